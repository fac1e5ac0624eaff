r"""FedCSR: sampled evaluation, the federated round (FedAvg) as an Algorithm, and individual training.

Reference: D. Zheng et al., "FedCSR", COLING 2025 (https://aclanthology.org/2025.coling-main.581/,
Algorithm 1 and Eq. 19); public code https://github.com/zdy769243418/FedCSR-v1 (``train_rec.py``,
``clients.py``, ``aggregator.py``, ``data_utils.py``). The model and the local loss live in
:mod:`fedlib.methods.fedcsr`.

Algorithm (K platforms, ``D_k`` the training sequences of platform ``k``, ``w`` the global
weights, ``N_k`` the weight of platform ``k``)::

    for k = 1..K:  A_k = transition_graphs(D_k)             # each platform, its own data only
    w^0 = random init                                       # FedCSRAlgorithm.init
    for t = 1..T:                                           # the trainer (fedlib.engine.train), T = rounds
        for k = 1..K (all platforms every round):
            w_k = w^{t-1};  w_g = frozen copy of w^{t-1}   # MCL target (Eq. 3)
            repeat E local epochs (E = 3):
                for each shuffled mini-batch b ⊂ D_k (size 256):
                    w_k ← Adam step on L(b; w_k, w_g, A_k)  # Eq. 18, fedcsr_loss
            send w_k to the server
        w^t = Σ_k N_k w_k / Σ_k N_k                        # FedAvg (Eq. 19); end of run_round
        evaluate w^t on every platform's valid/test rows with that platform's A_k   # evaluate
        select on the mean over domains of the validation MRR; stop after `patience`
        rounds without improvement                          # the trainer's Selection

:class:`FedCSRAlgorithm` is one round of this (``init``, ``run_round``, ``evaluate`` over a
:class:`FedCSRState`); :func:`train_fedcsr` hands it to the one trainer,
:func:`fedlib.engine.train`, with :func:`platform_schedule`, and returns the
:class:`FedCSRResult` view of the run. The round's randomness (batch order, augmentation,
sampled negatives: one numpy stream; dropout masks: torch's generator) continues from round
to round, as in the code, so both generators' states live in the state, and a checkpoint
(the trainer's) resumes them exactly.

Evaluation (:func:`evaluate_sequences`): for a valid/test sequence ``s`` with ground truth
(GT) ``y = s[-1]`` of domain ``d``, the history ``s[:-1]`` (its latest ``maxlen`` items) is
encoded and the candidates (GT in column 0 + same-domain negatives) are scored by domain
``d``'s cross-domain head of Eq. 16, ``(h*_last + h^d_last) W^d``: ``h*_last`` is the cross
encoder's feature at the last history position and ``h^d_last`` the domain-``d`` encoder's
feature at the last domain-``d`` position of the history (zero when the history has no
domain-``d`` item), as C2DSR/the public code score ("specific" feature). Then::

    rank = 1 + #{negatives j : score_j > score_GT}            (tie_rule="optimistic", default)
    MRR = 1/rank,  HR@K = [rank ≤ K],  NDCG@K = [rank ≤ K] / log2(rank + 1)

averaged over the rows whose GT is in domain ``d``. ``tie_rule="pessimistic"`` counts ties
against the GT (``≥``); ``tie_rule="code"`` is the public code's ``score_j > score_GT + 1e-5``.

Choices (where the paper is silent):

* **Graphs per platform.** Each platform builds ``A_k`` from its own training sequences.
  The graph is platform data, so the server holds no global graph: the global model is
  evaluated on platform ``k``'s share of the valid/test rows (``split.extra["valid_platforms"]``
  / ``["test_platforms"]``) with ``A_k``, and the per-row ranks are pooled into one score per
  domain (= the row-count-weighted mean over platforms). ``central_graph=True`` reproduces the
  public code: one graph from all platforms' training sequences, used everywhere.
* **Optimiser.** Each platform gets a **fresh Adam every round** (FedAvg semantics: optimiser
  moments are local state that is neither sent nor kept between rounds; keeping 10 sets of
  Adam moments of a 65 M-parameter model would also cost ~5 GB). ``shared_optimizer=True``
  reproduces the code: one Adam instance shared by all platforms and rounds, whose moments
  carry over from platform to platform. Adam betas default to the code's (0.9, 0.98).
* **FedAvg weights**: ``weight_by="users"`` (Eq. 19: the number of training users) or
  ``"sequences"`` (the code). Every state-dict entry is averaged (the model has no buffers).
* **MCL target**: a frozen copy of the round's global model (eval mode), run on the platform
  with the platform's own graph.
* **Selection**: best mean (over domains) validation MRR, the first best on ties, patience
  counted from the best round (the code counts from the previous round): the trainer's
  :class:`~fedlib.engine.selection.Selection`. The test metrics of the round with the best
  mean **test** MRR are kept too (``test_selected``, the schedule's ``audit_metric``), the
  audit of the code's per-round test log.
* **Communication**: per round, each participating platform downloads and uploads every
  state-dict tensor (``numel × element size`` bytes); graphs never leave a platform.
* **Individual training** (``individual=True``, paper Figure 4 / Table 9): each platform
  trains its own model on its own data with its own persistent Adam (no aggregation, no
  communication; the MCL target is the platform's own model at the start of the round) and
  is evaluated on its own valid/test rows with its own graph. One round = ``local_epochs``
  epochs on every platform; selection is joint over platforms (pooled validation MRR).

Where the public code differs (``train_rec.py``): central graph; one shared Adam; local
batches in a fixed order without shuffling (the last partial batch wrapped around); weights
= #sequences; early stopping against the previous round and no validation-based selection
(test logged every round); evaluation loop per sequence (here batched with ``gather``).
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence as SequenceT, Tuple, Union

import numpy as np
import torch

from fedlib.data.splits import SequenceSplit
from fedlib.engine.aggregation import client_weights
from fedlib.engine.aggregation import fedavg as engine_fedavg
from fedlib.engine.algorithm import RoundContext, RoundReport, dataclass_from_dict, dataclass_to_dict
from fedlib.engine.optim import adam
from fedlib.engine.trainer import RunResult, Schedule, train
from fedlib.methods.fedcsr import (FedCSRConfig, FedCSRModel, TransitionGraphs, fedcsr_loss, frozen_copy,
                                   make_batch, transition_graphs)

__all__ = ["TIE_RULES", "METRICS", "ranks_from_scores", "rank_metrics", "sequence_ranks", "evaluate_sequences",
           "fedavg", "state_bytes", "platform_graphs", "FedCSRTrainConfig", "FedCSRResult", "FedCSRState",
           "FedCSRAlgorithm", "PlatformPlan", "train_fedcsr", "train_individual"]

TIE_RULES = ("optimistic", "pessimistic", "code")
METRICS = ("MRR", "NDCG@5", "NDCG@10", "HR@1", "HR@5", "HR@10")
CODE_TIE_MARGIN = 1e-5


# ----------------------------------------------------------------------------- metrics
def ranks_from_scores(scores: torch.Tensor, tie_rule: str = "optimistic") -> torch.Tensor:
    """1-based rank of column 0 (the GT) among the columns of ``scores`` (R, C) → (R,) int64.

    ``optimistic``: rank = 1 + #{j ≥ 1: s_j > s_0} (ties favour the GT); ``pessimistic``:
    ``s_j ≥ s_0``; ``code``: ``s_j > s_0 + 1e-5`` (the public code).
    """
    if tie_rule not in TIE_RULES:
        raise ValueError(f"tie_rule must be one of {TIE_RULES}, got {tie_rule!r}")
    if scores.dim() != 2 or scores.shape[1] < 2:
        raise ValueError(f"scores must be (rows, 1 + negatives) with the GT in column 0, got shape {tuple(scores.shape)}")
    gt, neg = scores[:, :1], scores[:, 1:]                                 # (R, 1), (R, C−1)
    if tie_rule == "optimistic":
        above = neg > gt
    elif tie_rule == "pessimistic":
        above = neg >= gt
    else:
        above = neg > gt + CODE_TIE_MARGIN
    return 1 + above.sum(dim=1).to(torch.int64)                            # (R,)


def rank_metrics(ranks) -> Dict[str, float]:
    """Mean MRR, NDCG@5/10, HR@1/5/10 of 1-based ranks, plus ``count``; NaN metrics when empty."""
    r = np.asarray(ranks, dtype=np.float64)
    if r.size == 0:
        return {**{m: float("nan") for m in METRICS}, "count": 0}
    out = {"MRR": float(np.mean(1.0 / r))}
    for k in (5, 10):
        out[f"NDCG@{k}"] = float(np.mean(np.where(r <= k, 1.0 / np.log2(r + 1.0), 0.0)))
    for k in (1, 5, 10):
        out[f"HR@{k}"] = float(np.mean(r <= k))
    out["count"] = int(r.size)
    return out


def _domain_names(split: SequenceSplit):
    return tuple(split.extra.get("domain_names", ("A", "B")))


@torch.no_grad()
def sequence_ranks(model: torch.nn.Module, split: SequenceSplit, role: str, rows=None, *,
                   tie_rule: str = "optimistic", batch_size: int = 512, device=None,
                   full_ranking: bool = False) -> np.ndarray:
    """Ranks of the GT of ``split.<role>`` rows (default all) → (n,) int64.

    ``model`` is FedCSR or any baseline: it has ``config.maxlen`` and
    ``score(inputs, candidates (B, C), gt_domain (B,)) -> (B, C)``, and carries its current graphs.
    ``full_ranking=False`` ranks the GT among the row's stored candidates (GT + sampled
    negatives); ``True`` among **every item of the GT's domain** (the user's other items are not
    removed; ties count for the GT as in ``tie_rule="optimistic"``).
    """
    if role not in ("valid", "test"):
        raise ValueError(f"role must be 'valid' or 'test', got {role!r}")
    seqs, cands = getattr(split, role), np.asarray(getattr(split, f"{role}_candidates"))
    if cands.ndim != 2 or cands.shape[0] != len(seqs):
        raise ValueError(f"{role}_candidates must be ({len(seqs)}, 1 + negatives), got shape {cands.shape}")
    rows = np.arange(len(seqs), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    na, nb, maxlen = split.num_items_a, split.num_items_b, model.config.maxlen
    if full_ranking:                       # (B, |V^d|) scores per chunk: keep chunks small
        batch_size = max(1, batch_size // 8)
    was_training = model.training
    model.eval()
    out = np.empty(rows.size, dtype=np.int64)
    try:
        with torch.no_grad():
            for start in range(0, rows.size, batch_size):
                chunk = rows[start:start + batch_size]
                inputs = make_batch(seqs, na, nb, maxlen, rows=chunk).inputs.to(device)
                gt = torch.as_tensor(cands[chunk, 0], device=device)          # (B,) global ids
                gt_domain = (gt >= na).to(torch.int64)                         # (B,)
                if full_ranking:
                    out[start:start + chunk.size] = _full_ranks(model, inputs, gt, gt_domain, na, nb).cpu().numpy()
                    continue
                cand = torch.as_tensor(cands[chunk], device=device)            # (B, C) global ids, GT first
                try:
                    scores = model.score(inputs, cand, gt_domain)              # (B, C)
                except ValueError as error:
                    raise ValueError(f"{role} candidates must all lie in the GT's domain") from error
                out[start:start + chunk.size] = ranks_from_scores(scores, tie_rule).cpu().numpy()
    finally:
        model.train(was_training)
    return out


def _full_ranks(model, inputs, gt: torch.Tensor, gt_domain: torch.Tensor, na: int, nb: int) -> torch.Tensor:
    """1 + #{items of the GT's domain scored above the GT}, per row → (B,) int64."""
    ranks = torch.empty(gt.shape, dtype=torch.int64, device=gt.device)
    for d, (offset, size) in enumerate(((0, na), (na, nb))):
        m = gt_domain == d                                                     # (B,)
        if not bool(m.any()):
            continue
        sub = type(inputs)(*(t[m] for t in inputs))                            # the rows of domain d
        every = torch.arange(offset, offset + size, device=gt.device).expand(int(m.sum()), size)  # (b, |V^d|)
        scores = model.score(sub, every, gt_domain[m])                         # (b, |V^d|)
        truth = scores.gather(1, (gt[m] - offset).view(-1, 1))                 # (b, 1)
        ranks[m] = 1 + (scores > truth).sum(dim=1)
    return ranks


