"""FedRKG: the paper's figures from run results (live runs or the recorded paper-profile grid).

Each function takes ``results``: dicts ``{"config", "metrics", "extra"}`` as returned by
:func:`fedlib.papers.fedrkg.experiment.run_cells`, or built from ``runs.jsonl`` records by
:func:`results_from_records`, and returns a matplotlib figure, or ``None`` when none of the
runs it needs is among ``results`` (a figure is never drawn from an empty frame).

* Figure 2 (:func:`figure2`): Full Replacement, Local Only, FedRAP and Knowledge Guidance
  (w/o AG), test R@10 per evaluation.
* Figure 4 (:func:`convergence_figure`): FedRKG, its variants and the main baselines, one
  panel per sampler, guidance rounds marked and the step at each of them annotated;
  :func:`convergence_gains` returns those steps as a tidy frame (:func:`step_gains`).
* Figure 5 (:func:`warm_cold_figure`): warm vs cold users, FedRKG vs FedRAP
  (from :func:`fedlib.papers.fedrkg.tables.warm_cold_frame`).
* Figure D.1 (:func:`interval_figure`): Knowledge Guidance with several intervals.
* Figure D.2 (:func:`sensitivity_figure`): best-validation test R@10 against gate lr, β and
  ``T_int`` (one changed at a time).
* The audit's leak trace (:func:`trace_figure`).

:func:`write_recorded_figures` draws every figure it can from the committed paper-profile
records and saves it as ``figures/fedrkg/<name>_paper_profile.png``.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from fedlib.papers.fedrkg.experiment import (DEFAULT_PARAMS, GUIDANCE_MODES, PAPER, SPEC, cell, guidance_rounds,
                                             method_label)
from fedlib.papers.fedrkg.tables import curve_frame, warm_cold_frame
from fedlib.reporting.figures import results_from_records, save_figure

__all__ = ["results_from_records", "convergence_figure", "convergence_gains", "step_gains", "figure2",
           "interval_figure", "sensitivity_figure", "warm_cold_figure", "trace_figure", "write_recorded_figures"]

#: methods drawn in Figure 4 (the paper's: FedRKG against the strongest baselines)
CONVERGENCE_METHODS = ("FedRKG", "w/o AG", "w/ GIE", "w/ PIE", "FedRAP", "FedMF", "PFedRec")
#: row labels whose runs change their personal tables at a guidance round ("w/ PIE" never does)
GUIDED_LABELS = tuple(label for mode, label in GUIDANCE_MODES.items() if mode != "personal_only")
GAIN_COLUMNS = ["dataset", "method", "sampler", "guided", "guidance_round", "round_before", "value_before",
                "round_after", "value_after", "gain"]


def _plain(config: Mapping[str, Any]) -> bool:
    """A run of the main protocol: seed 0, no LDP, no probe, FedMF backbone for FedRKG."""
    return (config.get("ldp") is None and config.get("probe_round") is None and config.get("seed", 0) == 0
            and config.get("backbone") in (None, "FedMF"))


def _default_fedrkg(config: Mapping[str, Any]) -> bool:
    """FedRKG cells at the paper's gate lr and β (any interval)."""
    if config["method"] != "FedRKG":
        return True
    params, default = config["params"], cell(config["dataset"], "FedRKG")["params"]
    return params.get("gate_lr") == default["gate_lr"] and params.get("beta") == default["beta"]


