"""Item side information: titles, release years and genres of the items of a dataset.

Every loader returns a :class:`pandas.DataFrame` indexed by the dataset's **raw item id**
(the id used in its interaction file, index name ``item``) with the columns

==========  ===========  ============================================================
column      dtype        meaning
==========  ===========  ============================================================
``title``   str          title as published (``"Toy Story (1995)"``); ``""`` if none
``year``    float64      release year, ``NaN`` if unknown
``genres``  list[str]    genre / category names, in file order (may be empty)
==========  ===========  ============================================================

Rows are in file order. Files are found, downloaded (where the registry allows it) and
checksum-verified exactly like the interaction files (:mod:`fedlib.data.loaders`), so a
missing file raises :class:`~fedlib.data.errors.MissingDataError` with the data root that
was searched and where to get the file, and a bad line raises
:class:`~fedlib.data.errors.MalformedDataError` with the file and 1-based line number.

Used by :mod:`fedlib.models.item_init` (text-based item-embedding initialisation, FedKDRec).
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Callable, Dict, List

import pandas as pd

from fedlib.data.download import data_root, describe_root, resolve_file
from fedlib.data.errors import MalformedDataError, MissingDataError, closest_match
from fedlib.data.reading import _open_text, _require
from fedlib.data.registry import get_spec

AMAZON_INDUSTRIAL_META = "amazon-industrial/meta_Industrial_and_Scientific.json.gz"
"""Relative path (under the data root) of the Amazon 2018 Industrial metadata."""

AMAZON_META_SOURCE = "https://nijianmo.github.io/amazon/index.html"

# The last "(YYYY)" of a title: ML-100K appends e.g. "(V)" after the year, and the title
# year is the film's year (a release *date* can be a re-release, see load_ml100k_side_info).
_TITLE_YEAR = re.compile(r"\((\d{4})\)")
_ANY_YEAR = re.compile(r"\b(1[89]\d{2}|20\d{2})\b")


def load_side_info(dataset: str, *, root: "str | os.PathLike | None" = None) -> pd.DataFrame:
    """Side information of ``dataset`` (``"ml-100k"``, ``"ml-1m"`` or ``"amazon-industrial"``).

    Raises:
        ValueError: no side-information loader for ``dataset``.
        MissingDataError, MalformedDataError, ChecksumError: see the individual loaders.
    """
    try:
        loader = SIDE_INFO_LOADERS[dataset]
    except KeyError:
        hint = closest_match(str(dataset), list(SIDE_INFO_LOADERS))
        raise ValueError(
            f"No item side information loader for dataset {dataset!r}"
            + (f" (did you mean {hint!r}?)" if hint else "")
            + f". Available: {', '.join(SIDE_INFO_LOADERS)}."
        ) from None
    return loader(root=root)


def load_ml100k_side_info(*, root: "str | os.PathLike | None" = None) -> pd.DataFrame:
    """ML-100K ``u.item`` (+ genre names from ``u.genre``): 1,682 movies.

    ``u.item`` is ``id|title|release date|video release date|IMDb URL|19 genre flags``
    (latin-1). ``year`` is the last ``(YYYY)`` in the title, else the year of the release
    date: the release date is sometimes a re-release (``Return of the Jedi (1983)`` is dated
    14-Mar-1997), the title year is the film's. Item 267 (``unknown``) has year ``NaN``.
    """
    spec = get_spec("ml-100k")
    paths = _require(spec, ("ml-100k/u.item", "ml-100k/u.genre"), root)
    genre_names = _read_ml100k_genres(paths["ml-100k/u.genre"])
    path = paths["ml-100k/u.item"]
    rows: Dict[int, tuple] = {}
    for number, line in _lines(path):
        fields = line.split("|")
        if len(fields) != 5 + len(genre_names):
            _fail(path, number, line, f"expected {5 + len(genre_names)} fields separated by '|', found {len(fields)}")
        item = _parse_id(path, number, line, fields[0], rows)
        flags = fields[5:]
        if any(flag not in ("0", "1") for flag in flags):
            _fail(path, number, line, "genre flags must be 0 or 1")
        title = fields[1].strip()
        year = _title_year(title)
        if math.isnan(year):
            year = _year_in(fields[2])  # "01-Jan-1995" -> 1995
        rows[item] = (title, year, [g for g, flag in zip(genre_names, flags) if flag == "1"])
    return _frame(rows)


def load_ml1m_side_info(*, root: "str | os.PathLike | None" = None) -> pd.DataFrame:
    """ML-1M ``movies.dat``: ``id::Title (Year)::Genre1|Genre2`` (latin-1), 3,883 movies.

    Raises:
        MissingDataError: ``ml-1m/movies.dat`` is absent (message: data root searched,
            https://files.grouplens.org/datasets/movielens/ml-1m.zip).
    """
    spec = get_spec("ml-1m")
    path = _require(spec, ("ml-1m/movies.dat",), root)["ml-1m/movies.dat"]
    rows: Dict[int, tuple] = {}
    for number, line in _lines(path):
        fields = line.split("::")
        if len(fields) != 3:
            _fail(path, number, line, f"expected 3 fields separated by '::', found {len(fields)}")
        item = _parse_id(path, number, line, fields[0], rows)
        title = fields[1].strip()
        genres = [g for g in fields[2].strip().split("|") if g]
        rows[item] = (title, _title_year(title), genres)
    return _frame(rows)


def load_amazon_industrial_side_info(*, root: "str | os.PathLike | None" = None) -> pd.DataFrame:
    """Amazon 2018 Industrial and Scientific metadata (``meta_Industrial_and_Scientific.json.gz``).

    The file is not part of the reference collection and fedlib has no download URL for
    it. When it is placed by hand, one JSON object per line is read: ``asin`` (index),
    ``title``, ``category`` (-> ``genres``) and the year found in ``date``; a repeated
    ``asin`` keeps its first record.

    Raises:
        MissingDataError: the file is absent (the usual case); the message says where to put it.
    """
    spec = get_spec("amazon-industrial")
    try:
        path = resolve_file(spec, AMAZON_INDUSTRIAL_META, root, download=False)
    except MissingDataError:
        base = data_root(root)
        raise MissingDataError(
            f"Amazon 2018 Industrial and Scientific metadata ({spec.id}): missing file {AMAZON_INDUSTRIAL_META}\n"
            f"  looked for: {base / AMAZON_INDUSTRIAL_META} (also with .xz / .gz)\n"
            f"  data root searched: {describe_root(root)}\n"
            "  fedlib cannot download it (no stable direct link; the metadata is not in the registry).\n"
            f"  manual download: open {AMAZON_META_SOURCE} , section 'Per-category data', row "
            "'Industrial and Scientific', link 'metadata'; do not decompress it and save it as "
            f"{base / AMAZON_INDUSTRIAL_META} . Or set FEDLIB_DATA to the folder that contains "
            "'amazon-industrial/'.\n"
            f"  canonical source: {AMAZON_META_SOURCE}",
            dataset=spec.id, missing=[AMAZON_INDUSTRIAL_META], root=base,
        ) from None
    rows: Dict[str, tuple] = {}
    for number, line in _lines(path, encoding="utf-8"):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            _fail(path, number, line, f"not a JSON object ({exc.msg})")
        if not isinstance(record, dict) or not isinstance(record.get("asin"), str):
            _fail(path, number, line, "no 'asin' string field")
        if record["asin"] in rows:
            continue  # the 2018 metadata repeats some products: keep the first record
        categories = record.get("category") or []
        genres = list(dict.fromkeys(str(c).strip() for c in categories if str(c).strip()))
        rows[record["asin"]] = (str(record.get("title") or "").strip(), _year_in(str(record.get("date") or "")), genres)
    return _frame(rows)


SIDE_INFO_LOADERS: Dict[str, Callable[..., pd.DataFrame]] = {
    "ml-100k": load_ml100k_side_info,
    "ml-1m": load_ml1m_side_info,
    "amazon-industrial": load_amazon_industrial_side_info,
}
"""Dataset id -> loader (all take ``root=`` only)."""


# ----------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------

def _lines(path: Path, encoding: str = "latin-1"):
    """``(1-based number, text)`` of every non-blank line (MovieLens files end with blank lines)."""
    with _open_text(path, encoding=encoding) as fh:
        for number, raw in enumerate(fh, start=1):
            line = raw.rstrip("\r\n")
            if line.strip():
                yield number, line


def _fail(path: Path, number: int, line: str, reason: str):
    raise MalformedDataError(path, number, line, reason)


def _parse_id(path: Path, number: int, line: str, text: str, seen) -> int:
    try:
        item = int(text)
    except ValueError:
        _fail(path, number, line, f"item id {text!r} is not an integer")
    if item in seen:
        _fail(path, number, line, f"duplicate item id {item}")
    return item


def _read_ml100k_genres(path: Path) -> List[str]:
    """Genre names of ``u.genre`` (``name|index`` lines) ordered by index (0..18 in ML-100K)."""
    pairs = []
    for number, line in _lines(path):
        name, sep, index = line.partition("|")
        if not sep or not index.strip().isdigit() or not name.strip():
            _fail(path, number, line, "expected 'genre name|index'")
        pairs.append((int(index), name.strip()))
    pairs.sort()
    if not pairs or [i for i, _ in pairs] != list(range(len(pairs))):
        raise MalformedDataError(path, 0, "", f"genre indices must be 0..n-1 without gaps, found {[i for i, _ in pairs]}")
    return [name for _, name in pairs]


def _title_year(title: str) -> float:
    years = _TITLE_YEAR.findall(title)
    return float(years[-1]) if years else math.nan


def _year_in(text: str) -> float:
    match = _ANY_YEAR.search(text)
    return float(match.group(1)) if match else math.nan


def _frame(rows: Dict[object, tuple]) -> pd.DataFrame:
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=["title", "year", "genres"])
    if frame.empty:
        frame = pd.DataFrame({"title": pd.Series(dtype=object), "year": pd.Series(dtype="float64"),
                              "genres": pd.Series(dtype=object)})
    frame["year"] = frame["year"].astype("float64")
    frame.index.name = "item"
    return frame


__all__ = [
    "AMAZON_INDUSTRIAL_META",
    "SIDE_INFO_LOADERS",
    "load_side_info",
    "load_ml100k_side_info",
    "load_ml1m_side_info",
    "load_amazon_industrial_side_info",
]
