"""Leak audit (fedlib.metrics.leak_audit, traced runs: fedlib.audits.leak_trace): negative coverage, test-item ranks, duplicated pairs."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import data_root, missing_data
from fedlib.data.protocols import fedrkg
from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import Pairs
from fedlib.engine import FederatedConfig, make_round_plan, personal_table_method, round_generator, union_pairs
from fedlib.audits.leak_trace import trace_federated_run
from fedlib.metrics.leak_audit import (
    LeakTrace, NegativeCoverage, duplicate_pair_leak, exclusion_mask, lastfm_duplicate_leak, negatives_from_plan,
    reference_code_leave_last_out, test_item_rank,
)
from fedlib.models import PersonalItemTableModel

torch.set_num_threads(1)  # other experiments share this machine


# -- toys -------------------------------------------------------------------------------------
def _toy_coverage(storage):
    """2 users, 5 items. u0: train {0, 1}, test 4; u1: train {2}, test 0."""
    train = Pairs.from_arrays([0, 0, 1], [0, 1, 2], 2)
    test = Pairs.from_arrays([0, 1], [4, 0], 2)
    return NegativeCoverage(train, 5, test=test, storage=storage)


# Negatives of three rounds, (users, items). Round 1 repeats item 2 for u0 and contains u0's own
# training item 0, which is not a candidate and must be ignored.
TOY_ROUNDS = [
    ([0, 0, 0, 0, 1], [2, 2, 3, 0, 1]),
    ([0, 1, 1], [3, 3, 4]),
    ([0, 1, 1], [4, 0, 1]),
]
# u0 has candidates {2, 3, 4}, u1 {0, 1, 3, 4}. Never-sampled share after each round:
#   round 1: u0 {4} -> 1/3, u1 {0, 3, 4} -> 3/4;  round 2: 1/3, {0} -> 1/4;  round 3: 0, 0.
TOY_EXPECTED = [
    {"u": (1 / 3, 3 / 4), "mean": 13 / 24, "test": (False, False), "competitors": (0, 2)},
    {"u": (1 / 3, 1 / 4), "mean": 7 / 24, "test": (False, False), "competitors": (0, 0)},
    {"u": (0.0, 0.0), "mean": 0.0, "test": (True, True), "competitors": (0, 0)},
]


def _random_split(num_users=10, num_items=40, per_user=12, seed=0):
    """A tiny FedRKG (leave-last-out) split: distinct items per user, distinct timestamps."""
    rng = np.random.default_rng(seed)
    users = np.repeat(np.arange(num_users), per_user)
    items = np.concatenate([rng.choice(num_items, per_user, replace=False) for _ in range(num_users)])
    frame = pd.DataFrame({"user": users, "item": items, "rating": 1.0,
                          "timestamp": rng.permutation(users.size)})
    return fedrkg.split_from_frame(frame, min_user_interactions=5)


def _sampler(split, exclude):
    if exclude == "all_rated":
        return NegativeSampler(split.train, split.num_items, exclude="all_rated",
                               all_rated=union_pairs(split.train, split.valid, split.test))
    return NegativeSampler(split.train, split.num_items)


# -- 1. coverage ------------------------------------------------------------------------------
@pytest.mark.parametrize("storage", ["dense", "bits"])
def test_coverage_toy_exact_fractions(storage):
    coverage = _toy_coverage(storage)
    assert coverage.num_candidates.tolist() == [3, 4]
    assert coverage.num_competitors.tolist() == [2, 3]  # candidates minus the test item
    for r, ((users, items), expected) in enumerate(zip(TOY_ROUNDS, TOY_EXPECTED), start=1):
        coverage.update(torch.tensor(users), torch.tensor(items))
        np.testing.assert_allclose(coverage.never_sampled_fraction(), expected["u"], rtol=0, atol=1e-15)
        assert tuple(coverage.test_item_sampled().tolist()) == expected["test"]
        assert tuple(coverage.never_sampled_competitors().tolist()) == expected["competitors"]
        summary = coverage.summary()
        assert summary["rounds"] == r
        assert summary["never_sampled_fraction"] == pytest.approx(expected["mean"], abs=1e-15)
        assert summary["test_item_sampled_share"] == np.mean(expected["test"])
    # the train item 0 of u0 is remembered as drawn but never counted as a candidate
    assert coverage.sampled_mask().tolist() == [[True, False, True, True, True], [True, True, False, True, True]]


def test_coverage_from_plan_matches_the_plans_negatives():
    split = _random_split()
    sampler = _sampler(split, "train")
    coverage = NegativeCoverage(split.train, split.num_items, test=split.test)
    plan = make_round_plan(split.train, sampler, round_generator(0, 0), num_negatives=4, batch_size=16)
    users, items = negatives_from_plan(plan)
    assert users.size == 4 * len(split.train)  # 4 negatives per positive, one local epoch
    expected = np.zeros((split.num_users, split.num_items), dtype=bool)
    expected[users, items] = True
    coverage.update_from_plan(plan)
    assert np.array_equal(coverage.sampled_mask(), expected)
    bits = NegativeCoverage(split.train, split.num_items, test=split.test, storage="bits")
    bits.update_from_plan(plan)
    assert np.array_equal(bits.sampled_mask(), expected)
    assert bits.summary() == coverage.summary()


# -- 2. ranks ---------------------------------------------------------------------------------
def test_test_item_rank_hand_made_ties_and_masks():
    scores = torch.tensor([
        [0.9, 0.5, 0.5, 0.1, 0.7],  # test 1, mask {0}: 0.7 above, item 2 tied -> 1 + 1 + 1 = 3
        [1.0, 0.2, 0.3, 0.3, 0.0],  # test 2, mask {0, 1}: item 3 tied only -> 2 (optimistic would say 1)
        [0.1, 0.1, 0.1, 0.1, 0.1],  # test 0, nothing masked, all tied -> 5
        [0.0, 0.8, 0.9, 0.2, 0.1],  # test 1, mask {2}: strictly best of the rest -> 1
    ])
    test = torch.tensor([1, 2, 0, 1])
    mask = torch.zeros(4, 5, dtype=torch.bool)
    mask[0, 0] = mask[1, 0] = mask[1, 1] = mask[3, 2] = True
    assert test_item_rank(scores, test, mask).tolist() == [3, 2, 5, 1]
    assert test_item_rank(scores.double(), test.numpy(), mask).dtype == torch.int64


def test_test_item_rank_masked_test_item():
    scores = torch.tensor([[0.5, 0.4, 0.3, 0.2], [0.1, 0.2, 0.3, 0.4]])
    test = torch.tensor([0, 3])
    mask = torch.tensor([[True, False, False, True], [False, False, False, False]])  # u0's test item is masked
    with pytest.raises(ValueError, match="masked.*on_masked_test='worst'"):
        test_item_rank(scores, test, mask)
    # 'worst': behind the 2 unmasked candidates of u0 -> 3; u1 unaffected -> 1
    assert test_item_rank(scores, test, mask, on_masked_test="worst").tolist() == [3, 1]


def test_exclusion_mask_is_the_union_of_pairs():
    train = Pairs.from_arrays([0, 0, 1], [1, 3, 0], 3)
    valid = Pairs.from_arrays([0, 2], [2, 4], 3)
    mask = exclusion_mask([2, 0], 5, train, valid)
    assert mask.tolist() == [[False, False, False, False, True], [False, True, True, True, False]]


# -- 3./4. duplicated pairs ---------------------------------------------------------------------
def test_duplicate_pair_leak_toy():
    train = Pairs.from_arrays([0, 0, 1, 1, 2], [1, 2, 3, 3, 0], 4)  # (1, 3) twice
    test = (np.array([0, 1, 2, 3]), np.array([2, 4, 0, 1]))  # (0, 2) and (2, 0) are also in train
    leak = duplicate_pair_leak(train, test)
    assert (leak.test_pairs, leak.also_in_train, leak.fraction) == (4, 2, 0.5)
    assert leak.duplicated.tolist() == [True, False, True, False]
    # the reverse pair (2 -> 0 vs 0 -> 2) must not count: only exact (user, item) pairs
    assert duplicate_pair_leak(train, ([2], [1])).also_in_train == 0


def test_reference_code_split_rule():
    # user 7: 4 rows, timestamps 5, 9, 9, 1 -> the first of the two 9s (row 1) is test, row 2 valid
    frame = pd.DataFrame({"user": [7, 7, 7, 7, 8], "item": [10, 11, 12, 13, 10], "timestamp": [5, 9, 9, 1, 3]})
    parts = reference_code_leave_last_out(frame, min_user_interactions=3)
    assert parts["test"].values.tolist() == [[7, 11]]
    assert parts["valid"].values.tolist() == [[7, 12]]
    assert sorted(parts["train"]["item"].tolist()) == [10, 13]  # user 8 (1 row) is filtered out


# -- end to end: leaky vs correct sampler -----------------------------------------------------------
def test_leaky_sampler_never_samples_the_test_item_correct_one_does():
    split = _random_split()
    results = {}
    for exclude in ("all_rated", "train"):
        sampler = _sampler(split, exclude)
        coverage = NegativeCoverage(split.train, split.num_items, test=split.test, valid=split.valid)
        for t in range(30):
            coverage.update_from_plan(make_round_plan(split.train, sampler, round_generator(0, t), round_index=t))
        results[exclude] = coverage
    leaky, clean = results["all_rated"], results["train"]
    users = leaky.users
    assert users.size == split.num_users
    assert not leaky.test_item_sampled().any()
    assert clean.test_item_sampled()[users].all()
    # under the leak exactly the valid and test items stay untouched: 2 of each user's candidates
    np.testing.assert_allclose(leaky.never_sampled_fraction()[users], 2 / leaky.num_candidates[users])
    assert (leaky.never_sampled_competitors()[users] == 0).all()
    assert clean.summary()["never_sampled_fraction"] == 0.0


def test_engine_hook_replays_the_plans_and_shows_the_leak():
    """run_federated's on_round_end hook: the replayed negatives are the ones the engine trained on,
    and with personal tables + the leaky sampler every test item ends at rank 1."""

    class RecordingSampler(NegativeSampler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.drawn = []

        def sample(self, users, num_negatives, rng):
            out = super().sample(users, num_negatives, rng)
            self.drawn.append((np.repeat(users, num_negatives), out.ravel()))
            return out

    split = _random_split()
    frames = {}
    for exclude in ("all_rated", "train"):
        sampler = RecordingSampler(split.train, split.num_items, exclude=exclude,
                                   all_rated=union_pairs(split.train, split.valid, split.test)
                                   if exclude == "all_rated" else None)
        method = personal_table_method(PersonalItemTableModel(split.num_users, split.num_items, dim=4))
        config = FederatedConfig(rounds=12, seed=3, batch_size=32)
        _, frame = trace_federated_run(method, split, config, sampler=sampler, every=6, device="cpu")
        frames[exclude] = frame
        assert len(frame) == 12 and frame["round"].tolist() == list(range(1, 13))
        assert frame["test_rank_mean"].notna().tolist() == [r % 6 == 0 for r in range(1, 13)]
        # what the engine drew (the recording sampler: the engine's own calls, then the replays)
        engine_draws = sampler.drawn[0::2]
        replayed = sampler.drawn[1::2]
        assert len(engine_draws) == 12
        for (u1, i1), (u2, i2) in zip(engine_draws, replayed):
            assert np.array_equal(u1, u2) and np.array_equal(i1, i2)
        drawn = np.zeros((split.num_users, split.num_items), dtype=bool)
        for users, items in engine_draws:
            drawn[users, items] = True
        test_drawn = drawn[split.test.users, split.test.items]
        assert frame["test_item_sampled_share"].iloc[-1] == pytest.approx(test_drawn.mean())
    leaky, clean = frames["all_rated"].iloc[-1], frames["train"].iloc[-1]
    assert leaky["test_rank1_share"] == 1.0 and leaky["test_item_sampled_share"] == 0.0
    assert clean["test_rank1_share"] < 0.5 and clean["test_item_sampled_share"] == 1.0


# -- LastFM-2K raw files ----------------------------------------------------------------------
LASTFM_DIR = data_root() / "hetrec2011-lastfm-2k"


def test_lastfm_duplicate_pairs():
    if not (LASTFM_DIR / "user_taggedartists.dat").is_file():
        missing_data(f"LastFM-2K raw file {LASTFM_DIR / 'user_taggedartists.dat'} not found "
                     "(set FEDLIB_DATA to the folder holding hetrec2011-lastfm-2k/)")
    table = lastfm_duplicate_leak(data_root()).set_index("construction")
    project = table.loc["fedrkg protocol (tag_assignments)"]
    reference = table.loc["reference code (rebuilt)"]
    dedup = table.loc["de-duplicated pairs (tagged)"]
    # One row per (user, artist) pair: no test pair can be in train.
    assert dedup["also_in_train"] == 0 and dedup["fraction"] == 0.0 and dedup["test_pairs"] > 0
    # The project's FedRKG protocol keeps every tag assignment (the paper's Table C.1 counts), so it
    # does NOT de-duplicate; it builds exactly the reference code's split.
    cols = ["users", "test_pairs", "also_in_train", "also_in_train_or_valid"]
    assert project[cols].tolist() == reference[cols].tolist() == [1269, 1269, 676, 824]
    # ... and its own provenance note reports the same count
    split = fedrkg.build("hetrec2011-lastfm-2k", root=data_root())
    assert any(n.startswith("676 of 1269 test (user, item) pairs also occur in train") for n in split.notes)
    assert duplicate_pair_leak(split.train, split.test).also_in_train == 676


# -- bad input ----------------------------------------------------------------------------------
def test_bad_input_raises_value_error_with_a_fix():
    train = Pairs.from_arrays([0, 0, 1], [0, 1, 2], 2)
    with pytest.raises(ValueError, match="at most one pair per user.*latest"):
        NegativeCoverage(train, 5, test=Pairs.from_arrays([0, 0], [3, 4], 2))
    with pytest.raises(ValueError, match=r"train item ids must lie in \[0, 2\).*num_items"):
        NegativeCoverage(train, 2)
    with pytest.raises(ValueError, match="must be a fedlib Pairs.*Pairs.from_arrays"):
        NegativeCoverage((np.array([0]), np.array([1])), 5)
    coverage = _toy_coverage("auto")
    with pytest.raises(ValueError, match="equal length"):
        coverage.update([0, 1], [2])
    with pytest.raises(ValueError, match=r"item_ids must lie in \[0, 5\).*num_items"):
        coverage.update([0], [7])
    with pytest.raises(ValueError, match="integer ids.*astype"):
        coverage.update(np.array([0.0]), np.array([1.0]))
    with pytest.raises(ValueError, match="RoundPlan"):
        coverage.update_from_plan(object())
    scores = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="shape of scores"):
        test_item_rank(scores, [0, 1], torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool torch tensor.*exclusion_mask"):
        test_item_rank(scores, [0, 1], torch.zeros(2, 3))
    with pytest.raises(ValueError, match="one entry per row"):
        test_item_rank(scores, [0], torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="NaN"):
        test_item_rank(torch.full((2, 3), float("nan")), [0, 1], torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="(users, items)|Pairs"):
        duplicate_pair_leak([1, 2, 3], ([0], [1]))
    with pytest.raises(ValueError, match="equal length"):
        duplicate_pair_leak(([0, 1], [1]), ([0], [1]))
    with pytest.raises(ValueError, match="missing.*timestamp"):
        reference_code_leave_last_out(pd.DataFrame({"user": [1], "item": [2]}))
    with pytest.raises(ValueError, match="needs the test pairs"):
        LeakTrace(train, None, 5)
