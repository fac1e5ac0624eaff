r"""FedRAP: a private item *personality* table added to a shared, sparse item *commonality* table.

Reference:
    Li, Long, Zhou. "Federated Recommendation with Additive Personalization" (FedRAP).
    ICLR 2024. arXiv:2301.09109. Public code ``mtics/FedRAP`` (read at commit 550765d:
    ``model/model.py``, ``model/loss.py``, ``model/engine.py``, ``train.py``). FedRKG
    (Lim et al., arXiv:2511.12959, Table 1 and
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

Defaults (the public code's ``train.py``): ``λ = μ = 0.1``, L1 sparsity, head lr 0.5, item-table lr 200 (no
``× I`` scaling), learning rates × 0.97 after every round, 10 local epochs, batch 2048
(:data:`FEDRAP_CODE_CONFIG`). Every client starts from one shared draw of ``D`` and the head
(``nn.Embedding`` ``N(0, 1)``, ``nn.Linear`` ``U(±1/√d)``); ``C`` is a separate ``N(0, 1)`` draw.

The independence term is unbounded below (``D_u`` and ``C`` can drift apart for ever), so the
reported training loss can turn negative and keep falling (on a 14-user toy with the default
item lr 200 it does within a few rounds): watch the BCE part or validation metrics instead.

Where the code departs from the paper, and how to get the code's behaviour:

* the curriculum: the code computes ``λ·tanh(iteration/10)`` after round ``iteration`` (so
  round ``t`` would use ``tanh((t − 1)/10)``), but ``Loss`` reads the *fixed*
  ``config['lambda']``/``config['mu']``, so in the version read the ramp never reaches the
  loss. We follow the paper (``curriculum="tanh"``); ``curriculum="constant"`` reproduces the
  code's effective behaviour;
* the client optimiser: ``SGD(weight_decay=1e-4)`` on the head and both tables (every row, at
  the item rate 200: −2 % per batch), an ``ExponentialLR(0.95)`` stepped after every *batch*
  inside a client's local training, and local epochs stopped when the relative change of the
  running loss is below 1e-4. The engine's executors take plain SGD steps;
  :class:`FedRAPCodeExecutor` takes the code's (:data:`FEDRAP_CODE_OPTIMIZER`).

How the round index reaches the loss. ``FederatedMethod.client_loss(model, params, batch)``
is not told the round, but ``before_round(run, t, plan)`` is. :class:`FedRAPLoss` is therefore a
small object with a ``round_index`` that its :meth:`FedRAPLoss.before_round` hook sets;
:func:`fedrap_method` wires the two together. Code that drives an executor directly (without
:func:`~fedlib.engine.run_federated`) must call ``loss.set_round(t)`` itself.
"""
from __future__ import annotations

import math
from typing import Mapping, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from fedlib.engine.method import FederatedMethod, LocalBatch, chain_hooks
from fedlib.models.base import FederatedModel
from fedlib.models.personal import PersonalItemTableModel

__all__ = [
    "CURRICULA", "FEDRAP_CODE_CONFIG", "curriculum_weight", "independence_term", "sparsity_term",
    "fedrap_objective", "FedRAP", "FedRAPLoss", "fedrap_method", "FEDRAP_CODE_OPTIMIZER", "FedRAPCodeExecutor",
]

#: Curriculum schedules of ``λ_t``, ``μ_t``: ``"tanh"`` (paper), ``"constant"`` (code's effective).
CURRICULA = ("tanh", "constant")

#: Local-training settings of the public code (``train.py`` defaults), for a
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
            f"are {dict(kinds)}: use fedlib.baselines.single_domain.fedrap.FedRAP(...) (or PersonalItemTableModel(shared_table=True))")
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

    def before_round(self, run, round_index: int, plan) -> None:
        """Engine hook ``(run, t, plan) -> None``: sets the round; the run and the plan are not touched."""
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
    hook = chain_hooks(loss.before_round, kwargs.pop("before_round", None))
    kwargs.setdefault("name", "FedRAP")
    return FederatedMethod(model, rates, lr_decay=lr_decay, client_loss=loss, before_round=hook, **kwargs)


# ======================================================================================
# The public code's local optimiser: weight decay, per-batch decay, early-stopped epochs
# ======================================================================================
#: The rest of the public code's client optimiser (``model/engine.py`` at 550765d): SGD with
#: ``weight_decay=l2_regularization`` (1e-4 in ``train.py``) on the head and both tables, an
#: ``ExponentialLR(0.95)`` stepped after every batch (a fresh one per client and round), and
#: local epochs stopped once the loss changes by less than ``tol`` (relative).
FEDRAP_CODE_OPTIMIZER = {"weight_decay": 1e-4, "batch_lr_decay": 0.95, "tol": 1e-4}


