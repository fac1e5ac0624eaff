"""F3CRec's equations on hand-computed toy cases, and its client loss under both executors.

Lim et al., "Federated Continual Recommendation", CIKM 2025: Eqs. 1–6 (client), 7–13 (server).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import Pairs
from fedlib.data.synthetic import drifting_stream
from fedlib.engine import (BatchedExecutor, FederatedConfig, SequentialExecutor, bce_client_loss, fedmf_method,
                           ParameterAveraging, make_round_plan, round_generator, run_federated)
from fedlib.engine.method import LocalBatch
from fedlib.baselines.continual.continual import (BlockContext, PlanAugmentingExecutor, PreviousBlock, count_higher_scores,
                                      fedmf_backbone, fedncf_backbone, initial_block_state, pfedrec_backbone,
                                      student_ranks)
from fedlib.models import FedMF
from fedlib.papers.f3crec import method as f3crec
from fedlib.papers.f3crec.method import (CONTEXT_LABEL, F3CRec, ParameterRegularisation, ParameterRegularisationLoss,
                                         adaptive_replay_memory, augment_plan_with_replay, consistency_sampling_rate,
                                         decode_replay_label, item_knowledge_shift, item_temporal_mean_mix, kd_loss,
                                         pre_aggregation, preference_shift, replay_memory_size, replay_priorities,
                                         temporal_mean, temporal_mean_weights, top_n_memory, total_client_loss)


# -- Eq. 1 ---------------------------------------------------------------------------------
def test_top_n_memory_is_the_unmasked_teacher_top_n_best_first():
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.7], [3.0, -1.0, 2.0, 0.0]])
    items, logits = top_n_memory(scores, 3)
    assert items.tolist() == [[1, 3, 2], [0, 2, 3]]
    torch.testing.assert_close(logits, torch.tensor([[0.9, 0.7, 0.5], [3.0, 2.0, 0.0]]))
    with pytest.raises(ValueError):
        top_n_memory(scores, 5)


# -- Eq. 2 ---------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["compare", "sort"])
def test_rank_shift_by_hand(strategy):
    # Student scores of 6 items. The teacher's list is S_u = (i_1, i_2, i_3) = (item 1, item 2, item 4).
    scores = torch.tensor([[0.9, 0.1, 0.5, 0.7, 0.3, 0.2],
                           [0.6, 0.5, 0.4, 0.3, 0.2, 0.1]])
    memory = torch.tensor([[1, 2, 4], [0, 1, 2]])
    query = scores.gather(1, memory)
    ranks = student_ranks(scores, query, strategy)
    # item 1 (0.1): five items score higher -> rank 6; item 2 (0.5): 0.9, 0.7 -> 3; item 4 (0.3): 3 higher -> 4.
    # The second client keeps the teacher's order exactly: ranks 1, 2, 3.
    assert ranks.tolist() == [[6, 3, 4], [1, 2, 3]]
    shift = preference_shift(ranks)
    assert shift.tolist() == [5 + 1 + 1, 0]  # Δ = |6−1| + |3−2| + |4−3| = 7


def test_rank_count_strategies_agree_on_random_scores():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(7, 50, generator=gen, dtype=torch.float64)
    memory = torch.stack([torch.randperm(50, generator=gen)[:9] for _ in range(7)])
    query = scores.gather(1, memory)
    by_compare = count_higher_scores(scores, query, "compare", budget=100)  # forces client chunks
    by_sort = count_higher_scores(scores, query, "sort")
    assert torch.equal(by_compare, by_sort)
    # and both equal the position in a full descending argsort (no ties in random floats)
    positions = torch.argsort(torch.argsort(scores, dim=1, descending=True), dim=1).gather(1, memory)
    assert torch.equal(by_compare, positions)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rank_count_numpy_path_equals_the_torch_comparison(dtype):
    """The CPU path (numpy compare, int32 count) against torch's (C, N, I) comparison, with ties and NaN."""
    from fedlib.baselines.continual.continual import _count_higher_scores_torch
    gen = torch.Generator().manual_seed(3)
    scores = (torch.randn(23, 301, generator=gen, dtype=torch.float64) * 4).round().to(dtype)  # many ties
    scores[2, 5] = float("nan")
    scores[4, :] = float("-inf")
    query = scores.gather(1, torch.randint(0, 301, (23, 30), generator=gen))
    query[7, 3] = float("nan")
    for budget in (1 << 24, 30 * 301 * 5):  # one chunk; chunks of 5 clients
        fast = count_higher_scores(scores, query, "compare", budget=budget)
        reference = _count_higher_scores_torch(scores, query, chunk=23)
        assert fast.dtype == torch.int64 and torch.equal(fast, reference)
    by_hand = torch.tensor([[sum(float(s) > float(q) for s in scores[c]) for q in query[c]] for c in range(23)])
    assert torch.equal(fast, by_hand)
    assert int(fast[7, 3]) == 0 and int(fast[4].max()) == 0 and int(fast.max()) > 0


