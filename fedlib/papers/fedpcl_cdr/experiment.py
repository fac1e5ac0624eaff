r"""FedPCL-CDR experiments: every table and figure of the paper as cells of one grid.

Reference:
    "FedPCL-CDR: A Federated Prototype-based Contrastive Learning Framework for
    Privacy-Preserving Cross-domain Recommendation", L. Wang, Q. Wu, M. Xu, arXiv:2409.03294
    (2024), https://arxiv.org/abs/2409.03294; public code https://github.com/Lili1013/FedPCL_CDR.

A **cell** is a plain dict fixing one run (task, method, its hyperparameters, overlap ratio,
rounds, seed). :func:`run_cell` trains it and returns

* ``metrics``: per domain, the validation and **test** HR@N / NDCG@N / MRR at the round with
  the best mean validation HR@10 (``"<domain>/test/HR@10"``), the same read at the round with
  the best mean **test** HR@10 (``"test_selected/<domain>/test/HR@10"``: the reference code's
  rule, for the audit; a lower bound on what the code reports, since training stopped on
  validation), the selected rounds, bytes and seconds. A FedPCL-CDR cell with
  ``selection="test"`` (the ``audit`` part) runs the code's rule itself: it stops on the test
  score and both reads are its best test round;
* ``extra``: the learning curve (every evaluation), the domains, and whether the review
  branch was on.

Methods that transmit something about users (FedPCL-CDR's representative prototypes, P2FCDR's
and P²DTR's messages) are also attacked after training (:func:`~fedlib.metrics.reconstruction.reconstruction_attack`):
``"attack/<domain>/mse"`` and ``"attack/<domain>/normalised_mse"`` (Table 5).

The grid is data: ``spec.toml`` (next to this module) declares the tasks (substitutes, Douban
with Movie, FedPCL-CDR's original format with review text), the methods and every default with
its reason, the parts and the tables' layouts; :func:`cell` and :func:`grid_cells` read it through
:mod:`fedlib.experiments.spec`. The logic stays here: which tasks' files are present
(:func:`available_tasks`; the grid skips the others), loading a task, the learning-rate search
that widens the ``tuning`` part (:func:`tuning_cells`), and training a cell.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import pandas as pd
import torch

from fedlib.baselines import registry
from fedlib.baselines.cross_domain.cdr_common import flat_metrics, history_rows
from fedlib.data.protocols import fedpcl_cdr as protocol
from fedlib.device import default_device
from fedlib.experiments import grid
from fedlib.experiments.selection import best_on_validation
from fedlib.experiments.spec import load_spec
from fedlib.metrics.reconstruction import reconstruction_attack
from fedlib.papers.fedpcl_cdr.method import SELECTIONS, VARIANTS, FedPCLConfig, train_fedpcl_cdr, variant_config
from fedlib.reporting.results import config_hash, latest_records, read_runs

__all__ = ["PAPER", "SPEC", "PARTS", "TASKS", "SUBSTITUTE_TASKS", "METHODS", "BASELINES", "SELECTED_LR", "cell",
           "method_label", "grid_cells", "available_tasks", "needs_download", "load_task", "load_split", "fedpcl_config",
           "baseline_config", "run_cell", "tuning_cells", "selected_from_records", "tuning_frame", "run_grid", "main"]

PAPER = "fedpcl_cdr"
#: The grid's parts, tasks, methods and defaults, and the tables' layouts, as data.
SPEC = load_spec(PAPER)  # spec.toml, next to this module
VERSION = SPEC.version
PARTS = SPEC.parts
#: Every task but the smoke profile's ``synthetic``: its kind, how to load it, the paper task it stands for.
TASKS: Dict[str, Mapping[str, Any]] = {t: c for t, c in SPEC.choices("task").items() if c["kind"] != "synthetic"}
SUBSTITUTE_TASKS = tuple(t for t, c in TASKS.items() if c["kind"] == "substitute")
METHODS = tuple(SPEC.list("method"))  # Table 2's order: the baselines, then FedPCL-CDR
BASELINES = tuple(SPEC.list("baselines"))
#: Each baseline's Adam step, chosen on validation by the tuning part (:func:`selected_from_records`).
SELECTED_LR = {method: SPEC.choice("method", method)["cell"]["lr"] for method in BASELINES}
LR_LADDER = tuple(SPEC.list("lr_ladder"))  # where tuning_cells widens a baseline's learning-rate grid
KS = tuple(sorted(set(SPEC.list("list_lengths")) | {5, 10}))  # every run is evaluated at these list lengths
REVIEW_DIM = 64  # Doc2Vec vector size of the original-format tasks (the code's review_embed_dim)


# ======================================================================================
# Cells
# ======================================================================================
def cell(task: str, method: str = "FedPCL-CDR", **settings) -> Dict[str, Any]:
    """One run of the grid as a plain dict: the spec's ``[cell]`` and the method's own keys.

    ``task``: a task of the spec (``"synthetic"``: the smoke profile); ``method``: one of
    :data:`METHODS`. ``settings`` override the defaults (``None`` keeps one): ``seed``,
    ``overlap_ratio``, ``rounds``, ``patience``, ``dim``, ``num_negatives``; a baseline's ``lr``;
    FedPCL-CDR's ``variant``, ``epsilon``, ``alpha``, ``num_clusters``, ``batches_per_round`` and
    ``selection`` (written into the cell only when ``"test"``, so the other cells keep their hashes).
    """
    selection = settings.get("selection") or "valid"
    if selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
    if selection != "valid" and method != "FedPCL-CDR":
        raise ValueError(f"selection={selection!r} reproduces the FedPCL-CDR code's audit rule; the baselines are "
                         f"always selected on validation (got method {method!r})")
    config = SPEC.config({"task": task, "method": method}, settings)
    if method == "FedPCL-CDR":
        if config["variant"] not in VARIANTS:
            raise ValueError(f"unknown FedPCL-CDR variant {config['variant']!r}; expected one of {list(VARIANTS)}")
        if not config["epsilon"] > 0:
            raise ValueError(f"epsilon must be > 0 (the Laplace scale is 2 * {FedPCLConfig.clip_norm} / epsilon), "
                             f"got {config['epsilon']}")
        if selection == "valid":
            del config["selection"]
    return config


def method_label(config: Mapping[str, Any]) -> str:
    """The paper's row label: ``"FedPCL-CDR"``, ``"w/o LDP"``, ``"NeuMF"``, ..."""
    return config["variant"] if config["method"] == "FedPCL-CDR" else config["method"]


