"""The batched executor: every client of a chunk simulated together with tensor operations.

:class:`BatchedExecutor` gives the numbers of the sequential reference
(:class:`~fedlib.engine.executors.SequentialExecutor`, whose module docstring describes both:
the stacked private tensors, the ragged local row tables, one differentiation per local step,
the two exact shortcuts (one-batch clients, the FedMF kernel), Adam and gradient noise), to
floating-point rounding; ``tests/test_engine_equivalence.py`` checks it.

Two more exact shortcuts of this executor's autograd path: linear-head backbones (PFedRec, the
personal-table models) under the default loss, and FedMF or a linear head under a loss with
closed-form logit gradients (F3CRec's distillation), take closed-form gradients on the unpadded
examples (:mod:`fedlib.engine.linear_head`), in one chunk of clients in plan order since they
pad nothing, and full-support gradient noise under SGD keeps
local copies of the touched rows only (:class:`_SpreadNoise`).
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from fedlib.engine.linear_head import closed_form_head, linear_head_gradients
from fedlib.engine.method import FederatedMethod, LocalBatch, masked_adam_step
from fedlib.engine.plan import RoundPlan
from fedlib.engine.privacy import clip_factors
from fedlib.engine.uploads import (ClientRowUpdates, add_upload_noise_rows, clients_gradient_noise,
                                   full_table_upload_noise, gradient_noise_shapes, upload_noise_rows)
from fedlib.models.mf import FedMF
from fedlib.engine.local_updates import (MAX_CLIENT_UPDATE_VALUES, LocalUpdateResult, _check_client_update_size,
                                        _local_step_index, _noise_key, _state_like, _zero_update)

__all__ = ["BatchedExecutor", "client_batch_widths", "width_bucketed_chunks", "DEFAULT_WIDTH_RATIO"]


#: Row noise values drawn and scattered at once by the batched upload noise (4 MB in float32):
#: bounds the memory of full-support noise, ``C × num_items × d`` values in all.
UPLOAD_NOISE_BLOCK_VALUES = 1 << 20
_CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_ divides by (total_norm + 1e-6)


def _steps_every_row(method: FederatedMethod) -> bool:
    """Whether every client changes every row of its row tables.

    With full-support gradient noise on a row table, or Adam weight decay (``λ θ`` is in the
    gradient of every row): the batched executor then keeps whole-table local copies.
    """
    noises = (method.adds_gradient_noise and method.gradient_noise.support == "full"
              and any(name in method.model.row_names for name in method.gradient_noise_names))
    return noises or method.decays_every_row


def _rows_from_keys(keys: torch.Tensor, delta: torch.Tensor, plan: RoundPlan, num_items: int) -> ClientRowUpdates:
    """Client updates from ``position × I + item`` keys (sorted) and their ``(R, ...)`` deltas."""
    clients = torch.as_tensor(plan.clients, device=keys.device)[keys // num_items]
    return ClientRowUpdates(clients=clients, rows=keys % num_items, delta=delta)


#: Default ``width_ratio`` of the batched executors: a chunk's widest client batch is at most
#: this many times its narrowest, so padding a step wastes at most 50 %.
DEFAULT_WIDTH_RATIO = 1.5


def client_batch_widths(plan: RoundPlan) -> np.ndarray:
    """``(C,) int64`` each client's widest local batch (examples in its largest step)."""
    if plan.num_clients == 0:
        return np.zeros(0, dtype=np.int64)
    max_steps = max(int(plan.num_steps.max(initial=0)), 1)
    position = np.repeat(np.arange(plan.num_clients), np.diff(plan.example_indptr))  # (E,)
    per_step = np.bincount(position * max_steps + plan.steps, minlength=plan.num_clients * max_steps)
    return per_step.reshape(plan.num_clients, max_steps).max(1)


def width_bucketed_chunks(widths: np.ndarray, chunk_size: int, ratio: float) -> list:
    """Client positions in chunks of at most ``chunk_size`` whose widths differ at most ``ratio``-fold.

    Greedy over the clients sorted by decreasing width (ties in plan order): a chunk takes
    clients while it has room and their width is at least its first (widest) client's
    ``/ ratio``. Padding each step to the chunk's widest batch then wastes at most a factor
    ``ratio`` over the real examples, in ``≈ log_ratio(max / min width) + C / chunk_size``
    chunks. Each chunk's positions are returned sorted.

    Args:
        widths: ``(C,)`` from :func:`client_batch_widths`.
        chunk_size: most clients per chunk, ``>= 1``.
        ratio: ``>= 1``.

    Returns:
        A list of ``int64`` position arrays that together cover ``0 .. C − 1`` once.
    """
    widths = np.asarray(widths)
    order = np.argsort(-widths, kind="stable")
    chunks, start = [], 0
    while start < order.size:
        floor = widths[order[start]] / ratio
        stop = start + 1
        while stop < order.size and stop - start < chunk_size and widths[order[stop]] >= floor:
            stop += 1
        chunks.append(np.sort(order[start:stop]))
        start = stop
    return chunks


