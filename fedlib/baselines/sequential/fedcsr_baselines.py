r"""FedProx for the FedCSR baselines (any model with ``loss`` / ``score``), as an Algorithm.

References:
    T. Li, A. K. Sahu, M. Zaheer, M. Sanjabi, A. Talwalkar, V. Smith, "Federated Optimization
    in Heterogeneous Networks", MLSys 2020 (FedProx).
    D. Zheng et al., "FedCSR", COLING 2025 (https://aclanthology.org/2025.coling-main.581/,
    App. A.1): every baseline
    (TiSASRec, CLSR, CoNet, CCDR, π-Net, PSJNet, MIFN, C2DSR) is "federated with FedProx".

The model interface (so one algorithm runs them all): a ``torch.nn.Module`` with
``loss(batch: SequenceBatch) -> scalar``, ``score(inputs, candidates (B, C), gt_domain (B,))
-> (B, C)``, a ``config`` with ``maxlen``, and optionally ``set_graphs(TransitionGraphs)``.

Algorithm (K platforms, ``D_k`` platform ``k``'s training rows, ``N_k`` its number of users,
``w`` the global weights, ``μ`` the proximal weight)::

    w^0 = model_factory() weights                                           (FedProxAlgorithm.init)
    for t = 1..T:                                                            (the trainer, fedlib.engine.train)
        for k = 1..K (every platform every round):
            w_k = w^{t-1}
            E local epochs of shuffled mini-batches b ⊂ D_k:
                h_k(w_k) = loss(b; w_k) + (μ/2) ‖w_k − w^{t-1}‖²          (FedProx local objective)
                w_k ← optimiser step on ∇h_k  (∇ of the proximal term: μ (w_k − w^{t-1}))
        w^t = Σ_k N_k w_k / Σ_k N_k                      (FedAvg: fedlib.baselines.sequential.sequence_training.fedavg)
        evaluate w^t on every platform's valid/test rows (its own graphs, if any)
        select on the mean over domains of the validation MRR; stop after `patience`
        rounds without improvement

``μ = 0`` is FedAvg. The proximal term runs over every trainable parameter (the ``requires_grad``
entries of ``named_parameters``); buffers are averaged but not regularised.

Evaluation is that of :mod:`fedlib.baselines.sequential.sequence_training`: each valid/test row's history (its
latest ``maxlen`` items) is scored on its 1 + N candidates of the ground truth's domain with
``model.score``; ``ranks_from_scores`` (GT in column 0, optimistic ties by default) and
``rank_metrics`` give MRR, NDCG@5/10, HR@1/5/10 per GT domain, pooled over platforms.
The round with the best mean **test** MRR is kept too (the run's ``audit_round``, audit only).

Choices (the papers are silent): a fresh optimiser per platform and round (optimiser state is
local and not communicated, as in :func:`fedlib.papers.fedcsr.training.train_fedcsr`); Adam by
default (``optimizer="sgd"`` gives the FedProx paper's plain local SGD); platforms weighted
by their number of training users (``weight_by="sequences"`` for rows).
"""
from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import numpy as np
import torch
from torch import nn

from fedlib.data.splits import SequenceSplit
from fedlib.engine.algorithm import RoundContext, RoundReport, clone_dataclass, dataclass_from_dict, dataclass_to_dict
from fedlib.engine.optim import adam
from fedlib.engine.trainer import RunResult, train
from fedlib.baselines.config_checks import check_positive_ints, check_seed
from fedlib.baselines.sequential.sequences import make_batch, transition_graphs
from fedlib.baselines.sequential.sequence_training import (METRICS, TIE_RULES, PlatformPlan, clone_tensors,
                                              fedavg, flat_evaluation, generator_states, generators_of, platform_graphs,
                                              platform_rows, platform_schedule, rank_metrics, round_callback,
                                              sequence_ranks, state_bytes)

