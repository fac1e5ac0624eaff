r"""F3CRec experiments: every table and figure of the paper as cells of one grid.

Reference:
    Lim, Kweon, Kim, Kim, Choi, Kim, Yu. "Federated Continual Recommendation." CIKM 2025.
    https://arxiv.org/abs/2508.04792. Protocol details the paper leaves open follow the
    authors' public code, https://github.com/Jaehyung-Lim/F3CRec-CIKM-25 (``fcrec/main.py``,
    ``fcrec_data/dataset/ml-100k/data_processing.ipynb``).

A **cell** is a plain dict (hashable by :func:`~fedlib.reporting.config_hash`) that fixes one
continual run: dataset, backbone, method (with its hyperparameters and ablation flags),
upload noise, split rule, rounds, seed. :func:`run_cell` trains it block by block with
:func:`~fedlib.baselines.continual.continual.run_continual` and returns

* ``metrics``: numbers (``"N@20/D1"`` ... ``"N@20/Avg"``, ``"R@20/..."``, selected rounds,
  seconds), what ``runs.jsonl`` records and the tables are built from;
* ``extra``: per-user N@20 of every block (for the paper's paired t-test), the accuracy
  matrix ``A[t][s]``, each block's mean training loss and validation N@20 per round
  (``"train_loss per round/D1"``, ...; ``None`` where not finite), and, for analysis cells,
  the static/dynamic user and item analyses of Tables 4, 5 and 7.

Block 0 is plain training for every method (F3CRec starts at ``t = 1``), so it is trained
once per ``(dataset, backbone, seed, split, ...)`` and cached on disk (:func:`base_block`).

The grid itself is data: ``spec.toml`` (next to this module) declares each part (datasets ×
backbones × methods × sweeps), every default once with its justification (the split, rounds,
ε, learning rates, the validation choices :data:`SELECTED`), and the tables' layouts;
:func:`cell` and :func:`grid_cells` read it through :mod:`fedlib.experiments.spec`. Reg's λ is
expressed relative to the item learning rate (see :func:`reg_lambda`) because the absolute
values of the paper's grid diverge with F3CRec's ``lr × |I|`` item step.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np
import pandas as pd
import torch

from fedlib.data.protocols import build_split
from fedlib.data.protocols.f3crec import VALID_RULES
from fedlib.device import default_device
from fedlib.engine import FederatedConfig, RankingEvaluator, RunResult, UploadNoise
from fedlib.baselines.continual.continual import (NEXT_BLOCK_FROM, ContinualMethod, FineTuning, block_artifacts,
                                                  block_from_payload, block_payload, fedmf_backbone, fedncf_backbone,
                                                  pfedrec_backbone, run_continual)
from fedlib.baselines import registry
from fedlib.papers.f3crec.method import MEMORY_REFRESH
from fedlib.experiments.selection import best_on_validation, is_finite_score
from fedlib.experiments.spec import load_spec
from fedlib.reporting.results import config_hash

__all__ = [
    "PAPER", "SPEC", "PARTS", "DATASETS", "OFFLINE_DATASETS", "ANALYSIS_DATASETS", "BACKBONES", "METHODS",
    "SENSITIVITY_GRID", "SELECTED", "cell", "method_params", "grid_cells",
    "audit_cells", "select_hyperparameters", "select_backbone_lr", "backbone_choices", "tuning_grids", "flag_rules", "reg_lambda", "make_backbone", "make_method", "load_stream", "base_block",
    "run_cell", "WithUploadNoise", "run_cells", "run_grid", "run_live", "forgetting_frame", "memory_consumed_share",
]

PAPER = "f3crec"
#: The grid's parts, defaults and named lists, and the tables' layouts, as data.
SPEC = load_spec(PAPER)  # spec.toml, next to this module
#: Bumped (in the spec) when a change alters what a cell computes (old cache files then stop matching).
VERSION = SPEC.version
PARTS = SPEC.parts

#: Paper dataset name -> registry name (``None``: the smoke profile's synthetic stream).
DATASETS = {name: choice.get("registry") for name, choice in SPEC.choices("dataset").items()}
OFFLINE_DATASETS = tuple(SPEC.list("offline_datasets"))
ANALYSIS_DATASETS = tuple(SPEC.list("analysis_datasets"))
BACKBONES = tuple(SPEC.list("backbone"))
METHODS = tuple(SPEC.list("methods"))
#: Figure 4's one-at-a-time sweeps (ε as multiples of :func:`eps_scale`).
SENSITIVITY_GRID = {name: tuple(SPEC.list(name)) for name in ("eps_multiple", "lambda_kd", "beta")}
REG_PULL = SPEC.choice("method", "Reg")["params"]["pull"]
#: Hyperparameters chosen once on validation (:func:`select_hyperparameters`), ``{dataset: {method: {name: value}}}``.
SELECTED: Dict[str, Dict[str, Dict[str, float]]] = SPEC.data["selected"]


# ======================================================================================
# Cells
# ======================================================================================
def eps_scale(dataset: str) -> float:
    """The dataset's ε order of magnitude (paper §5.5: 10⁻³, 10⁻⁴ Lastfm, 10⁻⁵ ML-Latest-Small)."""
    return SPEC.choice("dataset", dataset)["eps_scale"]


