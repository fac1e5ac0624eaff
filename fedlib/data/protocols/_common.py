"""Building blocks shared by the per-paper protocols (all vectorised numpy).

Conventions used throughout:

* a *frame* is the ``frame`` of a :class:`fedlib.data.loaders.LoadedInteractions`
  (columns ``user, item, rating, timestamp`` and optionally ``domain``/``split``, raw ids,
  rows in file order);
* a *position* is an interaction's index in the order a protocol works in (file order,
  or the global chronological order for F3CRec); file order breaks timestamp ties, so
  every ordering below is deterministic;
* a *role* is ``TRAIN`` (0), ``VALID`` (1) or ``TEST`` (2), one per interaction.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from fedlib.data import loaders
from fedlib.data.errors import EmptyUserError, FedlibDataError
from fedlib.data.splits import InteractionSplit, Pairs

TRAIN, VALID, TEST = 0, 1, 2
ROLE_NAMES = ("train", "valid", "test")


class UnsupportedDatasetError(FedlibDataError, ValueError):
    """A dataset that a protocol cannot use (wrong format, or not part of that paper)."""

    def __init__(self, protocol: str, dataset: str, supported: Sequence[str], reason: str = ""):
        self.protocol = protocol
        self.dataset = dataset
        self.supported = tuple(supported)
        why = f" {reason}" if reason else ""
        super().__init__(
            f"Protocol {protocol!r} cannot use dataset {dataset!r}.{why} "
            f"Datasets it supports: {', '.join(self.supported)}."
        )


@dataclass(frozen=True)
class Loaded:
    """What the protocols need from a loader result (the frame plus provenance)."""

    dataset: str
    variant: Optional[str]
    frame: pd.DataFrame
    status: str
    notes: tuple


def load_interactions(dataset: str, *, variant=None, root=None, allow_partial=False) -> Loaded:
    """Thin wrapper over :func:`fedlib.data.loaders.load_interactions`."""
    got = loaders.load_interactions(dataset, variant=variant, root=root, allow_partial=allow_partial)
    return Loaded(got.dataset, got.variant, got.frame, got.status, tuple(got.notes))


def load_sequences(dataset: str, *, root=None):
    """Thin wrapper over :func:`fedlib.data.loaders.load_sequences`."""
    return loaders.load_sequences(dataset, root=root)


LASTFM = "hetrec2011-lastfm-2k"
LASTFM_ASSIGNMENTS = "tag_assignments"


def lastfm_tag_assignments(root=None) -> Loaded:
    """HetRec Last.fm: one row per tag assignment (user, artist, tag, time), in file order.

    FedRKG's LastFM-2K statistics count every tag assignment, and the F3CRec stream is
    built from distinct (user, artist, tagging day) events; both read the loader's
    ``tag_assignments`` variant (columns user, item, rating 1.0, timestamp, tag).
    """
    return load_interactions(LASTFM, variant=LASTFM_ASSIGNMENTS, root=root)


# ---------------------------------------------------------------------------------------
# Filtering and re-indexing
# ---------------------------------------------------------------------------------------


def iterative_k_core(users: np.ndarray, items: np.ndarray, k_user: int, k_item: int) -> np.ndarray:
    """Boolean mask of the rows that survive an iterative k-core filter.

    Users with fewer than ``k_user`` rows and items with fewer than ``k_item`` rows are
    removed, repeatedly, until no count changes (removing an item can push a user below
    its threshold and vice versa). Each row counts once (repeated pairs count repeatedly).

    Args:
        users, items: ``(n,)`` codes (any integers; factorised internally).
    """
    user_codes, _ = pd.factorize(users)
    item_codes, _ = pd.factorize(items)
    keep = np.ones(user_codes.size, dtype=bool)
    while True:
        user_counts = np.bincount(user_codes[keep], minlength=user_codes.max(initial=-1) + 1)
        item_counts = np.bincount(item_codes[keep], minlength=item_codes.max(initial=-1) + 1)
        new_keep = keep & (user_counts[user_codes] >= k_user) & (item_counts[item_codes] >= k_item)
        if new_keep.sum() == keep.sum():
            return new_keep
        keep = new_keep


def users_with_min_count(users: np.ndarray, k: int) -> np.ndarray:
    """Mask of rows whose user has at least ``k`` rows (a single, non-iterated user filter)."""
    codes, _ = pd.factorize(users)
    counts = np.bincount(codes)
    return counts[codes] >= k


def dense_ids(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense 0-based ids in order of first appearance, and the raw value of every id."""
    codes, uniques = pd.factorize(values)
    return codes.astype(np.int64), np.asarray(uniques)


