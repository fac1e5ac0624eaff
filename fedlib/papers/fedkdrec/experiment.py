r"""FedKDRec experiments: every table and figure of the paper as cells of one grid.

Reference:
    "Federated Recommendation with Reinforcement Learning based Knowledge Distillation"
    (FedKDRec), anonymous ICLR 2026 submission, https://openreview.net/forum?id=Qlk5I6TI2D;
    no public code. The choices the paper leaves open are listed in
    :mod:`fedlib.papers.fedkdrec.method`.

The grid is data: ``spec.toml`` (next to this module) declares each part, every default of a
cell once with its justification (rounds, evaluation, learning rates chosen on validation), and
the tables' layouts; :func:`cell` and :func:`grid_cells` read it through
:mod:`fedlib.experiments.spec`. A **cell** is a plain dict (hashable by
:func:`~fedlib.reporting.config_hash`) fixing one run. :func:`run_cell` trains it and returns

* ``metrics``: the **test** metrics at the best-validation evaluation, under both protocols
  (``sampled/HR@10``, ``sampled/NDCG@10``: the held-out item against 99 sampled negatives;
  ``full/Recall@10``, ``full/NDCG@10``: against every item the user has not trained on),
  the selected round, the validation value, the measured bytes per client and round, seconds;
* ``extra``: the learning curve (validation and test metrics of both protocols at every
  evaluation) and, for the prediction-transfer methods, the per-round history (server loss,
  predictions sent and uploaded per client, agent losses): Figure 2.

The split (:mod:`fedlib.data.protocols.fedkdrec`) is leave-one-out by time: validation is the
second latest interaction, test the latest. The centralised baselines train the backbone on the
pooled data (batch :data:`CENTRAL_BATCH`, patience :data:`CENTRAL_PATIENCE` evaluations).
"""
from __future__ import annotations

import functools
import math
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np
import pandas as pd
import torch

from fedlib.data.protocols import build_split
from fedlib.device import default_device
from fedlib.engine import CommunicationLedger, FederatedConfig, run_federated
from fedlib.baselines import registry
from fedlib.engine.centralised import Centralised
from fedlib.engine.method import LocalOptimizer
from fedlib.engine.trainer import Schedule, train
from fedlib.experiments import grid
from fedlib.experiments.grid import unique_cells  # noqa: F401  (part of this module's API)
from fedlib.experiments.selection import best_on_validation
from fedlib.experiments.spec import load_spec
from fedlib.metrics import full_ranking_metrics_from_score_fn, mean_over_users
from fedlib.metrics.ranking import candidate_set_metrics
from fedlib.models.stacked import Backbone, paper_hidden
from fedlib.papers.fedkdrec.clients import VARIANTS, FedKDRecConfig
from fedlib.papers.fedkdrec.method import train_fedkdrec
from fedlib.reporting.results import config_hash

__all__ = [
    "PAPER", "SPEC", "VERSION", "PARTS", "tuning_grids", "flag_rules", "DATASETS", "OFFLINE_DATASETS", "BACKBONES", "SELECTED", "LEARNING_RATES",
    "ALPHAS", "BETA_RANGES", "cell", "family", "method_label", "load_split", "DualProtocolRecorder", "run_cell",
    "grid_cells", "tuning_cells", "selected_from_records", "run_grid", "run_cells",
    "FAIR", "fair_key", "fair_budget_from_records",
]

