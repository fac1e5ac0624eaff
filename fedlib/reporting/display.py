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
    :func:`~fedlib.reporting.results_tables.read_results_table` sets for paper-profile files.
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


# --------------------------------------------------------------------------------------
# The paper's own layout: one cell per paper cell, "ours (paper)", coloured by the delta.
# --------------------------------------------------------------------------------------

FLAG_MARKS = {
    "at_cap": "ᶜ",
    "grid_edge": "ᵉ",
    "one_seed": "¹",
    "diverged": "ˣ",
    "dirty": "ᵈ",
    "substitute": "ˢ",
}
"""Superscript marks of the flags a results row may carry (``flags`` column, ``;``-separated)."""
FLAG_WORDS = {
    "at_cap": "selected its last allowed round (may be undertrained)",
    "grid_edge": "tuned value at the edge of its grid",
    "one_seed": "one seed",
    "diverged": "training diverged",
    "dirty": "recorded from a tree with uncommitted changes",
    "substitute": "substitute data or protocol",
}
CLOSE, MODERATE = 0.05, 0.20
"""|Δ| / paper up to 5 % is shaded green, up to 20 % amber, beyond that red."""
_SHADES = {"close": "background-color: #e3f2e6", "moderate": "background-color: #fff1cc",
           "far": "background-color: #fbdcd8", "missing": "color: #777; font-style: italic"}


def _flag_list(value: Any) -> list[str]:
    if _is_missing(value):
        return []
    return [flag.strip() for flag in str(value).replace(",", ";").split(";") if flag.strip()]


def _closeness(delta_rel: Any) -> str:
    if _is_missing(delta_rel):
        return "missing"
    size = abs(float(delta_rel))
    return "close" if size <= CLOSE else "moderate" if size <= MODERATE else "far"


def paper_grid(
    frame: pd.DataFrame,
    rows: list[str] | str,
    columns: list[str] | str,
    *,
    decimals: int = 2,
    caption: Optional[str] = None,
    row_order: Optional[list] = None,
    column_order: Optional[list] = None,
    styled: bool = True,
):
    """A results table in the paper's layout: each cell ``ours (paper)``, shaded by the delta.

    Args:
        frame: tidy results, one row per paper cell, with ``value_ours``, ``value_paper``,
            ``delta_rel`` and optionally ``flags`` and ``note`` (a ``results/<paper>/*.csv``
            table, filtered to one paper table).
        rows, columns: key columns that become the table's rows and columns, e.g.
            ``rows="method"``, ``columns=["dataset", "metric"]``.
        decimals: digits after the point, in the paper's unit.
        caption: what the table is; the colour and flag legends are appended.
        row_order, column_order: the paper's order of row / column labels (default: first
            appearance in ``frame``).
        styled: ``False`` returns the DataFrame of cell texts.

    A cell we could not produce reads ``— (paper)`` in grey; a paper value that does not
    exist reads ``ours (—)``. Flags (``at_cap``, ``one_seed``, ...) add superscript marks
    that the caption explains. Raises ``ValueError`` when two rows of ``frame`` fall on the
    same cell (filter to one table, one sampler, ... first).
    """
    rows = [rows] if isinstance(rows, str) else list(rows)
    columns = [columns] if isinstance(columns, str) else list(columns)
    absent = [key for key in rows + columns + ["value_ours", "value_paper"] if key not in frame.columns]
    if absent:
        raise ValueError(f"paper_grid: the table has no column(s) {absent}; it has {list(frame.columns)}")
    if frame.empty:
        raise ValueError("paper_grid: the table has no rows; the filter before it matched nothing "
                         "(check the key values, and that empty keys read as '' rather than NaN)")
    duplicated = frame.duplicated(rows + columns, keep=False)
    if duplicated.any():
        example = frame.loc[duplicated, rows + columns].head(3).to_dict(orient="records")
        raise ValueError(f"paper_grid: several rows fall on one cell of {rows} x {columns}, e.g. {example}; "
                         "filter the table first (one paper table, one sampler, one dimension ...)")

    def label(record, keys):
        values = tuple(record[key] for key in keys)
        return values[0] if len(values) == 1 else values

    texts: dict = {}
    shades: dict = {}
    flags_seen: set[str] = set()
    for _, record in frame.iterrows():
        r, c = label(record, rows), label(record, columns)
        ours, paper = record["value_ours"], record["value_paper"]
        ours_text = "—" if _is_missing(ours) else f"{float(ours):.{decimals}f}"
        paper_text = "—" if _is_missing(paper) else f"{float(paper):.{decimals}f}"
        marks = "".join(FLAG_MARKS.get(flag, "*") for flag in _flag_list(record.get("flags")))
        flags_seen.update(_flag_list(record.get("flags")))
        texts[(r, c)] = f"{ours_text}{marks} ({paper_text})"
        delta_rel = record.get("delta_rel")
        if _is_missing(delta_rel) and not _is_missing(ours) and not _is_missing(paper) and float(paper) != 0:
            delta_rel = (float(ours) - float(paper)) / float(paper)
        shades[(r, c)] = "missing" if _is_missing(ours) else _closeness(delta_rel) if not _is_missing(paper) else ""

    row_labels = list(row_order) if row_order is not None else list(dict.fromkeys(r for r, _ in texts))
    column_labels = list(column_order) if column_order is not None else list(dict.fromkeys(c for _, c in texts))
    table = pd.DataFrame("", index=pd.Index(row_labels), columns=pd.Index(column_labels), dtype=object)
    if len(rows) > 1:
        table.index = pd.MultiIndex.from_tuples(row_labels, names=rows)
    else:
        table.index.name = rows[0]
    if len(columns) > 1:
        table.columns = pd.MultiIndex.from_tuples(column_labels, names=columns)
    else:
        table.columns.name = columns[0]
    # fill by position: label lookups on an unsorted MultiIndex are slow and warn
    row_at = {label: i for i, label in enumerate(row_labels)}
    column_at = {label: j for j, label in enumerate(column_labels)}
    for (r, c), text in texts.items():
        if r in row_at and c in column_at:
            table.iat[row_at[r], column_at[c]] = text

    legend = ("Each cell: ours (paper). Shading: |Δ| ≤ 5 % of the paper's value green, ≤ 20 % amber, "
              "more red; grey = not produced (see the note in results/).")
    marks = [f"{FLAG_MARKS.get(flag, '*')} {FLAG_WORDS.get(flag, flag)}" for flag in sorted(flags_seen)]
    if marks:
        legend += " Flags: " + "; ".join(marks) + "."
    full_caption = f"{caption}. {legend}" if caption else legend
    table.attrs["legend"] = full_caption
    if not styled:
        return table

    def css(data: pd.DataFrame) -> pd.DataFrame:
        styles = pd.DataFrame("", index=data.index, columns=data.columns)
        for (r, c), shade in shades.items():
            if shade and r in row_at and c in column_at:
                styles.iat[row_at[r], column_at[c]] = _SHADES[shade]
        return styles

    return table.style.apply(css, axis=None).set_caption(full_caption)