# -- Eqs. 3 and 4 --------------------------------------------------------------------------------
def test_sampling_rate_by_hand():
    rate = consistency_sampling_rate(torch.tensor([7.0, 0.0, 100.0]), eps=0.1)
    torch.testing.assert_close(rate, torch.tensor([math.exp(-0.7), 1.0, math.exp(-10.0)], dtype=torch.float64))


def test_replay_memory_size_is_floor_of_rate_times_n():
    rate = torch.tensor([1.0, 0.5, 0.49, 0.0333, 0.0], dtype=torch.float64)
    assert replay_memory_size(rate, 30).tolist() == [30, 15, 14, 0, 0]  # 14.7 -> 14, 0.999 -> 0


def test_replay_sample_is_a_seeded_subset_without_replacement_of_the_right_size():
    n = 30
    sizes = torch.tensor([30, 15, 14, 1, 0])
    priorities = torch.as_tensor(replay_priorities(np.random.default_rng(5), sizes.numel(), n))
    # every row is a permutation of 0..N-1
    assert torch.equal(priorities.sort(1).values, torch.arange(n).expand(sizes.numel(), n))
    selected = adaptive_replay_memory(priorities, sizes)  # (C, N) mask over S_u
    assert selected.sum(1).tolist() == sizes.tolist()
    memory_items = torch.arange(100, 100 + n).expand(sizes.numel(), n)  # S_u
    for row in range(sizes.numel()):
        chosen = memory_items[row][selected[row]]
        assert chosen.unique().numel() == chosen.numel()  # without replacement
        assert set(chosen.tolist()) <= set(memory_items[row].tolist())  # subset of S_u
    # seeded: same seed same draw, another seed another draw
    again = torch.as_tensor(replay_priorities(np.random.default_rng(5), sizes.numel(), n))
    other = torch.as_tensor(replay_priorities(np.random.default_rng(6), sizes.numel(), n))
    assert torch.equal(priorities, again) and not torch.equal(priorities, other)


def test_replay_sample_is_uniform_over_the_memory():
    n, m, draws = 10, 3, 4000
    priorities = torch.as_tensor(replay_priorities(np.random.default_rng(0), draws, n))
    frequency = adaptive_replay_memory(priorities, torch.full((draws,), m)).double().mean(0)
    assert torch.allclose(frequency, torch.full((n,), m / n, dtype=torch.float64), atol=0.03)


# -- Eqs. 5 and 6 -------------------------------------------------------------------------------
def test_kd_loss_two_items_by_hand():
    student = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    teacher = torch.tensor([[math.log(3.0), 0.0]], dtype=torch.float64)  # σ = 0.75, 0.5
    both = torch.tensor([[True, True]])
    s1 = 1 / (1 + math.exp(-1.0))
    item0 = -(0.75 * math.log(0.5) + 0.25 * math.log(0.5))  # = ln 2
    item1 = -(0.5 * math.log(s1) + 0.5 * math.log(1 - s1))
    assert kd_loss(student, teacher, both).item() == pytest.approx((item0 + item1) / 2, abs=1e-12)
    assert kd_loss(student, teacher, both, reduction="sum").item() == pytest.approx(item0 + item1, abs=1e-12)
    only_second = torch.tensor([[False, True]])
    assert kd_loss(student, teacher, only_second).item() == pytest.approx(item1, abs=1e-12)
    assert kd_loss(student, teacher, torch.tensor([[False, False]])).item() == 0.0  # empty memory, no KD
    total = total_client_loss(torch.tensor([0.4], dtype=torch.float64), kd_loss(student, teacher, both), 0.1)
    assert total.item() == pytest.approx(0.4 + 0.1 * (item0 + item1) / 2, abs=1e-12)