PAPER = "fedkdrec"
#: The grid's parts, defaults and named lists, and the tables' layouts, as data.
SPEC = load_spec(PAPER)  # spec.toml, next to this module
VERSION = SPEC.version
PARTS = SPEC.parts
#: the paper's dataset names -> registry names of the FedKDRec protocol (``"synthetic"``: smoke profile)
DATASETS = {name: choice["registry"] for name, choice in SPEC.choices("dataset").items() if "registry" in choice}
OFFLINE_DATASETS = tuple(SPEC.list("offline_datasets"))
#: the paper's backbone names -> :class:`~fedlib.models.stacked.Backbone` kinds
BACKBONES = {name: choice["kind"] for name, choice in SPEC.choices("backbone").items()}
#: Learning rate per method family, chosen on validation by the ``tuning`` part (``[selected.lr]``).
SELECTED: Dict[str, float] = SPEC.data["selected"]["lr"]
#: The fair-budget headline's ``{dataset: {fair_key: {"lr", "rounds"}}}`` (``[selected.fair]``): chosen
#: in ``headline_tuning``; :func:`cell` applies them with ``fair=True``.
FAIR: Dict[str, Dict[str, Dict[str, float]]] = SPEC.data["selected"]["fair"]
LEARNING_RATES = tuple(SPEC.list("learning_rates"))
WEIGHT_DECAY = SPEC.data["cell"]["weight_decay"]
TABLE4_VARIANTS = tuple(SPEC.list("table4_variants"))
ALPHAS = tuple(case["alpha"] for case in SPEC.list("sensitivity") if "alpha" in case)
BETA_RANGES = tuple(tuple(case["beta_range"]) for case in SPEC.list("sensitivity") if "beta_range" in case)
SELECTION = "valid/sampled/NDCG@10"
#: centralised batch: LightGCN propagates the whole graph once per batch, so a 1,024 batch
#: costs 23 s per ML-100K epoch on 2 CPU cores; 4,096 brings it to about 6 s
CENTRAL_BATCH = 4096
CENTRAL_PATIENCE = 10  # evaluations


def family(config: Mapping[str, Any]) -> str:
    """The learning-rate family of a cell (PTF-FedRec's variant is tuned separately)."""
    return "PTF-FedRec" if config["method"] == "FedKDRec" and config.get("variant") == "-m-c~s" else config["method"]


def fair_key(method: str, backbone: Optional[str]) -> str:
    """The :data:`FAIR` key of a method's row label and backbone: ``"FedKDRec/NeuMF"``, ``"FedPerGNN"``."""
    return f"{method}/{backbone}" if backbone else method


def cell(dataset: str, method: str, *, backbone: Optional[str] = None, variant: str = "FedKDRec",
         lr: Optional[float] = None, rounds: Optional[int] = None, central_epochs: Optional[int] = None,
         fair: bool = False, **settings) -> Dict[str, Any]:
    """One run of the grid, as a plain dict.

    Args:
        dataset: a ``[choices.dataset]`` of the spec (``"synthetic"``: smoke profile).
        method: a ``[choices.method]``; ``"PTF-FedRec"`` is accepted as FedKDRec's ``-m-c~s``.
        backbone: ``"NeuMF"``, ``"NeuNCF"`` or ``"LightGCN"`` (Centralized and FedKDRec; the
            parameter-transfer baselines have their own models and take none).
        variant: a key of :data:`~fedlib.papers.fedkdrec.clients.VARIANTS` (FedKDRec only).
        lr: Adam step size (default :data:`SELECTED` of the family).
        rounds: communication rounds of the federated methods; central_epochs: epochs of the
            centralised baselines (``None``: the spec's); each method ignores the other's, so one
            set of keyword arguments serves a grid.
        fair: take the learning rate and the budget that validation chose for the fair-budget
            headline (:data:`FAIR`, ``[selected.fair]``); ``lr``, ``rounds`` and ``central_epochs``
            must then be left out.
        settings: the spec's other ``[cell]`` keys (``init``, ``seed``, ``eval_every``, ``dim``,
            ``client_fraction``, ``alpha``, ``beta_range`` (FedKDRec), ...).
    """
    if fair:
        if lr is not None or rounds is not None or central_epochs is not None:
            raise ValueError("fair=True takes the rate and budget of [selected.fair]; leave out lr, rounds and "
                             f"central_epochs (got lr={lr}, rounds={rounds}, central_epochs={central_epochs})")
        key = fair_key("PTF-FedRec" if method == "FedKDRec" and variant == "-m-c~s" else method, backbone)
        choices = FAIR.get(dataset, {})
        if key not in choices:
            raise ValueError(f"no fair-budget choice for {key!r} on {dataset!r} in [selected.fair] (it has "
                             f"{ {d: sorted(c) for d, c in FAIR.items()} }); run part headline_tuning for it and add "
                             "its choice (experiment.fair_budget_from_records)")
        lr = choices[key]["lr"]
        rounds = central_epochs = int(choices[key]["rounds"])
    if method == "PTF-FedRec":
        method, variant = "FedKDRec", "-m-c~s"
    settings["rounds"] = central_epochs if method == "Centralized" else rounds
    if "beta_range" in settings:
        settings["beta_range"] = [float(b) for b in settings["beta_range"]]
    config = SPEC.config({"dataset": dataset, "method": method}, {**settings, "backbone": backbone})
    if "compared_with" in SPEC.choice("method", method) and backbone is not None:
        raise ValueError(f"{method} has its own model; pass backbone=None (got {backbone!r})")
    if "compared_with" not in SPEC.choice("method", method) and backbone not in BACKBONES:
        raise ValueError(f"{method} needs backbone= one of {sorted(BACKBONES)}, got {backbone!r}")
    if method == "FedKDRec" and variant not in VARIANTS:
        raise ValueError(f"unknown FedKDRec variant {variant!r}; expected one of {sorted(VARIANTS)}")
    config["variant"] = ("-m-c~s" if variant == "PTF-FedRec" else variant) if method == "FedKDRec" else None
    if config["init"] not in ("random", "text"):
        raise ValueError(f"init must be 'random' or 'text', got {config['init']!r}")
    if config["eval_every"] < 1:
        raise ValueError(f"eval_every must be >= 1, got {config['eval_every']}")
    config["lr"] = float(lr if lr is not None else SELECTED[family(config)])
    return config


