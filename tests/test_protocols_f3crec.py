"""F3CRec protocol: Table 1 reproduction, block/split invariants, options, errors, speed."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedlib.data.protocols import f3crec
from fedlib.data.protocols._common import UnsupportedDatasetError

REPO = Path(__file__).resolve().parent.parent
PAPER_METRICS = {
    "# of accumulated users": "users",
    "# of accumulated items": "items",
    "# of interactions": "interactions",
    "sparsity": "sparsity",
}


def paper_table1(label: str) -> pd.DataFrame:
    """The paper's Table 1 for one dataset, wide: block, users, items, interactions, sparsity."""
    table = pd.read_csv(REPO / "paper_tables" / "f3crec" / "table1_data_blocks.csv")
    table = table[table["dataset"] == label]
    wide = table.pivot(index="block", columns="metric", values="value").rename(columns=PAPER_METRICS)
    return wide.reset_index()[["block", "users", "items", "interactions", "sparsity"]]


@pytest.fixture(scope="module")
def ml100k(shared_data):
    return f3crec.build("ml-100k", root=shared_data)


@pytest.fixture(scope="module")
def ml100k_chrono(shared_data):
    return f3crec.build("ml-100k", root=shared_data, split="chronological")


@pytest.mark.parametrize("dataset", ["ml-100k", "ml-latest-small"])
def test_table1_reproduced_exactly(shared_data, dataset):
    ours = f3crec.statistics(f3crec.build(dataset, root=shared_data))
    paper = paper_table1(f3crec.DATASETS[dataset]["label"])
    assert len(paper) == 4
    for column in ("users", "items", "interactions"):
        assert ours[column].tolist() == paper[column].astype(int).tolist(), column
    # The printed sparsity is 1 - block interactions / (accumulated users x items), 2 decimals.
    assert ours["sparsity"].tolist() == paper["sparsity"].tolist()


def test_lastfm_table1_documented_deltas(shared_data):
    """Lastfm-2K: only day-level tag dates exist offline, so Table 1 is close, not exact.

    Variant 'tag_days' (distinct (user, artist, tagging day) events, 5-core) is the closest
    reading found; these deltas (ours - paper) are the documented gap. Counting every tag
    assignment, one row per pair, or joining the listening data all land further away.
    """
    documented = {
        "users": [-22, -33, -33, -13],
        "items": [-59, -64, -72, -77],
        "interactions": [-1320, -293, -293, -294],
        "sparsity": [-0.01, 0.0, 0.0, 0.01],
    }
    ours = f3crec.statistics(f3crec.build("hetrec2011-lastfm-2k", root=shared_data))
    paper = paper_table1("Lastfm-2K")
    for column, deltas in documented.items():
        measured = np.round(ours[column].to_numpy(float) - paper[column].to_numpy(float), 2)
        assert measured.tolist() == deltas, column


def test_hetrec_movielens_needs_download(shared_data, monkeypatch):
    from fedlib.data.errors import MissingDataError

    monkeypatch.setenv("FEDLIB_OFFLINE", "1")
    if (shared_data / "hetrec2011-movielens-2k" / "user_ratedmovies-timestamps.dat").exists():
        pytest.skip("ratings present: Table 1 comparison possible")
    with pytest.raises(MissingDataError, match="user_ratedmovies"):
        f3crec.build("hetrec2011-movielens-2k", root=shared_data)


def _all_positions(block):
    return np.concatenate([block.extra[f"{r}_positions"] for r in ("train", "valid", "test")])


def test_blocks_partition_the_stream_in_time(ml100k):
    cuts = ml100k.extra["cuts"]
    previous_last_time = -np.inf
    for t, block in enumerate(ml100k):
        positions = np.sort(_all_positions(block))
        # Every interaction of the block exactly once, no leakage between train/valid/test.
        assert positions.tolist() == list(range(cuts[t], cuts[t + 1]))
        times = np.concatenate([block.extra[f"{r}_timestamps"] for r in ("train", "valid", "test")])
        assert times.min() >= previous_last_time
        previous_last_time = times.max()