def test_kd_gradient_reaches_only_the_sampled_items():
    student = torch.tensor([[0.3, -0.2, 1.1]], requires_grad=True)
    kd_loss(student, torch.zeros(1, 3), torch.tensor([[True, False, True]])).sum().backward()
    assert student.grad[0, 1] == 0 and student.grad[0, 0] != 0 and student.grad[0, 2] != 0


# -- Eqs. 7–13 -----------------------------------------------------------------------------------
def _server_toy():
    previous = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])  # Q^{t-1}: 2 old items, d = 4
    pre = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 3.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]])  # Q', item 2 new
    return previous, pre


def test_pre_aggregation_is_the_uniform_mean():
    uploads = torch.tensor([[[1.0, 2.0]], [[3.0, 6.0]]])  # (C=2, I=1, d=2)
    assert pre_aggregation(uploads).tolist() == [[2.0, 4.0]]


def test_knowledge_shift_weights_and_mixing_by_hand():
    previous, pre = _server_toy()
    phi = item_knowledge_shift(previous, pre)
    assert phi.tolist() == [0.0, 4.0 / 2.0]  # ‖(0, -2, 0, 0)‖² / √4
    gamma = temporal_mean_weights(phi, beta=0.6, num_items=3)
    torch.testing.assert_close(gamma, torch.tensor([0.6, 0.2, 0.0]))  # β/(1+φ); new item padded with 0
    mixed = temporal_mean(pre, previous, gamma)
    torch.testing.assert_close(mixed, torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 2.6, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]]))
    # w/o i.t.m: one γ = β for every old item
    uniform = temporal_mean_weights(phi, beta=0.6, num_items=3, itemwise=False)
    torch.testing.assert_close(uniform, torch.tensor([0.6, 0.6, 0.0]))
    torch.testing.assert_close(temporal_mean(pre, previous, uniform)[1], torch.tensor([0.0, 1.8, 0.0, 0.0]))


def test_mix_hook_leaves_new_items_and_other_tensors_untouched():
    previous, pre = _server_toy()
    mix = item_temporal_mean_mix({"item_emb": previous}, beta=0.6)
    dense = torch.ones(3)
    out = mix({"item_emb": pre.clone(), "w": dense}, {"item_emb": pre.clone(), "w": dense}, 0)
    assert torch.equal(out["item_emb"][2], pre[2]) and out["w"] is dense
    torch.testing.assert_close(out["item_emb"][1], torch.tensor([0.0, 2.6, 0.0, 0.0]))


def test_temporal_mean_hook_through_run_federated():
    """One round with the hook = one round without it, then Eqs. 8–13 applied to the result."""
    stream = drifting_stream(num_users=30, num_items=40, interactions_per_user=40, seed=1)
    split = stream[1]
    model = FedMF(split.num_users, split.num_items, dim=4, init_std=0.1)
    config = FederatedConfig(rounds=1, seed=3, batch_size=32, dtype="float64")
    start = ParameterAveraging(fedmf_method(model, lr=0.5), None, config, device="cpu").init(config.seed)
    gen = torch.Generator().manual_seed(0)
    anchor = torch.randn(stream[0].num_items, 4, generator=gen, dtype=torch.float64)  # "Q^{t-1}"

    def one_round(method):
        state = dataclasses.replace(start, global_state={k: v.clone() for k, v in start.global_state.items()},
                                    private_state={k: v.clone() for k, v in start.private_state.items()})
        return run_federated(method, split.train, config, state=state, executor=BatchedExecutor(), device="cpu").state

    plain = one_round(fedmf_method(model, lr=0.5))
    mixed = one_round(fedmf_method(model, lr=0.5, server_mix=item_temporal_mean_mix({"item_emb": anchor}, 0.7)))
    q_pre = plain.global_state["item_emb"]
    gamma = 0.7 / (1 + ((anchor - q_pre[:anchor.shape[0]]) ** 2).sum(1) / 2.0)  # √d = 2
    expected = q_pre.clone()
    expected[:anchor.shape[0]] = (1 - gamma[:, None]) * q_pre[:anchor.shape[0]] + gamma[:, None] * anchor
    torch.testing.assert_close(mixed.global_state["item_emb"], expected, rtol=0, atol=1e-12)
    assert torch.equal(mixed.global_state["item_emb"][anchor.shape[0]:], q_pre[anchor.shape[0]:])  # new items
    torch.testing.assert_close(mixed.private_state["user_emb"], plain.private_state["user_emb"], rtol=0, atol=0)


