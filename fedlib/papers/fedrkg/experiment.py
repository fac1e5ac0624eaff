r"""FedRKG experiments: every table and figure of the paper as cells of one grid.

Reference:
    Lim, Kweon, Kim, Kim, Kim, Yu. "Federated Recommendation with Knowledge Guidance"
    (FedRKG), ICLR 2026 submission, https://openreview.net/forum?id=oj2Xj8WXih (arXiv:2511.12959);
    protocol details follow the public code, https://github.com/Jaehyung-Lim/fedrkg
    (``main.py``, ``utils/data.py``, ``utils/evaluation_all.py``).

A **cell** is a plain dict (hashable by :func:`~fedlib.reporting.config_hash`) that fixes one
run: dataset, method (and its hyperparameters), guidance mode, negative sampler, rounds,
evaluation schedule, optional LDP noise, seed. :func:`run_cell` trains it and returns

* ``metrics``: the test metrics at the best-validation evaluation (Recall/NDCG @5/10/20,
  in [0, 1]), the selected round, the validation score, seconds;
* ``extra``: the learning curve (validation and test metrics at every evaluation), per-user
  test metrics at the selected evaluation (warm/cold analysis, significance), and for
  probe/trace cells the guidance-round probe (Table 4, D.3, D.4) or the leak trace.

Protocol (paper App. C.2 and the public code's ``main.py`` and ``utils/data.py``):

* leave-last-out split, full ranking over all items, train (+ valid for test) masked;
* 4 negatives per positive, batch 256, one local epoch, every user in every round, d = 32;
* model selection on validation Recall@10 with later ties winning (the code's ``>=``),
  patience 100 rounds; the test metrics reported are those of the selected evaluation
  (the code evaluates the test set at every round and keeps the best-validation one); a
  probe cell (Table 4) is not stopped by patience before its probe round;
* **negative sampler**: ``"correct"`` excludes only the user's training items; ``"leaky"``
  (``exclude="all_rated"``) reproduces the public code, whose negatives avoid the
  validation and test items too (the evaluation audit). The headline tables use
  ``"correct"``.

What we evaluate less often than the code: every ``eval_every`` rounds (the code: every
round). Patience is kept in rounds (100), i.e. ``ceil(100 / eval_every)`` evaluations.

The path of a cell: :func:`run_cell` builds the method (:func:`make_federated`; FedRKG's is
:func:`fedlib.papers.fedrkg.method.guided_method` with
:class:`~fedlib.papers.fedrkg.method.KnowledgeGuidance` attached) and hands it to the engine's
``run_federated``; what it records besides the training (selection, probes, LDP accounting)
is :mod:`fedlib.papers.fedrkg.measures`. The grid's parts (one list of cells per table or
figure, :func:`grid_cells`) are run by ``python -m fedlib grid fedrkg <parts>`` (:func:`main`).
"""
from __future__ import annotations

import functools
import math
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np
import pandas as pd
import torch

from fedlib.data.protocols import build_split
from fedlib.data.sampling import NegativeSampler
from fedlib.device import default_device
from fedlib.engine import (BatchedExecutor, FederatedConfig, RankingEvaluator, fedmf_method, fedncf_method,
                           personal_table_method, pfedrec_method, run_federated, union_pairs)
from fedlib.engine.method import GradientNoise
from fedlib.experiments import grid
from fedlib.papers.fedrkg.guidance import GUIDED_BACKBONES, guided_backbone
from fedlib.papers.fedrkg.measures import (SELECTION_METRIC, SelectionRecorder, guidance_probe, ldp_epsilon, ldp_params,
                                           run_centralised)
from fedlib.papers.fedrkg.method import LOG_KEY, KnowledgeGuidance, guided_method
from fedlib.reporting.results import config_hash

__all__ = [
    "PAPER", "VERSION", "DATASETS", "OFFLINE_DATASETS", "METHODS", "CENTRALISED", "GUIDANCE_MODES", "SAMPLERS",
    "KS", "SELECTION_METRIC", "cell", "paper_rounds", "paper_beta", "load_split", "make_sampler",
    "SelectionRecorder", "run_cell", "checkpointable", "guidance_rounds", "ldp_epsilon", "config_hash",
]

PAPER = "fedrkg"
VERSION = 1  # bump when a change alters the numbers a cell produces (invalidates cached runs)

#: the paper's dataset names -> registry names of the FedRKG protocol
DATASETS = {"Amazon-Video": "amazon-video", "FilmTrust": "filmtrust", "LastFM-2K": "hetrec2011-lastfm-2k",
            "ML-1M": "ml-1m"}
#: what is in the offline data root (ML-1M needs the full ratings.dat: download)
OFFLINE_DATASETS = ("Amazon-Video", "FilmTrust", "LastFM-2K")

CENTRALISED = ("MF", "NeuMF")
METHODS = CENTRALISED + ("FedMF", "FedNCF", "PFedRec", "GPFedRec", "CoFedRec", "FedRAP", "FedDAE", "FedRKG")
#: FedRKG's ablations (Table 2): mode of :class:`~fedlib.papers.fedrkg.method.KnowledgeGuidance`
GUIDANCE_MODES = {"adaptive": "FedRKG", "fixed": "w/o AG", "global_only": "w/ GIE", "personal_only": "w/ PIE"}
SAMPLERS = {"correct": "train", "leaky": "all_rated"}
KS = (5, 10, 20)
PATIENCE_ROUNDS = 100


#: epochs of the centralised baselines (the paper gives none; both converge well within it)
CENTRAL_EPOCHS = 300


def paper_rounds(dataset: str, method: Optional[str] = None) -> int:
    """Maximum rounds (App. C.2): 3,000 on LastFM-2K, 1,000 elsewhere; centralised: 300 epochs."""
    if method in CENTRALISED:
        return CENTRAL_EPOCHS
    return 3000 if dataset == "LastFM-2K" else 1000