def grid_cells(part: str, tasks: Optional[Sequence[str]] = None, **kwargs) -> List[Dict[str, Any]]:
    """The cells of one part (``[parts]`` of the spec); ``kwargs`` go to each :func:`cell`.

    ``tasks``: those of Tables 2 and 3 (default :func:`available_tasks`). ``tuning`` is
    :func:`tuning_cells` (the recorded runs may widen it).
    """
    if part == "tuning":
        return tuning_cells(**kwargs)
    return SPEC.cells(part, cell, {"tasks": list(available_tasks() if tasks is None else tasks)}, **kwargs)


# ======================================================================================
# Data
# ======================================================================================
def task_files(task: str) -> List[str]:
    """The files (relative to the data root) ``task`` needs."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {sorted(TASKS)}")
    spec = TASKS[task]
    if spec["kind"] == "original":
        return [protocol.original_relpath(d) for d in spec["domains"]]
    if spec["dataset"] == "douban-gadtcdr":
        return [f"douban-gadtcdr/douban_{d}/ratings.dat" for d in spec["domains"]]
    from fedlib.data.registry import get_spec

    return list(get_spec(spec["dataset"]).variant(spec["variant"]).required)


def available_tasks(root=None) -> Tuple[str, ...]:
    """The tasks whose files are all under the data root (``None`` = ``FEDLIB_DATA``), in :data:`TASKS` order."""
    from fedlib.data.download import data_root

    base = data_root(root)
    present = lambda relpath: any((base / f"{relpath}{suffix}").is_file() for suffix in ("", ".xz", ".gz"))  # noqa: E731
    return tuple(t for t in TASKS if all(present(f) for f in task_files(t)))


def needs_download(root=None) -> Dict[str, str]:
    """Paper task -> why it has no row of ours while its files are absent (``[report]`` of the spec), for the
    files present now: a paper task drops out once a task of ours covers all its domains."""
    covered = {TASKS[t]["paper_task"] for t in available_tasks(root) if TASKS[t]["kind"] != "substitute"}
    return {task: entry["reason"] for task, entry in SPEC.data["report"]["needs_download"].items()
            if task not in covered}


@functools.lru_cache(maxsize=8)
def load_task(task: str, overlap_ratio: Optional[float] = None, num_negatives: int = 99, seed: int = 0):
    """``(split, texts)`` of ``task`` (cached): the FedPCL-CDR split, 1 + ``num_negatives``
    candidates, and ``{domain: review texts}`` for the original-format tasks (else ``None``).

    Raises:
        MissingDataError: the task's files are absent (the message names them and the download).
    """
    if task == "synthetic":
        from fedlib.data.synthetic import overlapping_domains
        # the synthetic generator draws the overlap itself: the ratio scales its default share (0.5)
        overlap = 0.5 if overlap_ratio is None else 0.5 * overlap_ratio
        return overlapping_domains(num_users=240, items_per_domain=200, overlap=overlap, num_negatives=num_negatives,
                                   seed=seed), None
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {sorted(TASKS)} or 'synthetic'")
    spec = TASKS[task]
    if spec["kind"] == "original":
        return protocol.build_original(tuple(spec["domains"]), overlap_ratio=overlap_ratio,
                                       num_negatives=num_negatives, seed=seed)
    domains = tuple(spec["domains"]) if "domains" in spec else None
    return protocol.build(spec["dataset"], variant=spec.get("variant"), domains=domains,
                          overlap_ratio=overlap_ratio, num_negatives=num_negatives, seed=seed), None


def load_split(task: str, overlap_ratio: Optional[float] = None, num_negatives: int = 99, seed: int = 0):
    """The FedPCL-CDR split of ``task`` (cached, see :func:`load_task`)."""
    return load_task(task, overlap_ratio, num_negatives, seed)[0]


# ======================================================================================
# Runs
# ======================================================================================
def fedpcl_config(config: Mapping[str, Any]) -> FedPCLConfig:
    """The :class:`~fedlib.papers.fedpcl_cdr.method.FedPCLConfig` of a FedPCL-CDR cell (η = 2β/ε)."""
    base = FedPCLConfig(dim=config["dim"], num_clusters=config["num_clusters"], alpha=config["alpha"],
                        laplace_scale=2 * FedPCLConfig.clip_norm / config["epsilon"], rounds=config["rounds"],
                        patience=config["patience"], batches_per_round=config["batches_per_round"],
                        seed=config["seed"], selection=config.get("selection", "valid"))
    if config["task"] == "synthetic":
        base = dataclasses.replace(base, batch_size=128)
    return variant_config(config["variant"], base)


#: baseline -> (module, training function, config class); each trains on the whole DomainSplit
def baseline_config(config: Mapping[str, Any]):
    """The baseline's own config object (the registry's) for a cell: size, epochs (= the cell's rounds), lr,
    patience, seed."""
    config_class = registry.get(config["method"], "cross-domain").config
    names = {f.name for f in dataclasses.fields(config_class)}
    wanted = {"dim": config["dim"], "patience": config["patience"], "seed": config["seed"], "lr": config["lr"]}
    wanted["rounds" if "rounds" in names and "epochs" not in names else "epochs"] = config["rounds"]
    missing = sorted(set(wanted) - names)
    if missing:
        raise TypeError(f"{config_class.__name__} has no field(s) {missing}; the grid sets dim, epochs/rounds, lr, "
                        f"patience, seed")
    return config_class(**wanted)


def run_cell(config: Mapping[str, Any], progress: Optional[Callable[[int], None]] = None, device=None
             ) -> Dict[str, Any]:
    """Train one cell: ``{"metrics": {...}, "extra": {"curve": [...]}}`` (module docstring).

    ``progress(round)`` is called after every round; ``device``: default :func:`~fedlib.device.default_device`.
    """
    device = torch.device(device) if device is not None else default_device()
    started = time.perf_counter()
    split, texts = load_task(config["task"], config["overlap_ratio"], config["num_negatives"], config["seed"])
    each_round = (lambda r, row: progress(r)) if progress is not None else None
    if config["method"] == "FedPCL-CDR":  # the review branch is on exactly when the task has review text
        from fedlib.models.review_text import review_embeddings

        # {domain: (user (U, REVIEW_DIM), item (I, REVIEW_DIM))}: frozen Doc2Vec vectors of each domain's
        # training reviews only (the code also uses the held-out ones)
        reviews = None if texts is None else {d: review_embeddings(split[d], texts[d], REVIEW_DIM, seed=config["seed"])
                                              for d in split.domains}
        result = train_fedpcl_cdr(split, fedpcl_config(config), reviews=reviews, device=device, ks=KS,
                                  progress=each_round)
    else:
        train = registry.get(config["method"], "cross-domain").train
        result = train(split, baseline_config(config), device=device, progress=each_round)
    metrics = flat_metrics(result)
    for domain, pair in result.artifacts.get("transmitted", {}).items():  # Table 5
        if pair["sent"].shape[0] < 4:  # (almost) no cluster of this domain was sent: nothing to attack
            continue
        attack = reconstruction_attack(pair["sent"], pair["private"], seed=config["seed"])
        metrics.update({f"attack/{domain}/{key}": attack[key] for key in ("mse", "normalised_mse")})
    metrics["seconds"] = time.perf_counter() - started
    curve = [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()} for row in history_rows(result)]
    review_branch = config["method"] == "FedPCL-CDR" and texts is not None
    return {"metrics": metrics, "extra": {"curve": curve, "domains": list(split.domains), "review_branch": review_branch}}


# ======================================================================================
# The baselines' learning rates
# ======================================================================================
def tuning_cells(task: str = "Phone-Sport", records: Optional[Iterable] = None, **kwargs) -> List[Dict[str, Any]]:
    """The learning-rate search of every baseline on ``task`` (selection on mean validation HR@10).

    Each baseline starts at the rates of the spec's ``tuning`` part. Once all its runs so far are
    recorded, a best rate at the edge of what was tried (the largest or the smallest) adds the
    next rate of :data:`LR_LADDER` beyond that edge, so the chosen rate is never an untested edge
    of the grid (unless it is the ladder's end). ``records``: the paper-profile runs (default:
    read from ``results/fedpcl_cdr/runs.jsonl``).
    """
    scores = _validation_scores(read_runs(PAPER, "paper") if records is None else records)
    rates_of: Dict[str, List[float]] = {}
    for config in SPEC.cells("tuning", cell, task=task, **kwargs):
        rates_of.setdefault(config["method"], []).append(config["lr"])
    cells = []
    for method, rates in rates_of.items():
        while True:
            keys = {lr: config_hash(cell(task, method, lr=lr, **kwargs)) for lr in rates}
            if any(key not in scores for key in keys.values()):
                break  # some run of this baseline is still pending: widen only once all are in
            best = best_on_validation((lr, scores[keys[lr]]) for lr in rates)
            step = _ladder_step(best, rates) if best is not None else None
            if step is None:
                break
            rates.append(step)
        cells += [cell(task, method, lr=lr, **kwargs) for lr in sorted(rates)]
    return cells


def _ladder_step(best: float, rates: Sequence[float]) -> Optional[float]:
    """The :data:`LR_LADDER` rate beyond ``best`` when it is an edge of ``rates``; else ``None``."""
    index = min(range(len(LR_LADDER)), key=lambda i: abs(math.log(LR_LADDER[i] / best)))
    if best >= max(rates) and index + 1 < len(LR_LADDER):
        return LR_LADDER[index + 1]
    if best <= min(rates) and index > 0:
        return LR_LADDER[index - 1]
    return None


def _validation_scores(records) -> Dict[str, float]:
    """``{config hash: mean over domains of validation HR@10}`` of the latest record of each run."""
    scores = {}
    for key, record in latest_records(records).items():
        domains = [k.split("/")[0] for k in record.metrics if k.endswith("/valid/HR@10") and k.count("/") == 2]
        if domains:
            scores[key] = sum(record.metrics[f"{d}/valid/HR@10"] for d in domains) / len(domains)
    return scores


def selected_from_records(records, task: str = "Phone-Sport") -> Dict[str, float]:
    """Re-derive :data:`SELECTED_LR` from recorded tuning runs: ``{baseline: best lr}``, for the
    baselines whose search (:func:`tuning_cells`) has no run pending (best mean validation HR@10,
    :func:`~fedlib.experiments.selection.best_on_validation`: a tie keeps the grid's first rate,
    a NaN score never wins)."""
    records = list(records)
    scores = _validation_scores(records)
    by_method: Dict[str, List[Dict[str, Any]]] = {}
    for config in tuning_cells(task, records):
        by_method.setdefault(config["method"], []).append(config)
    chosen = {method: best_on_validation((c["lr"], scores[config_hash(c)]) for c in configs)
              for method, configs in by_method.items() if all(config_hash(c) in scores for c in configs)}
    return {method: lr for method, lr in chosen.items() if lr is not None}


def tuning_frame(records, task: str = "Phone-Sport") -> pd.DataFrame:
    """The learning-rate search as a table: one row per baseline and rate of :func:`tuning_cells`.

    Columns: ``method``, ``lr``, ``valid_HR@10`` (mean over the domains, a fraction; NaN while
    pending), ``seconds`` (wall time of the run), ``chosen`` (the rate
    :func:`selected_from_records` picks; False everywhere for an unfinished search).
    """
    records = list(records)
    scores, latest = _validation_scores(records), latest_records(records)
    chosen = selected_from_records(records, task)
    rows = []
    for config in tuning_cells(task, records):
        key = config_hash(config)
        seconds = latest[key].metrics.get("seconds", math.nan) if key in latest else math.nan
        rows.append({"method": config["method"], "lr": config["lr"], "valid_HR@10": scores.get(key, math.nan),
                     "seconds": seconds, "chosen": chosen.get(config["method"]) == config["lr"]})
    return pd.DataFrame(rows, columns=["method", "lr", "valid_HR@10", "seconds", "chosen"])


# ======================================================================================
# Running the grid
# ======================================================================================
def run_grid(cells: Iterable[Mapping[str, Any]], profile: str = "paper", *,
             cache_dir: Path = Path(".cache/fedpcl_cdr"), **kwargs) -> pd.DataFrame:
    """Run every cell without a recorded result, appending each to runs.jsonl
    (:func:`fedlib.experiments.grid.run_recorded_grid`: ``progress``, ``rerun``, ``cluster``)."""
    return grid.run_recorded_grid(PAPER, cells, run_cell, profile, cache_dir=cache_dir, **kwargs)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m fedlib grid fedpcl_cdr <parts> [--methods ..] [--tasks ..] [--seeds ..] ...`` (:func:`fedlib.experiments.grid.grid_main`)."""
    grid.grid_main(argv, paper=PAPER, title="FedPCL-CDR", parts=PARTS, grid_cells=grid_cells, label=method_label,
                   run_grid=run_grid, filters={"--tasks": grid.CellFilter("task", list(TASKS))})
