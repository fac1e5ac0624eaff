"""FedKDRec through the one trainer: an Algorithm whose checkpoints carry the whole simulation
(server model, its Adam, the labels it was told, both agents, every client's model), so a run
killed after a checkpoint and resumed equals the uninterrupted run; and the lesson's
step-by-step session gives the trainer's numbers."""
import math

import pytest
import torch

from fedlib.data.synthetic import clustered_interactions
from fedlib.engine import Checkpointer, CommunicationLedger
from fedlib.engine.algorithm import Algorithm
from fedlib.papers.fedkdrec.clients import FedKDRecConfig
from fedlib.papers.fedkdrec.method import FedKDRec, FedKDRecSession, curve_rows, server_scorer, train_fedkdrec
from fedlib.metrics.ranking import candidate_set_metrics

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def split():
    return clustered_interactions(num_users=40, num_items=60, interactions_per_user=10, seed=3)


def _config(**overrides):
    base = dict(backbone="lightgcn", hidden=(), dim=8, rounds=5, eval_every=2, client_fraction=0.3, client_batch=16,
                server_batch=64, mu=6, seed=2, client_lr=0.01, server_lr=0.01)
    return FedKDRecConfig(**{**base, **overrides})


def _without_seconds(history):
    return [{k: v for k, v in row.items() if k != "seconds"} for row in history]


class _Killed(Exception):
    pass


@pytest.mark.parametrize("overrides", [{}, dict(backbone="neumf", hidden=(8,), transfer="confidence")],
                         ids=["lightgcn agents", "neumf confidence"])
def test_a_killed_fedkdrec_run_resumes_to_the_uninterrupted_result(split, tmp_path, overrides):
    config = _config(**overrides)
    users, candidates = split.valid.users, split.extra["valid_candidates"]

    def evaluate(round_index, scorer):  # deterministic validation value of the current server
        value = float(candidate_set_metrics(scorer, users, candidates, ks=(10,), pair_fn=scorer.pairs)["NDCG@10"]
                      .float().mean())
        return value, {"evaluated_after": round_index}

    full_ledger = CommunicationLedger()
    full = train_fedkdrec(split, config, evaluate=evaluate, ledger=full_ledger, device="cpu")

    def kill_at_three(round_index):
        if round_index == 3:
            raise _Killed

    with pytest.raises(_Killed):
        train_fedkdrec(split, config, evaluate=evaluate, progress=kill_at_three, device="cpu",
                       checkpointer=Checkpointer(tmp_path, name="kd", every=2))
    second = Checkpointer(tmp_path, name="kd", every=2)
    resumed_ledger = CommunicationLedger()
    resumed = train_fedkdrec(split, config, evaluate=evaluate, ledger=resumed_ledger, device="cpu",
                             checkpointer=second)
    assert second.resumed_at == [2]
    assert _without_seconds(resumed.history) == _without_seconds(full.history)
    curve = curve_rows(full)
    assert curve_rows(resumed) == curve and [c["round"] for c in curve] == [2, 4, 5]
    assert all(c["evaluated_after"] == c["round"] for c in curve)  # the callback's extras reach the curve
    assert (resumed.best_round, resumed.selected_evaluation) == (full.best_round, full.selected_evaluation)
    assert full.selected_evaluation["valid/valid"] == max(c["valid"] for c in curve)
    for name in full.state.server.params:
        assert torch.equal(resumed.state.server.params[name], full.state.server.params[name]), name
        assert torch.equal(resumed.best_state.server.params[name], full.best_state.server.params[name]), name
    for name in full.state.clients:
        assert torch.equal(resumed.state.clients[name], full.state.clients[name]), name
    if config.backbone == "lightgcn":
        assert torch.equal(resumed.state.server.graph.to_dense(), full.state.server.graph.to_dense())
    users = torch.arange(5)
    assert torch.equal(server_scorer(resumed)(users), server_scorer(full)(users))
    frame, again = full_ledger.per_round(), resumed_ledger.per_round()
    assert frame[frame["round"] >= 3].reset_index(drop=True).equals(again.reset_index(drop=True))


def test_the_lesson_session_gives_the_trainers_numbers(split):
    config = _config(rounds=3, eval_every=1)
    values = iter([0.2, 0.5, 0.5])
    trained = train_fedkdrec(split, config, evaluate=lambda r, s: next(values), device="cpu")
    session = FedKDRecSession(split, config, device="cpu")
    values = iter([0.2, 0.5, 0.5])
    for _ in range(config.rounds):
        session.step_round()
        session.evaluate(lambda r, s: next(values))
    stepped = session.run
    assert isinstance(session.algorithm, Algorithm) and isinstance(FedKDRec(split, config), Algorithm)
    assert _without_seconds(stepped.history) == _without_seconds(trained.history)  # the trainer's rows
    assert curve_rows(stepped) == curve_rows(trained) and stepped.best_round == trained.best_round == 2  # earliest best
    assert (stepped.method, trained.method) == ("FedKDRec", "FedKDRec") and stepped.round_index == 3
    for name in trained.state.server.params:
        assert torch.equal(stepped.state.server.params[name], trained.state.server.params[name]), name
        assert torch.equal(stepped.best_state.server.params[name], trained.best_state.server.params[name]), name
    assert torch.equal(server_scorer(stepped)(torch.arange(5)), server_scorer(trained)(torch.arange(5)))
    assert session.clients.tolist() == sorted(session.clients.tolist())  # the current round's plan
    fresh = FedKDRecSession(split, config, device="cpu")
    with pytest.raises(AttributeError, match="begin_round"):
        fresh.uploads
    with pytest.raises(ValueError, match="after learn"):
        fresh.evaluate(lambda r, s: 0.5)


def test_without_evaluation_the_last_server_stands_in(split):
    run = train_fedkdrec(split, _config(rounds=2), device="cpu")
    assert curve_rows(run) == [] and run.best_round is None and run.best_state is None
    last = run.state.server
    assert torch.equal(server_scorer(run)(torch.arange(4)), last.backbone.server_scores(last.params, torch.arange(4),
                                                                                          last.graph))
    with pytest.raises(ValueError, match="evaluate="):
        FedKDRec(split, _config()).evaluate(None, "valid")


def test_when_every_validation_value_is_nan_the_last_server_stands_in(split):
    run = train_fedkdrec(split, _config(rounds=3, eval_every=1), evaluate=lambda r, s: math.nan, device="cpu")
    assert run.best_score == -math.inf and run.best_round == 1  # the trainer keeps the first (-inf) evaluation
    params = run.state.server.params
    assert any(not torch.equal(run.best_state.server.params[n], params[n]) for n in params)  # rounds 2, 3 moved it
    users = torch.arange(4)
    expected = run.artifacts["backbone"].server_scores(params, users, run.state.server.graph)
    assert torch.equal(server_scorer(run)(users), expected)
