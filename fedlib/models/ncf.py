"""Neural collaborative filtering (GMF, MLP, NeuMF) and its federated form FedNCF.

References:
    He, Liao, Zhang, Nie, Hu, Chua. "Neural Collaborative Filtering." WWW 2017.
    arXiv:1708.05031. GMF ``h·(p_u ⊙ q_i)``, MLP tower on ``[p_u; q_i]``, NeuMF = both with
    separate embeddings and one output layer. Init (their Keras code): embeddings
    ``N(0, 0.01²)``, tower Glorot-uniform, output layer LeCun-uniform, zero biases.
    Perifanis, Efraimidis. "Federated Neural Collaborative Filtering." Knowledge-Based
    Systems 242, 2022. arXiv:2106.04405. User embeddings stay private; item embeddings,
    the tower and the output layer are public and averaged (FedAvg).
    F3CRec's "fedmlp" variant (Lim et al., CIKM 2025; the authors' code
    https://github.com/Jaehyung-Lim/F3CRec-CIKM-25, ``fcrec/baseline/fedmlp/``): user vector
    + a **one-layer** head ``Linear(2d → 1)`` on ``[p_u; q_i]`` that is
    kept **private**; only the item table is aggregated; PyTorch default inits
    (``nn.Embedding`` ``N(0, 1)``, ``nn.Linear`` ``U(±1/√fan_in)``). Build it with
    :meth:`FedNCF.f3crec_variant`.

Learning rates in F3CRec's code: head ``lr``, user ``lr × lr_eta``, items
``lr × num_items × lr_eta`` (``lr_eta`` = 170).
"""
from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

import torch
from torch import nn

from fedlib.models.base import FederatedModel, normal_, torch_linear_init, uniform_

__all__ = ["FedNCF", "GMF", "MLP", "NeuMF"]

_VARIANTS = ("gmf", "mlp", "neumf")
_INITS = ("ncf", "torch_default")


def _init_linear(fan_in, fan_out, scheme, generator, dtype, device, output_layer=False):
    """``(W (out, in), b (out,))`` for one layer under the chosen init scheme."""
    if scheme == "torch_default":
        return torch_linear_init(fan_in, fan_out, generator, dtype, device)
    # He et al.: Glorot-uniform hidden layers, LeCun-uniform output layer, zero bias.
    bound = math.sqrt(3.0 / fan_in) if output_layer else math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_((fan_out, fan_in), bound, generator, dtype, device), torch.zeros(fan_out, dtype=dtype, device=device)


