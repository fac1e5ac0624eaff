"""Split objects: the contract between the data layer and the federated engine.

A protocol (``fedlib.data.protocols``) turns raw interactions into one of these; the
engine, metrics and notebooks only ever read these objects, never raw files.

Ids are dense, 0-based ``int64``. ``user`` ids index clients (one client per user in
the single-domain papers); ``item`` ids index rows of the item table.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np


@dataclass(frozen=True)
class Pairs:
    """A set of (user, item) interactions, stored sorted by user (then by input order).

    Attributes:
        users: ``(n,) int64`` user id of each interaction.
        items: ``(n,) int64`` item id of each interaction.
        num_users: size of the user id space (``indptr`` has ``num_users + 1`` entries).
    """

    users: np.ndarray
    items: np.ndarray
    num_users: int

    @staticmethod
    def from_arrays(users, items, num_users: Optional[int] = None) -> "Pairs":
        """Build from unsorted arrays; a stable sort by user keeps each user's input order."""
        users = np.asarray(users, dtype=np.int64)
        items = np.asarray(items, dtype=np.int64)
        if users.shape != items.shape or users.ndim != 1:
            raise ValueError(f"users and items must be 1-d of equal length, got {users.shape} and {items.shape}")
        if users.size and users.min() < 0:
            raise ValueError("user ids must be non-negative")
        n_users = int(num_users if num_users is not None else (users.max() + 1 if users.size else 0))
        if users.size and users.max() >= n_users:
            raise ValueError(f"user id {int(users.max())} out of range for num_users={n_users}")
        order = np.argsort(users, kind="stable")
        return Pairs(users=users[order], items=items[order], num_users=n_users)

    def __len__(self) -> int:
        return int(self.users.size)

    @property
    def indptr(self) -> np.ndarray:
        """``(num_users + 1,) int64`` CSR row pointer: user ``u`` owns ``items[indptr[u]:indptr[u+1]]``."""
        counts = np.bincount(self.users, minlength=self.num_users)
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def items_of(self, user: int) -> np.ndarray:
        """Items of one user (a view, in input order)."""
        ptr = self.indptr
        return self.items[ptr[user] : ptr[user + 1]]

    def counts(self) -> np.ndarray:
        """``(num_users,) int64`` interactions per user."""
        return np.bincount(self.users, minlength=self.num_users).astype(np.int64)

    def active_users(self) -> np.ndarray:
        """Sorted ids of users with at least one interaction."""
        return np.flatnonzero(self.counts() > 0)


@dataclass(frozen=True)
class InteractionSplit:
    """Train/valid/test interactions of one dataset (or one block, one domain).

    Attributes:
        num_users, num_items: id-space sizes (embedding-table rows).
        train, valid, test: the three disjoint interaction sets.
        name: e.g. ``"ml-100k/f3crec/D1"``.
        notes: human-readable provenance (substitute data, derived timestamps, ...).
        extra: protocol-specific arrays (candidate sets, block ids, domain ids, ...).
    """

    num_users: int
    num_items: int
    train: Pairs
    valid: Pairs
    test: Pairs
    name: str = ""
    notes: tuple = ()
    extra: dict = field(default_factory=dict)
