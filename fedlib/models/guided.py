r"""Backbones in their *guided* form: the item table made personal, for FedRKG's guidance.

References:
    FedRKG, "Federated Recommendation with Knowledge Guidance" (Lim et al.,
    https://openreview.net/forum?id=oj2Xj8WXih, arXiv:2511.12959): §6.3
    "Model Agnosticism" and Table 3 (Adaptive Guidance on FedMF, FedNCF and PFedRec, the
    "w/ AG" rows), Appendix C.1 (the backbones) and C.2 (their scoring functions). Its public
    code (https://github.com/Jaehyung-Lim/fedrkg) only ships the FedMF backbone; its local
    recipe is in that code's ``main.py`` and ``models/fedrkg.py``.
    Chai, Wang, Chen, Yang. "Secure Federated Matrix Factorization" (FedMF). IEEE Intelligent
    Systems 36(5), 2021. arXiv:1906.05108.
    Perifanis, Efraimidis. "Federated Neural Collaborative Filtering" (FedNCF).
    Knowledge-Based Systems 242, 2022. arXiv:2106.04405. He, Liao, Zhang, Nie, Hu, Chua.
    "Neural Collaborative Filtering." WWW 2017. arXiv:1708.05031.
    Zhang, Liu, Jiang, Guo, Zhang. "Dual Personalization on Federated Recommendation"
    (PFedRec). IJCAI 2023. arXiv:2301.08143.

FedRKG gives every user ``u`` a personal item table ``P_u ∈ R^{I×d}`` in place of the
backbone's shared item table ``Q``, and periodically guides it toward the mean ``P_g``
(:mod:`fedlib.methods.fedrkg`). The guided form of a backbone is therefore the backbone with
``Q[i]`` replaced by ``P_u[i]`` in its score, every other parameter keeping its role:

* ``"FedMF"``: unguided ``p_u · Q[i]`` (:class:`~fedlib.models.FedMF`); guided, as FedRKG's
  code, ``w_u · P_u[i] + b_u``: the user vector is a private ``Linear(d → 1)`` head with a
  bias (:class:`~fedlib.models.PersonalItemTableModel` with ``shared_table=False``, as is).
* ``"FedNCF"``: unguided ``h · MLP([p_u ; Q[i]]) + c`` (:class:`~fedlib.models.FedNCF`);
  guided ``h · MLP([p_u ; P_u[i]]) + c`` (:class:`GuidedFedNCF`).
* ``"PFedRec"``: unguided ``w_u · f_u(Q[i]) + b_u`` (:class:`~fedlib.models.PFedRec`, ``f_u``
  the identity); guided ``w_u · f_u(P_u[i]) + b_u`` (:class:`GuidedPFedRec`).

Parameter roles in the guided forms: ``personal_item_emb`` is ``private_rows`` ``(U, I, d)``
(never aggregated by the engine; only FedRKG's guidance reads and writes it), FedNCF's user
vector stays private and its MLP tower and output layer stay public (FedAvg-aggregated),
PFedRec's score function stays private. Every user starts from **one shared draw** of the
table with the backbone's own item-init std (FedRKG's clients are copies of one model):
``N(0, 1)`` for FedMF and PFedRec (``nn.Embedding``), ``N(0, 0.01²)`` for FedNCF with He et
al.'s init (``init="ncf"``) or ``N(0, 1)`` with ``init="torch_default"``.

Backbone definitions taken from the paper (Appendix C.2), and where this module departs:

* FedMF: the paper writes ``r_ui = e_u P_ui``; the code's head is ``Linear(d → 1)`` with a
  bias and ``U(±1/√d)`` init. :class:`~fedlib.models.PersonalItemTableModel` follows the code
  (with ``b_u = 0`` and ``w_u = p_u`` it is FedMF's score on personal rows).
* FedNCF: Appendix C.1 calls it "the federated version of NeuMF", but C.2 specifies only
  "a 2-layer MLP for the scoring function with architecture 64 → 32 → 1": read here as the
  MLP tower on ``[p_u ; q_i]`` (``2d = 64``), i.e. :class:`~fedlib.models.FedNCF` with
  ``variant="mlp"``, ``hidden=(32,)`` (the defaults of :func:`guided_backbone`). The GMF
  variant (one item table) is accepted too; NeuMF is not: its two item tables would need two
  personal tables and two gates, which the paper does not describe.
* PFedRec: the paper's appendix says "a personalized 2-layer MLP for scoring, with dimensions
  32 → 16 → 1" while PFedRec's public code (and :class:`~fedlib.models.PFedRec`) scores with
  a single ``Linear(d → 1)``. ``hidden=()`` (default) is the latter, so the guided form matches
  the library's unguided PFedRec; ``hidden=(16,)`` is the appendix's private ReLU MLP.

Learning rates (:func:`fedlib.methods.guided.guided_method`, FedRKG's code recipe for every
backbone): item tables ``lr × I × lr_eta`` (``0.1 × I × 80``), every other parameter ``lr`` (the code's
``lr_u = lr`` for a user vector, scaled by ``user_lr_scale``), plain SGD, each update step's
gradient clipped to norm 1 per client (the code's ``clip_grad_norm_(params, 1.0)``). PFedRec
keeps its two steps per batch (score function, then the item table), each clipped on its own.
"""
from __future__ import annotations

