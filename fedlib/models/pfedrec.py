"""PFedRec: a private score head on a public item table, trained in two steps per batch.

Reference:
    Zhang, Liu, Jiang, Guo, Zhang. "Dual Personalization on Federated Recommendation."
    IJCAI 2023. arXiv:2301.08143.

Each client keeps a private score function ``s_ui = w_u · q_i + b_u`` (a ``Linear(d → 1)``
head) and downloads the public item table. Per mini-batch it takes **two** SGD steps:
first the head with the item table fixed, then, after recomputing the loss with the new
head, the item rows (the engine's ``update_steps=(("head_w","head_b"), ("item_emb",))``,
see :func:`fedlib.engine.method.pfedrec_method`). Learning rates in the public code:
head ``lr`` (0.1), items ``lr × num_items × lr_eta`` (``lr_eta`` 80 in PFedRec/FedRKG,
170 in F3CRec).

Init as the reference code (``nn.Embedding`` / ``nn.Linear`` defaults): items ``N(0, 1)``;
the head is one ``U(±1/√d)`` draw shared by every user, because every client starts as a
copy of one model.
"""
from __future__ import annotations

from typing import Mapping

import torch

from fedlib.models.base import FederatedModel, normal_, torch_linear_init

__all__ = ["PFedRec"]


class PFedRec(FederatedModel):
    """Parameters: ``item_emb`` public rows ``(num_items, d)``; ``head_w`` private
    ``(num_users, d)``; ``head_b`` private ``(num_users,)``. Logit ``w_u · q_i + b_u``."""

    param_kinds = {"item_emb": "public_rows", "head_w": "private_dense", "head_b": "private_dense"}
    #: the two-step local update of the paper: head first, then the item table
    update_steps = (("head_w", "head_b"), ("item_emb",))
    #: the score is a linear head on this row table (the engine's closed-form gradients,
    #: :mod:`fedlib.engine.linear_head`)
    linear_head_tables = ("item_emb",)

    def __init__(self, num_users: int, num_items: int, dim: int = 32, item_init_std: float = 1.0):
        self.num_users, self.num_items, self.dim, self.item_init_std = int(num_users), int(num_items), int(dim), float(item_init_std)

    def init_global(self, generator, dtype=torch.float32, device="cpu"):
        return {"item_emb": normal_((self.num_items, self.dim), self.item_init_std, generator, dtype, device)}

    def init_private(self, generator, dtype=torch.float32, device="cpu"):
        weight, bias = torch_linear_init(self.dim, 1, generator, dtype, device)
        return {
            "head_w": weight[0].expand(self.num_users, -1).clone(),  # (U, d)
            "head_b": bias.expand(self.num_users).clone(),  # (U,)
        }

    def logits(self, params: Mapping[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        items = params["item_emb"][rows]  # (C, B, d)
        return torch.einsum("cbd,cd->cb", items, params["head_w"]) + params["head_b"][:, None]  # (C, B)

    def score_users(self, global_state, private_state, users):
        # Evaluation with the *global* item table, as F3CRec's code does (the original PFedRec
        # scores with each client's locally fine-tuned copy).
        return private_state["head_w"][users] @ global_state["item_emb"].T + private_state["head_b"][users][:, None]
