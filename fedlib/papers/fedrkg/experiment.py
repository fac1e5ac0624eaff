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

The grid itself is data: ``spec.toml`` (next to this module) declares each part (datasets ×
samplers × methods × sweeps), every default once with its justification (the protocol, the
rounds, β, the learning rates, the negative samplers) and the tables' layouts; :func:`cell` and
:func:`grid_cells` read it through :mod:`fedlib.experiments.spec`. The test metrics reported are
those of the evaluation selected on validation Recall@10 (the code evaluates the test set every
round and keeps the best-validation one).

The path of a cell: :func:`run_cell` builds the method (:func:`make_federated`; FedRKG's is
:func:`fedlib.papers.fedrkg.method.guided_method` with
:class:`~fedlib.papers.fedrkg.method.KnowledgeGuidance` attached) and hands it to the engine's
``run_federated``; what it records besides the training (selection, probes, LDP accounting)
is :mod:`fedlib.papers.fedrkg.measures`. The parts are run by ``python -m fedlib grid fedrkg
<parts>`` (:func:`main`).
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
from fedlib.engine import FederatedConfig, RankingEvaluator, run_federated, union_pairs
from fedlib.engine.method import GradientNoise
from fedlib.experiments import grid
from fedlib.baselines import registry
from fedlib.experiments.selection import best_on_validation
from fedlib.experiments.spec import load_spec
from fedlib.papers.fedrkg.measures import (SELECTION_METRIC, SelectionRecorder, guidance_probe, ldp_epsilon, ldp_params,
                                           run_centralised)
from fedlib.papers.fedrkg.method import LOG_KEY, KnowledgeGuidance
from fedlib.reporting.results import config_hash, latest_records

__all__ = [
    "PAPER", "SPEC", "VERSION", "PARTS", "DATASETS", "OFFLINE_DATASETS", "METHODS", "GUIDANCE_MODES", "LDP",
    "DEFAULT_PARAMS", "SELECTION_METRIC", "cell", "method_label", "grid_cells", "part_cells", "fedrap_code_cells",
    "load_split", "make_sampler", "SelectionRecorder", "run_cell", "checkpointable", "guidance_rounds", "ldp_epsilon",
    "config_hash", "SELECTED", "SELECTED_SERVER_LR", "select_learning_rates", "select_server_lr",
]

PAPER = "fedrkg"
#: The grid's parts, defaults and named lists, and the tables' layouts, as data.
SPEC = load_spec(PAPER)  # spec.toml, next to this module
VERSION = SPEC.version
PARTS = SPEC.parts
#: the paper's dataset names -> registry names of the FedRKG protocol (``synthetic``: the smoke profile's)
DATASETS = {name: choice["registry"] for name, choice in SPEC.choices("dataset").items() if "registry" in choice}
OFFLINE_DATASETS = tuple(SPEC.list("offline_datasets"))
METHODS = tuple(SPEC.list("method"))
#: FedRKG's modes (:class:`~fedlib.papers.fedrkg.method.KnowledgeGuidance`) -> the paper's row labels
GUIDANCE_MODES = {mode: choice["label"] for mode, choice in SPEC.choices("guidance").items()}
LDP = SPEC.list("ldp")[0]  # Table 5's clip and noise
KS = (5, 10, 20)


def _method_defaults(method: str) -> Dict[str, Any]:
    """``[choices.method]``'s parameters of ``method``; FedRKG's guidance schedule from :class:`KnowledgeGuidance`."""
    params = dict(SPEC.choice("method", method)["params"])
    if method == "FedRKG":
        params.update(interval=KnowledgeGuidance.interval, gate_lr=KnowledgeGuidance.gate_lr,
                      gate_epochs=KnowledgeGuidance.gate_epochs)
    return params


