"""FedPCL-CDR: from recorded runs to the paper's Tables 1–5 (paper vs ours) and Figures 3–6.

Every number is read from ``runs.jsonl`` records written by
:func:`fedlib.papers.fedpcl_cdr.experiment.run_grid` or :func:`~fedlib.papers.fedpcl_cdr.lesson.train_live`,
matched to table cells by the configuration hash of :func:`fedlib.papers.fedpcl_cdr.experiment.cell`
(seed means; ``std_ours`` the sample standard deviation over seeds). The tables are laid out as data
(``[tables]`` of ``spec.toml``) and built by :func:`fedlib.experiments.spec.build_table`; this module
holds what is table-specific: the paper's domain names, each row's note on its data, Table 2's
``Imp`` rows, the units, and which missing paper cells need a download.

**Substitute tasks.** Our two-domain substitutes stand for paper tasks (the spec's
``[choices.task]``): Phone-Sport for Task 1, Elec-Cloth for Task 2's Elec and Cloth rows,
Book-Music for Task 4's Book and Music rows; each row's note says so, and the other paper rows
read "needs download" (:func:`missing_note`). Once Douban Movie or FedPCL-CDR's original files
are under the data root, the tasks built from them take their paper task's rows over
(:func:`comparison_tasks`). Scores are the **test** HR@10 / NDCG@10 at the round with the best
mean validation HR@10 (fractions, as the paper).
"""
from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from fedlib.data.protocols.fedpcl_cdr import PAPER_DOMAIN_NAMES, statistics
from fedlib.experiments import grid
from fedlib.experiments.spec import TableContext, build_table, metric_units
from fedlib.papers.fedpcl_cdr.experiment import (BASELINES, PAPER, SPEC, TASKS, available_tasks, cell, load_split,
                                                 method_label, needs_download)
from fedlib.reporting import NEEDS_DOWNLOAD_NOTE
from fedlib.reporting.figures import curve_frame as long_curves
from fedlib.reporting.figures import plot_lines, save_figure, seed_summary_frame
from fedlib.reporting.results import RUN_ID_SEPARATOR, config_hash, runs_of_config

__all__ = ["DOMAINS", "TASK_NOTES", "comparison_tasks", "missing_note", "paper_table", "all_tables", "write_tables",
           "statistics_records", "sweep_frame", "list_length_frame", "curve_frame", "selection_gap_frame",
           "figure_sweeps", "figure_list_length", "figure_curves"]

#: Our domain keys (as in the metric names, lower-cased) -> the paper's domain names.
DOMAINS = {**PAPER_DOMAIN_NAMES, "a": "A", "b": "B"}
#: The note every row of a task carries (``[report] notes`` of the spec; the original-format tasks share one).
TASK_NOTES = {task: SPEC.data["report"]["notes"].get(task) or SPEC.data["report"]["notes"][choice["kind"]]
              for task, choice in SPEC.choices("task").items()}
KIND_RANK = {"original": 0, "ratings": 1, "substitute": 2}  # the best kind of task fills a paper task's rows
SCORES = ("HR@10", "NDCG@10")
MSE_METRIC, NORMALISED_MSE = SPEC.table("table5_privacy_mse")["metrics"]["metric"].values()


def comparison_tasks(tasks: Optional[Sequence[str]] = None) -> tuple:
    """The tasks whose rows fill the tables: of several tasks standing for one paper task, the
    best kind only (original, then Douban ratings with Movie, then substitute), so a paper row
    is never matched twice. ``None`` = :func:`~fedlib.papers.fedpcl_cdr.experiment.available_tasks`."""
    tasks = list(available_tasks() if tasks is None else tasks)
    best: Dict[str, int] = {}
    for task in tasks:
        if task in TASKS:
            best[TASKS[task]["paper_task"]] = min(best.get(TASKS[task]["paper_task"], 99), KIND_RANK[TASKS[task]["kind"]])
    return tuple(t for t in tasks if t not in TASKS or KIND_RANK[TASKS[t]["kind"]] == best[TASKS[t]["paper_task"]])


