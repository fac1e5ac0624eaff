r"""What a client sends the server: noisy uploads, per-client inspection, bytes on the wire.

Four pieces shared by both executors and the round loop:

* :func:`client_upload_noise` draws one client's Laplace noise for one round
  (:class:`~fedlib.engine.method.UploadNoise`). The draw is a pure function of
  ``(round noise key, client id)`` and the shapes involved, and it happens in one fixed order
  (public tensors in declaration order; touched rows sorted by item id), so the sequential
  and the batched executor add exactly the same numbers.
* :func:`client_gradient_noise` draws, the same way, one client's Gaussian noise for one
  local step (:class:`~fedlib.engine.method.GradientNoise`); what it perturbs ends up in the
  upload (public tables) or in the client's private state.
* :class:`ClientRowUpdates` holds the individual uploads of a ``public_rows`` table, one row
  per (client, item) pair a client sends a change for: what an honest-but-curious server
  sees before averaging (input of :mod:`fedlib.audits.inference_attack`).
* :func:`record_round_communication` charges one round's traffic to a
  :class:`~fedlib.engine.communication.CommunicationLedger`: every sampled client downloads
  the public tensors, and uploads either full tables or touched rows plus int64 indices
  (``method.upload_mode``), plus the public dense tensors.

Noise, written out for client ``c`` and a ``public_rows`` table ``Q`` of shape ``(I, d)``::

    support="full":     upload_c = Q + Δ_c + ε_c,            ε_c ~ Laplace(0, b)^(I × d)
    support="touched":  upload_c = Q + Δ_c + S_c ε_c,        ε_c ~ Laplace(0, b)^(n_c × d)

where ``S_c`` scatters the ``n_c`` noise rows to the items the client touched. The server
receives ``Σ_c w_c upload_c = Q + Σ_c w_c (Δ_c + noise_c)`` (``Σ_c w_c = 1``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Mapping, Sequence, Tuple

import torch

from fedlib.engine.communication import CommunicationLedger
from fedlib.engine.plan import RoundPlan, client_noise_generator
from fedlib.engine.privacy import gaussian_noise_like, laplace_noise_like

__all__ = ["ClientRowUpdates", "client_upload_noise", "client_gradient_noise", "gradient_noise_shapes",
           "record_round_communication"]


@dataclass
class ClientRowUpdates:
    """The individual uploads of one ``public_rows`` table in one round.

    One entry per (client, row) pair a client sends a change for, sorted by client id, then
    row id: the rows it touched, or, with full-support noise, every row of the table.

    Attributes:
        clients: ``(R,) int64`` user id of the sending client.
        rows: ``(R,) int64`` item id (row of the table).
        delta: ``(R, *row_shape)`` what the client's uploaded row differs from the row it
            downloaded by, noise included: ``upload_c[i] − Q[i]``.
    """

    clients: torch.Tensor
    rows: torch.Tensor
    delta: torch.Tensor

    def __len__(self) -> int:
        return int(self.rows.numel())

    @property
    def client_ids(self) -> torch.Tensor:
        """``(C,) int64`` distinct clients, sorted."""
        return torch.unique(self.clients)

    def norms(self) -> torch.Tensor:
        """``(R,)`` L2 norm of each row's change."""
        return torch.linalg.vector_norm(self.delta.reshape(len(self), -1), dim=1)

    def of_client(self, client_id: int):
        """``(rows (n,), delta (n, *row_shape))`` of one client (for display; not for loops)."""
        mask = self.clients == int(client_id)
        return self.rows[mask], self.delta[mask]

    def dense(self, num_rows: int) -> torch.Tensor:
        """``(C, num_rows, *row_shape)`` changes, zero where a client sent nothing; clients in
        :attr:`client_ids` order. Memory ``C × num_rows × row numel`` values."""
        ids, position = torch.unique(self.clients, return_inverse=True)
        out = self.delta.new_zeros((ids.numel(), int(num_rows), *self.delta.shape[1:]))
        out[position, self.rows] = self.delta
        return out


def client_upload_noise(method, global_state: Mapping[str, torch.Tensor], client_id: int, noise_key: int,
                        touched_items: torch.Tensor) -> Dict[str, torch.Tensor]:
    """One client's upload noise for one round: ``name -> noise`` for every public tensor.

    Args:
        method: the :class:`~fedlib.engine.method.FederatedMethod` (its ``upload_noise``
            must be set).
        global_state: the downloaded public tensors (shapes, dtype and device of the noise).
        client_id: the user id.
        noise_key: the round's key, :func:`~fedlib.engine.plan.round_noise_key` ``(seed, round)``
            or :attr:`~fedlib.engine.plan.RoundPlan.noise_key`.
        touched_items: ``(n,) int64`` sorted distinct items the client trained on.

    Returns:
        ``public_rows``: ``(I, *row_shape)`` with ``support="full"``, ``(n, *row_shape)``
        (aligned with ``touched_items``) with ``support="touched"``; ``public_dense``: the
        tensor's shape. Drawn in declaration order from
        :func:`~fedlib.engine.plan.client_noise_generator` ``(noise_key, client_id)``.
    """
    noise = method.upload_noise
    generator = client_noise_generator(noise_key, client_id)
    out = {}
    for name, kind in method.model.param_kinds.items():
        if kind == "public_rows":
            table = global_state[name]
            like = table if noise.support == "full" else table.new_empty((int(touched_items.numel()), *table.shape[1:]))
            out[name] = laplace_noise_like(like, noise.scale, generator)
        elif kind == "public_dense":
            out[name] = laplace_noise_like(global_state[name], noise.scale, generator)
    return out


