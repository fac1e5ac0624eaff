r"""FedRKG, what is guided and how: the guided backbones and the guidance equations (Eqs. 3–5, 9).

Reference:
    Lim, Kweon, Kim, Kim, Kim, Yu. "Federated Recommendation with Knowledge Guidance"
    (FedRKG), https://openreview.net/forum?id=oj2Xj8WXih (arXiv:2511.12959):
    §4.2 Knowledge Guidance (Eq. 3) and Proposition 1 (proof in Appendix A), §4.3 Adaptive
    Guidance (Eqs. 4–9), §5.1 memory analysis, Algorithm 1 (Appendix B). Equations 3, 6 and 9
    are lost in the paper's OCR; they are recovered from the authors' public code
    (https://github.com/Jaehyung-Lim/fedrkg, ``models/fedrkg.py``, ``main.py``).

Notation: ``U`` users, ``I`` items, ``d`` dimensions; ``P_u (I, d)`` the personal item table
of user ``u`` (the backbone's ``personal_item_emb``), ``P_g (I, d)`` the global table,
``β ∈ [0, 1]`` (the code's ``--alpha``, 0.99), ``g_ui ∈ (0, 1)`` the gate::

    P_g    = 1/|S| Σ_{u ∈ S} P_u        S = participants, unweighted mean           §4.2
    P_u   ← β P_u + (1 − β) P_g                                   Eq. 3  (Knowledge Guidance)
    Prop. 1: Eq. 3 is one GD step on ½ λ ‖P − P_g‖² with step size η, η λ = 1 − β
    g_ui   = σ(w_uᵀ [P_ui ; P_gi ; P_ui − P_gi] + b_u)               Eq. 5  (w_u ∈ R^{3d}, b_u ∈ R)
    G_ui   = 2 (1 − β) g_ui P_gi                                    Eq. 4  (factor 2: code)
    P̃_ui   = β P_ui + G_ui        (only while training the gate)    Eq. 6
    w_u, b_u ← SGD on L_rec(P̃_u) with P_u, head, P_g frozen          Eqs. 7–8 (lr 1e-4 in code)
    P_ui  ← β P_ui + 2 (1 − β) g*_ui P_gi   (every item, every user)  Eq. 9  (Adaptive Guidance)

The gate is zero-initialised in the code, so ``g = σ(0) = 0.5`` and Eq. 9 is exactly Eq. 3
until the gate learns; with the code's lr 1e-4 and at most 5 epochs it barely moves.

Ablations of Table 2, one code path (``mode``):

==================  ===================================================================
``"adaptive"``      FedRKG: nested gate training, then Eq. 9
``"fixed"``         "w/o AG": Knowledge Guidance with the fixed weight β, Eq. 3
``"global_only"``   "w/ GIE" ("global-only; full replacement by global item embeddings"):
                    ``P_u ← P_g`` at every guidance round (Eq. 3 with β = 0). With
                    ``interval=1`` this is Figure 2's per-round "Full Replacement" baseline.
``"personal_only"`` "w/ PIE" ("personalized-only; no global guidance"): tables untouched,
                    nothing uploaded (the local-only model)
==================  ===================================================================

Guided backbones (§6.3 "Model Agnosticism", Table 3; Appendix C.1–C.2). The guidance only
touches the item table, so any backbone whose items are read from a personal table can be
guided: the backbone with its shared item table ``Q`` replaced by the user's ``P_u``, every
other parameter keeping its role:

* ``"FedMF"``: unguided ``p_u · Q[i]`` (:class:`~fedlib.models.FedMF`); guided, as FedRKG's
  code, ``w_u · P_u[i] + b_u``: the user vector is a private ``Linear(d → 1)`` head with a
  bias (:class:`~fedlib.models.PersonalItemTableModel` with ``shared_table=False``, as is).
* ``"FedNCF"``: unguided ``h · MLP([p_u ; Q[i]]) + c`` (:class:`~fedlib.models.FedNCF`);
  guided ``h · MLP([p_u ; P_u[i]]) + c`` (:class:`GuidedFedNCF`).
* ``"PFedRec"``: unguided ``w_u · f_u(Q[i]) + b_u`` (:class:`~fedlib.models.PFedRec`, ``f_u``
  the identity); guided ``w_u · f_u(P_u[i]) + b_u`` (:class:`GuidedPFedRec`).

Parameter roles in the guided forms: ``personal_item_emb`` is ``private_rows`` ``(U, I, d)``
(never aggregated by the engine; only the guidance reads and writes it), FedNCF's user
vector stays private and its MLP tower and output layer stay public (FedAvg-aggregated),
PFedRec's score function stays private. Every user starts from **one shared draw** of the
table with the backbone's own item-init std (FedRKG's clients are copies of one model):
``N(0, 1)`` for FedMF and PFedRec (``nn.Embedding``), ``N(0, 0.01²)`` for FedNCF with He et
al.'s init (``init="ncf"``) or ``N(0, 1)`` with ``init="torch_default"``. Where the
backbones depart from the paper's Appendix C.2:

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

Backbone references: Chai, Wang, Chen, Yang. "Secure Federated Matrix Factorization" (FedMF),
IEEE Intelligent Systems 36(5), 2021, arXiv:1906.05108. Perifanis, Efraimidis. "Federated
Neural Collaborative Filtering" (FedNCF), Knowledge-Based Systems 242, 2022, arXiv:2106.04405;
He et al. "Neural Collaborative Filtering", WWW 2017, arXiv:1708.05031. Zhang, Liu, Jiang,
Guo, Zhang. "Dual Personalization on Federated Recommendation" (PFedRec), IJCAI 2023,
arXiv:2301.08143.

``P_g`` itself is :func:`fedlib.engine.knowledge.global_knowledge` (shared with CoFedRec). The
nested gate training (Eqs. 6–8) is :mod:`fedlib.papers.fedrkg.gates`; the schedule that runs
both inside the engine's rounds, and the local recipe of the backbones, is
:mod:`fedlib.papers.fedrkg.method`.
"""
from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence, Tuple

