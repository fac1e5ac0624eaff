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


#: Fewest bits of each key's fraction :func:`_argsort_within_blocks` packs; with fewer (very many
#: or very large blocks) it sorts the float keys as the reference does.
_MIN_FRACTION_BITS = 36


def _argsort_within_blocks(block_sizes: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """``np.argsort(owner + uniforms)`` with ``owner = repeat(arange(K), block_sizes)``, i.e. every
    block of consecutive entries ordered by its uniform keys: the shuffle of :func:`make_round_plan`.

    The keys are the reference's float64 ``owner + u`` (the same rounding), but they are sorted
    by value rather than by index: each entry becomes one ``uint64`` ``owner | fraction | local
    index`` (the fraction ``key − owner``, exact, truncated to the bits left over) and
    ``np.sort`` of those is about twice as fast as ``np.argsort`` of the floats. Truncating is
    monotone, so wherever the packed fractions differ the order is the reference's; where two
    entries of a block share a packed fraction (or a key rounds up to ``owner + 1``) the
    function falls back to the reference argsort, whose order there it cannot know. With 43
    fraction bits (ML-100K) that happens about once in 10^5 rounds.

    Args:
        block_sizes: ``(K,) int64`` entries per block (``Σ = M``), each ≥ 1.
        uniforms: ``(M,) float64`` keys in ``[0, 1)`` (``rng.random(M)``).

    Returns:
        ``(M,) int64`` the reference's ``argsort`` (indices into the ``M`` entries).
    """
    num_blocks = int(block_sizes.size)
    block_starts = np.zeros(num_blocks, dtype=np.int64)
    np.cumsum(block_sizes[:-1], out=block_starts[1:])
    owner = np.repeat(np.arange(num_blocks, dtype=np.float64), block_sizes)
    keys = owner + uniforms  # the reference's keys, rounded as it rounds them
    owner_bits = max(1, (num_blocks - 1).bit_length())
    index_bits = max(1, int(block_sizes.max() - 1).bit_length()) if num_blocks else 1
    fraction_bits = 64 - owner_bits - index_bits
    if num_blocks == 0 or fraction_bits < _MIN_FRACTION_BITS:
        return np.argsort(keys)
    fraction = np.subtract(keys, owner, out=owner)  # exact: key and owner share the exponent's grid
    fraction *= float(2 ** fraction_bits)  # exact (a power of two)
    packed = fraction.astype(np.uint64)  # floor: the top fraction_bits of the fraction
    if int(packed.max()) >> fraction_bits:  # some key rounded up to owner + 1
        return np.argsort(keys)
    packed <<= np.uint64(index_bits)
    # (owner << shift) − start, wrapping in uint64, plus the global position = owner | local index.
    shift = np.uint64(fraction_bits + index_bits)
    base = (np.arange(num_blocks, dtype=np.uint64) << shift) - block_starts.astype(np.uint64)
    packed += np.repeat(base, block_sizes)
    packed += np.arange(packed.size, dtype=np.uint64)
    packed.sort()
    local = packed & np.uint64((1 << index_bits) - 1)
    packed >>= np.uint64(index_bits)
    if (packed[1:] == packed[:-1]).any():  # equal packed fractions in one block: order unknown here
        return np.argsort(keys)
    # Sorting keeps every block in place (owner is the top field), so position p's block start is p's.
    local = local.view(np.int64)
    local += np.repeat(block_starts, block_sizes)
    return local


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
    items = np.empty((pos_index.size, per_pos), dtype=np.int64)
    items[:, 0], items[:, 1:] = pos_items, negatives
    items = items.ravel()  # (E,)
    labels = np.tile(np.concatenate([[1.0], np.zeros(num_negatives)]).astype(np.float32), pos_index.size)
    num_examples = num_pos * per_pos  # (C,)
    ex_start = np.zeros(clients.size + 1, dtype=np.int64)
    np.cumsum(num_examples, out=ex_start[1:])
    total = int(ex_start[-1])

    batches_per_epoch = -(-num_examples // batch_size)  # (C,) ceil
    num_steps = batches_per_epoch * local_epochs
    multi_clients = np.flatnonzero(batches_per_epoch > 1)  # the clients whose examples are shuffled
    multi_sizes = num_examples[multi_clients]
    multi = _ranges(ex_start[multi_clients], multi_sizes)  # (M,) their examples, in place
    # Local step of each example of an unshuffled epoch: batch b of client c holds
    # min(batch_size, n_c − b·batch_size) examples.
    step_of_batch = _ranges(np.zeros_like(batches_per_epoch), batches_per_epoch)  # (Σ batches,)
    batch_lengths = np.minimum(batch_size, np.repeat(num_examples, batches_per_epoch) - step_of_batch * batch_size)
    epoch_steps = np.repeat(step_of_batch, batch_lengths)  # (E,)

    def shuffled_epoch():
        """``(items, labels)`` of one epoch: each multi-batch client's block permuted uniformly
        (one ``U[0, 1)`` key per example, drawn here: the only draw of an epoch)."""
        if not multi.size:
            return items, labels
        sources = multi[_argsort_within_blocks(multi_sizes, rng.random(multi.size))]
        epoch_items, epoch_labels = items.copy(), labels.copy()
        epoch_items[multi], epoch_labels[multi] = items[sources], labels[sources]
        return epoch_items, epoch_labels

    if local_epochs == 1:
        out_items, out_labels = shuffled_epoch()
        out_steps = epoch_steps
    else:
        out_items = np.empty(total * local_epochs, dtype=np.int64)
        out_labels = np.empty(total * local_epochs, dtype=np.float32)
        out_steps = np.empty(total * local_epochs, dtype=np.int64)
        client_of_example = np.repeat(np.arange(clients.size), num_examples)
        position = np.arange(total, dtype=np.int64) - np.repeat(ex_start[:-1], num_examples)  # within the client
        for epoch in range(local_epochs):
            epoch_items, epoch_labels = shuffled_epoch()
            # Output slot of position j of client c in this epoch: client-major, then epoch, then j.
            slot = ex_start[client_of_example] * local_epochs + epoch * num_examples[client_of_example] + position
            out_items[slot] = epoch_items
            out_labels[slot] = epoch_labels
            out_steps[slot] = epoch * batches_per_epoch[client_of_example] + epoch_steps
    noise_key = int(rng.integers(0, 2**63 - 1))  # last draw: nothing above depends on it
    return RoundPlan(
        round_index=int(round_index), clients=clients, example_indptr=ex_start * local_epochs,
        items=out_items, labels=out_labels, steps=out_steps, num_steps=num_steps.astype(np.int64),
        num_examples=num_examples.astype(np.int64), batch_size=int(batch_size), local_epochs=int(local_epochs),
        noise_key=noise_key,
    )