def backbone_choices(dataset: str, backbone: str) -> Dict[str, Any]:
    """``[selected.<dataset>.backbones.<backbone>]``: that backbone's own ``lr`` and methods' values
    on ``dataset`` (empty where the backbone reuses the FedMF choices and its spec's rate)."""
    return dict(SELECTED.get(dataset, {}).get("backbones", {}).get(backbone, {}))


def method_params(method: str, dataset: str, tuned: bool = True, backbone: Optional[str] = None) -> Dict[str, Any]:
    """Hyperparameters of ``method`` (a Table 2 method or an ablation label) on ``dataset``.

    ``tuned=True`` applies :data:`SELECTED` (values chosen on validation data,
    :func:`select_hyperparameters`): ``backbone``'s own choices where it has them, else the
    FedMF tuning sweep's; ``tuned=False`` gives the untuned defaults around which the sweeps
    vary one parameter at a time. An ablation takes F3CRec's parameters (tuned or not) plus its flags.
    """
    own = SPEC.choice("method", method)
    base = own.get("ablation_of", method)
    selected = {}
    if tuned:
        selected = backbone_choices(dataset, backbone).get(base) if backbone is not None else None
        selected = selected if selected is not None else SELECTED.get(dataset, {}).get(base, {})
    params = SPEC.resolve(SPEC.choice("method", base)["params"], {"dataset": dataset})
    return {**params, **selected, **own.get("flags", {})}


def cell(dataset: str, backbone: str, method: str, *, params: Optional[Mapping] = None, tuned: bool = True,
         backbone_lr: Optional[float] = None, **settings) -> Dict[str, Any]:
    """The configuration of one continual run (every setting that changes its numbers).

    ``settings`` override the spec's ``[cell]`` defaults (``rounds``, ``patience``, ``seed``,
    ``split``, ``upload_noise``, ``analysis``, ``batch_size``, ``num_negatives``, ``dim``,
    ``num_blocks``, and the official code's options ``next_block_from``, ``valid_rule``,
    ``memory_refresh``; ``None`` keeps the default); ``params`` override the method's
    hyperparameters (:func:`method_params`, ``tuned`` or not). The backbone's learning rate is
    ``backbone_lr`` when given (the ``tuning_lr`` part), else the one chosen for it on
    ``dataset`` (:func:`backbone_choices`, tuned or not: the methods' sweeps run at it), else its spec's.

    The code options (``[lists] omitted_at_default``) are left out of the config at their
    default, so configs recorded before they existed keep their hashes; ``memory_refresh``
    other than ``"all"`` is refused for a method without a top-N memory (only F3CRec, its
    ablations and KD keep one).
    """
    config = SPEC.config({"dataset": dataset, "backbone": backbone, "method": method}, settings)
    lr = backbone_lr if backbone_lr is not None else backbone_choices(dataset, backbone).get("lr")
    if lr is not None:
        if not (isinstance(lr, (int, float)) and lr > 0):
            raise ValueError(f"backbone_lr must be a positive number, got {lr!r}")
        config["backbone_params"] = {**config["backbone_params"], "lr": float(lr)}
    config["method_params"] = {**method_params(method, dataset, tuned=tuned, backbone=backbone), **dict(params or {})}
    for key, allowed in (("next_block_from", NEXT_BLOCK_FROM), ("valid_rule", VALID_RULES),
                         ("memory_refresh", MEMORY_REFRESH)):
        if config[key] not in allowed:
            raise ValueError(f"{key} must be one of {allowed} (the first is fedlib's default, the second the "
                             f"official code's behaviour), got {config[key]!r}")
    keeps_top_n_memory = (SPEC.choice("method", method).get("ablation_of") or method) in ("F3CRec", "KD")
    if config["memory_refresh"] != SPEC.data["cell"]["memory_refresh"] and not keeps_top_n_memory:
        raise ValueError(f"memory_refresh={config['memory_refresh']!r} changes nothing for {method!r}: only F3CRec, "
                         "its ablations and KD keep top-N lists; leave memory_refresh at its default for this method")
    # Options added after the grid was recorded: absent at their default, so old hashes still match.
    omitted = {k for k in SPEC.list("omitted_at_default") if config[k] == SPEC.data["cell"][k]}
    return {k: v for k, v in config.items() if k not in omitted}


def grid_cells(part: str, datasets: Sequence[str] = OFFLINE_DATASETS, **kwargs) -> List[Dict[str, Any]]:
    """The cells of one part of the paper-profile grid (``[parts]`` of the spec); ``kwargs`` go to each :func:`cell`."""
    return SPEC.cells(part, cell, {"datasets": list(datasets)}, **kwargs)