def _code_optimizer_settings(weight_decay: float, batch_lr_decay: float, tol: float) -> Tuple[float, float, float]:
    weight_decay = _check_weight("weight_decay", weight_decay)
    tol = _check_weight("tol", tol)
    batch_lr_decay = float(batch_lr_decay)
    if not (math.isfinite(batch_lr_decay) and 0 < batch_lr_decay <= 1):
        raise ValueError(f"batch_lr_decay must be in (0, 1] (the factor of every local batch's learning rate; 1 = "
                         f"no decay), got {batch_lr_decay!r}")
    return weight_decay, batch_lr_decay, tol


def _fedrap_step_gradients(d_rows: torch.Tensor, c_rows: torch.Tensor, head_w: torch.Tensor, head_b: torch.Tensor,
                           client: torch.Tensor, labels: torch.Tensor, num_clients: int, lam: float, mu: float):
    r"""Each client's FedRAP loss on its batch and its gradients in closed form, every client at once.

    The batch is unpadded: example ``e`` belongs to client ``c_e`` and reads rows ``D_e``,
    ``C_e`` (of its local copies); ``n_c`` is client ``c``'s batch size. With
    ``s_e = w_c · (D_e + C_e) + b_c`` and ``g_e = (σ(s_e) − y_e) / n_c`` (the derivative of the
    mean BCE), :func:`fedrap_objective`'s gradients are::

        ∂L/∂D_e = g_e w_c − 2λ/(n_c d) (D_e − C_e)
        ∂L/∂C_e = g_e w_c + 2λ/(n_c d) (D_e − C_e) + μ/(n_c d) sign(C_e)
        ∂L/∂w_c = Σ_e g_e (D_e + C_e),     ∂L/∂b_c = Σ_e g_e

    (``sign(0) = 0``, as autograd's ``abs``). This replaces the padded ``(C, B, d)`` batch and
    the autograd pass; :class:`FedRAPCodeExecutor`'s ``reference=True`` path (autograd and
    ``torch.optim.SGD``, one client at a time) checks it in ``tests/test_fedrap.py``.

    Args:
        d_rows, c_rows: ``(E, d)`` the examples' personality and commonality rows.
        head_w: ``(C, d)``; head_b: ``(C,)`` every client of the chunk.
        client: ``(E,) int64`` each example's client in ``0 .. C − 1``.
        labels: ``(E,)`` 1 / 0.
        num_clients: ``C``.
        lam, mu: the round's ``λ_t``, ``μ_t``.

    Returns:
        ``(loss (C,), n (C,), ∂D (E, d), ∂C (E, d), ∂w (C, d), ∂b (C,))``; a client without an
        example has loss 0, ``n = 0`` and zero gradients. Gradients are per example: rows
        drawn twice are summed by the caller's scatter.
    """
    dim = d_rows.shape[1]
    w = head_w.index_select(0, client)  # (E, d); index_select: several times faster than head_w[client] on CPU
    items = d_rows + c_rows  # (E, d)
    logits = (items * w).sum(1) + head_b.index_select(0, client)  # (E,)
    sizes = torch.zeros(num_clients, dtype=d_rows.dtype, device=d_rows.device).index_add_(
        0, client, torch.ones_like(logits))  # (C,) n_c
    per_example = sizes.clamp(min=1).index_select(0, client)  # (E,)
    diff = d_rows - c_rows
    bce = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")  # (E,)
    terms = (bce - lam / dim * diff.pow(2).sum(1) + mu / dim * c_rows.abs().sum(1)) / per_example  # (E,)
    loss = torch.zeros_like(sizes).index_add_(0, client, terms)  # (C,)
    g = (torch.sigmoid(logits) - labels) / per_example  # (E,) ∂L/∂s_e
    common = g[:, None] * w  # (E, d)
    pull = diff * (2.0 * lam / dim / per_example)[:, None]
    grad_d = common - pull
    grad_c = common + pull + torch.sign(c_rows) * (mu / dim / per_example)[:, None]
    grad_w = torch.zeros_like(head_w).index_add_(0, client, g[:, None] * items)
    grad_b = torch.zeros_like(head_b).index_add_(0, client, g)
    return loss, sizes, grad_d, grad_c, grad_w, grad_b


