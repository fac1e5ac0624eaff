"""A paper's grid on a Dask cluster: workers train cells, this process alone writes the records.

``python -m fedlib grid <paper> <parts> --local-cluster N`` starts a ``LocalCluster`` of ``N``
single-threaded worker processes on this machine; ``--scheduler ADDRESS`` uses the workers of a
running scheduler instead (a lab cluster, or a Slurm allocation through ``dask_jobqueue``; the
README's "Running the grids on a cluster" has an example). Either way:

1. this process (the *driver*) computes the pending cells from ``runs.jsonl``, exactly as the
   in-process grid does, and claims them in the cache folder (a second driver or an in-process
   grid sharing that folder skips what this one trains);
2. each cell runs on a worker through :func:`fedlib.experiments.grid.train_measured`, the same
   function the in-process grid calls, so the metrics are the same;
3. each finished cell comes back to the driver, which appends its record to
   ``results/<paper>[/<profile>]/runs.jsonl`` at once. Workers never touch the results: a killed
   driver loses no finished record, and running the command again trains only what is missing.

A cell that fails on a worker (a missing dataset on that machine, say) is reported with its
error and the others go on; the command ends with an error that lists the failed cells.
Workers read their data from ``FEDLIB_DATA`` like any fedlib process, and checkpoints go to
``--cache-dir``, which must be a folder every worker can reach.

Dask is an optional dependency: ``pip install -e ".[cluster]"``.
"""
from __future__ import annotations

import contextlib
import logging
import math
import socket
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence

import pandas as pd

from fedlib.experiments.cells import (Cluster, CostGuess, Train, makespan_hours, record_measured, train_measured,
                                      unique_cells)
from fedlib.reporting.results import config_hash

__all__ = ["run_on_cluster", "cluster_client", "CellsFailed", "INSTALL_HINT", "WORKER_CONFIG"]

INSTALL_HINT = ("training a grid on a cluster needs Dask's distributed scheduler: "
                "pip install -e \".[cluster]\" (or pip install \"dask[distributed]\")")


class CellsFailed(RuntimeError):
    """Some cells of a grid failed on their workers (the others were recorded).

    Attributes:
        errors: ``config_hash -> "ErrorType: message"`` of each failed cell.
    """

    def __init__(self, paper: str, errors: Mapping[str, str]):
        self.errors = dict(errors)
        listed = "\n".join(f"  {key}: {message}" for key, message in self.errors.items())
        super().__init__(f"{len(self.errors)} {paper} cell(s) failed on their workers; the others are recorded, and "
                         f"running the command again retries only these:\n{listed}")


#: Dask settings for the workers of a LocalCluster (a remote cluster's workers read their own
#: configuration: set the same there, e.g. in ~/.config/dask/distributed.yaml). One cell per
#: worker at a time, long tasks: the profiler and the frequent ticks only take CPU from them.
WORKER_CONFIG = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
}


def _distributed():
    try:
        import distributed
    except ImportError as error:
        raise ImportError(INSTALL_HINT) from error
    return distributed


@contextlib.contextmanager
def cluster_client(cluster: Cluster) -> Iterator[Any]:
    """A ``distributed.Client`` of ``cluster`` (a ``LocalCluster`` started here, closed on exit)."""
    distributed = _distributed()
    cluster = cluster.check()
    if cluster.local_workers is not None:
        import dask

        # Processes, not threads: torch and numba hold the GIL in places, and a process per
        # worker is what a real cluster has. ":0": any free port for the dashboard. The workers'
        # statistical profiler samples the running thread's stack every 10 ms, taking the GIL
        # from the training loop: off (WORKER_CONFIG; the nannies pass it on to their workers).
        with dask.config.set(WORKER_CONFIG):
            local = distributed.LocalCluster(n_workers=int(cluster.local_workers), threads_per_worker=1,
                                             processes=True, dashboard_address=":0", silence_logs=logging.ERROR)
        try:
            with distributed.Client(local) as client:
                yield client
        finally:
            local.close()
    else:
        with distributed.Client(cluster.scheduler, timeout="60s") as client:
            yield client


def _train_on_worker(train: Train, config: Mapping[str, Any], checkpoint_dir: Optional[str],
                     checkpoint_every_s: Optional[float], threads: int) -> Dict[str, Any]:
    """What a worker runs for one cell: :func:`train_measured` plus where and with what code it ran."""
    import torch

    from fedlib.device import default_device
    from fedlib.reporting.results import current_commit

    torch.set_num_threads(int(threads))
    measured = train_measured(train, config, None if checkpoint_dir is None else Path(checkpoint_dir),
                              checkpoint_every_s)
    measured.update(commit=current_commit(), device=str(default_device()), torch_threads=torch.get_num_threads(),
                    host=socket.gethostname())
    return measured


