r"""FedPCL-CDR experiments: every table and figure of the paper as cells of one grid.

Reference:
    "FedPCL-CDR: A Federated Prototype-based Contrastive Learning Framework for
    Privacy-Preserving Cross-domain Recommendation", L. Wang, Q. Wu, M. Xu, arXiv:2409.03294
    (2024), https://arxiv.org/abs/2409.03294; public code https://github.com/Lili1013/FedPCL_CDR.

A **cell** is a plain dict fixing one run: task, method, FedPCL-CDR variant, overlap ratio,
privacy budget ε, α, K, rounds and seed. :func:`run_cell` trains it and returns

* ``metrics``: per domain, the validation and **test** HR@N / NDCG@N / MRR at the round with
  the best mean validation HR@10 (``"<domain>/test/HR@10"``), the same read at the round with
  the best mean **test** HR@10 (``"test_selected/<domain>/test/HR@10"``: the reference code's
  rule, for the audit; a lower bound on what the code reports, since training stopped on
  validation), the selected rounds, bytes and seconds. A FedPCL-CDR cell with
  ``selection="test"`` (:func:`audit_cells`) runs the code's rule itself: it stops on the test
  score and both reads are its best test round;
* ``extra``: the learning curve (every evaluation), the domains, and whether the review
  branch was on.

Methods that transmit something about users (FedPCL-CDR's representative prototypes, P2FCDR's
and P²DTR's messages) are also attacked after training (:func:`~fedlib.metrics.reconstruction.reconstruction_attack`):
``"attack/<domain>/mse"`` and ``"attack/<domain>/normalised_mse"`` (Table 5).

Data (:data:`TASKS`, :mod:`fedlib.data.protocols.fedpcl_cdr`). Three kinds of task:

* **substitutes** (in the shared data root; two domains, no review text, so the review branch
  is off): ``Phone-Sport`` (DisenCDR's ``phone_sport`` pair, for the paper's Task 1),
  ``Elec-Cloth`` (the ``electronic_cloth`` pair, for the Elec and Cloth rows of the
  three-domain Task 2) and ``Book-Music`` (GA-DTCDR's Douban Book and Music, for the Book and
  Music rows of Task 4);
* **Douban ratings with Movie** (``Movie-Music`` = Task 3, ``Book-Movie-Music`` = Task 4, on
  the three-domain path): GA-DTCDR's files once ``douban_movie/ratings.dat`` is placed by hand;
  still no review text;
* **original** (``"<task> (original)"``): FedPCL-CDR's own format, ratings with review text
  (:func:`fedlib.data.protocols.fedpcl_cdr.build_original`); FedPCL-CDR runs them with the
  review branch on (Doc2Vec from training reviews only, :data:`REVIEW_DIM`).

A task whose files are absent is not in :func:`available_tasks`: the grid skips it and its
table rows read "needs download" (:func:`needs_download`).

Protocol: random leave-one-out per user and domain; one more random interaction is the
validation item (the paper has no validation set and selects on test); 1 + 99 sampled
candidates; HR@N and NDCG@N, N = 10 unless a figure varies it.

FedPCL-CDR's settings (paper Sec. 4.1.3 and the code): d = 64, 3 LightGCN layers, K = 10,
τ = 0.2, α = 0.01, ε = 4 with β = 0.2 (η = 2β/ε = 0.1), Adam lr 1e-3, weight decay 1e-4,
batch 256, one sampled negative per positive, one local epoch per round, at most
:data:`ROUNDS` rounds with patience :data:`PATIENCE` on mean validation HR@10.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import pandas as pd
import torch

from fedlib.data.protocols import fedpcl_cdr as protocol
from fedlib.device import default_device
from fedlib.experiments import grid
from fedlib.experiments.grid import unique_cells  # noqa: F401  (part of this module's API)
from fedlib.papers.fedpcl_cdr.method import SELECTIONS, VARIANTS, FedPCLConfig, train_fedpcl_cdr, variant_config
from fedlib.metrics.reconstruction import reconstruction_attack
from fedlib.reporting.results import config_hash

__all__ = [
    "PAPER", "VERSION", "TASKS", "SUBSTITUTE_TASKS", "METHODS", "BASELINES", "EPSILONS", "ALPHAS", "CLUSTER_COUNTS",
    "OVERLAP_RATIOS", "LIST_LENGTHS", "cell", "method_cell", "method_label", "task_files", "available_tasks",
    "needs_download", "load_split", "load_task", "run_cell", "grid_cells", "run_grid", "run_cells", "LEARNING_RATES",
    "LR_LADDER", "SELECTED_LR", "tuning_cells", "selected_from_records", "tuning_frame",
]

PAPER = "fedpcl_cdr"
VERSION = 1  # bump when a change alters the numbers a cell produces (invalidates cached runs)

PAPER_TASKS = {1: "Task 1 (Phone-Sport, Amazon)", 2: "Task 2 (Elec-Cloth-Phone, Amazon)",
               3: "Task 3 (Movie-Music, Douban)", 4: "Task 4 (Book-Movie-Music, Douban)"}
ORIGINAL_DOMAINS = {1: ("phone", "sport"), 2: ("elec", "cloth", "phone"), 3: ("movie", "music"),
                    4: ("book", "movie", "music")}
"""The domains of each paper task in FedPCL-CDR's original format (all shared users aligned)."""
DOUBAN_MOVIE = "douban-gadtcdr/douban_movie/ratings.dat"

