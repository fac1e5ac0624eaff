"""GPFedRec: user-relation graph (correct and code-compatible), message passing, regulariser, runs."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine_toys import BATCH, NUM_ITEMS, NUM_USERS, toy_train
from fedlib.data.sampling import NegativeSampler
from fedlib.engine import (BatchedExecutor, FederatedConfig, LocalBatch, SequentialExecutor, ParameterAveraging,
                           make_round_plan, round_generator, run_federated)
from fedlib.engine.trainer import start_run
from fedlib.baselines.continual.continual import PlanAugmentingExecutor
from fedlib.baselines.single_domain.gpfedrec import (BROADCAST_KEY, CERTIFICATE_MARGIN, CONTEXT_LABEL, GRAPH_LOG_KEY, GRAPH_STATS_KEY,
                                     GPFedRecExecutor, GPFedRecLoss, GPFedRecModel, GraphGuidedServer, add_table_context, complete_graph_threshold,
                                     first_occurrence, gpfedrec_method,
                                     graph_personalise, graph_personalise_reference, graph_regulariser,
                                     message_passing, neighbour_weights, user_similarity)

torch.set_num_threads(1)

R2 = 1 / math.sqrt(2)


def three_users():
    """Three users, one item, d = 2: x0 = (1, 0), x1 = (1, 1), x2 = (0, 2)."""
    return torch.tensor([[[1.0, 0.0]], [[1.0, 1.0]], [[0.0, 2.0]]], dtype=torch.float64)  # (3, 1, 2)


# ---------------------------------------------------------------------------------------------
# The graph on a hand-computed 3-user case
# ---------------------------------------------------------------------------------------------
def test_cosine_similarity_by_hand():
    # cos(x0, x1) = 1/√2, cos(x0, x2) = 0, cos(x1, x2) = 2 / (√2 · 2) = 1/√2
    expected = torch.tensor([[1, R2, 0], [R2, 1, R2], [0, R2, 1]], dtype=torch.float64)
    torch.testing.assert_close(user_similarity(three_users()), expected)


def test_graph_by_hand_threshold_and_one_over_k_weights():
    agg = graph_personalise(three_users())
    # τ = mean(S) = (3 + 4/√2) / 9 ≈ 0.6476: user 0 -> {0, 1}, user 1 -> {0, 1, 2}, user 2 -> {1, 2}
    assert agg.threshold == pytest.approx((3 + 4 * R2) / 9)
    expected_weights = torch.tensor([[1 / 2, 1 / 2, 0], [1 / 3, 1 / 3, 1 / 3], [0, 1 / 2, 1 / 2]], dtype=torch.float64)
    torch.testing.assert_close(agg.weights, expected_weights)
    # r0 = (x0 + x1)/2, r1 = (x0 + x1 + x2)/3, r2 = (x1 + x2)/2; q_g = their mean
    expected_personal = torch.tensor([[[1.0, 0.5]], [[2 / 3, 1.0]], [[0.5, 1.5]]], dtype=torch.float64)
    torch.testing.assert_close(agg.personal, expected_personal)
    torch.testing.assert_close(agg.global_table, torch.tensor([[(1 + 2 / 3 + 0.5) / 3, 1.0]], dtype=torch.float64))


def test_code_flag_reproduces_distance_as_similarity():
    tables = three_users()
    distance = user_similarity(tables, "cosine_distance_as_in_code")
    expected = torch.tensor([[0, 1 - R2, 1], [1 - R2, 0, 1 - R2], [1, 1 - R2, 0]], dtype=torch.float64)
    torch.testing.assert_close(distance, expected)
    agg = graph_personalise(tables, similarity="cosine_distance_as_in_code")
    # τ = (2 + 4(1 − 1/√2)) / 9 ≈ 0.352: user 0's only "neighbour" is user 2, its *least* similar
    # user (orthogonal tables), and vice versa; user 1 has none and keeps its own table.
    assert agg.threshold == pytest.approx((2 + 4 * (1 - R2)) / 9)
    torch.testing.assert_close(agg.weights, torch.tensor([[0, 0, 1], [0, 1, 0], [1, 0, 0]], dtype=torch.float64))
    torch.testing.assert_close(agg.personal, tables[[2, 1, 0]])


def test_code_flag_matches_sklearn_and_picks_the_least_similar_users():
    from sklearn.metrics import pairwise_distances

    gen = torch.Generator().manual_seed(0)
    tables = torch.randn(9, 6, 4, generator=gen, dtype=torch.float64)
    tables[4] = 0.0  # a zero table, as sklearn handles it
    flat = tables.reshape(9, -1).numpy()
    code = user_similarity(tables, "cosine_distance_as_in_code", chunk_size=4)
    np.testing.assert_allclose(code.numpy(), pairwise_distances(flat, metric="cosine"), atol=1e-12)
    cosine = user_similarity(tables)
    weights, _ = neighbour_weights(code)
    for u in range(9):
        neighbours = torch.nonzero(weights[u] > 0).flatten()
        others = torch.tensor([v for v in range(9) if v not in neighbours.tolist() and v != u])
        if neighbours.numel() and others.numel() and u != 4:
            # under the code's graph, every neighbour is less similar than every non-neighbour
            assert cosine[u, neighbours].max() < cosine[u, others].min()
    correct, _ = neighbour_weights(cosine)
    assert (torch.diagonal(correct) > 0).sum() >= 8 and (torch.diagonal(weights) == 0).sum() >= 8


@pytest.mark.parametrize("similarity", ["cosine", "cosine_distance_as_in_code"])
@pytest.mark.parametrize("layers, scale", [(1, 1.0), (2, 0.5), (1, 1.3)])
def test_batched_equals_per_user_reference(similarity, layers, scale):
    gen = torch.Generator().manual_seed(layers)
    tables = torch.randn(11, 5, 3, generator=gen, dtype=torch.float64) + 0.3
    tables[7] = 0.0
    fast = graph_personalise(tables, similarity, scale, layers, chunk_size=4)  # 3 chunks of users
    slow = graph_personalise_reference(tables, similarity, scale, layers)
    torch.testing.assert_close(fast.similarity, slow.similarity, atol=1e-6, rtol=0)
    assert fast.threshold == pytest.approx(slow.threshold, abs=1e-6)
    torch.testing.assert_close(fast.weights, slow.weights, atol=1e-6, rtol=0)
    torch.testing.assert_close(fast.personal, slow.personal, atol=1e-6, rtol=0)
    torch.testing.assert_close(fast.global_table, slow.global_table, atol=1e-6, rtol=0)


def test_weights_rows_are_one_over_k_and_lonely_users_keep_their_table():
    gen = torch.Generator().manual_seed(3)
    sim = torch.rand(6, 6, generator=gen, dtype=torch.float64)
    weights, threshold = neighbour_weights(sim, threshold_scale=1.2)
    assert threshold == pytest.approx(float(sim.mean()) * 1.2)
    torch.testing.assert_close(weights.sum(1), torch.ones(6, dtype=torch.float64))
    for u in range(6):
        above = sim[u] > threshold
        k = int(above.sum())
        if k:
            torch.testing.assert_close(weights[u], above.to(torch.float64) / k)
        else:
            assert weights[u, u] == 1.0 and weights[u].sum() == 1.0
    # identical tables: S ≡ 1 = τ, nobody is strictly above, everyone keeps its own table
    same = torch.ones(4, 2, 3, dtype=torch.float64)
    agg = graph_personalise(same)
    torch.testing.assert_close(agg.weights, torch.eye(4, dtype=torch.float64))
    torch.testing.assert_close(message_passing(agg.weights, same), same)


# ---------------------------------------------------------------------------------------------
# The complete-graph certificate (every client starts a round from the same broadcast)
# ---------------------------------------------------------------------------------------------
def _near_broadcast(num_users=9, spread=0.05, seed=0):
    """Tables one local round away from a shared broadcast: q_g + spread · noise."""
    gen = torch.Generator().manual_seed(seed)
    broadcast = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    return broadcast + spread * torch.randn(num_users, 6, 4, generator=gen, dtype=torch.float64)


def test_certified_complete_graph_equals_the_full_computation():
    tables = _near_broadcast()
    fast = graph_personalise(tables, threshold_scale=0.5, layers=2)
    full = graph_personalise(tables, threshold_scale=0.5, layers=2, certify=False)
    assert fast.certified_complete and fast.similarity is None and not full.certified_complete
    assert bool((full.weights > 0).all())  # the full path agrees that everyone is a neighbour
    assert fast.threshold == pytest.approx(full.threshold, abs=1e-12)
    for name in ("weights", "personal", "global_table"):
        torch.testing.assert_close(getattr(fast, name), getattr(full, name), atol=1e-12, rtol=0, msg=name)


@pytest.mark.parametrize("outlier", ["far", "opposite"])
def test_bounded_path_computes_only_the_wide_rows_and_equals_the_full_computation(outlier):
    tables = _near_broadcast(num_users=12, seed=3)
    gen = torch.Generator().manual_seed(9)
    if outlier == "far":  # two users moved a lot: wide, but still neighbours of some
        tables[[2, 7]] += 1.5 * torch.randn(2, 6, 4, generator=gen, dtype=torch.float64)
    else:  # one user points away from everyone: nobody's neighbour but its own
        tables[5] = -tables[5]
    fast = graph_personalise(tables, threshold_scale=0.5)
    full = graph_personalise(tables, threshold_scale=0.5, certify=False)
    assert not fast.certified_complete and fast.similarity is None and 0 < fast.wide_users < 6
    assert full.wide_users is None and bool((full.weights == 0).any())  # the graph is not complete
    assert fast.threshold == pytest.approx(full.threshold, abs=1e-12)
    for name in ("weights", "personal", "global_table"):
        torch.testing.assert_close(getattr(fast, name), getattr(full, name), atol=1e-12, rtol=0, msg=name)


@pytest.mark.parametrize("spread", [0.01, 0.1, 0.3, 0.6, 1.0, 3.0])
@pytest.mark.parametrize("scale", [0.5, 0.9, 1.0])
def test_certificate_is_sound_every_certified_pair_is_above_the_threshold(spread, scale):
    for seed in range(4):
        tables = _near_broadcast(spread=spread, seed=seed)
        threshold = complete_graph_threshold(tables, scale)
        similarity = user_similarity(tables)
        assert float(similarity.mean()) * scale == pytest.approx(
            threshold if threshold is not None else float(similarity.mean()) * scale, abs=1e-12)
        if threshold is not None:
            assert float(similarity.min()) > threshold + CERTIFICATE_MARGIN / 2


def test_certificate_refuses_incomplete_graphs_zero_tables_and_the_code_flag():
    assert complete_graph_threshold(three_users()) is None  # users 0 and 2 are orthogonal
    assert not graph_personalise(three_users()).certified_complete
    tables = _near_broadcast()
    tables[3] = 0.0
    assert complete_graph_threshold(tables, 0.5) is None
    # scale 1.0: tight tables sit right at the mean, so the (conservative) bound cannot clear τ
    assert complete_graph_threshold(_near_broadcast(), 1.0) is None
    coded = graph_personalise(_near_broadcast(), "cosine_distance_as_in_code", 0.5)
    assert not coded.certified_complete and coded.similarity is not None


def test_loss_runs_the_mlp_only_up_to_the_last_real_column():
    model = GPFedRecModel(2, 5, dim=2, hidden=(3,))
    params = model.init_private(torch.Generator().manual_seed(2), dtype=torch.float64)
    params["target_item_emb"] = params["target_item_emb"] * 0.5
    # client 0: real, context, real, context; client 1: real then context; column 3 has no real row
    items = torch.tensor([[0, 1, 2, 3], [4, 0, 1, 2]])
    labels = torch.tensor([[1.0, CONTEXT_LABEL, 0.0, CONTEXT_LABEL], [1.0, CONTEXT_LABEL, CONTEXT_LABEL, CONTEXT_LABEL]],
                          dtype=torch.float64)
    rows = items + torch.tensor([[0], [5]])
    flat = {name: (value.reshape(-1, 2) if kind == "private_rows" else value)
            for (name, kind), value in zip(model.param_kinds.items(), params.values())}
    batch = LocalBatch(clients=torch.tensor([0, 1]), rows=rows, items=items, labels=labels,
                       mask=torch.ones(2, 4, dtype=torch.float64))
    loss = GPFedRecLoss(reg=1.5, reg_rows="batch")(model, flat, batch)
    logits = model.logits(flat, rows)  # every column, as before the shortcut
    real = (labels >= 0).to(torch.float64)
    bce = (F.binary_cross_entropy_with_logits(logits, labels.clamp(min=0), reduction="none") * real).sum(1) / real.sum(1)
    reg = graph_regulariser(flat["item_emb"][rows], flat["target_item_emb"][rows], items, batch.mask, 5)
    torch.testing.assert_close(loss, bce + 1.5 * reg)


# ---------------------------------------------------------------------------------------------
# The regulariser
# ---------------------------------------------------------------------------------------------
def test_regulariser_gradient_pulls_toward_the_personalised_table():
    gen = torch.Generator().manual_seed(1)
    num_items, d = 10, 3
    rows = torch.randn(2, 4, d, generator=gen, dtype=torch.float64, requires_grad=True)
    target = torch.randn(2, 4, d, generator=gen, dtype=torch.float64)
    items = torch.tensor([[3, 5, 3, 0], [1, 2, 4, 6]])  # item 3 twice for client 0; client 1 has padding
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.float64)
    # the repeated item is one row (same values), as in every executor
    with torch.no_grad():
        rows[0, 2] = rows[0, 0]
        target[0, 2] = target[0, 0]
    value = graph_regulariser(rows, target, items, mask, num_items)
    once = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0]], dtype=torch.float64)
    expected = ((rows - target).pow(2).sum(-1) * once).sum(1) / (num_items * d)
    torch.testing.assert_close(value, expected.detach())
    value.sum().backward()
    torch.testing.assert_close(rows.grad, 2 * (rows.detach() - target) * once[..., None] / (num_items * d))
    stepped = rows.detach() - 5.0 * rows.grad  # a descent step: every counted row gets closer to r_u
    before, after = (rows.detach() - target).norm(dim=-1), (stepped - target).norm(dim=-1)
    assert (after[once > 0] < before[once > 0]).all()
    assert torch.equal(after[once == 0], before[once == 0])


def test_first_occurrence_ignores_padding():
    items = torch.tensor([[4, 4, 1, 0], [2, 0, 2, 2]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    expected = torch.tensor([[True, False, True, False], [True, True, False, False]])
    assert torch.equal(first_occurrence(items, mask), expected)


def test_table_context_adds_every_item_to_every_step():
    train = toy_train()
    plan = make_round_plan(train, NegativeSampler(train, NUM_ITEMS), round_generator(0, 0), batch_size=BATCH)
    augmented = add_table_context(plan, NUM_ITEMS)
    for c in range(plan.num_clients):
        old = np.arange(plan.items.size)[plan.client_examples(c)]
        new = np.arange(augmented.items.size)[augmented.client_examples(c)]
        assert new.size == old.size + plan.num_steps[c] * NUM_ITEMS
        for step in range(plan.num_steps[c]):
            here = new[augmented.steps[new] == step]
            real = here[augmented.labels[here] >= 0]
            np.testing.assert_array_equal(augmented.items[real], plan.items[old][plan.steps[old] == step])
            assert set(augmented.items[here].tolist()) == set(range(NUM_ITEMS))
            assert (augmented.labels[here][real.size:] == CONTEXT_LABEL).all()  # real examples first


# ---------------------------------------------------------------------------------------------
# Model, method, server hook, runs
# ---------------------------------------------------------------------------------------------
def test_model_roles_and_learning_rates():
    model = GPFedRecModel(NUM_USERS, NUM_ITEMS, dim=4, hidden=(8, 4, 2))
    assert model.param_kinds["item_emb"] == model.param_kinds["target_item_emb"] == "private_rows"
    assert model.public_names == ()
    method = gpfedrec_method(model)
    assert method.learning_rates["item_emb"] == pytest.approx(0.1 * NUM_ITEMS * 80 - 0.1)
    assert method.learning_rates["user_emb"] == pytest.approx(0.1 * 80 - 0.1)
    assert method.learning_rates["target_item_emb"] == 0.0 and method.learning_rates["mlp1_w"] == 0.1
    assert "target_item_emb" not in method.steps[0] and "item_emb" in method.steps[0]


def test_mlp_on_concatenation():
    model = GPFedRecModel(2, 3, dim=2, hidden=(4, 3))
    state = model.init_private(torch.Generator().manual_seed(0), dtype=torch.float64)
    scores = model.score_users({}, state, torch.tensor([0, 1]))  # (2, 3)
    for u in range(2):
        for i in range(3):
            x = torch.cat([state["user_emb"][u], state["item_emb"][u, i]])
            h = torch.relu(state["mlp0_w"][u] @ x + state["mlp0_b"][u])
            h = torch.relu(state["mlp1_w"][u] @ h + state["mlp1_b"][u])
            assert float(scores[u, i]) == pytest.approx(float(state["head_w"][u] @ h + state["head_b"][u]))


def _run(executor, reg_rows, rounds=3, similarity="cosine"):
    train = toy_train()
    model = GPFedRecModel(NUM_USERS, NUM_ITEMS, dim=4, hidden=(8, 4), init_std=0.3)
    method = gpfedrec_method(model, lr=0.05, lr_eta=2.0, reg_rows=reg_rows, similarity=similarity, chunk_size=5)
    config = FederatedConfig(rounds=rounds, seed=1, batch_size=BATCH, dtype="float64")
    return method, run_federated(method, train, config, executor=executor, device="cpu")


@pytest.mark.parametrize("reg_rows", ["table", "batch"])
def test_executors_agree_and_server_personalises(reg_rows):
    wrap = PlanAugmentingExecutor if reg_rows == "table" else (lambda inner: inner)
    _, a = _run(wrap(SequentialExecutor()), reg_rows)
    method, b = _run(wrap(BatchedExecutor(chunk_size=6)), reg_rows)
    for name in a.state.private_state:
        torch.testing.assert_close(a.state.private_state[name], b.state.private_state[name], atol=1e-9, rtol=0,
                                   msg=name)
    np.testing.assert_allclose([r["train_loss"] for r in a.history], [r["train_loss"] for r in b.history], atol=1e-9)
    stats = b.state.extra[GRAPH_STATS_KEY]
    log = b.state.extra[GRAPH_LOG_KEY]  # one entry per server step (rounds 1 and 2), the last one is the stats
    assert [entry["round"] for entry in log] == [1, 2] and log[-1] == stats
    assert all(entry["complete"] == (entry["min_neighbours"] == NUM_USERS) for entry in log)
    assert stats["round"] == 2 and stats["participants"] == NUM_USERS and stats["self_included"] == 1.0
    targets = b.state.private_state["target_item_emb"]
    assert not torch.equal(targets[0], targets[1])  # personalised per user
    torch.testing.assert_close(b.state.extra[BROADCAST_KEY], targets.mean(0))  # q_g = mean of the r_u


def _run_with(executor, rounds=4, batch_size=BATCH, reg=1.0, lr_decay=1.0, threshold_scale=1.0, **method_kwargs):
    train = toy_train()
    model = GPFedRecModel(NUM_USERS, NUM_ITEMS, dim=4, hidden=(8, 4), init_std=0.3)
    method = gpfedrec_method(model, lr=0.05, lr_eta=2.0, reg=reg, threshold_scale=threshold_scale, chunk_size=5,
                             lr_decay=lr_decay, **method_kwargs)
    config = FederatedConfig(rounds=rounds, seed=2, batch_size=batch_size, dtype="float64")
    return run_federated(method, train, config, executor=executor, device="cpu")


@pytest.mark.parametrize("batch_size, reg, lr_decay, threshold_scale, chunk",
                         [(BATCH, 1.0, 1.0, 1.0, 128), (3, 1.0, 0.9, 1.0, 4), (2, 3.0, 1.0, 1.2, 1), (3, 0.0, 1.0, 1.0, 5)])
def test_closed_form_executor_equals_the_context_row_reference(batch_size, reg, lr_decay, threshold_scale, chunk,
                                                                monkeypatch):
    """Whole-table pull + batch-row autograd = every item as a context row, step by step.

    Small batches give clients several local steps of different counts (a shrinking prefix of
    active clients); ``threshold_scale`` 1.2 makes the graph incomplete, so ``r_u`` differs per
    user and the pull is not toward one table. Round 0 (and a complete graph) starts every
    client at ``q_u = r_u``: those clients take the touched-rows path.
    """
    paths = []
    chunk_fn = GPFedRecExecutor._chunk

    def recording(*args):
        paths.append(args[-1])  # whole_table
        return chunk_fn(*args)

    monkeypatch.setattr(GPFedRecExecutor, "_chunk", staticmethod(recording))
    options = dict(rounds=4, batch_size=batch_size, reg=reg, lr_decay=lr_decay, threshold_scale=threshold_scale)
    reference = _run_with(PlanAugmentingExecutor(BatchedExecutor(chunk_size=6)), **options)
    fast = _run_with(GPFedRecExecutor(chunk_size=chunk), **options)
    assert False in paths and (threshold_scale <= 1 or True in paths)
    sequential = _run_with(PlanAugmentingExecutor(SequentialExecutor()), **options)
    for name in reference.state.private_state:
        torch.testing.assert_close(fast.state.private_state[name], reference.state.private_state[name], atol=1e-10,
                                   rtol=0, msg=name)
        torch.testing.assert_close(fast.state.private_state[name], sequential.state.private_state[name], atol=1e-10,
                                   rtol=0, msg=name)
    np.testing.assert_allclose([r["train_loss"] for r in fast.history], [r["train_loss"] for r in reference.history],
                               atol=1e-10)
    # the comparison is not vacuous: several steps, tables that moved and differ per user
    positives = np.bincount(toy_train().users)
    positives = positives[positives > 0]
    assert batch_size == BATCH or (positives.max() > batch_size and positives.min() != positives.max())
    table = fast.state.private_state["item_emb"]
    assert not torch.equal(table[0], table[1])
    if threshold_scale > 1:
        assert not fast.state.extra[GRAPH_STATS_KEY]["complete"]


def test_closed_form_executor_falls_back_where_it_does_not_apply():
    """A step clip is outside the closed form: the reference path runs, with its own result."""
    assert not GPFedRecExecutor.applies(gpfedrec_method(GPFedRecModel(3, 4, 2), grad_clip_norm=0.5))
    assert not GPFedRecExecutor.applies(gpfedrec_method(GPFedRecModel(3, 4, 2), reg_rows="batch"))
    assert GPFedRecExecutor.applies(gpfedrec_method(GPFedRecModel(3, 4, 2)))
    clipped = _run_with(GPFedRecExecutor(), rounds=2, grad_clip_norm=0.05)
    reference = _run_with(PlanAugmentingExecutor(BatchedExecutor(chunk_size=6)), rounds=2, grad_clip_norm=0.05)
    plain = _run_with(GPFedRecExecutor(), rounds=2)
    torch.testing.assert_close(clipped.state.private_state["item_emb"], reference.state.private_state["item_emb"],
                               atol=1e-10, rtol=0)
    assert not torch.allclose(clipped.state.private_state["item_emb"], plain.state.private_state["item_emb"], atol=1e-6)


def test_closed_form_executor_refuses_a_bad_chunk_size():
    with pytest.raises(ValueError, match="chunk_size"):
        GPFedRecExecutor(chunk_size=0)


@pytest.mark.parametrize("executor", ["sequential", "batched"])
def test_equal_start_clients_skip_unmoved_rows_with_the_same_updates(executor, monkeypatch):
    def run(skip):
        inner = SequentialExecutor() if executor == "sequential" else BatchedExecutor(chunk_size=6)
        train = toy_train()
        model = GPFedRecModel(NUM_USERS, NUM_ITEMS, dim=4, hidden=(8, 4), init_std=0.3)
        method = gpfedrec_method(model, lr=0.05, lr_eta=2.0, chunk_size=5)
        method.client_loss.skip_equal_rows = skip
        config = FederatedConfig(rounds=3, seed=1, batch_size=BATCH, dtype="float64")
        return run_federated(method, train, config, executor=PlanAugmentingExecutor(inner), device="cpu")

    sizes = []
    original = add_table_context

    def counting(plan, num_items, full_table=None):
        out = original(plan, num_items, full_table)
        sizes.append((out.items.size, plan.items.size, plan.num_clients * 0 + int(plan.num_steps.sum()) * num_items))
        return out

    import fedlib.baselines.single_domain.gpfedrec as module
    monkeypatch.setattr(module, "add_table_context", counting)
    skipped = run(True)
    skip_sizes, sizes[:] = list(sizes), []
    whole = run(False)
    # round 0: every client starts at q_u = r_u (one init), so the skipping plan is much smaller
    grown, real, every_row = skip_sizes[0]
    assert real < grown < real + every_row and sizes[0][0] == real + every_row
    for name in whole.state.private_state:
        torch.testing.assert_close(skipped.state.private_state[name], whole.state.private_state[name], atol=1e-12,
                                   rtol=0, msg=name)
    np.testing.assert_allclose([r["train_loss"] for r in skipped.history], [r["train_loss"] for r in whole.history],
                               atol=1e-12)


def test_server_hook_broadcasts_and_skips_users_without_training():
    model = GPFedRecModel(4, 3, dim=2, hidden=())
    method = gpfedrec_method(model)
    config = FederatedConfig(rounds=2, dtype="float64")
    run = start_run(ParameterAveraging(method, None, config, device="cpu"), config.schedule(), config.seed)
    state = run.state  # the server changes the run's state in place
    server = GraphGuidedServer()
    server(run, 0, None)  # the graph step reads no plan
    tables = state.private_state["item_emb"]
    gen = torch.Generator().manual_seed(0)
    tables[:3] += torch.randn(3, 3, 2, generator=gen, dtype=torch.float64)  # users 0-2 trained, user 3 did not
    uploads = tables[:3].clone()
    untouched_target = state.private_state["target_item_emb"][3].clone()
    server(run, 1, None)
    expected = graph_personalise(uploads)
    torch.testing.assert_close(state.private_state["target_item_emb"][:3], expected.personal)
    torch.testing.assert_close(state.private_state["target_item_emb"][3], untouched_target)
    torch.testing.assert_close(tables, expected.global_table.expand(4, 3, 2))  # every client downloads q_g
    assert state.extra[GRAPH_STATS_KEY]["participants"] == 3


def test_table_mode_without_context_rows_says_how_to_fix():
    with pytest.raises(ValueError, match="PlanAugmentingExecutor"):
        _run(BatchedExecutor(), "table", rounds=1)


# ---------------------------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------------------------
def test_bad_inputs_raise_with_a_fix():
    tables = three_users()
    with pytest.raises(ValueError, match="unknown similarity 'euclidean'.*'cosine'.*cosine_distance_as_in_code"):
        user_similarity(tables, "euclidean")
    with pytest.raises(ValueError, match="unknown similarity"):
        graph_personalise_reference(tables, "cosine_distance")
    with pytest.raises(ValueError, match="unknown similarity"):
        gpfedrec_method(GPFedRecModel(3, 1, 2), similarity="pearson")
    with pytest.raises(ValueError, match=r"\(U, I, d\)"):
        user_similarity(torch.zeros(3))
    with pytest.raises(ValueError, match="square"):
        neighbour_weights(torch.zeros(3, 2))
    with pytest.raises(ValueError, match="do not match 3 users"):
        message_passing(torch.eye(2, dtype=torch.float64), tables)
    with pytest.raises(ValueError, match="chunk_size"):
        user_similarity(tables, chunk_size=0)
    with pytest.raises(ValueError, match="layers"):
        graph_personalise(tables, layers=0)
    rows = torch.zeros(1, 2, 3)
    with pytest.raises(ValueError, match="same .C, B. index"):
        graph_regulariser(rows, torch.zeros(1, 2, 2), torch.zeros(1, 2, dtype=torch.int64), torch.ones(1, 2), 5)
    with pytest.raises(ValueError, match="reg must be .* >= 0"):
        GPFedRecLoss(reg=-1.0)
    with pytest.raises(ValueError, match="unknown reg_rows"):
        GPFedRecLoss(reg_rows="rows")
    with pytest.raises(ValueError, match="client_fraction"):
        gpfedrec_method(GPFedRecModel(3, 1, 2), client_fraction=0.0)
    with pytest.raises(ValueError, match="hidden"):
        GPFedRecModel(3, 1, 2, hidden=(4, 0))
    with pytest.raises(ValueError, match="GPFedRecModel"):
        gpfedrec_method(object())


def test_loss_on_a_batch_without_context_rows_in_batch_mode():
    model = GPFedRecModel(1, 4, dim=2, hidden=())
    params = model.init_private(torch.Generator().manual_seed(0), dtype=torch.float64)
    params["target_item_emb"] = params["target_item_emb"] + 1.0  # r_u = q_u + 1 on every row
    batch = LocalBatch(clients=torch.tensor([0]), rows=torch.tensor([[0, 2]]), items=torch.tensor([[0, 2]]),
                       labels=torch.tensor([[1.0, 0.0]], dtype=torch.float64),
                       mask=torch.ones(1, 2, dtype=torch.float64))
    seq = {name: params[name][0] if kind == "private_rows" else params[name][:1]
           for name, kind in model.param_kinds.items()}
    plain = GPFedRecLoss(reg=0.0)(model, seq, batch)
    regularised = GPFedRecLoss(reg=2.0, reg_rows="batch")(model, seq, batch)
    # two distinct rows, each ‖q − r‖² = d = 2, over I · d = 8
    torch.testing.assert_close(regularised - plain, torch.tensor([2.0 * 2 * 2 / 8], dtype=torch.float64))
