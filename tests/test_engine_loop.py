"""Round plan, round loop, selection/patience and RNG hygiene."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import Pairs
from fedlib.engine import (BatchedExecutor, FederatedConfig, RankingEvaluator, SequentialExecutor, fedmf_method,
                           make_round_plan, round_generator, run_federated)
from fedlib.engine.selection import Selection
from fedlib.models import FedMF


def _split(num_users=30, num_items=80, seed=0):
    rng = np.random.default_rng(seed)
    tr_u, tr_i, va_u, va_i, te_u, te_i = [], [], [], [], [], []
    for u in range(num_users):
        n = int(rng.integers(3, 25))
        chosen = rng.choice(num_items, n + 2, replace=False)
        tr_u += [u] * n
        tr_i += chosen[:n].tolist()
        va_u.append(u), va_i.append(chosen[n]), te_u.append(u), te_i.append(chosen[n + 1])
    mk = lambda a, b: Pairs.from_arrays(a, b, num_users)  # noqa: E731
    return mk(tr_u, tr_i), mk(va_u, va_i), mk(te_u, te_i), num_items


def test_round_plan_layout():
    train, _, _, num_items = _split()
    plan = make_round_plan(train, NegativeSampler(train, num_items), round_generator(1, 0), num_negatives=4, batch_size=16)
    indptr = train.indptr
    for c, user in enumerate(plan.clients):
        ex = plan.client_examples(c)
        items, labels, steps = plan.items[ex], plan.labels[ex], plan.steps[ex]
        own = set(train.items[indptr[user]:indptr[user + 1]].tolist())
        assert sorted(items[labels == 1].tolist()) == sorted(train.items[indptr[user]:indptr[user + 1]].tolist())
        assert (labels == 0).sum() == 4 * len(own)
        assert not (set(items[labels == 0].tolist()) & own)
        # batches of 16 in order, the last one possibly smaller
        sizes = np.bincount(steps)
        assert (np.diff(steps) >= 0).all() and (sizes[:-1] == 16).all() and 0 < sizes[-1] <= 16
        assert plan.num_steps[c] == sizes.size


def test_round_plan_is_a_function_of_seed_and_round():
    train, _, _, num_items = _split()
    sampler = NegativeSampler(train, num_items)
    a = make_round_plan(train, sampler, round_generator(5, 3), clients_per_round=10, batch_size=16)
    b = make_round_plan(train, sampler, round_generator(5, 3), clients_per_round=10, batch_size=16)
    c = make_round_plan(train, sampler, round_generator(5, 4), clients_per_round=10, batch_size=16)
    for field in ("clients", "items", "labels", "steps"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert a.clients.size == 10 and not np.array_equal(a.items, c.items)


def test_run_leaves_global_rng_untouched():
    train, valid, test, num_items = _split()
    torch.manual_seed(123)
    np.random.seed(123)
    random.seed(123)
    torch_state, np_state, py_state = torch.get_rng_state(), np.random.get_state(), random.getstate()
    method = fedmf_method(FedMF(train.num_users, num_items, 8), lr=0.5)
    config = FederatedConfig(rounds=3, seed=1, batch_size=16, clients_per_round=12, selection_metric="NDCG@10")
    for executor in (SequentialExecutor(), BatchedExecutor()):
        run_federated(method, train, config, executor=executor, evaluator=RankingEvaluator(train, valid, test, ks=(10,)))
    assert torch.equal(torch.get_rng_state(), torch_state)
    after = np.random.get_state()
    assert after[0] == np_state[0] and np.array_equal(after[1], np_state[1]) and after[2:] == np_state[2:]
    assert random.getstate() == py_state


def test_same_seed_same_run_different_seed_different_run():
    train, valid, test, num_items = _split()
    method = fedmf_method(FedMF(train.num_users, num_items, 8), lr=0.5)
    runs = [run_federated(method, train, FederatedConfig(rounds=2, seed=s, batch_size=16)) for s in (1, 1, 2)]
    assert torch.equal(runs[0].state.global_state["item_emb"], runs[1].state.global_state["item_emb"])
    assert not torch.equal(runs[0].state.global_state["item_emb"], runs[2].state.global_state["item_emb"])


def test_training_improves_validation_ndcg():
    train, valid, test, num_items = _split(num_users=60, num_items=40, seed=3)
    method = fedmf_method(FedMF(train.num_users, num_items, 8, init_std=0.1), lr=0.5)
    config = FederatedConfig(rounds=30, seed=0, batch_size=64, eval_every=5, selection_metric="NDCG@10")
    run = run_federated(method, train, config, evaluator=RankingEvaluator(train, valid, test, ks=(10,)))
    assert run.history[-1]["train_loss"] < run.history[0]["train_loss"]
    assert len([r for r in run.history if "valid/NDCG@10" in r]) == 6
    assert run.test_metrics is not None and set(run.test_metrics) == {"Recall@10", "NDCG@10"}


def test_best_selection_ties_and_patience():
    selection = Selection("m", patience=2)
    improved = [selection.update(round_index, {"m": score}) for round_index, score in [(1, 0.5), (2, 0.5), (3, 0.4)]]
    assert improved == [True, False, False]
    assert selection.best_round == 1 and selection.best_metrics == {"m": 0.5}  # first of tied rounds
    assert selection.stopped_early  # two evaluations without improvement
    later = Selection("m", prefer_later_ties=True)
    for round_index, score in [(1, 0.5), (2, 0.5)]:
        later.update(round_index, {"m": score})
    assert later.best_round == 2 and not later.stopped_early
    with pytest.raises(ValueError, match="not among the evaluated metrics"):
        later.update(3, {"other": 1.0})


def test_selection_never_selects_a_nan_score():
    selection = Selection("m", patience=2)
    assert not selection.update(1, {"m": float("nan")})
    assert selection.best_round is None and selection.evals_since_best == 1
    assert selection.update(2, {"m": 0.1}) and selection.best_round == 2
    assert not selection.update(3, {"m": float("nan")}) and selection.best_round == 2


def test_selection_patience_is_recomputed_after_an_improvement():
    selection = Selection("m", patience=1)
    selection.update(1, {"m": 0.5})
    selection.update(2, {"m": 0.4})
    assert selection.stopped_early
    selection.update(3, {"m": 0.6})  # a caller that let the run go on sees the gain clear it
    assert not selection.stopped_early and selection.best_round == 3
    restored = Selection("m", patience=1)
    restored.load_state_dict(selection.state_dict())
    assert restored == selection
    with pytest.raises(ValueError, match="resumed under the rule"):
        Selection("m", patience=2).load_state_dict(selection.state_dict())


def test_early_stopping_stops_the_loop():
    train, valid, test, num_items = _split()
    method = fedmf_method(FedMF(train.num_users, num_items, 8), lr=0.0)  # nothing changes -> no improvement
    config = FederatedConfig(rounds=20, seed=0, batch_size=16, patience=3, selection_metric="NDCG@10")
    run = run_federated(method, train, config, evaluator=RankingEvaluator(train, valid, test, ks=(10,)))
    assert run.stopped_early and run.round_index == 4 and run.best_round == 1


def test_run_federated_starts_from_a_state_or_continues_a_run_and_refuses_anything_else():
    """``state=``: an AveragingState starts at round 0; a RunResult goes on; a dict of tensors is refused."""
    from fedlib.engine import ParameterAveraging

    train, _, _, num_items = _split()
    method = fedmf_method(FedMF(train.num_users, num_items, 8), lr=0.5)
    config = FederatedConfig(rounds=2, seed=1, batch_size=16)
    both = run_federated(method, train, config)
    start = ParameterAveraging(method, None, config).init(config.seed)
    from_state = run_federated(method, train, config, state=start)
    assert from_state.round_index == 2 and torch.equal(from_state.state.global_state["item_emb"],
                                                       both.state.global_state["item_emb"])
    first = run_federated(method, train, FederatedConfig(rounds=1, seed=1, batch_size=16))
    continued = run_federated(method, train, config, state=first)
    assert continued is first and [r["round"] for r in continued.history] == [1, 2]
    assert torch.equal(continued.state.global_state["item_emb"], both.state.global_state["item_emb"])
    with pytest.raises(TypeError, match="AveragingState .* or a RunResult"):
        run_federated(method, train, config, state=start.global_state)