def step_gains(curves: pd.DataFrame, rounds_of_guidance: Sequence[int]) -> pd.DataFrame:
    """The metric just before and just after each guidance round, per curve (the step-wise gains).

    Args:
        curves: a :func:`~fedlib.papers.fedrkg.tables.curve_frame`: one row per evaluation
            with ``dataset, method, sampler, round, value``; ``round`` counts completed rounds.
        rounds_of_guidance: 0-based rounds ``t`` before which guidance runs
            (:func:`~fedlib.papers.fedrkg.experiment.guidance_rounds`), i.e. after ``t`` completed rounds.

    Returns:
        One row per curve and guidance round with an evaluation on each side: the last evaluation
        at or before ``t`` (``round_before``, ``value_before``: the tables before guidance), the
        first one after it (``round_after``, ``value_after``: after the guidance step *and* the
        training rounds up to the evaluation, so with ``eval_every`` 10 the step also holds up to
        10 rounds of ordinary training) and ``gain = value_after − value_before`` (the metric's
        unit). ``guided`` says whether the method changes its tables at guidance rounds; the
        other methods' steps over the same rounds are the no-guidance reference. Columns:
        :data:`GAIN_COLUMNS`.
    """
    rows = []
    if curves.empty or not len(rounds_of_guidance):
        return pd.DataFrame(rows, columns=GAIN_COLUMNS)
    for (dataset, method, sampler), curve in curves.groupby(["dataset", "method", "sampler"], sort=False):
        curve = curve.dropna(subset=["value"]).sort_values("round")
        evaluated, values = curve["round"].to_numpy(), curve["value"].to_numpy(dtype=float)
        for t in rounds_of_guidance:
            before, after = evaluated <= t, evaluated > t
            if not before.any() or not after.any():
                continue
            i, j = int(before.nonzero()[0][-1]), int(after.nonzero()[0][0])
            rows.append({"dataset": dataset, "method": method, "sampler": sampler,
                         "guided": method in GUIDED_LABELS, "guidance_round": int(t),
                         "round_before": int(evaluated[i]), "value_before": float(values[i]),
                         "round_after": int(evaluated[j]), "value_after": float(values[j]),
                         "gain": float(values[j] - values[i])})
    return pd.DataFrame(rows, columns=GAIN_COLUMNS)


def _convergence_curves(results: Sequence[Mapping[str, Any]], interval: int, methods: Sequence[str],
                        metric: str) -> pd.DataFrame:
    """Figure 4's curves: main-protocol runs at the guidance ``interval`` (or methods without one)."""
    chosen = [r for r in results if _plain(r["config"]) and _default_fedrkg(r["config"])
              and (r["config"]["method"] != "FedRKG" or r["config"]["params"].get("interval") == interval)]
    curves = curve_frame(chosen, metric, "test")
    if curves.empty:
        return curves
    return curves[curves["method"].isin(list(methods))].drop_duplicates(["dataset", "method", "sampler", "round"])


def convergence_gains(results: Sequence[Mapping[str, Any]], interval: int, rounds: Optional[int] = None,
                      methods: Sequence[str] = CONVERGENCE_METHODS, metric: str = "Recall@10") -> pd.DataFrame:
    """The steps :func:`convergence_figure` annotates, as a tidy frame (:func:`step_gains`).

    ``rounds`` bounds the guidance schedule (default: each sampler's last evaluated round).
    """
    curves = _convergence_curves(results, interval, methods, metric)
    frames = [step_gains(part, guidance_rounds(rounds or int(part["round"].max()), interval))
              for _, part in curves.groupby("sampler", sort=False)] if len(curves) else []
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=GAIN_COLUMNS)


def _annotate_steps(ax, gains: pd.DataFrame, colors: Mapping[str, Any], label_method: Optional[str],
                    min_points: float = 0.5, min_gap: float = 0.08) -> None:
    """Mark each guided curve's evaluation before (○) and after (▲) every guidance round, joined by
    its step; print the step of ``label_method`` (points of the metric × 100) above it.

    A label is printed only for a step of at least ``min_points`` points and at least ``min_gap``
    (a fraction of the x range) right of the previous label, so labels never overlap; the
    unlabelled steps are in :func:`convergence_gains`.
    """
    if gains.empty or "round_after" not in gains:
        return
    x_range = max(1.0, float(gains["round_after"].max() - gains["round_before"].min()))
    last_label_x = None
    for _, g in gains[gains["guided"]].sort_values("round_after").iterrows():
        color = colors.get(g["method"], "black")
        ax.plot([g["round_before"], g["round_after"]], [g["value_before"], g["value_after"]], color=color, lw=1.6)
        ax.plot(g["round_before"], g["value_before"], "o", mfc="white", mec=color, ms=3.5)
        ax.plot(g["round_after"], g["value_after"], "^", color=color, ms=3.5)
        step = 100 * g["gain"]
        far_enough = last_label_x is None or g["round_after"] - last_label_x >= min_gap * x_range
        if g["method"] == label_method and abs(step) >= min_points and far_enough:
            ax.annotate(f"{step:+.1f}", (g["round_after"], max(g["value_before"], g["value_after"])),
                        textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7, color=color)
            last_label_x = g["round_after"]