from typing import Mapping, Sequence, Tuple

import torch

from fedlib.models.base import FederatedModel, normal_, torch_linear_init
from fedlib.models.ncf import FedNCF
from fedlib.models.personal import PersonalItemTableModel

__all__ = [
    "PERSONAL_TABLE", "GUIDED_BACKBONES", "GuidedFedNCF", "GuidedPFedRec", "guided_backbone",
    "check_guided_model", "backbone_name",
]

#: Name of the personal item table ``P_u`` in every guided model (``private_rows``, ``(U, I, d)``).
PERSONAL_TABLE = "personal_item_emb"
#: Backbones of the paper's Table 3, as accepted by :func:`guided_backbone`.
GUIDED_BACKBONES = ("FedMF", "FedNCF", "PFedRec")

# Keyword options each backbone's constructor takes besides (num_users, num_items, dim).
_OPTIONS = {
    "FedMF": ("init_std",),
    "FedNCF": ("variant", "hidden", "private_head", "init"),
    "PFedRec": ("hidden", "item_init_std"),
}


class _PersonalTableBackbone(FederatedModel):
    """Shared parts of the guided forms: whole-catalogue scoring through :meth:`logits`.

    Subclasses set ``param_kinds`` (with :data:`PERSONAL_TABLE` as the only row table),
    ``num_users``, ``num_items``, ``dim`` and implement :meth:`logits`.
    """

    backbone_name = ""
    #: users scored together in :meth:`score_users` (bounds the ``(n, I, hidden)`` activations)
    score_chunk = 128

    def score_users(self, global_state, private_state, users: torch.Tensor) -> torch.Tensor:
        """``(n, I)`` logits of every item for ``users`` ``(n,)``, each with its own table ``P_u``.

        The ``n`` users' tables are flattened into one ``(n·I, d)`` table that the row index
        ``(n, I)`` (user ``k`` reads rows ``k·I … k·I + I − 1``) hands to :meth:`logits`, so
        the score is exactly the training score.
        """
        out = []
        for start in range(0, users.numel(), self.score_chunk):
            block = users[start:start + self.score_chunk]
            n = block.numel()
            params = {}
            for name, kind in self.param_kinds.items():
                if kind == "private_rows":
                    params[name] = private_state[name][block].reshape(n * self.num_items, -1)  # (n·I, d)
                elif kind == "private_dense":
                    params[name] = private_state[name][block]  # (n, ...)
                else:  # public_dense: one copy per scored user
                    params[name] = global_state[name].unsqueeze(0).expand(n, *global_state[name].shape)
            rows = torch.arange(n * self.num_items, device=block.device).view(n, self.num_items)  # (n, I)
            out.append(self.logits(params, rows))
        if not out:
            return private_state[PERSONAL_TABLE].new_zeros((0, self.num_items))
        return torch.cat(out, 0)  # (n, I)