def audit_cells(dataset: str = "ML-100K", **kwargs) -> List[Dict[str, Any]]:
    """The split audit: FT and F3CRec (FedMF) with the paper's random and the code's chronological split."""
    return grid_cells("audit", dataset=dataset, **kwargs)


def _mean_validation(record) -> float:
    """Mean validation N@20 over D1–D3; NaN when a block has none (the run diverged)."""
    values = [record.metrics.get(f"valid N@20/D{t}") for t in (1, 2, 3)]
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values):
        return math.nan
    return float(np.mean(values))


def _best(scored: Sequence[Optional[tuple]]) -> Any:
    """The value of the best ``(value, score)`` (:func:`~fedlib.experiments.selection.best_on_validation`;
    ties keep the first value of the grid); ``None`` while a point is unrecorded or when every run diverged."""
    return None if None in scored else best_on_validation(scored)


def select_backbone_lr(records, datasets: Sequence[str] = OFFLINE_DATASETS) -> Dict[str, Dict[str, float]]:
    """Each backbone's learning rate of the ``tuning_lr`` part with the best mean validation N@20
    of FT over D1–D3: ``{dataset: {backbone: lr}}``; a backbone with an unrecorded rate is left out."""
    from fedlib.reporting.results import latest_records

    known = latest_records(records)
    points: Dict[tuple, list] = {}
    for keywords, config in SPEC.labelled_cells("tuning_lr", cell, {"datasets": list(datasets)}):
        if keywords["dataset"] not in datasets:
            continue
        record = known.get(config_hash(config))
        scored = points.setdefault((keywords["dataset"], keywords["backbone"]), [])
        scored.append(None if record is None else (keywords["backbone_lr"], _mean_validation(record)))
    out: Dict[str, Dict[str, float]] = {}
    for (dataset, backbone), scored in points.items():
        if _best(scored) is not None:
            out.setdefault(dataset, {})[backbone] = float(_best(scored))
    return out


def select_hyperparameters(records, datasets: Sequence[str], **kwargs) -> Dict[str, Dict[str, Any]]:
    """Each swept value of the ``tuning`` part with the best mean validation N@20 over D1–D3, one at a time.

    Returns ``{dataset: {"F3CRec": {"eps", "lambda_kd", "beta"}, "KD": {"lambda_kd"}, "Reg": {"pull"},
    "RLP2": {"alpha"}, "backbones": {backbone: {"lr": ..., "F3CRec": {...}, ...}}}}``: the FedMF
    sweeps' values (used for every backbone without its own), and per backbone of the headline
    setting its learning rate (:func:`select_backbone_lr`) and its own sweeps' values. A dataset
    whose FedMF sweep is incomplete is left out, as is a backbone's incomplete sweep. Ties keep
    the first value of the grid.
    """
    from fedlib.reporting.results import latest_records

    known = latest_records(records)
    points: Dict[tuple, list] = {}  # (dataset, backbone, method, param) -> [(value, score) or None]
    for keywords, config in SPEC.labelled_cells("tuning", cell, {"datasets": list(datasets)}, **kwargs):
        sweep, record = keywords["sweep"], known.get(config_hash(config))
        scored = points.setdefault((keywords["dataset"], keywords["backbone"], keywords["method"], sweep["param"]), [])
        scored.append(None if record is None else (sweep["value"], _mean_validation(record)))
    chosen: Dict[tuple, Dict[str, Dict[str, Any]]] = {}  # (dataset, backbone) -> {method: {param: value}}
    for (dataset, backbone, method, param), scored in points.items():
        chosen.setdefault((dataset, backbone), {}).setdefault(method, {})[param] = _best(scored)
    complete = lambda choice: all(None not in c.values() for c in choice.values())
    out = {d: dict(c) for (d, b), c in chosen.items() if b == "FedMF" and complete(c)}
    for dataset, rates in select_backbone_lr(records, datasets).items():
        for backbone, lr in rates.items():
            own = chosen.get((dataset, backbone), {}) if backbone != "FedMF" else {}
            entry = {"lr": lr, **(own if own and complete(own) else {})}
            if dataset in out:
                out[dataset].setdefault("backbones", {})[backbone] = entry
    return out


@functools.lru_cache(maxsize=None)
def _tuning_grids(dataset: str, backbone: str) -> Dict[str, Dict[str, tuple]]:
    grids: Dict[str, Dict[str, list]] = {}
    for keywords, _ in SPEC.labelled_cells("tuning", cell, {"datasets": [dataset]}):
        if keywords["dataset"] == dataset and keywords["backbone"] == backbone:
            sweep = keywords["sweep"]
            grids.setdefault(keywords["method"], {}).setdefault(f"method_params.{sweep['param']}", []).append(
                float(sweep["value"]))
    for keywords, _ in SPEC.labelled_cells("tuning_lr", cell, {"datasets": [dataset]}):
        if keywords["dataset"] == dataset and keywords["backbone"] == backbone:
            grids.setdefault("*", {}).setdefault("backbone_params.lr", []).append(float(keywords["backbone_lr"]))
    return {method: {path: tuple(v) for path, v in by_path.items()} for method, by_path in grids.items()}


