r"""What does a round of the recorded paper grids cost now, and how much cheaper than at an earlier revision?

A cost model of the ``paper``-profile grids recorded in ``results/*/runs.jsonl`` (issue 43).
A fixed list of cells (:data:`CELLS`, by config hash) stands for the grids:

* the ten recorded cells with the largest ``wall_time_s`` (16 of the 105 recorded CPU-hours),
* each paper's median cell (by ``wall_time_s``),
* the known hot spots that are not already among them: a FedMF round on ML-100K with
  Laplace upload noise on the touched rows and on the full table (as in
  ``benchmarks/engine_speed.py``; a noiseless round is timed next to them for reference and
  left out of the geometric mean), GPFedRec on FilmTrust, FedRAP with its public code's
  optimiser, PFedRec on ML-100K and a clipped personal-table (PFedRec, LDP) round on FilmTrust.
  FedCSR's step is the unit of its cells (below), so the FedCSR cells are its hot spot.

Each cell's config is read from its record and trained through its paper's own ``run_cell``
(``fedlib/papers/<slug>/experiment.py``) with a callback that reads the process's CPU clock
(``time.process_time``, one torch thread) at the end of every **unit** and stops the run, by
raising an exception out of the callback, once enough units are timed. Nothing in the library
changes and no config value is overridden (so early stopping cannot end a run this short):

* ``round`` (most cells): the paper's per-round callback. The first round is a warm-up (the
  clock starts at its end, so data loading, model construction and the first round are
  excluded); the next rounds of the same training run are timed: by default one evaluation
  period (:func:`timed_rounds`), so a cell that evaluates every 10th round (FedRKG, FedKDRec)
  is timed over rounds 2-11, which hold exactly one evaluation, and evaluation counts in the
  proportion the grid pays for it (one evaluation of FedRKG's FedNCF LastFM-2K cell cost about
  nine of its training rounds at 12a1189); other cells over two rounds. ``--rounds N`` times N
  rounds of every round cell instead (before 29 Nov 2026 the default was two rounds everywhere,
  which left those evaluations out). A cell whose first rounds are unlike the rest warms up for
  more rounds (``Cell.warmup_rounds``: GPFedRec on LastFM-2K times its fourth round).
* ``step`` (FedCSR and FedPCL-CDR, whose rounds take 20-350 s): one call of a torch optimiser's
  ``step`` (a global step hook, ``torch.optim.optimizer.register_optimizer_step_post_hook``).
  The first ``STEP_WARMUP`` steps are a warm-up, the next ``--steps`` are timed. A faster
  implementation that no longer calls a torch optimiser in these cells needs its unit changed
  here (the child then reports that no step happened).

``--baseline REV`` (default ``12a1189``, the ``main`` on which issue 43 started) times every cell
also on a ``git worktree`` of REV (under ``.cache/grid_cost/``, reused when present), old and
new alternating per cell (old, new, old, new, ... ``--repeats`` times; each in its own
subprocess with ``PYTHONPATH`` set to that tree), and reports the median of each. The old
tree runs this same script (so the cell list and the timing are the same), which therefore
only uses what both trees provide: each paper's ``run_cell`` and ``fedlib.engine``'s
``run_federated``. ``--baseline none`` times only the current tree.

Output: a table per cell (paper, dataset, method, short hash, unit, the record's seconds per
round = ``wall_time_s`` / rounds run, for context only, old and new CPU-seconds per unit, old ÷ new),
then per paper the recorded grid's CPU-hours (sum of ``wall_time_s`` over its latest records)
and an **estimate** of the same grid now: recorded hours ÷ the paper's geometric-mean speed-up
over its timed cells. The estimate assumes the timed cells speed up like the paper's whole
grid (they are its most expensive cells and its median one); it does not re-run the grid.
The last line is one JSON object with ``speedup_geomean`` (geometric mean of old ÷ new over
the fixed cells), the per-cell numbers and the per-paper estimates.

    python benchmarks/grid_cost.py                       # all cells against 12a1189 (see below)
    python benchmarks/grid_cost.py --cells d34ff2e3,005dbe4e  # a subset (two subsets can run side by side)
    python benchmarks/grid_cost.py --quick               # a 1-2 minute smoke of three cheap cells
    python benchmarks/grid_cost.py --cells e82d2ea8,fedmf-noise-touched --baseline none
    python benchmarks/grid_cost.py --list                # the fixed cells and why each is there

Cost of the default run (22 cells, 2 repeats, both trees: 88 subprocesses): about 45 minutes of
one-core work on a 2-core machine shared with other processes (load average 5-6), of which the
GPFedRec LastFM-2K cell (four ~40 CPU-s rounds per subprocess, three of them a warm-up) is about 25 minutes
and the three largest FedCSR cells (their data loading) another 15. Against 12a1189 with the same
engine the geometric mean was 1.002 over the 21 cells, single cells 0.83-1.19 under that load.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

#: The checkout this script belongs to (the "new" tree).
PROJECT_ROOT = Path(__file__).resolve().parents[1]
#: The revision issue 43 started from: the default baseline.
DEFAULT_BASELINE = "12a1189"
#: Where baseline worktrees and the benchmark's caches live (git-ignored).
CACHE_DIR = PROJECT_ROOT / ".cache" / "grid_cost"
#: Optimiser steps run before the clock starts, in ``step`` cells.
STEP_WARMUP = 3


@dataclasses.dataclass(frozen=True)
class Cell:
    """One timed cell.

    Attributes:
        key: the recorded cell's ``config_hash``, or the name of an engine cell (:data:`ENGINE_CELLS`).
        why: why it is in the list.
        unit: ``"round"`` or ``"step"`` (module docstring).
        max_rounds: at most this many timed rounds whatever ``--rounds`` says (rounds of 30 s and more).
        in_geomean: counted in ``speedup_geomean`` (False only for the noiseless reference round).
        warmup_rounds: untimed rounds before the timed ones (round cells). One by default; more
            where the first rounds are not like the rest of the run (GPFedRec on LastFM-2K: its
            graph is partly proved complete in rounds 1-2 only, the full path from round 3 on).
    """
    key: str
    why: str
    unit: str = "round"
    max_rounds: Optional[int] = None
    in_geomean: bool = True
    warmup_rounds: int = 1


# Fixed in advance from the records at 12a1189 (ten largest wall_time_s, each paper's median, hot spots).
CELLS = (
    # -- the ten recorded cells with the largest wall_time_s ------------------------------------------
    Cell("e82d2ea8ced9eeaa", "top 1: FedRKG (FedNCF) LastFM-2K leaky, 3000 rounds, 13,585 s"),
    Cell("64b9720b4ca7c567", "top 2: FedCSR Food-Kitchen d=256 (v2), 18 rounds, 6,355 s", unit="step"),
    Cell("6c25c0dcb2a1f581", "top 3: FedCSR Movie-Book d=256 (v2), 20 rounds, 5,798 s", unit="step"),
    Cell("2ab86e101fc43e89", "top 4: FedRKG (PFedRec) LastFM-2K leaky, 3000 rounds, 5,787 s"),
    # Rounds 1-2 of this cell take the bounded path (about 610 of 1,269 rows of S); 137 of its 139
    # logged rounds take the full one, so round 4 is timed (round 2 until 29 Nov 2026).
    Cell("d34ff2e3208323ea", "top 5: GPFedRec LastFM-2K, 140 rounds at ~40 s (user-user similarity)", max_rounds=1,
         warmup_rounds=3),
    Cell("fb4a7a6bbd986eb9", "top 6: FedCSR Food-Kitchen d=64 (v1), 20 rounds, 5,026 s", unit="step"),
    Cell("005dbe4e88360c17", "top 7: FedCSR Food-Kitchen d=256 (v2, patience 20), 4,140 s", unit="step"),
    Cell("155f19952588c3b7", "top 8: NMCDR Elec-Cloth, 20 rounds at ~200 s", unit="step"),
    Cell("090f81d91fa7ea3d", "top 9: FedKDRec (LightGCN, -m) ML-100K, 200 rounds, 3,837 s"),
    Cell("35680446f8bda0e5", "top 10: FedKDRec (LightGCN, -c) ML-100K, 200 rounds, 3,732 s"),
    # -- each paper's median cell (by wall_time_s) ----------------------------------------------------------
    Cell("41a91c02a874dd84", "median f3crec: F3CRec (FedMF) ML-100K"),
    Cell("2033d71b2d834f1c", "median fedcsr: FedCSR Food-Kitchen", unit="step"),
    Cell("aa8beefd3c850e59", "median fedkdrec: FedKDRec (NeuMF) ML-100K"),
    Cell("96c2849fe9ee3faf", "median fedpcl_cdr: FedPCL-CDR Phone-Sport", unit="step"),
    Cell("98358ecd9e9e6df8", "median fedrkg: FedRAP Amazon-Video"),
    # -- hot spots of issue 43 not already above ----------------------------------------------------------
    Cell("fedmf-noise-touched", "hot spot: FedMF round on ML-100K, Laplace(0, 0.1) on the touched rows"),
    Cell("fedmf-noise-full", "hot spot: FedMF round on ML-100K, Laplace(0, 0.1) on the full table"),
    Cell("fedmf-noiseless", "reference: the same FedMF round without noise (not in the geomean)", in_geomean=False),
    Cell("969163f8087fb481", "hot spot: GPFedRec FilmTrust (~5 s per round)"),
    Cell("84392147dfa3e2c5", "hot spot: FedRAP FilmTrust with the public code's optimiser (batch 2048, 10 epochs)"),
    Cell("8bface6ad794fa61", "hot spot: PFedRec (FT) ML-100K, generic batched path"),
    Cell("ba953471aa72c3e1", "hot spot: clipped personal-table round (PFedRec, LDP clip 0.1) FilmTrust"),
)
#: Engine cells (no record): FedMF on all of ML-100K as in benchmarks/engine_speed.py; noise support or None.
ENGINE_CELLS = {"fedmf-noise-touched": "touched", "fedmf-noise-full": "full", "fedmf-noiseless": None}
#: ``--quick``: three cheap cells, one of each kind of path.
QUICK_CELLS = ("fedmf-noise-touched", "41a91c02a874dd84", "8bface6ad794fa61")


# ======================================================================================
# Records (read in the parent, from this tree's results/)
# ======================================================================================
def read_records(root: Path = PROJECT_ROOT) -> Dict[str, Dict[str, Any]]:
    """``{config_hash: record}``: the latest ``paper``-profile record of every cell (``kind`` records skipped)."""
    latest: Dict[str, Dict[str, Any]] = {}
    for path in sorted(glob.glob(str(root / "results" / "*" / "runs.jsonl"))):
        with open(path) as handle:
            for line in handle:
                if not line.strip():
                    continue
                record = json.loads(line)
                if record.get("kind") or record.get("profile") != "paper":
                    continue
                key = record["config_hash"]
                if key not in latest or record.get("timestamp", "") >= latest[key].get("timestamp", ""):
                    latest[key] = record
    return latest


def rounds_run(record: Mapping[str, Any]) -> Optional[float]:
    """Rounds the recorded run trained (F3CRec: summed over its blocks; FedKDRec: its fixed ``rounds``)."""
    metrics = record["metrics"]
    if metrics.get("rounds_run"):
        return float(metrics["rounds_run"])
    blocks = [v for k, v in metrics.items() if k.startswith("rounds/D") and v == v]
    if blocks:
        return float(sum(blocks))
    rounds = record["config"].get("rounds")
    return float(rounds) if rounds else None


def describe(cell: Cell, record: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """Paper, dataset, method (with backbone) and short hash of a cell, for the table."""
    if record is None:
        return {"paper": "engine", "dataset": "ML-100K", "method": f"FedMF {cell.key.split('-', 1)[1]}",
                "hash": cell.key}
    config = record["config"]
    method = config.get("method", "?")
    if config.get("backbone"):
        method = f"{method}({config['backbone']})"
    return {"paper": record["paper"], "dataset": config.get("dataset") or config.get("task", "?"),
            "method": method, "hash": record["config_hash"][:8]}


def paper_hours(records: Mapping[str, Mapping[str, Any]],
                is_before: Optional[Callable[[str], bool]] = None) -> Dict[str, Dict[str, float]]:
    """Recorded CPU-hours of each paper's grid (sum of ``wall_time_s`` over its latest records).

    Returns ``paper -> {"total", "before", "after"}``: ``after`` sums the records whose code is
    newer than the baseline (``is_before(commit)`` false), which already ran with (some of) the
    speed-ups, so the estimate does not divide them again. Without ``is_before`` every record
    counts as ``before``.
    """
    hours: Dict[str, Dict[str, float]] = {}
    for record in records.values():
        paper = hours.setdefault(record["paper"], {"total": 0.0, "before": 0.0, "after": 0.0})
        value = record["wall_time_s"] / 3600.0
        paper["total"] += value
        before = True if is_before is None else is_before(str(record.get("commit") or ""))
        paper["before" if before else "after"] += value
    return hours


def commit_predates(baseline: str, root: Path = PROJECT_ROOT) -> Callable[[str], bool]:
    """``is_before(commit)``: whether a record's commit is ``baseline`` or one of its ancestors.

    A ``+dirty`` suffix is ignored (the commit the tree was based on). A commit this checkout
    does not know (an empty field, a rewritten history) counts as before, the conservative side:
    its hours are divided by the speed-up like those of the other old records.
    """
    known: Dict[str, bool] = {}

    def is_before(commit: str) -> bool:
        commit = commit.split("+", 1)[0].strip()
        if not commit:
            return True
        if commit not in known:
            exists = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=root,
                                    capture_output=True).returncode == 0
            known[commit] = (not exists) or subprocess.run(
                ["git", "merge-base", "--is-ancestor", commit, baseline], cwd=root, capture_output=True).returncode == 0
        return known[commit]

    return is_before


# ======================================================================================
# The child: time one cell on whichever fedlib PYTHONPATH points to
# ======================================================================================
class _Enough(BaseException):
    """Raised out of a training callback once the units are timed (a BaseException, so that no
    ``except Exception`` of a trainer mistakes it for a failed run)."""


class UnitTimer:
    """CPU-seconds of consecutive units (rounds or steps) of one training run.

    ``tick(position)`` is called at the end of each unit; ``position`` is the unit's index in its
    run when known (a round number), so that an interval spanning two runs (F3CRec's blocks)
    is not counted. The first ``warmup`` ticks only start the clock; after ``timed`` counted
    intervals :class:`_Enough` stops the training.
    """

    def __init__(self, warmup: int, timed: int):
        if warmup < 1 or timed < 1:
            raise ValueError(f"warmup ({warmup}) and timed ({timed}) must be at least 1")
        self.warmup, self.timed = warmup, timed
        self.ticks, self.seconds, self.counted = 0, 0.0, 0
        self._last_clock: Optional[float] = None
        self._last_position: Optional[int] = None

    def tick(self, position: Optional[int] = None) -> None:
        now = time.process_time()
        self.ticks += 1
        consecutive = position is None or self._last_position is None or position == self._last_position + 1
        if self.ticks > self.warmup and self._last_clock is not None and consecutive:
            self.seconds += now - self._last_clock
            self.counted += 1
        self._last_clock, self._last_position = now, position
        if self.counted >= self.timed:
            raise _Enough()


def _round_of(args) -> Optional[int]:
    """The round number in a paper's per-round callback arguments (an int, or a record's ``"round"``)."""
    for value in reversed(args):
        if isinstance(value, Mapping) and isinstance(value.get("round"), (int, float)):
            return int(value["round"])
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value)
    return None


def _run_recorded(config: Mapping[str, Any], timer: UnitTimer, unit: str, cache_dir: Path) -> None:
    import importlib
    import inspect

    run_cell = importlib.import_module(f"fedlib.papers.{config['paper']}.experiment").run_cell
    accepted = inspect.signature(run_cell).parameters
    kwargs: Dict[str, Any] = {}
    if "cache_dir" in accepted:  # F3CRec's block-0 model: trained once, outside the timed rounds
        kwargs["cache_dir"] = cache_dir / config["paper"]
    if unit == "round":
        callback = lambda *args: timer.tick(_round_of(args))  # noqa: E731
        name = "on_round_end" if "on_round_end" in accepted else "progress"
        if name not in accepted:
            raise SystemExit(f"{config['paper']}'s run_cell takes neither on_round_end nor progress: "
                             f"time this cell in steps instead (Cell(..., unit='step'))")
        kwargs[name] = callback
    run_cell(dict(config), **kwargs)


def _run_engine(support: Optional[str], timer: UnitTimer) -> None:
    """FedMF on all 100,000 ML-100K ratings (943 clients per round, 4 negatives, batch 512, d = 32,
    float32), optionally with Laplace(0, 0.1) upload noise: the round of benchmarks/engine_speed.py."""
    import numpy as np

    from fedlib.data import load_interactions
    from fedlib.data.splits import Pairs
    from fedlib.engine import FederatedConfig, UploadNoise, fedmf_method, run_federated
    from fedlib.models import FedMF

    frame = load_interactions("ml-100k").frame
    _, users = np.unique(frame["user"].to_numpy(), return_inverse=True)
    item_ids, items = np.unique(frame["item"].to_numpy(), return_inverse=True)
    train = Pairs.from_arrays(users, items, int(users.max()) + 1)
    method = fedmf_method(FedMF(train.num_users, int(item_ids.size), dim=32), lr=1.0)
    if support is not None:
        method = dataclasses.replace(method, upload_noise=UploadNoise(0.1, support=support))
    config = FederatedConfig(rounds=timer.warmup + timer.timed + 1, seed=0, num_negatives=4, batch_size=512,
                             dtype="float32")
    run_federated(method, train, config, keep_best_state=False,
                  on_round_end=lambda run, record: timer.tick(_round_of((record,))))


def child_main(spec: Mapping[str, Any]) -> Dict[str, Any]:
    """Time one cell in this process: ``spec`` = ``{"key", "unit", "timed", "config" (or None), "tree"}``.

    Returns ``{"cpu_s_per_unit", "units", "fedlib"}`` (``fedlib``: where the package was imported from).
    """
    import torch

    torch.set_num_threads(1)
    import fedlib

    tree = Path(spec["tree"]).resolve()
    imported = Path(fedlib.__file__).resolve()
    if tree not in imported.parents:
        raise SystemExit(f"fedlib was imported from {imported.parent}, not from the tree under test {tree}: "
                         f"PYTHONPATH must put that tree first (is another fedlib installed non-editable?)")
    unit = spec["unit"]
    timer = UnitTimer(warmup=int(spec.get("warmup_rounds", 1)) if unit == "round" else STEP_WARMUP,
                      timed=int(spec["timed"]))
    hook = None
    if unit == "step":
        from torch.optim.optimizer import register_optimizer_step_post_hook
        hook = register_optimizer_step_post_hook(lambda optimizer, args, kwargs: timer.tick())
    try:
        if spec["config"] is None:
            _run_engine(ENGINE_CELLS[spec["key"]], timer)
        else:
            _run_recorded(spec["config"], timer, unit, Path(spec["cache_dir"]))
    except _Enough:
        pass
    finally:
        if hook is not None:
            hook.remove()
    if timer.counted == 0:
        raise SystemExit(f"cell {spec['key']}: the run ended after {timer.ticks} {unit} callback(s) before any "
                         f"{unit} was timed (a run shorter than the warm-up, or no torch optimiser step in a "
                         f"'step' cell)")
    return {"cpu_s_per_unit": timer.seconds / timer.counted, "units": timer.counted, "fedlib": str(imported.parent)}


# ======================================================================================
# The parent: trees, subprocesses, the table
# ======================================================================================
def baseline_tree(revision: str, root: Path = PROJECT_ROOT) -> Path:
    """A ``git worktree`` of ``revision`` under ``.cache/grid_cost/`` (reused when it is already there)."""
    def git(*args, cwd=root):
        return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()

    try:
        commit = git("rev-parse", "--verify", f"{revision}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"--baseline {revision!r} is not a revision of {root.name}: give a commit, branch or tag "
                         f"(e.g. {DEFAULT_BASELINE}), or 'none' to time only the current tree")
    tree = CACHE_DIR / f"worktree-{commit[:12]}"
    if tree.exists():
        if git("rev-parse", "HEAD", cwd=tree) != commit:
            raise SystemExit(f"{tree} exists but is not at {commit[:12]}: remove it with `git worktree remove {tree}`")
        return tree
    tree.parent.mkdir(parents=True, exist_ok=True)
    git("worktree", "add", "--detach", str(tree), commit)
    return tree


def time_in_subprocess(cell: Cell, config: Optional[Mapping[str, Any]], tree: Path, timed: int) -> Dict[str, Any]:
    """Run :func:`child_main` for ``cell`` in a fresh interpreter whose ``fedlib`` is ``tree``'s."""
    spec = {"key": cell.key, "unit": cell.unit, "timed": timed, "config": config, "tree": str(tree),
            "warmup_rounds": cell.warmup_rounds,
            "cache_dir": str(CACHE_DIR / "caches" / tree.name)}
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(spec, handle)
    try:
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", handle.name],
                              cwd=tree, env=env, capture_output=True, text=True)
    finally:
        os.unlink(handle.name)
    if done.returncode != 0:
        raise RuntimeError(f"timing {cell.key} on {tree} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def geometric_mean(values: Sequence[float]) -> float:
    values = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def select_cells(names: Optional[str], quick: bool) -> List[Cell]:
    """The cells named by ``--cells`` (hash prefixes or engine names, comma-separated), ``--quick``'s, or all."""
    if names is None:
        return [c for c in CELLS if c.key in QUICK_CELLS] if quick else list(CELLS)
    chosen = []
    for name in (n.strip() for n in names.split(",") if n.strip()):
        matches = [c for c in CELLS if c.key.startswith(name)]
        if len(matches) != 1:
            known = ", ".join(c.key[:8] if c.key not in ENGINE_CELLS else c.key for c in CELLS)
            raise SystemExit(f"--cells: {name!r} matches {len(matches)} of the fixed cells; give one of: {known}")
        chosen.append(matches[0])
    return chosen


#: Round cells time at least this many rounds (after the warm-up round).
MIN_TIMED_ROUNDS = 2
#: A cell that evaluates every ``eval_every ≤`` this many rounds is timed over one whole evaluation period.
LONGEST_TIMED_PERIOD = 10


def timed_rounds(cell: Cell, config: Optional[Mapping[str, Any]], rounds: Optional[int]) -> int:
    """How many rounds of a round cell are timed (after one warm-up round).

    ``rounds`` (``--rounds``) when given; otherwise one evaluation period: ``eval_every`` rounds
    for a cell whose config evaluates every ``eval_every ≤`` :data:`LONGEST_TIMED_PERIOD` rounds
    (rounds 2 … ``eval_every + 1``, which hold exactly one evaluation, so a grid's evaluation
    cost counts in proportion), else :data:`MIN_TIMED_ROUNDS`. ``cell.max_rounds`` caps either.
    """
    if rounds is None:
        period = (config or {}).get("eval_every")
        rounds = (max(MIN_TIMED_ROUNDS, int(period)) if isinstance(period, int) and 0 < period <= LONGEST_TIMED_PERIOD
                  else MIN_TIMED_ROUNDS)
    return min(rounds, cell.max_rounds or rounds)


def measure(cells: Sequence[Cell], records: Mapping[str, Mapping[str, Any]], new_tree: Path,
            old_tree: Optional[Path], *, rounds: Optional[int], steps: int, repeats: int, log=print,
            is_before: Optional[Callable[[str], bool]] = None) -> Dict[str, Any]:
    """Time ``cells`` on ``new_tree`` (and ``old_tree``, alternating); the result the JSON line prints.

    ``rounds``: timed rounds of every round cell, or ``None`` for each cell's own (:func:`timed_rounds`).
    ``is_before``: :func:`commit_predates` of the baseline; the estimate divides only the hours of
    records made before it by the speed-up (:func:`paper_hours`).
    """
    if repeats < 1 or (rounds is not None and rounds < 1) or steps < 1:
        raise ValueError(f"--repeats ({repeats}), --rounds ({rounds}) and --steps ({steps}) must be at least 1")
    rows = []
    for cell in cells:
        record = records.get(cell.key)
        if record is None and cell.key not in ENGINE_CELLS:
            raise SystemExit(f"cell {cell.key} has no paper-profile record in results/*/runs.jsonl")
        config = None if record is None else record["config"]
        timed = steps if cell.unit == "step" else timed_rounds(cell, config, rounds)
        old_times, new_times = [], []
        cell_started = time.perf_counter()
        for _ in range(repeats):  # old, new, old, new, ...: both see the same machine state
            if old_tree is not None:
                old_times.append(time_in_subprocess(cell, config, old_tree, timed)["cpu_s_per_unit"])
            new_times.append(time_in_subprocess(cell, config, new_tree, timed)["cpu_s_per_unit"])
        row = {**describe(cell, record), "key": cell.key, "unit": cell.unit, "units_timed": timed,
               "in_geomean": cell.in_geomean,
               "recorded_s_per_round": None, "old_cpu_s": None, "new_cpu_s": statistics.median(new_times),
               "speedup": None, "wall_s": None}
        if record is not None and rounds_run(record):
            row["recorded_s_per_round"] = record["wall_time_s"] / rounds_run(record)
        if old_times:
            row["old_cpu_s"] = statistics.median(old_times)
            row["speedup"] = row["old_cpu_s"] / row["new_cpu_s"]
        row["wall_s"] = time.perf_counter() - cell_started  # of all its subprocesses, loading included
        rows.append(row)
        log(_format_row(row), flush=True)
    recorded = paper_hours(records, is_before)
    papers = {}
    for paper in sorted(recorded):
        speedups = [r["speedup"] for r in rows if r["paper"] == paper and r["speedup"] is not None]
        speedup = geometric_mean(speedups) if speedups else None
        hours = recorded[paper]
        papers[paper] = {"recorded_cpu_hours": hours["total"], "recorded_after_baseline_hours": hours["after"],
                         "cells_timed": len(speedups), "speedup_geomean": speedup,
                         "estimated_cpu_hours_now": hours["before"] / speedup + hours["after"] if speedups else None}
    counted = [r["speedup"] for r in rows if r["in_geomean"] and r["speedup"] is not None]
    return {"baseline": None if old_tree is None else str(old_tree.name),
            "speedup_geomean": geometric_mean(counted) if counted else None,
            "cells_in_geomean": len(counted), "rounds": rounds, "steps": steps, "repeats": repeats,
            "cells": rows, "papers": papers}


HEADER = (f"{'paper':<11}{'dataset':<14}{'method':<22}{'hash':<21}{'unit':<6}{'rec s/rnd':>10}"
          f"{'old CPU-s':>11}{'new CPU-s':>11}{'old/new':>9}{'wall':>9}")


def _number(value, width, digits=3):
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def _format_row(row: Mapping[str, Any]) -> str:
    return (f"{row['paper']:<11}{row['dataset'][:13]:<14}{row['method'][:21]:<22}{row['hash'][:20]:<21}"
            f"{row['unit']:<6}{_number(row['recorded_s_per_round'], 10, 2)}{_number(row['old_cpu_s'], 11, 4)}"
            f"{_number(row['new_cpu_s'], 11, 4)}{_number(row['speedup'], 9, 2)}"
            f"{row['wall_s']:>8.0f}s" + ("" if row["in_geomean"] else "  (reference)"))


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=DEFAULT_BASELINE,
                        help=f"revision to compare against (default {DEFAULT_BASELINE}); 'none': only the current tree")
    parser.add_argument("--baseline-tree", type=Path, default=None,
                        help="an existing checkout to use as the old tree instead of a worktree of --baseline")
    parser.add_argument("--rounds", type=int, default=None,
                        help="timed rounds per round cell, after one warm-up round (default: one evaluation period "
                             f"of cells evaluating every <= {LONGEST_TIMED_PERIOD} rounds, else {MIN_TIMED_ROUNDS})")
    parser.add_argument("--steps", type=int, default=10,
                        help=f"timed optimiser steps per step cell, after {STEP_WARMUP} warm-up steps")
    parser.add_argument("--repeats", type=int, default=2, help="runs per tree and cell (the median counts)")
    parser.add_argument("--cells", default=None, help="comma-separated hash prefixes or engine names (default: all)")
    parser.add_argument("--quick", action="store_true", help="three cheap cells, one round or five steps, one repeat")
    parser.add_argument("--list", action="store_true", help="print the fixed cells and exit")
    parser.add_argument("--json-only", action="store_true", help="print only the JSON line")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        with open(args.child) as handle:
            result = child_main(json.load(handle))
        print(json.dumps(result))
        return result
    if args.list:
        for cell in CELLS:
            print(f"{cell.key:<22}{cell.unit:<6}{cell.why}")
        return {}
    if args.quick:
        args.rounds, args.steps, args.repeats = 1, 5, 1
    log = (lambda *a, **k: None) if args.json_only else print
    started = time.perf_counter()
    cells = select_cells(args.cells, args.quick)
    records = read_records()
    if args.baseline_tree is not None:
        old_tree = args.baseline_tree.resolve()
        if not (old_tree / "fedlib").is_dir():
            raise SystemExit(f"--baseline-tree {old_tree} holds no fedlib/ package: give the root of a checkout")
    elif args.baseline.lower() == "none":
        old_tree = None
    else:
        old_tree = baseline_tree(args.baseline)
    log(f"CPU-seconds per unit on one torch thread; old = {old_tree.name if old_tree else '(none)'}, "
        f"new = {PROJECT_ROOT.name}; rounds {args.rounds or 'one evaluation period, else 2'} (+1 warm-up), steps {args.steps} (+{STEP_WARMUP} "
        f"warm-up), median of {args.repeats}; rec s/rnd = recorded wall_time_s / rounds run (context only)")
    log(HEADER)
    is_before = commit_predates(args.baseline) if old_tree is not None and args.baseline_tree is None else None
    result = measure(cells, records, PROJECT_ROOT, old_tree, rounds=args.rounds, steps=args.steps,
                     repeats=args.repeats, log=log, is_before=is_before)
    result["baseline"] = None if old_tree is None else (str(args.baseline_tree) if args.baseline_tree
                                                        else args.baseline)
    result["total_s"] = time.perf_counter() - started
    log("")
    log(f"{'paper':<12}{'recorded CPU-h':>15}{'of which new':>13}{'cells timed':>12}{'speed-up':>10}"
        f"{'est. CPU-h now':>16}")
    for paper, numbers in result["papers"].items():
        log(f"{paper:<12}{numbers['recorded_cpu_hours']:>15.1f}{numbers['recorded_after_baseline_hours']:>13.1f}"
            f"{numbers['cells_timed']:>12}"
            f"{_number(numbers['speedup_geomean'] if numbers['cells_timed'] else None, 10, 2)}"
            f"{_number(numbers['estimated_cpu_hours_now'], 16, 1)}")
    total = sum(p["recorded_cpu_hours"] for p in result["papers"].values())
    log(f"{'all':<12}{total:>15.1f}   (estimate = hours recorded before the baseline / the paper's geometric-mean "
        f"speed-up + the hours of newer records)")
    geomean = result["speedup_geomean"]
    log(f"speedup_geomean over {result['cells_in_geomean']} cells: "
        f"{'-' if geomean is None else f'{geomean:.3f}'}; total {result['total_s']:.0f} s")
    print(json.dumps(result, default=float))
    return result


if __name__ == "__main__":
    main()
