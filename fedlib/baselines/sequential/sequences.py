r"""The sequential cross-domain interface shared by FedCSR and the sequential baselines.

Two domains ``A`` and ``B`` with global item ids ``0 .. num_items_a - 1`` (A) and
``num_items_a .. num_items_a + num_items_b - 1`` (B); ``s*`` the cross-domain sequence, ``s^d``
its domain-``d`` items in order; ``n`` the feature size. What is here is used by FedCSR
(:mod:`fedlib.papers.fedcsr.model`) and by the baselines of its tables (TiSASRec, C2DSR,
CCDR, PiNet, PSJNet, MIFN, CoNet, CLSR and their FedProx training), so it sits below the
papers (the layers of ``pyproject.toml``):

* config checks (:func:`check_fields`, :func:`check_sampled_negatives`);
* batching: :class:`SequenceInputs` (left-padded windows, single-domain rows time-aligned with
  ``s*``), :class:`SequenceBatch` (inputs and next-item targets per domain), :func:`make_batch`;
* FedCSR's item graphs (Eq. 1 of FedCSR): :func:`transition_graphs`, a directed edge ``i -> j``
  when ``j`` directly follows ``i``, row-normalised; parameter-free propagation
  ``E' = (E + A E) / 2`` (:func:`propagate`, :func:`propagate_rows`);
* the graph-attention encoder :class:`GAEncoder` (FedCSR's Eq. 1; C2DSR's encoder too): item
  tables ``(cross, A, B)`` + graph layer + three causal self-attention encoders
  (:class:`CausalSelfAttention`) -> ``H*, H^A, H^B``;
* the prediction heads of FedCSR's Eqs. 16-17: :func:`prediction_loss` (the six CE terms),
  :func:`head_cross_entropy` / :func:`sampled_head_losses` (full or sampled softmax, negatives
  from :func:`draw_negatives` / :func:`draw_negatives_torch`) and the evaluation scores
  :func:`cross_domain_scores`.

The readings of the paper these pieces implement (graphs binary and row-normalised, the
encoder input ``(E'[s] + E[s]) * sqrt(n)`` plus a learned position embedding, the targets as
C2DSR) are stated in :mod:`fedlib.papers.fedcsr.model`.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence as SequenceT, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedlib.data.splits import Sequences
from fedlib.models.dropout import Dropout, dropout as drop_out


# ----------------------------------------------------------------------------- config
def check_sampled_negatives(value) -> None:
    """Raise ``ValueError`` unless ``value`` is None (full softmax) or a positive int (sampled softmax)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"sampled_negatives must be None (full softmax over the domain's items) or a positive int "
                         f"(uniform same-domain negatives shared by the mini-batch), got {value!r}")


def check_fields(config: Any, *, at_least: Mapping[str, int] = {}, rates: SequenceT[str] = (),
                 non_negative: SequenceT[str] = ()) -> None:
    """Validate a sequential model's config; errors name ``<Config>.<field>`` and the bad value.

    Args:
        at_least: field -> the smallest allowed int (``{"dim": 1, "maxlen": 2}``).
        rates: fields that must lie in ``[0, 1)`` (dropout-like).
        non_negative: fields that must be finite numbers ``>= 0`` (loss weights).
    """
    name = type(config).__name__
    for field, low in at_least.items():
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}.{field} must be an int >= {low}, got {value!r}")
    for field in rates:
        value = getattr(config, field)
        if not 0.0 <= value < 1.0:                                         # NaN fails too
            raise ValueError(f"{name}.{field} must be in [0, 1), got {value!r}")
    for field in non_negative:
        value = getattr(config, field)
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name}.{field} must be a finite number >= 0, got {value!r}")


# ----------------------------------------------------------------------------- batching
class SequenceInputs(NamedTuple):
    """Encoder inputs, left-padded ``(B, L)``; single-domain rows are time-aligned with ``cross``.

    ``cross``/``single_a``/``single_b`` hold global item ids (pad = num_items_a + num_items_b);
    ``pos_*`` hold 1-based positions within that sequence (0 = padding).
    """

    cross: torch.Tensor     # (B, L) int64
    single_a: torch.Tensor  # (B, L) int64, A items at A positions, pad elsewhere
    single_b: torch.Tensor  # (B, L) int64, B items at B positions, pad elsewhere
    pos_cross: torch.Tensor  # (B, L) int64
    pos_a: torch.Tensor      # (B, L) int64
    pos_b: torch.Tensor      # (B, L) int64

    def to(self, device) -> "SequenceInputs":
        return SequenceInputs(*(t.to(device) for t in self))