TASKS: Dict[str, Dict[str, Any]] = {
    "Phone-Sport": {"kind": "substitute", "dataset": "amazon-cdr-disencdr", "variant": "phone_sport",
                    "paper_task": PAPER_TASKS[1], "paper_dataset": "Amazon"},
    "Elec-Cloth": {"kind": "substitute", "dataset": "amazon-cdr-disencdr", "variant": "electronic_cloth",
                   "paper_task": PAPER_TASKS[2], "paper_dataset": "Amazon"},
    "Book-Music": {"kind": "substitute", "dataset": "douban-gadtcdr", "domains": ("book", "music"),
                   "paper_task": PAPER_TASKS[4], "paper_dataset": "Douban"},
    "Movie-Music": {"kind": "ratings", "dataset": "douban-gadtcdr", "domains": ("movie", "music"),
                    "paper_task": PAPER_TASKS[3], "paper_dataset": "Douban"},
    "Book-Movie-Music": {"kind": "ratings", "dataset": "douban-gadtcdr", "domains": ("book", "movie", "music"),
                         "paper_task": PAPER_TASKS[4], "paper_dataset": "Douban"},
    **{f"{'-'.join(d.capitalize() for d in domains)} (original)": {
        "kind": "original", "dataset": protocol.ORIGINAL_FOLDER, "domains": domains, "paper_task": PAPER_TASKS[n],
        "paper_dataset": "Amazon" if n <= 2 else "Douban"} for n, domains in ORIGINAL_DOMAINS.items()},
}
"""Every task: its kind (``substitute``, ``ratings`` = Douban with Movie, ``original`` = with
review text), how to load it and the paper task whose rows it is compared with. When several
available tasks stand for one paper task, the tables use the best kind (original, then
ratings, then substitute)."""
SUBSTITUTE_TASKS = tuple(t for t, spec in TASKS.items() if spec["kind"] == "substitute")
KIND_RANK = {"original": 0, "ratings": 1, "substitute": 2}

NEEDS_DOWNLOAD = {
    PAPER_TASKS[2]: "the Phone domain of the three-domain task: the substitute pairs are "
                    "re-indexed per pair, so users cannot be aligned across three domains",
    PAPER_TASKS[3]: "Douban Movie is not in the data root (douban_movie/ratings.dat)",
    PAPER_TASKS[4]: "Douban Movie is not in the data root (douban_movie/ratings.dat)",
}
"""Why a paper task (or Task 2's Phone row) has no row of ours while its files are absent."""