import torch

from fedlib.models.base import FederatedModel, normal_, per_user_mlp_init
from fedlib.models.ncf import FedNCF
from fedlib.models.personal import PersonalItemTableModel

__all__ = [
    "MODES", "MODE_LABELS", "PERSONAL_TABLE", "GUIDED_BACKBONES",
    # the guided backbones (Table 3)
    "GuidedFedNCF", "GuidedPFedRec", "guided_backbone", "check_guided_model", "backbone_name",
    # pure functions, one per equation
    "knowledge_guidance", "proposition1_step", "gate_logits", "gate_values", "guidance_vector", "fused_embedding",
    "adaptive_guidance", "apply_guidance",
    # per-user reference of Eq. 9
    "adaptive_guidance_sequential",
]

MODES = ("adaptive", "fixed", "global_only", "personal_only")
#: The paper's names of the modes (Table 2).
MODE_LABELS = {"adaptive": "FedRKG", "fixed": "w/o AG", "global_only": "w/ GIE", "personal_only": "w/ PIE"}
#: Name of the personal item table ``P_u`` in every guided model (``private_rows``, ``(U, I, d)``).
PERSONAL_TABLE = "personal_item_emb"
#: Backbones of the paper's Table 3, as accepted by :func:`guided_backbone`.
GUIDED_BACKBONES = ("FedMF", "FedNCF", "PFedRec")


# ======================================================================================
# Input checks: say what is wrong and how to fix it
# ======================================================================================
def _check_beta(beta: float) -> float:
    value = float(beta)
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"beta must be a number in [0, 1] (the share of the personal table kept; the paper's code "
                         f"uses 0.99), got {beta!r}")
    return value


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES} (adaptive = FedRKG, fixed = 'w/o AG', global_only = 'w/ GIE', "
                         f"personal_only = 'w/ PIE'), got {mode!r}")
    return mode


def _check_tables(personal: torch.Tensor, global_table: torch.Tensor) -> None:
    if personal.dim() != 3:
        raise ValueError(f"personal tables must be (U, I, d), got shape {tuple(personal.shape)}; "
                         "for a single user pass P_u.unsqueeze(0)")
    if tuple(global_table.shape) != tuple(personal.shape[1:]):
        raise ValueError(f"global table P_g must be (I, d) = {tuple(personal.shape[1:])} like each personal table, "
                         f"got {tuple(global_table.shape)}; build it with "
                         "fedlib.engine.knowledge.global_knowledge(personal_tables)")


def _check_gate(num_users: int, dim: int, gate_weight: torch.Tensor, gate_bias: torch.Tensor) -> None:
    if tuple(gate_weight.shape) != (num_users, 3 * dim):
        raise ValueError(f"gate_weight must be (U, 3d) = ({num_users}, {3 * dim}): one weight per entry of "
                         f"[P_ui ; P_gi ; P_ui - P_gi] for each of the U users, got {tuple(gate_weight.shape)}")
    if tuple(gate_bias.shape) != (num_users,):
        raise ValueError(f"gate_bias must be (U,) = ({num_users},), one bias per user, got {tuple(gate_bias.shape)}")