class FedNCF(FederatedModel):
    """Federated GMF / MLP / NeuMF.

    Args:
        num_users, num_items, dim: id spaces and embedding size ``d``.
        variant: ``"gmf"``, ``"mlp"`` or ``"neumf"``.
        hidden: sizes of the MLP tower's hidden layers (input ``2d``); ``()`` = no tower, the
            head reads ``[p_u; q_i]`` directly (F3CRec).
        private_head: keep the output layer private (F3CRec) instead of public (FedNCF).
        init: ``"ncf"`` (He et al.) or ``"torch_default"`` (F3CRec's code).

    Parameters (shapes as stored; dense ones get a leading client axis in :meth:`logits`):
        ``user_emb`` private ``(num_users, d)``; ``user_emb_gmf`` (NeuMF only);
        ``item_emb`` public rows ``(num_items, d)``; ``item_emb_gmf`` (NeuMF only);
        ``mlp{k}_w (out, in)``, ``mlp{k}_b (out,)`` public; ``head_w (h,)``, ``head_b ()``
        public, or ``(num_users, h)``, ``(num_users,)`` when private.

    A private head starts equal for every user (each client is a copy of one initial
    model in the reference code); user embeddings are independent draws.
    """

    def __init__(self, num_users: int, num_items: int, dim: int = 32, variant: str = "neumf",
                 hidden: Sequence[int] = (64, 32, 16), private_head: bool = False, init: str = "ncf"):
        if variant not in _VARIANTS:
            raise ValueError(f"variant must be one of {_VARIANTS}")
        if init not in _INITS:
            raise ValueError(f"init must be one of {_INITS}")
        self.num_users, self.num_items, self.dim = int(num_users), int(num_items), int(dim)
        self.variant, self.hidden, self.private_head, self.init = variant, tuple(int(h) for h in hidden), bool(private_head), init
        if variant == "gmf":
            self.hidden = ()
        kinds = {"user_emb": "private_dense", "item_emb": "public_rows"}
        if variant == "neumf":
            kinds.update({"user_emb_gmf": "private_dense", "item_emb_gmf": "public_rows"})
        for k in range(len(self.hidden)):
            kinds[f"mlp{k}_w"] = "public_dense"
            kinds[f"mlp{k}_b"] = "public_dense"
        head_kind = "private_dense" if private_head else "public_dense"
        kinds.update({"head_w": head_kind, "head_b": head_kind})
        self.param_kinds = kinds

    @classmethod
    def f3crec_variant(cls, num_users: int, num_items: int, dim: int = 32) -> "FedNCF":
        """F3CRec's "fedmlp": ``Linear(2d → 1)`` private head on ``[p_u; q_i]``, torch inits."""
        return cls(num_users, num_items, dim, variant="mlp", hidden=(), private_head=True, init="torch_default")

    @property
    def _head_in(self) -> int:
        tower_out = self.hidden[-1] if self.hidden else 2 * self.dim
        return {"gmf": self.dim, "mlp": tower_out, "neumf": self.dim + tower_out}[self.variant]

    def _emb_std(self):
        return 0.01 if self.init == "ncf" else 1.0

    def init_global(self, generator, dtype=torch.float32, device="cpu"):
        state = {"item_emb": normal_((self.num_items, self.dim), self._emb_std(), generator, dtype, device)}
        if self.variant == "neumf":
            state["item_emb_gmf"] = normal_((self.num_items, self.dim), self._emb_std(), generator, dtype, device)
        fan_in = 2 * self.dim
        for k, width in enumerate(self.hidden):
            state[f"mlp{k}_w"], state[f"mlp{k}_b"] = _init_linear(fan_in, width, self.init, generator, dtype, device)
            fan_in = width
        if not self.private_head:
            w, b = _init_linear(self._head_in, 1, self.init, generator, dtype, device, output_layer=True)
            state["head_w"], state["head_b"] = w[0], b[0]  # (h,), ()
        return state

    def init_private(self, generator, dtype=torch.float32, device="cpu"):
        state = {"user_emb": normal_((self.num_users, self.dim), self._emb_std(), generator, dtype, device)}
        if self.variant == "neumf":
            state["user_emb_gmf"] = normal_((self.num_users, self.dim), self._emb_std(), generator, dtype, device)
        if self.private_head:
            w, b = _init_linear(self._head_in, 1, self.init, generator, dtype, device, output_layer=True)
            state["head_w"] = w[0].expand(self.num_users, -1).clone()  # (U, h): one shared draw
            state["head_b"] = b[0].expand(self.num_users).clone()  # (U,)
        return state

    def logits(self, params: Mapping[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        num_batch = rows.shape[1]
        features = []
        if self.variant in ("gmf", "neumf"):
            user_gmf = params["user_emb_gmf" if self.variant == "neumf" else "user_emb"]  # (C, d)
            item_gmf = params["item_emb_gmf" if self.variant == "neumf" else "item_emb"][rows]  # (C, B, d)
            features.append(user_gmf[:, None, :] * item_gmf)  # (C, B, d)
        if self.variant in ("mlp", "neumf"):
            user = params["user_emb"][:, None, :].expand(-1, num_batch, -1)  # (C, B, d)
            hidden = torch.cat([user, params["item_emb"][rows]], dim=-1)  # (C, B, 2d)
            for k in range(len(self.hidden)):
                weight, bias = params[f"mlp{k}_w"], params[f"mlp{k}_b"]  # (C, out, in), (C, out)
                hidden = torch.relu(torch.einsum("cbi,coi->cbo", hidden, weight) + bias[:, None, :])
            features.append(hidden)  # (C, B, h_last)
        x = features[0] if len(features) == 1 else torch.cat(features, dim=-1)  # (C, B, h)
        return torch.einsum("cbh,ch->cb", x, params["head_w"]) + params["head_b"][:, None]  # (C, B)

    #: (user, item) pairs scored at once by :meth:`score_users`: the ``(n, I, h0)`` first-layer
    #: activations of a chunk stay around 2 MB instead of ~200 MB for 128 users on LastFM-2K
    #: (one FedRKG LastFM-2K scoring pass: 1.0-1.2 CPU-s for 4k-32k pairs, 1.3 for 131k).
    score_pairs_per_chunk = 16384

    def score_users(self, global_state, private_state, users, chunk: Optional[int] = None):
        """``(n, I)`` logits of every item for ``users`` ``(n,)`` (the shared item table).

        :meth:`split_scores` on chunks of users: the same logits as :meth:`logits` on every
        (user, item) pair (:meth:`score_users_reference`) up to float rounding.
        ``chunk``: users per chunk (default: about :attr:`score_pairs_per_chunk` pairs).
        """
        chunk = self._users_per_chunk(chunk)
        item_first = self.item_first_layer(global_state)  # (I, h0), once for all users
        out = []
        for start in range(0, users.numel(), chunk):
            block = users[start:start + chunk]
            params = {}
            for name, kind in self.param_kinds.items():
                params[name] = private_state[name][block] if kind == "private_dense" else global_state[name]
            out.append(self.split_scores(params, block.numel(), item_first))
        if not out:
            return global_state["item_emb"].new_zeros((0, self.num_items))
        return torch.cat(out, 0)  # (n, I)

    def _users_per_chunk(self, chunk=None) -> int:
        if chunk is not None:
            if int(chunk) < 1:
                raise ValueError(f"chunk (users scored at once) must be >= 1, got {chunk}")
            return int(chunk)
        return max(1, self.score_pairs_per_chunk // max(1, self.num_items))

    def item_first_layer(self, tables: Mapping[str, torch.Tensor]):
        """Item half of the tower's first layer, ``item_emb W0[:, d:]ᵀ``: ``(..., I, h0)``.

        ``tables["item_emb"]`` is ``(I, d)`` (shared) or ``(n, I, d)`` (one table per user);
        ``None`` without a tower (``variant="gmf"`` or ``hidden=()``).
        """
        if self.variant == "gmf" or not self.hidden:
            return None
        return torch.matmul(tables["item_emb"], tables["mlp0_w"][:, self.dim:].T)

    def split_scores(self, params: Mapping[str, torch.Tensor], n: int, item_first=None) -> torch.Tensor:
        """``(n, I)`` logits of every item for ``n`` users, the first layer split by input halves.

        ``W0 [p_u; q_i] + b0 = (W0[:, :d] p_u + b0) + W0[:, d:] q_i``: the user half is computed
        once per user, the item half once per item (or once per user's row when each user has
        its own table) and the two are broadcast-added, instead of concatenating and
        multiplying every pair (half the multiply-adds of the first layer, no ``(n, I, 2d)``
        concatenation, no per-pair copy of the weights). Without a tower the head splits the
        same way; GMF's ``h_g · (p_u ⊙ q_i)`` is ``(p_u ⊙ h_g) · q_i``, one matrix product.

        Args:
            params: ``user_emb (n, d)`` (and ``user_emb_gmf``); ``item_emb`` (and
                ``item_emb_gmf``) ``(I, d)`` shared or ``(n, I, d)`` per user; tower weights as
                stored ``mlp{k}_w (out, in)``, ``mlp{k}_b (out,)``; ``head_w (h,)``,
                ``head_b ()`` public or ``(n, h)``, ``(n,)`` private.
            n: number of users.
            item_first: :meth:`item_first_layer` ``(I, h0)`` of a shared ``item_emb``, computed
                once for all chunks (``None`` for per-user tables: computed here).

        Returns:
            ``(n, I)`` logits.
        """
        head_w, head_b = params["head_w"], params["head_b"]
        head_w = head_w.expand(n, -1) if head_w.dim() == 1 else head_w  # (n, h)
        logits = None  # (n, I)
        offset = 0  # columns of head_w already used (GMF's d come first in NeuMF)
        if self.variant in ("gmf", "neumf"):
            suffix = "_gmf" if self.variant == "neumf" else ""
            weighted_users = params["user_emb" + suffix] * head_w[:, :self.dim]  # (n, d)
            logits = _rows_times_items(weighted_users, params["item_emb" + suffix])  # (n, I)
            offset = self.dim
        if self.variant in ("mlp", "neumf"):
            user = params["user_emb"]  # (n, d)
            if not self.hidden:  # the head reads [p_u; q_i] directly
                mlp = (user * head_w[:, offset:offset + self.dim]).sum(-1, keepdim=True) \
                    + _rows_times_items(head_w[:, offset + self.dim:], params["item_emb"])  # (n, I)
            else:
                user_first = torch.addmm(params["mlp0_b"], user, params["mlp0_w"][:, :self.dim].T)  # (n, h0)
                if item_first is not None:  # shared item half (I, h0): broadcast-add the user half
                    hidden = torch.relu_(item_first + user_first[:, None, :])  # (n, I, h0)
                else:  # per-user tables (n, I, d): the user half enters as the product's bias
                    item_weight = params["mlp0_w"][:, self.dim:].T  # (d, h0)
                    hidden = torch.relu_(torch.baddbmm(user_first[:, None, :], params["item_emb"],
                                                       item_weight.expand(n, *item_weight.shape)))  # (n, I, h0)
                for k in range(1, len(self.hidden)):
                    flat = torch.addmm(params[f"mlp{k}_b"], hidden.reshape(-1, hidden.shape[-1]), params[f"mlp{k}_w"].T)
                    hidden = torch.relu_(flat).view(n, -1, self.hidden[k])  # (n, I, h_k)
                if params["head_w"].dim() == 1:  # public head: one matrix-vector product
                    mlp = (hidden.reshape(-1, hidden.shape[-1]) @ params["head_w"][offset:]).view(n, -1)  # (n, I)
                else:
                    mlp = torch.matmul(hidden, head_w[:, offset:, None]).squeeze(-1)  # (n, I)
            logits = mlp if logits is None else logits + mlp
        bias = head_b if head_b.dim() == 0 else head_b[:, None]
        return logits + bias  # (n, I)

    def score_users_reference(self, global_state, private_state, users, chunk: int = 128):
        """:meth:`score_users` through :meth:`logits` on every (user, item) pair: the plain form
        the split scoring is tested against (``tests/test_ncf_scoring.py``)."""
        out = []
        for start in range(0, users.numel(), chunk):
            block = users[start:start + chunk]
            n = block.numel()
            params = {}
            for name, kind in self.param_kinds.items():
                if kind == "private_dense":
                    params[name] = private_state[name][block]  # (n, ...)
                elif kind == "public_dense":
                    params[name] = global_state[name].unsqueeze(0).expand(n, *global_state[name].shape)
                else:
                    params[name] = global_state[name]
            rows = torch.arange(self.num_items, device=block.device).unsqueeze(0).expand(n, -1)  # (n, I)
            out.append(self.logits(params, rows))
        return torch.cat(out, 0)  # (n, I)


def _rows_times_items(vectors: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """``(n, I)``: each user's vector ``(n, d)`` dotted with every item row of ``items``,
    a shared table ``(I, d)`` or one table per user ``(n, I, d)``."""
    if items.dim() == 2:
        return vectors @ items.T
    return torch.matmul(items, vectors[:, :, None]).squeeze(-1)


# -- centralised forms (He et al. 2017) -------------------------------------------------
class _CentralNCF(nn.Module):
    """Centralised GMF/MLP/NeuMF sharing :class:`FedNCF`'s maths and inits."""

    def __init__(self, num_users, num_items, dim, variant, hidden, init, generator):
        super().__init__()
        generator = generator if generator is not None else torch.Generator().manual_seed(0)
        self.spec = FedNCF(num_users, num_items, dim, variant, hidden, private_head=False, init=init)
        params = {**self.spec.init_private(generator), **self.spec.init_global(generator)}
        self.params = nn.ParameterDict({k: nn.Parameter(v) for k, v in params.items()})

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """``(B,)`` logits of the pairs ``(users (B,), items (B,))``.

        :meth:`FedNCF.logits` with every example a one-row client, written with the shared
        tower as plain matrix products: the per-client form broadcasts every tower weight to
        ``(B, out, in)`` and its backward materialises a weight gradient per example, which
        made centralised NeuMF ~5x slower. Same values and gradients up to float rounding
        (``test_central_ncf_forward_equals_the_per_client_form``).
        """
        p, variant = self.params, self.spec.variant
        features = []
        if variant in ("gmf", "neumf"):
            suffix = "_gmf" if variant == "neumf" else ""
            features.append(p["user_emb" + suffix][users] * p["item_emb" + suffix][items])  # (B, d)
        if variant in ("mlp", "neumf"):
            hidden = torch.cat([p["user_emb"][users], p["item_emb"][items]], dim=-1)  # (B, 2d)
            for k in range(len(self.spec.hidden)):
                hidden = torch.relu(nn.functional.linear(hidden, p[f"mlp{k}_w"], p[f"mlp{k}_b"]))  # (B, h_k)
            features.append(hidden)
        x = features[0] if len(features) == 1 else torch.cat(features, dim=-1)  # (B, h)
        return x @ p["head_w"] + p["head_b"]  # (B,)

    def per_client_forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` through :meth:`FedNCF.logits` itself (the reference the tests compare with)."""
        b = users.numel()
        p = {}
        for name, kind in self.spec.param_kinds.items():
            t = self.params[name]
            if kind == "private_dense":
                p[name] = t[users]  # (B, ...)
            elif kind == "public_dense":
                p[name] = t.unsqueeze(0).expand(b, *t.shape)
            else:
                p[name] = t
        return self.spec.logits(p, items.view(b, 1)).view(b)

    def score_users(self, users):
        g = {k: v for k, v in self.params.items() if k not in self.spec.private_names}
        return self.spec.score_users(g, dict(self.params), users)


class GMF(_CentralNCF):
    """Generalised MF: logit ``h · (p_u ⊙ q_i) + b``."""

    def __init__(self, num_users, num_items, dim=32, init="ncf", generator=None):
        super().__init__(num_users, num_items, dim, "gmf", (), init, generator)


class MLP(_CentralNCF):
    """MLP tower on ``[p_u; q_i]`` then ``Linear(h → 1)``."""

    def __init__(self, num_users, num_items, dim=32, hidden=(64, 32, 16), init="ncf", generator=None):
        super().__init__(num_users, num_items, dim, "mlp", hidden, init, generator)


class NeuMF(_CentralNCF):
    """GMF and MLP with separate embeddings fused by one output layer."""

    def __init__(self, num_users, num_items, dim=32, hidden=(64, 32, 16), init="ncf", generator=None):
        super().__init__(num_users, num_items, dim, "neumf", hidden, init, generator)
