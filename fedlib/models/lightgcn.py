"""LightGCN: linear propagation on the normalised user-item graph.

Reference:
    He, Deng, Wang, Li, Zhang, Wang. "LightGCN: Simplifying and Powering Graph Convolution
    Network for Recommendation." SIGIR 2020. arXiv:2002.02126.

``E^{(k+1)} = Â E^{(k)}`` with ``Â = D^{-1/2} A D^{-1/2}`` on the ``(U + I) × (U + I)``
bipartite adjacency ``A``; final embeddings ``E = Σ_k α_k E^{(k)}`` with ``α_k = 1/(K+1)``
(the mean of the layer outputs, including layer 0); logit ``e_u · e_i``. Trained with BPR
(the paper) or BCE with sampled negatives. Init ``N(0, 0.1²)`` as the authors' code.

Used centralised, and as a server-side or per-domain model (FedPCL-CDR sums the layers
instead of averaging them: ``combine="sum"``).
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from fedlib.data.splits import Pairs
from fedlib.models.base import normal_

__all__ = ["LightGCN", "normalized_adjacency", "lightgcn_propagate", "symmetric_spmm"]


def normalized_adjacency(pairs: Pairs, num_users: int, num_items: int, dtype=torch.float32, device="cpu",
                         layout: str = "coo") -> torch.Tensor:
    """Sparse ``(U + I, U + I)`` matrix ``D^{-1/2} A D^{-1/2}`` (users first, then items).

    Duplicate (user, item) pairs count once; isolated nodes get degree 0 and zero rows.
    The matrix is exactly symmetric (each value is ``d_r^{-1/2} d_c^{-1/2}`` rounded once).
    ``layout``: ``"coo"`` (coalesced) or ``"csr"`` (for :func:`symmetric_spmm`).
    """
    if layout not in ("coo", "csr"):
        raise ValueError(f"layout must be 'coo' or 'csr', got {layout!r}")
    keys = torch.unique(torch.as_tensor(pairs.users, dtype=torch.int64) * num_items + torch.as_tensor(pairs.items, dtype=torch.int64))
    users, items = keys // num_items, keys % num_items
    n = num_users + num_items
    row = torch.cat([users, items + num_users])
    col = torch.cat([items + num_users, users])
    degree = torch.bincount(row, minlength=n).to(torch.float64)
    inv_sqrt = torch.where(degree > 0, degree.rsqrt(), torch.zeros_like(degree))
    values = (inv_sqrt[row] * inv_sqrt[col]).to(dtype)
    coo = torch.sparse_coo_tensor(torch.stack([row, col]), values, (n, n), check_invariants=False).coalesce()
    if layout == "coo":
        return coo.to(device)
    with warnings.catch_warnings():  # torch flags all of its CSR support as "beta"; spmm is what we use
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return coo.to_sparse_csr().to(device)


class _SymmetricSpMM(torch.autograd.Function):
    """``Â X`` whose backward is ``Â G``: for a symmetric ``Â``, ``Âᵀ G = Â G``.

    ``torch.sparse.mm`` builds ``Âᵀ`` (a transpose and a re-sort of the indices) on every
    backward call; with the graph fixed over many steps that dominates training time.
    """

    @staticmethod
    def forward(ctx, adjacency: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        ctx.adjacency = adjacency
        return adjacency @ dense

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return None, ctx.adjacency @ grad


def symmetric_spmm(adjacency: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """``(n, n)`` symmetric sparse CSR ``adjacency`` times ``dense (n, d)``, differentiable in ``dense``.

    Same values as ``torch.sparse.mm`` on the CSR matrix; the gradient reuses ``adjacency``
    instead of transposing it, which is correct only because it is symmetric (the caller's
    promise; :func:`normalized_adjacency` guarantees it). On ML-100K's graph (156k non-zeros,
    d = 32, one CPU thread) a 3-layer forward and backward takes about 7 ms against 73 ms
    with a COO ``torch.sparse.mm``.
    """
    if adjacency.layout != torch.sparse_csr:
        raise ValueError(f"symmetric_spmm needs a sparse CSR matrix (normalized_adjacency(..., layout='csr')), "
                         f"got layout {adjacency.layout}")
    return _SymmetricSpMM.apply(adjacency, dense)


class _SymmetricPropagation(torch.autograd.Function):
    """All layers of :func:`lightgcn_propagate` on a symmetric CSR ``Â`` as one autograd node.

    Forward ``T = c (E0 + Â E0 + … + Â^K E0)`` (``c = 1/(K+1)`` for ``mean``, else 1),
    summed in the order of the layer-by-layer form. Backward, with ``g = c G``: the gradient of
    ``E0`` is ``g + Â (g + Â (… (g + Â g)))`` (Horner), which is exactly what autograd
    accumulates through the ``K`` :func:`symmetric_spmm` nodes and the ``K`` additions (each
    layer's gradient is ``g`` from the sum plus ``Â`` times the next layer's). One node
    instead of ``2K + 2`` (and none of their saved tensors): the server step of FedKDRec's
    LightGCN, which propagates the whole graph for every mini-batch, is mostly these products.
    Bit-identical to the layer-by-layer form (``test_fused_propagation_is_bit_identical``).
    """

    @staticmethod
    def forward(ctx, adjacency: torch.Tensor, embeddings: torch.Tensor, num_layers: int, mean: bool):
        """``embeddings (U + I, d)`` -> ``(U + I, d)``."""
        ctx.adjacency, ctx.num_layers, ctx.mean = adjacency, num_layers, mean
        layer = total = embeddings
        for _ in range(num_layers):
            layer = adjacency @ layer  # (U + I, d)
            total = total + layer
        return total / (num_layers + 1) if mean else total

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        scaled = grad / (ctx.num_layers + 1) if ctx.mean else grad  # what the division's backward gives
        acc = scaled  # gradient of the last layer
        for _ in range(ctx.num_layers):
            acc = scaled + ctx.adjacency @ acc  # a layer's gradient: from the sum, plus Â × the next layer's
        return None, acc, None, None


def lightgcn_propagate(adjacency: torch.Tensor, user_emb: torch.Tensor, item_emb: torch.Tensor,
                       num_layers: int = 3, combine: str = "mean", symmetric: bool = False):
    """Propagate ``[user_emb; item_emb]`` (``(U, d)``, ``(I, d)``) ``num_layers`` times.

    Returns ``(users (U, d), items (I, d))``: the mean (``combine="mean"``, LightGCN) or the
    sum (``"sum"``) of the layer outputs ``E^{(0)} .. E^{(K)}``. ``symmetric=True`` takes a
    CSR ``adjacency`` and uses :func:`symmetric_spmm` (the fast backward).
    """
    if combine not in ("mean", "sum"):
        raise ValueError("combine must be 'mean' or 'sum'")
    if symmetric:
        if adjacency.layout != torch.sparse_csr:
            raise ValueError(f"symmetric propagation needs a sparse CSR matrix (normalized_adjacency(..., "
                             f"layout='csr')), got layout {adjacency.layout}")
        layers = torch.cat([user_emb, item_emb], dim=0)  # (U + I, d)
        total = _SymmetricPropagation.apply(adjacency, layers, int(num_layers), combine == "mean")
        return total[: user_emb.shape[0]], total[user_emb.shape[0]:]
    return _layer_by_layer(adjacency, user_emb, item_emb, num_layers, combine, symmetric)


def _layer_by_layer(adjacency: torch.Tensor, user_emb: torch.Tensor, item_emb: torch.Tensor, num_layers: int,
                    combine: str, symmetric: bool):
    """:func:`lightgcn_propagate` one autograd node per layer: the COO path, and the reference
    the fused symmetric path is tested against."""
    multiply = symmetric_spmm if symmetric else torch.sparse.mm
    layer = torch.cat([user_emb, item_emb], dim=0)  # (U + I, d)
    total = layer
    for _ in range(num_layers):
        layer = multiply(adjacency, layer)  # (U + I, d)
        total = total + layer
    if combine == "mean":
        total = total / (num_layers + 1)
    return total[: user_emb.shape[0]], total[user_emb.shape[0]:]


class LightGCN(nn.Module):
    """Centralised LightGCN on the training graph ``train``.

    Args:
        train: training interactions (the graph).
        num_users, num_items, dim, num_layers: sizes (paper: d = 64, K = 3).
        init_std: embedding init std (0.1).
        combine: ``"mean"`` (paper) or ``"sum"``.
    """

    def __init__(self, train: Pairs, num_users: int, num_items: int, dim: int = 64, num_layers: int = 3,
                 init_std: float = 0.1, combine: str = "mean", generator=None):
        super().__init__()
        generator = generator if generator is not None else torch.Generator().manual_seed(0)
        self.num_users, self.num_items, self.num_layers, self.combine = num_users, num_items, num_layers, combine
        self.user_emb = nn.Parameter(normal_((num_users, dim), init_std, generator, torch.float32, "cpu"))
        self.item_emb = nn.Parameter(normal_((num_items, dim), init_std, generator, torch.float32, "cpu"))
        self.register_buffer("adjacency", normalized_adjacency(train, num_users, num_items), persistent=False)

    def propagate(self):
        """``(users (U, d), items (I, d))`` final embeddings.

        A CSR adjacency (a caller may convert the buffer for speed) takes the symmetric
        backward of :func:`symmetric_spmm`; the COO default keeps ``torch.sparse.mm``.
        """
        return lightgcn_propagate(self.adjacency, self.user_emb, self.item_emb, self.num_layers, self.combine,
                                  symmetric=self.adjacency.layout == torch.sparse_csr)

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """``(B,)`` logits for (user, item) pairs."""
        all_users, all_items = self.propagate()
        return (all_users[users] * all_items[items]).sum(-1)

    def bpr_loss(self, users, positives, negatives, l2: float = 1e-4) -> torch.Tensor:
        """Mean BPR loss ``-log σ(s_ui - s_uj)`` + ``l2 · ‖ego embeddings of the batch‖² / (2B)``."""
        all_users, all_items = self.propagate()
        u = all_users[users]  # (B, d)
        diff = (u * all_items[positives]).sum(-1) - (u * all_items[negatives]).sum(-1)  # (B,)
        reg = (self.user_emb[users].pow(2).sum() + self.item_emb[positives].pow(2).sum()
               + self.item_emb[negatives].pow(2).sum()) / (2 * users.numel())
        return -F.logsigmoid(diff).mean() + l2 * reg

    def bce_loss(self, users, items, labels) -> torch.Tensor:
        """Mean BCE with logits over (user, item, label) examples."""
        return F.binary_cross_entropy_with_logits(self(users, items), labels)

    @torch.no_grad()
    def score_users(self, users: torch.Tensor) -> torch.Tensor:
        all_users, all_items = self.propagate()
        return all_users[users] @ all_items.T  # (n, I)