def method_label(config: Mapping[str, Any]) -> str:
    """The paper's row label: ``"FedKDRec"``, ``"PTF-FedRec"``, ``"-m"``, ``"FedMF"``, ..."""
    if config["method"] == "FedKDRec":
        return "PTF-FedRec" if config["variant"] == "-m-c~s" else config["variant"]
    return config["method"]


# ======================================================================================
# Data
# ======================================================================================
@functools.lru_cache(maxsize=4)
def load_split(dataset: str):
    """The FedKDRec leave-one-out split of ``dataset`` with its 1 + 99 candidate sets (cached)."""
    if dataset == "synthetic":
        return synthetic_split()
    return build_split(PAPER, DATASETS[dataset])


def synthetic_split(num_users: int = 60, num_items: int = 200, per_user: int = 14, clusters: int = 4, seed: int = 0):
    """A small leave-one-out split with taste clusters (smoke profile; not a paper dataset)."""
    from fedlib.data.protocols.fedkdrec import split_from_frame

    rng = np.random.default_rng(seed)
    user_group = rng.integers(clusters, size=num_users)
    item_group = np.arange(num_items) % clusters
    rows = []
    for u in range(num_users):
        mine = item_group == user_group[u]
        weights = np.where(mine, 0.85 / mine.sum(), 0.15 / (~mine).sum())
        items = rng.choice(num_items, size=per_user, replace=False, p=weights)
        rows += [(u, int(i), 1.0, t) for t, i in enumerate(items)]
    frame = pd.DataFrame(rows, columns=["user", "item", "rating", "timestamp"])
    return split_from_frame(frame, name="synthetic/fedkdrec")


@functools.lru_cache(maxsize=4)
def item_init(dataset: str, dim: int, seed: int) -> torch.Tensor:
    """``(I, dim)`` item rows from the side-information autoencoder (the ``"text"`` init)."""
    from fedlib.models.item_init import text_item_init
    split = load_split(dataset)
    return text_item_init(DATASETS[dataset], split.extra["raw_items"], dim=dim, seed=seed)


