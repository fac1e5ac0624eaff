"""CoFedRec: K-Means and the co-clustering server step by hand and against per-user references,
the supervised contrastive term, parameter roles, the server hook, short federated runs, bad inputs."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine_toys import BATCH, NUM_ITEMS, NUM_USERS, toy_train
from fedlib.engine import (BatchedExecutor, FederatedConfig, LocalBatch, SequentialExecutor, ParameterAveraging,
                           run_federated)
from fedlib.engine.plan import round_generator
from fedlib.engine.trainer import start_run
from fedlib.baselines.single_domain.cofedrec import (MEMBERSHIP_KEY, SERVER_STREAM, STATS_KEY, CoClusteringServer, CoFedRecLoss, CoFedRecModel,
                                     category_similarity, co_cluster_step, co_cluster_step_reference,
                                     cofedrec_method, elbow_split, kmeans, kmeans_reference, server_uniforms,
                                     supcon_loss, supcon_loss_dense, supcon_loss_reference)
from fedlib.baselines.continual.continual import PlanAugmentingExecutor
from fedlib.models import PFedRec

torch.set_num_threads(1)
F64 = torch.float64
R2 = 1 / math.sqrt(2)


# ---------------------------------------------------------------------------------------------
# K-Means
# ---------------------------------------------------------------------------------------------
def test_kmeans_by_hand():
    points = torch.tensor([[0.0, 0.0], [0.0, 1.0], [10.0, 0.0], [10.0, 1.0]], dtype=F64)
    # u0 = 0 -> first centre = point 0. D² = (0, 1, 100, 101), CDF = (0, 1/202, 101/202, 1):
    # u1 = 0.9 -> point 3. Lloyd: {0, 1} / {2, 3}, centres (0, .5), (10, .5), then no change.
    membership, centers, iterations = kmeans(points, 2, [0.0, 0.9])
    assert membership.tolist() == [0, 0, 1, 1]
    torch.testing.assert_close(centers, torch.tensor([[0.0, 0.5], [10.0, 0.5]], dtype=F64))
    assert iterations == 2


def test_kmeans_by_hand_second_draw():
    points = torch.tensor([[0.0, 0.0], [0.0, 1.0], [10.0, 0.0], [10.0, 1.0]], dtype=F64)
    # Centres (0, 0) and (0, 1). Distances²: p2 -> 100 / 101 (centre 0), p3 -> 101 / 100 (centre 1).
    # Iteration 1: {0, 2} / {1, 3}: centres (5, 0), (5, 1); iteration 2: same assignment -> stop.
    membership, centers, iterations = kmeans(points, 2, [0.0, 0.004])
    assert membership.tolist() == [0, 1, 0, 1]
    torch.testing.assert_close(centers, torch.tensor([[5.0, 0.0], [5.0, 1.0]], dtype=F64))
    assert iterations == 2


@pytest.mark.parametrize("k, seed", [(1, 0), (3, 1), (6, 2), (9, 3)])
def test_kmeans_batched_equals_reference(k, seed):
    gen = torch.Generator().manual_seed(seed)
    points = torch.randn(23, 3, generator=gen, dtype=F64)
    uniforms = np.random.default_rng(seed).random(k)
    fast = kmeans(points, k, uniforms, max_iter=50)
    slow = kmeans_reference(points, k, uniforms, max_iter=50)
    assert torch.equal(fast[0], slow[0])
    torch.testing.assert_close(fast[1], slow[1], atol=1e-6, rtol=0)
    assert fast[2] == slow[2]


def test_squared_distances_match_explicit_differences_and_keep_coinciding_points_at_zero():
    from fedlib.baselines.single_domain.seeded_kmeans import _squared_distances

    gen = torch.Generator().manual_seed(5)
    points = torch.randn(50, 8, generator=gen) * 3 + 10  # float32, far from the origin: cancellation-prone
    centers = torch.cat([points[[3, 7]], torch.randn(1, 8, generator=gen) + 10])
    distances = _squared_distances(points, centers)
    explicit = (points.double()[:, None, :] - centers.double()[None, :, :]).pow(2).sum(-1)
    assert distances.dtype == torch.float64 and distances.shape == (50, 3)
    assert distances[3, 0] == 0.0 and distances[7, 1] == 0.0 and bool((distances >= 0).all())
    torch.testing.assert_close(distances, explicit, rtol=1e-9, atol=1e-9)


def test_kmeans_keeps_an_empty_cluster_centre():
    points = torch.tensor([[0.0], [0.0], [0.0], [4.0]], dtype=F64)
    # u0 = 0 -> point 0; D² = (0, 0, 0, 16): u1 -> point 3; u2 -> D² = 0 everywhere -> uniform pick: point 1 (= point 0)
    membership, centers, _ = kmeans(points, 3, [0.0, 0.5, 0.3])
    assert membership.tolist() == [0, 0, 0, 1]  # ties go to the lowest index: cluster 2 stays empty
    torch.testing.assert_close(centers, torch.tensor([[0.0], [4.0], [0.0]], dtype=F64))


# ---------------------------------------------------------------------------------------------
# Users grouped on one category
# ---------------------------------------------------------------------------------------------
def five_users():
    """Users 0..4, items 0..2 (d = 2). Category = items {0, 1}; core = user 0."""
    return torch.tensor([
        [[1, 0], [0, 1], [5, 5]],      # core
        [[2, 0], [0, 3], [1, 0]],      # cos 1 + 1 = 2
        [[1, 1], [0, 1], [0, 1]],      # 1/√2 + 1
        [[-1, 0], [1, 0], [1, 1]],     # −1 + 0
        [[0, 1], [1, 0], [2, 2]],      # 0 + 0
    ], dtype=F64)


def test_category_similarity_and_elbow_by_hand():
    tables = five_users()
    sim = category_similarity(tables, np.arange(5), core=0, members=torch.tensor([0, 1]))
    torch.testing.assert_close(sim, torch.tensor([2, 2, 1 + R2, -1, 0], dtype=F64))
    order, elbow, distances = elbow_split(sim)
    # sorted: u0 2, u1 2, u2 1.707, u4 0, u3 −1; chord 2 -> −1 over 4 steps (slope −0.75):
    # vertical gaps 0, .75, 1.207, .25, 0; the distance is the gap / √(1 + .75²) = gap / 1.25
    assert order.tolist() == [0, 1, 2, 4, 3]
    assert elbow == 2
    torch.testing.assert_close(distances, torch.tensor([0, 0.75, 0.5 + R2, 0.25, 0], dtype=F64) / 1.25)
    # a zero row has cosine 0
    tables[4, 0] = 0.0
    assert float(category_similarity(tables, [4], 0, torch.tensor([0]))) == 0.0


def test_elbow_does_not_depend_on_the_scale_of_the_axes():
    values = torch.tensor([4.0, 3.9, 3.8, 1.0, 0.9], dtype=F64)
    # chord from 4 to .9 over 4 steps: line 4, 3.225, 2.45, 1.675, .9 -> gaps 0, .675, 1.35, −.675, 0
    assert elbow_split(values)[1] == 2
    assert elbow_split(values * 100)[1] == 2
    shuffled = values[[3, 0, 4, 2, 1]]
    order, elbow, _ = elbow_split(shuffled)
    assert elbow == 2 and order[:3].tolist() == [1, 4, 3]
    assert elbow_split(torch.tensor([1.0, 5.0]))[1] == 0  # two points: only the best one


def test_co_cluster_step_by_hand():
    # Items 0, 1 near (1, 0) and items 2, 3 near (0, 1) in every table: K = 2 splits them.
    base = torch.tensor([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0], [0.1, 1.0]], dtype=F64)
    tables = base.expand(4, 4, 2).clone()
    tables[3, 0] = torch.tensor([-1.0, 0.0], dtype=F64)  # user 3 disagrees on item 0
    tables[2, 1] = torch.tensor([0.0, 1.0], dtype=F64)  # user 2 a little on item 1
    # uniforms: k-means++ from point 0 then point 2 (u = .9 in the D² CDF); core = floor(.0 · 4) = user 0;
    # category = floor(.1 · 2) = cluster 0 = items {0, 1}
    result = co_cluster_step(tables, np.arange(4), 2, [0.0, 0.9, 0.0, 0.1])
    assert result.membership.tolist() == [0, 0, 1, 1]
    assert (result.core, result.category) == (0, 0)
    # s = (2, 2, 1 + cos((1, .1), (0, 1)), −1 + 1)
    c = 0.1 / math.sqrt(1.01)
    torch.testing.assert_close(result.similarity, torch.tensor([2, 2, 1 + c, 0], dtype=F64))
    # sorted 2, 2, 1.0995, 0: chord slope −2/3, gaps 0, .667, .433, 0 -> elbow 1: users {0, 1}
    assert result.elbow == 1 and result.similar.tolist() == [0, 1]
    torch.testing.assert_close(result.group_table, base)
    torch.testing.assert_close(result.global_table, tables.mean(0))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_server_step_batched_equals_per_user_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    tables = torch.randn(11, 25, 3, generator=gen, dtype=F64)
    tables[:, :8] += 2.0  # some structure among items
    participants = np.sort(np.random.default_rng(seed).choice(11, size=8, replace=False))
    uniforms = server_uniforms(np.random.default_rng(100 + seed), 4)
    fast = co_cluster_step(tables, participants, 4, uniforms, chunk_size=3)
    slow = co_cluster_step_reference(tables, participants, 4, uniforms)
    torch.testing.assert_close(fast.global_table, slow.global_table, atol=1e-6, rtol=0)
    assert torch.equal(fast.membership, slow.membership)
    torch.testing.assert_close(fast.centers, slow.centers, atol=1e-6, rtol=0)
    assert (fast.core, fast.category, fast.elbow) == (slow.core, slow.category, slow.elbow)
    torch.testing.assert_close(fast.similarity, slow.similarity, atol=1e-6, rtol=0)
    assert torch.equal(fast.order, slow.order) and torch.equal(fast.similar, slow.similar)
    torch.testing.assert_close(fast.group_table, slow.group_table, atol=1e-6, rtol=0)
    assert fast.core in participants.tolist() and fast.core in fast.similar.tolist()


# ---------------------------------------------------------------------------------------------
# The supervised contrastive term and the loss
# ---------------------------------------------------------------------------------------------
def test_supcon_by_hand():
    # v = (1,0), (1,0), (0,1), (0,1); labels 0, 0, 0, 1; τ = 1. Anchor 3 has no positive.
    features = torch.tensor([[[1.0, 0], [1, 0], [0, 1], [0, 1]]], dtype=F64)
    labels = torch.tensor([[0, 0, 0, 1]])
    present = torch.ones(1, 4)
    log_den_01 = math.log(math.e + 2)  # anchors 0, 1: others have dots 1, 0, 0
    log_den_2 = math.log(2 + math.e)  # anchor 2: dots 0, 0, 1
    # "in":  anchor 0: −log(½ (e + 1) / (e + 2)); anchor 2: −log(½ (1 + 1) / (2 + e))
    expected_in = (2 * -math.log(0.5 * (math.e + 1) / (math.e + 2)) + log_den_2) / 3
    # "out": anchor 0: −½ [(1 − L) + (0 − L)]; anchor 2: −½ [(0 − L) + (0 − L)] = L
    expected_out = (2 * -0.5 * ((1 - log_den_01) + (0 - log_den_01)) + log_den_2) / 3
    assert float(supcon_loss(features, labels, present, 1.0, "in")) == pytest.approx(expected_in)
    assert float(supcon_loss(features, labels, present, 1.0, "out")) == pytest.approx(expected_out)
    # normalisation: scaling a row changes nothing with normalize=True, everything without
    scaled = features.clone()
    scaled[0, 1] *= 3
    assert float(supcon_loss(scaled, labels, present, 1.0)) == pytest.approx(expected_in)
    assert float(supcon_loss(scaled, labels, present, 1.0, normalize=False)) != pytest.approx(expected_in)
    # a row that is not present takes no part; no positive at all -> 0
    assert float(supcon_loss(features, torch.tensor([[0, 1, 2, 3]]), present, 1.0)) == 0.0


@pytest.mark.parametrize("variant", ["in", "out"])
@pytest.mark.parametrize("normalize", [True, False])
def test_supcon_batched_equals_per_anchor_reference(variant, normalize):
    gen = torch.Generator().manual_seed(4)
    features = torch.randn(3, 9, 4, generator=gen, dtype=F64)
    labels = torch.randint(0, 3, (3, 9), generator=gen)
    present = torch.ones(3, 9)
    present[1, 6:] = 0
    present[2, ::2] = 0
    fast = supcon_loss(features, labels, present, 0.5, variant, normalize)
    slow = supcon_loss_reference(features, labels, present, 0.5, variant, normalize)
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=0)


def test_fused_supcon_equals_the_autograd_form_in_value_and_gradient():
    gen = torch.Generator().manual_seed(11)
    clients, width = 6, 14
    features = torch.randn(clients, width, 5, generator=gen, dtype=F64, requires_grad=True)
    labels = torch.randint(0, 4, (clients, width), generator=gen)
    present = (torch.rand(clients, width, generator=gen) < 0.8).to(F64)
    present[0] = 0                 # a client with no rows at all
    present[1] = 0
    present[1, :2] = 1             # two rows ...
    labels[1, :2] = torch.tensor([0, 1])  # ... with no positive: loss 0, gradient 0
    features.data[2, 3] = 0.0      # a zero row (normalises to zero)
    weights = torch.rand(clients, generator=gen, dtype=F64)
    for temperature in (0.05, 0.5, 2.0):
        fused = supcon_loss_dense(features, labels, present, temperature)
        plain = supcon_loss_dense(features, labels, present, temperature, fused=False)
        torch.testing.assert_close(fused, plain, atol=1e-12, rtol=1e-12)
        (grad_fused,) = torch.autograd.grad((fused * weights).sum(), features)
        (grad_plain,) = torch.autograd.grad((plain * weights).sum(), features)
        torch.testing.assert_close(grad_fused, grad_plain, atol=1e-10, rtol=1e-10)
    assert float(fused.detach()[1]) == 0.0 and float(grad_fused[1].abs().sum()) == 0.0
    # labels are only compared: shifted or negative labels give the same loss
    torch.testing.assert_close(supcon_loss_dense(features, labels - 7, present, 0.5),
                               supcon_loss_dense(features, labels, present, 0.5), atol=1e-12, rtol=0)
    # finite differences (away from the zero row, where normalising has a kink)
    smooth = torch.randn(3, 7, 3, generator=gen, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: supcon_loss_dense(x, labels[2:5, :7], present[2:5, :7], 0.5), (smooth,))


@pytest.mark.parametrize("variant", ["in", "out"])
def test_supcon_width_groups_give_the_dense_values_and_gradients(variant):
    gen = torch.Generator().manual_seed(7)
    clients, width = 37, 24
    features = torch.randn(clients, width, 4, generator=gen, dtype=F64, requires_grad=True)
    labels = torch.randint(0, 4, (clients, width), generator=gen)
    used = torch.randint(0, width + 1, (clients,), generator=gen)  # real rows first, then padding
    present = (torch.arange(width)[None, :] < used[:, None]).to(F64)
    present[3, 1] = 0  # a duplicate inside the real rows
    grouped = supcon_loss(features, labels, present, 0.5, variant, width_groups=5)
    dense = supcon_loss_dense(features, labels, present, 0.5, variant)
    torch.testing.assert_close(grouped, dense, atol=1e-12, rtol=0)
    weights = torch.rand(clients, generator=gen, dtype=F64)
    (grad_grouped,) = torch.autograd.grad((grouped * weights).sum(), features)
    (grad_dense,) = torch.autograd.grad((dense * weights).sum(), features)
    torch.testing.assert_close(grad_grouped, grad_dense, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="width_groups"):
        supcon_loss(features, labels, present, 0.5, width_groups=0)


def test_supcon_gradient_pulls_same_cluster_items_together():
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(1, 8, 3, generator=gen, dtype=F64, requires_grad=True)
    labels = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1]])
    loss = supcon_loss(features, labels, torch.ones(1, 8), 0.5)
    loss.sum().backward()
    stepped = (features - 0.5 * features.grad).detach()
    assert float(supcon_loss(stepped, labels, torch.ones(1, 8), 0.5)) < float(loss.detach())

    def within_minus_across(f):
        v = torch.nn.functional.normalize(f[0], dim=-1)
        cos = v @ v.T
        same = labels[0][:, None] == labels[0][None, :]
        off = ~torch.eye(8, dtype=torch.bool)
        return float(cos[same & off].mean() - cos[~same].mean())

    assert within_minus_across(stepped) > within_minus_across(features.detach())


def toy_batch():
    """1 client, 3 items, d = 2 (sequential layout: full table, rows = item ids)."""
    params = {
        "personal_item_emb": torch.tensor([[1.0, 0], [0, 1], [1, 1]], dtype=F64),  # full table (I, d)
        "head_w": torch.tensor([[1.0, 2.0]], dtype=F64),
        "head_b": torch.tensor([0.5], dtype=F64),
    }
    batch = LocalBatch(clients=torch.tensor([0]), rows=torch.tensor([[0, 1, 2]]), items=torch.tensor([[0, 1, 2]]),
                       labels=torch.tensor([[1.0, 0.0, 0.0]], dtype=F64), mask=torch.ones(1, 3, dtype=F64))
    return params, batch


def test_loss_is_bce_until_a_membership_arrives_then_adds_lambda_supcon():
    model = CoFedRecModel(1, 3, dim=2)
    params, batch = toy_batch()
    # logits w·v + b: item 0 -> 1.5 (y=1), item 1 -> 2.5 (y=0), item 2 -> 3.5 (y=0)
    sp = lambda z: math.log1p(math.exp(z))  # noqa: E731
    bce = (sp(-1.5) + sp(2.5) + sp(3.5)) / 3
    loss = CoFedRecLoss(lam=0.3, temperature=0.5, contrastive_rows="batch")
    assert float(loss(model, params, batch)) == pytest.approx(bce)
    loss.set_membership(torch.tensor([0, 0, 1]))
    rows = params["personal_item_emb"][batch.rows]
    contrast = float(supcon_loss(rows, torch.tensor([[0, 0, 1]]), torch.ones(1, 3), 0.5))
    # anchors 0, 1 (item 2 has no positive): cos(0,1) = 0, cos(0,2) = cos(1,2) = 1/√2, τ = .5
    by_hand = -math.log(math.exp(0) / (math.exp(0) + math.exp(2 * R2)))
    assert contrast == pytest.approx(by_hand)
    assert float(loss(model, params, batch)) == pytest.approx(bce + 0.3 * by_hand)
    with pytest.raises(ValueError, match="PlanAugmentingExecutor"):
        table_mode = CoFedRecLoss(lam=0.3, contrastive_rows="table")
        table_mode.set_membership(torch.tensor([0, 0, 1]))
        table_mode(model, params, LocalBatch(batch.clients, batch.rows[:, :2], batch.items[:, :2],
                                             batch.labels[:, :2], batch.mask[:, :2]))


# ---------------------------------------------------------------------------------------------
# Roles, server hook, runs
# ---------------------------------------------------------------------------------------------
def test_param_roles_and_learning_rates():
    train = toy_train()
    model = CoFedRecModel(NUM_USERS, NUM_ITEMS, dim=8)
    assert model.param_kinds == {"personal_item_emb": "private_rows", "head_w": "private_dense",
                                 "head_b": "private_dense"}
    assert model.public_names == ()  # nothing goes through FedAvg: the server step runs in before_round
    method = cofedrec_method(model, train, FederatedConfig(rounds=1), lr=0.05, lr_eta=80.0)
    assert method.learning_rates == {"personal_item_emb": 0.05 * NUM_ITEMS * 80, "head_w": 0.05, "head_b": 0.05}
    assert method.steps == (("head_w", "head_b"), ("personal_item_emb",))  # PFedRec: head, then items
    assert cofedrec_method(model, train, FederatedConfig(rounds=1), two_step=False).steps == (
        ("personal_item_emb", "head_w", "head_b"),)
    assert method.name == "CoFedRec" and isinstance(method.client_loss, CoFedRecLoss)
    state = ParameterAveraging(method, None, FederatedConfig(rounds=1), device="cpu").init(3)
    tables = state.private_state["personal_item_emb"]
    assert torch.equal(tables[0], tables[-1])  # every client starts from one shared table


def test_server_hook_groups_users_and_sends_the_membership():
    train = toy_train()
    config = FederatedConfig(rounds=2, seed=5, batch_size=BATCH, dtype="float64")
    model = CoFedRecModel(NUM_USERS, NUM_ITEMS, dim=3)
    method = cofedrec_method(model, train, config, num_clusters=4)
    run = start_run(ParameterAveraging(method, None, config, device="cpu"), config.schedule(), config.seed)
    state = run.state  # the hook changes the run's state in place
    method.before_round(run, 0, None)  # the server step reads no plan
    assert method.client_loss.membership is None and MEMBERSHIP_KEY not in state.extra
    tables = state.private_state["personal_item_emb"]
    tables += torch.randn(tables.shape, generator=torch.Generator().manual_seed(0), dtype=F64)
    uploads = tables.clone()
    method.before_round(run, 1, None)
    expected = co_cluster_step(uploads, train.active_users(), 4,
                               server_uniforms(round_generator(5, 1, SERVER_STREAM), 4))
    similar = expected.similar.tolist()
    for u in range(NUM_USERS):
        want = expected.group_table if u in similar else uploads[u]
        torch.testing.assert_close(tables[u], want)
    assert torch.equal(method.client_loss.membership, expected.membership)
    assert torch.equal(state.extra[MEMBERSHIP_KEY], expected.membership)
    stats = state.extra[STATS_KEY]
    assert stats["participants"] == NUM_USERS and stats["similar"] == len(similar) and 1 <= len(similar) < NUM_USERS


@pytest.mark.parametrize("rows", ["table", "batch"])
def test_executors_agree_on_cofedrec(rows):
    train = toy_train()
    runs = []
    for executor in (SequentialExecutor(), BatchedExecutor(chunk_size=6)):
        model = CoFedRecModel(NUM_USERS, NUM_ITEMS, dim=4, init_std=0.1)
        config = FederatedConfig(rounds=3, seed=2, batch_size=BATCH, dtype="float64")
        method = cofedrec_method(model, train, config, lr=0.1, lr_eta=2.0, lam=0.5, num_clusters=5,
                                 contrastive_rows=rows)
        runs.append(run_federated(method, train, config, executor=PlanAugmentingExecutor(executor), device="cpu"))
    a, b = runs
    for name in a.state.private_state:
        torch.testing.assert_close(a.state.private_state[name], b.state.private_state[name], atol=1e-9, rtol=0,
                                   msg=name)
    np.testing.assert_allclose([r["train_loss"] for r in a.history], [r["train_loss"] for r in b.history], atol=1e-9)
    assert a.state.extra[STATS_KEY] == b.state.extra[STATS_KEY]


def _balanced_bce(model, state, train):
    with torch.no_grad():
        logits = model.score_users(state.global_state, state.private_state, torch.arange(train.num_users))
    labels = torch.zeros_like(logits)
    labels[torch.as_tensor(train.users), torch.as_tensor(train.items)] = 1.0
    losses = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    return float((losses * labels).sum() / labels.sum() + (losses * (1 - labels)).sum() / (1 - labels).sum())


def test_federated_run_reduces_training_loss():
    train = toy_train()
    model = CoFedRecModel(NUM_USERS, NUM_ITEMS, dim=8, init_std=0.1)
    config = FederatedConfig(rounds=8, seed=0, batch_size=BATCH)
    method = cofedrec_method(model, train, config, lr=0.2, lr_eta=2.0, lam=0.005, num_clusters=5)
    before = _balanced_bce(model, ParameterAveraging(method, None, config, device="cpu").init(config.seed), train)
    run = run_federated(method, train, config, executor=PlanAugmentingExecutor(BatchedExecutor()), device="cpu")
    after = _balanced_bce(model, run.state, train)
    assert after < 0.8 * before, (before, after)
    assert run.history[-1]["train_loss"] < run.history[1]["train_loss"]  # round 0 is BCE only
    assert run.state.extra[STATS_KEY]["round"] == config.rounds - 1


# ---------------------------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------------------------
def test_bad_inputs_raise_with_a_fix():
    train = toy_train()
    config = FederatedConfig(rounds=1)
    model = CoFedRecModel(NUM_USERS, NUM_ITEMS, dim=2)
    tables = torch.zeros(3, 5, 2, dtype=F64)
    with pytest.raises(ValueError, match="num_clusters=6 exceeds the 5 items"):
        kmeans(tables[0], 6, np.zeros(6))
    with pytest.raises(ValueError, match="at least K = 3 numbers"):
        kmeans(tables[0], 3, [0.1])
    with pytest.raises(ValueError, match=r"K \+ 2 = 4 numbers in \[0, 1\): use server_uniforms"):
        co_cluster_step(tables, [0, 1], 2, [0.1, 0.2])
    with pytest.raises(ValueError, match="duplicate user ids"):
        co_cluster_step(tables, [0, 0], 2, [0.1, 0.2, 0.3, 0.4])
    with pytest.raises(ValueError, match=r"user ids in \[0, 3\)"):
        category_similarity(tables, [0, 7], 0, torch.tensor([0]))
    with pytest.raises(ValueError, match=r"\(U, I, d\)"):
        co_cluster_step(tables[0], [0], 2, [0.1] * 4)
    with pytest.raises(ValueError, match="participants is empty"):
        co_cluster_step(tables, [], 2, [0.1] * 4)
    with pytest.raises(ValueError, match="non-empty 1-D"):
        elbow_split(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        CoFedRecLoss(temperature=0.0)
    with pytest.raises(ValueError, match="lam must be a finite number >= 0"):
        CoFedRecLoss(lam=-1.0)
    with pytest.raises(ValueError, match="unknown variant 'mean'"):
        CoFedRecLoss(variant="mean")
    with pytest.raises(ValueError, match="unknown contrastive_rows"):
        CoFedRecLoss(contrastive_rows="all")
    with pytest.raises(ValueError, match=r"labels .* must both be \(C, B\)"):
        supcon_loss(torch.zeros(1, 3, 2), torch.zeros(1, 2), torch.ones(1, 3), 0.5)
    with pytest.raises(ValueError, match="1-D integer tensor"):
        CoFedRecLoss().set_membership(torch.zeros(3))
    with pytest.raises(ValueError, match="CoFedRecModel"):
        cofedrec_method(PFedRec(NUM_USERS, NUM_ITEMS, 2), train, config)
    with pytest.raises(ValueError, match="num_clusters=61 exceeds the model's 60 items"):
        cofedrec_method(model, train, config, num_clusters=61)
    with pytest.raises(ValueError, match="FederatedConfig"):
        cofedrec_method(model, train, {"seed": 0})
    with pytest.raises(ValueError, match="training Pairs"):
        cofedrec_method(model, train.users, config)
    with pytest.raises(ValueError, match="num_users >= train.num_users"):
        cofedrec_method(CoFedRecModel(3, NUM_ITEMS, 2), train, config)
    with pytest.raises(ValueError, match="client_loss"):
        cofedrec_method(model, train, config, client_loss=lambda *a: None)
    with pytest.raises(ValueError, match="max_iter must be an integer >= 1"):
        CoClusteringServer(CoFedRecLoss(), train, config, max_iter=0)
