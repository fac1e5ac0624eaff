"""The committed results tables ``results/<paper>/<table_id>.csv``: where they live, the
validated write and the read.

A results table holds one row per number of a paper table (schema and provenance columns:
:mod:`fedlib.reporting.results`). :func:`write_results_table` checks a table with
:mod:`fedlib.reporting.consistency` before it writes it; this is why it sits in its own module
above both (``results`` <- ``consistency`` <- ``results_tables``) rather than in
:mod:`fedlib.reporting.results`, which the consistency checks themselves import.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import pandas as pd

from fedlib.data.paper_tables import load_paper_table
from fedlib.paths import results_dir
from fedlib.reporting._atomic import atomic_writer
from fedlib.reporting.consistency import check_results_table
from fedlib.reporting.flags import FlagRules, add_flags
from fedlib.reporting.results import (
    FLOAT_COLUMNS,
    REQUIRED_COLUMNS,
    _text,
    check_profile,
    check_slug,
    latest_records,
    order_columns,
    read_results_csv,
    read_run_file,
)

__all__ = ["results_table_path", "write_results_table", "read_results_table", "recorded_or_none"]


def results_table_path(paper: str, table_id: str, profile: str) -> Path:
    """``results_dir(paper, profile)/<table_id>.csv``."""
    return results_dir(paper, check_profile(profile)) / f"{check_slug(table_id, 'table id')}.csv"


def write_results_table(
    paper: str, table_id: str, df: pd.DataFrame, profile: str, *, validate: bool = True,
    flag_rules: Optional[FlagRules] = None,
) -> Path:
    """Write a paper-vs-ours table to ``results_dir(paper, profile)/<table_id>.csv``.

    Refuses to write when a required column is missing, when the frame's ``table`` column
    is not ``table_id``, or when its ``profile`` column disagrees with ``profile``: a
    frame labelled ``paper`` can only be written by a ``paper``-profile run, and a
    quick/smoke frame can only go to its own sub-folder, never over a recorded table.

    With ``validate`` (the default) the table must also pass the consistency checks of
    :func:`fedlib.reporting.consistency.check_results_table`, including the run records
    behind every ``value_ours``, so a bad table fails here rather than in CI.

    The ``flags`` column is computed here from the rows and the runs behind them
    (:func:`~fedlib.reporting.flags.add_flags` with the paper's ``flag_rules``; flags the frame
    already carries are kept), so every written table says which of its values to read with care.

    The file is written to a temporary name and renamed into place: an interrupted write
    leaves the previous file (or none), never a partial one. Returns the path.
    """
    check_profile(profile)
    path = results_table_path(paper, table_id, profile)
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"results table {table_id!r} lacks required column(s) {missing}")
    if df.empty:
        raise ValueError(f"results table {table_id!r} has no rows")
    labels = set(df["profile"].astype(str))
    if labels != {profile}:
        raise PermissionError(
            f"refusing to write {table_id!r} of {paper!r} at profile {profile!r}: its rows are "
            f"labelled {sorted(labels)}; only a paper-profile run writes results/{paper}/{table_id}.csv"
        )
    table_ids = set(df["table"].astype(str))
    if table_ids != {table_id}:
        raise ValueError(f"rows of {table_id}.csv must have table == {table_id!r}, found {sorted(table_ids)}")

    runs = latest_records(read_run_file(path.parent / "runs.jsonl"))
    df = add_flags(df.reset_index(drop=True), runs.values(), flag_rules if flag_rules is not None else FlagRules())
    table = order_columns(df.copy())
    for column in FLOAT_COLUMNS:
        if column in table.columns:
            table[column] = pd.to_numeric(table[column], errors="raise").astype(float)
    table["n_seeds"] = pd.to_numeric(table["n_seeds"], errors="raise").fillna(0).astype(int)
    for column in table.columns:
        if column not in FLOAT_COLUMNS and column != "n_seeds":
            table[column] = table[column].map(_text)

    if validate:
        problems = check_results_table(
            table,
            table_id=table_id,
            expected_profile=profile,
            runs=runs,
            paper=paper,
        )
        if problems:
            listed = "\n  ".join(problems[:20])
            raise ValueError(f"results table {paper}/{table_id} at profile {profile!r} is inconsistent:\n  {listed}")

    with atomic_writer(path) as handle:
        table.to_csv(handle, index=False, lineterminator="\n")
    return path


def read_results_table(paper: str, table_id: str, profile: str = "paper") -> pd.DataFrame:
    """A written results table; ``attrs['recorded']`` is True for the ``paper`` profile.

    :func:`fedlib.reporting.display.paper_vs_ours` uses ``attrs`` to label its columns
    "ours (recorded, paper profile)" rather than "ours (live, ...)".
    """
    path = results_table_path(paper, table_id, profile)
    if not path.exists():
        raise FileNotFoundError(f"no results table {path} (has the {profile!r} profile been run for {paper}?)")
    table = read_results_csv(path)
    table.attrs.update({"recorded": profile == "paper", "profile": profile, "path": str(path)})
    return table


def recorded_or_none(paper: str, table_id: str) -> Optional[pd.DataFrame]:
    """The recorded paper-profile table, or ``None`` when the paper profile has not been run.

    Quick and smoke notebooks show it next to their live numbers; it is read-only here.
    ``table_id`` may also be the name of a ``paper_tables`` file (``table1_main``): results
    files carry the paper's own table id (``table1.csv``), read from that file's ``table`` column.
    """
    try:
        return read_results_table(paper, table_id, "paper")
    except FileNotFoundError:
        pass
    try:
        short = str(load_paper_table(paper, table_id)["table"].iloc[0])
    except (FileNotFoundError, KeyError, ValueError, IndexError):
        return None
    if short == table_id:
        return None
    try:
        return read_results_table(paper, short, "paper")
    except FileNotFoundError:
        return None
