"""What every cross-domain method of the FedPCL-CDR comparison shares: evaluation, selection, result.

A method trains on a :class:`~fedlib.data.splits.DomainSplit` (2+ domains, users
``0 .. n_o − 1`` shared) and is evaluated per domain on the protocol's sampled candidates
(``split[d].extra["valid_candidates"]`` / ``["test_candidates"]``, positive in column 0).
The shared pieces:

* :func:`evaluate_scorer`: HR@K, NDCG@K and MRR of a ``score(users (n,), items (n, C)) -> (n, C)``
  function on one domain and role (a metric, :mod:`fedlib.metrics.scorer`, imported here);
* :class:`SelectionTracker`: keeps the metrics at the best mean **validation** HR@10 (our rule,
  with patience) and, for the audit, at the best mean **test** HR@10 (the FedPCL-CDR code's
  rule);
* :class:`CDRResult`: what a run returns, whatever the method.

Example (any method)::

    tracker = SelectionTracker(patience=10)
    for epoch in range(1, epochs + 1):
        ...train...
        metrics = {d: evaluate_both(scorer_for(d), split[d]) for d in split.domains}
        if tracker.update(epoch, metrics):
            break
    return tracker.result(config, wall_seconds=...)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from fedlib.metrics.scorer import PairScorer, evaluate_both, evaluate_scorer

__all__ = ["PairScorer", "evaluate_scorer", "evaluate_both", "SelectionTracker", "CDRResult", "SELECTION_METRIC",
           "check_positive_ints", "check_training_loop"]

SELECTION_METRIC = "HR@10"


def check_positive_ints(config: Any, names: Sequence[str], hint: str = "") -> None:
    """Raise ``ValueError`` naming ``<Config>.<field>`` unless every field is an integer >= 1."""
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{type(config).__name__}.{name} must be an integer >= 1, got {value!r}{hint}")


def check_training_loop(config: Any, positive_ints: Sequence[str] = ()) -> None:
    """The settings every cross-domain method's config shares, checked once for all of them.

    ``dim``, ``patience``, ``eval_every`` and (when present) ``epochs``, ``rounds``,
    ``batch_size``, ``train_negatives`` must be integers >= 1, plus ``positive_ints``; ``lr``
    a finite number > 0; ``weight_decay`` (when present) >= 0; ``select_on`` "valid" or
    "test"; ``seed`` an integer >= 0. Errors name the config class and field.
    """
    name = type(config).__name__
    optional = [f for f in ("epochs", "rounds", "batch_size", "train_negatives") if hasattr(config, f)]
    check_positive_ints(config, ["dim", "patience", "eval_every", *optional, *positive_ints])
    lr = config.lr
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"{name}.lr must be a finite number > 0 (the Adam step, e.g. 1e-3), got {lr!r}")
    decay = getattr(config, "weight_decay", 0.0)
    if not (math.isfinite(decay) and decay >= 0):
        raise ValueError(f"{name}.weight_decay must be a finite number >= 0, got {decay!r}")
    if config.select_on not in ("valid", "test"):
        raise ValueError(f"{name}.select_on must be 'valid' (our rule) or 'test' (the audit of selecting on the "
                         f"test set), got {config.select_on!r}")
    if isinstance(config.seed, bool) or not isinstance(config.seed, (int, np.integer)) or config.seed < 0:
        raise ValueError(f"{name}.seed must be an integer >= 0, got {config.seed!r}")


@dataclass
class CDRResult:
    """A finished cross-domain run.

    Attributes:
        selected: ``{domain: {"valid/HR@10", "test/HR@10", "test/NDCG@10", ...}}`` at
            ``selected_round``, the evaluation with the best mean validation HR@10 (or test,
            when the method was asked to select on test).
        test_selected: the same at the best mean **test** HR@10 (``test_selected_round``).
        history: one row per evaluation: ``round`` plus ``"<domain>/<role>/<metric>"``,
            the means ``"valid/HR@10"`` / ``"test/HR@10"``, and whatever the method adds
            (losses, bytes, seconds).
        extra: method-specific scalars (privacy budget, bytes, ...).
        models: the final trained models by domain; artifacts: anything else a notebook or
            an attack needs (the last messages, cluster labels, ...).
    """

    method: str
    config: Any
    selected: Dict[str, Dict[str, float]]
    selected_round: int
    test_selected: Dict[str, Dict[str, float]]
    test_selected_round: int
    history: List[Dict[str, float]]
    wall_seconds: float
    extra: Dict[str, float] = field(default_factory=dict)
    models: Dict[str, Any] = field(repr=False, default_factory=dict)
    artifacts: Dict[str, Any] = field(repr=False, default_factory=dict)

    def flat_metrics(self) -> Dict[str, float]:
        """``{"<domain>/test/HR@10": ..., "test_selected/<domain>/test/HR@10": ..., ...}`` for records."""
        out: Dict[str, float] = {}
        for prefix, block in (("", self.selected), ("test_selected/", self.test_selected)):
            for domain, values in block.items():
                out.update({f"{prefix}{domain}/{key}": float(value) for key, value in values.items()})
        out.update({"selected_round": float(self.selected_round),
                    "test_selected_round": float(self.test_selected_round),
                    "seconds": float(self.wall_seconds)})
        out.update({key: float(value) for key, value in self.extra.items()})
        return out


class SelectionTracker:
    """Model selection over evaluations: validation (with patience) and test (audit only).

    Args:
        patience: stop after this many evaluations without a better selection score.
        select_on: ``"valid"`` (default) or ``"test"`` (reproduces selection on the test set).
    """

    def __init__(self, patience: int = 10, select_on: str = "valid"):
        if select_on not in ("valid", "test"):
            raise ValueError(f"select_on must be 'valid' or 'test', got {select_on!r}")
        if int(patience) < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        self.patience, self.select_on = int(patience), select_on
        self.history: List[Dict[str, float]] = []
        self.best_score, self.best_round, self.best = -math.inf, 0, {}
        self.best_test_score, self.best_test_round, self.best_test = -math.inf, 0, {}
        self.waited = 0

    def update(self, round_index: int, metrics: Mapping[str, Mapping[str, float]],
               **logged: float) -> bool:
        """Record one evaluation (``{domain: evaluate_both(...)}``); returns True when patience ran out."""
        row: Dict[str, float] = {"round": round_index, **logged}
        for domain, values in metrics.items():
            row.update({f"{domain}/{key}": float(value) for key, value in values.items()})
        valid = float(np.mean([m[f"valid/{SELECTION_METRIC}"] for m in metrics.values()]))
        test = float(np.mean([m[f"test/{SELECTION_METRIC}"] for m in metrics.values()]))
        row.update({f"valid/{SELECTION_METRIC}": valid, f"test/{SELECTION_METRIC}": test})
        self.history.append(row)
        frozen = {d: dict(m) for d, m in metrics.items()}
        if test > self.best_test_score:
            self.best_test_score, self.best_test_round, self.best_test = test, round_index, frozen
        score = valid if self.select_on == "valid" else test
        if score > self.best_score:
            self.best_score, self.best_round, self.best, self.waited = score, round_index, frozen, 0
            return False
        self.waited += 1
        return self.waited >= self.patience

    def result(self, method: str, config: Any, wall_seconds: float, extra: Optional[Mapping[str, float]] = None,
               models: Optional[Mapping[str, Any]] = None, artifacts: Optional[Mapping[str, Any]] = None) -> CDRResult:
        if not self.history:
            raise RuntimeError("no evaluation was recorded; call update() at least once")
        return CDRResult(method, config, self.best, self.best_round, self.best_test, self.best_test_round,
                         self.history, wall_seconds, dict(extra or {}), dict(models or {}), dict(artifacts or {}))
