"""A per-configuration result cache that makes long grids resumable.

A paper-profile grid can take hours. :meth:`ResultCache.run_grid` saves each cell the
moment it finishes, one JSON file per configuration named by its
:func:`~fedlib.reporting.results.config_hash`, so a grid that is interrupted (killed,
out of memory, laptop closed) resumes at the first unfinished cell and never loses a
finished one. Several processes may work through one grid (one walking it forwards, one
backwards): every file is written atomically, and a process *claims* a cell before training
it (``<config_hash>.claim``, holding its pid and host), so two processes never train the same
cell; a claim whose process has died is taken over.

The cache holds results, not checkpoints; keep its folder outside git (``.cache/`` is
ignored).
"""
from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import pandas as pd
from tqdm.auto import tqdm

from fedlib.reporting._atomic import atomic_write_text
from fedlib.reporting.results import canonical_json, config_hash, to_canonical

OnNewResult = Callable[[Mapping[str, Any], Mapping[str, Any], float], None]


class ResultCache:
    """Results of finished configurations, one ``<config_hash>.json`` file each.

    A configuration is any mapping (or dataclass) accepted by
    :func:`~fedlib.reporting.results.config_hash`; a result is a mapping of names to JSON
    values (numbers, strings, lists, ...). NaN results are stored as ``null``.
    """

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)

    def __repr__(self) -> str:
        return f"ResultCache({str(self.directory)!r})"

    def path_for(self, config: Mapping[str, Any]) -> Path:
        """The file that holds (or will hold) the result of ``config``."""
        return self.directory / f"{config_hash(config)}.json"

    def contains(self, config: Mapping[str, Any]) -> bool:
        """Whether ``config`` has a saved result."""
        return self.path_for(config).exists()

    __contains__ = contains

    def discard(self, config: Mapping[str, Any]) -> bool:
        """Forget the saved result of ``config`` (its run records stay); whether there was one."""
        try:
            self.path_for(config).unlink()
            return True
        except FileNotFoundError:
            return False

    def get(self, config: Mapping[str, Any], default: Any = None) -> Any:
        """The saved result of ``config``, or ``default`` when it has none.

        The stored configuration is compared with ``config``: a file that belongs to a
        different configuration (copied by hand, or a hash collision) is an error rather
        than a wrong answer.
        """
        path = self.path_for(config)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return default
        try:
            entry = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"cache entry {path} is not valid JSON ({error}); delete it to recompute") from None
        if json.dumps(entry.get("config"), sort_keys=True, separators=(",", ":"), ensure_ascii=False) != canonical_json(config):
            raise ValueError(f"cache entry {path} holds a different configuration; delete it to recompute")
        return entry["result"]

    def _run_claimed(self, config, fn, on_new_result) -> None:
        """Train a cell this process has claimed, record and save it, then release the claim."""
        try:
            if self.contains(config):  # finished between the last look and the claim
                return
            started = time.perf_counter()
            result = fn(config)
            wall_time_s = time.perf_counter() - started
            if not isinstance(result, Mapping):
                raise TypeError(f"the grid function returned a {type(result).__name__}; it must return a mapping")
            if on_new_result is not None:
                on_new_result(config, result, wall_time_s)
            self.put(config, result, wall_time_s=wall_time_s)
        finally:
            self.release(config)

    # ------------------------------------------------------------------ claims
    def claim_path(self, config: Mapping[str, Any]) -> Path:
        """The file that marks ``config`` as being trained by some process."""
        return self.directory / f"{config_hash(config)}.claim"

    def try_claim(self, config: Mapping[str, Any]) -> bool:
        """Claim ``config`` for this process; ``False`` while a live process holds it.

        The claim names its process (pid, host and, on Linux, the process start time, so a
        recycled pid is not mistaken for the holder). A claim whose process no longer runs on
        this host (killed, crashed) is taken over. A claim from another host is respected
        (its liveness cannot be checked), and so is every claim on Windows: delete the
        ``.claim`` file by hand if its process is gone.
        """
        path = self.claim_path(config)
        path.parent.mkdir(parents=True, exist_ok=True)
        me = _process_identity(os.getpid())
        for _ in range(2):
            try:
                descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                try:
                    holder = path.read_text(encoding="utf-8").split()
                except FileNotFoundError:  # released meanwhile: try again
                    continue
                if holder == me:
                    return True
                if len(holder) == 3 and holder[1] == socket.gethostname() and not _alive(holder):
                    try:
                        path.unlink()  # stale: its process is gone
                    except FileNotFoundError:
                        pass
                    continue
                return False  # a live holder, another host, or a claim still being written
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                handle.write(" ".join(me))
            return True
        return False

    def claim_holder(self, config: Mapping[str, Any]) -> Optional[str]:
        """``"pid@host"`` of the process holding ``config``'s claim, or ``None``."""
        try:
            holder = self.claim_path(config).read_text(encoding="utf-8").split()
        except FileNotFoundError:
            return None
        return f"{holder[0]}@{holder[1]}" if len(holder) >= 2 else "?"

    def release(self, config: Mapping[str, Any]) -> None:
        """Remove this process's claim on ``config`` (another process's claim is left alone)."""
        path = self.claim_path(config)
        try:
            if path.read_text(encoding="utf-8").split() == _process_identity(os.getpid()):
                path.unlink()
        except FileNotFoundError:
            pass

    def put(self, config: Mapping[str, Any], result: Mapping[str, Any], *, wall_time_s: Optional[float] = None) -> Path:
        """Save ``result`` for ``config`` (atomically: readers never see a partial file)."""
        if not isinstance(result, Mapping):
            raise TypeError(f"a cached result must be a mapping of names to values, not {type(result).__name__}")
        entry = {
            "config_hash": config_hash(config),
            "config": to_canonical(config),
            "result": to_canonical(result, _path="result", _non_finite="null"),
            "wall_time_s": wall_time_s,
            "saved_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        path = self.path_for(config)
        atomic_write_text(path, json.dumps(entry, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False) + "\n")
        return path

    def run_grid(
        self,
        configs: Iterable[Mapping[str, Any]],
        fn: Callable[[Mapping[str, Any]], Mapping[str, Any]],
        *,
        progress: bool = True,
        description: Optional[str] = None,
        on_new_result: Optional[OnNewResult] = None,
        poll_s: float = 30.0,
    ) -> pd.DataFrame:
        """Run ``fn(config)`` for every configuration without a saved result; return all results.

        Finished cells are skipped; each new result is saved as soon as ``fn`` returns, so
        an exception (or a kill) in one cell loses only that cell, and calling
        ``run_grid`` again runs just the missing ones. A configuration listed twice is run
        once. Each cell is looked up again just before it runs, so several processes sharing
        the cache directory (e.g. one walking the grid forwards, one backwards) skip what the
        others finished, and claimed (:meth:`try_claim`) so that none trains a cell another
        is training: such a cell is left for last and waited for (checked every ``poll_s``
        seconds), or trained here if its process dies. ``on_new_result(config, result, wall_time_s)`` is called for each new result
        *before* it is cached (use it to :func:`~fedlib.reporting.results.append_run`): a
        cell that is in the cache then always has its run record.

        Returns one row per configuration, in order: the configuration's entries (nested
        mappings flattened to ``outer.inner``) followed by the result's. The rows are
        built from the saved files, so a resumed grid returns exactly what an
        uninterrupted one would.
        """
        configs = list(configs)
        unique: dict[str, Mapping[str, Any]] = {}
        for config in configs:
            unique.setdefault(config_hash(config), config)
        pending = {key: config for key, config in unique.items() if not self.contains(config)}

        with tqdm(
            total=len(unique),
            initial=len(unique) - len(pending),
            desc=description or f"grid ({len(unique) - len(pending)} cached)",
            disable=not progress,
            unit="cell",
        ) as bar:
            elsewhere = []  # cells another live process is training
            for config in pending.values():
                if self.contains(config):  # finished meanwhile by another process sharing the cache
                    bar.update(1)
                elif self.try_claim(config):
                    self._run_claimed(config, fn, on_new_result)
                    bar.update(1)
                else:
                    elsewhere.append(config)
            for config in elsewhere:
                if not self.contains(config):
                    tqdm.write(f"waiting for cell {config_hash(config)}, trained by process "
                               f"{self.claim_holder(config)} (remove {self.claim_path(config)} if it is gone)")
                while not self.contains(config):
                    if self.try_claim(config):  # its process died without a result
                        self._run_claimed(config, fn, on_new_result)
                        break
                    time.sleep(poll_s)
                bar.update(1)

        return self.frame(configs)

    def frame(self, configs: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
        """One row per configuration, in order: its entries (nested mappings flattened to
        ``outer.inner``) followed by its saved result's; a configuration without a saved result
        gets only its own entries."""
        rows = []
        for config in configs:
            config_columns = _flatten(to_canonical(config))
            result_columns = _flatten(self.get(config, {}))
            clash = sorted(set(config_columns) & set(result_columns))
            if clash:
                raise ValueError(f"result names {clash} repeat configuration names; rename them in the grid function")
            rows.append({**config_columns, **result_columns})
        return pd.DataFrame(rows)


def _start_time(pid: int) -> str:
    """The start time of process ``pid`` in clock ticks since boot (Linux), ``"-"`` elsewhere or if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "-"
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; the name before ")" may hold spaces


def _process_identity(pid: int) -> list[str]:
    """``[pid, host, start time]``: what a claim file holds."""
    return [str(pid), socket.gethostname(), _start_time(pid)]


def _alive(holder: list[str]) -> bool:
    """Whether the claim holder ``[pid, host, start time]`` (on this host) still runs.

    Always ``True`` on Windows, where signal 0 would terminate the process.
    """
    if os.name == "nt":
        return True
    pid = int(holder[0])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    started = _start_time(pid)
    return holder[2] == "-" or started == "-" or started == holder[2]  # a recycled pid starts later


def _flatten(value: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and scalars are kept as they are."""
    flat: dict[str, Any] = {}
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, Mapping):
            flat.update(_flatten(item, prefix=f"{name}."))
        else:
            flat[name] = item
    return flat


def restore_cache_from_records(cache: "ResultCache", paper: str, profile: str, *,
                               rerun: Iterable[Mapping[str, Any]] = ()) -> int:
    """Fill ``cache`` with every run recorded in ``results/<paper>[/<profile>]/runs.jsonl``.

    The committed ``runs.jsonl`` is the durable record of a grid; the cache folder is a local
    convenience that a fresh clone lacks. Without this a clone would train again every cell
    whose result is already committed. The latest record of a configuration wins. Returns the
    number of entries restored.

    ``rerun``: configurations to train again although recorded (e.g. to record metrics added
    since, or to check a run repeats): their cache entries are discarded and not restored, so
    a grid trains them and appends a new record, which then is the latest.
    """
    from fedlib.reporting.results import latest_records, read_runs

    again = set()
    for config in rerun:
        cache.discard(config)
        again.add(config_hash(config))
    restored = 0
    for key, record in latest_records(read_runs(paper, profile)).items():
        if key not in again and not cache.contains(record.config):
            cache.put(record.config, {"metrics": record.metrics, "extra": record.extra},
                      wall_time_s=record.wall_time_s)
            restored += 1
    return restored
