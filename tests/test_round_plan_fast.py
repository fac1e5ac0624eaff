"""The round plan's fast path against its plain reference: the same draws, element by element.

:func:`~fedlib.engine.plan.make_round_plan` shuffles the multi-batch clients with a value sort
of packed keys (:func:`~fedlib.engine.plan._argsort_within_blocks`) instead of one float64
argsort and gathers only the shuffled examples; every draw from the round generator must stay
the same, in the same order. :func:`reference_round_plan` is the implementation it replaced.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pytest

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import Pairs
from fedlib.engine.plan import (RoundPlan, _argsort_within_blocks, _ranges, make_round_plan, round_generator,
                                select_clients)


def reference_round_plan(
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
    """:func:`make_round_plan` as it was before issue 43 (the reference of its fast path).

    One float64 argsort of ``owner + U[0, 1)`` keys per epoch shuffles the multi-batch clients,
    and the epoch's order is gathered from a full-length index array.
    """
    indptr = train.indptr
    if clients is None:
        clients = select_clients(train.active_users(), clients_per_round, rng)
    clients = np.asarray(clients, dtype=np.int64)
    num_pos = indptr[clients + 1] - indptr[clients]  # (C,)
    pos_index = _ranges(indptr[clients], num_pos)  # (P,) positions in train
    pos_items = train.items[pos_index]
    negatives = sampler.sample(train.users[pos_index], num_negatives, rng)  # (P, k)
    per_pos = 1 + num_negatives
    items = np.concatenate([pos_items[:, None], negatives], axis=1).ravel()  # (E,)
    labels = np.tile(np.concatenate([[1.0], np.zeros(num_negatives)]).astype(np.float32), pos_index.size)
    num_examples = num_pos * per_pos  # (C,)
    ex_start = np.zeros(clients.size + 1, dtype=np.int64)
    np.cumsum(num_examples, out=ex_start[1:])
    total = int(ex_start[-1])
    batches_per_epoch = -(-num_examples // batch_size)  # (C,) ceil
    num_steps = batches_per_epoch * local_epochs
    position = np.arange(total, dtype=np.int64) - np.repeat(ex_start[:-1], num_examples)
    multi_clients = np.flatnonzero(batches_per_epoch > 1)
    multi = _ranges(ex_start[multi_clients], num_examples[multi_clients])
    multi_owner = np.repeat(np.arange(multi_clients.size, dtype=np.float64), num_examples[multi_clients])

    def shuffled_order():
        order = np.arange(total, dtype=np.int64)
        if multi.size:
            keys = multi_owner + rng.random(multi.size)
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
            slot = ex_start[client_of_example] * local_epochs + epoch * num_examples[client_of_example] + position
            out_items[slot] = items[order]
            out_labels[slot] = labels[order]
            out_steps[slot] = epoch * batches_per_epoch[client_of_example] + position // batch_size
    noise_key = int(rng.integers(0, 2**63 - 1))
    return RoundPlan(
        round_index=int(round_index), clients=clients, example_indptr=ex_start * local_epochs,
        items=out_items, labels=out_labels, steps=out_steps, num_steps=num_steps.astype(np.int64),
        num_examples=num_examples.astype(np.int64), batch_size=int(batch_size), local_epochs=int(local_epochs),
        noise_key=noise_key,
    )


def _toy_pairs(seed: int, num_users: int = 60, num_items: int = 300):
    """Users with 1 to 250 positives (so batch sizes of 16-512 give one- and many-batch clients)."""
    rng = np.random.default_rng(seed)
    sizes = np.minimum(rng.geometric(1 / 40, num_users), 250)
    sizes[rng.choice(num_users, 5, replace=False)] = 0  # users without training data
    users = np.repeat(np.arange(num_users), sizes)
    items = np.concatenate([rng.choice(num_items, s, replace=False) for s in sizes])
    return Pairs.from_arrays(users, items, num_users), num_items


def _assert_plans_equal(fast: RoundPlan, reference: RoundPlan):
    for name in ("clients", "example_indptr", "items", "labels", "steps", "num_steps", "num_examples"):
        a, b = getattr(fast, name), getattr(reference, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert (fast.round_index, fast.batch_size, fast.local_epochs, fast.noise_key) == \
        (reference.round_index, reference.batch_size, reference.local_epochs, reference.noise_key)


@pytest.mark.parametrize("exclude", ["train", "all_rated"])
@pytest.mark.parametrize("batch_size,local_epochs,clients_per_round",
                         [(512, 1, None), (64, 1, None), (16, 1, 20), (64, 3, None), (32, 2, 25)])
def test_plan_equals_the_reference_draw_for_draw(exclude, batch_size, local_epochs, clients_per_round):
    train, num_items = _toy_pairs(1)
    if exclude == "train":
        sampler = NegativeSampler(train, num_items)
    else:  # the leaky sampler: more excluded items, more rejection passes
        extra, _ = _toy_pairs(2, num_items=num_items)
        union = Pairs.from_arrays(np.concatenate([train.users, extra.users]),
                                  np.concatenate([train.items, extra.items]), train.num_users)
        sampler = NegativeSampler(train, num_items, exclude="all_rated", all_rated=union)
    settings = dict(num_negatives=4, batch_size=batch_size, local_epochs=local_epochs,
                    clients_per_round=clients_per_round)
    shuffled = 0
    for round_index in range(4):
        fast_rng, reference_rng = round_generator(7, round_index), round_generator(7, round_index)
        fast = make_round_plan(train, sampler, fast_rng, round_index=round_index, **settings)
        reference = reference_round_plan(train, sampler, reference_rng, round_index=round_index, **settings)
        _assert_plans_equal(fast, reference)
        assert fast_rng.random() == reference_rng.random()  # both generators left in the same state
        shuffled += int((fast.num_steps > local_epochs).sum())
    assert shuffled > 0  # the shuffle was exercised


def test_plan_with_given_clients_and_one_negative_equals_the_reference():
    train, num_items = _toy_pairs(3)
    sampler = NegativeSampler(train, num_items)
    clients = np.array([0, 3, 4, 10, 11, 40, 59])  # may include users without positives
    for round_index in range(3):
        fast = make_round_plan(train, sampler, round_generator(0, round_index), round_index=round_index,
                               num_negatives=1, batch_size=32, clients=clients)
        reference = reference_round_plan(train, sampler, round_generator(0, round_index), round_index=round_index,
                                         num_negatives=1, batch_size=32, clients=clients)
        _assert_plans_equal(fast, reference)


def _owner_keys(sizes: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(sizes.size, dtype=np.float64), sizes) + uniforms


@pytest.mark.parametrize("seed", range(4))
def test_block_argsort_equals_the_float_argsort(seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 3000, size=int(rng.integers(1, 700)))
    uniforms = rng.random(int(sizes.sum()))
    assert np.array_equal(_argsort_within_blocks(sizes, uniforms), np.argsort(_owner_keys(sizes, uniforms)))


def test_block_argsort_when_packing_cannot_decide():
    """Equal keys, keys closer than the packed fraction, a key rounding up to its owner + 1, and
    more blocks than the packing has room for: the result is still the float argsort's."""
    rng = np.random.default_rng(5)
    sizes = np.array([4, 700, 3, 900])
    owner_keys = lambda u: _owner_keys(sizes, u)  # noqa: E731
    uniforms = rng.random(int(sizes.sum()))
    close = uniforms.copy()
    close[1], close[2] = 0.25, 0.25 + 2.0 ** -54  # distinct keys of block 0, one packed fraction (52 bits)
    rounding_up = uniforms.copy()
    rounding_up[-1] = 1.0 - 2.0 ** -53  # 3 + u rounds to 4.0
    for u in (close, rounding_up):
        assert np.array_equal(_argsort_within_blocks(sizes, u), np.argsort(owner_keys(u)))
    tied = uniforms.copy()
    tied[20] = tied[30]  # equal keys: the float argsort's own order of the pair
    assert np.array_equal(_argsort_within_blocks(sizes, tied), np.argsort(owner_keys(tied)))
    many = np.ones(1 << 14, dtype=np.int64)
    many[0] = 1 << 15  # 14 owner bits + 15 index bits leave fewer than _MIN_FRACTION_BITS
    u = rng.random(int(many.sum()))
    assert np.array_equal(_argsort_within_blocks(many, u), np.argsort(_owner_keys(many, u)))
    assert _argsort_within_blocks(np.zeros(0, dtype=np.int64), np.zeros(0)).size == 0


def test_block_argsort_permutes_each_block_within_itself():
    sizes = np.array([3, 1, 5])
    order = _argsort_within_blocks(sizes, np.array([0.5, 0.1, 0.9, 0.3, 0.8, 0.2, 0.4, 0.6, 0.0]))
    assert order.tolist() == [1, 0, 2, 3, 8, 5, 6, 7, 4]
