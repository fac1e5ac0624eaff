"""Centralised training on pooled data, with the same loss and negatives as the federated runs.

Used for "centralised MF vs FedMF" style comparisons: one model sees every user's
examples in shuffled mini-batches pooled across users. Per epoch it draws fresh negatives
with the same :class:`~fedlib.data.sampling.NegativeSampler`; the loss is BCE with logits,
mean over the batch; the optimiser is plain SGD with optional per-parameter learning rates.
"""
from __future__ import annotations

from typing import List, Mapping, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import Pairs
from fedlib.engine.plan import round_generator

__all__ = ["train_centralised"]


def train_centralised(
    model: nn.Module,
    train: Pairs,
    num_items: int,
    *,
    epochs: int,
    lr: Union[float, Mapping[str, float]],
    batch_size: int = 512,
    num_negatives: int = 4,
    seed: int = 0,
    sampler: Optional[NegativeSampler] = None,
    first_epoch: int = 0,
) -> List[float]:
    """Train ``model`` (``forward(users, items) -> logits``) for ``epochs`` epochs.

    Args:
        lr: one learning rate, or ``{parameter name: lr}`` (names from ``named_parameters``;
            unnamed parameters use ``lr["default"]``), e.g. ``{"user_emb": 1.0,
            "item_emb": 1.0, "default": 0.1}``.
        seed: epoch ``e`` draws its negatives and shuffle from ``round_generator(seed, e)``.
        first_epoch: index of the first epoch of this call, so that training in several calls
            (e.g. one epoch at a time, evaluating in between) draws what one call would.

    Returns:
        Mean training loss of each epoch.
    """
    sampler = sampler if sampler is not None else NegativeSampler(train, num_items)
    rates = {"default": lr} if not isinstance(lr, Mapping) else dict(lr)
    groups = [{"params": [p], "lr": rates.get(name, rates.get("default", 0.0))} for name, p in model.named_parameters()]
    optimizer = torch.optim.SGD(groups)
    device = next(model.parameters()).device
    losses = []
    for epoch in range(int(first_epoch), int(first_epoch) + epochs):
        rng = round_generator(seed, epoch)
        negatives = sampler.sample(train.users, num_negatives, rng)  # (P, k)
        users = np.repeat(train.users, 1 + num_negatives)
        items = np.concatenate([train.items[:, None], negatives], axis=1).ravel()
        labels = np.tile(np.r_[1.0, np.zeros(num_negatives)], len(train)).astype(np.float32)
        order = rng.permutation(users.size)
        users_t = torch.as_tensor(users[order], device=device)
        items_t = torch.as_tensor(items[order], device=device)
        labels_t = torch.as_tensor(labels[order], device=device, dtype=next(model.parameters()).dtype)
        total = 0.0
        for start in range(0, users.size, batch_size):
            sl = slice(start, start + batch_size)
            optimizer.zero_grad()
            loss = F.binary_cross_entropy_with_logits(model(users_t[sl], items_t[sl]), labels_t[sl])
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * (min(start + batch_size, users.size) - start)
        losses.append(total / users.size)
    return losses
