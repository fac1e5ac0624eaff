"""Loaders against the reference data collection, plus synthetic files for formats it lacks.

Counts are the figures verified in the collection's MANIFEST.md. Tests that need the
collection read ``FEDLIB_DATA`` (default ``<repo>/../shared/data``) and are skipped, with
the reason, when it is absent.
"""
from __future__ import annotations

import functools
import gzip
import json
import lzma
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import data_root, missing_data

from fedlib.data import download
from fedlib.data.loaders import (
    LoadedInteractions,
    c2dsr_item_counts,
    load_interactions,
    load_sequences,
    madrid_midnight_seconds,
    parse_c2dsr_file,
)
from fedlib.data.registry import DISENCDR_PAIRS

CONTRACT_COLUMNS = ["user", "item", "rating", "timestamp"]


pytestmark = pytest.mark.usefixtures("isolated_data_env")  # offline, private cache (tests/conftest.py)


@pytest.fixture(scope="session")
def root() -> Path:
    path = data_root()
    if not (path / "ml-100k").is_dir():
        missing_data(f"reference data collection not found at {path} (set FEDLIB_DATA to it)")
    return path


def _check_contract(loaded: LoadedInteractions, extra=()):
    frame = loaded.frame
    assert list(frame.columns) == CONTRACT_COLUMNS + list(extra)
    assert frame["rating"].dtype == np.float64
    assert frame["timestamp"].dtype == np.int64
    assert isinstance(frame.index, pd.RangeIndex) and frame.index.start == 0
    for column in extra:
        assert frame[column].map(type).eq(str).all()


def _counts(loaded: LoadedInteractions):
    return len(loaded.frame), loaded.frame["user"].nunique(), loaded.frame["item"].nunique()


# ----------------------------------------------------------------------------------------
# MovieLens
# ----------------------------------------------------------------------------------------

def test_ml100k_counts_and_order(root):
    loaded = load_interactions("ml-100k", root=root)
    _check_contract(loaded)
    assert _counts(loaded) == (100_000, 943, 1_682)
    assert loaded.frame["user"].dtype == np.int64 and loaded.frame["item"].dtype == np.int64
    assert loaded.status == "complete" and loaded.notes == () and loaded.variant is None
    # File order is kept: the first and last lines of u.data.
    assert loaded.frame.iloc[0].tolist() == [196, 242, 3.0, 881250949]
    assert loaded.frame.iloc[-1].tolist() == [12, 203, 3.0, 879959583]
    assert loaded.frame["timestamp"].min() == 874724710 and loaded.frame["timestamp"].max() == 893286638


@pytest.mark.parametrize("split, n_train, n_test", [("u1", 80_000, 20_000), ("u5", 80_000, 20_000),
                                                    ("ua", 90_570, 9_430)])
def test_ml100k_split_variants_read_xz_transparently(root, split, n_train, n_test):
    assert not (root / "ml-100k" / f"{split}.base").exists()  # only the .xz copy is stored
    loaded = load_interactions("ml-100k", variant=split, root=root)
    _check_contract(loaded, extra=["split"])
    counts = loaded.frame["split"].value_counts()
    assert counts["train"] == n_train and counts["test"] == n_test
    # train rows come first, then test rows
    assert (loaded.frame["split"].iloc[:n_train] == "train").all()
    assert loaded.variant == split


def test_ml_latest_small_counts(root):
    loaded = load_interactions("ml-latest-small", root=root)
    _check_contract(loaded)
    assert _counts(loaded) == (100_836, 610, 9_724)
    assert loaded.frame.iloc[0].tolist() == [1, 1, 4.0, 964982703]
    assert set(np.unique(loaded.frame["rating"])) == set(np.arange(1, 11) / 2)


def test_ml1m_partial_loads_only_when_allowed_with_loud_note(root):
    loaded = load_interactions("ml-1m", root=root, allow_partial=True)
    _check_contract(loaded)
    assert _counts(loaded) == (487_650, 2_999, 3_615)
    assert loaded.status == "partial"
    assert any("PARTIAL" in n and "NEVER" in n for n in loaded.notes)


def test_ml1m_full_file_is_preferred_over_the_partial_copy(tmp_path):
    folder = tmp_path / "ml-1m" / "partial"
    folder.mkdir(parents=True)
    with gzip.open(folder / "ratings.dat.gz", "wt") as fh:
        fh.write("1::1193::5::978300760\n")
    (tmp_path / "ml-1m" / "ratings.dat").write_text("1::1193::5::978300760\n1::661::3::978302109\n6040::1::4::956703932\n")
    loaded = load_interactions("ml-1m", root=tmp_path)  # no allow_partial needed
    assert loaded.frame.values.tolist() == [[1, 1193, 5.0, 978300760], [1, 661, 3.0, 978302109],
                                            [6040, 1, 4.0, 956703932]]
    assert not any("PARTIAL" in n for n in loaded.notes)


