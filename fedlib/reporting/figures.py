"""Figure helpers every paper shares: saving with reproducible bytes, long frames, common plots.

Committed figures should change in git only when the plot changes. Matplotlib stamps
files with its version and the date, and SVG element ids are random unless salted;
:func:`save_figure` strips the stamps and fixes the salt, so the same figure drawn by the
same matplotlib gives the same bytes.

The papers' figure code reads recorded runs through :func:`results_from_records`,
:func:`curve_frame` (learning curves) and :func:`seed_summary_frame` (sweeps: seed means per
setting), and draws with :func:`grouped_bars` and :func:`plot_lines`. Matplotlib is imported
only where a function draws, so that table code can use the frames without it.
"""
from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

import numpy as np
import pandas as pd

from fedlib.paths import figures_dir
from fedlib.reporting._atomic import atomic_write_bytes
from fedlib.reporting.results import RUN_ID_SEPARATOR, check_profile, check_slug, latest_records, runs_of_config

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FIGURE_FORMATS = ("png", "svg", "pdf")

# None removes a key matplotlib would otherwise fill in (software version, dates).
_UNSTAMPED_METADATA = {
    "png": {"Software": None},
    "svg": {"Creator": None, "Date": None, "Format": None, "Type": None},
    "pdf": {"Creator": None, "Producer": None, "CreationDate": None, "ModDate": None},
}


def save_figure(
    fig: Figure,
    paper: str,
    name: Optional[str],
    profile: str,
    formats: Sequence[str] | str = ("png",),
    *,
    dpi: int = 150,
    tight: bool = True,
) -> list[Path]:
    """Save ``fig`` as ``figures_dir(paper, profile)/<name>.<format>`` for each format.

    ``name`` must be a plain file stem (letters, digits, ``_``, ``-``), e.g.
    ``"fig4_sensitivity_epsilon"``; the paper's own figure number at the front keeps the
    folder readable. Smoke runs write to ``figures/<paper>/smoke/`` (see
    :func:`fedlib.paths.figures_dir`). Each file is written atomically. Returns the paths
    in the order of ``formats``. ``name=None`` saves nothing and returns ``[]``, so a figure
    function's optional ``name`` argument passes straight through.
    """
    if name is None:
        return []
    import matplotlib

    check_profile(profile)
    check_slug(name, "figure name")
    if isinstance(formats, str):
        formats = (formats,)
    unknown = [fmt for fmt in formats if fmt not in FIGURE_FORMATS]
    if unknown or not formats:
        raise ValueError(f"unsupported figure format(s) {unknown or formats}; choose from {FIGURE_FORMATS}")
    directory = figures_dir(paper, profile)
    paths = []
    for fmt in formats:
        buffer = io.BytesIO()
        # A fixed salt makes SVG ids depend on the content only.
        with matplotlib.rc_context({"svg.hashsalt": f"fedlib:{paper}:{name}"}):
            fig.savefig(
                buffer,
                format=fmt,
                dpi=dpi,
                metadata=_UNSTAMPED_METADATA[fmt],
                bbox_inches="tight" if tight else None,
            )
        paths.append(atomic_write_bytes(directory / f"{name}.{fmt}", buffer.getvalue()))
    return paths


def use_style(context: str = "notebook", *, font_scale: float = 1.0) -> None:
    """The common look of every notebook figure: seaborn ``whitegrid``, colour-blind palette.

    Call once near the top of a notebook. ``context`` is seaborn's (``paper``,
    ``notebook``, ``talk``, ``poster``).
    """
    import matplotlib
    import seaborn as sns

    sns.set_theme(context=context, style="whitegrid", palette="colorblind", font_scale=font_scale)
    matplotlib.rcParams.update(
        {
            "figure.dpi": 100,
            "savefig.dpi": 150,
            "axes.titleweight": "bold",
            "legend.frameon": False,
        }
    )


