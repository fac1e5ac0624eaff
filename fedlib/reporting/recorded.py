"""The lessons' view of a recorded results table: its flags, and its deviations grouped by reason.

One definition for every paper, so that a flag or a deviation summary means the same in each lesson:

* :func:`with_flags` / :func:`recorded_table`: a ``flags`` column for
  :func:`~fedlib.reporting.display.paper_grid`, read from the row and from the runs behind it
  (:data:`FLAG_ORDER`);
* :func:`recorded_deviations`: :func:`~fedlib.reporting.display.deviations` over several tables
  stacked (a paper's ``(match, reason)`` rules, first match wins, raises on a deviating cell
  without a reason);
* :func:`deviations_by_reason`: those cells grouped by reason, every cell named, none dropped.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence, Union

import pandas as pd

from fedlib.reporting.display import MODERATE, deviations
from fedlib.reporting.flags import FLAG_ORDER, FlagRules, add_flags
from fedlib.reporting.results import read_runs
from fedlib.reporting.results_tables import read_results_table

__all__ = ["FLAG_ORDER", "with_flags", "recorded_table", "recorded_deviations", "deviations_by_reason"]


def _text(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def with_flags(frame: pd.DataFrame, records=(), *, at_cap_exempt: Mapping[str, Sequence[Any]] = {},
               rules: Optional[FlagRules] = None) -> pd.DataFrame:
    """``frame`` (rows of a results table) with a ``flags`` column (:data:`FLAG_ORDER`).

    Args:
        frame: rows with ``value_ours`` and optionally ``n_seeds``, ``note``, ``commit``,
            ``run_ids`` (run config hashes joined by ``;``) and ``flags`` (a written table's
            flags, kept); an absent column raises no flag.
        records: the run records behind ``run_ids`` (``read_runs(paper, profile)``); the
            run-level flags (``diverged``, ``at_cap``, ``grid_edge``, a run's ``dirty``) need them.
        at_cap_exempt: config key -> values whose runs are never ``at_cap``, e.g.
            ``{"method": ["Centralized"]}`` (trained for a fixed number of epochs, not rounds).
        rules: the paper's :class:`~fedlib.reporting.flags.FlagRules` (replaces ``at_cap_exempt``).
    """
    return add_flags(frame, records, rules if rules is not None else FlagRules(at_cap_exempt=at_cap_exempt))


def recorded_table(paper: str, table_id: str, profile: str = "paper", *, records=None,
                   at_cap_exempt: Mapping[str, Sequence[Any]] = {}) -> pd.DataFrame:
    """``results/<paper>[/<profile>]/<table_id>.csv`` with a ``flags`` column (:func:`with_flags`).

    ``records``: the runs of ``paper`` at ``profile`` (read from its ``runs.jsonl`` when ``None``).
    Empty key cells read as ``""`` (:func:`~fedlib.reporting.results_tables.read_results_table`).
    """
    records = read_runs(paper, profile) if records is None else records
    return with_flags(read_results_table(paper, table_id, profile), records, at_cap_exempt=at_cap_exempt)


def recorded_deviations(frames: Union[Sequence[pd.DataFrame], Mapping[Any, pd.DataFrame]],
                        reasons: Sequence[tuple], keys: Sequence[str], *, threshold: float = MODERATE) -> pd.DataFrame:
    """Every cell of ``frames`` more than ``threshold`` from the paper, with its reason.

    The frames are stacked; a key or rule column a frame lacks reads ``""`` there (a rule on it
    then does not match that frame's rows). Returns :func:`~fedlib.reporting.display.deviations`:
    one row per deviating cell, ``keys``, ``ours``, ``paper``, ``Δ %`` and ``reason``, largest
    deviation first; raises ``ValueError`` when a deviating cell matches no rule.
    """
    parts = list(frames.values()) if isinstance(frames, Mapping) else list(frames)
    if not parts:
        raise ValueError("recorded_deviations: give at least one table")
    stacked = pd.concat(parts, ignore_index=True)
    named = list(dict.fromkeys([*keys, *(column for rule, _ in reasons for column in rule)]))
    for column in named:
        stacked[column] = stacked[column].map(_text) if column in stacked.columns else ""
    return deviations(stacked, list(reasons), list(keys), threshold=threshold)


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def deviations_by_reason(found: pd.DataFrame, keys: Sequence[str], *, by: Sequence[str] = (),
                         detail: Optional[str] = "metric", max_named: Optional[int] = None) -> pd.DataFrame:
    """The cells of :func:`recorded_deviations` (or ``deviations``) grouped by reason, none dropped.

    Args:
        found: one row per deviating cell, with ``keys``, ``ours``, ``paper``, ``Δ %``, ``reason``.
        keys: the columns that name a cell (their non-empty values, joined by spaces; the
            ``by`` columns are named once, in their own columns).
        by: columns to group by before the reason (``["table", "dataset"]``: one line per
            table, dataset and reason).
        detail: a key whose cells of one otherwise equal name are listed together
            (``table1 FilmTrust FedMF: R@10 43.31 (31.05), N@10 ...``); ``None``: each cell alone.
        max_named: name at most this many cells (names) per group, the largest deviations,
            then "… and N more"; every cell is still counted in ``cells`` and in its ``Δ %``
            range, and listed in ``found`` (``None``: name them all).

    Returns:
        One row per ``(*by, reason)``, sorted by ``by`` and then in order of first appearance
        (the largest deviation first): ``by``, ``reason``,
        ``cells`` (how many), ``Δ % from`` / ``Δ % to`` (the range of their relative
        deviation, percent) and ``ours (paper)``: every cell named with our value and the
        paper's in brackets, ``; ``-separated.
    """
    if max_named is not None and (isinstance(max_named, bool) or not isinstance(max_named, int) or max_named < 1):
        raise ValueError(f"deviations_by_reason: max_named is a positive number of cells or None, got {max_named!r}")
    absent = [k for k in [*keys, *by, "ours", "paper", "Δ %", "reason"] if k not in found.columns]
    if absent:
        raise ValueError(f"deviations_by_reason: the deviations have no column(s) {absent}; "
                         "give the output of recorded_deviations (or fedlib.reporting.deviations)")
    names = [k for k in keys if k != detail and k not in by]
    columns = [*by, "reason", "cells", "Δ % from", "Δ % to", "ours (paper)"]
    rows = []
    for group_keys, part in found.groupby([*by, "reason"], sort=False, dropna=False):
        group_keys = group_keys if isinstance(group_keys, tuple) else (group_keys,)
        cells = []
        for where, cell in part.groupby(names, sort=False, dropna=False) if names else [((), part)]:
            where = where if isinstance(where, tuple) else (where,)
            label = " ".join(_text(w) for w in where if _text(w))
            values = ", ".join(" ".join(p for p in (_text(r[detail]) if detail in keys else "",
                                                    f"{_number(r['ours'])} ({_number(r['paper'])})") if p)
                               for _, r in cell.iterrows())
            cells.append(f"{label}: {values}" if label else values)
        if max_named is not None and len(cells) > max_named:
            cells = [*cells[:max_named], f"… and {len(cells) - max_named} more"]
        rows.append({**dict(zip([*by, "reason"], group_keys)), "cells": len(part), "Δ % from": part["Δ %"].min(),
                     "Δ % to": part["Δ %"].max(), "ours (paper)": "; ".join(cells)})
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values(list(by), kind="stable", ignore_index=True) if by else frame
