"""Training-state checkpoints: save every N rounds atomically, resume exactly.

A checkpoint holds the :class:`~fedlib.engine.loop.TrainState` (global and private
tensors, round index, best-so-far state and metrics, history, method extras) and the
configuration it was made with. No generator state is stored: round ``t`` always draws
from ``round_generator(seed, t)``, so resuming at round ``t`` redraws exactly what the
uninterrupted run would have drawn.

Writes are atomic: the file is written to a temporary name in the same directory,
flushed to disk and renamed over the previous checkpoint (``os.replace``), so a run killed
at any moment leaves either the old or the new checkpoint, never a torn one.
Checkpoints live under a directory passed in (default ``checkpoints/``, git-ignored).
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

import torch

__all__ = ["Checkpointer"]

_FORMAT = 1
_STATE_FIELDS = ("round_index", "global_state", "private_state", "history", "best_round", "best_score",
                 "best_metrics", "best_global_state", "best_private_state", "evals_since_best",
                 "stopped_early", "test_metrics", "extra")


class Checkpointer:
    """Save a run's state every ``every`` rounds to ``directory/<name>.pt``.

    Args:
        directory: where checkpoints go (created if missing).
        name: file stem, e.g. a hash of the full configuration.
        every: save when the number of completed rounds is a multiple of this.
    """

    def __init__(self, directory="checkpoints", name: str = "run", every: int = 10):
        if every < 1:
            raise ValueError("every must be >= 1")
        self.directory, self.name, self.every = Path(directory), str(name), int(every)

    @property
    def path(self) -> Path:
        return self.directory / f"{self.name}.pt"

    def maybe_save(self, state, config) -> bool:
        """Save if ``state.round_index`` is on the schedule (or the run has just stopped)."""
        if state.round_index % self.every == 0 or state.stopped_early or state.round_index >= config.rounds:
            self.save(state, config)
            return True
        return False

    def save(self, state, config) -> None:
        payload = {"format": _FORMAT, "config": dataclasses.asdict(config),
                   "state": {name: getattr(state, name) for name in _STATE_FIELDS}}
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

    def load(self, config=None, device=None):
        """The saved :class:`TrainState`, or ``None`` when there is no checkpoint.

        Raises ``ValueError`` when ``config`` differs from the saved one in anything but
        ``rounds`` (a run may be extended, not changed).
        """
        from fedlib.engine.loop import TrainState

        if not self.path.exists():
            return None
        payload = torch.load(self.path, map_location=device or "cpu", weights_only=True)
        if payload.get("format") != _FORMAT:
            raise ValueError(f"{self.path}: unknown checkpoint format {payload.get('format')}")
        if config is not None:
            saved = dict(payload["config"])
            current = dataclasses.asdict(config)
            saved.pop("rounds", None)
            current.pop("rounds", None)
            if saved != current:
                diff = {k: (saved.get(k), current.get(k)) for k in set(saved) | set(current) if saved.get(k) != current.get(k)}
                raise ValueError(f"{self.path} was written with a different configuration: {diff}")
        state = TrainState(**payload["state"])
        if config is not None and state.round_index < config.rounds and not state.stopped_early:
            state.test_metrics = None  # an extended run is tested again when it ends
        return state
