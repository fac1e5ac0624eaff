"""One rule for every hyperparameter chosen on validation data.

Every paper's grid picks some values (a learning rate, a budget, a loss weight) from recorded
runs: the value whose run scored best on the validation split. The rule is written once here
so that every paper treats ties and failed runs the same way:

* the highest validation score wins;
* a score of ``None`` (no evaluation recorded) or NaN (the run diverged before its first
  evaluation) never wins: a diverged run is a result, not a candidate;
* ties go to the option with the smallest ``prefer`` key (default: the first option given,
  i.e. grid order), so a paper can prefer its code's default or a shorter budget.

Whether every point of a grid must be recorded before choosing is the caller's decision (a
half-finished sweep usually must not choose yet); :func:`best_on_validation` sees only the
options it is given.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Optional, Tuple, TypeVar

__all__ = ["best_on_validation", "is_finite_score"]

T = TypeVar("T")


def is_finite_score(score: Optional[float]) -> bool:
    """True for a real validation score; False for ``None`` (not evaluated) and NaN/±inf (diverged)."""
    return score is not None and math.isfinite(float(score))


def best_on_validation(options: Iterable[Tuple[T, Optional[float]]],
                       prefer: Optional[Callable[[T], Any]] = None) -> Optional[T]:
    """The option with the highest finite validation score.

    Args:
        options: ``(option, score)`` pairs, in grid order; ``score`` is the validation metric at
            the run's selected evaluation (larger is better), ``None`` or NaN when there is none.
        prefer: tie-break key (smaller wins) among options with the same best score; ``None``
            keeps the first of them in ``options``' order.

    Returns:
        The winning option, or ``None`` when no option has a finite score.

    >>> best_on_validation([(0.1, 0.30), (0.5, 0.32), (1.0, float("nan"))])
    0.5
    >>> best_on_validation([(1e-2, 0.3), (1e-3, 0.3)], prefer=lambda rate: rate)
    0.001
    """
    best: Optional[tuple] = None
    for position, (option, score) in enumerate(options):
        if not is_finite_score(score):
            continue
        tie_break = prefer(option) if prefer is not None else ()
        rank = (-float(score), tie_break, position)
        if best is None or rank < best[0]:
            best = (rank, option)
    return None if best is None else best[1]
