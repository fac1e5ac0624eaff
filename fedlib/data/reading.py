"""Reading raw files: the loaders' result types and their generic helpers.

:class:`LoadedInteractions` and :class:`LoadedSequences` are what :mod:`fedlib.data.loaders`
returns (its module docstring gives the frame contract); the helpers find and check the
registered files, parse delimited tables fast with pandas' C parser and, only when a cheap
validation finds a malformed line, rescan the file to report its first bad line.
"""
from __future__ import annotations

import gzip
import lzma
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from fedlib.data.download import (
    data_root,
    dataset_status,
    find_file,
    missing_data_message,
    normalise_relpath,
    resolve_file,
)
from fedlib.data.errors import (
    MalformedDataError,
    MissingDataError,
)
from fedlib.data.registry import DatasetSpec


# ----------------------------------------------------------------------------------------
# Result types
# ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LoadedInteractions:
    """Interactions of one dataset variant.

    Attributes:
        dataset: registry id.
        variant: the variant actually loaded (the default's name when ``variant=None`` was
            asked for a dataset with named variants; ``None`` for single-variant data).
        frame: ``(n, 4..6)`` frame, columns ``user, item, rating, timestamp`` then
            ``domain`` and/or ``split`` where applicable (see module docstring). File order.
        status: status computed from the files present (``complete``, ``partial``, ...).
        notes: every caveat a reader must see (partial file, substitute data, derived or
            fabricated timestamps, rows without time, ...).
    """

    dataset: str
    variant: Optional[str]
    frame: pd.DataFrame
    status: str
    notes: Tuple[str, ...]

    @property
    def num_users(self) -> int:
        return int(self.frame["user"].nunique())

    @property
    def num_items(self) -> int:
        return int(self.frame["item"].nunique())

    def __len__(self) -> int:
        return len(self.frame)

    def __repr__(self) -> str:
        variant = f", variant={self.variant!r}" if self.variant is not None else ""
        return (f"LoadedInteractions({self.dataset!r}{variant}: {len(self.frame):,} rows, {self.num_users:,} users, "
                f"{self.num_items:,} items, status={self.status!r}, {len(self.notes)} note(s))")


@dataclass(frozen=True)
class LoadedSequences:
    """C2DSR cross-domain sequences (Food-Kitchen, Movie-Book, Entertainment-Education).

    Attributes:
        dataset: registry id.
        num_items_a, num_items_b: sizes of the two item sets. Item ids ``< num_items_a``
            belong to domain A, ids ``>= num_items_a`` (up to ``num_items_a + num_items_b - 1``)
            to domain B.
        train: ``None`` when ``traindata_new.txt`` is absent (``notes`` says so).
        valid, test: one row per line with columns ``user`` (int64, the line's first field),
            ``seq_id`` (int64, second field), ``items`` (list[int], sorted by time, stable),
            ``timestamps`` (list[int], unix seconds, non-decreasing). In valid/test the last
            item is the held-out target.
        status: status computed from the files present.
        notes: caveats.
        domain_names: names of domain A and B (``("Food", "Kitchen")``, ...).
    """

    dataset: str
    num_items_a: int
    num_items_b: int
    train: Optional[pd.DataFrame]
    valid: pd.DataFrame
    test: pd.DataFrame
    status: str
    notes: Tuple[str, ...]
    domain_names: Tuple[str, str] = ("A", "B")

    def __repr__(self) -> str:
        train = "absent" if self.train is None else f"{len(self.train):,}"
        return (f"LoadedSequences({self.dataset!r}: items A={self.num_items_a:,} B={self.num_items_b:,}, "
                f"train={train}, valid={len(self.valid):,}, test={len(self.test):,}, status={self.status!r})")


# ----------------------------------------------------------------------------------------
# Generic helpers: file access, fast parsing, validation
# ----------------------------------------------------------------------------------------

