"""Dropout with a faster CPU mask: a drop-in for :class:`torch.nn.Dropout`.

Why. On CPU, ``torch.nn.Dropout`` draws its mask with ``bernoulli_``, one Mersenne-Twister
call and one float comparison per element: ~15 ns per element on one core, about 100 times
the cost of the multiplication it guards. The transformer encoders of the sequential models
(FedCSR and its baselines) apply dropout to every ``(B, L, n)`` activation, so in FedCSR's
training step on Food-Kitchen ``bernoulli_`` was a sixth of the CPU time.

How. The mask comes from NumPy's PCG64 as 16-bit integers (~1.5 ns per element) and keeps
an element when its integer is at least ``round(p * 65536)``. The drop rate is therefore
``round(p * 65536) / 65536``, within 7.7e-6 of ``p`` (0.3 → 0.3000031). Kept elements are
scaled by ``1 / (1 - p)`` as in torch. Each call seeds its NumPy generator with one draw from
torch's global generator, so ``torch.manual_seed`` makes runs repeat exactly.

On CUDA (and for ``p = 0`` or in eval mode) it defers to :func:`torch.nn.functional.dropout`.
The masks differ from torch's, so a model using this layer does not reproduce the numbers
of the same model with ``nn.Dropout``: the distribution is the same, the draws are not.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Dropout", "dropout", "keep_mask"]

_LEVELS = 65536  # the mask's integers are uint16


def _check_rate(p: float) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) < 1.0:
        raise ValueError(f"dropout rate must be a number in [0, 1), got {p!r}")
    return float(p)


def keep_mask(shape, p: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A CPU tensor of ``shape``: ``1 / (1 - p)`` where an element is kept, 0 where dropped.

    The generator is seeded from torch's global CPU generator (one ``randint``), so the mask
    follows ``torch.manual_seed``.
    """
    p = _check_rate(p)
    seed = int(torch.randint(0, 2 ** 62, (), dtype=torch.int64))
    count = int(np.prod(shape, dtype=np.int64))
    draws = np.random.default_rng(seed).integers(0, _LEVELS, size=count, dtype=np.uint16)
    keep = torch.from_numpy(draws >= round(p * _LEVELS)).view(tuple(shape))   # bool, shape
    return keep.to(dtype).mul_(1.0 / (1.0 - p))


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """:func:`torch.nn.functional.dropout` with the CPU mask of :func:`keep_mask` (same shape as ``x``)."""
    p = _check_rate(p)
    if not training or p == 0.0 or x.numel() == 0:
        return x
    if x.device.type != "cpu" or not x.dtype.is_floating_point:
        return F.dropout(x, p, training=True)
    return x * keep_mask(x.shape, p, x.dtype)


class Dropout(nn.Module):
    """Drop-in for :class:`torch.nn.Dropout` (module docstring); ``p`` in [0, 1)."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        self.p = _check_rate(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