def evaluate_sequences(model: FedCSRModel, split: SequenceSplit, role: str,
                       graphs_per_platform: Union[TransitionGraphs, SequenceT[TransitionGraphs]], *,
                       rows_per_platform: Optional[SequenceT] = None, models: Optional[SequenceT[FedCSRModel]] = None,
                       tie_rule: str = "optimistic", batch_size: int = 512, device=None,
                       return_ranks: bool = False, full_ranking: bool = False) -> Dict[str, Any]:
    """Per-GT-domain MRR, NDCG@5/10, HR@1/5/10 (and ``count``) of ``split.<role>``.

    Args:
        graphs_per_platform: one :class:`TransitionGraphs` (all rows scored with it) or one per
            platform; platform ``k``'s rows (``rows_per_platform[k]``, default
            ``split.extra[f"{role}_platforms"][k]``) are scored with graph ``k``.
        models: optional per-platform models (individual training); default ``model`` everywhere.
        return_ranks: also return ``"ranks"`` (pooled) and ``"domains"``.
        full_ranking: rank the GT among every item of its domain (:func:`sequence_ranks`).
    Returns:
        ``{domain_name: {metric: value, "count": n}}`` (plus ``"per_platform"``: the same per platform).
    """
    if role not in ("valid", "test"):
        raise ValueError(f"role must be 'valid' or 'test', got {role!r}")
    seqs = getattr(split, role)
    if isinstance(graphs_per_platform, TransitionGraphs):
        graphs_list = [graphs_per_platform]
        rows_list = [np.arange(len(seqs), dtype=np.int64)] if rows_per_platform is None else list(rows_per_platform)
    else:
        graphs_list = list(graphs_per_platform)
        if rows_per_platform is None:
            key = f"{role}_platforms"
            if key not in split.extra:
                raise ValueError(f"split.extra has no {key!r}: pass rows_per_platform or a single graph")
            rows_per_platform = split.extra[key]
        rows_list = list(rows_per_platform)
    if len(rows_list) != len(graphs_list):
        raise ValueError(f"{len(graphs_list)} graphs for {len(rows_list)} platforms' {role} rows")
    if models is not None and len(models) != len(graphs_list):
        raise ValueError(f"{len(models)} models for {len(graphs_list)} platforms")
    names = _domain_names(split)
    targets = seqs.last_items()
    all_ranks, all_dom, per_platform = [], [], []
    for k, (graphs, rows) in enumerate(zip(graphs_list, rows_list)):
        net = model if models is None else models[k]
        net.set_graphs(graphs)
        rows = np.asarray(rows, dtype=np.int64)
        ranks = sequence_ranks(net, split, role, rows, tie_rule=tie_rule, batch_size=batch_size, device=device,
                               full_ranking=full_ranking)
        dom = (targets[rows] >= split.num_items_a).astype(np.int64)
        all_ranks.append(ranks)
        all_dom.append(dom)
        per_platform.append({names[d]: rank_metrics(ranks[dom == d]) for d in (0, 1)})
    ranks = np.concatenate(all_ranks) if all_ranks else np.empty(0, np.int64)
    dom = np.concatenate(all_dom) if all_dom else np.empty(0, np.int64)
    out: Dict[str, Any] = {names[d]: rank_metrics(ranks[dom == d]) for d in (0, 1)}
    out["per_platform"] = per_platform
    if return_ranks:
        out.update(ranks=ranks, domains=dom)
    return out


