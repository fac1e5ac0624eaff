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


@dataclass(frozen=True)
class BlockStream:
    """Chronological data blocks ``D0 .. DT`` for continual recommendation (F3CRec).

    Block ``t`` is an :class:`InteractionSplit` whose ``num_users`` / ``num_items`` are the
    sizes of the id spaces *accumulated* over blocks ``0..t`` (every id that occurs anywhere
    in those blocks, including items seen only in block ``t``'s valid/test sets). Ids are
    assigned in order of first appearance in time, so the ids of blocks ``0..t-1`` are
    exactly ``range(blocks[t-1].num_users)`` / ``range(blocks[t-1].num_items)``: embedding
    tables grow by appending rows.

    Attributes:
        blocks: one split per block, oldest first.
        active_users: per block, sorted ``int64`` ids of users with at least one
            interaction (train, valid or test) in that block.
        name, notes, extra: as in :class:`InteractionSplit`.

    Each block's ``extra`` holds ``{"train","valid","test"}_timestamps`` (``int64`` unix
    seconds, aligned with the corresponding :class:`Pairs`) and ``{...}_positions``
    (``int64`` position of the interaction in the global chronological order).
    """

    blocks: tuple
    active_users: tuple
    name: str = ""
    notes: tuple = ()
    extra: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, t: int) -> InteractionSplit:
        return self.blocks[t]

    def __iter__(self):
        return iter(self.blocks)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_users(self) -> int:
        """Users accumulated over the whole stream."""
        return self.blocks[-1].num_users if self.blocks else 0

    @property
    def num_items(self) -> int:
        """Items accumulated over the whole stream."""
        return self.blocks[-1].num_items if self.blocks else 0

    def block_sizes(self) -> np.ndarray:
        """``(num_blocks,) int64`` interactions per block (train + valid + test)."""
        return np.array([len(b.train) + len(b.valid) + len(b.test) for b in self.blocks], dtype=np.int64)


@dataclass(frozen=True)
class DomainSplit:
    """Several domains (clients of a cross-domain task) with partly shared users (FedPCL-CDR).

    Every domain has its own :class:`InteractionSplit` with its own item id space. User ids
    ``0 .. num_overlap_users - 1`` denote the *same* people in every domain; ids from
    ``num_overlap_users`` on are domain-local (user ``num_overlap_users`` of domain A and of
    domain B are different people).

    Attributes:
        domains: domain names, in task order.
        splits: domain name -> split. ``extra["valid_candidates"]`` /
            ``extra["test_candidates"]`` are ``(n, 1 + num_negatives) int64`` arrays whose
            row ``r`` belongs to ``valid.users[r]`` / ``test.users[r]`` (positive in column 0);
            ``extra["raw_users"]`` / ``extra["raw_items"]`` map dense ids back to file ids.
        num_overlap_users: size of the shared user-id range.
        name, notes, extra: as in :class:`InteractionSplit`.
    """

    domains: tuple
    splits: dict
    num_overlap_users: int
    name: str = ""
    notes: tuple = ()
    extra: dict = field(default_factory=dict)

    def __getitem__(self, domain: str) -> InteractionSplit:
        return self.splits[domain]

    def __iter__(self):
        return iter(self.domains)

    def __len__(self) -> int:
        return len(self.domains)

    def overlap_users(self) -> np.ndarray:
        """``(num_overlap_users,) int64`` ids shared by every domain."""
        return np.arange(self.num_overlap_users, dtype=np.int64)


