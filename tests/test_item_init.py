"""Item side information (fedlib.data.side_info) and text-based item init (fedlib.models.item_init)."""
from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from fedlib.data.errors import MalformedDataError, MissingDataError
from fedlib.data.side_info import (
    load_amazon_industrial_side_info,
    load_ml100k_side_info,
    load_ml1m_side_info,
    load_side_info,
)
from fedlib.models.item_init import item_text_features, text_item_init, train_item_autoencoder

ML100K_GENRES = ["unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary",
                 "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller",
                 "War", "Western"]


def _u_item_line(item: int, title: str, date: str, genres) -> str:
    flags = ["1" if g in genres else "0" for g in ML100K_GENRES]
    return "|".join([str(item), title, date, "", "http://us.imdb.com/x"] + flags)


@pytest.fixture
def synthetic_root(tmp_path, monkeypatch, isolated_data_env):
    monkeypatch.setenv("FEDLIB_VERIFY", "0")  # synthetic stand-ins for registered files
    folder = tmp_path / "ml-100k"
    folder.mkdir()
    (folder / "u.genre").write_text("".join(f"{g}|{i}\n" for i, g in enumerate(ML100K_GENRES)) + "\n")
    (folder / "u.item").write_text("\n".join([
        _u_item_line(1, "Toy Story (1995)", "01-Jan-1995", {"Animation", "Children's", "Comedy"}),
        _u_item_line(181, "Return of the Jedi (1983)", "14-Mar-1997", {"Action", "Sci-Fi"}),
        _u_item_line(267, "unknown", "", {"unknown"}),
    ]) + "\n")
    (tmp_path / "ml-1m").mkdir()
    return tmp_path


# ----------------------------------------------------------------------------------------
# Loaders
# ----------------------------------------------------------------------------------------

def test_ml100k_side_info_on_the_real_data(shared_data):
    frame = load_ml100k_side_info(root=shared_data)
    assert len(frame) == 1682 and frame.index.is_unique
    assert list(frame.columns) == ["title", "year", "genres"] and frame["year"].dtype == np.float64
    assert frame.loc[1, "title"] == "Toy Story (1995)"
    assert frame.loc[1, "genres"] == ["Animation", "Children's", "Comedy"]
    assert frame.loc[1, "year"] == 1995.0
    assert frame.loc[181, "year"] == 1983.0  # title year, not the 1997 re-release date
    assert math.isnan(frame.loc[267, "year"])


def test_ml1m_side_info_on_the_real_data(shared_data):
    if not (shared_data / "ml-1m" / "movies.dat").is_file():
        pytest.skip(f"{shared_data}/ml-1m/movies.dat not present")
    frame = load_side_info("ml-1m", root=shared_data)
    assert len(frame) == 3883
    assert frame.loc[1, "title"] == "Toy Story (1995)" and frame.loc[1, "year"] == 1995.0
    assert frame.loc[2, "genres"] == ["Adventure", "Children's", "Fantasy"]


def test_synthetic_ml100k_file(synthetic_root):
    frame = load_side_info("ml-100k", root=synthetic_root)
    assert frame.index.tolist() == [1, 181, 267]
    assert frame.loc[181, "genres"] == ["Action", "Sci-Fi"] and frame.loc[181, "year"] == 1983.0
    assert frame.loc[267, "genres"] == ["unknown"] and math.isnan(frame.loc[267, "year"])


def test_synthetic_ml1m_file(synthetic_root):
    (synthetic_root / "ml-1m" / "movies.dat").write_bytes(
        "1::Toy Story (1995)::Animation|Children's|Comedy\n2::Caf\xe9 Society (1995)::Drama\n".encode("latin-1"))
    frame = load_ml1m_side_info(root=synthetic_root)
    assert frame.loc[2, "title"] == "Caf\xe9 Society (1995)"  # latin-1 decoded
    assert frame.loc[1, "genres"] == ["Animation", "Children's", "Comedy"] and frame.loc[2, "year"] == 1995.0


