"""Parameter averaging (FedAvg and its kin), the algorithm behind 14 methods of the course.

::

    for each round t:
        plan   ← sample clients, their negatives and batch order     (seeded by (seed, t))
        send the global state θ to the sampled clients               (ledger: download)
        each client c: local SGD on its own copy → upload Δ_c + ε_c  (executor; ε_c = optional noise)
                                                                     (ledger: upload)
        θ      ← θ + Σ_c w_c (Δ_c + ε_c)                            (aggregation)
        θ      ← server_mix(θ_previous, θ)                           (optional hook)
        every k rounds: evaluate on validation, keep the best, stop after `patience`

:class:`ParameterAveraging` is one :class:`~fedlib.engine.algorithm.Algorithm`; the rounds are
run by the one trainer, :func:`~fedlib.engine.trainer.train`. :func:`run_federated` builds the
algorithm from a :class:`~fedlib.engine.method.FederatedMethod` and trains it, returning the
family's :class:`TrainState` (a flat view of the trainer's result that the method hooks and
the experiments read).

All randomness of round ``t`` comes from :func:`~fedlib.engine.plan.round_generator`
``(seed, t)``, and the initial state from a generator seeded by ``seed``: nothing touches
torch's or numpy's global random state, and a run resumed from a checkpoint redraws
exactly the rounds it would have drawn.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from fedlib.data.sampling import NegativeSampler
from fedlib.device import default_device
from fedlib.data.splits import Pairs
from fedlib.engine.algorithm import RoundContext, RoundReport
from fedlib.engine.communication import CommunicationLedger
from fedlib.engine.executors import BatchedExecutor
from fedlib.engine.method import FederatedMethod
from fedlib.engine.plan import RoundPlan, make_round_plan
from fedlib.engine.selection import Selection
from fedlib.engine.trainer import RunResult, Schedule
from fedlib.engine.trainer import train as train_rounds
from fedlib.engine.uploads import record_round_communication

__all__ = ["FederatedConfig", "AveragingState", "ParameterAveraging", "TrainState", "init_train_state",
           "run_federated"]



@dataclass(frozen=True)
class FederatedConfig:
    """Everything that defines a parameter-averaging run besides the method and the data.

    Attributes:
        rounds: communication rounds (upper bound with early stopping).
        seed: the only source of randomness (init and every round plan).
        num_negatives, batch_size, local_epochs: local training (F3CRec: 4, 512, 1).
        clients_per_round: users sampled per round; ``None`` = every user with training
            data (F3CRec, FedRKG).
        eval_every, patience, selection_metric, prefer_later_ties, test_at_end: the trainer's
            :class:`~fedlib.engine.trainer.Schedule` (defaults written there, once).
        dtype: ``"float32"`` or ``"float64"``.
    """

    rounds: int
    seed: int = 0
    num_negatives: int = 4
    batch_size: int = 512
    local_epochs: int = 1
    clients_per_round: Optional[int] = None
    eval_every: int = Schedule.eval_every
    patience: Optional[int] = Schedule.patience
    selection_metric: str = Schedule.selection_metric
    prefer_later_ties: bool = Schedule.prefer_later_ties
    test_at_end: bool = Schedule.test_at_end
    dtype: str = "float32"

    def schedule(self, keep_best_state: bool = Schedule.keep_best_state) -> Schedule:
        """The trainer's schedule of this configuration."""
        return Schedule(rounds=self.rounds, eval_every=self.eval_every, patience=self.patience,
                        selection_metric=self.selection_metric, prefer_later_ties=self.prefer_later_ties,
                        test_at_end=self.test_at_end, keep_best_state=keep_best_state)


@dataclass
class AveragingState:
    """The server state of parameter averaging.

    Attributes:
        global_state: ``name -> tensor`` of every public parameter (what clients download).
        private_state: ``name -> tensor`` of every private parameter, all clients stacked
            (e.g. ``user_emb (U, d)``): what each client keeps to itself, held by the simulation.
        extra: method-specific server state (FedRKG's gates, GPFedRec's graph, logs), plain
            values and tensors. :meth:`ParameterAveraging.copy_state` shares it, not copies it.
    """

    global_state: Dict[str, torch.Tensor]
    private_state: Dict[str, torch.Tensor]
    extra: Dict[str, object] = field(default_factory=dict)