BASELINES = ("NeuMF", "LightGCN", "FedNCF", "GA-DTCDR", "GA-MTCDR-P", "NMCDR", "CL-DTCDR", "PriCDR", "P2FCDR",
             "P2DTR")
METHODS = BASELINES + ("FedPCL-CDR",)

#: rounds = local epochs per domain. The reference code trains at most 500 rounds of one
#: 512-positive mini-batch (about 7 epochs of Phone) and stops after 6 rounds without a better
#: test score; 20 full epochs with patience 5 (on validation) covers that budget with room.
ROUNDS = 20
PATIENCE = 5
#: the baselines' starting learning-rate grid (the paper: "hyperparameters carefully tuned");
#: the ``tuning`` part runs each baseline at each value on Phone-Sport (seed 0) and
#: :data:`SELECTED_LR` fixes the one with the best mean validation HR@10
LEARNING_RATES = (1e-3, 1e-2)
#: where the grid may widen: when a baseline's best rate is the largest (smallest) it was
#: tried at, :func:`tuning_cells` adds the next rate of this ladder (half a decade) beyond it
LR_LADDER = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
#: Only :func:`selected_from_records` fills it: once all of a baseline's tuning runs are recorded
#: at the paper profile (``tuning_cells()`` has none pending for it), copy its result here
#: (``X.selected_from_records(read_runs("fedpcl_cdr", "paper"))``); a test checks every entry
#: against the recorded runs, so no value can be typed in. A baseline not in it runs at
#: BASELINE_DEFAULT_LR.
SELECTED_LR: Dict[str, float] = {"NeuMF": 1e-3, "LightGCN": 1e-2, "FedNCF": 1e-2, "GA-DTCDR": 1e-3, "GA-MTCDR-P": 3e-4,
                                 "NMCDR": 1e-4, "CL-DTCDR": 1e-2, "PriCDR": 1e-3, "P2FCDR": 1e-2, "P2DTR": 1e-2}
BASELINE_DEFAULT_LR = 1e-3  # until a baseline's tuning runs are recorded
#: methods whose round is not one pass over every domain's data: FedNCF samples 10 % of the
#: users per round and evaluates every 10 rounds (its own default), so it gets more rounds
DEFAULT_ROUNDS = {"FedNCF": 200}
CLIP_NORM = 0.2
EPSILONS = (1.0, 2.0, 4.0, 8.0, 16.0)   # Figure 3 (the figure prints no values; ε = 4 is the paper's choice)
ALPHAS = (0.001, 0.01, 0.1, 0.2)        # Figure 4 (the paper's grid)
CLUSTER_COUNTS = (2, 5, 10, 15, 20)     # Figure 5 (the paper's axis is not printed; K = 10 is its best)
OVERLAP_RATIOS = (0.3, 0.5, 0.7)        # Table 4
LIST_LENGTHS = (2, 4, 6, 8, 10)         # Figure 6: read from every run's evaluation (no extra runs)
KS = tuple(sorted(set(LIST_LENGTHS) | {5, 10}))
REVIEW_DIM = 64  # Doc2Vec vector size of the original-format tasks (the code's review_embed_dim)


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


def _present(relpath: str, root=None) -> bool:
    from fedlib.data.download import data_root

    base = data_root(root)
    return any((base / f"{relpath}{suffix}").is_file() for suffix in ("", ".xz", ".gz"))


def available_tasks(root=None) -> Tuple[str, ...]:
    """The tasks whose files are all under the data root (``None`` = ``FEDLIB_DATA``), in :data:`TASKS` order."""
    return tuple(t for t in TASKS if all(_present(f, root) for f in task_files(t)))