# ----------------------------------------------------------------------------- federated pieces
def fedavg(states: SequenceT[Mapping[str, torch.Tensor]], weights) -> Dict[str, torch.Tensor]:
    """Eq. 19: ``Σ_k N_k w_k / Σ_k N_k`` for every entry of the state dicts, by the library's FedAvg.

    ``states``: the K uploaded state dicts (same keys); ``weights``: (K,) the ``N_k``. Each float
    entry goes through :func:`fedlib.engine.aggregation.fedavg` as ``θ + Σ_k p_k Δ_k`` with
    ``θ = 0`` and ``Δ_k = w_k`` (so it is exactly the weighted mean, not a sum of differences to
    the global model), ``p_k = N_k / Σ N`` (:func:`~fedlib.engine.aggregation.client_weights`), in
    float64, rounded once to the entry's dtype: the float32 result then equals a float64 running
    sum rounded once (tested on 2 M entries: no element differs), which averaging in float32 would
    not (2.5 % of the entries differ by an ulp). One entry at a time, so only one entry's K
    copies are stacked at once. Integer entries (none in FedCSR's model) keep the first state's.
    """
    w = np.asarray(weights, dtype=np.float64)
    if len(states) == 0 or w.shape != (len(states),):
        raise ValueError(f"need one weight per state dict, got {w.shape} weights for {len(states)} states")
    if not np.all(np.isfinite(w)) or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"FedAvg weights must be finite, >= 0 and not all 0, got {w.tolist()}")
    keys = list(states[0].keys())
    if any(list(s.keys()) != keys for s in states[1:]):
        raise ValueError("all state dicts must have the same keys")
    p = client_weights(w, "num_examples")                                   # (K,) N_k / Σ N
    out = {}
    for key in keys:
        ref = states[0][key]
        if not torch.is_floating_point(ref):
            out[key] = ref.clone()
            continue
        uploads = torch.stack([s[key].to(torch.float64) for s in states])    # (K, *shape)
        zero = torch.zeros(ref.shape, dtype=torch.float64, device=ref.device)
        out[key] = engine_fedavg({key: zero}, {key: uploads}, p)[key].to(ref.dtype)
    return out


