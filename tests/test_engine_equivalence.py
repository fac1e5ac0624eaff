"""Sequential and batched executors give the same federated run, for every backbone.

The data has one-batch clients and clients with 3+ local batches; the runs are float64, so
any semantic difference (a shared instead of a per-client item copy, a wrong step order,
a pooled batch) shows up far above the 1e-5 tolerance, while rounding stays ~1e-12.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import Pairs
from fedlib.engine import (Aggregation, BatchedExecutor, FederatedConfig, GradientNoise, RankingEvaluator,
                           SequentialExecutor, UploadNoise, fedmf_method, fedncf_method, ParameterAveraging,
                           make_round_plan, pfedrec_method, personal_table_method, round_generator, run_federated)
from fedlib.models import FedMF, FedNCF, PersonalItemTableModel, PFedRec

NUM_USERS, NUM_ITEMS = 14, 60
BATCH = 16  # (1 + 4 negatives) x 4 positives = 20 examples -> 2 batches; 18 positives -> 90 -> 6 batches


def toy_split(seed=0):
    """Users with 1..18 training positives (one-batch and many-batch clients), 1 valid + 1 test each."""
    rng = np.random.default_rng(seed)
    users, items, valid, test = [], [], [], []
    for u in range(NUM_USERS):
        n = [1, 2, 3, 18, 5, 9, 14, 2, 7, 16, 1, 11, 4, 6][u]
        chosen = rng.choice(NUM_ITEMS, size=n + 2, replace=False)
        users += [u] * n
        items += chosen[:n].tolist()
        valid.append((u, chosen[n]))
        test.append((u, chosen[n + 1]))
    train = Pairs.from_arrays(users, items, NUM_USERS)
    valid = Pairs.from_arrays([u for u, _ in valid], [i for _, i in valid], NUM_USERS)
    test = Pairs.from_arrays([u for u, _ in test], [i for _, i in test], NUM_USERS)
    return train, valid, test


def _methods():
    return {
        "fedmf": fedmf_method(FedMF(NUM_USERS, NUM_ITEMS, 8, init_std=0.1), lr=0.5),
        "fedncf_f3crec": fedncf_method(FedNCF.f3crec_variant(NUM_USERS, NUM_ITEMS, 8), lr=0.01, lr_eta=2.0),
        "fedncf_neumf_weighted": fedncf_method(
            FedNCF(NUM_USERS, NUM_ITEMS, 8, variant="neumf", hidden=(12, 6)), lr=0.05, lr_eta=2.0,
            aggregation=Aggregation("num_examples")),
        "pfedrec": pfedrec_method(PFedRec(NUM_USERS, NUM_ITEMS, 8), lr=0.1, lr_eta=0.05),
        "fedrkg_personal_clip": personal_table_method(PersonalItemTableModel(NUM_USERS, NUM_ITEMS, 8), lr=0.1, lr_eta=1.0,
                                                      grad_clip_norm=1.0),
        "fedrap_personal_shared": personal_table_method(
            PersonalItemTableModel(NUM_USERS, NUM_ITEMS, 8, shared_table=True), lr=0.1, lr_eta=0.02, grad_clip_norm=None),
    }


def _run(method, executor, split, rounds=3, clients_per_round=None):
    train, valid, test = split
    config = FederatedConfig(rounds=rounds, seed=7, batch_size=BATCH, dtype="float64",
                             clients_per_round=clients_per_round, selection_metric="NDCG@10")
    evaluator = RankingEvaluator(train, valid, test, ks=(10,))
    return run_federated(method, train, config, executor=executor, evaluator=evaluator)


def _assert_same(a, b, tol=1e-5):
    """Two runs (the trainer's RunResults) agree: final states, every history row and the test metrics."""
    for name in a.state.global_state:
        torch.testing.assert_close(a.state.global_state[name], b.state.global_state[name], atol=tol, rtol=0, msg=name)
    for name in a.state.private_state:
        torch.testing.assert_close(a.state.private_state[name], b.state.private_state[name], atol=tol, rtol=0,
                                   msg=name)
    for ra, rb in zip(a.history, b.history):
        assert ra.keys() == rb.keys()
        for key in ra:
            assert abs(ra[key] - rb[key]) <= tol, (key, ra[key], rb[key])
    assert a.test_metrics.keys() == b.test_metrics.keys()
    for key in a.test_metrics:
        assert abs(a.test_metrics[key] - b.test_metrics[key]) <= tol


def test_toy_data_has_one_batch_and_many_batch_clients():
    train, _, _ = toy_split()
    plan = make_round_plan(train, NegativeSampler(train, NUM_ITEMS), round_generator(7, 0), batch_size=BATCH)
    assert (plan.num_steps == 1).sum() >= 2
    assert (plan.num_steps >= 3).sum() >= 4
    assert plan.num_steps.max() >= 6


@pytest.mark.parametrize("name", list(_methods()))
def test_batched_equals_sequential(name):
    split = toy_split()
    method = _methods()[name]
    seq = _run(method, SequentialExecutor(), split)
    bat = _run(method, BatchedExecutor(chunk_size=5), split)  # several chunks
    _assert_same(seq, bat)
    # The run really trained: the state moved away from the initial one.
    init = ParameterAveraging(method, None, FederatedConfig(rounds=1, dtype="float64")).init(7)
    moved = max(float((seq.state.private_state[k] - init.private_state[k]).abs().max()) for k in init.private_state)
    assert moved > 1e-3


def test_fedmf_kernel_generic_path_and_sampled_clients_agree():
    split = toy_split()
    method = _methods()["fedmf"]
    seq = _run(method, SequentialExecutor(), split, clients_per_round=6)
    kernel = _run(method, BatchedExecutor(analytic_fedmf=True), split, clients_per_round=6)
    generic = _run(method, BatchedExecutor(analytic_fedmf=False), split, clients_per_round=6)
    no_fast_path = _run(method, BatchedExecutor(analytic_fedmf=False, one_batch_fast_path=False), split, clients_per_round=6)
    # A tiny memory budget forces the kernel to work in chunks of a couple of clients.
    chunked_kernel = _run(method, BatchedExecutor(analytic_fedmf=True, dense_budget=2 * NUM_ITEMS * 10), split,
                          clients_per_round=6)
    for other in (kernel, generic, no_fast_path, chunked_kernel):
        _assert_same(seq, other)


def test_two_local_epochs_and_lr_decay_agree():
    train, valid, test = toy_split()
    method = dataclasses.replace(_methods()["pfedrec"], lr_decay=0.9)
    config = FederatedConfig(rounds=2, seed=3, batch_size=BATCH, local_epochs=2, dtype="float64")
    a = run_federated(method, train, config, executor=SequentialExecutor())
    b = run_federated(method, train, config, executor=BatchedExecutor())
    for name in a.state.global_state:
        torch.testing.assert_close(a.state.global_state[name], b.state.global_state[name], atol=1e-5, rtol=0)


def _pooled_round(method, state, plan, weights):
    """A WRONG batched round: all clients of a step share one item table (no per-client copies).

    This is what a pooled mini-batch across clients computes; it is only right when every
    client has a single batch.
    """
    items_table = state.global_state["item_emb"].clone()
    users = torch.as_tensor(plan.clients)
    p = state.private_state["user_emb"][users].clone()
    for step in range(int(plan.num_steps.max())):
        q = items_table.clone().requires_grad_(True)
        pv = p.clone().requires_grad_(True)
        total = 0
        for c in range(plan.num_clients):
            ex = plan.client_examples(c)
            sel = plan.steps[ex] == step
            if not sel.any():
                continue
            it = torch.as_tensor(plan.items[ex][sel])
            y = torch.as_tensor(plan.labels[ex][sel], dtype=q.dtype)
            logits = q[it] @ pv[c]
            total = total + torch.nn.functional.binary_cross_entropy_with_logits(logits, y)
        gq, gp = torch.autograd.grad(total, [q, pv])
        # per-client weights of the upload folded into one shared step
        items_table = items_table - method.learning_rates["item_emb"] * float(weights[0]) * gq
        p = p - method.learning_rates["user_emb"] * gp
    return items_table


@pytest.mark.parametrize("batch_size, expect_equal", [(BATCH, False), (4096, True)])
def test_pooled_minibatch_differs_when_clients_have_several_batches(batch_size, expect_equal):
    train, _, _ = toy_split()
    method = _methods()["fedmf"]
    config = FederatedConfig(rounds=1, seed=7, batch_size=batch_size, dtype="float64")
    state = ParameterAveraging(method, None, config).init(config.seed)
    plan = make_round_plan(train, NegativeSampler(train, NUM_ITEMS), round_generator(7, 0), batch_size=batch_size)
    weights = method.aggregation.client_weights(plan.num_examples)
    pooled_items = _pooled_round(method, state, plan, weights)
    private = {k: v.clone() for k, v in state.private_state.items()}
    result = BatchedExecutor().local_updates(method, state.global_state, private, plan, weights)
    per_client_items = state.global_state["item_emb"] + result.update["item_emb"]
    diff = float((pooled_items - per_client_items).abs().max())
    if expect_equal:
        assert diff < 1e-10  # one batch per client: pooling is harmless
    else:
        assert diff > 1e-3  # several batches: the pooled update is a different algorithm


# -- upload noise ---------------------------------------------------------------------------
NOISY_METHODS = ["fedmf", "fedncf_neumf_weighted", "pfedrec", "fedrap_personal_shared"]


@pytest.mark.parametrize("support", ["full", "touched"])
@pytest.mark.parametrize("name", NOISY_METHODS)
def test_noisy_uploads_agree(name, support):
    """Each client draws its noise from its own (noise_key, client id) stream, so both executors
    add the same numbers, whatever the chunking or the FedMF kernel."""
    split = toy_split()
    method = dataclasses.replace(_methods()[name], upload_noise=UploadNoise(0.01, support=support))
    seq = _run(method, SequentialExecutor(), split, clients_per_round=9)
    bat = _run(method, BatchedExecutor(chunk_size=4), split, clients_per_round=9)
    _assert_same(seq, bat)
    if name == "fedmf":
        _assert_same(seq, _run(method, BatchedExecutor(analytic_fedmf=False), split, clients_per_round=9))
    # The noise really entered: the noiseless run ends elsewhere (by far more than 1e-5).
    clean = _run(_methods()[name], BatchedExecutor(chunk_size=4), split, clients_per_round=9)
    moved = max(float((clean.state.global_state[k] - bat.state.global_state[k]).abs().max())
                for k in clean.state.global_state)
    assert moved > 1e-3


# -- gradient noise (clip + Gaussian noise in every local step) -------------------------------------
DP_METHODS = {
    # name -> (backbone, GradientNoise): FedMF and PFedRec noise everything (PFedRec: both of its
    # update steps per batch), FedRKG noises its personal table only, after clip_grad_norm_(all, 1.0).
    "fedmf": ("fedmf", GradientNoise(0.5, 0.3)),
    "fedmf_touched": ("fedmf", GradientNoise(0.5, 0.3, support="touched")),
    "pfedrec": ("pfedrec", GradientNoise(0.5, 0.3)),
    "pfedrec_items": ("pfedrec", GradientNoise(0.5, 0.3, params=("item_emb",), support="touched")),
    "fedrkg_personal": ("fedrkg_personal_clip", GradientNoise(0.1, 0.5, params=("personal_item_emb",))),
    "fedrap_personal_shared": ("fedrap_personal_shared", GradientNoise(0.3, 0.5)),
}


@pytest.mark.parametrize("name", list(DP_METHODS))
def test_gradient_noise_agrees(name):
    """Each client draws its step-k noise from its own (round key, client id, k) stream, so both
    executors add the same numbers; clients with 1 and with 3+ local batches, several chunks."""
    backbone, noise = DP_METHODS[name]
    split = toy_split()
    method = dataclasses.replace(_methods()[backbone], gradient_noise=noise)
    seq = _run(method, SequentialExecutor(), split)
    bat = _run(method, BatchedExecutor(chunk_size=5), split)
    _assert_same(seq, bat)
    if backbone == "fedmf":  # the analytic kernel must step aside, also when asked for explicitly
        _assert_same(seq, _run(method, BatchedExecutor(analytic_fedmf=True), split, clients_per_round=None))
    # The noise really entered: the noise-free run ends elsewhere (by far more than 1e-5).
    clean = _run(_methods()[backbone], BatchedExecutor(chunk_size=5), split)
    moved = max(float((clean.state.private_state[k] - bat.state.private_state[k]).abs().max())
                for k in clean.state.private_state)
    assert moved > 1e-3


@pytest.mark.parametrize("upload_support", [None, "touched", "full"])
def test_gradient_noise_client_uploads_agree(upload_support):
    """Full-support gradient noise: every client uploads every row; combined with upload noise the
    individual uploads and their weighted sum are the same in both executors."""
    train, _, _ = toy_split()
    plan = make_round_plan(train, NegativeSampler(train, NUM_ITEMS), round_generator(7, 0), batch_size=BATCH)
    upload_noise = None if upload_support is None else UploadNoise(0.02, upload_support)
    method = dataclasses.replace(_methods()["fedmf"], gradient_noise=GradientNoise(0.5, 0.3), upload_noise=upload_noise)
    weights = method.aggregation.client_weights(plan.num_examples)
    results = {}
    for executor in (SequentialExecutor(), BatchedExecutor(chunk_size=4)):
        state = ParameterAveraging(method, None, FederatedConfig(rounds=1, dtype="float64")).init(7)
        results[executor.name] = executor.local_updates(method, state.global_state, state.private_state, plan, weights,
                                                        return_client_updates=True)
    seq, bat = (results[k].client_updates["item_emb"] for k in ("sequential", "batched"))
    assert len(seq) == plan.num_clients * NUM_ITEMS
    assert torch.equal(seq.clients, bat.clients) and torch.equal(seq.rows, bat.rows)
    torch.testing.assert_close(seq.delta, bat.delta, atol=1e-10, rtol=0)
    torch.testing.assert_close(results["sequential"].update["item_emb"], results["batched"].update["item_emb"],
                               atol=1e-10, rtol=0)
    summed = torch.zeros(NUM_ITEMS, 8, dtype=torch.float64).index_add_(0, seq.rows, seq.delta) / plan.num_clients
    torch.testing.assert_close(summed, results["batched"].update["item_emb"], atol=1e-12, rtol=0)


# -- width-bucketed chunks -----------------------------------------------------------------
def test_width_bucketed_chunks_cover_every_client_once_within_the_ratio():
    from fedlib.engine.executors import width_bucketed_chunks

    rng = np.random.default_rng(0)
    widths = rng.integers(1, 2000, size=500)
    for ratio, chunk_size in ((1.0, 1000), (1.5, 1000), (1.5, 7), (4.0, 64)):
        chunks = width_bucketed_chunks(widths, chunk_size, ratio)
        positions = np.concatenate(chunks)
        assert sorted(positions.tolist()) == list(range(widths.size))
        for chunk in chunks:
            assert 1 <= chunk.size <= chunk_size
            assert np.all(np.diff(chunk) > 0)
            assert widths[chunk].max() <= ratio * widths[chunk].min()
    # Padded work: each chunk pads to its widest client.
    chunks = width_bucketed_chunks(widths, 1000, 1.5)
    padded = sum(widths[c].max() * c.size for c in chunks)
    assert padded <= 1.5 * widths.sum()
    assert widths.max() * widths.size > 1.9 * widths.sum()  # what one plan-order chunk would pad to


def test_client_batch_widths_is_each_clients_largest_step():
    from fedlib.engine.executors import client_batch_widths

    train, _, _ = toy_split()
    plan = make_round_plan(train, NegativeSampler(train, NUM_ITEMS), round_generator(7, 0), batch_size=BATCH,
                           local_epochs=2)
    widths = client_batch_widths(plan)
    for c in range(plan.num_clients):
        steps = plan.steps[plan.example_indptr[c]:plan.example_indptr[c + 1]]
        assert widths[c] == np.bincount(steps).max()
    assert widths.max() == BATCH and widths.min() == 5  # 1 positive + 4 negatives


def test_width_buckets_change_only_the_order_of_sums():
    """One wide batch per client (FedRAP's code config): bucketed, plan-order and sequential runs agree."""
    train, valid, test = toy_split()
    method = _methods()["fedrap_personal_shared"]
    config = FederatedConfig(rounds=3, seed=5, batch_size=2048, local_epochs=3, dtype="float64",
                             selection_metric="NDCG@10")
    evaluator = RankingEvaluator(train, valid, test, ks=(10,))
    runs = {name: run_federated(method, train, config, executor=executor, evaluator=evaluator)
            for name, executor in (("sequential", SequentialExecutor()),
                                   ("plan_order", BatchedExecutor(width_ratio=None)),
                                   ("bucketed", BatchedExecutor(width_ratio=1.5)))}
    _assert_same(runs["sequential"], runs["bucketed"])
    _assert_same(runs["plan_order"], runs["bucketed"])
    from fedlib.engine.executors import client_batch_widths, width_bucketed_chunks
    plan = make_round_plan(train, NegativeSampler(train, NUM_ITEMS), round_generator(5, 0), batch_size=2048,
                           local_epochs=3)
    assert len(width_bucketed_chunks(client_batch_widths(plan), 1024, 1.5)) >= 4  # the buckets were exercised


@pytest.mark.parametrize("ratio", [0.5, float("nan"), float("inf")])
def test_width_ratio_below_one_or_not_finite_is_refused(ratio):
    with pytest.raises(ValueError, match="width_ratio"):
        BatchedExecutor(width_ratio=ratio)