def needs_download(root=None) -> Dict[str, str]:
    """:data:`NEEDS_DOWNLOAD` for the files present now: a paper task drops out once a task of
    ours covers all its domains (Task 2's Phone row needs the original Amazon files)."""
    covered = {TASKS[t]["paper_task"] for t in available_tasks(root) if TASKS[t]["kind"] != "substitute"}
    return {task: reason for task, reason in NEEDS_DOWNLOAD.items() if task not in covered}


def cell(task: str, method: str = "FedPCL-CDR", *, variant: str = "FedPCL-CDR", seed: int = 0,
         overlap_ratio: Optional[float] = None, epsilon: float = 4.0, alpha: float = 0.01, num_clusters: int = 10,
         rounds: Optional[int] = None, patience: int = PATIENCE, batches_per_round: Optional[int] = None,
         num_negatives: int = 99, dim: int = 64, lr: Optional[float] = None, selection: str = "valid"
         ) -> Dict[str, Any]:
    """One run of the grid as a plain dict.

    Args:
        task: a key of :data:`TASKS`, or ``"synthetic"`` (smoke profile).
        method: one of :data:`METHODS`.
        variant: a key of :data:`~fedlib.papers.fedpcl_cdr.method.VARIANTS` (FedPCL-CDR only).
        overlap_ratio: share of the overlapping users kept (Table 4); ``None`` = all.
        epsilon: the paper's privacy budget ``2β/η`` (β = 0.2), FedPCL-CDR only.
        alpha, num_clusters: Eq. 11's α and K (FedPCL-CDR only).
        rounds, patience: rounds (epochs for centralised baselines; default :data:`ROUNDS`, or
            :data:`DEFAULT_ROUNDS` of the method) and evaluations without improvement before stopping.
        batches_per_round: the code's one mini-batch per round (audit); ``None`` = full epochs.
        num_negatives: 99 (paper) or 98 (what the code evaluates with).
        lr: a baseline's Adam step (default :data:`SELECTED_LR`); FedPCL-CDR uses the paper's 1e-3.
        selection: FedPCL-CDR only: ``"valid"`` (ours) or ``"test"``, the code's rule (stop after
            ``patience`` evaluations without a better mean test HR@10, report the best test
            round; an audit cell). Only ``"test"`` is written into the cell, so the hashes of
            validation-selected cells do not change.
    """
    if task not in TASKS and task != "synthetic":
        raise ValueError(f"unknown task {task!r}; expected one of {sorted(TASKS)} or 'synthetic'")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    if selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
    if selection != "valid" and method != "FedPCL-CDR":
        raise ValueError(f"selection={selection!r} reproduces the FedPCL-CDR code's audit rule; the baselines are "
                         f"always selected on validation (got method {method!r})")
    config: Dict[str, Any] = {"paper": PAPER, "version": VERSION, "task": task, "method": method, "seed": int(seed),
                              "overlap_ratio": None if overlap_ratio is None else float(overlap_ratio),
                              "rounds": int(rounds if rounds is not None else DEFAULT_ROUNDS.get(method, ROUNDS)),
                              "patience": int(patience), "dim": int(dim),
                              "num_negatives": int(num_negatives)}
    if method == "FedPCL-CDR":
        if variant not in VARIANTS:
            raise ValueError(f"unknown FedPCL-CDR variant {variant!r}; expected one of {sorted(VARIANTS)}")
        if not epsilon > 0:
            raise ValueError(f"epsilon must be > 0 (the Laplace scale is 2 * {CLIP_NORM} / epsilon), got {epsilon}")
        config.update(variant=variant, epsilon=float(epsilon), alpha=float(alpha), num_clusters=int(num_clusters),
                      batches_per_round=None if batches_per_round is None else int(batches_per_round))
        if selection != "valid":
            config["selection"] = selection
    else:
        config["lr"] = float(lr if lr is not None else SELECTED_LR.get(method, BASELINE_DEFAULT_LR))
    return config


