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
  the previous block's **best-validation** state (``next_block_from="best"``, the default).
  ``next_block_from="last"`` overwrites them with the previous block's *last-round* state
  instead (the round at which early stopping fired, else the final round), as the public
  code's FedMF engine does: its ``add_user_item`` appends rows to the engine's live tables,
  not to the restored best model (its FedMLP and PFedRec engines restore the best model
  first, i.e. ``"best"``). Testing block ``t−1``, the methods' memories (KD teacher, top-N
  lists) and F3CRec's anchor ``Q^{t−1}`` use the best-validation state either way.
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

Results: every block is one trainer run, so each block is the trainer's
:class:`~fedlib.engine.trainer.RunResult` (its ``method`` and the block's own fields in
``artifacts``, :data:`BLOCK_ARTIFACTS`); :class:`ContinualResult` is the protocol's record of
the sequence of them, with the accuracy matrix that needs every block.

A client loss that needs extra rows in every local batch (F3CRec's replay items, which are
not among the batch's positives/negatives) declares a
``prepare_round(plan, global_state, private_state)`` method; :class:`PlanAugmentingExecutor`
calls it before handing the (augmented) round plan to the engine's executor. See that class for why this is needed.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import pandas as pd
import torch

from fedlib.data.splits import BlockStream, InteractionSplit
from fedlib.device import default_device
from fedlib.engine import (AveragingState, BatchedExecutor, FederatedConfig, FederatedMethod, ParameterAveraging,
                           RankingEvaluator, RunResult, fedmf_method, fedncf_method, pfedrec_method, run_federated)
from fedlib.engine.plan import RoundPlan
from fedlib.engine.selection import Selection
from fedlib.metrics import paired_ttest
from fedlib.models import FedMF, FedNCF, PFedRec
from fedlib.models.base import FederatedModel

__all__ = [
    "Backbone", "fedmf_backbone", "fedncf_backbone", "pfedrec_backbone",
    "PreviousBlock", "BlockContext", "ContinualMethod", "FineTuning", "PlanAugmentingExecutor",
    "block_seed", "grow_state", "initial_block_state",
    "BLOCK_ARTIFACTS", "block_artifacts", "block_row", "ContinualResult", "BLOCK_FORMAT", "block_payload",
    "block_from_payload", "NEXT_BLOCK_FROM", "run_continual", "count_higher_scores", "student_ranks",
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
        start_global_state, start_private_state: the state block ``t`` grows its round-0
            state from (:func:`initial_block_state`); ``None`` (the default) means the
            best-validation state above. :func:`run_continual` with ``next_block_from="last"``
            sets them to block ``t−1``'s last-round state. Methods read ``global_state`` /
            ``private_state`` (the best state), never these.
    """

    index: int
    split: InteractionSplit
    model: FederatedModel
    global_state: Dict[str, torch.Tensor]
    private_state: Dict[str, torch.Tensor]
    memory: Dict[str, object] = field(default_factory=dict)
    start_global_state: Optional[Dict[str, torch.Tensor]] = None
    start_private_state: Optional[Dict[str, torch.Tensor]] = None

    @property
    def starting_state(self) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor]]:
        """``(global_state, private_state)`` the next block's round-0 state is grown from."""
        if (self.start_global_state is None) != (self.start_private_state is None):
            raise ValueError("set both start_global_state and start_private_state, or neither (the best state)")
        if self.start_global_state is None:
            return self.global_state, self.private_state
        return self.start_global_state, self.start_private_state

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
    previous block's starting state (:attr:`PreviousBlock.starting_state`: its best-validation
    state unless :func:`run_continual` was asked for the last-round one), with new users' and
    new items' rows drawn from the backbone's initialiser (a generator seeded by ``(seed, t)``).
    """
    device = torch.device(device) if device is not None else default_device()
    if ctx.previous is None:
        return ParameterAveraging(ctx.base_method, None, ctx.config, device=device).init(ctx.config.seed)
    dtype = getattr(torch, ctx.config.dtype)
    generator = _growth_generator(seed, ctx.index)
    fresh_global = ctx.model.init_global(generator, dtype=dtype, device=device)
    fresh_private = ctx.model.init_private(generator, dtype=dtype, device=device)
    start_global, start_private = ctx.previous.starting_state
    return AveragingState(global_state=grow_state(start_global, fresh_global),
                          private_state=grow_state(start_private, fresh_private))


# ======================================================================================
# Results: each block is the trainer's RunResult; the continual run is the sequence of them
# ======================================================================================
#: The keys :func:`run_continual` puts in every block's ``RunResult.artifacts``.
BLOCK_ARTIFACTS = ("block", "name", "num_users", "num_items", "test_users", "test_per_user", "seconds")


def block_artifacts(run: RunResult) -> Dict[str, Any]:
    """The block-specific fields of one block's run (``run.artifacts``), checked.

    ``block`` (``t``), ``name`` (the split's), ``num_users``/``num_items`` (the block's
    accumulated sizes), ``test_users`` (``(n,) int64``, the users with test items in the block),
    ``test_per_user`` (``metric -> (n,) float64`` aligned with ``test_users``, for paired
    t-tests), ``seconds`` (wall-clock time of training + evaluation, the accuracy-matrix row
    included). Raises ``ValueError`` naming the missing keys for a run that is not a block's.
    """
    missing = [key for key in BLOCK_ARTIFACTS if key not in run.artifacts]
    if missing:
        raise ValueError(f"run.artifacts lacks {missing}: pass the RunResult of one block of run_continual "
                         "(ContinualResult.blocks[t]) or of fedlib.papers.f3crec.experiment.base_block")
    return run.artifacts


def block_row(run: RunResult) -> Dict[str, Any]:
    """One block as a summary row: ``block`` (``"D<t>"``), sizes, selected and last round,
    seconds, ``valid/<metric>`` of the selected round and ``test/<metric>`` (``A[t][t]``)."""
    info = block_artifacts(run)
    row = {"block": f"D{info['block']}", "users": info["num_users"], "items": info["num_items"],
           "best_round": run.best_round, "rounds": run.round_index, "seconds": round(info["seconds"], 2)}
    row.update({f"valid/{k}": v for k, v in (run.best_metrics or {}).items()})
    row.update({f"test/{k}": v for k, v in (run.test_metrics or {}).items()})
    return row


@dataclass
class ContinualResult:
    """A whole continual run: the record of the continual protocol, one trainer run per block.

    This is not a view of one run but a sequence of them: the trainer returns one
    :class:`~fedlib.engine.trainer.RunResult` per trainer run (per block here), and the
    accuracy matrix ``A[t][s]`` needs every block's model, so it is kept beside them.

    Attributes:
        method, backbone: labels.
        blocks: one :class:`~fedlib.engine.trainer.RunResult` per trained block, in order:
            ``best_round``, ``round_index`` (rounds run), ``stopped_early``, ``best_metrics``
            (validation metrics of the selected round), ``test_metrics`` (``A[t][t]``),
            ``history``, ``selected_state`` (the best-validation :class:`AveragingState`, what
            the next block starts from by default), ``state`` (the last-round state, what it
            starts from with ``next_block_from="last"``), ``method`` (the continual method's
            name; ``"FT"`` for a shared base block) and the block's own fields in ``artifacts``
            (:data:`BLOCK_ARTIFACTS`, read with :func:`block_artifacts`).
        accuracy: ``metric -> (T, T)`` array, ``accuracy[m][t, s]`` = model after block ``t``
            on block ``s``'s test set (NaN for ``s > t``, and off the diagonal when the matrix
            was not requested).
    """

    method: str
    backbone: str
    blocks: List[RunResult]
    accuracy: Dict[str, np.ndarray]

    def per_block(self, metric: str = "NDCG@20") -> np.ndarray:
        """``(T,)`` ``A[t][t]`` of ``metric`` (what the paper's tables report per block)."""
        return np.array([b.test_metrics[metric] for b in self.blocks])

    def summary(self) -> pd.DataFrame:
        """One row per block (:func:`block_row`): sizes, selected round, validation and test metrics."""
        return pd.DataFrame([block_row(b) for b in self.blocks])

    def paired_ttest(self, other: "ContinualResult", block: int, metric: str = "NDCG@20"):
        """Paired t-test of this run against ``other`` on block ``block``'s test users."""
        a, b = block_artifacts(self.blocks[block]), block_artifacts(other.blocks[block])
        if not np.array_equal(a["test_users"], b["test_users"]):
            raise ValueError("the two runs evaluated different users on this block")
        return paired_ttest(a["test_per_user"][metric], b["test_per_user"][metric])


# ======================================================================================
# A block's run as plain values (F3CRec's block-0 cache)
# ======================================================================================
#: Tag of :func:`block_payload`'s layout; a payload with another tag is not read (retrain it).
BLOCK_FORMAT = "fedlib.continual.block-run/1"


def block_payload(run: RunResult) -> Dict[str, Any]:
    """One block's run as plain values and tensors, loadable with ``torch.load(weights_only=True)``.

    Holds what :func:`block_from_payload` needs to rebuild the same :class:`RunResult`: the
    trainer's run (last and selected state, history, selection, test metrics) plus ``method``,
    ``wall_seconds`` and the block's artifacts (numpy arrays stored as tensors), tagged
    :data:`BLOCK_FORMAT`.
    """
    info = block_artifacts(run)

    def state(value: Optional[AveragingState]):
        if value is None:
            return None
        return {"global_state": value.global_state, "private_state": value.private_state, "extra": value.extra}

    artifacts = {**{k: info[k] for k in BLOCK_ARTIFACTS},
                 "test_users": torch.from_numpy(np.asarray(info["test_users"])),
                 "test_per_user": {k: torch.from_numpy(np.asarray(v)) for k, v in info["test_per_user"].items()}}
    return {"format": BLOCK_FORMAT, "round_index": run.round_index, "state": state(run.state),
            "best_state": state(run.best_state), "history": run.history, "selection": run.selection.state_dict(),
            "audit": None if run.audit is None else run.audit.state_dict(), "test_metrics": run.test_metrics,
            "stopped_early": run.stopped_early, "wall_seconds": run.wall_seconds, "method": run.method,
            "artifacts": artifacts}


def _selection_from(saved: Optional[Dict[str, Any]]) -> Optional[Selection]:
    if saved is None:
        return None
    selection = Selection(saved["metric"], saved["patience"], saved["prefer_later_ties"])
    selection.load_state_dict(saved)
    return selection


def block_from_payload(payload: Dict[str, Any], device=None) -> RunResult:
    """The :class:`RunResult` that :func:`block_payload` stored, its tensors on ``device``.

    Raises ``ValueError`` for a payload of another layout (not tagged :data:`BLOCK_FORMAT`).
    """
    if not isinstance(payload, dict) or payload.get("format") != BLOCK_FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(f"not a block run of layout {BLOCK_FORMAT!r} (found {found!r}); train the block again")

    def state(saved):
        if saved is None:
            return None
        here = lambda tensors: {k: v.to(device) for k, v in tensors.items()}  # noqa: E731
        return AveragingState(here(saved["global_state"]), here(saved["private_state"]), dict(saved["extra"]))

    saved_artifacts = payload["artifacts"]
    artifacts = {**saved_artifacts, "test_users": saved_artifacts["test_users"].numpy(),
                 "test_per_user": {k: v.numpy() for k, v in saved_artifacts["test_per_user"].items()}}
    return RunResult(state=state(payload["state"]), selection=_selection_from(payload["selection"]),
                     round_index=int(payload["round_index"]), history=list(payload["history"]),
                     audit=_selection_from(payload["audit"]), best_state=state(payload["best_state"]),
                     test_metrics=payload["test_metrics"], stopped_early=bool(payload["stopped_early"]),
                     wall_seconds=float(payload["wall_seconds"]), method=payload["method"], artifacts=artifacts)


# ======================================================================================
# The block loop
# ======================================================================================
def _block_config(config: FederatedConfig, seed: int, block_index: int) -> FederatedConfig:
    return dataclasses.replace(config, seed=block_seed(seed, block_index))


def _evaluator(split: InteractionSplit, ks) -> RankingEvaluator:
    # Valid masks the block's train items, test its train + valid items (RankingEvaluator's
    # rule); items of earlier blocks are never masked.
    return RankingEvaluator(split.train, split.valid, split.test, ks=ks)


#: What block ``t+1`` grows its round-0 state from (:func:`run_continual`'s ``next_block_from``):
#: block ``t``'s best-validation state (fedlib's default) or its last-round state (the public
#: code's FedMF engine).
NEXT_BLOCK_FROM = ("best", "last")


def run_continual(
    stream: BlockStream,
    backbone: Backbone,
    method: ContinualMethod,
    config: FederatedConfig,
    *,
    executor=None,
    base_config: Optional[FederatedConfig] = None,
    base: Optional[RunResult] = None,
    num_blocks: Optional[int] = None,
    accuracy_matrix: bool = True,
    ks=(20,),
    device=None,
    on_block_start: Optional[Callable[[BlockContext, AveragingState], None]] = None,
    on_round_end: Optional[Callable[[RunResult, dict], None]] = None,
    next_block_from: str = "best",
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
        base: block 0's :class:`~fedlib.engine.trainer.RunResult` from an earlier run with the
            same backbone, stream and seed (``ContinualResult.blocks[0]``): block 0 is not
            retrained (every method here trains block 0 as plain FT, so the base model can be
            shared across methods); it becomes ``blocks[0]`` of the result as it is.
        num_blocks: train only the first blocks (default all).
        accuracy_matrix: also evaluate each block's model on every earlier block's test set.
        ks: metric cutoffs (F3CRec: 20).
        device: where states live (default :func:`fedlib.default_device`).
        on_block_start: ``callback(ctx, initial_state)`` before a block is trained.
        on_round_end: passed to :func:`~fedlib.engine.run_federated` (progress bars).
        next_block_from: ``"best"`` (default): block ``t+1`` grows its round-0 state from block
            ``t``'s best-validation state. ``"last"``: from block ``t``'s last-round state
            (``RunResult.state``: the round at which early stopping fired, else the final
            round; for a shared ``base``, the last state it stored), as the public code's
            FedMF engine does. Either way block ``t`` is tested on its best-validation
            state, and ``method.after_block`` (KD teacher, top-N lists) and
            ``PreviousBlock.global_state`` (F3CRec's anchor ``Q^{t}``, Reg's target) are
            the best-validation state: only the next block's starting point moves.

    Returns:
        :class:`ContinualResult`: each block's trainer ``RunResult`` (``method`` set, the
        block's fields in ``artifacts``, :data:`BLOCK_ARTIFACTS`) and the accuracy matrix.
    """
    if next_block_from not in NEXT_BLOCK_FROM:
        raise ValueError(f"next_block_from must be one of {NEXT_BLOCK_FROM} (block t's best-validation or "
                         f"last-round state), got {next_block_from!r}")
    device = torch.device(device) if device is not None else default_device()
    wrapped = PlanAugmentingExecutor(executor if executor is not None else BatchedExecutor())
    total = len(stream) if num_blocks is None else min(int(num_blocks), len(stream))
    label = getattr(method, "name", type(method).__name__)
    metric_names = None
    accuracy: Dict[str, np.ndarray] = {}
    results: List[RunResult] = []
    previous: Optional[PreviousBlock] = None

    for t in range(total):
        split = stream[t]
        model = backbone.make_model(split.num_users, split.num_items)
        block_config = _block_config(base_config if (t == 0 and base_config is not None) else config, config.seed, t)
        ctx = BlockContext(index=t, split=split, model=model, base_method=backbone.make_method(model),
                           config=block_config, previous=previous)
        started = time.perf_counter()
        if t == 0 and base is not None:
            shared = block_artifacts(base)
            if (shared["num_users"], shared["num_items"]) != (split.num_users, split.num_items):
                raise ValueError(f"base was trained on a block 0 of {shared['num_users']} users and "
                                 f"{shared['num_items']} items, this stream's has {split.num_users} and "
                                 f"{split.num_items}: pass the base block of this stream")
            run = base
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
            run.method = label
            run.artifacts = {"block": t, "name": split.name, "num_users": split.num_users,
                             "num_items": split.num_items, "test_users": np.asarray(users),
                             "test_per_user": {k: v.cpu().numpy() for k, v in per_user.items()}, "seconds": 0.0}
        selected = run.selected_state

        # A[t][s] for every s ≤ t (row t of the accuracy matrix).
        if metric_names is None:
            metric_names = list(run.test_metrics)
            accuracy = {m: np.full((total, total), np.nan) for m in metric_names}
        for m in metric_names:
            accuracy[m][t, t] = run.test_metrics[m]
        if accuracy_matrix:
            for s in range(t):
                past = _evaluator(stream[s], ks)(scoring_model, selected.global_state, selected.private_state, "test")
                for m in metric_names:
                    accuracy[m][t, s] = past[m]
        if run is not base:
            run.artifacts["seconds"] = time.perf_counter() - started
        results.append(run)

        if t + 1 < total:
            # The memory and the anchor always come from the selected (best) state; only the
            # next block's starting tables may be the last round's.
            memory = method.after_block(ctx, selected.global_state, selected.private_state)
            # RunResult.state is the state after the last round run (best_state is a copy of an
            # earlier one), so "last" needs no extra copy: both are kept in results anyway.
            start = run.state if next_block_from == "last" else selected
            previous = PreviousBlock(index=t, split=split, model=model, global_state=selected.global_state,
                                     private_state=selected.private_state, memory=dict(memory or {}),
                                     start_global_state=start.global_state,
                                     start_private_state=start.private_state)

    return ContinualResult(method=label, backbone=backbone.name, blocks=results, accuracy=accuracy)


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
    chunk = max(1, budget // max(1, query.shape[1] * num_items))  # clients per (c, N, I) comparison
    if scores.device.type == "cpu" and scores.dtype == query.dtype and scores.dtype in (torch.float32, torch.float64):
        # The same comparison in numpy: its broadcast compare and int32 count run ~2.5x faster
        # than torch's (c, N, I) compare and int64 bool sum on the CPU (F3CRec's Eq. 2 runs this
        # every local step: ~12 % of a FedMF F3CRec round on ML-100K). Counts are exact integers.
        scores_np, query_np = scores.detach().numpy(), query.detach().numpy()
        counts = np.empty(query.shape, dtype=np.int32 if num_items < 2**31 else np.int64)
        for start in range(0, num_clients, chunk):
            s, q = scores_np[start:start + chunk], query_np[start:start + chunk]
            (s[:, None, :] > q[:, :, None]).sum(-1, dtype=counts.dtype, out=counts[start:start + chunk])
        return torch.from_numpy(counts.astype(np.int64, copy=False))
    return _count_higher_scores_torch(scores, query, chunk)


def _count_higher_scores_torch(scores: torch.Tensor, query: torch.Tensor, chunk: int) -> torch.Tensor:
    """:func:`count_higher_scores`'s ``"compare"`` in torch, ``chunk`` clients at a time: ``(C, N) int64``.

    The path for tensors numpy cannot hold (GPU, half precision) and the reference of the
    numpy path in the tests.
    """
    parts = []
    for start in range(0, scores.shape[0], chunk):
        s, q = scores[start:start + chunk], query[start:start + chunk]
        parts.append((s[:, None, :] > q[:, :, None]).sum(-1))  # (c, N, I) -> (c, N)
    return torch.cat(parts, 0) if parts else query.new_zeros(query.shape, dtype=torch.int64)


def student_ranks(scores: torch.Tensor, query: torch.Tensor, strategy: str = "compare") -> torch.Tensor:
    """1-based ranks ``r_u^{t,r}(i_k)`` of the queried items (F3CRec's memory) among all items: ``(C, N) int64``."""
    return 1 + count_higher_scores(scores, query, strategy)