def test_hetrec_movielens_parser_on_a_synthetic_file(tmp_path):
    folder = tmp_path / "hetrec2011-movielens-2k"
    folder.mkdir()
    (folder / "user_ratedmovies-timestamps.dat").write_text(
        "userID\tmovieID\trating\ttimestamp\r\n75\t3\t1\t1162160236000\r\n75\t32\t4.5\t1162160624000\r\n")
    loaded = load_interactions("hetrec2011-movielens-2k", root=tmp_path)
    _check_contract(loaded)
    assert loaded.frame.values.tolist() == [[75, 3, 1.0, 1162160236], [75, 32, 4.5, 1162160624]]


# ----------------------------------------------------------------------------------------
# Last.fm
# ----------------------------------------------------------------------------------------

def test_madrid_midnight_matches_readme_example():
    # readme.txt: 1/4/2009 <-> 1238536800000 ms (CEST, UTC+2); winter dates are UTC+1.
    assert madrid_midnight_seconds([2009], [4], [1]).tolist() == [1238536800]
    assert madrid_midnight_seconds([2009, 2009], [1, 3], [1, 29]).tolist() == [1230764400, 1238281200]


def test_lastfm_listens_default_with_derived_timestamps(root):
    loaded = load_interactions("hetrec2011-lastfm-2k", root=root)
    _check_contract(loaded)
    assert loaded.variant == "listens"
    assert _counts(loaded) == (92_834, 1_892, 17_632)
    assert loaded.status == "partial"
    frame = loaded.frame
    assert frame.iloc[0].tolist()[:3] == [2, 51, 13883.0]  # file order, weight as rating
    untimed = int((frame["timestamp"] == -1).sum())
    assert untimed == 72_169
    notes = " ".join(loaded.notes)
    assert "DERIVED TIMESTAMPS" in notes and "Europe/Madrid" in notes and "72,169" in notes
    # user 2 tagged artist 52 first on 1/4/2009 (readme example)
    row = frame[(frame["user"] == 2) & (frame["item"] == 52)]
    assert row["timestamp"].tolist() == [1238536800]


def test_lastfm_tagged_variant_has_a_time_for_every_row(root):
    loaded = load_interactions("hetrec2011-lastfm-2k", variant="tagged", root=root)
    _check_contract(loaded)
    assert _counts(loaded) == (71_064, 1_892, 12_523)
    assert (loaded.frame["timestamp"] != -1).all()
    # dates from 1956 are in the original data: negative seconds, flagged in the notes
    assert (loaded.frame["timestamp"] < 0).sum() > 0 and any("NEGATIVE" in n for n in loaded.notes)
    assert (loaded.frame["rating"] == 1.0).all()
    assert loaded.frame.iloc[0][["user", "item"]].tolist() == [2, 52]
    assert any("50,399" in n for n in loaded.notes)


def test_lastfm_tag_assignments_variant(root):
    loaded = load_interactions("hetrec2011-lastfm-2k", variant="tag_assignments", root=root)
    assert list(loaded.frame.columns) == CONTRACT_COLUMNS + ["tag"]
    assert loaded.frame["tag"].dtype == np.int64 and loaded.frame["timestamp"].dtype == np.int64
    assert _counts(loaded) == (186_479, 1_892, 12_523)
    assert loaded.frame.iloc[:2][["user", "item", "tag", "timestamp"]].values.tolist() == [
        [2, 52, 13, 1238536800], [2, 52, 15, 1238536800]]
    # per pair, the earliest assignment time is the 'tagged' variant's time
    tagged = load_interactions("hetrec2011-lastfm-2k", variant="tagged", root=root).frame
    first = loaded.frame.groupby(["user", "item"], sort=False)["timestamp"].min().reset_index()
    assert first.values.tolist() == tagged[["user", "item", "timestamp"]].values.tolist()