def deviations(
    frame: pd.DataFrame,
    reasons: list[tuple[dict, str]],
    keys: list[str],
    *,
    threshold: float = MODERATE,
) -> pd.DataFrame:
    """Every cell whose ours differs from the paper by more than ``threshold``, with its reason.

    Args:
        frame: tidy results (``value_ours``, ``value_paper``, ``delta_rel`` and ``keys``).
        reasons: ``(match, reason)`` rules, first match wins. ``match`` maps a key column to
            a value or a list of accepted values, e.g. ``({"sampler": "leaky",
            "dataset": ["FilmTrust"]}, "the leak lifts ...")``; ``{}`` matches every row.
        keys: the columns that name a cell in the output.
        threshold: relative deviation above which a cell needs a reason (default 20 %).

    Returns:
        One row per deviating cell: ``keys``, ``ours``, ``paper``, ``Δ %`` and ``reason``,
        largest deviation first. Nothing is left out: the list is the evidence a summary
        rests on.

    Raises:
        ValueError: a deviating cell matches no rule (every deviation needs its reason).
    """
    absent = [key for key in keys + ["value_ours", "value_paper"] if key not in frame.columns]
    if absent:
        raise ValueError(f"deviations: the table has no column(s) {absent}")
    values = frame.copy()
    rel = (values["value_ours"] - values["value_paper"]) / values["value_paper"]
    values["Δ %"] = 100 * rel
    far = values[rel.abs() > threshold].copy()

    def matches(record, rule: dict) -> bool:
        for column, wanted in rule.items():
            if column not in record.index:
                raise ValueError(f"deviations: a reason matches on {column!r}, which the table lacks")
            accepted = wanted if isinstance(wanted, (list, tuple, set)) else [wanted]
            if record[column] not in accepted and str(record[column]) not in map(str, accepted):
                return False
        return True

    found, unexplained = [], []
    for _, record in far.iterrows():
        reason = next((text for rule, text in reasons if matches(record, rule)), None)
        if reason is None:
            unexplained.append({key: record[key] for key in keys})
        found.append(reason)
    if unexplained:
        raise ValueError(f"{len(unexplained)} cell(s) deviate from the paper by more than {threshold:.0%} "
                         f"without a reason: {unexplained[:5]}{' ...' if len(unexplained) > 5 else ''}; "
                         "add a (match, reason) rule for them")
    far["reason"] = found
    far = far.rename(columns={"value_ours": "ours", "value_paper": "paper"})
    far = far.reindex(far["Δ %"].abs().sort_values(ascending=False).index)
    return far[keys + ["ours", "paper", "Δ %", "reason"]].reset_index(drop=True)
