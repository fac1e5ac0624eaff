r"""Continual federated training: one federated run per data block, state carried between blocks.

Reference:
    Lim, Kweon, Kim, Kim, Choi, Kim, Yu. "Federated Continual Recommendation." CIKM 2025
    (F3CRec), https://arxiv.org/abs/2508.04792, §3 (the FCRec task) and §5.1 (protocol);
    the protocol details the paper leaves open (server step, block loop, model selection)
    follow the authors' public code, https://github.com/Jaehyung-Lim/F3CRec-CIKM-25
    (``fcrec/main.py``, ``fcrec/utils/``).

The task (F3CRec §3.1–3.2). Data arrive as chronological blocks ``D0 .. DT``
(:class:`~fedlib.data.splits.BlockStream`). Block ``t`` is trained federatedly, starting
from the state reached after block ``t−1``; nobody may look at older blocks' interactions::

    for t = 0 .. T:
        model_t   ← backbone sized (|U^t|, |I^t|)            accumulated users/items of D0..Dt
        θ_t       ← θ_{t−1} with appended rows               new users/items: the backbone's init
        method_t  ← continual method (FT, F3CRec, Reg, ...) given what block t−1 left behind
        run_federated(method_t, D_t.train)                    every block user, every round;
                                                              best round on valid N@20, patience
        A[t][s]   ← test metrics of the best state on D_s.test, s ≤ t
        memory    ← method.after_block(...)                   e.g. top-N lists for the next block

Protocol choices (the public code's ``fcrec/main.py``):

* **Growth.** Ids are assigned by first appearance in time, so the users/items of blocks
  ``0..t−1`` are exactly the first rows of block ``t``'s tables. A new block's state is a
  fresh initialisation of the larger model (the backbone's own initialiser: FedMF
  ``N(0, 0.01²)``, FedNCF/PFedRec items ``N(0, 1)``) whose leading rows are overwritten by
  the previous block's **best-validation** state.
* **Participation.** ``clients_per_round=None``: every user with training data in the block
  trains in every round.
* **Negatives.** Uniform over the block's accumulated items, excluding only the user's
  current-block training positives (the engine's default sampler on ``D_t.train``).
* **Selection.** Validation N@20 after every round, first best kept (``prefer_later_ties``
  False), early stop after ``patience`` evaluations without improvement, best state restored.
* **Evaluation.** Full ranking over all ``|I^t|`` items; test masks the evaluated block's own
  train + valid items only: items of earlier blocks stay candidates (a user may consume them
  again). ``A[t][s]`` evaluates the block-``t`` model on block ``s``'s test set with block
  ``s``'s mask; the paper reports ``A[t][t]``.

Methods plug in through :class:`ContinualMethod`: ``make_method`` turns the backbone's plain
:class:`~fedlib.engine.FederatedMethod` into the method of block ``t`` (a different client
loss, a ``server_mix`` hook) and ``after_block`` stores what the next block needs. Fine-tuning
(FT) is the base class itself; F3CRec, its ablations and the KD/Reg baselines live in
:mod:`fedlib.papers.f3crec.method`. The ranks of a few items among all items
(:func:`student_ranks`), which F3CRec's Eq. 2 and SPP's ranking discrepancy both read, are here.

A client loss that needs extra rows in every local batch (F3CRec's replay items, which are
not among the batch's positives/negatives) declares a
``prepare_round(plan, global_state, private_state)`` method; :class:`PlanAugmentingExecutor`
calls it before handing the (augmented) round plan to the engine's executor. See that class for why this is needed.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np
import pandas as pd
import torch

from fedlib.data.splits import BlockStream, InteractionSplit
from fedlib.device import default_device
from fedlib.engine import (AveragingState, BatchedExecutor, FederatedConfig, FederatedMethod, ParameterAveraging,
                           RankingEvaluator, RunResult, fedmf_method, fedncf_method, pfedrec_method, run_federated)
from fedlib.engine.plan import RoundPlan
from fedlib.metrics import paired_ttest
from fedlib.models import FedMF, FedNCF, PFedRec
from fedlib.models.base import FederatedModel

__all__ = [
    "Backbone", "fedmf_backbone", "fedncf_backbone", "pfedrec_backbone",
    "PreviousBlock", "BlockContext", "ContinualMethod", "FineTuning", "PlanAugmentingExecutor",
    "block_seed", "grow_state", "initial_block_state",
    "BlockResult", "ContinualResult", "run_continual", "count_higher_scores", "student_ranks",
]

#: SeedSequence stream tags, so block seeds and growth initialisers never share numbers.
_BLOCK_SEED_STREAM = 0xB10C
_GROWTH_STREAM = 0x6E0


# ======================================================================================
# Backbones: a model factory (the sizes change every block) and its learning-rate scheme
# ======================================================================================
@dataclass(frozen=True)
class Backbone:
    """How to build the backbone of a block.

    Attributes:
        name: label (``"FedMF"``, ...).
        make_model: ``(num_users, num_items) -> FederatedModel`` for the block's accumulated sizes.
        make_method: ``model -> FederatedMethod``: the plain federated method (learning rates,
            update steps, aggregation) that continual methods then modify.
    """

    name: str
    make_model: Callable[[int, int], FederatedModel]
    make_method: Callable[[FederatedModel], FederatedMethod]


def fedmf_backbone(dim: int = 32, lr: float = 1.0, **method_kwargs) -> Backbone:
    """FedMF (public code): private ``p_u``, public item table, rows ``N(0, 0.01²)``; lr ``{0.1, 0.5, 1}``."""
    return Backbone("FedMF", lambda u, i: FedMF(u, i, dim=dim),
                    lambda model: fedmf_method(model, lr=lr, **method_kwargs))


def fedncf_backbone(dim: int = 32, lr: float = 0.05, lr_eta: float = 170.0, **method_kwargs) -> Backbone:
    """F3CRec's "fedmlp": private ``p_u`` and ``Linear(2d → 1)`` head, public item table ``N(0, 1)``."""
    return Backbone("FedNCF", lambda u, i: FedNCF.f3crec_variant(u, i, dim=dim),
                    lambda model: fedncf_method(model, lr=lr, lr_eta=lr_eta, **method_kwargs))


