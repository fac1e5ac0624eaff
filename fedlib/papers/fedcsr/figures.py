"""FedCSR: the paper's Figures 3, 4 and 6 and Figure 2's bars, drawn from recorded runs.

:func:`figure_prediction_targets`, :func:`figure_curves`, :func:`figure_individual` and
:func:`figure_hidden` take the frames of :mod:`fedlib.papers.fedcsr.tables` (or
:func:`curve_frame`, the learning curves of :func:`figure3_configs`' cells) and return the
figure, saved under ``figures/fedcsr/`` when given a name (:func:`fedlib.reporting.save_figure`).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

import pandas as pd

from fedlib.experiments import grid
from fedlib.papers.fedcsr.experiment import BASELINES, PAPER, SMALL_DIM, method_cell, method_label
from fedlib.papers.fedcsr.tables import (FIGURE2_VARIANTS, FIGURE3_VARIANTS, PAPER_LABELS, SCORES, TABLE9_ALL_PLATFORMS,
                                         TABLE9_CENTRALIZED, TABLE9_FEDERATED, _dim, _fedcsr_dims, _sized)
from fedlib.reporting.figures import curve_frame as long_curves
from fedlib.reporting.figures import grouped_bars, plot_lines, save_figure

__all__ = ["figure3_configs", "curve_frame", "headline_curve_frame", "series_style", "figure_prediction_targets",
           "figure_curves", "figure_individual", "figure_hidden"]


def figure3_configs(dataset: str = "Food-Kitchen", cell_kwargs: Mapping = {}, method_kwargs: Mapping = {},
                    baselines: Sequence[str] = BASELINES) -> List[Dict[str, Any]]:
    """The cells of Figure 3's curves: FedCSR w/o SCL & MCL, w/o MCL and full at n = 64, FedCSR at
    n = 256 and ``baselines`` at n = 64."""
    small = _dim("FedCSR", cell_kwargs, method_kwargs, SMALL_DIM)
    configs = [method_cell(dataset, "FedCSR", cell_kwargs, method_kwargs, variant=v, dim=small)
               for v in FIGURE3_VARIANTS]
    configs += [method_cell(dataset, "FedCSR", cell_kwargs, method_kwargs, dim=d)
                for d in _fedcsr_dims(cell_kwargs, method_kwargs) if d != small]
    configs += [_sized(dataset, m, cell_kwargs, method_kwargs)[1] for m in baselines]
    return grid.unique_cells(configs)


def curve_frame(records, configs: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Learning curves of the given cells: one row per (run, round, numeric curve column).

    Columns ``dataset, method, dim, seed, round, series, value``; ``method`` is the paper's label
    (``FedPi-Net``; FedCSR variants by name), ``series`` the history key (``"valid/MRR"``: mean over
    domains, ``"Food/valid/MRR"``, ``"loss"``, ...), ``value`` as recorded (scores are fractions).
    """
    def label(config: Mapping[str, Any]) -> Dict[str, Any]:
        method = method_label(config)
        method = PAPER_LABELS.get(method, method) if config["method"] != "FedCSR" else method
        return {"dataset": config["dataset"], "method": method, "dim": config["dim"]}

    return long_curves(records, label, ["dataset", "method", "dim", "seed", "round", "series", "value"],
                       configs=configs)


def headline_curve_frame(records) -> pd.DataFrame:
    """The learning curves of the fair-budget headline's runs (part ``headline_lr`` and the
    ``headline`` seeds): :func:`curve_frame`'s columns, ``method`` naming the rate as well
    (``"FedPi-Net, lr 0.002"``), so that :func:`figure_curves` draws one line per method and rate
    (with ``per_seed=True``, the chosen rates' seeds 1 and 2 as lighter lines beside seed 0)."""
    from fedlib.papers.fedcsr import experiment as X

    def label(config: Mapping[str, Any]) -> Dict[str, Any]:
        return {"dataset": config["dataset"], "method": f"{PAPER_LABELS[config['method']]}, lr {config['lr']:g}",
                "dim": config["dim"]}

    configs = grid.unique_cells(X.grid_cells("headline_lr") + X.grid_cells("headline"))
    return long_curves(records, label, ["dataset", "method", "dim", "seed", "round", "series", "value"],
                       configs=configs)


LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")


