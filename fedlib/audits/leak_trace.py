"""The FedRKG test-leak audit attached to a federated run: the round-by-round trace.

:mod:`fedlib.metrics.leak_audit` measures the leak (negative coverage, test-item ranks) from
plans and scores handed to it; it knows nothing of the engine. This module connects it to the
engine's round loop, one layer above both:

* :func:`replay_round_plan` - the plan :func:`~fedlib.engine.run_federated` drew in a round;
* :func:`leak_trace_hook` - an ``on_round_end`` hook that records a :class:`LeakTrace` row per round;
* :func:`trace_federated_run` - ``run_federated`` with that hook, returning the trace as a frame.
"""
from __future__ import annotations

from typing import Callable, Optional

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import InteractionSplit, Pairs
from fedlib.engine.loop import run_federated
from fedlib.engine.plan import make_round_plan, round_generator
from fedlib.metrics.leak_audit import LeakTrace

__all__ = ["replay_round_plan", "leak_trace_hook", "trace_federated_run"]


def replay_round_plan(train: Pairs, sampler, config, round_index: int):
    """The exact plan :func:`~fedlib.engine.run_federated` drew in round ``round_index``.

    The engine's ``on_round_end`` hook does not receive the plan, but a plan is a pure function
    of ``(train, sampler, config, seed, round)`` (:func:`~fedlib.engine.plan.round_generator`),
    so drawing it again gives the same clients, negatives and batches. ``sampler`` must be the
    one passed to ``run_federated`` (its default: ``NegativeSampler(train, num_items)``).
    """
    return make_round_plan(train, sampler, round_generator(config.seed, round_index), round_index=int(round_index),
                           num_negatives=config.num_negatives, batch_size=config.batch_size,
                           local_epochs=config.local_epochs, clients_per_round=config.clients_per_round)


def leak_trace_hook(trace: LeakTrace, method, train: Pairs, config, *, sampler=None, every: int = 1,
                    chunk_size: int = 256, then: Optional[Callable] = None) -> Callable:
    """An ``on_round_end(run, record)`` hook for :func:`~fedlib.engine.run_federated` that fills ``trace``.

    The hook receives no plan, so it replays the round's plan (:func:`replay_round_plan`;
    pass the same ``sampler`` as to ``run_federated``) to update the coverage every round, and
    scores the traced users with ``method.model.score_users`` every ``every`` rounds (and
    never in other rounds: rank columns are NaN there). ``then`` is called afterwards
    (to chain an existing hook).

    Args:
        trace: the :class:`~fedlib.metrics.leak_audit.LeakTrace` to record into (one row per round).
        method: the engine method being run (its ``model.score_users`` gives ``(n, I)`` scores).
        train, config: the training pairs and ``FederatedConfig`` given to ``run_federated``.
        every: score the traced users every ``every`` rounds (and after the last round).
    """
    if int(every) < 1:
        raise ValueError(f"every must be >= 1 (score every k rounds), got {every}")
    model = method.model
    sampler = sampler if sampler is not None else NegativeSampler(train, model.num_items)

    def on_round_end(run, record):
        t = run.round_index - 1  # the round just completed
        plan = replay_round_plan(train, sampler, config, t)
        score_fn = None
        if run.round_index % int(every) == 0 or run.round_index == config.rounds:
            state = run.state
            device = next(iter({**state.global_state, **state.private_state}.values())).device
            score_fn = lambda u: model.score_users(state.global_state, state.private_state, u.to(device))  # noqa: E731
        trace.record(run.round_index, plan, score_fn, chunk_size=chunk_size)
        if then is not None:
            then(run, record)

    return on_round_end


def trace_federated_run(method, split: InteractionSplit, config, *, sampler=None, every: int = 1,
                        chunk_size: int = 256, **run_kwargs):
    """Run :func:`~fedlib.engine.run_federated` with a :class:`~fedlib.metrics.leak_audit.LeakTrace` attached.

    Args:
        sampler: training negative sampler, e.g. ``NegativeSampler(train, I, exclude="all_rated",
            all_rated=union_pairs(train, valid, test))`` to reproduce the leak.
        every: score the traced users every ``every`` rounds.
        run_kwargs: passed on (``executor``, ``evaluator``, ``device``, ``on_round_end``, ...).

    Returns:
        ``(run, frame)``: the trainer's :class:`~fedlib.engine.trainer.RunResult` and the per-round trace.
    """
    sampler = sampler if sampler is not None else NegativeSampler(split.train, split.num_items)
    trace = LeakTrace(split.train, split.test, split.num_items, valid=split.valid)
    hook = leak_trace_hook(trace, method, split.train, config, sampler=sampler, every=every, chunk_size=chunk_size,
                           then=run_kwargs.pop("on_round_end", None))
    run = run_federated(method, split.train, config, sampler=sampler, on_round_end=hook, **run_kwargs)
    return run, trace.frame()