# ======================================================================================
# The guided backbones: §6.3, Table 3
# ======================================================================================
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

    def score_users(self, global_state, private_state, users: torch.Tensor) -> torch.Tensor:
        """``(n, I)`` logits of every item for ``users`` ``(n,)``, each with its own table ``P_u``.

        :meth:`FedNCF.split_scores <fedlib.models.FedNCF.split_scores>` with the users' tables
        ``(n, I, d)`` as item tables: the first layer's item half ``P_u W0[:, d:]ᵀ`` is one
        matrix product per chunk and the user half is broadcast-added, instead of the MLP on
        the concatenation of every pair (:meth:`score_users_reference`, the training score;
        equal up to float rounding). Chunks of about ``FedNCF.score_pairs_per_chunk`` pairs.
        """
        chunk = self.base._users_per_chunk()
        out = []
        for start in range(0, users.numel(), chunk):
            block = users[start:start + chunk]
            params = {}
            first, n = int(block[0]), block.numel()
            # consecutive ids (evaluation's sorted users, often all of them): a view of the
            # tables instead of a copy of n·I·d floats
            rows = slice(first, first + n) if int(block[-1]) - first == n - 1 and bool((block.diff() == 1).all()) \
                else block
            for name, kind in self.param_kinds.items():
                base_name = "item_emb" if name == PERSONAL_TABLE else name
                params[base_name] = private_state[name][rows] if kind.startswith("private") else global_state[name]
            out.append(self.base.split_scores(params, block.numel()))  # item tables (n, I, d)
        if not out:
            return private_state[PERSONAL_TABLE].new_zeros((0, self.num_items))
        return torch.cat(out, 0)  # (n, I)

    def score_users_reference(self, global_state, private_state, users: torch.Tensor) -> torch.Tensor:
        """The training score :meth:`logits` on every (user, item) pair (what :meth:`score_users` is tested against)."""
        return _PersonalTableBackbone.score_users(self, global_state, private_state, users)


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
    def linear_head_tables(self) -> Optional[Tuple[str, ...]]:
        """Without hidden layers the score is a linear head on ``P_u``: the engine's closed-form
        local gradients apply (:mod:`fedlib.engine.linear_head`); ``None`` with an MLP."""
        return None if self.hidden else (PERSONAL_TABLE,)

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
        state.update(per_user_mlp_init(users, self.dim, self.hidden, generator, dtype, device))
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
                         "fedlib.papers.fedrkg.guidance.guided_backbone(...)")
    others = [name for name, kind in kinds.items() if kind == "private_rows" and name != PERSONAL_TABLE]
    if others:
        raise ValueError(f"knowledge guidance guides one item table, {PERSONAL_TABLE!r}, but {type(model).__name__} "
                         f"has other row tables {others}")
    return int(model.dim)


# ======================================================================================
# Knowledge Guidance: §4.2, Eq. 3, Proposition 1
# ======================================================================================
def knowledge_guidance(personal: torch.Tensor, global_table: torch.Tensor, beta: float) -> torch.Tensor:
    """Eq. 3: ``P_u ← β P_u + (1 − β) P_g`` for every user.

    Args:
        personal: ``(U, I, d)``; global_table: ``(I, d)``; beta: ``β ∈ [0, 1]``.

    Returns:
        ``(U, I, d)`` new tables (inputs untouched).
    """
    beta = _check_beta(beta)
    _check_tables(personal, global_table)
    return beta * personal + (1.0 - beta) * global_table


def proposition1_step(personal: torch.Tensor, global_table: torch.Tensor, lam: float, lr: float) -> torch.Tensor:
    r"""Proposition 1: one gradient-descent step on ``L(P) = ½ λ ‖P − P_g‖²_F``.

    ``∇L = λ (P − P_g)``, so ``P − η ∇L = (1 − ηλ) P + ηλ P_g`` (Appendix A, Eqs. 15–19): with
    ``η λ = 1 − β`` this is exactly Eq. 3. The gradient is taken by autograd, so the
    equivalence is checked against the loss itself, not a re-derivation. (It does **not**
    extend to Eq. 9: ``β + 2(1 − β) g ≠ 1`` unless ``g = 0.5``.)

    Args:
        personal: ``(U, I, d)`` (each user's loss is separate: the sum over users does not
            couple their gradients); global_table: ``(I, d)`` treated as a constant.
        lam: ``λ > 0``; lr: step size ``η ≥ 0``.

    Returns:
        ``(U, I, d)``.
    """
    _check_tables(personal, global_table)
    lam, lr = float(lam), float(lr)
    if not math.isfinite(lam) or lam <= 0:
        raise ValueError(f"lam must be a finite number > 0, got {lam}")
    if not math.isfinite(lr) or lr < 0:
        raise ValueError(f"lr must be a finite number >= 0, got {lr}")
    with torch.enable_grad():
        table = personal.detach().clone().requires_grad_(True)
        loss = 0.5 * lam * (table - global_table.detach()).pow(2).sum()
        (grad,) = torch.autograd.grad(loss, table)
    return (table - lr * grad).detach()