def paper_beta(dataset: str) -> float:
    """β of Eqs. 3/9 (App. C.2): 0.999 on LastFM-2K, 0.99 elsewhere."""
    return 0.999 if dataset == "LastFM-2K" else 0.99


def paper_lr_decay(dataset: str) -> float:
    """The code's per-round learning-rate decay (``decay_rate``): 0.99 on Amazon-Video, else 1."""
    return 0.99 if dataset == "Amazon-Video" else 1.0


#: FedRAP parameters beyond :data:`DEFAULT_PARAMS` that only the code-optimiser cells set.
FEDRAP_CODE_PARAMS = {"weight_decay", "batch_lr_decay", "tol", "curriculum"}

#: Method hyperparameters of the paper profile: the public code's values (its scripts and argparse defaults) where it
#: has them, the paper's App. C.2 architecture sizes otherwise. The paper "selects learning
#: rates from {1e-4, …, 1e-1}" without reporting the choice; we keep the code's values.
DEFAULT_PARAMS: Dict[str, Dict[str, Any]] = {
    # Centralised SGD on the mean BCE of a 256-example batch: the code-style 0.1 leaves MF at its
    # N(0, 0.01²) init (FilmTrust test R@10 0.02 after 100 epochs). Chosen once on FilmTrust
    # validation R@10 after 100 epochs: MF lr ∈ {1, 10, 50} → 10 (0.377 / 0.412 / 0.385);
    # NeuMF: lr 1 (validation R@10 0.377 after 100 epochs; larger rates not tried).
    "MF": {"lr": 10.0, "epochs_per_round": 1},
    "NeuMF": {"lr": 1.0, "hidden": (32, 16, 8), "epochs_per_round": 1},
    "FedMF": {"lr": 1.0},
    "FedNCF": {"lr": 0.05, "lr_eta": 170.0, "hidden": (32,)},
    "PFedRec": {"lr": 0.1, "lr_eta": 80.0},
    "GPFedRec": {"lr": 0.1, "lr_eta": 80.0, "reg": 1.0, "threshold_scale": 0.5, "hidden": (32, 16, 8),
                 "similarity": "cosine"},
    # L_sup over the batch's distinct items ("batch"), not the paper's every item ("table"): over
    # every item a client step holds (I + B)² similarities (FilmTrust 5.4 M, Amazon-Video 67 M,
    # LastFM-2K 320 M floats per client and step), which costs hours per round on a CPU.
    "CoFedRec": {"lr": 0.05, "lr_eta": 80.0, "lam": 0.005, "temperature": 0.5, "num_clusters": 30,
                 "contrastive_rows": "batch"},
    # FedRAP's code decays its rates by 0.97 per round over 10 local epochs; under FedRKG's
    # one-epoch protocol that schedule freezes training after ~100 rounds (0.97^100 ≈ 0.05),
    # so FedRAP gets the protocol's per-dataset decay like every other federated method.
    "FedRAP": {"lr": 0.5, "lr_items": 200.0, "lam": 0.1, "mu": 0.1},
    # SGD at the public code's rate 0.1 (an Adam rate there) diverges (NaN) by round 11. Chosen once
    # on FilmTrust validation R@10 (seed 0, correct sampler) over the paper's grid: 1e-1: 12.6 %
    # (NaN at round 11), 1e-2: 35.5 % (NaN at round 143; the best evaluation before it counts),
    # 1e-3: 8.4 % (patience stop at round 570); 1e-4 learns slower still and was not run.
    "FedDAE": {"lr": 0.01, "beta": 1.0, "hidden": (64,)},
    # the guidance schedule's defaults are the public code's, written once on KnowledgeGuidance
    "FedRKG": {"lr": 0.1, "lr_eta": 80.0, "interval": KnowledgeGuidance.interval, "gate_lr": KnowledgeGuidance.gate_lr,
               "gate_epochs": KnowledgeGuidance.gate_epochs},
}