#: every method's hyperparameters of the paper profile (the dataset's β and lr_decay aside)
DEFAULT_PARAMS: Dict[str, Dict[str, Any]] = {method: _method_defaults(method) for method in METHODS}
#: the learning rates chosen on validation by the ``headline_tuning`` part (spec ``[selected.lr]``):
#: ``{dataset: {sampler: {method: lr}}}``; :func:`cell` applies them with ``tuned=True``
SELECTED: Dict[str, Dict[str, Dict[str, float]]] = SPEC.data.get("selected", {}).get("lr", {})
HEADLINE_DATASETS = tuple(SPEC.list("headline_datasets"))


#: FedDAE's server Adam rate chosen on validation by the ``feddae_server`` part (spec
#: ``[selected.server_lr]``): ``{dataset: {sampler: rate}}``; :func:`cell` applies it with ``tuned=True``
SELECTED_SERVER_LR: Dict[str, Dict[str, float]] = SPEC.data.get("selected", {}).get("server_lr", {})
#: the server Adam rate of FedDAE's public code (the tie-break of :func:`select_server_lr`)
FEDDAE_CODE_SERVER_LR = 1e-3


def _best_rate(options: Sequence[tuple], code_rate: float) -> float:
    """The rate of ``[(rate, validation score or None), ...]`` with the highest score
    (:func:`~fedlib.experiments.selection.best_on_validation`); ties go to ``code_rate``, then to
    the smaller rate; a score of None or NaN (diverged before its first evaluation) never wins.
    When no rate has a score (all diverged), the code's rate stays."""
    best = best_on_validation(options, prefer=lambda rate: (rate != code_rate, rate))
    return code_rate if best is None else best


def selected_lr(dataset: str, sampler: str, method: str) -> Optional[float]:
    """The rate :data:`SELECTED` holds for ``method`` on ``dataset`` under ``sampler``, else ``None``."""
    return SELECTED.get(dataset, {}).get(sampler, {}).get(method)


def tuning_scores(records, datasets: Sequence[str] = HEADLINE_DATASETS) -> Dict[tuple, List[tuple]]:
    """``{(dataset, sampler, method): [(lr, validation score or None), ...]}`` of the recorded
    ``headline_tuning`` runs (seed 0; the score is the selection metric at the selected evaluation,
    ``None`` when the cell is not recorded or diverged before its first evaluation)."""
    known = latest_records(records)
    tried: Dict[tuple, List[tuple]] = {}
    for config in grid_cells("headline_tuning"):
        if config["dataset"] not in datasets:
            continue
        record = known.get(config_hash(config))
        score = None if record is None else record.metrics.get("valid/" + SELECTION_METRIC)
        tried.setdefault((config["dataset"], config["sampler"], config["method"]), []).append(
            (config["params"]["lr"], score, record is not None))
    return tried


def select_learning_rates(records, datasets: Sequence[str] = HEADLINE_DATASETS) -> Dict[str, Dict[str, Dict[str, float]]]:
    """The rates behind :data:`SELECTED`, re-derived from the recorded ``headline_tuning`` runs.

    For every (dataset, sampler, method) of the part: the rate whose seed-0 run has the highest
    validation Recall@10 at its selected evaluation (the selection metric); ties go to the public
    code's rate (the spec's default), then to the smaller rate; a run that diverged before its first
    evaluation never wins. Raises when a cell of the part is not recorded, naming it (run
    ``python -m fedlib grid fedrkg headline_tuning``).
    """
    chosen: Dict[str, Dict[str, Dict[str, float]]] = {}
    for (dataset, sampler, method), options in tuning_scores(records, datasets).items():
        missing = [lr for lr, _, recorded in options if not recorded]
        if missing:
            raise ValueError(f"headline_tuning has no record of {method} at lr {missing[0]} on {dataset} ({sampler}): "
                             "run python -m fedlib grid fedrkg headline_tuning")
        chosen.setdefault(dataset, {}).setdefault(sampler, {})[method] = _best_rate(
            [(lr, score) for lr, score, _ in options], DEFAULT_PARAMS[method]["lr"])
    return chosen