# -- the client loss inside the engine -------------------------------------------------------------
def _block_one(backbone, top_n=6, seed=2):
    """Block 1 of a small stream with a random "block 0" state as the teacher."""
    stream = drifting_stream(num_users=40, num_items=50, interactions_per_user=40, seed=seed)
    config = FederatedConfig(rounds=3, seed=11, batch_size=8, dtype="float64")
    model0 = backbone.make_model(stream[0].num_users, stream[0].num_items)
    state0 = ParameterAveraging(backbone.make_method(model0), None, config, device="cpu").init(config.seed)
    ctx0 = BlockContext(0, stream[0], model0, backbone.make_method(model0), config)
    model1 = backbone.make_model(stream[1].num_users, stream[1].num_items)
    method = F3CRec(top_n=top_n)
    memory = method.after_block(ctx0, state0.global_state, state0.private_state)
    previous = PreviousBlock(0, stream[0], model0, state0.global_state, state0.private_state, memory)
    ctx1 = BlockContext(1, stream[1], model1, backbone.make_method(model1), config, previous)
    return stream, ctx1, config


def _train_block(ctx, config, method, executor):
    state = initial_block_state(ctx, config.seed, device="cpu")
    return run_federated(method.make_method(ctx), ctx.split.train, config, state=state,
                         executor=PlanAugmentingExecutor(executor), device="cpu")


def _assert_states_close(a, b, tol=1e-9):
    """Two runs agree: final states and every round's history."""
    for name in a.state.global_state:
        torch.testing.assert_close(a.state.global_state[name], b.state.global_state[name], rtol=0, atol=tol, msg=name)
    for name in a.state.private_state:
        torch.testing.assert_close(a.state.private_state[name], b.state.private_state[name], rtol=0, atol=tol,
                                   msg=name)
    for ra, rb in zip(a.history, b.history):
        assert abs(ra["train_loss"] - rb["train_loss"]) <= tol


def test_toy_block_has_multi_batch_clients():
    _, ctx, config = _block_one(fedmf_backbone(dim=4))
    plan = make_round_plan(ctx.split.train, NegativeSampler(ctx.split.train, ctx.split.num_items),
                           round_generator(config.seed, 0), batch_size=config.batch_size)
    assert (plan.num_steps >= 3).sum() >= 5 and (plan.num_steps == 1).sum() >= 1
    assert (plan.clients < ctx.previous.num_users).sum() >= 10  # clients with a memory
    assert (plan.clients >= ctx.previous.num_users).sum() >= 1  # and new users without one


@pytest.mark.parametrize("backbone", [fedmf_backbone(dim=4, lr=2.0), pfedrec_backbone(dim=4, lr=0.1, lr_eta=0.1),
                                      fedncf_backbone(dim=4, lr=0.05, lr_eta=0.5)], ids=["fedmf", "pfedrec", "fedncf"])
def test_f3crec_client_loss_sequential_equals_batched(backbone):
    _, ctx, config = _block_one(backbone)
    method = F3CRec(top_n=6, eps=0.02, lambda_kd=1.0, beta=0.5, record_shifts=True)
    seq = _train_block(ctx, config, method, SequentialExecutor())
    seq_records = method.losses[1].records
    bat = _train_block(ctx, config, method, BatchedExecutor(chunk_size=7))
    bat_records = method.losses[1].records
    _assert_states_close(seq, bat)

    # Same Δ_u, δ_u and |M_u| for every user and step, whatever the order of the calls.
    def per_user(records):
        out = {}
        for r in records:
            for u, shift, size in zip(r["users"], r["shift"], r["size"]):
                out.setdefault((r["round"], int(u)), []).append((float(shift), int(size)))
        return out
    assert per_user(seq_records) == per_user(bat_records)
    sizes = np.concatenate([r["size"] for r in bat_records])
    assert sizes.min() < 6 and sizes.max() > 0  # the adaptive memory really varies

    # The distillation matters: without it (λ = 0) the run differs.
    plain = _train_block(ctx, config, dataclasses.replace(method, lambda_kd=0.0), BatchedExecutor())
    assert max(float((plain.state.private_state[k] - bat.state.private_state[k]).abs().max())
               for k in bat.state.private_state) > 1e-6