def chronological_order(timestamps: np.ndarray) -> np.ndarray:
    """Permutation that sorts by timestamp; ties keep file order (stable sort)."""
    return np.argsort(np.asarray(timestamps), kind="stable")


def within_group_rank(groups: np.ndarray) -> np.ndarray:
    """0-based rank of each row inside its group, in the given row order (like ``cumcount``)."""
    groups = np.asarray(groups)
    order = np.argsort(groups, kind="stable")
    sorted_groups = groups[order]
    starts = np.ones(sorted_groups.size, dtype=bool)
    starts[1:] = sorted_groups[1:] != sorted_groups[:-1]
    group_start = np.maximum.accumulate(np.where(starts, np.arange(sorted_groups.size), 0))
    rank = np.empty(groups.size, dtype=np.int64)
    rank[order] = np.arange(sorted_groups.size) - group_start
    return rank


# ---------------------------------------------------------------------------------------
# Per-user splits
# ---------------------------------------------------------------------------------------


def ceil_percent(counts: np.ndarray, percent: int) -> np.ndarray:
    """``ceil(counts * percent / 100)`` in exact integer arithmetic (no float surprises)."""
    counts = np.asarray(counts, dtype=np.int64)
    return (counts * percent + 99) // 100


def holdout_roles(
    users: np.ndarray,
    *,
    mode: str,
    rng: Optional[np.random.Generator] = None,
    valid_percent: int = 10,
    test_percent: int = 10,
    min_for_holdout: int = 3,
) -> np.ndarray:
    """Per-user train/valid/test roles for rows given in chronological order.

    A user with ``n >= min_for_holdout`` rows gets ``ceil(n * test_percent / 100)`` test rows
    and ``ceil(n * valid_percent / 100)`` valid rows (so at least one of each), the rest
    train; a user with fewer rows keeps all of them in train.

    Args:
        users: ``(n,)`` user of each row; rows must already be in chronological order.
        mode: ``"chronological"``: the user's latest rows are test, the ones just before
            are valid; ``"random"``: which rows are held out is a uniformly random choice
            per user (drawn from ``rng``).
    Returns:
        ``(n,) int8`` roles (``TRAIN``/``VALID``/``TEST``).
    """
    users = np.asarray(users)
    if mode == "chronological":
        rank = within_group_rank(users)
    elif mode == "random":
        if rng is None:
            raise ValueError("mode='random' needs an rng")
        # A random permutation inside every user: sort by (user, random key), then rank.
        keys = rng.random(users.size)
        order = np.lexsort((keys, users))
        rank = np.empty(users.size, dtype=np.int64)
        rank[order] = within_group_rank(users[order])
    else:
        raise ValueError(f"unknown split mode {mode!r}; use 'random' or 'chronological'")
    codes, _ = pd.factorize(users)
    counts = np.bincount(codes)[codes]
    holds = counts >= min_for_holdout
    n_test = np.where(holds, ceil_percent(counts, test_percent), 0)
    n_valid = np.where(holds, ceil_percent(counts, valid_percent), 0)
    roles = np.full(users.size, TRAIN, dtype=np.int8)
    roles[rank >= counts - n_test] = TEST
    roles[(rank >= counts - n_test - n_valid) & (rank < counts - n_test)] = VALID
    return roles


