"""FedPCL-CDR: from recorded runs to the paper's Tables 1–5 (paper vs ours) and Figures 3–6.

Every number is read from ``runs.jsonl`` records written by
:func:`fedlib.papers.fedpcl_cdr.experiment.run_grid` or :func:`~fedlib.papers.fedpcl_cdr.experiment.run_cells`,
matched to table cells by the configuration hash of :func:`fedlib.papers.fedpcl_cdr.experiment.cell`
(seed means; ``std_ours`` the sample standard deviation over seeds).

**Substitute tasks.** Our three substitute tasks have two domains each and no review text;
each row of ours is compared with the paper row of the same domain in the paper task it
stands in for (:data:`~fedlib.papers.fedpcl_cdr.experiment.TASKS`), and its note says it is a
substitute:

* Phone-Sport → Task 1 (Phone, Sport);
* Elec-Cloth → Task 2's Elec and Cloth rows (Task 2's Phone row: "needs download");
* Book-Music → Task 4's Book and Music rows (Movie: "needs download"); Task 3 (Movie-Music)
  reads "needs download" everywhere.

Once Douban Movie (or FedPCL-CDR's original files) are under the data root, the tasks built
from them (Movie-Music, Book-Movie-Music, "<task> (original)") are available and take the
paper task's rows over from the substitute (:func:`comparison_tasks`); the "needs download"
notes follow the files present (:func:`~fedlib.papers.fedpcl_cdr.experiment.needs_download`).

Scores are the **test** HR@10 / NDCG@10 at the round with the best mean validation HR@10
(fractions, as the paper). Table 2's ``Imp (vs best baseline)`` rows are derived like the
paper's: FedPCL-CDR minus the best baseline recorded for that cell, in percentage points.
Table 5's MSE is the reconstruction attack's raw MSE (the paper's scale is unknown, so raw
values of different models are not comparable); the normalised MSE (1 = the messages reveal
nothing beyond the mean user) sits beside it as rows of ours only.
"""
from __future__ import annotations

import math
import time
from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from fedlib.data.protocols.fedpcl_cdr import PAPER_DOMAIN_NAMES, statistics
from fedlib.experiments import grid
from fedlib.papers.fedpcl_cdr.experiment import (ALPHAS, BASELINES, CLUSTER_COUNTS, EPSILONS, KIND_RANK,
                                                 LIST_LENGTHS, METHODS, OVERLAP_RATIOS, PAPER, PAPER_TASKS,
                                                 TABLE4_METHODS, TASKS, available_tasks, cell, load_split, method_cell,
                                                 needs_download)
from fedlib.reporting import NEEDS_DOWNLOAD_NOTE, aggregate_runs, compare_with_paper, load_paper_table
from fedlib.reporting.results import RUN_ID_SEPARATOR, cell_index, config_hash, latest_records, runs_of_config

__all__ = ["DOMAINS", "SUBSTITUTE_NOTES", "comparison_tasks", "table1", "table2", "table3", "table4", "table5", "all_tables",
           "write_tables", "statistics_records", "sweep_frame", "list_length_frame", "curve_frame", "figure_sweeps",
           "figure_list_length", "figure_curves", "selection_gap_frame"]