def pfedrec_backbone(dim: int = 32, lr: float = 0.1, lr_eta: float = 170.0, **method_kwargs) -> Backbone:
    """PFedRec: private head, public item table ``N(0, 1)``, two steps per batch; F3CRec uses ``lr_eta`` 170."""
    return Backbone("PFedRec", lambda u, i: PFedRec(u, i, dim=dim),
                    lambda model: pfedrec_method(model, lr=lr, lr_eta=lr_eta, **method_kwargs))


# ======================================================================================
# What a continual method sees
# ======================================================================================
@dataclass
class PreviousBlock:
    """What block ``t−1`` left behind for block ``t``.

    Attributes:
        index: ``t − 1``.
        split: block ``t−1``'s data (only its sizes may be used by methods: the FCRec
            constraint forbids revisiting old interactions).
        model: the backbone sized for block ``t−1``.
        global_state: the **best-validation** public state of block ``t−1`` (``Q^{t−1}``).
        private_state: the best-validation private state of every user of block ``t−1``
            (in a real deployment each user keeps only their own row).
        memory: whatever the method's :meth:`ContinualMethod.after_block` returned.
    """

    index: int
    split: InteractionSplit
    model: FederatedModel
    global_state: Dict[str, torch.Tensor]
    private_state: Dict[str, torch.Tensor]
    memory: Dict[str, object] = field(default_factory=dict)

    @property
    def num_users(self) -> int:
        return self.model.num_users

    @property
    def num_items(self) -> int:
        return self.model.num_items


