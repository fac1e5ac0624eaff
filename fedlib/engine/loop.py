"""Parameter averaging (FedAvg and its kin), the algorithm behind 14 methods of the course.

::

    for each round t:
        plan   ← sample clients, their negatives and batch order     (seeded by (seed, t))
        send the global state θ to the sampled clients               (ledger: download)
        each client c: local SGD on its own copy → upload Δ_c + ε_c  (executor; ε_c = optional noise)
                                                                     (ledger: upload)
        θ      ← θ + Σ_c w_c (Δ_c + ε_c)                            (aggregation)
        θ      ← server_optimizer(θ_previous, θ)                     (optional: Adam on −Δ̄)
        θ      ← server_mix(θ_previous, θ)                           (optional hook)
        every k rounds: evaluate on validation, keep the best, stop after `patience`

:class:`ParameterAveraging` is one :class:`~fedlib.engine.algorithm.Algorithm`; the rounds are
run by the one trainer, :func:`~fedlib.engine.trainer.train`. :func:`run_federated` builds the
algorithm from a :class:`~fedlib.engine.method.FederatedMethod` and trains it, returning the
trainer's :class:`~fedlib.engine.trainer.RunResult` of :class:`AveragingState` (the run's
state is ``run.state.global_state`` / ``run.state.private_state``, the selected one
``run.selected_state``). Method hooks (``before_round``) and ``on_round_end`` callbacks
receive that same run, live.

All randomness of round ``t`` comes from :func:`~fedlib.engine.plan.round_generator`
``(seed, t)``, and the initial state from a generator seeded by ``seed``: nothing touches
torch's or numpy's global random state, and a run resumed from a checkpoint redraws
exactly the rounds it would have drawn.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

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
from fedlib.engine.trainer import RunResult, Schedule, start_run
from fedlib.engine.trainer import train as train_rounds
from fedlib.engine.uploads import record_round_communication

__all__ = ["FederatedConfig", "AveragingState", "ParameterAveraging", "run_federated", "SERVER_OPTIMIZER_KEY"]

# Where AveragingState.extra keeps the server optimiser's moments (saved with every checkpoint).
SERVER_OPTIMIZER_KEY = "server_optimizer"



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
    def before_round(self, run: RunResult, round_index: int, plan: RoundPlan) -> None:
        """The method's ``before_round`` hook (FedRKG's guidance, GPFedRec's graph, RLP2's memory)."""
        if self.method.before_round is not None:
            self.method.before_round(run, round_index, plan)

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
        extra = state.extra
        if method.server_optimizer is not None:                                               # server Adam on −Δ̄
            rates = {name: method.lr(name, context.index) for name in new_global}
            new_global, moments = method.server_optimizer.step(
                state.global_state, new_global, state.extra.get(SERVER_OPTIMIZER_KEY), rates)
            extra = {**state.extra, SERVER_OPTIMIZER_KEY: moments}       # a new dict: copies keep their own
        if method.server_mix is not None:
            new_global = method.server_mix(state.global_state, new_global, context.index)    # mix with earlier θ
        losses = result.client_losses
        loss = float(losses.mean()) if losses.numel() else float("nan")
        return AveragingState(new_global, state.private_state, extra), RoundReport(train_loss=loss)

    def evaluate(self, state: AveragingState, split: str) -> Dict[str, float]:
        return self.evaluator(self.method.model, state.global_state, state.private_state, split)


def run_federated(
    method: FederatedMethod,
    train: Pairs,
    config: FederatedConfig,
    *,
    executor=None,
    sampler: Optional[NegativeSampler] = None,
    evaluator: Optional[Callable] = None,
    state: Union[AveragingState, RunResult, None] = None,
    checkpointer=None,
    device=None,
    keep_best_state: bool = True,
    on_round_end: Optional[Callable[[RunResult, dict], None]] = None,
    ledger: Optional[CommunicationLedger] = None,
) -> RunResult:
    """Train ``method`` federatedly on ``train`` for ``config.rounds`` rounds with the trainer.

    Args:
        executor: :class:`~fedlib.engine.executors.BatchedExecutor` (default) or
            :class:`~fedlib.engine.executors.SequentialExecutor`.
        sampler: training negative sampler (default: excludes only ``train``).
        evaluator: ``evaluator(model, global_state, private_state, which) -> {metric: value}``,
            e.g. :class:`~fedlib.engine.evaluation.RankingEvaluator`; ``None`` = no evaluation.
        state: where to start. An :class:`AveragingState` (e.g. ``ParameterAveraging(...).init(seed)``
            with a table replaced, or a continual block's grown state) starts at round 0 with
            empty bookkeeping; a :class:`~fedlib.engine.trainer.RunResult` returned earlier is
            continued (its rounds, history and selection carry on, and it is updated in place).
            ``None``: resume from ``checkpointer`` when it holds a checkpoint, else start fresh.
        checkpointer: :class:`~fedlib.engine.checkpoint.Checkpointer` saving every N rounds.
        device: where a fresh state is created (default :func:`fedlib.default_device`).
        keep_best_state: keep a copy of the best-on-validation state (restored for the test).
        on_round_end: ``callback(run, record)`` after each round (progress bars, logging);
            ``run`` is the live :class:`~fedlib.engine.trainer.RunResult`.
        ledger: a :class:`~fedlib.engine.communication.CommunicationLedger` to charge every
            round's messages to: each sampled client downloads the public tensors in full and
            uploads full tables or touched rows + indices (``method.upload_mode``) plus the
            public dense tensors (see :func:`~fedlib.engine.uploads.record_round_communication`).
            Only rounds run by this call are recorded (not those restored from a checkpoint).

    Returns:
        The trainer's :class:`~fedlib.engine.trainer.RunResult` of :class:`AveragingState`:
        ``state`` after the last round, and when evaluating ``best_state`` (the selected
        state, ``keep_best_state``), ``best_round``, ``best_metrics`` and ``test_metrics``.
    """
    algorithm = ParameterAveraging(method, train, config, executor=executor, sampler=sampler, evaluator=evaluator,
                                   device=device)
    schedule = config.schedule(keep_best_state=keep_best_state)
    if isinstance(state, AveragingState):
        start = start_run(algorithm, schedule, config.seed, state=state)
    elif state is None or isinstance(state, RunResult):
        start = state
    else:
        raise TypeError(f"state must be an AveragingState (start from it at round 0) or a RunResult (continue it), "
                        f"got {type(state).__name__}")
    return train_rounds(algorithm, schedule, seed=config.seed, start=start, checkpointer=checkpointer,
                        checkpoint_config=config_dict(config), ledger=ledger, on_round_end=on_round_end,
                        evaluate=evaluator is not None)


def config_dict(config: FederatedConfig) -> dict:
    """Plain-dict form of a config (for checkpoints and result caches)."""
    return asdict(config)
