"""One cell of a grid: train it and measure it, record it, guess its cost.

What the in-process grid (:func:`fedlib.experiments.grid.run_recorded_grid`) and the cluster
driver (:mod:`fedlib.experiments.cluster`) share: a cell is trained by :func:`train_measured`
wherever it runs (this process or a Dask worker) and recorded by :func:`record_measured` in the
one process that writes ``runs.jsonl``.
"""
from __future__ import annotations

import math

import re
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import pandas as pd

from fedlib.reporting.results import config_hash

__all__ = ["Train", "unique_cells", "PeakRSS", "Cluster", "train_measured", "record_measured", "DATASET_KEYS",
           "CostGuess", "makespan_hours"]

#: ``train(config, progress)`` -> ``{"metrics", "extra"}``; ``progress()`` is called once per round
Train = Callable[[Mapping[str, Any], Optional[Callable[..., None]]], Mapping[str, Any]]


def unique_cells(cells: Iterable[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """``cells`` without repeats, in first-seen order (parts of a grid share cells, e.g. a
    main-table row that is also an ablation's full model)."""
    seen: Dict[str, Dict[str, Any]] = {}
    for c in cells:
        seen.setdefault(config_hash(c), dict(c))
    return list(seen.values())


class PeakRSS:
    """Peak resident memory (RSS) of this process while a block runs, in MiB.

    ``with PeakRSS() as peak: ...`` then ``peak.mb`` (``None`` if it could not be measured) and
    ``peak.source``, which says what the number is:

    * ``"VmHWM"`` (Linux): the peak is reset to the current RSS before the block by writing
      ``5`` to ``/proc/self/clear_refs``, and ``VmHWM`` of ``/proc/self/status`` is read after
      it: the peak *of this block* (it includes what the process held before the block, and a
      tensor served from heap memory an earlier block freed adds nothing: those pages are
      resident already, see :func:`fedlib.device.keep_freed_memory`);
    * ``"ru_maxrss"`` (when the reset or the read fails, e.g. not Linux):
      ``resource.getrusage(RUSAGE_SELF).ru_maxrss``, the peak of the *whole process so far*,
      so a run after a bigger one reports the bigger one's peak (an upper bound, not the run's own);
    * ``None``: neither is available; ``mb`` is ``None``.

    Only this process is counted (threads yes, child processes no); the engine trains in-process.
    """

    _STATUS = Path("/proc/self/status")
    _CLEAR_REFS = Path("/proc/self/clear_refs")

    def __init__(self):
        self.mb: Optional[float] = None
        self.source: Optional[str] = None
        self._reset = False

    def __enter__(self) -> "PeakRSS":
        try:
            self._CLEAR_REFS.write_text("5")  # "5": reset the peak RSS counter (VmHWM) to the current RSS
            self._reset = self._vm_hwm_mb() is not None
        except OSError:
            self._reset = False
        return self

    def __exit__(self, *exc) -> None:
        self.mb, self.source = (self._vm_hwm_mb(), "VmHWM") if self._reset else (None, None)
        if self.mb is None:
            self.mb, self.source = self._ru_maxrss_mb(), "ru_maxrss"
            if self.mb is None:
                self.source = None

    @classmethod
    def _vm_hwm_mb(cls) -> Optional[float]:
        try:
            found = re.search(r"^VmHWM:\s*(\d+)\s*kB", cls._STATUS.read_text(), re.MULTILINE)
        except OSError:
            return None
        return int(found.group(1)) / 1024.0 if found else None

    @staticmethod
    def _ru_maxrss_mb() -> Optional[float]:
        try:
            import resource
            import sys

            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        except (ImportError, OSError, ValueError):
            return None
        # kilobytes on Linux, bytes on macOS
        return float(peak) / (2**20 if sys.platform == "darwin" else 1024.0)


class Cluster(NamedTuple):
    """Where a grid's cells train when not in this process: a Dask cluster.

    ``local_workers``: start a ``LocalCluster`` of that many single-threaded worker processes on
    this machine (``--local-cluster N``); ``scheduler``: the address of a running scheduler
    (``--scheduler tcp://host:8786``, e.g. a ``dask_jobqueue.SLURMCluster``'s). Exactly one of
    the two. ``threads``: torch threads per cell on a worker.
    """
    local_workers: Optional[int] = None
    scheduler: Optional[str] = None
    threads: int = 1

    def check(self) -> "Cluster":
        if (self.local_workers is None) == (self.scheduler is None):
            raise ValueError("a Cluster needs exactly one of local_workers (a LocalCluster on this machine) and "
                             f"scheduler (the address of a running one), got {self}")
        if self.local_workers is not None and int(self.local_workers) < 1:
            raise ValueError(f"local_workers must be at least 1, got {self.local_workers!r}")
        if int(self.threads) < 1:
            raise ValueError(f"threads must be at least 1 (torch threads per cell), got {self.threads!r}")
        return self


def train_measured(train: Train, config: Mapping[str, Any], checkpoint_dir: Optional[Path] = None,
                   checkpoint_every_s: Optional[float] = None) -> Dict[str, Any]:
    """Train one cell and measure it: ``{"result", "wall_s", "cpu_s", "peak_rss_mb", "earlier_s"}``.

    What this process and a cluster worker both run. ``checkpoint_dir``: save the cell's state
    there every ``checkpoint_every_s`` seconds and resume from it (``train`` then accepts
    ``checkpointer=``); ``earlier_s`` is the wall time of earlier sessions up to their last save
    (0 without one). ``cpu_s`` is this process's CPU time (all threads) during the cell.
    """
    from fedlib.engine import Checkpointer

    keywords = {}
    checkpointer = None
    if checkpoint_every_s is not None:
        checkpointer = keywords["checkpointer"] = Checkpointer(Path(checkpoint_dir), name=config_hash(config),
                                                               every=None, every_seconds=checkpoint_every_s)
    started, cpu_started = time.perf_counter(), time.process_time()
    with PeakRSS() as peak:
        result = train(config, None, **keywords)
    if not isinstance(result, Mapping):
        raise TypeError(f"the grid's train function returned a {type(result).__name__}; it must return a mapping")
    return {"result": dict(result), "wall_s": time.perf_counter() - started,
            "cpu_s": time.process_time() - cpu_started, "peak_rss_mb": peak.mb,
            "earlier_s": checkpointer.earlier_seconds if checkpointer is not None else 0.0}


def record_measured(paper: str, profile: str, config: Mapping[str, Any], measured: Mapping[str, Any], *,
                    commit: str, checkpoint_dir: Optional[Path] = None, torch_threads: Optional[int] = None,
                    device: Optional[str] = None) -> None:
    """Append the run of :func:`train_measured` to ``runs.jsonl``, then delete the cell's checkpoint.

    The recorded wall time adds the earlier sessions' time (``earlier_s``); a checkpoint keeps
    their wall time but not their CPU time, so a resumed cell's CPU time is left unmeasured.
    """
    from fedlib.engine import Checkpointer
    from fedlib.reporting import append_run

    result, earlier = measured["result"], float(measured["earlier_s"])
    append_run(paper, profile, config, config["seed"], result["metrics"], measured["wall_s"] + earlier,
               extra=result.get("extra"), peak_rss_mb=measured["peak_rss_mb"], commit=commit,
               cpu_time_s=measured["cpu_s"] if earlier == 0.0 else None, torch_threads=torch_threads, device=device)
    if checkpoint_dir is not None:
        Checkpointer(Path(checkpoint_dir), name=config_hash(config), every=1).delete()  # (the schedule is unused)


#: Config keys that name a cell's dataset (the first one present is used by :func:`pending_report`).
DATASET_KEYS = ("task", "dataset")


def _dataset_of(config: Mapping[str, Any]) -> Optional[str]:
    """The cell's dataset (or task) name, or ``None`` when its config has none of :data:`DATASET_KEYS`."""
    for key in DATASET_KEYS:
        if config.get(key) is not None:
            return str(config[key])
    return None


class CostGuess:
    """A cell's wall time (s) guessed from recorded runs: ``CostGuess(records, label)(cell)``.

    The rules of :func:`pending_report`: the median of the same cell's other seeds; else of the
    label's runs on the cell's dataset with the nearest configs; else of the label's nearest
    runs on other datasets scaled by how much dearer the dataset is; else the label's median
    (NaN for a label never run). ``records``: :class:`~fedlib.reporting.results.RunRecord` s
    (the latest of each configuration).
    """

    def __init__(self, records: Iterable[Any], label: Optional[Callable[[Mapping[str, Any]], str]] = None):
        self.label = label or (lambda c: str(c.get("method", "cell")))
        seconds: Dict[str, List[float]] = {}
        self.on_dataset: Dict[Tuple[str, Optional[str]], List[Tuple[Mapping[str, Any], float]]] = {}  # (config, s)
        self.same_cell: Dict[str, List[float]] = {}
        for record in records:
            try:
                wall = float(record.wall_time_s)
                row_label = self.label(record.config)
            except (KeyError, TypeError):  # statistics records and other kinds of run have no row label
                continue
            seconds.setdefault(row_label, []).append(wall)
            self.on_dataset.setdefault((row_label, _dataset_of(record.config)), []).append((record.config, wall))
            self.same_cell.setdefault(self._seedless(record.config), []).append(wall)
        self.label_median = {k: self._median(v) for k, v in seconds.items()}
        self.pair_median = {key: self._median([wall for _, wall in runs])  # (label, dataset) -> s
                            for key, runs in self.on_dataset.items()}

    @staticmethod
    def _seedless(config: Mapping[str, Any]) -> str:
        return config_hash({k: v for k, v in config.items() if k != "seed"})

    @staticmethod
    def _median(values: Sequence[float]) -> float:
        return float(pd.Series(values, dtype=float).median())

    def _nearest_median(self, c: Mapping[str, Any], runs: Sequence[Tuple[Mapping[str, Any], float]]) -> float:
        """Median wall time of the ``runs`` whose configs differ from ``c`` in the fewest settings,
        each scaled to ``c``'s round cap (:func:`_rounds_scale`; the cap is not counted as a difference)."""
        ignored = {"seed", "rounds", *DATASET_KEYS}

        def distance(config: Mapping[str, Any]) -> int:
            return sum(config.get(k) != c.get(k) for k in (set(config) | set(c)) - ignored)

        closest = min(distance(config) for config, _ in runs)
        return self._median([wall * _rounds_scale(config, c) for config, wall in runs if distance(config) == closest])

    def _dataset_ratio(self, target: Optional[str], source: Optional[str]) -> Optional[float]:
        """How many times dearer ``target`` ran than ``source``, over the labels run on both."""
        ratios = [wall / self.pair_median[(row_label, source)] for (row_label, dataset), wall in self.pair_median.items()
                  if dataset == target and self.pair_median.get((row_label, source), 0.0) > 0]
        return self._median(ratios) if ratios else None

    def __call__(self, c: Mapping[str, Any]) -> float:
        others = self.same_cell.get(self._seedless(c))
        if others:
            return self._median(others)
        row_label, dataset = self.label(c), _dataset_of(c)
        if (row_label, dataset) in self.on_dataset:
            return self._nearest_median(c, self.on_dataset[(row_label, dataset)])
        scaled = [self._nearest_median(c, runs) * ratio for (other_label, source), runs in self.on_dataset.items()
                  if other_label == row_label and (ratio := self._dataset_ratio(dataset, source)) is not None]
        return self._median(scaled) if scaled else self.label_median.get(row_label, float("nan"))


def _rounds_scale(recorded: Mapping[str, Any], target: Mapping[str, Any]) -> float:
    """How many times more rounds ``target`` may run than ``recorded`` did: the ratio of their round
    caps (``config["rounds"]``), 1 when either has none. An upper bound for a run that stops early
    (patience), which is the safe side for a budget."""
    try:
        ratio = float(target["rounds"]) / float(recorded["rounds"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return 1.0
    return ratio if ratio > 0 and math.isfinite(ratio) else 1.0


def makespan_hours(seconds: Iterable[float], workers: int) -> float:
    """Hours until ``workers`` parallel workers finish cells of these durations (seconds).

    Longest cell first, each to the least-loaded worker (the LPT rule, within 4/3 of the best
    schedule): about ``sum / workers`` when the cells are many and short, and never less than
    the longest cell. NaN durations (cells without a guess) are left out.
    """
    import heapq

    if int(workers) < 1:
        raise ValueError(f"workers must be at least 1, got {workers!r}")
    loads = [0.0] * int(workers)
    for duration in sorted((float(v) for v in seconds if v == v), reverse=True):
        heapq.heapreplace(loads, loads[0] + duration)
    return max(loads) / 3600.0
