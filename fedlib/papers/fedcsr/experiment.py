r"""FedCSR experiments: the paper's tables and figures as cells of one resumable grid.

Reference:
    D. Zheng et al., "FedCSR: A Federated Framework for Multi-Platform Cross-Domain Sequential
    Recommendation with Dual Contrastive Learning", COLING 2025, pp. 8699–8713,
    https://aclanthology.org/2025.coling-main.581/; public code
    https://github.com/zdy769243418/FedCSR-v1.

The grid is data: ``spec.toml`` (next to this module) declares each part (scenarios × methods ×
variants × sweeps), every default of a cell once with its justification (sizes, rounds,
patience, the sampled softmax), the scenarios, methods and FedCSR variants; :func:`cell` and
:func:`grid_cells` read it through :mod:`fedlib.experiments.spec`.

A **cell** is a plain dict fixing one run. :func:`run_cell` trains it and returns

* ``metrics``: per domain, the validation and **test** MRR / NDCG@5 / NDCG@10 / HR@1 / HR@5 /
  HR@10 at the round with the best mean validation MRR (``"<domain>/test/MRR"``), the same
  read at the round with the best mean **test** MRR (``"test_selected/<domain>/test/MRR"``:
  the public code's rule, for the audit), ``selected_round``, ``test_selected_round``,
  ``rounds_run``, ``bytes_per_round`` (upload + download of all platforms), ``seconds``;
  FedCSR and individual training add each platform's own test rows,
  ``"platform<k>/<domain>/test/MRR"`` (Table 9 / Figure 4: the federated model, or platform
  k's own model); the selected model's test scores ranked against every item of the domain
  (``"full/<domain>/test/MRR"``) and on the sampled candidates with ties counted against the
  ground truth (``"ties_against/<domain>/test/MRR"``: equal to the reported value unless ties
  flatter the model);
* ``extra``: the learning curve (one row per round), the domain names and the data notes
  (``substitute_split`` says whether the substitute user split was used).

Data (:mod:`fedlib.data.protocols.fedcsr`): the original C2DSR training file is not available
offline; the protocol then builds a **substitute split** (the users of the valid and test
files, split 80/10/10), recorded in ``extra["substitute_split"]``.

Methods (each an Algorithm trained by :func:`fedlib.engine.train`, which checkpoints and
resumes every one of them): ``"FedCSR"`` and its variants
(:func:`~fedlib.papers.fedcsr.training.train_fedcsr`), ``"Individual"`` (each platform alone,
:func:`~fedlib.papers.fedcsr.training.train_individual`), ``"Centralized"`` (the FedCSR model
trained on all platforms' data as one platform) and the baselines, each federated with FedProx
(:func:`~fedlib.baselines.sequential.fedcsr_baselines.train_federated_baseline`, μ = 0.01).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import torch

from fedlib.baselines import registry
from fedlib.baselines.sequential.fedcsr_baselines import FedProxConfig, evaluate_baseline, train_federated_baseline
from fedlib.baselines.sequential.sequence_training import (audit_blocks, evaluate_sequences, history_rows, platform_blocks,
                                                           platform_graphs, selected_blocks)
from fedlib.data.protocols import fedcsr as protocol
from fedlib.device import default_device
from fedlib.experiments import grid
from fedlib.experiments.grid import unique_cells  # noqa: F401  (part of this module's API)
from fedlib.experiments.spec import load_spec
from fedlib.papers.fedcsr.model import FedCSRConfig, FedCSRModel
from fedlib.papers.fedcsr.training import FedCSRTrainConfig, train_fedcsr
from fedlib.reporting.results import config_hash

__all__ = [
    "PAPER", "SPEC", "VERSION", "PARTS", "HEADLINE_PARTS", "DATASETS", "METHODS", "BASELINES", "VARIANTS", "ALPHAS", "SMALL_DIM",
    "TIES_AGAINST_PREFIX", "CHECKPOINT_EVERY_S", "cell", "method_cell", "method_label", "load_split",
    "largest_platforms", "random_ranking_mrr", "constant_score_audit", "fedcsr_configs", "run_cell", "grid_cells",
    "unique_cells", "run_grid", "run_cells", "main", "config_hash", "HEADLINE_RATES", "HEADLINE_LR",
    "headline_rates", "headline_validation", "headline_lr_from_records", "selected_on_curve",
]

PAPER = "fedcsr"
#: The grid's parts, defaults, scenarios, methods and variants, as data.
SPEC = load_spec(PAPER)  # spec.toml, next to this module
VERSION = SPEC.version
PARTS = SPEC.parts
#: The fair-budget parts (the headline comparison at the paper's 100 rounds, three seeds, and its
#: learning-rate check), recorded after the tables' grid; the tables' grid is every other part.
HEADLINE_PARTS = ("headline", "headline_lr")
#: The headline's common learning-rate grid (part ``headline_lr``, seed 0); a method whose choice
#: fell on its edge also runs the rates of the spec's ``headline_wider`` (:func:`headline_rates`).
HEADLINE_RATES = tuple(SPEC.list("headline_rates"))
#: The headline's ``{method: learning rate}`` (``headline_rows``): the rate validation chose in ``headline_lr``.
HEADLINE_LR: Dict[str, float] = {row["method"]: row["lr"] for row in SPEC.list("headline_rows")}
#: Paper scenario -> protocol dataset name (the synthetic smoke task has none).
DATASETS: Dict[str, str] = {name: c["registry"] for name, c in SPEC.choices("dataset").items() if "registry" in c}
BASELINES = tuple(SPEC.list("baselines"))
METHODS = tuple(SPEC.list("method"))
VARIANTS = tuple(SPEC.list("variant"))
ALPHAS = tuple(SPEC.list("alphas"))
SMALL_DIM = SPEC.choice("method", "Individual")["dim"]  # baselines, sweeps, and FedCSR again beside them
FEDPROX_MU = 0.01
#: metrics prefix of the test scores re-ranked with ties counted against the ground truth
TIES_AGAINST_PREFIX = "ties_against/"
#: Wall-time seconds between two snapshots of a cell in the resumable grid (an n = 256 cell takes about 2 h).
CHECKPOINT_EVERY_S = 900.0
#: Lower bounds of the integer settings of a cell.
MINIMUM = {"dim": 2, "maxlen": 2, "rounds": 1, "patience": 1, "local_epochs": 1, "batch_size": 1, "num_negatives": 1}


# ======================================================================================
# Cells
# ======================================================================================
def cell(dataset: str, method: str = "FedCSR", *, variant: str = "FedCSR", sampled_negatives: Optional[int] = -1,
         **settings) -> Dict[str, Any]:
    """One run of the grid as a plain dict.

    ``settings`` override the spec's ``[cell]`` defaults (``None`` keeps the default): ``dim``
    (default: the method's, 256 for FedCSR and Centralized, 64 otherwise), ``alpha`` and
    ``scl_hidden_factor`` (FedCSR-family methods only), ``rounds``, ``patience`` (stop after
    that many rounds without a better mean validation MRR), ``seed``, ``lr``, ``local_epochs``,
    ``batch_size``, ``maxlen``, ``num_negatives`` (per evaluation row), ``platforms`` (keep
    only this many platforms, those with the most training sequences, :func:`largest_platforms`:
    a smaller federation that learns in a few rounds, the lesson's live run).
    ``variant``: a FedCSR variant (method ``"FedCSR"`` only). ``sampled_negatives``: training
    softmax over the target and this many shared negatives; ``None``: the full softmax; -1: the
    dataset's default.
    """
    if method != "FedCSR" and variant != "FedCSR":
        raise ValueError(f"variant {variant!r} applies to method 'FedCSR' only, not {method!r}")
    if settings.get("platforms") is not None and int(settings["platforms"]) < 1:
        raise ValueError(f"platforms must be None (all) or a positive integer, got {settings['platforms']!r}")
    config = SPEC.config({"dataset": dataset, "method": method, "variant": variant}, settings)
    for key, low in MINIMUM.items():
        if config[key] < low:
            raise ValueError(f"{key} must be an integer >= {low}, got {settings.get(key)!r}")
    if not 0.0 <= config["alpha"] <= 1.0:
        raise ValueError(f"alpha (augmentation ratio) must be in [0, 1], got {config['alpha']!r}")
    if not (config["lr"] > 0 and config["scl_hidden_factor"] > 0):
        raise ValueError(f"lr and scl_hidden_factor must be > 0, got {config['lr']!r}, {config['scl_hidden_factor']!r}")
    if sampled_negatives != -1 and (sampled_negatives is not None and (isinstance(sampled_negatives, bool)
                                                                      or int(sampled_negatives) < 1)):
        raise ValueError(f"sampled_negatives must be None (full softmax) or a positive int, got {sampled_negatives!r}")
    sampled = config["sampled_negatives"] if sampled_negatives == -1 else sampled_negatives
    config["sampled_negatives"] = int(sampled) if sampled else None  # the spec's 0: the full softmax
    owned = set(SPEC.choice("method", method)["own"])
    not_owned = {k for choice in SPEC.choices("method").values() for k in choice["own"]} - owned
    omitted = {k for k in SPEC.list("omitted_at_default") if config[k] == SPEC.data["cell"][k]}
    return {k: v for k, v in config.items() if k not in not_owned | omitted}


def method_cell(dataset: str, method: str, cell_kwargs: Mapping[str, Any] = {},
                method_kwargs: Mapping[str, Mapping[str, Any]] = {}, **extra) -> Dict[str, Any]:
    """:func:`cell` with the profile's common keywords, then the method's own."""
    return cell(dataset, method, **{**cell_kwargs, **method_kwargs.get(method, {}), **extra})


def method_label(config: Mapping[str, Any]) -> str:
    """The row label: ``"FedCSR"``, ``"w/o SCL"``, ``"code: central graph"``, ``"C2DSR"``, ``"Individual"``."""
    return config["variant"] if config["method"] == "FedCSR" else config["method"]


def grid_cells(part: str, **kwargs) -> List[Dict[str, Any]]:
    """The cells of one part of the paper-profile grid (``[parts]`` of the spec); ``kwargs`` go to each :func:`cell`."""
    return SPEC.cells(part, cell, **kwargs)


# ======================================================================================
# Data
# ======================================================================================
def load_split(dataset: str, num_negatives: Optional[int] = None, seed: int = 0):
    """The FedCSR split of ``dataset`` (cached): 10 platforms, 1 + ``num_negatives`` candidates
    (default: the dataset's, 999 on the paper's scenarios)."""
    return _load_split(dataset, int(num_negatives or SPEC.choice("dataset", dataset)["num_negatives"]), seed)


@functools.lru_cache(maxsize=8)
def _load_split(dataset: str, num_negatives: int, seed: int):
    if dataset == "synthetic":
        from fedlib.data.synthetic import cross_domain_sequences
        return cross_domain_sequences(num_users=120, items_a=30, items_b=30, topics=4, num_negatives=num_negatives,
                                      seed=seed)
    if dataset not in DATASETS:
        raise ValueError(f"{dataset!r} has no dataset in the registry: its sequence files (the C2DSR release) are not "
                         f"available, so Table 8 shows the paper's numbers only; the scenarios that can be run are "
                         f"{', '.join(DATASETS)} and 'synthetic'")
    return protocol.build(DATASETS[dataset], num_negatives=num_negatives, seed=seed)


def largest_platforms(split, count: int):
    """``split`` restricted to its ``count`` platforms with the most training sequences.

    The kept platforms keep their training, validation and test rows (in their original order);
    the other platforms' users leave the federation entirely, so evaluation covers the kept
    platforms' own held-out users only.

    Raises:
        ValueError: ``count`` is not between 1 and the number of platforms.
    """
    total = len(split.platforms)
    if not 1 <= int(count) <= total:
        raise ValueError(f"count must be between 1 and the split's {total} platforms, got {count!r}")
    sizes = np.asarray([len(rows) for rows in split.platforms])
    keep = np.sort(np.argsort(-sizes, kind="stable")[:int(count)])             # platform indices, original order
    extra = dict(split.extra)
    for role in ("valid", "test"):
        extra[f"{role}_platforms"] = tuple(split.extra[f"{role}_platforms"][k] for k in keep)
    extra["kept_platforms"] = tuple(int(k) for k in keep)
    return dataclasses.replace(split, platforms=tuple(split.platforms[k] for k in keep), extra=extra)


def random_ranking_mrr(num_candidates: int) -> float:
    """Expected MRR of a ranking that places the ground truth uniformly among ``num_candidates``
    (1 GT + negatives): ``(1/C) Σ_{r=1..C} 1/r``; 0.0075 for the paper's 1 + 999 candidates."""
    if isinstance(num_candidates, bool) or int(num_candidates) < 1:
        raise ValueError(f"num_candidates must be a positive integer, got {num_candidates!r}")
    return float(np.mean(1.0 / np.arange(1, int(num_candidates) + 1)))


def constant_score_audit(split, tie_rules: Sequence[str] = ("optimistic", "code", "pessimistic")) -> pd.DataFrame:
    """Test MRR per domain of a model that gives every candidate the **same** score, per tie rule.

    The model is a FedCSR model whose prediction layers are zero (weights and biases), so every
    candidate of every row scores 0 and the ground truth ties with all 999 negatives. The public
    code's rule (``s_neg > s_gt + 1e-5``, ``"code"``) and ``"optimistic"`` rank it first; ``"pessimistic"``
    last. Returns one row per tie rule: ``tie rule``, ``<domain> MRR`` (fractions), ``candidates``.
    """
    torch.manual_seed(0)
    model = FedCSRModel(split.num_items_a, split.num_items_b, FedCSRConfig(dim=8, dropout=0.0))
    with torch.no_grad():
        for head in (model.head_a, model.head_b):
            head.weight.zero_()
            head.bias.zero_()
    graphs = platform_graphs(split)
    names = split.extra.get("domain_names", ("A", "B"))
    rows = []
    for rule in tie_rules:
        scores = evaluate_sequences(model, split, "test", graphs, tie_rule=rule)
        rows.append({"tie rule": rule, **{f"{d} MRR": scores[d]["MRR"] for d in names},
                     "candidates": int(np.asarray(split.test_candidates).shape[1])})
    return pd.DataFrame(rows)


def centralized_split(split):
    """``split`` with every platform's rows pooled into one platform (Table 9's centralised training)."""
    extra = dict(split.extra)
    for role in ("valid", "test"):
        extra[f"{role}_platforms"] = (np.arange(len(getattr(split, role)), dtype=np.int64),)
    pooled = np.concatenate([np.asarray(r, dtype=np.int64) for r in split.platforms])
    return dataclasses.replace(split, platforms=(np.sort(pooled),), extra=extra)


def _device_name(device) -> str:
    device = torch.device(device) if device is not None else default_device()
    return str(device) if device.type in ("cpu", "cuda") else "cpu"


def fedcsr_configs(config: Mapping[str, Any], device=None):
    """``(FedCSRConfig, FedCSRTrainConfig)`` of a FedCSR / Individual / Centralized cell."""
    variant = SPEC.choice("variant", config.get("variant", "FedCSR"))
    model = FedCSRConfig(dim=config["dim"], maxlen=config["maxlen"], alpha=config["alpha"],
                         sampled_negatives=config.get("sampled_negatives"),
                         scl_hidden_factor=config.get("scl_hidden_factor", SPEC.data["cell"]["scl_hidden_factor"]),
                         **variant["model"])
    train = FedCSRTrainConfig(rounds=config["rounds"], local_epochs=config["local_epochs"],
                              batch_size=config["batch_size"], lr=config["lr"], patience=config["patience"],
                              seed=config["seed"], device=_device_name(device), **variant["train"])
    return model, train


def baseline_factory(config: Mapping[str, Any], split) -> Callable[[], torch.nn.Module]:
    """``() -> model`` of a baseline cell (the registry's sequential model): its own defaults apart from
    ``dim``, ``maxlen``, ``seed`` and, for the models trained with a softmax over a domain's items,
    ``sampled_negatives``."""
    method = registry.get(config["method"], "sequential")
    sizes = {"dim": config["dim"], "maxlen": config["maxlen"], "seed": config["seed"]}
    if "sampled_negatives" in {f.name for f in dataclasses.fields(method.config)}:
        sizes["sampled_negatives"] = config.get("sampled_negatives")
    model_config = method.config(**sizes)
    return lambda: method.model(split, model_config)


def baseline_train_config(config: Mapping[str, Any], device=None) -> FedProxConfig:
    return FedProxConfig(rounds=config["rounds"], local_epochs=config["local_epochs"],
                         batch_size=config["batch_size"], lr=config["lr"], mu=FEDPROX_MU,
                         patience=config["patience"], seed=config["seed"], device=_device_name(device))


# ======================================================================================
# Runs
# ======================================================================================
def _flat(block: Mapping[str, Mapping[str, float]], prefix: str = "") -> Dict[str, float]:
    return {f"{prefix}{domain}/{key}": float(value) for domain, values in block.items() for key, value in values.items()}


def run_cell(config: Mapping[str, Any], device=None, progress: Optional[Callable[[int], None]] = None,
             checkpointer=None) -> Dict[str, Any]:
    """Train one cell: ``{"metrics": {...}, "extra": {"curve": [...], ...}}`` (module docstring).

    ``checkpointer``: a :class:`~fedlib.engine.Checkpointer` named after the cell; the cell resumes
    from its snapshot and saves on its schedule, so a killed run continues at its last save with
    the numbers of an uninterrupted one.
    ``metrics["seconds"]`` then counts the earlier sessions' time up to that save, and
    ``extra["resumed_at"]`` lists the rounds it was resumed at.
    """
    started = time.perf_counter()
    split = load_split(config["dataset"], config["num_negatives"], config["seed"])
    if config.get("platforms") is not None:
        split = largest_platforms(split, config["platforms"])
    method = config["method"]
    if method in ("FedCSR", "Individual", "Centralized"):
        model_config, train_config = fedcsr_configs(config, device)
        trained_on = centralized_split(split) if method == "Centralized" else split
        on_round = (lambda row: progress(row["round"])) if progress else None
        run = train_fedcsr(trained_on, model_config, train_config, individual=method == "Individual",
                           progress=on_round, checkpointer=checkpointer)
        # each platform's own test rows, scored by its own model (Individual) or by the one
        # federated model (FedCSR): Table 9 / Figure 4 compare the two platform by platform
        per_platform = platform_blocks(run) if method in ("FedCSR", "Individual") else []
        models, graphs = run.artifacts["models"], run.artifacts["graphs"]
        full = evaluate_sequences(models[0], trained_on, "test", graphs,
                                  models=models if len(models) > 1 else None, full_ranking=True)
        ties_against = evaluate_sequences(models[0], trained_on, "test", graphs,
                                          models=models if len(models) > 1 else None, tie_rule="pessimistic")
    else:
        run = train_federated_baseline(baseline_factory(config, split), split,
                                       baseline_train_config(config, device), device=_device_name(device),
                                       progress=(lambda row: progress(row["round"])) if progress else None,
                                       checkpointer=checkpointer)
        per_platform = []
        model, graphs = run.artifacts["models"][0], run.artifacts["graphs"]
        full = evaluate_baseline(model, split, "test", graphs, full_ranking=True)
        ties_against = evaluate_baseline(model, split, "test", graphs, tie_rule="pessimistic")
    metrics = _flat(selected_blocks(run))
    metrics.update(_flat(audit_blocks(run), "test_selected/"))
    names = split.extra.get("domain_names", ("A", "B"))
    metrics.update({f"full/{d}/test/{m}": float(v) for d in names for m, v in full[d].items() if m != "count"})
    # The sampled protocol again with ties counted against the ground truth: equal to the
    # reported (optimistic) value unless the model gives the GT and some negatives one score,
    # which the optimistic rule rewards (a floored MIFN once scored MRR 0.89 that way).
    metrics.update({f"{TIES_AGAINST_PREFIX}{d}/test/{m}": float(v) for d in names
                    for m, v in ties_against[d].items() if m != "count"})
    for k, block in enumerate(per_platform):
        metrics.update(_flat(block, f"platform{k}/"))
    history = history_rows(run)
    metrics.update(selected_round=int(run.best_round or 0), test_selected_round=int(run.audit_round or 0),
                   rounds_run=len(history),
                   bytes_per_round=float(history[0]["bytes_up"] + history[0]["bytes_down"]) if history else 0.0,
                   seconds=time.perf_counter() - started + (checkpointer.earlier_seconds if checkpointer else 0.0))
    curve = [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()} for row in history]
    extra = {"curve": curve, "domains": list(split.extra.get("domain_names", ("A", "B"))),
             "substitute_split": bool(split.extra.get("substitute_train", False)), "notes": list(split.notes)}
    if checkpointer is not None and checkpointer.resumed_at:
        extra["resumed_at"] = list(checkpointer.resumed_at)
    return {"metrics": metrics, "extra": extra}


# ======================================================================================
# The headline's learning rate, chosen on validation
# ======================================================================================
def headline_validation(metrics: Mapping[str, float], domains: Sequence[str]) -> float:
    """The selection score of a run: the mean over ``domains`` of its finite validation MRRs at
    the selected round (``"<domain>/valid/MRR"``, fractions), the metric training selects its
    round on (:func:`~fedlib.baselines.sequential.sequence_training.flat_evaluation`); NaN when a
    domain's value is missing from the record or none is finite."""
    values = [metrics.get(f"{domain}/valid/MRR") for domain in domains]
    if any(value is None for value in values):
        return float("nan")
    finite = [float(value) for value in values if np.isfinite(value)]
    return float(np.mean(finite)) if finite else float("nan")


def selected_on_curve(curve: Sequence[Mapping[str, float]], domains: Sequence[str],
                      cap: Optional[int] = None) -> Optional[Mapping[str, float]]:
    """The evaluation a run would have selected had it stopped at round ``cap``: the first row of
    its recorded ``curve`` (``extra["curve"]``, one row per evaluated round) with round <= ``cap``
    and the best :func:`headline_validation` over ``domains``, as training selects (a later
    round must be strictly better). ``cap=None`` takes the whole curve, which gives back the
    run's own selected round. ``None`` when no row up to ``cap`` has a finite score.

    A shorter cap read this way is the same run cut short: the rounds before it are the same
    computation (the random stream does not depend on the cap), so this answers "what did the
    extra rounds change?" seed by seed, without a second run. The recorded curve keeps six
    decimals, so two rounds closer than that tie here where training could tell them apart; a
    test checks that every recorded headline run gives back its own selection."""
    best, best_score = None, -math.inf
    for row in curve:
        if cap is not None and row["round"] > cap:
            continue
        score = headline_validation(row, domains)
        if math.isfinite(score) and score > best_score:
            best, best_score = row, score
    return best


def headline_rates(method: str, dataset: str = "Food-Kitchen") -> Tuple[float, ...]:
    """The learning rates ``method`` runs in part ``headline_lr`` on ``dataset``, ascending:
    :data:`HEADLINE_RATES` and any rate the spec's ``headline_wider`` adds for it."""
    rates = sorted({float(c["lr"]) for c in grid_cells("headline_lr") if c["dataset"] == dataset and c["method"] == method})
    if not rates:
        raise ValueError(f"headline_rates: {method!r} on {dataset!r} is not in part headline_lr; its methods are "
                         f"{SPEC.list('headline_methods')} on Food-Kitchen")
    return tuple(rates)


def headline_lr_from_records(records, dataset: str = "Food-Kitchen") -> Dict[str, Optional[float]]:
    """Re-derive :data:`HEADLINE_LR` from the recorded seed-0 runs of part ``headline_lr``.

    Returns ``{method: rate}``: the rate of :func:`headline_rates` with the best
    :func:`headline_validation` (:func:`~fedlib.experiments.selection.best_on_validation`; a tie
    keeps the smaller rate), or ``None`` while any of the method's rates is unrecorded (a choice
    from part of the grid could still move).
    """
    from fedlib.experiments.selection import best_on_validation
    from fedlib.reporting.results import latest_records

    known = latest_records(records)
    domains = tuple(SPEC.choice("dataset", dataset)["domains"])
    scores: Dict[str, List[tuple]] = {}
    for config in grid_cells("headline_lr"):
        if config["dataset"] != dataset:
            continue
        record = known.get(config_hash(config))
        score = None if record is None else headline_validation(record.metrics, domains)
        scores.setdefault(config["method"], []).append((config["lr"], score, record is not None))
    return {method: (best_on_validation([(lr, score) for lr, score, _ in tried], prefer=lambda rate: rate)
                     if all(recorded for _, _, recorded in tried) else None)
            for method, tried in scores.items()}


# ======================================================================================
# The grid command
# ======================================================================================
def run_grid(cells: Iterable[Mapping[str, Any]], profile: str = "paper", *,
             cache_dir: Path = Path(".cache/fedcsr"), progress: bool = True, rerun: bool = False,
             cluster: Optional[grid.Cluster] = None) -> pd.DataFrame:
    """Run every cell without a recorded result, appending each to runs.jsonl (``cluster``: train on Dask workers).

    A cell saves a snapshot every :data:`CHECKPOINT_EVERY_S` seconds (and
    when it stops) under ``cache_dir/<profile>/checkpoints/``; a killed grid's cell continues
    there when the grid next runs (an n = 256 cell can outlast a working session).
    """
    return grid.run_recorded_grid(PAPER, unique_cells(cells), _train, profile, cache_dir=cache_dir,
                                  progress=progress, checkpoint_every_s=CHECKPOINT_EVERY_S, rerun=rerun,
                                  cluster=cluster)


def run_cells(cells: Sequence[Mapping[str, Any]], profile: str, description: str = "cells") -> List[Dict[str, Any]]:
    """What a notebook calls: train each cell and record it at ``profile`` (see :func:`fedlib.experiments.grid.run_cells`)."""
    return grid.run_cells(PAPER, cells, profile, _train, method_label, description)


def _train(config: Mapping[str, Any], progress=None, checkpointer=None) -> Dict[str, Any]:
    return run_cell(config, progress=progress, checkpointer=checkpointer)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m fedlib grid fedcsr <parts> [--methods ..] [--seeds ..] ...`` (:func:`fedlib.experiments.grid.grid_main`)."""
    grid.grid_main(argv, paper=PAPER, title="FedCSR", parts=PARTS, grid_cells=grid_cells, label=method_label,
                   run_grid=run_grid, filters={"--datasets": grid.CellFilter("dataset", list(DATASETS)), "--dims": grid.CellFilter("dim", type=int)})