def run_on_cluster(paper: str, cells: Sequence[Mapping[str, Any]], train: Train, profile: str, *, cache,
                   cluster: Cluster, checkpoint_dir: Optional[Path], checkpoint_every_s: Optional[float],
                   rerun: bool, progress: bool, commit: str) -> pd.DataFrame:
    """Train the pending ``cells`` on ``cluster``'s workers, recording each as it arrives; all cells' results.

    Called by :func:`fedlib.experiments.grid.run_recorded_grid` (``cache``: its
    :class:`~fedlib.reporting.ResultCache`, already restored from the records; ``commit``: the
    driver's). A cell is pending when ``runs.jsonl`` has no record of it (every cell with
    ``rerun``). Returns one row per distinct cell, as the in-process grid does.

    Raises:
        CellsFailed: after every other cell is recorded, when some failed on their workers.
    """
    from tqdm.auto import tqdm

    from fedlib.reporting import read_runs
    from fedlib.reporting.results import latest_records

    distributed = _distributed()
    distinct = unique_cells(cells)
    recorded = latest_records(read_runs(paper, profile))
    pending = [c for c in distinct if rerun or config_hash(c) not in recorded]
    guess = CostGuess(recorded.values())
    expected_s = {config_hash(c): guess(c) for c in pending}
    if checkpoint_dir is not None:
        checkpoint_dir = Path(checkpoint_dir).resolve()  # the workers' working folder may be another
    errors: Dict[str, str] = {}
    claimed: List[Mapping[str, Any]] = []
    with cluster_client(cluster) as client:
        workers = max(1, len(client.scheduler_info().get("workers", {})))
        if progress and client.dashboard_link:
            tqdm.write(f"Dask dashboard: {client.dashboard_link}")
        elsewhere = []
        for config in pending:
            (claimed if cache.try_claim(config) else elsewhere).append(config)
        for config in elsewhere:
            tqdm.write(f"cell {config_hash(config)} is being trained by process {cache.claim_holder(config)}: "
                       f"skipped (run the command again once it is done)")
        # Longest first (cells never timed before those with a guess, they may be long), so that the
        # last cells to finish are short ones: the LPT rule of :func:`makespan_hours`.
        order = sorted(claimed, key=lambda c: -_or_infinite(expected_s[config_hash(c)]))
        futures = {client.submit(_train_on_worker, train, config, None if checkpoint_dir is None else str(checkpoint_dir),
                                 checkpoint_every_s, cluster.threads, pure=False, priority=len(order) - rank,
                                 key=f"{paper}-{config_hash(config)}-{time.time_ns()}"): config
                   for rank, config in enumerate(order)}
        remaining_s = {config_hash(c): expected_s[config_hash(c)] for c in claimed}  # cells still out
        warned_commit = False
        with tqdm(total=len(distinct), initial=len(distinct) - len(pending), unit="cell", disable=not progress,
                  desc=f"{paper} {profile} on {workers} worker(s)") as bar:
            bar.set_postfix_str(_hours_left(list(remaining_s.values()), workers))
            try:
                for future in distributed.as_completed(futures):
                    config = futures[future]
                    key = config_hash(config)
                    try:
                        measured = future.result()
                    except Exception as error:  # noqa: BLE001 - any failure of a cell is reported, the others go on
                        errors[key] = f"{type(error).__name__}: {error}"
                        tqdm.write(f"cell {key} failed on its worker: {errors[key]}")
                    else:
                        if measured["commit"] != commit and not warned_commit:
                            tqdm.write(f"workers run commit {measured['commit']}, this process {commit}: each record "
                                       f"carries the commit its worker ran")
                            warned_commit = True
                        try:  # a worker on uncommitted code trains, but its paper-profile record is refused
                            record_measured(paper, profile, config, measured, commit=measured["commit"],
                                            checkpoint_dir=checkpoint_dir, torch_threads=measured["torch_threads"],
                                            device=measured["device"])
                        except ValueError as error:
                            errors[key] = f"not recorded: {error}"
                            tqdm.write(f"cell {key} trained on {measured['host']} but was not recorded: {error}")
                        else:
                            cache.put(config, measured["result"], wall_time_s=measured["wall_s"])
                    finally:
                        cache.release(config)
                        remaining_s.pop(key, None)
                        bar.update(1)
                        bar.set_postfix_str(_hours_left(list(remaining_s.values()), workers))
            finally:
                for config in claimed:  # a driver stopped early releases what it did not record
                    cache.release(config)
    if errors:
        raise CellsFailed(paper, errors)
    return cache.frame(distinct)


def _hours_left(seconds: Sequence[float], workers: int) -> str:
    """``"≈ X h left"`` from the cells' guessed one-thread wall times (:class:`CostGuess`), scheduled on ``workers``."""
    known = [s for s in seconds if s == s]
    if not seconds:
        return "done"
    text = f"≈ {makespan_hours(known, workers):.1f} h left" if known else "time left unknown"
    unknown = len(seconds) - len(known)
    return text + (f" (+{unknown} cell(s) never timed)" if unknown else "")


def _or_infinite(seconds: float) -> float:
    """A cost guess for ordering: a cell never timed (NaN) counts as the longest."""
    return float("inf") if math.isnan(seconds) else seconds