def gradient_noise_shapes(method, group: Sequence[str], global_state: Mapping[str, torch.Tensor],
                          private_state: Mapping[str, torch.Tensor], num_touched_rows: int) -> Dict[str, Tuple[int, ...]]:
    """Shapes of one client's gradient noise in a step of ``group``: ``name -> shape``.

    Covered parameters of the group only (:attr:`~fedlib.engine.method.FederatedMethod.gradient_noise_names`),
    in declaration order, per client (no client axis): a row table ``(num_items, *row)``
    with ``support="full"``, ``(num_touched_rows, *row)`` with ``"touched"``; a dense tensor
    its own shape (a private one: one user's slice).
    """
    model = method.model
    full = method.gradient_noise.support == "full"
    in_group = set(group)
    shapes = {}
    for name in method.gradient_noise_names:
        if name not in in_group:
            continue
        kind = model.param_kinds[name]
        if kind == "public_rows":
            shapes[name] = (model.num_items if full else int(num_touched_rows), *global_state[name].shape[1:])
        elif kind == "private_rows":
            shapes[name] = (model.num_items if full else int(num_touched_rows), *private_state[name].shape[2:])
        elif kind == "public_dense":
            shapes[name] = tuple(global_state[name].shape)
        else:  # private_dense: (num_users, ...) stacked
            shapes[name] = tuple(private_state[name].shape[1:])
    return shapes


def client_gradient_noise(method, shapes: Mapping[str, Tuple[int, ...]], client_id: int, noise_key: int,
                          local_step: int, like: torch.Tensor) -> Dict[str, torch.Tensor]:
    r"""One client's Gaussian gradient noise for one local step: ``name -> N(0, (σC)²)`` noise.

    All tensors come from a single draw of ``Σ numel`` normals, split in the order of
    ``shapes`` (:func:`gradient_noise_shapes`, declaration order), from
    :func:`~fedlib.engine.plan.client_noise_generator` ``(noise_key, client_id, stream=1 + local_step)``.
    Row noise of a ``"touched"`` table is aligned with the client's sorted touched items.

    Args:
        method: the :class:`~fedlib.engine.method.FederatedMethod` (``gradient_noise`` set).
        shapes: per-client noise shapes of the step.
        client_id: the user id.
        noise_key: the round's key (as for :func:`client_upload_noise`).
        local_step: ``k = batch × len(method.steps) + group`` (0-based, within the round).
        like: any tensor of the state: dtype and device of the noise.
    """
    generator = client_noise_generator(noise_key, client_id, stream=1 + int(local_step))
    sizes = [math.prod(shape) for shape in shapes.values()]
    flat = gaussian_noise_like(like.new_empty(sum(sizes)), method.gradient_noise.noise_std, generator)
    return {name: part.view(shape) for (name, shape), part in zip(shapes.items(), flat.split(sizes))}


def record_round_communication(ledger: CommunicationLedger, method, global_state: Mapping[str, torch.Tensor],
                               plan: RoundPlan) -> None:
    """Charge one round's messages to ``ledger`` (no per-client Python work).

    * download: every sampled client receives every public tensor in full
      (``numel × element size`` bytes each);
    * upload, ``public_rows`` tables: ``method.upload_mode == "full"``: the full table;
      ``"rows"``: ``n_c × (row numel × element size + 8)`` bytes, ``n_c`` = distinct items
      client ``c`` trained on, each row sent with its int64 index;
    * upload, ``public_dense`` tensors: in full.

    Noise does not change sizes. Records are named after the parameters.
    """
    model = method.model
    round_index, clients = int(plan.round_index), plan.clients
    for name in model.public_names:
        ledger.download(round_index, clients, name, global_state[name])
    row_counts = None
    for name, kind in model.param_kinds.items():
        if kind == "public_rows" and method.upload_mode == "rows":
            if row_counts is None:
                row_counts = plan.touched_row_counts(model.num_items)
            table = global_state[name]
            # A stride-0 view stands for "every client's copy of the table": the ledger reads
            # only its shape and dtype when given explicit row counts.
            stacked = table.unsqueeze(0).expand(clients.size, *table.shape)
            ledger.upload(round_index, clients, name, stacked, per_client=False, sparse_rows=row_counts)
        elif kind in ("public_rows", "public_dense"):
            ledger.upload(round_index, clients, name, global_state[name])