def _require(spec: DatasetSpec, relpaths: Sequence[str], root) -> Dict[str, Path]:
    """Resolve (download if allowed, verify) every path; one MissingDataError naming all missing ones."""
    found: Dict[str, Path] = {}
    missing: List[str] = []
    reasons: List[str] = []
    for rel in relpaths:
        try:
            found[rel] = resolve_file(spec, rel, root)
        except MissingDataError as exc:
            missing += list(exc.missing) or [rel]
            reason = _reason_of(exc)
            if reason and reason not in reasons:
                reasons.append(reason)
    if missing:
        base = data_root(root)
        raise MissingDataError(
            missing_data_message(spec, [normalise_relpath(spec, m) for m in missing], base,
                                 "; ".join(reasons) or None, root_given=root),
            dataset=spec.id, missing=missing, root=base)
    return found


def _reason_of(exc: MissingDataError) -> Optional[str]:
    for line in str(exc).splitlines():
        if line.strip().startswith("not downloaded:"):
            return line.split(":", 1)[1].strip()
    return None


def _optional(spec: DatasetSpec, relpath: str, root) -> Optional[Path]:
    """A verified optional file if present; never downloads (a missing optional file is a note)."""
    if find_file(spec, relpath, root) is None:
        return None
    return resolve_file(spec, relpath, root, download=False)


def _open_text(path: Path, encoding: str = "latin-1"):
    """Text handle that decompresses ``.xz`` / ``.gz`` transparently."""
    name = str(path)
    if name.endswith(".xz"):
        return lzma.open(path, "rt", encoding=encoding, newline="")
    if name.endswith(".gz"):
        return gzip.open(path, "rt", encoding=encoding, newline="")
    return open(path, "r", encoding=encoding, newline="")


def _first_line(path: Path) -> str:
    with _open_text(path) as fh:
        return fh.readline().rstrip("\r\n")


def _looks_like_header(path: Path, sep: str) -> bool:
    """True when the first field of the first line is not a number (a column-name header)."""
    first = _first_line(path).split(sep)[0].strip()
    try:
        float(first)
        return False
    except ValueError:
        return True


# Kinds of column: "int" (integer id/time), "float" (finite number), "str" (non-empty text).
_Column = Tuple[str, str]


def _read_table(path: Path, *, sep: str, columns: Sequence[_Column], header: "bool | str" = False) -> pd.DataFrame:
    """Parse a delimited numeric file with the C parser and validate every value.

    Args:
        path: the file (``.xz`` / ``.gz`` decompressed transparently).
        sep: a single character, or ``"::"`` (MovieLens 1M).
        columns: ``(name, kind)`` per field, in file order.
        header: ``True`` skips the first line, ``"auto"`` skips it if it is not numeric.

    Returns:
        Frame with the named columns; ``int`` columns as int64, ``float`` as float64.

    Raises:
        MalformedDataError: first offending line, 1-based, with its text.
    """
    if header == "auto":
        header = _looks_like_header(path, sep)
    names = [name for name, _ in columns]
    # "::" is not a single character; splitting on ":" keeps the C parser (a regex
    # separator would force the slow Python engine) and puts empty fields between values.
    c_sep = ":" if sep == "::" else sep
    n_fields = 2 * len(columns) - 1 if sep == "::" else len(columns)
    try:
        raw = pd.read_csv(path, sep=c_sep, header=None, skiprows=1 if header else 0, index_col=False,
                          engine="c", encoding="latin-1", compression="infer", low_memory=False)
    except pd.errors.EmptyDataError:
        return pd.DataFrame({name: pd.Series(dtype="int64" if kind == "int" else "float64" if kind == "float" else object)
                             for name, kind in columns})
    except (pd.errors.ParserError, ValueError) as exc:
        raise _malformed(path, sep, columns, bool(header), f"pandas: {exc}") from None
    if raw.shape[1] != n_fields:
        raise _malformed(path, sep, columns, bool(header), f"expected {len(columns)} fields, the file has {raw.shape[1]}")
    if sep == "::":
        # The odd positions are the empty fields between "::" and must stay empty.
        if raw.iloc[:, 1::2].notna().to_numpy().any():
            raise _malformed(path, sep, columns, bool(header), "stray ':' in a line")
        raw = raw.iloc[:, 0::2]
    raw.columns = names
    for name, kind in columns:
        col = raw[name]
        if kind == "int" and col.dtype.kind not in "iu":
            raise _malformed(path, sep, columns, bool(header), f"column {name!r} is not all integers")
        if kind == "float" and (col.dtype.kind not in "fiu" or col.isna().any() or not np.isfinite(col.to_numpy(dtype="float64")).all()):
            raise _malformed(path, sep, columns, bool(header), f"column {name!r} is not all finite numbers")
        if kind == "str" and col.isna().any():
            raise _malformed(path, sep, columns, bool(header), f"column {name!r} has empty values")
    for name, kind in columns:
        if kind == "int":
            raw[name] = raw[name].astype("int64", copy=False)
        elif kind == "float":
            raw[name] = raw[name].astype("float64", copy=False)
    return raw


