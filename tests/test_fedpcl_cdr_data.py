"""FedPCL-CDR data paths on files written to a temporary data root: the original format
(ratings + review text) and the Douban tasks that need the Movie file (Tasks 3 and 4)."""
import numpy as np
import pandas as pd
import pytest
import torch

import fedlib.papers.fedpcl_cdr.experiment as X
import fedlib.papers.fedpcl_cdr.tables as T
from fedlib.data.errors import MalformedDataError, MissingDataError
from fedlib.data.protocols import fedpcl_cdr as protocol
from fedlib.reporting import NEEDS_DOWNLOAD_NOTE

ITEMS = 25
PER_USER = 8


def _interactions(users, prefix):
    """Each user rates 8 distinct items of 25, spread so every item has >= 5 ratings."""
    rows = []
    for u in users:
        for j in range(PER_USER):
            rows.append((f"u{u}", f"{prefix}{(u + 3 * j) % ITEMS}", float(1 + (u + j) % 5)))
    return rows


def write_original(root, domain, users, extra_rows=()):
    """One domain in FedPCL-CDR's original format: user_id, item_id, rating, reviews (+ an ignored column)."""
    prefix = domain[0]
    rows = [(u, i, r, f"review by {u} of {i} word{len(u)}") for u, i, r in _interactions(users, prefix)]
    rows += list(extra_rows)
    path = root / protocol.original_relpath(domain)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows, columns=["user_id", "item_id", "rating", "reviews"])
    frame.insert(3, "votes", 0)
    frame.to_csv(path, index=False)
    return path


def write_douban_ratings(root, domain, users):
    """GA-DTCDR's format: tab-separated integer user, item, rating, no header."""
    path = root / f"douban-gadtcdr/douban_{domain}/ratings.dat"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{u}\t{(u + 3 * j) % ITEMS + 1}\t{1 + (u + j) % 5}" for u in users for j in range(PER_USER)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture()
def data_root(tmp_path, monkeypatch, isolated_data_env):
    """An empty data root used by everything (FEDLIB_DATA); checksums off for the hand-made files."""
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path))
    monkeypatch.setenv("FEDLIB_VERIFY", "0")
    X.load_task.cache_clear()
    yield tmp_path
    X.load_task.cache_clear()


# ----------------------------------------------------------------------------- item 1: the original format
def test_build_original_reads_ratings_and_review_text(tmp_path):
    extra = [("u0", "b0", 5.0, "second review of the same book"),       # a repeated pair: both reviews kept
             ("u0", "b3", 2.0, "review by u0 of b3 word2"),             # an exact duplicate row: dropped
             ("u1", "b2", 3.0, ""),                                     # a new pair without text: no entry
             ("u99", "b3", 5.0, "a user with too few ratings"),         # dropped by the count filter (5)
             ("u98", "b99", 5.0, "an item with one rating")]
    write_original(tmp_path, "book", range(0, 40), extra)
    write_original(tmp_path, "music", range(20, 60))
    split, texts = protocol.build_original(("book", "music"), num_negatives=5, root=tmp_path)
    assert split.domains == ("book", "music") and set(texts) == {"book", "music"}
    assert split.num_overlap_users == 20
    raw_book, raw_music = split["book"].extra["raw_users"], split["music"].extra["raw_users"]
    assert np.array_equal(raw_book[:20], raw_music[:20]) and set(raw_book[:20]) == {f"u{u}" for u in range(20, 40)}
    assert "u99" not in set(raw_book) and "b99" not in set(split["book"].extra["raw_items"])
    for domain in split.domains:
        part = split[domain]
        raw_users, raw_items = part.extra["raw_users"], part.extra["raw_items"]
        pairs = [(u, i) for role in (part.train, part.valid, part.test)
                 for u, i in zip(role.users.tolist(), role.items.tolist())]
        assert len(pairs) == 40 * PER_USER + (domain == "book")  # + u1's pair without text
        with_text = [p for p in pairs if p in texts[domain]]
        assert set(texts[domain]) == set(with_text)  # only interactions of the split, keyed by dense ids
        for u, i in with_text:
            assert f"review by {raw_users[u]} of {raw_items[i]}" in texts[domain][(u, i)]
    book = split["book"]
    u0 = int(np.flatnonzero(book.extra["raw_users"] == "u0")[0])
    b0 = int(np.flatnonzero(book.extra["raw_items"] == "b0")[0])
    b2 = int(np.flatnonzero(book.extra["raw_items"] == "b2")[0])
    b3 = int(np.flatnonzero(book.extra["raw_items"] == "b3")[0])
    u1 = int(np.flatnonzero(book.extra["raw_users"] == "u1")[0])
    assert texts["book"][(u0, b0)].endswith("second review of the same book")
    assert texts["book"][(u0, b0)].startswith("review by u0 of b0")
    assert texts["book"][(u0, b3)] == "review by u0 of b3 word2"  # the duplicate row did not repeat it
    assert (u1, b2) not in texts["book"]
    assert any("original format" in note for note in split.notes)