@dataclass
class BlockContext:
    """Everything a continual method may use to set up block ``index``.

    Attributes:
        index: the block ``t``.
        split: block ``t``'s data (train/valid/test pairs, accumulated sizes).
        model: the backbone sized ``(split.num_users, split.num_items)``.
        base_method: the backbone's plain federated method for ``model``.
        config: the block's run configuration (its own derived ``seed``).
        previous: block ``t−1``'s legacy, ``None`` for block 0.
    """

    index: int
    split: InteractionSplit
    model: FederatedModel
    base_method: FederatedMethod
    config: FederatedConfig
    previous: Optional[PreviousBlock] = None


class ContinualMethod:
    """A continual-learning method as two hooks; the base class is fine-tuning (FT).

    FT (F3CRec §5.1): start every block from the previous block's state and train on the
    new block with the plain backbone, with no term that protects old knowledge.
    """

    name: str = "FT"

    def make_method(self, ctx: BlockContext) -> FederatedMethod:
        """The federated method of block ``ctx.index`` (default: the plain backbone method)."""
        return ctx.base_method

    def after_block(self, ctx: BlockContext, global_state, private_state) -> Dict[str, object]:
        """What the next block needs, computed from this block's best-validation state."""
        return {}


class FineTuning(ContinualMethod):
    """FT: the backbone trained block after block, nothing else."""

    name = "FT"


# ======================================================================================
# Executor wrapper: client losses that add rows to the round plan
# ======================================================================================
class PlanAugmentingExecutor:
    """Wraps an engine executor for client losses that need extra rows in their batches.

    Why: both engine executors give ``client_loss`` only the item rows of the current local
    batch (the batched executor gathers exactly those rows per client), so a loss term on
    other items, e.g. F3CRec's distillation on the previous block's top-N items, can neither
    read their *local* values nor send gradients into them. A loss object that defines
    ``prepare_round(plan, global_state, private_state) -> RoundPlan`` may add such rows to every
    local step of the plan as extra examples (marked by negative labels its own loss recognises), and
    ``finish_round()`` to release what it kept for the round. The inner executor then treats
    them as ordinary touched rows: local copies, gradients, uploads, in both executors alike.

    Losses without ``prepare_round`` run unchanged.
    """

    def __init__(self, inner=None):
        self.inner = inner if inner is not None else BatchedExecutor()
        self.name = f"{self.inner.name}+plan"

    def local_updates(self, method: FederatedMethod, global_state, private_state, plan: RoundPlan, weights, **kwargs):
        prepare = getattr(method.client_loss, "prepare_round", None)
        if prepare is None:
            return self.inner.local_updates(method, global_state, private_state, plan, weights, **kwargs)
        augmented = prepare(plan, global_state, private_state)
        try:
            return self.inner.local_updates(method, global_state, private_state, augmented, weights, **kwargs)
        finally:
            method.client_loss.finish_round()


# ======================================================================================
# Growing the state between blocks
# ======================================================================================
def block_seed(seed: int, block_index: int) -> int:
    """The seed of block ``block_index``'s federated run: a pure function of ``(seed, block)``."""
    words = np.random.SeedSequence([int(seed), int(block_index), _BLOCK_SEED_STREAM]).generate_state(2, dtype=np.uint32)
    return int(words[0] & 0x7FFFFFFF) << 32 | int(words[1])


def _growth_generator(seed: int, block_index: int) -> torch.Generator:
    words = np.random.SeedSequence([int(seed), int(block_index), _GROWTH_STREAM]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(words[0] & 0x7FFFFFFF) << 32 | int(words[1]))