def select_server_lr(records, datasets: Sequence[str] = HEADLINE_DATASETS) -> Dict[str, Dict[str, float]]:
    """The rates behind :data:`SELECTED_SERVER_LR`, re-derived from the recorded ``feddae_server`` runs.

    For every (dataset, sampler) of the part: FedDAE's server Adam rate whose seed-0 run has the
    highest validation Recall@10 at its selected evaluation; ties go to the public code's rate
    (:data:`FEDDAE_CODE_SERVER_LR`), then to the smaller rate. Raises when a cell of the part is
    not recorded, naming it (run ``python -m fedlib grid fedrkg feddae_server``).
    """
    known = latest_records(records)
    options: Dict[tuple, List[tuple]] = {}
    for config in grid_cells("feddae_server"):
        if config["dataset"] not in datasets or "server_lr" not in config["params"]:  # FedAvg: not a rate
            continue
        record = known.get(config_hash(config))
        rate = config["params"]["server_lr"]
        if record is None:
            raise ValueError(f"feddae_server has no record of FedDAE at server lr {rate} on {config['dataset']} "
                             f"({config['sampler']}): run python -m fedlib grid fedrkg feddae_server")
        options.setdefault((config["dataset"], config["sampler"]), []).append(
            (rate, record.metrics.get("valid/" + SELECTION_METRIC)))
    chosen: Dict[str, Dict[str, float]] = {}
    for (dataset, sampler), tried in options.items():
        chosen.setdefault(dataset, {})[sampler] = _best_rate(tried, FEDDAE_CODE_SERVER_LR)
    return chosen


