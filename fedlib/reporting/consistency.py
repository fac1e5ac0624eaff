"""Checks that a results folder says what it claims: arithmetic, provenance and paper values.

:func:`check_results_dir` returns a list of human-readable problems (empty when the folder
is consistent). It is run by ``tests/test_results_consistency.py`` over every
``results/<paper>/`` and, table by table, by :func:`~fedlib.reporting.results_tables.write_results_table`
before anything is written.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from fedlib.data.paper_tables import load_paper_table, paper_key_columns
from fedlib.paths import PAPER_SLUGS
from fedlib.reporting.results import (
    PROFILES,
    REQUIRED_COLUMNS,
    RUN_ID_SEPARATOR,
    RunRecord,
    config_hash,
    convert_unit,
    key_columns,
    latest_records,
    read_results_csv,
    read_run_file,
)

RELATIVE_TOLERANCE = 1e-9
ABSOLUTE_TOLERANCE = 1e-12
"""Values are written with Python's exact float repr, so recomputed numbers agree to
rounding error; the tolerance only absorbs a different order of summation."""

AVERAGE_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (("block", "Avg", ("D1", "D2", "D3")),)
"""(column, average label, parts): F3CRec's ``Avg`` block is the mean of blocks D1-D3."""

MAX_PROBLEMS_PER_CHECK = 10
"""Long tables repeat one mistake many times; report the first few and a count."""


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=RELATIVE_TOLERANCE, abs_tol=ABSOLUTE_TOLERANCE)


