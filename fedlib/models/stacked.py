"""Whole-model backbones for prediction-transfer federated recommendation.

In prediction-transfer methods (PTF-FedRec, FedKDRec) no parameter is ever aggregated:
every client owns a **complete** copy of the model (its own user vector, its own item
table, its own tower) and the server owns another one with a row for every user. What
travels are predictions. This module gives the three backbones of the FedKDRec paper in a
functional form with two entry points:

* ``client_*``: ``C`` client models at once, every tensor with a leading client axis
  (``item_emb (C, I, d)``, ``mlp0_w (C, out, in)``, ``user_emb (C, d)``);
* ``server_*``: one model with a user table ``(U, d)``, scoring ``(user, item)`` pairs.

Backbones (He et al. 2017, "Neural Collaborative Filtering", WWW; He et al. 2020,
"LightGCN", SIGIR):

* ``"neumf"``: GMF ``p_u ⊙ q_i`` and an MLP tower on ``[p_u'; q_i']`` with separate
  embeddings, fused by one output layer;
* ``"ncf"`` (the paper's "NeuNCF"): the MLP tower alone (``[128, 64]`` on ML-100K,
  ``[64, 128, 64]`` on ML-1M and Industrial);
* ``"lightgcn"``: 3 linear propagation layers, mean over layers, dot-product score. The
  server propagates over the graph of what it has been told (:meth:`Backbone.server_graph`).
  A client only knows its own interactions, so its graph is the star "user — its
  training items"; on a star the layer outputs have a closed form
  (:meth:`Backbone.client_lightgcn`), tested against the sparse propagation.

Init: embeddings ``N(0, σ²)`` (σ = 0.01 for NCF models, 0.1 for LightGCN, as the authors'
code), Glorot-uniform tower, LeCun-uniform output layer. ``item_init`` replaces the item
table(s) by a given ``(I, d)`` matrix (the paper's side-information initialisation).
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence

import torch

from fedlib.data.splits import Pairs
from fedlib.models.base import normal_
from fedlib.models.lightgcn import lightgcn_propagate, normalized_adjacency
from fedlib.models.ncf import _init_linear

__all__ = ["BACKBONES", "Backbone", "paper_hidden"]

BACKBONES = ("neumf", "ncf", "lightgcn")


def paper_hidden(kind: str, dataset: str) -> tuple:
    """The tower the FedKDRec paper states (App. D.3): NeuNCF ``[128, 64]`` on ML-100K,
    ``[64, 128, 64]`` elsewhere; NeuMF's tower is not stated, we use ``[64, 32, 16]``."""
    if kind == "ncf":
        return (128, 64) if dataset == "ml-100k" else (64, 128, 64)
    if kind == "neumf":
        return (64, 32, 16)
    return ()


