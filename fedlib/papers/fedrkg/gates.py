r"""FedRKG's nested gate training (§4.3.2, Eqs. 6–8): SGD on each client's gate, everything else frozen.

Reference: Lim et al., "Federated Recommendation with Knowledge Guidance" (FedRKG),
https://openreview.net/forum?id=oj2Xj8WXih (arXiv:2511.12959), §4.3.2 and Algorithm 1,
lines 12–15; Eq. 6 is recovered from the public code (https://github.com/Jaehyung-Lim/fedrkg,
``models/fedrkg.py``: ``forward_with_gate``, ``train_gate``). Notation and the gate itself
(Eq. 5) are in :mod:`fedlib.papers.fedrkg.guidance`::

    P̃_ui = β P_ui + 2 (1 − β) σ(w_uᵀ [P_ui ; P_gi ; P_ui − P_gi] + b_u) P_gi      Eq. 6
    w_u, b_u ← SGD on L_rec(P̃_u) with P_u, the backbone and P_g frozen          Eqs. 7–8

The gate is trained on the backbone's logits on the fused rows. Two paths, one result:

* :func:`train_gates`: the fast path for FedMF's linear head ``s = w_u · P̃_ui + b_u`` (the
  code's backbone): gradients in closed form on the real examples only, clients bucketed by
  their number of examples (:func:`_train_gates_bucketed`);
* :func:`train_gates_on_model`: any guided backbone (the rows fused per example, then
  ``model.logits``; autograd updates the gate only).

:func:`train_gates_sequential` and :func:`train_gates_on_model_sequential` are the per-user
references the batched paths are tested against (the code's loop over users). Which path
runs is chosen by :meth:`fedlib.papers.fedrkg.method.KnowledgeGuidance.guide`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, NamedTuple, Optional

import torch
import torch.nn.functional as F

from fedlib.engine.knowledge import check_user_ids
from fedlib.models.base import FederatedModel
from fedlib.models.personal import PersonalItemTableModel
from fedlib.papers.fedrkg.guidance import (PERSONAL_TABLE, _check_beta, _check_gate, _check_tables, _row_gate_logits,
                                          check_guided_model)

__all__ = [
    "GateExamples", "GateTraining", "fused_logits", "train_gates", "fused_model_logits", "train_gates_on_model",
    # per-user references
    "train_gates_sequential", "train_gates_on_model_sequential",
]

_CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_ divides by (total_norm + 1e-6)
_TOL_EPS = 1e-8  # the code's early exit divides by |previous + 1e-8|


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
    users = check_user_ids(users, num_users)
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
            examples (:class:`GateExamples` layout; :func:`fedlib.papers.fedrkg.method.gate_examples_from_plan`).
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
        model: a guided backbone (:func:`~fedlib.papers.fedrkg.guidance.check_guided_model`).
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
                             "run.state.global_state and run.state.private_state (all of the backbone's tensors)")
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
        model: a guided backbone (:func:`~fedlib.papers.fedrkg.guidance.guided_backbone`).
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

