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
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from fedlib.engine.method import FederatedMethod, bce_client_loss

__all__ = ["HEAD_NAMES", "GRADIENT_NAMES", "linear_head_tables", "linear_head_gradients"]

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


def linear_head_gradients(rows_sum: torch.Tensor, head_w: torch.Tensor, head_b: torch.Tensor, row: torch.Tensor,
                          client: torch.Tensor, labels: torch.Tensor, need_loss: bool = True,
                          wanted: Sequence[str] = GRADIENT_NAMES
                          ) -> Tuple[Optional[torch.Tensor], Dict[str, torch.Tensor]]:
    """Each client's mean BCE on its batch and its gradients, every client of a step at once.

    Args:
        rows_sum: ``(S, d)`` ``Σ_t T_t`` at the step's row slots (the clients' local copies).
        head_w: ``(C, d)``; head_b: ``(C,)`` the stepping clients' heads.
        row: ``(E,) int64`` each example's slot in ``rows_sum``.
        client: ``(E,) int64`` each example's client in ``0 .. C − 1``; every client has at
            least one example (as the autograd path, a client without one would divide by 0).
        labels: ``(E,)`` 1 / 0.
        need_loss: compute the loss (only the first update group of a step reports it).
        wanted: the gradients to compute, among :data:`GRADIENT_NAMES` (an update group that
            steps only the head needs no row gradient, and the reverse).

    Returns:
        ``(loss, grads)``: ``loss`` ``(C,)`` (``None`` without ``need_loss``); ``grads`` maps
        each of ``wanted``: ``"rows"`` to ``(S, d)`` (the gradient of every summed table, rows drawn twice added
        up), ``"head_w"`` to ``(C, d)`` and ``"head_b"`` to ``(C,)``.
    """
    num_clients = head_w.shape[0]
    # index_select rather than tensor[index]: the same rows, several times faster on CPU
    x = rows_sum.index_select(0, row)  # (E, d)
    w = head_w.index_select(0, client)  # (E, d)
    logits = (x * w).sum(1) + head_b.index_select(0, client)  # (E,)
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
    if "head_b" in wanted:
        grads["head_b"] = torch.zeros_like(head_b).index_add_(0, client, g)
    return loss, grads