DATASET_OF = {**{task: spec["paper_dataset"] for task, spec in TASKS.items()}, "synthetic": "synthetic"}
SUBSTITUTE_NOTES = {
    "Phone-Sport": "SUBSTITUTE: DisenCDR phone_sport pair (2 domains, every user shared, no review text)",
    "Elec-Cloth": "SUBSTITUTE: DisenCDR electronic_cloth pair (2 domains, every user shared, no review text) "
                  "for Task 2's Elec and Cloth rows",
    "Book-Music": "SUBSTITUTE: GA-DTCDR Douban Book and Music (2 domains, no review text) for Task 4's Book and "
                  "Music rows",
    "Movie-Music": "GA-DTCDR Douban Movie and Music ratings (2 domains, no review text, not FedPCL-CDR's "
                   "preprocessing)",
    "Book-Movie-Music": "GA-DTCDR Douban Book, Movie and Music ratings (3 domains, no review text, not FedPCL-CDR's "
                        "preprocessing)",
    **{task: "FedPCL-CDR's original format (ratings and review text; review branch on, Doc2Vec from training "
             "reviews only)" for task, spec in TASKS.items() if spec["kind"] == "original"},
    "synthetic": "synthetic smoke data (not a paper task)",
}
"""The note each row of a task carries (every task of :data:`~fedlib.papers.fedpcl_cdr.experiment.TASKS` has one)."""
DOMAINS = {**{k: v for k, v in PAPER_DOMAIN_NAMES.items()}, "a": "A", "b": "B"}
"""Our domain keys (as in the metric names) -> the paper's domain names."""
SCORES = ("HR@10", "NDCG@10")
MSE_METRIC = "MSE of reconstructed user embeddings (higher = more private)"
NORMALISED_MSE = "normalised MSE (1 = no better than the mean user; ours only)"


def _paper_task(task: str) -> str:
    return TASKS[task]["paper_task"] if task in TASKS else task


def comparison_tasks(tasks: Optional[Sequence[str]] = None) -> tuple:
    """The tasks whose rows fill the tables: of several tasks standing for one paper task, the
    best kind only (original, then Douban ratings with Movie, then substitute), so a paper row
    is never matched twice. ``None`` = :func:`~fedlib.papers.fedpcl_cdr.experiment.available_tasks`."""
    tasks = list(available_tasks() if tasks is None else tasks)
    best: Dict[str, int] = {}
    for task in tasks:
        if task in TASKS:
            paper_task = _paper_task(task)
            best[paper_task] = min(best.get(paper_task, 99), KIND_RANK[TASKS[task]["kind"]])
    return tuple(t for t in tasks if t not in TASKS or KIND_RANK[TASKS[t]["kind"]] == best[_paper_task(t)])


def _domain_of(name: str) -> Optional[str]:
    return DOMAINS.get(name.lower())


def _score_cells(name: str) -> Optional[dict]:
    """``"<domain>/test/HR@10"`` -> ``{"domain": "Phone", "metric": "HR@10"}`` (valid-selected test scores)."""
    parts = name.split("/")
    if len(parts) == 3 and parts[1] == "test" and parts[2] in SCORES and _domain_of(parts[0]):
        return {"domain": _domain_of(parts[0]), "metric": parts[2]}
    return None


def _missing_note(row: pd.Series) -> str:
    task = str(row.get("task", ""))
    domain = str(row.get("domain", ""))
    missing = needs_download()
    if task in missing and (task != PAPER_TASKS[2] or domain == "Phone"):
        return f"{NEEDS_DOWNLOAD_NOTE}: {missing[task]}"
    if row.get("method") in BASELINES:
        return "not run at this profile (baseline not recorded yet)"
    return "not run at this profile"


def _with_notes(ours: pd.DataFrame, task_of_row) -> pd.DataFrame:
    if len(ours):
        notes = [SUBSTITUTE_NOTES.get(task_of_row(row), "") for _, row in ours.iterrows()]
        ours["note"] = [f"{n}; {old}" if isinstance(old, str) and old else n
                        for n, old in zip(notes, ours.get("note", [""] * len(ours)))]
    return ours


def _compare(ours: pd.DataFrame, table_id: str, keys: Sequence[str], profile: str) -> pd.DataFrame:
    paper = load_paper_table(PAPER, table_id)
    if ours.empty:
        ours = pd.DataFrame(columns=[*keys, "value"])
    return compare_with_paper(ours, paper, list(keys), profile=profile, missing_note=_missing_note, unmatched="keep")


def _task_lookup(pairs) -> Dict[str, str]:
    return {keys["task"]: task for keys, task in pairs}


