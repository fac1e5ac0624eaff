"""Executors: run the local updates of one round's clients and collect their uploads.

Both executors take the same inputs and give the same result (to floating-point
rounding), because both follow the same :class:`~fedlib.engine.plan.RoundPlan`:

* :class:`SequentialExecutor` simulates one client at a time in plain PyTorch: download a
  copy of the public tensors, run autograd + explicit SGD (or a fresh ``torch.optim.Adam``)
  on each planned batch, upload the difference. It is the readable reference.
* :class:`~fedlib.engine.batched.BatchedExecutor` simulates all clients of a chunk together. Each client still
  takes its own sequential steps on its own copy of the downloaded state:

  - private tensors are stacked ``(C, ...)``; public dense tensors are copied per client;
  - the item rows a client touches (its positives and negatives) are gathered into a local
    table of ``(client, item)`` rows (stored ragged, ``(R, d)``, rather than padded
    ``(C, R_max, d)``: same per-client copies without the padding);
  - in local step ``s`` every client that has an ``s``-th batch steps at once. The loss
    ``Σ_c L_c`` is differentiated once: clients share no parameter inside a step, so every
    client receives exactly the gradient of its own mean loss ``L_c``;
  - at the end, each client's row deltas are scatter-added (``index_add_``) into the
    weighted upload sum ``Σ_c w_c Δ_c``; memory is bounded by processing ``chunk_size``
    clients at a time.

  Two shortcuts, both exact and both off with ``gradient_noise`` or Adam:

  - **one-batch clients** (all their data in one batch, one epoch) need no local copies:
    the gradient is taken at the downloaded rows and scattered directly;
  - **FedMF** (plain BCE, one step group, no clipping) has an analytic kernel. A FedMF
    client's local item rows differ from the download only by multiples of its own past user
    vectors (``q_ci = Q_i − lr_Q Σ_{s'<s} G_{s'}[c, i] p_c^{(s')}``, with ``G_s[c, i]`` the summed
    per-example loss gradients of step ``s``). So all logits of a step are one ``(C, I)``
    matrix product plus rank-one corrections, and every gradient is a product with a
    ``(C, I)`` matrix of per-example coefficients: no ``(examples × d)`` gather or scatter at all.

Adam. With ``method.optimizer`` Adam (:class:`~fedlib.engine.method.LocalOptimizer`) the
sequential executor gives each client a fresh ``torch.optim.Adam`` over its own copies, one
parameter group per tensor. The batched executor keeps the same state stacked per client (the
moments of every local row slot and dense copy, a step count per client and tensor) and
steps it with :func:`~fedlib.engine.method.masked_adam_step`. Adam's gradients are dense:
in each step every slot of a stepping client gets a gradient, zero on the rows it does not use
in that batch, so their moments decay and they keep moving as in ``torch.optim.Adam`` on the
full table. Rows a client never trains on in the round have zero moments and do not move, so
local copies of its touched rows suffice, except with weight decay: ``λ θ`` reaches every
row, and local copies then cover whole tables (as with full-support gradient noise). Clients
whose data is exhausted are outside the stepping prefix and take no Adam step.

Gradient noise. With ``method.gradient_noise`` set (DP-SGD at the client level), each step's
covered gradient is clipped per client and Gaussian noise keyed by
``(round noise key, client id, local step, tensor, element)`` is added
(:func:`~fedlib.engine.uploads.client_gradient_noise`; the batched executor draws all stepping
clients' at once with :func:`~fedlib.engine.uploads.clients_gradient_noise`, the same numbers). The batched executor then takes neither shortcut (the FedMF kernel assumes
plain SGD, the one-batch path has no per-client row gradients to clip); with full-support
noise on a row table every client's local copy covers the whole table.

Uploads. With ``method.upload_noise`` set, every client adds its own Laplace noise
(:func:`~fedlib.engine.uploads.client_upload_noise`, keyed by the round's noise key, the
client id, the tensor and the element; the batched executor draws every client's at once with
:func:`~fedlib.engine.uploads.upload_noise_rows`) before the server averages, so both executors
add the same numbers. With ``return_client_updates=True`` both also return every client's individual row
uploads (:class:`~fedlib.engine.uploads.ClientRowUpdates`), the view of a curious server.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from fedlib.engine.method import FederatedMethod, LocalBatch
from fedlib.engine.plan import RoundPlan
from fedlib.engine.privacy import clip_per_sample
from fedlib.engine.uploads import ClientRowUpdates, client_gradient_noise, client_upload_noise, gradient_noise_shapes
from fedlib.engine.batched import (DEFAULT_WIDTH_RATIO, BatchedExecutor, client_batch_widths,
                                  width_bucketed_chunks)
from fedlib.engine.local_updates import (MAX_CLIENT_UPDATE_VALUES, LocalUpdateResult, _check_client_update_size,
                                        _local_step_index, _noise_key, _state_like, _zero_update)

__all__ = ["LocalUpdateResult", "SequentialExecutor", "BatchedExecutor", "make_executor", "client_batch_widths",
           "width_bucketed_chunks", "DEFAULT_WIDTH_RATIO"]


class SequentialExecutor:
    """One client at a time: download, local SGD (or Adam) with autograd, upload. The reference.

    With Adam, each client builds a fresh ``torch.optim.Adam`` over its own copies of the
    parameters at the start of its round (one parameter group per tensor, with its rate).

    Private state is updated in place; ``global_state`` is only read.
    """

    name = "sequential"

    @torch.enable_grad()
    def local_updates(self, method: FederatedMethod, global_state, private_state, plan: RoundPlan,
                      weights: np.ndarray, *, return_client_updates: bool = False,
                      noise_seed: Optional[int] = None,
                      max_client_update_values: Optional[int] = MAX_CLIENT_UPDATE_VALUES) -> LocalUpdateResult:
        """Run the round's local updates; see :class:`LocalUpdateResult`.

        Args:
            weights: ``(C,)`` aggregation weights in ``plan.clients`` order.
            return_client_updates: also return every client's row uploads
                (``result.client_updates``). Memory: ``R × d`` values per table, ``R`` = Σ_c
                touched items, or ``C × num_items`` with full-support noise.
            noise_seed: with ``method.upload_noise`` or ``gradient_noise``, client ``u``'s noise
                is keyed by ``client_noise_keys(round_noise_key(noise_seed, plan.round_index), u, …)``
                (:func:`~fedlib.engine.run_federated` passes its config's seed); ``None`` =
                from ``plan.noise_key``.
            max_client_update_values: refuse (``ValueError``) to return more values than this
                (``None`` = no cap).
        """
        model = method.model
        device, dtype = _state_like(global_state, private_state)
        update = _zero_update(method, global_state)
        losses = torch.zeros(plan.num_clients, dtype=dtype, device=device)
        noisy = method.adds_upload_noise
        full_support = noisy and method.upload_noise.support == "full"
        if return_client_updates:
            _check_client_update_size(method, global_state, plan, max_client_update_values)
        sent = {name: [] for name in model.names("public_rows")}  # per client: (user, rows, delta)
        noise_key = _noise_key(plan, noise_seed)
        covered = set(method.gradient_noise_names)
        for c, user in enumerate(plan.clients.tolist()):
            # 1. Download the public state and load the client's private state (its own copies).
            params = {}
            for name, kind in model.param_kinds.items():
                if kind == "public_rows":
                    params[name] = global_state[name].clone()  # (I, d)
                elif kind == "public_dense":
                    params[name] = global_state[name].unsqueeze(0).clone()  # (1, ...)
                elif kind == "private_dense":
                    params[name] = private_state[name][user].unsqueeze(0).clone()  # (1, ...)
                else:  # private_rows
                    params[name] = private_state[name][user].clone()  # (I, d)

            # 2. Local SGD or Adam, batch by batch in the planned order. Adam's state is the
            #    client's own and lives for this round only.
            optimizer = _client_adam(method, params, plan.round_index)
            examples = plan.client_examples(c)
            items = torch.as_tensor(plan.items[examples], device=device)
            labels = torch.as_tensor(plan.labels[examples], device=device, dtype=dtype)
            steps = torch.as_tensor(plan.steps[examples], device=device)
            num_steps = int(plan.num_steps[c])
            touched = torch.unique(items)  # sorted: the rows this client trains on this round
            for step in range(num_steps):
                in_batch = steps == step
                batch_items = items[in_batch].unsqueeze(0)  # (1, B)
                batch = LocalBatch(clients=torch.tensor([user], device=device), rows=batch_items, items=batch_items,
                                   labels=labels[in_batch].unsqueeze(0), mask=torch.ones_like(labels[in_batch]).unsqueeze(0))
                for group_index, group in enumerate(method.steps):
                    trainable = [params[name].requires_grad_(True) for name in group]
                    loss = method.client_loss(model, params, batch).sum()
                    loss.backward()
                    if group_index == 0:
                        losses[c] += loss.detach() / num_steps
                    if method.step_clip_norm is not None:
                        torch.nn.utils.clip_grad_norm_(trainable, method.step_clip_norm)
                    noised = [name for name in group if name in covered]
                    if noised:  # DP step: clip the covered gradient jointly, add this client's noise
                        local_step = _local_step_index(method, step, group_index)
                        _privatise_client_gradient(method, group, noised, params, global_state, private_state,
                                                   user, noise_key, local_step, touched)
                    if optimizer is not None:
                        optimizer.step()  # steps the tensors with a gradient: this group's
                    else:
                        with torch.no_grad():
                            for name, tensor in zip(group, trainable):
                                tensor -= method.lr(name, plan.round_index) * tensor.grad
                    for tensor in trainable:
                        tensor.grad = None
                        tensor.requires_grad_(False)

            # 3. Upload the change of every public tensor (plus this client's noise); keep the
            #    private ones on the device.
            noise = client_upload_noise(method, global_state, user, noise_key, touched) if noisy else {}
            for name, kind in model.param_kinds.items():
                if kind == "public_rows":
                    delta = params[name] - global_state[name]  # (I, d), zero on rows not touched
                    if name in noise:
                        delta = delta + noise[name] if full_support else delta.index_add(0, touched, noise[name])
                    update[name] += float(weights[c]) * delta
                    if return_client_updates:
                        every_row = method.uploads_every_row(name)
                        rows = torch.arange(model.num_items, device=device) if every_row else touched
                        sent[name].append((torch.full_like(rows, user), rows, delta[rows]))
                elif kind == "public_dense":
                    delta = params[name][0] - global_state[name]
                    update[name] += float(weights[c]) * (delta + noise[name] if name in noise else delta)
                elif kind == "private_dense":
                    private_state[name][user] = params[name][0]
                else:
                    private_state[name][user] = params[name]
        client_updates = None
        if return_client_updates:
            client_updates = {}
            for name, parts in sent.items():
                table = global_state[name]
                empty = (torch.zeros(0, dtype=torch.int64, device=device),) * 2 + (table.new_zeros((0, *table.shape[1:])),)
                clients, rows, delta = (torch.cat(t) for t in zip(*parts)) if parts else empty
                client_updates[name] = ClientRowUpdates(clients, rows, delta)
        return LocalUpdateResult(update, losses, client_updates)


def _client_adam(method: FederatedMethod, params, round_index: int) -> Optional[torch.optim.Adam]:
    """A fresh ``torch.optim.Adam`` over one client's copies (``None`` with SGD).

    One parameter group per stepped tensor, with its rate. Tensors outside the current
    ``update_steps`` group have no gradient when it steps, and ``torch.optim.Adam`` leaves
    them (moments and step count) alone: each tensor counts its own steps.
    """
    local = method.optimizer
    if not local.is_adam:
        return None
    stepped = list(dict.fromkeys(name for group in method.steps for name in group))
    groups = [{"params": [params[name]], "lr": method.lr(name, round_index)} for name in stepped]
    return torch.optim.Adam(groups, betas=local.betas, eps=local.eps, weight_decay=local.weight_decay)


def _privatise_client_gradient(method, group, noised, params, global_state, private_state, user, noise_key,
                               local_step, touched):
    """One client's DP step in the sequential executor, in place on ``params[name].grad``.

    The covered gradients (``noised``) are clipped jointly to ``clip_norm``
    (:func:`~fedlib.engine.privacy.clip_per_sample` on a one-client stack), then the client's
    noise of this local step is added: on the whole table, or (``support="touched"``) on
    its ``touched`` rows only.
    """
    row_names = method.model.row_names
    # Dense tensors already carry a client axis of 1; full row tables get one.
    stacked = {name: params[name].grad.unsqueeze(0) if name in row_names else params[name].grad for name in noised}
    clipped = clip_per_sample(stacked, method.gradient_noise.clip_norm)
    noise = {}
    if method.adds_gradient_noise:
        shapes = gradient_noise_shapes(method, group, global_state, private_state, touched.numel())
        noise = client_gradient_noise(method, shapes, user, noise_key, local_step, params[noised[0]])
    for name in noised:
        if name in row_names:
            grad = clipped[name][0]  # (I, d)
            if name in noise:
                full = method.gradient_noise.support == "full"
                grad = grad + noise[name] if full else grad.index_add(0, touched, noise[name])
        else:
            grad = clipped[name] + noise[name].unsqueeze(0) if name in noise else clipped[name]  # (1, ...)
        params[name].grad = grad


def make_executor(name: str, **kwargs):
    """``"sequential"`` or ``"batched"``."""
    if name == "sequential":
        return SequentialExecutor()
    if name == "batched":
        return BatchedExecutor(**kwargs)
    raise ValueError(f"unknown executor {name!r}; expected 'sequential' or 'batched'")
