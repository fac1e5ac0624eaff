"""Training negative sampler: uniform negatives that never look at validation or test data.

Implicit-feedback recommenders train a binary classifier on each user's positives plus
``n`` sampled "negatives" per positive (4 in F3CRec, FedRKG, PFedRec, FedNCF). A negative
for user ``u`` is an item drawn uniformly from ``[0, num_items)`` **minus the user's
excluded set**. What that set contains matters:

* ``exclude="train"`` (default, and the only correct choice): the user's *training*
  positives. Validation and test items stay possible negatives, exactly as they are
  unknown to the user's device at training time.
* ``exclude="all_rated"`` (audit only): every item the user rated in train, valid **or
  test**. This is what the public code of PFedRec, FedRAP and FedRKG does. It leaks the
  held-out items: their rows are never pushed down by a negative step, so with personal
  item tables and full-ranking evaluation (train + valid masked) the test item ends up as
  the only never-penalised candidate and lands at rank 1. FedRKG's public code
  (https://github.com/Jaehyung-Lim/fedrkg, ``utils/data.py``) samples this way; in the
  recorded FedRKG Table 1 runs on FilmTrust (``results/fedrkg/table1.csv``) it alone turns
  R@5 ≈ 0.4 % into R@5 = 100 %. Use it only to reproduce and explain that effect.

Sampling is vectorised rejection sampling: draw all candidates at once, look every
``(user, item)`` key up in the excluded set, and redraw only the rejected entries. The
excluded set is a sorted ``int64`` key array ``user * num_items + item`` (membership by
``searchsorted``); when ``num_users * num_items`` is small enough a dense boolean table of
the same keys is used instead, because one fancy-index lookup is ~50x faster than a binary
search. Both lookups answer the same question, so the draws do not depend on which is used.

All randomness comes from an explicit ``numpy.random.Generator``.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from fedlib.data.splits import Pairs

__all__ = ["NegativeSampler", "sample_negatives", "EXCLUDE_MODES"]

EXCLUDE_MODES = ("train", "all_rated")

# Dense lookup table up to this many (user, item) cells: 64 Mi cells = 64 MiB of bools.
_DENSE_LOOKUP_MAX_CELLS = 1 << 26

# After this many rejection passes the few entries still rejected (users with almost every
# item excluded) are drawn exactly from their complement set.
_MAX_REJECTION_PASSES = 32


class NegativeSampler:
    """Uniform negatives per user, excluding a fixed per-user item set.

    Build it once per split (it precomputes the exclusion lookup) and call
    :meth:`sample` every round with that round's generator.

    Args:
        train: the training interactions; their items are always excluded.
        num_items: size of the item id space; negatives are drawn from ``[0, num_items)``.
        exclude: ``"train"`` (default) or ``"all_rated"`` (see the module docstring: this
            reproduces a test leak of public reference code and exists for audits only).
        all_rated: with ``exclude="all_rated"``, the union of train, valid and test pairs
            (e.g. ``Pairs.from_arrays(concat users, concat items)``). Required there and
            rejected otherwise, so the leak can never be switched on by accident.

    Example:
        >>> sampler = NegativeSampler(split.train, split.num_items)
        >>> negatives = sampler.sample(split.train.users, 4, np.random.default_rng(0))  # (n, 4)
    """

    def __init__(self, train: Pairs, num_items: int, *, exclude: str = "train", all_rated: Optional[Pairs] = None):
        if exclude not in EXCLUDE_MODES:
            raise ValueError(f"exclude must be one of {EXCLUDE_MODES}, got {exclude!r}")
        if exclude == "train" and all_rated is not None:
            raise ValueError("all_rated is only used with exclude='all_rated' (an audit of a leaky sampler)")
        if exclude == "all_rated":
            if all_rated is None:
                raise ValueError("exclude='all_rated' needs all_rated=<union of train, valid and test Pairs>")
            excluded_pairs = all_rated
        else:
            excluded_pairs = train
        self.num_items = int(num_items)
        self.num_users = int(max(train.num_users, excluded_pairs.num_users))
        self.exclude = exclude
        if self.num_items <= 0:
            raise ValueError("num_items must be positive")
        if len(excluded_pairs) and (excluded_pairs.items.min() < 0 or excluded_pairs.items.max() >= self.num_items):
            raise ValueError(f"item ids must lie in [0, {self.num_items})")

        # Sorted, de-duplicated keys of the excluded (user, item) cells.
        keys = np.unique(excluded_pairs.users.astype(np.int64) * self.num_items + excluded_pairs.items)
        self._keys = keys
        users_of_keys = keys // self.num_items
        self.excluded_count = np.bincount(users_of_keys, minlength=self.num_users).astype(np.int64)
        cells = self.num_users * self.num_items
        self._dense = None
        if cells <= _DENSE_LOOKUP_MAX_CELLS:
            dense = np.zeros(cells, dtype=bool)
            dense[keys] = True
            self._dense = dense

    # ------------------------------------------------------------------------------
    def is_excluded(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Boolean array: is ``(users[j], items[j])`` in the excluded set? Same shape as inputs."""
        keys = np.asarray(users, dtype=np.int64) * self.num_items + np.asarray(items, dtype=np.int64)
        if self._dense is not None:
            return self._dense[keys]
        pos = np.searchsorted(self._keys, keys)
        pos[pos == self._keys.size] = 0  # past the end: compare with any key (it cannot match)
        return self._keys[pos] == keys if self._keys.size else np.zeros(keys.shape, dtype=bool)

    def sample(self, users: np.ndarray, num_negatives: int, rng: np.random.Generator) -> np.ndarray:
        """Draw ``num_negatives`` negatives for every entry of ``users``.

        Args:
            users: ``(n,) int64`` user of each training positive (repeats expected: one entry
                per positive).
            num_negatives: negatives per entry.
            rng: the generator to draw from (for example the round's generator).

        Returns:
            ``(n, num_negatives) int64`` item ids; row ``j`` belongs to ``users[j]``. Draws are
            independent and uniform over the user's non-excluded items (with replacement, as
            in the reference implementations: one row may repeat an item).

        Raises:
            ValueError: if some user has every item excluded (no valid negative exists).
        """
        users = np.asarray(users, dtype=np.int64)
        n = int(num_negatives)
        if users.ndim != 1:
            raise ValueError("users must be 1-d")
        if n < 0:
            raise ValueError("num_negatives must be >= 0")
        if users.size == 0 or n == 0:
            return np.zeros((users.size, n), dtype=np.int64)
        if users.min() < 0 or users.max() >= self.num_users:
            raise ValueError(f"user ids must lie in [0, {self.num_users})")
        full = self.excluded_count[users] >= self.num_items
        if full.any():
            bad = np.unique(users[full])
            raise ValueError(
                f"{bad.size} user(s) have every one of the {self.num_items} items excluded, so no "
                f"negative can be drawn for them (first ids: {bad[:10].tolist()})"
            )

        users_rep = np.repeat(users, n)  # (n_entries * n,) owner of each draw
        draws = rng.integers(0, self.num_items, size=users_rep.size, dtype=np.int64)
        rejected = np.flatnonzero(self.is_excluded(users_rep, draws))
        passes = 0
        # Redraw only the rejected entries; each pass keeps a fraction (excluded share) of them.
        while rejected.size and passes < _MAX_REJECTION_PASSES:
            redraw = rng.integers(0, self.num_items, size=rejected.size, dtype=np.int64)
            draws[rejected] = redraw
            still = self.is_excluded(users_rep[rejected], redraw)
            rejected = rejected[still]
            passes += 1
        if rejected.size:
            self._draw_exactly(users_rep, draws, rejected, rng)
        return draws.reshape(users.size, n)

    def _draw_exactly(self, users_rep: np.ndarray, draws: np.ndarray, entries: np.ndarray, rng: np.random.Generator) -> None:
        """Fill ``draws[entries]`` uniformly from each user's complement (users with tiny complements)."""
        for user in np.unique(users_rep[entries]):
            mine = entries[users_rep[entries] == user]
            lo, hi = np.searchsorted(self._keys, [user * self.num_items, (user + 1) * self.num_items])
            excluded_items = self._keys[lo:hi] - user * self.num_items
            allowed = np.setdiff1d(np.arange(self.num_items, dtype=np.int64), excluded_items, assume_unique=True)
            draws[mine] = allowed[rng.integers(0, allowed.size, size=mine.size)]


def sample_negatives(
    train: Pairs,
    num_items: int,
    num_negatives: int,
    rng: np.random.Generator,
    *,
    exclude: str = "train",
    all_rated: Optional[Pairs] = None,
) -> np.ndarray:
    """One-shot helper: ``(len(train), num_negatives)`` negatives for every training positive.

    Builds a :class:`NegativeSampler` (keep one around instead when sampling every round).
    """
    sampler = NegativeSampler(train, num_items, exclude=exclude, all_rated=all_rated)
    return sampler.sample(train.users, num_negatives, rng)
