"""Results files: run records, paper-vs-ours tables and their provenance.

Two kinds of file live in ``results/<paper>/`` (``paper`` profile) and in
``results/<paper>/<profile>/`` (``quick``, ``smoke``):

``runs.jsonl``
    An append-only log, one JSON line per finished training run: the configuration and
    its hash, seed, git commit, device, library versions, wall time, peak memory and metrics
    (:func:`append_run`). A run is identified by its *run id*, which is the
    :func:`config_hash` of its configuration including the seed.

``<table_id>.csv``
    One row per number of a paper table: the paper's value, ours, the delta and where
    ours came from (:func:`compare_with_paper`; written by
    :func:`fedlib.reporting.results_tables.write_results_table`). Every
    ``value_ours`` names the runs it was computed from in ``run_ids``, so the consistency
    check (:mod:`fedlib.reporting.consistency`) can recompute it from ``runs.jsonl``.

Only ``paper``-profile runs write ``results/<paper>/*.csv``; quick and smoke runs write
below their own sub-folder and can never overwrite a recorded table.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import operator
import os
import platform
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path, PurePath
from typing import Any, Literal, Optional

import numpy as np
import pandas as pd

from fedlib.data.paper_tables import PAPER_VALUE_COLUMNS
from fedlib.paths import _GIT_TIMEOUT_S, current_commit, project_root, results_dir  # current_commit: part of this module's API

try:  # POSIX only; elsewhere appends rely on O_APPEND alone.
    import fcntl
except ImportError:  # pragma: no cover - exercised on Windows only
    fcntl = None

PROFILES = ("smoke", "quick", "paper")
"""The run profiles, cheapest first. Each writes its own results folder
(:func:`fedlib.paths.results_dir`); notebooks read their settings per profile
(:mod:`fedlib.notebook.profiles`, which takes the names from here)."""

# --------------------------------------------------------------------------------------
# Schema of a results table
# --------------------------------------------------------------------------------------

STANDARD_COLUMNS = (
    "table",
    "dataset",
    "method",
    "metric",
    "value_paper",
    "value_ours",
    "delta",
    "delta_rel",
    "confidence",
    "profile",
    "n_seeds",
    "commit",
    "device",
)
"""The columns every results table starts with (see the notebook standard)."""

REQUIRED_COLUMNS = STANDARD_COLUMNS + ("run_ids", "note")
"""Standard columns plus the provenance link (``run_ids``) and the explanation (``note``)."""

PROVENANCE_COLUMNS = ("std_ours", "unit", "ours_unit", "run_metric", "run_ids", "flags", "note")
"""Optional columns written after the table's own keys.

``unit`` is the paper's unit, in which ``value_ours``, ``std_ours`` and ``delta`` are
expressed; ``ours_unit`` is the unit of the metric in ``runs.jsonl``; ``run_metric`` is the
metric's name there; ``run_ids`` lists the runs (config hashes, ``;``-separated); ``flags``
the reasons to read the value with care (:data:`fedlib.reporting.flags.FLAG_ORDER`).
"""

VALUE_COLUMNS = frozenset(STANDARD_COLUMNS[4:]) | frozenset(PROVENANCE_COLUMNS)
"""Columns that describe a cell. Every other column of a results table identifies it."""

FLOAT_COLUMNS = ("value_paper", "value_ours", "std_ours", "delta", "delta_rel")

RUN_ID_SEPARATOR = ";"

NEEDS_DOWNLOAD_NOTE = "dataset needs download"
"""The note for a paper cell we could not produce because its data is absent.

The README status table counts cells whose note mentions "download" as *needing data*.
"""

_SLUG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")


def key_columns(table: pd.DataFrame) -> list[str]:
    """The identifying columns of a results table (``table``, ``dataset``, keys, ``metric``)."""
    return [column for column in table.columns if column not in VALUE_COLUMNS]


def check_profile(profile: str) -> str:
    """Return ``profile`` if it is one of :data:`PROFILES`, else raise.

    Checked before any path is built: ``results_dir`` maps every profile other than
    ``paper`` to a sub-folder, and an empty or odd profile must not land in the recorded one.
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; expected one of {', '.join(PROFILES)}")
    return profile


