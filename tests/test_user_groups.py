"""FedRKG user groups and group statistics (fedlib.metrics.user_groups) on hand-computed toys."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedlib.data.splits import Pairs
from fedlib.metrics.user_groups import (
    distinct_and_followers, gate_group_change, group_count, improved_declined, popular_items, popular_share,
    relative_change, warm_and_cold,
)

torch.set_num_threads(1)  # other experiments share this machine

NUM_ITEMS = 6


def toy_train() -> Pairs:
    """6 items, 6 users (user 5 has no training data).

    user 0: items 0 1 2 3      (4 interactions)
    user 1: items 0 0 4        (3, the pair (1, 0) twice)
    user 2: items 0 1          (2)
    user 3: items 5 4 3 2 1    (5)
    user 4: item  1            (1)
    item counts: 0 -> 4, 1 -> 4, 2 -> 2, 3 -> 2, 4 -> 2, 5 -> 1
    """
    rows = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 0), (1, 4), (2, 0), (2, 1),
            (3, 5), (3, 4), (3, 3), (3, 2), (3, 1), (4, 1)]
    users, items = zip(*rows)
    return Pairs.from_arrays(users, items, num_users=6)


# -- counts -----------------------------------------------------------------------------------
def test_group_count_rounds_half_up():
    assert group_count(0.3, 6) == 2  # 1.8
    assert group_count(0.3, 5) == 2  # 1.5
    assert group_count(0.3, 10) == 3  # 3.0000000000000004
    assert group_count(0.15, 10) == 2  # 1.5
    assert group_count(0.29, 50) == 15  # 14.499999999999998
    assert group_count(0.3, 7957) == 2387
    assert group_count(0.3, 1372) == 412
    assert group_count(0.1, 1372) == 137


# -- popular items and shares -----------------------------------------------------------------
def test_popular_items_top_30_percent():
    mask = popular_items(toy_train(), NUM_ITEMS)  # 30 % of 6 -> 2 items
    assert mask.dtype == np.bool_
    assert mask.tolist() == [True, True, False, False, False, False]


def test_popular_items_ties_go_to_smaller_ids():
    # 50 % of 6 -> 3 items: 0 and 1 (count 4), then the smallest id among 2, 3, 4 (count 2).
    assert np.flatnonzero(popular_items(toy_train(), NUM_ITEMS, top_fraction=0.5)).tolist() == [0, 1, 2]
    # Unseen items fill the top k by id once the seen ones are used up.
    train = Pairs.from_arrays([0, 0], [3, 3], num_users=1)
    assert np.flatnonzero(popular_items(train, 4, top_fraction=0.5)).tolist() == [0, 3]


def test_popular_share_per_user():
    train = toy_train()
    share = popular_share(train, popular_items(train, NUM_ITEMS))
    np.testing.assert_allclose(share[:5], [2 / 4, 2 / 3, 1.0, 1 / 5, 1.0])
    assert np.isnan(share[5])  # no training data


# -- distinct users vs followers --------------------------------------------------------------
def test_distinct_and_followers_median_split_with_tie_at_the_median():
    # shares of users 0..4: 0.5, 0.667, 1, 0.2, 1; median split k = round(2.5) = 3 ->
    # both thresholds are the median 2/3, so user 1 (at the median) joins neither pool.
    groups = distinct_and_followers(toy_train(), NUM_ITEMS, group_size=2)
    assert groups.distinct.tolist() == [0, 3]
    assert groups.followers.tolist() == [2, 4]
    assert groups.distinct_threshold == pytest.approx(2 / 3)
    assert groups.follower_threshold == pytest.approx(2 / 3)
    assert (groups.distinct_pool_size, groups.follower_pool_size, groups.population_size) == (2, 2, 5)
    assert groups.popular.tolist() == [True, True, False, False, False, False]
    np.testing.assert_allclose(groups.share[:5], [0.5, 2 / 3, 1.0, 0.2, 1.0])


def test_distinct_and_followers_ties_join_the_pool():
    # k = round(0.2 * 5) = 1: distinct = share <= 0.2 -> {3}; followers = share >= 1 -> {2, 4} (a tie).
    groups = distinct_and_followers(toy_train(), NUM_ITEMS, group_size=None, pool_fraction=0.2)
    assert groups.distinct.tolist() == [3]
    assert groups.followers.tolist() == [2, 4]
    assert (groups.distinct_threshold, groups.follower_threshold) == (0.2, 1.0)
    # Tercile-like pools: k = 2 -> share <= 0.5 and share >= 1.
    groups = distinct_and_followers(toy_train(), NUM_ITEMS, group_size=None, pool_fraction=0.4)
    assert (groups.distinct.tolist(), groups.followers.tolist()) == ([0, 3], [2, 4])
    assert (groups.distinct_threshold, groups.follower_threshold) == (0.5, 1.0)


def test_distinct_and_followers_candidates_restrict_the_population():
    # Without user 4: shares 0.5, 0.667, 1, 0.2; k = 2 -> distinct <= 0.5, followers >= 0.667.
    groups = distinct_and_followers(toy_train(), NUM_ITEMS, group_size=None, candidates=[0, 1, 2, 3])
    assert (groups.distinct.tolist(), groups.followers.tolist()) == ([0, 3], [1, 2])
    with pytest.raises(ValueError, match="without training interactions"):
        distinct_and_followers(toy_train(), NUM_ITEMS, candidates=[0, 5])


def _random_train(num_users=60, num_items=40, seed=3) -> Pairs:
    rng = np.random.default_rng(seed)
    counts = rng.integers(3, 12, size=num_users)
    users = np.repeat(np.arange(num_users), counts)
    # Skewed popularity so that shares spread out.
    items = np.minimum(rng.geometric(0.08, size=users.size) - 1, num_items - 1)
    return Pairs.from_arrays(users, items, num_users=num_users)


def test_distinct_and_followers_sampling_is_seeded_and_within_pools():
    train = _random_train()
    a = distinct_and_followers(train, 40, group_size=10, seed=7)
    b = distinct_and_followers(train, 40, group_size=10, seed=7)
    c = distinct_and_followers(train, 40, group_size=10, seed=8)
    assert np.array_equal(a.distinct, b.distinct) and np.array_equal(a.followers, b.followers)
    assert not (np.array_equal(a.distinct, c.distinct) and np.array_equal(a.followers, c.followers))
    for groups in (a, c):
        assert groups.distinct.size == groups.followers.size == 10
        assert np.all(np.diff(groups.distinct) > 0) and np.all(np.diff(groups.followers) > 0)
        assert np.all(groups.share[groups.distinct] <= groups.distinct_threshold)
        assert np.all(groups.share[groups.followers] >= groups.follower_threshold)
        assert np.intersect1d(groups.distinct, groups.followers).size == 0
    # The pools do not depend on the seed.
    assert (a.distinct_threshold, a.follower_threshold, a.distinct_pool_size, a.follower_pool_size) == (
        c.distinct_threshold, c.follower_threshold, c.distinct_pool_size, c.follower_pool_size)
    # Pool sizes follow the documented rule (strict inequalities when the thresholds meet).
    share, low, high = a.share, a.distinct_threshold, a.follower_threshold
    strict = low == high
    assert a.distinct_pool_size == int(((share < low) if strict else (share <= low)).sum())
    assert a.follower_pool_size == int(((share > high) if strict else (share >= high)).sum())
    assert a.population_size == 60 and a.distinct_pool_size + a.follower_pool_size <= 60


def test_distinct_and_followers_pool_too_small_says_what_to_change():
    with pytest.raises(ValueError, match=r"distinct pool has 2 users .*fewer than group_size=3.*group_size=None"):
        distinct_and_followers(toy_train(), NUM_ITEMS, group_size=3)
    with pytest.raises(ValueError, match=r"pool_fraction must lie in \(0, 0.5\]"):
        distinct_and_followers(toy_train(), NUM_ITEMS, pool_fraction=0.6)
    with pytest.raises(ValueError, match=r"top_fraction must lie in \(0, 1\)"):
        distinct_and_followers(toy_train(), NUM_ITEMS, top_fraction=1.0)
    with pytest.raises(ValueError, match="group_size must be a positive integer"):
        distinct_and_followers(toy_train(), NUM_ITEMS, group_size=0)


# -- warm vs cold -----------------------------------------------------------------------------
def test_warm_and_cold_top_and_bottom_30_percent():
    groups = warm_and_cold(toy_train())  # counts 4, 3, 2, 5, 1 -> k = round(1.5) = 2
    assert groups.warm.tolist() == [0, 3]
    assert groups.cold.tolist() == [2, 4]
    assert (groups.warm_min_count, groups.cold_max_count, groups.population_size) == (4, 2, 5)


def test_warm_and_cold_ties_are_split_by_id_without_overlap():
    # counts 2, 2, 2, 1, 3; k = 2. Ranking (count desc, id asc): 4, 0, 1, 2, 3.
    train = Pairs.from_arrays([0, 0, 1, 1, 2, 2, 3, 4, 4, 4], [0] * 10, num_users=5)
    groups = warm_and_cold(train, fraction=0.4)
    assert groups.warm.tolist() == [0, 4]
    assert groups.cold.tolist() == [2, 3]
    assert groups.warm_min_count == 2 and groups.cold_max_count == 2


def test_warm_and_cold_errors():
    with pytest.raises(ValueError, match=r"fraction must lie in \(0, 0.5\]"):
        warm_and_cold(toy_train(), fraction=0.7)
    with pytest.raises(ValueError, match="would overlap"):
        warm_and_cold(toy_train(), fraction=0.5)  # 3 + 3 > 5 users
    with pytest.raises(ValueError, match="rounds to 0 users"):
        warm_and_cold(toy_train(), fraction=0.05)
    with pytest.raises(TypeError, match="must be a fedlib.data.splits.Pairs"):
        warm_and_cold(([0], [1]))


# -- relative change and improved/declined (Table 4) ------------------------------------------
BEFORE = {"NDCG@5": np.array([0.5, 0.3, 0.0, 1.0, 0.3]), "Recall@5": np.array([1.0, 0.0, 0.0, 1.0, 0.0])}
AFTER = {"NDCG@5": torch.tensor([0.6, 0.4, 0.0, 1.0, 0.5], dtype=torch.float64),
         "Recall@5": torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0], dtype=torch.float64)}


def test_relative_change_of_group_means():
    change = relative_change(BEFORE, AFTER, [0, 1])
    assert list(change) == ["NDCG@5", "Recall@5"]
    assert change["NDCG@5"] == pytest.approx(25.0)  # 0.4 -> 0.5
    assert change["Recall@5"] == pytest.approx(-100.0)  # 0.5 -> 0
    assert relative_change(BEFORE, AFTER, [3, 4], metrics=["NDCG@5"]) == {"NDCG@5": pytest.approx(100 * (0.75 - 0.65) / 0.65)}


def test_relative_change_zero_mean_before_is_nan_with_warning():
    with pytest.warns(RuntimeWarning, match="Recall@5.*reference mean is 0"):
        change = relative_change(BEFORE, AFTER, [1, 4])
    assert math.isnan(change["Recall@5"])
    assert change["NDCG@5"] == pytest.approx(100 * (0.45 - 0.3) / 0.3)


def test_relative_change_matches_rows_of_per_user_pairs():
    # Rows as returned by RankingEvaluator.per_user: only evaluated users, in their own order.
    before = (np.array([1, 3, 4]), {"NDCG@5": torch.tensor([0.2, 0.4, 0.6])})
    after = (np.array([4, 3]), {"NDCG@5": torch.tensor([0.9, 0.5])})
    assert relative_change(before, after, [3, 4])["NDCG@5"] == pytest.approx(100 * (0.7 - 0.5) / 0.5)
    with pytest.raises(ValueError, match=r"after has no row for 1 group users \(e.g. \[1\]\)"):
        relative_change(before, after, [1, 3])


def test_relative_change_input_errors():
    with pytest.raises(ValueError, match="group holds user 7"):
        relative_change(BEFORE, AFTER, [0, 7])
    with pytest.raises(ValueError, match=r"repeats user ids \[1\]"):
        relative_change(BEFORE, AFTER, [1, 1])
    with pytest.raises(ValueError, match="different metrics"):
        relative_change(BEFORE, {"NDCG@5": AFTER["NDCG@5"]}, [0])
    with pytest.raises(KeyError, match="'MRR' is not in before"):
        relative_change(BEFORE, AFTER, [0], metrics=["MRR"])
    with pytest.raises(ValueError, match="different lengths"):
        relative_change({"a": [1.0, 2.0], "b": [1.0]}, {"a": [1.0, 2.0], "b": [1.0]}, [0])
    with pytest.raises(ValueError, match="NaN or infinite"):
        relative_change({"a": [np.nan, 1.0]}, {"a": [1.0, 1.0]}, [0])


def test_improved_declined_counts_both_ways():
    # Aggregate (NDCG + Recall) before 1.5, 0.3, 0, 2, 0.3; after 0.6, 0.4, 0, 2, 1.5.
    result = improved_declined(BEFORE, AFTER)
    assert (result.n_users, result.n_improved, result.n_declined, result.n_unchanged) == (5, 2, 1, 2)
    assert (result.improved, result.declined, result.unchanged) == pytest.approx((0.4, 0.2, 0.4))
    assert (result.improved_of_changed, result.declined_of_changed) == pytest.approx((2 / 3, 1 / 3))
    # One metric only, a sub-group, and a dead band.
    result = improved_declined(BEFORE, AFTER, [0, 1, 4], metrics=["NDCG@5"])
    assert (result.n_improved, result.n_declined, result.n_unchanged) == (3, 0, 0)
    result = improved_declined(BEFORE, AFTER, [0, 1, 4], metrics=["NDCG@5"], atol=0.15)
    assert (result.n_improved, result.n_declined, result.n_unchanged) == (1, 0, 2)
    result = improved_declined(BEFORE, AFTER, [2, 3])
    assert result.n_unchanged == 2 and math.isnan(result.improved_of_changed)


# -- gating values of two groups (Tables D.3, D.4) --------------------------------------------
L3, L4 = math.log(3.0), math.log(4.0)  # sigma(ln 3) = 0.75, sigma(ln 4) = 0.8
LOGITS = torch.tensor([[L3, L3, 0.0, 0.0],
                       [L4, 0.0, L4, -L4],
                       [0.0, L3, -L3, L3]], dtype=torch.float64)


def test_gate_group_change_on_chosen_items():
    result = gate_group_change(LOGITS, [0], [1, 2], item_mask=np.array([True, True, False, False]))
    assert (result.mean_value_a, result.mean_value_b) == pytest.approx((0.75, (0.8 + 0.5 + 0.5 + 0.75) / 4))
    assert (result.mean_logit_a, result.mean_logit_b) == pytest.approx((L3, (L4 + L3) / 4))
    assert result.value_change == pytest.approx(-15.0)
    assert result.logit_change == pytest.approx(100 * ((L4 + L3) / 4 - L3) / L3)
    assert (result.n_a, result.n_b, result.n_items) == (1, 2, 2)
    # Item ids instead of a mask give the same numbers.
    assert gate_group_change(LOGITS, [0], [1, 2], item_mask=[1, 0]) == pytest.approx(tuple(result))


def test_gate_group_change_all_items_numpy_and_values():
    result = gate_group_change(LOGITS.numpy(), np.array([0]), np.array([1, 2]))
    assert result.mean_value_a == pytest.approx(0.625) and result.mean_value_b == pytest.approx(4.55 / 8)
    assert result.value_change == pytest.approx(-9.0)
    assert result.logit_change == pytest.approx(100 * (math.log(12.0) / 8 - L3 / 2) / (L3 / 2))
    from_values = gate_group_change(torch.sigmoid(LOGITS).float(), [0], [1, 2], kind="values")
    assert from_values.value_change == pytest.approx(-9.0, rel=1e-5)
    assert from_values.logit_change == pytest.approx(result.logit_change, rel=1e-4)


def test_gate_group_change_zero_logit_mean_is_nan():
    with pytest.warns(RuntimeWarning, match="gate logit .*reference mean is 0"):
        result = gate_group_change(LOGITS, [0], [1], item_mask=[2, 3])  # user 0: logits 0, 0
    assert math.isnan(result.logit_change)
    assert result.value_change == pytest.approx(100 * ((0.8 + 0.2) / 2 - 0.5) / 0.5)  # 0.0


def test_gate_group_change_with_fedrkg_gate_logits():
    from fedlib.papers.fedrkg.guidance import gate_logits, gate_values

    g = torch.Generator().manual_seed(0)
    personal, p_g = torch.randn(4, 5, 3, generator=g), torch.randn(5, 3, generator=g)
    weight, bias = torch.randn(4, 9, generator=g), torch.randn(4, generator=g)
    logits = gate_logits(personal, p_g, weight, bias)
    values = gate_values(personal, p_g, weight, bias)
    mask = torch.tensor([True, False, True, True, False])
    result = gate_group_change(logits, [0, 2], [1, 3], item_mask=mask)
    v_a, v_b = values[[0, 2]][:, mask].double().mean(), values[[1, 3]][:, mask].double().mean()
    assert result.value_change == pytest.approx(float(100 * (v_b - v_a) / v_a), rel=1e-5)


def test_gate_group_change_errors():
    with pytest.raises(ValueError, match=r"must be a \(U, I\) matrix"):
        gate_group_change(LOGITS[0], [0], [1])
    with pytest.raises(ValueError, match=r"users_b holds user id 3, outside \[0, 3\)"):
        gate_group_change(LOGITS, [0], [1, 3])
    with pytest.raises(ValueError, match=r"item_mask must be a bool array of shape \(4,\)"):
        gate_group_change(LOGITS, [0], [1], item_mask=np.array([True, False]))
    with pytest.raises(ValueError, match="selects no item"):
        gate_group_change(LOGITS, [0], [1], item_mask=np.zeros(4, dtype=bool))
    with pytest.raises(ValueError, match="strictly inside"):
        gate_group_change(LOGITS, [0], [1], kind="values")
    with pytest.raises(ValueError, match="users_a is empty"):
        gate_group_change(LOGITS, [], [1])


def test_input_validation_messages():
    with pytest.raises(ValueError, match="train holds item id 5 but num_items=4"):
        popular_items(toy_train(), 4)
    with pytest.raises(ValueError, match="rounds to 0 popular items"):
        popular_items(toy_train(), NUM_ITEMS, top_fraction=0.01)
    with pytest.raises(ValueError, match="1-d bool array"):
        popular_share(toy_train(), np.ones(NUM_ITEMS))
    with pytest.raises(ValueError, match="covers only 3 items"):
        popular_share(toy_train(), np.ones(3, dtype=bool))
