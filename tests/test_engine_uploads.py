"""Uploads: Laplace noise semantics, per-client row uploads, communication accounting."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import Pairs
from fedlib.engine import (Aggregation, BatchedExecutor, CommunicationLedger, FederatedConfig, SequentialExecutor,
                           UploadNoise, client_upload_noise, fedmf_method, fedncf_method, ParameterAveraging,
                           make_round_plan, pfedrec_method, round_generator, run_federated)
from fedlib.engine import plan as plan_module
from fedlib.models import FedMF, FedNCF, PFedRec

from engine_toys import BATCH, DIM, NUM_ITEMS, NUM_USERS, toy_train  # noqa: F401



def _round(method, executor, plan, **kwargs):
    """One round of local updates from the float64 initial state."""
    state = ParameterAveraging(method, None, FederatedConfig(rounds=1, dtype="float64")).init(7)
    weights = method.aggregation.client_weights(plan.num_examples)
    result = executor.local_updates(method, state.global_state, state.private_state, plan, weights, **kwargs)
    return result, state, weights


def _plan(train, seed=7, **kwargs):
    return make_round_plan(train, NegativeSampler(train, NUM_ITEMS), round_generator(seed, 0), batch_size=BATCH, **kwargs)


EXECUTORS = {
    "sequential": SequentialExecutor(),
    "batched_kernel": BatchedExecutor(analytic_fedmf=True, dense_budget=2 * NUM_ITEMS * 10),  # kernel, in chunks
    "batched_generic": BatchedExecutor(analytic_fedmf=False, chunk_size=4),
    "batched_no_fast_path": BatchedExecutor(analytic_fedmf=False, one_batch_fast_path=False),
}


# -- configuration ---------------------------------------------------------------------------
def test_upload_noise_and_mode_are_validated():
    model = FedMF(NUM_USERS, NUM_ITEMS, DIM)
    with pytest.raises(ValueError, match="scale"):
        UploadNoise(-0.1)
    with pytest.raises(ValueError, match="scale"):
        UploadNoise(float("inf"))
    with pytest.raises(ValueError, match="support"):
        UploadNoise(0.1, support="rows")
    with pytest.raises(ValueError, match="upload_mode"):
        fedmf_method(model, upload_mode="sparse")
    with pytest.raises(ValueError, match="support='touched'"):
        fedmf_method(model, upload_mode="rows", upload_noise=UploadNoise(0.1, support="full"))
    assert fedmf_method(model, upload_mode="rows", upload_noise=UploadNoise(0.1, support="touched")).adds_upload_noise
    assert not fedmf_method(model, upload_noise=UploadNoise(0.0)).adds_upload_noise


def test_noise_key_is_a_function_of_seed_and_round_and_survives_subset():
    train = toy_train()
    a, b = _plan(train), _plan(train)
    other_round = make_round_plan(train, NegativeSampler(train, NUM_ITEMS), round_generator(7, 1), batch_size=BATCH)
    assert a.noise_key == b.noise_key != other_round.noise_key
    assert a.subset(np.array([3, 1])).noise_key == a.noise_key


@pytest.mark.parametrize("mask_limit", [plan_module.TOUCHED_MASK_LIMIT, 0])
def test_touched_rows_are_each_clients_distinct_items(monkeypatch, mask_limit):
    monkeypatch.setattr(plan_module, "TOUCHED_MASK_LIMIT", mask_limit)  # 0: the sorting branch
    train = toy_train()
    plan = _plan(train, local_epochs=2)
    positions, items = plan.touched_rows(NUM_ITEMS)
    for c in range(plan.num_clients):
        expected = np.unique(plan.items[plan.client_examples(c)])
        np.testing.assert_array_equal(items[positions == c], expected)
    assert (np.diff(positions) >= 0).all()
    np.testing.assert_array_equal(plan.touched_row_counts(NUM_ITEMS), np.bincount(positions, minlength=plan.num_clients))


# -- per-client uploads ----------------------------------------------------------------------
@pytest.mark.parametrize("noise", [None, UploadNoise(0.02, "touched"), UploadNoise(0.02, "full")],
                         ids=["no_noise", "touched", "full"])
def test_client_updates_identical_across_executors_and_sum_to_the_update(noise):
    train = toy_train()
    plan = _plan(train)
    method = fedmf_method(FedMF(NUM_USERS, NUM_ITEMS, DIM, init_std=0.1), lr=0.5, upload_noise=noise)
    results = {name: _round(method, executor, plan, return_client_updates=True)[0]
               for name, executor in EXECUTORS.items()}
    reference = results["sequential"].client_updates["item_emb"]
    for name, result in results.items():
        updates = result.client_updates["item_emb"]
        assert torch.equal(updates.clients, reference.clients), name
        assert torch.equal(updates.rows, reference.rows), name
        torch.testing.assert_close(updates.delta, reference.delta, atol=1e-10, rtol=0, msg=name)
        torch.testing.assert_close(result.update["item_emb"], results["sequential"].update["item_emb"],
                                   atol=1e-10, rtol=0, msg=name)

    # Uniform weights: the server's update is the mean of the (noisy) individual uploads.
    mean_upload = torch.zeros(NUM_ITEMS, DIM, dtype=torch.float64).index_add_(0, reference.rows, reference.delta)
    torch.testing.assert_close(results["batched_kernel"].update["item_emb"], mean_upload / plan.num_clients,
                               atol=1e-12, rtol=0)

    # Which (client, row) pairs are sent.
    positions, items = plan.touched_rows(NUM_ITEMS)
    if noise is not None and noise.support == "full":
        assert len(reference) == plan.num_clients * NUM_ITEMS
        np.testing.assert_array_equal(reference.clients.numpy(), np.repeat(plan.clients, NUM_ITEMS))
        assert (reference.norms() > 0).all()  # untouched rows carry noise too
    else:
        np.testing.assert_array_equal(reference.clients.numpy(), plan.clients[positions])
        np.testing.assert_array_equal(reference.rows.numpy(), items)


@pytest.mark.parametrize("name", ["fedncf_neumf", "pfedrec"])
def test_client_updates_of_other_backbones_agree(name):
    train = toy_train()
    plan = _plan(train)
    noise = UploadNoise(0.02, "touched")
    if name == "pfedrec":
        method = pfedrec_method(PFedRec(NUM_USERS, NUM_ITEMS, DIM), lr=0.1, lr_eta=0.05, upload_noise=noise)
    else:
        method = fedncf_method(FedNCF(NUM_USERS, NUM_ITEMS, DIM, variant="neumf", hidden=(12, 6)), lr=0.05, lr_eta=2.0,
                               aggregation=Aggregation("num_examples"), upload_noise=noise)
    seq, _, weights = _round(method, SequentialExecutor(), plan, return_client_updates=True)
    bat, _, _ = _round(method, BatchedExecutor(chunk_size=5), plan, return_client_updates=True)
    assert set(seq.client_updates) == set(method.model.names("public_rows"))
    for table, updates in seq.client_updates.items():
        other = bat.client_updates[table]
        assert torch.equal(updates.clients, other.clients) and torch.equal(updates.rows, other.rows)
        torch.testing.assert_close(updates.delta, other.delta, atol=1e-10, rtol=0)
        # Weighted sum of the individual row uploads = the server's update of that table.
        w = torch.as_tensor(weights)[torch.searchsorted(torch.as_tensor(plan.clients), updates.clients)]
        summed = torch.zeros_like(seq.update[table]).index_add_(0, updates.rows, updates.delta * w[:, None])
        torch.testing.assert_close(summed, seq.update[table], atol=1e-12, rtol=0)


def test_noise_follows_the_client_not_the_chunk_or_the_other_participants():
    train = toy_train()
    plan = _plan(train)
    method = fedmf_method(FedMF(NUM_USERS, NUM_ITEMS, DIM, init_std=0.1), lr=0.5, upload_noise=UploadNoise(0.05, "full"))
    everyone = _round(method, BatchedExecutor(), plan, return_client_updates=True)[0].client_updates["item_emb"]
    few = _round(method, BatchedExecutor(), plan.subset(np.array([2, 9])), return_client_updates=True)[0]
    few = few.client_updates["item_emb"]
    for user in plan.clients[[2, 9]]:
        torch.testing.assert_close(few.of_client(user)[1], everyone.of_client(user)[1], atol=1e-12, rtol=0)
    # The noise on a row the client did not touch is exactly its own draw.
    state = ParameterAveraging(method, None, FederatedConfig(rounds=1, dtype="float64")).init(7)
    user = int(plan.clients[0])
    touched = torch.as_tensor(np.unique(plan.items[plan.client_examples(0)]))
    noise = client_upload_noise(method, state.global_state, user, plan.noise_key, touched)["item_emb"]
    untouched = torch.ones(NUM_ITEMS, dtype=torch.bool)
    untouched[touched] = False
    torch.testing.assert_close(everyone.of_client(user)[1][untouched], noise[untouched], atol=0, rtol=0)


def test_noise_seed_reproduces_the_round_loop():
    """run_federated draws client u's round-t noise from (config.seed, t, u): one round redone by
    hand with noise_seed=config.seed lands on the same state; without the seed (plan key) it does not."""
    train = toy_train()
    method = fedmf_method(FedMF(NUM_USERS, NUM_ITEMS, DIM, init_std=0.1), lr=0.5,
                          upload_noise=UploadNoise(0.05, "touched"))
    config = FederatedConfig(rounds=1, seed=7, batch_size=BATCH, dtype="float64")
    looped = run_federated(method, train, config, executor=BatchedExecutor())
    plan = _plan(train)  # round 0 of seed 7, as in the loop
    by_hand = {}
    for noise_seed in (7, None):
        result, state, _ = _round(method, SequentialExecutor(), plan, noise_seed=noise_seed)
        by_hand[noise_seed] = state.global_state["item_emb"] + result.update["item_emb"]
    torch.testing.assert_close(by_hand[7], looped.state.global_state["item_emb"], atol=1e-12, rtol=0)
    assert float((by_hand[None] - looped.state.global_state["item_emb"]).abs().max()) > 1e-3


def test_noise_has_the_laplace_scale_and_touched_support_spares_other_rows():
    train = toy_train()
    plan = _plan(train)
    scale = 0.3
    base = fedmf_method(FedMF(NUM_USERS, NUM_ITEMS, DIM), lr=0.5)
    clean = _round(base, BatchedExecutor(), plan, return_client_updates=True)[0]
    full = _round(dataclasses.replace(base, upload_noise=UploadNoise(scale, "full")), BatchedExecutor(), plan,
                  return_client_updates=True)[0]
    dense = full.client_updates["item_emb"].dense(NUM_ITEMS) - clean.client_updates["item_emb"].dense(NUM_ITEMS)
    # Laplace(0, b): mean 0, E|x| = b, Var = 2 b^2 (C x I x d = 6,720 draws: a few % error).
    assert abs(float(dense.mean())) < 0.02
    assert float(dense.abs().mean()) == pytest.approx(scale, rel=0.06)
    assert float(dense.var()) == pytest.approx(2 * scale**2, rel=0.12)

    # Three small clients leave most rows untouched: only full-support noise reaches those.
    few = plan.subset(np.array([0, 1, 2]))
    never_touched = np.setdiff1d(np.arange(NUM_ITEMS), few.items)
    assert never_touched.size > 20
    for support, untouched_changed in (("touched", False), ("full", True)):
        method = dataclasses.replace(base, upload_noise=UploadNoise(scale, support))
        update = _round(method, BatchedExecutor(), few)[0].update["item_emb"]
        assert bool((update[never_touched] != 0).all()) is untouched_changed
        assert bool((update[never_touched] != 0).any()) is untouched_changed


def test_client_update_guard():
    train = toy_train()
    plan = _plan(train)
    method = fedmf_method(FedMF(NUM_USERS, NUM_ITEMS, DIM), upload_noise=UploadNoise(0.1, "full"))
    limit = plan.num_clients * NUM_ITEMS * DIM - 1
    for executor in (SequentialExecutor(), BatchedExecutor()):
        with pytest.raises(ValueError, match="max_client_update_values"):
            _round(method, executor, plan, return_client_updates=True, max_client_update_values=limit)
    result = _round(method, BatchedExecutor(), plan, return_client_updates=True, max_client_update_values=limit + 1)[0]
    assert len(result.client_updates["item_emb"]) == plan.num_clients * NUM_ITEMS


# -- communication ---------------------------------------------------------------------------
def _tiny_run(method, rounds=2, num_negatives=0):
    # user 0 trains on items {0, 1}, user 1 on {2}, user 2 on {3, 4, 5}
    train = Pairs.from_arrays([0, 0, 1, 2, 2, 2], [0, 1, 2, 3, 4, 5], 3)
    ledger = CommunicationLedger()
    config = FederatedConfig(rounds=rounds, seed=0, num_negatives=num_negatives, dtype="float64")
    run_federated(method, train, config, executor=BatchedExecutor(), ledger=ledger)
    return ledger


def test_ledger_full_tables_and_touched_rows_by_hand():
    model = FedMF(3, 6, dim=4)  # item table 6 x 4 float64 = 192 B
    full = _tiny_run(fedmf_method(model))
    # Every round each of the 3 clients downloads and uploads the whole table: 3 x 192 B each way.
    assert full.total("download") == 2 * 3 * 192
    assert full.total("upload") == 2 * 3 * 192
    assert full.per_round()["total_bytes"].tolist() == [576, 576, 576, 576]

    rows = _tiny_run(fedmf_method(model, upload_mode="rows"))
    # A row = 4 x 8 B values + an 8 B int64 index = 40 B; clients send 2, 1 and 3 rows.
    assert rows.total("download") == 2 * 3 * 192
    assert rows.total("upload") == 2 * (2 + 1 + 3) * 40
    per_client = rows.to_frame(by_client=True)
    uploads = per_client[(per_client["direction"] == "upload") & (per_client["round"] == 1)]
    assert uploads["bytes"].tolist() == [80, 40, 120] and uploads["client"].tolist() == [0, 1, 2]

    # Noise changes values, not sizes.
    noisy = _tiny_run(fedmf_method(model, upload_mode="rows", upload_noise=UploadNoise(0.1, "touched")))
    assert noisy.total("upload") == rows.total("upload")


def test_ledger_counts_public_dense_tensors_and_sampled_negatives():
    # GMF with a public head: item table 6 x 4, head_w (4,), head_b () in float64.
    model = FedNCF(3, 6, dim=4, variant="gmf")
    ledger = _tiny_run(fedncf_method(model, upload_mode="rows"), rounds=1)
    per_name = ledger.per_round(by_name=True).set_index(["direction", "name"])["total_bytes"]
    assert per_name[("download", "item_emb")] == 3 * 192
    assert per_name[("download", "head_w")] == 3 * 32 and per_name[("upload", "head_w")] == 3 * 32
    assert per_name[("download", "head_b")] == 3 * 8 and per_name[("upload", "head_b")] == 3 * 8
    assert per_name[("upload", "item_emb")] == (2 + 1 + 3) * 40

    # With sampled negatives a client's rows are its distinct positives and negatives.
    ledger = _tiny_run(fedmf_method(FedMF(3, 6, dim=4), upload_mode="rows"), rounds=1, num_negatives=1)
    train = Pairs.from_arrays([0, 0, 1, 2, 2, 2], [0, 1, 2, 3, 4, 5], 3)
    plan = make_round_plan(train, NegativeSampler(train, 6), round_generator(0, 0), num_negatives=1)
    expected = [np.unique(plan.items[plan.client_examples(c)]).size * 40 for c in range(3)]
    assert ledger.to_frame(by_client=True).query("direction == 'upload'")["bytes"].tolist() == expected