def test_missing_or_malformed_original_files_say_what_to_do(tmp_path):
    write_original(tmp_path, "music", range(20, 60))
    with pytest.raises(MissingDataError) as missing:
        protocol.build_original(("movie", "music"), root=tmp_path)
    message = str(missing.value)
    assert "fedpcl-cdr/douban_movie/movie_review_data.csv" in message
    assert str(tmp_path) in message
    assert "researchgate.net" in message and "reviews" in message
    amazon = protocol.original_relpath("phone")
    with pytest.raises(MissingDataError, match="jmcauley"):
        protocol.build_original(("phone", "sport"), root=tmp_path)
    assert amazon == "fedpcl-cdr/amazon_phone/phone_review_data.csv"
    bad = tmp_path / protocol.original_relpath("movie")
    bad.parent.mkdir(parents=True)
    bad.write_text("user_id,item_id,rating\nu1,m1,5\n")
    with pytest.raises(MalformedDataError, match="review column"):
        protocol.build_original(("movie", "music"), root=tmp_path)
    with pytest.raises(ValueError, match="one source"):
        protocol.build_original(("book", "phone"), root=tmp_path)


def test_run_cell_trains_an_original_task_with_the_review_branch(data_root, monkeypatch):
    assert "Movie-Music (original)" not in X.available_tasks()
    write_original(data_root, "movie", range(0, 40))
    write_original(data_root, "music", range(20, 60))
    assert "Movie-Music (original)" in X.available_tasks()
    assert "Task 3 (Movie-Music, Douban)" not in X.needs_download()
    seen = {}
    real = X.train_fedpcl_cdr

    def spy(split, config, **kwargs):
        seen["reviews"] = kwargs.get("reviews")
        return real(split, config, **kwargs)

    monkeypatch.setattr(X, "train_fedpcl_cdr", spy)
    torch.set_num_threads(1)
    result = X.run_cell(X.cell("Movie-Music (original)", rounds=1, dim=8, num_clusters=2, num_negatives=5))
    assert result["extra"]["review_branch"] is True and result["extra"]["domains"] == ["movie", "music"]
    split = X.load_split("Movie-Music (original)", None, 5, 0)
    for domain in ("movie", "music"):
        users, items = seen["reviews"][domain]
        assert users.shape == (split[domain].num_users, X.REVIEW_DIM)
        assert items.shape == (split[domain].num_items, X.REVIEW_DIM)
        assert 0.0 <= result["metrics"][f"{domain}/test/HR@10"] <= 1.0


# ----------------------------------------------------------------------------- item 2: Tasks 3 and 4 gated on Movie
def test_tasks_3_and_4_run_only_once_douban_movie_is_present(data_root):
    write_douban_ratings(data_root, "book", range(1, 41))
    write_douban_ratings(data_root, "music", range(21, 61))
    available = X.available_tasks()
    assert "Book-Music" in available
    assert "Movie-Music" not in available and "Book-Movie-Music" not in available
    assert {c["task"] for c in X.grid_cells("table2")} == {"Book-Music"}
    missing = X.needs_download()
    assert "Task 3 (Movie-Music, Douban)" in missing and "Task 4 (Book-Movie-Music, Douban)" in missing
    note = T.missing_note(pd.Series({"task": "Task 3 (Movie-Music, Douban)", "domain": "Movie", "method": "NeuMF"}))
    assert note.startswith(NEEDS_DOWNLOAD_NOTE)
    with pytest.raises(MissingDataError, match="douban_movie"):
        X.load_split("Movie-Music", None, 5, 0)

    write_douban_ratings(data_root, "movie", range(11, 51))
    X.load_task.cache_clear()
    available = X.available_tasks()
    assert {"Movie-Music", "Book-Movie-Music", "Book-Music"} <= set(available)
    assert {"Movie-Music", "Book-Movie-Music"} <= {c["task"] for c in X.grid_cells("table2")}
    missing = X.needs_download()
    assert "Task 3 (Movie-Music, Douban)" not in missing and "Task 4 (Book-Movie-Music, Douban)" not in missing
    note = T.missing_note(pd.Series({"task": "Task 3 (Movie-Music, Douban)", "domain": "Movie", "method": "NeuMF"}))
    assert NEEDS_DOWNLOAD_NOTE not in note
    three = X.load_split("Book-Movie-Music", None, 5, 0)
    assert three.domains == ("book", "movie", "music")
    assert three.num_overlap_users == 20  # users 21..40 rate in all three domains
    raw = [three[d].extra["raw_users"][: three.num_overlap_users] for d in three.domains]
    assert all(np.array_equal(raw[0], r) for r in raw)
    assert X.load_split("Movie-Music", None, 5, 0).domains == ("movie", "music")
    assert X.load_split("Book-Music", None, 5, 0).domains == ("book", "music")  # stays two domains
    # Task 4's rows now come from the three-domain task, not from the Book-Music stand-in.
    assert T.comparison_tasks() == tuple(t for t in available if t != "Book-Music")
