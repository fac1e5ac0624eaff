"""Checkpoints of a run: save every N rounds and/or seconds atomically, resume exactly.

The trainer (:func:`~fedlib.engine.trainer.train`, hence every algorithm of the course,
:func:`~fedlib.engine.loop.run_federated` included) saves a **snapshot** of its
:class:`~fedlib.engine.trainer.RunResult`: the algorithm's ``state_dict`` of the state and of
the best state, the round index, history, selection and test metrics (tensors, numbers,
strings, lists, dicts only), with :meth:`Checkpointer.save_snapshot`, and reads it back with
:meth:`Checkpointer.load_snapshot`. A checkpoint also holds the configuration it was made
with; a run under another configuration refuses it. No generator state is stored: round
``t`` always draws from ``round_generator(seed, t)``, so resuming at round ``t`` redraws
exactly what the uninterrupted run would have drawn.

Writes are atomic: the file is written to a temporary name in the same directory,
flushed to disk and renamed over the previous checkpoint (``os.replace``), so a run killed
at any moment leaves either the old or the new checkpoint, never a torn one.
Checkpoints live under a directory passed in (default ``checkpoints/``, git-ignored).

Besides the snapshot, a checkpoint carries:

* the **attachments**: objects outside the run that its result depends on (e.g. a
  selection recorder that keeps the test metrics of the best evaluation), each with
  ``state_dict()`` / ``load_state_dict(d)`` (tensors, numbers, strings, lists, dicts only);
* the **wall time** spent on the run up to the save (``elapsed_s``), so a run resumed over
  several sessions reports the time of the rounds it kept (:attr:`Checkpointer.earlier_seconds`);
  the rounds a killed session ran after its last save are not counted (they are run again);
* the rounds at which it was **resumed** (:attr:`Checkpointer.resumed_at`);
* the **code** that wrote it: the commit (:func:`fedlib.paths.current_commit`) and a fingerprint
  of the ``fedlib/`` sources (:func:`fedlib.paths.source_fingerprint`). A run resumes only
  under the same sources: otherwise its rounds would come from two versions of the code, and
  no record could name the one behind its numbers.

A save can be scheduled every ``every`` rounds, every ``every_seconds`` of wall time (for
runs whose rounds differ in cost by orders of magnitude between datasets), or both
(:meth:`Checkpointer.due`).
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import torch

from fedlib.paths import current_commit, source_fingerprint

__all__ = ["Checkpointer", "checkpoint_progress"]

_FORMAT = 1


class Checkpointer:
    """Save a run's snapshot to ``directory/<name>.pt`` every ``every`` rounds and/or ``every_seconds``.

    Args:
        directory: where checkpoints go (created if missing).
        name: file stem, e.g. a hash of the full configuration.
        every: save when the number of completed rounds is a multiple of this (``None``: no
            round schedule).
        every_seconds: save when this much wall time has passed since the last save (or since
            this object was made / loaded a checkpoint); ``None``: no time schedule.

    Attributes:
        earlier_seconds: wall time (s) the run had spent when the loaded checkpoint was saved
            (0 for a fresh run).
        resumed_at: the rounds (completed-round counts) at which the run was resumed, oldest first.
    """

    def __init__(self, directory="checkpoints", name: str = "run", every: Optional[int] = 10,
                 every_seconds: Optional[float] = None):
        if every is None and every_seconds is None:
            raise ValueError("give every (rounds) or every_seconds (wall time), or both")
        if every is not None and every < 1:
            raise ValueError("every must be >= 1")
        if every_seconds is not None and not every_seconds > 0:
            raise ValueError(f"every_seconds must be > 0, got {every_seconds}")
        self.directory, self.name = Path(directory), str(name)
        self.every = None if every is None else int(every)
        self.every_seconds = None if every_seconds is None else float(every_seconds)
        self.attachments: Dict[str, Any] = {}
        self.earlier_seconds = 0.0
        self.resumed_at: List[int] = []
        self._started = self._last_save = time.perf_counter()
        self._commit: Optional[str] = None  # the checkout's commit, read at the first save (a git call)

    @property
    def path(self) -> Path:
        return self.directory / f"{self.name}.pt"

    def attach(self, name: str, obj) -> None:
        """Save ``obj.state_dict()`` with every checkpoint and restore it in :meth:`load_snapshot`."""
        if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
            raise TypeError(f"attachment {name!r} ({type(obj).__name__}) needs state_dict() and load_state_dict()")
        self.attachments[name] = obj

    def elapsed_seconds(self) -> float:
        """Wall time spent on the run so far: earlier sessions (up to their last save) plus this one."""
        return self.earlier_seconds + (time.perf_counter() - self._started)

    def due(self, round_index: int, finished: bool = False) -> bool:
        """Whether a save is on the schedule after ``round_index`` completed rounds (always when ``finished``)."""
        on_rounds = self.every is not None and round_index % self.every == 0
        on_clock = self.every_seconds is not None and time.perf_counter() - self._last_save >= self.every_seconds
        return bool(on_rounds or on_clock or finished)

    def save_snapshot(self, snapshot: Dict[str, Any], config: Mapping[str, Any]) -> None:
        """Save a run's ``snapshot`` (plain values and tensors) made under ``config``.

        ``snapshot`` must hold ``round_index`` (the completed rounds; :attr:`resumed_at` records
        it). ``config``: a flat or nested dict of plain values naming everything the run's numbers
        depend on; :meth:`load_snapshot` refuses a snapshot made under another one (``rounds``
        aside). The snapshot is written atomically with the wall time spent so far.
        """
        if "round_index" not in snapshot:
            raise ValueError("a snapshot must hold 'round_index' (the number of completed rounds)")
        self._write({"snapshot": snapshot}, dict(config))

    def load_snapshot(self, config: Mapping[str, Any], device=None) -> Optional[Dict[str, Any]]:
        """The saved snapshot, or ``None`` when there is none; restores the wall-time bookkeeping.

        Raises ``ValueError`` when the file holds a checkpoint of the older flat ``state``
        layout, was made under a ``config`` that differs in anything but ``rounds``, lacks an
        attachment this object has (it was written by a run that did not save it), or was
        written by other ``fedlib/`` sources than this process runs (the message names the
        commit that wrote it).
        """
        if not self.path.exists():
            return None
        payload = torch.load(self.path, map_location=device or "cpu", weights_only=True)
        if payload.get("format") != _FORMAT:
            raise ValueError(f"{self.path}: unknown checkpoint format {payload.get('format')}")
        if "snapshot" not in payload:
            raise ValueError(f"{self.path} holds a checkpoint of the older flat 'state' layout, which runs no longer "
                             "resume from; delete it to start the run afresh")
        saved, current = dict(payload["config"]), dict(config)
        saved.pop("rounds", None)    # a run may be extended, not changed
        current.pop("rounds", None)
        if saved != current:
            diff = {k: (saved.get(k), current.get(k)) for k in set(saved) | set(current) if saved.get(k) != current.get(k)}
            raise ValueError(f"{self.path} was written with a different configuration: {diff}")
        saved_attachments = payload.get("attachments", {})
        missing = sorted(set(self.attachments) - set(saved_attachments))
        if missing:
            raise ValueError(f"{self.path} holds no state for the attachments {missing}; delete it to start the run afresh")
        if payload.get("source") != source_fingerprint():
            written = (f"commit {payload['commit']}" if payload.get("commit") else
                       "code that recorded no commit (a checkpoint older than that field)")
            raise ValueError(f"{self.path} was written by {written}, and the fedlib/ sources differ now "
                             f"(at {current_commit()}): resuming would mix two versions of the code in one run. Check "
                             f"out the code that wrote it to finish the run, or delete the file to start it afresh")
        for name, obj in self.attachments.items():
            obj.load_state_dict(saved_attachments[name])
        snapshot = payload["snapshot"]
        self.earlier_seconds = float(payload.get("elapsed_s", 0.0))
        self.resumed_at = [*payload.get("resumed_at", []), int(snapshot["round_index"])]
        self._last_save = time.perf_counter()
        return snapshot

    def _code_commit(self) -> str:
        if self._commit is None:
            self._commit = current_commit()
        return self._commit

    def _write(self, body: Dict[str, Any], config: Dict[str, Any]) -> None:
        payload = {"format": _FORMAT, "config": config, **body,
                   "attachments": {name: obj.state_dict() for name, obj in self.attachments.items()},
                   "elapsed_s": self.elapsed_seconds(), "resumed_at": list(self.resumed_at),
                   "commit": self._code_commit(), "source": source_fingerprint()}
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.name}.", suffix=".tmp", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as handle:
                torch.save(payload, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        self._last_save = time.perf_counter()

    def delete(self) -> None:
        """Remove the checkpoint file (e.g. once the run's result is recorded)."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


def checkpoint_progress(path) -> Dict[str, Any]:
    """How far the run saved at ``path`` got: ``{"round_index", "elapsed_s", "resumed_at"}``.

    Reads the file memory-mapped, so a multi-GB checkpoint costs milliseconds (its tensors are
    not read). Raises ``ValueError`` for a file that is not a checkpoint of this format.
    """
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # a torn or foreign file: say which, not a pickle traceback
        raise ValueError(f"{path} is not a readable checkpoint ({type(error).__name__}: {error}); "
                         "delete it to start its run afresh") from error
    body = payload.get("snapshot") if isinstance(payload, dict) else None
    if not isinstance(body, dict) or payload.get("format") != _FORMAT or "round_index" not in body:
        raise ValueError(f"{path} is not a checkpoint of format {_FORMAT} (a snapshot with a round_index); "
                         "delete it to start its run afresh")
    return {"round_index": int(body["round_index"]), "elapsed_s": float(payload.get("elapsed_s", 0.0)),
            "resumed_at": list(payload.get("resumed_at", []))}