def tuning_grids(config: Mapping[str, Any]) -> Dict[str, tuple]:
    """The values tried for each chosen hyperparameter of ``config`` on its dataset, for the
    ``grid_edge`` flag: ``{"method_params.beta": (...), "backbone_params.lr": (...)}``.

    Only a value :data:`SELECTED` chose counts (a sweep point away from it is at no grid's edge).
    A method's values come from its backbone's own sweeps where it has them, else from the FedMF
    sweeps (one at a time around the untuned defaults, whose winners are combined); an ablation's
    are F3CRec's. The backbone's rate comes from the ``tuning_lr`` part, for every method run at it.
    """
    dataset, method, backbone = config.get("dataset"), config.get("method"), config.get("backbone")
    if dataset not in SPEC.choices("dataset") or method not in SPEC.choices("method"):
        return {}
    base = SPEC.choice("method", method).get("ablation_of", method)
    own = backbone_choices(dataset, backbone)
    sweeps_of = backbone if base in own else "FedMF"
    chosen = own.get(base) if base in own else SELECTED.get(dataset, {}).get(base, {})
    params = config.get("method_params", {})
    out = {path: values for path, values in _tuning_grids(dataset, sweeps_of).get(base, {}).items()
           if path.split(".", 1)[1] in chosen and params.get(path.split(".", 1)[1]) == chosen[path.split(".", 1)[1]]}
    lr_grid = _tuning_grids(dataset, backbone).get("*", {}).get("backbone_params.lr")
    if lr_grid and "lr" in own and config.get("backbone_params", {}).get("lr") == own["lr"]:
        out["backbone_params.lr"] = lr_grid
    return out


def flag_rules():
    """The spec's ``[report.flags]`` with :func:`tuning_grids` as the grids the tuned values came from."""
    return dataclasses.replace(SPEC.flag_rules(), grids=tuning_grids)


# ======================================================================================
# Building blocks
# ======================================================================================
def load_stream(config: Mapping[str, Any]):
    """The cell's :class:`~fedlib.data.splits.BlockStream` (or a synthetic stream, see below).

    ``split`` and ``valid_rule`` (absent = ``"tenth"``, the configs recorded before it existed)
    go to :mod:`fedlib.data.protocols.f3crec`. ``dataset == "synthetic"`` (smoke profile only)
    uses :func:`fedlib.data.synthetic.drifting_stream`, which has the default valid rule only.
    """
    valid_rule = config.get("valid_rule", "tenth")
    if config["dataset"] == "synthetic":
        if valid_rule != "tenth":
            raise ValueError(f"the synthetic stream is split with valid_rule 'tenth' only, got {valid_rule!r}: "
                             "run valid_rule 'code' on a real dataset (e.g. ML-100K)")
        from fedlib.data.synthetic import drifting_stream
        return drifting_stream(seed=0, split=config["split"])
    return build_split("f3crec", DATASETS[config["dataset"]], split=config["split"], valid_rule=valid_rule)


def make_backbone(config: Mapping[str, Any]):
    factory = {"FedMF": fedmf_backbone, "FedNCF": fedncf_backbone, "PFedRec": pfedrec_backbone}[config["backbone"]]
    return factory(dim=config["dim"], **config["backbone_params"])


def item_learning_rate(config: Mapping[str, Any], num_items: int) -> float:
    """The backbone's per-row item learning rate (``lr × |I|`` × ``lr_eta``)."""
    params = config["backbone_params"]
    return params["lr"] * num_items * params.get("lr_eta", 1.0)


def reg_lambda(config: Mapping[str, Any], num_items: int) -> float:
    """Reg's λ: one local step moves an old item row ``pull`` of the way back to ``Q^{t−1}``.

    With plain SGD the penalty ``λ‖q − q^{t−1}‖²`` changes a row by ``2 λ lr_item (q − q^{t−1})``
    per step, so the paper's absolute grid (1e-5..1) is unstable for most of its values once
    ``lr_item = lr × |I|``; fixing the pull makes the same λ meaningful on every dataset and
    backbone.
    """
    return float(config["method_params"]["pull"]) / (2.0 * item_learning_rate(config, num_items))


class WithUploadNoise(ContinualMethod):
    """Any continual method with Laplace noise of scale ``λ`` on every upload (Table 8).

    F3CRec §5.6 perturbs the uploaded item table, ``Q_u ← Q_u + Laplace(0, λ)``, on every row
    (``support="full"``). Block 0 is the shared noise-free base model (the paper's incremental
    blocks start from a pre-trained base block).
    """

    def __init__(self, inner: ContinualMethod, scale: float):
        self.inner, self.scale = inner, float(scale)
        self.name = inner.name

    def make_method(self, ctx):
        method = self.inner.make_method(ctx)
        if ctx.previous is None or self.scale == 0.0:
            return method
        return dataclasses.replace(method, upload_noise=UploadNoise(scale=self.scale, support="full"))

    def after_block(self, ctx, global_state, private_state):
        return self.inner.after_block(ctx, global_state, private_state)


