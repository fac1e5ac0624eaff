"""FedCSR protocol: platforms, the substitute split, candidates, Table 1 where comparable."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedlib.data.protocols import fedcsr

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def food_kitchen(shared_data):
    return fedcsr.build("c2dsr-food-kitchen", root=shared_data)


def paper_table1(label):
    table = pd.read_csv(REPO / "paper_tables" / "fedcsr" / "table1_dataset_stats.csv", keep_default_na=False)
    return table[table["dataset"] == label]


def test_platforms_disjoint_users_and_stated_fractions(food_kitchen):
    split = food_kitchen
    rows = np.concatenate(split.platforms)
    assert np.array_equal(np.sort(rows), np.arange(len(split.train)))  # a partition of train
    user_sets = [set(split.train.users[p].tolist()) for p in split.platforms]
    for i in range(len(user_sets)):
        for j in range(i + 1, len(user_sets)):
            assert user_sets[i].isdisjoint(user_sets[j])
    n = len(split.train)  # one sequence per user in the substitute
    bounds = np.floor(np.cumsum(fedcsr.PLATFORM_FRACTIONS) * n).astype(int)
    bounds[-1] = n
    assert [len(p) for p in split.platforms] == np.diff(np.concatenate([[0], bounds])).tolist()
    lengths = split.train.lengths()
    for p, q in zip(split.platforms[:-1], split.platforms[1:]):
        assert lengths[p].max() <= lengths[q].min()  # platforms differ in sequence length


def test_substitute_split_pools_valid_and_test_users(shared_data, food_kitchen):
    from fedlib.data.loaders import load_sequences

    loaded = load_sequences("c2dsr-food-kitchen", root=shared_data)
    if loaded.train is not None:
        pytest.skip("original training file present: the substitute is not used")
    split = food_kitchen
    n = len(loaded.valid) + len(loaded.test)
    assert (len(split.train), len(split.valid)) == (int(0.8 * n), int(0.1 * n))
    assert len(split.train) + len(split.valid) + len(split.test) == n
    parts = [set(s.users.tolist()) for s in (split.train, split.valid, split.test)]
    assert parts[0].isdisjoint(parts[1]) and parts[0].isdisjoint(parts[2]) and parts[1].isdisjoint(parts[2])
    raw = split.extra["raw_users"]
    pooled = set(loaded.valid["user"]) | set(loaded.test["user"])
    assert set(raw.tolist()) == pooled
    # Training users contribute their whole sequence, target included.
    by_user = dict(zip(pd.concat([loaded.valid, loaded.test])["user"], pd.concat([loaded.valid, loaded.test])["items"]))
    for r in range(0, len(split.train), 997):
        assert split.train.sequence(r).tolist() == list(by_user[raw[split.train.users[r]]])
    assert any("SUBSTITUTE" in note for note in split.notes)


def test_table1_item_and_user_counts(food_kitchen):
    paper = paper_table1("Food-Kitchen")
    ours = fedcsr.statistics(food_kitchen).iloc[0]
    value = lambda metric, domain="": float(paper[(paper["metric"] == metric) & (paper["domain"] == domain)]["value"].iloc[0])
    assert ours["users"] == value("#Users")
    assert ours["items_Food"] == value("#Items", "Food") and ours["items_Kitchen"] == value("#Items", "Kitchen")
    # Train/valid/test differ by construction while the training file is missing (substitute):
    # the paper's #Valid + #Test equals all sequences available offline.
    assert ours["train"] + ours["valid"] + ours["test"] == value("#Valid") + value("#Test")


@pytest.mark.parametrize("role", ["valid", "test"])
def test_candidates_same_domain_no_history(food_kitchen, role):
    split = food_kitchen
    seqs = getattr(split, role)
    cands = getattr(split, f"{role}_candidates")
    assert cands.shape == (len(seqs), 1000)
    assert np.array_equal(cands[:, 0], seqs.last_items())
    domain = split.domain_of(cands)
    assert np.all(domain == domain[:, :1])  # negatives from the ground truth's domain
    for r in range(0, len(seqs), 97):
        row = cands[r]
        assert np.unique(row).size == row.size
        assert not set(row[1:].tolist()) & set(seqs.sequence(r).tolist())


def test_reference_exclusion_and_seed(shared_data, food_kitchen):
    code_like = fedcsr.build("c2dsr-food-kitchen", root=shared_data, exclude_history=False, num_negatives=50)
    assert code_like.test_candidates.shape[1] == 51
    assert np.array_equal(code_like.test.items, food_kitchen.test.items)  # same seed -> same users
    other = fedcsr.build("c2dsr-food-kitchen", root=shared_data, seed=1, num_negatives=50)
    raw_train = lambda split: split.extra["raw_users"][split.train.users]
    assert not np.array_equal(raw_train(other), raw_train(code_like))


def test_original_split_used_when_training_file_present():
    def frame(users, seqs):
        return pd.DataFrame({"user": users, "items": seqs, "timestamps": [list(range(len(s))) for s in seqs]})
    train = frame([1, 1, 2, 3], [[0, 5, 1], [1, 6], [2, 7, 3, 8], [4, 9, 0]])
    valid = frame([1], [[0, 5, 6]])
    test = frame([2], [[2, 7, 9]])
    split = fedcsr.split_from_frames(train, valid, test, num_items_a=5, num_items_b=5, num_negatives=2,
                                     platform_fractions=(0.5, 0.5))
    assert len(split.train) == 4 and split.extra["substitute_train"] is False
    # User 1 has two training sequences: they stay on one platform.
    platform_of_row = np.empty(4, int)
    for p, rows in enumerate(split.platforms):
        platform_of_row[rows] = p
    assert platform_of_row[0] == platform_of_row[1]
    # User 2 knows Kitchen items 7, 8, 9: the only allowed Kitchen negatives are 5 and 6.
    assert split.test_candidates[0, 0] == 9 and sorted(split.test_candidates[0, 1:].tolist()) == [5, 6]


def test_wrong_dataset(shared_data):
    from fedlib.data.protocols._common import UnsupportedDatasetError

    with pytest.raises(UnsupportedDatasetError, match="item lists"):
        fedcsr.build("c2dsr-entertainment-education", root=shared_data)
    with pytest.raises(UnsupportedDatasetError):
        fedcsr.build("ml-100k", root=shared_data)


def test_sequences_padding_and_subset(food_kitchen):
    seqs = food_kitchen.test
    padded = seqs.padded(maxlen=8, pad_id=food_kitchen.pad_id)
    assert padded.shape == (len(seqs), 8)
    for r in (0, 1, len(seqs) - 1):
        tail = seqs.sequence(r)[-8:]
        assert padded[r, 8 - tail.size:].tolist() == tail.tolist()
        assert np.all(padded[r, :8 - tail.size] == food_kitchen.pad_id)
    picked = seqs.subset([5, 2])
    assert picked.sequence(0).tolist() == seqs.sequence(5).tolist() and picked.users.tolist() == seqs.users[[5, 2]].tolist()


def test_platform_statistics_add_up_and_show_the_length_ordering(food_kitchen):
    stats = fedcsr.platform_statistics(food_kitchen)
    assert list(stats["platform"]) == list(range(1, 11))
    assert stats["train_sequences"].sum() == len(food_kitchen.train)
    assert stats["valid"].sum() == len(food_kitchen.valid) and stats["test"].sum() == len(food_kitchen.test)
    assert stats["share_of_users"].sum() == pytest.approx(100.0, abs=0.1)
    # platforms are cut from users sorted by sequence length: mean length never decreases
    assert (np.diff(stats["mean_length"].to_numpy()) >= 0).all()
    assert (stats["share_Food"].between(0, 100)).all() and (stats["items_seen"] > 0).all()
    first = food_kitchen.train.subset(food_kitchen.platforms[0])
    assert stats.loc[0, "popularity_of_top_item"] == pytest.approx(
        100 * np.bincount(first.items).max() / first.items.size, abs=0.01)