# ======================================================================================
# Evaluation: both protocols at every evaluation, test kept at the best validation
# ======================================================================================
class DualProtocolRecorder:
    """Scores validation and test under the sampled (1 + 99) and the full-ranking protocol.

    Call it with ``(round, score_fn, pair_fn=None)``: ``score_fn(users (n,)) -> (n, I)`` scores
    of every item, ``pair_fn(users (n,), items (n, K)) -> (n, K)`` optional cheaper scores of
    the candidates only. It returns the validation value used for selection
    (:data:`SELECTION`) and keeps the test metrics of the best one (earliest wins ties).

    Attributes after the run: ``curve`` (one dict per evaluation: ``round``, ``valid/...``,
    ``test/...``), ``best`` (index into ``curve``).
    """

    def __init__(self, split, ks: Sequence[int] = (10,), selection: str = SELECTION):
        self.split, self.ks, self.selection = split, tuple(ks), selection
        self.curve: List[Dict[str, float]] = []
        self.best: Optional[int] = None
        from fedlib.engine.evaluation import union_pairs
        self._masks = {"valid": split.train, "test": union_pairs(split.train, split.valid)}
        self._targets = {"valid": split.valid, "test": split.test}

    def metrics(self, score_fn, pair_fn=None, device=None, chunk: int = 256) -> Dict[str, float]:
        out: Dict[str, float] = {}
        with torch.no_grad():
            # Score every user once, (U, I), and read both splits and both protocols from it:
            # an MLP tower over all U × I pairs is the expensive part (FedNCF: ~8 s on ML-100K).
            everyone = torch.arange(self.split.num_users, device=device)
            all_scores = torch.cat([score_fn(everyone[s:s + chunk]) for s in range(0, everyone.numel(), chunk)])
            score_fn = lambda users: all_scores[users.to(all_scores.device)]  # noqa: E731 (reads the (U, I) scores)
            for which in ("valid", "test"):
                targets, masked = self._targets[which], self._masks[which]
                sampled = candidate_set_metrics(score_fn, targets.users, self.split.extra[f"{which}_candidates"],
                                                ks=self.ks, pair_fn=pair_fn, device=device)
                for key in [f"HR@{k}" for k in self.ks] + [f"NDCG@{k}" for k in self.ks]:
                    out[f"{which}/sampled/{key}"] = float(sampled[key].float().mean())
                users = targets.active_users()
                full = full_ranking_metrics_from_score_fn(
                    score_fn, user_ids=users, target_indptr=targets.indptr, target_items=targets.items,
                    mask_indptr=masked.indptr, mask_items=masked.items, ks=self.ks, metrics=("recall", "ndcg"),
                    device=device)
                for key, value in mean_over_users(full).items():
                    out[f"{which}/full/{key}"] = float(value)
        return out

    def __call__(self, round_index: int, score_fn, pair_fn=None, device=None) -> float:
        values = self.metrics(score_fn, pair_fn, device)
        self.curve.append({"round": int(round_index), **values})
        value = values[self.selection]
        if self.best is None or value > self.curve[self.best][self.selection]:
            self.best = len(self.curve) - 1
        return value

    def test_metrics(self) -> Dict[str, float]:
        if self.best is None:
            return {}
        best = self.curve[self.best]
        return {k.split("/", 1)[1]: v for k, v in best.items() if k.startswith("test/")}

    def selected(self) -> Dict[str, Any]:
        if self.best is None:
            return {"best_round": None, SELECTION: float("nan")}
        return {"best_round": self.curve[self.best]["round"], SELECTION: self.curve[self.best][self.selection]}


# ======================================================================================
# Methods
# ======================================================================================
def _kd_config(config: Mapping[str, Any], dataset_name: str) -> FedKDRecConfig:
    kind = BACKBONES[config["backbone"]]
    variant = VARIANTS[config["variant"]]
    return FedKDRecConfig(
        **{**dict(backbone=kind, hidden=paper_hidden(kind, dataset_name), dim=config["dim"], rounds=config["rounds"],
                  client_fraction=config["client_fraction"], client_lr=config["lr"], server_lr=config["lr"],
                  weight_decay=config["weight_decay"], alpha=config["alpha"], beta_range=tuple(config["beta_range"]),
                  eval_every=config["eval_every"], seed=config["seed"]), **variant})