def _init_generator(seed: int) -> torch.Generator:
    # A stream separate from the round plans: SeedSequence([seed, -1 as uint32]).
    entropy = np.random.SeedSequence([int(seed), 2**32 - 1]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(entropy[0]) << 32 | int(entropy[1]))


def _clone(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in state.items()}


class ParameterAveraging:
    """A :class:`~fedlib.engine.method.FederatedMethod` as an :class:`~fedlib.engine.algorithm.Algorithm`.

    Args:
        method: the model and its local loss, optimiser, aggregation and hooks.
        train: the training pairs (every client's positives); ``None`` for an algorithm that
            only initialises states.
        config: local training (negatives, batch size, epochs, clients per round) and dtype.
        executor: :class:`~fedlib.engine.executors.BatchedExecutor` (default) or
            :class:`~fedlib.engine.executors.SequentialExecutor`; both give the same numbers.
        sampler: training negative sampler (default: excludes only ``train``).
        evaluator: ``evaluator(model, global_state, private_state, which) -> {metric: value}``.
        device: where the state lives (default :func:`fedlib.default_device`).
    """

    def __init__(self, method: FederatedMethod, train: Optional[Pairs], config: FederatedConfig, *, executor=None,
                 sampler: Optional[NegativeSampler] = None, evaluator: Optional[Callable] = None, device=None):
        self.method, self.train, self.config, self.evaluator = method, train, config, evaluator
        self.executor = executor if executor is not None else BatchedExecutor()
        if sampler is None and train is not None:
            sampler = NegativeSampler(train, method.model.num_items)
        self.sampler = sampler
        self.device = torch.device(device) if device is not None else default_device()

    # --- state ---------------------------------------------------------------------------
    def init(self, seed: int) -> AveragingState:
        """The model's initialisers, drawn on the CPU from a generator seeded by ``seed`` (same on every device)."""
        dtype, generator = getattr(torch, self.config.dtype), _init_generator(seed)
        model = self.method.model
        return AveragingState(global_state=model.init_global(generator, dtype=dtype, device=self.device),
                              private_state=model.init_private(generator, dtype=dtype, device=self.device))

    def copy_state(self, state: AveragingState) -> AveragingState:
        return AveragingState(_clone(state.global_state), _clone(state.private_state), state.extra)

    def state_dict(self, state: AveragingState) -> Dict[str, Any]:
        return {"global_state": state.global_state, "private_state": state.private_state, "extra": state.extra}

    def load_state(self, saved: Mapping[str, Any]) -> AveragingState:
        def here(tensors):
            return {k: v.to(self.device) for k, v in tensors.items()}
        return AveragingState(here(saved["global_state"]), here(saved["private_state"]), dict(saved["extra"]))

    # --- one round -------------------------------------------------------------------------
    def before_round(self, run: RunResult, round_index: int) -> None:
        """The method's ``before_round`` hook (FedRKG's guidance, GPFedRec's graph, RLP2's memory)."""
        if self.method.before_round is not None:
            self.method.before_round(TrainState.view(run), round_index)

    def plan_round(self, state: AveragingState, context: RoundContext) -> RoundPlan:
        """Sample the round's clients, their negatives and batch order from ``context.rng``."""
        config = self.config
        return make_round_plan(self.train, self.sampler, context.rng, round_index=context.index,
                               num_negatives=config.num_negatives, batch_size=config.batch_size,
                               local_epochs=config.local_epochs, clients_per_round=config.clients_per_round)

    def run_round(self, state: AveragingState, plan: RoundPlan, context: RoundContext
                  ) -> Tuple[AveragingState, RoundReport]:
        """Send θ, local updates, upload Δ_c (+ ε_c), θ ← θ + Σ_c w_c (Δ_c + ε_c), optional server mix."""
        method = self.method
        weights = method.aggregation.client_weights(plan.num_examples)
        if context.ledger is not None:
            record_round_communication(context.ledger, method, state.global_state, plan)   # bytes both ways
        # Noise of client u in round t: a function of (seed, t, u) only (not of the plan's draws).
        noise = {"noise_seed": context.seed} if method.adds_upload_noise or method.adds_gradient_noise else {}
        result = self.executor.local_updates(                                                # local updates
            method, state.global_state, state.private_state, plan, weights, **noise)
        new_global = method.aggregation.apply(state.global_state, result.update)            # aggregate
        if method.server_mix is not None:
            new_global = method.server_mix(state.global_state, new_global, context.index)    # mix with earlier θ
        losses = result.client_losses
        loss = float(losses.mean()) if losses.numel() else float("nan")
        return AveragingState(new_global, state.private_state, state.extra), RoundReport(train_loss=loss)

    def evaluate(self, state: AveragingState, split: str) -> Dict[str, float]:
        return self.evaluator(self.method.model, state.global_state, state.private_state, split)


