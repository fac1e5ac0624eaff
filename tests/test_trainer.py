"""The one trainer: schedule, selection, early stopping, best state, audit, checkpoints, resume."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np
import pytest
import torch

from fedlib.engine import (Algorithm, Checkpointer, CommunicationLedger, FederatedConfig, ParameterAveraging,
                           RankingEvaluator, RoundReport, RunResult, Schedule, fedmf_method, round_generator,
                           chain_hooks, run_federated, train)
from fedlib.engine.algorithm import clone_dataclass, dataclass_from_dict, dataclass_to_dict
from fedlib.data.splits import Pairs
from fedlib.models import FedMF


@dataclass
class WalkState:
    """A random walk whose scores the toy evaluation reads: ``position`` moves each round."""
    position: torch.Tensor
    visited: List[float] = field(default_factory=list)


class RandomWalk:
    """A toy algorithm: each round adds a step drawn from the round's generator.

    ``valid`` = the position, ``test`` = minus the position: selecting on test is then the opposite rule.
    """

    def __init__(self, drift: float = 0.0):
        self.drift, self.plans = drift, []

    def init(self, seed):
        return WalkState(position=torch.tensor(float(seed)))

    def plan_round(self, state, context):
        step = float(context.rng.normal()) + self.drift
        self.plans.append((context.index, step))
        return step

    def run_round(self, state, plan, context):
        state = WalkState(position=state.position + plan, visited=state.visited + [float(state.position)])
        return state, RoundReport(train_loss=abs(plan), logged={"step": plan})

    def evaluate(self, state, split):
        value = float(state.position)
        return {"score": value if split == "valid" else -value}

    def copy_state(self, state):
        return clone_dataclass(state)

    def state_dict(self, state):
        return dataclass_to_dict(state)

    def load_state(self, saved):
        return dataclass_from_dict(WalkState, saved)


def _positions(seed, rounds, drift=0.0):
    position, out = float(seed), []
    for t in range(rounds):
        position += float(round_generator(seed, t).normal()) + drift
        out.append(position)
    return out


def test_the_toy_and_parameter_averaging_are_algorithms():
    assert isinstance(RandomWalk(), Algorithm)
    train_pairs = Pairs.from_arrays([0, 1], [0, 1], 2)
    algorithm = ParameterAveraging(fedmf_method(FedMF(2, 3, 2), lr=0.1), train_pairs, FederatedConfig(rounds=1))
    assert isinstance(algorithm, Algorithm)


def test_rounds_draw_from_the_round_generator_and_evaluate_on_schedule():
    algorithm = RandomWalk()
    run = train(algorithm, Schedule(rounds=7, eval_every=3, selection_metric="score"), seed=2)
    assert [t for t, _ in algorithm.plans] == list(range(7))
    expected = _positions(2, 7)
    assert np.allclose([h["step"] for h in run.history], np.diff([2.0] + expected))
    evaluated = [h["round"] for h in run.history if "valid/score" in h]
    assert evaluated == [3, 6, 7]  # every third round and after the last
    best = max(evaluated, key=lambda r: expected[r - 1])
    assert run.best_round == best and run.best_metrics == {"score": pytest.approx(expected[best - 1])}
    # the test set is scored on the kept best state, not the last one
    assert run.test_metrics == {"score": pytest.approx(-expected[best - 1])}
    assert float(run.best_state.position) == pytest.approx(expected[best - 1])


def test_patience_stops_and_the_last_state_is_tested_without_a_kept_best():
    run = train(RandomWalk(drift=-5.0), Schedule(rounds=50, patience=2, selection_metric="score",
                                                 keep_best_state=False), seed=0)
    assert run.stopped_early and run.round_index == 3 and run.best_round == 1  # falling every round
    assert run.best_state is None
    assert run.test_metrics == {"score": pytest.approx(-float(run.state.position))}


def test_test_every_evaluation_keeps_the_selected_rounds_test_numbers_and_the_audit():
    schedule = Schedule(rounds=9, selection_metric="score", test_every_evaluation=True, audit_metric="score")
    run = train(RandomWalk(), schedule, seed=4)
    positions = _positions(4, 9)
    assert run.selected_test_metrics == {"score": pytest.approx(-max(positions))}
    assert run.audit.best_round == int(np.argmin(positions)) + 1  # selecting on test = the lowest position
    with pytest.raises(ValueError, match="test_every_evaluation"):
        Schedule(rounds=3, audit_metric="score")
    on_test = train(RandomWalk(), Schedule(rounds=9, selection_metric="score", test_every_evaluation=True,
                                           select_on="test"), seed=4)
    assert on_test.best_round == run.audit.best_round
    with pytest.raises(ValueError, match="select_on"):
        Schedule(rounds=3, select_on="test")


def test_a_callback_may_stop_the_run_and_evaluate_false_runs_without_selection():
    def stop_at_four(run, record):
        if record["round"] == 4:
            run.stopped_early = True

    run = train(RandomWalk(), Schedule(rounds=10, selection_metric="score"), seed=1, on_round_end=stop_at_four)
    assert run.round_index == 4 and run.stopped_early
    quiet = train(RandomWalk(), Schedule(rounds=5, selection_metric="score"), seed=1, evaluate=False)
    assert quiet.best_round is None and quiet.test_metrics is None and quiet.round_index == 5


class _Killed(Exception):
    pass


def test_a_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_result(tmp_path):
    schedule = Schedule(rounds=12, eval_every=2, patience=4, selection_metric="score")
    settings = {"toy": "random walk", "seed": 3}
    full = train(RandomWalk(), schedule, seed=3)

    def kill_at_seven(run, record):
        if record["round"] == 7:
            raise _Killed

    first = Checkpointer(tmp_path, name="walk", every=3)
    with pytest.raises(_Killed):
        train(RandomWalk(), schedule, seed=3, checkpointer=first, checkpoint_config=settings, on_round_end=kill_at_seven)
    second = Checkpointer(tmp_path, name="walk", every=3)
    resumed_algorithm = RandomWalk()
    resumed = train(resumed_algorithm, schedule, seed=3, checkpointer=second, checkpoint_config=settings)
    assert second.resumed_at == [6] and resumed_algorithm.plans[0][0] == 6  # rounds 7.. are run again
    assert resumed.history == full.history
    assert (resumed.best_round, resumed.test_metrics, resumed.stopped_early) == \
        (full.best_round, full.test_metrics, full.stopped_early)
    assert torch.equal(resumed.state.position, full.state.position)
    with pytest.raises(ValueError, match="different configuration"):
        train(RandomWalk(), schedule, seed=3, checkpointer=Checkpointer(tmp_path, name="walk", every=3),
              checkpoint_config={**settings, "seed": 4})
    with pytest.raises(ValueError, match="checkpoint_config"):
        train(RandomWalk(), schedule, seed=3, checkpointer=second)


def _toy_split(num_users=20, num_items=40):
    rng = np.random.default_rng(0)
    parts = {"train": ([], []), "valid": ([], []), "test": ([], [])}
    for u in range(num_users):
        n = int(rng.integers(2, 10))
        chosen = rng.choice(num_items, n + 2, replace=False)
        parts["train"][0].extend([u] * n), parts["train"][1].extend(chosen[:n].tolist())
        parts["valid"][0].append(u), parts["valid"][1].append(int(chosen[n]))
        parts["test"][0].append(u), parts["test"][1].append(int(chosen[n + 1]))
    return {k: Pairs.from_arrays(a, b, num_users) for k, (a, b) in parts.items()}, num_items


def test_parameter_averaging_through_the_trainer_is_run_federated():
    split, num_items = _toy_split()
    config = FederatedConfig(rounds=5, seed=1, batch_size=8, clients_per_round=10, eval_every=2,
                             selection_metric="NDCG@10", dtype="float64")
    evaluator = RankingEvaluator(split["train"], split["valid"], split["test"], ks=(10,))

    def method():
        return fedmf_method(FedMF(20, num_items, 4), lr=0.5)

    ledger_a, ledger_b = CommunicationLedger(), CommunicationLedger()
    direct = run_federated(method(), split["train"], config, evaluator=evaluator, device="cpu", ledger=ledger_a)
    algorithm = ParameterAveraging(method(), split["train"], config, evaluator=evaluator, device="cpu")
    run = train(algorithm, config.schedule(), seed=config.seed, ledger=ledger_b)
    assert isinstance(run, RunResult) and isinstance(direct, RunResult)  # one result type
    assert run.history == direct.history and run.best_round == direct.best_round
    assert run.test_metrics == direct.test_metrics
    for name, tensor in direct.state.global_state.items():
        assert torch.equal(run.state.global_state[name], tensor)
        assert torch.equal(run.best_state.global_state[name], direct.best_state.global_state[name])
    assert ledger_a.total() == ledger_b.total() > 0
    assert ledger_a.per_round().equals(ledger_b.per_round())


class SharedScoring(RandomWalk):
    """Scores both splits in one pass (and counts the passes)."""

    def __init__(self):
        super().__init__()
        self.passes = 0

    def evaluate_splits(self, state, splits):
        self.passes += 1
        return {split: self.evaluate(state, split) for split in splits}


def test_evaluate_splits_scores_valid_and_test_in_one_pass_with_the_same_numbers():
    schedule = Schedule(rounds=6, eval_every=2, selection_metric="score", test_every_evaluation=True)
    shared = SharedScoring()
    one_pass = train(shared, schedule, seed=5)
    assert shared.passes == 3  # one pass per evaluation, not two
    assert one_pass.history == train(RandomWalk(), schedule, seed=5).history


class ServerStep(RandomWalk):
    """The toy with server work before each round: it reads the round's plan (the step) and the run."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def before_round(self, run, round_index, plan):
        self.seen.append((round_index, plan, run.round_index))
        run.state = WalkState(position=run.state.position * 0.5, visited=run.state.visited)  # halve before each step


def test_before_round_gets_the_rounds_plan_before_the_round_runs():
    walk = ServerStep()
    run = train(walk, Schedule(rounds=4, test_at_end=False), seed=3, evaluate=False)
    planned = [step for _, step in walk.plans]
    assert [(t, step, t) for t, step in enumerate(planned)] == walk.seen  # round t's plan, before round t ran
    position = 3.0
    for t in range(4):
        position = 0.5 * position + float(round_generator(3, t).normal())  # the hook's change, then the step
    assert float(run.state.position) == pytest.approx(position, abs=1e-6)


def test_chain_hooks_runs_hooks_in_order_and_keeps_none_for_none():
    calls = []
    first = lambda run, t, plan: calls.append(("first", t, plan))  # noqa: E731
    second = lambda run, t, plan: calls.append(("second", t, plan))  # noqa: E731
    assert chain_hooks(None, None) is None and chain_hooks(None, first) is first
    chain_hooks(first, None, second)(None, 2, "plan")
    assert calls == [("first", 2, "plan"), ("second", 2, "plan")]