def method_cell(task: str, method: str, cell_kwargs: Mapping[str, Any] = {},
                method_kwargs: Mapping[str, Mapping[str, Any]] = {}, **extra) -> Dict[str, Any]:
    """:func:`cell` with the profile's common keywords, then the method's own (e.g. FedNCF's rounds)."""
    return cell(task, method, **{**cell_kwargs, **method_kwargs.get(method, {}), **extra})


def method_label(config: Mapping[str, Any]) -> str:
    """The paper's row label: ``"FedPCL-CDR"``, ``"w/o LDP"``, ``"NeuMF"``, ..."""
    if config["method"] == "FedPCL-CDR":
        return config["variant"]
    return config["method"]


# ======================================================================================
# Data
# ======================================================================================
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
        return protocol.build_original(spec["domains"], overlap_ratio=overlap_ratio, num_negatives=num_negatives,
                                       seed=seed)
    return protocol.build(spec["dataset"], variant=spec.get("variant"), domains=spec.get("domains"),
                          overlap_ratio=overlap_ratio, num_negatives=num_negatives, seed=seed), None


def load_split(task: str, overlap_ratio: Optional[float] = None, num_negatives: int = 99, seed: int = 0):
    """The FedPCL-CDR split of ``task`` (cached, see :func:`load_task`)."""
    return load_task(task, overlap_ratio, num_negatives, seed)[0]


def fedpcl_config(config: Mapping[str, Any]) -> FedPCLConfig:
    """The :class:`~fedlib.papers.fedpcl_cdr.method.FedPCLConfig` of a FedPCL-CDR cell."""
    base = FedPCLConfig(dim=config["dim"], num_clusters=config["num_clusters"], alpha=config["alpha"],
                        clip_norm=CLIP_NORM, laplace_scale=2 * CLIP_NORM / config["epsilon"],
                        rounds=config["rounds"], patience=config["patience"],
                        batches_per_round=config["batches_per_round"], seed=config["seed"],
                        selection=config.get("selection", "valid"))
    if config["task"] == "synthetic":
        base = replace(base, batch_size=128)
    return variant_config(config["variant"], base)


# ======================================================================================
# Runs
# ======================================================================================
def review_vectors(split, texts, seed: int = 0) -> Dict[str, tuple]:
    """``{domain: (user (U, REVIEW_DIM), item (I, REVIEW_DIM))}`` frozen Doc2Vec vectors built
    from each domain's **training** reviews only (the code also uses the held-out ones)."""
    from fedlib.models.review_text import review_embeddings

    return {d: review_embeddings(split[d], texts[d], REVIEW_DIM, seed=seed) for d in split.domains}


def _run_fedpcl(config, split, device, progress, texts=None):
    reviews = review_vectors(split, texts, config["seed"]) if texts is not None else None
    return train_fedpcl_cdr(split, fedpcl_config(config), reviews=reviews, device=device, ks=KS,
                            progress=(lambda r, row: progress(r)) if progress is not None else None)


#: baseline -> (module, training function, config class); each trains on the whole DomainSplit
BASELINE_SPECS = {
    "NeuMF": ("fedlib.baselines.cross_domain.cdr_single_domain", "train_neumf", "NeuMFConfig", {}),
    "LightGCN": ("fedlib.baselines.cross_domain.cdr_single_domain", "train_lightgcn", "LightGCNConfig", {}),
    "FedNCF": ("fedlib.baselines.cross_domain.cdr_single_domain", "train_fedncf", "FedNCFConfig", {}),
    "GA-DTCDR": ("fedlib.baselines.cross_domain.ga_cdr", "train_ga_dtcdr", "GADTCDRConfig", {}),
    "GA-MTCDR-P": ("fedlib.baselines.cross_domain.ga_cdr", "train_ga_mtcdr_p", "GAMTCDRPConfig", {}),
    "NMCDR": ("fedlib.baselines.cross_domain.nmcdr", "train_nmcdr", "NMCDRConfig", {}),
    "CL-DTCDR": ("fedlib.baselines.cross_domain.cl_dtcdr", "train_cl_dtcdr", "CLDTCDRConfig", {}),
    "PriCDR": ("fedlib.baselines.cross_domain.pricdr", "train_pricdr", "PriCDRConfig", {}),
    "P2FCDR": ("fedlib.baselines.cross_domain.p2fcdr", "train_p2fcdr", "P2FCDRConfig", {}),
    "P2DTR": ("fedlib.baselines.cross_domain.p2dtr", "train_p2dtr", "P2DTRConfig", {}),
}