@dataclass
class TrainState:
    """A parameter-averaging run as one flat record: the state and the trainer's bookkeeping.

    What :func:`run_federated` returns and accepts as ``state=``, and what method hooks
    (``before_round``) and ``on_round_end`` callbacks receive: the fields of the trainer's
    :class:`~fedlib.engine.trainer.RunResult` and of its :class:`AveragingState`, side by side.
    ``round_index`` is the number of completed rounds; ``history`` has one dict per completed
    round (``round``, ``train_loss``, and ``valid/<metric>`` when evaluated); ``best_metrics``
    the validation metrics of the selected round, without the ``valid/`` prefix.
    """

    round_index: int
    global_state: Dict[str, torch.Tensor]
    private_state: Dict[str, torch.Tensor]
    history: List[dict] = field(default_factory=list)
    best_round: Optional[int] = None
    best_score: Optional[float] = None
    best_metrics: Optional[Dict[str, float]] = None
    best_global_state: Optional[Dict[str, torch.Tensor]] = None
    best_private_state: Optional[Dict[str, torch.Tensor]] = None
    evals_since_best: int = 0
    stopped_early: bool = False
    test_metrics: Optional[Dict[str, float]] = None
    extra: Dict[str, object] = field(default_factory=dict)

    @classmethod
    def from_run(cls, run: RunResult) -> "TrainState":
        """The flat record of a finished (or paused) run."""
        best = run.best_state
        return cls(round_index=run.round_index, global_state=run.state.global_state,
                   private_state=run.state.private_state, history=run.history, best_round=run.best_round,
                   best_score=run.best_score, best_metrics=run.best_metrics,
                   best_global_state=None if best is None else best.global_state,
                   best_private_state=None if best is None else best.private_state,
                   evals_since_best=run.selection.evals_since_best, stopped_early=run.stopped_early,
                   test_metrics=run.test_metrics, extra=run.state.extra)

    @classmethod
    def from_snapshot(cls, saved: Mapping[str, Any]) -> "TrainState":
        """The flat record of a trainer checkpoint of :class:`ParameterAveraging` (``Checkpointer.load``)."""
        best = saved["best_state"]
        run = RunResult(state=AveragingState(**saved["state"]), selection=Selection(**saved["selection"]),
                        round_index=int(saved["round_index"]), history=list(saved["history"]),
                        best_state=None if best is None else AveragingState(**best),
                        test_metrics=saved["test_metrics"], stopped_early=bool(saved["stopped_early"]))
        return cls.from_run(run)

    def to_run(self, schedule: Schedule) -> RunResult:
        """The trainer's result that continues this record under ``schedule``."""
        selection = Selection(f"valid/{schedule.selection_metric}", schedule.patience, schedule.prefer_later_ties,
                              best_round=self.best_round, best_score=self.best_score,
                              best_metrics=None if self.best_metrics is None
                              else {f"valid/{k}": v for k, v in self.best_metrics.items()},
                              evals_since_best=self.evals_since_best)
        best = (None if self.best_global_state is None
                else AveragingState(self.best_global_state, self.best_private_state, self.extra))
        return RunResult(state=AveragingState(self.global_state, self.private_state, self.extra),
                         selection=selection, round_index=self.round_index, history=self.history, best_state=best,
                         test_metrics=self.test_metrics, stopped_early=self.stopped_early)

    @staticmethod
    def view(run: RunResult) -> "_RunView":
        """A live view of ``run`` under this record's field names (reads and writes go to ``run``)."""
        return _RunView(run)