@pytest.mark.parametrize("dataset, relpath, text, reason", [
    ("ml-100k", "ml-100k/u.item", _u_item_line(1, "Toy Story (1995)", "01-Jan-1995", {"Comedy"}) + "\n1|Broken|x\n",
     "expected 24 fields"),
    ("ml-1m", "ml-1m/movies.dat", "1::Toy Story (1995)::Comedy\n\nx1::Jumanji (1995)::Fantasy\n", "not an integer"),
    ("ml-1m", "ml-1m/movies.dat", "1::A (1995)::Comedy\n1::B (1996)::Drama\n", "duplicate item id 1"),
])
def test_malformed_line_names_file_and_line(synthetic_root, dataset, relpath, text, reason):
    (synthetic_root / relpath).write_text(text)
    with pytest.raises(MalformedDataError) as info:
        load_side_info(dataset, root=synthetic_root)
    line = 3 if "x1::" in text else 2  # the blank line still counts
    assert info.value.line_number == line and info.value.path.name == relpath.split("/")[1]
    assert f"{relpath.split('/')[1]}, line {line}" in str(info.value) and reason in str(info.value)


def test_missing_ml1m_movies_names_file_root_and_download(synthetic_root):
    with pytest.raises(MissingDataError) as info:
        load_side_info("ml-1m", root=synthetic_root)
    text = str(info.value)
    assert "movies.dat" in text and str(synthetic_root) in text
    assert "https://files.grouplens.org/datasets/movielens/ml-1m.zip" in text
    assert info.value.root == synthetic_root and "ml-1m/movies.dat" in info.value.missing


def test_amazon_industrial_metadata_missing_and_present(synthetic_root):
    with pytest.raises(FileNotFoundError) as info:  # MissingDataError is a FileNotFoundError
        load_amazon_industrial_side_info(root=synthetic_root)
    text = str(info.value)
    assert isinstance(info.value, MissingDataError)
    assert "meta_Industrial_and_Scientific.json.gz" in text and str(synthetic_root) in text
    assert "https://nijianmo.github.io/amazon/index.html" in text

    folder = synthetic_root / "amazon-industrial"
    folder.mkdir()
    records = [{"asin": "B01", "title": "Safety Glasses", "category": ["Industrial & Scientific", "Safety"],
                "date": "June 2, 2015"}, {"asin": "B02", "title": "Lab Gloves"}]
    with gzip.open(folder / "meta_Industrial_and_Scientific.json.gz", "wt", encoding="utf-8") as fh:
        fh.write("\n".join(json.dumps(r) for r in records) + "\n{not json\n")
    with pytest.raises(MalformedDataError, match="line 3"):
        load_side_info("amazon-industrial", root=synthetic_root)
    with gzip.open(folder / "meta_Industrial_and_Scientific.json.gz", "wt", encoding="utf-8") as fh:
        fh.write("\n".join(json.dumps(r) for r in records) + "\n")
    frame = load_side_info("amazon-industrial", root=synthetic_root)
    assert frame.index.tolist() == ["B01", "B02"] and frame.loc["B01", "year"] == 2015.0
    assert frame.loc["B01", "genres"] == ["Industrial & Scientific", "Safety"] and frame.loc["B02", "genres"] == []


def test_unknown_side_info_dataset_suggests_the_closest():
    with pytest.raises(ValueError, match="did you mean 'ml-100k'"):
        load_side_info("ml100k")


# ----------------------------------------------------------------------------------------
# Features
# ----------------------------------------------------------------------------------------

TOY = pd.DataFrame({
    "title": ["Star Quest (1980)", "Star Quest Returns (1983)", "Love in Paris (1950)", "Paris Love Story (1955)",
              "Quiet Farm (2000)", "Unrelated Thing (1999)"],
    "year": [1980.0, 1983.0, 1950.0, 1955.0, 2000.0, np.nan],
    "genres": [["Sci-Fi", "Action"], ["Sci-Fi", "Action"], ["Romance", "Drama"], ["Romance"], ["Documentary"],
               ["Horror"]],
}, index=pd.Index([10, 11, 20, 21, 30, 40], name="item"))


def _cos(m: np.ndarray) -> np.ndarray:
    unit = m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)
    return unit @ unit.T


def test_items_sharing_genres_and_title_words_are_more_similar():
    features = item_text_features(TOY, TOY.index.to_numpy())
    assert features.matrix.dtype == np.float32 and features.matrix.shape == (6, len(features.columns))
    assert {"title:star", "title:paris", "genre:Sci-Fi", "year"} <= set(features.columns)
    assert "title:1980" not in features.columns  # the year tag is its own column
    sim = _cos(features.matrix)
    assert sim[0, 1] > max(sim[0, 2], sim[0, 4], sim[0, 5]) + 0.3
    assert sim[2, 3] > max(sim[2, 0], sim[2, 4], sim[2, 5]) + 0.3
    # Title words alone: same genres and no year everywhere.
    words = TOY.assign(genres=[["Drama"]] * 6, year=np.nan)
    sim = _cos(item_text_features(words, TOY.index.to_numpy(), year_weight=0.0).matrix)
    assert sim[0, 1] > sim[0, 2] and sim[2, 3] > sim[2, 4]


