"""F3CRec figures: the forgetting curve of lesson 02 and the paper's Figures 3 and 4.

Each function takes a tidy frame and returns a matplotlib ``Figure`` (the caller saves it
with :func:`fedlib.reporting.save_figure`). Layouts are fixed so that no text overlaps:
constrained layout, one legend per figure with a title that names what the colours are, and
tick labels that fit their axis.
"""
from __future__ import annotations

from typing import Optional, Sequence

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from fedlib.reporting.figures import grouped_bars

__all__ = ["plot_forgetting", "plot_improvement", "plot_sensitivity", "plot_round_curves"]

#: Distinct colours and markers per run label (tab10 order; more labels cycle markers too).
_COLOURS = plt.get_cmap("tab10").colors
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def plot_forgetting(frame: pd.DataFrame, test_blocks: Sequence[str] = ("D0", "D1"), metric: str = "N@20",
                    title: Optional[str] = None) -> Figure:
    """One panel per test block: ``metric`` on that block's test users after each later block.

    Args:
        frame: :func:`fedlib.papers.f3crec.experiment.forgetting_frame` (``run``, ``test block``,
            ``after training``, ``t`` and ``metric``).
        test_blocks: the blocks whose test users are followed (one panel each).
        metric: the column to plot (``"N@20"``: NDCG at 20, a fraction in [0, 1]).
    """
    runs = list(dict.fromkeys(frame["run"]))
    fig, axes = plt.subplots(1, len(test_blocks), figsize=(4.6 * len(test_blocks), 3.6), sharey=False,
                             constrained_layout=True, squeeze=False)
    for ax, block in zip(axes[0], test_blocks):
        part = frame[frame["test block"] == block]
        for i, run in enumerate(runs):
            line = part[part["run"] == run].sort_values("t")
            ax.plot(line["t"], line[metric], marker=_MARKERS[i % len(_MARKERS)], color=_COLOURS[i % len(_COLOURS)],
                    label=run, linewidth=1.8)
        ticks = sorted(part["t"].unique())
        ax.set_xticks(ticks, [f"D{t}" for t in ticks])
        ax.set(xlabel="model after training block", ylabel=f"{metric} on {block}'s test users",
               title=f"{block}'s test users")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(title="method", fontsize=8, title_fontsize=9, loc="best")
    fig.suptitle(title or f"Forgetting: {metric} on earlier blocks' test users as training moves on")
    return fig


def plot_improvement(frame: pd.DataFrame, title: str = "Figure 3: F3CRec over the second-best method\n"
                     "(N@20, average of D1–D3)") -> Figure:
    """Figure 3 as grouped horizontal bars: one group per (dataset, backbone), one bar per source.

    Args:
        frame: rows of :func:`fedlib.papers.f3crec.tables.improvement_over_second_best`
            with a ``source`` column (e.g. ``"paper"``, ``"ours"``); ``improvement_percent`` in %.

    Horizontal bars keep the nine "dataset · backbone" labels readable (vertical ones overlap).
    """
    frame = frame.reset_index(drop=True).assign(label=lambda f: f["dataset"] + " · " + f["backbone"])
    produced = frame.groupby("label")["improvement_percent"].count() == frame["source"].nunique()
    frame["label"] = [label if produced[label] else f"{label} (ours: needs download)" for label in frame["label"]]
    settings = list(dict.fromkeys(frame["label"]))
    sources = list(dict.fromkeys(frame["source"]))
    fig, ax = plt.subplots(figsize=(7.5, 0.3 * len(settings) * max(1, len(sources)) + 1.6), constrained_layout=True)
    bars = {source: frame[frame["source"] == source].set_index("label")["improvement_percent"].reindex(settings)
            for source in sources}
    grouped_bars(ax, settings, bars, horizontal=True, colors=_COLOURS, fontsize=9)
    ax.invert_yaxis()
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set(xlabel="F3CRec vs the second-best method (%)", title=title)
    fig.legend(title="source", fontsize=8, title_fontsize=9, loc="outside lower center", ncol=len(sources))
    ax.grid(axis="x", alpha=0.3)
    return fig


