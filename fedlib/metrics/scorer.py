"""Ranking metrics of a pair scorer on a split's sampled candidates (HR@K, NDCG@K, MRR).

A *pair scorer* scores given items for given users: ``score(users (n,) int64, items (n, C)
int64) -> (n, C)`` scores, higher is better. A split built with sampled candidates (the
FedPCL-CDR protocol) holds them in ``split.extra["valid_candidates"]`` /
``["test_candidates"]``, ``(n, C)`` item ids per held-out pair with the positive in column 0.
The cross-domain methods (:mod:`fedlib.baselines.cross_domain.cdr_common`) and the review-text leak audit
(:func:`fedlib.models.review_text.review_leak_effect`) are evaluated this way.
"""
from __future__ import annotations

from typing import Callable, Dict, Sequence

import torch

from fedlib.data.splits import InteractionSplit
from fedlib.metrics.ranking import candidate_set_metrics

__all__ = ["PairScorer", "evaluate_scorer", "evaluate_both"]

PairScorer = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``score(users (n,) int64, items (n, C) int64) -> (n, C)`` scores (higher = better)."""


def evaluate_scorer(score: PairScorer, split: InteractionSplit, role: str, ks: Sequence[int] = (5, 10),
                    device=None, chunk_size: int = 2048) -> Dict[str, float]:
    """Mean ``HR@K``, ``NDCG@K`` and ``MRR`` of ``score`` on one domain's ``role`` candidates.

    Ties count against the positive (``tie_rule="pessimistic"``), so a constant scorer gets 0.
    Raises ``ValueError`` when the split has no candidates for ``role``.
    """
    held = getattr(split, role)
    candidates = split.extra.get(f"{role}_candidates")
    if candidates is None or len(held) == 0:
        raise ValueError(f"{split.name}: no {role} candidates; build the split with the fedpcl_cdr protocol "
                         f"(valid_holdout=True for 'valid')")
    with torch.no_grad():
        per_user = candidate_set_metrics(None, held.users, candidates, ks=ks, chunk_size=chunk_size, device=device,
                                         pair_fn=score)
    return {key: float(value.float().mean()) for key, value in per_user.items()}


def evaluate_both(score: PairScorer, split: InteractionSplit, ks: Sequence[int] = (5, 10),
                  device=None) -> Dict[str, float]:
    """``{"valid/HR@10": ..., "test/HR@10": ..., ...}`` of one domain."""
    return {f"{role}/{key}": value for role in ("valid", "test")
            for key, value in evaluate_scorer(score, split, role, ks, device).items()}