@dataclass(frozen=True)
class Sequences:
    """Variable-length, time-sorted item sequences in CSR layout (one row per sequence).

    Attributes:
        users: ``(n,) int64`` owner of each sequence (dense user id).
        indptr: ``(n + 1,) int64``; sequence ``r`` is ``items[indptr[r]:indptr[r+1]]``.
        items: ``(total,) int64`` item ids, oldest first within a sequence.
        timestamps: ``(total,) int64`` unix seconds aligned with ``items``.
    """

    users: np.ndarray
    indptr: np.ndarray
    items: np.ndarray
    timestamps: np.ndarray

    @staticmethod
    def from_lists(users, item_lists, timestamp_lists=None) -> "Sequences":
        """Build from per-sequence lists (already time-sorted)."""
        users = np.asarray(users, dtype=np.int64)
        lengths = np.fromiter((len(s) for s in item_lists), dtype=np.int64, count=len(item_lists))
        indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        items = np.fromiter((i for s in item_lists for i in s), dtype=np.int64, count=int(indptr[-1]))
        if timestamp_lists is None:
            stamps = np.full(items.shape, -1, dtype=np.int64)
        else:
            stamps = np.fromiter((t for s in timestamp_lists for t in s), dtype=np.int64, count=int(indptr[-1]))
        if users.shape != lengths.shape:
            raise ValueError(f"{users.size} users for {lengths.size} sequences")
        return Sequences(users=users, indptr=indptr, items=items, timestamps=stamps)

    def __len__(self) -> int:
        return int(self.users.size)

    def lengths(self) -> np.ndarray:
        """``(n,) int64`` length of every sequence."""
        return np.diff(self.indptr)

    def sequence(self, r: int) -> np.ndarray:
        """Items of sequence ``r`` (a view), oldest first."""
        return self.items[self.indptr[r] : self.indptr[r + 1]]

    def last_items(self) -> np.ndarray:
        """``(n,) int64`` most recent item of every sequence (the target of valid/test rows)."""
        return self.items[self.indptr[1:] - 1]

    def subset(self, rows) -> "Sequences":
        """The sequences at positions ``rows`` (in that order)."""
        rows = np.asarray(rows, dtype=np.int64)
        starts, ends = self.indptr[rows], self.indptr[rows + 1]
        lengths = ends - starts
        indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        # Flat gather index: for each chosen row, its [start, end) range.
        offsets = np.arange(int(indptr[-1]), dtype=np.int64) - np.repeat(indptr[:-1], lengths)
        flat = np.repeat(starts, lengths) + offsets
        return Sequences(users=self.users[rows], indptr=indptr, items=self.items[flat], timestamps=self.timestamps[flat])

    def padded(self, maxlen: int, pad_id: int) -> np.ndarray:
        """``(n, maxlen) int64`` left-padded matrix holding the *last* ``maxlen`` items of each row."""
        lengths = self.lengths()
        out = np.full((len(self), maxlen), pad_id, dtype=np.int64)
        keep = np.minimum(lengths, maxlen)
        rows = np.repeat(np.arange(len(self)), keep)
        # Position within the kept tail (0 = oldest kept item), right-aligned in the row.
        within = np.arange(int(keep.sum())) - np.repeat(np.cumsum(keep) - keep, keep)
        cols = maxlen - np.repeat(keep, keep) + within
        src = np.repeat(self.indptr[1:] - keep, keep) + within
        out[rows, cols] = self.items[src]
        return out


@dataclass(frozen=True)
class SequenceSplit:
    """Cross-domain sequences split over platforms (FedCSR, C2DSR format).

    Item ids ``< num_items_a`` belong to domain A, ids in ``[num_items_a, num_items)`` to
    domain B; ``pad_id == num_items``. Valid/test rows are whole sequences whose last item
    is the ground truth; its domain decides which domain's metrics the row counts for.

    Attributes:
        num_items_a, num_items_b: items per domain.
        num_users: size of the user id space.
        train, valid, test: the sequences.
        platforms: per platform, ``int64`` row indices into ``train``; rows of different
            platforms belong to disjoint users.
        valid_candidates, test_candidates: ``(n, 1 + num_negatives) int64``; column 0 is the
            ground truth, the rest are negatives from the ground truth's domain.
        name, notes, extra: as in :class:`InteractionSplit`.
    """

    num_items_a: int
    num_items_b: int
    num_users: int
    train: Sequences
    valid: Sequences
    test: Sequences
    platforms: tuple
    valid_candidates: np.ndarray
    test_candidates: np.ndarray
    name: str = ""
    notes: tuple = ()
    extra: dict = field(default_factory=dict)

    @property
    def num_items(self) -> int:
        return self.num_items_a + self.num_items_b

    @property
    def pad_id(self) -> int:
        return self.num_items_a + self.num_items_b

    @property
    def num_platforms(self) -> int:
        return len(self.platforms)

    def domain_of(self, items) -> np.ndarray:
        """``0`` for domain-A items, ``1`` for domain-B items (same shape as ``items``)."""
        return (np.asarray(items) >= self.num_items_a).astype(np.int64)