def make_method(config: Mapping[str, Any], num_items: int) -> ContinualMethod:
    """The :class:`ContinualMethod` of a cell, from the registry (``num_items`` of block 1, for Reg's λ).

    An ablation is F3CRec with its flags (already in ``method_params``) under the ablation's name.
    F3CRec, its ablations and KD get the cell's ``memory_refresh`` (absent = ``"all"``)."""
    name, params = config["method"], dict(config["method_params"])
    registered = SPEC.choice("method", name).get("ablation_of") or name
    if registered == "Reg":  # the spec's pull, as the λ of the item step it pulls back
        params = {"lambda_reg": reg_lambda(config, num_items)}
    elif registered == "F3CRec":
        params.update(record_shifts=bool(config.get("analysis", False)), name=name)
    if registered in ("F3CRec", "KD"):
        params["memory_refresh"] = config.get("memory_refresh", "all")
    method = registry.get(registered, "continual").build(**params)
    if config.get("upload_noise", 0.0):
        method = WithUploadNoise(method, config["upload_noise"])
    return method


def federated_config(config: Mapping[str, Any]) -> FederatedConfig:
    return FederatedConfig(rounds=config["rounds"], seed=config["seed"], num_negatives=config["num_negatives"],
                           batch_size=config["batch_size"], local_epochs=1, clients_per_round=None,
                           eval_every=1, patience=config["patience"], selection_metric="NDCG@20",
                           prefer_later_ties=False)


_BASE_KEYS = ("paper", "version", "dataset", "backbone", "backbone_params", "rounds", "patience", "seed", "split",
              "batch_size", "num_negatives", "dim", "data_seed")


def base_config(config: Mapping[str, Any]) -> Dict[str, Any]:
    """What block 0's training depends on (not the method: block 0 is plain for every method)."""
    return {k: config[k] for k in _BASE_KEYS if k in config}


def _cached_block(path: Path, key: Mapping[str, Any], device) -> Optional[RunResult]:
    """The block-0 run stored at ``path``, or ``None`` (with a warning) when the file is of
    another layout (e.g. the pickled ``BlockResult`` objects of older versions) or another key."""
    import pickle
    import warnings

    try:
        saved = torch.load(path, map_location=device, weights_only=True)  # plain values only: nothing is imported
        if config_hash(saved.get("config")) != config_hash(key):
            raise ValueError(f"it was trained for {saved.get('config')!r}, not {dict(key)!r}")
        return block_from_payload(saved["run"], device)
    except pickle.UnpicklingError:
        reason = "it holds pickled objects (the BlockResult of older versions), not plain values and tensors"
    except (EOFError, ValueError, KeyError, AttributeError, RuntimeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    warnings.warn(f"{path} is not a block-0 run this version can read: {reason}; training block 0 again and "
                  "replacing the file", stacklevel=3)
    return None


def base_block(config: Mapping[str, Any], stream, cache_dir: Optional[Path], device) -> RunResult:
    """Block 0 trained once per :func:`base_config`, kept in ``cache_dir/base/<hash>.pt``.

    Returns block 0's trainer :class:`~fedlib.engine.trainer.RunResult` as
    :func:`~fedlib.baselines.continual.continual.run_continual` returns it (``method`` ``"FT"``,
    the block's fields in ``artifacts``). The file holds ``{"config": base_config,
    "run": block_payload(run)}`` as plain values and tensors, read with ``weights_only=True``;
    a file this version cannot read (an older layout, another key) is replaced by training
    block 0 again, which gives the same numbers (block 0 is a pure function of the key).

    The key holds ``valid_rule`` when the cell sets it (``"code"`` also changes block 0's
    validation set, hence its selected round); ``next_block_from`` is not in it: the stored
    run keeps both the best and the last-round state.
    """
    key = base_config(config)
    if "valid_rule" in config:  # absent at its default: the recorded base files keep their names
        key["valid_rule"] = config["valid_rule"]
    path = None if cache_dir is None else Path(cache_dir) / "base" / f"{config_hash(key)}.pt"
    if path is not None and path.exists():
        cached = _cached_block(path, key, device)
        if cached is not None:
            return cached
    run = run_continual(stream, make_backbone(config), FineTuning(), federated_config(config), num_blocks=1,
                        accuracy_matrix=False, device=device).blocks[0]
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".tmp{id(run)}")
        torch.save({"config": dict(key), "run": block_payload(run)}, partial)
        partial.replace(path)  # atomic: a parallel worker sees either nothing or the whole file
    return run


# ======================================================================================
# Analyses (Tables 4, 5, 7)
# ======================================================================================
def _per_user_ndcg(evaluator: RankingEvaluator, model, global_state, private_state):
    users, per_user = evaluator.per_user(model, global_state, private_state, "test")
    return np.asarray(users), per_user["NDCG@20"].cpu().numpy()


