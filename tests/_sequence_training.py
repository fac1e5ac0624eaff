"""Shared by the sequential baselines' tests: a short centralised training and held-out MRR."""
from typing import List, Sequence

import numpy as np
import torch

from fedlib.baselines.sequential.sequences import make_batch
from fedlib.baselines.sequential.sequence_training import sequence_ranks


def train_steps(model, split, *, steps: int, lr: float, batch_size: int = 32) -> List[float]:
    """Adam on ``steps`` random mini-batches of ``split.train`` (rows drawn with seed 0, windows of
    ``model.config.maxlen``); the losses."""
    na, nb = split.num_items_a, split.num_items_b
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    rng = np.random.default_rng(0)
    model.train()
    losses = []
    for _ in range(steps):
        rows = rng.choice(len(split.train), size=batch_size, replace=False)
        loss = model.loss(make_batch(split.train, na, nb, model.config.maxlen, rows=rows))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def heldout_mrr(model, split, *, roles: Sequence[str] = ("valid", "test")) -> float:
    """Mean reciprocal rank of the ground truth over the ``roles`` sequences (the library's rank loop)."""
    ranks = np.concatenate([sequence_ranks(model, split, role) for role in roles])
    return float(np.mean(1.0 / ranks))


def random_mrr(split, role: str = "test") -> float:
    """The MRR of a random ranking of ``role``'s candidates (ties aside)."""
    num_candidates = np.asarray(getattr(split, f"{role}_candidates")).shape[1]
    return float(np.mean(1.0 / np.arange(1, num_candidates + 1)))