# ======================================================================================
# Frames from recorded runs
# ======================================================================================
def results_from_records(records) -> list[dict]:
    """One ``{"config", "metrics", "extra"}`` per recorded training run, as a live run returns it.

    The latest record of each configuration wins; records of another kind (``config["kind"]``
    set, e.g. a dataset's statistics) are left out.
    """
    return [r.result() for r in latest_records(records).values() if r.config.get("kind") is None]


def _runs_with_curves(runs, configs: Optional[Sequence[Mapping[str, Any]]]):
    """``(config, seed, curve)`` of every run: the records of each config's recorded seeds, or each run given."""
    if configs is not None:
        runs = list(runs)
        for config in configs:
            for run in runs_of_config(runs, config):
                yield config, run.seed, (run.extra or {}).get("curve", [])
        return
    for run in runs:
        if isinstance(run, Mapping):
            config, extra = run["config"], run.get("extra")
        else:  # a RunRecord
            config, extra = run.config, run.extra
        yield config, config.get("seed"), (extra or {}).get("curve", [])


def curve_frame(runs, label: Callable[[Mapping[str, Any]], Mapping[str, Any]], columns: Sequence[str], *,
                configs: Optional[Sequence[Mapping[str, Any]]] = None,
                series: Optional[Mapping[str, Mapping[str, Any]]] = None) -> pd.DataFrame:
    """Learning curves as one long frame: one row per (run, evaluation, curve column).

    Args:
        runs: with ``configs``, run records (``read_runs``), of which each config's latest run at
            every recorded seed is read; without, the runs themselves: ``{"config", "extra"}``
            results (:func:`results_from_records`, a live run) or records.
        label: the config -> the row's leading columns, e.g. ``{"dataset": ..., "method": ...}``.
        columns: the frame's columns, in order: any of ``label``'s keys, ``"seed"``, ``"round"``,
            ``"series"`` (or ``series``' column names) and ``"value"``.
        series: ``None``: every numeric entry of a curve point but ``round`` is a row, its key in
            column ``"series"`` (``"valid/MRR"``) and its value as a float. A mapping
            ``{curve key: columns}``: only those keys (a point without one has no row for it),
            each row with the key's own columns (``{"metric": "NDCG@10", "protocol": "full"}``)
            and the value as recorded.

    Curve points are the dicts of ``extra["curve"]`` (``{"round": 3, "valid/MRR": 0.04, ...}``);
    values keep the recorded unit (scores are fractions).
    """
    rows = []
    for config, seed, curve in _runs_with_curves(runs, configs):
        labels = label(config)
        for point in curve:
            start = {**labels, "seed": seed, "round": point["round"]}
            if series is None:
                rows += [{**start, "series": key, "value": float(value)} for key, value in point.items()
                         if key != "round" and isinstance(value, (int, float)) and not isinstance(value, bool)]
            else:
                rows += [{**start, **keys, "value": point[key]} for key, keys in series.items() if key in point]
    unknown = [c for c in columns if rows and c not in rows[0]]
    if unknown:
        raise ValueError(f"curve_frame: no column {unknown} in the rows (they have {list(rows[0])}); "
                         "name them in label's result or in series")
    return pd.DataFrame(rows, columns=list(columns))