def user_analysis(stream, backbone, run, base: RunResult, method: ContinualMethod) -> Dict[str, Any]:
    """Per-user D0-test N@20 before (``a00``) and after (``a10``) block 1, and mean Δ in block 1.

    Tables 4–5 split the users present in D0 and D1 by their preference shift Δ (Eq. 2, the
    mean over block 1's local steps, recorded by F3CRec); this function returns the raw
    per-user values so that groups defined by one run (F3CRec's Δ) can be applied to others.
    """
    evaluator = RankingEvaluator(stream[0].train, stream[0].valid, stream[0].test, ks=(20,))
    model0 = backbone.make_model(stream[0].num_users, stream[0].num_items)
    before, after = base.selected_state, run.blocks[1].selected_state
    users0, a00 = _per_user_ndcg(evaluator, model0, before.global_state, before.private_state)
    model1 = backbone.make_model(stream[1].num_users, stream[1].num_items)
    users1, a10 = _per_user_ndcg(evaluator, model1, after.global_state, after.private_state)
    assert np.array_equal(users0, users1)
    out = {"users": users0.tolist(), "a00": np.round(a00, 6).tolist(), "a10": np.round(a10, 6).tolist()}
    losses = getattr(getattr(method, "inner", method), "losses", {})
    loss = losses.get(1) if isinstance(losses, dict) else None
    if loss is not None and getattr(loss, "records", None):
        users = np.concatenate([r["users"] for r in loss.records])
        shifts = np.concatenate([r["shift"] for r in loss.records]).astype(float)
        total = np.bincount(users, weights=shifts, minlength=stream[1].num_users)
        count = np.bincount(users, minlength=stream[1].num_users)
        seen = np.flatnonzero(count)
        out["shift_users"] = seen.tolist()
        out["shift_mean"] = np.round(total[seen] / count[seen], 3).tolist()
    return out


def _mean_item_ranks(model, global_state, private_state, num_users: int, num_items: int) -> np.ndarray:
    """``(num_items,)`` each item's mean 1-based rank over the first ``num_users`` users' score lists."""
    total = torch.zeros(num_items, dtype=torch.float64)
    with torch.no_grad():
        for start in range(0, num_users, 256):
            users = torch.arange(start, min(start + 256, num_users),
                                 device=next(iter(global_state.values())).device)
            scores = model.score_users(global_state, private_state, users)[:, :num_items]  # (n, I)
            ranks = scores.argsort(dim=1, descending=True).argsort(dim=1).to(torch.float64) + 1.0
            total += ranks.sum(0).cpu()
    return (total / num_users).numpy()


def item_analysis(stream, backbone, blocks: Sequence[RunResult], fraction: float = 0.2) -> Dict[str, Any]:
    """Table 7: ranking-change rate of static vs dynamic items, averaged over transitions.

    For each transition ``t−1 → t``: the item knowledge shift ``φ_i = ‖Q^{t−1}_i − Q^t_i‖²/√d``
    between the two best-validation item tables (Eq. 8), and each old item's mean rank over
    the old users' full score lists under both models; change rate ``|r^{t−1} − r^t| / r^{t−1}``.
    Static items are the bottom ``fraction`` of φ, dynamic the top ``fraction``.
    """
    static, dynamic = [], []
    for t in range(1, len(blocks)):
        old_size, new_size = block_artifacts(blocks[t - 1]), block_artifacts(blocks[t])
        old, new = blocks[t - 1].selected_state, blocks[t].selected_state
        old_users, old_items = old_size["num_users"], old_size["num_items"]
        old_model = backbone.make_model(old_users, old_items)
        new_model = backbone.make_model(new_size["num_users"], new_size["num_items"])
        name = old_model.names("public_rows")[0]
        q_old = old.global_state[name].cpu()
        q_new = new.global_state[name][:old_items].cpu()
        phi = ((q_old - q_new) ** 2).sum(1) / math.sqrt(q_old.shape[1])
        r_old = _mean_item_ranks(old_model, old.global_state, old.private_state, old_users, old_items)
        r_new = _mean_item_ranks(new_model, new.global_state, new.private_state, old_users, old_items)
        change = np.abs(r_old - r_new) / r_old
        order = np.argsort(phi.numpy(), kind="stable")
        k = max(1, int(round(fraction * order.size)))
        static.append(float(change[order[:k]].mean()))
        dynamic.append(float(change[order[-k:]].mean()))
    return {"static_items": float(np.mean(static)), "dynamic_items": float(np.mean(dynamic)),
            "static_by_transition": static, "dynamic_by_transition": dynamic}


# ======================================================================================
# One cell
# ======================================================================================
def _finite_or_none(value) -> Optional[float]:
    """A JSON-safe float of a history value: ``None`` when absent or not finite."""
    return float(value) if is_finite_score(value) else None