def missing_note(row: pd.Series) -> str:
    """The note of a paper cell without a value of ours: "needs download" and why while the files of its paper
    task are absent (``[report] needs_download``; Task 2: its Phone row only), else "not run at this profile"."""
    task, domain = str(row.get("task", "")), str(row.get("domain", ""))
    only = SPEC.data["report"]["needs_download"].get(task, {}).get("domain", domain)
    missing = needs_download()
    if task in missing and domain == only:
        return f"{NEEDS_DOWNLOAD_NOTE}: {missing[task]}"
    if row.get("method") in BASELINES:
        return "not run at this profile (baseline not recorded yet)"
    return "not run at this profile"


# ======================================================================================
# Table-specific rows (the hooks the spec's layouts name)
# ======================================================================================
def _our_rows(ours: pd.DataFrame, context: TableContext) -> pd.DataFrame:
    """The paper's domain names, and each row's note: the data of the task its runs trained on."""
    if ours.empty:
        return ours
    ours = ours[ours["domain"].str.lower().isin(DOMAINS)].copy()
    ours["domain"] = [DOMAINS[d.lower()] for d in ours["domain"]]
    task_of = {r.config_hash: r.config.get("task", r.config.get("dataset")) for r in context.records}
    ours["note"] = [TASK_NOTES.get(task_of[ids.split(RUN_ID_SEPARATOR)[0]], "") for ids in ours["run_ids"]]
    return ours


def _statistics_units(ours: pd.DataFrame, context: TableContext) -> pd.DataFrame:
    return metric_units({"Density": "percent"})(_our_rows(ours, context), context)


def _improvement_over_best_baseline(ours: pd.DataFrame, context: TableContext) -> pd.DataFrame:
    """Table 2's ``Imp (vs best baseline)``: FedPCL-CDR minus the best recorded baseline of the same cell, in
    percentage points (the paper's convention); its note names that baseline and its runs."""
    ours, derived = _our_rows(ours, context), []
    for (task, domain, metric), group in (ours.groupby(["task", "domain", "metric"]) if len(ours) else ()):
        mine = group[group["method"] == "FedPCL-CDR"]
        others = group[group["method"].isin(BASELINES) & group["value"].notna()]
        if mine.empty or others.empty:
            continue
        best, row = others.loc[others["value"].idxmax()], mine.iloc[0]
        derived.append({**{k: row[k] for k in ("dataset", "task", "domain", "metric")}, "method": "FedPCL-CDR",
                        "stat": "Imp (vs best baseline)", "value": 100.0 * (row["value"] - best["value"]),
                        # n_seeds and run_ids are FedPCL-CDR's (the consistency check ties n_seeds to run_ids)
                        "n_seeds": int(row["n_seeds"]), "run_ids": row["run_ids"], "run_metric": "",
                        "ours_unit": "percent", "commit": row.get("commit"), "device": row.get("device"),
                        "note": (f"derived: 100·(FedPCL-CDR − {best['method']}), the best of the "
                                 f"{len(others)} recorded baselines (its runs: {best['run_ids']}); "
                                 f"n_seeds and run_ids are FedPCL-CDR's; {row['note']}")})
    return pd.concat([ours, pd.DataFrame(derived)], ignore_index=True) if derived else ours


def _attack_units(ours: pd.DataFrame, context: TableContext) -> pd.DataFrame:
    ours = _our_rows(ours, context)
    if len(ours):
        ours["ours_unit"] = ["mse" if m == MSE_METRIC else "ratio" for m in ours["metric"]]
        ours["note"] = ours["note"] + "; attacker: MLP on half of the (sent, private) pairs, scored on the rest"
    return ours


#: The functions the table layouts of the spec name (``derive``).
TABLE_HOOKS = {"statistics_units": _statistics_units, "improvement_over_best_baseline": _improvement_over_best_baseline,
               "task_notes": _our_rows, "attack_units": _attack_units}


def _statistics_cell(task: str) -> Dict[str, Any]:
    return grid.statistics_config(PAPER, task)