def test_student_scores_equal_the_full_local_model(monkeypatch):
    """In the sequential executor the loss sees the full local item table: the scores built from the
    download plus the plan's replay/context rows must equal scoring that table directly."""
    _, ctx, config = _block_one(fedmf_backbone(dim=4, lr=2.0))
    original = f3crec._scores_of_local_models
    checked = []

    def checking(model, params, batch, logits, download):
        scores = original(model, params, batch, logits, download)
        direct = params["user_emb"].detach() @ params["item_emb"].detach().T  # (1, I) full local table
        torch.testing.assert_close(scores, direct, rtol=0, atol=1e-12)
        checked.append(int(batch.items.shape[1]))
        return scores

    monkeypatch.setattr(f3crec, "_scores_of_local_models", checking)
    _train_block(ctx, dataclasses.replace(config, rounds=2), F3CRec(top_n=6, eps=0.02), SequentialExecutor())
    assert len(checked) > 20


def test_augmented_plan_replay_and_context_rows():
    _, ctx, config = _block_one(fedmf_backbone(dim=4))
    train = ctx.split.train
    plan = make_round_plan(train, NegativeSampler(train, ctx.split.num_items), round_generator(config.seed, 0),
                           batch_size=config.batch_size)
    memory = ctx.previous.memory["topn_items"].numpy()
    n = memory.shape[1]
    out = augment_plan_with_replay(plan, memory, np.random.default_rng(0), with_context=True)
    assert np.array_equal(out.num_steps, plan.num_steps) and np.array_equal(out.num_examples, plan.num_examples)
    for c, user in enumerate(plan.clients):
        a, b = plan.client_examples(c), out.client_examples(c)
        items, labels, steps = out.items[b], out.labels[b], out.steps[b]
        assert np.all(np.diff(steps) >= 0)
        for s in range(plan.num_steps[c]):
            original = plan.items[a][plan.steps[a] == s]
            here = steps == s
            rec = here & (labels >= 0)
            assert np.array_equal(items[rec], original)  # planned examples unchanged, same order
            replay = here & (labels <= -1)
            if user < memory.shape[0]:
                k, priority = decode_replay_label(torch.as_tensor(labels[replay]), n)
                assert np.array_equal(items[replay][np.argsort(k.numpy())], memory[user])
                assert sorted(priority.tolist()) == list(range(n))
            else:
                assert not replay.any()
            context = here & (labels == CONTEXT_LABEL)
            earlier = set(plan.items[a][plan.steps[a] < s].tolist()) if user < memory.shape[0] else set()
            assert set(items[context].tolist()) == earlier - set(original.tolist())
            assert np.unique(items[context]).size == context.sum()
    assert np.any(out.labels == CONTEXT_LABEL)
    no_context = augment_plan_with_replay(plan, memory, np.random.default_rng(0), with_context=False)
    assert not np.any(no_context.labels == CONTEXT_LABEL)