# ======================================================================================
# Table 1: dataset statistics
# ======================================================================================
STAT_NAMES = {"users": "# Users", "items": "# Items", "overlapping_users": "# Overlapping Users",
              "interactions": "# Interactions", "density": "Density"}


def statistics_records(profile: str, tasks: Optional[Sequence[str]] = None, records=()) -> list:
    """Record each task's per-domain statistics (the split we train on) as a run, once per task.

    Metrics ``"<domain>/<statistic>"``: users, items, overlapping users, interactions
    (train + valid + test) and density (percent).
    """
    from fedlib.reporting import append_run

    known, out = latest_records(records), []
    for task in comparison_tasks(tasks):
        config = grid.statistics_config(PAPER, task)
        if config_hash(config) in known:
            out.append(known[config_hash(config)])
            continue
        started = time.perf_counter()
        split = load_split(task)
        frame = statistics(split)
        metrics = {}
        for domain_key, (_, row) in zip(split.domains, frame.iterrows()):
            metrics.update({f"{domain_key}/{name}": float(row[name]) for name in STAT_NAMES})
        out.append(append_run(PAPER, profile, config, 0, metrics, time.perf_counter() - started))
    return out


def table1(records, profile: str, tasks: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """Table 1: users, items, overlapping users, interactions and density per domain."""
    tasks = comparison_tasks(tasks)
    index = {config_hash(grid.statistics_config(PAPER, t)): {"dataset": DATASET_OF[t], "task": _paper_task(t),
                                                             "method": "", "our_task": t}
             for t in [*tasks, "synthetic"]}

    def metric_cells(name: str):
        domain, _, stat = name.partition("/")
        return {"domain": _domain_of(domain), "metric": STAT_NAMES[stat]} if stat in STAT_NAMES and _domain_of(
            domain) else None

    ours = aggregate_runs(records, lambda r: index.get(r.config_hash), metric_cells=metric_cells)
    if len(ours):
        ours["ours_unit"] = ["percent" if m == "Density" else "count" for m in ours["metric"]]
        ours = _with_notes(ours, lambda row: row["our_task"]).drop(columns=["our_task"])
    return _compare(ours, "table1_dataset_stats", ["dataset", "task", "domain", "method", "metric"], profile)


# ======================================================================================
# Table 2: every method on every task (+ Imp vs the best recorded baseline)
# ======================================================================================
TABLE2_KEYS = ["dataset", "task", "domain", "method", "metric", "stat"]


def table2(records, profile: str, tasks: Optional[Sequence[str]] = None, cell_kwargs: Mapping = {},
           method_kwargs: Mapping = {}) -> pd.DataFrame:
    """Table 2: HR@10 and NDCG@10 (fractions, seed means) of the ten baselines and FedPCL-CDR.

    ``stat = "Imp (vs best baseline)"``: FedPCL-CDR minus the best recorded baseline of the
    same cell, in percentage points (the paper's convention); its note names that baseline.
    """
    tasks = comparison_tasks(tasks)
    pairs = [({"dataset": DATASET_OF[t], "task": _paper_task(t), "method": m, "stat": "score"},
              method_cell(t, m, cell_kwargs, method_kwargs)) for t in tasks for m in METHODS]
    task_of = {_paper_task(t): t for t in tasks}
    ours = aggregate_runs(records, lambda r: cell_index(records, pairs).get(r.config_hash), metric_cells=_score_cells)
    ours = _with_notes(ours, lambda row: task_of.get(row["task"], ""))
    derived = []
    if len(ours):
        for (task, domain, metric), group in ours.groupby(["task", "domain", "metric"]):
            mine = group[group["method"] == "FedPCL-CDR"]
            others = group[group["method"].isin(BASELINES) & group["value"].notna()]
            if mine.empty or others.empty:
                continue
            best = others.loc[others["value"].idxmax()]
            row = mine.iloc[0]
            derived.append({**{k: row[k] for k in ("dataset", "task", "domain", "metric")}, "method": "FedPCL-CDR",
                            "stat": "Imp (vs best baseline)", "value": 100.0 * (row["value"] - best["value"]),
                            # n_seeds and run_ids are FedPCL-CDR's (the consistency check ties n_seeds to
                            # run_ids); the note names the baseline's runs
                            "n_seeds": int(row["n_seeds"]), "run_ids": row["run_ids"],
                            "run_metric": "", "ours_unit": "percent", "commit": row.get("commit"),
                            "device": row.get("device"),
                            "note": (f"derived: 100·(FedPCL-CDR − {best['method']}), the best of the "
                                     f"{len(others)} recorded baselines (its runs: {best['run_ids']}); "
                                     f"n_seeds and run_ids are FedPCL-CDR's; "
                                     f"{SUBSTITUTE_NOTES.get(task_of.get(task, ''), '')}")})
    if derived:
        ours = pd.concat([ours, pd.DataFrame(derived)], ignore_index=True)
    return _compare(ours, "table2_main", TABLE2_KEYS, profile)


# ======================================================================================
# Table 3: ablations
# ======================================================================================
TABLE3_VARIANTS = ("FedPCL-CDR", "w/o loc-proto", "w/o glob-proto", "w/o LDP", "w/o CL")


def table3(records, profile: str, tasks: Optional[Sequence[str]] = None, cell_kwargs: Mapping = {}
           ) -> pd.DataFrame:
    """Table 3: FedPCL-CDR and its ablations; "w/o CL" (no prototype term) is an extra row of ours."""
    tasks = comparison_tasks(tasks)
    pairs = [({"dataset": DATASET_OF[t], "task": _paper_task(t), "method": v},
              cell(t, "FedPCL-CDR", variant=v, **cell_kwargs)) for t in tasks for v in TABLE3_VARIANTS]
    task_of = {_paper_task(t): t for t in tasks}
    ours = aggregate_runs(records, lambda r: cell_index(records, pairs).get(r.config_hash), metric_cells=_score_cells)
    ours = _with_notes(ours, lambda row: task_of.get(row["task"], ""))
    return _compare(ours, "table3_ablation", ["dataset", "task", "domain", "method", "metric"], profile)


# ======================================================================================
# Table 4: overlap ratio (Phone-Sport)
# ======================================================================================
def table4(records, profile: str, cell_kwargs: Mapping = {}, method_kwargs: Mapping = {},
           task: str = "Phone-Sport") -> pd.DataFrame:
    """Table 4: Phone-Sport (``task``) with 30 / 50 / 70 % of the overlapping users kept."""
    pairs = [({"dataset": DATASET_OF[task], "task": _paper_task(task), "method": m,
               "setting": f"overlapping user ratio {round(100 * r)}%"},
              method_cell(task, m, cell_kwargs, method_kwargs, overlap_ratio=r))
             for r in OVERLAP_RATIOS for m in TABLE4_METHODS]
    ours = aggregate_runs(records, lambda r: cell_index(records, pairs).get(r.config_hash), metric_cells=_score_cells)
    ours = _with_notes(ours, lambda row: task)
    return _compare(ours, "table4_overlap_ratio", ["dataset", "task", "domain", "method", "setting", "metric"], profile)


# ======================================================================================
# Table 5: reconstruction attack
# ======================================================================================
PRIVACY_METHODS = ("P2FCDR", "P2DTR", "FedPCL-CDR")


def table5(records, profile: str, tasks: Sequence[str] = ("Phone-Sport", "Book-Music"), cell_kwargs: Mapping = {},
           method_kwargs: Mapping = {}) -> pd.DataFrame:
    """Table 5: MSE of the reconstruction attack on what each domain transmitted (raw and normalised)."""
    pairs = [({"dataset": DATASET_OF[t], "task": _paper_task(t), "method": m},
              method_cell(t, m, cell_kwargs, method_kwargs)) for t in tasks for m in PRIVACY_METHODS]
    task_of = {_paper_task(t): t for t in tasks}

    def metric_cells(name: str):
        parts = name.split("/")
        if len(parts) == 3 and parts[0] == "attack" and _domain_of(parts[1]):
            label = {"mse": MSE_METRIC, "normalised_mse": NORMALISED_MSE}.get(parts[2])
            return {"domain": _domain_of(parts[1]), "metric": label} if label else None
        return None

    ours = aggregate_runs(records, lambda r: cell_index(records, pairs).get(r.config_hash), metric_cells=metric_cells)
    if len(ours):
        ours["ours_unit"] = ["mse" if m == MSE_METRIC else "ratio" for m in ours["metric"]]
        ours = _with_notes(ours, lambda row: task_of.get(row["task"], ""))
        ours["note"] = ours["note"] + "; attacker: MLP on half of the (sent, private) pairs, scored on the rest"
    return _compare(ours, "table5_privacy_mse", ["dataset", "task", "domain", "method", "metric"], profile)


# ======================================================================================
# Everything
# ======================================================================================
def all_tables(records, profile: str, cell_kwargs: Mapping = {}, method_kwargs: Mapping = {}, *,
               tasks: Optional[Sequence[str]] = None) -> Dict[str, pd.DataFrame]:
    """Every paper table (keyed by its ``paper_tables`` file stem) -> its paper-vs-ours frame.

    ``cell_kwargs`` are the profile's keywords for every cell, ``method_kwargs`` a method's own
    on top (:func:`~fedlib.papers.fedpcl_cdr.experiment.method_cell`). ``tasks``: default the
    available ones; see :func:`comparison_tasks`.
    """
    tasks = comparison_tasks(tasks)
    return {"table1_dataset_stats": table1(records, profile, tasks),
            "table2_main": table2(records, profile, tasks, cell_kwargs, method_kwargs),
            "table3_ablation": table3(records, profile, tasks, cell_kwargs),
            "table4_overlap_ratio": table4(records, profile, cell_kwargs, method_kwargs,
                                           "synthetic" if "synthetic" in tasks else "Phone-Sport"),
            "table5_privacy_mse": table5(records, profile, [t for t in ("Phone-Sport", "Book-Music", "synthetic")
                                                            if t in tasks], cell_kwargs, method_kwargs)}


def write_tables(profile: str, cell_kwargs: Mapping = {}, method_kwargs: Mapping = {}, *,
                 tasks: Optional[Sequence[str]] = None) -> Dict[str, pd.DataFrame]:
    """Record the statistics if needed, build every table and write ``results/fedpcl_cdr[/profile]/``."""
    from fedlib.reporting import read_runs, write_results_table

    tasks = comparison_tasks(tasks)
    statistics_records(profile, tasks, read_runs(PAPER, profile))
    records = read_runs(PAPER, profile)
    tables = all_tables(records, profile, cell_kwargs, method_kwargs, tasks=tasks)
    for table_id, frame in tables.items():
        write_results_table(PAPER, str(frame["table"].iloc[0]) if len(frame) else table_id.split("_")[0], frame,
                            profile)
    return tables


# ======================================================================================
# Figures
# ======================================================================================
def sweep_frame(records, cell_kwargs: Mapping = {}, tasks_privacy: Sequence[str] = ("Phone-Sport", "Book-Music"),
                task_sensitivity: str = "Phone-Sport") -> pd.DataFrame:
    """Figures 3–5: test HR@10 / NDCG@10 per domain as ε, α or K varies alone.

    Columns: ``task, parameter (epsilon | alpha | K), setting, domain, metric, value, std, n_seeds``.
    """
    sweeps = [(t, "epsilon", e, cell(t, "FedPCL-CDR", epsilon=e, **cell_kwargs)) for t in tasks_privacy
              for e in EPSILONS]
    sweeps += [(task_sensitivity, "alpha", a, cell(task_sensitivity, "FedPCL-CDR", alpha=a, **cell_kwargs))
               for a in ALPHAS]
    sweeps += [(task_sensitivity, "K", k, cell(task_sensitivity, "FedPCL-CDR", num_clusters=k, **cell_kwargs))
               for k in CLUSTER_COUNTS]
    rows = []
    for task, parameter, setting, config in sweeps:
        runs = runs_of_config(records, config)
        if not runs:
            continue
        for name in runs[0].metrics:
            keys = _score_cells(name)
            if keys is None:
                continue
            values = [r.metrics[name] for r in runs if name in r.metrics]
            rows.append({"task": task, "parameter": parameter, "setting": setting, **keys,
                         "value": float(np.mean(values)),
                         "std": float(np.std(values, ddof=1)) if len(values) > 1 else math.nan,
                         "n_seeds": len(values)})
    return pd.DataFrame(rows, columns=["task", "parameter", "setting", "domain", "metric", "value", "std", "n_seeds"])


def list_length_frame(records, cell_kwargs: Mapping = {}, tasks: Sequence[str] = tuple(TASKS)) -> pd.DataFrame:
    """Figure 6: test HR@N and NDCG@N of the main FedPCL-CDR run for N in 2..10 (one run gives all N)."""
    rows = []
    for task in tasks:
        for run in runs_of_config(records, cell(task, "FedPCL-CDR", **cell_kwargs)):
            for name, value in run.metrics.items():
                parts = name.split("/")
                if len(parts) != 3 or parts[1] != "test" or not _domain_of(parts[0]) or "@" not in parts[2]:
                    continue
                metric, n = parts[2].split("@")
                if int(n) in LIST_LENGTHS:
                    rows.append({"task": task, "domain": _domain_of(parts[0]), "metric": metric, "N": int(n),
                                 "seed": run.seed, "value": float(value)})
    frame = pd.DataFrame(rows, columns=["task", "domain", "metric", "N", "seed", "value"])
    return frame.groupby(["task", "domain", "metric", "N"], as_index=False)["value"].mean() if len(frame) else frame


def curve_frame(records, configs: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Learning curves (every evaluation) of the given cells: one row per (cell, round, column)."""
    from fedlib.papers.fedpcl_cdr.experiment import method_label

    rows = []
    for config in configs:
        for run in runs_of_config(records, config):
            for point in (run.extra or {}).get("curve", []):
                for key, value in point.items():
                    if key != "round" and isinstance(value, (int, float)):
                        rows.append({"task": config["task"], "method": method_label(config), "seed": run.seed,
                                     "round": point["round"], "series": key, "value": float(value)})
    return pd.DataFrame(rows, columns=["task", "method", "seed", "round", "series", "value"])


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
    from fedlib.papers.fedpcl_cdr.experiment import method_label

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


def _save(fig, name: Optional[str], profile: str):
    if name:
        from fedlib.reporting import save_figure
        save_figure(fig, PAPER, name, profile)
    return fig


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
        for (task, domain), line in part[part["metric"] == metric].groupby(["task", "domain"]):
            line = line.sort_values("setting")
            ax.errorbar(line["setting"], line["value"], yerr=line["std"].fillna(0.0), marker="o", capsize=3,
                        label=f"{domain} ({task})")
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
    return _save(fig, name, profile)


def figure_list_length(frame: pd.DataFrame, name: Optional[str] = None, *, profile: str = "paper"):
    """Figure 6 from :func:`list_length_frame`: HR@N and NDCG@N against N, one line per domain."""
    import matplotlib.pyplot as plt

    if frame.empty:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.3))
    for ax, metric in zip(axes, ("HR", "NDCG")):
        for (task, domain), line in frame[frame["metric"] == metric].groupby(["task", "domain"]):
            line = line.sort_values("N")
            ax.plot(line["N"], line["value"], marker="o", label=f"{domain} ({task})")
        ax.set_xlabel("list length N")
        ax.set_ylabel(f"test {metric}@N (fraction)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False)
    fig.suptitle("FedPCL-CDR · Figure 6: recommendation list length")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return _save(fig, name, profile)


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
    return _save(fig, name, profile)
