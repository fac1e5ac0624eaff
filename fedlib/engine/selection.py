"""Validation selection and early stopping: the library's one rule, used by the trainer.

After every scheduled evaluation the trainer hands the evaluation's metrics to a
:class:`Selection`, which

* keeps the evaluation with the best ``metric`` (higher is better): its round and every
  metric it reported (``best_metrics``; an evaluation that also scored the test set carries
  the test numbers *at the selected round*, which is what the papers' tables report);
* counts the evaluations since the last improvement and stops the run once they reach
  ``patience`` (``None``: never stop early);
* never selects a NaN score (it counts as an evaluation without improvement);
* breaks ties by keeping the first best (F3CRec, the cross-domain methods), or the later one
  with ``prefer_later_ties`` (FedRKG's code compares with ``>=``).

The same class, pointed at a *test* metric and never allowed to stop the run, is the audit
of "selecting on the test set" that several papers' code does (FedPCL-CDR, FedCSR): the
trainer keeps one as ``audit`` when the schedule names an ``audit_metric``.

Example::

    selection = Selection("valid/HR@10", patience=10)
    for round_index, metrics in evaluations:
        selection.update(round_index, metrics)
        if selection.stopped_early:
            break
    selection.best_round, selection.best_metrics
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional

__all__ = ["Selection"]


@dataclass
class Selection:
    """Best-evaluation bookkeeping and patience (see the module docstring).

    Attributes:
        metric: the key of the evaluation's metrics to maximise (e.g. ``"NDCG@20"``,
            ``"valid/HR@10"``).
        patience: stop after this many evaluations without improvement; ``None`` = never.
        prefer_later_ties: on an equal score keep the later evaluation.
        best_round: the round (number of completed rounds) of the best evaluation so far.
        best_score: its ``metric``.
        best_metrics: every metric of that evaluation.
        evals_since_best: evaluations since ``best_round`` (0 right after an improvement).
        stopped_early: patience has run out.
    """

    metric: str
    patience: Optional[int] = None
    prefer_later_ties: bool = False
    best_round: Optional[int] = None
    best_score: Optional[float] = None
    best_metrics: Optional[Dict[str, float]] = None
    evals_since_best: int = 0
    stopped_early: bool = False
    evaluations: int = field(default=0)

    def __post_init__(self):
        if not isinstance(self.metric, str) or not self.metric:
            raise ValueError(f"Selection.metric must name a metric (e.g. 'NDCG@20'), got {self.metric!r}")
        if self.patience is not None and (isinstance(self.patience, bool) or int(self.patience) < 1):
            raise ValueError(f"Selection.patience must be an integer >= 1 or None (never stop), got {self.patience!r}")

    def update(self, round_index: int, metrics: Mapping[str, float]) -> bool:
        """Record one evaluation made after ``round_index`` completed rounds; ``True`` when it is the new best.

        Raises ``ValueError`` when ``metrics`` lacks :attr:`metric`.
        """
        if self.metric not in metrics:
            raise ValueError(f"selection metric {self.metric!r} is not among the evaluated metrics {sorted(metrics)}; "
                             "evaluate it or select on one of these")
        score = float(metrics[self.metric])
        self.evaluations += 1
        if self.improves(score, self.best_score, self.prefer_later_ties):
            self.best_round, self.best_score, self.best_metrics = int(round_index), score, dict(metrics)
            self.evals_since_best, self.stopped_early = 0, False
            return True
        self.evals_since_best += 1
        # Recomputed at every evaluation, not sticky: a caller that lets a run go on past its
        # patience (FedRKG's probe rounds) sees it set again at the next evaluation without gain.
        self.stopped_early = self.patience is not None and self.evals_since_best >= self.patience
        return False

    @staticmethod
    def improves(score: float, best_score: Optional[float], prefer_later_ties: bool = False) -> bool:
        """The rule: whether ``score`` replaces ``best_score`` (``None``: nothing selected yet).

        A NaN score (a diverged model, an empty validation set) is never selected: it counts as
        an evaluation without improvement, as in every paper's code that starts from -inf.
        """
        if math.isnan(score):
            return False
        return best_score is None or score > best_score or (prefer_later_ties and score == best_score)

    def state_dict(self) -> Dict[str, object]:
        """Plain values (for checkpoints)."""
        return {"metric": self.metric, "patience": self.patience, "prefer_later_ties": self.prefer_later_ties,
                "best_round": self.best_round, "best_score": self.best_score,
                "best_metrics": None if self.best_metrics is None else dict(self.best_metrics),
                "evals_since_best": self.evals_since_best, "stopped_early": self.stopped_early,
                "evaluations": self.evaluations}

    def load_state_dict(self, saved: Mapping[str, object]) -> None:
        """Restore what :meth:`state_dict` returned; refuses one made for another rule."""
        for key in ("metric", "patience", "prefer_later_ties"):
            if saved[key] != getattr(self, key):
                raise ValueError(f"saved selection has {key}={saved[key]!r}, this run {getattr(self, key)!r}; "
                                 "a run may only be resumed under the rule it started with")
        self.best_round, self.best_score = saved["best_round"], saved["best_score"]
        self.best_metrics = None if saved["best_metrics"] is None else dict(saved["best_metrics"])
        self.evals_since_best, self.stopped_early = int(saved["evals_since_best"]), bool(saved["stopped_early"])
        self.evaluations = int(saved.get("evaluations", 0))
