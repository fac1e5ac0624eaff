"""Checks of a config's integer fields, shared by every baseline family and the papers above them.

A config dataclass validates itself in ``__post_init__``; its counts (rounds, epochs, sizes,
patience) must be integers >= 1 and its seed an integer >= 0. ``bool`` is refused although
Python counts it as an ``int`` (``rounds=True`` is a mistake, not one round); NumPy integers
are accepted (grids build configs from arrays). Errors name ``<ConfigClass>.<field>`` and the
value given, so the message says which setting to fix and to what.

Layer: :mod:`fedlib.baselines`, below :mod:`fedlib.papers` (which may import it) and beside the
families (``cross_domain``, ``sequential``, ...), which all import it.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["check_positive_ints", "check_seed"]


def _check_integer(config: Any, name: str, minimum: int, hint: str) -> None:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{type(config).__name__}.{name} must be an integer >= {minimum}, got {value!r}{hint}")


def check_positive_ints(config: Any, names: Sequence[str], hint: str = "") -> None:
    """Raise ``ValueError`` naming ``<Config>.<field>`` and its value unless every field in ``names`` is an integer >= 1.

    ``hint`` is appended to the message (e.g. ``" (rounds of the trainer)"``).
    """
    for name in names:
        _check_integer(config, name, 1, hint)


def check_seed(config: Any, name: str = "seed") -> None:
    """Raise ``ValueError`` naming ``<Config>.seed`` and its value unless it is an integer >= 0."""
    _check_integer(config, name, 0, " (the run's only source of randomness)")