def convergence_figure(results: Sequence[Mapping[str, Any]], interval: int, rounds: Optional[int] = None,
                       methods: Sequence[str] = CONVERGENCE_METHODS, metric: str = "Recall@10"):
    """Figure 4: test ``metric`` per evaluation, one panel per sampler (rows) and dataset (columns).

    Colour = method (one legend for the figure); grey lines = guidance rounds. Only runs at
    the guidance ``interval`` given (or methods without one) are drawn. At every guidance round
    each guided curve (:data:`GUIDED_LABELS`) is marked at its evaluation just before (○) and
    just after (▲) the guidance, and FedRKG's larger steps (≥ 0.5 points) are written above it;
    :func:`convergence_gains` returns every step of every curve.
    """
    curves = _convergence_curves(results, interval, methods, metric)
    if curves.empty:
        return None
    samplers = [s for s in ("leaky", "correct") if s in set(curves["sampler"])]
    datasets = list(dict.fromkeys(curves["dataset"]))
    drawn = [m for m in methods if m in set(curves["method"])]
    colors = dict(zip(drawn, sns.color_palette("tab10", n_colors=len(drawn))))
    width = max(8.0, 4.2 * len(datasets) + 1.6)  # room for the two-line title and the legend
    fig, axes = plt.subplots(len(samplers), len(datasets), figsize=(width, 3.0 * len(samplers) + 0.6), squeeze=False)
    for row, sampler in enumerate(samplers):
        for col, dataset in enumerate(datasets):
            ax = axes[row][col]
            part = curves[(curves["sampler"] == sampler) & (curves["dataset"] == dataset)]
            if part.empty:
                ax.set_axis_off()
                continue
            for method in [m for m in drawn if m in set(part["method"])]:
                line = part[part["method"] == method].sort_values("round")
                ax.plot(line["round"], 100 * line["value"], color=colors[method], lw=1.2, label=method)
            scheduled = guidance_rounds(rounds or int(part["round"].max()), interval)
            for t in scheduled:
                ax.axvline(t, color="grey", lw=0.5, alpha=0.4)
            label_method = next((m for m in GUIDED_LABELS if m in set(part["method"])), None)
            gains = step_gains(part, scheduled)
            gains[["value_before", "value_after"]] *= 100  # drawn in percent
            _annotate_steps(ax, gains, colors, label_method)
            ax.set_title(f"{dataset}, {sampler} sampler", fontsize=10)
            ax.set_xlabel("round")
            ax.set_ylabel(f"test {metric} (%)" if col == 0 else "")
    handles = [plt.Line2D([], [], color=colors[m], lw=2) for m in drawn]
    fig.legend(handles, drawn, title="method", loc="center right", fontsize=8, title_fontsize=9, frameon=False)
    fig.suptitle(f"Figure 4, convergence: grey lines = guidance every {interval} rounds;\n"
                 "○ → ▲ = the evaluations around it, FedRKG's step in points", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1 - 1.5 / fig.get_figwidth(), 1))
    return fig


def figure2(results: Sequence[Mapping[str, Any]], dataset: str, sampler: str = "leaky",
            interval: int = DEFAULT_PARAMS["FedRKG"]["interval"], metric: str = "Recall@10"):
    """Figure 2: Full Replacement (w/ GIE every round), Local Only (w/ PIE), FedRAP, Knowledge Guidance.

    Grey lines mark Knowledge Guidance's guidance rounds; its evaluations just before (○) and
    after (▲) each are marked and its step is written above in points (×100), as in
    :func:`convergence_figure` (the same steps are in :func:`convergence_gains`'s ``w/o AG`` rows).
    """
    names = {"w/ GIE": "Full Replacement", "w/ PIE": "Local Only", "FedRAP": "FedRAP (dual)",
             "w/o AG": "Knowledge Guidance"}
    chosen = []
    for r in results:
        c = r["config"]
        if c["dataset"] != dataset or c["sampler"] != sampler or not _plain(c) or not _default_fedrkg(c):
            continue
        label = method_label(c)
        wanted_interval = 1 if label == "w/ GIE" else interval
        if label in names and (c["method"] != "FedRKG" or c["params"].get("interval") == wanted_interval):
            chosen.append(r)
    curves = curve_frame(chosen, metric, "test")
    if curves.empty:
        return None
    curves = curves.drop_duplicates(["method", "round"])
    guided = curves[curves["method"] == "w/o AG"]
    scheduled = guidance_rounds(int(guided["round"].max()), interval) if len(guided) else []
    gains = step_gains(guided, scheduled)
    curves["method"], gains["method"] = curves["method"].map(names), gains["method"].map(names)
    drawn = [n for n in names.values() if n in set(curves["method"])]
    colors = dict(zip(drawn, sns.color_palette(n_colors=len(drawn))))
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    sns.lineplot(data=curves, x="round", y="value", hue="method", hue_order=drawn, palette=colors, ax=ax)
    for t in scheduled:
        ax.axvline(t, color="grey", lw=0.5, alpha=0.4)
    _annotate_steps(ax, gains, colors, "Knowledge Guidance")
    ax.set_xlabel("round"), ax.set_ylabel(f"test {metric} (fraction of users)")
    ax.set_title(f"Figure 2: the knowledge dilemma ({dataset}, {sampler} sampler)", fontsize=10)
    ax.legend(title="method", fontsize=8)
    return fig


