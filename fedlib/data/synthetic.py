"""Small, seeded synthetic datasets with learnable structure, shaped like the paper protocols.

Three generators, each returning exactly the split object of one protocol (they build an
interaction frame and pass it through that protocol's ``*_from_frame(s)`` function, so the
shapes, id conventions and candidate sets are the real ones):

* :func:`drifting_stream` -> :class:`BlockStream` (F3CRec): users' tastes drift between
  blocks, new users and items appear over time;
* :func:`overlapping_domains` -> :class:`DomainSplit` (FedPCL-CDR): several domains whose
  items are driven by one shared user taste, with partial user overlap;
* :func:`cross_domain_sequences` -> :class:`SequenceSplit` (FedCSR): sequences that walk
  along topic "chains" of items alternating between two domains;
* :func:`clustered_interactions` -> :class:`InteractionSplit` (FedKDRec): one domain,
  leave-one-out by time with 1 + 99 candidates.

The data follow a latent-factor (or chain) model plus an item-popularity bias, so a
personalised method (item co-occurrence, matrix factorisation, a Markov chain) beats the
popularity ranking on them, while popularity is still a meaningful baseline. Everything
is seeded: the same arguments give identical arrays. Sizes default to a few hundred users
and items so that a whole federated run takes seconds on a CPU.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from fedlib.data.protocols import f3crec as _f3crec
from fedlib.data.protocols import fedcsr as _fedcsr
from fedlib.data.protocols import fedkdrec as _fedkdrec
from fedlib.data.protocols import fedpcl_cdr as _fedpcl
from fedlib.data.splits import BlockStream, DomainSplit, InteractionSplit, SequenceSplit

SECONDS_PER_BLOCK = 1_000_000


def _clustered_factors(rng, n: int, dim: int, clusters: int, spread: float = 0.35):
    """``(n, dim)`` unit vectors around ``clusters`` random centres, and each row's cluster."""
    centres = rng.normal(size=(clusters, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    assign = rng.integers(0, clusters, size=n)
    vectors = centres[assign] + spread * rng.normal(size=(n, dim)) / np.sqrt(dim)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True), centres, assign


def _sample_without_replacement(rng, logits: np.ndarray, counts: np.ndarray) -> tuple:
    """Per row, ``counts[r]`` distinct columns drawn from ``softmax(logits[r])``.

    Gumbel-top-k: adding Gumbel noise and keeping the k largest is exact sampling without
    replacement. Columns with ``-inf`` logits are never drawn.

    Returns:
        (rows, cols) int64 arrays of the drawn pairs, rows ascending, in draw order.
    """
    gumbel = -np.log(-np.log(rng.random(logits.shape)))
    noisy = logits + gumbel
    order = np.argsort(-noisy, axis=1)
    available = np.isfinite(logits).sum(axis=1)
    counts = np.minimum(counts, available)
    take = np.arange(logits.shape[1])[None, :] < counts[:, None]
    rows = np.repeat(np.arange(logits.shape[0]), take.sum(axis=1))
    cols = order[take]
    return rows.astype(np.int64), cols.astype(np.int64)


def drifting_stream(
    *,
    num_users: int = 200,
    num_items: int = 300,
    interactions_per_user: int = 40,
    dim: int = 8,
    clusters: int = 8,
    drift: float = 0.6,
    late_user_share: float = 0.3,
    late_item_share: float = 0.15,
    sharpness: float = 10.0,
    popularity_scale: float = 0.7,
    split: str = "random",
    seed: int = 0,
) -> BlockStream:
    """A 4-block stream (like F3CRec's) in which user preferences drift between blocks.

    Generation: item vectors come from ``clusters`` taste clusters; each user's taste at
    block ``t`` is ``normalise((1 - drift) * taste_{t-1} + drift * fresh)`` with a fresh random
    direction per block, so preferences move noticeably from block to block. A user picks
    distinct, not yet consumed items with probability ``∝ exp(sharpness * taste·item +
    popularity_bias)``. ``late_user_share`` of the users join in block 1-3 and
    ``late_item_share`` of the items are released in block 1-3 (so the id spaces grow).
    Block volumes follow the protocol's 60 / 13.3 / 13.3 / 13.3 % cut, and the frame is
    passed through :func:`fedlib.data.protocols.f3crec.stream_from_frame` (no k-core).

    Returns:
        :class:`BlockStream`; ``extra["synthetic"]`` holds the generating factors
        (``item_vectors``, ``tastes`` of shape ``(4, num_users, dim)``, ``item_bias``).
    """
    rng = np.random.default_rng([seed, 7001])
    items, _, _ = _clustered_factors(rng, num_items, dim, clusters)
    item_bias = popularity_scale * rng.normal(size=num_items)
    tastes = np.empty((4, num_users, dim))
    taste = rng.normal(size=(num_users, dim))
    taste /= np.linalg.norm(taste, axis=1, keepdims=True)
    for t in range(4):
        if t:
            fresh = rng.normal(size=(num_users, dim))
            fresh /= np.linalg.norm(fresh, axis=1, keepdims=True)
            taste = (1 - drift) * taste + drift * fresh
            taste /= np.linalg.norm(taste, axis=1, keepdims=True)
        tastes[t] = taste
    user_start = np.where(rng.random(num_users) < late_user_share, rng.integers(1, 4, num_users), 0)
    item_release = np.where(rng.random(num_items) < late_item_share, rng.integers(1, 4, num_items), 0)

    # Block volumes computed with the protocol's own cut, so that its blocks coincide exactly
    # with the generation phases (the taste of block t generated block t's interactions).
    total = num_users * interactions_per_user
    base = total * _f3crec.BASE_FRACTION[0] // _f3crec.BASE_FRACTION[1]
    per_block = (total - base) // 3
    volume = [base, per_block, per_block, total - base - 2 * per_block]
    consumed = np.zeros((num_users, num_items), dtype=bool)
    frames = []
    for t in range(4):
        active = np.flatnonzero(user_start <= t)
        if volume[t] < 3 * active.size:
            raise ValueError(
                f"block {t}: {volume[t]} interactions cannot give each of {active.size} active users 3; "
                "raise interactions_per_user"
            )
        # Spread the block's volume over its active users, at least 3 each (all can be evaluated).
        share = rng.dirichlet(np.full(active.size, 4.0))
        counts = 3 + rng.multinomial(volume[t] - 3 * active.size, share)
        logits = sharpness * tastes[t, active] @ items.T + item_bias
        logits[:, item_release > t] = -np.inf
        logits[consumed[active]] = -np.inf
        rows, cols = _sample_without_replacement(rng, logits, counts)
        users = active[rows]
        consumed[users, cols] = True
        stamps = t * SECONDS_PER_BLOCK + rng.integers(0, SECONDS_PER_BLOCK, size=users.size)
        frames.append(pd.DataFrame({"user": users, "item": cols, "rating": 1.0, "timestamp": stamps}))
    frame = pd.concat(frames, ignore_index=True)
    stream = _f3crec.stream_from_frame(
        frame, k_core=1, split=split, seed=seed, name="synthetic/drifting_stream",
        notes=(f"synthetic: {num_users} users, {num_items} items, drift={drift}, seed={seed}",),
    )
    stream.extra["synthetic"] = {"item_vectors": items, "tastes": tastes, "item_bias": item_bias,
                                 "user_start": user_start, "item_release": item_release}
    return stream


def overlapping_domains(
    *,
    domains: Sequence[str] = ("A", "B"),
    num_users: int = 300,
    items_per_domain: int = 200,
    overlap: float = 0.5,
    interactions_per_user: int = 20,
    dim: int = 8,
    clusters: int = 6,
    sharpness: float = 6.0,
    popularity_scale: float = 0.7,
    num_negatives: int = 99,
    seed: int = 0,
) -> DomainSplit:
    """Several domains driven by one user taste, with partial user overlap (like FedPCL-CDR).

    Each user has one taste vector; each domain has its own item vectors drawn around the
    **same** cluster centres, so what a user likes in one domain predicts what they like in
    another (cross-domain transfer has something to learn). ``overlap`` of the users are
    present in every domain; each other user belongs to one domain (uniformly). Every
    (user, domain) picks ``interactions_per_user`` distinct items (±50 %, at least 4).
    The frames go through :func:`fedlib.data.protocols.fedpcl_cdr.split_from_frames`.

    Returns:
        :class:`DomainSplit`; overlapping users have ids ``0 .. num_overlap_users - 1`` in
        every domain.
    """
    rng = np.random.default_rng([seed, 7002])
    tastes, centres, _ = _clustered_factors(rng, num_users, dim, clusters, spread=0.5)
    shared = rng.random(num_users) < overlap
    home = rng.integers(0, len(domains), size=num_users)
    frames = {}
    for index, name in enumerate(domains):
        assign = rng.integers(0, clusters, size=items_per_domain)
        vectors = centres[assign] + 0.35 * rng.normal(size=(items_per_domain, dim)) / np.sqrt(dim)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        bias = popularity_scale * rng.normal(size=items_per_domain)
        members = np.flatnonzero(shared | (home == index))
        counts = np.maximum(4, np.round(interactions_per_user * rng.uniform(0.5, 1.5, members.size))).astype(np.int64)
        logits = sharpness * tastes[members] @ vectors.T + bias
        rows, cols = _sample_without_replacement(rng, logits, counts)
        frames[name] = pd.DataFrame({"user": members[rows], "item": cols, "rating": 1.0})
    split = _fedpcl.split_from_frames(
        frames, num_negatives=num_negatives, seed=seed, name="synthetic/overlapping_domains",
        notes=(f"synthetic: {num_users} users, {len(domains)} domains x {items_per_domain} items, "
               f"overlap={overlap}, seed={seed}",),
    )
    split.extra["synthetic"] = {"tastes": tastes, "shared": shared}
    return split


def clustered_interactions(
    *,
    num_users: int = 200,
    num_items: int = 300,
    interactions_per_user: int = 25,
    dim: int = 8,
    clusters: int = 5,
    sharpness: float = 6.0,
    popularity_scale: float = 0.7,
    num_negatives: int = 99,
    seed: int = 0,
) -> InteractionSplit:
    """Users and items around shared taste clusters (like ML-100K, but planted and tiny).

    Each user picks ``interactions_per_user`` distinct items (±50 %, at least 5) from
    ``softmax(sharpness · taste·item + popularity bias)`` at random times; the frame goes
    through :func:`fedlib.data.protocols.fedkdrec.split_from_frame` (leave-one-out by time,
    1 + ``num_negatives`` candidates).
    """
    rng = np.random.default_rng([seed, 7003])
    tastes, centres, _ = _clustered_factors(rng, num_users, dim, clusters)
    assign = rng.integers(0, clusters, size=num_items)
    vectors = centres[assign] + 0.35 * rng.normal(size=(num_items, dim)) / np.sqrt(dim)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    counts = np.maximum(5, np.round(interactions_per_user * rng.uniform(0.5, 1.5, num_users))).astype(np.int64)
    logits = sharpness * tastes @ vectors.T + popularity_scale * rng.normal(size=num_items)
    rows, cols = _sample_without_replacement(rng, logits, counts)
    frame = pd.DataFrame({"user": rows, "item": cols, "rating": 1.0,
                          "timestamp": rng.permutation(rows.size).astype(np.int64)})
    room = num_items - int(counts.max()) - 1  # candidates exclude every item of the user
    if room < 1:
        raise ValueError(f"num_items={num_items} is too small for users with up to {int(counts.max())} items; "
                         "raise num_items or lower interactions_per_user")
    split = _fedkdrec.split_from_frame(
        frame, num_negatives=min(num_negatives, room), seed=seed,
        name="synthetic/clustered_interactions",
        notes=(f"synthetic: {num_users} users x {num_items} items, {clusters} taste clusters, seed={seed}",),
    )
    split.extra["synthetic"] = {"tastes": tastes, "item_vectors": vectors}
    return split


def cross_domain_sequences(
    *,
    num_users: int = 400,
    items_a: int = 150,
    items_b: int = 150,
    topics: int = 10,
    min_len: int = 6,
    max_len: int = 15,
    follow_chain: float = 0.7,
    num_negatives: int = 99,
    num_platforms: int = 10,
    seed: int = 0,
) -> SequenceSplit:
    """Cross-domain sequences (C2DSR layout, like FedCSR) with a learnable next-item structure.

    Every topic owns a "chain": a fixed random order of its items, which mixes domain-A and
    domain-B items. A user has one topic; their sequence starts at a random chain position
    and, at each step, moves to the next chain item with probability ``follow_chain`` and
    otherwise jumps to a random item of the topic. So the next item is predictable from the
    previous one (a Markov model or a sequential encoder beats popularity), and sequences
    switch domains. Users are split 80 / 10 / 10 % into train / valid / test users (valid
    and test rows end in their target) and train users into ``num_platforms`` platforms with
    the protocol's length-sorted, unequal cut (the reference fractions for 10 platforms).

    Returns:
        :class:`SequenceSplit` built by :func:`fedlib.data.protocols.fedcsr.split_from_frames`.
    """
    rng = np.random.default_rng([seed, 7003])
    num_items = items_a + items_b
    topic_of_item = rng.integers(0, topics, size=num_items)
    chains = [rng.permutation(np.flatnonzero(topic_of_item == k)) for k in range(topics)]
    user_topic = rng.integers(0, topics, size=num_users)
    lengths = rng.integers(min_len, max_len + 1, size=num_users)
    item_lists, stamp_lists = [], []
    for user in range(num_users):  # generation only (a few hundred short rows), not a hot path
        chain = chains[user_topic[user]]
        pos = int(rng.integers(0, chain.size))
        seq = [int(chain[pos])]
        for _ in range(lengths[user] - 1):
            pos = (pos + 1) % chain.size if rng.random() < follow_chain else int(rng.integers(0, chain.size))
            seq.append(int(chain[pos]))
        item_lists.append(seq)
        stamp_lists.append(list(np.cumsum(rng.integers(1, 86_400, size=len(seq))) + 1_500_000_000))
    frame = pd.DataFrame({"user": np.arange(num_users), "items": item_lists, "timestamps": stamp_lists})
    perm = rng.permutation(num_users)
    n_train, n_valid = int(0.8 * num_users), int(0.1 * num_users)
    parts = [frame.iloc[np.sort(p)].reset_index(drop=True)
             for p in (perm[:n_train], perm[n_train:n_train + n_valid], perm[n_train + n_valid:])]
    fractions = _fedcsr.PLATFORM_FRACTIONS if num_platforms == 10 else tuple(np.full(num_platforms, 1.0 / num_platforms))
    split = _fedcsr.split_from_frames(
        parts[0], parts[1], parts[2], num_items_a=items_a, num_items_b=items_b,
        num_negatives=num_negatives, seed=seed, platform_fractions=fractions,
        name="synthetic/cross_domain_sequences",
        notes=(f"synthetic: {num_users} users, {items_a}+{items_b} items, {topics} topic chains, "
               f"follow_chain={follow_chain}, seed={seed}",),
    )
    split.extra["synthetic"] = {"topic_of_item": topic_of_item, "user_topic": user_topic}
    return split


__all__ = ["drifting_stream", "overlapping_domains", "cross_domain_sequences"]
