"""Most-popular items: the non-personalised reference every recommender must beat.

Scores every item by its number of training interactions, identically for every user.
It needs no training and no federation (the counts could be gathered with secure
aggregation), so it marks the floor a federated model has to clear.
"""
from __future__ import annotations

import numpy as np
import torch

from fedlib.data.splits import Pairs
from fedlib.models.base import FederatedModel

__all__ = ["ItemPopularity"]


class ItemPopularity(FederatedModel):
    """``s_ui = count_i`` (training interactions of item ``i``) for every user ``u``.

    Use with :class:`fedlib.engine.RankingEvaluator` like any backbone:
    ``evaluator(model, model.global_state(), {}, "test")``.
    """

    param_kinds = {}

    def __init__(self, train: Pairs, num_items: int):
        self.num_users, self.num_items = int(train.num_users), int(num_items)
        self.counts = torch.as_tensor(np.bincount(train.items, minlength=num_items), dtype=torch.float64)  # (I,)

    def global_state(self) -> dict:
        return {"counts": self.counts}

    def score_users(self, global_state, private_state, users):
        counts = global_state["counts"]
        return counts.unsqueeze(0).expand(len(users), -1)  # (n, I)