def _check_value(text: str, kind: str) -> Optional[str]:
    """Why ``text`` is not a valid value of ``kind`` (``None`` if it is)."""
    if kind == "int":
        try:
            int(text)
        except ValueError:
            return f"{text!r} is not an integer"
    elif kind == "float":
        try:
            value = float(text)
        except ValueError:
            return f"{text!r} is not a number"
        if not math.isfinite(value):
            return f"{text!r} is not a finite number"
    elif not text.strip():
        return "empty value"
    return None


def _malformed(path: Path, sep: str, columns: Sequence[_Column], header: bool, detail: str) -> MalformedDataError:
    """Rescan ``path`` line by line and build the error for the first bad line."""
    kinds = [kind for _, kind in columns]
    with _open_text(path) as fh:
        for number, raw_line in enumerate(fh, start=1):
            line = raw_line.rstrip("\r\n")
            if number == 1 and header:
                continue
            if not line.strip():
                continue  # pandas skips blank lines too
            fields = line.split(sep)
            if len(fields) != len(kinds):
                return MalformedDataError(path, number, line,
                                          f"expected {len(kinds)} fields separated by {sep!r}, found {len(fields)}")
            for (name, kind), text in zip(columns, fields):
                problem = _check_value(text, kind)
                if problem:
                    return MalformedDataError(path, number, line, f"field {name!r}: {problem}")
    # The fast parser objected but no single line is at fault (e.g. an encoding problem).
    return MalformedDataError(path, 0, "", f"the file could not be parsed ({detail})")


def _frame(user, item, rating, timestamp, **extra) -> pd.DataFrame:
    """The contract frame: user, item, rating (float64), timestamp (int64), then extras."""
    data = {
        "user": user,
        "item": item,
        "rating": np.asarray(rating, dtype="float64"),
        "timestamp": np.asarray(timestamp, dtype="int64"),
    }
    for name, values in extra.items():
        data[name] = values
    frame = pd.DataFrame(data)
    frame.index = pd.RangeIndex(len(frame))
    return frame


def _no_time(n: int) -> np.ndarray:
    return np.full(n, -1, dtype="int64")


def _result(spec: DatasetSpec, variant: Optional[str], frame: pd.DataFrame, root, notes: Iterable[str],
            status: Optional[str] = None) -> LoadedInteractions:
    return LoadedInteractions(
        dataset=spec.id,
        variant=variant,
        frame=frame,
        status=status or dataset_status(spec, root),
        notes=tuple(notes),
    )


_UIRT = (("user", "int"), ("item", "int"), ("rating", "float"), ("timestamp", "int"))
_UIR = (("user", "int"), ("item", "int"), ("rating", "float"))


def _uirt_frame(path: Path, sep: str, header: "bool | str" = False, **extra) -> pd.DataFrame:
    raw = _read_table(path, sep=sep, columns=_UIRT, header=header)
    return _frame(raw["user"].to_numpy(), raw["item"].to_numpy(), raw["rating"].to_numpy(),
                  raw["timestamp"].to_numpy(), **extra)