# ======================================================================================
# Adaptive Guidance: §4.3, Eqs. 4–6 and 9
# ======================================================================================
def _row_gate_logits(rows: torch.Tensor, global_rows: torch.Tensor, gate_weight: torch.Tensor,
                     gate_bias: torch.Tensor) -> torch.Tensor:
    """Eq. 5's logit for gathered rows: ``rows, global_rows (C, B, d)`` → ``(C, B)``.

    ``wᵀ[P ; P_g ; P − P_g] = (w_P + w_Δ)ᵀ P + (w_g − w_Δ)ᵀ P_g``: the ``(C, B, 3d)`` input is
    never built (for the full commit it would be ``U × I × 3d``).
    """
    d = rows.shape[-1]
    w_p, w_g, w_diff = gate_weight[:, :d], gate_weight[:, d:2 * d], gate_weight[:, 2 * d:]
    return (torch.einsum("cbd,cd->cb", rows, w_p + w_diff) + torch.einsum("cbd,cd->cb", global_rows, w_g - w_diff)
            + gate_bias[:, None])


def gate_logits(personal: torch.Tensor, global_table: torch.Tensor, gate_weight: torch.Tensor,
                gate_bias: torch.Tensor) -> torch.Tensor:
    """Eq. 5 before the sigmoid: ``w_uᵀ [P_ui ; P_gi ; P_ui − P_gi] + b_u``.

    Args:
        personal: ``(U, I, d)``; global_table: ``(I, d)``; gate_weight: ``(U, 3d)`` laid out as
            ``[w_P ; w_g ; w_Δ]``, the code's ``Linear(3d → 1)`` weight; gate_bias: ``(U,)``.

    Returns:
        ``(U, I)``.
    """
    _check_tables(personal, global_table)
    num_users, _, dim = personal.shape
    _check_gate(num_users, dim, gate_weight, gate_bias)
    d = dim
    w_p, w_g, w_diff = gate_weight[:, :d], gate_weight[:, d:2 * d], gate_weight[:, 2 * d:]
    return (torch.einsum("uid,ud->ui", personal, w_p + w_diff) + (w_g - w_diff) @ global_table.T
            + gate_bias[:, None])


def gate_values(personal: torch.Tensor, global_table: torch.Tensor, gate_weight: torch.Tensor,
                gate_bias: torch.Tensor) -> torch.Tensor:
    """Eqs. 4–5: ``g_ui = σ(w_uᵀ [P_ui ; P_gi ; P_ui − P_gi] + b_u) ∈ (0, 1)``: ``(U, I)``.

    A zero-initialised gate (the code's init) gives ``g = 0.5`` everywhere.
    """
    return torch.sigmoid(gate_logits(personal, global_table, gate_weight, gate_bias))


def guidance_vector(gate: torch.Tensor, global_table: torch.Tensor, beta: float) -> torch.Tensor:
    """Eq. 4 scaled as the code uses it: ``G_ui = 2 (1 − β) g_ui P_gi``.

    The factor 2 is in the code (``SIE * gate_weight * (1 - alpha) * 2``), so that ``g = 0.5``
    reproduces Eq. 3's ``(1 − β) P_g``. (The paper's OCR of Eq. 4 reads "G_ui = 2 g_ui P_gi",
    which may carry the same factor; we attribute it to the code.)

    Args:
        gate: ``(U, I)``; global_table: ``(I, d)``; beta: ``β``.

    Returns:
        ``(U, I, d)``.
    """
    beta = _check_beta(beta)
    if gate.dim() != 2 or gate.shape[1] != global_table.shape[0]:
        raise ValueError(f"gate must be (U, I) with I = {global_table.shape[0]} rows of P_g, got {tuple(gate.shape)}")
    # Scalar times gate first: with g = 0.5 the coefficient is exactly (1 − β) in floating point.
    return (2.0 * (1.0 - beta) * gate)[..., None] * global_table