class Backbone:
    """One backbone's maths, shared by the server and the clients (holds no parameters).

    Args:
        kind: ``"neumf"``, ``"ncf"`` or ``"lightgcn"``.
        num_users, num_items, dim: sizes (paper: ``d = 32``).
        hidden: MLP tower widths (input ``2d``); ignored by LightGCN.
        num_layers: LightGCN propagation layers (3).
    """

    def __init__(self, kind: str, num_users: int, num_items: int, dim: int = 32, hidden: Sequence[int] = (),
                 num_layers: int = 3):
        if kind not in BACKBONES:
            raise ValueError(f"backbone kind must be one of {BACKBONES}, got {kind!r}")
        if kind in ("neumf", "ncf") and not hidden:
            raise ValueError(f"{kind} needs an MLP tower: pass hidden=(...), e.g. paper_hidden({kind!r}, dataset)")
        self.kind, self.num_users, self.num_items, self.dim = kind, int(num_users), int(num_items), int(dim)
        self.hidden = tuple(int(h) for h in hidden) if kind != "lightgcn" else ()
        self.num_layers = int(num_layers)

    # ------------------------------------------------------------------ parameters
    @property
    def embedding_names(self) -> tuple:
        """(user tables, item tables) of this backbone."""
        if self.kind == "neumf":
            return ("user_emb", "user_emb_gmf"), ("item_emb", "item_emb_gmf")
        return ("user_emb",), ("item_emb",)

    def init_server(self, generator: torch.Generator, item_init: Optional[torch.Tensor] = None,
                    dtype=torch.float32, device="cpu") -> Dict[str, torch.Tensor]:
        """The server's initial model (also every client's starting copy).

        Returns name -> tensor: ``user_emb (U, d)``, ``item_emb (I, d)`` (NeuMF adds the
        ``_gmf`` pair), ``mlp{k}_w (out, in)``, ``mlp{k}_b (out,)``, ``head_w (h,)``, ``head_b ()``.
        """
        std = 0.1 if self.kind == "lightgcn" else 0.01
        user_names, item_names = self.embedding_names
        params = {}
        for name in user_names:
            params[name] = normal_((self.num_users, self.dim), std, generator, dtype, device)
        for name in item_names:
            params[name] = normal_((self.num_items, self.dim), std, generator, dtype, device)
            if item_init is not None:
                if tuple(item_init.shape) != (self.num_items, self.dim):
                    raise ValueError(f"item_init must be (num_items, dim) = {(self.num_items, self.dim)}, "
                                     f"got {tuple(item_init.shape)}")
                params[name] = item_init.to(dtype=dtype, device=device).clone()
        if self.kind != "lightgcn":
            fan_in = 2 * self.dim
            for k, width in enumerate(self.hidden):
                params[f"mlp{k}_w"], params[f"mlp{k}_b"] = _init_linear(fan_in, width, "ncf", generator, dtype, device)
                fan_in = width
            head_in = self.hidden[-1] + (self.dim if self.kind == "neumf" else 0)
            w, b = _init_linear(head_in, 1, "ncf", generator, dtype, device, output_layer=True)
            params["head_w"], params["head_b"] = w[0], b[0]
        return params

    def client_copies(self, server: Mapping[str, torch.Tensor], users: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Stacked copies of ``server`` for clients ``users (C,)``: each keeps its own user row.

        Returns user tables ``(C, d)`` and every other tensor with a leading ``C`` axis.
        """
        user_names, _ = self.embedding_names
        out = {}
        for name, value in server.items():
            if name in user_names:
                out[name] = value[users].clone()  # (C, d)
            else:
                out[name] = value.unsqueeze(0).expand(users.numel(), *value.shape).clone()  # (C, ...)
        return out

    # ------------------------------------------------------------------ the interaction function
    def _fuse(self, p: Mapping[str, torch.Tensor], user: torch.Tensor, item: torch.Tensor,
              user_gmf: Optional[torch.Tensor], item_gmf: Optional[torch.Tensor]) -> torch.Tensor:
        """Logits ``(C, B)`` from vectors ``(C, B, d)``; ``p`` holds tower weights with a ``C`` axis."""
        if self.kind == "lightgcn":
            return (user * item).sum(-1)
        hidden = torch.cat([user, item], dim=-1)  # (C, B, 2d)
        for k in range(len(self.hidden)):
            hidden = torch.relu(torch.baddbmm(p[f"mlp{k}_b"][:, None, :], hidden, p[f"mlp{k}_w"].transpose(1, 2)))
        if self.kind == "neumf":
            hidden = torch.cat([user_gmf * item_gmf, hidden], dim=-1)  # (C, B, d + h)
        return torch.baddbmm(p["head_b"][:, None, None], hidden, p["head_w"][:, :, None]).squeeze(-1)

    # ------------------------------------------------------------------ clients
    def _star(self, params: Mapping[str, torch.Tensor], own: torch.Tensor):
        """Final LightGCN embeddings on each client's star graph (closed form, 3 layers).

        On the star "user — its n training items" with ``Â = D^{-1/2} A D^{-1/2}`` (every
        item has degree 1 locally) the layers are ``e_u^{(1)} = Σ_j e_j^{(0)}/√n``,
        ``e_u^{(2)} = e_u^{(0)}``, ``e_u^{(3)} = e_u^{(1)}`` and, for an own item,
        ``e_i^{(k+1)} = e_u^{(k)}/√n``; items outside the star keep only layer 0. The mean
        over the 4 layers is then ``e_u = (e_u^{(0)} + e_u^{(1)})/2`` and
        ``e_i = e_i^{(0)}/4 + [i own]·(2 e_u^{(0)} + e_u^{(1)})/(4√n)``.

        Args:
            params: client models (``user_emb (C, d)``, ``item_emb (C, I, d)``).
            own: ``(C, I)`` 0/1 mask of each client's training items.
        Returns:
            ``(user_final (C, d), item_shift (C, d))``.
        """
        if self.num_layers != 3:
            raise ValueError("the client-side closed form is derived for LightGCN's 3 layers")
        counts = own.sum(1)  # (C,)
        if bool((counts < 1).any()):
            raise ValueError("every client needs at least one training item for its LightGCN star graph")
        inv_sqrt_n = counts.rsqrt()  # (C,)
        user0 = params["user_emb"]  # (C, d)
        user1 = torch.einsum("ci,cid->cd", own, params["item_emb"]) * inv_sqrt_n[:, None]  # (C, d)
        user_final = (user0 + user1) / 2  # mean of e0, e1, e0, e1
        item_shift = (2 * user0 + user1) * inv_sqrt_n[:, None] / 4  # added to own items' e_i^{(0)} / 4
        return user_final, item_shift

    def client_logits(self, params: Mapping[str, torch.Tensor], items: torch.Tensor,
                      own: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits ``(C, B)`` of client models ``params`` on items ``(C, B)``.

        ``own`` ``(C, I)`` 0/1 mask of each client's training items: LightGCN's star graph.
        """
        rows = torch.arange(items.shape[0], device=items.device)[:, None]  # (C, 1)
        if self.kind == "lightgcn":
            if own is None:
                raise ValueError("LightGCN clients need own=(C, I) masks of their training items")
            user, shift = self._star(params, own)
            item = params["item_emb"][rows, items] / 4 + own[rows, items][..., None] * shift[:, None, :]  # (C, B, d)
            return self._fuse(params, user[:, None, :], item, None, None)
        batch = items.shape[1]
        user = params["user_emb"][:, None, :].expand(-1, batch, -1)  # (C, B, d)
        item = params["item_emb"][rows, items]  # (C, B, d)
        user_gmf = item_gmf = None
        if self.kind == "neumf":
            user_gmf = params["user_emb_gmf"][:, None, :].expand(-1, batch, -1)
            item_gmf = params["item_emb_gmf"][rows, items]
        return self._fuse(params, user, item, user_gmf, item_gmf)

    def client_scores(self, params: Mapping[str, torch.Tensor], own: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``(C, I)`` logits of every item for every client model."""
        c = params["user_emb"].shape[0]
        items = torch.arange(self.num_items, device=params["user_emb"].device).expand(c, -1)
        return self.client_logits(params, items, own)

    # ------------------------------------------------------------------ server
    def server_graph(self, pairs: Pairs, device="cpu") -> Optional[torch.Tensor]:
        """LightGCN's normalised adjacency over ``pairs``, sparse CSR (``None`` for the other backbones).

        The server propagates over this graph in every training step; CSR with the symmetric
        backward (:func:`~fedlib.models.lightgcn.symmetric_spmm`) makes a step ~10x cheaper
        than a COO ``torch.sparse.mm``. Runs recorded before this change used COO: the same
        products, summed in another order (differences of ~1e-7 per layer).
        """
        if self.kind != "lightgcn":
            return None
        return normalized_adjacency(pairs, self.num_users, self.num_items, device=device, layout="csr")

    def server_embeddings(self, params: Mapping[str, torch.Tensor], graph: Optional[torch.Tensor]):
        """``(users (U, d), items (I, d))`` the server scores with (propagated for LightGCN)."""
        if self.kind == "lightgcn" and graph is not None:
            return lightgcn_propagate(graph, params["user_emb"], params["item_emb"], self.num_layers, symmetric=True)
        return params["user_emb"], params["item_emb"]

    def _server_tower(self, params):
        return {k: v.unsqueeze(0) for k, v in params.items() if k.startswith(("mlp", "head"))}

    def server_logits(self, params: Mapping[str, torch.Tensor], users: torch.Tensor, items: torch.Tensor,
                      graph: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits ``(B,)`` of the server model on pairs ``(users (B,), items (B,))``."""
        all_users, all_items = self.server_embeddings(params, graph)
        user, item = all_users[users][None], all_items[items][None]  # (1, B, d)
        user_gmf = item_gmf = None
        if self.kind == "neumf":
            user_gmf, item_gmf = params["user_emb_gmf"][users][None], params["item_emb_gmf"][items][None]
        return self._fuse(self._server_tower(params), user, item, user_gmf, item_gmf)[0]

    def server_pair_scores(self, params: Mapping[str, torch.Tensor], users: torch.Tensor, items: torch.Tensor,
                           graph: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``(n, K)`` server logits of ``items (n, K)`` for ``users (n,)`` (e.g. 1 + 99 candidates)."""
        n, k = items.shape
        flat_users = users[:, None].expand(n, k).reshape(-1)
        return self.server_logits(params, flat_users, items.reshape(-1), graph).view(n, k)

    def server_scores(self, params: Mapping[str, torch.Tensor], users: torch.Tensor,
                      graph: Optional[torch.Tensor] = None, chunk: int = 64) -> torch.Tensor:
        """``(n, I)`` server logits of every item for ``users (n,)``.

        The tower's first layer is split, ``W [e_u; e_i] + b = W_u e_u + (W_i e_i + b)``, so the
        item half is computed once for all users instead of once per (user, item) pair, and
        NeuMF's GMF term ``(p_u ⊙ q_i)·h_g`` is one matrix product ``p_u (q_i ⊙ h_g)ᵀ``. Same
        logits as :meth:`server_pair_scores` up to float rounding (the sums run in another
        order; ``test_server_scores_equal_pairwise_logits``). Ranking every item for every user
        (evaluation, the server's selection) costs about half of the unsplit form.

        ``chunk`` users at a time, each user's logits computed alone: the chunk sets the size of the
        ``(chunk, I, h0)`` intermediate, and 64 keeps it near the cache (ML-100K, NeuMF, all 943
        users: 0.76 CPU-s with 256, 0.28 with 64, the same bits; 16 and 32 are no faster). A chunk
        of a few users may take another GEMM kernel, so logits can differ by float rounding from
        one chunk size to another (``test_server_scores_do_not_depend_on_the_chunk``, float64).
        """
        all_users, all_items = self.server_embeddings(params, graph)
        if self.kind == "lightgcn":
            return all_users[users] @ all_items.T
        d, last = self.dim, len(self.hidden) - 1
        first_w = params["mlp0_w"]                                               # (h0, 2d)
        item_first = torch.addmm(params["mlp0_b"], all_items, first_w[:, d:].T)  # (I, h0)
        user_first = all_users[users] @ first_w[:, :d].T                        # (n, h0)
        head_mlp = params["head_w"][-self.hidden[-1]:]                          # (h_last,)
        if self.kind == "neumf":
            gmf_items = params["item_emb_gmf"] * params["head_w"][:d]             # (I, d)
            gmf_users = params["user_emb_gmf"][users]                            # (n, d)
        out = []
        for start in range(0, users.numel(), chunk):
            n = min(chunk, users.numel() - start)
            hidden = torch.relu(user_first[start:start + n, None, :] + item_first[None])  # (n, I, h0)
            for k in range(1, last + 1):
                hidden = torch.relu(torch.addmm(params[f"mlp{k}_b"], hidden.reshape(-1, hidden.shape[-1]),
                                                params[f"mlp{k}_w"].T)).view(n, self.num_items, -1)  # (n, I, h_k)
            logits = hidden @ head_mlp + params["head_b"]                       # (n, I)
            if self.kind == "neumf":
                logits = logits + gmf_users[start:start + n] @ gmf_items.T      # (n, I)
            out.append(logits)
        return torch.cat(out, 0)

    def num_parameters(self) -> int:
        """Parameters of one client model (one user row), for communication accounting."""
        g = torch.Generator().manual_seed(0)
        params = self.init_server(g)
        user_names, _ = self.embedding_names
        return sum(v[0].numel() if k in user_names else v.numel() for k, v in params.items())

    def __repr__(self) -> str:
        return f"Backbone({self.kind!r}, users={self.num_users}, items={self.num_items}, d={self.dim}, hidden={self.hidden})"