def grow_state(old: Dict[str, torch.Tensor], fresh: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """``fresh`` with its leading block replaced by ``old``, tensor by tensor.

    Works for every parameter kind because ids only ever grow at the end: item tables
    ``(I', d) -> (I, d)``, user tables ``(U', ...) -> (U, ...)``, personal tables
    ``(U', I', d) -> (U, I, d)``; tensors of equal shape (shared MLPs) are simply kept.
    """
    out = {}
    for name, new in fresh.items():
        previous = old[name].to(device=new.device, dtype=new.dtype)
        if previous.dim() != new.dim() or any(p > n for p, n in zip(previous.shape, new.shape)):
            raise ValueError(f"{name}: cannot grow {tuple(previous.shape)} into {tuple(new.shape)}")
        grown = new.clone()
        grown[tuple(slice(0, s) for s in previous.shape)] = previous
        out[name] = grown
    return out


def initial_block_state(ctx: BlockContext, seed: int, device=None) -> AveragingState:
    """Round-0 state of block ``ctx.index``.

    Block 0: the backbone's initialisation (seeded by the block's config). Block ``t ≥ 1``: the
    previous block's best-validation state, with new users' and new items' rows drawn from the
    backbone's initialiser (a generator seeded by ``(seed, t)``).
    """
    device = torch.device(device) if device is not None else default_device()
    if ctx.previous is None:
        return ParameterAveraging(ctx.base_method, None, ctx.config, device=device).init(ctx.config.seed)
    dtype = getattr(torch, ctx.config.dtype)
    generator = _growth_generator(seed, ctx.index)
    fresh_global = ctx.model.init_global(generator, dtype=dtype, device=device)
    fresh_private = ctx.model.init_private(generator, dtype=dtype, device=device)
    return AveragingState(global_state=grow_state(ctx.previous.global_state, fresh_global),
                          private_state=grow_state(ctx.previous.private_state, fresh_private))


# ======================================================================================
# Results
# ======================================================================================
@dataclass
class BlockResult:
    """One block of a continual run.

    Attributes:
        index, name: block ``t`` and the split's name.
        num_users, num_items: accumulated sizes of the block.
        best_round: selected round (number of completed rounds at selection).
        rounds_run, stopped_early: how the run ended.
        valid_metrics: validation metrics of the selected round.
        test_metrics: ``A[t][t]``: the selected state on this block's test set.
        test_users: ``(n,) int64`` evaluated users (those with test items in the block).
        test_per_user: ``metric -> (n,) float64`` aligned with ``test_users`` (paired t-tests).
        history: per-round records of :func:`~fedlib.engine.run_federated`.
        global_state, private_state: the best-validation state (what the next block starts from).
        seconds: wall-clock time of training + evaluation.
    """

    index: int
    name: str
    num_users: int
    num_items: int
    best_round: Optional[int]
    rounds_run: int
    stopped_early: bool
    valid_metrics: Dict[str, float]
    test_metrics: Dict[str, float]
    test_users: np.ndarray
    test_per_user: Dict[str, np.ndarray]
    history: List[dict]
    global_state: Dict[str, torch.Tensor]
    private_state: Dict[str, torch.Tensor]
    seconds: float = 0.0


@dataclass
class ContinualResult:
    """A whole continual run.

    Attributes:
        method, backbone: labels.
        blocks: one :class:`BlockResult` per trained block.
        accuracy: ``metric -> (T, T)`` array, ``accuracy[m][t, s]`` = model after block ``t``
            on block ``s``'s test set (NaN for ``s > t``, and off the diagonal when the matrix
            was not requested).
    """

    method: str
    backbone: str
    blocks: List[BlockResult]
    accuracy: Dict[str, np.ndarray]

    def per_block(self, metric: str = "NDCG@20") -> np.ndarray:
        """``(T,)`` ``A[t][t]`` of ``metric`` (what the paper's tables report per block)."""
        return np.array([b.test_metrics[metric] for b in self.blocks])

    def summary(self) -> pd.DataFrame:
        """One row per block: sizes, selected round, validation and test metrics."""
        rows = []
        for b in self.blocks:
            row = {"block": f"D{b.index}", "users": b.num_users, "items": b.num_items, "best_round": b.best_round,
                   "rounds": b.rounds_run, "seconds": round(b.seconds, 2)}
            row.update({f"valid/{k}": v for k, v in b.valid_metrics.items()})
            row.update({f"test/{k}": v for k, v in b.test_metrics.items()})
            rows.append(row)
        return pd.DataFrame(rows)

    def paired_ttest(self, other: "ContinualResult", block: int, metric: str = "NDCG@20"):
        """Paired t-test of this run against ``other`` on block ``block``'s test users."""
        a, b = self.blocks[block], other.blocks[block]
        if not np.array_equal(a.test_users, b.test_users):
            raise ValueError("the two runs evaluated different users on this block")
        return paired_ttest(a.test_per_user[metric], b.test_per_user[metric])


# ======================================================================================
# The block loop
# ======================================================================================
def _block_config(config: FederatedConfig, seed: int, block_index: int) -> FederatedConfig:
    return dataclasses.replace(config, seed=block_seed(seed, block_index))


def _evaluator(split: InteractionSplit, ks) -> RankingEvaluator:
    # Valid masks the block's train items, test its train + valid items (RankingEvaluator's
    # rule); items of earlier blocks are never masked.
    return RankingEvaluator(split.train, split.valid, split.test, ks=ks)


def _detach_state(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in state.items()}


def run_continual(
    stream: BlockStream,
    backbone: Backbone,
    method: ContinualMethod,
    config: FederatedConfig,
    *,
    executor=None,
    base_config: Optional[FederatedConfig] = None,
    base: Optional[BlockResult] = None,
    num_blocks: Optional[int] = None,
    accuracy_matrix: bool = True,
    ks=(20,),
    device=None,
    on_block_start: Optional[Callable[[BlockContext, AveragingState], None]] = None,
    on_round_end: Optional[Callable[[RunResult, dict], None]] = None,
) -> ContinualResult:
    """Train ``method`` on ``backbone`` block after block (see the module docstring).

    Args:
        stream: the blocks ``D0 .. DT``.
        config: run configuration of every block (``rounds``, ``patience``, ``batch_size`` ...;
            ``clients_per_round=None`` for F3CRec's all-users participation). Its ``seed`` is
            the seed of the whole run: block ``t`` uses :func:`block_seed` ``(seed, t)``.
        executor: an engine executor (default :class:`~fedlib.engine.BatchedExecutor`); it is
            wrapped in :class:`PlanAugmentingExecutor`.
        base_config: configuration of block 0 only (default ``config``).
        base: a block-0 :class:`BlockResult` from an earlier run with the same backbone,
            stream and seed: block 0 is not retrained (every method here trains block 0 as
            plain FT, so the base model can be shared across methods).
        num_blocks: train only the first blocks (default all).
        accuracy_matrix: also evaluate each block's model on every earlier block's test set.
        ks: metric cutoffs (F3CRec: 20).
        device: where states live (default :func:`fedlib.default_device`).
        on_block_start: ``callback(ctx, initial_state)`` before a block is trained.
        on_round_end: passed to :func:`~fedlib.engine.run_federated` (progress bars).

    Returns:
        :class:`ContinualResult`.
    """
    device = torch.device(device) if device is not None else default_device()
    wrapped = PlanAugmentingExecutor(executor if executor is not None else BatchedExecutor())
    total = len(stream) if num_blocks is None else min(int(num_blocks), len(stream))
    metric_names = None
    accuracy: Dict[str, np.ndarray] = {}
    results: List[BlockResult] = []
    previous: Optional[PreviousBlock] = None

    for t in range(total):
        split = stream[t]
        model = backbone.make_model(split.num_users, split.num_items)
        block_config = _block_config(base_config if (t == 0 and base_config is not None) else config, config.seed, t)
        ctx = BlockContext(index=t, split=split, model=model, base_method=backbone.make_method(model),
                           config=block_config, previous=previous)
        started = time.perf_counter()
        if t == 0 and base is not None:
            if (base.num_users, base.num_items) != (split.num_users, split.num_items):
                raise ValueError("base was trained on a different block 0")
            result = base
            scoring_model = model
        else:
            block_method = method.make_method(ctx)
            scoring_model = block_method.model
            state = initial_block_state(ctx, config.seed, device=device)
            if on_block_start is not None:
                on_block_start(ctx, state)
            evaluator = _evaluator(split, ks)
            run = run_federated(block_method, split.train, block_config, executor=wrapped, evaluator=evaluator,
                                state=state, device=device, on_round_end=on_round_end)
            selected = run.selected_state
            # The method's model scores: a method may wrap the backbone (RLP2's error compensation).
            users, per_user = evaluator.per_user(block_method.model, selected.global_state, selected.private_state,
                                                 "test")
            result = BlockResult(
                index=t, name=split.name, num_users=split.num_users, num_items=split.num_items,
                best_round=run.best_round, rounds_run=run.round_index, stopped_early=run.stopped_early,
                valid_metrics=dict(run.best_metrics or {}), test_metrics=dict(run.test_metrics or {}),
                test_users=np.asarray(users), test_per_user={k: v.cpu().numpy() for k, v in per_user.items()},
                history=list(run.history), global_state=_detach_state(selected.global_state),
                private_state=_detach_state(selected.private_state),
            )

        # A[t][s] for every s ≤ t (row t of the accuracy matrix).
        if metric_names is None:
            metric_names = list(result.test_metrics)
            accuracy = {m: np.full((total, total), np.nan) for m in metric_names}
        for m in metric_names:
            accuracy[m][t, t] = result.test_metrics[m]
        if accuracy_matrix:
            for s in range(t):
                past = _evaluator(stream[s], ks)(scoring_model, result.global_state, result.private_state, "test")
                for m in metric_names:
                    accuracy[m][t, s] = past[m]
        if result is not base:
            result.seconds = time.perf_counter() - started
        results.append(result)

        if t + 1 < total:
            memory = method.after_block(ctx, result.global_state, result.private_state)
            previous = PreviousBlock(index=t, split=split, model=model, global_state=result.global_state,
                                     private_state=result.private_state, memory=dict(memory or {}))

    return ContinualResult(method=getattr(method, "name", type(method).__name__), backbone=backbone.name,
                           blocks=results, accuracy=accuracy)


# ======================================================================================
# Ranks of a few items among all items (F3CRec's Eq. 2, SPP's ranking discrepancy)
# ======================================================================================
def count_higher_scores(scores: torch.Tensor, query: torch.Tensor, strategy: str = "compare",
                        budget: int = 1 << 24) -> torch.Tensor:
    """``out[c, k] = #{j : scores[c, j] > query[c, k]}``: the ranks of a few items, no argsort.

    Args:
        scores: ``(C, I)`` every item's score for each client.
        query: ``(C, N)`` the scores whose rank is wanted.
        strategy: ``"compare"``: one ``(C, N, I)`` comparison, ``O(C·N·I)`` work, processed in
            client chunks of at most ``budget`` booleans; ``"sort"``: sort each row once
            (``O(C·I log I)``) and binary-search the ``N`` queries (``O(C·N log I)``), cheaper
            when ``N`` exceeds ``log I`` by a lot. Both give identical counts.

    Returns:
        ``(C, N) int64``. Ties count as not higher (a tied item is ranked after the query).
    """
    if strategy == "sort":
        ascending = torch.sort(scores, dim=1).values
        return scores.shape[1] - torch.searchsorted(ascending, query.contiguous(), right=True)
    if strategy != "compare":
        raise ValueError(f"strategy must be 'compare' or 'sort', got {strategy!r}")
    num_clients, num_items = scores.shape
    per_client = max(1, query.shape[1] * num_items)
    chunk = max(1, budget // per_client)
    parts = []
    for start in range(0, num_clients, chunk):
        s, q = scores[start:start + chunk], query[start:start + chunk]
        parts.append((s[:, None, :] > q[:, :, None]).sum(-1))  # (c, N, I) -> (c, N)
    return torch.cat(parts, 0) if parts else query.new_zeros(query.shape, dtype=torch.int64)


def student_ranks(scores: torch.Tensor, query: torch.Tensor, strategy: str = "compare") -> torch.Tensor:
    """1-based ranks ``r_u^{t,r}(i_k)`` of the queried items (F3CRec's memory) among all items: ``(C, N) int64``."""
    return 1 + count_higher_scores(scores, query, strategy)
