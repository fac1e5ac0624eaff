"""Paper and ours side by side, for notebooks.

:func:`paper_vs_ours` turns a results table (live, recorded, or both) into one row per
paper cell with the paper's value, ours and the delta next to each other. Three rules:

* a paper number only ever appears in the ``paper`` column; an "ours" column shows our
  value or, for a cell we could not produce, a dash and the reason ("dataset needs
  download"), never the paper's number;
* paper cells transcribed with confidence ``uncertain`` or ``reconstructed`` carry a
  ``†`` and the legend explains it;
* every "ours" column says where its numbers come from: ``ours (live, quick)`` for this
  run, ``ours (recorded, paper profile)`` for the committed ``results/<paper>/`` table.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import pandas as pd

from fedlib.reporting.results import key_columns

PAPER_SOURCE = "paper"
RECORDED_SOURCE = "ours (recorded, paper profile)"
FLAGGED_CONFIDENCE = ("uncertain", "reconstructed")
FLAG = "†"
LEGEND = (
    f"{FLAG} paper value transcribed with confidence 'uncertain' or 'reconstructed' "
    "(see paper_tables/README.md). Δ = ours − paper in the paper's unit, relative change in "
    "brackets. 'recorded' = committed paper-profile results; 'live' = this run."
)
_DECIMALS = {"fraction": 4, "percent": 2, "count": 0}
_ALWAYS_SHOWN_KEYS = ("dataset", "method", "metric")


def live_source(profile: str) -> str:
    """Label of numbers computed by the running notebook, e.g. ``ours (live, quick)``."""
    return f"ours (live, {profile})"


def source_label(table: pd.DataFrame, *, recorded: Optional[bool] = None) -> str:
    """The "ours" label of a results table.

    ``recorded`` defaults to ``table.attrs['recorded']``, which
    :func:`~fedlib.reporting.results.read_results_table` sets for paper-profile files.
    """
    profiles = sorted(set(table["profile"].astype(str)))
    if len(profiles) != 1:
        raise ValueError(f"a results table has one profile; this one has {profiles}")
    profile = profiles[0]
    if recorded is None:
        recorded = bool(table.attrs.get("recorded", False))
    if recorded:
        if profile != "paper":
            raise ValueError(f"only paper-profile tables are recorded; this one is {profile!r}")
        return RECORDED_SOURCE
    return live_source(profile)


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value == ""


def comparison_long(
    live: Optional[pd.DataFrame] = None,
    recorded: Optional[pd.DataFrame] = None,
) -> pd.DataFrame:
    """One row per (cell, source): the keys, ``source``, ``value``, ``delta``, ``delta_rel``.

    ``source`` is ``paper`` for the paper's number (with its ``confidence``), and the
    frame's :func:`source_label` for ours. ``live`` is labelled by its ``attrs`` like
    ``recorded`` is, so passing a recorded table as the only argument is labelled right.
    """
    frames = []
    if live is not None:
        frames.append((source_label(live), live))
    if recorded is not None:
        frames.append((source_label(recorded, recorded=True), recorded))
    if not frames:
        raise ValueError("give at least one results table")
    labels = [label for label, _ in frames]
    if len(set(labels)) != len(labels):
        raise ValueError(f"two tables with the same source {labels[0]!r}")

    keys = key_columns(frames[0][1])
    for label, frame in frames[1:]:
        absent = [key for key in keys if key not in frame.columns]
        if absent:
            raise ValueError(f"{label} lacks key column(s) {absent} of the other table")

    rows: list[dict] = []
    paper_seen: dict[tuple, float] = {}
    for label, frame in frames:
        for _, row in frame.iterrows():
            identity = tuple(str(row[key]) for key in keys)
            base = {key: row[key] for key in keys}
            unit = str(row.get("unit", "") or "")
            if identity not in paper_seen:
                paper_seen[identity] = row["value_paper"]
                rows.append(
                    {
                        **base,
                        "source": PAPER_SOURCE,
                        "value": row["value_paper"],
                        "delta": math.nan,
                        "delta_rel": math.nan,
                        "unit": unit,
                        "confidence": row["confidence"],
                        "note": "",
                    }
                )
            rows.append(
                {
                    **base,
                    "source": label,
                    "value": row["value_ours"],
                    "delta": row["delta"],
                    "delta_rel": row["delta_rel"],
                    "unit": unit,
                    "confidence": "",
                    "note": str(row.get("note", "") or ""),
                }
            )
    return pd.DataFrame(rows)


def _format_number(value: Any, unit: str) -> str:
    if _is_missing(value):
        return ""
    decimals = _DECIMALS.get(unit)
    return f"{value:.{decimals}f}" if decimals is not None else f"{value:.4g}"


def _format_delta(delta: Any, delta_rel: Any, unit: str) -> str:
    if _is_missing(delta):
        return ""
    decimals = _DECIMALS.get(unit)
    text = f"{delta:+.{decimals}f}" if decimals is not None else f"{delta:+.4g}"
    if not _is_missing(delta_rel):
        text += f" ({delta_rel:+.1%})"
    return text


def paper_vs_ours(
    live: Optional[pd.DataFrame] = None,
    recorded: Optional[pd.DataFrame] = None,
    *,
    styled: bool = True,
):
    """A display table: keys, ``paper``, then ``ours (...)`` and ``Δ (...)`` per source.

    ``live`` is the table this notebook run produced (:func:`compare_with_paper`);
    ``recorded`` the committed paper-profile table (:func:`recorded_or_none`; ``None`` is
    fine). Returns a pandas ``Styler`` with the legend as caption, or, with
    ``styled=False`` or without jinja2, a plain DataFrame of display strings whose
    ``attrs['legend']`` holds the legend.
    """
    long = comparison_long(live, recorded)
    sources = [source for source in dict.fromkeys(long["source"]) if source != PAPER_SOURCE]
    keys = [column for column in long.columns if column not in ("source", "value", "delta", "delta_rel", "unit", "confidence", "note")]
    # Keys that say nothing (one value for the whole table, or empty) go to the caption.
    shown_keys = [
        key for key in keys if key in _ALWAYS_SHOWN_KEYS or long[key].astype(str).nunique() > 1
    ]
    constant = {key: str(long[key].iloc[0]) for key in keys if key not in shown_keys and str(long[key].iloc[0])}

    cells: dict[tuple, dict] = {}
    missing_cells: list[tuple[tuple, str]] = []
    for _, row in long.iterrows():
        identity = tuple(str(row[key]) for key in keys)
        cell = cells.setdefault(identity, {key: row[key] for key in shown_keys})
        unit = row["unit"]
        if row["source"] == PAPER_SOURCE:
            text = _format_number(row["value"], unit) or "—"
            if str(row["confidence"]) in FLAGGED_CONFIDENCE:
                text += FLAG
            cell[PAPER_SOURCE] = text
            continue
        delta_column = "Δ" + row["source"][len("ours"):]
        if _is_missing(row["value"]):
            # Never fall back to the paper's number: say why ours is absent.
            cell[row["source"]] = f"— ({row['note']})" if row["note"] else "—"
            missing_cells.append((identity, row["source"]))
        else:
            cell[row["source"]] = _format_number(row["value"], unit)
        cell[delta_column] = _format_delta(row["delta"], row["delta_rel"], unit)

    columns = shown_keys + [PAPER_SOURCE]
    for source in sources:
        columns += [source, "Δ" + source[len("ours"):]]
    table = pd.DataFrame(list(cells.values())).reindex(columns=columns).fillna("")
    caption = "; ".join(f"{key} = {value}" for key, value in constant.items())
    legend = f"{caption}. {LEGEND}" if caption else LEGEND
    table.attrs["legend"] = legend
    if not styled:
        return table
    try:
        styler = table.style
    except ImportError:  # pandas' Styler needs jinja2
        return table

    order = list(cells)
    missing_positions = {(order.index(identity), source) for identity, source in missing_cells}

    def css(frame: pd.DataFrame) -> pd.DataFrame:
        styles = pd.DataFrame("", index=frame.index, columns=frame.columns)
        for position, source in missing_positions:
            styles.iloc[position, frame.columns.get_loc(source)] = "color: #777; font-style: italic"
        flagged = frame[PAPER_SOURCE].str.endswith(FLAG)
        styles.loc[flagged, PAPER_SOURCE] = "font-style: italic"
        return styles

    return styler.hide(axis="index").set_caption(legend).apply(css, axis=None)