def cell(dataset: str, method: str, *, guidance: Optional[str] = None, sampler: str = "correct",
         rounds: Optional[int] = None, eval_every: int = 10, seed: int = 0, params: Optional[Mapping] = None,
         ldp: Optional[Mapping[str, float]] = None, probe_round: Optional[int] = None, trace_every: int = 0,
         interval: Optional[int] = None, backbone: str = "FedMF", dim: int = 32, batch_size: int = 256,
         num_negatives: int = 4) -> Dict[str, Any]:
    """One run of the grid, as a plain dict.

    Args:
        dataset: a key of :data:`DATASETS`, or ``"synthetic"`` (smoke profile).
        method: one of :data:`METHODS`.
        guidance: FedRKG's mode (a key of :data:`GUIDANCE_MODES`; default ``"adaptive"``).
        sampler: ``"correct"`` (exclude training items) or ``"leaky"`` (the public code's).
        rounds: maximum rounds (default :func:`paper_rounds`); centralised methods: epochs.
        eval_every: evaluate validation (and test) every k rounds.
        params: overrides of :data:`DEFAULT_PARAMS` (and FedRKG's ``beta``, ``lr_decay``; any
            federated method also takes ``local_epochs``, default 1: the protocol's).
        ldp: ``{"clip": C, "noise_std": s}``: clip each local step's gradient of the private
            item table to L2 norm ``C`` and add ``N(0, s²)`` (Table 5), else ``None``.
        probe_round: evaluate every user's test metrics just before and after the guidance of
            this round (0-based round index ``t`` of ``run_federated``; Table 4, D.3, D.4).
        trace_every: > 0 records the leak trace (negative coverage every round, test-item rank
            every ``trace_every`` rounds).
        interval: FedRKG's guidance interval ``T_int`` (default 100); other methods have none
            and ignore it, so one set of keyword arguments serves a whole grid.
        backbone: FedRKG's backbone (Table 3): ``"FedMF"`` (the paper's main setting),
            ``"FedNCF"`` or ``"PFedRec"``, each with its item table made personal
            (:func:`fedlib.papers.fedrkg.guidance.guided_backbone`). Ignored by other methods.
    """
    if dataset not in DATASETS and dataset != "synthetic":
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {sorted(DATASETS)} or 'synthetic'")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler must be one of {sorted(SAMPLERS)}, got {sampler!r}")
    if method == "FedRKG":
        guidance = guidance or "adaptive"
        if guidance not in GUIDANCE_MODES:
            raise ValueError(f"guidance must be one of {sorted(GUIDANCE_MODES)}, got {guidance!r}")
    elif guidance is not None:
        raise ValueError(f"guidance modes apply to FedRKG only, not to {method}")
    if method == "FedRKG" and backbone not in GUIDED_BACKBONES:
        raise ValueError(f"backbone must be one of {GUIDED_BACKBONES}, got {backbone!r}")
    if int(eval_every) < 1:
        raise ValueError(f"eval_every must be >= 1, got {eval_every}")
    merged = dict(DEFAULT_PARAMS[method])
    if method == "FedRKG":
        merged["beta"] = paper_beta(dataset)
        if interval is not None:
            merged["interval"] = int(interval)
    if method not in CENTRALISED:
        merged["lr_decay"] = paper_lr_decay(dataset)
    optional = set() if method in CENTRALISED else {"local_epochs"}
    if method == "FedRAP":  # the public code's optimiser (fedrap_code_cells); absent from the default cells' hash
        optional |= FEDRAP_CODE_PARAMS
    unknown = set(params or {}) - set(merged) - optional
    if unknown:
        raise ValueError(f"unknown parameters {sorted(unknown)} for {method}; known: {sorted(merged)}")
    merged.update(params or {})
    if ldp is not None:
        missing = {"clip", "noise_std"} - set(ldp)
        if missing:
            raise ValueError(f"ldp needs keys 'clip' and 'noise_std', missing {sorted(missing)}")
        ldp = {"clip": float(ldp["clip"]), "noise_std": float(ldp["noise_std"])}
    return {
        "paper": PAPER, "version": VERSION, "dataset": dataset, "method": method, "guidance": guidance,
        "backbone": backbone if method == "FedRKG" else None,
        "sampler": sampler, "rounds": int(rounds if rounds is not None else paper_rounds(dataset, method)),
        "eval_every": int(eval_every), "patience_rounds": PATIENCE_ROUNDS, "seed": int(seed),
        "params": {k: (list(v) if isinstance(v, tuple) else v) for k, v in sorted(merged.items())},
        "ldp": ldp, "probe_round": None if probe_round is None else int(probe_round),
        "trace_every": int(trace_every), "dim": int(dim), "batch_size": int(batch_size),
        "num_negatives": int(num_negatives),
    }


def method_label(config: Mapping[str, Any]) -> str:
    """The paper's row label of a cell (``"w/o AG"`` for FedRKG's fixed mode, …)."""
    if config["method"] == "FedRKG":
        label = GUIDANCE_MODES[config["guidance"]]
        backbone = config.get("backbone") or "FedMF"
        return label if backbone == "FedMF" else f"{backbone} w/ AG" if config["guidance"] == "adaptive" else \
            f"{backbone} {label}"
    return config["method"]


# ======================================================================================
# Data
# ======================================================================================
@functools.lru_cache(maxsize=4)
def load_split(dataset: str):
    """The FedRKG leave-last-out split of ``dataset`` (cached per process)."""
    if dataset == "synthetic":
        return synthetic_split()
    return build_split(PAPER, DATASETS[dataset])


def synthetic_split(num_users: int = 80, num_items: int = 120, per_user: int = 16, clusters: int = 4, seed: int = 0):
    """A small leave-last-out split with cluster structure (smoke profile; not a paper dataset).

    Users and items belong to ``clusters`` taste groups; each user draws ``per_user`` distinct
    items, 80 % from its own group's items, in a random order that serves as time.
    """
    from fedlib.data.protocols.fedrkg import split_from_frame

    rng = np.random.default_rng(seed)
    user_group = rng.integers(clusters, size=num_users)
    item_group = np.arange(num_items) % clusters
    rows = []
    for u in range(num_users):
        weights = np.where(item_group == user_group[u], 0.8 / (item_group == user_group[u]).sum(),
                           0.2 / (item_group != user_group[u]).sum())
        items = rng.choice(num_items, size=per_user, replace=False, p=weights)
        rows += [(u, int(i), 1.0, t) for t, i in enumerate(items)]
    frame = pd.DataFrame(rows, columns=["user", "item", "rating", "timestamp"])
    return split_from_frame(frame, min_user_interactions=10, name="synthetic/fedrkg")


def make_sampler(split, sampler: str) -> NegativeSampler:
    """``"correct"``: exclude training items; ``"leaky"``: every item rated in train, valid or test."""
    exclude = SAMPLERS[sampler]
    if exclude == "all_rated":
        return NegativeSampler(split.train, split.num_items, exclude="all_rated",
                               all_rated=union_pairs(split.train, split.valid, split.test))
    return NegativeSampler(split.train, split.num_items)


def federated_config(config: Mapping[str, Any], dtype: str = "float32") -> FederatedConfig:
    return FederatedConfig(
        rounds=config["rounds"], seed=config["seed"], num_negatives=config["num_negatives"],
        batch_size=config["batch_size"], local_epochs=int(config["params"].get("local_epochs", 1)),
        clients_per_round=None, eval_every=config["eval_every"],
        patience=math.ceil(config["patience_rounds"] / config["eval_every"]), selection_metric=SELECTION_METRIC,
        prefer_later_ties=True, test_at_end=False, dtype=dtype)


#: ``TrainState.extra`` key: the round whose loss or scores were not finite (the run stopped there)
DIVERGED_KEY = "diverged_at_round"