def test_lastfm_prefers_the_millisecond_file_when_present(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_VERIFY", "0")  # synthetic stand-ins for registered files
    data = tmp_path / "data" / "hetrec2011-lastfm-2k"
    data.mkdir(parents=True)
    (data / "user_artists.dat").write_text("userID\tartistID\tweight\r\n2\t52\t10\r\n2\t53\t5\r\n3\t52\t1\r\n")
    (data / "user_taggedartists-timestamps.dat").write_text(
        "userID\tartistID\ttagID\ttimestamp\n2\t52\t13\t1238536800000\n2\t52\t15\t1238000000000\n3\t99\t1\t1300000000999\n")
    listens = load_interactions("hetrec2011-lastfm-2k", root=tmp_path / "data")
    assert listens.frame["timestamp"].tolist() == [1238000000, -1, -1]  # earliest tag of (2, 52)
    assert not any("DERIVED" in n for n in listens.notes)
    assert any("NO TIME for 2 of 3" in n for n in listens.notes)
    tagged = load_interactions("hetrec2011-lastfm-2k", variant="tagged", root=tmp_path / "data")
    assert tagged.frame[["user", "item", "timestamp"]].values.tolist() == [[2, 52, 1238000000], [3, 99, 1300000000]]
    assignments = load_interactions("hetrec2011-lastfm-2k", variant="tag_assignments", root=tmp_path / "data")
    assert assignments.frame["tag"].tolist() == [13, 15, 1]
    assert assignments.frame["timestamp"].tolist() == [1238536800, 1238000000, 1300000000]


# ----------------------------------------------------------------------------------------
# FilmTrust, Amazon Video, Amazon Industrial
# ----------------------------------------------------------------------------------------

def test_filmtrust_variants(root):
    raw = load_interactions("filmtrust", root=root)
    _check_contract(raw)
    assert raw.variant == "raw"
    assert _counts(raw) == (35_497, 1_508, 2_071)
    assert (raw.frame["timestamp"] == -1).all()
    assert raw.frame["rating"].min() == 0.5 and raw.frame["rating"].max() == 4.0
    fedrkg = load_interactions("filmtrust", variant="fedrkg", root=root)
    _check_contract(fedrkg)
    assert _counts(fedrkg) == (34_889, 1_227, 2_059)
    assert any("FABRICATED" in n for n in fedrkg.notes)


def test_amazon_video_counts(root):
    loaded = load_interactions("amazon-video", root=root)
    _check_contract(loaded)
    assert _counts(loaded) == (23_181, 1_372, 7_957)
    assert loaded.status == "processed"
    assert loaded.frame["timestamp"].min() == 967248000 and loaded.frame["timestamp"].max() == 1406073600


def test_amazon_industrial_parser_on_a_synthetic_file(tmp_path):
    folder = tmp_path / "data" / "amazon-industrial"
    folder.mkdir(parents=True)
    records = [
        {"overall": 5.0, "reviewerID": "A1", "asin": "B01", "unixReviewTime": 1500000000, "reviewText": "ok"},
        {"overall": 3.0, "reviewerID": "A2", "asin": "B01", "unixReviewTime": 1400000000, "vote": "2"},
        {"overall": 4.0, "reviewerID": "A1", "asin": "B02", "unixReviewTime": 1600000000},
    ]
    with gzip.open(folder / "Industrial_and_Scientific_5.json.gz", "wt", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record) + "\n")
    loaded = load_interactions("amazon-industrial", root=tmp_path / "data")
    _check_contract(loaded)
    assert loaded.frame[["user", "item"]].values.tolist() == [["A1", "B01"], ["A2", "B01"], ["A1", "B02"]]
    assert loaded.frame["rating"].tolist() == [5.0, 3.0, 4.0]
    assert loaded.frame["timestamp"].tolist() == [1500000000, 1400000000, 1600000000]
    assert loaded.status == "complete"
    # no published hash: recorded on first use, so a later change is caught
    assert download.recorded_hash(tmp_path / "data", file="amazon-industrial/Industrial_and_Scientific_5.json.gz")


# ----------------------------------------------------------------------------------------
# Cross-domain data
# ----------------------------------------------------------------------------------------

def test_douban_variants(root):
    book = load_interactions("douban-gadtcdr", variant="book", root=root)
    _check_contract(book)
    assert _counts(book) == (96_041, 2_110, 6_777)
    music = load_interactions("douban-gadtcdr", variant="music", root=root)
    assert _counts(music) == (69_709, 1_672, 5_567)
    both = load_interactions("douban-gadtcdr", root=root)
    _check_contract(both, extra=["domain"])
    assert both.frame["domain"].value_counts().to_dict() == {"book": 96_041, "music": 69_709}
    assert both.frame["user"].min() >= 1 and both.frame["user"].max() <= 2_718  # one shared user id space
    assert both.status == "substitute"
    assert any("movie domain is missing" in n for n in both.notes)
    assert (both.frame["timestamp"] == -1).all()