def _nan(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _describe(row: pd.Series, keys: Sequence[str]) -> str:
    return ", ".join(f"{key}={row[key]}" for key in keys if str(row[key]) != "")


class _Problems:
    """Collects problems, capping repetitions of one kind of problem."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self._counts: dict[str, int] = {}

    def add(self, kind: str, message: str) -> None:
        self._counts[kind] = self._counts.get(kind, 0) + 1
        if self._counts[kind] <= MAX_PROBLEMS_PER_CHECK:
            self.items.append(message)

    def finish(self) -> list[str]:
        for kind, count in self._counts.items():
            if count > MAX_PROBLEMS_PER_CHECK:
                self.items.append(f"... and {count - MAX_PROBLEMS_PER_CHECK} more {kind} problem(s)")
        return self.items


def check_results_table(
    table: pd.DataFrame,
    *,
    table_id: Optional[str] = None,
    expected_profile: Optional[str] = None,
    runs: Optional[Mapping[str, RunRecord]] = None,
    paper: Optional[str] = None,
    compare_paper_tables: bool = True,
) -> list[str]:
    """Problems of one results table (as read by :func:`read_results_csv`).

    * the required columns are present, ``table`` equals ``table_id`` and ``profile``
      equals ``expected_profile``;
    * no two rows share the same keys;
    * ``delta == value_ours - value_paper`` and ``delta_rel == delta / value_paper``, and
      both are empty exactly when they are undefined;
    * a cell without ``value_ours`` has a ``note`` saying why;
    * every ``value_ours`` lists its runs in ``run_ids`` (as many as ``n_seeds``) and, when
      ``runs`` is given, each run exists with the right paper and profile, and the mean of
      its ``run_metric`` (converted from ``ours_unit`` to ``unit``) equals ``value_ours``;
    * averages equal the mean of their parts (:data:`AVERAGE_RULES`);
    * with ``paper`` and ``compare_paper_tables``: ``value_paper`` and ``confidence`` equal
      the current ``paper_tables/<paper>/`` values (tables without a paper table are skipped).
    """
    problems = _Problems()
    missing = [column for column in REQUIRED_COLUMNS if column not in table.columns]
    if missing:
        return [f"missing required column(s) {missing}"]
    keys = key_columns(table)

    if table_id is not None:
        wrong = sorted(set(table["table"]) - {table_id})
        if wrong:
            problems.add("table id", f"rows with table {wrong} in the file of table {table_id!r}")
    if expected_profile is not None:
        wrong = sorted(set(table["profile"]) - {expected_profile})
        if wrong:
            problems.add("profile", f"rows labelled profile {wrong} in a {expected_profile!r} results folder")

    duplicated = table[table.duplicated(keys, keep=False)]
    for _, row in duplicated.drop_duplicates(keys).iterrows():
        problems.add("duplicate", f"duplicated key ({_describe(row, keys)})")

    for _, row in table.iterrows():
        _check_row_arithmetic(row, keys, problems)
        _check_row_provenance(row, keys, runs, paper, problems)

    _check_averages(table, keys, problems)
    if paper is not None and compare_paper_tables and paper in PAPER_SLUGS:
        ids = sorted(set(table["table"]))
        if len(ids) == 1:
            _check_against_paper_table(table, paper, ids[0], keys, problems)
    return problems.finish()


def _check_row_arithmetic(row: pd.Series, keys: Sequence[str], problems: _Problems) -> None:
    where = _describe(row, keys)
    paper_value, ours, delta, delta_rel = row["value_paper"], row["value_ours"], row["delta"], row["delta_rel"]
    if _nan(paper_value) or _nan(ours):
        if not _nan(delta):
            problems.add("delta", f"({where}): delta {delta!r} given although a value is empty")
    elif _nan(delta) or not _close(delta, ours - paper_value):
        problems.add("delta", f"({where}): delta {delta!r} != value_ours - value_paper = {ours - paper_value!r}")
    if _nan(delta) or _nan(paper_value) or paper_value == 0:
        if not _nan(delta_rel):
            problems.add("delta_rel", f"({where}): delta_rel {delta_rel!r} given although it is undefined")
    elif _nan(delta_rel) or not _close(delta_rel, delta / paper_value):
        problems.add("delta_rel", f"({where}): delta_rel {delta_rel!r} != delta / value_paper = {delta / paper_value!r}")
    if _nan(ours) and not str(row["note"]).strip():
        problems.add("note", f"({where}): empty value_ours without a note saying why")


def _check_row_provenance(
    row: pd.Series,
    keys: Sequence[str],
    runs: Optional[Mapping[str, RunRecord]],
    paper: Optional[str],
    problems: _Problems,
) -> None:
    if _nan(row["value_ours"]):
        return
    where = _describe(row, keys)
    run_ids = [run_id for run_id in str(row["run_ids"]).split(RUN_ID_SEPARATOR) if run_id]
    if not run_ids:
        problems.add("run_ids", f"({where}): value_ours {row['value_ours']!r} has no run_ids")
        return
    if int(row["n_seeds"]) != len(run_ids):
        problems.add("n_seeds", f"({where}): n_seeds = {row['n_seeds']} but {len(run_ids)} run id(s)")
    if runs is None:
        return
    records = []
    for run_id in run_ids:
        record = runs.get(run_id)
        if record is None:
            problems.add("run record", f"({where}): run {run_id} is not in runs.jsonl")
            continue
        if record.profile != row["profile"]:
            problems.add("run record", f"({where}): run {run_id} ran at profile {record.profile!r}, not {row['profile']!r}")
        if paper is not None and record.paper != paper:
            problems.add("run record", f"({where}): run {run_id} belongs to paper {record.paper!r}")
        records.append(record)
    metric = str(row.get("run_metric", "") or "")
    if not metric or len(records) != len(run_ids):
        return
    values = []
    for record in records:
        if metric not in record.metrics:
            problems.add("run metric", f"({where}): run {record.config_hash} has no metric {metric!r}")
            return
        raw = record.metrics[metric]
        values.append(math.nan if raw is None else float(raw))
    unit = str(row.get("unit", "") or "")
    ours_unit = str(row.get("ours_unit", "") or "") or unit
    try:
        expected = float(convert_unit(float(np.asarray(values, dtype=float).mean()), ours_unit, unit))
    except ValueError as error:
        problems.add("unit", f"({where}): {error}")
        return
    if math.isnan(expected) or not _close(float(row["value_ours"]), expected):
        problems.add(
            "run value",
            f"({where}): value_ours {row['value_ours']!r} != mean of {metric!r} over its runs "
            f"({expected!r} in {unit or 'its unit'})",
        )


def _check_averages(table: pd.DataFrame, keys: Sequence[str], problems: _Problems) -> None:
    for column, average_label, parts in AVERAGE_RULES:
        if column not in table.columns:
            continue
        group_keys = [key for key in keys if key != column]
        for _, group in table.groupby(group_keys, sort=False, dropna=False):
            by_label = {label: value for label, value in zip(group[column], group["value_ours"])}
            average = by_label.get(average_label)
            part_values = [by_label.get(part) for part in parts]
            if _nan(average) or any(_nan(value) for value in part_values):
                continue
            expected = float(np.mean(part_values))
            if not _close(float(average), expected):
                row = group.iloc[0]
                problems.add(
                    "average",
                    f"({_describe(row, group_keys)}): {column}={average_label} value_ours {average!r} "
                    f"!= mean of {', '.join(parts)} = {expected!r}",
                )


def _check_against_paper_table(
    table: pd.DataFrame, paper: str, table_id: str, keys: Sequence[str], problems: _Problems
) -> None:
    try:
        reference = load_paper_table(paper, table_id)
    except (KeyError, FileNotFoundError):
        return  # a table of our own (a figure's data, an audit) has no paper counterpart
    match_keys = [key for key in paper_key_columns(reference) if key != "paper"]
    absent = [key for key in match_keys if key not in table.columns]
    if absent:
        problems.add("paper table", f"cannot match rows to paper_tables/{paper}/{table_id}: missing key column(s) {absent}")
        return
    lookup = {
        tuple(str(row[key]) for key in match_keys): (row["value"], row["confidence"]) for _, row in reference.iterrows()
    }
    for _, row in table.iterrows():
        found = lookup.get(tuple(str(row[key]) for key in match_keys))
        where = _describe(row, keys)
        if found is None:
            if not _nan(row["value_paper"]):
                problems.add("paper table", f"({where}): value_paper {row['value_paper']!r} is not in paper_tables/{paper}")
            continue
        value, confidence = found
        if _nan(value) != _nan(row["value_paper"]) or (not _nan(value) and not _close(value, row["value_paper"])):
            problems.add("paper value", f"({where}): value_paper {row['value_paper']!r} but paper_tables has {value!r}")
        if str(row["confidence"]) != str(confidence):
            problems.add("paper value", f"({where}): confidence {row['confidence']!r} but paper_tables has {confidence!r}")


def check_run_records(records: Sequence[RunRecord], *, paper: Optional[str], profile: str) -> list[str]:
    """Problems of a ``runs.jsonl``: wrong paper/profile, or a hash that is not its config's."""
    problems = _Problems()
    for number, record in enumerate(records, start=1):
        if record.profile != profile:
            problems.add("run profile", f"runs.jsonl record {number}: profile {record.profile!r} in a {profile!r} folder")
        if paper is not None and record.paper != paper:
            problems.add("run paper", f"runs.jsonl record {number}: paper {record.paper!r} in the folder of {paper!r}")
        try:
            recomputed = config_hash(record.config)
        except TypeError as error:
            problems.add("run hash", f"runs.jsonl record {number}: config cannot be hashed ({error})")
            continue
        if recomputed != record.config_hash:
            problems.add("run hash", f"runs.jsonl record {number}: config_hash {record.config_hash} != hash of its config {recomputed}")
        if record.config.get("seed") != record.seed:
            problems.add("run seed", f"runs.jsonl record {number}: seed {record.seed} != config seed {record.config.get('seed')!r}")
    return problems.finish()


def check_results_dir(paper_dir: str | Path, *, compare_paper_tables: bool = True) -> list[str]:
    """Problems of every ``*.csv`` in ``paper_dir`` and of its ``runs.jsonl``.

    ``paper_dir`` is ``results/<paper>/`` (profile ``paper``) or one of its ``quick/`` or
    ``smoke/`` sub-folders; sub-folders are not descended into. The folder name gives the
    paper slug; under an unknown name the paper-specific checks are skipped.
    """
    directory = Path(paper_dir)
    if not directory.is_dir():
        return [f"{directory} is not a directory"]
    if directory.name in PROFILES and directory.name != "paper":
        profile, slug = directory.name, directory.parent.name
    else:
        profile, slug = "paper", directory.name
    paper = slug if slug in PAPER_SLUGS else None

    problems: list[str] = []
    try:
        records = read_run_file(directory / "runs.jsonl")
    except ValueError as error:
        problems.append(str(error))
        records = []
    problems.extend(check_run_records(records, paper=paper, profile=profile))
    runs = latest_records(records)

    for path in sorted(directory.glob("*.csv")):
        try:
            table = read_results_csv(path)
        except (ValueError, pd.errors.ParserError) as error:
            problems.append(f"{path.name}: cannot be read ({error})")
            continue
        for problem in check_results_table(
            table,
            table_id=path.stem,
            expected_profile=profile,
            runs=runs,
            paper=paper,
            compare_paper_tables=compare_paper_tables,
        ):
            problems.append(f"{path.name}: {problem}")
    return problems