def _run_fedkdrec(config, split, recorder, init, device, progress):
    ledger = CommunicationLedger()
    kd_config = _kd_config(config, DATASETS.get(config["dataset"], "ml-100k"))

    def evaluate(round_index, scorer):
        return recorder(round_index, scorer, scorer.pairs, device)

    run = train_fedkdrec(split, kd_config, item_init=init, evaluate=evaluate, ledger=ledger, device=device,
                         progress=progress)
    keep = ("round", "server_loss", "client_loss", "sent_per_client", "uploaded_per_client", "teacher_entropy",
            "teacher_loss", "label_revealed", "critic_loss", "actor_loss", "seconds")
    history = [{k: (None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v)
                for k, v in h.items() if k in keep} for h in run.history]
    return ledger, {"history": history, "client_model_parameters": run.artifacts["backbone"].num_parameters()}


def _run_parameter_transfer(config, split, recorder, init, device, progress):
    """FedMF / FedNCF from the method registry, through the engine (Adam, 10 % of the clients per round)."""
    per_round = max(1, int(round(config["client_fraction"] * split.train.active_users().size)))
    fed = FederatedConfig(rounds=config["rounds"], seed=config["seed"], num_negatives=4, batch_size=256,
                          local_epochs=2, clients_per_round=per_round, eval_every=config["eval_every"],
                          selection_metric="selection", test_at_end=False)
    # FedNCF: the NeuNCF tower the paper compares it with
    tower = {"hidden": paper_hidden("ncf", DATASETS.get(config["dataset"], "ml-100k"))
             } if config["method"] == "FedNCF" else {}
    optimizer = LocalOptimizer("adam", weight_decay=config["weight_decay"])
    job = registry.get(config["method"], "single-domain").build(split, fed, dim=config["dim"], lr=config["lr"],
                                                                optimizer=optimizer, device=device, **tower)
    method = job.algorithm.method
    state = job.algorithm.init(fed.seed)
    if init is not None:
        state.global_state["item_emb"] = init.to(state.global_state["item_emb"])
    evaluations = []

    def evaluator(_model, global_state, private_state, which="valid"):
        # The trainer evaluates after rounds eval_every, 2 eval_every, ... and the last (no patience here),
        # so the i-th evaluation follows round min(i * eval_every, rounds) (the trainer's RunResult, not the
        # starting state, counts the rounds).
        evaluations.append(min((len(evaluations) + 1) * fed.eval_every, fed.rounds))
        value = recorder(evaluations[-1], lambda users: method.model.score_users(global_state, private_state, users),
                         None, device)
        return {"selection": value}

    ledger = CommunicationLedger()
    run_federated(method, split.train, fed, evaluator=evaluator, state=state, device=device, keep_best_state=False,
                  ledger=ledger, on_round_end=None if progress is None else (
                      lambda st, record: progress(int(record["round"]))))
    return ledger, {}


def _run_fedpergnn(config, split, recorder, init, device, progress):
    from fedlib.baselines.single_domain.fedpergnn import FedPerGNNConfig, train_fedpergnn

    ledger = CommunicationLedger()
    cfg = FedPerGNNConfig(dim=config["dim"], rounds=config["rounds"], client_fraction=config["client_fraction"],
                          lr=config["lr"], weight_decay=config["weight_decay"], eval_every=config["eval_every"],
                          seed=config["seed"])
    train_fedpergnn(split, cfg, evaluate=lambda r, score_fn: recorder(r, score_fn, None, device), ledger=ledger,
                    progress=progress)
    return ledger, {}