def leave_last_out_roles(users: np.ndarray, timestamps: np.ndarray, *, tie_break: str = "file_last_is_latest") -> np.ndarray:
    """Latest row per user -> ``TEST``, second latest -> ``VALID``, the rest ``TRAIN``.

    Rows are given in file order. ``tie_break`` decides which of several rows with the same
    timestamp counts as the more recent one:

    * ``"file_last_is_latest"``: the row further down the file (a stable ascending sort);
    * ``"file_first_is_latest"``: the row higher up the file, which is what
      ``groupby(user).timestamp.rank(method="first", ascending=False)`` does (the FedRKG /
      PFedRec reference code).

    Raises:
        EmptyUserError: a user has fewer than 3 rows (train would be empty).
    """
    users = np.asarray(users)
    timestamps = np.asarray(timestamps, dtype=np.int64)
    position = np.arange(users.size)
    if tie_break == "file_last_is_latest":
        order = np.lexsort((-position, -timestamps, users))
    elif tie_break == "file_first_is_latest":
        order = np.lexsort((position, -timestamps, users))
    else:
        raise ValueError(f"unknown tie_break {tie_break!r}")
    recency = np.empty(users.size, dtype=np.int64)  # 0 = latest
    recency[order] = within_group_rank(users[order])
    codes, raw = pd.factorize(users)
    counts = np.bincount(codes)
    if counts.size and counts.min() < 3:
        bad = raw[np.flatnonzero(counts < 3)[:5]]
        raise EmptyUserError(
            f"{int((counts < 3).sum())} user(s) have fewer than 3 interactions (e.g. raw ids "
            f"{', '.join(map(str, bad))}); leave-last-out would leave their training set empty. "
            "Filter users with a minimum interaction count first."
        )
    roles = np.full(users.size, TRAIN, dtype=np.int8)
    roles[recency == 0] = TEST
    roles[recency == 1] = VALID
    return roles


def build_split(
    users: np.ndarray,
    items: np.ndarray,
    roles: np.ndarray,
    *,
    num_users: int,
    num_items: int,
    positions: Optional[np.ndarray] = None,
    timestamps: Optional[np.ndarray] = None,
    name: str = "",
    notes: Sequence[str] = (),
    extra: Optional[dict] = None,
) -> InteractionSplit:
    """An :class:`InteractionSplit` from per-row arrays and roles.

    Within each user, rows are kept in ``positions`` order (chronological when positions
    are global time ranks). ``timestamps``/``positions`` are stored in ``extra`` aligned
    with each :class:`Pairs` under ``"<role>_timestamps"`` / ``"<role>_positions"``.
    """
    users = np.asarray(users, dtype=np.int64)
    items = np.asarray(items, dtype=np.int64)
    positions = np.arange(users.size, dtype=np.int64) if positions is None else np.asarray(positions, dtype=np.int64)
    extra = dict(extra or {})
    parts = {}
    for role, role_name in enumerate(ROLE_NAMES):
        idx = np.flatnonzero(roles == role)
        idx = idx[np.lexsort((positions[idx], users[idx]))]
        parts[role_name] = Pairs.from_arrays(users[idx], items[idx], num_users=num_users)
        extra[f"{role_name}_positions"] = positions[idx]
        if timestamps is not None:
            extra[f"{role_name}_timestamps"] = np.asarray(timestamps, dtype=np.int64)[idx]
    return InteractionSplit(
        num_users=int(num_users),
        num_items=int(num_items),
        train=parts["train"],
        valid=parts["valid"],
        test=parts["test"],
        name=name,
        notes=tuple(notes),
        extra=extra,
    )


def implicit_rows(frame: pd.DataFrame) -> np.ndarray:
    """Mask of rows kept as implicit positives: every rating > 0 (a missing rating counts)."""
    rating = frame["rating"].to_numpy(dtype=np.float64)
    return ~(rating <= 0)


def sparsity_percent(interactions: int, users: int, items: int) -> float:
    """``100 * (1 - interactions / (users * items))`` (unrounded)."""
    if users == 0 or items == 0:
        return float("nan")
    return 100.0 * (1.0 - interactions / (users * items))


def interaction_statistics(split: InteractionSplit) -> pd.DataFrame:
    """One-row table: users, items, interactions (train + valid + test), sparsity (%)."""
    inter = len(split.train) + len(split.valid) + len(split.test)
    return pd.DataFrame([{
        "users": split.num_users,
        "items": split.num_items,
        "interactions": inter,
        "sparsity": round(sparsity_percent(inter, split.num_users, split.num_items), 2),
    }])
