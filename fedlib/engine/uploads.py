r"""What a client sends the server: noisy uploads, per-client inspection, bytes on the wire.

Four pieces shared by both executors and the round loop:

* :func:`upload_noise_rows` draws the Laplace upload noise of many clients of a round in one
  vectorised call (:class:`~fedlib.engine.method.UploadNoise`), :func:`client_upload_noise`
  one client's. Every element is a pure function of ``(round noise key, client id, tensor,
  element index)`` (a counter-based generator, :func:`~fedlib.engine.privacy.counter_bits`),
  so the sequential and the batched executor add exactly the same numbers, whatever the
  chunking and whichever other clients take part.
* :func:`clients_gradient_noise` draws, the same way, the Gaussian noise of many clients for
  one local step (:class:`~fedlib.engine.method.GradientNoise`), :func:`client_gradient_noise`
  one client's; what it perturbs ends up in the upload (public tables) or in the client's
  private state.
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

import numpy as np
import torch

from fedlib.engine.communication import CommunicationLedger
from fedlib.engine.plan import RoundPlan, client_noise_keys
from fedlib.engine.privacy import add_laplace_from_counters, gaussian_from_counters, laplace_from_counters

__all__ = ["ClientRowUpdates", "client_upload_noise", "upload_noise_rows", "add_upload_noise_rows", "full_table_upload_noise", "client_gradient_noise",
           "clients_gradient_noise", "gradient_noise_shapes", "record_round_communication"]


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


def _part_index(method, name: str) -> int:
    """The noise ``part`` of a tensor: its index in ``model.param_kinds`` (declaration order)."""
    return list(method.model.param_kinds).index(name)


def upload_noise_rows(method, global_state: Mapping[str, torch.Tensor], noise_key: int, client_ids: np.ndarray,
                      positions: np.ndarray, items: np.ndarray, names: Sequence[str] = None,
                      row_weights: np.ndarray = None) -> Dict[str, torch.Tensor]:
    r"""Upload noise of many clients at once: ``name -> noise`` for the public tensors.

    Element ``j`` of row ``i`` of a ``public_rows`` table ``Q`` (``(I, *row)``, ``m`` = row
    numel) in client ``u``'s upload gets element ``i·m + j`` of the counter stream
    :func:`~fedlib.engine.plan.client_noise_keys` ``(noise_key, u, stream=0, part)``
    (``part`` = the tensor's index in ``model.param_kinds``), through
    :func:`~fedlib.engine.privacy.laplace_from_counters`; element ``j`` of a ``public_dense``
    tensor gets element ``j``. The noise a client adds to row ``i`` is therefore the same with
    ``support="touched"`` and ``"full"``, and independent of the other rows, clients and chunks.

    Args:
        method: the :class:`~fedlib.engine.method.FederatedMethod` (``upload_noise`` set).
        global_state: the downloaded public tensors (shapes, dtype, device).
        noise_key: the round's key (:func:`~fedlib.engine.plan.round_noise_key`).
        client_ids: ``(C,) int64`` user ids.
        positions: ``(R,) int64`` index into ``client_ids`` of each noisy row.
        items: ``(R,) int64`` row (item id) of each noisy row.
        names: the tensors to draw (default: every public one).
        row_weights: ``(R,)`` factors of the row noise (aggregation weights), applied in the
            same pass as the scale (:func:`~fedlib.engine.privacy.laplace_from_counters`).

    Returns:
        ``public_rows``: ``(R, *row)`` aligned with ``(positions, items)``; ``public_dense``:
        ``(C, *shape)``.
    """
    scale = method.upload_noise.scale
    client_ids = np.asarray(client_ids, dtype=np.int64)
    positions = np.asarray(positions, dtype=np.int64)
    items = np.asarray(items, dtype=np.int64)
    out = {}
    for name, kind in method.model.param_kinds.items():
        if kind not in ("public_rows", "public_dense") or (names is not None and name not in names):
            continue
        tensor = global_state[name]
        keys = client_noise_keys(noise_key, client_ids, stream=0, part=_part_index(method, name))
        if kind == "public_rows":
            width = math.prod(tensor.shape[1:])
            noise = laplace_from_counters(keys[positions], items * width, width, scale, tensor.dtype, tensor.device,
                                          row_weights=row_weights)
            out[name] = noise.view(items.size, *tensor.shape[1:])
        else:
            noise = laplace_from_counters(keys, np.zeros(client_ids.size, dtype=np.int64), tensor.numel(), scale,
                                          tensor.dtype, tensor.device)
            out[name] = noise.view(client_ids.size, *tensor.shape)
    return out


def add_upload_noise_rows(method, global_state: Mapping[str, torch.Tensor], noise_key: int, client_ids: np.ndarray,
                          positions: np.ndarray, items: np.ndarray, name: str, table: torch.Tensor,
                          row_weights: np.ndarray = None) -> torch.Tensor:
    """``table.index_add_(0, items, upload_noise_rows(...)[name])`` without keeping the noise.

    The same numbers as :func:`upload_noise_rows` for the ``public_rows`` tensor ``name``, summed
    into ``table`` (``(I, *row)``, e.g. the round's aggregate update) row by row in the order of
    ``(positions, items)``: bit-identical to drawing the rows and calling ``index_add_``
    (:func:`~fedlib.engine.privacy.add_laplace_from_counters`).

    Args:
        method, global_state, noise_key, client_ids, positions, items, row_weights: as in
            :func:`upload_noise_rows`.
        name: a ``public_rows`` tensor of ``method.model``.
        table: updated in place and returned.
    """
    if method.model.param_kinds.get(name) != "public_rows":
        raise ValueError(f"{name!r} is not a public_rows tensor of {type(method.model).__name__}")
    client_ids = np.asarray(client_ids, dtype=np.int64)
    positions = np.asarray(positions, dtype=np.int64)
    items = np.asarray(items, dtype=np.int64)
    width = math.prod(global_state[name].shape[1:])
    keys = client_noise_keys(noise_key, client_ids, stream=0, part=_part_index(method, name))
    return add_laplace_from_counters(table, items, keys[positions], items * width, width, method.upload_noise.scale,
                                     row_weights=row_weights)


def full_table_upload_noise(method, global_state: Mapping[str, torch.Tensor], noise_key: int, client_ids: np.ndarray,
                            name: str, client_weights: np.ndarray = None) -> torch.Tensor:
    r"""``(C, I, *row)`` upload noise of the whole ``public_rows`` table ``name`` of many clients.

    The same numbers as :func:`upload_noise_rows` over every item (element ``j`` of row ``i``
    is element ``i·m + j`` of the client's stream), drawn as one row of ``I·m`` elements per
    client: long rows keep the vectorised draw's per-row work small.

    Args:
        method, global_state, noise_key, client_ids: as in :func:`upload_noise_rows`.
        name: the ``public_rows`` tensor.
        client_weights: ``(C,)`` factors of each client's noise (aggregation weights), applied
            in the same pass as the scale.
    """
    client_ids = np.asarray(client_ids, dtype=np.int64)
    table = global_state[name]
    keys = client_noise_keys(noise_key, client_ids, stream=0, part=_part_index(method, name))
    noise = laplace_from_counters(keys, np.zeros(client_ids.size, dtype=np.int64), table.numel(),
                                  method.upload_noise.scale, table.dtype, table.device, row_weights=client_weights)
    return noise.view(client_ids.size, *table.shape)


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
        tensor's shape. The same numbers as this client's part of :func:`upload_noise_rows`,
        which the batched executor draws for all clients at once.
    """
    kinds = method.model.param_kinds
    client = np.array([int(client_id)])
    full = method.upload_noise.support == "full"
    items = np.zeros(0, dtype=np.int64) if full else torch.as_tensor(touched_items).cpu().numpy().astype(np.int64)
    # One client: position 0 of a one-client batch (the batched executor draws all at once).
    drawn = upload_noise_rows(method, global_state, noise_key, client, np.zeros(items.size, dtype=np.int64), items)
    if full:  # whole tables: the same numbers as every item's row, drawn as one long row
        drawn.update({name: full_table_upload_noise(method, global_state, noise_key, client, name)[0]
                      for name in drawn if kinds[name] == "public_rows"})
    return {name: tensor if kinds[name] == "public_rows" else tensor[0] for name, tensor in drawn.items()}


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


def clients_gradient_noise(method, shapes: Mapping[str, Tuple[int, ...]], client_ids: np.ndarray,
                           rows_per_client: np.ndarray, noise_key: int, local_step: int,
                           like: torch.Tensor) -> Dict[str, torch.Tensor]:
    r"""Gaussian gradient noise ``N(0, (σC)²)`` of many clients for one local step, in one draw per tensor.

    Element ``j`` of a client's noise on a tensor (flattened, per client: its ``n_c`` rows of a
    row table, or the whole dense tensor) is element ``j`` of the counter stream
    :func:`~fedlib.engine.plan.client_noise_keys` ``(noise_key, u, stream=1 + local_step, part)``
    (``part`` = the tensor's index in ``model.param_kinds``), through
    :func:`~fedlib.engine.privacy.gaussian_from_counters`. Row noise of a ``"touched"`` table
    is aligned with the client's sorted touched items.

    Args:
        method: the :class:`~fedlib.engine.method.FederatedMethod` (``gradient_noise`` set).
        shapes: ``name -> per-client shape`` (:func:`gradient_noise_shapes`; the leading size
            of a row table's shape is ignored, ``rows_per_client`` gives it).
        client_ids: ``(C,) int64`` user ids.
        rows_per_client: ``(C,) int64`` noise rows of each client in the row tables.
        noise_key: the round's key.
        local_step: ``k = batch × len(method.steps) + group`` (0-based, within the round).
        like: any tensor of the state: dtype and device of the noise.

    Returns:
        ``name -> noise``: row tables ``(Σ_c n_c, *row)``, clients in order; dense tensors
        ``(C, *shape)``.
    """
    std = method.gradient_noise.noise_std
    row_names = method.model.row_names
    client_ids = np.asarray(client_ids, dtype=np.int64)
    rows_per_client = np.asarray(rows_per_client, dtype=np.int64)
    out = {}
    for name, shape in shapes.items():
        keys = client_noise_keys(noise_key, client_ids, stream=1 + int(local_step), part=_part_index(method, name))
        if name in row_names:
            width = math.prod(shape[1:])
            owner = np.repeat(np.arange(client_ids.size), rows_per_client)
            first = np.zeros(client_ids.size + 1, dtype=np.int64)
            np.cumsum(rows_per_client, out=first[1:])
            rank = np.arange(owner.size, dtype=np.int64) - first[owner]
            noise = gaussian_from_counters(keys[owner], rank * width, width, std, like.dtype, like.device)
            out[name] = noise.view(owner.size, *shape[1:])
        else:
            noise = gaussian_from_counters(keys, np.zeros(client_ids.size, dtype=np.int64), math.prod(shape), std,
                                           like.dtype, like.device)
            out[name] = noise.view(client_ids.size, *shape)
    return out


def client_gradient_noise(method, shapes: Mapping[str, Tuple[int, ...]], client_id: int, noise_key: int,
                          local_step: int, like: torch.Tensor) -> Dict[str, torch.Tensor]:
    r"""One client's Gaussian gradient noise for one local step: ``name -> N(0, (σC)²)`` noise.

    This client's part of :func:`clients_gradient_noise` (the same numbers), shaped as
    ``shapes`` (:func:`gradient_noise_shapes`, declaration order). Row noise of a
    ``"touched"`` table is aligned with the client's sorted touched items.

    Args:
        method: the :class:`~fedlib.engine.method.FederatedMethod` (``gradient_noise`` set).
        shapes: per-client noise shapes of the step.
        client_id: the user id.
        noise_key: the round's key (as for :func:`client_upload_noise`).
        local_step: ``k = batch × len(method.steps) + group`` (0-based, within the round).
        like: any tensor of the state: dtype and device of the noise.
    """
    row_names = method.model.row_names
    rows = {shape[0] for name, shape in shapes.items() if name in row_names}
    if len(rows) > 1:
        raise ValueError(f"the row tables of one step must have the same number of noise rows, got {sorted(rows)}")
    noise = clients_gradient_noise(method, shapes, np.array([int(client_id)]), np.array([rows.pop() if rows else 0]),
                                   noise_key, local_step, like)
    return {name: tensor if name in row_names else tensor[0] for name, tensor in noise.items()}


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
