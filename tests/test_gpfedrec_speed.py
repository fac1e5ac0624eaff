"""GPFedRec's fast server and client paths against plain computations (issue 43).

* the symmetric Gram (:func:`_symmetric_gram`) against ``x @ x.T``;
* the pairwise angle certificate (:func:`_uncertified_above`) against the mask ``S > τ`` of the
  full similarity, and the message passing through the non-edges
  (:func:`_personalise_by_complement`) against :func:`message_passing`, in float64;
* the one-client-at-a-time pull of the closed-form executor (:func:`_pull_toward`) against the
  whole-chunk form, bit for bit in float32.
"""
from __future__ import annotations

import math

import pytest
import torch

from fedlib.baselines.single_domain.gpfedrec import _pull_toward
from fedlib.baselines.single_domain.gpfedrec_graph import (GRAM_BLOCK, MAX_DROPPED, _personalise_by_complement, _symmetric_gram,
                                                           _uncertified_above, angle_bound, graph_personalise,
                                                           message_passing, neighbour_weights, user_similarity)

torch.set_num_threads(1)


def _tables(num_users, spread, seed, outliers=(), num_items=7, dim=3):
    """``(U, I, d)`` float64 tables near a shared broadcast, some users moved far (``outliers``)."""
    gen = torch.Generator().manual_seed(seed)
    broadcast = torch.randn(num_items, dim, generator=gen, dtype=torch.float64)
    tables = broadcast + spread * torch.randn(num_users, num_items, dim, generator=gen, dtype=torch.float64)
    for user in outliers:
        tables[user] = torch.randn(num_items, dim, generator=gen, dtype=torch.float64)
    return tables


@pytest.mark.parametrize("num_users,chunk", [(1, 1024), (5, 2), (GRAM_BLOCK + 37, 1024), (2 * GRAM_BLOCK + 1, 64)])
def test_symmetric_gram_equals_the_full_product_and_is_exactly_symmetric(num_users, chunk):
    x = torch.randn(num_users, 11, generator=torch.Generator().manual_seed(num_users), dtype=torch.float64)
    gram = _symmetric_gram(x, chunk)
    torch.testing.assert_close(gram, x @ x.T, atol=1e-12, rtol=0)
    assert torch.equal(gram, gram.T)
    similarity = user_similarity(x, chunk_size=chunk)
    assert torch.equal(similarity, similarity.T)


@pytest.mark.parametrize("scale", [0.5, 0.9])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("num_users,spread,outliers", [(30, 0.3, ()), (40, 0.6, (3, 17)), (GRAM_BLOCK + 20, 0.5, (0, 5, 99)),
                                                       (25, 0.05, (2,)), (20, 2.0, ())])
def test_uncertified_pairs_give_the_mask_of_the_full_similarity(scale, seed, num_users, spread, outliers):
    tables = _tables(num_users, spread, seed, outliers)
    bound = angle_bound(tables, scale)
    full = user_similarity(tables)
    # the certificate's τ is κ times the mean of S (computed without S)
    assert bound.threshold == pytest.approx(scale * float(full.mean()), abs=1e-12)
    above = _uncertified_above(tables.reshape(num_users, -1), bound, bound.threshold)
    assert torch.equal(above, full > bound.threshold)
    assert torch.equal(above, above.T)


@pytest.mark.parametrize("seed", range(3))
def test_message_passing_through_the_non_edges_equals_the_dense_product(seed):
    tables = _tables(30, 0.6, seed, outliers=(1, 4, 9))
    tables[7] = 0.0  # a zero table: similarity 0 with everyone, so it has no neighbour and keeps itself
    x = tables.reshape(30, -1)
    weights_full, threshold = neighbour_weights(user_similarity(tables), 0.5)
    above = weights_full > 0
    weights, personal = _personalise_by_complement(x, above)
    assert torch.equal(weights, weights_full)
    non_edges = (~above).sum(1)  # both kinds of rows: by subtraction and dense
    assert bool(((non_edges > 0) & (non_edges <= MAX_DROPPED)).any()) and bool((non_edges > MAX_DROPPED).any())
    torch.testing.assert_close(personal, message_passing(weights_full, x), atol=1e-12, rtol=0)
    torch.testing.assert_close(personal[7], x[7], atol=0, rtol=0)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("spread,scale", [(0.35, 0.5), (1.0, 0.5), (3.0, 0.9), (0.2, 1.0)])
def test_bounded_server_step_equals_the_full_one_with_many_wide_users(seed, spread, scale):
    # from a few wide users (the bounded path) to every user wide (the full path itself)
    tables = _tables(60, spread, seed, outliers=(seed, 11, 40))
    fast = graph_personalise(tables, threshold_scale=scale)
    full = graph_personalise(tables, threshold_scale=scale, certify=False)
    assert full.wide_users is None
    if fast.wide_users is None:  # half or more of the users wide: the full path
        assert torch.equal(fast.similarity, full.similarity) and fast.threshold == full.threshold
    else:
        assert fast.similarity is None
    assert torch.equal(fast.weights, full.weights)
    for name in ("personal", "global_table"):
        torch.testing.assert_close(getattr(fast, name), getattr(full, name), atol=1e-12, rtol=0, msg=name)


@pytest.mark.parametrize("train", [True, False])
def test_pull_one_client_at_a_time_is_bitwise_the_whole_chunk_form(train):
    gen = torch.Generator().manual_seed(5)
    tables = torch.randn(6, 50, 4, generator=gen)  # float32, as the grids
    targets = torch.randn(6, 50, 4, generator=gen)
    pull = 0.0137
    expected_tables = tables.clone()
    gap = expected_tables - targets  # the whole-chunk form the executor used before
    expected_norms = torch.linalg.vector_norm(gap, dim=(1, 2))
    if train:
        expected_tables.sub_(gap, alpha=pull)
    norms = _pull_toward(tables, targets, pull if train else None, torch.empty(1, 50, 4))
    assert torch.equal(norms, expected_norms)
    assert torch.equal(tables, expected_tables)
    assert math.isfinite(float(norms.sum()))