def test_client_loss_wiring_by_hand():
    """Eqs. 2–6 end to end on one client: ranks from the local model, δ, the sampled item, the loss."""
    model = FedMF(1, 4, dim=2)
    table = torch.tensor([[3.0, 0.0], [2.0, 0.0], [1.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    params = {"user_emb": torch.tensor([[1.0, 0.0]], dtype=torch.float64), "item_emb": table}  # scores 3, 2, 1, 0
    memory = torch.tensor([[2, 3]])  # S_u = (item 2, item 3): student ranks 3 and 4 -> Δ = 2 + 2 = 4
    teacher = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    eps = -math.log(0.6) / 4  # δ = 0.6 -> ⌊0.6 · 2⌋ = 1 item
    loss = f3crec.ReplayDistillationLoss(memory, teacher, lambda_kd=0.5, eps=eps, record=True)
    loss._download = {"item_emb": table}  # what prepare_round keeps
    labels = [1.0, 0.0, -(1 + 0 + 2 * 1), -(1 + 1 + 2 * 0)]  # item 2: k=0, priority 1; item 3: k=1, priority 0
    batch = LocalBatch(clients=torch.tensor([0]), rows=torch.tensor([[0, 1, 2, 3]]), items=torch.tensor([[0, 1, 2, 3]]),
                       labels=torch.tensor([labels], dtype=torch.float64), mask=torch.ones(1, 4, dtype=torch.float64))

    def bce(logit, target):
        p = 1 / (1 + math.exp(-logit))
        return -(target * math.log(p) + (1 - target) * math.log(1 - p))

    rec = (bce(3.0, 1.0) + bce(2.0, 0.0)) / 2
    kd_item3 = bce(0.0, 1 / (1 + math.exp(1.0)))  # only the priority-0 item is in M_u
    assert loss(model, params, batch).item() == pytest.approx(rec + 0.5 * kd_item3, abs=1e-12)
    assert loss.records[-1]["shift"].tolist() == [4.0] and loss.records[-1]["size"].tolist() == [1]
    loss.eps = 0.0  # δ = 1: both items
    kd_both = (bce(1.0, 1 / (1 + math.exp(-1.0))) + kd_item3) / 2
    assert loss(model, params, batch).item() == pytest.approx(rec + 0.5 * kd_both, abs=1e-12)


@pytest.mark.parametrize("refresh", ["all", "trained"])
def test_memory_refresh_after_a_block(refresh):
    _, ctx, config = _block_one(fedmf_backbone(dim=4))
    # Users 0-4 do not train in this block (every synthetic user is active in every block).
    train = ctx.split.train
    keep = train.users >= 5
    ctx = dataclasses.replace(ctx, split=dataclasses.replace(
        ctx.split, train=Pairs.from_arrays(train.users[keep], train.items[keep], train.num_users)))
    state = initial_block_state(ctx, config.seed, device="cpu")  # stands for block 1's best state
    method = F3CRec(top_n=6, memory_refresh=refresh)
    memory = method.after_block(ctx, state.global_state, state.private_state)
    scores = ctx.model.score_users(state.global_state, state.private_state, torch.arange(ctx.model.num_users))
    fresh_items, fresh_logits = top_n_memory(scores, 6)
    assert memory["topn_items"].shape == (ctx.model.num_users, 6)
    old_users = ctx.previous.num_users
    idle = np.setdiff1d(np.arange(old_users), ctx.split.train.active_users())  # old users not trained in block 1
    assert idle.tolist() == [0, 1, 2, 3, 4]
    expected_items = fresh_items.clone()
    if refresh == "trained":  # the public code: idle users keep their older list
        expected_items[idle] = ctx.previous.memory["topn_items"][idle]
    assert torch.equal(memory["topn_items"], expected_items)
    # teacher logits always come from the newest model, at the listed items
    torch.testing.assert_close(memory["topn_logits"], scores.gather(1, expected_items), rtol=0, atol=1e-12)


def test_loss_refuses_to_run_without_its_plan():
    _, ctx, config = _block_one(fedmf_backbone(dim=4))
    loss = F3CRec(top_n=6).make_method(ctx).client_loss
    batch = LocalBatch(clients=torch.tensor([0]), rows=torch.tensor([[1, 2]]), items=torch.tensor([[1, 2]]),
                       labels=torch.tensor([[1.0, -1.0]], dtype=torch.float64),
                       mask=torch.ones(1, 2, dtype=torch.float64))
    state = initial_block_state(ctx, config.seed, device="cpu")
    params = {"user_emb": state.private_state["user_emb"][:1], "item_emb": state.global_state["item_emb"]}
    with pytest.raises(RuntimeError, match="PlanAugmentingExecutor"):
        loss(ctx.model, params, batch)


# -- Reg baseline -----------------------------------------------------------------------------------
def test_regularisation_penalty_by_hand():
    model = FedMF(3, 4, dim=2)
    previous_global = {"item_emb": torch.zeros(3, 2, dtype=torch.float64)}  # block t-1 had 3 items, 2 users
    previous_private = {"user_emb": torch.zeros(2, 2, dtype=torch.float64)}
    loss = ParameterRegularisationLoss(previous_global, previous_private, lambda_reg=0.5)
    params = {"user_emb": torch.tensor([[1.0, 1.0], [2.0, 0.0]], dtype=torch.float64),
              "item_emb": torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [3.0, 3.0]], dtype=torch.float64)}
    # client 0 = old user 1: items 1, 1 (duplicate), 3 (new item); client 1 = new user 2: item 0 and padding.
    batch = LocalBatch(clients=torch.tensor([1, 2]), rows=torch.tensor([[1, 1, 3], [0, 0, 0]]),
                       items=torch.tensor([[1, 1, 3], [0, 0, 0]]),
                       labels=torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64),
                       mask=torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64))
    base = bce_client_loss(model, params, batch)
    # client 0: ‖p‖² = 1 + 1, item 1 once: 4; item 3 is new -> 0. client 1: new user -> 0, item 0: 1.
    torch.testing.assert_close(loss(model, params, batch) - base, 0.5 * torch.tensor([6.0, 1.0], dtype=torch.float64))