__all__ = ["FedProxConfig", "FedProxState", "FedProxAlgorithm", "proximal_term", "local_update",
           "evaluate_baseline", "gather_domain_scores", "train_federated_baseline"]


@dataclass(frozen=True)
class FedProxConfig:
    """Round-loop settings. ``mu`` is FedProx's proximal weight (0 = FedAvg)."""

    rounds: int = 100
    local_epochs: int = 3
    batch_size: int = 256
    lr: float = 1e-3
    optimizer: str = "adam"
    betas: tuple = (0.9, 0.98)
    weight_decay: float = 0.0
    mu: float = 0.01
    patience: int = 20
    weight_by: str = "users"
    tie_rule: str = "optimistic"
    eval_batch_size: int = 512
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self):
        check_positive_ints(self, ("rounds", "local_epochs", "batch_size", "patience", "eval_batch_size"))
        check_seed(self)
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"FedProxConfig.lr must be a finite number > 0, got {self.lr!r}")
        if not (isinstance(self.mu, (int, float)) and math.isfinite(self.mu) and self.mu >= 0):
            raise ValueError(f"FedProxConfig.mu must be a finite number >= 0 (0 = FedAvg), got {self.mu!r}")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"FedProxConfig.optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        if self.weight_by not in ("users", "sequences"):
            raise ValueError(f"FedProxConfig.weight_by must be 'users' or 'sequences', got {self.weight_by!r}")
        if self.tie_rule not in TIE_RULES:
            raise ValueError(f"FedProxConfig.tie_rule must be one of {TIE_RULES}, got {self.tie_rule!r}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"FedProxConfig.weight_decay must be >= 0, got {self.weight_decay!r}")


# ----------------------------------------------------------------------------- FedProx pieces
def proximal_term(model: nn.Module, anchor: Mapping[str, torch.Tensor], mu: float) -> torch.Tensor:
    """``(μ/2) Σ ‖w − w_anchor‖²`` over the trainable parameters (gradient ``μ (w − w_anchor)``)."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    total = params[0][1].new_zeros(()) if params else torch.zeros(())
    if mu == 0:
        return total
    for name, p in params:
        total = total + (p - anchor[name].detach()).pow(2).sum()
    return 0.5 * mu * total


def _optimizer(params, tc: FedProxConfig) -> torch.optim.Optimizer:
    if tc.optimizer == "sgd":
        return torch.optim.SGD(params, lr=tc.lr, weight_decay=tc.weight_decay)
    return adam(params, lr=tc.lr, betas=tuple(tc.betas), weight_decay=tc.weight_decay)


def local_update(model: nn.Module, split: SequenceSplit, rows: np.ndarray, tc: FedProxConfig,
                 rng: np.random.Generator, device: torch.device):
    """One platform's local FedProx training from the current (global) weights of ``model``.

    Returns ``(mean loss, mean proximal term, steps)``; ``model`` is updated in place.
    """
    anchor = {n: p.detach().clone() for n, p in model.named_parameters()}  # w^{t-1}
    opt = _optimizer([p for p in model.parameters() if p.requires_grad], tc)
    maxlen = model.config.maxlen
    model.train()
    loss_sum, prox_sum, steps = 0.0, 0.0, 0
    for _ in range(tc.local_epochs):
        order = rows[rng.permutation(rows.size)]
        for start in range(0, order.size, tc.batch_size):
            batch = make_batch(split.train, split.num_items_a, split.num_items_b, maxlen,
                               rows=order[start:start + tc.batch_size]).to(device)
            loss = model.loss(batch)
            prox = proximal_term(model, anchor, tc.mu)
            opt.zero_grad(set_to_none=True)
            (loss + prox).backward()
            opt.step()
            loss_sum, prox_sum, steps = loss_sum + float(loss.detach()), prox_sum + float(prox.detach()), steps + 1
    div = max(steps, 1)
    return loss_sum / div, prox_sum / div, steps


# ----------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate_baseline(model: nn.Module, split: SequenceSplit, role: str, graphs=None, *,
                      tie_rule: str = "optimistic", batch_size: int = 512, device=None,
                      full_ranking: bool = False) -> Dict[str, Any]:
    """Per-GT-domain metrics of ``split.<role>``; platform ``k``'s rows use ``graphs[k]`` when given.

    Rows come from ``split.extra[f"{role}_platforms"]`` (all rows at once when absent).
    Returns ``{domain: {metric: value, "count": n}, "per_platform": [...]}``.
    """
    if role not in ("valid", "test"):
        raise ValueError(f"role must be 'valid' or 'test', got {role!r}")
    seqs = getattr(split, role)
    names = tuple(split.extra.get("domain_names", ("A", "B")))
    rows_list = split.extra.get(f"{role}_platforms")
    rows_list = [np.arange(len(seqs))] if rows_list is None else list(rows_list)
    device = torch.device(device) if device is not None else next(model.parameters()).device
    targets = seqs.last_items()
    was_training = model.training
    model.eval()
    all_r, all_d, per_platform = [], [], []
    try:
        for k, rows in enumerate(rows_list):
            rows = np.asarray(rows, dtype=np.int64)
            if graphs is not None and hasattr(model, "set_graphs"):
                model.set_graphs(graphs[k % len(graphs)])
            ranks = sequence_ranks(model, split, role, rows, tie_rule=tie_rule, batch_size=batch_size, device=device,
                                   full_ranking=full_ranking)
            dom = (targets[rows] >= split.num_items_a).astype(np.int64)
            all_r.append(ranks)
            all_d.append(dom)
            per_platform.append({names[d]: rank_metrics(ranks[dom == d]) for d in (0, 1)})
    finally:
        model.train(was_training)
    ranks, dom = np.concatenate(all_r), np.concatenate(all_d)
    out: Dict[str, Any] = {names[d]: rank_metrics(ranks[dom == d]) for d in (0, 1)}
    out["per_platform"] = per_platform
    return out


# ----------------------------------------------------------------------------- FedProx as an Algorithm
@dataclass
class FedProxState:
    """Everything a FedProx round depends on.

    Attributes:
        weights: the global model's state dict ``w^t``.
        numpy_rng: the numpy generator's state (batch order, and what the model's loss draws).
        torch_rng: torch's CPU generator state (dropout masks), (N,) uint8.
        cuda_rng: the CUDA generator's state on a CUDA device, else ``None``.
    """

    weights: Dict[str, torch.Tensor]
    numpy_rng: Dict[str, Any]
    torch_rng: torch.Tensor
    cuda_rng: Optional[torch.Tensor] = None


class FedProxAlgorithm:
    """A FedProx round (module docstring) of any baseline model, as an :class:`~fedlib.engine.algorithm.Algorithm`.

    Args:
        model_factory: ``() -> model``; called once for the initial weights (after
            ``torch.manual_seed(seed)``) and once, with torch's generator untouched, for the
            scratch modules every round loads its state into.
        device: where the model lives.
    """

    def __init__(self, model_factory: Callable[[], nn.Module], split: SequenceSplit,
                 train_config: FedProxConfig = FedProxConfig(), *, device=None):
        tc = train_config
        if not isinstance(split, SequenceSplit):
            raise ValueError(f"split must be a SequenceSplit, got {type(split).__name__}")
        if len(split.platforms) == 0:
            raise ValueError("split.platforms is empty: FedProx needs at least one platform")
        self.model_factory, self.split, self.train_config = model_factory, split, tc
        self.device = torch.device(device if device is not None else tc.device)
        self.names = tuple(split.extra.get("domain_names", ("A", "B")))
        self.train_rows, self.counts, self.active = platform_rows(split, tc.weight_by)
        with torch.random.fork_rng(devices=[]):                    # scratch modules: their init draws nothing
            self.global_model = model_factory().to(self.device)     # holds w^t for evaluation
        self.work = copy.deepcopy(self.global_model)               # each platform's local copy
        self.uses_graphs = hasattr(self.global_model, "set_graphs")
        self.graphs = platform_graphs(split) if self.uses_graphs else None
        self.eval_graphs = self.graphs
        if self.uses_graphs and "valid_platforms" not in split.extra:   # rows not assigned to platforms: one graph
            self.eval_graphs = [transition_graphs(split.train, split.num_items_a, split.num_items_b)]
        self.model_bytes = state_bytes(self.global_model.state_dict())

    @property
    def method(self) -> str:
        return ("FedAvg-" if self.train_config.mu == 0 else "FedProx-") + type(self.global_model).__name__

    # --- state -------------------------------------------------------------------------------
    def init(self, seed: int) -> FedProxState:
        torch.manual_seed(seed)
        rng = np.random.default_rng([seed, 5005])
        weights = clone_tensors(self.model_factory().to(self.device).state_dict())
        return FedProxState(weights=weights, **generator_states(rng, self.device))

    def copy_state(self, state: FedProxState) -> FedProxState:
        return clone_dataclass(state)

    def state_dict(self, state: FedProxState) -> Dict[str, Any]:
        return dataclass_to_dict(state)

    def load_state(self, saved: Mapping[str, Any]) -> FedProxState:
        state = dataclass_from_dict(FedProxState, saved)
        state.weights = {n: v.to(self.device) for n, v in state.weights.items()}
        return state

    # --- one round -----------------------------------------------------------------------------
    def plan_round(self, state: FedProxState, context: RoundContext) -> PlatformPlan:
        return PlatformPlan(platforms=tuple(self.active))

    def run_round(self, state: FedProxState, plan: PlatformPlan, context: RoundContext
                  ) -> Tuple[FedProxState, RoundReport]:
        """Every platform: E local epochs of the proximal objective from ``w^{t-1}``; then FedAvg."""
        rng = generators_of(state.numpy_rng, state.torch_rng, state.cuda_rng, self.device)
        uploads, losses, proxes, steps_total = [], [], [], 0
        for k in plan.platforms:
            self.work.load_state_dict(state.weights)
            if self.uses_graphs:
                self.work.set_graphs(self.graphs[k])
            loss, prox, steps = local_update(self.work, self.split, self.train_rows[k], self.train_config, rng,
                                             self.device)
            losses.append(loss)
            proxes.append(prox)
            steps_total += steps
            uploads.append(clone_tensors(self.work.state_dict()))
        weights = [self.counts[k] for k in plan.platforms]
        sent = self.model_bytes * len(plan.platforms)                    # every state-dict tensor, both ways
        report = RoundReport(train_loss=float(np.average(losses, weights=weights)),
                             logged={"prox": float(np.average(proxes, weights=weights)), "local_steps": steps_total,
                                     "bytes_up": sent, "bytes_down": sent})
        return FedProxState(weights=fedavg(uploads, weights), **generator_states(rng, self.device)), report

    # --- evaluation ------------------------------------------------------------------------------
    def network(self, state: FedProxState) -> nn.Module:
        """The scratch module holding ``state``'s global model."""
        self.global_model.load_state_dict(state.weights)
        return self.global_model

    def evaluate(self, state: FedProxState, split: str) -> Dict[str, float]:
        tc = self.train_config
        evaluation = evaluate_baseline(self.network(state), self.split, split, self.eval_graphs, tie_rule=tc.tie_rule,
                                       batch_size=tc.eval_batch_size, device=self.device)
        return flat_evaluation(evaluation, self.names, per_platform=False)