def test_feature_rows_follow_raw_items_order():
    raw = TOY.index.to_numpy()
    perm = np.array([3, 0, 5, 1, 4, 2])
    base = item_text_features(TOY, raw)
    permuted = item_text_features(TOY, raw[perm])
    assert permuted.columns == base.columns
    np.testing.assert_allclose(permuted.matrix, base.matrix[perm], atol=1e-6)
    assert not np.allclose(permuted.matrix, base.matrix)


def test_missing_items_get_zero_rows_and_a_note():
    features = item_text_features(TOY, np.array([10, 999, 11]))
    assert features.missing.tolist() == [False, True, False]
    assert not features.matrix[1].any() and features.matrix[0].any()
    assert features.notes and "1 of 3 items" in features.notes[0]
    with pytest.raises(ValueError, match="None of the 2 raw item ids"):
        item_text_features(TOY, np.array(["10", "11"]))  # wrong id type: nothing matches
    with pytest.raises(ValueError, match="duplicate"):
        item_text_features(TOY, np.array([10, 10]))


# ----------------------------------------------------------------------------------------
# Autoencoder
# ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def low_rank_features() -> np.ndarray:
    rng = np.random.default_rng(0)
    return (rng.normal(size=(300, 4)) @ rng.normal(size=(4, 40))).astype(np.float32)


def test_autoencoder_learns_and_is_scaled(low_rank_features):
    rng_state = torch.get_rng_state()
    threads = torch.get_num_threads()
    codes, losses = train_item_autoencoder(low_rank_features, dim=8, hidden=32, epochs=30, target_std=0.05, seed=1)
    assert codes.shape == (300, 8) and codes.dtype == torch.float32
    assert len(losses) == 30 and losses[-1] < 0.5 * losses[0]
    assert codes.std().item() == pytest.approx(0.05, rel=1e-4)
    assert codes.mean(dim=0).abs().max().item() < 1e-6
    assert torch.equal(torch.get_rng_state(), rng_state) and torch.get_num_threads() == threads


def test_autoencoder_is_deterministic_per_seed(low_rank_features):
    kw = dict(dim=8, hidden=32, epochs=5)
    a, losses_a = train_item_autoencoder(low_rank_features, seed=3, **kw)
    b, losses_b = train_item_autoencoder(low_rank_features, seed=3, **kw)
    c, _ = train_item_autoencoder(low_rank_features, seed=4, **kw)
    assert torch.equal(a, b) and losses_a == losses_b
    assert not torch.allclose(a, c)


# ----------------------------------------------------------------------------------------
# The one-call init on real ML-100K
# ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ml100k_init(shared_data):
    from fedlib.data.protocols import fedkdrec

    raw_items = fedkdrec.build("ml-100k", root=shared_data).extra["raw_items"]
    embeddings = text_item_init("ml-100k", raw_items, dim=32, seed=0, root=shared_data, target_std=0.01)
    return raw_items, embeddings, load_ml100k_side_info(root=shared_data)


def test_text_init_on_ml100k_groups_items_by_genre(ml100k_init):
    raw_items, embeddings, side = ml100k_init
    assert embeddings.shape == (1682, 32) and embeddings.std().item() == pytest.approx(0.01, rel=1e-4)
    genres = [set(side.loc[r, "genres"]) for r in raw_items]
    sim = _cos(embeddings.numpy())
    share = np.array([[bool(a & b) for b in genres] for a in genres])
    upper = np.triu(np.ones_like(share), k=1).astype(bool)
    assert sim[share & upper].mean() > sim[~share & upper].mean() + 0.1

    star_wars = int(np.flatnonzero(raw_items == 50)[0])
    assert side.loc[50, "title"] == "Star Wars (1977)"
    neighbours = np.argsort(-sim[star_wars])[1:11]
    scifi_action = np.array([bool(g & {"Sci-Fi", "Action"}) for g in genres])
    assert scifi_action[neighbours].mean() >= 2 * scifi_action.mean()  # base rate ~18 %