def _run_centralised(config, split, recorder, init, device, progress):
    """The backbone trained on the pooled data with Adam (FedKDRec's "Centralized" rows).

    The :class:`~fedlib.engine.centralised.Centralised` algorithm: one round = one epoch over every
    training pair with 4 fresh negatives, shuffled, batch :data:`CENTRAL_BATCH`, BCE; LightGCN
    propagates over the training graph. Evaluated every ``eval_every // 10`` epochs (at least 1),
    stopped after :data:`CENTRAL_PATIENCE` evaluations without improvement (the trainer's selection
    on the recorder's validation value; the recorder keeps the test numbers of the selected epoch).
    """
    kind = BACKBONES[config["backbone"]]
    backbone = Backbone(kind, split.num_users, split.num_items, config["dim"],
                        paper_hidden(kind, DATASETS.get(config["dataset"], "ml-100k")))
    graph = backbone.server_graph(split.train, device=device)

    def init_params(seed):
        return backbone.init_server(torch.Generator().manual_seed(int(seed)), init, device=device)

    def make_optimizer(params):
        return torch.optim.Adam(params, lr=config["lr"], weight_decay=config["weight_decay"])

    def evaluator(state, split_name):
        frozen = {n: v.detach() for n, v in state.params.items()}
        return {"value": recorder(state.round_index, lambda u: backbone.server_scores(frozen, u, graph),
                                  lambda u, i: backbone.server_pair_scores(frozen, u, i, graph), device)}

    algorithm = Centralised(lambda params, users, items: backbone.server_logits(params, users, items, graph),
                            init_params, make_optimizer, split.train, split.num_items, batch_size=CENTRAL_BATCH,
                            num_negatives=4, evaluator=evaluator)
    schedule = Schedule(rounds=config["rounds"], eval_every=max(1, config["eval_every"] // 10),
                        patience=CENTRAL_PATIENCE, selection_metric="value", test_at_end=False, keep_best_state=False)
    train(algorithm, schedule, seed=config["seed"],
          on_round_end=None if progress is None else (lambda run, record: progress(record["round"])))
    return None, {}


_RUNNERS = {"Centralized": _run_centralised, "FedMF": _run_parameter_transfer, "FedNCF": _run_parameter_transfer,
            "FedPerGNN": _run_fedpergnn, "FedKDRec": _run_fedkdrec}


def run_cell(config: Mapping[str, Any], progress: Optional[Callable[[int], None]] = None, device=None
             ) -> Dict[str, Any]:
    """Train one cell: ``{"metrics": {...}, "extra": {"curve", ...}}`` (module docstring); ``progress(round)``."""
    device = torch.device(device) if device is not None else default_device()
    started = time.perf_counter()
    split = load_split(config["dataset"])
    recorder = DualProtocolRecorder(split)
    init = item_init(config["dataset"], config["dim"], config["seed"]) if config["init"] == "text" else None
    ledger, extra = _RUNNERS[config["method"]](config, split, recorder, init, device, progress)
    metrics = {**recorder.test_metrics(), **recorder.selected(), "seconds": time.perf_counter() - started}
    if ledger is not None and len(ledger):
        means = ledger.per_client_per_round()
        metrics["download_bytes_per_client_round"] = float(means["download"])
        metrics["upload_bytes_per_client_round"] = float(means["upload"])
        per_round = ledger.per_round()
        extra["communication"] = {d: per_round[per_round["direction"] == d]["mean_bytes_per_client"].round(1).tolist()
                                  for d in ("download", "upload")}
    extra["curve"] = [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()}
                      for row in recorder.curve]
    return {"metrics": metrics, "extra": extra}


# ======================================================================================
# The grid
# ======================================================================================
def grid_cells(part: str, dataset: str = "ML-100K", **kwargs) -> List[Dict[str, Any]]:
    """The cells of one part of the paper-profile grid (``[parts]`` of the spec); ``kwargs`` go to each :func:`cell`."""
    return SPEC.cells(part, cell, {"datasets": [dataset]}, **kwargs)


def tuning_cells(dataset: str = "ML-100K", **kwargs) -> List[Dict[str, Any]]:
    """Each family at every learning rate of the paper's range (the ``tuning`` part)."""
    return grid_cells("tuning", dataset, **kwargs)


def selected_from_records(records) -> Dict[str, float]:
    """Re-derive :data:`SELECTED` from recorded ``tuning`` runs: ``{family: best lr}`` (best
    validation N@10, :func:`~fedlib.experiments.selection.best_on_validation`; a tie keeps the
    first rate of the grid; a family without a finite score is left out)."""
    from fedlib.reporting.results import latest_records

    known = latest_records(records)
    tried: Dict[str, List[tuple]] = {}
    for config in tuning_cells():
        record = known.get(config_hash(config))
        if record is not None:
            tried.setdefault(family(config), []).append((config["lr"], record.metrics.get(SELECTION)))
    chosen = {fam: best_on_validation(options) for fam, options in tried.items()}
    return {fam: lr for fam, lr in chosen.items() if lr is not None}