def baseline_config(config: Mapping[str, Any]):
    """The baseline's own config object for a cell: size, epochs (= the cell's rounds), patience, seed."""
    import dataclasses
    import importlib

    module_name, _, class_name, fixed = BASELINE_SPECS[config["method"]]
    config_class = getattr(importlib.import_module(module_name), class_name)
    names = {f.name for f in dataclasses.fields(config_class)}
    wanted = {"dim": config["dim"], "patience": config["patience"], "seed": config["seed"], "lr": config["lr"],
              **fixed}
    wanted["rounds" if "rounds" in names and "epochs" not in names else "epochs"] = config["rounds"]
    missing = sorted(set(wanted) - names)
    if missing:
        raise TypeError(f"{class_name} has no field(s) {missing}; the grid sets dim, epochs/rounds, patience, seed")
    return config_class(**wanted)


def _baseline_runner(method: str) -> Callable:
    """``run(config, split, device, progress) -> CDRResult`` of a baseline (imported on demand)."""
    import importlib

    module_name, function_name, _, _ = BASELINE_SPECS[method]
    train = getattr(importlib.import_module(module_name), function_name)

    def run(config, split, device, progress):
        return train(split, baseline_config(config), device=device,
                     progress=(lambda r, row: progress(r)) if progress is not None else None)
    return run


def run_cell(config: Mapping[str, Any], device=None, progress: Optional[Callable[[int], None]] = None
             ) -> Dict[str, Any]:
    """Train one cell: ``{"metrics": {...}, "extra": {"curve": [...]}}`` (module docstring)."""
    device = torch.device(device) if device is not None else default_device()
    started = time.perf_counter()
    split, texts = load_task(config["task"], config["overlap_ratio"], config["num_negatives"], config["seed"])
    if config["method"] == "FedPCL-CDR":
        # the review branch is on exactly when the task has review text (the original format)
        result = _run_fedpcl(config, split, device, progress, texts)
    else:
        result = _baseline_runner(config["method"])(config, split, device, progress)
    metrics = result.flat_metrics()
    for domain, pair in result.artifacts.get("transmitted", {}).items():  # Table 5
        if pair["sent"].shape[0] < 4:  # (almost) no cluster of this domain was sent: nothing to attack
            continue
        attack = reconstruction_attack(pair["sent"], pair["private"], seed=config["seed"])
        metrics.update({f"attack/{domain}/{key}": attack[key] for key in ("mse", "normalised_mse")})
    metrics["seconds"] = time.perf_counter() - started
    curve = [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()} for row in result.history]
    review_branch = config["method"] == "FedPCL-CDR" and texts is not None
    return {"metrics": metrics, "extra": {"curve": curve, "domains": list(split.domains), "review_branch": review_branch}}


