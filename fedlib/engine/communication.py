r"""Communication accounting: bytes actually transmitted between clients and server.

A :class:`CommunicationLedger` is filled by the round loop at the moment something is
sent (``ledger.download(...)`` when clients receive, ``ledger.upload(...)`` when they send)
and summarised afterwards. It records **measured** sizes: the shape and dtype of what a
method really transmits, so e.g. a method that uploads only touched item rows is charged
for those rows plus their indices. Papers usually report **analytic** sizes instead
(parameter count × bytes per value); :func:`analytic_model_bytes` computes those, and
notebooks show the two side by side, never mixed.

Sizes:

* bytes of a dense tensor = ``numel × element size of the dtype as sent``
  (float32 = 4, float64 = 8, float16/bfloat16 = 2, int64 = 8 bytes);
* ``sparse_rows``: only the rows (slices along the first payload dimension) that are
  sent count, each with one index, ``rows × (row numel × element size + index size)``
  (int64 indices by default, 8 bytes);
* raw byte counts can be recorded directly (e.g. for pickled or compressed messages).

Units (:func:`format_bytes`). Two conventions exist and both are spelled out:

* ``"binary"`` (default): 1 KiB = 1024 B, 1 MiB = 1024² B = 1,048,576 B;
* ``"decimal"`` (SI): 1 kB = 1000 B, 1 MB = 10⁶ B;
* ``"paper"``: binary multiples printed as "KB"/"MB", which is how the papers in this
  library label their figures. Checked against their numbers: FedKDRec Table 3 reports
  FedMF on ML-100K as "0.205 MB" = 1,682 items × 32 dims × 4 B = 215,296 B / 2²⁰
  (decimal would be 0.215 MB), Amazon-Industrial "0.651 MB" = 5,334 × 128 B / 2²⁰, and
  ML-1M "0.482 MB" = 3,952 × 128 B / 2²⁰ (3,952 is the largest raw ML-1M item id; only
  3,706 items occur in the ratings). FedCSR §5 computes 100k items × 32 dims × 8 B =
  25.6·10⁶ B and reports "24.41MB" = 25.6·10⁶ / 2²⁰.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Union

import numpy as np
import pandas as pd
import torch

__all__ = [
    "CommunicationLedger",
    "analytic_model_bytes",
    "tensor_nbytes",
    "format_bytes",
    "UNIT_CONVENTIONS",
]

DIRECTIONS = ("upload", "download")

#: Unit ladders per convention: (label, bytes per unit), from small to large.
UNIT_CONVENTIONS = {
    "binary": (("B", 1), ("KiB", 1024), ("MiB", 1024**2), ("GiB", 1024**3), ("TiB", 1024**4)),
    "decimal": (("B", 1), ("kB", 1000), ("MB", 1000**2), ("GB", 1000**3), ("TB", 1000**4)),
    "paper": (("B", 1), ("KB", 1024), ("MB", 1024**2), ("GB", 1024**3), ("TB", 1024**4)),
}

Payload = Union[torch.Tensor, int, np.integer, np.ndarray, Sequence[int], Sequence[torch.Tensor]]
ClientIds = Union[int, np.integer, np.ndarray, torch.Tensor, Sequence[int]]


def _dtype_nbytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def tensor_nbytes(tensor: torch.Tensor, dtype: Optional[torch.dtype] = None) -> int:
    """Bytes of a dense tensor as sent: ``numel × element size`` of ``dtype`` (default: its own)."""
    return int(tensor.numel()) * _dtype_nbytes(dtype if dtype is not None else tensor.dtype)


def analytic_model_bytes(num_params: Union[int, torch.nn.Module, Iterable[torch.Tensor]], dtype: torch.dtype = torch.float32) -> int:
    """Analytic message size ``num_params × bytes per value`` as papers compute it.

    Args:
        num_params: a parameter count, a module (all its parameters are counted), or an
            iterable of tensors.
        dtype: value type assumed by the paper (float32 = 4 B; FedCSR assumes 64-bit = 8 B).

    Example: an ML-100K item table, ``analytic_model_bytes(1682 * 32)`` = 215,296 B
    (``format_bytes(215296, "paper", unit="MB")`` = "0.205 MB", as in FedKDRec Table 3).
    """
    if isinstance(num_params, torch.nn.Module):
        count = sum(p.numel() for p in num_params.parameters())
    elif isinstance(num_params, (int, np.integer)):
        count = int(num_params)
    else:
        count = sum(int(t.numel()) for t in num_params)
    if count < 0:
        raise ValueError(f"num_params must be >= 0, got {count}")
    return count * _dtype_nbytes(dtype)


def format_bytes(num_bytes: float, convention: str = "binary", precision: int = 3, unit: Optional[str] = None) -> str:
    """Human-readable size, e.g. ``format_bytes(215296)`` -> ``"210.250 KiB"``.

    Args:
        num_bytes: size in bytes (may be fractional, e.g. a mean).
        convention: ``"binary"`` (KiB/MiB, powers of 1024), ``"decimal"`` (kB/MB, powers of
            1000) or ``"paper"`` (powers of 1024 labelled KB/MB, the papers' usage); see the
            module docstring.
        precision: digits after the decimal point (plain bytes are printed as integers
            when whole).
        unit: force one unit of the convention (e.g. ``"MB"``) so a table column shares it;
            by default the largest unit giving a value ≥ 1 is used.
    """
    if convention not in UNIT_CONVENTIONS:
        raise ValueError(f"convention must be one of {sorted(UNIT_CONVENTIONS)}, got {convention!r}")
    ladder = UNIT_CONVENTIONS[convention]
    value = float(num_bytes)
    if math.isnan(value):
        return "nan"
    if unit is not None:
        factors = dict(ladder)
        if unit not in factors:
            raise ValueError(f"unit {unit!r} is not part of the {convention!r} convention {list(factors)}")
        label, factor = unit, factors[unit]
    else:
        label, factor = ladder[0]
        for candidate_label, candidate_factor in ladder:
            if abs(value) >= candidate_factor:
                label, factor = candidate_label, candidate_factor
    scaled = value / factor
    if label == "B" and float(scaled).is_integer():
        return f"{int(scaled)} B"
    return f"{scaled:.{precision}f} {label}"


@dataclass(frozen=True)
class _Entry:
    """One ``upload``/``download`` call: a named message sent to/from several clients."""

    round: int
    direction: str
    name: str
    client_ids: np.ndarray  # (C,) int64
    nbytes: np.ndarray  # (C,) int64, bytes of each client's message


def _as_client_ids(client_ids: ClientIds) -> np.ndarray:
    if isinstance(client_ids, torch.Tensor):
        ids = client_ids.detach().cpu().numpy()
    else:
        ids = np.asarray(client_ids)
    ids = np.atleast_1d(ids)
    if ids.ndim != 1:
        raise ValueError(f"client_ids must be a scalar or 1-d, got shape {ids.shape}")
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"client_ids must be integers, got {ids.dtype}")
    return ids.astype(np.int64, copy=False)


def _row_payload_nbytes(row_shape: Sequence[int], element_bytes: int) -> int:
    return int(np.prod(row_shape, dtype=np.int64)) * element_bytes


def _is_dense(sparse_rows) -> bool:
    # Identity checks: `sparse_rows` may be a tensor, whose truth value is ambiguous.
    return sparse_rows is None or sparse_rows is False


def _touched_row_counts(rows: torch.Tensor) -> torch.Tensor:
    """Rows with any non-zero value, counted over dim -1 of ``rows.reshape(..., R, -1)``."""
    return (rows != 0).any(dim=-1).sum(dim=-1)


class CommunicationLedger:
    """Record of every message between server and clients, in bytes.

    Typical use inside a round loop (C clients, stacked tensors, no per-client loop)::

        ledger.download(r, client_ids, "item_table", global_items)            # each gets the table
        ledger.upload(r, client_ids, "item_table", local_items, per_client=False)  # (C, I, d)
        ledger.upload(r, client_ids, "item_rows", deltas, per_client=False, sparse_rows=True)

    ``per_client`` says how ``payload`` maps to clients:

    * ``per_client=True`` (default): ``payload`` is **one client's message** and every
      listed client transmits a message of that size (e.g. a broadcast model). Accepts a
      tensor or an ``int`` byte count.
    * ``per_client=False``: ``payload`` holds **all listed clients' messages**: a stacked
      tensor whose first dimension indexes the clients (``payload[c]`` is client
      ``client_ids[c]``'s message), a list of per-client tensors, or an integer array of
      per-client byte counts.

    A list of tensors is read with one Python step per element (shape metadata only); the
    stacked form is fully vectorised.
    """

    def __init__(self) -> None:
        self._entries: List[_Entry] = []

    # ------------------------------------------------------------------ recording
    def upload(self, round: int, client_ids: ClientIds, name: str, payload: Payload, *, per_client: bool = True,
               sparse_rows: Union[None, bool, torch.Tensor, np.ndarray] = None,
               sent_dtype: Optional[torch.dtype] = None, index_dtype: torch.dtype = torch.int64) -> int:
        """Record client → server messages; returns the total bytes recorded by this call.

        Args:
            round: round index.
            client_ids: ``(C,)`` ids of the sending clients (or one int).
            name: what is sent (``"item_table"``, ``"predictions"``, ...), kept for summaries.
            payload: see the class docstring for ``per_client``.
            per_client: ``True``: payload is one client's message; ``False``: payload is
                stacked / one entry per client.
            sparse_rows: ``None``/``False`` dense; ``True`` count only rows with a non-zero
                value (a row = a slice along the first dimension of a client's message);
                a bool tensor/array of touched rows (``(R,)`` per client, or ``(C, R)``
                stacked); or integer row counts (scalar or ``(C,)``).
            sent_dtype: dtype on the wire when it differs from the payload's (e.g. float16).
            index_dtype: dtype of the row indices in ``sparse_rows`` mode (int64 = 8 B).
        """
        return self._record("upload", round, client_ids, name, payload, per_client, sparse_rows, sent_dtype, index_dtype)

    def download(self, round: int, client_ids: ClientIds, name: str, payload: Payload, *, per_client: bool = True,
                 sparse_rows: Union[None, bool, torch.Tensor, np.ndarray] = None,
                 sent_dtype: Optional[torch.dtype] = None, index_dtype: torch.dtype = torch.int64) -> int:
        """Record server → client messages; arguments as in :meth:`upload`."""
        return self._record("download", round, client_ids, name, payload, per_client, sparse_rows, sent_dtype, index_dtype)

    def _record(self, direction, round, client_ids, name, payload, per_client, sparse_rows, sent_dtype, index_dtype) -> int:
        ids = _as_client_ids(client_ids)
        nbytes = self._bytes_per_client(payload, ids.size, bool(per_client), sparse_rows, sent_dtype, index_dtype)
        self._entries.append(_Entry(int(round), direction, str(name), ids, nbytes))
        return int(nbytes.sum())

    @staticmethod
    def _bytes_per_client(payload, num_clients, per_client, sparse_rows, sent_dtype, index_dtype) -> np.ndarray:
        """``(C,) int64`` bytes of each client's message."""
        index_bytes = _dtype_nbytes(index_dtype)
        if num_clients == 0:
            return np.zeros(0, dtype=np.int64)

        # Raw byte counts.
        if isinstance(payload, (int, np.integer)) and not isinstance(payload, bool):
            if not per_client:
                raise ValueError("an int payload is one client's byte count; pass an array of per-client counts "
                                 "with per_client=False")
            if not _is_dense(sparse_rows):
                raise ValueError("sparse_rows needs a tensor payload")
            if payload < 0:
                raise ValueError(f"byte counts must be >= 0, got {payload}")
            return np.full(num_clients, int(payload), dtype=np.int64)

        if isinstance(payload, torch.Tensor):
            element_bytes = _dtype_nbytes(sent_dtype if sent_dtype is not None else payload.dtype)
            if per_client:
                if _is_dense(sparse_rows):
                    return np.full(num_clients, tensor_nbytes(payload, sent_dtype), dtype=np.int64)
                if payload.ndim < 1:
                    raise ValueError("sparse_rows needs a payload with a row dimension")
                rows = CommunicationLedger._row_counts(payload.reshape(payload.shape[0], -1), sparse_rows, None)
                per_row = _row_payload_nbytes(payload.shape[1:], element_bytes) + index_bytes
                return np.full(num_clients, int(rows) * per_row, dtype=np.int64)
            # Stacked: payload[c] is client c's message.
            if payload.ndim < 1 or payload.shape[0] != num_clients:
                raise ValueError(f"stacked payload must have first dimension {num_clients} (one per client), "
                                 f"got shape {tuple(payload.shape)}")
            if _is_dense(sparse_rows):
                return np.full(num_clients, _row_payload_nbytes(payload.shape[1:], element_bytes), dtype=np.int64)
            if payload.ndim < 2:
                raise ValueError("sparse_rows with a stacked payload needs shape (C, R, ...)")
            rows = CommunicationLedger._row_counts(
                payload.reshape(payload.shape[0], payload.shape[1], -1), sparse_rows, num_clients)
            per_row = _row_payload_nbytes(payload.shape[2:], element_bytes) + index_bytes
            return rows.astype(np.int64) * per_row

        # A sequence: per-client tensors or per-client byte counts.
        if per_client:
            raise ValueError("a list/array payload holds one entry per client; pass per_client=False")
        entries = list(payload) if not isinstance(payload, np.ndarray) else payload
        if len(entries) != num_clients:
            raise ValueError(f"payload has {len(entries)} entries for {num_clients} clients")
        if num_clients and all(isinstance(t, torch.Tensor) for t in entries):
            if not (_is_dense(sparse_rows) or sparse_rows is True):
                raise ValueError("with a list of tensors, sparse_rows can only be True (rows inferred per tensor)")
            out = np.empty(num_clients, dtype=np.int64)
            for position, tensor in enumerate(entries):  # metadata per client; use a stacked tensor to vectorise
                if sparse_rows is True:
                    element_bytes = _dtype_nbytes(sent_dtype if sent_dtype is not None else tensor.dtype)
                    rows = int(_touched_row_counts(tensor.reshape(tensor.shape[0], -1)))
                    out[position] = rows * (_row_payload_nbytes(tensor.shape[1:], element_bytes) + index_bytes)
                else:
                    out[position] = tensor_nbytes(tensor, sent_dtype)
            return out
        counts = np.asarray(entries)
        if counts.size and not np.issubdtype(counts.dtype, np.integer):
            raise TypeError("a per-client payload must be tensors or integer byte counts")
        if not _is_dense(sparse_rows):
            raise ValueError("sparse_rows needs a tensor payload")
        counts = counts.astype(np.int64, copy=False).reshape(-1)
        if (counts < 0).any():
            raise ValueError("byte counts must be >= 0")
        return counts

    @staticmethod
    def _row_counts(rows_view: torch.Tensor, sparse_rows, num_clients: Optional[int]):
        """Number of sent rows: scalar (one message) or ``(C,)`` numpy array (stacked)."""
        stacked = num_clients is not None
        if sparse_rows is True:
            counts = _touched_row_counts(rows_view)
        else:
            spec = sparse_rows if isinstance(sparse_rows, torch.Tensor) else torch.as_tensor(np.asarray(sparse_rows))
            if spec.dtype == torch.bool:
                expected = tuple(rows_view.shape[:2]) if stacked else (rows_view.shape[0],)
                if tuple(spec.shape) != expected:
                    raise ValueError(f"sparse_rows mask must have shape {expected}, got {tuple(spec.shape)}")
                counts = spec.sum(dim=-1)
            elif not spec.dtype.is_floating_point:
                counts = spec.to(torch.int64)
                if (counts < 0).any() or (counts > rows_view.shape[1 if stacked else 0]).any():
                    raise ValueError("sparse row counts must be between 0 and the number of rows")
                if stacked and counts.ndim == 0:
                    counts = counts.expand(num_clients)
                if stacked and tuple(counts.shape) != (num_clients,):
                    raise ValueError(f"sparse row counts must be a scalar or ({num_clients},)")
            else:
                raise TypeError("sparse_rows must be True, a bool mask or integer row counts")
        counts = counts.detach().cpu()
        return counts.numpy().astype(np.int64) if stacked else int(counts)

    # ------------------------------------------------------------------ summaries
    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every record."""
        self._entries.clear()

    def to_frame(self, by_client: bool = False) -> pd.DataFrame:
        """All records as a DataFrame.

        ``by_client=False``: one row per call (round, direction, name, clients, total_bytes).
        ``by_client=True``: one row per (call, client) with that client's ``bytes``.
        """
        if by_client:
            if not self._entries:
                return pd.DataFrame({"round": pd.Series(dtype=np.int64), "direction": pd.Series(dtype=object),
                                     "name": pd.Series(dtype=object), "client": pd.Series(dtype=np.int64),
                                     "bytes": pd.Series(dtype=np.int64)})
            sizes = [e.client_ids.size for e in self._entries]
            return pd.DataFrame({
                "round": np.repeat([e.round for e in self._entries], sizes).astype(np.int64),
                "direction": np.repeat([e.direction for e in self._entries], sizes).astype(object),
                "name": np.repeat([e.name for e in self._entries], sizes).astype(object),
                "client": np.concatenate([e.client_ids for e in self._entries]),
                "bytes": np.concatenate([e.nbytes for e in self._entries]),
            })
        return pd.DataFrame({
            "round": pd.Series([e.round for e in self._entries], dtype=np.int64),
            "direction": pd.Series([e.direction for e in self._entries], dtype=object),
            "name": pd.Series([e.name for e in self._entries], dtype=object),
            "clients": pd.Series([e.client_ids.size for e in self._entries], dtype=np.int64),
            "total_bytes": pd.Series([int(e.nbytes.sum()) for e in self._entries], dtype=np.int64),
        })

    def per_round(self, by_name: bool = False) -> pd.DataFrame:
        """Traffic per round and direction.

        Columns: ``round, direction, [name,] total_bytes, clients, mean_bytes_per_client``,
        where ``clients`` is the number of **distinct** clients that sent (upload) or received
        (download) anything in that round, and ``mean_bytes_per_client = total_bytes / clients``.
        """
        keys = ["round", "direction"] + (["name"] if by_name else [])
        columns = keys + ["total_bytes", "clients", "mean_bytes_per_client"]
        frame = self.to_frame(by_client=True)
        if frame.empty:
            return pd.DataFrame(columns=columns)
        grouped = frame.groupby(keys, sort=True)
        out = grouped["bytes"].sum().rename("total_bytes").to_frame()
        out["clients"] = grouped["client"].nunique()
        out["mean_bytes_per_client"] = out["total_bytes"] / out["clients"]
        return out.reset_index()[columns]

    def per_client_per_round(self) -> pd.Series:
        r"""Mean bytes per participating client per round, by direction.

        ``mean = Σ bytes / #{(round, client) pairs with traffic in that direction}``, the
        "average per-client communication cost per round" of FedKDRec Table 3. The
        ``"both"`` entry divides all traffic by the pairs with traffic in either direction.
        Index: ``download, upload, both``; NaN where nothing was recorded.
        """
        frame = self.to_frame(by_client=True)
        values = {}
        for direction in ("download", "upload"):
            part = frame[frame["direction"] == direction]
            pairs = len(part[["round", "client"]].drop_duplicates())
            values[direction] = part["bytes"].sum() / pairs if pairs else float("nan")
        pairs = len(frame[["round", "client"]].drop_duplicates())
        values["both"] = frame["bytes"].sum() / pairs if pairs else float("nan")
        return pd.Series(values, name="mean_bytes_per_client_per_round", dtype=float)

    def total(self, direction: Optional[str] = None, name: Optional[str] = None) -> int:
        """Total recorded bytes, optionally for one direction and/or one message name."""
        if direction is not None and direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        return int(sum(int(e.nbytes.sum()) for e in self._entries
                       if (direction is None or e.direction == direction) and (name is None or e.name == name)))

    def summary(self, convention: str = "binary", precision: int = 3) -> str:
        """A short multi-line text summary (totals and per-client means) for notebooks/logs."""
        if not self._entries:
            return "no communication recorded"
        means = self.per_client_per_round()
        rounds = sorted({e.round for e in self._entries})
        lines = [f"communication over {len(rounds)} round(s) (units: {convention})"]
        for direction in DIRECTIONS:
            lines.append(
                f"  {direction:<8} total {format_bytes(self.total(direction), convention, precision):>14}"
                f"   per client per round {format_bytes(means[direction], convention, precision):>14}"
            )
        lines.append(f"  {'both':<8} total {format_bytes(self.total(), convention, precision):>14}"
                     f"   per client per round {format_bytes(means['both'], convention, precision):>14}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"CommunicationLedger(records={len(self._entries)}, total_bytes={self.total()})"