def test_regularisation_sequential_equals_batched():
    _, ctx, config = _block_one(fedmf_backbone(dim=4, lr=2.0))
    # Item rows step with lr × I = 100 here: the pull 2λ(q − q_old) is stable only for 2λ·100 < 2.
    method = ParameterRegularisation(lambda_reg=0.002)
    seq = _train_block(ctx, config, method, SequentialExecutor())
    bat = _train_block(ctx, config, method, BatchedExecutor(chunk_size=7))
    _assert_states_close(seq, bat)
    plain = _train_block(ctx, config, ParameterRegularisation(lambda_reg=0.0), BatchedExecutor())
    assert float((plain.state.global_state["item_emb"] - bat.state.global_state["item_emb"]).abs().max()) > 1e-6


# -- closed-form gradients (the batched executor's path for FedMF and PFedRec) ---------------------
def _replay_step(model, seed, num_clients=4, top_n=5):
    """An unpadded step of ``num_clients`` clients (rec, replay and context examples, float64):
    ``(loss with its round prepared, head (C, ...), row slots (S, 3), slot (E,), client (E,),
    item (E,), label (E,), the same step as a padded LocalBatch)``."""
    gen = torch.Generator().manual_seed(seed)
    num_items = model.num_items
    download = {"item_emb": torch.randn(num_items, 3, generator=gen, dtype=torch.float64)}
    memory = torch.stack([torch.randperm(num_items, generator=gen)[:top_n] for _ in range(num_clients - 1)])
    teacher = torch.randn(num_clients - 1, top_n, generator=gen, dtype=torch.float64) * 2
    loss = f3crec.ReplayDistillationLoss(memory, teacher, lambda_kd=0.7, eps=0.05, record=True)
    loss._download = download
    clients, items, labels = [], [], []
    for c in range(num_clients):  # the last client is a new user: no memory, no replay rows
        own = torch.randperm(num_items, generator=gen)[:3 + c]
        rec_labels = (torch.rand(own.numel(), generator=gen) < 0.4).double()
        items += own.tolist()
        labels += rec_labels.tolist()
        if c < num_clients - 1:
            priority = torch.randperm(top_n, generator=gen)
            items += memory[c].tolist()
            labels += [-(1.0 + k + top_n * float(priority[k])) for k in range(top_n)]
            items.append(int(torch.randint(num_items, (1,), generator=gen)))
            labels.append(CONTEXT_LABEL)
        clients += [c] * (len(items) - len(clients))
    client, item, label = torch.tensor(clients), torch.tensor(items), torch.tensor(labels, dtype=torch.float64)
    # Row slots: one per (client, item), the local copies moved away from the download.
    keys, row = torch.unique(client * num_items + item, return_inverse=True)
    rows_table = download["item_emb"][keys % num_items] + 0.3 * torch.randn(keys.numel(), 3, generator=gen,
                                                                           dtype=torch.float64)
    if type(model) is FedMF:  # the stepping clients' head, under the model's own names
        head = {"user_emb": torch.randn(num_clients, 3, generator=gen, dtype=torch.float64)}
    else:
        head = {"head_w": torch.randn(num_clients, 3, generator=gen, dtype=torch.float64),
                "head_b": torch.randn(num_clients, generator=gen, dtype=torch.float64)}
    sizes = torch.bincount(client).tolist()
    width = max(sizes)
    column = torch.cat([torch.arange(n) for n in sizes])
    padded = {key: torch.zeros(num_clients, width, dtype=dtype) for key, dtype in
              (("rows", torch.int64), ("items", torch.int64), ("labels", torch.float64), ("mask", torch.float64))}
    padded["rows"][client, column], padded["items"][client, column] = row, item
    padded["labels"][client, column], padded["mask"][client, column] = label, 1.0
    batch = LocalBatch(clients=torch.arange(num_clients), **padded)
    return loss, head, rows_table, row, client, item, label, batch


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("backbone", ["fedmf", "pfedrec"])
@pytest.mark.parametrize("adaptive,reduction", [(True, "mean"), (True, "sum"), (False, "mean")])
def test_closed_form_logit_gradients_equal_autograd_on_the_padded_loss(backbone, seed, adaptive, reduction):
    """logit_gradients (the batched executor's closed-form path) against the loss's own __call__
    on the padded batch and autograd, float64: the loss, the gradients of the item rows and of the
    head, and the recorded Δ / |M_u|."""
    from fedlib.engine.linear_head import linear_head_gradients
    from fedlib.models import PFedRec

    model = FedMF(4, 12, dim=3) if backbone == "fedmf" else PFedRec(4, 12, dim=3)
    loss, head, rows_table, row, client, item, label, batch = _replay_step(model, seed)
    loss.adaptive, loss.kd_reduction = adaptive, reduction
    head_names = list(head)
    live = {name: value.clone().requires_grad_(True) for name, value in head.items()}
    live["item_emb"] = rows_table.clone().requires_grad_(True)
    reference = loss(model, live, batch)  # (C,)
    expected = torch.autograd.grad(reference.sum(), [live[name] for name in head_names + ["item_emb"]])
    reference_records = loss.records[-1] if adaptive else None

    weight, bias = head_names[0], (head_names[1] if len(head_names) > 1 else None)
    got_loss, grads = linear_head_gradients(
        rows_table, head[weight], None if bias is None else head[bias], row, client, label, loss_fn=loss,
        step={"model": model, "items": item, "users": torch.arange(4), "head": head})
    torch.testing.assert_close(got_loss, reference.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(grads["head_w"], expected[0], rtol=0, atol=1e-12)
    if bias is not None:
        torch.testing.assert_close(grads["head_b"], expected[1], rtol=0, atol=1e-12)
    torch.testing.assert_close(grads["rows"], expected[-1], rtol=0, atol=1e-12)
    kd_rows = grads["rows"][row[label <= -1.0]]
    assert float(kd_rows.abs().max()) > 1e-4  # the distillation really reaches the replay rows
    if adaptive:
        for key in ("users", "shift", "size"):
            np.testing.assert_array_equal(loss.records[-1][key], reference_records[key])
        assert reference_records["size"].min() < 5  # the adaptive memory is not all of S_u here


def test_closed_form_path_is_taken_only_where_it_applies():
    from fedlib.engine.linear_head import closed_form_head
    from fedlib.models import FedNCF

    model = FedMF(4, 12, dim=3)
    loss = _replay_step(model, 0)[0]
    method = fedmf_method(model, client_loss=loss)
    head = closed_form_head(method)
    assert head.tables == ("item_emb",) and head.weight == "user_emb" and head.bias is None and head.loss is loss
    assert closed_form_head(fedmf_method(model)) is None  # FedMF under BCE: its kernel / autograd
    custom = f3crec.ReplayDistillationLoss(loss.memory_items, loss.teacher_logits, lambda_kd=0.7, eps=0.05,
                                           base_loss=lambda model, params, batch: bce_client_loss(model, params, batch))
    assert closed_form_head(fedmf_method(model, client_loss=custom)) is None  # a base loss of its own
    ncf = FedNCF(4, 12, dim=3)
    assert not loss.closed_form_applies(ncf)  # shared MLP layers: autograd