class _RunView:
    """:class:`TrainState`'s field names over a live :class:`RunResult` (for hooks and callbacks)."""

    __slots__ = ("_run",)

    def __init__(self, run: RunResult):
        object.__setattr__(self, "_run", run)

    round_index = property(lambda self: self._run.round_index)
    history = property(lambda self: self._run.history)
    best_round = property(lambda self: self._run.best_round)
    best_score = property(lambda self: self._run.best_score)
    best_metrics = property(lambda self: self._run.best_metrics)
    evals_since_best = property(lambda self: self._run.selection.evals_since_best)
    test_metrics = property(lambda self: self._run.test_metrics)
    best_global_state = property(lambda self: None if self._run.best_state is None else self._run.best_state.global_state)
    best_private_state = property(lambda self: None if self._run.best_state is None else self._run.best_state.private_state)

    @property
    def global_state(self):
        return self._run.state.global_state

    @global_state.setter
    def global_state(self, value):
        self._run.state.global_state = value

    @property
    def private_state(self):
        return self._run.state.private_state

    @private_state.setter
    def private_state(self, value):
        self._run.state.private_state = value

    @property
    def extra(self):
        return self._run.state.extra

    @property
    def stopped_early(self):
        return self._run.stopped_early

    @stopped_early.setter
    def stopped_early(self, value):
        self._run.stopped_early = bool(value)


def init_train_state(method: FederatedMethod, config: FederatedConfig, device=None) -> TrainState:
    """Round-0 state: the model's initialisers drawn from a generator seeded by ``config.seed``.

    ``device`` defaults to :func:`fedlib.default_device` (CUDA when present). The numbers are
    drawn on the CPU, so the initial state is the same on every device.
    """
    state = ParameterAveraging(method, None, config, device=device).init(config.seed)
    return TrainState(round_index=0, global_state=state.global_state, private_state=state.private_state)


def run_federated(
    method: FederatedMethod,
    train: Pairs,
    config: FederatedConfig,
    *,
    executor=None,
    sampler: Optional[NegativeSampler] = None,
    evaluator: Optional[Callable] = None,
    state: Optional[TrainState] = None,
    checkpointer=None,
    device=None,
    keep_best_state: bool = True,
    on_round_end: Optional[Callable[[TrainState, dict], None]] = None,
    ledger: Optional[CommunicationLedger] = None,
) -> TrainState:
    """Train ``method`` federatedly on ``train`` for ``config.rounds`` rounds with the trainer.

    Args:
        executor: :class:`~fedlib.engine.executors.BatchedExecutor` (default) or
            :class:`~fedlib.engine.executors.SequentialExecutor`.
        sampler: training negative sampler (default: excludes only ``train``).
        evaluator: ``evaluator(model, global_state, private_state, which) -> {metric: value}``,
            e.g. :class:`~fedlib.engine.evaluation.RankingEvaluator`; ``None`` = no evaluation.
        state: continue from this state (else resume from ``checkpointer`` or start fresh).
        checkpointer: :class:`~fedlib.engine.checkpoint.Checkpointer` saving every N rounds.
        device: where a fresh state is created (default :func:`fedlib.default_device`).
        keep_best_state: keep a copy of the best-on-validation state (restored for the test).
        on_round_end: ``callback(state, record)`` after each round (progress bars, logging);
            ``state`` is a live :class:`TrainState` view of the run.
        ledger: a :class:`~fedlib.engine.communication.CommunicationLedger` to charge every
            round's messages to: each sampled client downloads the public tensors in full and
            uploads full tables or touched rows + indices (``method.upload_mode``) plus the
            public dense tensors (see :func:`~fedlib.engine.uploads.record_round_communication`).
            Only rounds run by this call are recorded (not those restored from a checkpoint).

    Returns:
        The final :class:`TrainState` (``best_*`` and ``test_metrics`` filled when evaluating).
    """
    algorithm = ParameterAveraging(method, train, config, executor=executor, sampler=sampler, evaluator=evaluator,
                                   device=device)
    schedule = config.schedule(keep_best_state=keep_best_state)
    callback = None if on_round_end is None else (lambda run, record: on_round_end(TrainState.view(run), record))
    run = train_rounds(algorithm, schedule, seed=config.seed, start=None if state is None else state.to_run(schedule),
                    checkpointer=checkpointer, checkpoint_config=config_dict(config), ledger=ledger,
                    on_round_end=callback, evaluate=evaluator is not None)
    return TrainState.from_run(run)


def config_dict(config: FederatedConfig) -> dict:
    """Plain-dict form of a config (for checkpoints and result caches)."""
    return asdict(config)