# ======================================================================================
# Methods
# ======================================================================================
def guidance_rounds(rounds: int, interval: int) -> List[int]:
    """0-based rounds ``t`` before which guidance runs (``KnowledgeGuidance.is_guidance_round``)."""
    schedule = KnowledgeGuidance(interval=int(interval))
    return [t for t in range(int(rounds)) if schedule.is_guidance_round(t)]


def make_federated(config: Mapping[str, Any], split, sampler: NegativeSampler, fed_config: FederatedConfig):
    """``(method, executor)`` of a federated cell."""
    from fedlib.baselines.continual.continual import PlanAugmentingExecutor

    name, p = config["method"], dict(config["params"])
    num_users, num_items, dim = split.num_users, split.num_items, config["dim"]
    decay = p.pop("lr_decay", 1.0)
    p.pop("local_epochs", None)  # read by federated_config
    gradient_noise = None
    if config["ldp"] is not None:
        gradient_noise = GradientNoise.from_std(clip_norm=config["ldp"]["clip"], noise_std=config["ldp"]["noise_std"],
                                                params=ldp_params(name))
    kwargs = {"lr_decay": decay}
    if gradient_noise is not None:
        kwargs["gradient_noise"] = gradient_noise
    executor = BatchedExecutor()
    if name == "FedMF":
        from fedlib.models import FedMF
        method = fedmf_method(FedMF(num_users, num_items, dim), lr=p["lr"], **kwargs)
    elif name == "FedNCF":
        from fedlib.models import FedNCF
        model = FedNCF(num_users, num_items, dim, variant="mlp", hidden=tuple(p["hidden"]))
        method = fedncf_method(model, lr=p["lr"], lr_eta=p["lr_eta"], **kwargs)
    elif name == "PFedRec":
        from fedlib.models import PFedRec
        method = pfedrec_method(PFedRec(num_users, num_items, dim), lr=p["lr"], lr_eta=p["lr_eta"], **kwargs)
    elif name == "GPFedRec":
        from fedlib.baselines.single_domain.gpfedrec import GPFedRecExecutor, GPFedRecModel, gpfedrec_method
        model = GPFedRecModel(num_users, num_items, dim, hidden=tuple(p["hidden"]))
        method = gpfedrec_method(model, lr=p["lr"], lr_eta=p["lr_eta"], reg=p["reg"],
                                 threshold_scale=p["threshold_scale"], similarity=p["similarity"], **kwargs)
        executor = GPFedRecExecutor()  # the whole-table regulariser in closed form (falls back under LDP)
    elif name == "CoFedRec":
        from fedlib.baselines.single_domain.cofedrec import CoFedRecModel, cofedrec_method
        method = cofedrec_method(CoFedRecModel(num_users, num_items, dim), split.train, fed_config, lr=p["lr"],
                                 lr_eta=p["lr_eta"], lam=p["lam"], temperature=p["temperature"],
                                 num_clusters=_item_clusters(int(p["num_clusters"]), num_items),
                                 contrastive_rows=p["contrastive_rows"], **kwargs)
        rows = config["batch_size"] + (num_items if p["contrastive_rows"] == "table" else 0)
        executor = PlanAugmentingExecutor(BatchedExecutor(chunk_size=supcon_chunk(rows)))
    elif name == "FedRAP":
        from fedlib.baselines.single_domain.fedrap import FedRAP, FedRAPCodeExecutor, fedrap_method
        method = fedrap_method(FedRAP(num_users, num_items, dim), lr=p["lr"], lr_items=p["lr_items"], lam=p["lam"],
                               mu=p["mu"], lr_decay=decay, curriculum=p.get("curriculum", "tanh"),
                               **{k: v for k, v in kwargs.items() if k != "lr_decay"})
        code_optimizer = {k: p[k] for k in ("weight_decay", "batch_lr_decay", "tol") if k in p}
        if code_optimizer:  # the public code's SGD: weight decay, per-batch decay, early-stopped epochs
            if gradient_noise is not None:
                raise ValueError("FedRAP's code optimiser (weight_decay, batch_lr_decay, tol) runs without LDP noise: "
                                 "drop those parameters or the ldp setting")
            executor = FedRAPCodeExecutor(**code_optimizer)
    elif name == "FedDAE":
        from fedlib.baselines.single_domain.feddae import FedDAEModel, feddae_method
        from fedlib.baselines.single_domain.feddae_executor import FedDAEExecutor
        model = FedDAEModel(num_users, num_items, train=split.train, latent_dim=dim, hidden=tuple(p["hidden"]))
        method = feddae_method(model, lr=p["lr"], beta=p["beta"], **kwargs)
        # one local step per round: shared global parameters, the first layers at the user's items
        # only (the reference path, used otherwise, copies ~4·h·I numbers per client)
        executor = FedDAEExecutor(chunk_size=256, reference_chunk_size=64)
    elif name == "FedRKG":
        model = guided_backbone(config.get("backbone") or "FedMF", num_users, num_items, dim)
        clip = None if gradient_noise is not None else 1.0  # GradientNoise clips (to its own bound)
        if (config.get("backbone") or "FedMF") == "FedMF":
            base = personal_table_method(model, lr=p["lr"], lr_eta=p["lr_eta"], grad_clip_norm=clip, **kwargs)
        else:
            base = guided_method(model, lr=p["lr"], lr_eta=p["lr_eta"], grad_clip_norm=clip, **kwargs)
        guidance = KnowledgeGuidance(beta=p["beta"], interval=int(p["interval"]), mode=config["guidance"],
                                     gate_lr=p["gate_lr"], gate_epochs=int(p["gate_epochs"]))
        method = guidance.attach(base, split.train, fed_config, sampler)
    else:  # pragma: no cover - cell() validates
        raise ValueError(name)
    return method, executor