def fair_budget_from_records(records, dataset: str = "ML-100K") -> Dict[str, Dict[str, float]]:
    """Re-derive :data:`FAIR` ``[dataset]`` from the recorded ``headline_tuning`` runs: per :func:`fair_key`, the
    ``{"lr", "rounds"}`` of the best validation N@10 over every rate and budget tried
    (:func:`~fedlib.experiments.selection.best_on_validation`: finite values only; a tie goes to
    the shorter budget, then to the smaller rate)."""
    from fedlib.reporting.results import latest_records

    known = latest_records(records)
    tried: Dict[str, List[tuple]] = {}
    for config in grid_cells("headline_tuning", dataset):
        record = known.get(config_hash(config))
        if record is not None:
            tried.setdefault(fair_key(method_label(config), config.get("backbone")), []).append(
                ({"lr": config["lr"], "rounds": config["rounds"]}, record.metrics.get(SELECTION)))
    chosen = {key: best_on_validation(options, prefer=lambda c: (c["rounds"], c["lr"])) for key, options in tried.items()}
    return {key: choice for key, choice in chosen.items() if choice is not None}


def tuning_grids(config: Mapping[str, Any]) -> Dict[str, tuple]:
    """The rates the ``tuning`` part tried for ``config``'s family, when the cell runs at the rate
    chosen there (:data:`SELECTED`; one choice per family, on NeuMF, serves every backbone), for
    the ``grid_edge`` flag; ``{}`` for a cell at another rate or budget, whose recorded neighbours
    decide (a ``headline`` cell: the ``headline_tuning`` rates recorded at its budget)."""
    if config.get("method") not in SPEC.choices("method") or family(config) not in SELECTED:
        return {}
    # the tuning part ran each family at its method's default budget (200 rounds, 100 epochs)
    default_rounds = SPEC.choice("method", config["method"]).get("cell", {}).get("rounds", SPEC.data["cell"]["rounds"])
    at_choice = config.get("lr") == SELECTED[family(config)] and config.get("rounds") == default_rounds
    return {"lr": LEARNING_RATES} if at_choice else {}


def flag_rules():
    """The spec's ``[report.flags]`` with :func:`tuning_grids` as the grids the chosen rates came from."""
    import dataclasses

    return dataclasses.replace(SPEC.flag_rules(), grids=tuning_grids)


def run_grid(cells: Iterable[Mapping[str, Any]], profile: str = "paper", *, cache_dir=".cache/fedkdrec",
             **kwargs) -> pd.DataFrame:
    """Run every cell without a recorded result, appending each to runs.jsonl (a fresh clone resumes from the
    committed records; :func:`fedlib.experiments.grid.run_recorded_grid`: ``progress``, ``rerun``, ``cluster``)."""
    return grid.run_recorded_grid(PAPER, unique_cells(cells), run_cell, profile, cache_dir=cache_dir, **kwargs)


def run_cells(cells: Sequence[Mapping[str, Any]], profile: str, description: str = "cells") -> List[Dict[str, Any]]:
    """What the notebook calls: train each cell (progress bars) and record it at ``profile``
    (:func:`fedlib.experiments.grid.run_cells`); one ``{"config", "metrics", "extra"}`` per cell, in order."""
    return grid.run_cells(PAPER, cells, profile, run_cell, method_label, description)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m fedlib grid fedkdrec <parts> [--dataset ..] [--methods ..] [--backbones ..] [--seeds ..]``.

    ``--methods`` takes row labels (FedKDRec, PTF-FedRec, w/o R_i, FedMF; write ``--methods=-m``
    for a label that starts with a dash); the paper's Tables 1-2 use ``--seeds 0 1 2 3 4``
    (:func:`fedlib.experiments.grid.grid_main`).
    """
    grid.grid_main(argv, paper=PAPER, title="FedKDRec", parts=PARTS, grid_cells=grid_cells, label=method_label,
                   run_grid=run_grid, part_options={"--dataset": dict(default="ML-100K", choices=list(DATASETS))},
                   filters={"--backbones": grid.CellFilter("backbone", list(BACKBONES), keep_missing=True)})