class FedRAPCodeExecutor:
    r"""FedRAP's local training exactly as its public code optimises it, many clients at once.

    The public code (``model/engine.py``, ``train.py`` at 550765d) gives every client, every
    round, a fresh ``torch.optim.SGD`` over the head, ``D_u`` and ``C`` with
    ``weight_decay = wd`` and a fresh ``ExponentialLR(γ)`` stepped after every batch. In local
    batch ``k`` (0-based, counted over epochs) of round ``t`` a parameter ``θ`` with rate
    ``η_t`` (``η × 0.97^t``) therefore moves by::

        θ ← (1 − η_t γ^k wd) · θ − η_t γ^k ∂L_u/∂θ                              (every row of θ)

    with ``∂L_u/∂θ`` zero outside the batch's rows. After each epoch ``e ≥ 1`` the client stops
    when ``|A_e − A_{e−1}| / |A_{e−1}| < tol``, where ``A_e`` is the code's running loss: the
    example-weighted mean of every batch loss of the round so far (the code never resets its
    sums between epochs). The client reports ``A`` of its last epoch as its loss.

    Weight decay reaches every row, not only those the client trains on. A row the client
    never touches in the round only shrinks, to ``f_u · θ`` with ``f_u = Π_k (1 − η_t γ^k wd)``
    over the batches it ran. So the local copies cover the touched rows only (as in
    :class:`~fedlib.engine.BatchedExecutor`), every other row is scaled by ``f_u`` in closed
    form: ``D_u`` in place, and ``C``'s upload through
    ``Σ_u w_u (C_u − C) = (Σ_u w_u (f_u − 1)) C + Σ_{u, touched i} w_u (C_u[i] − f_u C[i])``.

    ``reference=True`` runs the readable path instead: one client at a time, whole tables,
    ``torch.optim.SGD`` and ``ExponentialLR`` as the code uses them. Tests check the two
    against each other.

    Args:
        weight_decay: ``wd`` (code: 1e-4), ``>= 0``.
        batch_lr_decay: ``γ`` (code: 0.95), in ``(0, 1]``.
        tol: relative change of the running loss that ends local training (code: 1e-4);
            0 never stops early.
        chunk_size: clients per chunk (clients of similar batch width are chunked together,
            :func:`~fedlib.engine.executors.width_bucketed_chunks`).
        reference: the one-client-at-a-time path.

    The method must be a FedRAP method (:func:`fedrap_method`; its :class:`FedRAPLoss` gives
    ``λ_t``, ``μ_t``, its rates and ``lr_decay`` give ``η_t``) without clipping, noise or Adam.
    """

    name = "fedrap-code"

    def __init__(self, weight_decay: float = 1e-4, batch_lr_decay: float = 0.95, tol: float = 1e-4,
                 chunk_size: int = 256, reference: bool = False):
        self.weight_decay, self.batch_lr_decay, self.tol = _code_optimizer_settings(weight_decay, batch_lr_decay, tol)
        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size!r}")
        self.chunk_size, self.reference = int(chunk_size), bool(reference)

    def _check(self, method: FederatedMethod, return_client_updates: bool) -> Tuple[str, str]:
        personality, commonality = _table_names(method.model)
        problems = []
        if not isinstance(method.client_loss, FedRAPLoss):
            problems.append("its client_loss is not a FedRAPLoss (build it with fedrap_method)")
        if method.grad_clip_norm is not None or getattr(method, "step_clip_norm", None) is not None:
            problems.append("it clips gradients")
        if method.gradient_noise is not None or method.adds_upload_noise:
            problems.append("it adds noise")
        if method.optimizer.is_adam:
            problems.append("it uses Adam")
        if len(method.steps) != 1:
            problems.append(f"it has {len(method.steps)} update groups (the code steps everything at once)")
        if return_client_updates:
            problems.append("per-client uploads were requested")
        if problems:
            raise ValueError("FedRAPCodeExecutor runs the public code's plain SGD step only, but " + "; ".join(problems)
                             + ". Use fedlib.engine.BatchedExecutor for other settings.")
        return personality, commonality

    @torch.enable_grad()
    def local_updates(self, method: FederatedMethod, global_state, private_state, plan, weights, *,
                      return_client_updates: bool = False, **kwargs):
        """Run the round's local updates (the interface of :class:`~fedlib.engine.BatchedExecutor`)."""
        from fedlib.engine.executors import (DEFAULT_WIDTH_RATIO, LocalUpdateResult, client_batch_widths,
                                             width_bucketed_chunks)

        personality, commonality = self._check(method, return_client_updates)
        table = global_state[commonality]
        update = {commonality: torch.zeros_like(table)}
        losses = torch.zeros(plan.num_clients, dtype=table.dtype, device=table.device)
        weights = np.asarray(weights, dtype=np.float64)
        rates = {name: method.lr(name, plan.round_index) for name in method.model.param_kinds}
        if self.reference:
            for position in range(plan.num_clients):
                self._reference_client(method, global_state, private_state, plan, position, float(weights[position]),
                                       rates, update, losses)
        else:
            for positions in width_bucketed_chunks(client_batch_widths(plan), self.chunk_size, DEFAULT_WIDTH_RATIO):
                self._chunk(method, global_state, private_state, plan, positions, weights, rates, update, losses)
        return LocalUpdateResult(update, losses, None)

    # -- the readable path ------------------------------------------------------------------
    def _reference_client(self, method, global_state, private_state, plan, position, weight, rates, update, losses):
        model = method.model
        personality, commonality = _table_names(model)
        user = int(plan.clients[position])
        params = {personality: private_state[personality][user].clone(), commonality: global_state[commonality].clone(),
                  "head_w": private_state["head_w"][user].clone(), "head_b": private_state["head_b"][user].clone()}
        for tensor in params.values():
            tensor.requires_grad_(True)
        optimizer = torch.optim.SGD([{"params": [params["head_w"], params["head_b"]], "lr": rates["head_w"]},
                                     {"params": [params[personality]], "lr": rates[personality]},
                                     {"params": [params[commonality]], "lr": rates[commonality]}],
                                    weight_decay=self.weight_decay)
        scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=self.batch_lr_decay)
        lam, mu = method.client_loss.weights(plan.round_index)
        examples = np.arange(plan.example_indptr[position], plan.example_indptr[position + 1])
        steps_per_epoch = max(int(plan.num_steps[position]) // plan.local_epochs, 1)
        loss_sum, example_count, running = 0.0, 0, []
        for step in range(int(plan.num_steps[position])):
            batch = examples[plan.steps[examples] == step]
            items = torch.as_tensor(plan.items[batch], device=params[commonality].device)
            labels = torch.as_tensor(plan.labels[batch], dtype=params[commonality].dtype,
                                     device=params[commonality].device)
            d_rows, c_rows = params[personality][items], params[commonality][items]  # (n, d)
            logits = (d_rows + c_rows) @ params["head_w"] + params["head_b"]  # (n,)
            loss = fedrap_objective(logits[None], labels[None], torch.ones_like(labels)[None], d_rows[None],
                                    c_rows[None], lam, mu)[0]
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            loss_sum += float(loss.detach()) * batch.size
            example_count += batch.size
            if (step + 1) % steps_per_epoch == 0:  # end of an epoch: the code's convergence check
                running.append(loss_sum / example_count)
                if len(running) > 1 and running[-2] != 0 and abs(running[-1] - running[-2]) / abs(running[-2]) < self.tol:
                    break
        with torch.no_grad():
            update[commonality] += weight * (params[commonality] - global_state[commonality])
            private_state[personality][user] = params[personality]
            private_state["head_w"][user] = params["head_w"]
            private_state["head_b"][user] = params["head_b"]
            losses[position] = running[-1] if running else 0.0

    # -- many clients at once ---------------------------------------------------------------
    def _chunk(self, method, global_state, private_state, plan, positions, weights, rates, update, losses):
        model = method.model
        personality, commonality = _table_names(model)
        public = global_state[commonality]  # (I, d)
        device, dtype = public.device, public.dtype
        num_items = model.num_items
        sub = plan.subset(positions)
        count = sub.num_clients
        users = torch.as_tensor(sub.clients, device=device)
        ex_client = torch.repeat_interleave(torch.arange(count, device=device),
                                            torch.as_tensor(np.diff(sub.example_indptr), device=device))  # (E,)
        ex_item = torch.as_tensor(sub.items, device=device)
        ex_label = torch.as_tensor(sub.labels, dtype=dtype, device=device)
        ex_step = torch.as_tensor(sub.steps, device=device)
        # One row slot per (client, item) the round touches: the local copies of D_u and C.
        keys, ex_slot = torch.unique(ex_client * num_items + ex_item, sorted=True, return_inverse=True)
        slot_client, slot_item = keys // num_items, keys % num_items  # (R,)
        flat_personal = private_state[personality].view(-1, model.dim)
        d_slots = flat_personal.index_select(0, users[slot_client] * num_items + slot_item)  # (R, d), a copy
        c_slots = public.index_select(0, slot_item)  # (R, d), a copy
        head_w = private_state["head_w"][users].clone()  # (C, d)
        head_b = private_state["head_b"][users].clone()  # (C,)
        lam, mu = method.client_loss.weights(plan.round_index)
        wd, gamma = self.weight_decay, self.batch_lr_decay
        num_steps = torch.as_tensor(sub.num_steps, device=device)  # (C,)
        steps_per_epoch = (num_steps // plan.local_epochs).clamp(min=1)  # (C,)
        running = torch.ones(count, dtype=torch.bool, device=device)  # not yet stopped by tol
        shrink = torch.ones(count, dtype=dtype, device=device)  # f_u: untouched rows end as f_u · θ
        loss_sum = torch.zeros(count, dtype=torch.float64, device=device)
        example_count = torch.zeros(count, dtype=torch.float64, device=device)
        previous = torch.full((count,), float("nan"), dtype=torch.float64, device=device)
        epochs_done = torch.zeros(count, dtype=torch.int64, device=device)
        by_step = torch.argsort(ex_step * count + ex_client, stable=True)
        bounds = torch.searchsorted(ex_step[by_step], torch.arange(int(sub.num_steps.max(initial=0)) + 1,
                                                                     device=device)).tolist()
        for step in range(len(bounds) - 1):
            stepping = running & (num_steps > step)  # (C,)
            if not bool(stepping.any()):
                break
            idx = by_step[bounds[step]:bounds[step + 1]]
            idx = idx[stepping[ex_client[idx]]]
            client, slot = ex_client[idx], ex_slot[idx]  # (E_s,) this step's examples, unpadded
            client_loss, sizes, grad_d, grad_c, grad_w, grad_b = _fedrap_step_gradients(
                d_slots.index_select(0, slot), c_slots.index_select(0, slot), head_w, head_b, client, ex_label[idx],
                count, lam, mu)
            with torch.no_grad():
                scale = gamma ** step
                lr_items, lr_head = rates[personality] * scale, rates["head_w"] * scale
                one = torch.ones(count, dtype=dtype, device=device)
                keep_items = torch.where(stepping, one * (1.0 - lr_items * wd), one)  # (C,) in the state's dtype
                keep_head = torch.where(stepping, one * (1.0 - lr_head * wd), one)
                # SGD with weight decay: θ ← θ (1 − η wd) − η ∇L, ∇L taken at the pre-step θ.
                keep_slots = keep_items.index_select(0, slot_client)[:, None]  # (R, 1)
                d_slots.mul_(keep_slots)
                c_slots.mul_(keep_slots)
                d_slots.index_add_(0, slot, grad_d, alpha=-lr_items)  # an item drawn twice adds up
                c_slots.index_add_(0, slot, grad_c, alpha=-lr_items)
                head_w.mul_(keep_head[:, None]).sub_(grad_w, alpha=lr_head)
                head_b.mul_(keep_head).sub_(grad_b, alpha=lr_head)
                shrink.mul_(keep_items)
                # The code's running loss and its convergence check at each client's epoch end.
                sizes = sizes.to(torch.float64)
                loss_sum += torch.where(stepping, client_loss.detach().to(torch.float64) * sizes, 0.0)
                example_count += torch.where(stepping, sizes, 0.0)
                epoch_end = stepping & ((step + 1) % steps_per_epoch == 0)
                average = loss_sum / example_count.clamp(min=1.0)
                converged = epoch_end & (epochs_done > 0) & ((average - previous).abs() / previous.abs() < self.tol)
                previous = torch.where(epoch_end, average, previous)
                epochs_done += epoch_end.long()
                running &= ~converged
        with torch.no_grad():
            w_clients = torch.as_tensor(weights[positions], dtype=dtype, device=device)  # (C,)
            # C: untouched rows end at f_u C, touched ones at their local copy.
            update[commonality].add_(public, alpha=float((w_clients * (shrink - 1.0)).sum()))
            update[commonality].index_add_(
                0, slot_item, w_clients[slot_client, None] * (c_slots - shrink[slot_client, None] * public[slot_item]))
            # D_u: every row shrinks by f_u, then the touched rows take their local copy. One
            # in-place scale per client: a gathered (C, I, d) copy would cost C × I × d more memory.
            for user, factor in zip(sub.clients.tolist(), shrink.tolist()):
                if factor != 1.0:
                    private_state[personality][user].mul_(factor)
            flat_personal[users[slot_client] * num_items + slot_item] = d_slots
            private_state["head_w"][users] = head_w
            private_state["head_b"][users] = head_b
            # the running loss of each client's last epoch (0 for a client without examples)
            losses[torch.as_tensor(positions, device=device)] = torch.nan_to_num(previous, nan=0.0).to(losses.dtype)