def train_federated_baseline(model_factory: Callable[[], nn.Module], split: SequenceSplit,
                             train_config: FedProxConfig = FedProxConfig(), *, device=None,
                             progress: Optional[Callable[[Dict[str, float]], None]] = None,
                             checkpointer=None) -> RunResult[FedProxState]:
    """FedProx over ``split.platforms`` (module docstring), trained by :func:`fedlib.engine.train`.

    Args:
        model_factory: ``() -> model`` (deterministic from the model's own config seed).
        device: overrides ``train_config.device``.
        progress: called with every round's history row.
        checkpointer: a :class:`~fedlib.engine.Checkpointer`: resume from its checkpoint, save on
            its schedule (the state holds the weights and both generators: resumed = uninterrupted).

    Returns:
        The trainer's :class:`~fedlib.engine.trainer.RunResult`: ``best_round`` and
        ``selected_evaluation`` (best mean validation MRR, with that round's test numbers),
        ``audit_round`` and ``audit_evaluation`` (best mean **test** MRR; audit only), the raw
        ``history`` (each round also logs ``prox``, the mean proximal term); ``method``
        (``"FedProx-<Model>"``, ``"FedAvg-<Model>"`` with ``mu = 0``) and ``artifacts``:
        ``domains`` (the domain names of the metrics' keys), ``models`` (``[a copy of the
        selected global model]``), ``graphs`` (the platforms', ``None`` for a model without
        graphs), ``train_config``, ``weights`` (FedAvg's ``N_k``), ``active_platforms``,
        ``model_bytes``, ``metrics`` (the metric names). Per-domain blocks and history rows:
        :func:`~fedlib.baselines.sequential.sequence_training.selected_blocks`, ``audit_blocks``,
        ``history_rows``.
    """
    tc = train_config
    algorithm = FedProxAlgorithm(model_factory, split, tc, device=device)
    run = train(algorithm, platform_schedule(tc.rounds, tc.patience), seed=tc.seed, checkpointer=checkpointer,
                checkpoint_config=_checkpoint_config(algorithm), on_round_end=round_callback(algorithm.names, progress))
    run.method = algorithm.method
    run.artifacts = {"domains": algorithm.names, "models": [copy.deepcopy(algorithm.network(run.selected_state))],
                     "graphs": algorithm.graphs, "train_config": tc, "weights": algorithm.counts,
                     "active_platforms": algorithm.active, "model_bytes": algorithm.model_bytes, "metrics": METRICS}
    return run