# ======================================================================================
class BatchedExecutor:
    """Many clients at once with tensor operations (see the module docstring).

    Args:
        chunk_size: clients simulated together (bounds memory: local row tables, padded
            batches and, for FedMF, ``(chunk, num_items)`` coefficient matrices).
        analytic_fedmf: use the analytic FedMF kernel when it applies (``"auto"``: when its
            ``(C, I)`` matrices are not much larger than the examples themselves), ``True``
            whenever it applies, ``False`` never.
        one_batch_fast_path: skip local copies for clients with a single local step.
        width_ratio: on the autograd path, chunk clients of similar batch width together: a
            step's batch is padded to ``(C_s, B_s)`` with ``B_s`` the widest client's batch, so
            one chunk mixing a 1,375-example client with 5-example ones (Amazon-Video under
            batch 2,048) computes ~18× the real examples. With a ratio ``r`` every chunk's
            widest client is at most ``r`` × its narrowest (:func:`width_bucketed_chunks`),
            which bounds the padding by ``r``. ``None`` keeps the plan's order (one chunk of
            up to ``chunk_size`` clients). The result does not depend on it beyond the
            order of float sums.
    """

    name = "batched"

    def __init__(self, chunk_size: int = 1024, analytic_fedmf="auto", one_batch_fast_path: bool = True,
                 dense_budget: int = 1 << 25, width_ratio: Optional[float] = DEFAULT_WIDTH_RATIO):
        if chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        if width_ratio is not None and not (np.isfinite(width_ratio) and width_ratio >= 1):
            raise ValueError(f"width_ratio must be a finite number >= 1 (widest / narrowest batch in a chunk), "
                             f"or None to chunk in plan order; got {width_ratio!r}")
        self.width_ratio = None if width_ratio is None else float(width_ratio)
        self.chunk_size = int(chunk_size)
        self.analytic_fedmf = analytic_fedmf
        self.one_batch_fast_path = bool(one_batch_fast_path)
        self.dense_budget = int(dense_budget)  # max floats in the FedMF kernel's (C, I) matrices

    @torch.enable_grad()
    def local_updates(self, method: FederatedMethod, global_state, private_state, plan: RoundPlan,
                      weights: np.ndarray, *, return_client_updates: bool = False,
                      noise_seed: Optional[int] = None,
                      max_client_update_values: Optional[int] = MAX_CLIENT_UPDATE_VALUES) -> LocalUpdateResult:
        """Run the round's local updates; arguments as in :meth:`SequentialExecutor.local_updates`."""
        device, dtype = _state_like(global_state, private_state)
        update = _zero_update(method, global_state)
        losses = torch.zeros(plan.num_clients, dtype=dtype, device=device)
        weights = np.asarray(weights, dtype=np.float64)
        if return_client_updates:
            _check_client_update_size(method, global_state, plan, max_client_update_values)
        # name -> [(position × I + item keys, deltas)] from every chunk, when inspecting uploads
        sent = {name: [] for name in method.model.names("public_rows")} if return_client_updates else None
        use_kernel = self._use_fedmf_kernel(method, plan)
        chunk = self.chunk_size
        if use_kernel:
            # Keep the kernel's (C, I) matrices (one per local step) inside the budget.
            per_client = method.model.num_items * (int(plan.num_steps.max(initial=1)) + 3)
            chunk = max(1, min(chunk, self.dense_budget // max(per_client, 1)))
        elif _steps_every_row(method):
            # Every client's local copy covers every row of the row tables: C × I × row values.
            model = method.model
            one_row = {name: global_state[name][0] if kind == "public_rows" else private_state[name][0, 0]
                       for name, kind in model.param_kinds.items() if name in model.row_names}
            row_values = sum(row.numel() for row in one_row.values())
            chunk = max(1, min(chunk, self.dense_budget // max(model.num_items * row_values, 1)))
        noisy = method.adds_upload_noise or method.adds_gradient_noise
        noise_key = _noise_key(plan, noise_seed) if noisy else 0
        # Width buckets bound the padding of the autograd path's (C_s, B_s) batches; the FedMF
        # kernel and the closed-form linear-head gradients pad nothing, and one chunk in plan
        # order spares them the per-chunk and per-step overhead of ~10 buckets per round.
        pads = not use_kernel and closed_form_head(method) is None
        if not pads or self.width_ratio is None:
            chunks = [np.arange(start, min(start + chunk, plan.num_clients))
                      for start in range(0, plan.num_clients, chunk)]
        else:
            chunks = width_bucketed_chunks(client_batch_widths(plan), chunk, self.width_ratio)
        for positions in chunks:
            if use_kernel:
                self._fedmf_chunk(method, global_state, private_state, plan, positions, weights, update, losses, sent)
                continue
            one_step = plan.num_steps[positions] == 1
            groups = [positions]
            if self.one_batch_fast_path and self._fast_path_allowed(method):
                groups = [positions[one_step], positions[~one_step]]
            for group_positions, direct in zip(groups, (True, False) if len(groups) == 2 else (False,)):
                if group_positions.size:
                    self._generic_chunk(method, global_state, private_state, plan, group_positions, weights,
                                        update, losses, direct_rows=direct, sent=sent, noise_key=noise_key)
        noise_rows = None
        if method.adds_upload_noise:
            noise_rows = self._add_upload_noise(method, global_state, plan, weights, update, noise_key,
                                                keep=sent is not None)
        client_updates = None
        if sent is not None:
            client_updates = {name: self._client_rows(method, global_state, plan, name, parts,
                                                      None if noise_rows is None else noise_rows[name])
                              for name, parts in sent.items()}
        return LocalUpdateResult(update, losses, client_updates)

    # -- uploads: noise and per-client inspection -------------------------------------------
    @staticmethod
    def _add_upload_noise(method, global_state, plan, weights, update, noise_key: int, keep: bool):
        """Add ``Σ_c w_c noise_c`` to ``update``, every client of the round at once.

        The noise is counter-based (:func:`~fedlib.engine.uploads.upload_noise_rows`): each
        element a pure function of ``(round key, client, tensor, element)``, so drawing all
        clients' rows in one vectorised call gives the sequential executor's numbers. Row noise
        is drawn and scattered in blocks of :data:`UPLOAD_NOISE_BLOCK_VALUES` values, so the
        memory stays bounded with full support (``C × num_items × d`` values in all). With
        ``keep`` the row noise is also returned, ``name -> (R, *row)`` over the (client, item)
        pairs sorted by client position, then item (every pair with full support), for
        :meth:`_client_rows`.
        """
        model = method.model
        num_items = model.num_items
        row_names = model.names("public_rows")
        if not update:  # nothing public, nothing uploaded
            return {name: None for name in row_names} if keep else None
        device = next(iter(update.values())).device
        full_support = method.upload_noise.support == "full"
        if full_support:  # every (client, item) pair, drawn a client's whole table at a time
            positions = np.arange(plan.num_clients, dtype=np.int64)
            items = None
        else:
            positions, items = plan.touched_rows(num_items)
        dense_names = [name for name in update if name not in row_names]
        if dense_names:  # (C, *shape) each: one draw, one weighted sum
            none = np.zeros(0, dtype=np.int64)
            dense = upload_noise_rows(method, global_state, noise_key, plan.clients, none, none, names=dense_names)
            for name, noise in dense.items():
                update[name] += torch.tensordot(torch.as_tensor(weights, dtype=noise.dtype, device=device), noise, dims=1)
        kept = {name: [] for name in row_names} if keep else None
        row_weights = np.asarray(weights, dtype=np.float64)[positions]
        for name in row_names:
            table = update[name]
            block = max(1, UPLOAD_NOISE_BLOCK_VALUES // max(math.prod(table.shape[1:]), 1))
            if full_support:  # whole clients per block: their tables add up without a scatter
                block = max(1, block // num_items)
            for start in range(0, positions.size, block):
                rows = slice(start, start + block)
                # Without inspection the weight is applied with the scale (one pass fewer).
                weights_in_draw = None if keep else row_weights[rows]
                if full_support:
                    noise = full_table_upload_noise(method, global_state, noise_key, plan.clients[rows], name,
                                                    weights_in_draw).view(-1, *table.shape[1:])
                elif not keep:  # drawn and summed into the table in one pass, never kept
                    add_upload_noise_rows(method, global_state, noise_key, plan.clients, positions[rows], items[rows],
                                          name, table, row_weights=weights_in_draw)
                    continue
                else:
                    noise = upload_noise_rows(method, global_state, noise_key, plan.clients, positions[rows],
                                              items[rows], names=[name], row_weights=weights_in_draw)[name]
                if keep:
                    kept[name].append(noise)
                    row_factor = np.repeat(row_weights[rows], num_items) if full_support else row_weights[rows]
                    noise = noise * torch.as_tensor(row_factor, dtype=noise.dtype,
                                                    device=device).view(-1, *(1,) * (noise.ndim - 1))
                if full_support:
                    table += noise.view(-1, *table.shape).sum(dim=0)
                else:
                    table.index_add_(0, torch.as_tensor(items[rows], device=device), noise)
        if not keep:
            return None
        return {name: torch.cat(parts) if parts else update[name].new_zeros((0, *update[name].shape[1:]))
                for name, parts in kept.items()}

    @staticmethod
    def _client_rows(method, global_state, plan, name, parts, noise) -> ClientRowUpdates:
        """Merge the chunks' ``(keys, deltas)`` of table ``name`` into sorted client updates.

        ``keys`` are ``position × I + item``; the one-batch fast path keeps one slot per example,
        so a key can repeat and its deltas are summed. ``noise``: the row noise from
        :meth:`_add_upload_noise`, ``(R, *row)`` over its sorted (client, item) pairs
        (``None`` without noise).
        """
        num_items = method.model.num_items
        table = global_state[name]
        row_shape = table.shape[1:]
        if parts:
            keys = torch.cat([k for k, _ in parts])
            deltas = torch.cat([d for _, d in parts])
            keys, inverse = torch.unique(keys, sorted=True, return_inverse=True)
            delta = deltas.new_zeros((keys.numel(), *row_shape)).index_add_(0, inverse, deltas)
        else:
            keys = torch.zeros(0, dtype=torch.int64, device=table.device)
            delta = table.new_zeros((0, *row_shape))
        if noise is None:
            return _rows_from_keys(keys, delta, plan, num_items)
        if method.upload_noise.support == "touched":
            # Noise rows are sorted by (client position, item) over the touched pairs; the keys
            # cover those pairs, or every pair when gradient noise changed every row.
            noise_rows = noise
            positions, items = plan.touched_rows(num_items)
            noise_keys = torch.as_tensor(positions * num_items + items, device=keys.device)
            delta = delta.index_add(0, torch.searchsorted(keys, noise_keys), noise_rows)
            return _rows_from_keys(keys, delta, plan, num_items)
        # Full support: every client sends every row.
        full = noise.reshape(-1, *row_shape)
        full.index_add_(0, keys, delta)
        all_keys = torch.arange(plan.num_clients * num_items, device=keys.device)
        return _rows_from_keys(all_keys, full, plan, num_items)

    # -- generic autograd path ------------------------------------------------------------
    @staticmethod
    def _fast_path_allowed(method: FederatedMethod) -> bool:
        # Per-client clipping needs per-(client, row) gradients (gradient noise clips too); a
        # row stepped twice per batch needs a local copy. Otherwise one-batch clients can work
        # on the download directly.
        # Adam's step is not linear in the gradient, and it needs the moments of each
        # client's rows between steps: no shortcut.
        row_names = method.model.row_names
        stepped = [name for group in method.steps for name in group if name in row_names]
        return (method.grad_clip_norm is None and method.gradient_noise is None
                and not method.optimizer.is_adam and len(stepped) == len(set(stepped)))

    def _generic_chunk(self, method, global_state, private_state, plan, positions, weights, update, losses,
                       direct_rows: bool, sent=None, noise_key: int = 0):
        model = method.model
        device, dtype = _state_like(global_state, private_state)
        # Clients by decreasing number of steps: the clients still stepping at step s are a prefix.
        order = positions[np.argsort(-plan.num_steps[positions], kind="stable")]
        sub = plan.subset(order)
        num_clients = sub.num_clients
        users = torch.as_tensor(sub.clients, device=device)
        w = torch.as_tensor(weights[order], dtype=dtype, device=device)  # (C,)
        counts = torch.as_tensor(np.diff(sub.example_indptr), device=device)
        ex_client = torch.repeat_interleave(torch.arange(num_clients, device=device), counts)  # (E,)
        ex_item = torch.as_tensor(sub.items, device=device)
        ex_label = torch.as_tensor(sub.labels, device=device, dtype=dtype)
        ex_step = torch.as_tensor(sub.steps, device=device)
        num_items = model.num_items

        # Row slots: one per (client, item) pair touched (a local copy), or, on the fast path,
        # one per example (gradient at the download, no copy kept between steps), or, with
        # full-support gradient noise or Adam weight decay, one per (client, item) pair of the
        # whole table. Slots are sorted by (client, item) in the last two cases: a client's
        # slots are contiguous.
        slot_touched = None  # with whole-table slots: which ones the client trains on
        # Full-support gradient noise under SGD: the rows a client never trains on only collect
        # noise, which reaches the result without a local copy (see _spread_row_noise), so the
        # local copies stay on the touched rows. Adam (its moments) and per-client uploads
        # (every row of every client) keep whole-table slots.
        noise_every_row = (not direct_rows and _steps_every_row(method) and not method.optimizer.is_adam
                           and sent is None)
        if direct_rows:
            slot_client, slot_item = ex_client, ex_item
            ex_slot = torch.arange(ex_item.numel(), device=device)
        elif _steps_every_row(method) and not noise_every_row:
            ex_slot = ex_client * num_items + ex_item
            slot_client = torch.arange(num_clients, device=device).repeat_interleave(num_items)
            slot_item = torch.arange(num_items, device=device).repeat(num_clients)
            slot_touched = torch.zeros(num_clients * num_items, dtype=torch.bool, device=device)
            slot_touched[ex_slot] = True
        else:
            keys, ex_slot = torch.unique(ex_client * num_items + ex_item, sorted=True, return_inverse=True)
            slot_client, slot_item = keys // num_items, keys % num_items
        slot_user = users[slot_client]
        # First slot of each client (C + 1,): the noise rows of the clients stepping at step s
        # (a prefix of the ranks) are the slot prefix [0, slot_bounds[C_s]).
        slot_bounds = torch.searchsorted(slot_client, torch.arange(num_clients + 1, device=device)).tolist()
        covered = set(method.gradient_noise_names)
        # Rows that receive a client's gradient noise: all its slots, except with touched-support
        # noise on whole-table slots (Adam weight decay, never with SGD), where only its touched
        # slots do; noise_slots lists them, sorted by (client, item) like the noise draws.
        noise_slots, noise_bounds = None, slot_bounds
        touched_noise = method.gradient_noise is not None and method.gradient_noise.support == "touched"
        if slot_touched is not None and touched_noise:
            noise_slots = torch.nonzero(slot_touched).squeeze(1)
            noise_bounds = torch.searchsorted(slot_client[noise_slots],
                                              torch.arange(num_clients + 1, device=device)).tolist()
        spread = None
        if noise_every_row:  # noise rows: every (client, item) pair, I per client
            noise_bounds = list(range(0, (num_clients + 1) * num_items, num_items))
            spread = _SpreadNoise(model, global_state, slot_client, slot_item, num_items)

        params, downloaded = {}, {}
        for name, kind in model.param_kinds.items():
            # index_select rather than tensor[index]: the same rows, several times faster on CPU
            if kind == "public_rows":
                downloaded[name] = global_state[name].index_select(0, slot_item)  # (R, d)
            elif kind == "private_rows":
                table = private_state[name]
                downloaded[name] = table.view(-1, *table.shape[2:]).index_select(0, slot_user * num_items + slot_item)
            elif kind == "public_dense":
                downloaded[name] = global_state[name].unsqueeze(0).expand(num_clients, *global_state[name].shape)
            else:
                downloaded[name] = private_state[name][users]  # (C, ...)
            # The upload and the one-batch write-back need the download next to the trained copy;
            # other private tensors are gathered copies already and are written back whole.
            keeps_download = kind.startswith("public") or (kind == "private_rows" and direct_rows)
            params[name] = downloaded[name].clone() if keeps_download else downloaded[name]
        adam = _ChunkAdam(method, params, num_clients, plan.round_index) if method.optimizer.is_adam else None

        # Examples grouped by step, then client, padded to (C_s, B_s).
        by_step = torch.argsort(ex_step * num_clients + ex_client, stable=True)
        step_of_sorted = ex_step[by_step]
        num_steps = int(sub.num_steps.max(initial=0))
        step_bounds = torch.searchsorted(step_of_sorted, torch.arange(num_steps + 1, device=device)).tolist()
        steps_per_client = torch.as_tensor(sub.num_steps, device=device)
        row_names = model.row_names
        # Linear-head backbones under the default loss (and FedMF or a linear head under a loss
        # with closed-form logit gradients, F3CRec's): gradients on the unpadded examples
        # (fedlib.engine.linear_head) instead of a padded batch and autograd.
        head = closed_form_head(method)
        summed_tables = None if head is None else head.tables
        for step in range(num_steps):
            idx = by_step[step_bounds[step]:step_bounds[step + 1]]
            active = int((steps_per_client > step).sum())
            # Only the row slots this step reads are gathered and differentiated.
            if direct_rows:
                step_slots = ex_slot[idx]
                local_rows = torch.arange(idx.numel(), device=device)
            else:
                step_slots, local_rows = torch.unique(ex_slot[idx], return_inverse=True)
            if summed_tables is None:
                batch = _padded_batch(ex_client[idx], local_rows, ex_item[idx], ex_label[idx], active, users, dtype)
                stepping = batch.mask.sum(1) > 0
            else:
                stepping = torch.bincount(ex_client[idx], minlength=active) > 0
            rows_sum = None  # Σ of the summed tables at step_slots, until a group steps them
            for group_index, group in enumerate(method.steps):
                if summed_tables is not None:
                    if rows_sum is None:
                        rows_sum = params[summed_tables[0]].index_select(0, step_slots)
                        for name in summed_tables[1:]:
                            rows_sum = rows_sum + params[name].index_select(0, step_slots)
                    wanted = [head.role(name) for name in group]
                    head_w = params[head.weight][:active]
                    head_b = None if head.bias is None else params[head.bias][:active]
                    step_fields = None
                    if head.loss is not None:  # what the loss reads beyond logits and labels
                        own = {head.weight: head_w} if head_b is None else {head.weight: head_w, head.bias: head_b}
                        step_fields = {"model": model, "items": ex_item[idx], "users": users[:active],
                                       "head": {name: value.detach() for name, value in own.items()}}
                    client_loss, by_name = linear_head_gradients(
                        rows_sum, head_w, head_b, local_rows, ex_client[idx], ex_label[idx],
                        need_loss=group_index == 0, wanted=wanted, loss_fn=head.loss,
                        step=step_fields)
                    grads = tuple(by_name[key] for key in wanted)
                    if any(name in summed_tables for name in group):
                        rows_sum = None  # this group's step moves the rows
                else:
                    live = {}
                    for name in model.param_kinds:
                        if name in row_names:
                            tensor = params[name].index_select(0, step_slots)
                        else:
                            tensor = params[name][:active]
                        live[name] = tensor.detach().requires_grad_(name in group)
                    client_loss = method.client_loss(model, live, batch)  # (C_s,)
                    grads = torch.autograd.grad(client_loss.sum(), [live[name] for name in group])
                if group_index == 0:
                    losses[torch.as_tensor(order[:active], device=device)] += client_loss.detach() / steps_per_client[:active]
                if method.step_clip_norm is not None:
                    grads = _clip_per_client(group, grads, row_names, slot_client[step_slots], active,
                                             method.step_clip_norm)
                noise = {}
                noised = [name for name in group if name in covered]
                if noised:  # DP step: clip the covered gradient of each client jointly, then noise
                    at = [group.index(name) for name in noised]
                    clipped = _clip_per_client(noised, [grads[i] for i in at], row_names, slot_client[step_slots],
                                               active, method.gradient_noise.clip_norm, exact=True)
                    grads = list(grads)
                    for i, grad in zip(at, clipped):
                        grads[i] = grad
                    if method.adds_gradient_noise:
                        noise = self._step_noise(method, group, global_state, private_state, sub.clients[:active],
                                                 noise_bounds, noise_key, _local_step_index(method, step, group_index))
                if adam is not None:
                    adam.step(group, grads, noise, step_slots, slot_client, slot_bounds[active], active,
                              stepping=stepping,
                              noise_slots=None if noise_slots is None else noise_slots[:noise_bounds[active]])
                    continue
                with torch.no_grad():
                    for name, grad in zip(group, grads):
                        step_size = method.lr(name, plan.round_index)
                        if name in row_names:
                            params[name].index_add_(0, step_slots, grad, alpha=-step_size)
                            if name in noise and spread is not None:  # every row of the stepping clients
                                spread.add(name, noise[name], params[name], slot_bounds[active], active,
                                           users, w, private_state, -step_size)
                            elif name in noise:  # every slot of the stepping clients, not only this batch's
                                params[name][:slot_bounds[active]].add_(noise[name], alpha=-step_size)
                        else:
                            params[name][:active] -= step_size * (grad + noise[name] if name in noise else grad)

        # Upload: weighted deltas scatter-added into the global sum; private state written back.
        with torch.no_grad():
            for name, kind in model.param_kinds.items():
                delta = None
                if kind.startswith("public") or (kind == "private_rows" and direct_rows):
                    delta = params[name] - downloaded[name]
                if spread is not None and kind == "public_rows":
                    delta = spread.untouched_part(name, update, delta)
                if kind == "public_rows":
                    update[name].index_add_(0, slot_item, delta * w[slot_client].unsqueeze(-1))
                    if sent is not None:
                        slot_position = torch.as_tensor(order, device=device)[slot_client]
                        keys_sent, delta_sent = slot_position * num_items + slot_item, delta
                        if slot_touched is not None and not method.uploads_every_row(name):
                            # whole-table slots, but this table changes on the touched rows only
                            keys_sent, delta_sent = keys_sent[slot_touched], delta_sent[slot_touched]
                        sent[name].append((keys_sent, delta_sent))
                elif kind == "public_dense":
                    update[name] += torch.tensordot(w, delta, dims=1)
                elif kind == "private_rows":
                    flat = private_state[name].view(-1, *private_state[name].shape[2:])
                    if direct_rows:  # one slot per example: duplicates of a row must add up
                        flat.index_add_(0, slot_user * num_items + slot_item, delta)
                    else:  # one slot per (client, item): write the local copy back
                        flat.index_copy_(0, slot_user * num_items + slot_item, params[name])
                else:
                    private_state[name][users] = params[name]

    @staticmethod
    def _step_noise(method, group, global_state, private_state, users, slot_bounds, noise_key, local_step):
        """Gradient noise of the stepping clients (ranks ``0..C_s-1``) for one update step.

        One counter-based draw per tensor for all stepping clients
        (:func:`~fedlib.engine.uploads.clients_gradient_noise`, the sequential executor's numbers):
        row noise ``(slot_bounds[C_s], *row)`` aligned with the slot prefix, dense noise
        ``(C_s, ...)``. ``slot_bounds`` (``C + 1``) delimits each client's noise rows: its
        slots, or only its touched slots when the executor keeps whole-table slots for another
        reason (Adam weight decay with touched-support noise).
        """
        like = next(iter({**global_state, **private_state}.values()))  # dtype and device of the noise
        users = np.asarray(users, dtype=np.int64)
        rows_per_client = np.diff(np.asarray(slot_bounds[:users.size + 1], dtype=np.int64))
        shapes = gradient_noise_shapes(method, group, global_state, private_state, 0)
        return clients_gradient_noise(method, shapes, users, rows_per_client, noise_key, local_step, like)

    # -- analytic FedMF kernel --------------------------------------------------------------
    def _use_fedmf_kernel(self, method: FederatedMethod, plan: RoundPlan) -> bool:
        if self.analytic_fedmf is False or type(method.model) is not FedMF or not method.is_plain:
            return False
        if self.analytic_fedmf is True:
            return True
        # "auto": (C, I) matrices per step versus the examples they replace.
        client_steps = float(plan.num_steps.sum())
        return client_steps * method.model.num_items <= 8.0 * max(plan.items.size, 1)

    def _fedmf_chunk(self, method, global_state, private_state, plan, positions, weights, update, losses, sent=None):
        model = method.model
        device, dtype = _state_like(global_state, private_state)
        num_items = model.num_items
        lr_user, lr_item = method.lr("user_emb", plan.round_index), method.lr("item_emb", plan.round_index)
        # A chunk is a contiguous range of clients, so its examples are one contiguous slice.
        first, last = int(positions[0]), int(positions[-1])
        examples = slice(int(plan.example_indptr[first]), int(plan.example_indptr[last + 1]))
        counts = np.diff(plan.example_indptr[first:last + 2])
        num_steps_of = plan.num_steps[first:last + 1]
        num_clients = num_steps_of.size
        # Rank clients by decreasing number of steps: those still stepping at step s are a prefix.
        order = np.argsort(-num_steps_of, kind="stable")  # rank -> position in the chunk
        rank = np.empty_like(order)
        rank[order] = np.arange(num_clients)
        num_steps_ranked = num_steps_of[order]
        users = torch.as_tensor(plan.clients[first:last + 1][order], device=device)
        w = torch.as_tensor(weights[first:last + 1][order], dtype=dtype, device=device)
        items_table = global_state["item_emb"]  # Q (I, d), read only
        user_vectors = private_state["user_emb"][users]  # p_c (C, d), this chunk's copies

        # Every (client, step) batch is a contiguous run of the plan (a client visits its examples
        # in step order). Order the runs by (step, client rank) and read them in that order:
        # no sort over the examples is needed.
        steps = plan.steps[examples]
        total = steps.size
        num_steps = int(num_steps_ranked.max(initial=0))
        run_start = np.zeros(total, dtype=bool)
        run_start[1:] = steps[1:] != steps[:-1]
        client_starts = np.cumsum(counts) - counts
        run_start[client_starts[counts > 0]] = True
        starts = np.flatnonzero(run_start)  # (runs,)
        lengths = np.diff(np.append(starts, total))
        run_client = np.repeat(rank, counts)[starts] if total else starts
        run_order = np.lexsort((run_client, steps[starts]))  # by step, then client rank
        starts, lengths, run_client = starts[run_order], lengths[run_order], run_client[run_order]
        by_step = _ranges_np(starts, lengths)  # example indices, step-major
        step_bounds = np.searchsorted(steps[starts], np.arange(num_steps + 1))
        step_bounds = np.concatenate([[0], np.cumsum(lengths)])[step_bounds]
        ex_rank_sorted = np.repeat(run_client, lengths)
        flat_all = torch.as_tensor(ex_rank_sorted * num_items + plan.items[examples][by_step], device=device)
        label_all = torch.as_tensor(plan.labels[examples][by_step], device=device, dtype=dtype)
        client_all = torch.as_tensor(ex_rank_sorted, device=device)
        # 1 / (size of the example's batch): the mean over the client's batch.
        inv_size_all = torch.as_tensor(np.repeat(1.0 / lengths, lengths), device=device, dtype=dtype)
        steps_per_client = torch.as_tensor(num_steps_ranked, device=device, dtype=dtype)

        past_vectors, past_coeffs = [], []  # p^{(s)} and A_s = -lr_Q G_s, for the active prefix
        loss_sum = torch.zeros(num_clients, dtype=dtype, device=device)
        upload = torch.zeros_like(items_table)
        for step in range(num_steps):
            lo, hi = int(step_bounds[step]), int(step_bounds[step + 1])
            active = int((num_steps_ranked > step).sum())
            p = user_vectors[:active]  # (C_s, d)
            # Logits of every (client, item) at the client's current local state.
            logits_all = p @ items_table.T  # (C_s, I)
            for p_old, coeff in zip(past_vectors, past_coeffs):
                logits_all += coeff[:active] * (p * p_old[:active]).sum(1, keepdim=True)
            flat = flat_all[lo:hi]
            z = logits_all.view(-1)[flat]  # (E_s,)
            y = label_all[lo:hi]
            inv_size = inv_size_all[lo:hi]
            # dL_c/dz_e for the mean BCE of the client's batch; summed per (client, item).
            g = (torch.sigmoid(z) - y) * inv_size
            coeff_matrix = torch.zeros(active * num_items, dtype=dtype, device=device).index_add_(0, flat, g)
            coeff_matrix = coeff_matrix.view(active, num_items)  # G_s (C_s, I)
            bce = torch.nn.functional.softplus(z) - y * z
            loss_sum[:active] += torch.zeros(active, dtype=dtype, device=device).index_add_(0, client_all[lo:hi], bce * inv_size)
            # Gradient of p_c: Σ_i G_s[c, i] q_ci with q_ci = Q_i + Σ_{s'} A_{s'}[c, i] p^{(s')}_c.
            grad_p = coeff_matrix @ items_table  # (C_s, d)
            for p_old, coeff in zip(past_vectors, past_coeffs):
                grad_p += (coeff_matrix * coeff[:active]).sum(1, keepdim=True) * p_old[:active]
            # This step's item-row change of client c is A_s[c, i] p_c (rank one per client).
            past_vectors.append(p.clone())
            past_coeffs.append(coeff_matrix.mul_(-lr_item))
            upload += past_coeffs[-1].T @ (w[:active, None] * p)  # Σ_c w_c A_s[c, i] p_c (I, d)
            user_vectors[:active] = p - lr_user * grad_p

        update["item_emb"] += upload
        private_state["user_emb"][users] = user_vectors
        if sent is not None:
            # Client c's change of row i: Σ_s A_s[c, i] p_c^{(s)}, read at the touched pairs only.
            pair_keys = torch.unique(flat_all)  # rank × I + item, sorted
            pair_rank = pair_keys // num_items
            delta = items_table.new_zeros((pair_keys.numel(), items_table.shape[1]))
            for p_old, coeff in zip(past_vectors, past_coeffs):
                in_step = pair_rank < p_old.shape[0]  # clients still stepping (a prefix of the ranks)
                rank_s, key_s = pair_rank[in_step], pair_keys[in_step]
                delta[in_step] += coeff.reshape(-1)[key_s].unsqueeze(-1) * p_old[rank_s]
            pair_position = torch.as_tensor(first + order, device=device)[pair_rank]
            sent["item_emb"].append((pair_position * num_items + pair_keys % num_items, delta))
        losses[torch.as_tensor(first + order, device=device)] += loss_sum / steps_per_client.clamp(min=1)


class _SpreadNoise:
    r"""Full-support gradient noise (SGD) without whole-table local copies.

    Under SGD a client's row ``i`` ends at ``θ_i − Σ_s lr_s (g_{s,i} + n_{s,i})``. Its gradient
    ``g`` is zero on the rows it does not train on, and those rows' values never enter its
    loss, so only the touched rows need a local copy (the executor's row slots). The noise of
    every other row goes straight where it ends up: into the client's private table in place
    (``private_rows``), or, weighted, into the round's aggregate (``public_rows``):
    ``Σ_c w_c Δ_c = Σ_c w_c (Δ_c on the touched rows, less their noise) + Σ_c w_c Σ_s −lr_s n_{c,s}``.
    This replaces ``C × I × d`` gathers, clones, differences and scatters per chunk by one
    weighted sum of each step's noise (which has to be drawn anyway). The sequential
    executor (whole tables) is the reference: ``tests/test_engine_equivalence.py``.

    Args:
        model: the backbone (its row tables' kinds).
        global_state: for the public tables' shapes.
        slot_client, slot_item: ``(R,)`` the touched row slots, sorted by (client rank, item).
        num_items: ``I``.
    """

    def __init__(self, model, global_state, slot_client: torch.Tensor, slot_item: torch.Tensor, num_items: int):
        self.kinds = model.param_kinds
        self.slot_pair = slot_client * num_items + slot_item  # (R,) the slot's row in the noise draw
        # public tables: the noise of every row, weighted and summed over clients (I, d), and the
        # part of it the touched slots already hold (R, d)
        self.public_sum = {name: torch.zeros_like(global_state[name]) for name in model.names("public_rows")}
        self.at_slots = {name: global_state[name].new_zeros((slot_item.numel(), *global_state[name].shape[1:]))
                         for name in model.names("public_rows")}

    def add(self, name, noise, slots_param, num_slots: int, active: int, users, w, private_state, alpha: float):
        """Add ``alpha ×`` one step's noise of the ``active`` stepping clients to every row they hold.

        Args:
            noise: ``(active × I, *row)`` sorted by (client rank, item).
            slots_param: ``(R, *row)`` the local copies (the slot prefix ``[0, num_slots)`` is
                the stepping clients').
            users: ``(C,)`` the chunk's user ids by rank; w: ``(C,)`` their upload weights.
        """
        at_touched = noise.index_select(0, self.slot_pair[:num_slots])  # (num_slots, *row)
        slots_param[:num_slots].add_(at_touched, alpha=alpha)
        per_client = noise.view(active, -1, *noise.shape[1:])  # (active, I, *row)
        if self.kinds[name] == "private_rows":  # untouched rows in place; touched ones are rewritten at the end
            private_state[name].index_add_(0, users[:active], per_client, alpha=alpha)
        else:
            self.public_sum[name] += torch.tensordot(w[:active] * alpha, per_client, dims=1)
            self.at_slots[name][:num_slots].add_(at_touched, alpha=alpha)

    def untouched_part(self, name, update, delta):
        """Add the public table's spread noise to ``update``; return the slots' delta without it."""
        update[name] += self.public_sum[name]
        return delta - self.at_slots[name]


class _ChunkAdam:
    """The Adam state of one chunk's clients, stacked like their parameters (fresh each round).

    Moments ``(R, ...)`` for row tables (aligned with the chunk's row slots) and ``(C, ...)``
    for dense tensors; a step count ``(C,)`` per client and tensor.
    """

    def __init__(self, method: FederatedMethod, params, num_clients: int, round_index: int):
        local = method.optimizer
        self.row_names = method.model.row_names
        self.options = dict(betas=local.betas, eps=local.eps, weight_decay=float(local.weight_decay))
        stepped = dict.fromkeys(name for group in method.steps for name in group)
        self.lr = {name: method.lr(name, round_index) for name in stepped}
        self.exp_avg = {name: torch.zeros_like(params[name]) for name in stepped}
        self.exp_avg_sq = {name: torch.zeros_like(params[name]) for name in stepped}
        device = next(iter(params.values())).device
        self.count = {name: torch.zeros(num_clients, dtype=torch.int64, device=device) for name in stepped}
        self.params = params

    @torch.no_grad()
    def step(self, group, grads, noise, step_slots, slot_client, num_slots: int, active: int, stepping,
             noise_slots=None):
        """One Adam step of the ``active`` clients (a prefix of the ranks) on the tensors of ``group``.

        Args:
            grads: the group's gradients (clipped): ``(S, ...)`` at ``step_slots`` for row
                tables, ``(C_s, ...)`` for dense tensors.
            noise: gradient noise per tensor: dense ``(C_s, ...)``; rows ``(num_slots, ...)`` on
                the slot prefix, or aligned with ``noise_slots`` when given.
            num_slots: slots of the active clients (the prefix ``[0, num_slots)``).
            stepping: ``(C_s,) bool`` the active clients that have a real example in this batch.
            noise_slots: ``(N,)`` the slots that receive the row noise (``None``: the prefix).
        """
        for name, grad in zip(group, grads):
            if name in self.row_names:
                # Dense gradient over every slot of the stepping clients: zero on the rows this
                # batch does not use, whose moments still decay (torch.optim.Adam on a full table).
                grad = grad.new_zeros((num_slots, *grad.shape[1:])).index_add_(0, step_slots, grad)
                span, owner = slice(0, num_slots), slot_client[:num_slots]
            else:
                span, owner = slice(0, active), None
            if name in noise:
                in_rows = name in self.row_names and noise_slots is not None
                grad = grad.index_add(0, noise_slots, noise[name]) if in_rows else grad + noise[name]
            masked_adam_step(self.params[name][span], grad, self.exp_avg[name][span], self.exp_avg_sq[name][span],
                             self.count[name][:active], stepping, lr=self.lr[name], owner=owner, **self.options)


def _ranges_np(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(starts[j], starts[j] + lengths[j])``."""
    offsets = np.cumsum(lengths) - lengths
    return np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(starts - offsets, lengths)


def _padded_batch(client, slot, item, label, active, users, dtype) -> LocalBatch:
    """Pad one step's examples (sorted by client) into ``(C_s, B_s)`` tensors."""
    device = client.device
    counts = torch.bincount(client, minlength=active)  # (C_s,)
    width = int(counts.max()) if counts.numel() else 0
    starts = torch.cumsum(counts, 0) - counts
    column = torch.arange(client.numel(), device=device) - starts[client]
    rows = torch.zeros(active, width, dtype=torch.int64, device=device)
    items = torch.zeros(active, width, dtype=torch.int64, device=device)
    labels = torch.zeros(active, width, dtype=dtype, device=device)
    mask = torch.zeros(active, width, dtype=dtype, device=device)
    rows[client, column] = slot
    items[client, column] = item
    labels[client, column] = label
    mask[client, column] = 1.0
    return LocalBatch(clients=users[:active], rows=rows, items=items, labels=labels, mask=mask)


def _clip_per_client(names, grads, row_names, slot_client, active, max_norm, exact: bool = False):
    """Clip each client's own gradient over the tensors ``names`` (jointly), ``C_s`` clients at once.

    Row gradients are ragged, ``(R_s, ...)`` with ``slot_client`` their client ranks; dense ones
    ``(C_s, ...)``. The factor is ``torch.nn.utils.clip_grad_norm_``'s
    ``min(1, C / (‖g‖ + 1e-6))`` for the step clip, or with ``exact`` the DP one
    ``min(1, C / ‖g‖)`` of :func:`~fedlib.engine.privacy.clip_factors` (as
    :func:`~fedlib.engine.privacy.clip_per_sample`, which the sequential executor uses).
    """
    squared = None
    for name, grad in zip(names, grads):
        if name in row_names:
            per_slot = grad.pow(2).flatten(1).sum(1)
            part = torch.zeros(active, dtype=grad.dtype, device=grad.device)
            in_range = slot_client < active
            part.index_add_(0, slot_client[in_range], per_slot[in_range])
        else:
            part = grad.pow(2).flatten(1).sum(1) if grad.dim() > 1 else grad.pow(2)
        squared = part if squared is None else squared + part
    if exact:
        scale = clip_factors(squared.sqrt(), max_norm)  # (C_s,)
    else:
        scale = (max_norm / (squared.sqrt() + _CLIP_EPS)).clamp(max=1.0)  # (C_s,)
    clipped = []
    for name, grad in zip(names, grads):
        if name in row_names:
            factor = torch.ones_like(slot_client, dtype=grad.dtype)
            in_range = slot_client < active
            factor[in_range] = scale[slot_client[in_range]]
            clipped.append(grad * factor.view(-1, *([1] * (grad.dim() - 1))))
        else:
            clipped.append(grad * scale.view(-1, *([1] * (grad.dim() - 1))))
    return clipped