# ======================================================================================
# The grid
# ======================================================================================
def tuning_cells(task: str = "Phone-Sport", records: Optional[Iterable] = None, **kwargs) -> List[Dict[str, Any]]:
    """The learning-rate search of every baseline on ``task`` (selection on mean validation HR@10).

    Each baseline starts at :data:`LEARNING_RATES`. Once all its runs so far are recorded, a
    best rate at the edge of what was tried (the largest or the smallest) adds the next rate
    of :data:`LR_LADDER` beyond that edge, so the chosen rate is never an untested edge of the
    grid (unless it is the ladder's end). ``records``: the paper-profile runs (default: read
    from ``results/fedpcl_cdr/runs.jsonl``).
    """
    if records is None:
        from fedlib.reporting.results import read_runs

        records = read_runs(PAPER, "paper")
    scores = _validation_scores(records)
    cells = []
    for method in BASELINES:
        rates = list(LEARNING_RATES)
        while True:
            keys = {lr: config_hash(cell(task, method, lr=lr, **kwargs)) for lr in rates}
            if any(key not in scores for key in keys.values()):
                break  # some run of this baseline is still pending: widen only once all are in
            step = _ladder_step(max(rates, key=lambda lr: scores[keys[lr]]), rates)
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
    from fedlib.reporting.results import latest_records

    scores = {}
    for key, record in latest_records(records).items():
        domains = [k.split("/")[0] for k in record.metrics if k.endswith("/valid/HR@10") and k.count("/") == 2]
        if domains:
            scores[key] = sum(record.metrics[f"{d}/valid/HR@10"] for d in domains) / len(domains)
    return scores


def selected_from_records(records, task: str = "Phone-Sport") -> Dict[str, float]:
    """Re-derive :data:`SELECTED_LR` from recorded tuning runs: ``{baseline: best lr}``, for the
    baselines whose search (:func:`tuning_cells`) has no run pending."""
    records = list(records)
    scores = _validation_scores(records)
    by_method: Dict[str, List[Dict[str, Any]]] = {}
    for config in tuning_cells(task, records):
        by_method.setdefault(config["method"], []).append(config)
    chosen = {}
    for method, configs in by_method.items():
        if all(config_hash(c) in scores for c in configs):
            chosen[method] = max(configs, key=lambda c: scores[config_hash(c)])["lr"]
    return chosen


def tuning_frame(records, task: str = "Phone-Sport") -> pd.DataFrame:
    """The learning-rate search as a table: one row per baseline and rate of :func:`tuning_cells`.

    Columns: ``method``, ``lr``, ``valid_HR@10`` (mean over the domains, a fraction; NaN while
    pending), ``seconds`` (wall time of the run), ``chosen`` (the rate
    :func:`selected_from_records` picks; False everywhere for an unfinished search).
    """
    from fedlib.reporting.results import latest_records

    records = list(records)
    scores, latest = _validation_scores(records), latest_records(records)
    chosen = selected_from_records(records, task)
    rows = []
    for config in tuning_cells(task, records):
        key = config_hash(config)
        seconds = latest[key].metrics.get("seconds", float("nan")) if key in latest else float("nan")
        rows.append({"method": config["method"], "lr": config["lr"], "valid_HR@10": scores.get(key, float("nan")),
                     "seconds": seconds, "chosen": chosen.get(config["method"]) == config["lr"]})
    return pd.DataFrame(rows, columns=["method", "lr", "valid_HR@10", "seconds", "chosen"])


def table2_cells(tasks: Optional[Sequence[str]] = None, **kwargs) -> List[Dict[str, Any]]:
    """Table 2: every method on every task (default: :func:`available_tasks`)."""
    return [cell(t, m, **kwargs) for t in (available_tasks() if tasks is None else tasks) for m in METHODS]


def ablation_cells(tasks: Optional[Sequence[str]] = None, **kwargs) -> List[Dict[str, Any]]:
    """Table 3: the FedPCL-CDR variants (plus "w/o CL", not a paper row) on every task (default: the available ones)."""
    return [cell(t, "FedPCL-CDR", variant=v, **kwargs) for t in (available_tasks() if tasks is None else tasks)
            for v in VARIANTS]


TABLE4_METHODS = ("GA-DTCDR", "NMCDR", "CL-DTCDR", "PriCDR", "P2DTR", "FedPCL-CDR")


def overlap_cells(**kwargs) -> List[Dict[str, Any]]:
    """Table 4: Phone-Sport with 30 / 50 / 70 % of the overlapping users kept."""
    return [cell("Phone-Sport", m, overlap_ratio=r, **kwargs) for r in OVERLAP_RATIOS for m in TABLE4_METHODS]