def run_cell(config: Mapping[str, Any], *, cache_dir: Optional[Path] = None, device=None,
             on_round_end=None) -> Dict[str, Any]:
    """Train one cell; return ``{"metrics": {...numbers...}, "extra": {...}}`` (see module docstring)."""
    device = torch.device(device) if device is not None else default_device()
    started = time.perf_counter()
    stream = load_stream(config)
    backbone = make_backbone(config)
    num_blocks = min(int(config["num_blocks"]), len(stream))
    method = make_method(config, stream[min(1, num_blocks - 1)].num_items)
    base = base_block(config, stream, cache_dir, device)
    try:
        run = run_continual(stream, backbone, method, federated_config(config), base=base, num_blocks=num_blocks,
                            device=device, on_round_end=on_round_end,
                            next_block_from=config.get("next_block_from", "best"))
    except ValueError as error:
        if "NaN" not in str(error):
            raise
        # A diverged configuration is a result (e.g. λ_KD = 1 with the lr × |I| item step), not a
        # crash of the grid: its metrics are NaN and it is flagged.
        nan_metrics = {f"{m}/D{t}": math.nan for m in ("N@20", "R@20", "valid N@20") for t in range(1, num_blocks)}
        return {"metrics": {**nan_metrics, "N@20/Avg": math.nan, "R@20/Avg": math.nan, "diverged": 1.0,
                            "seconds": time.perf_counter() - started},
                "extra": {"error": str(error)}}
    metrics: Dict[str, float] = {}
    extra: Dict[str, Any] = {"accuracy": {m.replace("NDCG", "N").replace("Recall", "R"): np.round(a, 6).tolist()
                                          for m, a in run.accuracy.items()}}
    for block in run.blocks:
        info = block_artifacts(block)
        label = f"D{info['block']}"
        for long, short in (("NDCG@20", "N@20"), ("Recall@20", "R@20")):
            metrics[f"{short}/{label}"] = float(block.test_metrics[long])
        metrics[f"valid N@20/{label}"] = float((block.best_metrics or {}).get("NDCG@20", math.nan))
        metrics[f"best_round/{label}"] = float(block.best_round if block.best_round is not None else math.nan)
        metrics[f"rounds/{label}"] = float(block.round_index)
        metrics[f"seconds/{label}"] = float(info["seconds"])
        extra[f"users/{label}"] = info["test_users"].tolist()
        extra[f"N@20 per user/{label}"] = np.round(info["test_per_user"]["NDCG@20"], 5).tolist()
        # per round of the block: mean client training loss and validation N@20 (a diverging run shows here)
        extra[f"train_loss per round/{label}"] = [_finite_or_none(r.get("train_loss")) for r in block.history]
        extra[f"valid N@20 per round/{label}"] = [_finite_or_none(r.get("valid/NDCG@20")) for r in block.history]
    incremental = range(1, len(run.blocks))  # D1, D2, ...: blocks[t] is block t
    for short in ("N@20", "R@20"):
        metrics[f"{short}/Avg"] = float(np.mean([metrics[f"{short}/D{t}"] for t in incremental])) \
            if incremental else math.nan
    if config.get("analysis"):
        extra["users_D0"] = user_analysis(stream, backbone, run, base, method)
        extra["items"] = item_analysis(stream, backbone, run.blocks)
    metrics["diverged"] = 0.0
    metrics["seconds"] = time.perf_counter() - started
    return {"metrics": metrics, "extra": extra}


# ======================================================================================
# Command line: resumable paper-profile grids
# ======================================================================================
def _grid_train(config: Mapping[str, Any], progress=None, *, cache_dir: Path) -> Dict[str, Any]:
    """:func:`run_cell` as the grid calls it (``train(config, progress)``), block-0 models under ``cache_dir``."""
    return run_cell(config, cache_dir=Path(cache_dir))


def run_grid(cells: Iterable[Mapping[str, Any]], profile: str, *, cache_dir: Path, progress: bool = True,
             rerun: bool = False, cluster=None) -> pd.DataFrame:
    """Run every cell without a recorded result, recording each run.

    :func:`fedlib.experiments.grid.run_recorded_grid`: each finished cell is appended to
    ``results/f3crec[/profile]/runs.jsonl`` (with its per-user values in ``extra``); an
    interrupted grid resumes at the first unfinished cell. Block-0 models are shared under
    ``cache_dir/base`` (:func:`base_block`; on a cluster, a folder every worker reaches).
    ``cluster``: a :class:`fedlib.experiments.grid.Cluster` to train on, or ``None``.
    """
    import functools

    from fedlib.experiments.grid import run_recorded_grid

    return run_recorded_grid(PAPER, cells, functools.partial(_grid_train, cache_dir=Path(cache_dir)), profile,
                             cache_dir=Path(cache_dir), progress=progress, rerun=rerun, cluster=cluster)


