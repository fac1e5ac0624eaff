"""Full-ranking evaluation of a federated state (validation for selection, test at the end).

Protocol of F3CRec and FedRKG: every item is a candidate; the user's training items are
masked for validation, training + validation items for test; Recall@K / NDCG@K come from
:func:`fedlib.metrics.full_ranking_metrics_from_score_fn`, one value per user with at
least one target, then averaged over those users.
"""
from __future__ import annotations

from typing import Dict, Iterable, Tuple

import numpy as np
import torch

from fedlib.data.splits import Pairs
from fedlib.metrics import full_ranking_metrics_from_score_fn, mean_over_users
from fedlib.models.base import FederatedModel

__all__ = ["RankingEvaluator", "union_pairs"]


def union_pairs(*pairs: Pairs) -> Pairs:
    """All interactions of several :class:`Pairs` (same user id space) in one object."""
    num_users = max(p.num_users for p in pairs)
    return Pairs.from_arrays(np.concatenate([p.users for p in pairs]), np.concatenate([p.items for p in pairs]), num_users)


class RankingEvaluator:
    """Evaluate ``model`` at a (global, private) state on the validation or test pairs.

    Args:
        train, valid, test: the split's interactions (user ids = client ids).
        ks: cutoffs (F3CRec: 20; FedRKG: 5, 10, 20).
        metrics: names understood by :mod:`fedlib.metrics` (``"recall"``, ``"ndcg"``, ...).
        chunk_size: users scored at once (``chunk_size × num_items`` scores in memory).
    """

    def __init__(self, train: Pairs, valid: Pairs, test: Pairs, ks: Iterable[int] = (20,),
                 metrics: Iterable[str] = ("recall", "ndcg"), chunk_size: int = 512):
        self.ks, self.metrics, self.chunk_size = tuple(ks), tuple(metrics), int(chunk_size)
        self._sets = {
            "valid": (valid, train),
            "test": (test, union_pairs(train, valid)),
        }

    def per_user(self, model: FederatedModel, global_state, private_state, which: str = "valid") -> Tuple[np.ndarray, Dict[str, torch.Tensor]]:
        """``(users, {"Recall@20": (n,), ...})`` for users with at least one target in ``which``."""
        return self._per_user(lambda u: model.score_users(global_state, private_state, u), global_state,
                              private_state, which)

    def _per_user(self, score_fn, global_state, private_state, which: str):
        targets, masked = self._sets[which]
        users = targets.active_users()
        device = next(iter({**global_state, **private_state}.values())).device
        with torch.no_grad():
            per_user = full_ranking_metrics_from_score_fn(
                score_fn,
                user_ids=users, target_indptr=targets.indptr, target_items=targets.items,
                mask_indptr=masked.indptr, mask_items=masked.items, ks=self.ks, metrics=self.metrics,
                chunk_size=self.chunk_size, device=device,
            )
        return users, per_user

    def per_user_splits(self, model: FederatedModel, global_state, private_state,
                        splits: Iterable[str] = ("valid", "test")) -> Dict[str, Tuple[np.ndarray, Dict[str, torch.Tensor]]]:
        """:meth:`per_user` for several splits, scoring each chunk of users only once.

        Validation and test usually evaluate the same users in the same chunks, so the
        ``(chunk, I)`` scores of the first split are kept (all users: ``U × I`` floats, e.g.
        44 MB for Amazon-Video) and reused by the next: one scoring pass instead of two,
        with identical numbers. Chunks that differ between splits are scored again.
        """
        cache: Dict[bytes, torch.Tensor] = {}

        def scores(users: torch.Tensor) -> torch.Tensor:
            key = users.detach().cpu().numpy().tobytes()
            if key not in cache:
                cache[key] = model.score_users(global_state, private_state, users)
            return cache[key]

        out = {}
        for which in splits:
            if which not in self._sets:
                raise ValueError(f"unknown split {which!r}; expected one of {sorted(self._sets)}")
            out[which] = self._per_user(scores, global_state, private_state, which)
        return out

    def __call__(self, model: FederatedModel, global_state, private_state, which: str = "valid") -> Dict[str, float]:
        """Mean over evaluated users: ``{"NDCG@20": 0.08, ...}``."""
        _, per_user = self.per_user(model, global_state, private_state, which)
        return {k: float(v) for k, v in mean_over_users(per_user).items()}