class SequenceBatch(NamedTuple):
    """Inputs plus next-item targets (head index spaces: A = item, B = item − num_items_a)."""

    inputs: SequenceInputs
    unified_a: torch.Tensor       # (B, L) int64 target of the unified A head (0 where masked)
    unified_a_mask: torch.Tensor  # (B, L) bool: the next cross item is an A item
    unified_b: torch.Tensor       # (B, L) int64
    unified_b_mask: torch.Tensor  # (B, L) bool
    next_a: torch.Tensor          # (B, L) int64 next A item after an A position (single/cross heads)
    next_a_mask: torch.Tensor     # (B, L) bool
    next_b: torch.Tensor          # (B, L) int64
    next_b_mask: torch.Tensor     # (B, L) bool

    def to(self, device) -> "SequenceBatch":
        return SequenceBatch(self.inputs.to(device), *(t.to(device) for t in self[1:]))


def domain_index(items, num_items_a: int):
    """``(is_b, index)``: B items are ``items >= num_items_a`` and index ``items − num_items_a``."""
    items = torch.as_tensor(items)
    is_b = items >= num_items_a
    return is_b, torch.where(is_b, items - num_items_a, items)


def inputs_from_cross(cross: np.ndarray, num_items_a: int, num_items_b: int) -> SequenceInputs:
    """Derive both single-domain rows and all positions from a left-padded cross matrix ``(B, L)``."""
    cross = np.asarray(cross, dtype=np.int64)            # (B, L)
    pad = num_items_a + num_items_b
    real = cross != pad                                  # (B, L)
    is_a = real & (cross < num_items_a)                  # (B, L)
    is_b = real & ~is_a                                  # (B, L)
    single_a = np.where(is_a, cross, pad)                # (B, L)
    single_b = np.where(is_b, cross, pad)                # (B, L)
    positions = [np.cumsum(m, axis=1) * m for m in (real, is_a, is_b)]  # 3 × (B, L)
    return SequenceInputs(*(torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64))
                            for x in (cross, single_a, single_b, *positions)))