def run_cells(cells: Sequence[Mapping[str, Any]], profile: str, *, cache_dir: Optional[Path] = None,
              description: str = "cells") -> pd.DataFrame:
    """Train ``cells`` and record each run at ``profile`` (:func:`fedlib.experiments.grid.run_cells`).

    ``paper``: through the resumable grid, so recorded cells are not trained again; other
    profiles train each distinct cell live, their block-0 model shared in a temporary folder.
    Returns one row per cell: its keys and metrics.
    """
    import tempfile

    from fedlib.experiments.grid import run_cells as train_and_record

    with tempfile.TemporaryDirectory(prefix="f3crec-base-") as temporary:
        base_dir = Path(cache_dir or ".cache/f3crec/paper") if profile == "paper" else Path(temporary)
        results = train_and_record(
            PAPER, cells, profile, lambda config, progress=None: run_cell(config, cache_dir=base_dir,
                                                                          on_round_end=progress),
            label=lambda c: f"{c['dataset']} {c['backbone']} {c['method']}", description=description,
            cache_dir=base_dir)
    keys = ("dataset", "backbone", "method", "split", "upload_noise")
    return pd.DataFrame([{**{k: r["config"][k] for k in keys}, **r["metrics"]} for r in results])


# ======================================================================================
# Lesson helpers: one visible training step, the forgetting curve, the memory audit
# ======================================================================================
def run_live(config: Mapping[str, Any], profile: str, *, cache_dir: Path, description: str = "",
             record: bool = True) -> Dict[str, Any]:
    """Train one cell with a progress bar over its rounds and record it at ``profile``.

    ``cache_dir`` holds the block-0 model (:func:`base_block`), so several calls of one lesson
    share it. Returns :func:`run_cell`'s ``{"metrics", "extra"}``; ``extra["accuracy"]["N@20"]``
    is the accuracy matrix ``A[t][s]`` (N@20 on block ``s``'s test set after training block
    ``t``), from which :func:`forgetting_frame` draws the forgetting curve.
    """
    from tqdm.auto import tqdm

    from fedlib.reporting import append_run

    incremental = max(0, int(config["num_blocks"]) - 1)
    bar = tqdm(total=incremental * int(config["rounds"]), desc=description or config["method"], unit="round")

    def tick(run, round_record):
        bar.update(1)

    started = time.perf_counter()
    try:
        result = run_cell(config, cache_dir=Path(cache_dir), on_round_end=tick)
    finally:
        bar.close()
    if record:
        append_run(PAPER, profile, config, config["seed"], result["metrics"], time.perf_counter() - started,
                   extra=result["extra"])
    return result


def forgetting_frame(results: Mapping[str, Mapping[str, Any]], metric: str = "N@20") -> pd.DataFrame:
    """The accuracy matrices of several runs as one tidy frame (the forgetting curves).

    Args:
        results: label -> a :func:`run_cell` / :func:`run_live` result.
        metric: ``"N@20"`` or ``"R@20"``.

    Returns:
        One row per (run, test block ``s``, trained block ``t ≥ s``): ``run``, ``test block``
        (``"D0"`` ...), ``after training`` (``"D0"`` ...), ``t`` (int) and ``metric``.
    """
    rows = []
    for label, result in results.items():
        matrix = np.array([[np.nan if v is None else v for v in row] for row in result["extra"]["accuracy"][metric]],
                          dtype=float)  # (T, T), A[t][s] for s <= t
        for t in range(matrix.shape[0]):
            for s in range(t + 1):
                rows.append({"run": label, "test block": f"D{s}", "after training": f"D{t}", "t": t,
                             metric: float(matrix[t, s])})
    return pd.DataFrame(rows)


def memory_consumed_share(config: Mapping[str, Any], base: RunResult, stream, top_n: int = 30, device=None) -> float:
    """Share of the block-0 top-``top_n`` memory (Eq. 1, unmasked) the user already trained on.

    The public code takes each user's top-N over **all** items; a trained model ranks the
    user's own training items highest, so this share says how much of the "replay" re-teaches
    consumed items rather than the predicted next ones.
    """
    from fedlib.papers.f3crec.method import top_n_memory

    model = make_backbone(config).make_model(stream[0].num_users, stream[0].num_items)
    selected = base.selected_state
    device = next(iter(selected.global_state.values())).device if device is None else device
    with torch.no_grad():
        scores = model.score_users(selected.global_state, selected.private_state,
                                   torch.arange(stream[0].num_users, device=device))  # (U, I)
    top_items = top_n_memory(scores, top_n)[0].cpu().numpy()  # (U, N)
    train = stream[0].train
    consumed = [np.isin(top_items[u], train.items[train.indptr[u]:train.indptr[u + 1]])
                for u in range(stream[0].num_users)]
    return float(np.mean(consumed))


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m fedlib grid f3crec <parts> [--datasets ..] [--backbones ..] [--methods ..] [--seeds ..] [--pending]``
    (:func:`fedlib.experiments.grid.grid_main`)."""
    from fedlib.experiments import grid

    grid.grid_main(argv, paper=PAPER, title="F3CRec", parts=PARTS, grid_cells=grid_cells, run_grid=run_grid,
                   part_options={"--datasets": dict(nargs="+", default=list(OFFLINE_DATASETS), choices=list(DATASETS))},
                   filters={"--backbones": grid.CellFilter("backbone", BACKBONES, keep_missing=True),
                            "--methods": grid.CellFilter("method", METHODS, keep_missing=True,
                                                         help="keep only cells of these methods")},
                   cache_dir=".cache/f3crec/paper")

