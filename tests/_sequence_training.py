"""Shared by the sequential baselines' tests: a short centralised training and held-out MRR."""
from typing import List, Sequence

import numpy as np
import torch

from fedlib.methods.fedcsr import make_batch


def train_steps(model, split, *, steps: int, lr: float, maxlen: int = 15, batch_size: int = 32) -> List[float]:
    """Adam on ``steps`` random mini-batches of ``split.train`` (rows drawn with seed 0); the losses."""
    na, nb = split.num_items_a, split.num_items_b
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    rng = np.random.default_rng(0)
    model.train()
    losses = []
    for _ in range(steps):
        rows = rng.choice(len(split.train), size=batch_size, replace=False)
        loss = model.loss(make_batch(split.train, na, nb, maxlen, rows=rows))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def heldout_mrr(model, split, *, maxlen: int = 15, roles: Sequence[str] = ("valid", "test")) -> float:
    """Mean reciprocal rank of the ground truth (candidate 0) over the ``roles`` sequences, in eval mode."""
    na, nb = split.num_items_a, split.num_items_b
    model.eval()
    reciprocal = []
    with torch.no_grad():
        for role in roles:
            candidates = torch.as_tensor(np.asarray(getattr(split, f"{role}_candidates")))   # (R, C)
            inputs = make_batch(getattr(split, role), na, nb, maxlen).inputs
            scores = model.score(inputs, candidates, (candidates[:, 0] >= na).long())      # (R, C)
            reciprocal.append(1.0 / (1 + (scores[:, 1:] > scores[:, :1]).sum(1)).double())
    return torch.cat(reciprocal).mean().item()


def random_mrr(split, role: str = "test") -> float:
    """The MRR of a random ranking of ``role``'s candidates (ties aside)."""
    num_candidates = np.asarray(getattr(split, f"{role}_candidates")).shape[1]
    return float(np.mean(1.0 / np.arange(1, num_candidates + 1)))
