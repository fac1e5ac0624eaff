r"""FedProx trainer for the FedCSR baselines (any model with ``loss`` / ``score``).

References:
    T. Li, A. K. Sahu, M. Zaheer, M. Sanjabi, A. Talwalkar, V. Smith, "Federated Optimization
    in Heterogeneous Networks", MLSys 2020 (FedProx).
    D. Zheng et al., "FedCSR", COLING 2025 (https://aclanthology.org/2025.coling-main.581/,
    App. A.1): every baseline
    (TiSASRec, CLSR, CoNet, CCDR, π-Net, PSJNet, MIFN, C2DSR) is "federated with FedProx".

The model interface (so one loop runs them all): a ``torch.nn.Module`` with
``loss(batch: SequenceBatch) -> scalar``, ``score(inputs, candidates (B, C), gt_domain (B,))
-> (B, C)``, a ``config`` with ``maxlen``, and optionally ``set_graphs(TransitionGraphs)``.

Algorithm (K platforms, ``D_k`` platform ``k``'s training rows, ``N_k`` its number of users,
``w`` the global weights, ``μ`` the proximal weight)::

    w^0 = model_factory() weights
    for t = 1..T:
        for k = 1..K (every platform every round):
            w_k = w^{t-1}
            E local epochs of shuffled mini-batches b ⊂ D_k:
                h_k(w_k) = loss(b; w_k) + (μ/2) ‖w_k − w^{t-1}‖²          (FedProx local objective)
                w_k ← optimiser step on ∇h_k  (∇ of the proximal term: μ (w_k − w^{t-1}))
        w^t = Σ_k N_k w_k / Σ_k N_k                                         (FedAvg aggregation)
        evaluate w^t on every platform's valid/test rows (its own graphs, if any)
        select on the mean over domains of the validation MRR; stop after `patience`
        rounds without improvement

``μ = 0`` is FedAvg. The proximal term runs over every trainable parameter (the ``requires_grad``
entries of ``named_parameters``); buffers are averaged but not regularised.

Evaluation is that of :mod:`fedlib.methods.fedcsr_train`: each valid/test row's history (its
latest ``maxlen`` items) is scored on its 1 + N candidates of the ground truth's domain with
``model.score``; ``ranks_from_scores`` (GT in column 0, optimistic ties by default) and
``rank_metrics`` give MRR, NDCG@5/10, HR@1/5/10 per GT domain, pooled over platforms.
The round with the best mean **test** MRR is kept too (``test_selected``, audit only).

Choices (the papers are silent): a fresh optimiser per platform and round (optimiser state is
local and not communicated, as in :func:`fedlib.methods.fedcsr_train.train_fedcsr`); Adam by
default (``optimizer="sgd"`` gives the FedProx paper's plain local SGD); platforms weighted
by their number of training users (``weight_by="sequences"`` for rows).
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional

import numpy as np
import torch
from torch import nn

from fedlib.data.splits import SequenceSplit
from fedlib.engine.optim import adam
from fedlib.methods.fedcsr import make_batch, transition_graphs
from fedlib.methods.fedcsr_train import (METRICS, TIE_RULES, fedavg, platform_graphs, rank_metrics, sequence_ranks,
                                         state_bytes)

__all__ = ["FedProxConfig", "BaselineResult", "proximal_term", "local_update", "evaluate_baseline",
           "gather_domain_scores",
           "train_federated_baseline"]


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
        for name in ("rounds", "local_epochs", "batch_size", "patience", "eval_batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"FedProxConfig.{name} must be an integer >= 1, got {v!r}")
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


@dataclass
class BaselineResult:
    """A finished FedProx run.

    Attributes:
        selected: ``{domain: {"valid/MRR", ..., "test/MRR", ...}}`` at ``selected_round``
            (best mean validation MRR).
        test_selected: the same at ``test_selected_round`` (best mean test MRR; audit only).
        history: one row per round: ``round``, ``loss`` (platform-weighted mean of the local
            objective without the proximal term), ``prox`` (mean proximal term), ``local_steps``,
            ``valid/MRR``, ``test/MRR`` (means over domains), ``<domain>/<role>/<metric>``,
            ``bytes_up``, ``bytes_down``, ``seconds``.
        model: the selected global model.
    """

    method: str
    selected: Dict[str, Dict[str, float]]
    selected_round: int
    test_selected: Dict[str, Dict[str, float]]
    test_selected_round: int
    history: List[Dict[str, float]]
    wall_seconds: float
    train_config: Any = None
    model: Optional[nn.Module] = field(repr=False, default=None)
    artifacts: Dict[str, Any] = field(repr=False, default_factory=dict)


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


def _mean_mrr(block, role: str) -> float:
    vals = [m[f"{role}/MRR"] for m in block.values() if np.isfinite(m[f"{role}/MRR"])]
    return float(np.mean(vals)) if vals else float("nan")


# ----------------------------------------------------------------------------- round loop
def train_federated_baseline(model_factory: Callable[[], nn.Module], split: SequenceSplit,
                             train_config: FedProxConfig = FedProxConfig(), *, device=None,
                             progress: Optional[Callable[[Dict[str, float]], None]] = None) -> BaselineResult:
    """FedProx over ``split.platforms`` (module docstring); ``progress(row)`` is called every round.

    Args:
        model_factory: ``() -> model`` (deterministic from the model's own config seed).
        device: overrides ``train_config.device``.
    """
    tc = train_config
    if not isinstance(split, SequenceSplit):
        raise ValueError(f"split must be a SequenceSplit, got {type(split).__name__}")
    K = len(split.platforms)
    if K == 0:
        raise ValueError("split.platforms is empty: FedProx needs at least one platform")
    device = torch.device(device if device is not None else tc.device)
    torch.manual_seed(tc.seed)
    rng = np.random.default_rng([tc.seed, 5005])
    names = tuple(split.extra.get("domain_names", ("A", "B")))

    lengths = split.train.lengths()
    train_rows = [np.asarray(r, dtype=np.int64)[lengths[np.asarray(r, dtype=np.int64)] >= 2] for r in split.platforms]
    counts = [np.unique(split.train.users[r]).size if tc.weight_by == "users" else r.size for r in train_rows]
    if sum(counts) == 0:
        raise ValueError("no platform has a training sequence of length >= 2")
    active = [k for k in range(K) if train_rows[k].size]

    global_model = model_factory().to(device)
    uses_graphs = hasattr(global_model, "set_graphs")
    graphs = platform_graphs(split) if uses_graphs else None
    eval_graphs = graphs
    if uses_graphs and "valid_platforms" not in split.extra:   # rows not assigned to platforms: one graph
        eval_graphs = [transition_graphs(split.train, split.num_items_a, split.num_items_b)]
    work = copy.deepcopy(global_model)
    model_bytes = state_bytes(global_model.state_dict())

    history: List[Dict[str, float]] = []
    best_score, best_round, best, best_state = -math.inf, 0, {}, None
    best_test_score, best_test_round, best_test = -math.inf, 0, {}
    waited, started, metrics = 0, time.perf_counter(), {}
    for rnd in range(1, tc.rounds + 1):
        t0 = time.perf_counter()
        global_state = {n: v.detach().clone() for n, v in global_model.state_dict().items()}
        uploads, losses, proxes, steps_total = [], [], [], 0
        for k in active:
            work.load_state_dict(global_state)
            if uses_graphs:
                work.set_graphs(graphs[k])
            loss, prox, steps = local_update(work, split, train_rows[k], tc, rng, device)
            losses.append(loss)
            proxes.append(prox)
            steps_total += steps
            uploads.append({n: v.detach().clone() for n, v in work.state_dict().items()})
        weights = [counts[k] for k in active]
        global_model.load_state_dict(fedavg(uploads, weights))
        row: Dict[str, float] = {"round": rnd, "loss": float(np.average(losses, weights=weights)),
                                 "prox": float(np.average(proxes, weights=weights)), "local_steps": steps_total,
                                 "bytes_up": model_bytes * len(active), "bytes_down": model_bytes * len(active)}
        evals = {role: evaluate_baseline(global_model, split, role, eval_graphs, tie_rule=tc.tie_rule,
                                         batch_size=tc.eval_batch_size, device=device)
                 for role in ("valid", "test")}
        metrics = {d: {f"{role}/{m}": v for role in ("valid", "test") for m, v in evals[role][d].items()}
                   for d in names}
        for d, block in metrics.items():
            row.update({f"{d}/{key}": float(v) for key, v in block.items()})
        valid, test = _mean_mrr(metrics, "valid"), _mean_mrr(metrics, "test")
        row.update({"valid/MRR": valid, "test/MRR": test, "seconds": time.perf_counter() - t0})
        history.append(row)
        if progress is not None:
            progress(row)
        if test > best_test_score:
            best_test_score, best_test_round, best_test = test, rnd, copy.deepcopy(metrics)
        if valid > best_score:
            best_score, best_round, best, waited = valid, rnd, copy.deepcopy(metrics), 0
            best_state = {n: v.detach().clone() for n, v in global_model.state_dict().items()}
        else:
            waited += 1
            if waited >= tc.patience:
                break
    if best_state is None:                                   # no finite validation MRR
        best_round, best = history[-1]["round"], metrics
        best_state = {n: v.detach().clone() for n, v in global_model.state_dict().items()}
    final = copy.deepcopy(global_model)
    final.load_state_dict(best_state)
    method = ("FedAvg-" if tc.mu == 0 else "FedProx-") + type(final).__name__
    return BaselineResult(method=method, selected=best, selected_round=int(best_round), test_selected=best_test,
                          test_selected_round=int(best_test_round), history=history,
                          wall_seconds=time.perf_counter() - started, train_config=tc, model=final,
                          artifacts={"weights": counts, "active_platforms": active, "model_bytes": model_bytes,
                                     "graphs": graphs, "metrics": METRICS})


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