def cell(dataset: str, method: str, *, params: Optional[Mapping] = None, interval: Optional[int] = None,
         ldp: Optional[Mapping[str, float]] = None, probe_round: Optional[int | str] = None,
         fedrap_code: Optional[str] = None, tuned: bool = False, **settings) -> Dict[str, Any]:
    """One run of the grid, as a plain dict.

    Args:
        dataset, method: names of ``[choices.dataset]`` (or ``"synthetic"``, the smoke profile's) and ``[choices.method]``.
        params: overrides of the method's hyperparameters (``[choices.method]``, FedRKG's
            ``beta``, ``lr_decay``; any federated method also takes ``local_epochs``, default 1).
        interval: FedRKG's guidance interval ``T_int``; other methods have none and ignore it,
            so one set of keyword arguments serves a whole grid.
        ldp: ``{"clip": C, "noise_std": s}``: clip each local step's gradient of the private
            item table to L2 norm ``C`` and add ``N(0, s²)`` (Table 5), else ``None``.
        probe_round: evaluate every user's test metrics just before and after the guidance of
            this round (0-based round index ``t``; Table 4, D.3, D.4); ``"last"``: the last
            guidance round of the run (the paper's "round 900").
        fedrap_code: FedRAP with its public code's local training, ``"epochs"`` (10 local epochs,
            batch 2048, rates × 0.97 per round) or ``"optimizer"`` (also the code's
            ``SGD(weight_decay=1e-4)``, ``ExponentialLR(0.95)`` per batch, local epochs stopped at a
            relative loss change below 1e-4, and the constant ``λ``, ``μ`` its loss really reads).
        tuned: take the learning rate chosen on validation (:data:`SELECTED`) where it holds one
            for this dataset, sampler and method, and FedDAE's server Adam rate
            (:data:`SELECTED_SERVER_LR`) where it holds one (``params`` still override them).
        settings: the spec's ``[cell]`` keys (``guidance``, ``backbone``, ``sampler``, ``rounds``,
            ``eval_every``, ``seed``, ``trace_every``, ``dim``, ...); ``None`` keeps the default.
    """
    if method != "FedRKG":
        settings.pop("backbone", None)  # FedRKG's (Table 3); ignored by other methods
    if tuned:
        sampler = settings.get("sampler") or SPEC.data["cell"]["sampler"]
        rate = selected_lr(dataset, sampler, method)
        if rate is not None:
            params = {"lr": rate, **dict(params or {})}
        server_rate = SELECTED_SERVER_LR.get(dataset, {}).get(sampler) if method == "FedDAE" else None
        if server_rate is not None:
            params = {"server_lr": server_rate, **dict(params or {})}
    if fedrap_code is not None:
        params, settings["batch_size"] = _fedrap_code(method, fedrap_code, params)
    centralised = SPEC.choice("method", method).get("epochs") if method in SPEC.choices("method") else None
    if settings.get("rounds") is None and centralised is not None:
        settings["rounds"] = centralised  # epochs of the centralised baselines
    config = SPEC.config({"dataset": dataset, "method": method}, settings)
    valid = {"sampler": SPEC.list("sampler")}
    if method == "FedRKG":
        valid.update(guidance=SPEC.list("guidance"), backbone=SPEC.list("guided_backbones"))
    elif config["guidance"] is not None:
        raise ValueError(f"guidance modes apply to FedRKG only, not to {method}")
    for key, values in valid.items():
        if config[key] not in values:
            raise ValueError(f"{key} must be one of {sorted(values)}, got {config[key]!r}")
    if config["eval_every"] < 1:
        raise ValueError(f"eval_every must be >= 1, got {config['eval_every']}")
    choice = SPEC.choice("dataset", dataset)
    merged = _method_defaults(method)
    if method == "FedRKG":
        merged["beta"] = choice["beta"]
        if interval is not None:
            merged["interval"] = int(interval)
    optional = set() if centralised else {"local_epochs"}
    if not centralised:
        merged["lr_decay"] = choice["lr_decay"]
    if method == "FedRAP":  # the public code's optimiser (fedrap_code); absent from the default cells' hash
        from fedlib.baselines.single_domain.fedrap import FEDRAP_CODE_OPTIMIZER
        optional |= {*FEDRAP_CODE_OPTIMIZER, "curriculum"}
    if method == "FedDAE":  # the public code's server Adam; absent from the default cells' hash
        optional |= {"server_lr", "server_weight_decay"}
    unknown = set(params or {}) - set(merged) - optional
    if unknown:
        raise ValueError(f"unknown parameters {sorted(unknown)} for {method}; known: {sorted(merged)}")
    merged.update(params or {})
    config["params"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in sorted(merged.items())}
    if ldp is not None:
        missing = {"clip", "noise_std"} - set(ldp)
        if missing:
            raise ValueError(f"ldp needs keys 'clip' and 'noise_std', missing {sorted(missing)}")
        ldp = {"clip": float(ldp["clip"]), "noise_std": float(ldp["noise_std"])}
    if probe_round == "last":
        scheduled = guidance_rounds(config["rounds"], config["params"]["interval"])
        if not scheduled:
            raise ValueError(f"no guidance round in {config['rounds']} rounds with interval {config['params']['interval']}")
        probe_round = scheduled[-1]
    config.update(ldp=ldp, probe_round=None if probe_round is None else int(probe_round))
    config["version"] = SPEC.cell_version(config)  # [versions]: the LDP cells' version (ldp is set here)
    return config


def _fedrap_code(method: str, variant: str, params: Optional[Mapping]) -> tuple:
    """``(params, batch_size)`` of FedRAP with its public code's local training (``variant`` of ``[lists] fedrap_code``)."""
    from fedlib.baselines.single_domain.fedrap import FEDRAP_CODE_CONFIG, FEDRAP_CODE_OPTIMIZER

    if method != "FedRAP" or variant not in SPEC.list("fedrap_code"):
        raise ValueError(f"fedrap_code is one of {SPEC.list('fedrap_code')} of FedRAP, got {variant!r} for {method}")
    code = {"local_epochs": FEDRAP_CODE_CONFIG["local_epochs"], "lr_decay": 0.97}
    if variant == "optimizer":
        code.update(FEDRAP_CODE_OPTIMIZER, curriculum="constant")
    return {**code, **dict(params or {})}, FEDRAP_CODE_CONFIG["batch_size"]  # given params win (a search)