def _next_of_domain(window: np.ndarray, in_domain: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """For every column j < W−1: the first in-domain item in columns > j (and whether one exists)."""
    rows, width = window.shape
    nxt = np.zeros((rows, width - 1), dtype=np.int64)    # (B, L)
    has = np.zeros((rows, width - 1), dtype=bool)        # (B, L)
    cur = np.zeros(rows, dtype=np.int64)                 # (B,)
    cur_has = np.zeros(rows, dtype=bool)                 # (B,)
    for j in range(width - 1, 0, -1):                    # right to left over columns (L steps)
        cur = np.where(in_domain[:, j], window[:, j], cur)
        cur_has = cur_has | in_domain[:, j]
        nxt[:, j - 1], has[:, j - 1] = cur, cur_has
    return nxt, has


def make_batch(sequences: Union[Sequences, SequenceT], num_items_a: int, num_items_b: int,
               maxlen: int = 15, rows=None) -> SequenceBatch:
    """Left-padded inputs (the last ``maxlen`` items before each row's final item) and targets.

    Args:
        sequences: a :class:`Sequences` or a list of item-id sequences (oldest first).
        rows: optional subset of rows of ``sequences``.
    """
    if not isinstance(sequences, Sequences):
        sequences = Sequences.from_lists(np.arange(len(sequences)), [list(s) for s in sequences])
    if rows is not None:
        sequences = sequences.subset(rows)
    if len(sequences) and sequences.lengths().min() < 2:
        raise ValueError("every sequence needs at least 2 items (an input and a next-item target)")
    pad = num_items_a + num_items_b
    window = sequences.padded(maxlen + 1, pad)           # (B, L+1): inputs window[:, :-1], next items window[:, 1:]
    cross = window[:, :-1]                               # (B, L)
    nxt = window[:, 1:]                                  # (B, L)
    real = cross != pad                                  # (B, L)
    # Unified heads: the next cross-domain item, routed to the head of its domain.
    uni_b_mask = real & (nxt >= num_items_a)             # (B, L); ">=": num_items_a is the first B item
    uni_a_mask = real & (nxt < num_items_a)              # (B, L)
    # Single/cross heads: at a domain-d position, the next domain-d item (anywhere later).
    in_a = window < num_items_a                          # (B, L+1)
    in_b = (window >= num_items_a) & (window != pad)     # (B, L+1)
    next_a, has_a = _next_of_domain(window, in_a)        # (B, L)
    next_b, has_b = _next_of_domain(window, in_b)        # (B, L)
    next_a_mask = in_a[:, :-1] & has_a                   # (B, L)
    next_b_mask = in_b[:, :-1] & has_b                   # (B, L)
    t = lambda x: torch.from_numpy(np.ascontiguousarray(x))
    return SequenceBatch(
        inputs_from_cross(cross, num_items_a, num_items_b),
        t(np.where(uni_a_mask, nxt, 0)), t(uni_a_mask),
        t(np.where(uni_b_mask, nxt - num_items_a, 0)), t(uni_b_mask),
        t(np.where(next_a_mask, next_a, 0)), t(next_a_mask),
        t(np.where(next_b_mask, next_b - num_items_a, 0)), t(next_b_mask),
    )


# ----------------------------------------------------------------------------- graphs (Eq. 1)
class TransitionGraphs(NamedTuple):
    cross: torch.Tensor  # (n, n) sparse, row-normalised, n = num_items_a + num_items_b
    a: torch.Tensor      # (num_items_a, num_items_a) sparse
    b: torch.Tensor      # (num_items_b, num_items_b) sparse, local ids item − num_items_a


def _row_normalised(src: np.ndarray, dst: np.ndarray, size: int, binary: bool) -> torch.Tensor:
    flat = src * size + dst                               # (E,)
    if binary:
        flat = np.unique(flat)
    keys, counts = np.unique(flat, return_counts=True)    # (E',)
    rows, cols = keys // size, keys % size
    weights = counts.astype(np.float64)
    out_deg = np.bincount(rows, weights=weights, minlength=size)  # (size,)
    values = weights / out_deg[rows]
    index = torch.from_numpy(np.stack([rows, cols]).astype(np.int64))
    return torch.sparse_coo_tensor(index, torch.from_numpy(values).float(), (size, size),
                                   check_invariants=True).coalesce()


def transition_graphs(sequences: Union[Sequences, SequenceT], num_items_a: int, num_items_b: int,
                      *, binary: bool = True) -> TransitionGraphs:
    """Directed item-transition graphs of the given (training) sequences, row-normalised.

    Edge ``i → j`` when ``j`` directly follows ``i`` in ``s*`` (cross graph) or in ``s^d``
    (domain graph, local ids). ``binary=False`` weights an edge by its number of occurrences.
    """
    if not isinstance(sequences, Sequences):
        sequences = Sequences.from_lists(np.arange(len(sequences)), [list(s) for s in sequences])
    items, indptr = sequences.items, sequences.indptr
    n = num_items_a + num_items_b
    if items.size and (items.min() < 0 or items.max() >= n):
        raise ValueError(f"item ids must be in [0, {n}); got range [{items.min()}, {items.max()}]")
    row_of = np.repeat(np.arange(len(sequences)), np.diff(indptr))  # (total,)
    is_b = items >= num_items_a                                      # (total,)
    graphs = []
    for keep, offset, size in ((np.ones_like(is_b), 0, n), (~is_b, 0, num_items_a), (is_b, num_items_a, num_items_b)):
        it, rw = items[keep] - offset, row_of[keep]                  # order kept within each row
        same = rw[1:] == rw[:-1]                                     # consecutive pairs in one sequence
        graphs.append(_row_normalised(it[:-1][same], it[1:][same], size, binary))
    return TransitionGraphs(*graphs)


# ----------------------------------------------------------------------------- encoder (Eqs. 1–2)
class CausalSelfAttention(nn.Module):
    """SASRec-style encoder: learned positions, pre-LN attention blocks, causal + padding mask.

    Two paths give the same function (tested, with dropout off):

    * :meth:`forward` (packed): every per-token layer (the q/k/v and output projections, the
      layer norms, the feed-forward net, dropout) runs on the **real** tokens only, ``(T, n)``
      with ``T`` = number of non-padding positions; only the attention itself is laid out
      padded, and on **compacted** rows: each row's real tokens, in order, in the first slots
      of a ``(B, W)`` layout with ``W`` = the longest row's number of real tokens. A padding
      position's output is zero and no real position attends to one, so the padding of the
      reference path is pure waste: on Food-Kitchen every training window of ``L = 15`` holds
      5 real cross-domain items and 2-3 of each domain (``W`` = 5 and 3, so the attention's
      ``L x L`` matrices shrink 9-25 times).
    * :meth:`forward_reference`: the plain padded form with :class:`torch.nn.MultiheadAttention`.

    The attention parameters live in ``nn.MultiheadAttention`` modules in both paths, so the
    state dict (and what FedAvg averages) is the same. The packed path draws the attention
    dropout mask for the full ``(B, heads, L, L)`` layout, as the uncompacted form did, and
    reads it at the compacted pairs: the random stream and the numbers do not depend on ``W``.
    """

    def __init__(self, dim: int, maxlen: int, num_blocks: int, num_heads: int, dropout: float):
        super().__init__()
        self.num_heads = num_heads
        self.pos = nn.Embedding(maxlen + 1, dim, padding_idx=0)
        self.drop = Dropout(dropout)
        self.attn_norm = nn.ModuleList(nn.LayerNorm(dim, eps=1e-8) for _ in range(num_blocks))
        self.attn = nn.ModuleList(nn.MultiheadAttention(dim, num_heads, dropout=dropout, batch_first=True)
                                  for _ in range(num_blocks))
        self.ffn_norm = nn.ModuleList(nn.LayerNorm(dim, eps=1e-8) for _ in range(num_blocks))
        self.ffn = nn.ModuleList(nn.Sequential(nn.Linear(dim, dim), Dropout(dropout), nn.ReLU(),
                                               nn.Linear(dim, dim), Dropout(dropout))
                                 for _ in range(num_blocks))
        self.last_norm = nn.LayerNorm(dim, eps=1e-8)

    @staticmethod
    def _allowed(positions: torch.Tensor) -> torch.Tensor:
        """(B, L, L) bool: query i may read key j when j ≤ i and j is real (or j = i)."""
        L = positions.shape[1]
        eye = torch.eye(L, dtype=torch.bool, device=positions.device)          # (L, L)
        causal = torch.ones(L, L, dtype=torch.bool, device=positions.device).tril()  # (L, L)
        return causal & ((positions > 0).unsqueeze(1) | eye)                   # (B, L, L)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``x`` (B, L, n) item features, ``positions`` (B, L) (0 = padding) → (B, L, n), zero at padding."""
        B, L, n = x.shape
        token = (positions > 0).reshape(-1).nonzero().squeeze(1)               # (T,) real positions of B·L, row-major
        return self.forward_tokens(x.reshape(B * L, n)[token], positions)

    def forward_tokens(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` from the real positions' features only: ``x`` (T, n), the rows of the (B, L, n)
        input at ``positions > 0`` in row-major order (the encoder never reads a padding row's features,
        so a caller need not build them) → (B, L, n), zero at padding."""
        (B, L), n = positions.shape, x.shape[1]
        heads, head_dim = self.num_heads, n // self.num_heads
        real = positions > 0                                                   # (B, L)
        token = real.reshape(-1).nonzero().squeeze(1)                          # (T,) real positions of B·L, row-major
        width = max(int(real.sum(1).max()), 1) if B else 1                     # W: the longest row's real tokens
        slot = (real.cumsum(1) - 1).reshape(-1)[token]                         # (T,) rank of a token in its row
        packed = torch.div(token, L, rounding_mode="floor") * width + slot     # (T,) its place in the (B·W) layout
        column = torch.zeros(B * width, dtype=torch.long, device=x.device).index_copy_(0, packed, token % L)
        column = column.view(B, width)                                         # (B, W) original column of a slot
        slot_real = torch.zeros(B * width, dtype=torch.long, device=x.device).index_fill_(0, packed, 1)
        blocked = ~self._allowed(slot_real.view(B, width)).unsqueeze(1)        # (B, 1, W, W)
        pair = (column.unsqueeze(2) * L + column.unsqueeze(1)).view(B, 1, width * width)  # (B, 1, W·W) into L·L
        h = self.drop(x + self.pos(positions.reshape(-1)[token]))                # (T, n)
        for norm, attn, fnorm, ffn in zip(self.attn_norm, self.attn, self.ffn_norm, self.ffn):
            q = norm(h)                                                        # (T, n); keys/values read h
            w, b = attn.in_proj_weight, attn.in_proj_bias                      # (3n, n), (3n,)
            qkv = torch.cat([F.linear(q, w[:n], b[:n]), F.linear(h, w[n:], b[n:])], dim=1)  # (T, 3n)
            # In place into fresh zeros: an out-of-place index_copy would copy the zeros once more.
            padded = qkv.new_zeros(B * width, 3 * n).index_copy_(0, packed, qkv)  # (B·W, 3n)
            qp, kp, vp = padded.view(B, width, 3, heads, head_dim).permute(2, 0, 3, 1, 4)  # 3 × (B, heads, W, d_h)
            scores = (qp @ kp.transpose(-1, -2)) / math.sqrt(head_dim)         # (B, heads, W, W)
            weights = torch.softmax(scores.masked_fill(blocked, float("-inf")), dim=-1)  # (B, heads, W, W)
            if self.training and attn.dropout > 0:
                # The mask of the uncompacted (B, heads, L, L) weights (the same draws), read at the compacted pairs.
                keep = drop_out(weights.new_ones(B, heads, L, L), attn.dropout, True)  # (B, heads, L, L): 0 or 1/(1-p)
                weights = weights * keep.view(B, heads, L * L).gather(2, pair.expand(B, heads, -1)).view(
                    B, heads, width, width)                                    # (B, heads, W, W)
            mixed = (weights @ vp).transpose(1, 2).reshape(B * width, n)[packed]  # (T, n)
            a = F.linear(mixed, attn.out_proj.weight, attn.out_proj.bias)      # (T, n)
            h = fnorm(q + a)                                                   # (T, n)
            h = h + ffn(h)                                                     # (T, n)
        out = self.last_norm(h)                                                # (T, n)
        return out.new_zeros(B * L, n).index_copy_(0, token, out).view(B, L, n)  # (B, L, n)

    def forward_reference(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` in the plain padded form (``nn.MultiheadAttention`` on all B·L positions)."""
        real = (positions > 0).unsqueeze(-1).to(x.dtype)                  # (B, L, 1)
        h = self.drop(x + self.pos(positions)) * real                      # (B, L, n)
        blocked = (~self._allowed(positions)).repeat_interleave(self.num_heads, dim=0)  # (B·heads, L, L)
        for norm, attn, fnorm, ffn in zip(self.attn_norm, self.attn, self.ffn_norm, self.ffn):
            q = norm(h)                                                    # (B, L, n)
            a, _ = attn(q, h, h, attn_mask=blocked, need_weights=False)    # (B, L, n)
            h = fnorm(q + a)                                               # (B, L, n)
            h = (h + ffn(h)) * real                                        # (B, L, n)
        return self.last_norm(h) * real                                    # (B, L, n)


def propagate(graph: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Parameter-free graph layer ``(E + A E) / 2`` on the first ``graph.shape[0]`` rows (the rest: pad)."""
    n = graph.shape[0]
    items = table[:n]                                                      # (n, dim)
    mixed = 0.5 * (items + torch.sparse.mm(graph, items))                  # (n, dim)
    return torch.cat([mixed, table[n:]], dim=0)                            # (n + 1, dim)


def read_rows(table: torch.Tensor, ids: torch.Tensor, sparse_grad: bool = False) -> torch.Tensor:
    """``table[ids]``: (..., d) rows of a (rows, d) table; with ``sparse_grad`` its gradient is sparse.

    A dense read's backward allocates a zero-filled gradient of the whole table every step (at
    d = 256 the Food-Kitchen tables are 30-65 MB each, and a fresh allocation of that size costs
    its page faults: a fresh 65 MB zero fill takes about 8 times as long as zeroing it in place).
    A sparse gradient added into a dense ``.grad`` that is kept between steps
    (:class:`fedlib.papers.fedcsr.training.KeptTableGradients`) gives the same dense gradient
    without it. Use ``sparse_grad`` only when such a ``.grad`` exists: otherwise the
    parameter's ``.grad`` becomes a sparse tensor, which Adam refuses.
    """
    return F.embedding(ids, table, sparse=True) if sparse_grad else table[ids]


def propagate_rows(graph: torch.Tensor, table: torch.Tensor, ids: torch.Tensor, *,
                   residual: bool = False, sparse_grad: bool = False, scale: float = 1.0) -> torch.Tensor:
    """``propagate(graph, table)[ids]`` (plus ``table[ids]`` if ``residual``), from the rows ``ids`` need.

    A batch touches a few thousand of the tens of thousands of items, so mixing only those
    rows costs their out-degree instead of the whole graph, forward and backward (FedCSR's
    training step on Food-Kitchen: the full propagation was a fifth of it). Same values as the
    full propagation up to the order of the float sums (tested).

    The table is read through **one** gather of the rows involved (the batch's items and their
    successors). Every index into a parameter costs its backward a zero-filled gradient of the
    whole table (tens of thousands of rows) and an add into ``.grad``; one gather pays that once
    instead of four times per table and forward.

    Args:
        graph: ``(n, n)`` sparse COO, row-normalised (:func:`transition_graphs`).
        table: ``(n + 1, d)`` item table, row ``n`` = padding.
        ids: ``(...)`` item ids in ``[0, n]``.
        residual: add the raw rows ``table[ids]`` (the encoder's ``E + propagate(E)`` input, Eq. 1).
        sparse_grad: give ``table`` a sparse gradient (:func:`read_rows`).
        scale: a factor applied to the distinct rows before they are spread over ``ids`` (the
            encoder's ``sqrt(n)``; on the few distinct rows instead of every position of the batch).
    Returns:
        ``(..., d)`` graph-mixed rows.
    """
    n = graph.shape[0]
    graph = graph if graph.is_coalesced() else graph.coalesce()           # edges sorted by row
    edge_rows, edge_cols = graph.indices()                                 # (E,), (E,)
    weights = graph.values()                                               # (E,)
    row_start = torch.zeros(n + 1, dtype=torch.long, device=table.device)  # CSR row pointers
    row_start[1:] = torch.bincount(edge_rows, minlength=n).cumsum(0)
    unique_ids, inverse = torch.unique(ids.reshape(-1), return_inverse=True)  # (U,) sorted: pad (n) last
    real = int((unique_ids < n).sum())
    rows = unique_ids[:real]                                               # (R,) real items
    first, degree = row_start[rows], row_start[rows + 1] - row_start[rows]  # (R,), (R,)
    owner = torch.repeat_interleave(torch.arange(real, device=table.device), degree)  # (S,)
    offset_in_row = torch.arange(owner.numel(), device=table.device) - (degree.cumsum(0) - degree)[owner]
    edges = first[owner] + offset_in_row                                   # (S,) positions in the COO arrays
    needed, local = torch.unique(torch.cat([unique_ids, edge_cols[edges]]), return_inverse=True)  # (N,), (U + S,)
    gathered = read_rows(table, needed, sparse_grad)                       # (N, d): the one read of the table
    own = gathered[local[:unique_ids.numel()]]                             # (U, d) = table[unique_ids]
    messages = weights[edges, None].to(table.dtype) * gathered[local[unique_ids.numel():]]  # (S, d)
    neighbours = torch.zeros(real, table.shape[1], dtype=table.dtype, device=table.device)
    neighbours = neighbours.index_add(0, owner, messages)                  # (R, d) = (A E)[rows]
    mixed = torch.cat([0.5 * (own[:real] + neighbours), own[real:]])       # (U, d)
    if residual:
        mixed = mixed + own
    if scale != 1.0:
        mixed = mixed * scale                                              # (U, d)
    return mixed[inverse].view(*ids.shape, table.shape[1])                 # (..., d)


class GAEncoder(nn.Module):
    """Item tables (cross, A, B) + graph layer + three causal encoders → ``H*, H^A, H^B``.

    The graphs are platform data, not parameters: set them with :meth:`set_graphs`. ``config``:
    any validated config with ``dim``, ``maxlen``, ``num_blocks``, ``num_heads`` and ``dropout``
    (:class:`fedlib.papers.fedcsr.model.FedCSRConfig`, :class:`fedlib.baselines.sequential.c2dsr.C2DSRConfig`).
    """

    def __init__(self, num_items_a: int, num_items_b: int, config: Any,
                 graphs: Optional[TransitionGraphs] = None):
        super().__init__()
        self.num_items_a, self.num_items_b = num_items_a, num_items_b
        n, d = num_items_a + num_items_b, config.dim
        self.emb_cross = nn.Embedding(n + 1, d, padding_idx=n)            # pad row n
        self.emb_a = nn.Embedding(num_items_a + 1, d, padding_idx=num_items_a)
        self.emb_b = nn.Embedding(num_items_b + 1, d, padding_idx=num_items_b)
        for emb in (self.emb_cross, self.emb_a, self.emb_b):
            nn.init.xavier_normal_(emb.weight)
            with torch.no_grad():
                emb.weight[emb.padding_idx].zero_()
        args = (d, config.maxlen, config.num_blocks, config.num_heads, config.dropout)
        self.enc_cross, self.enc_a, self.enc_b = (CausalSelfAttention(*args) for _ in range(3))
        self.scale = math.sqrt(d)
        self.graphs = graphs
        self.sparse_table_grads = False    # read the tables with sparse gradients (read_rows); set by the training loop

    def set_graphs(self, graphs: TransitionGraphs) -> None:
        self.graphs = graphs

    def _features(self, emb: nn.Embedding, graph: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        table = emb.weight                                                 # (rows + 1, n)
        return propagate_rows(graph.to(table.device), table, ids, residual=True, sparse_grad=self.sparse_table_grads,
                              scale=self.scale)                             # (..., n) = (propagate(...)[ids] + table[ids]) · √n

    def forward(self, inputs: SequenceInputs) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(H*, H^A, H^B)``, three (B, L, n), of one batch of inputs."""
        return self.encode_views([inputs])[0]

    def encode_views(self, views: SequenceT[SequenceInputs]) -> List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """:meth:`forward` of each view (e.g. a batch and its augmented copy), every item table read once for all.

        Every read of a table costs the backward a zero-filled gradient of the whole table (tens of
        thousands of rows, freshly allocated: about 40 ms for Food-Kitchen's d = 256 cross table) and
        an addition into the other reads' gradient; reading each of the three tables once per step
        instead of once per view saves three of them. The views are encoded in order, view by view
        and ``cross, A, B`` within a view, so the dropout masks are drawn as by separate calls.

        Args: ``views``: V inputs, each ``(B_v, L_v)``. Returns: V triples ``(H*, H^A, H^B)``, each ``(B_v, L_v, n)``.
        """
        if self.graphs is None:
            raise ValueError("GAEncoder has no item graphs: call set_graphs(transition_graphs(train_sequences, ...)) "
                             "with the platform's own training sequences first")
        na = self.num_items_a
        # Only the real positions' features: the encoders never read a padding row (CausalSelfAttention.forward_tokens),
        # and on Food-Kitchen a domain sequence fills a fifth of the L = 15 window.
        ids = [(v.cross[v.pos_cross > 0], v.single_a[v.pos_a > 0], v.single_b[v.pos_b > 0] - na)  # local ids
               for v in views]                                             # V × 3 × (T_v,) in row-major order
        features = []                                                      # per table: V × (T_v, n)
        for table, (emb, graph) in enumerate(((self.emb_cross, self.graphs.cross), (self.emb_a, self.graphs.a),
                                              (self.emb_b, self.graphs.b))):
            every = torch.cat([view_ids[table] for view_ids in ids])       # (Σ T_v,)
            features.append(self._features(emb, graph, every).split([view_ids[table].numel() for view_ids in ids]))
        return [(self.enc_cross.forward_tokens(features[0][v], view.pos_cross),
                 self.enc_a.forward_tokens(features[1][v], view.pos_a),
                 self.enc_b.forward_tokens(features[2][v], view.pos_b))  # 3 × (B, L, n)
                for v, view in enumerate(views)]


def cross_domain_scores(hidden: Tuple[torch.Tensor, torch.Tensor, torch.Tensor], inputs: SequenceInputs,
                        heads: Tuple[nn.Linear, nn.Linear], candidates: torch.Tensor, gt_domain: torch.Tensor,
                        num_items_a: int) -> torch.Tensor:
    """Domain ``d``'s cross-domain head of Eq. 16 at the last position, ``(h*_last + h^d_last) W^d``,
    read at the candidates (as C2DSR and the public code score).

    ``h*_last`` is the cross encoder's feature at the last history position, ``h^d_last`` the
    domain-``d`` encoder's at the last domain-``d`` position (column 0's feature, a padding row,
    when the history has no domain-``d`` item).

    Args:
        hidden: ``(H*, H^A, H^B)``, three (B, L, n); ``heads``: ``(W^A, W^B)``.
        candidates: (B, C) global ids, all in the row's ``gt_domain`` (B,) (0 = A, 1 = B).
    Returns: (B, C) scores. Raises ``ValueError`` when a candidate lies outside its row's domain.
    """
    h_cross, h_a, h_b = hidden
    col = torch.arange(inputs.cross.shape[1], device=h_cross.device)        # (L,)
    out = torch.empty(candidates.shape, dtype=h_cross.dtype, device=h_cross.device)  # (B, C)
    for d, (h_d, pos_d, head, offset) in enumerate(((h_a, inputs.pos_a, heads[0], 0),
                                                    (h_b, inputs.pos_b, heads[1], num_items_a))):
        m = gt_domain == d                                                  # (B,)
        if not bool(m.any()):
            continue
        last_d = ((pos_d[m] > 0) * col).amax(dim=1)                         # (b,) last domain-d column (0 if none)
        h_last = h_d[m].gather(1, last_d.view(-1, 1, 1).expand(-1, 1, h_d.shape[2])).squeeze(1)  # (b, n)
        logits = head(h_cross[m][:, -1] + h_last)                           # (b, |V^d|)
        idx = candidates[m] - offset                                        # (b, C) head index space
        if bool((idx < 0).any()) or bool((idx >= logits.shape[1]).any()):
            raise ValueError("all candidates of a row must lie in that row's gt_domain")
        out[m] = logits.gather(1, idx)
    return out


# ----------------------------------------------------------------------------- losses
def head_cross_entropy(head: nn.Linear, hidden: torch.Tensor, target: torch.Tensor, mask: torch.Tensor,
                       negatives: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mean CE of the linear ``head`` over the masked positions only; 0 (still in the graph) if none.

    With ``negatives=None`` this equals ``F.cross_entropy(head(hidden)[mask], target[mask])`` (the
    full softmax of Eq. 16), but the head runs on the masked rows alone: over ~30k items the full
    (B, L, |V|) logits cost ~7x more time and memory than the ~13 % of positions a term uses.

    With ``negatives`` (S,) item ids of the head's index space, the softmax runs over the target
    and those shared negatives (sampled softmax; a negative equal to a row's target is masked
    out). Uniform negatives need no log-Q correction; the estimate converges to the full
    softmax as S grows.

    Args: hidden (B, L, n); target, mask (B, L); ``head``: ``nn.Linear(n, |V^d|)``.
    """
    return sampled_head_losses(head, [(hidden, target, mask)], negatives)[0]


def sampled_head_losses(head: nn.Linear, terms: SequenceT[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                        negatives: Optional[torch.Tensor] = None, *, sparse_grad: bool = False) -> List[torch.Tensor]:
    """:func:`head_cross_entropy` of several ``(hidden, target, mask)`` terms that share one head.

    With a sampled softmax the head's rows (every term's targets and the shared negatives) are
    read in **one** gather: each index into a (|V^d|, n) parameter costs its backward a zero-filled
    gradient of the whole head, so one gather instead of two per term is several times cheaper
    for the three terms of a domain in Eq. 17. Same values as separate calls. ``sparse_grad``:
    the head's weight gets a sparse gradient (:func:`read_rows`; sampled softmax only).
    """
    losses: List[Optional[torch.Tensor]] = [None] * len(terms)
    live = []                                                               # (term index, rows (P, n), targets (P,))
    for index, (hidden, target, mask) in enumerate(terms):
        if not bool(mask.any()):
            losses[index] = hidden.sum() * 0.0
        else:
            live.append((index, hidden[mask], target[mask]))
    if negatives is None:
        for index, rows, tgt in live:
            losses[index] = F.cross_entropy(head(rows), tgt)                # over (P, |V^d|)
        return losses
    if live:
        ids = torch.cat([negatives] + [tgt for _, _, tgt in live])         # (S + Σ P,)
        weight, bias = read_rows(head.weight, ids, sparse_grad), head.bias[ids]  # (S + Σ P, n), (S + Σ P,): one gather
        neg_w, neg_b = weight[:negatives.numel()], bias[:negatives.numel()]  # (S, n), (S,)
        start = negatives.numel()
        for index, rows, tgt in live:
            stop = start + tgt.numel()
            pos = (rows * weight[start:stop]).sum(-1) + bias[start:stop]   # (P,)
            neg = rows @ neg_w.T + neg_b                                    # (P, S)
            neg = neg.masked_fill(negatives.unsqueeze(0) == tgt.unsqueeze(1), float("-inf"))
            logits = torch.cat([pos.unsqueeze(1), neg], dim=1)              # (P, 1 + S); target at 0
            losses[index] = F.cross_entropy(logits, torch.zeros_like(tgt))
            start = stop
    return losses


def draw_negatives(num_items_a: int, num_items_b: int, count: Optional[int], rng: np.random.Generator,
                   device) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """``count`` uniform item ids per domain (local index spaces), or None for the full softmax."""
    if count is None:
        return None
    return tuple(torch.as_tensor(rng.integers(0, n, size=min(int(count), n)), device=device)
                 for n in (num_items_a, num_items_b))


def draw_negatives_torch(num_items_a: int, num_items_b: int, count: Optional[int],
                         device) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """:func:`draw_negatives` from torch's global RNG (the baselines' ``loss``; FedProx seeds it).

    ``count`` uniform ids per domain (with replacement, local index spaces, ``min(count, |V^d|)``
    each), or None (no draw, no RNG use) for the full softmax.
    """
    if count is None:
        return None
    return tuple(torch.randint(0, n, (min(int(count), n),), device=device) for n in (num_items_a, num_items_b))


def prediction_loss(heads: Tuple[nn.Linear, nn.Linear], h_cross: torch.Tensor, h_a: torch.Tensor, h_b: torch.Tensor,
                    batch: SequenceBatch, *, use_unified: bool = True, use_single: bool = True,
                    negatives: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
                    sparse_grads: bool = False) -> Dict[str, torch.Tensor]:
    """Eq. 17 as separate CE terms (cross-domain heads always; unified / single by flag).

    ``heads = (W^A, W^B)``; the three hidden states are (B, L, n). The logits of Eq. 16 are
    those of :meth:`FedCSRModel.logits`, evaluated only where a term has a target.
    ``negatives``: per-domain shared negatives for a sampled softmax (:func:`draw_negatives`).
    ``sparse_grads``: the heads' weights get sparse gradients (:func:`read_rows`).
    """
    head_a, head_b = heads
    neg_a, neg_b = negatives if negatives is not None else (None, None)
    names = ["cross"] + (["single"] if use_single else []) + (["unified"] if use_unified else [])
    inputs = {"cross": ((h_a + h_cross, batch.next_a, batch.next_a_mask), (h_b + h_cross, batch.next_b, batch.next_b_mask)),
              "single": ((h_a, batch.next_a, batch.next_a_mask), (h_b, batch.next_b, batch.next_b_mask)),
              "unified": ((h_cross, batch.unified_a, batch.unified_a_mask), (h_cross, batch.unified_b, batch.unified_b_mask))}
    losses_a = sampled_head_losses(head_a, [inputs[name][0] for name in names], neg_a, sparse_grad=sparse_grads)
    losses_b = sampled_head_losses(head_b, [inputs[name][1] for name in names], neg_b, sparse_grad=sparse_grads)
    terms = {}
    for name, loss_a, loss_b in zip(names, losses_a, losses_b):
        terms[f"{name}_a"], terms[f"{name}_b"] = loss_a, loss_b
    return terms


__all__ = ["check_fields", "check_sampled_negatives", "SequenceInputs", "SequenceBatch", "domain_index", "inputs_from_cross",
           "make_batch", "TransitionGraphs", "transition_graphs", "CausalSelfAttention", "propagate", "read_rows", "propagate_rows",
           "GAEncoder", "cross_domain_scores", "head_cross_entropy", "sampled_head_losses", "draw_negatives",
           "draw_negatives_torch", "prediction_loss"]
