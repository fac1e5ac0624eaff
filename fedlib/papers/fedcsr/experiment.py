r"""FedCSR experiments: the paper's tables and figures as cells of one resumable grid.

Reference:
    D. Zheng et al., "FedCSR: A Federated Framework for Multi-Platform Cross-Domain Sequential
    Recommendation with Dual Contrastive Learning", COLING 2025, pp. 8699–8713,
    https://aclanthology.org/2025.coling-main.581/; public code
    https://github.com/zdy769243418/FedCSR-v1.

A **cell** is a plain dict fixing one run: dataset, method, FedCSR variant, embedding size,
α, rounds, patience, seed and the few size keywords a smoke run shrinks. :func:`run_cell`
trains it and returns

* ``metrics``: per domain, the validation and **test** MRR / NDCG@5 / NDCG@10 / HR@1 / HR@5 /
  HR@10 at the round with the best mean validation MRR (``"<domain>/test/MRR"``), the same
  read at the round with the best mean **test** MRR (``"test_selected/<domain>/test/MRR"``:
  the public code's rule, for the audit), ``selected_round``, ``test_selected_round``,
  ``rounds_run``, ``bytes_per_round`` (upload + download of all platforms), ``seconds``;
  FedCSR and individual training add each platform's own test rows,
  ``"platform<k>/<domain>/test/MRR"`` (Table 9 / Figure 4: the federated model, or platform
  k's own model); the
  selected model's test scores ranked against every item of the domain
  (``"full/<domain>/test/MRR"``) and on the sampled candidates with ties counted against the
  ground truth (``"ties_against/<domain>/test/MRR"``: equal to the reported value unless ties
  flatter the model);
* ``extra``: the learning curve (one row per round), the domain names and the data notes
  (``substitute_split`` says whether the substitute user split was used).

Data (:mod:`fedlib.data.protocols.fedcsr`): C2DSR's Food-Kitchen and Movie-Book sequences
over 10 platforms, 1 + 999 candidates. The original training file is not available
offline; the protocol then builds a **substitute split** (the users of the valid and test
files, split 80/10/10), recorded in ``extra["substitute_split"]`` and in the row label of
:func:`dataset_label`. ``"synthetic"`` is a tiny smoke task
(:func:`fedlib.data.synthetic.cross_domain_sequences`, 20 negatives).

Methods (each an Algorithm trained by :func:`fedlib.engine.train`): ``"FedCSR"``
(:func:`~fedlib.papers.fedcsr.training.train_fedcsr`), its variants
(:data:`VARIANTS`: the ablations of Tables 3-4 and Figure 2 and the audit of the public
code, all flags of the one implementation), ``"Individual"`` (each platform alone,
:func:`~fedlib.papers.fedcsr.training.train_individual`), ``"Centralized"`` (Table 9's third
row: the FedCSR model trained on all platforms' data as one platform) and the eight
baselines of :data:`BASELINES`, each federated with FedProx
(:func:`~fedlib.methods.fedcsr_baselines.train_federated_baseline`, μ = 0.01).

Sizes. The paper sets the embedding size to 256 for every method. FedCSR's main rows are run
at ``dim=256`` (one seed); every baseline and every sweep (ablation, α, individual, audit)
runs at the stated smaller size :data:`SMALL_DIM` = 64, and FedCSR is also run at 64 so that
Table 2 compares like with like.

Figure 6 varies the hidden size of the SCL transformation ``t`` (``n → f·n → n``) over
:data:`HIDDEN_FACTORS` f = 1/4, 1/2, 1, 2 (the paper's choice), 4, at :data:`SMALL_DIM`.

Rounds. The paper (App. A.2) trains up to 100 rounds of 3 local epochs on all 10 platforms
with patience 20. Here every method runs at most :data:`ROUNDS` = 20 rounds of 3 local epochs
with the paper's patience :data:`PATIENCE` = 20 on the mean validation MRR, so no run stops
before round 20 and each reports its best-validation round of the 20 (a stated reduction: one round
of FedCSR at n = 64 on Food-Kitchen is 171 training steps of ~0.3 s each on one idle core, see
``benchmarks/fedcsr_step.py``, plus two evaluations). No method gets other defaults
(:data:`DEFAULT_ROUNDS` is empty).

Softmax. Eqs. 16-17 are softmaxes over ~30k items per domain; every model whose loss is such
a softmax (FedCSR, TiSASRec, π-Net, PSJNet, MIFN, C2DSR) trains on real data with a
**sampled softmax** over the target and :data:`SAMPLED_NEGATIVES` = 1000 uniform same-domain
items shared by the mini-batch (:func:`fedlib.methods.sequences.head_cross_entropy`), ~6x faster
per step. Evaluation is unchanged (1 + 999 candidates); each run also records the full ranking of
its selected model against every item of the GT's domain. The synthetic smoke task keeps the
full softmax. Learning rate 1e-3
(the paper's grid {1e-3, 5e-4, 1e-4}; the code's value), batch 256, FedCSR dropout 0.3 (masks from
:mod:`fedlib.models.dropout`, ~3x cheaper on CPU than ``nn.Dropout``; FedCSR and its baselines), τ = 0.5,
(λ1, λ2, λ3) = (0.5, 1.5, 0.5); the baselines keep their own modules' defaults apart from
``dim``, ``maxlen`` and ``seed``.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np
import pandas as pd
import torch

from fedlib.data.protocols import fedcsr as protocol
from fedlib.device import default_device
from fedlib.experiments import grid
from fedlib.experiments.grid import unique_cells  # noqa: F401  (part of this module's API)
from fedlib.methods.fedcsr_baselines import FedProxConfig, evaluate_baseline, train_federated_baseline
from fedlib.methods.sequence_training import evaluate_sequences, platform_graphs
from fedlib.papers.fedcsr.model import FedCSRConfig, FedCSRModel
from fedlib.papers.fedcsr.training import FedCSRTrainConfig, train_fedcsr
from fedlib.reporting.results import config_hash

__all__ = [
    "PAPER", "VERSION", "DATASETS", "METHODS", "BASELINES", "VARIANTS", "ALPHAS", "HIDDEN_FACTORS", "SMALL_DIM",
    "MAIN_DIM", "ROUNDS", "PATIENCE", "SAMPLED_NEGATIVES", "TIES_AGAINST_PREFIX", "PARTS", "cell", "method_cell",
    "method_label", "dataset_label", "load_split", "largest_platforms", "random_ranking_mrr", "constant_score_audit", "checkpointable", "CHECKPOINT_EVERY_S",
    "fedcsr_configs", "run_cell", "grid_cells", "unique_cells", "run_grid", "run_cells", "main", "config_hash",
]

PAPER = "fedcsr"
VERSION = 2  # bump when a change alters the numbers a cell produces (invalidates cached runs)

DATASETS: Dict[str, str] = {"Food-Kitchen": "c2dsr-food-kitchen", "Movie-Book": "c2dsr-movie-book"}
"""Paper scenario -> protocol dataset name."""

#: baseline -> (module, model class, config class)
BASELINE_SPECS: Dict[str, tuple] = {
    "TiSASRec": ("fedlib.methods.tisasrec", "TiSASRec", "TiSASRecConfig"),
    "CLSR": ("fedlib.methods.clsr", "CLSR", "CLSRConfig"),
    "CoNet": ("fedlib.methods.conet", "CoNet", "CoNetConfig"),
    "CCDR": ("fedlib.methods.ccdr", "CCDR", "CCDRConfig"),
    "PiNet": ("fedlib.methods.pinet", "PiNet", "PiNetConfig"),
    "PSJNet": ("fedlib.methods.psjnet", "PSJNet", "PSJNetConfig"),
    "MIFN": ("fedlib.methods.mifn", "MIFN", "MIFNConfig"),
    "C2DSR": ("fedlib.methods.c2dsr", "C2DSR", "C2DSRConfig"),
}
BASELINES = tuple(BASELINE_SPECS)
METHODS = ("FedCSR", "Individual", "Centralized") + BASELINES

#: FedCSR variant -> (model flags of FedCSRConfig, round-loop flags of FedCSRTrainConfig)
VARIANTS: Dict[str, tuple] = {
    "FedCSR": ({}, {}),
    "w/o SCL": ({"use_scl": False}, {}),
    "w/o MCL": ({"use_mcl": False}, {}),
    "w/o SCL & MCL": ({"use_mcl": False, "use_scl": False}, {}),
    "w/o unified": ({"use_unified": False}, {}),
    "w/o single": ({"use_single": False}, {}),
    # the public code's configuration (``model/trainer.py``, ``train_rec.py``): one change at a time, then all
    "code: prediction only": ({"use_mcl": False, "use_scl": False}, {}),
    "code: central graph": ({}, {"central_graph": True}),
    "code: shared Adam": ({}, {"shared_optimizer": True}),
    "code: all": ({"use_mcl": False, "use_scl": False, "binary_graph": False},
                  {"central_graph": True, "shared_optimizer": True, "weight_by": "sequences", "tie_rule": "code"}),
}
ABLATION_VARIANTS = ("FedCSR", "w/o SCL", "w/o MCL", "w/o SCL & MCL", "w/o unified", "w/o single")
AUDIT_VARIANTS = ("FedCSR", "code: prediction only", "code: central graph", "code: shared Adam", "code: all")

MAIN_DIM = 256       # the paper's embedding size: FedCSR's main rows
SMALL_DIM = 64       # baselines, sweeps, and FedCSR again for a like-for-like Table 2
ROUNDS = 20          # paper App. A.2: 100 (every method); reduced, module docstring
# The paper's patience. With at most ROUNDS rounds it never fires: every run trains 20 rounds and
# reports its best-validation round. (Patience 5 stopped CCDR on Food-Kitchen after round 6 on a
# near-chance validation MRR of round 1, 0.0092 against 0.0075 for a random ranking, while its
# test MRR was still rising.)
PATIENCE = 20
SAMPLED_NEGATIVES = 1000  # shared uniform negatives per domain and mini-batch (real data only)
DEFAULT_ROUNDS: Dict[str, int] = {}   # no method deviates from ROUNDS
LR = 1e-3
FEDPROX_MU = 0.01
ALPHAS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)                  # Table 5 (paper prints 0.1/0.3/0.5/0.7)
HIDDEN_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)                   # Figure 6: t's hidden size / n
SYNTHETIC_NEGATIVES = 20
REAL_NEGATIVES = 999
#: metrics prefix of the test scores re-ranked with ties counted against the ground truth
TIES_AGAINST_PREFIX = "ties_against/"


def cell(dataset: str, method: str = "FedCSR", *, variant: str = "FedCSR", dim: Optional[int] = None,
         alpha: float = 0.3, rounds: Optional[int] = None, patience: int = PATIENCE, seed: int = 0,
         lr: float = LR, local_epochs: int = 3, batch_size: int = 256, maxlen: int = 15,
         num_negatives: Optional[int] = None, sampled_negatives: Optional[int] = -1,
         scl_hidden_factor: float = 2.0, platforms: Optional[int] = None) -> Dict[str, Any]:
    """One run of the grid as a plain dict.

    Args:
        dataset: a key of :data:`DATASETS` or ``"synthetic"`` (smoke task).
        method: one of :data:`METHODS`.
        variant: a key of :data:`VARIANTS` (``"FedCSR"`` method only).
        dim: embedding size; default :data:`MAIN_DIM` for FedCSR / Centralized, :data:`SMALL_DIM` otherwise.
        alpha: the augmentation ratio α (FedCSR-family methods only).
        scl_hidden_factor: hidden size of the SCL transformation ``t`` over ``n`` (FedCSR family; paper 2).
        rounds, patience: at most ``rounds`` (default :data:`ROUNDS`) rounds; stop after
            ``patience`` rounds without a better mean validation MRR.
        lr, local_epochs, batch_size, maxlen: the round loop and input window (paper: 1e-3, 3, 256, 15).
        num_negatives: negatives per evaluation row; default 999 (real data) or 20 (synthetic).
        sampled_negatives: training softmax over the target and this many shared negatives;
            ``None`` = full softmax; default (-1): :data:`SAMPLED_NEGATIVES` on real data, full on synthetic.
        platforms: keep only this many platforms, the ones with the most training sequences
            (:func:`largest_platforms`; their own valid and test users only); ``None`` = all 10.
            A smaller federation that learns in a few rounds (the lesson's live run).
    """
    if dataset not in DATASETS and dataset != "synthetic":
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {sorted(DATASETS)} or 'synthetic'")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    if method != "FedCSR" and variant != "FedCSR":
        raise ValueError(f"variant {variant!r} applies to method 'FedCSR' only, not {method!r}")
    if variant not in VARIANTS:
        raise ValueError(f"unknown FedCSR variant {variant!r}; expected one of {list(VARIANTS)}")
    fedcsr_family = method in ("FedCSR", "Individual", "Centralized")
    if dim is None:
        dim = MAIN_DIM if method in ("FedCSR", "Centralized") else SMALL_DIM
    for name, value in (("dim", dim), ("patience", patience), ("local_epochs", local_epochs),
                        ("batch_size", batch_size), ("maxlen", maxlen)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < (2 if name in
                                                                                           ("dim", "maxlen") else 1):
            raise ValueError(f"{name} must be a positive integer{' >= 2' if name in ('dim', 'maxlen') else ''}, "
                             f"got {value!r}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha (augmentation ratio) must be in [0, 1], got {alpha!r}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr!r}")
    rounds = int(rounds if rounds is not None else DEFAULT_ROUNDS.get(method, ROUNDS))
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if num_negatives is None:
        num_negatives = SYNTHETIC_NEGATIVES if dataset == "synthetic" else REAL_NEGATIVES
    if int(num_negatives) < 1:
        raise ValueError(f"num_negatives must be >= 1, got {num_negatives!r}")
    if sampled_negatives == -1:
        sampled_negatives = None if dataset == "synthetic" else SAMPLED_NEGATIVES
    if sampled_negatives is not None and (isinstance(sampled_negatives, bool) or int(sampled_negatives) < 1):
        raise ValueError(f"sampled_negatives must be None (full softmax) or a positive int, got {sampled_negatives!r}")
    config: Dict[str, Any] = {"paper": PAPER, "version": VERSION, "dataset": dataset, "method": method,
                              "seed": int(seed), "dim": int(dim), "rounds": rounds, "patience": int(patience),
                              "lr": float(lr), "local_epochs": int(local_epochs), "batch_size": int(batch_size),
                              "maxlen": int(maxlen), "num_negatives": int(num_negatives),
                              "sampled_negatives": None if sampled_negatives is None else int(sampled_negatives)}
    if not scl_hidden_factor > 0:
        raise ValueError(f"scl_hidden_factor must be > 0, got {scl_hidden_factor!r}")
    if platforms is not None:            # absent by default: the grid's cells keep their keys (and cache hashes)
        if isinstance(platforms, bool) or not isinstance(platforms, (int, np.integer)) or platforms < 1:
            raise ValueError(f"platforms must be None (all) or a positive integer, got {platforms!r}")
        config["platforms"] = int(platforms)
    if fedcsr_family:
        config["alpha"] = float(alpha)
        if float(scl_hidden_factor) != 2.0:      # keep the default cells' keys (and cache hashes) unchanged
            config["scl_hidden_factor"] = float(scl_hidden_factor)
    if method == "FedCSR":
        config["variant"] = variant
    return config


def method_cell(dataset: str, method: str, cell_kwargs: Mapping[str, Any] = {},
                method_kwargs: Mapping[str, Mapping[str, Any]] = {}, **extra) -> Dict[str, Any]:
    """:func:`cell` with the profile's common keywords, then the method's own."""
    return cell(dataset, method, **{**cell_kwargs, **method_kwargs.get(method, {}), **extra})


def method_label(config: Mapping[str, Any]) -> str:
    """The row label: ``"FedCSR"``, ``"w/o SCL"``, ``"code: central graph"``, ``"C2DSR"``, ``"Individual"``."""
    if config["method"] == "FedCSR":
        return config["variant"]
    return config["method"]


def dataset_label(config: Mapping[str, Any]) -> str:
    """``"Food-Kitchen"``, or ``"Food-Kitchen (substitute split)"`` when the training file is absent."""
    dataset = config["dataset"]
    if dataset == "synthetic":
        return "synthetic"
    split = load_split(dataset, config["num_negatives"], config["seed"])
    return dataset + (" (substitute split)" if split.extra.get("substitute_train") else "")


# ======================================================================================
# Data
# ======================================================================================
@functools.lru_cache(maxsize=8)
def load_split(dataset: str, num_negatives: int = REAL_NEGATIVES, seed: int = 0):
    """The FedCSR split of ``dataset`` (cached): 10 platforms, 1 + ``num_negatives`` candidates."""
    if dataset == "synthetic":
        from fedlib.data.synthetic import cross_domain_sequences
        return cross_domain_sequences(num_users=120, items_a=30, items_b=30, topics=4, num_negatives=num_negatives,
                                      seed=seed)
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
    model_flags, train_flags = VARIANTS[config.get("variant", "FedCSR")]
    model = FedCSRConfig(dim=config["dim"], maxlen=config["maxlen"], alpha=config["alpha"],
                         sampled_negatives=config.get("sampled_negatives"),
                         scl_hidden_factor=config.get("scl_hidden_factor", 2.0), **model_flags)
    train = FedCSRTrainConfig(rounds=config["rounds"], local_epochs=config["local_epochs"],
                              batch_size=config["batch_size"], lr=config["lr"], patience=config["patience"],
                              seed=config["seed"], device=_device_name(device), **train_flags)
    return model, train


def baseline_factory(config: Mapping[str, Any], split) -> Callable[[], torch.nn.Module]:
    """``() -> model`` of a baseline cell: its own defaults apart from ``dim``, ``maxlen``, ``seed``
    and, for the models trained with a softmax over a domain's items, ``sampled_negatives``."""
    module_name, model_name, config_name = BASELINE_SPECS[config["method"]]
    module = importlib.import_module(module_name)
    model_class, config_class = getattr(module, model_name), getattr(module, config_name)
    sizes = {"dim": config["dim"], "maxlen": config["maxlen"], "seed": config["seed"]}
    if "sampled_negatives" in {f.name for f in dataclasses.fields(config_class)}:
        sizes["sampled_negatives"] = config.get("sampled_negatives")
    model_config = config_class(**sizes)
    return lambda: model_class(split.num_items_a, split.num_items_b, model_config)


def baseline_train_config(config: Mapping[str, Any], device=None) -> FedProxConfig:
    return FedProxConfig(rounds=config["rounds"], local_epochs=config["local_epochs"],
                         batch_size=config["batch_size"], lr=config["lr"], mu=FEDPROX_MU,
                         patience=config["patience"], seed=config["seed"], device=_device_name(device))


# ======================================================================================
# Runs
# ======================================================================================
def _flat(block: Mapping[str, Mapping[str, float]], prefix: str = "") -> Dict[str, float]:
    return {f"{prefix}{domain}/{key}": float(value) for domain, values in block.items() for key, value in values.items()}


def checkpointable(config: Mapping[str, Any]) -> bool:
    """Whether :func:`run_cell` can save and resume ``config`` mid-run: every method can (FedCSR,
    Individual, Centralized and the FedProx baselines all run on the trainer, whose checkpoints
    resume a run exactly; an n = 256 FedCSR cell takes about 2 h)."""
    return config["method"] in METHODS


def run_cell(config: Mapping[str, Any], device=None, progress: Optional[Callable[[int], None]] = None,
             checkpointer=None) -> Dict[str, Any]:
    """Train one cell: ``{"metrics": {...}, "extra": {"curve": [...], ...}}`` (module docstring).

    ``checkpointer``: a :class:`~fedlib.engine.Checkpointer` named after the cell; a
    :func:`checkpointable` cell resumes from its snapshot and saves on its schedule, so a killed
    run continues at its last save with the numbers of an uninterrupted one.
    ``metrics["seconds"]`` then counts the earlier sessions' time up to that save, and
    ``extra["resumed_at"]`` lists the rounds it was resumed at.
    """
    if checkpointer is not None and not checkpointable(config):
        checkpointer = None
    started = time.perf_counter()
    split = load_split(config["dataset"], config["num_negatives"], config["seed"])
    if config.get("platforms") is not None:
        split = largest_platforms(split, config["platforms"])
    method = config["method"]
    if method in ("FedCSR", "Individual", "Centralized"):
        model_config, train_config = fedcsr_configs(config, device)
        trained_on = centralized_split(split) if method == "Centralized" else split
        on_round = (lambda row: progress(row["round"])) if progress else None
        result = train_fedcsr(trained_on, model_config, train_config, individual=method == "Individual",
                              progress=on_round, checkpointer=checkpointer)
        # each platform's own test rows, scored by its own model (Individual) or by the one
        # federated model (FedCSR): Table 9 / Figure 4 compare the two platform by platform
        per_platform = result.per_platform if method in ("FedCSR", "Individual") else []
        models = result.models
        full = evaluate_sequences(models[0], trained_on, "test", result.graphs,
                                  models=models if len(models) > 1 else None, full_ranking=True)
        ties_against = evaluate_sequences(models[0], trained_on, "test", result.graphs,
                                          models=models if len(models) > 1 else None, tie_rule="pessimistic")
    else:
        result = train_federated_baseline(baseline_factory(config, split), split,
                                          baseline_train_config(config, device), device=_device_name(device),
                                          progress=(lambda row: progress(row["round"])) if progress else None,
                                          checkpointer=checkpointer)
        per_platform = []
        full = evaluate_baseline(result.model, split, "test", result.artifacts.get("graphs"), full_ranking=True)
        ties_against = evaluate_baseline(result.model, split, "test", result.artifacts.get("graphs"),
                                         tie_rule="pessimistic")
    metrics = _flat(result.selected)
    metrics.update(_flat(result.test_selected, "test_selected/"))
    names = split.extra.get("domain_names", ("A", "B"))
    metrics.update({f"full/{d}/test/{m}": float(v) for d in names for m, v in full[d].items() if m != "count"})
    # The sampled protocol again with ties counted against the ground truth: equal to the
    # reported (optimistic) value unless the model gives the GT and some negatives one score,
    # which the optimistic rule rewards (a floored MIFN once scored MRR 0.89 that way).
    metrics.update({f"{TIES_AGAINST_PREFIX}{d}/test/{m}": float(v) for d in names
                    for m, v in ties_against[d].items() if m != "count"})
    for k, block in enumerate(per_platform):
        metrics.update(_flat(block, f"platform{k}/"))
    history = result.history
    metrics.update(selected_round=int(result.selected_round), test_selected_round=int(result.test_selected_round),
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
# The grid
# ======================================================================================
def table2_cells(datasets: Sequence[str] = tuple(DATASETS), **kwargs) -> List[Dict[str, Any]]:
    """Table 2: FedCSR at 256 and at 64, and the eight baselines at 64, on both scenarios."""
    out = []
    for d in datasets:
        out += [cell(d, "FedCSR", dim=MAIN_DIM, **kwargs), cell(d, "FedCSR", dim=SMALL_DIM, **kwargs)]
        out += [cell(d, m, dim=SMALL_DIM, **kwargs) for m in BASELINES]
    return out


def ablation_cells(datasets: Sequence[str] = tuple(DATASETS), **kwargs) -> List[Dict[str, Any]]:
    """Tables 3-4 (SCL / MCL) and Figure 2 (w/o unified, w/o single) at :data:`SMALL_DIM` on both scenarios."""
    return [cell(d, "FedCSR", variant=v, dim=SMALL_DIM, **kwargs) for d in datasets for v in ABLATION_VARIANTS]


def alpha_cells(dataset: str = "Food-Kitchen", **kwargs) -> List[Dict[str, Any]]:
    """Table 5: FedCSR at each α of :data:`ALPHAS` (Food-Kitchen, :data:`SMALL_DIM`)."""
    return [cell(dataset, "FedCSR", alpha=a, dim=SMALL_DIM, **kwargs) for a in ALPHAS]


def hidden_cells(dataset: str = "Food-Kitchen", **kwargs) -> List[Dict[str, Any]]:
    """Figure 6: FedCSR at each hidden size factor of ``t`` in :data:`HIDDEN_FACTORS` (:data:`SMALL_DIM`)."""
    return [cell(dataset, "FedCSR", dim=SMALL_DIM, scl_hidden_factor=f, **kwargs) for f in HIDDEN_FACTORS]


def individual_cells(dataset: str = "Food-Kitchen", **kwargs) -> List[Dict[str, Any]]:
    """Table 9 / Figure 4: FedCSR, each platform alone, and centralised training (:data:`SMALL_DIM`)."""
    return [cell(dataset, m, dim=SMALL_DIM, **kwargs) for m in ("FedCSR", "Individual", "Centralized")]


def audit_cells(dataset: str = "Food-Kitchen", **kwargs) -> List[Dict[str, Any]]:
    """The public code's configuration vs the paper's method (Food-Kitchen, :data:`SMALL_DIM`).

    ``"code: prediction only"`` has the flags of ``"w/o SCL & MCL"``; it is kept as its own
    row (and run) so the audit table reads on its own. Test-set selection needs no extra run:
    every run records its ``test_selected`` metrics.
    """
    return [cell(dataset, "FedCSR", variant=v, dim=SMALL_DIM, **kwargs) for v in AUDIT_VARIANTS]


PARTS = ("table2", "ablation", "alpha", "hidden", "individual", "audit")
#: Wall-time seconds between two snapshots of a checkpointable cell in the resumable grid.
CHECKPOINT_EVERY_S = 900.0
_MAKERS = {"table2": table2_cells, "ablation": ablation_cells, "alpha": alpha_cells, "hidden": hidden_cells,
           "individual": individual_cells, "audit": audit_cells}


def grid_cells(part: str, **kwargs) -> List[Dict[str, Any]]:
    """The cells of one part of the paper-profile grid."""
    if part not in _MAKERS:
        raise ValueError(f"unknown part {part!r}; expected one of {PARTS}")
    return _MAKERS[part](**kwargs)


def run_grid(cells: Iterable[Mapping[str, Any]], profile: str = "paper", *,
             cache_dir: Path = Path(".cache/fedcsr"), worker: int = 0, workers: int = 1,
             progress: bool = True, rerun: bool = False) -> pd.DataFrame:
    """Run every cell without a recorded result (this worker's share), appending each to runs.jsonl.

    A :func:`checkpointable` cell saves a snapshot every :data:`CHECKPOINT_EVERY_S` seconds (and
    when it stops) under ``cache_dir/<profile>/checkpoints/``; a killed worker's cell continues
    there when a worker next takes it (an n = 256 cell can outlast a working session).
    """
    return grid.run_recorded_grid(PAPER, unique_cells(cells), _train, profile, cache_dir=cache_dir, worker=worker,
                                  workers=workers, progress=progress, checkpoint_every_s=CHECKPOINT_EVERY_S,
                                  rerun=rerun)


def run_cells(cells: Sequence[Mapping[str, Any]], profile: str, description: str = "cells") -> List[Dict[str, Any]]:
    """What a notebook calls: train each cell and record it at ``profile`` (see :func:`fedlib.experiments.grid.run_cells`)."""
    return grid.run_cells(PAPER, cells, profile, _train, method_label, description)


def _train(config: Mapping[str, Any], progress=None, checkpointer=None) -> Dict[str, Any]:
    return run_cell(config, progress=progress, checkpointer=checkpointer)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m fedlib grid fedcsr <parts> [--methods ..] [--seeds ..] ...`` (:func:`fedlib.experiments.grid.grid_main`)."""
    grid.grid_main(argv, paper=PAPER, title="FedCSR", parts=PARTS, grid_cells=grid_cells, label=method_label,
                   run_grid=run_grid, filters={"--datasets": grid.CellFilter("dataset", list(DATASETS)), "--dims": grid.CellFilter("dim", type=int)})
