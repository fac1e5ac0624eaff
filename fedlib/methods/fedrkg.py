r"""FedRKG: knowledge guidance of personal item tables by the mean of all tables.

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

Schedule (Algorithm 1; the code's ``main.py``). The code aggregates ``P_g`` after the local training of
rounds ``r ∈ {T, 2T, …} (< R)`` and applies guidance at the *start* of round ``r + 1``, for
every user, before that round's local training; the gate is trained on the examples of that
round (its positives and freshly drawn negatives). In :func:`~fedlib.engine.run_federated`
terms (0-based round ``t`` = rounds completed), guidance runs in ``before_round(state, t)``
when ``t − 1`` is a positive multiple of ``T`` (:meth:`KnowledgeGuidance.is_guidance_round`).

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

Backbones (§6.3 "Model Agnosticism", Table 3). The gate and the guidance only touch the item
table, so any backbone whose items are read from ``personal_item_emb`` can be guided: FedMF
(:class:`~fedlib.models.PersonalItemTableModel`, the code's backbone), FedNCF and PFedRec in
their guided forms (:func:`fedlib.models.guided.guided_backbone`). Nested gate training needs
the backbone's logits on the fused rows ``P̃_u`` with every other parameter frozen:
:func:`train_gates` is the fast path for FedMF's linear head ``s = w_u · P̃_ui + b_u``;
:func:`train_gates_on_model` is the generic path (the rows fused per example, then
``model.logits``; autograd updates the gate only) with :func:`train_gates_on_model_sequential`
as its per-user reference. :meth:`KnowledgeGuidance.guide` picks the path from the model.

How it plugs into the engine. The gate ``(w_u, b_u)`` is private per-client state that the
backbone does not score with, so it is kept out of the model and stored in
``TrainState.extra`` (:data:`GATE_WEIGHT_KEY`, :data:`GATE_BIAS_KEY`; saved by checkpoints).
The engine's ``before_round(state, t)`` hook receives neither the round plan nor the data, so
:meth:`KnowledgeGuidance.before_round_hook` re-derives both: participants of round ``t − 1``
and the examples of round ``t`` are pure functions of ``(seed, round)``
(:func:`guidance_participants`, :func:`guidance_examples`), hence the same as the engine's.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Dict, NamedTuple, Optional

import numpy as np
import torch
import torch.nn.functional as F

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import Pairs
from fedlib.engine.method import FederatedMethod
from fedlib.engine.plan import RoundPlan, make_round_plan, round_generator, select_clients
from fedlib.models.base import FederatedModel
from fedlib.models.guided import PERSONAL_TABLE, check_guided_model
from fedlib.models.personal import PersonalItemTableModel

__all__ = [
    "MODES", "MODE_LABELS", "GATE_WEIGHT_KEY", "GATE_BIAS_KEY", "LOG_KEY",
    # pure functions, one per equation
    "global_knowledge", "knowledge_guidance", "proposition1_step", "gate_logits", "gate_values",
    "guidance_vector", "fused_embedding", "adaptive_guidance", "apply_guidance",
    # nested gate training (Eqs. 6–8): FedMF fast path, any guided backbone
    "GateExamples", "GateTraining", "fused_logits", "train_gates", "fused_model_logits", "train_gates_on_model",
    # per-user references
    "train_gates_sequential", "train_gates_on_model_sequential", "adaptive_guidance_sequential",
    # engine plumbing
    "gate_examples_from_plan", "guidance_participants", "guidance_examples", "KnowledgeGuidance",
    # §5.1
    "client_parameter_counts",
]

MODES = ("adaptive", "fixed", "global_only", "personal_only")
#: The paper's names of the modes (Table 2).
MODE_LABELS = {"adaptive": "FedRKG", "fixed": "w/o AG", "global_only": "w/ GIE", "personal_only": "w/ PIE"}
#: ``TrainState.extra`` keys: gate weights ``(U, 3d)``, biases ``(U,)``, one record per guidance.
GATE_WEIGHT_KEY = "fedrkg_gate_weight"
GATE_BIAS_KEY = "fedrkg_gate_bias"
LOG_KEY = "fedrkg_guidance"

_CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_ divides by (total_norm + 1e-6)
_TOL_EPS = 1e-8  # the code's early exit divides by |previous + 1e-8|


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
                         f"got {tuple(global_table.shape)}; build it with global_knowledge(personal_tables)")


def _check_gate(num_users: int, dim: int, gate_weight: torch.Tensor, gate_bias: torch.Tensor) -> None:
    if tuple(gate_weight.shape) != (num_users, 3 * dim):
        raise ValueError(f"gate_weight must be (U, 3d) = ({num_users}, {3 * dim}): one weight per entry of "
                         f"[P_ui ; P_gi ; P_ui - P_gi] for each of the U users, got {tuple(gate_weight.shape)}")
    if tuple(gate_bias.shape) != (num_users,):
        raise ValueError(f"gate_bias must be (U,) = ({num_users},), one bias per user, got {tuple(gate_bias.shape)}")


def _check_users(users: torch.Tensor, num_users: int, what: str = "users") -> torch.Tensor:
    users = torch.as_tensor(users, dtype=torch.int64)
    if users.dim() != 1:
        raise ValueError(f"{what} must be a 1-D tensor of user ids, got shape {tuple(users.shape)}")
    if users.numel() and (int(users.min()) < 0 or int(users.max()) >= num_users):
        raise ValueError(f"{what} must be user ids in [0, {num_users}), got ids from {int(users.min())} "
                         f"to {int(users.max())}")
    return users


# ======================================================================================
# Knowledge Guidance: §4.2, Eq. 3, Proposition 1
# ======================================================================================
def global_knowledge(personal_tables: torch.Tensor, participants=None, chunk_size: int = 256) -> torch.Tensor:
    """``P_g = 1/|S| Σ_{u ∈ S} P_u``: the server's unweighted mean of the uploaded tables (§4.2).

    Unweighted, as the code's ``aggregate_item_emb`` (every participant counts once, whatever
    its number of interactions).

    Args:
        personal_tables: ``(U, I, d)`` every user's table.
        participants: ``(S,)`` distinct user ids that upload (``None`` = every user).
        chunk_size: users summed at a time, so no ``(S, I, d)`` copy is made (ML-1M's tables
            alone are 2.9 GB).

    Returns:
        ``(I, d)``.
    """
    if personal_tables.dim() != 3:
        raise ValueError(f"personal tables must be (U, I, d), got shape {tuple(personal_tables.shape)}")
    num_users = personal_tables.shape[0]
    if participants is None:
        participants = torch.arange(num_users)
    idx = _check_users(participants, num_users, "participants").to(personal_tables.device)
    if idx.numel() == 0:
        raise ValueError("participants is empty: P_g needs at least one uploaded table (pass None for every user)")
    if torch.unique(idx).numel() != idx.numel():
        raise ValueError("participants contains duplicate user ids: each participant uploads its table once")
    total = torch.zeros(personal_tables.shape[1:], dtype=personal_tables.dtype, device=personal_tables.device)
    for start in range(0, idx.numel(), max(1, int(chunk_size))):
        chunk = idx[start:start + chunk_size]
        first, last = int(chunk[0]), int(chunk[-1])
        consecutive = last - first + 1 == chunk.numel() and bool((chunk[1:] > chunk[:-1]).all())
        if consecutive:  # the same rows in the same order: a view instead of a gathered copy (bit-identical sum)
            total += personal_tables[first:last + 1].sum(0)
        else:
            total += personal_tables[chunk].sum(0)
    return total / idx.numel()


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

    ``g*`` comes from the gate after nested training (:func:`train_gates`); the update is
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


# ======================================================================================
# Nested gate training: §4.3.2, Eqs. 6–8
# ======================================================================================
class GateExamples(NamedTuple):
    """Local training examples of ``C`` clients, padded to ``B`` (the engine's ``LocalBatch`` layout).

    Attributes:
        users: ``(C,) int64`` user ids.
        items: ``(C, B) int64`` item ids (padding: 0).
        labels: ``(C, B)`` 1 / 0 (padding: 0).
        mask: ``(C, B)`` 1 for real examples, 0 for padding.
        steps: ``(C, B) int64`` mini-batch of each example within an epoch (0-based).
    """

    users: torch.Tensor
    items: torch.Tensor
    labels: torch.Tensor
    mask: torch.Tensor
    steps: torch.Tensor

    def subset(self, index) -> "GateExamples":
        """The clients ``index`` (positions, a slice or a tensor)."""
        return GateExamples(*(t[index] for t in self))


@dataclass
class GateTraining:
    """Result of :func:`train_gates` for ``C`` clients.

    Attributes:
        weight: ``(C, 3d)`` trained gate weights.
        bias: ``(C,)`` trained gate biases.
        losses: ``(C, E)`` the code's running mean loss after each epoch (mean of every batch
            loss so far, weighted by batch size); NaN for epochs a client did not run.
        epochs_run: ``(C,) int64`` epochs each client trained (0 for a client without data).
    """

    weight: torch.Tensor
    bias: torch.Tensor
    losses: torch.Tensor
    epochs_run: torch.Tensor


def fused_logits(rows: torch.Tensor, global_rows: torch.Tensor, head_w: torch.Tensor, head_b: torch.Tensor,
                 gate_weight: torch.Tensor, gate_bias: torch.Tensor, beta: float) -> torch.Tensor:
    """Logits of the FedRKG backbone on fused rows (the code's ``forward_with_gate``).

    ``s_ui = e_uᵀ P̃_ui + c_u`` with ``P̃_ui = β P_ui + 2(1 − β) g_ui P_gi`` (Eq. 6) and the
    private ``Linear(d → 1)`` head ``(e_u, c_u)`` of :class:`~fedlib.models.PersonalItemTableModel`.

    Args:
        rows, global_rows: ``(C, B, d)`` ``P_u`` and ``P_g`` rows of each client's examples.
        head_w: ``(C, d)``; head_b: ``(C,)``; gate_weight: ``(C, 3d)``; gate_bias: ``(C,)``.

    Returns:
        ``(C, B)``.
    """
    gate = torch.sigmoid(_row_gate_logits(rows, global_rows, gate_weight, gate_bias))  # (C, B)
    fused = beta * rows + (2.0 * (1.0 - beta) * gate)[..., None] * global_rows  # (C, B, d) Eq. 6
    return torch.einsum("cbd,cd->cb", fused, head_w) + head_b[:, None]


def _check_training_inputs(personal_tables, global_table, head_w, head_b, gate_weight, gate_bias,
                           users, items, labels, mask, steps, beta, lr, epochs, clip_norm, tol):
    _check_tables(personal_tables, global_table)
    num_users, num_items, dim = personal_tables.shape
    _check_gate(num_users, dim, gate_weight, gate_bias)
    if tuple(head_w.shape) != (num_users, dim) or tuple(head_b.shape) != (num_users,):
        raise ValueError(f"head_w must be (U, d) = ({num_users}, {dim}) and head_b (U,) = ({num_users},), "
                         f"got {tuple(head_w.shape)} and {tuple(head_b.shape)}")
    return _check_examples(num_users, num_items, users, items, labels, mask, steps, beta, lr, epochs, clip_norm, tol)


def _check_examples(num_users, num_items, users, items, labels, mask, steps, beta, lr, epochs, clip_norm, tol):
    """Checks of the examples and options shared by every gate trainer."""
    users = _check_users(users, num_users)
    if items.dim() != 2 or items.shape[0] != users.numel():
        raise ValueError(f"items must be (C, B) with C = {users.numel()} rows, one per user id, "
                         f"got {tuple(items.shape)}")
    for name, tensor in (("labels", labels), ("mask", mask), ("steps", steps)):
        if tensor is not None and tensor.shape != items.shape:
            raise ValueError(f"{name} must have the shape of items {tuple(items.shape)}, got {tuple(tensor.shape)}")
    if items.numel() and (int(items.min()) < 0 or int(items.max()) >= num_items):
        raise ValueError(f"item ids must be in [0, {num_items}), got ids from {int(items.min())} to {int(items.max())}")
    beta = _check_beta(beta)
    lr = float(lr)
    if not math.isfinite(lr) or lr < 0:
        raise ValueError(f"lr (the gate's learning rate, 1e-4 in the code) must be a finite number >= 0, got {lr}")
    if int(epochs) != epochs or epochs < 0:
        raise ValueError(f"epochs must be an integer >= 0, got {epochs!r}")
    if clip_norm is not None and not float(clip_norm) > 0:
        raise ValueError(f"clip_norm must be > 0 or None (no clipping), got {clip_norm!r}")
    if tol is not None and not float(tol) >= 0:
        raise ValueError(f"tol must be >= 0 or None (no early exit), got {tol!r}")
    return users, beta, lr, int(epochs)


def train_gates(personal_tables: torch.Tensor, global_table: torch.Tensor, head_w: torch.Tensor,
                head_b: torch.Tensor, gate_weight: torch.Tensor, gate_bias: torch.Tensor, users: torch.Tensor,
                items: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, *, beta: float, lr: float = 1e-4,
                epochs: int = 5, steps: Optional[torch.Tensor] = None, clip_norm: Optional[float] = None,
                tol: Optional[float] = None) -> GateTraining:
    """Eqs. 6–8, batched over ``C`` clients: SGD on each client's gate ``(w_u, b_u)`` only.

    Each client minimises its BCE (mean over a mini-batch, as ``BCEWithLogitsLoss``) with
    its item rows replaced by the fused embedding ``P̃_u`` (Eq. 6); its table ``P_u``, head
    and ``P_g`` are frozen (read, never written: the inputs are left untouched). In every
    epoch the client visits its mini-batches ``0, 1, …`` (``steps``) in order, one SGD step
    ``(w, b) ← (w, b) − lr ∇`` per batch (Eq. 8). Clients share no parameter: all of them
    take their step of batch ``k`` together, each on its own examples.

    How it is computed. The logit is linear in ``P̃`` and ``P̃`` depends on the gate only
    through ``g_ui``, so the gradients are written out in closed form
    (:func:`_linear_head_gradients`) instead of being taken by autograd, and they are
    evaluated on the real examples only, stacked without padding (the padded ``(C, B)``
    layout is read once): the cost follows the number of examples, not ``C ×`` the largest
    count. :func:`train_gates_sequential` is the autograd reference.

    Code details reproduced on request:

    * ``clip_norm``: the code calls ``clip_grad_norm_(model.parameters(), 1.0)`` over **all**
      parameters, so the gate's gradient is scaled by ``min(1, C / (‖∇_all‖ + 1e-6))`` where
      the norm includes the (unused) gradients of the frozen table rows and head.
    * ``tol``: the code stops a client after epoch ``e > 0`` when its running mean loss
      changed by less than ``tol`` relative to the previous epoch's running mean.

    Args:
        personal_tables: ``(U, I, d)`` every user's table (only the example rows are read).
        global_table: ``(I, d)`` ``P_g``.
        head_w: ``(U, d)``; head_b: ``(U,)`` the private score heads.
        gate_weight: ``(U, 3d)``; gate_bias: ``(U,)`` the gates before training.
        users: ``(C,)`` distinct user ids to train; items, labels, mask: ``(C, B)`` their
            examples (:class:`GateExamples` layout; :func:`gate_examples_from_plan`).
        beta: ``β``; lr: the gate's learning rate (code: 1e-4); epochs: gate epochs (code: 5).
        steps: ``(C, B)`` mini-batch index of each example (``None``: one batch per client).
        clip_norm: see above (code: 1.0; ``None`` = plain Eq. 8).
        tol: see above (code: 1e-4; ``None`` = always ``epochs`` epochs).

    Returns:
        :class:`GateTraining` with the ``C`` clients' new gates.
    """
    users, beta, lr, epochs = _check_training_inputs(personal_tables, global_table, head_w, head_b, gate_weight,
                                                     gate_bias, users, items, labels, mask, steps, beta, lr, epochs,
                                                     clip_norm, tol)
    device, dtype = personal_tables.device, personal_tables.dtype
    users = users.to(device)
    num_clients = users.numel()
    num_items, dim = global_table.shape
    items = items.to(device)
    mask = mask.to(device=device, dtype=dtype)
    labels = labels.to(device=device, dtype=dtype)
    steps = torch.zeros_like(items) if steps is None else steps.to(device)
    weight = gate_weight[users].detach().clone()  # (C, 3d)
    bias = gate_bias[users].detach().clone()  # (C,)
    head_w_c, head_b_c = head_w[users].detach(), head_b[users].detach()  # (C, d), (C,)
    losses = torch.full((num_clients, epochs), float("nan"), dtype=dtype, device=device)
    epochs_run = torch.zeros(num_clients, dtype=torch.int64, device=device)
    if epochs == 0 or num_clients == 0:
        return GateTraining(weight, bias, losses, epochs_run)

    # The N real examples (mask > 0, in a batch), stacked without padding and ordered by batch,
    # then client, then slot: a batch is a contiguous range, a client's examples stay in order.
    client, slot = ((mask > 0) & (steps >= 0)).nonzero(as_tuple=True)  # (N,) each, by client then slot
    batch = steps[client, slot]
    order = torch.argsort(batch, stable=True)
    client, slot, batch = client[order], slot[order], batch[order]
    example_items = items[client, slot]
    with torch.no_grad():
        rows = personal_tables.detach()[users[client], example_items]  # (N, d) frozen P_u rows
        global_rows = global_table.detach()[example_items]  # (N, d) frozen P_g rows
        head_rows = head_w_c.index_select(0, client)  # (N, d) e_u of each example
        examples = _LinearHeadExamples(
            client=client, batch=batch, label=labels[client, slot], weight=mask[client, slot], rows=rows,
            global_rows=global_rows, head_rows=head_rows, head_dot_global=(head_rows * global_rows).sum(1),
            key=torch.zeros_like(client))
        key_batch = key_client = None
        if clip_norm is not None:
            # (batch, client, item) keys: repeats of an item in one batch add up in one row of
            # the table's gradient (what clip_grad_norm_ sees); a batch's keys are a contiguous range.
            keys, key_index = torch.unique((batch * num_clients + client) * num_items + example_items,
                                           return_inverse=True)
            key_client = (keys // num_items) % num_clients  # (K,)
            key_batch = keys // (num_items * num_clients)  # (K,) sorted
            examples = examples._replace(key=key_index)

    active = torch.zeros(num_clients, dtype=torch.bool, device=device)
    active[client] = True  # clients with data
    total_loss = torch.zeros(num_clients, dtype=dtype, device=device)
    total_count = torch.zeros(num_clients, dtype=dtype, device=device)
    previous = None
    current, current_active = examples, active.clone()
    for epoch in range(epochs):
        if not bool(active.any()):
            break
        ran = active.clone()
        if not torch.equal(active, current_active):  # drop the examples of the clients that stopped
            current, current_active = examples.subset(active[examples.client]), active.clone()
        values, sizes = torch.unique_consecutive(current.batch, return_counts=True)
        start = 0
        for step, size in zip(values.tolist(), sizes.tolist()):
            part = current.subset(slice(start, start + size))
            start += size
            key_range = None
            if clip_norm is not None:
                key_range = (int(torch.searchsorted(key_batch, step)),
                             int(torch.searchsorted(key_batch, step, right=True)))
            client_loss, count, grad_w, grad_b = _linear_head_gradients(
                weight, bias, head_w_c, head_b_c, part, beta, clip_norm, key_client, key_range)
            weight = weight - lr * grad_w
            bias = bias - lr * grad_b
            total_loss += client_loss * count
            total_count += count
        running = total_loss / total_count.clamp(min=1.0)  # the code's cumulative mean, not per epoch
        losses[ran, epoch] = running[ran]
        epochs_run += ran.to(torch.int64)
        if tol is not None and previous is not None:
            change = (running - previous).abs() / (previous + _TOL_EPS).abs()
            active = active & ~(ran & (change < float(tol)))
        previous = running
    return GateTraining(weight, bias, losses, epochs_run)


class _LinearHeadExamples(NamedTuple):
    """Real examples of :func:`train_gates`, stacked without padding: ``(N, ...)`` each."""

    client: torch.Tensor  # position of the example's client in the chunk
    batch: torch.Tensor  # its mini-batch
    label: torch.Tensor
    weight: torch.Tensor  # its mask value (1)
    rows: torch.Tensor  # (N, d) P_ui
    global_rows: torch.Tensor  # (N, d) P_gi
    head_rows: torch.Tensor  # (N, d) e_u
    head_dot_global: torch.Tensor  # e_u · P_gi
    key: torch.Tensor  # index of its (batch, client, item) key (clipping only)

    def subset(self, index) -> "_LinearHeadExamples":
        return _LinearHeadExamples(*(t[index] for t in self))


def _linear_head_gradients(weight: torch.Tensor, bias: torch.Tensor, head_w: torch.Tensor, head_b: torch.Tensor,
                           ex: _LinearHeadExamples, beta: float, clip_norm: Optional[float],
                           key_client: Optional[torch.Tensor], key_range: Optional[tuple]):
    r"""One mini-batch of :func:`train_gates`: each client's mean loss and the (clipped) gradient of its gate.

    For client ``u`` and its ``n_u`` examples ``(i, y)`` of the batch, with ``p = P_ui``,
    ``q = P_gi``, head ``(e, c)`` and gate ``w = [w_P ; w_g ; w_Δ]``, ``b``, ``κ = 2(1 − β)``::

        z = (w_P + w_Δ)·p + (w_g − w_Δ)·q + b     g = σ(z)     P̃ = β p + κ g q     s = e·P̃ + c
        L = 1/n_u Σ BCE(s, y)
        δ = ∂L/∂s = (σ(s) − y) / n_u             t = ∂L/∂z = δ κ (e·q) g (1 − g)
        ∇w_P = Σ t p    ∇w_g = Σ t q    ∇w_Δ = ∇w_P − ∇w_g    ∇b = Σ t
        frozen (clip only): ∇e = Σ δ P̃    ∇c = Σ δ    ∇P_ui = β e Σ_i δ + (w_P + w_Δ) Σ_i t

    (``δ`` is also multiplied by the example's mask value, 1 for a real example), where ``Σ_i``
    runs over the batch's examples of item ``i``: a table row read by several examples of
    the batch gets the sum of their gradients, and that sum is what ``clip_grad_norm_``
    measures. Sums per client (and per row) are taken with ``index_add_`` over the stacked
    examples, so no ``(C, B)`` padding and no ``(C, I, d)`` gradient is made.

    Args:
        weight: ``(C, 3d)``; bias: ``(C,)`` the gates; head_w: ``(C, d)``; head_b: ``(C,)``.
        ex: the batch's examples.
        key_client: ``(K,)`` client of every (batch, client, item) key; key_range: the keys of this batch.

    Returns:
        ``loss (C,)`` (0 for a client without examples here), ``count (C,)``, ``grad_w (C, 3d)``, ``grad_b (C,)``.
    """
    num_clients, dim = head_w.shape
    dtype, device = weight.dtype, weight.device
    client = ex.client
    kappa = 2.0 * (1.0 - beta)
    w_p, w_g, w_diff = weight[:, :dim], weight[:, dim:2 * dim], weight[:, 2 * dim:]
    row_weight = w_p + w_diff  # (C, d) the gate's weight on P_ui
    z = ((ex.rows * row_weight.index_select(0, client)).sum(1)
         + (ex.global_rows * (w_g - w_diff).index_select(0, client)).sum(1) + bias.index_select(0, client))
    gate = torch.sigmoid(z)  # (n,) Eq. 5
    fused = beta * ex.rows + (kappa * gate)[:, None] * ex.global_rows  # (n, d) Eq. 6
    logits = (fused * ex.head_rows).sum(1) + head_b.index_select(0, client)  # (n,)
    per_example = F.binary_cross_entropy_with_logits(logits, ex.label, reduction="none") * ex.weight
    count = torch.zeros(num_clients, dtype=dtype, device=device).index_add_(0, client, ex.weight)
    inverse = 1.0 / count.clamp(min=1.0)
    client_loss = torch.zeros(num_clients, dtype=dtype, device=device).index_add_(0, client, per_example) * inverse
    delta = (torch.sigmoid(logits) - ex.label) * (inverse.index_select(0, client) * ex.weight)  # ∂L/∂s
    t = kappa * (delta * ex.head_dot_global) * ((1.0 - gate) * gate)  # ∂L/∂z
    grad_p = torch.zeros(num_clients, dim, dtype=dtype, device=device).index_add_(0, client, t[:, None] * ex.rows)
    grad_g = torch.zeros(num_clients, dim, dtype=dtype, device=device).index_add_(
        0, client, t[:, None] * ex.global_rows)
    grad_w = torch.cat([grad_p, grad_g, grad_p - grad_g], dim=1)  # (C, 3d)
    grad_b = torch.zeros(num_clients, dtype=dtype, device=device).index_add_(0, client, t)
    if clip_norm is not None:
        # The code's clip_grad_norm_ over every parameter of the client model, the frozen
        # ones included: their gradients shrink the gate's step.
        grad_e = torch.zeros(num_clients, dim, dtype=dtype, device=device).index_add_(
            0, client, delta[:, None] * fused)
        grad_c = torch.zeros(num_clients, dtype=dtype, device=device).index_add_(0, client, delta)
        first, last = key_range
        local = ex.key - first
        owner = key_client[first:last]  # (K,)
        delta_sum = torch.zeros(last - first, dtype=dtype, device=device).index_add_(0, local, delta)
        t_sum = torch.zeros(last - first, dtype=dtype, device=device).index_add_(0, local, t)
        row_grad = (beta * head_w.index_select(0, owner) * delta_sum[:, None]
                    + row_weight.index_select(0, owner) * t_sum[:, None])  # (K, d)
        squared = torch.zeros(num_clients, dtype=dtype, device=device).index_add_(0, owner, row_grad.pow(2).sum(1))
        squared = squared + grad_w.pow(2).sum(1) + grad_b.pow(2) + grad_e.pow(2).sum(1) + grad_c.pow(2)
        factor = (float(clip_norm) / (squared.sqrt() + _CLIP_EPS)).clamp(max=1.0)  # (C,)
        grad_w, grad_b = grad_w * factor[:, None], grad_b * factor
    return client_loss, count, grad_w, grad_b


def _buckets_by_count(examples: GateExamples, chunk_size: int):
    """Clients grouped ``chunk_size`` at a time by number of examples: ``[(positions, examples), ...]``.

    Clients are taken in increasing order of their number of examples (ties in their order),
    and each group's ``(c, B)`` matrices are cut to the widest of its clients, so a group of
    clients with few examples is not padded to the client with the most. The clients are
    independent, so grouping them differently changes nothing but the padding.
    """
    real = examples.mask > 0  # (C, B)
    order = torch.argsort(real.sum(1), stable=True)
    buckets = []
    for start in range(0, order.numel(), max(1, int(chunk_size))):
        positions = order[start:start + chunk_size]
        part = examples.subset(positions)
        used = real[positions].any(0).nonzero()
        width = int(used.max()) + 1 if used.numel() else 0
        buckets.append((positions, GateExamples(part.users, *(t[:, :width] for t in part[1:]))))
    return buckets


def _train_gates_bucketed(personal_tables: torch.Tensor, global_table: torch.Tensor, head_w: torch.Tensor,
                          head_b: torch.Tensor, gate_weight: torch.Tensor, gate_bias: torch.Tensor,
                          examples: GateExamples, chunk_size: int, **options) -> GateTraining:
    """:func:`train_gates` on ``examples`` in groups of ``chunk_size`` clients (:func:`_buckets_by_count`).

    Returns the :class:`GateTraining` of all ``C`` clients in the order of ``examples.users``.
    """
    device, dtype = personal_tables.device, personal_tables.dtype
    num_clients, dim = examples.users.numel(), global_table.shape[1]
    epochs = int(options.get("epochs", 5))
    weight = torch.empty(num_clients, 3 * dim, dtype=gate_weight.dtype, device=device)
    bias = torch.empty(num_clients, dtype=gate_bias.dtype, device=device)
    losses = torch.full((num_clients, epochs), float("nan"), dtype=dtype, device=device)
    epochs_run = torch.zeros(num_clients, dtype=torch.int64, device=device)
    for positions, part in _buckets_by_count(examples, chunk_size):
        result = train_gates(personal_tables, global_table, head_w, head_b, gate_weight, gate_bias, part.users,
                             part.items, part.labels, part.mask, steps=part.steps, **options)
        positions = positions.to(device)
        weight[positions], bias[positions] = result.weight, result.bias
        losses[positions], epochs_run[positions] = result.losses, result.epochs_run
    return GateTraining(weight, bias, losses, epochs_run)


def _nested_gate_sgd(weight: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor, steps: torch.Tensor, lr: float,
                     epochs: int, tol: Optional[float], batch_gradients: Callable) -> GateTraining:
    """The schedule of :func:`train_gates_on_model`: epochs of mini-batches, SGD on ``(w, b)``, early exit.

    (:func:`train_gates` runs the same schedule on its unpadded examples.)

    Args:
        weight: ``(C, 3d)``; bias: ``(C,)`` the gates before training.
        mask: ``(C, B)`` real examples (model dtype); steps: ``(C, B)`` mini-batch of each example.
        lr, epochs, tol: as :func:`train_gates`.
        batch_gradients: ``(weight, bias, in_batch (C, B), count (C,)) -> (loss (C,), grad_w, grad_b)``:
            each client's mean loss on the examples ``in_batch`` and the (clipped) gradient of its gate.
    """
    device, dtype = mask.device, mask.dtype
    num_clients, width = mask.shape
    last_step = torch.where(mask > 0, steps, torch.full_like(steps, -1)).max(1).values if width else \
        torch.full((num_clients,), -1, dtype=torch.int64, device=device)
    num_batches = int(last_step.max()) + 1 if num_clients else 0
    active = last_step >= 0  # clients with data
    total_loss = torch.zeros(num_clients, dtype=dtype, device=device)
    total_count = torch.zeros(num_clients, dtype=dtype, device=device)
    losses = torch.full((num_clients, epochs), float("nan"), dtype=dtype, device=device)
    epochs_run = torch.zeros(num_clients, dtype=torch.int64, device=device)
    previous = None

    for epoch in range(epochs):
        if not bool(active.any()):
            break
        ran = active.clone()
        for step in range(num_batches):
            in_batch = mask * (steps == step) * active[:, None].to(dtype)  # (C, B)
            count = in_batch.sum(1)  # (C,)
            if not bool((count > 0).any()):
                continue
            client_loss, grad_w, grad_b = batch_gradients(weight, bias, in_batch, count)
            weight = weight - lr * grad_w
            bias = bias - lr * grad_b
            total_loss += client_loss.detach() * count
            total_count += count
        running = total_loss / total_count.clamp(min=1.0)  # the code's cumulative mean, not per epoch
        losses[ran, epoch] = running[ran]
        epochs_run += ran.to(torch.int64)
        if tol is not None and previous is not None:
            change = (running - previous).abs() / (previous + _TOL_EPS).abs()
            active = active & ~(ran & (change < float(tol)))
        previous = running
    return GateTraining(weight.detach(), bias.detach(), losses, epochs_run)


def train_gates_sequential(personal_tables: torch.Tensor, global_table: torch.Tensor, head_w: torch.Tensor,
                           head_b: torch.Tensor, gate_weight: torch.Tensor, gate_bias: torch.Tensor,
                           users: torch.Tensor, items: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, *,
                           beta: float, lr: float = 1e-4, epochs: int = 5, steps: Optional[torch.Tensor] = None,
                           clip_norm: Optional[float] = None, tol: Optional[float] = None) -> GateTraining:
    """Per-user reference of :func:`train_gates` (same arguments, same result up to rounding).

    Written as the code does it, one client model at a time: the full table ``P_u (I, d)``,
    the head and the gate as leaf tensors, the gate input built by concatenation,
    ``torch.nn.utils.clip_grad_norm_`` over all of them, a step on the gate only.
    """
    users, beta, lr, epochs = _check_training_inputs(personal_tables, global_table, head_w, head_b, gate_weight,
                                                     gate_bias, users, items, labels, mask, steps, beta, lr, epochs,
                                                     clip_norm, tol)
    dtype = personal_tables.dtype
    num_clients = users.numel()
    steps = torch.zeros_like(items) if steps is None else steps
    out_w = gate_weight[users.to(gate_weight.device)].detach().clone()
    out_b = gate_bias[users.to(gate_bias.device)].detach().clone()
    losses = torch.full((num_clients, epochs), float("nan"), dtype=dtype, device=personal_tables.device)
    epochs_run = torch.zeros(num_clients, dtype=torch.int64, device=personal_tables.device)
    p_g = global_table.detach()
    for c, user in enumerate(users.tolist()):
        real = mask[c] > 0
        if not bool(real.any()):
            continue
        c_items, c_labels, c_steps = items[c][real], labels[c][real].to(dtype), steps[c][real]
        table = personal_tables[user].detach().clone().requires_grad_(True)  # (I, d) frozen
        e_u = head_w[user].detach().clone().requires_grad_(True)  # (d,) frozen
        c_u = head_b[user].detach().clone().requires_grad_(True)  # () frozen
        w = out_w[c].clone().requires_grad_(True)  # (3d,)
        b = out_b[c].clone().requires_grad_(True)  # ()
        total, count, previous = 0.0, 0, None
        for epoch in range(epochs):
            for step in range(int(c_steps.max()) + 1):
                batch = c_steps == step
                if not bool(batch.any()):
                    continue
                with torch.enable_grad():
                    p_rows, g_rows = table[c_items[batch]], p_g[c_items[batch]]  # (n, d)
                    gate = torch.sigmoid(torch.cat([p_rows, g_rows, p_rows - g_rows], dim=1) @ w + b)  # (n,) Eq. 5
                    fused = p_rows * beta + g_rows * gate[:, None] * (1.0 - beta) * 2.0  # (n, d) Eq. 6
                    loss = F.binary_cross_entropy_with_logits(fused @ e_u + c_u, c_labels[batch])
                    loss.backward()
                if clip_norm is not None:
                    torch.nn.utils.clip_grad_norm_([table, e_u, c_u, w, b], float(clip_norm))
                with torch.no_grad():
                    w -= lr * w.grad
                    b -= lr * b.grad
                for tensor in (table, e_u, c_u, w, b):
                    tensor.grad = None
                total += float(loss.detach()) * int(batch.sum())
                count += int(batch.sum())
            running = total / count
            losses[c, epoch] = running
            epochs_run[c] += 1
            if tol is not None and previous is not None and abs(running - previous) / abs(previous + _TOL_EPS) < tol:
                break
            previous = running
        out_w[c], out_b[c] = w.detach(), b.detach()
    return GateTraining(out_w, out_b, losses, epochs_run)


# -- any guided backbone: the generic path -------------------------------------------------
def _has_linear_head(model: Optional[FederatedModel]) -> bool:
    """Whether the fast path applies: FedRKG's own backbone, ``s = w_u · P_ui + b_u`` (or no model given)."""
    return model is None or (isinstance(model, PersonalItemTableModel) and not model.shared_table)


def _frozen_dense_params(model: FederatedModel, global_state: Dict[str, torch.Tensor],
                         private_state: Dict[str, torch.Tensor], users: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Every dense parameter of the ``C`` clients ``users``, detached: ``name -> (C, ...)``.

    Private ones are the users' own rows; public ones (e.g. FedNCF's tower) one copy per
    client, as each client holds its downloaded copy (and its gradient counts in its clip).
    """
    params = {}
    for name, kind in model.param_kinds.items():
        if kind == "private_dense":
            params[name] = private_state[name][users].detach()  # (C, ...)
        elif kind == "public_dense":
            table = global_state[name].detach()
            params[name] = table.unsqueeze(0).expand(users.numel(), *table.shape).clone()  # (C, ...)
    return params


def fused_model_logits(model: FederatedModel, params: Dict[str, torch.Tensor], rows: torch.Tensor,
                       global_rows: torch.Tensor, gate_weight: torch.Tensor, gate_bias: torch.Tensor,
                       beta: float) -> torch.Tensor:
    """Logits of any guided backbone on fused rows: the generic ``forward_with_gate``.

    Each example's row is fused (Eq. 6, ``P̃_ui = β P_ui + 2(1 − β) g_ui P_gi``) and the
    ``(C·B, d)`` stack of fused rows is handed to ``model.logits`` as its
    ``personal_item_emb`` table, example ``(c, b)`` reading row ``c·B + b``. For
    :class:`~fedlib.models.PersonalItemTableModel` this equals :func:`fused_logits`.

    Args:
        model: a guided backbone (:func:`~fedlib.models.guided.check_guided_model`).
        params: every dense parameter with a leading client axis ``(C, ...)``.
        rows, global_rows: ``(C, B, d)`` ``P_u`` and ``P_g`` rows of each client's examples.
        gate_weight: ``(C, 3d)``; gate_bias: ``(C,)``; beta: ``β``.

    Returns:
        ``(C, B)``.
    """
    gate = torch.sigmoid(_row_gate_logits(rows, global_rows, gate_weight, gate_bias))  # (C, B)
    fused = beta * rows + (2.0 * (1.0 - beta) * gate)[..., None] * global_rows  # (C, B, d) Eq. 6
    num_clients, width, dim = fused.shape
    example_rows = torch.arange(num_clients * width, device=fused.device).view(num_clients, width)  # (C, B)
    return model.logits({**params, PERSONAL_TABLE: fused.reshape(num_clients * width, dim)}, example_rows)


def _check_model_training_inputs(model, global_state, private_state, global_table, gate_weight, gate_bias, users,
                                 items, labels, mask, steps, beta, lr, epochs, clip_norm, tol):
    check_guided_model(model)
    for name, kind in model.param_kinds.items():
        state, which = (global_state, "global_state") if kind.startswith("public") else (private_state, "private_state")
        if name not in state:
            raise ValueError(f"{which} misses {name!r} ({kind}) of {type(model).__name__}: pass the run's "
                             "TrainState.global_state and TrainState.private_state")
    tables = private_state[PERSONAL_TABLE]
    _check_tables(tables, global_table)
    num_users, num_items, dim = tables.shape
    _check_gate(num_users, dim, gate_weight, gate_bias)
    return _check_examples(num_users, num_items, users, items, labels, mask, steps, beta, lr, epochs, clip_norm, tol)


def train_gates_on_model(model: FederatedModel, global_state: Dict[str, torch.Tensor],
                         private_state: Dict[str, torch.Tensor], global_table: torch.Tensor,
                         gate_weight: torch.Tensor, gate_bias: torch.Tensor, users: torch.Tensor, items: torch.Tensor,
                         labels: torch.Tensor, mask: torch.Tensor, *, beta: float, lr: float = 1e-4, epochs: int = 5,
                         steps: Optional[torch.Tensor] = None, clip_norm: Optional[float] = None,
                         tol: Optional[float] = None) -> GateTraining:
    """Eqs. 6–8 for any guided backbone, batched over ``C`` clients: SGD on the gates only.

    As :func:`train_gates` (same schedule, loss, ``clip_norm`` and ``tol`` rules), with the
    score computed by ``model.logits`` on the fused rows (:func:`fused_model_logits`)
    instead of a linear head. Every other parameter, private (user vector, head, PFedRec's
    score MLP) or public (FedNCF's tower, read from ``global_state``), is frozen: it is read,
    never written, and differentiated only when ``clip_norm`` needs its gradient (the code's
    ``clip_grad_norm_`` over all of the client model's parameters; a public parameter counts
    once per client, for its downloaded copy).

    Args:
        model: a guided backbone (:func:`~fedlib.models.guided.guided_backbone`).
        global_state: the public parameters (``name -> tensor``; ``{}`` when there are none).
        private_state: every user's private parameters, with ``personal_item_emb`` ``(U, I, d)``.
        global_table: ``(I, d)`` ``P_g``.
        gate_weight: ``(U, 3d)``; gate_bias: ``(U,)`` the gates before training.
        users, items, labels, mask, steps, beta, lr, epochs, clip_norm, tol: as :func:`train_gates`.

    Returns:
        :class:`GateTraining` with the ``C`` clients' new gates.
    """
    users, beta, lr, epochs = _check_model_training_inputs(model, global_state, private_state, global_table,
                                                           gate_weight, gate_bias, users, items, labels, mask, steps,
                                                           beta, lr, epochs, clip_norm, tol)
    tables = private_state[PERSONAL_TABLE]
    device, dtype = tables.device, tables.dtype
    users = users.to(device)
    num_clients = users.numel()
    num_items, dim = global_table.shape
    items = items.to(device)
    mask = mask.to(device=device, dtype=dtype)
    labels = labels.to(device=device, dtype=dtype)
    steps = torch.zeros_like(items) if steps is None else steps.to(device)
    with torch.no_grad():
        rows = tables[users[:, None], items]  # (C, B, d) frozen P_u rows
        global_rows = global_table[items]  # (C, B, d) frozen P_g rows
    frozen = _frozen_dense_params(model, global_state, private_state, users)  # name -> (C, ...)
    weight = gate_weight[users].detach().clone()  # (C, 3d)
    bias = gate_bias[users].detach().clone()  # (C,)
    clip = clip_norm is not None
    # (client, item) keys of every example slot: duplicates of a row sum into one table-gradient row.
    keys, key_index = torch.unique(torch.arange(num_clients, device=device)[:, None] * num_items + items,
                                   return_inverse=True)
    key_client = keys // num_items

    def batch_gradients(weight, bias, in_batch, count):
        # Only the columns holding this mini-batch are evaluated: a step reads batch_size
        # columns of each client, not the (C, B) padded matrix (B is the busiest client's
        # epoch, 13k examples on LastFM-2K, which made every step cost C·B model evaluations).
        used = in_batch.any(0).nonzero()
        cols = slice(int(used.min()), int(used.max()) + 1) if used.numel() else slice(0, 0)
        with torch.enable_grad():
            gate = [weight.detach().requires_grad_(True), bias.detach().requires_grad_(True)]
            # Frozen parameters become leaves only when the clip needs their gradients.
            row_leaf = rows[:, cols].detach().requires_grad_(clip)
            dense = {name: tensor.detach().requires_grad_(clip) for name, tensor in frozen.items()}
            logits = fused_model_logits(model, dense, row_leaf, global_rows[:, cols], gate[0], gate[1],
                                        beta)  # (C, b) b = columns of this step
            per_example = F.binary_cross_entropy_with_logits(logits, labels[:, cols], reduction="none")  # (C, b)
            client_loss = (per_example * in_batch[:, cols]).sum(1) / count.clamp(min=1.0)  # (C,) 0 without a batch
            wrt = gate + ([row_leaf] + list(dense.values()) if clip else [])
            grads = torch.autograd.grad(client_loss.sum(), wrt, allow_unused=True)
        grads = [torch.zeros_like(leaf) if grad is None else grad for leaf, grad in zip(wrt, grads)]
        grad_w, grad_b = grads[0], grads[1]
        if clip:
            # The code's clip_grad_norm_ over every parameter of the client model (see train_gates).
            row_grad = torch.zeros(keys.numel(), dim, dtype=dtype, device=device)
            row_grad.index_add_(0, key_index[:, cols].reshape(-1), grads[2].reshape(-1, dim))
            squared = torch.zeros(num_clients, dtype=dtype, device=device)
            squared.index_add_(0, key_client, row_grad.pow(2).sum(1))
            squared = squared + grad_w.pow(2).sum(1) + grad_b.pow(2)
            for grad in grads[3:]:
                squared = squared + grad.pow(2).reshape(num_clients, -1).sum(1)
            factor = (float(clip_norm) / (squared.sqrt() + _CLIP_EPS)).clamp(max=1.0)  # (C,)
            grad_w, grad_b = grad_w * factor[:, None], grad_b * factor
        return client_loss, grad_w, grad_b

    return _nested_gate_sgd(weight, bias, mask, steps, lr, epochs, tol, batch_gradients)


def train_gates_on_model_sequential(model: FederatedModel, global_state: Dict[str, torch.Tensor],
                                    private_state: Dict[str, torch.Tensor], global_table: torch.Tensor,
                                    gate_weight: torch.Tensor, gate_bias: torch.Tensor, users: torch.Tensor,
                                    items: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, *, beta: float,
                                    lr: float = 1e-4, epochs: int = 5, steps: Optional[torch.Tensor] = None,
                                    clip_norm: Optional[float] = None, tol: Optional[float] = None) -> GateTraining:
    """Per-user reference of :func:`train_gates_on_model` (same arguments, same result up to rounding).

    One client model at a time, as the code does it: the full table ``P_u (I, d)``, every
    dense parameter (``(1, ...)``) and the gate as leaf tensors, the gate input built by
    concatenation, the fused rows scored by ``model.logits`` one batch at a time,
    ``torch.nn.utils.clip_grad_norm_`` over all of them, a step on the gate only.
    """
    users, beta, lr, epochs = _check_model_training_inputs(model, global_state, private_state, global_table,
                                                           gate_weight, gate_bias, users, items, labels, mask, steps,
                                                           beta, lr, epochs, clip_norm, tol)
    tables = private_state[PERSONAL_TABLE]
    dtype, device = tables.dtype, tables.device
    num_clients = users.numel()
    steps = torch.zeros_like(items) if steps is None else steps
    out_w = gate_weight[users.to(gate_weight.device)].detach().clone()
    out_b = gate_bias[users.to(gate_bias.device)].detach().clone()
    losses = torch.full((num_clients, epochs), float("nan"), dtype=dtype, device=device)
    epochs_run = torch.zeros(num_clients, dtype=torch.int64, device=device)
    p_g = global_table.detach()
    for c, user in enumerate(users.tolist()):
        real = mask[c] > 0
        if not bool(real.any()):
            continue
        c_items, c_labels, c_steps = items[c][real], labels[c][real].to(dtype), steps[c][real]
        table = tables[user].detach().clone().requires_grad_(True)  # (I, d) frozen
        dense = {}  # (1, ...) frozen: this client's copy of every dense parameter
        for name, kind in model.param_kinds.items():
            if kind == "private_dense":
                dense[name] = private_state[name][user].unsqueeze(0).detach().clone().requires_grad_(True)
            elif kind == "public_dense":
                dense[name] = global_state[name].unsqueeze(0).detach().clone().requires_grad_(True)
        w = out_w[c].clone().requires_grad_(True)  # (3d,)
        b = out_b[c].clone().requires_grad_(True)  # ()
        every_parameter = [table, *dense.values(), w, b]
        total, count, previous = 0.0, 0, None
        for epoch in range(epochs):
            for step in range(int(c_steps.max()) + 1):
                batch = c_steps == step
                if not bool(batch.any()):
                    continue
                with torch.enable_grad():
                    p_rows, g_rows = table[c_items[batch]], p_g[c_items[batch]]  # (n, d)
                    gate = torch.sigmoid(torch.cat([p_rows, g_rows, p_rows - g_rows], dim=1) @ w + b)  # (n,) Eq. 5
                    fused = p_rows * beta + g_rows * gate[:, None] * (1.0 - beta) * 2.0  # (n, d) Eq. 6
                    example_rows = torch.arange(fused.shape[0], device=fused.device).unsqueeze(0)  # (1, n)
                    logits = model.logits({**dense, PERSONAL_TABLE: fused}, example_rows)[0]  # (n,)
                    loss = F.binary_cross_entropy_with_logits(logits, c_labels[batch])
                    loss.backward()
                if clip_norm is not None:
                    torch.nn.utils.clip_grad_norm_([t for t in every_parameter if t.grad is not None],
                                                   float(clip_norm))
                with torch.no_grad():
                    w -= lr * w.grad
                    b -= lr * b.grad
                for tensor in every_parameter:
                    tensor.grad = None
                total += float(loss.detach()) * int(batch.sum())
                count += int(batch.sum())
            running = total / count
            losses[c, epoch] = running
            epochs_run[c] += 1
            if tol is not None and previous is not None and abs(running - previous) / abs(previous + _TOL_EPS) < tol:
                break
            previous = running
        out_w[c], out_b[c] = w.detach(), b.detach()
    return GateTraining(out_w, out_b, losses, epochs_run)


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


# ======================================================================================
# Engine plumbing
# ======================================================================================
def gate_examples_from_plan(plan: RoundPlan, device=None, dtype=torch.float32) -> GateExamples:
    """The first local epoch of each client of ``plan`` as padded :class:`GateExamples`.

    The code trains the gate on the user's examples of the guidance round (the same
    positives and negatives as its local training), in mini-batches of the local batch size.
    Here the plan's batches of epoch 1 are reused in every gate epoch (the code reshuffles;
    the order of examples inside a batch does not change its mean loss).
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    counts = plan.num_examples.astype(np.int64)  # (C,) examples of one epoch
    starts = plan.example_indptr[:-1]
    width = int(counts.max(initial=0))
    column = np.arange(width, dtype=np.int64)[None, :]
    valid = column < counts[:, None]  # (C, B)
    index = np.where(valid, starts[:, None] + column, 0)
    return GateExamples(
        users=torch.as_tensor(plan.clients, dtype=torch.int64, device=device),
        items=torch.as_tensor(np.where(valid, plan.items[index], 0), dtype=torch.int64, device=device),
        labels=torch.as_tensor(np.where(valid, plan.labels[index], 0), dtype=dtype, device=device),
        mask=torch.as_tensor(valid, dtype=dtype, device=device),
        steps=torch.as_tensor(np.where(valid, plan.steps[index], 0), dtype=torch.int64, device=device),
    )


def guidance_participants(train: Pairs, config, round_index: int) -> np.ndarray:
    """The participants of round ``round_index``: exactly those of the engine's plan.

    ``make_round_plan`` draws its clients first from ``round_generator(seed, round)``, so
    repeating that draw reproduces them (every user with training data when
    ``config.clients_per_round`` is ``None``, the paper's setting).
    """
    rng = round_generator(config.seed, int(round_index))
    return select_clients(train.active_users(), config.clients_per_round, rng)


def guidance_examples(train: Pairs, sampler: NegativeSampler, config, round_index: int, device=None,
                      dtype=torch.float32) -> GateExamples:
    """Gate-training examples of round ``round_index`` for every user with training data.

    Drawn like the engine's plan of that round (same generator, same options, clients = all
    users with data): with ``config.clients_per_round=None`` the engine's client selection
    draws nothing, so these are exactly the examples of the round's local training, as in
    the code. With client sampling, the users not sampled still get fresh examples (the
    code trains every user's gate), drawn after a different selection, so they differ.
    """
    plan = make_round_plan(train, sampler, round_generator(config.seed, int(round_index)),
                           round_index=int(round_index), num_negatives=config.num_negatives,
                           batch_size=config.batch_size, local_epochs=config.local_epochs,
                           clients=train.active_users())
    return gate_examples_from_plan(plan, device=device, dtype=dtype)


@dataclass(frozen=True)
class KnowledgeGuidance:
    """FedRKG's guidance schedule and its ablations, for any guided backbone (Table 3).

    Attributes:
        beta: ``β`` of Eqs. 3/9 (code: 0.99; paper: 0.999 on LastFM).
        interval: ``T_int``, rounds between aggregations of ``P_g`` (code: 100).
        mode: one of :data:`MODES` (module docstring).
        gate_lr: the gate's SGD learning rate (code: 1e-4).
        gate_epochs: nested training epochs (code: 5, with an early exit).
        gate_clip_norm: the code's ``clip_grad_norm_`` over all parameters (1.0); ``None`` = off.
        gate_tol: the code's early exit on the running mean loss (1e-4); ``None`` = off.
        chunk_size: users processed together (bounds the ``(chunk, I, d)`` temporaries).
    """

    beta: float = 0.99
    interval: int = 100
    mode: str = "adaptive"
    gate_lr: float = 1e-4
    gate_epochs: int = 5
    gate_clip_norm: Optional[float] = 1.0
    gate_tol: Optional[float] = 1e-4
    chunk_size: int = 256

    def __post_init__(self):
        _check_beta(self.beta)
        _check_mode(self.mode)
        if int(self.interval) != self.interval or self.interval < 1:
            raise ValueError(f"interval must be an integer >= 1 (rounds between guidance steps; the code uses 100), "
                             f"got {self.interval!r}")
        if not math.isfinite(float(self.gate_lr)) or self.gate_lr < 0:
            raise ValueError(f"gate_lr must be a finite number >= 0 (the code uses 1e-4), got {self.gate_lr!r}")
        if int(self.gate_epochs) != self.gate_epochs or self.gate_epochs < 0:
            raise ValueError(f"gate_epochs must be an integer >= 0 (the code uses 5), got {self.gate_epochs!r}")
        if self.gate_clip_norm is not None and not float(self.gate_clip_norm) > 0:
            raise ValueError(f"gate_clip_norm must be > 0 or None, got {self.gate_clip_norm!r}")
        if self.gate_tol is not None and not float(self.gate_tol) >= 0:
            raise ValueError(f"gate_tol must be >= 0 or None, got {self.gate_tol!r}")
        if int(self.chunk_size) < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size!r}")

    @property
    def label(self) -> str:
        """The paper's name of this configuration (Table 2)."""
        return MODE_LABELS[self.mode]

    def is_guidance_round(self, round_index: int) -> bool:
        """Whether guidance runs before round ``round_index`` (0-based, ``run_federated``'s ``t``).

        The code aggregates after rounds ``T, 2T, …`` and guides at the start of the next
        round: ``t − 1`` a positive multiple of ``T`` (``T = 100``: rounds 101, 201, …).
        """
        t = int(round_index)
        return t > self.interval and (t - 1) % self.interval == 0

    # -- one guidance step on the stacked private state ------------------------------------
    def guide(self, private_state: Dict[str, torch.Tensor], extra: Dict[str, object], participants,
              examples: Optional[GateExamples] = None, round_index: Optional[int] = None, *,
              model: Optional[FederatedModel] = None,
              global_state: Optional[Dict[str, torch.Tensor]] = None) -> dict:
        """Algorithm 1, lines 10–17, in place on ``private_state["personal_item_emb"]``.

        1. ``P_g`` = unweighted mean of the ``participants``' tables (before any change);
        2. ``"adaptive"``: train the gates of ``examples.users`` (Eqs. 6–8), kept in ``extra``
           (zero-initialised on first use, the code's init);
        3. commit the mode's update for **every** user (the code guides all users, not only
           the participants).

        The gate is trained on the backbone's logits: ``model=None`` or FedRKG's own backbone
        (:class:`PersonalItemTableModel`) take the linear-head fast path (:func:`train_gates`,
        head read from ``private_state``, clients chunked by number of examples); any other
        guided backbone the generic path (:func:`train_gates_on_model`, public parameters read
        from ``global_state``).

        Returns (and appends to ``extra[LOG_KEY]``) a small record: round, mode,
        participants, and for ``"adaptive"`` the mean/std of ``g*`` and the gate losses.
        """
        if model is not None:
            check_guided_model(model)
        tables = private_state[PERSONAL_TABLE]  # (U, I, d)
        num_users, _, dim = tables.shape
        participants = np.asarray(participants, dtype=np.int64)
        record = {"round": None if round_index is None else int(round_index), "mode": self.mode,
                  "participants": int(participants.size)}
        if self.mode == "personal_only":  # w/ PIE: nothing is uploaded, nothing changes
            extra.setdefault(LOG_KEY, []).append(record)
            return record
        with torch.no_grad():
            p_g = global_knowledge(tables, participants, self.chunk_size)  # (I, d)
        chunk = int(self.chunk_size)
        if self.mode == "adaptive":
            weight, bias = self._gates(extra, num_users, dim, tables)
            if examples is not None and self.gate_epochs > 0 and examples.users.numel():
                first, last = [], []

                def store(users, result):
                    users = users.to(weight.device)
                    weight[users], bias[users] = result.weight, result.bias
                    ran = result.epochs_run > 0
                    first.append(result.losses[ran, 0])
                    last.append(result.losses[ran].gather(1, (result.epochs_run[ran] - 1)[:, None])[:, 0])

                options = dict(beta=self.beta, lr=self.gate_lr, epochs=self.gate_epochs,
                               clip_norm=self.gate_clip_norm, tol=self.gate_tol)
                if _has_linear_head(model):  # chunks of clients with similar numbers of examples
                    store(examples.users, _train_gates_bucketed(tables, p_g, private_state["head_w"],
                                                                private_state["head_b"], weight, bias, examples,
                                                                chunk, **options))
                else:  # the same grouping, so a chunk is not padded to the busiest client's epoch
                    for _, part in _buckets_by_count(examples, chunk):
                        store(part.users, train_gates_on_model(
                            model, global_state if global_state is not None else {}, private_state, p_g, weight,
                            bias, part.users, part.items, part.labels, part.mask, steps=part.steps, **options))
                record["gate_loss_first_epoch"] = float(torch.cat(first).mean()) if first else float("nan")
                record["gate_loss_last_epoch"] = float(torch.cat(last).mean()) if last else float("nan")
        total = total_sq = 0.0
        with torch.no_grad():
            for start in range(0, num_users, chunk):
                part = slice(start, min(start + chunk, num_users))
                if self.mode == "adaptive":
                    gate = gate_values(tables[part], p_g, weight[part], bias[part])  # (c, I)
                    total += float(gate.sum())
                    total_sq += float(gate.pow(2).sum())
                    tables[part] = fused_embedding(tables[part], guidance_vector(gate, p_g, self.beta), self.beta)
                else:
                    tables[part] = apply_guidance(tables[part], p_g, self.beta, self.mode)
        if self.mode == "adaptive":
            n = num_users * tables.shape[1]
            mean = total / n
            record.update(gate_mean=mean, gate_std=math.sqrt(max(total_sq / n - mean * mean, 0.0)))
        extra.setdefault(LOG_KEY, []).append(record)
        return record

    @staticmethod
    def _gates(extra: Dict[str, object], num_users: int, dim: int, like: torch.Tensor):
        """The stored gates, created with the code's zero init on first use."""
        if GATE_WEIGHT_KEY not in extra:
            extra[GATE_WEIGHT_KEY] = like.new_zeros((num_users, 3 * dim))
            extra[GATE_BIAS_KEY] = like.new_zeros((num_users,))
        weight, bias = extra[GATE_WEIGHT_KEY], extra[GATE_BIAS_KEY]
        _check_gate(num_users, dim, weight, bias)
        return weight, bias

    # -- the engine hook -------------------------------------------------------------------
    def before_round_hook(self, train: Pairs, config, num_items: int, sampler: Optional[NegativeSampler] = None,
                          inner: Optional[Callable] = None, model: Optional[FederatedModel] = None) -> Callable:
        """A ``before_round(state, t)`` hook for :class:`~fedlib.engine.FederatedMethod`.

        Args:
            train: the training pairs given to ``run_federated``.
            config: the run's :class:`~fedlib.engine.FederatedConfig` (seed and plan options).
            num_items: item count of the backbone.
            sampler: the negative sampler given to ``run_federated`` (``None``: its default,
                ``NegativeSampler(train, num_items)``); it must be the same one for the gate
                examples to be the round's examples.
            inner: an earlier ``before_round`` hook, run first.
            model: the guided backbone whose logits train the gate (``None``: FedRKG's own,
                :class:`PersonalItemTableModel`; see :meth:`guide`).
        """
        sampler = sampler if sampler is not None else NegativeSampler(train, num_items)

        def hook(state, round_index):
            if inner is not None:
                inner(state, round_index)
            if not self.is_guidance_round(round_index) or self.mode == "personal_only":
                return
            participants = guidance_participants(train, config, round_index - 1)  # who uploaded after round t − 1
            examples = None
            if self.mode == "adaptive" and self.gate_epochs > 0:
                tables = state.private_state["personal_item_emb"]
                examples = guidance_examples(train, sampler, config, round_index, device=tables.device,
                                             dtype=tables.dtype)
            self.guide(state.private_state, state.extra, participants, examples, round_index=round_index,
                       model=model, global_state=state.global_state)

        return hook

    def attach(self, method: FederatedMethod, train: Pairs, config, sampler: Optional[NegativeSampler] = None
               ) -> FederatedMethod:
        """``method`` with this guidance in its ``before_round`` hook (an existing hook runs first).

        ``method.model`` must hold a personal item table and no shared one: FedRKG's backbone
        (:class:`PersonalItemTableModel` without a shared table, e.g.
        ``personal_table_method(model)``) or any guided backbone of Table 3, e.g.
        ``guided_method(guided_backbone("FedNCF", U, I, d))`` (:mod:`fedlib.models.guided`).
        """
        model = method.model
        check_guided_model(model)  # ValueError naming what is wrong and how to build a guided model
        hook = self.before_round_hook(train, config, model.num_items, sampler, inner=method.before_round,
                                      model=model)
        name = f"{method.name}+{self.label}" if method.name else self.label
        return dataclasses.replace(method, before_round=hook, name=name)


