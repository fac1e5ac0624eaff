"""Matrix factorisation: centralised MF and its federated form FedMF.

References:
    Koren, Bell, Volinsky. "Matrix Factorization Techniques for Recommender Systems."
    IEEE Computer 42(8), 2009.
    Chai, Wang, Chen, Yang. "Secure Federated Matrix Factorization." IEEE Intelligent
    Systems 36(5), 2021. arXiv:1906.05108.
    FedMF as the backbone of F3CRec (Lim et al., CIKM 2025): user vector private, item
    table public, logit ``p_u · q_i``, BCE with logits (mean over the batch), rows
    initialised ``N(0, 0.01²)`` (the authors' code, https://github.com/Jaehyung-Lim/F3CRec-CIKM-25,
    ``fcrec/baseline/fedmf/``).

Learning rates used with it (F3CRec public code): user vector ``lr``, item table
``lr × num_items``, because a client's mean loss touches only a few item rows.
"""
from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from fedlib.models.base import FederatedModel, GlobalState, PrivateState, normal_

__all__ = ["FedMF", "MF"]


class FedMF(FederatedModel):
    """Federated matrix factorisation.

    Parameters:
        ``user_emb``  private_dense ``(num_users, d)``: ``p_u``, stays on the device.
        ``item_emb``  public_rows ``(num_items, d)``: ``q_i``, aggregated by the server.

    Logit ``s_ui = p_u · q_i``. Init ``N(0, init_std²)`` for both tables (F3CRec: 0.01).
    """

    param_kinds = {"user_emb": "private_dense", "item_emb": "public_rows"}

    def __init__(self, num_users: int, num_items: int, dim: int = 32, init_std: float = 0.01):
        self.num_users, self.num_items, self.dim, self.init_std = int(num_users), int(num_items), int(dim), float(init_std)

    def init_global(self, generator, dtype=torch.float32, device="cpu") -> GlobalState:
        return {"item_emb": normal_((self.num_items, self.dim), self.init_std, generator, dtype, device)}

    def init_private(self, generator, dtype=torch.float32, device="cpu") -> PrivateState:
        return {"user_emb": normal_((self.num_users, self.dim), self.init_std, generator, dtype, device)}

    def logits(self, params: Mapping[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        item_vectors = params["item_emb"][rows]  # (C, B, d)
        user_vectors = params["user_emb"]  # (C, d)
        return torch.einsum("cbd,cd->cb", item_vectors, user_vectors)  # (C, B)

    def score_users(self, global_state, private_state, users):
        return private_state["user_emb"][users] @ global_state["item_emb"].T  # (n, I)


class MF(nn.Module):
    """Centralised MF with the same logit, init and loss as :class:`FedMF` (for comparisons).

    ``forward(users (B,), items (B,)) -> (B,)`` logits.
    """

    def __init__(self, num_users: int, num_items: int, dim: int = 32, init_std: float = 0.01, generator=None):
        super().__init__()
        generator = generator if generator is not None else torch.Generator().manual_seed(0)
        self.user_emb = nn.Parameter(normal_((num_users, dim), init_std, generator, torch.float32, "cpu"))
        self.item_emb = nn.Parameter(normal_((num_items, dim), init_std, generator, torch.float32, "cpu"))

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return (self.user_emb[users] * self.item_emb[items]).sum(-1)  # (B,)

    def score_users(self, users: torch.Tensor) -> torch.Tensor:
        return self.user_emb[users] @ self.item_emb.T  # (n, I)