def check_slug(name: str, what: str = "name") -> str:
    """Return ``name`` if it is a safe file-name stem (letters, digits, ``_``, ``-``)."""
    if not isinstance(name, str) or not _SLUG.match(name):
        raise ValueError(
            f"{what} {name!r} is not a safe file name: use letters, digits, '_' and '-' "
            "(at most 100 characters, starting with a letter or digit)"
        )
    return name


# --------------------------------------------------------------------------------------
# Configuration hashing
# --------------------------------------------------------------------------------------


def to_canonical(value: Any, *, _path: str = "config", _non_finite: str = "reject") -> Any:
    """Convert ``value`` to plain JSON data, or raise ``TypeError`` naming the bad entry.

    * mappings must have string keys (an int key would collide with its string form);
    * tuples and lists become lists, numpy arrays their ``tolist()``;
    * numpy scalars become Python ``bool``/``int``/``float``;
    * paths become strings;
    * dataclass instances become a mapping of their fields plus ``"__dataclass__"`` (the
      class name), so two config classes with the same fields do not collide;
    * ``int`` and ``float`` stay distinct (``1`` and ``1.0`` hash differently);
    * NaN and infinities are rejected (configs) or stored as ``null`` (metrics).
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        number = float(value)
        if not math.isfinite(number):
            if _non_finite == "null":
                return None
            raise TypeError(f"{_path}: {number!r} is not a finite number and cannot be hashed")
        return number
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Mapping):
        result = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{_path}: key {key!r} is a {type(key).__name__}; only string keys are allowed")
            result[str(key)] = to_canonical(item, _path=f"{_path}[{key!r}]", _non_finite=_non_finite)
        return result
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        result = {"__dataclass__": type(value).__qualname__}
        for field in dataclasses.fields(value):
            result[field.name] = to_canonical(
                getattr(value, field.name), _path=f"{_path}.{field.name}", _non_finite=_non_finite
            )
        return result
    if isinstance(value, (list, tuple)):
        return [to_canonical(item, _path=f"{_path}[{i}]", _non_finite=_non_finite) for i, item in enumerate(value)]
    if isinstance(value, np.ndarray):
        return to_canonical(value.tolist(), _path=_path, _non_finite=_non_finite)
    raise TypeError(
        f"{_path}: cannot serialise a {type(value).__module__}.{type(value).__qualname__} "
        "(allowed: str, int, float, bool, None, paths, numpy scalars and arrays, lists, tuples, "
        "string-keyed mappings, dataclasses); convert it to one of these first"
    )


def canonical_json(config: Mapping[str, Any] | Any) -> str:
    """The canonical JSON text of ``config``: sorted keys, no spaces, exact float reprs."""
    if not (isinstance(config, Mapping) or (dataclasses.is_dataclass(config) and not isinstance(config, type))):
        raise TypeError(f"a configuration must be a mapping or a dataclass instance, not {type(config).__name__}")
    # Python's float repr is the shortest string that round-trips, so equal floats give
    # equal text and different floats (0.1 + 0.2 vs 0.3) give different text.
    return json.dumps(to_canonical(config), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def config_hash(config: Mapping[str, Any] | Any) -> str:
    """First 16 hex digits of the SHA-256 of :func:`canonical_json` (64 bits).

    Stable across processes, Python versions and key order; tuples hash like lists.
    """
    return hashlib.sha256(canonical_json(config).encode("utf-8")).hexdigest()[:16]


# --------------------------------------------------------------------------------------
# Provenance of a run
# --------------------------------------------------------------------------------------

def check_recordable_commit(commit: str, root: str | Path | None = None) -> str:
    """``commit`` if a ``paper``-profile record may carry it, else a ``ValueError`` saying what to do.

    The recorded tables must trace every number to code anyone can check out: the commit must
    name committed code (not ``unknown``, no ``+dirty``: changes under ``results/``, ``figures/``
    and executed notebooks do not count, see :func:`current_commit`) and exist in the project's
    history. There is no override: commit the change, then run the grid.
    """
    commit = str(commit or "").strip()
    fix = "commit (or stash) the change to fedlib/, tests/ or the notebooks' sources first, then run the grid again"
    if commit in ("", "unknown"):
        raise ValueError("a paper-profile record needs the commit of the code that ran, and this checkout has none "
                         "(not a git checkout, or git is missing): run the grid from a clone of the project")
    if commit.endswith("+dirty"):
        raise ValueError(f"a paper-profile record must come from committed code, and the checkout at "
                         f"{commit.split('+')[0]} has uncommitted changes ({commit}): {fix}")
    root_path = Path(root) if root is not None else project_root()
    try:
        found = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=root_path, capture_output=True,
                               timeout=_GIT_TIMEOUT_S).returncode == 0
    except (OSError, subprocess.SubprocessError):
        found = False
    if not found:
        raise ValueError(f"a paper-profile record names commit {commit!r}, which is not in the history of "
                         f"{root_path}: record only from code that exists there")
    return commit


def _default_device() -> str:
    from fedlib.device import default_device

    return str(default_device())


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """One finished training run, as stored in ``runs.jsonl``.

    ``config_hash`` (the run id) is the hash of ``config``, which always includes ``seed``.
    ``peak_rss_mb`` is the run's peak resident memory in MiB
    (:class:`fedlib.experiments.cells.PeakRSS`), or ``None`` when it was not measured
    (records written before the field existed, runs recorded outside a grid).
    ``cpu_time_s`` is the CPU time of the process (all its threads, seconds) spent training the
    run, or ``None`` when it was not measured (older records, runs resumed from a checkpoint of
    an earlier session). Unlike ``wall_time_s`` it does not grow when other processes share
    the cores, so it is what a cost comparison between records should read.
    ``torch_threads`` is ``torch.get_num_threads()`` during the run (``None`` in older records):
    float32 sums can be ordered differently with another thread count, so a run repeats its
    numbers bit for bit only with the same count.
    """

    config_hash: str
    paper: str
    profile: str
    seed: int
    config: dict
    metrics: dict
    wall_time_s: float
    commit: str
    device: str
    fedlib_version: str
    torch_version: str
    python_version: str
    timestamp: str
    extra: dict = dataclasses.field(default_factory=dict)
    peak_rss_mb: Optional[float] = None
    cpu_time_s: Optional[float] = None
    torch_threads: Optional[int] = None

    @property
    def run_id(self) -> str:
        return self.config_hash

    def result(self) -> dict:
        """``{"config", "metrics", "extra"}``: the run in the shape a live run returns (copies)."""
        return {"config": dict(self.config), "metrics": dict(self.metrics), "extra": dict(self.extra or {})}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json_line(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunRecord":
        """Build a record from its JSON form.

        Fields added by later versions are ignored; optional fields an older record lacks
        (``extra``, ``peak_rss_mb``, ``cpu_time_s``, ``torch_threads``) take their defaults.
        """
        names = [field.name for field in dataclasses.fields(cls)]
        required = [field.name for field in dataclasses.fields(cls)
                    if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            raise ValueError(f"run record lacks {', '.join(missing)}")
        return cls(**{name: data[name] for name in names if name in data})


def runs_path(paper: str, profile: str) -> Path:
    """``runs.jsonl`` of ``paper`` at ``profile``."""
    return results_dir(paper, check_profile(profile)) / "runs.jsonl"


def append_run(
    paper: str,
    profile: str,
    config: Mapping[str, Any],
    seed: int,
    metrics: Mapping[str, Any],
    wall_time_s: float,
    extra: Optional[Mapping[str, Any]] = None,
    *,
    device: Optional[str] = None,
    commit: Optional[str] = None,
    peak_rss_mb: Optional[float] = None,
    cpu_time_s: Optional[float] = None,
    torch_threads: Optional[int] = None,
) -> RunRecord:
    """Append one run to ``results_dir(paper, profile)/runs.jsonl`` and return its record.

    ``config`` is every setting that determines the run. ``seed`` is added to it when it is
    absent (a ``seed`` entry that disagrees is an error), so the run id distinguishes seeds.
    ``metrics`` maps metric names to numbers; NaN is stored as ``null``. ``device`` and
    ``commit`` default to :func:`fedlib.device.default_device` and :func:`current_commit`.
    ``peak_rss_mb`` is the run's peak resident memory in MiB (``None``: not measured).
    ``cpu_time_s`` is the CPU time (all threads, seconds) of its training (``None``: not measured).
    ``torch_threads``: torch's thread count during the run (default: the current
    ``torch.get_num_threads()``).

    The line is written with one ``write`` on a file opened for appending, under an
    exclusive ``flock`` where available, then fsync'ed: two writing processes (two grid
    commands, a grid and a notebook) cannot interleave their lines, and a finished run
    survives a crash right after.
    """
    check_profile(profile)
    path = runs_path(paper, profile)
    seed = operator.index(seed)
    if not (isinstance(config, Mapping) or (dataclasses.is_dataclass(config) and not isinstance(config, type))):
        raise TypeError(f"config must be a mapping or a dataclass instance, not {type(config).__name__}")
    canonical_config = to_canonical(config)
    if "seed" in canonical_config and canonical_config["seed"] != seed:
        raise ValueError(f"config['seed'] = {canonical_config['seed']!r} disagrees with seed = {seed!r}")
    canonical_config["seed"] = seed
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a mapping of metric name to number, not {type(metrics).__name__}")
    wall_time_s = float(wall_time_s)
    if not (math.isfinite(wall_time_s) and wall_time_s >= 0):
        raise ValueError(f"wall_time_s must be a finite non-negative number, got {wall_time_s!r}")
    if peak_rss_mb is not None:
        peak_rss_mb = float(peak_rss_mb)
        if not (math.isfinite(peak_rss_mb) and peak_rss_mb >= 0):
            raise ValueError(f"peak_rss_mb must be a finite non-negative number of MiB or None, got {peak_rss_mb!r}")
    if cpu_time_s is not None:
        cpu_time_s = float(cpu_time_s)
        if not (math.isfinite(cpu_time_s) and cpu_time_s >= 0):
            raise ValueError(f"cpu_time_s must be a finite non-negative number of seconds or None, got {cpu_time_s!r}")

    import torch

    import fedlib

    torch_threads = torch.get_num_threads() if torch_threads is None else operator.index(torch_threads)
    if torch_threads < 1:
        raise ValueError(f"torch_threads must be a positive thread count, got {torch_threads!r}")
    record = RunRecord(
        config_hash=config_hash(canonical_config),
        paper=paper,
        profile=profile,
        seed=seed,
        config=canonical_config,
        metrics=to_canonical(metrics, _path="metrics", _non_finite="null"),
        wall_time_s=wall_time_s,
        commit=commit if commit is not None else current_commit(),
        device=device if device is not None else _default_device(),
        fedlib_version=fedlib.__version__,
        torch_version=torch.__version__,
        python_version=platform.python_version(),
        timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        extra=to_canonical(dict(extra or {}), _path="extra", _non_finite="null"),
        peak_rss_mb=peak_rss_mb,
        cpu_time_s=cpu_time_s,
        torch_threads=torch_threads,
    )
    if profile == "paper":
        check_recordable_commit(record.commit)
        _append_line(path, record.to_json_line())
    else:
        # quick and smoke runs are refreshed by every notebook execution: the newest record
        # of a configuration replaces the older ones, so the tracked files do not grow.
        _replace_config_line(path, record.config_hash, record.to_json_line())
    return record


def _append_line(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        data = line.encode("utf-8")
        # A writer killed mid-line would glue our record onto its fragment; start a fresh
        # line so ours stays readable (the fragment is reported by read_run_file).
        size = os.fstat(fd).st_size
        if size and _last_byte(path) != b"\n":
            data = b"\n" + data
        written = os.write(fd, data)
        while written < len(data):  # regular files take it in one go; stay correct anyway
            written += os.write(fd, data[written:])
        os.fsync(fd)
    finally:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _replace_config_line(path: Path, config_hash_value: str, line: str) -> None:
    """Rewrite ``path`` without the records of ``config_hash_value``, then with ``line`` last.

    The rewrite goes through a temporary file and ``os.replace`` (never a half-written
    file), under an exclusive ``flock`` on a sibling ``.lock`` file so that two notebook
    runs refreshing the same file do not lose each other's records.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(path.with_name(path.name + ".lock"), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        kept = []
        if path.exists():
            for old_line in path.read_text(encoding="utf-8").splitlines():
                if not old_line.strip():
                    continue
                try:
                    same = json.loads(old_line).get("config_hash") == config_hash_value
                except json.JSONDecodeError:
                    same = False  # a fragment stays; read_run_file reports it
                if not same:
                    kept.append(old_line)
        kept.append(line.rstrip("\n"))
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text("\n".join(kept) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        if fcntl is not None:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
        os.close(lock_fd)


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1)


