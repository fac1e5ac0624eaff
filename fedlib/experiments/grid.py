"""Running a paper's cells: the resumable recorded grid and the notebooks' live runs.

Both paths train a cell with the paper module's ``run_cell`` and append the result to
``results/<paper>[/<profile>]/runs.jsonl`` (:func:`~fedlib.reporting.append_run`), with its
wall time and its peak resident memory (:class:`PeakRSS`):

* :func:`run_recorded_grid` (``paper`` profile, command line): skips every cell already in
  the cache, which a fresh clone restores from the committed ``runs.jsonl``; cells train in
  this process, or on a Dask cluster (:class:`Cluster`, :mod:`fedlib.experiments.cluster`)
  whose workers return results to this process, the only writer of the records; processes
  sharing the cache skip what the others finished;
* :func:`run_cells` (notebooks): ``paper`` goes through the recorded grid; other profiles
  train each cell live with a progress bar, once per distinct configuration.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Union

import pandas as pd

# re-exported: a cell's training, measurement, record and cost guess live in fedlib.experiments.cells
from fedlib.experiments.cells import (Cluster, CostGuess, PeakRSS, Train, makespan_hours, record_measured,
                                     train_measured, unique_cells)
from fedlib.reporting.results import config_hash

__all__ = ["run_recorded_grid", "run_cells", "unique_cells", "statistics_config", "split_statistics",
           "record_split_statistics", "write_tables", "CellFilter", "pending_cells", "pending_report", "grid_main", "PeakRSS",
           "Cluster", "CostGuess", "makespan_hours"]


def run_recorded_grid(paper: str, cells: Iterable[Mapping[str, Any]], train: Train, profile: str = "paper", *,
                      cache_dir: Path, progress: bool = True, checkpoint_every_s: Optional[float] = None,
                      rerun: bool = False, cluster: Optional[Cluster] = None) -> pd.DataFrame:
    """Run every cell without a recorded result, appending each to runs.jsonl; all cells' results.

    Each record carries the commit checked out when the grid started, not when the cell
    ended: a long-running process keeps the code it imported, whatever is committed meanwhile.

    ``checkpoint_every_s``: also save each cell's training state every this many seconds of
    wall time, to ``<cache_dir>/<profile>/checkpoints/<config_hash>.pt``, and resume a cell
    from there (a cell longer than a working session then finishes over several). ``train``
    must then accept ``checkpointer=`` (a :class:`~fedlib.engine.Checkpointer`, which it may
    ignore for cells it cannot resume). The recorded wall time adds the earlier sessions'
    time up to their last save; the checkpoint is deleted once the cell is recorded. A
    checkpoint holds no code version: after a change that alters a cell's numbers, bump the
    paper's config ``version`` (which renames every checkpoint) or delete the folder.

    ``rerun``: train the cells again even when recorded, appending a new record (the tables
    read each cell's latest): to record metrics added since, or to check that a cell repeats
    its numbers. A rerun cell that was killed continues from its checkpoint like any other.

    ``cluster``: train the pending cells on Dask workers (:func:`fedlib.experiments.cluster.run_on_cluster`);
    this process stays the only writer of ``runs.jsonl``, appending each record as it arrives.
    """
    from fedlib.reporting import ResultCache
    from fedlib.reporting.cache import restore_cache_from_records
    from fedlib.reporting.results import current_commit

    started_at = current_commit()
    distinct = unique_cells(cells)
    cache = ResultCache(Path(cache_dir) / profile)
    restore_cache_from_records(cache, paper, profile, rerun=distinct if rerun else ())
    if profile == "paper" and any(not cache.contains(c) for c in distinct):
        # fail before training: a paper-profile record needs committed code (reading recorded
        # cells, as a lesson at the paper profile does, needs none)
        from fedlib.reporting.results import check_recordable_commit

        check_recordable_commit(started_at)
    checkpoint_dir = Path(cache_dir) / profile / "checkpoints" if checkpoint_every_s is not None else None

    if cluster is not None:
        from fedlib.experiments.cluster import run_on_cluster

        return run_on_cluster(paper, distinct, train, profile, cache=cache, cluster=cluster.check(),
                              checkpoint_dir=checkpoint_dir, checkpoint_every_s=checkpoint_every_s,
                              rerun=rerun, progress=progress, commit=started_at)

    measured_runs: Dict[str, Dict[str, Any]] = {}  # run id -> its measurements, until it is recorded

    def measured(config):
        measured_runs[config_hash(config)] = run = train_measured(train, config, checkpoint_dir, checkpoint_every_s)
        return run["result"]

    def record(config, result, wall):
        record_measured(paper, profile, config, measured_runs.pop(config_hash(config)), commit=started_at,
                        checkpoint_dir=checkpoint_dir)

    return cache.run_grid(distinct, measured, progress=progress, on_new_result=record,
                          description=f"{paper} {profile}")


def run_cells(paper: str, cells: Sequence[Mapping[str, Any]], profile: str, train: Train,
              label: Callable[[Mapping[str, Any]], str], description: str = "cells", *,
              cache_dir: Optional[Path] = None) -> List[Dict[str, Any]]:
    """Train each cell (progress bars) and record it at ``profile``; one ``{"config", "metrics", "extra"}`` per cell.

    ``paper``: through :func:`run_recorded_grid` (recorded cells are not trained again), then
    read back from the records. Otherwise each distinct cell is trained live and appended to
    ``results/<paper>/<profile>/runs.jsonl``.
    """
    from tqdm.auto import tqdm

    from fedlib.reporting import append_run, read_runs
    from fedlib.reporting.results import latest_records

    if profile == "paper":
        run_recorded_grid(paper, cells, train, profile, cache_dir=cache_dir or Path(f".cache/{paper}"))
        known = latest_records(read_runs(paper, profile))
        return [{**known[config_hash(c)].result(), "config": dict(c)} for c in cells]
    out, done = [], {}
    for config in tqdm(list(cells), desc=description, unit="cell"):
        key = config_hash(config)
        if key not in done:
            started, cpu_started = time.perf_counter(), time.process_time()
            bar = tqdm(total=config["rounds"], desc=label(config), unit="round", leave=False)
            with PeakRSS() as peak:
                result = train(config, lambda *_: bar.update(1))
            bar.close()
            append_run(paper, profile, config, config["seed"], result["metrics"], time.perf_counter() - started,
                       extra=result["extra"], peak_rss_mb=peak.mb, cpu_time_s=time.process_time() - cpu_started)
            done[key] = result
        out.append({"config": dict(config), **done[key]})
    return out


def statistics_config(paper: str, dataset: str, kind: str = "data_statistics") -> Dict[str, Any]:
    """The run configuration under which a dataset's statistics are recorded (``kind``: what is measured)."""
    return {"paper": paper, "kind": kind, "dataset": dataset, "seed": 0}


def split_statistics(split) -> Dict[str, float]:
    """``users``, ``items``, ``interactions`` (train + valid + test) and ``sparsity``
    (percent: ``100·(1 − interactions / (users·items))``) of a split."""
    interactions = len(split.train) + len(split.valid) + len(split.test)
    return {"users": float(split.num_users), "items": float(split.num_items), "interactions": float(interactions),
            "sparsity": 100.0 * (1.0 - interactions / (split.num_users * split.num_items))}


def record_split_statistics(paper: str, profile: str, datasets: Sequence[str], load_split, records=(), *,
                            metrics_of: Callable[[Any], Mapping[str, float]] = split_statistics,
                            extra_of: Optional[Callable[[Any], Mapping[str, Any]]] = None,
                            kind: str = "data_statistics") -> list:
    """Record each dataset's statistics as a run, once (so every table value has a run record).

    ``load_split(dataset)`` gives what is measured (a split, or whatever ``metrics_of`` reads);
    ``metrics_of`` its metrics (default :func:`split_statistics`), ``extra_of`` the run's
    ``extra`` (none by default). The config is :func:`statistics_config` with ``kind``; a
    dataset whose config is among ``records`` is not measured again. Returns one record per dataset.
    """
    from fedlib.reporting import append_run
    from fedlib.reporting.results import latest_records

    known = latest_records(records)
    out = []
    for dataset in datasets:
        config = statistics_config(paper, dataset, kind)
        if config_hash(config) in known:
            out.append(known[config_hash(config)])
            continue
        started = time.perf_counter()
        measured = load_split(dataset)
        metrics = dict(metrics_of(measured))
        extra = dict(extra_of(measured)) if extra_of is not None else None
        out.append(append_run(paper, profile, config, 0, metrics, time.perf_counter() - started, extra=extra))
    return out


def write_tables(paper: str, profile: str, build: Callable[[list], Mapping[str, pd.DataFrame]],
                 record_statistics: Optional[Callable[[list], Any]] = None,
                 flag_rules: Optional[Any] = None) -> Dict[str, pd.DataFrame]:
    """Record the statistics if needed, build every table and write ``results/<paper>[/<profile>]/``.

    ``record_statistics(records)`` records what the tables need and is missing (e.g. a bound
    :func:`record_split_statistics`); ``build(records)`` -> ``{key: frame}``. Each non-empty
    frame is written to ``<its table column>.csv`` (the paper's table id, as the status table
    expects) by :func:`~fedlib.reporting.write_results_table`, which validates it first and adds
    its ``flags`` column by ``flag_rules`` (default: the paper's ``[report.flags]``,
    :meth:`~fedlib.experiments.spec.Spec.flag_rules`). Returns the built frames.
    """
    from fedlib.experiments.spec import load_spec
    from fedlib.reporting import read_runs, write_results_table

    rules = flag_rules if flag_rules is not None else load_spec(paper).flag_rules()

    if record_statistics is not None:
        record_statistics(read_runs(paper, profile))
    tables = dict(build(read_runs(paper, profile)))
    for frame in tables.values():
        if len(frame):
            write_results_table(paper, str(frame["table"].iloc[0]), frame, profile, flag_rules=rules)
    return tables


def pending_cells(paper: str, profile: str, cells: Iterable[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """The distinct ``cells`` (first-seen order) that have no run recorded in ``runs.jsonl`` at ``profile``."""
    from fedlib.reporting import read_runs
    from fedlib.reporting.results import latest_records

    known = latest_records(read_runs(paper, profile))
    return [c for c in unique_cells(cells) if config_hash(c) not in known]


def dirty_or_pending_cells(paper: str, profile: str, cells: Iterable[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """The distinct ``cells`` whose latest record at ``profile`` was written from a tree with
    uncommitted changes (commit ``...+dirty``: the code behind it cannot be recovered), and those
    without a record, in first-seen order: what ``--rerun-dirty`` trains."""
    from fedlib.reporting import read_runs
    from fedlib.reporting.results import latest_records

    known = latest_records(read_runs(paper, profile))
    return [c for c in unique_cells(cells)
            if config_hash(c) not in known or str(known[config_hash(c)].commit).endswith("+dirty")]


def pending_report(paper: str, profile: str, cells: Sequence[Mapping[str, Any]],
                   label: Optional[Callable[[Mapping[str, Any]], str]] = None,
                   cache_dir: Optional[Path] = None) -> pd.DataFrame:
    """What is left of a grid: one row per row label, with pending / recorded counts and a cost guess.

    Columns: ``label``, ``recorded``, ``pending``, ``median_s`` (median recorded wall time of
    that label's runs at ``profile``, over the whole runs file, so other datasets and seeds of
    the label count too; NaN if it has none) and ``pending_h`` (hours; a guess, since wall
    time depends on what shares the cores). With ``cache_dir`` (the grid's), also
    ``checkpointed`` (pending cells with a mid-run checkpoint in
    ``<cache_dir>/<profile>/checkpoints/``, which continue from it) and ``spent_h`` (the
    wall time those checkpoints hold). ``pending_h`` stays the whole cell's guess: how much of
    it a checkpoint has done is unknown when the guess comes from other cells. Each pending
    cell is priced by the first of:

    1. the median of the recorded runs of the same cell with other seeds;
    2. the median of the label's recorded runs on the cell's dataset (``task`` or ``dataset``)
       whose configs are nearest the cell's (fewest differing settings, seed and dataset aside);
    3. the label's nearest runs on other datasets, each scaled by how much dearer that dataset
       is: the median, over labels run on both, of (their median on the cell's dataset / their
       median on the other one). A label timed only on a small dataset is not a guess for a
       large one;
    4. the label's median, when no label has been run on both datasets.

    One label can mix cells of very different cost (a backbone, a width, a dataset, a run of an
    earlier config ``version``), hence the per-cell guess from the nearest configs.
    """
    from fedlib.reporting import read_runs
    from fedlib.reporting.results import latest_records

    label = label or (lambda c: str(c.get("method", "cell")))
    known = latest_records(read_runs(paper, profile))
    guess = CostGuess(known.values(), label)

    def progress_of(c: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
        from fedlib.engine import checkpoint_progress

        path = Path(cache_dir) / profile / "checkpoints" / f"{config_hash(c)}.pt" if cache_dir is not None else None
        return checkpoint_progress(path) if path is not None and path.exists() else None

    rows: Dict[str, Dict[str, Any]] = {}
    for c in unique_cells(cells):
        row = rows.setdefault(label(c), {"label": label(c), "recorded": 0, "pending": 0, "pending_s": 0.0,
                                         "checkpointed": 0, "spent_s": 0.0})
        if config_hash(c) in known:
            row["recorded"] += 1
            continue
        row["pending"] += 1
        row["pending_s"] += guess(c)
        saved = progress_of(c)
        if saved is not None:
            row["checkpointed"] += 1
            row["spent_s"] += saved["elapsed_s"]
    frame = pd.DataFrame(list(rows.values()),
                         columns=["label", "recorded", "pending", "pending_s", "checkpointed", "spent_s"])
    frame["median_s"] = [guess.label_median.get(k, float("nan")) for k in frame["label"]]
    frame["pending_h"] = frame.pop("pending_s") / 3600.0
    spent_h = frame.pop("spent_s") / 3600.0
    checkpointed = frame.pop("checkpointed")
    if cache_dir is not None:
        frame["checkpointed"], frame["spent_h"] = checkpointed, spent_h
    return frame


class CellFilter(NamedTuple):
    """A grid command-line option that keeps the cells whose value is one of the option's values.

    ``key`` names a cell entry, or is a function of the cell (its row label, say);
    ``keep_missing`` lets through the cells that have no value (``None``), e.g. methods
    without a backbone when filtering by backbone.
    """
    key: Union[str, Callable[[Mapping[str, Any]], Any]]
    choices: Optional[Sequence[Any]] = None
    type: Callable[[str], Any] = str
    keep_missing: bool = False
    help: Optional[str] = None

    def value(self, cell: Mapping[str, Any]) -> Any:
        return self.key(cell) if callable(self.key) else cell[self.key]


def grid_main(argv: Optional[Sequence[str]], *, paper: str, title: str, parts: Sequence[str],
              grid_cells: Callable[..., List[Dict[str, Any]]], run_grid: Callable[..., Any],
              label: Optional[Callable[[Mapping[str, Any]], str]] = None,
              filters: Mapping[str, CellFilter] = {}, part_options: Mapping[str, Mapping[str, Any]] = {},
              cache_dir: Optional[str] = None) -> List[Dict[str, Any]]:
    """The command line of a paper's resumable grid: pick parts, filter cells, add seeds, run.

    Args:
        grid_cells: ``grid_cells(part, **part_options)`` -> the part's cells.
        run_grid: ``run_grid(cells, profile, cache_dir=, rerun=, cluster=)`` (``cluster``: a
            :class:`Cluster` or ``None`` for this process).
        label: a cell's row label; adds ``--methods`` (keep cells with these labels) unless
            ``filters`` defines its own.
        filters: option (``"--datasets"``) -> :class:`CellFilter`.
        part_options: option -> ``argparse`` keywords; its value goes to ``grid_cells`` under
            the option's name (``--dataset ML-1M`` -> ``grid_cells(part, dataset="ML-1M")``).
        cache_dir: the default of ``--cache-dir`` (``.cache/<paper>``).
    Returns:
        The cells handed to ``run_grid`` (seeds applied, duplicates removed); with
        ``--pending``, the selected cells without a recorded run (nothing is trained).
    """
    import argparse

    import torch

    filters = dict(filters)
    if label is not None and "--methods" not in filters:
        filters["--methods"] = CellFilter(label, help="keep only cells with these row labels")
    parser = argparse.ArgumentParser(prog=f"python -m fedlib grid {paper}",
                                     description=f"Run parts of the {title} paper-profile grid (resumable).")
    parser.add_argument("parts", nargs="+", choices=list(parts))
    for option, kwargs in part_options.items():
        parser.add_argument(option, **kwargs)
    for option, spec in filters.items():
        parser.add_argument(option, nargs="+", default=None, type=spec.type,
                            choices=None if spec.choices is None else list(spec.choices), help=spec.help)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0],
                        help="run every selected cell with each of these seeds")
    parser.add_argument("--profile", default="paper")
    parser.add_argument("--cache-dir", default=cache_dir or f".cache/{paper}",
                        help="results cache and checkpoints (on a cluster: a folder every worker can reach)")
    parser.add_argument("--results-dir", default=None,
                        help="folder of the run records and tables instead of results/ (e.g. a scratch copy)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--local-cluster", type=int, default=None, metavar="N",
                       help="train on a Dask LocalCluster of N single-threaded workers on this machine "
                            "(pip install -e '.[cluster]')")
    where.add_argument("--scheduler", default=None, metavar="ADDRESS",
                       help="train on the workers of a running Dask scheduler (e.g. tcp://host:8786)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per cell (in this process or a worker)")
    parser.add_argument("--reverse", action="store_true",
                        help="walk the cells backwards: a second process sharing the cache meets the first halfway")
    parser.add_argument("--rerun", action="store_true",
                        help="train the selected cells again even when recorded, appending a new record that the "
                             "tables then read (e.g. to record metrics added since the cell ran)")
    parser.add_argument("--rerun-dirty", action="store_true",
                        help="train the selected cells whose latest record was written from uncommitted code "
                             "(commit '+dirty') again, appending records the tables then read, and those not yet "
                             "recorded; run it from a clean checkout")
    parser.add_argument("--pending", action="store_true",
                        help="print what is left of the selected cells per row label (recorded, pending, a "
                             "wall-time guess from the recorded runs) and exit without training")
    args = parser.parse_args(argv)
    if args.rerun and args.pending:
        parser.error("--rerun trains cells and --pending trains none: give one of them")
    if args.rerun_dirty and (args.rerun or args.pending):
        parser.error("--rerun-dirty trains the dirty and pending cells; it goes with neither --rerun (every "
                     "selected cell) nor --pending (none): give one of them")
    if args.local_cluster is not None and args.local_cluster < 1:
        parser.error(f"--local-cluster needs at least one worker, got {args.local_cluster}")
    if args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    if args.results_dir is not None:
        import os

        from fedlib.paths import RESULTS_DIR_ENV

        os.environ[RESULTS_DIR_ENV] = str(Path(args.results_dir).expanduser().resolve())
    torch.set_num_threads(args.threads)
    dest = {option: option.lstrip("-").replace("-", "_") for option in (*part_options, *filters)}
    options = {dest[option]: getattr(args, dest[option]) for option in part_options}
    cells = [c for part in args.parts for c in grid_cells(part, **options)]
    for option, spec in filters.items():
        wanted = getattr(args, dest[option])
        if wanted:
            cells = [c for c in cells if spec.value(c) in wanted or (spec.keep_missing and spec.value(c) is None)]
    cells = unique_cells({**c, "seed": seed} for seed in args.seeds for c in cells)
    if args.pending:
        report = pending_report(paper, args.profile, cells, label, cache_dir=Path(args.cache_dir))
        with pd.option_context("display.width", 160, "display.max_rows", None):
            print(report.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
        print(f"{int(report['pending'].sum())} of {len(unique_cells(cells))} cells pending; about "
              f"{report['pending_h'].sum():.1f} h of one-thread wall time, priced from the recorded runs of each cell's other "
              "seeds, else of its label on its dataset, else of its label on other datasets scaled by their relative cost "
              f"(labels without a recorded run: {int(report['median_s'].isna().sum())})")
        if report["checkpointed"].sum():
            print(f"{int(report['checkpointed'].sum())} of them continue from a checkpoint in {args.cache_dir} "
                  f"({report['spent_h'].sum():.1f} h already spent on them)")
        pending = pending_cells(paper, args.profile, cells)
        if pending:
            from fedlib.reporting import read_runs
            from fedlib.reporting.results import latest_records

            guess = CostGuess(latest_records(read_runs(paper, args.profile)).values(), label)
            seconds = [guess(c) for c in pending]
            priced = [v for v in seconds if v == v]
            if priced:
                spans = ", ".join(f"{n} workers {makespan_hours(priced, n):.1f} h" for n in (2, 10, 100))
                print(f"on a cluster (longest cell first, one-thread workers; the {len(priced)} priced cells): {spans}; "
                      f"the longest cell {max(priced) / 3600.0:.1f} h")
        return pending
    rerun = args.rerun
    if args.rerun_dirty:
        cells, rerun = dirty_or_pending_cells(paper, args.profile, cells), True
        print(f"{len(cells)} selected cells have a dirty latest record or none: training them")
    if args.reverse:
        cells = cells[::-1]
    cluster = None
    if args.local_cluster is not None or args.scheduler is not None:
        import importlib.util

        from fedlib.experiments.cluster import INSTALL_HINT, CellsFailed

        if importlib.util.find_spec("distributed") is None:
            parser.error(INSTALL_HINT)
        cluster = Cluster(local_workers=args.local_cluster, scheduler=args.scheduler, threads=args.threads)
        try:  # absolute: a cluster's workers may start in another folder
            run_grid(cells, args.profile, cache_dir=Path(args.cache_dir).resolve(), rerun=rerun, cluster=cluster)
        except CellsFailed as failed:
            raise SystemExit(str(failed)) from None
        return cells
    run_grid(cells, args.profile, cache_dir=Path(args.cache_dir).resolve(), rerun=rerun, cluster=None)
    return cells
