r"""FedRAP: a private item *personality* table added to a shared, sparse item *commonality* table.

Reference:
    Li, Long, Zhou. "Federated Recommendation with Additive Personalization" (FedRAP).
    ICLR 2024. arXiv:2301.09109. Public code ``mtics/FedRAP`` (read at commit 550765d:
    ``model/model.py``, ``model/loss.py``, ``model/engine.py``, ``train.py``), summarised in
    ``shared/notes/FedRKG-reference.md`` §6. FedRKG (``shared/seeds/003``, Table 1 and
    Appendix C.2) uses it as its "dual-knowledge" baseline "with two regularization
    coefficients modulated by a tanh annealing schedule as described in the original paper".

Notation: ``U`` users, ``I`` items, ``d`` dimensions; ``D_u (I, d)`` the item personality of
user ``u`` (private, the backbone's ``personal_item_emb``); ``C (I, d)`` the item commonality
(public, averaged by the server, the backbone's ``item_emb``); ``(w_u, b_u)`` a private
``Linear(d → 1)`` head; round ``t`` 0-based; a client's batch holds ``n`` examples
``(i_b, y_b)``::

    ŷ_ui  = σ(w_u · (D_u[i] + C[i]) + b_u)                                   score (additive items)
    L_u   = BCE(ŷ, y)                                                        mean over the batch
            − λ_t · 1/(n d) Σ_b ‖D_u[i_b] − C[i_b]‖²      independence: push D_u away from C
            + μ_t · 1/(n d) Σ_b ‖C[i_b]‖₁                  sparsity of the shared table (L1)
    λ_t   = λ · tanh(t / 10),   μ_t = μ · tanh(t / 10)                       curriculum
    C    ← 1/|S| Σ_{u ∈ S} C_u                      server: uniform mean of the uploaded copies

The paper states the two regularisers on whole tables (``‖D_u − C‖²_F`` and ``‖C‖₁``); the
public code evaluates ``MSELoss`` and ``L1Loss`` on the rows *gathered for the batch* (mean
over ``n × d`` entries, an item drawn twice counts twice). We follow the code, which is also
what the engine can compute: a client loss only ever sees the rows of its current batch.

Defaults (notes §6): ``λ = μ = 0.1``, L1 sparsity, head lr 0.5, item-table lr 200 (no
``× I`` scaling), learning rates × 0.97 after every round, 10 local epochs, batch 2048
(:data:`FEDRAP_CODE_CONFIG`). Every client starts from one shared draw of ``D`` and the head
(``nn.Embedding`` ``N(0, 1)``, ``nn.Linear`` ``U(±1/√d)``); ``C`` is a separate ``N(0, 1)`` draw.

The independence term is unbounded below (``D_u`` and ``C`` can drift apart for ever), so the
reported training loss can turn negative and keep falling (on a 14-user toy with the default
item lr 200 it does within a few rounds): watch the BCE part or validation metrics instead.

What the code does and this module does not (the engine has no place for it):

* the curriculum: the code computes ``λ·tanh(iteration/10)`` after round ``iteration`` (so
  round ``t`` would use ``tanh((t − 1)/10)``), but ``Loss`` reads the *fixed*
  ``config['lambda']``/``config['mu']``, so in the version read the ramp never reaches the
  loss. We follow the paper (``curriculum="tanh"``); ``curriculum="constant"`` reproduces the
  code's effective behaviour;
* an ``ExponentialLR(0.95)`` stepped after every *batch* inside a client's local training;
* stopping local epochs early when the relative change of the epoch loss is below 1e-4.

How the round index reaches the loss. ``FederatedMethod.client_loss(model, params, batch)``
is not told the round, but ``before_round(state, t)`` is. :class:`FedRAPLoss` is therefore a
small object with a ``round_index`` that its :meth:`FedRAPLoss.before_round` hook sets;
:func:`fedrap_method` wires the two together. Code that drives an executor directly (without
:func:`~fedlib.engine.run_federated`) must call ``loss.set_round(t)`` itself.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F

from fedlib.engine.method import FederatedMethod, LocalBatch
from fedlib.models.base import FederatedModel
from fedlib.models.personal import PersonalItemTableModel

__all__ = [
    "CURRICULA", "FEDRAP_CODE_CONFIG", "curriculum_weight", "independence_term", "sparsity_term",
    "fedrap_objective", "FedRAP", "FedRAPLoss", "fedrap_method",
]

#: Curriculum schedules of ``λ_t``, ``μ_t``: ``"tanh"`` (paper), ``"constant"`` (code's effective).
CURRICULA = ("tanh", "constant")

#: Local-training settings of the public code (``train.py`` defaults, notes §6), for a
#: :class:`~fedlib.engine.FederatedConfig`. FedRKG's comparison fixes batch 256 and one local
#: epoch for every method instead (Appendix C.2).
FEDRAP_CODE_CONFIG = {"batch_size": 2048, "local_epochs": 10, "num_negatives": 4}


def _check_weight(name: str, value: float) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number >= 0, got {value!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0 (it weights a regulariser; use 0 to switch the "
                         f"term off), got {value!r}")
    return value


def curriculum_weight(round_index: int, curriculum: str = "tanh", scale: float = 10.0) -> float:
    """The curriculum factor of round ``t``: ``tanh(t / scale)`` (``"tanh"``) or 1 (``"constant"``).

    ``λ_t = λ · curriculum_weight(t)`` and ``μ_t = μ · curriculum_weight(t)``. With the tanh
    schedule round 0 trains without regularisers, round 10 at 76 %, round 30 at 99.5 %.

    Args:
        round_index: 0-based round ``t`` (rounds completed before this one), ``>= 0``.
        curriculum: one of :data:`CURRICULA`.
        scale: rounds per unit of the tanh argument (10 in the paper and code), ``> 0``.

    Returns:
        A float in ``[0, 1]``.
    """
    if curriculum not in CURRICULA:
        raise ValueError(f"unknown curriculum {curriculum!r}: use one of {CURRICULA} "
                         "('tanh' = the paper's schedule, 'constant' = the public code's effective one)")
    if int(round_index) < 0:
        raise ValueError(f"round_index must be >= 0 (0-based rounds), got {round_index}")
    if curriculum == "constant":
        return 1.0
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a finite number > 0 (rounds per unit of tanh), got {scale!r}")
    return math.tanh(int(round_index) / scale)


def _check_rows(personality: torch.Tensor, commonality: torch.Tensor, mask: torch.Tensor) -> None:
    if personality.shape != commonality.shape:
        raise ValueError(
            f"personality rows {tuple(personality.shape)} and commonality rows {tuple(commonality.shape)} differ: "
            "gather both tables with the same (C, B) row index, e.g. table[batch.rows]")
    if personality.dim() != 3 or personality.shape[:2] != mask.shape:
        raise ValueError(
            f"item rows must be (C, B, d) with (C, B) = mask.shape {tuple(mask.shape)}, got {tuple(personality.shape)}")


def independence_term(personality: torch.Tensor, commonality: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``1/(n d) Σ_b ‖D_u[i_b] − C[i_b]‖²`` per client: the code's ``MSELoss(D rows, C rows)``.

    Args:
        personality: ``(C, B, d)`` each client's rows ``D_u[i_b]`` of its batch.
        commonality: ``(C, B, d)`` the rows ``C[i_b]`` (the client's local copy).
        mask: ``(C, B)`` 1 for real examples, 0 for padding.

    Returns:
        ``(C,)``; subtracted (times ``λ_t``) from the loss, so minimising the loss *increases* it.
    """
    _check_rows(personality, commonality, mask)
    squared = (personality - commonality).pow(2).sum(-1)  # (C, B)
    return (squared * mask).sum(1) / (mask.sum(1).clamp(min=1) * personality.shape[-1])


