"""Centralised training is the one-client case of the algorithm interface: a :class:`Centralised`
algorithm whose round is one epoch over the pooled data, trained by the one trainer."""
import numpy as np
import pytest
import torch

from fedlib.data.splits import Pairs
from fedlib.engine import Checkpointer
from fedlib.engine.algorithm import Algorithm, RoundContext
from fedlib.engine.centralised import Centralised, sgd_centralised, train_centralised
from fedlib.engine.plan import round_generator
from fedlib.engine.trainer import Schedule, train
from fedlib.models.mf import MF


def _pairs(num_users=30, num_items=50, per_user=6, seed=0):
    rng = np.random.default_rng(seed)
    users = np.repeat(np.arange(num_users), per_user)
    items = np.concatenate([rng.choice(num_items, per_user, replace=False) for _ in range(num_users)])
    return Pairs.from_arrays(users, items, num_users), num_items


def _adam_algorithm(train_pairs, num_items, evaluator=None, epochs_per_round=1):
    """An MF-like model with Adam: its moments are state a checkpoint must carry."""
    num_users, dim = train_pairs.num_users, 4

    def init_params(seed):
        g = torch.Generator().manual_seed(seed)
        return {"user": 0.1 * torch.randn(num_users, dim, generator=g, dtype=torch.float64),
                "item": 0.1 * torch.randn(num_items, dim, generator=g, dtype=torch.float64)}

    return Centralised(lambda p, u, i: (p["user"][u] * p["item"][i]).sum(-1), init_params,
                       lambda params: torch.optim.Adam(params, lr=0.05), train_pairs, num_items, batch_size=16,
                       num_negatives=2, evaluator=evaluator, epochs_per_round=epochs_per_round)


def test_centralised_is_an_algorithm_and_an_epoch_draws_from_the_round_generator():
    train_pairs, num_items = _pairs()
    algorithm = _adam_algorithm(train_pairs, num_items)
    assert isinstance(algorithm, Algorithm)
    state = algorithm.init(3)
    [plan] = algorithm.plan_round(state, RoundContext(index=2, seed=3, rng=round_generator(3, 2)))
    [again] = algorithm.plan_round(state, RoundContext(index=2, seed=3, rng=round_generator(3, 2)))
    assert torch.equal(plan.users, again.users) and torch.equal(plan.items, again.items)
    assert plan.users.numel() == 3 * len(train_pairs)  # each positive and its 2 negatives
    assert float(plan.labels.sum()) == len(train_pairs)
    with pytest.raises(ValueError, match="batch_size"):
        Centralised(None, None, None, train_pairs, num_items, batch_size=0)
    with pytest.raises(ValueError, match="epochs_per_round"):
        Centralised(None, None, None, train_pairs, num_items, batch_size=4, epochs_per_round=0)
    with pytest.raises(ValueError, match="no evaluator"):
        algorithm.evaluate(state, "valid")


def test_train_centralised_in_several_calls_equals_one_call():
    train_pairs, num_items = _pairs()
    whole = MF(train_pairs.num_users, num_items, dim=4, generator=torch.Generator().manual_seed(0))
    parts = MF(train_pairs.num_users, num_items, dim=4, generator=torch.Generator().manual_seed(0))
    losses = train_centralised(whole, train_pairs, num_items, epochs=3, lr={"user_emb": 1.0, "item_emb": 0.5},
                               batch_size=32, seed=2)
    split_losses = [train_centralised(parts, train_pairs, num_items, epochs=1, lr={"user_emb": 1.0, "item_emb": 0.5},
                                      batch_size=32, seed=2, first_epoch=e)[0] for e in range(3)]
    assert losses == split_losses and len(losses) == 3
    for (name, a), (_, b) in zip(whole.named_parameters(), parts.named_parameters()):
        assert torch.equal(a, b), name
    assert losses[-1] < losses[0]  # it learns


class _Killed(Exception):
    pass


def test_a_centralised_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_result(tmp_path):
    train_pairs, num_items = _pairs()
    target = torch.arange(num_items) % 3 == 0

    def evaluator(state, split):  # a deterministic "validation" score of the state
        item = state.params["item"].detach()
        return {"score": float(item[target].sum() - item[~target].sum())}

    schedule = Schedule(rounds=6, eval_every=2, patience=2, selection_metric="score", test_at_end=False)
    full = train(_adam_algorithm(train_pairs, num_items, evaluator), schedule, seed=1)

    def kill_at_five(run, record):
        if record["round"] == 5:
            raise _Killed

    settings = {"toy": "adam mf", "seed": 1}
    with pytest.raises(_Killed):
        train(_adam_algorithm(train_pairs, num_items, evaluator), schedule, seed=1,
              checkpointer=Checkpointer(tmp_path, name="central", every=2), checkpoint_config=settings,
              on_round_end=kill_at_five)
    second = Checkpointer(tmp_path, name="central", every=2)
    resumed = train(_adam_algorithm(train_pairs, num_items, evaluator), schedule, seed=1, checkpointer=second,
                    checkpoint_config=settings)
    assert second.resumed_at == [4]
    assert resumed.history == full.history and resumed.best_round == full.best_round
    for name in full.state.params:
        assert torch.equal(resumed.state.params[name], full.state.params[name]), name
        assert torch.equal(resumed.best_state.params[name], full.best_state.params[name]), name
    moments = full.state.optimizer.state_dict()["state"], resumed.state.optimizer.state_dict()["state"]
    assert all(torch.equal(moments[0][k]["exp_avg_sq"], moments[1][k]["exp_avg_sq"]) for k in moments[0])


def test_copy_state_is_independent_of_later_epochs():
    train_pairs, num_items = _pairs()
    algorithm = sgd_centralised(MF(train_pairs.num_users, num_items, dim=4), train_pairs, num_items, lr=1.0,
                                batch_size=32, num_negatives=1)
    state = algorithm.init(0)
    copy = algorithm.copy_state(state)
    context = RoundContext(index=0, seed=0, rng=round_generator(0, 0))
    state, report = algorithm.run_round(state, algorithm.plan_round(state, context), context)
    assert not torch.equal(state.params["item_emb"], copy.params["item_emb"])  # the epoch moved the state...
    assert torch.equal(copy.params["item_emb"], algorithm.init(0).params["item_emb"])  # ...not its copy
    assert state.round_index == 1 and report.train_loss > 0


def test_rounds_of_several_epochs_draw_what_single_epoch_rounds_would():
    train_pairs, num_items = _pairs()
    three = _adam_algorithm(train_pairs, num_items, epochs_per_round=3)
    one = _adam_algorithm(train_pairs, num_items)
    by_three = train(three, Schedule(rounds=2), seed=5, evaluate=False)
    by_one = train(one, Schedule(rounds=6), seed=5, evaluate=False)
    for name, tensor in by_one.state.params.items():
        assert torch.equal(by_three.state.params[name], tensor)
    losses = [row["train_loss"] for row in by_one.history]
    assert [row["train_loss"] for row in by_three.history] == pytest.approx([np.mean(losses[:3]), np.mean(losses[3:])])
