"""The round plan: every random choice of one round, drawn once, vectorised.

Both executors consume the same :class:`RoundPlan`, which is why they can be compared
number for number. A plan fixes

1. which clients take part (``clients``, sorted user ids);
2. each client's local examples: its training positives (label 1) and ``num_negatives``
   fresh negatives per positive (label 0), resampled every round as in F3CRec/FedRKG;
3. the order in which each client visits them: one shuffle per local epoch, cut into
   batches of ``batch_size`` (the last batch of an epoch may be smaller). A client whose
   examples fit in one batch is not shuffled: the order inside a batch does not change a
   mean loss.

Randomness comes only from the generator passed in; :func:`round_generator` derives one
per round from ``(seed, round_index)``, so a resumed run redraws exactly the same plans.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import Pairs

__all__ = ["RoundPlan", "round_generator", "make_round_plan", "select_clients"]


def round_generator(seed: int, round_index: int, stream: int = 0) -> np.random.Generator:
    """The generator of one round: a pure function of ``(seed, round_index, stream)``.

    ``stream`` separates independent uses inside a round (0 = the round plan).
    """
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), int(round_index), int(stream)])))


@dataclass(frozen=True)
class RoundPlan:
    """Every random choice of one round (numpy arrays on the host).

    Attributes:
        round_index: the round this plan belongs to.
        clients: ``(C,) int64`` participating user ids, sorted.
        example_indptr: ``(C + 1,) int64``; client ``c`` visits examples
            ``example_indptr[c]:example_indptr[c + 1]`` in that order.
        items: ``(E,) int64`` item id of each example.
        labels: ``(E,) float32`` 1 for a positive, 0 for a sampled negative.
        steps: ``(E,) int64`` local SGD step (0-based, epoch-major) the example belongs to.
        num_steps: ``(C,) int64`` local steps of each client.
        num_examples: ``(C,) int64`` examples per client and epoch (positives × (1 + negatives)).
        batch_size, local_epochs: as configured.
    """

    round_index: int
    clients: np.ndarray
    example_indptr: np.ndarray
    items: np.ndarray
    labels: np.ndarray
    steps: np.ndarray
    num_steps: np.ndarray
    num_examples: np.ndarray
    batch_size: int
    local_epochs: int

    @property
    def num_clients(self) -> int:
        return int(self.clients.size)

    def client_examples(self, c: int) -> slice:
        """Slice of client ``c``'s examples (``c`` = position in :attr:`clients`)."""
        return slice(int(self.example_indptr[c]), int(self.example_indptr[c + 1]))

    def subset(self, positions: np.ndarray) -> "RoundPlan":
        """The plan restricted to clients ``positions`` (indices into :attr:`clients`), in that order."""
        positions = np.asarray(positions, dtype=np.int64)
        starts, ends = self.example_indptr[positions], self.example_indptr[positions + 1]
        counts = ends - starts
        indptr = np.zeros(positions.size + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        take = np.arange(indptr[-1], dtype=np.int64) + np.repeat(starts - indptr[:-1], counts)
        return RoundPlan(self.round_index, self.clients[positions], indptr, self.items[take], self.labels[take],
                         self.steps[take], self.num_steps[positions], self.num_examples[positions],
                         self.batch_size, self.local_epochs)


def select_clients(candidates: np.ndarray, clients_per_round: Optional[int], rng: np.random.Generator) -> np.ndarray:
    """``clients_per_round`` users drawn without replacement from ``candidates`` (all if None), sorted."""
    candidates = np.asarray(candidates, dtype=np.int64)
    if clients_per_round is None or clients_per_round >= candidates.size:
        return np.sort(candidates)
    return np.sort(rng.choice(candidates, size=int(clients_per_round), replace=False))


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(starts[j], starts[j] + counts[j])`` without a Python loop."""
    total = int(counts.sum())
    offsets = np.zeros(counts.size, dtype=np.int64)
    np.cumsum(counts[:-1], out=offsets[1:])
    return np.arange(total, dtype=np.int64) + np.repeat(starts - offsets, counts)


def make_round_plan(
    train: Pairs,
    sampler: NegativeSampler,
    rng: np.random.Generator,
    *,
    round_index: int = 0,
    num_negatives: int = 4,
    batch_size: int = 512,
    local_epochs: int = 1,
    clients_per_round: Optional[int] = None,
    clients: Optional[np.ndarray] = None,
) -> RoundPlan:
    """Draw the plan of one round (see the module docstring).

    Args:
        train: training interactions (CSR by user).
        sampler: the negative sampler (built once on ``train``).
        rng: this round's generator, e.g. ``round_generator(seed, round_index)``.
        clients_per_round: sample that many users with training data (None = all of them).
        clients: use exactly these users instead of sampling.
    """
    indptr = train.indptr
    if clients is None:
        clients = select_clients(train.active_users(), clients_per_round, rng)
    clients = np.asarray(clients, dtype=np.int64)
    num_pos = indptr[clients + 1] - indptr[clients]  # (C,)
    pos_index = _ranges(indptr[clients], num_pos)  # (P,) positions in train
    pos_items = train.items[pos_index]
    negatives = sampler.sample(train.users[pos_index], num_negatives, rng)  # (P, k)

    # Each positive followed by its negatives: train is sorted by user, so every client's
    # examples are contiguous without any scatter.
    per_pos = 1 + num_negatives
    items = np.concatenate([pos_items[:, None], negatives], axis=1).ravel()  # (E,)
    labels = np.tile(np.concatenate([[1.0], np.zeros(num_negatives)]).astype(np.float32), pos_index.size)
    num_examples = num_pos * per_pos  # (C,)
    ex_start = np.zeros(clients.size + 1, dtype=np.int64)
    np.cumsum(num_examples, out=ex_start[1:])
    total = int(ex_start[-1])

    batches_per_epoch = -(-num_examples // batch_size)  # (C,) ceil
    num_steps = batches_per_epoch * local_epochs
    position = np.arange(total, dtype=np.int64) - np.repeat(ex_start[:-1], num_examples)  # position within the client
    multi_clients = np.flatnonzero(batches_per_epoch > 1)
    multi = _ranges(ex_start[multi_clients], num_examples[multi_clients])  # examples needing a shuffle
    multi_owner = np.repeat(np.arange(multi_clients.size, dtype=np.float64), num_examples[multi_clients])

    def shuffled_order():
        """Example order of one epoch: each multi-batch client's block permuted uniformly."""
        order = np.arange(total, dtype=np.int64)
        if multi.size:
            keys = multi_owner + rng.random(multi.size)  # sort by client, then by a U[0, 1) key
            order[multi] = multi[np.argsort(keys)]
        return order

    if local_epochs == 1:
        order = shuffled_order()
        out_items, out_labels = items[order], labels[order]
        out_steps = position // batch_size
    else:
        out_items = np.empty(total * local_epochs, dtype=np.int64)
        out_labels = np.empty(total * local_epochs, dtype=np.float32)
        out_steps = np.empty(total * local_epochs, dtype=np.int64)
        client_of_example = np.repeat(np.arange(clients.size), num_examples)
        for epoch in range(local_epochs):
            order = shuffled_order()
            # Output slot of position j of client c in this epoch: client-major, then epoch, then j.
            slot = ex_start[client_of_example] * local_epochs + epoch * num_examples[client_of_example] + position
            out_items[slot] = items[order]
            out_labels[slot] = labels[order]
            out_steps[slot] = epoch * batches_per_epoch[client_of_example] + position // batch_size
    return RoundPlan(
        round_index=int(round_index), clients=clients, example_indptr=ex_start * local_epochs,
        items=out_items, labels=out_labels, steps=out_steps, num_steps=num_steps.astype(np.int64),
        num_examples=num_examples.astype(np.int64), batch_size=int(batch_size), local_epochs=int(local_epochs),
    )