def _checkpoint_config(algorithm: FedProxAlgorithm) -> Dict[str, Any]:
    """What a checkpoint must have been made under: the model (class and config) and every setting but ``rounds``."""
    model_config = getattr(algorithm.global_model, "config", None)
    model_config = (dataclasses.asdict(model_config) if dataclasses.is_dataclass(model_config)
                    else repr(model_config))
    train_settings = {k: v for k, v in dataclasses.asdict(algorithm.train_config).items() if k != "rounds"}
    return {"rounds": algorithm.train_config.rounds, "model": type(algorithm.global_model).__name__,
            "model_config": model_config, "train": train_settings, "device": str(algorithm.device)}


# ----------------------------------------------------------------------------- helpers for the baselines
def gather_domain_scores(logits_a: torch.Tensor, logits_b: torch.Tensor, candidates: torch.Tensor,
                         gt_domain: torch.Tensor, num_items_a: int) -> torch.Tensor:
    """Scores of global candidate ids from per-domain head logits (B, |V^A|), (B, |V^B|) → (B, C).

    Raises ``ValueError`` when a row's candidates are not all in its ``gt_domain`` (0 = A, 1 = B).
    """
    is_b = candidates >= num_items_a                                        # (B, C)
    if bool((is_b != gt_domain.view(-1, 1).bool()).any()):
        raise ValueError("every candidate must lie in its row's ground-truth domain (gt_domain)")
    full = torch.cat([logits_a, logits_b], dim=1)                           # (B, |V^A| + |V^B|) global ids
    return full.gather(1, candidates)                                       # (B, C)