def read_run_file(path: str | Path) -> list[RunRecord]:
    """Every record of a ``runs.jsonl`` file, in file order; ``[]`` when it does not exist.

    A malformed line raises ``ValueError`` naming the file and line number.
    """
    path = Path(path)
    if not path.exists():
        return []
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                records.append(RunRecord.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError, ValueError) as error:
                raise ValueError(f"{path}:{number}: not a valid run record ({error})") from None
    return records


def read_runs(paper: str, profile: str) -> list[RunRecord]:
    """Every run recorded for ``paper`` at ``profile``, in the order they finished."""
    return read_run_file(runs_path(paper, profile))


def latest_records(records: Iterable[RunRecord]) -> dict[str, RunRecord]:
    """Run id -> record; when a configuration was run again, the later record wins."""
    latest: dict[str, RunRecord] = {}
    for record in records:
        latest[record.config_hash] = record
    return latest


def recorded_seeds(records: Iterable[RunRecord]) -> list[int]:
    """The seeds present in ``records``, sorted (``[0]`` when there is none)."""
    return sorted({int(record.seed) for record in records}) or [0]


def runs_of_config(records: Iterable[RunRecord], config: Mapping[str, Any]) -> list[RunRecord]:
    """The latest record of ``config`` at every recorded seed (seed order); seeds without one are skipped."""
    records = list(records)
    known = latest_records(records)
    return [known[h] for h in (config_hash({**config, "seed": s}) for s in recorded_seeds(records)) if h in known]