def paper_table(table_id: str, records, profile: str, tasks: Optional[Sequence[str]] = None,
                cell_kwargs: Mapping = {}) -> pd.DataFrame:
    """One table laid out in the spec, keyed by its ``paper_tables`` file stem (``"table2_main"``): paper vs ours.

    ``tasks``: ours (default the available ones; see :func:`comparison_tasks`). Tables 1-3 read all of
    them (Table 1 also the synthetic task's statistics), Table 4 Phone-Sport (or the synthetic task when
    given), Table 5 those of Phone-Sport, Book-Music and synthetic given. ``cell_kwargs``: the profile's
    keywords for every cell.
    """
    tasks = list(comparison_tasks(tasks))
    options = {"tasks": [*tasks, "synthetic"] if table_id == "table1_dataset_stats" else tasks,
               "overlap_task": ["synthetic"] if "synthetic" in tasks else SPEC.data["options"]["overlap_task"],
               "privacy_tasks": [t for t in (*SPEC.data["options"]["privacy_tasks"], "synthetic") if t in tasks]}
    builder, cell_kwargs = (_statistics_cell, {}) if table_id == "table1_dataset_stats" else (cell, cell_kwargs)
    return build_table(SPEC, table_id, records, profile, builder=builder, hooks=TABLE_HOOKS, options=options,
                       cell_kwargs=dict(cell_kwargs), missing_note=missing_note)


def statistics_records(profile: str, tasks: Optional[Sequence[str]] = None, records=()) -> list:
    """Record each task's per-domain statistics (the split we train on) as a run, once per task.

    Metrics ``"<domain>/<statistic>"``: users, items, overlapping users, interactions
    (train + valid + test) and density (percent).
    """
    names = SPEC.table("table1_dataset_stats")["metrics"]["metric"]  # recorded statistic -> Table 1's name

    def per_domain(split) -> Dict[str, float]:
        return {f"{domain}/{name}": float(row[name])
                for domain, (_, row) in zip(split.domains, statistics(split).iterrows()) for name in names}
    return grid.record_split_statistics(PAPER, profile, comparison_tasks(tasks), load_split, records,
                                        metrics_of=per_domain)


def all_tables(records, profile: str, cell_kwargs: Mapping = {}, *,
               tasks: Optional[Sequence[str]] = None) -> Dict[str, pd.DataFrame]:
    """Every paper table (keyed by its ``paper_tables`` file stem) -> its paper-vs-ours frame (:func:`paper_table`)."""
    return {table_id: paper_table(table_id, records, profile, tasks, cell_kwargs) for table_id in SPEC.data["tables"]}


def write_tables(profile: str, cell_kwargs: Mapping = {}, *,
                 tasks: Optional[Sequence[str]] = None) -> Dict[str, pd.DataFrame]:
    """Record the statistics if needed, build every table and write ``results/fedpcl_cdr[/profile]/``."""
    tasks = comparison_tasks(tasks)
    return grid.write_tables(PAPER, profile, lambda records: all_tables(records, profile, cell_kwargs, tasks=tasks),
                             lambda records: statistics_records(profile, tasks, records))


# ======================================================================================
# Figures
# ======================================================================================
#: The sweeps of Figures 3-5: the cell key a part varies -> its name in :func:`sweep_frame`.
SWEPT = {"epsilon": "epsilon", "alpha": "alpha", "num_clusters": "K"}


def sweep_frame(records, cell_kwargs: Mapping = {}) -> pd.DataFrame:
    """Figures 3–5: test HR@10 / NDCG@10 per domain as ε, α or K varies alone (the privacy and sensitivity parts).

    Columns: ``task, parameter (epsilon | alpha | K), setting, domain, metric, value, std, n_seeds``.
    """
    points = []
    for keywords, config in [pair for part in ("privacy", "sensitivity")
                             for pair in SPEC.labelled_cells(part, cell, {}, **cell_kwargs)]:
        swept = next(key for key in SWEPT if key in keywords)
        points.append(({"task": config["task"], "parameter": SWEPT[swept], "setting": keywords[swept]}, config))
    return seed_summary_frame(records, points, _score_cells,
                              ["task", "parameter", "setting", "domain", "metric", "value", "std", "n_seeds"])