def fused_embedding(personal: torch.Tensor, guidance: torch.Tensor, beta: float) -> torch.Tensor:
    """Eq. 6: ``P̃_ui = β P_ui + G_ui``: ``(U, I, d)`` (or any matching row shape)."""
    beta = _check_beta(beta)
    if guidance.shape != personal.shape:
        raise ValueError(f"guidance vector must have the shape of the personal rows {tuple(personal.shape)}, "
                         f"got {tuple(guidance.shape)}")
    return beta * personal + guidance


def adaptive_guidance(personal: torch.Tensor, global_table: torch.Tensor, gate_weight: torch.Tensor,
                      gate_bias: torch.Tensor, beta: float) -> torch.Tensor:
    """Eq. 9, the committed update: ``P_ui ← β P_ui + 2 (1 − β) g*_ui P_gi`` for every item.

    ``g*`` comes from the gate after nested training (:func:`fedlib.papers.fedrkg.gates.train_gates`); the update is
    Eq. 6's fused embedding, now written into the table.

    Departure from the paper's reading. The paper presents Adaptive Guidance as a refined
    Eq. 3, i.e. a per-item interpolation between ``P_u`` and ``P_g``. The code's update is
    not a convex combination: the coefficients ``β`` and ``2(1 − β) g`` sum to 1 only at
    ``g = 0.5``; ``g → 1`` over-weights ``P_g`` (total weight ``2 − β``), ``g → 0`` shrinks
    ``P_u`` by ``β`` with no global term. Proposition 1 therefore holds only at ``g = 0.5``.

    Zero-initialised gate: ``g = σ(0) = 0.5`` and the update equals Eq. 3
    (:func:`knowledge_guidance`) exactly, bit for bit.

    Args:
        personal: ``(U, I, d)``; global_table: ``(I, d)``; gate_weight: ``(U, 3d)``;
        gate_bias: ``(U,)``; beta: ``β``.

    Returns:
        ``(U, I, d)`` new tables (inputs untouched).
    """
    beta = _check_beta(beta)
    gate = gate_values(personal, global_table, gate_weight, gate_bias)  # (U, I)
    return fused_embedding(personal, guidance_vector(gate, global_table, beta), beta)


def apply_guidance(personal: torch.Tensor, global_table: torch.Tensor, beta: float, mode: str = "adaptive",
                   gate_weight: Optional[torch.Tensor] = None, gate_bias: Optional[torch.Tensor] = None
                   ) -> torch.Tensor:
    """The guidance step of one ablation (see the module docstring's table): ``(U, I, d)``.

    ``"adaptive"``: Eq. 9 with the given gate (``None`` = the zero-initialised gate, i.e.
    Eq. 3); ``"fixed"``: Eq. 3; ``"global_only"``: ``P_g`` for every user;
    ``"personal_only"``: an unchanged copy.
    """
    _check_mode(mode)
    beta = _check_beta(beta)
    _check_tables(personal, global_table)
    if mode == "personal_only":
        return personal.clone()
    if mode == "global_only":
        return global_table.expand_as(personal).clone()
    if mode == "fixed":
        return knowledge_guidance(personal, global_table, beta)
    num_users, _, dim = personal.shape
    if gate_weight is None:
        gate_weight = personal.new_zeros((num_users, 3 * dim))
    if gate_bias is None:
        gate_bias = personal.new_zeros((num_users,))
    return adaptive_guidance(personal, global_table, gate_weight, gate_bias, beta)


def adaptive_guidance_sequential(personal: torch.Tensor, global_table: torch.Tensor, gate_weight: torch.Tensor,
                                 gate_bias: torch.Tensor, beta: float) -> torch.Tensor:
    """Per-user reference of :func:`adaptive_guidance` (the code's ``gate_inference`` + fusion loop)."""
    beta = _check_beta(beta)
    _check_tables(personal, global_table)
    _check_gate(personal.shape[0], personal.shape[2], gate_weight, gate_bias)
    out = torch.empty_like(personal)
    for user in range(personal.shape[0]):
        table = personal[user]  # (I, d)
        gate_input = torch.cat([table, global_table, table - global_table], dim=1)  # (I, 3d)
        gate = torch.sigmoid(gate_input @ gate_weight[user] + gate_bias[user])  # (I,)
        out[user] = table * beta + global_table * (1.0 - beta) * 2.0 * gate[:, None]
    return out