def interval_figure(results: Sequence[Mapping[str, Any]], dataset: str, sampler: str = "leaky",
                    intervals: Sequence[int] = tuple(SPEC.list("intervals")), metric: str = "Recall@10"):
    """Figure D.1: Knowledge Guidance (w/o AG) with each guidance interval."""
    chosen = [r for r in results if r["config"]["dataset"] == dataset and r["config"]["sampler"] == sampler
              and method_label(r["config"]) == "w/o AG" and _plain(r["config"]) and _default_fedrkg(r["config"])
              and r["config"]["params"].get("interval") in set(intervals)]
    curves = curve_frame(chosen, metric, "test")
    if curves.empty:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    shown = curves.drop_duplicates(["interval", "round"])
    order = sorted(set(shown["interval"]))
    sns.lineplot(data=shown, x="round", y="value", hue="interval", hue_order=order,
                 palette=dict(zip(order, sns.color_palette("tab10", n_colors=len(order)))), ax=ax)
    ax.legend(title="$T_{int}$ (rounds)", fontsize=8)
    ax.set_xlabel("round"), ax.set_ylabel(f"test {metric} (fraction of users)")
    ax.set_title(f"Figure D.1: guidance interval, w/o AG ({dataset}, {sampler} sampler)", fontsize=10)
    return fig


def sensitivity_frame(results: Sequence[Mapping[str, Any]], dataset: str, sampler: str = "leaky",
                      metric: str = "Recall@10") -> pd.DataFrame:
    """Figure D.2's points: ``parameter, value, score`` (test ``metric`` at the best validation, %)."""
    paper = cell(dataset, "FedRKG")
    defaults = {name: paper["params"][name] for name in ("gate_lr", "beta", "interval")}
    sweeps = {"gate_lr": SPEC.list("gate_lrs"), "beta": SPEC.list("betas"), "interval": SPEC.list("intervals")}
    rows = []
    for r in results:
        c = r["config"]
        if (c["dataset"] != dataset or c["sampler"] != sampler or c["method"] != "FedRKG"
                or c["guidance"] != "adaptive" or not _plain(c) or c["rounds"] != paper["rounds"]):
            continue
        changed = [k for k, v in defaults.items() if c["params"].get(k) != v]
        if len(changed) > 1:
            continue
        for name in (changed or list(defaults)):  # the default point belongs to every sweep
            if c["params"].get(name) in sweeps[name] and r["metrics"].get(metric) is not None:
                rows.append({"parameter": name, "value": c["params"][name], "score": 100.0 * r["metrics"][metric]})
    return pd.DataFrame(rows, columns=["parameter", "value", "score"]).drop_duplicates(["parameter", "value"])


SENSITIVITY_LABELS = {"gate_lr": "gate learning rate", "beta": "retention β", "interval": "guidance interval $T_{int}$ (rounds)"}


def sensitivity_figure(results: Sequence[Mapping[str, Any]], dataset: str, sampler: str = "leaky",
                       metric: str = "Recall@10"):
    """Figure D.2: one panel per hyperparameter (log-x for gate lr and ``T_int``)."""
    frame = sensitivity_frame(results, dataset, sampler, metric)
    if frame.empty:
        return None
    names = [p for p in ("gate_lr", "beta", "interval") if p in set(frame["parameter"])]
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        part = frame[frame["parameter"] == name].sort_values("value")
        ax.plot(part["value"], part["score"], marker="o")
        if name in ("gate_lr", "interval"):
            ax.set_xscale("log")
        ax.set_xlabel(SENSITIVITY_LABELS[name]), ax.set_ylabel(f"test {metric} (%)")
    fig.suptitle(f"Figure D.2: sensitivity of FedRKG ({dataset}, {sampler} sampler)")
    fig.tight_layout()
    return fig