def series_style(index: int) -> Dict[str, Any]:
    """Colour, line style and marker of the ``index``-th line of a figure.

    Colours cycle through the 10 of ``tab10``; the line style changes with every cycle and the
    marker with every line, so the 11th line differs from the 1st in two ways, never zero
    (Figure 3 has 12 lines).
    """
    import matplotlib.pyplot as plt

    colours = plt.get_cmap("tab10").colors
    return {"color": colours[index % len(colours)], "linestyle": LINE_STYLES[(index // len(colours)) % len(LINE_STYLES)],
            "marker": MARKERS[index % len(MARKERS)]}


def figure_curves(frame: pd.DataFrame, name: Optional[str] = None, *, profile: str = "paper", metric: str = "MRR",
                  role: str = "valid", random_level: Optional[float] = None, title: Optional[str] = None,
                  mark_round: Optional[int] = None, mark_label: str = "", per_seed: bool = False):
    """Figure 3 from :func:`curve_frame`: ``role`` ``metric`` (percent, seed mean) per round, one
    panel per domain (``"<domain>/<role>/<metric>"``; the mean over domains when no domain series
    exists), one line per (method, n), each with its own colour/line-style/marker combination
    (:func:`series_style`) and one legend beside the panels. ``random_level`` (a fraction, e.g.
    the MRR of a random ranking) draws a grey reference line, ``mark_round`` a grey vertical one
    labelled ``mark_label`` (e.g. the round cap of the tables' grid). ``per_seed`` draws each seed
    as its own line instead of the seed mean (runs that stop early make a mean jump where one of
    them ends): the smallest seed as above, the others thinner and lighter in the same colour,
    without a legend entry of their own. Returns ``None`` without points."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if frame.empty:
        return None
    suffix = f"/{role}/{metric}"
    domains = sorted({s[:-len(suffix)] for s in frame["series"] if s.endswith(suffix) and s.count("/") == 2})
    panels = [(d, f"{d}{suffix}") for d in domains] or [("mean over domains", f"{role}/{metric}")]
    if not frame["series"].isin([s for _, s in panels]).any():
        return None
    lines = list(dict.fromkeys(zip(frame["method"], frame["dim"])))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels) + 2.6, 3.6), squeeze=False)
    for ax, (panel_title, series) in zip(axes[0], panels):
        part = frame[frame["series"] == series]
        for index, (method, dim) in enumerate(lines):
            line = part[(part["method"] == method) & (part["dim"] == dim)]
            if line.empty:
                continue
            style = series_style(index)
            if per_seed:
                first, *others = sorted(line["seed"].unique())
                for seed in others:
                    run = line[line["seed"] == seed].sort_values("round")
                    ax.plot(run["round"], 100.0 * run["value"], color=style["color"], linestyle=style["linestyle"],
                            linewidth=0.9, alpha=0.55, label="_nolegend_")
                line = line[line["seed"] == first]
            line = line.groupby("round", as_index=False)["value"].mean()
            ax.plot(line["round"], 100.0 * line["value"], markersize=4, label=f"{method} (n={dim})",
                    markevery=max(1, len(line) // 12), **style)  # a marker every ~12th of a long curve
        if random_level is not None:
            ax.axhline(100.0 * random_level, color="0.5", linestyle=":", linewidth=1.2, label="random ranking")
        if mark_round is not None:
            ax.axvline(mark_round, color="0.5", linestyle="--", linewidth=1.0, label=mark_label or f"round {mark_round}")
        ax.set_title(panel_title)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("communication round")
        ax.set_ylabel(f"{role} {metric} (%)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.suptitle(title or f"FedCSR · Figure 3: {role} {metric} over communication rounds")
    fig.tight_layout()
    save_figure(fig, PAPER, name, profile)
    return fig


def figure_prediction_targets(frame: pd.DataFrame, name: Optional[str] = None, *, profile: str = "paper",
                              metrics: Sequence[str] = ("MRR", "HR@10")):
    """Figure 2 from :func:`figure2_table`: bars of FedCSR, w/o unified and w/o single per domain
    (percent, error bars = std over seeds), one panel per metric. Returns ``None`` without values."""
    import matplotlib.pyplot as plt

    part = frame[frame["value_ours"].notna() & frame["metric"].isin(metrics)] if len(frame) else frame
    if part.empty:
        return None
    groups = list(dict.fromkeys(f"{d}\n({s})" for d, s in zip(part["domain"], part["dataset"])))
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.6 * len(metrics), 3.5), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        rows = part[part["metric"] == metric]
        lookup = {(f"{r['domain']}\n({r['dataset']})", r["method"]): r for _, r in rows.iterrows()}
        variants = [v for v in FIGURE2_VARIANTS if v in set(rows["method"])]
        values = {v: [lookup[(g, v)]["value_ours"] if (g, v) in lookup else math.nan for g in groups] for v in variants}
        errors = {v: [lookup[(g, v)]["std_ours"] if (g, v) in lookup else math.nan for g in groups] for v in variants}
        grouped_bars(ax, groups, values, errors)
        ax.set_ylabel(f"test {metric} (%)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("FedCSR · Figure 2: single- and unified-domain prediction targets")
    fig.tight_layout()
    save_figure(fig, PAPER, name, profile)
    return fig


def _table9_order(setting: str) -> tuple:
    if setting.startswith("platform "):
        return (0, int(setting.split()[1]))
    return (1, [TABLE9_FEDERATED, TABLE9_CENTRALIZED[1], TABLE9_ALL_PLATFORMS].index(setting)
            if setting in (TABLE9_FEDERATED, TABLE9_CENTRALIZED[1], TABLE9_ALL_PLATFORMS) else 9)


def _table9_label(setting: str) -> str:
    if setting.startswith("platform "):
        return f"p{setting.split()[1]}"
    return {TABLE9_FEDERATED: "FedCSR", TABLE9_CENTRALIZED[1]: "central.", TABLE9_ALL_PLATFORMS: "indiv.\n(all)"
            }.get(setting, setting)


def figure_individual(frame: pd.DataFrame, name: Optional[str] = None, *, profile: str = "paper",
                      metric: str = "MRR"):
    """Figure 4 from :func:`table9`: ``metric`` (percent) of each platform trained alone (p1–p10)
    and of FedCSR, ours beside the paper's, one panel per domain; where the FedCSR run recorded
    per-platform scores, a third bar per platform shows the federated model on that platform's
    own test rows. Returns ``None`` without ours."""
    import matplotlib.pyplot as plt

    part = frame[frame["metric"] == metric] if len(frame) else frame
    if part.empty or part["value_ours"].isna().all():
        return None
    # FedCSR's per-platform rows (when recorded) are a third bar beside each platform's own model
    federated_on_platform = (part["method"] == "FedCSR") & part["setting"].str.startswith("platform ")
    fedcsr_by_platform = part[federated_on_platform]
    part = part[~federated_on_platform]
    domains = list(dict.fromkeys(part["domain"]))
    fig, axes = plt.subplots(1, len(domains), figsize=(5.5 * len(domains), 3.5), squeeze=False)
    for ax, domain in zip(axes[0], domains):
        rows = part[part["domain"] == domain]
        rows = rows.iloc[sorted(range(len(rows)), key=lambda i: _table9_order(str(rows["setting"].iloc[i])))]
        groups = [_table9_label(s) for s in rows["setting"]]
        series = {"ours": rows["value_ours"].tolist(), "paper": rows["value_paper"].tolist()}
        errors = {"ours": rows["std_ours"].tolist(), "paper": [math.nan] * len(rows)}
        federated = fedcsr_by_platform[fedcsr_by_platform["domain"] == domain].set_index("setting")
        if len(federated):
            def per_group(column: str) -> List[float]:  # NaN where the group is not a platform
                return [federated[column].get(s, math.nan) if s.startswith("platform ") else math.nan
                        for s in rows["setting"]]
            series["FedCSR on this platform (ours)"] = per_group("value_ours")
            errors["FedCSR on this platform (ours)"] = per_group("std_ours")
        grouped_bars(ax, groups, series, errors)
        ax.set_title(f"{domain} ({rows['dataset'].iloc[0]})")
        ax.set_ylabel(f"test {metric} (%)")
    handles, labels = axes[0][0].get_legend_handles_labels()      # below the panels: no bar is hidden
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(labels), fontsize=8,
               frameon=False)
    fig.suptitle("FedCSR · Figure 4: individual training (p#) vs FedCSR")
    fig.tight_layout()
    save_figure(fig, PAPER, name, profile)
    return fig


def figure_hidden(frame: pd.DataFrame, name: Optional[str] = None, *, profile: str = "paper",
                  metrics: Sequence[str] = SCORES):
    """Figure 6 from :func:`figure6_table`: each metric (percent) against the hidden size factor
    f of SCL's ``t`` (log2 x axis), one line per domain. Returns ``None`` without values."""
    import matplotlib.pyplot as plt

    part = frame[frame["value_ours"].notna()] if len(frame) else frame
    if part.empty:
        return None
    part = part.assign(factor=[float(s.split("=")[1].split("·")[0]) for s in part["setting"]])
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.8 * len(metrics), 3.3), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        plot_lines(ax, part[part["metric"] == metric], "domain", "factor", "value_ours", yerr="std_ours", sort=False)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("hidden size of t / n")
        ax.set_ylabel(f"test {metric} (%)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("FedCSR · Figure 6: hidden size of the SCL transformation")
    fig.tight_layout()
    save_figure(fig, PAPER, name, profile)
    return fig
