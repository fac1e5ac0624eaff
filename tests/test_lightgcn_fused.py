"""The fused symmetric LightGCN propagation (one autograd node for all layers, issue 43).

:func:`fedlib.models.lightgcn.lightgcn_propagate` with ``symmetric=True`` runs every layer in
one autograd node whose backward is Horner's form of the layers' gradients. It must give the
same values and gradients as the layer-by-layer form (one :func:`symmetric_spmm` node per
layer) bit for bit in float32 (FedKDRec's LightGCN cells, CL-DTCDR and GA-CDR keep their
numbers), and the values and gradients of the dense polynomial ``c Σ_k Â^k`` in float64.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlib.data.splits import Pairs
from fedlib.models.lightgcn import _layer_by_layer, lightgcn_propagate, normalized_adjacency

NUM_USERS, NUM_ITEMS, DIM = 23, 31, 5


def _graph(dtype=torch.float32):
    rng = np.random.default_rng(0)
    pairs = Pairs.from_arrays(rng.integers(0, NUM_USERS, 150), rng.integers(0, NUM_ITEMS, 150), NUM_USERS)
    return normalized_adjacency(pairs, NUM_USERS, NUM_ITEMS, dtype=dtype, layout="csr")


def _values_and_grads(propagate, adjacency, num_layers, combine, dtype):
    g = torch.Generator().manual_seed(1)
    users = torch.randn(NUM_USERS, DIM, generator=g, dtype=dtype).requires_grad_()
    items = torch.randn(NUM_ITEMS, DIM, generator=g, dtype=dtype).requires_grad_()
    out_users, out_items = propagate(adjacency, users, items, num_layers, combine)
    weight_users = torch.randn(out_users.shape, generator=g, dtype=dtype)
    weight_items = torch.randn(out_items.shape, generator=g, dtype=dtype)
    ((out_users * weight_users).sum() + (out_items * weight_items).sum()).backward()
    return out_users.detach(), out_items.detach(), users.grad, items.grad


@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize("combine", ["mean", "sum"])
def test_fused_propagation_is_bit_identical(num_layers, combine):
    adjacency = _graph()
    fused = _values_and_grads(lambda *a: lightgcn_propagate(*a, symmetric=True), adjacency, num_layers, combine,
                              torch.float32)
    layered = _values_and_grads(lambda *a: _layer_by_layer(*a, symmetric=True), adjacency, num_layers, combine,
                                torch.float32)
    for name, a, b in zip(("users", "items", "user grad", "item grad"), fused, layered):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("combine", ["mean", "sum"])
def test_fused_propagation_matches_the_dense_polynomial_in_float64(combine):
    """Values ``M E0`` and gradients ``Mᵀ W`` with the dense ``M = c Σ_k Â^k`` (c = 1/4 for the mean)."""
    adjacency = _graph(torch.float64)
    fused = _values_and_grads(lambda *a: lightgcn_propagate(*a, symmetric=True), adjacency, 3, combine, torch.float64)
    dense = adjacency.to_dense()
    power, polynomial = torch.eye(dense.shape[0], dtype=torch.float64), torch.zeros_like(dense)
    for _ in range(4):
        polynomial, power = polynomial + power, dense @ power
    polynomial = polynomial / 4 if combine == "mean" else polynomial
    g = torch.Generator().manual_seed(1)  # the draws of _values_and_grads, in its order
    embeddings = torch.cat([torch.randn(NUM_USERS, DIM, generator=g, dtype=torch.float64),
                            torch.randn(NUM_ITEMS, DIM, generator=g, dtype=torch.float64)])
    weights = torch.cat([torch.randn(NUM_USERS, DIM, generator=g, dtype=torch.float64),
                         torch.randn(NUM_ITEMS, DIM, generator=g, dtype=torch.float64)])
    torch.testing.assert_close(torch.cat(fused[:2]), polynomial @ embeddings, rtol=0, atol=1e-10)
    torch.testing.assert_close(torch.cat(fused[2:]), polynomial.T @ weights, rtol=0, atol=1e-10)


def test_fused_propagation_refuses_a_coo_matrix():
    coo = normalized_adjacency(Pairs.from_arrays(np.array([0]), np.array([1]), 2), 2, 3, layout="coo")
    with pytest.raises(ValueError, match="CSR"):
        lightgcn_propagate(coo, torch.zeros(2, 4), torch.zeros(3, 4), symmetric=True)