def _score_cells(name: str) -> Optional[dict]:
    """``"<domain>/test/HR@10"`` -> ``{"domain": "Phone", "metric": "HR@10"}`` (valid-selected test scores)."""
    parts = name.split("/")
    if len(parts) == 3 and parts[1] == "test" and parts[2] in SCORES and parts[0].lower() in DOMAINS:
        return {"domain": DOMAINS[parts[0].lower()], "metric": parts[2]}
    return None


def list_length_frame(records, cell_kwargs: Mapping = {}, tasks: Sequence[str] = tuple(TASKS)) -> pd.DataFrame:
    """Figure 6: test HR@N and NDCG@N (seed means) of the main FedPCL-CDR run for N in 2..10 (one run gives all N)."""
    def list_length_cells(name: str) -> Optional[dict]:  # "Phone/test/HR@5" -> Phone, HR, 5
        parts = name.split("/")
        if len(parts) != 3 or parts[1] != "test" or parts[0].lower() not in DOMAINS or "@" not in parts[2]:
            return None
        metric, n = parts[2].split("@")
        wanted = int(n) in SPEC.list("list_lengths")
        return {"domain": DOMAINS[parts[0].lower()], "metric": metric, "N": int(n)} if wanted else None

    keys = ["task", "domain", "metric", "N"]
    points = [({"task": task}, cell(task, "FedPCL-CDR", **cell_kwargs)) for task in tasks]
    return seed_summary_frame(records, points, list_length_cells, [*keys, "value"]).sort_values(keys, ignore_index=True)