def method_label(config: Mapping[str, Any]) -> str:
    """The paper's row label of a cell (``"w/o AG"`` for FedRKG's fixed mode, …)."""
    if config["method"] == "FedRKG":
        label = GUIDANCE_MODES[config["guidance"]]
        backbone = config.get("backbone") or "FedMF"
        return label if backbone == "FedMF" else f"{backbone} w/ AG" if config["guidance"] == "adaptive" else \
            f"{backbone} {label}"
    return config["method"]


def grid_cells(part: str, datasets: Sequence[str] = OFFLINE_DATASETS, **kwargs) -> List[Dict[str, Any]]:
    """The cells of one part of the paper-profile grid (``[parts]`` of the spec); ``datasets``
    filters the multi-dataset parts, ``kwargs`` go to each :func:`cell`."""
    return SPEC.cells(part, cell, {"datasets": list(datasets)}, **kwargs)


def part_cells(part: str, **fixed) -> List[Dict[str, Any]]:
    """The distinct cells of ``part`` with the keywords ``fixed`` replacing the spec's
    (``dataset="synthetic"``, ``sampler="correct"``, ``rounds=4``), in the part's order."""
    return grid.unique_cells(SPEC.cells(part, cell, **fixed))


def fedrap_code_cells(datasets: Sequence[str], samplers: Sequence[str], variants: Optional[Sequence[str]] = None,
                      **kwargs) -> List[Dict[str, Any]]:
    """FedRAP with its public code's local training (:func:`cell`'s ``fedrap_code``), every variant × dataset × sampler."""
    return [cell(d, "FedRAP", sampler=s, fedrap_code=v, **kwargs)
            for v in variants or SPEC.list("fedrap_code") for d in datasets for s in samplers]


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
    if SPEC.choice("sampler", sampler)["exclude"] == "all_rated":
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


#: ``AveragingState.extra`` key: the round whose loss or scores were not finite (the run stopped there)
DIVERGED_KEY = "diverged_at_round"


# ======================================================================================
# Methods
# ======================================================================================
def guidance_rounds(rounds: int, interval: int) -> List[int]:
    """0-based rounds ``t`` before which guidance runs (``KnowledgeGuidance.is_guidance_round``)."""
    schedule = KnowledgeGuidance(interval=int(interval))
    return [t for t in range(int(rounds)) if schedule.is_guidance_round(t)]


def make_federated(config: Mapping[str, Any], split, sampler: NegativeSampler, fed_config: FederatedConfig):
    """``(method, executor)`` of a federated cell, built by the method registry.

    The cell's ``params`` are the method's keywords; what the cell adds: the dataset's learning-rate
    decay (1 where it has none), LDP noise on the gradients, CoFedRec's item clusters on tiny data,
    and FedRKG's guidance (its mode, backbone and sampler; the gradient clip that LDP replaces)."""
    name, params = config["method"], dict(config["params"])
    params.pop("local_epochs", None)  # read by federated_config
    params["lr_decay"] = params.get("lr_decay", 1.0)
    if config["ldp"] is not None:
        params["gradient_noise"] = GradientNoise.from_std(clip_norm=config["ldp"]["clip"],
                                                          noise_std=config["ldp"]["noise_std"], params=ldp_params(name))
    if name == "CoFedRec":
        params["num_clusters"] = _item_clusters(int(params["num_clusters"]), split.num_items)
    if name == "FedRKG":
        guidance = {k: params.pop(k) for k in ("beta", "interval", "gate_lr", "gate_epochs")}
        guidance.update(interval=int(guidance["interval"]), gate_epochs=int(guidance["gate_epochs"]))
        params.update(backbone=config.get("backbone") or "FedMF", mode=config["guidance"], sampler=sampler,
                      guidance=guidance, grad_clip_norm=None if config["ldp"] is not None else 1.0)  # LDP clips
    job = registry.get(name, "single-domain").build(split, fed_config, dim=config["dim"], **params)
    return job.algorithm.method, job.algorithm.executor


