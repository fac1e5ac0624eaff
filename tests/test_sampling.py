"""The training negative sampler: exclusion, uniformity, determinism, speed, leak option."""
from __future__ import annotations

import time

import numpy as np
import pytest

from fedlib.data.sampling import NegativeSampler, sample_negatives
from fedlib.data.splits import Pairs


def _random_pairs(num_users=50, num_items=200, per_user=30, seed=0):
    rng = np.random.default_rng(seed)
    users = np.repeat(np.arange(num_users), per_user)
    items = np.concatenate([rng.choice(num_items, per_user, replace=False) for _ in range(num_users)])
    return Pairs.from_arrays(users, items, num_users)


@pytest.mark.parametrize("dense", [True, False])
def test_never_samples_an_excluded_item(dense, monkeypatch):
    if not dense:  # force the sorted-key (searchsorted) lookup
        monkeypatch.setattr("fedlib.data.sampling._DENSE_LOOKUP_MAX_CELLS", 0)
    train = _random_pairs()
    sampler = NegativeSampler(train, 200)
    assert (sampler._dense is not None) == dense
    negatives = sampler.sample(train.users, 8, np.random.default_rng(1))
    assert negatives.shape == (len(train), 8)
    assert negatives.min() >= 0 and negatives.max() < 200
    owned = {(u, i) for u, i in zip(train.users.tolist(), train.items.tolist())}
    for u, row in zip(train.users.tolist(), negatives.tolist()):
        assert not any((u, i) in owned for i in row)


def test_uniform_over_allowed_items():
    # One user owning items 0..49 of 100: negatives must be uniform over 50..99.
    train = Pairs.from_arrays(np.zeros(50, dtype=np.int64), np.arange(50), 1)
    draws = NegativeSampler(train, 100).sample(np.zeros(20_000, dtype=np.int64), 5, np.random.default_rng(3)).ravel()
    assert draws.min() >= 50
    counts = np.bincount(draws - 50, minlength=50)
    expected = draws.size / 50
    chi2 = ((counts - expected) ** 2 / expected).sum()
    # 49 degrees of freedom: the 99.9% quantile is about 85.
    assert chi2 < 85, chi2


def test_deterministic_under_a_seed_and_sensitive_to_it():
    train = _random_pairs()
    sampler = NegativeSampler(train, 200)
    a = sampler.sample(train.users, 4, np.random.default_rng(42))
    b = sampler.sample(train.users, 4, np.random.default_rng(42))
    c = sampler.sample(train.users, 4, np.random.default_rng(43))
    np.testing.assert_array_equal(a, b)
    assert (a != c).mean() > 0.5
    # The helper gives the same draws.
    np.testing.assert_array_equal(sample_negatives(train, 200, 4, np.random.default_rng(42)), a)


def test_default_excludes_only_training_items_and_all_rated_is_opt_in():
    train = Pairs.from_arrays([0] * 3, [0, 1, 2], 1)
    held_out = Pairs.from_arrays([0, 0], [3, 4], 1)  # valid + test of user 0
    union = Pairs.from_arrays([0] * 5, [0, 1, 2, 3, 4], 1)
    clean = NegativeSampler(train, 6).sample(np.zeros(2000, dtype=np.int64), 1, np.random.default_rng(0))
    assert set(np.unique(clean)) == {3, 4, 5}  # held-out items are possible negatives
    leaky = NegativeSampler(train, 6, exclude="all_rated", all_rated=union).sample(np.zeros(200, dtype=np.int64), 1, np.random.default_rng(0))
    assert set(np.unique(leaky)) == {5}
    with pytest.raises(ValueError, match="all_rated"):
        NegativeSampler(train, 6, exclude="all_rated")
    with pytest.raises(ValueError, match="only used"):
        NegativeSampler(train, 6, all_rated=union)
    with pytest.raises(ValueError, match="exclude must be"):
        NegativeSampler(train, 6, exclude="valid")
    assert held_out.num_users == 1


def test_user_with_no_valid_negative_is_a_clear_error():
    train = Pairs.from_arrays([0, 0, 0, 1], [0, 1, 2, 0], 2)
    sampler = NegativeSampler(train, 3)
    sampler.sample(np.array([1]), 2, np.random.default_rng(0))  # user 1 is fine
    with pytest.raises(ValueError, match="every one of the 3 items excluded"):
        sampler.sample(np.array([1, 0]), 2, np.random.default_rng(0))


def test_nearly_full_users_get_exact_draws():
    # User 0 may only receive item 999: rejection alone would need ~1000 passes.
    train = Pairs.from_arrays(np.zeros(999, dtype=np.int64), np.arange(999), 1)
    draws = NegativeSampler(train, 1000).sample(np.zeros(50, dtype=np.int64), 3, np.random.default_rng(0))
    assert (draws == 999).all()


def test_500k_draws_are_fast():
    rng = np.random.default_rng(0)
    num_users, num_items = 943, 1682
    users = np.repeat(np.arange(num_users), 106)
    items = rng.integers(0, num_items, users.size)
    train = Pairs.from_arrays(users, items, num_users)
    sampler = NegativeSampler(train, num_items)
    owners = train.users[: 125_000]
    best = min(_timed(lambda: sampler.sample(owners, 4, np.random.default_rng(1))) for _ in range(5))
    assert best < 0.1, best  # typically ~0.01 s


def _timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