class GuidedFedNCF(_PersonalTableBackbone):
    """FedNCF with a personal item table: ``s_ui = h · ReLU-MLP([p_u ; P_u[i]]) + c``.

    The score is :class:`~fedlib.models.FedNCF`'s own :meth:`~fedlib.models.FedNCF.logits`
    with the shared table ``item_emb`` replaced by the user's rows of ``personal_item_emb``.

    Args:
        num_users, num_items, dim: ``U``, ``I``, ``d``.
        variant: ``"mlp"`` (FedRKG's FedNCF, default) or ``"gmf"``; ``"neumf"`` is refused.
        hidden: tower sizes after the ``2d`` input; default ``(32,)``: the paper's
            ``64 → 32 → 1`` at ``d = 32``.
        private_head: keep the output layer private (F3CRec's variant) instead of public.
        init: ``"ncf"`` (He et al.: item/user ``N(0, 0.01²)``, Glorot tower, default, as
            :class:`~fedlib.models.FedNCF`) or ``"torch_default"`` (``N(0, 1)``, ``U(±1/√fan_in)``).

    Parameters (``param_kinds``, stored shapes): ``user_emb`` private ``(U, d)``;
    ``personal_item_emb`` private rows ``(U, I, d)``; ``mlp{k}_w (out, in)``, ``mlp{k}_b (out,)``
    public; ``head_w (h,)``, ``head_b ()`` public (``(U, h)``, ``(U,)`` when ``private_head``).
    """

    backbone_name = "FedNCF"

    def __init__(self, num_users: int, num_items: int, dim: int = 32, variant: str = "mlp",
                 hidden: Sequence[int] = (32,), private_head: bool = False, init: str = "ncf"):
        if variant == "neumf":
            raise ValueError("the guided FedNCF supports variant 'mlp' (FedRKG's FedNCF) or 'gmf': NeuMF has two "
                             "item tables (item_emb and item_emb_gmf), while FedRKG guides one personal table")
        self.base = FedNCF(num_users, num_items, dim, variant=variant, hidden=hidden, private_head=private_head,
                           init=init)
        self.num_users, self.num_items, self.dim = self.base.num_users, self.base.num_items, self.base.dim
        self.variant, self.hidden, self.private_head, self.init = variant, self.base.hidden, bool(private_head), init
        self.init_std = self.base._emb_std()
        # FedNCF's roles, in FedNCF's order, with the shared table swapped for the personal one.
        self.param_kinds = {(PERSONAL_TABLE if name == "item_emb" else name): ("private_rows" if name == "item_emb"
                                                                                else kind)
                            for name, kind in self.base.param_kinds.items()}

    def init_global(self, generator, dtype=torch.float32, device="cpu"):
        """FedNCF's public tower and head (its shared item table is drawn, then dropped)."""
        state = self.base.init_global(generator, dtype=dtype, device=device)
        del state["item_emb"]  # replaced by the personal tables of init_private
        return state

    def init_private(self, generator, dtype=torch.float32, device="cpu"):
        """One ``N(0, init_std²)`` table ``(I, d)`` copied to every user, then FedNCF's private parts."""
        table = normal_((self.num_items, self.dim), self.init_std, generator, dtype, device)
        state = {PERSONAL_TABLE: table.unsqueeze(0).repeat(self.num_users, 1, 1)}  # (U, I, d)
        state.update(self.base.init_private(generator, dtype=dtype, device=device))
        return state

    def logits(self, params: Mapping[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        """``(C, B)``: dense parameters ``(C, ...)``, ``personal_item_emb`` a row table ``(R, d)``."""
        base_params = {("item_emb" if name == PERSONAL_TABLE else name): tensor for name, tensor in params.items()}
        return self.base.logits(base_params, rows)


class GuidedPFedRec(_PersonalTableBackbone):
    """PFedRec with a personal item table: ``s_ui = w_u · f_u(P_u[i]) + b_u``, all private.

    ``f_u`` is the identity for ``hidden=()`` (PFedRec's code and
    :class:`~fedlib.models.PFedRec`: a ``Linear(d → 1)`` score head), else a private ReLU MLP
    ``d → hidden[0] → … `` (``hidden=(16,)``: the appendix's ``32 → 16 → 1``). Two SGD steps
    per batch (:attr:`update_steps`): the score function first, then the item table.

    Args:
        num_users, num_items, dim: ``U``, ``I``, ``d``.
        hidden: hidden sizes of the private score MLP (default ``()``).
        item_init_std: std of the shared initial table (``nn.Embedding``: 1).

    Parameters (``param_kinds``, stored shapes): ``personal_item_emb`` private rows
    ``(U, I, d)``; ``mlp{k}_w (U, out, in)``, ``mlp{k}_b (U, out)``, ``head_w (U, h)``,
    ``head_b (U,)`` private dense. Every user starts from one shared draw of all of them
    (layers with ``nn.Linear``'s ``U(±1/√fan_in)``).
    """

    backbone_name = "PFedRec"

    def __init__(self, num_users: int, num_items: int, dim: int = 32, hidden: Sequence[int] = (),
                 item_init_std: float = 1.0):
        self.num_users, self.num_items, self.dim = int(num_users), int(num_items), int(dim)
        self.hidden = tuple(int(h) for h in hidden)
        if any(h < 1 for h in self.hidden):
            raise ValueError(f"hidden layer sizes must be >= 1, got {tuple(hidden)}")
        self.init_std = self.item_init_std = float(item_init_std)
        kinds = {PERSONAL_TABLE: "private_rows"}
        for k in range(len(self.hidden)):
            kinds[f"mlp{k}_w"] = kinds[f"mlp{k}_b"] = "private_dense"
        kinds["head_w"] = kinds["head_b"] = "private_dense"
        self.param_kinds = kinds

    @property
    def update_steps(self) -> Tuple[Tuple[str, ...], ...]:
        """PFedRec's two steps per batch: the score function, then (loss recomputed) the items."""
        return tuple(name for name in self.param_kinds if name != PERSONAL_TABLE), (PERSONAL_TABLE,)

    def init_global(self, generator, dtype=torch.float32, device="cpu"):
        return {}

    def init_private(self, generator, dtype=torch.float32, device="cpu"):
        # Drawn in PFedRec's order (item table, then score function): with hidden=() the same
        # generator gives PFedRec's initial item table and head.
        users = self.num_users
        table = normal_((self.num_items, self.dim), self.item_init_std, generator, dtype, device)
        state = {PERSONAL_TABLE: table.unsqueeze(0).repeat(users, 1, 1)}  # (U, I, d)
        fan_in = self.dim
        for k, width in enumerate(self.hidden):
            weight, bias = torch_linear_init(fan_in, width, generator, dtype, device)
            state[f"mlp{k}_w"] = weight.unsqueeze(0).repeat(users, 1, 1)  # (U, out, in)
            state[f"mlp{k}_b"] = bias.unsqueeze(0).repeat(users, 1)  # (U, out)
            fan_in = width
        weight, bias = torch_linear_init(fan_in, 1, generator, dtype, device)
        state["head_w"] = weight[0].expand(users, -1).clone()  # (U, h)
        state["head_b"] = bias.expand(users).clone()  # (U,)
        return state

    def logits(self, params: Mapping[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        """``(C, B)``: dense parameters ``(C, ...)``, ``personal_item_emb`` a row table ``(R, d)``."""
        hidden = params[PERSONAL_TABLE][rows]  # (C, B, d)
        for k in range(len(self.hidden)):
            weight, bias = params[f"mlp{k}_w"], params[f"mlp{k}_b"]  # (C, out, in), (C, out)
            hidden = torch.relu(torch.einsum("cbi,coi->cbo", hidden, weight) + bias[:, None, :])
        return torch.einsum("cbh,ch->cb", hidden, params["head_w"]) + params["head_b"][:, None]  # (C, B)


# ======================================================================================
# Construction and checks
# ======================================================================================
def guided_backbone(name: str, num_users: int, num_items: int, dim: int = 32, **options) -> FederatedModel:
    """The guided form of one of Table 3's backbones (see the module docstring).

    Args:
        name: ``"FedMF"``, ``"FedNCF"`` or ``"PFedRec"`` (case-insensitive).
        num_users, num_items, dim: ``U``, ``I``, ``d``.
        options: the backbone's own options: FedMF ``init_std``; FedNCF ``variant``
            (``"mlp"``), ``hidden`` (``(32,)``), ``private_head``, ``init`` (``"ncf"``);
            PFedRec ``hidden`` (``()``), ``item_init_std``.

    Returns:
        :class:`~fedlib.models.PersonalItemTableModel` (``shared_table=False``, FedRKG's own
        backbone), :class:`GuidedFedNCF` or :class:`GuidedPFedRec`; each holds its personal
        tables as ``personal_item_emb`` ``(U, I, d)``.
    """
    canonical = {known.lower(): known for known in GUIDED_BACKBONES}.get(str(name).lower())
    if canonical is None:
        raise ValueError(f"unknown backbone {name!r}: guided_backbone knows {GUIDED_BACKBONES} (the backbones of "
                         "FedRKG's Table 3)")
    unknown = sorted(set(options) - set(_OPTIONS[canonical]))
    if unknown:
        raise ValueError(f"{canonical} takes the options {_OPTIONS[canonical]}, got unknown {unknown}")
    if canonical == "FedMF":
        return PersonalItemTableModel(num_users, num_items, dim, shared_table=False, **options)
    if canonical == "FedNCF":
        return GuidedFedNCF(num_users, num_items, dim, **options)
    return GuidedPFedRec(num_users, num_items, dim, **options)


def backbone_name(model: FederatedModel) -> str:
    """``"FedMF"``, ``"FedNCF"`` or ``"PFedRec"`` for a guided model, else its class name."""
    if isinstance(model, PersonalItemTableModel):
        return "FedMF"
    return getattr(model, "backbone_name", "") or type(model).__name__


def check_guided_model(model: FederatedModel) -> int:
    """Raise ``ValueError`` unless ``model`` holds exactly one item table, the personal one.

    FedRKG's guidance reads and rewrites ``personal_item_emb`` ``(U, I, d)`` (``private_rows``)
    and trains its gate on the model's logits with that table replaced by fused rows, so
    the model must have no shared item table (``public_rows``) and no other row table.

    Returns:
        ``d``, the table's width (from the model's ``dim``).
    """
    kinds = dict(getattr(model, "param_kinds", {}))
    if isinstance(model, PersonalItemTableModel) and model.shared_table:
        raise ValueError("knowledge guidance needs the FedRKG backbone: PersonalItemTableModel(..., "
                         "shared_table=False), got PersonalItemTableModel with shared_table=True (FedRAP's dual "
                         "tables: its public item_emb would be left out of the guidance)")
    shared = [name for name, kind in kinds.items() if kind == "public_rows"]
    if shared:
        raise ValueError(f"knowledge guidance needs a personal item table per user, but {type(model).__name__} has a "
                         f"shared item table {shared} (public_rows); build its guided form, e.g. "
                         f"guided_backbone({backbone_name(model)!r}, num_users, num_items, dim)")
    if kinds.get(PERSONAL_TABLE) != "private_rows":
        raise ValueError(f"knowledge guidance needs a personal item table {PERSONAL_TABLE!r} (private_rows, "
                         f"(U, I, d)); {type(model).__name__} has {sorted(kinds)}: build the model with "
                         "fedlib.models.guided.guided_backbone(...)")
    others = [name for name, kind in kinds.items() if kind == "private_rows" and name != PERSONAL_TABLE]
    if others:
        raise ValueError(f"knowledge guidance guides one item table, {PERSONAL_TABLE!r}, but {type(model).__name__} "
                         f"has other row tables {others}")
    return int(model.dim)
