"""Sampled evaluation candidates: exclusion, distinctness, ranges, determinism, errors."""
from __future__ import annotations

import numpy as np
import pytest

from fedlib.data.candidates import candidates_for, sample_candidates
from fedlib.data.splits import Pairs


def _random_problem(seed=0, n_users=300, n_items=500, per_user=60):
    rng = np.random.default_rng(seed)
    users = np.repeat(np.arange(n_users), per_user)
    items = np.concatenate([rng.choice(n_items, per_user, replace=False) for _ in range(n_users)])
    positives = items[::per_user]  # one known item per user is the held-out positive
    return users, items, positives


def test_never_a_positive_always_distinct_positive_first():
    users, items, positives = _random_problem()
    rows = np.arange(300)
    cands = sample_candidates(rows, positives, users, items, num_negatives=99, seed=0, num_items=500)
    assert cands.shape == (300, 100) and cands.dtype == np.int64
    assert np.array_equal(cands[:, 0], positives)
    known = users * 500 + items
    assert not np.isin(rows[:, None] * 500 + cands[:, 1:], known).any()
    assert all(np.unique(r).size == 100 for r in cands)
    assert cands.min() >= 0 and cands.max() < 500


def test_fixed_by_seed():
    users, items, positives = _random_problem()
    rows = np.arange(300)
    a = sample_candidates(rows, positives, users, items, num_negatives=99, seed=5, num_items=500)
    b = sample_candidates(rows, positives, users, items, num_negatives=99, seed=5, num_items=500)
    c = sample_candidates(rows, positives, users, items, num_negatives=99, seed=6, num_items=500)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_per_row_ranges_and_saturated_rows():
    # Row 0 may only draw from [10, 20) minus its 5 known items: exactly 5 are left.
    users = np.array([0] * 5 + [1])
    items = np.array([10, 11, 12, 13, 14, 3])
    cands = sample_candidates(np.array([0, 1]), np.array([10, 3]), users, items, num_negatives=5, seed=0,
                              item_low=np.array([10, 0]), item_high=np.array([20, 10]))
    assert sorted(cands[0, 1:].tolist()) == [15, 16, 17, 18, 19]
    assert np.all((cands[1, 1:] >= 0) & (cands[1, 1:] < 10)) and 3 not in cands[1, 1:]


def test_positive_is_excluded_even_if_not_listed():
    cands = sample_candidates(np.zeros(50, int), np.full(50, 2), [], [], num_negatives=3, seed=1, num_items=4)
    assert not np.any(cands[:, 1:] == 2)


def test_errors():
    with pytest.raises(ValueError, match="cannot draw 5"):
        sample_candidates(np.array([0]), np.array([1]), [0, 0], [1, 2], num_negatives=5, seed=0, num_items=6)
    with pytest.raises(ValueError, match="outside its candidate range"):
        sample_candidates(np.array([0]), np.array([9]), [], [], num_negatives=1, seed=0, num_items=5)


def test_candidates_for_uses_every_known_interaction():
    train = Pairs.from_arrays([0, 0, 1], [0, 1, 2], num_users=2)
    test = Pairs.from_arrays([0, 1], [2, 3], num_users=2)
    cands = candidates_for(test, [train, test], num_items=6, num_negatives=3, seed=0)
    assert sorted(cands[0, 1:].tolist()) == [3, 4, 5]
    assert set(cands[1, 1:].tolist()) <= {0, 1, 4, 5} and np.unique(cands[1, 1:]).size == 3