def cell_index(records: Sequence[RunRecord], pairs: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]
               ) -> dict[str, Mapping[str, Any]]:
    """Run id -> table keys, for every ``(keys, cell config)`` pair at every seed in ``records``.

    Paper grids build a cell without a seed-specific key besides ``seed``; this maps each
    recorded seed's run of the cell to the cell's table keys (for :func:`aggregate_runs`).
    """
    pairs = list(pairs)
    index: dict[str, Mapping[str, Any]] = {}
    for seed in recorded_seeds(records):
        for keys, config in pairs:
            index[config_hash({**config, "seed": seed})] = keys
    return index


def aggregate_runs(
    records: Iterable[RunRecord],
    cell_of: Callable[[RunRecord], Optional[Mapping[str, Any]]],
    *,
    metric_cells: Optional[Callable[[str], Optional[Mapping[str, Any]]]] = None,
    ours_unit: str = "fraction",
) -> pd.DataFrame:
    """Average recorded runs over seeds into the ``ours`` frame :func:`compare_with_paper` takes.

    ``cell_of(record)`` returns the table keys the run belongs to (``{"dataset": ...,
    "method": ..., "backbone": ...}``), or ``None`` to skip the run. Each metric of the
    run becomes one cell; ``metric_cells(name)`` maps a metric name to its keys (default
    ``{"metric": name}``; for example ``"N@20/D1"`` -> ``{"metric": "N@20", "block": "D1"}``)
    or ``None`` to skip it. When a configuration was run twice, its later record is used.

    Returns one row per cell: the keys, ``value`` (mean over seeds; NaN if any seed has
    none), ``std`` (sample standard deviation, NaN for one seed), ``n_seeds``, ``run_ids``,
    ``run_metric``, ``ours_unit``, ``commit`` and ``device`` (distinct values joined by ``;``).
    """
    cells: dict[tuple, list[tuple[RunRecord, str]]] = {}
    cell_keys: dict[tuple, dict] = {}
    for record in latest_records(records).values():
        base = cell_of(record)
        if base is None:
            continue
        for name in record.metrics:
            extra = metric_cells(name) if metric_cells is not None else {"metric": name}
            if extra is None:
                continue
            keys = {**base, **extra}
            identity = tuple(sorted((str(k), str(v)) for k, v in keys.items()))
            cells.setdefault(identity, []).append((record, name))
            cell_keys[identity] = keys

    rows = []
    for identity, members in cells.items():
        names = {name for _, name in members}
        if len(names) > 1:
            raise ValueError(f"cell {cell_keys[identity]} collects different metrics {sorted(names)}")
        seeds = [record.seed for record, _ in members]
        if len(set(seeds)) != len(seeds):
            raise ValueError(
                f"cell {cell_keys[identity]} has two different configurations with the same seed; "
                "cell_of must map each configuration to its own cell"
            )
        members = sorted(members, key=lambda member: member[0].seed)
        values = []
        for record, name in members:
            raw = record.metrics[name]
            if raw is not None and not isinstance(raw, (int, float)):
                raise TypeError(f"metric {name!r} of run {record.config_hash} is not a number: {raw!r}")
            values.append(math.nan if raw is None else float(raw))
        array = np.asarray(values, dtype=float)
        rows.append(
            {
                **cell_keys[identity],
                "value": float(array.mean()),
                "std": float(array.std(ddof=1)) if len(array) > 1 else math.nan,
                "n_seeds": len(members),
                "run_ids": RUN_ID_SEPARATOR.join(record.config_hash for record, _ in members),
                "run_metric": next(iter(names)),
                "ours_unit": ours_unit,
                "commit": RUN_ID_SEPARATOR.join(sorted({record.commit for record, _ in members})),
                "device": RUN_ID_SEPARATOR.join(sorted({record.device for record, _ in members})),
            }
        )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------