#: floats the clients of one CoFedRec chunk may hold in their L_sup similarity matrices (1 GiB)
SUPCON_BUDGET_FLOATS = 1 << 28
#: (B, B) tensors alive per client in L_sup's forward and backward, counted with margin from
#: :func:`fedlib.baselines.single_domain.cofedrec.supcon_loss` (similarities, masks, masked copies, exponentials
#: of the log-sum-exps, their gradients)
SUPCON_COPIES = 12


def supcon_chunk(rows: int) -> int:
    """Clients per batched chunk for CoFedRec, whose L_sup compares every row of a step with every other.

    ``rows`` per client and step: the batch, plus every item with ``contrastive_rows="table"``
    (FilmTrust: 2,327 rows, ``(B, B)`` matrices of 5.4 M floats; the executor's default chunk of
    up to 1,024 clients would need ~100 GB). The chunk size bounds memory only; clients are
    independent, so it does not change what they learn.
    """
    rows = int(rows)
    if rows < 1:
        raise ValueError(f"rows must be >= 1 (rows per client and local step), got {rows}")
    return max(1, SUPCON_BUDGET_FLOATS // (SUPCON_COPIES * rows * rows))


def _item_clusters(wanted: int, num_items: int) -> int:
    """CoFedRec's item clusters: ``wanted`` (30), but at most one per 10 items on tiny (smoke) data."""
    return int(max(2, min(wanted, num_items // 10)))


# ======================================================================================
# Running one cell
# ======================================================================================
def checkpointable(config: Mapping[str, Any]) -> bool:
    """Whether :func:`run_cell` can save and resume ``config`` mid-run.

    Federated cells can. Not: the centralised baselines (minutes per cell), and the probe and
    trace cells, whose measurements accumulate outside the training state.
    """
    return config["method"] not in CENTRALISED and config["probe_round"] is None and config["trace_every"] == 0


def run_cell(config: Mapping[str, Any], device=None, progress: Optional[Callable[[dict], None]] = None,
             checkpointer=None) -> Dict[str, Any]:
    """Train one cell; ``{"metrics": {...}, "extra": {...}}`` (see the module docstring).

    ``progress(record)`` is called after every round (e.g. a tqdm update).
    ``checkpointer``: a :class:`~fedlib.engine.Checkpointer` named after the cell (one file per
    cell); a :func:`checkpointable` cell resumes from it and saves to it on its schedule, so
    a killed run continues at its last save with the identical result. ``metrics["seconds"]``
    then counts the earlier sessions' time up to that save, and ``extra["resumed_at"]`` lists
    the rounds it was resumed at. Other cells ignore it.
    """
    device = torch.device(device) if device is not None else default_device()
    if checkpointer is not None and not checkpointable(config):
        checkpointer = None
    started = time.perf_counter()
    split = load_split(config["dataset"])
    sampler = make_sampler(split, config["sampler"])
    evaluator = RankingEvaluator(split.train, split.valid, split.test, ks=KS)
    recorder = SelectionRecorder(evaluator)
    extra: Dict[str, Any] = {}
    if config["method"] in CENTRALISED:
        history = run_centralised(config, split, sampler, recorder, device)
        rounds_run = len(history)
    else:
        fed_config = federated_config(config)
        method, executor = make_federated(config, split, sampler, fed_config)
        hooks = []
        if config["probe_round"] is not None:
            method, probe = guidance_probe(method, config, split, evaluator, fed_config)
            extra["probe"] = probe
        trace = None
        if config["trace_every"] > 0:
            from fedlib.audits.leak_trace import leak_trace_hook
            from fedlib.metrics.leak_audit import LeakTrace
            trace = LeakTrace(split.train, split.test, split.num_items, valid=split.valid)
            hooks.append(leak_trace_hook(trace, method, split.train, fed_config, sampler=sampler,
                                         every=config["trace_every"]))
        if progress is not None:
            hooks.append(lambda state, record: progress(record))

        def on_round_end(state, record):
            loss = record.get("train_loss")
            if recorder.diverged or (loss is not None and not math.isfinite(loss)):
                # A NaN/inf loss or NaN scores: the parameters are lost; stop (recorded below;
                # kept in the state so that a checkpoint of the stopped run carries it).
                state.extra.setdefault(DIVERGED_KEY, int(record["round"]))
                state.stopped_early = True
                return
            probe_round = config["probe_round"]
            if probe_round is not None and state.stopped_early and state.round_index <= probe_round:
                # A probe cell measures the guidance of its probe round (the paper's round 900):
                # patience may not end it before then. Selection still reads every evaluation
                # (a later best is selected); once past the probe round patience applies again.
                state.stopped_early = False
            for hook in hooks:
                hook(state, record)

        if checkpointer is not None:
            checkpointer.attach("selection", recorder)
        state = run_federated(method, split.train, fed_config, executor=executor, sampler=sampler,
                              evaluator=recorder, device=device, keep_best_state=False, on_round_end=on_round_end,
                              checkpointer=checkpointer)
        history = state.history
        rounds_run = state.round_index
        if DIVERGED_KEY in state.extra:
            extra["diverged_at_round"] = state.extra[DIVERGED_KEY]
        if trace is not None:
            extra["trace"] = trace.frame().to_dict(orient="list")
        log = state.extra.get(LOG_KEY)
        if log:
            extra["guidance_log"] = log
        from fedlib.baselines.single_domain.gpfedrec import GRAPH_LOG_KEY
        graph_log = state.extra.get(GRAPH_LOG_KEY)
        if graph_log:  # GPFedRec: is the user graph complete, round by round?
            extra["graph_log"] = [{k: entry[k] for k in ("round", "mean_neighbours", "min_neighbours", "complete",
                                                         "similarity_rows")} for entry in graph_log]
    # An evaluation that found NaN scores returned -inf and has no entry in the recorder's curve.
    evaluated = [h for h in history if f"valid/{SELECTION_METRIC}" in h and h[f"valid/{SELECTION_METRIC}"] != float("-inf")]
    curve = [{"round": h["round"], "train_loss": h.get("train_loss"), **c} for h, c in zip(evaluated, recorder.curve)]
    best_round = curve[recorder.best]["round"] if recorder.best is not None else None
    metrics = {**recorder.test_metrics(), "best_round": best_round, "rounds_run": int(rounds_run),
               "valid/" + SELECTION_METRIC: (recorder.curve[recorder.best][f"valid/{SELECTION_METRIC}"]
                                             if recorder.best is not None else float("nan")),
               "seconds": time.perf_counter() - started + (checkpointer.earlier_seconds if checkpointer else 0.0)}
    if checkpointer is not None and checkpointer.resumed_at:
        extra["resumed_at"] = list(checkpointer.resumed_at)
    if config["ldp"] is not None:
        metrics["ldp_epsilon"] = ldp_epsilon(config, split)
        metrics["ldp_delta"] = 1.0 / split.num_users
    extra.update(curve=curve, test_users=None if recorder.best_users is None else recorder.best_users.tolist(),
                 test_per_user={k: v.tolist() for k, v in recorder.best_per_user.items()})
    return {"metrics": metrics, "extra": extra}


# ======================================================================================
# The grid: one list of cells per table / figure
# ======================================================================================
#: Table 1's comparison; run under both samplers ("leaky" is what the paper's numbers measure)
TABLE1_METHODS = METHODS
#: the audit's subset (issue: FedRKG, FedRAP, FedMF, PFedRec, local-only)
AUDIT_METHODS = (("FedRKG", "adaptive"), ("FedRKG", "personal_only"), ("FedRAP", None), ("FedMF", None),
                 ("PFedRec", None))
ABLATION_DATASETS = ("Amazon-Video", "LastFM-2K")
INTERVALS = (1, 10, 50, 100, 200)  # Figure D.1 / D.2
GATE_LRS = (1e-4, 1e-3, 1e-2, 1e-1)  # Figure D.2 (the paper's search space)
BETAS = (0.9, 0.99, 0.999)  # Figure D.2
LDP = {"clip": 0.1, "noise_std": 0.001}  # "sensitivity 0.1 and σ = 0.001" (Table 5)
LDP_METHODS = ("FedMF", "PFedRec", "FedRAP", "FedRKG")
#: (β, T_int) of the guidance-strength sweep: stronger and more frequent guidance than the paper's
#: (0.99, 100), to ask whether more global knowledge brings FedRKG back under the correct sampler
GUIDANCE_STRENGTHS = ((0.9, 10), (0.9, 1), (0.5, 10), (0.5, 1))
PARTS = ("audit", "table1", "table3", "ablation", "probe", "ldp", "interval", "sensitivity", "trace", "figure2",
         "strength", "fedrap_code")


def _fedrkg(dataset, mode="adaptive", **kwargs):
    return cell(dataset, "FedRKG", guidance=mode, **kwargs)


def table1_cells(datasets: Sequence[str] = OFFLINE_DATASETS, samplers: Sequence[str] = ("correct", "leaky"),
                 methods: Sequence[str] = TABLE1_METHODS, **kwargs) -> List[Dict[str, Any]]:
    """Every method of Table 1 on every dataset, under each sampler."""
    return [cell(d, m, sampler=s, **kwargs) for s in samplers for d in datasets for m in methods]


def audit_cells(datasets: Sequence[str] = OFFLINE_DATASETS, samplers: Sequence[str] = ("leaky", "correct"),
                **kwargs) -> List[Dict[str, Any]]:
    """The evaluation audit: FedRKG, local-only (w/ PIE), FedRAP, FedMF, PFedRec under both samplers."""
    return [cell(d, m, guidance=g, sampler=s, **kwargs) for d in datasets for s in samplers for m, g in AUDIT_METHODS]


def table3_cells(datasets: Sequence[str] = OFFLINE_DATASETS, samplers: Sequence[str] = ("correct", "leaky"),
                 **kwargs) -> List[Dict[str, Any]]:
    """Table 3: each backbone without and with Adaptive Guidance (the base runs are Table 1's)."""
    out = []
    for s in samplers:
        for d in datasets:
            for b in GUIDED_BACKBONES:
                out += [cell(d, b, sampler=s, **kwargs), cell(d, "FedRKG", backbone=b, sampler=s, **kwargs)]
    return out


def ablation_cells(datasets: Sequence[str] = ABLATION_DATASETS, samplers: Sequence[str] = ("correct", "leaky"),
                   **kwargs) -> List[Dict[str, Any]]:
    """Table 2 / D.1: FedRKG and its three variants."""
    return [_fedrkg(d, mode, sampler=s, **kwargs) for s in samplers for d in datasets for mode in GUIDANCE_MODES]


def probe_cells(dataset: str = "Amazon-Video", sampler: str = "leaky", **kwargs) -> List[Dict[str, Any]]:
    """Table 4, D.3, D.4: w/ KG (fixed) and w/ AG (adaptive) measured around the last guidance round.

    The paper measures "at round 900", i.e. the guidance applied after round 900; with
    ``rounds`` rounds and interval T that is the last guidance round before the end.
    """
    rounds = kwargs.pop("rounds", None)
    rounds = int(rounds if rounds is not None else paper_rounds(dataset))
    interval = kwargs.get("interval") or kwargs.get("params", {}).get("interval") or DEFAULT_PARAMS["FedRKG"]["interval"]
    scheduled = guidance_rounds(rounds, interval)
    if not scheduled:
        raise ValueError(f"no guidance round in {rounds} rounds with interval {interval}")
    return [_fedrkg(dataset, mode, sampler=sampler, rounds=rounds, probe_round=scheduled[-1], **kwargs)
            for mode in ("fixed", "adaptive")]


def ldp_cells(dataset: str = "FilmTrust", samplers: Sequence[str] = ("correct", "leaky"), **kwargs):
    """Table 5 / D.2: FedMF, PFedRec, FedRAP, FedRKG with clipping 0.1 and Gaussian noise σ = 0.001."""
    return [cell(dataset, m, sampler=s, ldp=LDP, **kwargs) for s in samplers for m in LDP_METHODS]


def interval_cells(dataset: str = "Amazon-Video", sampler: str = "leaky", intervals: Sequence[int] = INTERVALS,
                   **kwargs):
    """Figure D.1: Knowledge Guidance (fixed β) with T_int ∈ {1, 10, 50, 100, 200}."""
    kwargs.pop("interval", None)
    return [_fedrkg(dataset, "fixed", sampler=sampler, interval=t, **kwargs) for t in intervals]


def sensitivity_cells(dataset: str = "Amazon-Video", sampler: str = "leaky", **kwargs):
    """Figure D.2: FedRKG with one of gate lr, β, T_int changed at a time (the others at their defaults)."""
    params = kwargs.pop("params", {})
    cells = [_fedrkg(dataset, sampler=sampler, params={**params, "gate_lr": v}, **kwargs) for v in GATE_LRS]
    cells += [_fedrkg(dataset, sampler=sampler, params={**params, "beta": v}, **kwargs) for v in BETAS]
    kwargs.pop("interval", None)
    cells += [_fedrkg(dataset, sampler=sampler, params=params, interval=v, **kwargs) for v in INTERVALS]
    return cells


def trace_cells(dataset: str = "FilmTrust", every: int = 50, **kwargs):
    """The audit's mechanism: FedRKG under both samplers with the per-round leak trace."""
    return [_fedrkg(dataset, sampler=s, trace_every=every, **kwargs) for s in ("leaky", "correct")]


def figure2_cells(dataset: str = "Amazon-Video", sampler: str = "leaky", **kwargs):
    """Figure 2: Full Replacement (β = 0 every round), Local Only, FedRAP, Knowledge Guidance (fixed β)."""
    every_round = {k: v for k, v in kwargs.items() if k != "interval"}
    return [
        _fedrkg(dataset, "global_only", sampler=sampler, interval=1, **every_round),
        _fedrkg(dataset, "personal_only", sampler=sampler, **kwargs),
        cell(dataset, "FedRAP", sampler=sampler, **kwargs),
        _fedrkg(dataset, "fixed", sampler=sampler, **kwargs),
    ]


def strength_cells(dataset: str = "FilmTrust", sampler: str = "correct", **kwargs):
    """Beyond the paper: FedRKG (adaptive and fixed β) with stronger, more frequent guidance.

    Under the correct sampler the paper's setting (β = 0.99 every 100 rounds: 1 % of the
    global table per guidance step) leaves each personal table almost purely local. These
    cells move β and ``T_int`` along :data:`GUIDANCE_STRENGTHS`, plus Full Replacement
    (``global_only`` every round: the personal table *is* the global one), to measure how much
    of FedMF's accuracy guidance can bring back.
    """
    params = kwargs.pop("params", {})
    kwargs.pop("interval", None)
    cells = [_fedrkg(dataset, mode, sampler=sampler, interval=t, params={**params, "beta": b}, **kwargs)
             for mode in ("adaptive", "fixed") for b, t in GUIDANCE_STRENGTHS]
    cells.append(_fedrkg(dataset, "global_only", sampler=sampler, interval=1, params=params, **kwargs))
    return cells


#: ``fedrap_code_cells`` variants: ``"epochs"`` takes the code's local epochs, batch and per-round
#: decay into the engine's plain SGD; ``"optimizer"`` adds the rest of the code's client optimiser
#: (weight decay 1e-4, × 0.95 per batch, early-stopped epochs) and its constant λ, μ.
FEDRAP_CODE_VARIANTS = ("epochs", "optimizer")


def fedrap_code_cells(datasets: Sequence[str] = ("FilmTrust", "Amazon-Video"),
                      samplers: Sequence[str] = ("leaky", "correct"),
                      variants: Sequence[str] = FEDRAP_CODE_VARIANTS, **kwargs):
    """FedRAP with its public code's local training, in two steps (:data:`FEDRAP_CODE_VARIANTS`).

    ``"epochs"``: 10 local epochs, batch 2048, rates × 0.97 per round. ``"optimizer"``: also
    the code's ``SGD(weight_decay=1e-4)`` on every row, ``ExponentialLR(0.95)`` per batch, local
    epochs stopped at a relative loss change below 1e-4, and the ``λ``, ``μ`` its loss really
    reads (constant; :class:`~fedlib.baselines.single_domain.fedrap.FedRAPCodeExecutor`). The paper ran "the
    official implementation", whose defaults these are; Table 1's FedRAP cells use FedRKG's
    protocol (one epoch, batch 256) instead. All are reported.
    """
    from fedlib.baselines.single_domain.fedrap import FEDRAP_CODE_CONFIG, FEDRAP_CODE_OPTIMIZER

    unknown = set(variants) - set(FEDRAP_CODE_VARIANTS)
    if unknown:
        raise ValueError(f"unknown variants {sorted(unknown)}; expected some of {FEDRAP_CODE_VARIANTS}")
    base = {**kwargs.pop("params", {}), "local_epochs": FEDRAP_CODE_CONFIG["local_epochs"], "lr_decay": 0.97}
    extra = {"epochs": {}, "optimizer": {**FEDRAP_CODE_OPTIMIZER, "curriculum": "constant"}}
    kwargs.pop("interval", None)
    return [cell(d, "FedRAP", sampler=s, batch_size=FEDRAP_CODE_CONFIG["batch_size"], params={**base, **extra[v]},
                 **kwargs)
            for v in variants for d in datasets for s in samplers]


def grid_cells(part: str, datasets: Sequence[str] = OFFLINE_DATASETS, **kwargs) -> List[Dict[str, Any]]:
    """The cells of one part of the paper-profile grid (``datasets`` filters the multi-dataset parts)."""
    if part == "table1":
        return table1_cells(datasets, **kwargs)
    if part == "table3":
        return table3_cells(datasets, **kwargs)
    if part == "audit":
        return audit_cells(datasets, **kwargs)
    if part == "fedrap_code":
        # LastFM-2K: the paper's sampler and the full optimiser only (about 40 s per round)
        lastfm = fedrap_code_cells(["LastFM-2K"], ["leaky"], ["optimizer"], **kwargs) if "LastFM-2K" in datasets else []
        return fedrap_code_cells([d for d in ("FilmTrust", "Amazon-Video") if d in datasets], **kwargs) + lastfm
    if part == "ablation":
        return ablation_cells([d for d in ABLATION_DATASETS if d in datasets], **kwargs)
    if part == "probe":
        return [c for sampler in ("leaky", "correct") for c in probe_cells(sampler=sampler, **kwargs)]
    single = {"ldp": ldp_cells, "interval": interval_cells, "sensitivity": sensitivity_cells,
              "trace": trace_cells, "figure2": figure2_cells, "strength": strength_cells}
    if part in single:
        return single[part](**kwargs)
    raise ValueError(f"unknown part {part!r}; expected one of {PARTS}")


# ======================================================================================
# Recording runs (resumable paper-profile grid; live quick/smoke runs)
# ======================================================================================
def _compact(result: Mapping[str, Any]) -> Dict[str, Any]:
    """Round per-user values to 5 decimals (they are written to runs.jsonl)."""
    def rounded(values):
        return [round(float(v), 5) for v in values]

    extra = dict(result["extra"])
    extra["test_per_user"] = {k: rounded(v) for k, v in extra.get("test_per_user", {}).items()}
    if "probe" in extra:
        probe = dict(extra["probe"])
        for key in ("before", "after"):
            if key in probe:
                probe[key] = {k: rounded(v) for k, v in probe[key].items()}
        if "gates" in probe:
            probe["gates"] = {k: [round(float(v), 7) for v in values] for k, values in probe["gates"].items()}
        extra["probe"] = probe
    return {"metrics": dict(result["metrics"]), "extra": extra}


#: wall time between two checkpoints of a grid cell (s): a LastFM-2K FedRKG checkpoint holds
#: 1,269 personal 12,322 × 32 item tables (~2 GB), too much to write every few rounds
CHECKPOINT_EVERY_S = 900.0


def run_grid(cells: Iterable[Mapping[str, Any]], profile: str = "paper", *, cache_dir: Path = Path(".cache/fedrkg"),
             worker: int = 0, workers: int = 1, progress: bool = True, rerun: bool = False) -> pd.DataFrame:
    """Run every cell without a recorded result (this worker's share), appending each to runs.jsonl.

    A fresh clone resumes from the committed ``results/fedrkg[/profile]/runs.jsonl``: recorded
    cells are restored into the cache and not trained again. A cell in training saves its
    state every :data:`CHECKPOINT_EVERY_S` seconds (:func:`checkpointable` cells) under
    ``cache_dir/<profile>/checkpoints/``; a killed worker's cell continues there when a worker
    next takes it (a LastFM-2K cell can outlast a working session).
    """
    return grid.run_recorded_grid(PAPER, cells, _train, profile, cache_dir=cache_dir, worker=worker,
                                  workers=workers, progress=progress, checkpoint_every_s=CHECKPOINT_EVERY_S,
                                  rerun=rerun)


def run_cells(cells: Sequence[Mapping[str, Any]], profile: str, description: str = "cells",
              live: bool = True) -> List[Dict[str, Any]]:
    """What the notebook calls: train each cell (with a progress bar) and record it at ``profile``.

    ``paper``: through :func:`run_grid` (recorded cells are not trained again). Otherwise each
    cell is trained live and appended to ``results/fedrkg/<profile>/runs.jsonl``. Returns one
    ``{"config", "metrics", "extra"}`` per cell, in order.
    """
    return grid.run_cells(PAPER, cells, profile, _train, method_label, description)


def _train(config: Mapping[str, Any], progress=None, checkpointer=None) -> Dict[str, Any]:
    return _compact(run_cell(config, progress=progress, checkpointer=checkpointer))


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m fedlib grid fedrkg <parts> [--datasets ..] [--methods ..] [--samplers ..] [--seeds ..]``.

    Table 1 uses ``--seeds 0 1 2 3 4`` on FilmTrust and Amazon-Video (:func:`fedlib.experiments.grid.grid_main`).
    """
    grid.grid_main(argv, paper=PAPER, title="FedRKG", parts=PARTS, grid_cells=grid_cells, run_grid=run_grid,
                   part_options={"--datasets": dict(nargs="+", default=list(OFFLINE_DATASETS), choices=list(DATASETS))},
                   filters={"--methods": grid.CellFilter("method", METHODS, help="keep only cells of these methods"),
                            "--samplers": grid.CellFilter("sampler", list(SAMPLERS))})


# ======================================================================================
# The dataset: how many test items can be hit at all
# ======================================================================================
def hittable_share(dataset: str) -> float:
    """Share of users whose test item can be hit at all (a fraction in [0, 1]).

    A test pair that also occurs in train or validation is masked at test time (LastFM-2K's
    interactions are tag assignments, so a (user, artist) pair can repeat): such a user's
    test item can never be ranked, which bounds every R@K of the dataset.
    """
    from fedlib.metrics.leak_audit import duplicate_pair_leak

    split = load_split(dataset)
    masked = duplicate_pair_leak(union_pairs(split.train, split.valid), split.test)  # the test evaluation's mask
    return 1.0 - masked.fraction
