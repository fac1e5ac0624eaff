"""The federated round loop (the papers' Algorithm 1).

::

    for each round t:
        plan   ← sample clients, their negatives and batch order     (seeded by (seed, t))
        send the global state θ to the sampled clients               (ledger: download)
        each client c: local SGD on its own copy → upload Δ_c + ε_c  (executor; ε_c = optional noise)
                                                                     (ledger: upload)
        θ      ← θ + Σ_c w_c (Δ_c + ε_c)                            (aggregation)
        θ      ← server_mix(θ_previous, θ)                           (optional hook)
        every k rounds: evaluate on validation, keep the best, stop after `patience`

All randomness of round ``t`` comes from :func:`~fedlib.engine.plan.round_generator`
``(seed, t)``, and the initial state from a generator seeded by ``seed``: nothing touches
torch's or numpy's global random state, and a run resumed from a checkpoint redraws
exactly the rounds it would have drawn.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

from fedlib.data.sampling import NegativeSampler
from fedlib.device import default_device
from fedlib.data.splits import Pairs
from fedlib.engine.communication import CommunicationLedger
from fedlib.engine.executors import BatchedExecutor
from fedlib.engine.method import FederatedMethod
from fedlib.engine.plan import make_round_plan, round_generator
from fedlib.engine.uploads import record_round_communication

__all__ = ["FederatedConfig", "TrainState", "init_train_state", "run_federated"]


@dataclass(frozen=True)
class FederatedConfig:
    """Everything that defines a run besides the method and the data.

    Attributes:
        rounds: communication rounds (upper bound with early stopping).
        seed: the only source of randomness (init and every round plan).
        num_negatives, batch_size, local_epochs: local training (F3CRec: 4, 512, 1).
        clients_per_round: users sampled per round; ``None`` = every user with training
            data (F3CRec, FedRKG).
        eval_every: evaluate on validation every k rounds (and after the last round).
        patience: stop after this many evaluations without improvement (``None`` = never).
        selection_metric: validation metric to maximise (e.g. ``"NDCG@20"``).
        prefer_later_ties: on equal validation scores keep the later round (FedRKG's ``>=``)
            instead of the first (F3CRec).
        test_at_end: evaluate the selected state on the test set when the run ends.
        dtype: ``"float32"`` or ``"float64"``.
    """

    rounds: int
    seed: int = 0
    num_negatives: int = 4
    batch_size: int = 512
    local_epochs: int = 1
    clients_per_round: Optional[int] = None
    eval_every: int = 1
    patience: Optional[int] = None
    selection_metric: str = "NDCG@20"
    prefer_later_ties: bool = False
    test_at_end: bool = True
    dtype: str = "float32"


@dataclass
class TrainState:
    """Everything needed to continue a run exactly (what a checkpoint stores).

    ``round_index`` is the number of completed rounds (the next round to run).
    ``history`` has one dict per completed round (``round``, ``train_loss``, and
    ``valid/<metric>`` when evaluated). ``extra`` holds method-specific server state.
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


def _init_generator(seed: int) -> torch.Generator:
    # A stream separate from the round plans: SeedSequence([seed, -1 as uint32]).
    entropy = np.random.SeedSequence([int(seed), 2**32 - 1]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(entropy[0]) << 32 | int(entropy[1]))


def init_train_state(method: FederatedMethod, config: FederatedConfig, device=None) -> TrainState:
    """Round-0 state: the model's initialisers drawn from a generator seeded by ``config.seed``.

    ``device`` defaults to :func:`fedlib.default_device` (CUDA when present). The numbers are
    drawn on the CPU, so the initial state is the same on every device.
    """
    device = torch.device(device) if device is not None else default_device()
    dtype = getattr(torch, config.dtype)
    generator = _init_generator(config.seed)
    global_state = method.model.init_global(generator, dtype=dtype, device=device)
    private_state = method.model.init_private(generator, dtype=dtype, device=device)
    return TrainState(round_index=0, global_state=global_state, private_state=private_state)


def _clone(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in state.items()}


def _select(state: TrainState, metrics: Dict[str, float], config: FederatedConfig, keep_best_state: bool) -> None:
    """Best-on-validation bookkeeping and patience."""
    if config.selection_metric not in metrics:
        raise ValueError(f"selection_metric {config.selection_metric!r} is not among the evaluated metrics {sorted(metrics)}")
    score = metrics[config.selection_metric]
    better = state.best_score is None or score > state.best_score or (config.prefer_later_ties and score == state.best_score)
    if better:
        state.best_round, state.best_score, state.best_metrics = state.round_index, score, dict(metrics)
        state.evals_since_best = 0
        if keep_best_state:
            state.best_global_state = _clone(state.global_state)
            state.best_private_state = _clone(state.private_state)
    else:
        state.evals_since_best += 1
        if config.patience is not None and state.evals_since_best >= config.patience:
            state.stopped_early = True


def _end_of_round(state: TrainState, result, model, evaluator, config: FederatedConfig, keep_best_state: bool) -> dict:
    """Log the round, evaluate on validation when scheduled, update best/patience."""
    losses = result.client_losses
    record = {"round": state.round_index, "train_loss": float(losses.mean()) if losses.numel() else float("nan")}
    if evaluator is not None and (state.round_index % config.eval_every == 0 or state.round_index == config.rounds):
        metrics = evaluator(model, state.global_state, state.private_state, "valid")
        record.update({f"valid/{k}": v for k, v in metrics.items()})
        _select(state, metrics, config, keep_best_state)
    state.history.append(record)
    return record


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
    """Train ``method`` federatedly on ``train`` for ``config.rounds`` rounds.

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
        on_round_end: ``callback(state, record)`` after each round (progress bars, logging).
        ledger: a :class:`~fedlib.engine.communication.CommunicationLedger` to charge every
            round's messages to: each sampled client downloads the public tensors in full and
            uploads full tables or touched rows + indices (``method.upload_mode``) plus the
            public dense tensors (see :func:`~fedlib.engine.uploads.record_round_communication`).
            Only rounds run by this call are recorded (not those restored from a checkpoint).

    Returns:
        The final :class:`TrainState` (``best_*`` and ``test_metrics`` filled when evaluating).
    """
    model = method.model
    executor = executor if executor is not None else BatchedExecutor()
    sampler = sampler if sampler is not None else NegativeSampler(train, model.num_items)
    device = torch.device(device) if device is not None else default_device()
    if state is None and checkpointer is not None:
        state = checkpointer.load(config, device=device)
    if state is None:
        state = init_train_state(method, config, device=device)

    plan_options = dict(num_negatives=config.num_negatives, batch_size=config.batch_size,
                        local_epochs=config.local_epochs, clients_per_round=config.clients_per_round)
    while state.round_index < config.rounds and not state.stopped_early:
        t = state.round_index
        if method.before_round is not None:
            method.before_round(state, t)
        rng = round_generator(config.seed, t)
        plan = make_round_plan(train, sampler, rng, round_index=t, **plan_options)       # 1. sample clients, negatives, batches
        weights = method.aggregation.client_weights(plan.num_examples)
        if ledger is not None:
            record_round_communication(ledger, method, state.global_state, plan)       #    bytes sent both ways
        # Noise of client u in round t: a function of (seed, t, u) only (not of the plan's draws).
        noise = {"noise_seed": config.seed} if method.adds_upload_noise or method.adds_gradient_noise else {}
        result = executor.local_updates(                                                  # 2.-4. send, local update, upload
            method, state.global_state, state.private_state, plan, weights, **noise)
        new_global = method.aggregation.apply(state.global_state, result.update)         # 5. aggregate
        if method.server_mix is not None:
            new_global = method.server_mix(state.global_state, new_global, t)            #    mix with earlier global state
        state.global_state, state.round_index = new_global, t + 1
        record = _end_of_round(state, result, model, evaluator, config, keep_best_state)  # 6. evaluate on schedule
        if on_round_end is not None:
            on_round_end(state, record)
        if checkpointer is not None:
            checkpointer.maybe_save(state, config)

    if evaluator is not None and config.test_at_end and state.test_metrics is None:
        use_best = keep_best_state and state.best_global_state is not None
        g = state.best_global_state if use_best else state.global_state
        p = state.best_private_state if use_best else state.private_state
        state.test_metrics = evaluator(model, g, p, "test")
        if checkpointer is not None:
            checkpointer.save(state, config)
    return state


def config_dict(config: FederatedConfig) -> dict:
    """Plain-dict form of a config (for checkpoints and result caches)."""
    return asdict(config)