def seed_summary_frame(records, points: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]],
                       metrics: Union[Mapping[str, Mapping[str, Any]], Callable[[str], Optional[Mapping[str, Any]]]],
                       columns: Sequence[str], *, scale: float = 1.0) -> pd.DataFrame:
    """Seed means of recorded cells (a sweep's points): one row per (point, metric).

    Args:
        records: run records (``read_runs``).
        points: ``(labels, config)`` pairs: the row's leading columns and the cell, whose
            latest run at every recorded seed counts (:func:`~fedlib.reporting.results.runs_of_config`).
            A point without a recorded run has no row.
        metrics: recorded metric name -> the row's metric columns. A mapping is read in its
            order; a function is asked about each metric of the point's first run (in recorded
            order) and returns ``None`` for a metric to skip.
        columns: the frame's columns, in order: of the labels, the metric columns and
            ``value`` (the mean of ``scale`` × the runs' values), ``std`` (their sample standard
            deviation, NaN for one run), ``n_seeds`` and ``run_ids`` (the runs' ids).
        scale: multiplies every value first (``100.0``: fractions to percent).
    """
    rows = []
    for labels, config in points:
        runs = runs_of_config(records, config)
        if not runs:
            continue
        names = metrics.items() if isinstance(metrics, Mapping) else ((n, metrics(n)) for n in runs[0].metrics)
        for name, keys in names:
            found = [r for r in runs if r.metrics.get(name) is not None]
            if keys is None or not found:
                continue
            values = scale * np.asarray([r.metrics[name] for r in found], dtype=float)
            rows.append({**labels, **keys, "value": float(values.mean()),
                         "std": float(values.std(ddof=1)) if len(values) > 1 else math.nan,
                         "n_seeds": len(found), "run_ids": RUN_ID_SEPARATOR.join(r.config_hash for r in found)})
    return pd.DataFrame(rows, columns=list(columns))


# ======================================================================================
# Plots
# ======================================================================================
def grouped_bars(ax: Axes, groups: Sequence[str], series: Mapping[str, Sequence[float]],
                 errors: Optional[Mapping[str, Sequence[float]]] = None, *, horizontal: bool = False,
                 colors: Optional[Sequence[Any]] = None, fontsize: float = 8) -> None:
    """One group of bars per entry of ``groups``, one bar per series (``{label: value per group}``).

    ``errors`` (same shape; NaN = no error bar, a series of NaN only = none) draws error bars.
    ``horizontal`` lays the groups out top to bottom (``barh``); ``colors`` the bars' colours by
    series (default: the axes' cycle). The groups label the category axis (rotated 45° when
    more than 8 stand side by side).
    """
    width = 0.8 / max(len(series), 1)
    positions = np.arange(len(groups))
    for i, (label, values) in enumerate(series.items()):
        error = None if errors is None else np.asarray(errors[label], dtype=float)
        error = None if error is None or np.isnan(error).all() else np.nan_to_num(error)
        offset = positions + (i - (len(series) - 1) / 2) * width
        style = {"label": label, "capsize": 2, **({} if colors is None else {"color": colors[i % len(colors)]})}
        if horizontal:
            ax.barh(offset, np.asarray(values, dtype=float), height=width, xerr=error, **style)
        else:
            ax.bar(offset, values, width, yerr=error, **style)
    if horizontal:
        ax.set_yticks(positions, groups, fontsize=fontsize)
    else:
        ax.set_xticks(positions)
        ax.set_xticklabels(groups, fontsize=fontsize, rotation=45 if len(groups) > 8 else 0)


def plot_lines(ax: Axes, frame: pd.DataFrame, by: Union[str, Sequence[str]], x: str, y: str, *,
               yerr: Optional[str] = None, sort: bool = True,
               label: Optional[Callable[[Any], str]] = None, **style) -> None:
    """One line per group of ``frame`` by ``by`` (in sorted order, or first appearance with
    ``sort=False``), its points ordered by ``x``, circles at the points.

    ``yerr`` names a column of error bars (``errorbar``, caps of 3 points; NaN draws none);
    ``label`` turns a group's key into its legend label (default: the key). ``style`` goes
    to matplotlib (``marker``, ``markersize``, ...).
    """
    for key, line in frame.groupby(by, sort=sort):
        line = line.sort_values(x)
        line_style = {"marker": "o", "label": label(key) if label else key, **style}
        if yerr is None:
            ax.plot(line[x], line[y], **line_style)
        else:
            ax.errorbar(line[x], line[y], yerr=line[yerr].fillna(0.0), capsize=3, **line_style)
