r"""Closed-form local gradients of the linear-head backbones (PFedRec, the personal-table models).

A backbone whose score is a private linear head on a sum of gathered item rows,

    s_ci = w_c · Σ_t T_t[row_ci] + b_c        (``head_w`` ``(C, d)``, ``head_b`` ``(C,)``),

declares the row tables ``T_t`` of that sum in a ``linear_head_tables`` attribute
(:class:`~fedlib.models.PFedRec`: ``("item_emb",)``; :class:`~fedlib.models.PersonalItemTableModel`:
``("personal_item_emb",)``, plus ``"item_emb"`` with its shared table). Under the default
loss (:func:`~fedlib.engine.method.bce_client_loss`, the mean BCE of each client's batch) a
step's gradients are, with ``n_c`` client ``c``'s batch size, ``x_e = Σ_t T_t[row_e]`` and
``g_e = (σ(s_e) − y_e) / n_c``::

    ∂L_c/∂w_c = Σ_e g_e x_e,     ∂L_c/∂b_c = Σ_e g_e,     ∂L_c/∂T_t[r] = Σ_{e: row_e = r} g_e w_c  (every t)

:func:`linear_head_gradients` computes them for every client of a step at once on the
unpadded examples, in place of the padded ``(C, B)`` batch and one autograd pass per update
group (:class:`~fedlib.engine.batched.BatchedExecutor` uses it when :func:`linear_head_tables`
applies). The model's own ``logits`` and autograd are the reference:
``tests/test_linear_head.py`` compares the two in float64.

A paper's own loss can use the same path when its gradient with respect to each example's
logit has a closed form (F3CRec's distillation: ``λ (σ(s_e) − σ(t_e)) / |M_c|`` on the replay
items). Such a loss defines ``closed_form_applies(model) -> bool`` and
``logit_gradients(step: StepLogits) -> (loss (C,), g (E,))``; :func:`closed_form_head` then
also accepts FedMF (``s_ci = p_c · q_i``: a linear head ``user_emb`` without bias on
``item_emb``) under it. FedMF under the default loss keeps its analytic kernel and its
autograd path unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from fedlib.engine.method import FederatedMethod, bce_client_loss
from fedlib.models.mf import FedMF

__all__ = ["HEAD_NAMES", "GRADIENT_NAMES", "LinearHead", "StepLogits", "linear_head_tables", "closed_form_head",
           "linear_head_gradients"]

#: The private head of a linear-head backbone: weight ``(U, d)`` and bias ``(U,)``.
HEAD_NAMES = ("head_w", "head_b")
#: The gradients :func:`linear_head_gradients` can return (``"rows"``: every summed table's).
GRADIENT_NAMES = ("rows",) + HEAD_NAMES


def linear_head_tables(method: FederatedMethod) -> Optional[Tuple[str, ...]]:
    """The row tables summed under the method's linear head, or ``None`` when the closed form does not apply.

    It applies when the model declares ``linear_head_tables``, its parameters are exactly
    those tables plus :data:`HEAD_NAMES`, and the local loss is the default BCE (a paper's own
    loss, e.g. FedRAP's regularisers or F3CRec's distillation, goes through autograd).
    """
    model = method.model
    tables = getattr(model, "linear_head_tables", None)
    if not tables or method.client_loss is not bce_client_loss:
        return None
    kinds = model.param_kinds
    if set(kinds) != set(tables) | set(HEAD_NAMES) or any(not kinds[name].endswith("rows") for name in tables):
        return None
    return tuple(tables)


@dataclass(frozen=True)
class LinearHead:
    """How the batched executor takes closed-form gradients of a method (:func:`closed_form_head`).

    Attributes:
        tables: the row tables summed under the head.
        weight: the private head weight ``(U, d)`` (``"head_w"``; FedMF's ``"user_emb"``).
        bias: the private head bias ``(U,)``, or ``None`` (FedMF).
        loss: ``None`` for the default BCE, else the method's client loss, which defines
            ``logit_gradients`` (see the module docstring).
    """

    tables: Tuple[str, ...]
    weight: str = "head_w"
    bias: Optional[str] = "head_b"
    loss: Any = None

    def role(self, name: str) -> str:
        """The key of parameter ``name``'s gradient in :func:`linear_head_gradients`'s result."""
        if name in self.tables:
            return "rows"
        return "head_w" if name == self.weight else "head_b"


@dataclass(frozen=True)
class StepLogits:
    """One local step of every stepping client, unpadded: what a closed-form loss reads.

    Attributes:
        model: the backbone (its ``score_users`` scores every item, e.g. for F3CRec's ranks).
        logits: ``(E,)`` each example's logit at the clients' current local state.
        client: ``(E,) int64`` each example's client in ``0 .. C − 1`` (sorted).
        labels: ``(E,)`` the plan's labels (a loss may give negative ones its own meaning).
        items: ``(E,) int64`` global item ids.
        users: ``(C,) int64`` the stepping clients' user ids.
        head: the stepping clients' head, ``(C, ...)`` under the model's own parameter names
            (detached), as ``model.score_users`` reads a private state indexed by ``0 .. C − 1``.
    """

    model: Any
    logits: torch.Tensor
    client: torch.Tensor
    labels: torch.Tensor
    items: torch.Tensor
    users: torch.Tensor
    head: Mapping[str, torch.Tensor]


def closed_form_head(method: FederatedMethod) -> Optional[LinearHead]:
    """The closed-form gradient path of ``method`` in the batched executor, or ``None`` (autograd).

    The default BCE on a linear-head backbone (:func:`linear_head_tables`), or a client loss
    with ``logit_gradients`` that accepts the model (``closed_form_applies``), on a linear-head
    backbone or on FedMF.
    """
    tables = linear_head_tables(method)
    if tables is not None:
        return LinearHead(tables)
    model, loss = method.model, method.client_loss
    if not callable(getattr(loss, "logit_gradients", None)) or not loss.closed_form_applies(model):
        return None
    if type(model) is FedMF:
        return LinearHead(("item_emb",), weight="user_emb", bias=None, loss=loss)
    tables = getattr(model, "linear_head_tables", None)
    kinds = model.param_kinds
    if (not tables or set(kinds) != set(tables) | set(HEAD_NAMES)
            or any(not kinds[name].endswith("rows") for name in tables)):
        return None
    return LinearHead(tuple(tables), loss=loss)


def linear_head_gradients(rows_sum: torch.Tensor, head_w: torch.Tensor, head_b: Optional[torch.Tensor],
                          row: torch.Tensor, client: torch.Tensor, labels: torch.Tensor, need_loss: bool = True,
                          wanted: Sequence[str] = GRADIENT_NAMES, loss_fn: Any = None,
                          step: Optional[Mapping[str, Any]] = None
                          ) -> Tuple[Optional[torch.Tensor], Dict[str, torch.Tensor]]:
    """Each client's mean BCE on its batch and its gradients, every client of a step at once.

    Args:
        rows_sum: ``(S, d)`` ``Σ_t T_t`` at the step's row slots (the clients' local copies).
        head_w: ``(C, d)``; head_b: ``(C,)`` the stepping clients' heads (``None``: no bias, FedMF).
        row: ``(E,) int64`` each example's slot in ``rows_sum``.
        client: ``(E,) int64`` each example's client in ``0 .. C − 1``; every client has at
            least one example (as the autograd path, a client without one would divide by 0).
        labels: ``(E,)`` 1 / 0.
        need_loss: compute the loss (only the first update group of a step reports it).
        wanted: the gradients to compute, among :data:`GRADIENT_NAMES` (an update group that
            steps only the head needs no row gradient, and the reverse).
        loss_fn: ``None`` for the default mean BCE, else a loss with ``logit_gradients``
            (:attr:`LinearHead.loss`), called with a :class:`StepLogits`.
        step: with ``loss_fn``, the rest of the :class:`StepLogits` fields:
            ``{"model", "items" (E,), "users" (C,), "head"}``.

    Returns:
        ``(loss, grads)``: ``loss`` ``(C,)`` (``None`` without ``need_loss``); ``grads`` maps
        each of ``wanted``: ``"rows"`` to ``(S, d)`` (the gradient of every summed table, rows drawn twice added
        up), ``"head_w"`` to ``(C, d)`` and ``"head_b"`` to ``(C,)``.
    """
    num_clients = head_w.shape[0]
    # index_select rather than tensor[index]: the same rows, several times faster on CPU
    x = rows_sum.index_select(0, row)  # (E, d)
    w = head_w.index_select(0, client)  # (E, d)
    logits = (x * w).sum(1)  # (E,)
    if head_b is not None:
        logits = logits + head_b.index_select(0, client)
    if loss_fn is not None:
        loss, g = loss_fn.logit_gradients(StepLogits(logits=logits, client=client, labels=labels, **step))
        loss = loss if need_loss else None
    else:
        sizes = torch.zeros(num_clients, dtype=x.dtype, device=x.device).index_add_(0, client, torch.ones_like(logits))
        per_example = sizes.index_select(0, client)  # (E,) n_c
        loss = None
        if need_loss:
            bce = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")  # (E,)
            loss = torch.zeros_like(sizes).index_add_(0, client, bce) / sizes  # (C,)
        g = (torch.sigmoid(logits) - labels) / per_example  # (E,) ∂L_c/∂s_e
    grads = {}
    if "rows" in wanted:
        grads["rows"] = torch.zeros_like(rows_sum).index_add_(0, row, g[:, None] * w)
    if "head_w" in wanted:
        grads["head_w"] = torch.zeros_like(head_w).index_add_(0, client, g[:, None] * x)
    if "head_b" in wanted and head_b is not None:
        grads["head_b"] = torch.zeros_like(head_b).index_add_(0, client, g)
    return loss, grads
