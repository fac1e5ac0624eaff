"""The numbers the papers report, as tidy tables (``paper_tables/<paper>/*.csv``).

Read-only reference input, like the datasets: the data layer compares its dataset statistics
with them (:mod:`fedlib.data.stats`) and :mod:`fedlib.reporting` puts our results beside them
(``fedlib.reporting.load_paper_table`` is this module's :func:`load_paper_table`).

Each CSV holds one table of one paper, one row per reported number; its layout is
described in ``paper_tables/README.md``. A table is addressed by its id, the value of its
``table`` column, which is also the file name up to the first underscore
(``table1_data_blocks.csv`` is ``table1``, ``text_claims.csv`` is ``text``).
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from fedlib.paths import PAPER_SLUGS, project_root

PAPER_VALUE_COLUMNS = (
    "value",
    "unit",
    "printed",
    "marker",
    "confidence",
    "value_source",
    "note",
    "metric_as_printed",
)
"""Columns of a paper table that describe a number rather than identify it."""

CONFIDENCE_LEVELS = ("high", "reconstructed", "uncertain")
"""Transcription confidence of a paper cell (see ``paper_tables/README.md``)."""


def paper_tables_dir(paper: str) -> Path:
    """``paper_tables/<paper>/`` in the project checkout."""
    if paper not in PAPER_SLUGS:
        raise ValueError(f"unknown paper slug {paper!r}; expected one of {', '.join(PAPER_SLUGS)}")
    return project_root() / "paper_tables" / paper


def _table_files(paper: str) -> dict[str, Path]:
    """Table id -> CSV file, for every table of ``paper``."""
    directory = paper_tables_dir(paper)
    if not directory.is_dir():
        raise FileNotFoundError(f"no paper tables for {paper!r}: {directory} does not exist")
    files: dict[str, Path] = {}
    for path in sorted(directory.glob("*.csv")):
        table_id = path.stem.split("_", 1)[0]
        if table_id in files:
            raise ValueError(f"two CSVs claim table id {table_id!r}: {files[table_id].name} and {path.name}")
        files[table_id] = path
    return files


def list_paper_tables(paper: str) -> list[str]:
    """Ids of every table of ``paper``, e.g. ``['table1', 'table2', ..., 'text']``."""
    return list(_table_files(paper))


def paper_table_path(paper: str, table_id: str) -> Path:
    """The CSV holding ``table_id`` of ``paper``; the full file stem is accepted too."""
    files = _table_files(paper)
    if table_id in files:
        return files[table_id]
    for path in files.values():
        if path.stem == table_id:
            return path
    available = ", ".join(f"{tid} ({path.name})" for tid, path in files.items())
    raise KeyError(f"paper {paper!r} has no table {table_id!r}; available tables: {available}")


def load_paper_table(paper: str, table_id: str) -> pd.DataFrame:
    """The reported numbers of one paper table, one row per number.

    Identifying columns are strings, with ``""`` where a key does not apply (for example an
    empty ``method`` in a dataset-statistics table). ``value`` is a float, NaN where the
    paper prints no number (out-of-memory cells). Values are parsed with Python's
    ``float`` so that they round-trip exactly through our own results files.
    """
    path = paper_table_path(paper, table_id)
    # keep_default_na=False: dataset or method names such as "NA" must stay text.
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    if "value" not in table.columns or "table" not in table.columns:
        raise ValueError(f"{path} lacks a 'value' or 'table' column; see paper_tables/README.md")
    table["value"] = [float(text) if text.strip() else math.nan for text in table["value"]]
    declared = set(table["table"])
    resolved_id = path.stem.split("_", 1)[0]
    if declared != {resolved_id}:
        raise ValueError(f"{path.name}: its 'table' column holds {sorted(declared)}, expected {resolved_id!r}")
    return table


def paper_key_columns(table: pd.DataFrame) -> list[str]:
    """The columns that identify a cell of a paper table (unique per file), in file order."""
    return [column for column in table.columns if column not in PAPER_VALUE_COLUMNS]
