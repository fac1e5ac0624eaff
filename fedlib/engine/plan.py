"""The round plan: every random choice of one round, drawn once, vectorised.

Both executors consume the same :class:`RoundPlan`, which is why they can be compared
number for number. A plan fixes

1. which clients take part (``clients``, sorted user ids);
2. each client's local examples: its training positives (label 1) and ``num_negatives``
   fresh negatives per positive (label 0), resampled every round as in F3CRec/FedRKG;
3. the order in which each client visits them: one shuffle per local epoch, cut into
   batches of ``batch_size`` (the last batch of an epoch may be smaller). A client whose
   examples fit in one batch is not shuffled: the order inside a batch does not change a
   mean loss;
4. a ``noise_key`` from which each client's upload and gradient noise can be derived
   (:func:`client_noise_keys`, counter-based, for every client of a round in one call), so
   every executor adds the same noise. The round loop
   derives the key from ``(seed, round_index)`` instead (:func:`round_noise_key`), which
   makes the noise of client ``u`` in round ``t`` a function of ``(seed, t, u)`` alone.

Randomness comes only from the generator passed in; :func:`round_generator` derives one
per round from ``(seed, round_index)``, so a resumed run redraws exactly the same plans.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import Pairs
from fedlib.engine.privacy import SPLITMIX_GAMMA, splitmix64

__all__ = ["RoundPlan", "round_generator", "round_noise_key", "client_noise_generator", "client_noise_keys",
           "make_round_plan",
           "select_clients", "guidance_participants"]

#: ``round_generator`` stream of the upload-noise keys (0 is the round plan).
NOISE_STREAM = 1

#: Largest ``clients × items`` for which :meth:`RoundPlan.touched_rows` dedupes with a boolean
#: ``(C, I)`` mask (linear time, 16 MB at most) instead of sorting the examples.
TOUCHED_MASK_LIMIT = 1 << 24


def round_generator(seed: int, round_index: int, stream: int = 0) -> np.random.Generator:
    """The generator of one round: a pure function of ``(seed, round_index, stream)``.

    ``stream`` separates independent uses inside a round (0 = the round plan).
    """
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), int(round_index), int(stream)])))


def round_noise_key(seed: int, round_index: int) -> int:
    """The upload-noise key of round ``round_index`` of a run seeded ``seed`` (a pure function).

    What the executors use when given ``noise_seed`` (the round loop passes its config's
    seed), instead of the key stored in the plan.
    """
    return int(round_generator(seed, round_index, NOISE_STREAM).integers(0, 2**63 - 1))


def client_noise_generator(noise_key: int, client_id: int, stream: int = 0) -> torch.Generator:
    """The CPU ``torch.Generator`` of one client's noise in one round.

    A pure function of ``(noise_key, client_id, stream)``, with ``noise_key`` the round's key:
    :func:`round_noise_key` ``(seed, round_index)``, or :attr:`RoundPlan.noise_key` when no
    seed is given. Giving each client its own stream makes its noise independent of which
    other clients take part, of the executor and of how clients are chunked.

    ``stream`` separates the uses inside one client's round. For methods that draw their own
    per-client noise with a ``torch.Generator`` (FedPerGNN, FedDAE). The engine's upload and
    gradient noise (:class:`~fedlib.engine.method.UploadNoise`,
    :class:`~fedlib.engine.method.GradientNoise`) use the counter-based
    :func:`client_noise_keys` instead, which serves all clients of a round in one call.
    """
    if int(stream) < 0:
        raise ValueError(f"stream must be >= 0, got {stream}")
    # Stream 0 keeps the two-word entropy it always had, so upload noise is unchanged.
    entropy = [int(noise_key), int(client_id)] + ([int(stream)] if int(stream) else [])
    words = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32)
    # torch seeds are 64-bit; keep the top bit clear so the value fits an int64 on every path.
    return torch.Generator().manual_seed((int(words[0]) & 0x7FFFFFFF) << 32 | int(words[1]))


def client_noise_keys(noise_key: int, client_ids, stream: int = 0, part: int = 0) -> np.ndarray:
    """``(C,) uint64`` counter-stream keys of the clients' noise in one round (vectorised).

    A pure function of ``(noise_key, client id, stream, part)``, the round key being
    :func:`round_noise_key` ``(seed, round_index)`` (or :attr:`RoundPlan.noise_key`): the
    engine's upload and gradient noise are element ``e`` of the stream with this key
    (:func:`~fedlib.engine.privacy.counter_bits`), so a client's noise does not depend on which
    other clients take part, on the executor or on how clients are chunked, and all clients'
    keys come from one call. ``stream`` separates the uses inside one client's round (``0``:
    its upload noise, ``1 + k``: the gradient noise of its local step ``k``), ``part`` the
    tensors (their index in ``model.param_kinds``).

    Each word is folded in with SplitMix64's finaliser: ``h ← mix(h + mix((word + 1)·γ))``,
    starting from ``h = mix(noise_key)``.
    """
    if int(stream) < 0 or int(part) < 0:
        raise ValueError(f"stream and part must be >= 0, got stream={stream}, part={part}")
    ids = np.asarray(client_ids, dtype=np.int64).reshape(-1)
    if ids.size and ids.min() < 0:
        raise ValueError(f"client ids must be >= 0, got {int(ids.min())}")
    with np.errstate(over="ignore"):
        key = splitmix64(np.array([int(noise_key) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
        for word in (np.uint64(stream), np.uint64(part)):
            key = splitmix64(key + splitmix64(np.array([word + np.uint64(1)], dtype=np.uint64) * SPLITMIX_GAMMA))
        words = splitmix64((ids.astype(np.uint64) + np.uint64(1)) * SPLITMIX_GAMMA)
        return splitmix64(key + words)


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
        noise_key: seed material of the clients' upload noise when the executor is given
            no ``noise_seed`` (see :func:`client_noise_keys`); drawn after every other
            field, so the other fields do not depend on it.
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
    noise_key: int = 0

    @property
    def num_clients(self) -> int:
        return int(self.clients.size)

    def example_positions(self) -> np.ndarray:
        """``(E,) int64`` position (index into :attr:`clients`) of the client owning each example."""
        return np.repeat(np.arange(self.num_clients, dtype=np.int64), np.diff(self.example_indptr))

    def touched_rows(self, num_items: int):
        """Every (client, item) pair a client trains on this round, each once.

        Returns:
            ``(positions, items)``, two ``(R,) int64`` arrays sorted by position (index into
            :attr:`clients`), then item id. ``R = Σ_c`` distinct items of client ``c``
            (positives and sampled negatives): the rows of a ``public_rows`` table that the
            client changes.
        """
        num_items = int(num_items)
        keys = self.example_positions() * num_items + self.items
        if self.num_clients * num_items <= TOUCHED_MASK_LIMIT:
            mask = np.zeros(self.num_clients * num_items, dtype=bool)
            mask[keys] = True
            keys = np.flatnonzero(mask)
        else:
            keys = np.unique(keys)
        return keys // num_items, keys % num_items

    def touched_row_counts(self, num_items: int) -> np.ndarray:
        """``(C,) int64`` number of distinct items each client trains on this round."""
        positions, _ = self.touched_rows(num_items)
        return np.bincount(positions, minlength=self.num_clients).astype(np.int64)

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
                         self.batch_size, self.local_epochs, self.noise_key)


def select_clients(candidates: np.ndarray, clients_per_round: Optional[int], rng: np.random.Generator) -> np.ndarray:
    """``clients_per_round`` users drawn without replacement from ``candidates`` (all if None), sorted."""
    candidates = np.asarray(candidates, dtype=np.int64)
    if clients_per_round is None or clients_per_round >= candidates.size:
        return np.sort(candidates)
    return np.sort(rng.choice(candidates, size=int(clients_per_round), replace=False))


def guidance_participants(train: Pairs, config, round_index: int) -> np.ndarray:
    """The clients of round ``round_index``'s plan, replayed: exactly those :func:`make_round_plan` draws.

    For a hook that acts between rounds on what the clients of an earlier round uploaded
    (FedRKG's guidance and CoFedRec's clustering read the tables of round ``t − 1``'s
    participants at the start of round ``t``) and receives neither the plan nor the data.
    ``make_round_plan`` draws its clients first from ``round_generator(seed, round)``, so
    repeating that draw reproduces them: every user with training data when
    ``config.clients_per_round`` is ``None`` (the papers' setting).

    Args:
        train: the run's training pairs.
        config: the run's :class:`~fedlib.engine.FederatedConfig` (``seed``, ``clients_per_round``).
        round_index: 0-based round whose participants are wanted.

    Returns:
        ``(S,) int64`` sorted user ids.
    """
    rng = round_generator(config.seed, int(round_index))
    return select_clients(train.active_users(), config.clients_per_round, rng)


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
    noise_key = int(rng.integers(0, 2**63 - 1))  # last draw: nothing above depends on it
    return RoundPlan(
        round_index=int(round_index), clients=clients, example_indptr=ex_start * local_epochs,
        items=out_items, labels=out_labels, steps=out_steps, num_steps=num_steps.astype(np.int64),
        num_examples=num_examples.astype(np.int64), batch_size=int(batch_size), local_epochs=int(local_epochs),
        noise_key=noise_key,
    )