def test_accumulated_id_spaces_grow_by_appending(ml100k):
    previous_users = previous_items = 0
    for block in ml100k:
        assert block.num_users >= previous_users and block.num_items >= previous_items
        for part in (block.train, block.valid, block.test):
            assert part.users.max() < block.num_users and part.items.max() < block.num_items
        items = np.concatenate([block.train.items, block.valid.items, block.test.items])
        new_items = np.setdiff1d(np.unique(items), np.arange(previous_items))
        # Ids of the items first seen in this block are exactly the next rows of the table.
        assert new_items.tolist() == list(range(previous_items, block.num_items))
        previous_users, previous_items = block.num_users, block.num_items


def test_active_users_and_holdout_sizes(ml100k):
    for t, block in enumerate(ml100k):
        users = np.concatenate([block.train.users, block.valid.users, block.test.users])
        counts = np.bincount(users, minlength=block.num_users)
        assert ml100k.active_users[t].tolist() == np.flatnonzero(counts).tolist()
        n_test = block.test.counts()
        n_valid = block.valid.counts()
        expected = np.where(counts >= 3, -(-counts // 10), 0)  # ceil(n / 10), or nothing below 3
        assert np.array_equal(n_test, expected) and np.array_equal(n_valid, expected)
        assert np.all(block.train.counts()[counts > 0] >= 1)


def test_chronological_option_holds_out_latest(ml100k_chrono):
    for t, block in enumerate(ml100k_chrono):
        if t == 0:
            continue  # the official code splits D0 at random
        for u in np.unique(block.test.users)[:200]:
            train_pos = block.extra["train_positions"][block.train.indptr[u]:block.train.indptr[u + 1]]
            valid_pos = block.extra["valid_positions"][block.valid.indptr[u]:block.valid.indptr[u + 1]]
            test_pos = block.extra["test_positions"][block.test.indptr[u]:block.test.indptr[u + 1]]
            assert train_pos.max() < valid_pos.min() and valid_pos.max() < test_pos.min()


def test_random_split_is_seeded(shared_data, ml100k):
    again = f3crec.build("ml-100k", root=shared_data)
    other = f3crec.build("ml-100k", root=shared_data, seed=1)
    for a, b, c in zip(ml100k, again, other):
        assert np.array_equal(a.test.items, b.test.items) and np.array_equal(a.train.items, b.train.items)
        assert not np.array_equal(a.test.items, c.test.items)
        # Only the held-out choice depends on the seed, never the block content.
        assert np.array_equal(np.sort(_all_positions(a)), np.sort(_all_positions(c)))


def test_random_and_chronological_differ_only_after_d0(ml100k, ml100k_chrono):
    assert np.array_equal(ml100k[0].test.items, ml100k_chrono[0].test.items)
    assert not np.array_equal(ml100k[1].test.items, ml100k_chrono[1].test.items)


def test_wrong_dataset_and_empty_data_errors(shared_data):
    with pytest.raises(UnsupportedDatasetError, match="f3crec.*c2dsr-food-kitchen"):
        f3crec.build("c2dsr-food-kitchen", root=shared_data)
    tiny = pd.DataFrame({"user": [1, 1, 2], "item": [1, 2, 1], "rating": 1.0, "timestamp": [1, 2, 3]})
    with pytest.raises(ValueError, match="no interaction survives"):
        f3crec.stream_from_frame(tiny, k_core=5)
    no_time = tiny.assign(timestamp=-1)
    with pytest.raises(ValueError, match="no timestamp"):
        f3crec.stream_from_frame(no_time, k_core=1)
    with pytest.raises(ValueError, match="split must be"):
        f3crec.stream_from_frame(tiny, split="shuffled")


def test_ml100k_protocol_builds_from_the_data_root(shared_data):
    # its time is a budget for benchmarks, not a test assertion (shared, noisy machines)
    stream = f3crec.build("ml-100k", root=shared_data)
    assert stream is not None and len(stream) >= 2