def curve_frame(records, configs: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Learning curves (every evaluation) of the given cells: one row per (run, round, numeric curve column)."""
    return long_curves(records, lambda config: {"task": config["task"], "method": method_label(config)},
                       ["task", "method", "seed", "round", "series", "value"], configs=configs)


LOWER_BOUND = "lower bound (training stopped on validation)"
CODE_RULE = "the code's rule (training stopped on test)"
GAP_COLUMNS = ["task", "method", "selection", "seed", "domain", "metric", "valid-selected", "test-selected", "gap",
               "test-selected is", "valid round", "test round"]


def selection_gap_frame(records, configs: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The audit of test-set selection: per run and domain, test HR@10 / NDCG@10 at the best
    validation round (ours) and at the best test round (the reference code's rule), and the gap.

    A validation-selected cell stopped on validation, so its best test round is the best
    among fewer rounds than the code would train: its ``test-selected`` value and gap are a
    **lower bound** (column ``test-selected is``). A ``selection="test"`` cell ran the code's
    rule: its ``test-selected`` value is what the code reports, and ``valid-selected`` comes
    from the same cell selected on validation (same seed; both runs train identically until
    the validation one stops), NaN when that run is not recorded.
    """
    rows = []
    for config in configs:
        by_test = config.get("selection") == "test"
        paired = {}
        if by_test:
            valid_config = {k: v for k, v in config.items() if k != "selection"}
            paired = {run.seed: run for run in runs_of_config(records, valid_config)}
        for run in runs_of_config(records, config):
            for name, value in run.metrics.items():
                keys = _score_cells(name)
                other = run.metrics.get(f"test_selected/{name}")
                if keys is None or other is None:
                    continue
                if by_test:
                    partner = paired.get(run.seed)
                    valid = partner.metrics.get(name, math.nan) if partner is not None else math.nan
                    valid_round = partner.metrics.get("selected_round") if partner is not None else None
                else:
                    valid, valid_round = value, run.metrics.get("selected_round")
                rows.append({"task": config["task"], "method": method_label(config),
                             "selection": config.get("selection", "valid"), "seed": run.seed, **keys,
                             "valid-selected": float(valid), "test-selected": float(other),
                             "gap": float(other) - float(valid), "test-selected is": CODE_RULE if by_test else LOWER_BOUND,
                             "valid round": valid_round, "test round": run.metrics.get("test_selected_round")})
    return pd.DataFrame(rows, columns=GAP_COLUMNS)


SWEEP_TITLES = {
    # ε on this axis is the paper's 2β/η, which is not the Laplace mechanism's budget: a d-vector clipped
    # to L2 norm β has L1 sensitivity up to 2β√d, so the guarantee is √d (8 at d = 64) times this value.
    "epsilon": ("Figure 3: noise scale η = 2β/ε (β = 0.2); the Laplace mechanism's ε is 8× the axis value",
                "ε as the paper states it (2β/η)"),
    "alpha": ("Figure 4: weight α of the prototype losses (Eq. 11)", "α"),
    "K": ("Figure 5: number of clusters K", "K (clusters per domain)")}


def figure_sweeps(frame: pd.DataFrame, parameter: str, name: Optional[str] = None, *, profile: str = "paper"):
    """Figures 3–5 from :func:`sweep_frame`: HR@10 and NDCG@10 per domain as ``parameter`` varies.

    One line per (task, domain), log-scaled x for ε and α. Returns ``None`` without points.
    """
    import matplotlib.pyplot as plt

    part = frame[frame["parameter"] == parameter] if len(frame) else frame
    if part.empty:
        return None
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(1, len(SCORES), figsize=(9.5, 3.9))
    title, label = SWEEP_TITLES[parameter]
    settings = sorted(part["setting"].unique())
    for ax, metric in zip(axes, SCORES):
        plot_lines(ax, part[part["metric"] == metric], ["task", "domain"], "setting", "value", yerr="std",
                   label=lambda key: f"{key[1]} ({key[0]})")
        if parameter in ("epsilon", "alpha"):
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(settings, labels=[f"{value:g}" for value in settings])  # the values run, as plain numbers
        ax.set_xlabel(label)
        ax.set_ylabel(f"test {metric} (fraction)")
    handles, labels = axes[0].get_legend_handles_labels()
    # below the panels, so no line is hidden behind it
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False)
    fig.suptitle(f"FedPCL-CDR · {title}", fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    save_figure(fig, PAPER, name, profile)
    return fig


def figure_list_length(frame: pd.DataFrame, name: Optional[str] = None, *, profile: str = "paper"):
    """Figure 6 from :func:`list_length_frame`: HR@N and NDCG@N against N, one line per domain."""
    import matplotlib.pyplot as plt

    if frame.empty:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.3))
    for ax, metric in zip(axes, ("HR", "NDCG")):
        plot_lines(ax, frame[frame["metric"] == metric], ["task", "domain"], "N", "value",
                   label=lambda key: f"{key[1]} ({key[0]})")
        ax.set_xlabel("list length N")
        ax.set_ylabel(f"test {metric}@N (fraction)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False)
    fig.suptitle("FedPCL-CDR · Figure 6: recommendation list length")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    save_figure(fig, PAPER, name, profile)
    return fig


def figure_curves(frame: pd.DataFrame, name: Optional[str] = None, *, profile: str = "paper",
                  series: str = "valid/HR@10", title: Optional[str] = None):
    """Validation HR@10 (mean over domains) per round of each method in :func:`curve_frame`."""
    import matplotlib.pyplot as plt

    part = frame[frame["series"] == series] if len(frame) else frame
    if part.empty:
        return None
    fig, ax = plt.subplots(figsize=(7.0, 3.6))
    groups = list(part.groupby(["task", "method"]))
    colours = plt.cm.tab20(np.linspace(0, 1, 20))  # more series than the default 10-colour cycle
    for index, ((task, method), line) in enumerate(groups):
        line = line.groupby("round", as_index=False)["value"].mean()
        ax.plot(line["round"], line["value"], marker="os^Dv"[index % 5], markersize=3,
                color=colours[(2 * index + index // 10) % 20], linestyle="-" if index < 10 else "--",
                label=method if part["task"].nunique() == 1 else f"{method} ({task})")
    ax.set_xscale("log")  # FedNCF's rounds (10 % of the users each) outnumber the others' epochs
    ax.set_xlabel("round / epoch (log scale)")
    ax.set_ylabel(f"{series.replace('valid/', 'validation ')} (fraction, mean of domains)", fontsize=9)
    ax.set_title(title or "Learning curves")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save_figure(fig, PAPER, name, profile)
    return fig
