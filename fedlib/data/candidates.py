"""Sampled evaluation candidate sets: one positive plus ``n`` negatives per row, fixed by seed.

Sampled evaluation ranks a held-out positive against a small set of items the user is not
known to like (1 + 99 in FedKDRec/FedPCL-CDR style setups, 1 + 999 in FedCSR). The set is
drawn **once** with a seed and stored with the split, so every method is scored on exactly
the same candidates.

Which items count as the user's positives (and are therefore never drawn as negatives):
**every known interaction of that user in that domain**: train, valid and test together,
plus the row's own positive. Items outside the row's item range (another domain) are never
drawn either. Negatives are distinct within a row (sampling without replacement).

The output is always an ``(n_rows, 1 + num_negatives) int64`` array with the positive in
column 0; the order of the negatives is random.
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence, Union

import numpy as np

from fedlib.data.splits import Pairs

SeedLike = Union[int, Sequence[int], np.random.SeedSequence, np.random.Generator]


def make_rng(seed: SeedLike) -> np.random.Generator:
    """A numpy ``Generator`` from an int, a sequence of ints (e.g. ``[seed, stream]``) or a generator."""
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(seed)


def sample_candidates(
    row_users,
    positives,
    exclude_users,
    exclude_items,
    *,
    num_negatives: int,
    seed: SeedLike,
    num_items: Optional[int] = None,
    item_low=0,
    item_high=None,
) -> np.ndarray:
    """Draw ``num_negatives`` distinct negatives per row, never one of the row user's positives.

    Args:
        row_users: ``(R,)`` user id owning each row (several rows may share a user).
        positives: ``(R,)`` the held-out positive item of each row (goes to column 0).
        exclude_users, exclude_items: ``(E,)`` pairs ``(user, item)`` that may never be a
            negative for that user: pass all of the user's known interactions in the domain.
            The row's own positive is always excluded, listed here or not.
        num_negatives: negatives per row (99, 999, ...).
        seed: int, ``[seed, stream]`` list, ``SeedSequence`` or ``Generator``.
        num_items: item-id space ``[0, num_items)`` when all rows share one range.
        item_low, item_high: per-row (``(R,)``) or scalar half-open item range to draw from,
            e.g. the target's domain in a cross-domain id space. ``item_high`` defaults to
            ``num_items``.

    Returns:
        ``(R, 1 + num_negatives) int64``; column 0 is ``positives``.

    Raises:
        ValueError: a row has fewer than ``num_negatives`` allowed items, or a positive lies
            outside its row's range.
    """
    row_users = np.asarray(row_users, dtype=np.int64)
    positives = np.asarray(positives, dtype=np.int64)
    if row_users.shape != positives.shape or row_users.ndim != 1:
        raise ValueError(f"row_users and positives must be 1-d of equal length, got {row_users.shape}, {positives.shape}")
    if item_high is None:
        if num_items is None:
            raise ValueError("give num_items or item_high")
        item_high = num_items
    n_rows = row_users.size
    low = np.broadcast_to(np.asarray(item_low, dtype=np.int64), (n_rows,))
    high = np.broadcast_to(np.asarray(item_high, dtype=np.int64), (n_rows,))
    if n_rows == 0:
        return np.empty((0, 1 + num_negatives), dtype=np.int64)
    if np.any((positives < low) | (positives >= high)):
        bad = int(np.flatnonzero((positives < low) | (positives >= high))[0])
        raise ValueError(
            f"row {bad}: positive item {int(positives[bad])} lies outside its candidate range "
            f"[{int(low[bad])}, {int(high[bad])})"
        )

    # Excluded (user, item) pairs as sorted unique int64 keys user * stride + item, so that
    # membership and per-range counts are binary searches (no per-user Python sets).
    stride = int(max(int(high.max()), int(np.max(exclude_items, initial=0)) + 1, 1))
    keys = np.sort(
        np.concatenate([
            np.asarray(exclude_users, dtype=np.int64) * stride + np.asarray(exclude_items, dtype=np.int64),
            row_users * stride + positives,
        ])
    )
    keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]
    width = high - low
    excluded_in_range = np.searchsorted(keys, row_users * stride + high) - np.searchsorted(keys, row_users * stride + low)
    allowed = width - excluded_in_range
    if np.any(allowed < num_negatives):
        bad = int(np.flatnonzero(allowed < num_negatives)[0])
        raise ValueError(
            f"row {bad} (user {int(row_users[bad])}) has only {int(allowed[bad])} items it has not "
            f"interacted with in [{int(low[bad])}, {int(high[bad])}); cannot draw {num_negatives} "
            "distinct negatives. Use fewer negatives or full ranking."
        )

    rng = make_rng(seed)
    out = np.empty((n_rows, 1 + num_negatives), dtype=np.int64)
    out[:, 0] = positives
    pending = np.arange(n_rows)
    # Oversample so that one round usually suffices for almost every row: the expected
    # share of usable draws is allowed / width. Rows with an unusually low share retry with
    # twice as many draws, and the rare nearly saturated row falls through to the exact path.
    acceptance = np.clip(allowed / np.maximum(width, 1), 1e-2, 1.0)
    factor = 1.3 / float(np.percentile(acceptance, 5))
    for _ in range(8):
        if pending.size == 0:
            break
        draws = int(np.ceil(num_negatives * factor)) + 8
        u = rng.random((pending.size, draws))
        cand = low[pending, None] + (u * width[pending, None]).astype(np.int64)
        ok = ~_is_member(keys, row_users[pending, None] * stride + cand)
        ok &= _first_occurrence(cand)
        enough = ok.sum(axis=1) >= num_negatives
        if np.any(enough):
            rows = pending[enough]
            # Stable argsort of "not ok" puts the accepted draws first, in draw order.
            pick = np.argsort(~ok[enough], axis=1, kind="stable")[:, :num_negatives]
            out[rows, 1:] = np.take_along_axis(cand[enough], pick, axis=1)
        pending = pending[~enough]
        factor *= 2.0
    # Nearly saturated rows (allowed close to num_negatives): draw exactly from the allowed set.
    for row in pending:
        pool = np.arange(low[row], high[row], dtype=np.int64)
        pool = pool[~_is_member(keys, row_users[row] * stride + pool)]
        out[row, 1:] = rng.choice(pool, size=num_negatives, replace=False)
    return out


def candidates_for(
    eval_pairs: Pairs,
    known: Iterable[Pairs],
    *,
    num_items: int,
    num_negatives: int = 99,
    seed: SeedLike = 0,
) -> np.ndarray:
    """Candidates for every row of ``eval_pairs`` (e.g. a split's test set).

    ``known`` lists every interaction set of the same domain (typically ``train, valid,
    test``); all of a user's items there are excluded from that user's negatives.

    Returns:
        ``(len(eval_pairs), 1 + num_negatives) int64``, row ``r`` for
        ``(eval_pairs.users[r], eval_pairs.items[r])``.
    """
    known = list(known)
    users = np.concatenate([p.users for p in known]) if known else np.empty(0, np.int64)
    items = np.concatenate([p.items for p in known]) if known else np.empty(0, np.int64)
    return sample_candidates(
        eval_pairs.users,
        eval_pairs.items,
        users,
        items,
        num_negatives=num_negatives,
        seed=seed,
        num_items=num_items,
    )


def _is_member(sorted_keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Element-wise ``queries in sorted_keys`` for a sorted unique key array."""
    if sorted_keys.size == 0:
        return np.zeros(queries.shape, dtype=bool)
    pos = np.searchsorted(sorted_keys, queries)
    pos = np.minimum(pos, sorted_keys.size - 1)
    return sorted_keys[pos] == queries


def _first_occurrence(matrix: np.ndarray) -> np.ndarray:
    """Mask of entries that are the first occurrence of their value within their row."""
    order = np.argsort(matrix, axis=1, kind="stable")
    sorted_vals = np.take_along_axis(matrix, order, axis=1)
    first_sorted = np.ones(matrix.shape, dtype=bool)
    first_sorted[:, 1:] = sorted_vals[:, 1:] != sorted_vals[:, :-1]
    mask = np.empty(matrix.shape, dtype=bool)
    np.put_along_axis(mask, order, first_sorted, axis=1)
    return mask


__all__ = ["sample_candidates", "candidates_for", "make_rng"]
