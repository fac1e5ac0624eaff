"""What every method of the course is: an :class:`Algorithm` with a named server state.

A federated recommendation method, seen from the trainer, answers four questions:

* ``init(seed) -> state``: the server's state before round 0 (global tensors, and the
  private tensors the simulation keeps for the clients), drawn from ``seed`` alone;
* ``plan_round(state, context) -> plan``: every random choice of round ``t`` (which clients
  take part, their local examples and batch order), drawn from ``context.rng`` only, so a
  resumed run redraws exactly the plans an uninterrupted one would;
* ``run_round(state, plan, context) -> (state, RoundReport)``: one round of the paper's
  Algorithm 1: send, local updates, upload, aggregate (and whatever the method's server
  does); it charges its messages to ``context.ledger`` when one is given;
* ``evaluate(state, split) -> {metric: value}``: ranking metrics on ``"valid"`` or
  ``"test"``.

optionally ``before_round(run, t, plan)``: server work before round ``t`` that reads the run so far
(its state and its selection: RLP2 keeps the memory of its best round) and the round's plan,
drawn just before it (FedRKG trains its gates on the round's examples); optionally
``evaluate_splits(state, splits) -> {split: metrics}``, the same numbers as ``evaluate`` per
split, for a model whose scoring pass is worth sharing between validation and test (graph
embeddings); and three about its state, so that the trainer can keep the best state and checkpoint:
``copy_state`` (a copy later rounds do not modify), ``state_dict`` (tensors and plain values)
and ``load_state`` (its inverse). States are dataclasses with named fields, never dicts under
string keys; :func:`clone_dataclass`, :func:`dataclass_to_dict` and :func:`dataclass_from_dict`
implement the three for a dataclass of tensors, dicts, lists and numbers.

The trainer (:func:`fedlib.engine.trainer.train`) owns everything else: the round schedule,
evaluation, selection and early stopping, checkpoints, the ledger and the
:class:`~fedlib.engine.trainer.RunResult`. Centralised training is the one-client case of
the same interface.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, Generic, Mapping, Optional, Protocol, Tuple, Type, TypeVar, runtime_checkable

import numpy as np
import torch

__all__ = ["Algorithm", "RoundContext", "RoundReport", "clone_dataclass", "dataclass_to_dict", "dataclass_from_dict"]

StateT = TypeVar("StateT")
PlanT = TypeVar("PlanT")


@dataclass(frozen=True)
class RoundContext:
    """What the trainer hands an algorithm for round ``index``.

    Attributes:
        index: the 0-based round ``t`` (also the number of rounds completed before it).
        seed: the run's seed.
        rng: the round's generator, ``round_generator(seed, t)``: the only source of the
            round's randomness.
        ledger: a :class:`~fedlib.engine.communication.CommunicationLedger` to charge the
            round's messages to, or ``None``.
    """

    index: int
    seed: int
    rng: np.random.Generator
    ledger: Optional[Any] = None


@dataclass
class RoundReport:
    """What one round reports to the trainer's history.

    Attributes:
        train_loss: mean local training loss of the round (NaN when no client trained).
        logged: further scalars for the history row (e.g. ``{"guidance/seconds": 0.4}``).
    """

    train_loss: float
    logged: Dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Algorithm(Protocol[StateT, PlanT]):
    """The interface of every method (see the module docstring for the contract)."""

    def init(self, seed: int) -> StateT:
        """The state before round 0, a pure function of ``seed``."""

    def plan_round(self, state: StateT, context: RoundContext) -> PlanT:
        """Every random choice of round ``context.index``, from ``context.rng`` only."""

    def run_round(self, state: StateT, plan: PlanT, context: RoundContext) -> Tuple[StateT, RoundReport]:
        """One round: the new state and what to log."""

    def evaluate(self, state: StateT, split: str) -> Dict[str, float]:
        """Metrics of ``state`` on ``split`` (``"valid"`` or ``"test"``), keys without the split prefix."""

    def copy_state(self, state: StateT) -> StateT:
        """A copy that later rounds do not modify (the trainer keeps the best one)."""

    def state_dict(self, state: StateT) -> Dict[str, Any]:
        """Tensors and plain values only (what a checkpoint stores)."""

    def load_state(self, saved: Mapping[str, Any]) -> StateT:
        """The inverse of :meth:`state_dict`."""


def _clone_value(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _clone_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone_value(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_clone_value(v) for v in value)
    return value


def clone_dataclass(state):
    """A deep copy of a dataclass state whose fields hold tensors, dicts, lists and plain values."""
    return dataclasses.replace(state, **{f.name: _clone_value(getattr(state, f.name))
                                         for f in dataclasses.fields(state) if f.init})


def dataclass_to_dict(state) -> Dict[str, Any]:
    """``{field: value}`` of a dataclass state (values shared, not copied)."""
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state) if f.init}


def dataclass_from_dict(cls: Type[StateT], saved: Mapping[str, Any]) -> StateT:
    """The dataclass ``cls`` from :func:`dataclass_to_dict`'s output; names missing or unknown fields."""
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(saved) - names)
    if unknown:
        raise ValueError(f"saved {cls.__name__} has unknown fields {unknown}; it was written by other code")
    return cls(**dict(saved))
