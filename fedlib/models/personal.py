"""Clients with a personal item table (FedRAP- and FedRKG-style backbones).

References:
    Li, Long, Zhou, Jiang, Zhang. "Federated Recommendation with Additive Personalization"
    (FedRAP). ICLR 2024. arXiv:2301.09109. Private "item personality" table plus a public
    "item commonality" table; score from their sum through a private user head.
    FedRKG (Lim et al., arXiv:2511.12959; public code https://github.com/Jaehyung-Lim/fedrkg,
    ``models/fedrkg.py``, ``main.py``): a **fully
    personal** item table ``P_u ∈ R^{I×d}`` and a private ``Linear(d → 1)`` head
    (``s_ui = w_u · P_u[i] + b_u``); nothing is aggregated in normal rounds; item lr
    ``0.1 × I × 80`` with per-step gradient clipping to norm 1.

Both inits follow the reference code: every client starts from one shared draw (the
round-0 copy of one model): item tables ``N(0, 1)``, head ``U(±1/√d)``.

Memory: the personal tables are ``num_users × num_items × d`` numbers (ML-1M, d=32,
float32: 2.9 GB). Keep them on the device that trains them.
"""
from __future__ import annotations

from typing import Mapping

import torch

from fedlib.models.base import FederatedModel, consecutive_runs, normal_, torch_linear_init

__all__ = ["PersonalItemTableModel"]


class PersonalItemTableModel(FederatedModel):
    """Personal item table + private head, optionally plus a public item table.

    Args:
        shared_table: ``False`` → FedRKG backbone (``s_ui = w_u · P_u[i] + b_u``);
            ``True`` → FedRAP backbone (``s_ui = w_u · (P_u[i] + C[i]) + b_u`` with the public
            table ``C``).

    Parameters: ``personal_item_emb`` private rows ``(num_users, num_items, d)``;
    ``item_emb`` public rows ``(num_items, d)`` (FedRAP only); ``head_w (num_users, d)``,
    ``head_b (num_users,)`` private.
    """

    def __init__(self, num_users: int, num_items: int, dim: int = 32, shared_table: bool = False, init_std: float = 1.0):
        self.num_users, self.num_items, self.dim = int(num_users), int(num_items), int(dim)
        self.shared_table, self.init_std = bool(shared_table), float(init_std)
        kinds = {"personal_item_emb": "private_rows"}
        if shared_table:
            kinds["item_emb"] = "public_rows"
        kinds.update({"head_w": "private_dense", "head_b": "private_dense"})
        self.param_kinds = kinds

    @property
    def linear_head_tables(self):
        """The row tables whose rows add up under the linear head (:mod:`fedlib.engine.linear_head`)."""
        return ("personal_item_emb", "item_emb") if self.shared_table else ("personal_item_emb",)

    def init_global(self, generator, dtype=torch.float32, device="cpu"):
        if not self.shared_table:
            return {}
        return {"item_emb": normal_((self.num_items, self.dim), self.init_std, generator, dtype, device)}

    def init_private(self, generator, dtype=torch.float32, device="cpu"):
        table = normal_((self.num_items, self.dim), self.init_std, generator, dtype, device)
        weight, bias = torch_linear_init(self.dim, 1, generator, dtype, device)
        return {
            "personal_item_emb": table.unsqueeze(0).repeat(self.num_users, 1, 1),  # (U, I, d)
            "head_w": weight[0].expand(self.num_users, -1).clone(),  # (U, d)
            "head_b": bias.expand(self.num_users).clone(),  # (U,)
        }

    def logits(self, params: Mapping[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        items = params["personal_item_emb"][rows]  # (C, B, d)
        if self.shared_table:
            items = items + params["item_emb"][rows]
        return torch.einsum("cbd,cd->cb", items, params["head_w"]) + params["head_b"][:, None]  # (C, B)

    def score_users(self, global_state, private_state, users):
        """``(n, I)`` scores of every item; runs of consecutive users read their tables as views.

        (Gathering ``table[users]`` would copy ``n × I × d`` floats per call, 0.5 GB for 512
        Amazon-Video users: most of an evaluation's time.)
        """
        table, head_w, head_b = private_state["personal_item_emb"], private_state["head_w"], private_state["head_b"]
        out = torch.empty(users.numel(), self.num_items, dtype=table.dtype, device=table.device)
        for position, first, length in consecutive_runs(users):
            items = table.narrow(0, first, length)  # (length, I, d), no copy
            if self.shared_table:
                items = items + global_state["item_emb"]
            w = head_w.narrow(0, first, length)
            b = head_b.narrow(0, first, length)
            out[position:position + length] = torch.einsum("nid,nd->ni", items, w) + b[:, None]
        return out
