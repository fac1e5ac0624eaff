"""FedKDRec protocol: Table 5 sizes, leave-one-out, both evaluation modes, missing data."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedlib.data.errors import MissingDataError, PartialDataError
from fedlib.data.protocols import fedkdrec

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ml100k(shared_data):
    return fedkdrec.build("ml-100k", root=shared_data)


def test_table5_ml100k(ml100k):
    table = pd.read_csv(REPO / "paper_tables" / "fedkdrec" / "table5_dataset_stats.csv")
    paper = dict(zip(table.loc[table["dataset"] == "ML100K", "metric"], table.loc[table["dataset"] == "ML100K", "value"]))
    ours = fedkdrec.statistics(ml100k).iloc[0]
    assert ours["users"] == paper["# Users"] and ours["items"] == paper["# Items"]
    assert ours["interactions"] == paper["# Interactions"]
    assert ours["sparsity"] == paper["Sparsity"]


def test_leave_one_out_by_time(ml100k):
    assert np.all(ml100k.test.counts() == 1) and np.all(ml100k.valid.counts() == 1)
    latest_train = np.full(ml100k.num_users, np.iinfo(np.int64).min)
    np.maximum.at(latest_train, ml100k.train.users, ml100k.extra["train_timestamps"])
    assert np.all(ml100k.extra["valid_timestamps"] >= latest_train)
    assert np.all(ml100k.extra["test_timestamps"] >= ml100k.extra["valid_timestamps"])


@pytest.mark.parametrize("role", ["valid", "test"])
def test_sampled_candidates(ml100k, role):
    cands = ml100k.extra[f"{role}_candidates"]
    held = getattr(ml100k, role)
    assert cands.shape == (ml100k.num_users, 100) and cands.dtype == np.int64
    assert np.array_equal(cands[:, 0], held.items)
    stride = ml100k.num_items
    known = np.concatenate([p.users * stride + p.items for p in (ml100k.train, ml100k.valid, ml100k.test)])
    negatives = held.users[:, None] * stride + cands[:, 1:]
    assert not np.isin(negatives, known).any()
    assert all(np.unique(row).size == 100 for row in cands)


def test_candidates_fixed_by_seed(shared_data, ml100k):
    again = fedkdrec.build("ml-100k", root=shared_data)
    other = fedkdrec.build("ml-100k", root=shared_data, seed=3)
    assert np.array_equal(again.extra["test_candidates"], ml100k.extra["test_candidates"])
    assert not np.array_equal(other.extra["test_candidates"], ml100k.extra["test_candidates"])
    assert np.array_equal(other.test.items, ml100k.test.items)  # the split itself is not random


def test_missing_datasets(shared_data, monkeypatch):
    monkeypatch.setenv("FEDLIB_OFFLINE", "1")
    if not (shared_data / "ml-1m" / "ratings.dat").exists():
        with pytest.raises(PartialDataError):
            fedkdrec.build("ml-1m", root=shared_data)
    with pytest.raises(MissingDataError):
        fedkdrec.build("amazon-industrial", root=shared_data)