def _item_clusters(wanted: int, num_items: int) -> int:
    """CoFedRec's item clusters: ``wanted`` (30), but at most one per 10 items on tiny (smoke) data."""
    return int(max(2, min(wanted, num_items // 10)))


# ======================================================================================
# Running one cell
# ======================================================================================
def _centralised(config: Mapping[str, Any]) -> bool:
    return "epochs" in SPEC.choice("method", config["method"])


def checkpointable(config: Mapping[str, Any]) -> bool:
    """Whether :func:`run_cell` can save and resume ``config`` mid-run.

    Federated cells can. Not: the centralised baselines (minutes per cell), and the probe and
    trace cells, whose measurements accumulate outside the training state.
    """
    return not _centralised(config) and config["probe_round"] is None and config["trace_every"] == 0


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
    if _centralised(config):
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
            hooks.append(lambda run, record: progress(record))

        def on_round_end(run, record):
            loss = record.get("train_loss")
            if recorder.diverged or (loss is not None and not math.isfinite(loss)):
                # A NaN/inf loss or NaN scores: the parameters are lost; stop (recorded below;
                # kept in the state so that a checkpoint of the stopped run carries it).
                run.state.extra.setdefault(DIVERGED_KEY, int(record["round"]))
                run.stopped_early = True
                return
            probe_round = config["probe_round"]
            if probe_round is not None and run.stopped_early and run.round_index <= probe_round:
                # A probe cell measures the guidance of its probe round (the paper's round 900):
                # patience may not end it before then. Selection still reads every evaluation
                # (a later best is selected); once past the probe round patience applies again.
                run.stopped_early = False
            for hook in hooks:
                hook(run, record)

        if checkpointer is not None:
            checkpointer.attach("selection", recorder)
        run = run_federated(method, split.train, fed_config, executor=executor, sampler=sampler,
                            evaluator=recorder, device=device, keep_best_state=False, on_round_end=on_round_end,
                            checkpointer=checkpointer)
        history = run.history
        rounds_run = run.round_index
        server_extra = run.state.extra
        if DIVERGED_KEY in server_extra:
            extra["diverged_at_round"] = server_extra[DIVERGED_KEY]
        if trace is not None:
            extra["trace"] = trace.frame().to_dict(orient="list")
        log = server_extra.get(LOG_KEY)
        if log:
            extra["guidance_log"] = log
        from fedlib.baselines.single_domain.gpfedrec import GRAPH_LOG_KEY
        graph_log = server_extra.get(GRAPH_LOG_KEY)
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
             progress: bool = True, rerun: bool = False, cluster: Optional[grid.Cluster] = None) -> pd.DataFrame:
    """Run every cell without a recorded result, appending each to runs.jsonl (``cluster``: train on Dask workers).

    A fresh clone resumes from the committed ``results/fedrkg[/profile]/runs.jsonl``: recorded
    cells are restored into the cache and not trained again. A cell in training saves its
    state every :data:`CHECKPOINT_EVERY_S` seconds (:func:`checkpointable` cells) under
    ``cache_dir/<profile>/checkpoints/``; a killed grid's cell continues there when the grid
    next runs (a LastFM-2K cell can outlast a working session).
    """
    return grid.run_recorded_grid(PAPER, cells, _train, profile, cache_dir=cache_dir, progress=progress,
                                  checkpoint_every_s=CHECKPOINT_EVERY_S, rerun=rerun, cluster=cluster)


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
                            "--samplers": grid.CellFilter("sampler", SPEC.list("sampler"))})


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