# ======================================================================================
# §5.1 memory analysis
# ======================================================================================
def client_parameter_counts(model: FederatedModel, mode: str = "adaptive") -> Dict[str, int]:
    """Numbers one client stores, counted from the backbone's own initialisers (§5.1).

    Counts one user's share of every private parameter and the whole of every public one
    (the client holds its downloaded copy, e.g. FedNCF's tower), plus the gate ``3d + 1`` in
    ``"adaptive"`` mode. The initialisers run on the ``meta`` device (no ``U × I × d`` tensor
    is allocated; only the small per-parameter draws on the CPU).

    Keys: every parameter name; ``"gate"``; ``"stored"`` (between guidance rounds and at
    inference); ``"peak"`` (during guidance, when ``P_g`` (``I × d``) is downloaded too;
    equal to ``"stored"`` for ``"personal_only"`` and for a backbone that already holds a
    public table).

    Paper: ``md + 4d + 1`` stored, ``2md + 4d + 1`` at the guidance peak (``m`` items), for
    FedMF. Ours is one more (``md + 4d + 2``): the code's head is ``Linear(d → 1)``, with a
    bias. A dual-knowledge client (FedRAP: ``PersonalItemTableModel(shared_table=True)``)
    stores ``2md + d + 1`` at all times. Guided FedNCF / PFedRec add their own parameters
    (user vector, tower, score MLP) to the same ``md`` table.

    Args:
        model: :class:`PersonalItemTableModel` (either form) or a guided backbone
            (:func:`~fedlib.models.guided.guided_backbone`).
        mode: one of :data:`MODES`.
    """
    _check_mode(mode)
    dual_knowledge = isinstance(model, PersonalItemTableModel) and model.shared_table
    if not dual_knowledge:
        if not isinstance(model, FederatedModel):
            raise ValueError("model must be a federated backbone with a personal item table, "
                             f"got {type(model).__name__}")
        check_guided_model(model)
    generator = torch.Generator().manual_seed(0)
    public = model.init_global(generator, device="meta")
    private = model.init_private(generator, device="meta")
    counts = {}
    for name, kind in model.param_kinds.items():
        if kind.startswith("public"):
            counts[name] = int(public[name].numel())  # the client's downloaded copy
        else:
            counts[name] = int(private[name].numel()) // model.num_users  # (U, ...) stacked: one user's share
    dim = int(private[PERSONAL_TABLE].shape[-1])
    guided = mode != "personal_only" and not dual_knowledge
    counts["gate"] = 3 * dim + 1 if mode == "adaptive" and not dual_knowledge else 0
    counts["stored"] = sum(counts.values())
    counts["peak"] = counts["stored"] + (model.num_items * dim if guided else 0)
    return counts