def test_disencdr_pair_semantics(root):
    loaded = load_interactions("amazon-cdr-disencdr", variant="phone_sport", root=root)
    _check_contract(loaded, extra=["domain", "split"])
    frame = loaded.frame
    counts = frame.groupby(["domain", "split"]).size().to_dict()
    assert counts[("phone", "train")] == 42_446 and counts[("sport", "train")] == 50_558
    assert frame.loc[frame["domain"] == "phone", "user"].nunique() == 4_998
    # the same users under the same ids in both domains
    phone_users = set(frame.loc[frame["domain"] == "phone", "user"])
    assert phone_users == set(frame.loc[frame["domain"] == "sport", "user"])
    # one test item per user, never an item unseen in that domain's train part
    test = frame[frame["split"] == "test"]
    assert not test.duplicated(["domain", "user"]).any()
    for domain in ("phone", "sport"):
        train_items = set(frame.loc[(frame["domain"] == domain) & (frame["split"] == "train"), "item"])
        assert set(test.loc[test["domain"] == domain, "item"]) <= train_items
    assert (frame["rating"] == 1.0).all() and (frame["timestamp"] == -1).all()
    assert loaded.status == "substitute" and any("SUBSTITUTE" in n for n in loaded.notes)
    # the reversed name holds the same rows, only the domain order changes
    reverse = load_interactions("amazon-cdr-disencdr", variant="sport_phone", root=root).frame
    assert reverse["domain"].iloc[0] == "sport"
    key = ["domain", "split", "user", "item"]
    assert frame.sort_values(key)[key].values.tolist() == reverse.sort_values(key)[key].values.tolist()


@pytest.mark.parametrize("pair", DISENCDR_PAIRS)
def test_every_disencdr_pair_loads(root, pair):
    frame = load_interactions("amazon-cdr-disencdr", variant=pair, root=root).frame
    assert list(frame["domain"].unique()) == pair.split("_")


# ----------------------------------------------------------------------------------------
# C2DSR sequences
# ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dataset, items, valid, test", [
    ("c2dsr-food-kitchen", (29_207, 34_886), 8_173, 8_406),
    ("c2dsr-movie-book", (36_845, 63_937), 7_644, 7_708),
])
def test_c2dsr_sequences(root, dataset, items, valid, test):
    loaded = load_sequences(dataset, root=root)
    assert (loaded.num_items_a, loaded.num_items_b) == items
    assert len(loaded.valid) == valid and len(loaded.test) == test
    assert loaded.train is None and any("NO TRAINING DATA" in n for n in loaded.notes)
    assert loaded.status == "partial"
    assert list(loaded.valid.columns) == ["user", "seq_id", "items", "timestamps"]
    for frame in (loaded.valid, loaded.test):
        lengths = frame["items"].map(len)
        assert (lengths == frame["timestamps"].map(len)).all() and (lengths >= 2).all()
        assert frame["timestamps"].map(lambda t: all(a <= b for a, b in zip(t, t[1:]))).all()
        flat = np.concatenate(frame["items"].to_numpy())
        assert flat.min() >= 0 and flat.max() < sum(items)
    # valid and test users are disjoint (each held-out user contributes one sequence)
    assert not set(loaded.valid["user"]) & set(loaded.test["user"])


def test_c2dsr_sort_is_stable_and_train_is_used_when_present(tmp_path, root):
    folder = tmp_path / "data" / "c2dsr-food-kitchen"
    folder.mkdir(parents=True)
    for name in ("Alist.txt", "Blist.txt", "validdata_new.txt", "testdata_new.txt"):
        shutil.copy(root / "c2dsr-food-kitchen" / name, folder / name)
    (folder / "traindata_new.txt").write_text(
        "0\t5\t30000|20|2000-01-01 00:00:00|\t7|10|x|\t8|20|x|\t9|10|x|\n")
    loaded = load_sequences("c2dsr-food-kitchen", root=tmp_path / "data")
    assert loaded.train is not None
    assert loaded.train.iloc[0]["items"] == [7, 9, 30000, 8]  # equal times keep file order
    assert loaded.train.iloc[0]["timestamps"] == [10, 10, 20, 20]
    assert not any("NO TRAINING DATA" in n for n in loaded.notes)


def test_c2dsr_entertainment_item_counts(root):
    assert c2dsr_item_counts("c2dsr-entertainment-education", root=root) == (8_367, 11_404)


def test_parse_c2dsr_matches_line_count(root):
    path = root / "c2dsr-movie-book" / "testdata_new.txt"
    with open(path, "rb") as fh:
        lines = sum(1 for line in fh if line.strip())
    assert len(parse_c2dsr_file(path)) == lines


# ----------------------------------------------------------------------------------------
# Transparent compression and the environment variable
# ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix, opener", [(".xz", functools.partial(lzma.open, preset=0)),
                                             (".gz", functools.partial(gzip.open, compresslevel=1))])
def test_compressed_copy_is_read_transparently(tmp_path, root, suffix, opener, monkeypatch):
    folder = tmp_path / "data" / "ml-100k"
    folder.mkdir(parents=True)
    with open(root / "ml-100k" / "u.data", "rb") as src, opener(folder / f"u.data{suffix}", "wb") as dst:
        shutil.copyfileobj(src, dst)
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path / "data"))  # root taken from the environment
    loaded = load_interactions("ml-100k")
    reference = load_interactions("ml-100k", root=root)
    pd.testing.assert_frame_equal(loaded.frame, reference.frame)