def warm_cold_figure(frame: pd.DataFrame):
    """Figure 5 from :func:`~fedlib.papers.fedrkg.tables.warm_cold_frame` (one panel per sampler)."""
    if frame is None or frame.empty:
        return None
    frame = frame.assign(**{"method · group": frame["method"] + " " + frame["group"]})
    by_dataset = {"row": "dataset"} if "dataset" in frame and frame["dataset"].nunique() > 1 else {}
    grid = sns.catplot(data=frame, x="metric", y="value", hue="method · group", col="sampler", kind="bar",
                       palette="Paired", height=3.2, aspect=1.3, errorbar=None, **by_dataset)
    grid.set_ylabels("score (%)")
    grid.set_titles(**({"template": "{row_name}, {col_name} sampler"} if by_dataset else {"col_template": "{col_name} sampler"}))
    grid.figure.suptitle("Figure 5: warm vs cold users (top / bottom 30 % by interactions)", y=1.02)
    return grid.figure


def trace_frame(results: Sequence[Mapping[str, Any]], dataset: str) -> pd.DataFrame:
    """The leak traces of the runs on ``dataset`` that carry one (one row per traced round)."""
    frames = []
    for r in results:
        c = r["config"]
        if c.get("trace_every") and "trace" in r["extra"] and c["dataset"] == dataset and c.get("ldp") is None:
            frame = pd.DataFrame(r["extra"]["trace"])
            frames.append(frame.assign(sampler=c["sampler"], method=method_label(c)))
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True).drop_duplicates(["method", "sampler", "round"])


def trace_figure(trace: pd.DataFrame):
    """Never-sampled share, median test-item rank and rank-1 share per round (the audit).

    Colour = method, line style = sampler; one legend for the figure.
    """
    if trace.empty:
        return None
    methods = list(dict.fromkeys(trace["method"]))
    colors = dict(zip(methods, sns.color_palette("tab10", n_colors=len(methods))))
    styles = {"leaky": "-", "correct": "--"}
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    ranked = trace.dropna(subset=["test_rank_median"])
    panels = [(trace, "never_sampled_fraction", "candidates never sampled\nas a negative (share)", None),
              (ranked, "test_rank_median", "median rank of the test item\n(1 = top, log scale)", "o"),
              (ranked, "test_rank1_share", "users with the test item\nat rank 1 (share)", "o")]
    for ax, (frame, column, label, marker) in zip(axes, panels):
        for (method, sampler), line in frame.groupby(["method", "sampler"], sort=False):
            line = line.sort_values("round")
            ax.plot(line["round"], line[column], color=colors[method], ls=styles.get(sampler, ":"),
                    marker=marker, ms=3)
        ax.set_xlabel("round"), ax.set_ylabel(label, fontsize=9)
    axes[1].set_yscale("log")
    handles = ([plt.Line2D([], [], color=colors[m], lw=2, label=m) for m in methods]
               + [plt.Line2D([], [], color="black", ls=styles[s], label=f"{s} sampler")
                  for s in styles if s in set(trace["sampler"])])
    fig.legend(handles=handles, loc="center right", fontsize=8, frameon=False)
    fig.suptitle("The audit: negatives sampled, and where the test item ranks")
    fig.tight_layout(rect=(0, 0, 0.87, 1))
    return fig


def write_recorded_figures(records, probe_dataset: str = "Amazon-Video", trace_dataset: str = "FilmTrust",
                           suffix: str = "_paper_profile", profile: str = "paper") -> Dict[str, Optional[plt.Figure]]:
    """Draw every figure the paper-profile ``records`` allow; save each as ``<name><suffix>.png``.

    ``profile`` picks the folder (:func:`fedlib.paths.figures_dir`): a smoke run draws into
    ``figures/fedrkg/smoke/`` and never over the committed figures.

    Returns ``{name: figure or None}`` (``None``: the runs it needs are not recorded yet).
    """
    results = results_from_records(records)
    interval = DEFAULT_PARAMS["FedRKG"]["interval"]
    warm_cold = pd.concat([warm_cold_frame(records, {}, sampler=s, dataset=d) for d in ("FilmTrust", probe_dataset)
                           for s in ("leaky", "correct")], ignore_index=True)
    figures = {
        "figure2_knowledge_dilemma": figure2(results, probe_dataset),
        "figure4_convergence": convergence_figure(results, interval),
        "figure5_warm_cold": warm_cold_figure(warm_cold),
        "figureD1_interval": interval_figure(results, probe_dataset),
        "figureD2_sensitivity": sensitivity_figure(results, probe_dataset),
        "audit_leak_trace": trace_figure(trace_frame(results, trace_dataset)),
    }
    for name, fig in figures.items():
        if fig is not None:
            save_figure(fig, PAPER, name + suffix, profile)
    return figures