def sparsity_term(commonality: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``1/(n d) Σ_b ‖C[i_b]‖₁`` per client: the code's ``L1Loss(C rows, 0)``.

    Args:
        commonality: ``(C, B, d)``.
        mask: ``(C, B)``.

    Returns:
        ``(C,)``.
    """
    _check_rows(commonality, commonality, mask)
    absolute = commonality.abs().sum(-1)  # (C, B)
    return (absolute * mask).sum(1) / (mask.sum(1).clamp(min=1) * commonality.shape[-1])


def fedrap_objective(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, personality: torch.Tensor,
                     commonality: torch.Tensor, lam: float, mu: float) -> torch.Tensor:
    """FedRAP's local loss ``BCE − λ · independence + μ · sparsity`` per client (module docstring).

    Args:
        logits: ``(C, B)`` ``w_u · (D_u[i] + C[i]) + b_u``.
        labels: ``(C, B)`` 1 / 0.
        mask: ``(C, B)`` 1 for real examples.
        personality, commonality: ``(C, B, d)`` the rows of the batch.
        lam, mu: the round's weights ``λ_t``, ``μ_t`` (already multiplied by the curriculum), ``>= 0``.

    Returns:
        ``(C,)`` each client's loss.
    """
    lam, mu = _check_weight("lam", lam), _check_weight("mu", mu)
    if logits.shape != labels.shape or logits.shape != mask.shape:
        raise ValueError(f"logits {tuple(logits.shape)}, labels {tuple(labels.shape)} and mask {tuple(mask.shape)} "
                         "must all be (C, B)")
    losses = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")  # (C, B)
    bce = (losses * mask).sum(1) / mask.sum(1).clamp(min=1)  # (C,)
    return bce - lam * independence_term(personality, commonality, mask) + mu * sparsity_term(commonality, mask)


class FedRAP(PersonalItemTableModel):
    """FedRAP's backbone: ``s_ui = w_u · (D_u[i] + C[i]) + b_u``.

    A :class:`~fedlib.models.PersonalItemTableModel` with its public table switched on.
    Parameters and roles (``param_kinds``):

    ==========================  =================  ======================================
    ``personal_item_emb``       ``private_rows``   ``D_u``, ``(U, I, d)``, never uploaded
    ``item_emb``                ``public_rows``    ``C``, ``(I, d)``, averaged by the server
    ``head_w``, ``head_b``      ``private_dense``  ``w_u (U, d)``, ``b_u (U,)``
    ==========================  =================  ======================================
    """

    #: name of the personality table ``D_u``
    personality = "personal_item_emb"
    #: name of the commonality table ``C``
    commonality = "item_emb"

    def __init__(self, num_users: int, num_items: int, dim: int = 32, init_std: float = 1.0):
        super().__init__(num_users, num_items, dim, shared_table=True, init_std=init_std)


def _table_names(model: FederatedModel) -> Tuple[str, str]:
    """``(personality, commonality)`` parameter names of a FedRAP-style backbone."""
    personality = getattr(model, "personality", "personal_item_emb")
    commonality = getattr(model, "commonality", "item_emb")
    kinds = getattr(model, "param_kinds", {})
    if kinds.get(personality) != "private_rows" or kinds.get(commonality) != "public_rows":
        raise ValueError(
            f"FedRAP needs a private personality table and a public commonality table, but the model's param_kinds "
            f"are {dict(kinds)}: use fedlib.methods.fedrap.FedRAP(...) (or PersonalItemTableModel(shared_table=True))")
    return personality, commonality


class FedRAPLoss:
    """FedRAP's client loss with the round's curriculum weights (a :data:`~fedlib.engine.method.ClientLossFn`).

    Call signature ``(model, params, batch) -> (C,)`` as the engine expects. The round index
    it uses is set by :meth:`before_round` (pass it as the method's ``before_round`` hook, as
    :func:`fedrap_method` does) or by :meth:`set_round`.

    Args:
        lam, mu: base weights ``λ``, ``μ`` (0.1, 0.1), ``>= 0``.
        curriculum: one of :data:`CURRICULA`.
        scale: the tanh curriculum's rounds per unit (10).
    """

    def __init__(self, lam: float = 0.1, mu: float = 0.1, curriculum: str = "tanh", scale: float = 10.0):
        self.lam, self.mu = _check_weight("lam", lam), _check_weight("mu", mu)
        curriculum_weight(0, curriculum, scale)  # validates both
        self.curriculum, self.scale = curriculum, float(scale)
        self.round_index = 0

    def set_round(self, round_index: int) -> None:
        """Use the weights of round ``round_index`` from now on."""
        curriculum_weight(round_index, self.curriculum, self.scale)  # validates
        self.round_index = int(round_index)

    def before_round(self, state, round_index: int) -> None:
        """Engine hook ``(state, t) -> None``: sets the round; the state is not touched."""
        self.set_round(round_index)

    def weights(self, round_index: Optional[int] = None) -> Tuple[float, float]:
        """``(λ_t, μ_t)`` of round ``round_index`` (default: the current round)."""
        t = self.round_index if round_index is None else int(round_index)
        factor = curriculum_weight(t, self.curriculum, self.scale)
        return self.lam * factor, self.mu * factor

    def __call__(self, model: FederatedModel, params: Mapping[str, torch.Tensor], batch: LocalBatch) -> torch.Tensor:
        personality, commonality = _table_names(model)
        lam, mu = self.weights()
        logits = model.logits(params, batch.rows)  # (C, B)
        d_rows = params[personality][batch.rows]  # (C, B, d)
        c_rows = params[commonality][batch.rows]  # (C, B, d)
        return fedrap_objective(logits, batch.labels, batch.mask, d_rows, c_rows, lam, mu)

    def __repr__(self) -> str:
        return (f"FedRAPLoss(lam={self.lam}, mu={self.mu}, curriculum={self.curriculum!r}, scale={self.scale}, "
                f"round_index={self.round_index})")


def _chain(first: Callable, second: Optional[Callable]) -> Callable:
    if second is None:
        return first

    def hook(state, round_index):
        first(state, round_index)
        second(state, round_index)
    return hook


def fedrap_method(model: FedRAP, lr: float = 0.5, lr_items: float = 200.0, lam: float = 0.1, mu: float = 0.1,
                  curriculum: str = "tanh", curriculum_scale: float = 10.0, lr_decay: float = 0.97,
                  **kwargs) -> FederatedMethod:
    """FedRAP as an engine method: the code's learning rates, :class:`FedRAPLoss`, uniform FedAvg of ``C``.

    Args:
        model: a :class:`FedRAP` backbone (or any model with the same two tables).
        lr: head learning rate (code's ``lr_network``; notes: 0.5).
        lr_items: learning rate of both item tables ``D_u`` and ``C`` (``lr_args``; notes: 200).
        lam, mu: regulariser weights ``λ``, ``μ`` (0.1 each).
        curriculum, curriculum_scale: see :func:`curriculum_weight`.
        lr_decay: every learning rate × this after each round (code's ``decay_rate`` 0.97).
        **kwargs: other :class:`~fedlib.engine.FederatedMethod` fields. A ``before_round``
            given here runs after the loss's own hook; ``client_loss`` cannot be replaced.

    Returns:
        The :class:`~fedlib.engine.FederatedMethod`; its ``client_loss`` is the
        :class:`FedRAPLoss` (read ``method.client_loss.weights(t)`` for ``(λ_t, μ_t)``).
    """
    personality, commonality = _table_names(model)
    if "client_loss" in kwargs:
        raise ValueError("fedrap_method builds its own client_loss (FedRAPLoss); pass lam/mu/curriculum instead")
    for name, value in (("lr", lr), ("lr_items", lr_items)):
        if not math.isfinite(float(value)) or float(value) < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    loss = FedRAPLoss(lam, mu, curriculum, curriculum_scale)
    rates = {name: float(lr_items) if name in (personality, commonality) else float(lr) for name in model.param_kinds}
    hook = _chain(loss.before_round, kwargs.pop("before_round", None))
    kwargs.setdefault("name", "FedRAP")
    return FederatedMethod(model, rates, lr_decay=lr_decay, client_loss=loss, before_round=hook, **kwargs)