def state_bytes(state: Mapping[str, torch.Tensor]) -> int:
    """Bytes of every tensor of a state dict (what one platform sends or receives per round)."""
    return int(sum(t.numel() * t.element_size() for t in state.values()))


def platform_graphs(split: SequenceSplit, *, central: bool = False, binary: bool = True) -> List[TransitionGraphs]:
    """One graph per platform from its own training rows, or (``central``) the all-platform graph K times."""
    na, nb = split.num_items_a, split.num_items_b
    if central:
        g = transition_graphs(split.train, na, nb, binary=binary)
        return [g] * len(split.platforms)
    return [transition_graphs(split.train.subset(np.asarray(rows, dtype=np.int64)), na, nb, binary=binary)
            for rows in split.platforms]


# ----------------------------------------------------------------------------- config / result
@dataclass(frozen=True)
class FedCSRTrainConfig:
    """Round-loop settings (paper / code defaults).

    ``rounds`` is the maximum number of rounds; ``patience`` stops after that many rounds
    without a better mean validation MRR. ``device``: ``"cpu"`` or ``"cuda"``.
    """

    rounds: int = 100
    local_epochs: int = 3
    batch_size: int = 256
    lr: float = 1e-3
    betas: tuple = (0.9, 0.98)
    weight_decay: float = 0.0
    patience: int = 20
    weight_by: str = "users"
    tie_rule: str = "optimistic"
    central_graph: bool = False
    shared_optimizer: bool = False
    eval_batch_size: int = 512
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self):
        for name in ("rounds", "local_epochs", "batch_size", "patience", "eval_batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"FedCSRTrainConfig.{name} must be an integer >= 1, got {v!r}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not math.isfinite(self.lr) \
                or self.lr <= 0:
            raise ValueError(f"FedCSRTrainConfig.lr must be a finite number > 0 (e.g. 1e-3), got {self.lr!r}")
        if len(tuple(self.betas)) != 2 or not all(0.0 <= float(b) < 1.0 for b in self.betas):
            raise ValueError(f"FedCSRTrainConfig.betas must be two numbers in [0, 1), got {self.betas!r}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"FedCSRTrainConfig.weight_decay must be >= 0, got {self.weight_decay!r}")
        if self.weight_by not in ("users", "sequences"):
            raise ValueError(f"FedCSRTrainConfig.weight_by must be 'users' (Eq. 19) or 'sequences' (the code), "
                             f"got {self.weight_by!r}")
        if self.tie_rule not in TIE_RULES:
            raise ValueError(f"FedCSRTrainConfig.tie_rule must be one of {TIE_RULES}, got {self.tie_rule!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ValueError(f"FedCSRTrainConfig.seed must be an integer >= 0, got {self.seed!r}")
        if str(self.device).split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"FedCSRTrainConfig.device must be 'cpu' or 'cuda[:i]', got {self.device!r}")


@dataclass
class FedCSRResult:
    """A finished run.

    Attributes:
        selected: ``{domain: {"valid/MRR", ..., "test/MRR", "test/NDCG@10", ...}}`` at
            ``selected_round`` (best mean validation MRR).
        test_selected: the same at ``test_selected_round`` (best mean **test** MRR; audit only).
        per_platform: at ``selected_round``, ``[{domain: {"test/MRR", ...}}]`` per platform.
        history: one row per round: ``round``, ``loss`` (and ``loss/<part>``), ``local_steps``,
            ``valid/MRR``, ``test/MRR`` (means over domains), ``<domain>/<role>/<metric>``,
            ``bytes_up``, ``bytes_down``, ``seconds``.
        models: the selected global model (``[model]``) or, individually, one per platform.
        graphs: the platforms' graphs; artifacts: the shared optimizer (audit mode), weights.
    """

    method: str
    selected: Dict[str, Dict[str, float]]
    selected_round: int
    test_selected: Dict[str, Dict[str, float]]
    test_selected_round: int
    per_platform: List[Dict[str, Dict[str, float]]]
    history: List[Dict[str, float]]
    wall_seconds: float
    config: Any = None
    train_config: Any = None
    models: List[FedCSRModel] = field(repr=False, default_factory=list)
    graphs: List[TransitionGraphs] = field(repr=False, default_factory=list)
    artifacts: Dict[str, Any] = field(repr=False, default_factory=dict)

    @classmethod
    def from_run(cls, run: RunResult, algorithm: "FedCSRAlgorithm") -> "FedCSRResult":
        """A view of the trainer's :class:`~fedlib.engine.trainer.RunResult` of ``algorithm``.

        ``selected``/``per_platform``: the selection's evaluation (valid and test numbers of that
        round); ``test_selected``: the audit's (best mean test MRR); ``history``: the trainer's
        records as :func:`curve_row` rows; ``models``: the selected state's networks (copies).
        """
        names, best = algorithm.names, run.selection.best_metrics
        audit = run.audit.best_metrics if run.audit is not None else None
        kept = run.best_state if run.best_state is not None else run.state
        return cls(method=algorithm.method, selected=domain_blocks(best, names),
                   selected_round=int(run.selection.best_round or 0),
                   test_selected=domain_blocks(audit, names),
                   test_selected_round=int(run.audit.best_round or 0) if run.audit is not None else 0,
                   per_platform=[] if best is None else [domain_blocks(best, names, f"platform{k}/")
                                                         for k in range(len(algorithm.graphs))],
                   history=[curve_row(record, names) for record in run.history], wall_seconds=run.wall_seconds,
                   config=algorithm.config, train_config=algorithm.train_config,
                   models=[copy.deepcopy(net) for net in algorithm.networks(kept)], graphs=algorithm.graphs,
                   artifacts={"shared_optimizer": algorithm.shared_optimizer(run.state), "weights": algorithm.counts,
                              "model_bytes": algorithm.model_bytes, "active_platforms": algorithm.active})


# ----------------------------------------------------------------------------- pieces shared with the baselines
SCORES = METRICS + ("count",)


def _device(name: str) -> torch.device:
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but CUDA is not available; use device='cpu'")
    return dev


def platform_rows(split: SequenceSplit, weight_by: str):
    """``(train_rows, counts, active)``: each platform's training rows (sequences of length >= 2),
    its FedAvg weight ``N_k`` (training users, or rows with ``weight_by="sequences"``) and the
    platforms that have rows. Raises ``ValueError`` when no platform has one."""
    lengths = split.train.lengths()
    train_rows = [np.asarray(r, dtype=np.int64)[lengths[np.asarray(r, dtype=np.int64)] >= 2] for r in split.platforms]
    counts = [np.unique(split.train.users[r]).size if weight_by == "users" else r.size for r in train_rows]
    if sum(counts) == 0:
        raise ValueError("no platform has a training sequence of length >= 2")
    return train_rows, counts, [k for k in range(len(train_rows)) if train_rows[k].size]


@dataclass(frozen=True)
class PlatformPlan:
    """Round ``t``'s plan: the platforms that train (every platform with training rows, every round).

    The batch order, augmentation and sampled negatives are drawn during local training from the
    generator carried in the state (one stream across rounds, as the papers' code), not here.
    """

    platforms: Tuple[int, ...]


def generators_of(numpy_rng: Mapping[str, Any], torch_rng: torch.Tensor, cuda_rng: Optional[torch.Tensor],
                  device: torch.device) -> np.random.Generator:
    """Restore the run's generators from a state: torch's global CPU (and CUDA) generator, which
    draws the dropout masks, is set in place; the numpy generator (batch order, augmentation,
    sampled negatives) is returned."""
    rng = np.random.default_rng()
    rng.bit_generator.state = dict(numpy_rng)
    torch.set_rng_state(torch_rng.cpu())
    if device.type == "cuda" and cuda_rng is not None:
        torch.cuda.set_rng_state(cuda_rng.cpu(), device)
    return rng


def generator_states(rng: np.random.Generator, device: torch.device) -> Dict[str, Any]:
    """The states :func:`generators_of` restores: ``numpy_rng``, ``torch_rng``, ``cuda_rng``."""
    return {"numpy_rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def deep_clone(value):
    """A copy of nested dicts / lists / tuples whose tensors are cloned (an optimizer's state dict):
    loading it into an optimizer leaves the original's tensors untouched (``load_state_dict`` aliases them)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: deep_clone(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(deep_clone(v) for v in value)
    return value


def clone_tensors(state: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    return {n: v.detach().clone() for n, v in state.items()}


def flat_evaluation(evaluation: Mapping[str, Any], names, per_platform: bool = True) -> Dict[str, float]:
    """One :func:`evaluate_sequences` result as the trainer's flat metrics.

    ``<domain>/<metric>`` (and ``count``), ``platform<k>/<domain>/<metric>`` with ``per_platform``,
    and ``MRR``: the mean over domains of the (finite) MRRs, the selection metric.
    """
    out = {f"{d}/{m}": v for d in names for m, v in evaluation[d].items()}
    if per_platform:
        out.update({f"platform{k}/{d}/{m}": v for k, block in enumerate(evaluation["per_platform"])
                    for d in names for m, v in block[d].items()})
    finite = [evaluation[d]["MRR"] for d in names if np.isfinite(evaluation[d]["MRR"])]
    out["MRR"] = float(np.mean(finite)) if finite else float("nan")
    return out


def domain_blocks(metrics: Optional[Mapping[str, float]], names, prefix: str = "") -> Dict[str, Dict[str, float]]:
    """``{domain: {"valid/MRR", ..., "test/count"}}`` from the trainer's ``valid/<prefix><domain>/<metric>``
    (``{}`` when ``metrics`` is ``None``: no evaluation)."""
    if metrics is None:
        return {}
    return {d: {f"{role}/{m}": metrics[f"{role}/{prefix}{d}/{m}"] for role in ("valid", "test") for m in SCORES}
            for d in names}


def curve_row(record: Mapping[str, Any], names) -> Dict[str, Any]:
    """A trainer history record as the family's history row (the record's ``extra["curve"]``).

    ``round``, ``loss`` (the round's ``train_loss``), what the round logged in its order,
    ``<domain>/<role>/<metric>`` as floats, ``valid/MRR``, ``test/MRR`` and ``seconds``.
    """
    row: Dict[str, Any] = {"round": record["round"], "loss": record["train_loss"]}
    row.update({k: v for k, v in record.items() if k not in ("round", "train_loss", "seconds")
                and not k.startswith(("valid/", "test/"))})
    for d in names:
        row.update({f"{d}/{role}/{m}": float(record[f"{role}/{d}/{m}"]) for role in ("valid", "test")
                    for m in SCORES})
    row.update({"valid/MRR": record["valid/MRR"], "test/MRR": record["test/MRR"], "seconds": record["seconds"]})
    return row


def platform_schedule(rounds: int, patience: int) -> Schedule:
    """Evaluate valid and test after every round; select (and stop) on the mean validation MRR
    with the first best kept; also keep the round of the best mean **test** MRR (the audit of the
    code's rule); report the test numbers *at* the selected round (no test of the end state)."""
    return Schedule(rounds=rounds, eval_every=1, patience=patience, selection_metric="MRR",
                    test_every_evaluation=True, audit_metric="MRR", test_at_end=False, keep_best_state=True)


def round_callback(names, progress: Optional[Callable[[Dict[str, Any]], None]] = None,
                   verbose: bool = False) -> Callable:
    """The trainer's ``on_round_end``: stamps ``seconds`` (wall time since the previous round
    ended, or since this call) on the record and hands the history row to ``progress``."""
    clock = [time.perf_counter()]

    def on_round_end(run, record):
        now = time.perf_counter()
        record["seconds"], clock[0] = now - clock[0], now
        row = curve_row(record, names)
        if progress is not None:
            progress(row)
        if verbose:
            print(f"round {row['round']}: loss {row['loss']:.4f} valid/MRR {row['valid/MRR']:.4f} "
                  f"test/MRR {row['test/MRR']:.4f}")
    return on_round_end


# ----------------------------------------------------------------------------- FedCSR as an Algorithm
@dataclass
class FedCSRState:
    """Everything FedCSR's next round depends on.

    Attributes:
        models: state dicts: ``[w]``, the global model (federated), or one per platform
            (individual training).
        optimizers: Adam state dicts that outlive a round: ``[]`` (a fresh Adam per platform and
            round), ``[shared]`` (``shared_optimizer``) or one per platform (individual).
        numpy_rng: the numpy generator's state (batch order, augmentation, sampled negatives).
        torch_rng: torch's CPU generator state (dropout masks), (N,) uint8.
        cuda_rng: the CUDA generator's state on a CUDA device, else ``None``.
    """

    models: List[Dict[str, torch.Tensor]]
    optimizers: List[Dict[str, Any]]
    numpy_rng: Dict[str, Any]
    torch_rng: torch.Tensor
    cuda_rng: Optional[torch.Tensor] = None


class FedCSRAlgorithm:
    """FedCSR's round (module docstring) as an :class:`~fedlib.engine.algorithm.Algorithm`.

    ``individual=True``: every platform trains its own model alone (no aggregation, no
    communication). The modules are scratch space: every round loads its state into them.
    """

    def __init__(self, split: SequenceSplit, config: FedCSRConfig = FedCSRConfig(),
                 train_config: FedCSRTrainConfig = FedCSRTrainConfig(), *, individual: bool = False):
        tc = train_config
        if not isinstance(split, SequenceSplit):
            raise ValueError(f"split must be a SequenceSplit (e.g. fedlib.data.protocols.fedcsr), "
                             f"got {type(split).__name__}")
        if individual and (tc.shared_optimizer or tc.central_graph):
            raise ValueError("individual=True trains each platform alone: shared_optimizer and central_graph "
                             "(audit flags of the federated code) do not apply")
        K = len(split.platforms)
        if K == 0:
            raise ValueError("split.platforms is empty: FedCSR needs at least one platform")
        for role in ("valid", "test"):
            rows = split.extra.get(f"{role}_platforms")
            if rows is None or len(rows) != K:
                raise ValueError(f"split.extra['{role}_platforms'] must hold one row array per platform ({K}); "
                                 f"got {None if rows is None else len(rows)}")
        self.split, self.config, self.train_config, self.individual = split, config, tc, bool(individual)
        self.device = _device(tc.device)
        self.names = _domain_names(split)
        self.train_rows, self.counts, self.active = platform_rows(split, tc.weight_by)
        self.graphs = platform_graphs(split, central=tc.central_graph, binary=config.binary_graph)
        with torch.random.fork_rng(devices=[]):                  # scratch modules: their init draws nothing
            self._modules = [self._new_model() for _ in range(K if individual else 2)]  # (global, work) or per platform
        self.model_bytes = state_bytes(self._modules[0].state_dict())

    @property
    def method(self) -> str:
        return ("FedCSR-individual" if self.individual
                else ("FedCSR-central-graph" if self.train_config.central_graph else "FedCSR"))

    def _new_model(self) -> FedCSRModel:
        return FedCSRModel(self.split.num_items_a, self.split.num_items_b, self.config).to(self.device)

    def _new_adam(self, params) -> torch.optim.Optimizer:
        tc = self.train_config
        return adam(params, lr=tc.lr, betas=tuple(tc.betas), weight_decay=tc.weight_decay)

    # --- state -------------------------------------------------------------------------------
    def init(self, seed: int) -> FedCSRState:
        """``torch.manual_seed(seed)``, then one model: the global one, or every platform's (same init)."""
        torch.manual_seed(seed)
        rng = np.random.default_rng([seed, 4004])
        weights = clone_tensors(self._new_model().state_dict())
        if self.individual:
            models = [clone_tensors(weights) for _ in self._modules]
            optimizers = [self._new_adam(m.parameters()).state_dict() for m in self._modules]
        else:
            models = [weights]
            optimizers = [self._new_adam(self._modules[1].parameters()).state_dict()] \
                if self.train_config.shared_optimizer else []
        return FedCSRState(models=models, optimizers=optimizers, **generator_states(rng, self.device))

    def copy_state(self, state: FedCSRState) -> FedCSRState:
        """A new state sharing ``state``'s tensors: states are never written to after
        :meth:`run_round` returns them (it trains the scratch modules and fresh Adams loaded with
        clones), so the kept best state costs no copy of the K models and their Adam moments."""
        return dataclasses.replace(state, models=list(state.models), optimizers=list(state.optimizers))

    def state_dict(self, state: FedCSRState) -> Dict[str, Any]:
        return dataclass_to_dict(state)

    def load_state(self, saved: Mapping[str, Any]) -> FedCSRState:
        state = dataclass_from_dict(FedCSRState, saved)
        state.models = [{n: v.to(self.device) for n, v in m.items()} for m in state.models]
        return state

    # --- one round -----------------------------------------------------------------------------
    def plan_round(self, state: FedCSRState, context: RoundContext) -> PlatformPlan:
        return PlatformPlan(platforms=tuple(self.active))

    def run_round(self, state: FedCSRState, plan: PlatformPlan, context: RoundContext
                  ) -> Tuple[FedCSRState, RoundReport]:
        """Every platform: E local epochs from ``w^{t-1}`` (Eq. 18); then FedAvg (Eq. 19)."""
        tc, use_mcl = self.train_config, self.config.use_mcl
        rng = generators_of(state.numpy_rng, state.torch_rng, state.cuda_rng, self.device)
        losses, parts_acc, steps_total, uploads = {}, {}, 0, []
        if self.individual:
            optimizers = []
            for net, weights, saved in zip(self._modules, state.models, state.optimizers):
                net.load_state_dict(weights)
                optimizers.append(self._new_adam(net.parameters()))
                optimizers[-1].load_state_dict(deep_clone(saved))   # the state's tensors stay untouched
        else:
            global_model, work = self._modules
            global_model.load_state_dict(state.models[0])
            target = frozen_copy(global_model) if use_mcl else None          # MCL target: w^{t-1}, frozen
            shared = None
            if tc.shared_optimizer:
                shared = self._new_adam(work.parameters())
                shared.load_state_dict(deep_clone(state.optimizers[0]))
        for k in plan.platforms:
            if self.individual:
                net, opt = self._modules[k], optimizers[k]
                target = frozen_copy(net) if use_mcl else None
            else:
                work.load_state_dict(state.models[0])
                net, opt = work, (shared if shared is not None else self._new_adam(work.parameters()))
            net.set_graphs(self.graphs[k])
            if target is not None:
                target.set_graphs(self.graphs[k])
            loss, parts, steps = _local_epochs(net, opt, self.split, self.train_rows[k], target, tc, rng, self.device)
            losses[k], steps_total = loss, steps_total + steps
            for key, value in parts.items():
                parts_acc.setdefault(key, []).append((self.counts[k], value))
            if not self.individual:
                uploads.append(clone_tensors(work.state_dict()))
        if self.individual:
            models = [clone_tensors(m.state_dict()) for m in self._modules]
            optimizer_states = [o.state_dict() for o in optimizers]
        else:
            models = [fedavg(uploads, [self.counts[k] for k in plan.platforms])]          # Eq. 19
            optimizer_states = [shared.state_dict()] if shared is not None else []
        sent = 0 if self.individual else self.model_bytes * len(plan.platforms)   # every state-dict tensor, both ways
        w_active = np.asarray([self.counts[k] for k in plan.platforms], dtype=np.float64)
        logged: Dict[str, float] = {"local_steps": steps_total, "bytes_up": sent, "bytes_down": sent}
        logged.update({f"loss/{key}": float(np.average([v for _, v in vals], weights=[c for c, _ in vals]))
                       for key, vals in parts_acc.items()})
        logged.update({f"loss/platform{k}": losses[k] for k in plan.platforms})
        loss = float(np.average([losses[k] for k in plan.platforms], weights=w_active))
        new_state = FedCSRState(models=models, optimizers=optimizer_states, **generator_states(rng, self.device))
        return new_state, RoundReport(train_loss=loss, logged=logged)

    # --- evaluation ------------------------------------------------------------------------------
    def networks(self, state: FedCSRState) -> List[FedCSRModel]:
        """The modules holding ``state``'s models: ``[global]`` or one per platform (scratch, reloaded every round)."""
        nets = self._modules if self.individual else self._modules[:1]
        for net, weights in zip(nets, state.models):
            net.load_state_dict(weights)
        return list(nets)

    def evaluate(self, state: FedCSRState, split: str) -> Dict[str, float]:
        """Per-domain (and per-platform) metrics of ``split`` rows, each platform's with its own graph."""
        tc, nets = self.train_config, self.networks(state)
        evaluation = evaluate_sequences(nets[0], self.split, split, self.graphs, models=nets if self.individual else None,
                                        tie_rule=tc.tie_rule, batch_size=tc.eval_batch_size, device=self.device)
        return flat_evaluation(evaluation, self.names)

    def shared_optimizer(self, state: FedCSRState) -> Optional[torch.optim.Optimizer]:
        """The shared Adam (``shared_optimizer``) holding ``state``'s moments, else ``None``."""
        if self.individual or not self.train_config.shared_optimizer:
            return None
        shared = self._new_adam(self._modules[1].parameters())
        shared.load_state_dict(deep_clone(state.optimizers[0]))
        return shared


def _local_epochs(model: FedCSRModel, optimizer: torch.optim.Optimizer, split: SequenceSplit, rows: np.ndarray,
                  target: Optional[FedCSRModel], tc: FedCSRTrainConfig, rng: np.random.Generator,
                  device: torch.device):
    """``local_epochs`` shuffled passes of mini-batches over ``rows``; returns (mean loss, mean parts, steps)."""
    model.train()
    total, parts_sum, steps = 0.0, {}, 0
    for _ in range(tc.local_epochs):
        order = rows[rng.permutation(rows.size)]
        for start in range(0, order.size, tc.batch_size):
            batch = make_batch(split.train, split.num_items_a, split.num_items_b, model.config.maxlen,
                               rows=order[start:start + tc.batch_size]).to(device)
            loss, parts = fedcsr_loss(model, batch, global_model=target, rng=rng)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
            for key, value in parts.items():
                parts_sum[key] = parts_sum.get(key, 0.0) + float(value.detach())
            steps += 1
    steps_div = max(steps, 1)
    return total / steps_div, {k: v / steps_div for k, v in parts_sum.items()}, steps


# ----------------------------------------------------------------------------- entry points
def train_fedcsr(split: SequenceSplit, config: FedCSRConfig = FedCSRConfig(),
                 train_config: FedCSRTrainConfig = FedCSRTrainConfig(), *, individual: bool = False,
                 verbose: bool = False, progress: Optional[Callable[[Dict[str, float]], None]] = None,
                 checkpointer=None) -> FedCSRResult:
    """FedCSR (module docstring) trained by :func:`fedlib.engine.train`; ``individual=True`` trains each platform alone.

    ``progress`` is called with each round's history row (e.g. to advance a progress bar).
    ``checkpointer``: a :class:`~fedlib.engine.Checkpointer`. The trainer resumes from its
    checkpoint when there is one, and saves at the end of each round its schedule picks and when
    the run stops. The state holds the models, the Adam states that outlive a round (the shared
    Adam, the individual platforms' Adams) and the numpy and torch generator states, so a resumed
    run gives the numbers of an uninterrupted one.

    Raises:
        ValueError: no platform with training sequences, platform/valid/test platform counts
            that differ, CUDA asked for but absent, or ``individual`` with the audit flags.
    """
    tc = train_config
    algorithm = FedCSRAlgorithm(split, config, tc, individual=individual)
    run = train(algorithm, platform_schedule(tc.rounds, tc.patience), seed=tc.seed, checkpointer=checkpointer,
                checkpoint_config=_snapshot_config(config, tc, individual),
                on_round_end=round_callback(algorithm.names, progress, verbose))
    return FedCSRResult.from_run(run, algorithm)


def _snapshot_config(config: FedCSRConfig, tc: FedCSRTrainConfig, individual: bool) -> Dict[str, Any]:
    """What a checkpoint must have been made under to be resumed: every setting but ``rounds`` (which may grow).

    ``"loop": "trainer"`` refuses (with the differing key named) a snapshot of the round loop
    this module had before the trainer, whose layout differs.
    """
    train_settings = {k: v for k, v in dataclasses.asdict(tc).items() if k != "rounds"}
    return {"rounds": tc.rounds, "model": dataclasses.asdict(config), "train": train_settings,
            "individual": bool(individual), "loop": "trainer"}


def train_individual(split: SequenceSplit, config: FedCSRConfig = FedCSRConfig(),
                     train_config: FedCSRTrainConfig = FedCSRTrainConfig(), **kwargs) -> FedCSRResult:
    """Paper Figure 4 / Table 9: every platform trains alone; same as ``train_fedcsr(..., individual=True)``."""
    return train_fedcsr(split, config, train_config, individual=True, **kwargs)