# Units
# --------------------------------------------------------------------------------------

SCORE_UNITS = ("fraction", "percent")


def convert_unit(values: Any, from_unit: str, to_unit: str) -> Any:
    """Express ``values`` (a number or array) given in ``from_unit`` in ``to_unit``.

    Only the fraction (0-1) / percent (0-100) pair is converted; any other pair of
    different units is an error, so a mismatch is never silently off by a factor.
    """
    if from_unit == to_unit:
        return values
    if (from_unit, to_unit) == ("fraction", "percent"):
        return values * 100.0
    if (from_unit, to_unit) == ("percent", "fraction"):
        return values / 100.0
    raise ValueError(
        f"cannot convert {from_unit!r} to {to_unit!r}; report our values in the paper's unit "
        f"(only fraction <-> percent is converted)"
    )


# --------------------------------------------------------------------------------------
# Paper vs ours
# --------------------------------------------------------------------------------------

_OURS_COLUMNS = ("value", "std", "n_seeds", "run_ids", "run_metric", "ours_unit", "commit", "device", "note")


def _normalise_keys(frame: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Keys as text with ``""`` for missing, so ``NaN`` and ``""`` match when merging."""
    frame = frame.copy()
    for key in keys:
        frame[key] = frame[key].map(lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
    return frame


def _duplicates(frame: pd.DataFrame, keys: Sequence[str]) -> list[dict]:
    duplicated = frame[frame.duplicated(list(keys), keep=False)]
    return duplicated[list(keys)].drop_duplicates().head(5).to_dict("records")


def compare_with_paper(
    ours: pd.DataFrame,
    paper: pd.DataFrame,
    keys: Sequence[str],
    *,
    profile: str,
    missing_note: str | Callable[[pd.Series], str] = "not run at this profile",
    unmatched: Literal["error", "keep"] = "error",
    ours_unit: Optional[str] = None,
    commit: Optional[str] = None,
    device: Optional[str] = None,
) -> pd.DataFrame:
    """Put our numbers next to the paper's, one row per paper cell, in the results layout.

    ``paper`` is one paper table (:func:`~fedlib.data.paper_tables.load_paper_table`),
    usually filtered to the cells this table regenerates. ``ours`` has the ``keys`` columns
    and ``value``; optionally ``std``, ``n_seeds``, ``run_ids``, ``run_metric``,
    ``ours_unit``, ``commit``, ``device`` and ``note`` (:func:`aggregate_runs` builds it).
    ``keys`` must identify one row in each frame.

    **Units.** ``value_ours``, ``std_ours`` and ``delta`` are in the *paper's* unit. Our
    metrics are usually fractions (0-1); when the paper prints percent (0-100) ours are
    multiplied by 100 before the delta is taken, so ``delta`` is in percentage points.
    Our unit comes from ``ours_unit`` (argument, then column); by default it is
    ``fraction`` for score cells (paper unit ``fraction`` or ``percent``) and the paper's
    own unit for everything else (counts, MB, ...). Any other unit mismatch is an error.

    **Arithmetic.** ``delta = value_ours - value_paper``; ``delta_rel = delta / value_paper``
    (empty when the paper value is 0 or missing).

    **Missing cells.** A paper cell without ours keeps ``value_paper``, an empty
    ``value_ours``, ``n_seeds = 0`` and a ``note``: ``missing_note`` (a string, or a
    function of the paper row, e.g. returning :data:`NEEDS_DOWNLOAD_NOTE` for absent
    datasets). Our cells with no paper counterpart are an error (``unmatched="error"``,
    which catches misspelt keys) or kept with an empty ``value_paper`` (``"keep"``).

    ``commit`` and ``device`` fill in cells whose ``ours`` row does not carry them
    (default: the current commit and device).
    """
    check_profile(profile)
    keys = list(keys)
    if not keys:
        raise ValueError("keys must name at least one column (e.g. ['dataset', 'method', 'metric'])")
    for name, frame in (("paper", paper), ("ours", ours)):
        absent = [key for key in keys if key not in frame.columns]
        if absent:
            raise KeyError(f"{name} frame lacks key column(s) {absent}; it has {list(frame.columns)}")
    value_like = [key for key in keys if key in PAPER_VALUE_COLUMNS or key in VALUE_COLUMNS]
    if value_like:
        raise ValueError(f"{value_like} describe a cell and cannot be keys")
    if "value" not in ours.columns:
        raise KeyError(f"ours frame needs a 'value' column; it has {list(ours.columns)}")
    for column in ("table", "value", "unit", "confidence"):
        if column not in paper.columns:
            raise KeyError(f"paper frame lacks {column!r}; pass a table from load_paper_table()")
    table_ids = sorted(set(paper["table"]))
    if len(table_ids) != 1:
        raise ValueError(f"paper frame must hold one table, it holds {table_ids}")
    table_id = table_ids[0]

    paper_frame = _normalise_keys(paper.reset_index(drop=True), keys)
    ours_frame = _normalise_keys(ours.reset_index(drop=True), keys)
    for name, frame in (("paper", paper_frame), ("ours", ours_frame)):
        duplicates = _duplicates(frame, keys)
        if duplicates:
            raise ValueError(
                f"{name} rows are not unique on keys {keys}, e.g. {duplicates}; "
                "add a key (stat, setting, block, ...) or filter the frame first"
            )

    # The paper side brings its identifying columns; keys we were not given are carried
    # along so every row of the results file says exactly which paper cell it is.
    paper_keys = [c for c in paper_frame.columns if c not in PAPER_VALUE_COLUMNS and c != "paper"]
    paper_side = paper_frame[paper_keys + ["value", "unit", "confidence"]].rename(columns={"value": "value_paper"})
    ours_side = ours_frame[keys + [c for c in _OURS_COLUMNS if c in ours_frame.columns]].rename(
        columns={c: f"ours:{c}" for c in _OURS_COLUMNS}
    )
    # An outer merge sorts its keys; keep the paper's row order, our extra cells last.
    paper_side["_paper_order"] = range(len(paper_side))
    ours_side["ours:order"] = range(len(ours_side))
    merged = paper_side.merge(ours_side, on=keys, how="outer", indicator=True)
    merged = merged.sort_values(["_paper_order", "ours:order"], na_position="last", kind="stable")

    only_ours = merged[merged["_merge"] == "right_only"]
    if unmatched not in ("error", "keep"):
        raise ValueError(f"unmatched must be 'error' or 'keep', not {unmatched!r}")
    if len(only_ours) and unmatched == "error":
        examples = only_ours[keys].head(10).to_dict("records")
        raise ValueError(
            f"{len(only_ours)} of our cells match no paper cell on keys {keys}, e.g. {examples}; "
            "check the spelling of datasets/methods/metrics, or pass unmatched='keep'"
        )

    # Resolved lazily: a table with no live cell needs neither git nor torch.
    fill_commit, fill_device = commit, device
    rows = []
    for _, row in merged.iterrows():
        has_paper = row["_merge"] != "right_only"
        ours_value = row.get("ours:value", math.nan)
        ours_value = math.nan if ours_value is None or pd.isna(ours_value) else float(ours_value)
        has_ours = row["_merge"] != "left_only" and not math.isnan(ours_value)
        out = {column: _text(row[column]) for column in paper_keys}
        out["table"] = table_id
        out["value_paper"] = float(row["value_paper"]) if has_paper and not pd.isna(row["value_paper"]) else math.nan
        out["confidence"] = row["confidence"] if has_paper else ""
        out["profile"] = profile

        own_note = _text(row.get("ours:note"))
        if has_ours:
            row_unit = _text(row.get("ours:ours_unit"))
            paper_unit = _text(row["unit"]) if has_paper else (ours_unit or row_unit or "")
            source_unit = ours_unit or row_unit or (
                "fraction" if paper_unit in SCORE_UNITS else paper_unit
            )
            out["unit"] = paper_unit
            out["ours_unit"] = source_unit
            out["value_ours"] = float(convert_unit(ours_value, source_unit, paper_unit))
            std = row.get("ours:std", math.nan)
            out["std_ours"] = math.nan if std is None or pd.isna(std) else float(convert_unit(float(std), source_unit, paper_unit))
            run_ids = _text(row.get("ours:run_ids"))
            n_seeds = row.get("ours:n_seeds", math.nan)
            if n_seeds is None or pd.isna(n_seeds):
                n_seeds = len(run_ids.split(RUN_ID_SEPARATOR)) if run_ids else 1
            out["n_seeds"] = int(n_seeds)
            out["run_ids"] = run_ids
            out["run_metric"] = _text(row.get("ours:run_metric"))
            if fill_commit is None and not _text(row.get("ours:commit")):
                fill_commit = current_commit()
            if fill_device is None and not _text(row.get("ours:device")):
                fill_device = _default_device()
            out["commit"] = _text(row.get("ours:commit")) or fill_commit
            out["device"] = _text(row.get("ours:device")) or fill_device
            if math.isnan(out["value_paper"]):
                delta = math.nan
                own_note = own_note or ("no paper value for this cell" if not has_paper else "the paper prints no value here")
            else:
                delta = out["value_ours"] - out["value_paper"]
            out["delta"] = delta
            out["delta_rel"] = delta / out["value_paper"] if not math.isnan(delta) and out["value_paper"] != 0 else math.nan
            out["note"] = own_note
        else:
            out["unit"] = _text(row["unit"]) if has_paper else ""
            out["ours_unit"] = ""
            out["value_ours"] = out["std_ours"] = out["delta"] = out["delta_rel"] = math.nan
            out["n_seeds"] = 0
            out["run_ids"] = out["run_metric"] = out["commit"] = out["device"] = ""
            if own_note:
                out["note"] = own_note
            else:
                out["note"] = missing_note(row) if callable(missing_note) else str(missing_note)
            if not out["note"]:
                raise ValueError(f"missing_note returned an empty note for cell {out}; a missing cell must say why")
        rows.append(out)

    return order_columns(pd.DataFrame(rows))


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def order_columns(table: pd.DataFrame) -> pd.DataFrame:
    """Standard columns first, then the table's own keys, then the provenance columns."""
    standard = [c for c in STANDARD_COLUMNS if c in table.columns]
    provenance = [c for c in PROVENANCE_COLUMNS if c in table.columns]
    own = [c for c in table.columns if c not in standard and c not in provenance]
    return table[standard + own + provenance]


# --------------------------------------------------------------------------------------
# Reading results tables (writing them: fedlib.reporting.results_tables)
# --------------------------------------------------------------------------------------


def read_results_csv(path: str | Path) -> pd.DataFrame:
    """Parse a results CSV: floats exact (Python ``float``), ``n_seeds`` int, the rest text."""
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    for column in FLOAT_COLUMNS:
        if column in table.columns:
            table[column] = [float(text) if text.strip() else math.nan for text in table[column]]
    if "n_seeds" in table.columns:
        table["n_seeds"] = [int(float(text)) if text.strip() else 0 for text in table["n_seeds"]]
    return table