def privacy_cells(tasks: Sequence[str] = ("Phone-Sport", "Book-Music"), **kwargs) -> List[Dict[str, Any]]:
    """Figure 3: FedPCL-CDR at each privacy budget ε (paper: Tasks 1 and 3; Book-Music stands in for 3)."""
    return [cell(t, "FedPCL-CDR", epsilon=e, **kwargs) for t in tasks for e in EPSILONS]


def sensitivity_cells(task: str = "Phone-Sport", **kwargs) -> List[Dict[str, Any]]:
    """Figures 4 and 5: α and K one at a time around (0.01, 10)."""
    return ([cell(task, "FedPCL-CDR", alpha=a, **kwargs) for a in ALPHAS]
            + [cell(task, "FedPCL-CDR", num_clusters=k, **kwargs) for k in CLUSTER_COUNTS])


def audit_cells(task: str = "Phone-Sport", **kwargs) -> List[Dict[str, Any]]:
    """The reference code's training and evaluation: one mini-batch per round, 98 negatives.

    The first two cells stop on **validation** (patience 6) and differ only in the negatives;
    their test-selected metrics (``test_selected/...``) are the best test round among the
    rounds trained before validation stopped them, a **lower bound** on what the code reports.
    The third cell is the code's whole rule (``selection="test"``): it stops after 6
    evaluations without a better mean test HR@10 and reports the best test round, so it trains
    as long as the test score keeps rising. (The code resets its counter on ties, ``>=``; the
    tracker needs a strict gain, which can only stop it earlier.)
    """
    code = dict(batches_per_round=1, rounds=500, patience=6)
    return [cell(task, "FedPCL-CDR", num_negatives=98, **code, **kwargs),
            cell(task, "FedPCL-CDR", **code, **kwargs),
            cell(task, "FedPCL-CDR", num_negatives=98, selection="test", **code, **kwargs)]


PARTS = ("tuning", "table2", "ablation", "overlap", "privacy", "sensitivity", "audit")


def grid_cells(part: str, **kwargs) -> List[Dict[str, Any]]:
    """The cells of one part of the paper-profile grid."""
    makers = {"tuning": tuning_cells, "table2": table2_cells, "ablation": ablation_cells, "overlap": overlap_cells,
              "privacy": privacy_cells, "sensitivity": sensitivity_cells, "audit": audit_cells}
    if part not in makers:
        raise ValueError(f"unknown part {part!r}; expected one of {PARTS}")
    return makers[part](**kwargs)


def run_grid(cells: Iterable[Mapping[str, Any]], profile: str = "paper", *,
             cache_dir: Path = Path(".cache/fedpcl_cdr"), worker: int = 0, workers: int = 1,
             progress: bool = True, rerun: bool = False) -> pd.DataFrame:
    """Run every cell without a recorded result (this worker's share), appending each to runs.jsonl."""
    return grid.run_recorded_grid(PAPER, unique_cells(cells), _train, profile, cache_dir=cache_dir, worker=worker,
                                  workers=workers, progress=progress, rerun=rerun)


def run_cells(cells: Sequence[Mapping[str, Any]], profile: str, description: str = "cells") -> List[Dict[str, Any]]:
    """What the notebook calls: train each cell and record it at ``profile`` (see :func:`fedlib.experiments.grid.run_cells`)."""
    return grid.run_cells(PAPER, cells, profile, _train, method_label, description)


def _train(config: Mapping[str, Any], progress=None) -> Dict[str, Any]:
    return run_cell(config, progress=progress)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m fedlib grid fedpcl_cdr <parts> [--methods ..] [--seeds ..] ...`` (:func:`fedlib.experiments.grid.grid_main`)."""
    grid.grid_main(argv, paper=PAPER, title="FedPCL-CDR", parts=PARTS, grid_cells=grid_cells, label=method_label,
                   run_grid=run_grid, filters={"--tasks": grid.CellFilter("task", list(TASKS))})

