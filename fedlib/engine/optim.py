"""Optimisers shared by the methods.

:func:`adam` is ``torch.optim.Adam`` in its fused form wherever the device supports it. The
update rule is the same; what differs is the cost. The unfused step walks every parameter
element-wise in several passes (``lerp``, ``mul``, ``sqrt``, ``div``, ``addcdiv``), and
recommendation models step dense embedding tables of tens of thousands of rows every
mini-batch. On one CPU thread, stepping FedCSR's 12.6 M parameters takes about 82 ms unfused
and 16 ms fused (the optimiser was about a sixth of a FedCSR training step). The two forms agree
to float rounding (tested).
"""
from __future__ import annotations

from typing import Iterable

import torch

__all__ = ["adam"]


def adam(parameters: Iterable, **kwargs) -> torch.optim.Adam:
    """``torch.optim.Adam(parameters, **kwargs)``, fused where the device supports it.

    ``kwargs`` are Adam's own (``lr``, ``betas``, ``eps``, ``weight_decay``, ...). Falls back to
    the default implementation when the parameters' device or dtype has no fused kernel.
    """
    parameters = list(parameters)
    try:
        return torch.optim.Adam(parameters, fused=True, **kwargs)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(parameters, **kwargs)
