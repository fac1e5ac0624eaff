"""The counter-based noise of the engine: its distribution, its keying, and its batched draw.

Upload (Laplace) and gradient (Gaussian) noise are element ``e`` of a SplitMix64 stream keyed by
``(round key, client, stream, tensor)`` (``fedlib.engine.privacy.counter_bits``,
``fedlib.engine.plan.client_noise_keys``), drawn for every client of a round in one vectorised
call. These tests check what that must guarantee: the right distribution (Kolmogorov-Smirnov on
100k draws at fixed keys, moments), independence between clients, streams and tensors, values
that depend on ``(key, element)`` only (not on how rows are cut, on the other clients or on the
executor), and the batched draw equal to the per-client one.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from scipy import stats

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import Pairs
from fedlib.engine import (BatchedExecutor, FederatedConfig, GradientNoise, ParameterAveraging, SequentialExecutor,
                           UploadNoise, fedmf_method, make_round_plan, round_generator)
from fedlib.engine.plan import client_noise_keys
from fedlib.engine.privacy import counter_bits, gaussian_from_counters, laplace_from_counters
from fedlib.engine.uploads import (client_gradient_noise, client_upload_noise, clients_gradient_noise,
                                   full_table_upload_noise, upload_noise_rows)
from fedlib.models import FedMF

DRAWS = 100_000
ALPHA = 1e-3  # KS tests at fixed keys: deterministic, and a wrong distribution fails by far


def _keys(noise_key=12345, clients=(3,), stream=0, part=0):
    return client_noise_keys(noise_key, np.asarray(clients), stream=stream, part=part)


def _one_stream(sampler, scale, dtype, key=None, rows=1000, width=100):
    keys = np.repeat(_keys() if key is None else key, rows)
    starts = np.arange(rows, dtype=np.int64) * width
    return sampler(keys, starts, width, scale, dtype).double().reshape(-1).numpy()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_laplace_draws_pass_kolmogorov_smirnov_and_have_the_laplace_moments(dtype):
    scale = 0.3
    x = _one_stream(laplace_from_counters, scale, dtype)
    assert x.size == DRAWS
    assert stats.kstest(x, stats.laplace(scale=scale).cdf).pvalue > ALPHA
    assert abs(x.mean()) < 5 * np.sqrt(2) * scale / np.sqrt(DRAWS)
    assert x.var() == pytest.approx(2 * scale ** 2, rel=0.03)
    assert np.abs(x).mean() == pytest.approx(scale, rel=0.02)  # E|X| = b
    assert (x > 0).mean() == pytest.approx(0.5, abs=0.005)
    # A wrong scale is rejected by the same test (the test can fail).
    assert stats.kstest(x, stats.laplace(scale=1.1 * scale).cdf).pvalue < ALPHA
    assert stats.kstest(x, stats.norm(scale=np.sqrt(2) * scale).cdf).pvalue < ALPHA


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gaussian_draws_pass_kolmogorov_smirnov_and_have_the_normal_moments(dtype):
    std = 0.7
    x = _one_stream(gaussian_from_counters, std, dtype)
    assert stats.kstest(x, stats.norm(scale=std).cdf).pvalue > ALPHA
    assert abs(x.mean()) < 5 * std / np.sqrt(DRAWS)
    assert x.var() == pytest.approx(std ** 2, rel=0.03)
    assert stats.kurtosis(x) == pytest.approx(0.0, abs=0.1)
    assert stats.kstest(x, stats.norm(scale=1.1 * std).cdf).pvalue < ALPHA
    # Box-Muller pairs: the cos and sin halves are each normal and uncorrelated.
    even, odd = x[0::2], x[1::2]
    assert stats.kstest(even, stats.norm(scale=std).cdf).pvalue > ALPHA
    assert stats.kstest(odd, stats.norm(scale=std).cdf).pvalue > ALPHA
    assert abs(np.corrcoef(even, odd)[0, 1]) < 5 / np.sqrt(even.size)


def test_uniform_words_are_uniform_and_neighbours_uncorrelated():
    words = counter_bits(np.repeat(_keys(), 500), np.arange(500) * 200, 200).reshape(-1).astype(np.float64)
    u = words / 2 ** 32
    assert stats.kstest(u, "uniform").pvalue > ALPHA
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 5 / np.sqrt(u.size)
    bits = np.unpackbits(counter_bits(_keys(), [0], 4096).view(np.uint8))
    assert bits.mean() == pytest.approx(0.5, abs=0.01)


@pytest.mark.parametrize("what", ["clients", "streams", "parts", "round keys"])
def test_streams_of_other_clients_streams_parts_and_rounds_are_uncorrelated(what):
    variants = {
        "clients": [_keys(clients=(3,)), _keys(clients=(4,))],
        "streams": [_keys(stream=0), _keys(stream=1)],
        "parts": [_keys(part=0), _keys(part=1)],
        "round keys": [_keys(noise_key=12345), _keys(noise_key=12346)],
    }[what]
    a, b = (_one_stream(laplace_from_counters, 1.0, torch.float64, key=k) for k in variants)
    assert not np.array_equal(a, b)
    assert abs(np.corrcoef(a, b)[0, 1]) < 5 / np.sqrt(DRAWS)
    # ... and so are their signs and magnitudes separately (a shared word would correlate them)
    assert abs(np.corrcoef(np.abs(a), np.abs(b))[0, 1]) < 5 / np.sqrt(DRAWS)


def test_many_clients_at_once_are_uncorrelated_with_each_other():
    clients = np.arange(200)
    keys = client_noise_keys(99, clients)
    noise = laplace_from_counters(keys, np.zeros(clients.size, dtype=np.int64), 2000, 1.0, torch.float64).numpy()
    corr = np.corrcoef(noise)[np.triu_indices(clients.size, 1)]
    assert np.abs(corr).max() < 6 / np.sqrt(2000)
    assert abs(corr.mean()) < 5 / np.sqrt(2000 * corr.size)


def test_keys_are_a_pure_function_of_key_client_stream_part():
    assert np.array_equal(client_noise_keys(7, [5, 1, 9], stream=2, part=1),
                          np.concatenate([client_noise_keys(7, [u], stream=2, part=1) for u in (5, 1, 9)]))
    assert len(set(client_noise_keys(7, np.arange(10_000)).tolist())) == 10_000
    with pytest.raises(ValueError, match="stream and part"):
        client_noise_keys(7, [1], stream=-1)
    with pytest.raises(ValueError, match="client ids"):
        client_noise_keys(7, [-1])


@pytest.mark.parametrize("width", [32, 7])
def test_an_element_has_one_value_however_the_rows_are_cut(width):
    """Element e of a stream is the same in a long row, in short rows, at odd offsets, on both paths."""
    key = _keys()
    total = 40 * width
    whole = counter_bits(key, [0], total)[0]
    rows = counter_bits(np.repeat(key, 40), np.arange(40) * width, width).reshape(-1)
    odd = counter_bits(np.repeat(key, 3), [1, 3, 5], 5)  # generic path: odd starts
    assert np.array_equal(rows, whole)
    assert np.array_equal(odd[0], whole[1:6]) and np.array_equal(odd[2], whole[5:10])
    lap_whole = laplace_from_counters(key, [0], total, 0.5)[0]
    lap_rows = laplace_from_counters(np.repeat(key, 40), np.arange(40) * width, width, 0.5).reshape(-1)
    assert torch.equal(lap_whole, lap_rows)
    gauss_whole = gaussian_from_counters(key, [0], total, 0.5)[0]
    gauss_rows = gaussian_from_counters(np.repeat(key, 40), np.arange(40) * width, width, 0.5).reshape(-1)
    assert torch.equal(gauss_whole, gauss_rows)


def test_row_weights_scale_the_rows_and_zero_scale_gives_zeros():
    keys, starts = np.repeat(_keys(), 4), np.arange(4) * 8
    plain = laplace_from_counters(keys, starts, 8, 0.5, torch.float64)
    weighted = laplace_from_counters(keys, starts, 8, 0.5, torch.float64, row_weights=np.array([0.0, 1.0, 0.5, 2.0]))
    assert torch.allclose(weighted, plain * torch.tensor([0.0, 1.0, 0.5, 2.0], dtype=torch.float64)[:, None])
    assert torch.equal(laplace_from_counters(keys, starts, 8, 0.0), torch.zeros(4, 8))
    assert torch.equal(gaussian_from_counters(keys, starts, 8, 0.0), torch.zeros(4, 8))
    with pytest.raises(ValueError, match="row_weights"):
        laplace_from_counters(keys, starts, 8, 0.5, row_weights=np.array([1.0, -1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="starts must be >= 0"):
        counter_bits(keys, -starts - 1, 8)
    with pytest.raises(ValueError, match="same length"):
        laplace_from_counters(keys, starts[:3], 8, 0.5)


# -- the engine's noise --------------------------------------------------------------------------
def _setup(num_users=30, num_items=40, seed=0):
    rng = np.random.default_rng(seed)
    users = np.repeat(np.arange(num_users), 6)
    items = np.concatenate([rng.choice(num_items, 6, replace=False) for _ in range(num_users)])
    train = Pairs.from_arrays(users, items, num_users)
    model = FedMF(num_users, num_items, dim=6)
    plan = make_round_plan(train, NegativeSampler(train, num_items), round_generator(seed, 3), round_index=3,
                           num_negatives=2, batch_size=8)
    return model, plan


@pytest.mark.parametrize("support", ["touched", "full"])
def test_batched_upload_noise_is_each_clients_own_draw(support):
    """upload_noise_rows over all clients == client_upload_noise client by client, bit for bit."""
    model, plan = _setup()
    method = dataclasses.replace(fedmf_method(model, lr=0.5), upload_noise=UploadNoise(0.2, support=support))
    state = ParameterAveraging(method, None, FederatedConfig(rounds=1, seed=0)).init(0)
    num_items = model.num_items
    positions, items = plan.touched_rows(num_items)
    if support == "full":
        positions = np.repeat(np.arange(plan.num_clients), num_items)
        items = np.tile(np.arange(num_items), plan.num_clients)
    batched = upload_noise_rows(method, state.global_state, 77, plan.clients, positions, items)["item_emb"]
    bounds = np.searchsorted(positions, np.arange(plan.num_clients + 1))
    for c, user in enumerate(plan.clients.tolist()):
        own = client_upload_noise(method, state.global_state, user, 77, torch.as_tensor(items[bounds[c]:bounds[c + 1]]))
        assert torch.equal(own["item_emb"], batched[bounds[c]:bounds[c + 1]])
    # The touched rows' noise is the full table's noise on those rows (keyed by row, not by rank).
    touched_items = torch.as_tensor(plan.touched_rows(num_items)[1][:5])
    full_method = dataclasses.replace(method, upload_noise=UploadNoise(0.2, support="full"))
    touched_method = dataclasses.replace(method, upload_noise=UploadNoise(0.2, support="touched"))
    user = int(plan.clients[0])
    full = client_upload_noise(full_method, state.global_state, user, 77, touched_items)["item_emb"]
    touched = client_upload_noise(touched_method, state.global_state, user, 77, touched_items)["item_emb"]
    assert torch.equal(full[touched_items], touched)


def test_batched_gradient_noise_is_each_clients_own_draw_and_ignores_the_others():
    model, plan = _setup()
    method = dataclasses.replace(fedmf_method(model, lr=0.5), gradient_noise=GradientNoise(1.0, 0.3))
    state = ParameterAveraging(method, None, FederatedConfig(rounds=1, seed=0)).init(0)
    like = state.global_state["item_emb"]
    rows = np.array([3, 0, 5, 2])
    users = plan.clients[:4]
    shapes = {"item_emb": (1, 6), "user_emb": (6,)}
    batched = clients_gradient_noise(method, shapes, users, rows, 55, 2, like)
    first = np.concatenate([[0], np.cumsum(rows)])
    for c, user in enumerate(users.tolist()):
        own = client_gradient_noise(method, {"item_emb": (int(rows[c]), 6), "user_emb": (6,)}, user, 55, 2, like)
        assert torch.equal(own["item_emb"], batched["item_emb"][first[c]:first[c + 1]])
        assert torch.equal(own["user_emb"], batched["user_emb"][c])
    # Another set of participants leaves client users[1]'s noise unchanged.
    others = clients_gradient_noise(method, shapes, np.array([users[1], 999]), np.array([rows[1], 4]), 55, 2, like)
    assert torch.equal(others["user_emb"][0], batched["user_emb"][1])
    # Another step draws other numbers.
    assert not torch.equal(clients_gradient_noise(method, shapes, users, rows, 55, 3, like)["user_emb"],
                           batched["user_emb"])


@pytest.mark.parametrize("support", ["touched", "full"])
def test_executors_agree_on_a_noisy_round_and_chunking_changes_nothing(support):
    model, plan = _setup()
    method = dataclasses.replace(fedmf_method(model, lr=0.5), upload_noise=UploadNoise(0.1, support=support))
    config = FederatedConfig(rounds=1, seed=0, dtype="float64")
    weights = method.aggregation.client_weights(plan.num_examples)
    results = []
    for executor in (SequentialExecutor(), BatchedExecutor(), BatchedExecutor(chunk_size=7)):
        state = ParameterAveraging(method, None, config).init(0)
        results.append(executor.local_updates(method, state.global_state, state.private_state, plan, weights,
                                              noise_seed=5, return_client_updates=True))
    for other in results[1:]:
        torch.testing.assert_close(other.update["item_emb"], results[0].update["item_emb"], rtol=0, atol=1e-12)
        torch.testing.assert_close(other.client_updates["item_emb"].delta, results[0].client_updates["item_emb"].delta,
                                   rtol=0, atol=1e-12)
    # The noise really entered the aggregate.
    state = ParameterAveraging(method, None, config).init(0)
    plain = BatchedExecutor().local_updates(dataclasses.replace(method, upload_noise=None), state.global_state,
                                            state.private_state, plan, weights)
    assert (results[1].update["item_emb"] - plain.update["item_emb"]).abs().max() > 1e-3


def test_the_vectorised_block_size_changes_no_value(monkeypatch):
    import fedlib.engine.privacy as privacy

    keys, starts = np.repeat(_keys(), 300), np.arange(300) * 10
    default = (laplace_from_counters(keys, starts, 10, 0.5), gaussian_from_counters(keys, starts, 10, 0.5))
    monkeypatch.setattr(privacy, "COUNTER_BLOCK_ELEMENTS", 64)
    small = (laplace_from_counters(keys, starts, 10, 0.5), gaussian_from_counters(keys, starts, 10, 0.5))
    assert all(torch.equal(a, b) for a, b in zip(default, small))


def test_the_compiled_hash_gives_the_bits_of_numpys_splitmix64():
    from fedlib.engine.counter_kernel import splitmix64_rows
    from fedlib.engine.privacy import SPLITMIX_GAMMA, splitmix64

    bases = np.random.default_rng(3).integers(0, 2**63, size=17).astype(np.uint64) * np.uint64(2) + np.uint64(1)
    steps = np.arange(1, 301, dtype=np.uint64) * SPLITMIX_GAMMA
    assert np.array_equal(splitmix64_rows(bases, 300), splitmix64(bases[:, None] + steps[None, :]))
    assert splitmix64_rows(bases, 0).shape == (17, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("weighted", [False, True])
def test_the_whole_pair_paths_give_the_bits_of_the_per_element_path(monkeypatch, dtype, weighted):
    """Rows of whole pairs take compiled / pairwise paths; the generic per-element numpy path is their reference."""
    import fedlib.engine.privacy as privacy

    rng = np.random.default_rng(4)
    keys = rng.integers(0, 2**63, size=120).astype(np.uint64)
    starts, width = rng.integers(0, 10**6, size=120) * 2, 2 * 37
    weights = rng.random(120) if weighted else None
    fast = (laplace_from_counters(keys, starts, width, 0.3, dtype, row_weights=weights),
            gaussian_from_counters(keys, starts, width, 0.3, dtype))
    monkeypatch.setattr(privacy, "_pairs_aligned", lambda *_: False)
    generic = (laplace_from_counters(keys, starts, width, 0.3, dtype, row_weights=weights),
               gaussian_from_counters(keys, starts, width, 0.3, dtype))
    for a, b in zip(fast, generic):  # the same bits, including the sign of zeros
        assert torch.equal(a, b) and torch.equal(a.signbit(), b.signbit())


def test_whole_tables_drawn_as_one_row_per_client_are_the_rows_of_every_item():
    """full_table_upload_noise (one long row per client) == upload_noise_rows over every item; weights scale clients."""
    model, plan = _setup()
    method = dataclasses.replace(fedmf_method(model, lr=0.5), upload_noise=UploadNoise(0.2, support="full"))
    state = ParameterAveraging(method, None, FederatedConfig(rounds=1, seed=0)).init(0)
    num_items, clients = model.num_items, plan.clients[:4]
    positions = np.repeat(np.arange(clients.size), num_items)
    items = np.tile(np.arange(num_items), clients.size)
    rows = upload_noise_rows(method, state.global_state, 77, clients, positions, items)["item_emb"]
    tables = full_table_upload_noise(method, state.global_state, 77, clients, "item_emb")
    assert tables.shape == (clients.size, *state.global_state["item_emb"].shape)
    assert torch.equal(tables.reshape(rows.shape), rows)
    weights = np.array([0.5, 0.0, 2.0, 1.0])
    weighted = full_table_upload_noise(method, state.global_state, 77, clients, "item_emb", weights)
    expected = tables * torch.as_tensor(weights, dtype=tables.dtype)[:, None, None]
    assert torch.allclose(weighted, expected, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(weighted, tables)  # the weights do change the noise (the test can fail)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("block", [None, 64])
def test_noise_added_in_place_has_the_bits_of_drawing_it_and_index_add(monkeypatch, weighted, block):
    """add_laplace_from_counters == laplace_from_counters + index_add_, bit for bit, repeated rows included."""
    import fedlib.engine.privacy as privacy
    from fedlib.engine.privacy import add_laplace_from_counters

    if block is not None:  # many blocks: the rows must still be added in order across them
        monkeypatch.setattr(privacy, "COUNTER_BLOCK_ELEMENTS", block)
    rng = np.random.default_rng(6)
    rows, width, table_rows = 500, 2 * 9, 23
    keys = rng.integers(0, 2**63, size=rows).astype(np.uint64)
    destination = rng.integers(0, table_rows, size=rows)  # every table row hit ~20 times
    starts = destination * width
    weights = rng.random(rows) if weighted else None
    table = torch.randn(table_rows, 3, 6)  # rows of (3, 6): 18 elements each
    expected = table.clone().index_add_(0, torch.as_tensor(destination),
                                        laplace_from_counters(keys, starts, width, 0.3, row_weights=weights).view(-1, 3, 6))
    returned = add_laplace_from_counters(table, destination, keys, starts, width, 0.3, row_weights=weights)
    assert returned is table
    assert torch.equal(table, expected)
    # Summed in another order the float32 table differs: bit equality above does tell orders apart.
    noise = laplace_from_counters(keys, starts, width, 0.3, row_weights=weights).view(-1, 3, 6)
    start = expected - 0  # a copy of the same table the sums began from
    start.index_add_(0, torch.as_tensor(destination), -noise)  # back to the first table, up to rounding
    reverse = torch.arange(rows - 1, -1, -1)
    backwards = start.clone().index_add_(0, torch.as_tensor(destination)[reverse], noise[reverse])
    forwards = start.clone().index_add_(0, torch.as_tensor(destination), noise)
    assert not torch.equal(backwards, forwards)


@pytest.mark.parametrize("case", ["float64", "unaligned", "zero scale"])
def test_noise_added_in_place_falls_back_to_index_add_off_the_compiled_path(case):
    from fedlib.engine.privacy import add_laplace_from_counters

    rng = np.random.default_rng(7)
    dtype = torch.float64 if case == "float64" else torch.float32
    width = 7 if case == "unaligned" else 8
    keys = rng.integers(0, 2**63, size=50).astype(np.uint64)
    destination = rng.integers(0, 5, size=50)
    starts = destination * width + (1 if case == "unaligned" else 0)
    scale = 0.0 if case == "zero scale" else 0.4
    table = torch.randn(5, width, dtype=dtype)
    expected = table.clone().index_add_(0, torch.as_tensor(destination),
                                        laplace_from_counters(keys, starts, width, scale, dtype))
    add_laplace_from_counters(table, destination, keys, starts, width, scale)
    assert torch.equal(table, expected)


def test_noise_added_in_place_rejects_mismatched_rows():
    from fedlib.engine.privacy import add_laplace_from_counters

    keys, table = np.arange(4, dtype=np.uint64), torch.zeros(3, 4)
    with pytest.raises(ValueError, match="one row per key"):
        add_laplace_from_counters(table, np.array([0, 1]), keys, np.zeros(4, dtype=np.int64), 4, 0.1)
    with pytest.raises(ValueError, match="rows must have 6 elements"):
        add_laplace_from_counters(table, np.zeros(4, dtype=np.int64), keys, np.zeros(4, dtype=np.int64), 6, 0.1)
    with pytest.raises(ValueError, match=r"destination rows must lie in \[0, 3\)"):
        add_laplace_from_counters(table, np.array([0, 1, 2, 3]), keys, np.zeros(4, dtype=np.int64), 4, 0.1)
    with pytest.raises(ValueError, match="row_weights"):
        add_laplace_from_counters(table, np.zeros(4, dtype=np.int64), keys, np.zeros(4, dtype=np.int64), 4, 0.1,
                                  row_weights=np.array([1.0, -1.0, 1.0, 1.0]))
    assert torch.equal(table, torch.zeros(3, 4))  # nothing was added before the errors


def test_a_float32_noisy_round_adds_the_noise_in_place_with_the_bits_of_index_add(monkeypatch):
    """The batched round's touched-row noise, added as drawn, == drawing the rows and index_add_ (float32)."""
    import fedlib.engine.batched as batched

    def drawn_then_added(method, global_state, noise_key, client_ids, positions, items, name, table, row_weights=None):
        noise = upload_noise_rows(method, global_state, noise_key, client_ids, positions, items, names=[name],
                                  row_weights=row_weights)[name]
        return table.index_add_(0, torch.as_tensor(items), noise)

    model, plan = _setup()
    method = dataclasses.replace(fedmf_method(model, lr=0.5), upload_noise=UploadNoise(0.1, support="touched"))
    config = FederatedConfig(rounds=1, seed=0, dtype="float32")
    weights = method.aggregation.client_weights(plan.num_examples)

    def round_update(method):
        state = ParameterAveraging(method, None, config).init(0)
        assert state.global_state["item_emb"].dtype == torch.float32
        return BatchedExecutor().local_updates(method, state.global_state, state.private_state, plan, weights,
                                               noise_seed=5).update["item_emb"]

    in_place = round_update(method)
    monkeypatch.setattr(batched, "add_upload_noise_rows", drawn_then_added)
    assert torch.equal(in_place, round_update(method))
    plain = round_update(dataclasses.replace(method, upload_noise=None))
    assert (in_place - plain).abs().max() > 1e-3  # the noise is in it