def plot_sensitivity(frame: pd.DataFrame, parameters: Sequence[str] = ("ε", "λ_KD", "β"),
                     title: str = "Figure 4: F3CRec (FedMF) sensitivity, N@20 averaged over D1–D3") -> Figure:
    """Figure 4: one panel per hyperparameter, one line per dataset, one shared legend.

    Args:
        frame: :func:`fedlib.papers.f3crec.tables.sensitivity_frame` (``dataset``,
            ``parameter``, ``value``, ``N@20``).

    ε and λ_KD are swept over orders of magnitude (log x axis); each panel keeps its own y range
    (the datasets differ by a factor of 3) and the y label sits on the first panel only.
    """
    datasets = list(dict.fromkeys(frame["dataset"]))
    fig, axes = plt.subplots(1, len(parameters), figsize=(4.2 * len(parameters), 3.8), constrained_layout=True,
                             squeeze=False)
    handles = {}
    for j, (ax, parameter) in enumerate(zip(axes[0], parameters)):
        part = frame[frame["parameter"] == parameter]
        for i, dataset in enumerate(datasets):
            line = part[part["dataset"] == dataset].sort_values("value")
            if len(line):
                (handle,) = ax.plot(line["value"], line["N@20"], marker=_MARKERS[i % len(_MARKERS)],
                                    color=_COLOURS[i % len(_COLOURS)], label=dataset)
                handles[dataset] = handle
        if parameter in ("ε", "λ_KD"):
            ax.set_xscale("log")
        ax.set(xlabel=f"{parameter} (log scale)" if parameter in ("ε", "λ_KD") else parameter, title=parameter)
        ax.set_ylabel("N@20, average of D1–D3" if j == 0 else "")
        ax.grid(alpha=0.3)
    fig.legend(list(handles.values()), list(handles), title="dataset", loc="outside lower center",
               ncol=len(handles), fontsize=9, title_fontsize=9)
    fig.suptitle(title)
    return fig


def plot_round_curves(frame: pd.DataFrame, blocks: Sequence[str] = ("D1", "D2", "D3"),
                      title: Optional[str] = None) -> Figure:
    """Per round of each block: mean client training loss (top row, log scale) and validation
    N@20 (bottom row), one line per case; one column per block.

    Args:
        frame: one row per (``case``, ``block``, ``round``) with ``train_loss`` and ``valid N@20``
            (:func:`fedlib.papers.f3crec.tables.round_curves_frame`); NaN values are gaps.
        blocks: the blocks to draw, one column each.
    """
    cases = list(dict.fromkeys(frame["case"]))
    fig, axes = plt.subplots(2, len(blocks), figsize=(4.2 * len(blocks), 6.4), sharex="col",
                             constrained_layout=True, squeeze=False)
    for column, block in enumerate(blocks):
        part = frame[frame["block"] == block]
        for i, case in enumerate(cases):
            line = part[part["case"] == case].sort_values("round")
            style = {"color": _COLOURS[i % len(_COLOURS)], "linewidth": 1.5, "label": case}
            axes[0][column].plot(line["round"], line["train_loss"], **style)
            axes[1][column].plot(line["round"], line["valid N@20"], **style)
        axes[0][column].set_yscale("log")
        axes[0][column].set(title=block, ylabel="training loss (log scale)" if column == 0 else None)
        axes[1][column].set(xlabel=f"round of {block}", ylabel="validation N@20" if column == 0 else None)
        for ax in axes[:, column]:
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, title="case", loc="outside lower center", ncols=min(len(cases), 3), fontsize=8,
               title_fontsize=9)
    fig.suptitle(title or "Mean client training loss and validation N@20 per round of each block")
    return fig
