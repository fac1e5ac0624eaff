"""GPFedRec's server: the user-relation graph and its message passing (the paper's Eqs. 4-6).

The server of GPFedRec (:mod:`fedlib.baselines.single_domain.gpfedrec`) builds a graph over the users'
uploaded item tables (cosine similarity, an edge where it exceeds the mean similarity times a
scale), passes messages over it and sends every user its personalised table. This module is
that computation alone, on a stacked ``(U, I, d)`` tensor of tables, with a reference
implementation (:func:`graph_personalise_reference`) and a certified fast path for graphs that
are provably complete (:func:`angle_bound`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch

__all__ = ["SIMILARITIES", "flatten_tables", "user_similarity", "neighbour_weights", "message_passing", "GraphAggregate", "CERTIFICATE_MARGIN", "AngleBound", "angle_bound", "complete_graph_threshold", "rows_equal", "graph_personalise", "graph_personalise_reference"]


#: ``"cosine"``: the paper's similarity; ``"cosine_distance_as_in_code"``: sklearn's cosine
#: distance used as a similarity, as in the public code.
SIMILARITIES = ("cosine", "cosine_distance_as_in_code")


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}: use one of {choices}")


def _check_chunk(chunk_size) -> int:
    if int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be >= 1 (users per block of the U×U products), got {chunk_size!r}")
    return int(chunk_size)


# ======================================================================================
# Server: the user-relation graph and message passing
# ======================================================================================
def flatten_tables(tables: torch.Tensor) -> torch.Tensor:
    """``(U, I, d)`` item tables (or already flat ``(U, F)``) as ``(U, I·d)`` rows ``x_u`` (a view)."""
    if tables.dim() == 3:
        return tables.reshape(tables.shape[0], -1)
    if tables.dim() == 2:
        return tables
    raise ValueError(f"item tables must be (U, I, d) (one table per user) or (U, I*d), got shape {tuple(tables.shape)}")


def user_similarity(tables: torch.Tensor, similarity: str = "cosine", chunk_size: int = 1024) -> torch.Tensor:
    """The user-relation graph ``S (U, U)`` from the users' item tables, by blocked matrix products.

    ``S_uv = x_uᵀ x_v / (‖x_u‖ ‖x_v‖)``, from the upper-triangular blocks of ``X Xᵀ`` only
    (:func:`_symmetric_gram`: about half the multiply-adds of the full product; no normalised
    copy of the tables is made). A zero table has similarity 0 with everyone (sklearn's convention).

    Args:
        tables: ``(U, I, d)`` or ``(U, F)``.
        similarity: ``"cosine"``, or ``"cosine_distance_as_in_code"``: ``clip(1 − cos, 0, 2)``
            with a zero diagonal, i.e. sklearn's ``pairwise_distances(metric="cosine")``,
            which the public code then uses as a similarity.
        chunk_size: at most this many rows of ``S`` per block (see :func:`_symmetric_gram`).

    Returns:
        ``(U, U)`` in the tables' dtype, exactly symmetric.
    """
    _check_choice("similarity", similarity, SIMILARITIES)
    chunk_size = _check_chunk(chunk_size)
    x = flatten_tables(tables)  # (U, F)
    norms = x.norm(dim=1)
    norms = torch.where(norms > 0, norms, torch.ones_like(norms))  # (U,) zero rows stay zero
    out = _symmetric_gram(x, chunk_size)  # (U, U) x xᵀ
    out /= norms[:, None] * norms[None, :]
    if similarity == "cosine_distance_as_in_code":
        out = (1.0 - out).clamp_(0.0, 2.0)
        out.fill_diagonal_(0.0)
    return out


#: Rows per block of :func:`_symmetric_gram`: small enough that the skipped lower-triangular
#: blocks are most of the lower half (``U²/2 + U·block/2`` multiply-adds per column instead of
#: ``U²``), large enough for an efficient matrix product over the ``I·d`` columns.
GRAM_BLOCK = 128


def _symmetric_gram(x: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """``x xᵀ (U, U)`` from its upper-triangular row blocks, mirrored: exactly symmetric.

    Why: the Gram is symmetric, so block row ``[a, b)`` needs only columns ``a:``; the
    diagonal blocks are made symmetric by copying their upper triangle (float rounding may
    order the two halves' sums differently).

    Args:
        x: ``(U, F)``.
        chunk_size: upper bound on the rows per block (``GRAM_BLOCK`` when smaller).
    """
    num_users = x.shape[0]
    block = max(1, min(int(chunk_size), GRAM_BLOCK))
    gram = x.new_empty((num_users, num_users))
    for start in range(0, num_users, block):
        stop = min(start + block, num_users)
        gram[start:stop, start:] = x[start:stop] @ x[start:].T  # (block, U − start)
    upper = torch.triu(gram)
    return upper + torch.triu(gram, diagonal=1).T


def neighbour_weights(similarity: torch.Tensor, threshold_scale: float = 1.0) -> Tuple[torch.Tensor, float]:
    """Threshold the graph and weight each user's neighbours equally: ``(A (U, U), τ)``.

    ``τ = threshold_scale · mean(S)`` over all ``U²`` entries (diagonal included);
    ``N(u) = {v : S_uv > τ}`` (strict); ``A_uv = 1/|N(u)|`` on ``N(u)``; a user without
    neighbours keeps its own table (``A_uu = 1``). Every row of ``A`` sums to 1.

    Args:
        similarity: ``(U, U)`` the graph ``S``.
        threshold_scale: ``κ`` (the code's ``--neighborhood_threshold``, 1.0), finite.

    Returns:
        ``(A, τ)``: ``A`` in the graph's dtype, ``τ`` a float.
    """
    if similarity.dim() != 2 or similarity.shape[0] != similarity.shape[1]:
        raise ValueError(f"similarity must be a square (U, U) matrix, got shape {tuple(similarity.shape)}")
    scale = float(threshold_scale)
    if not math.isfinite(scale):
        raise ValueError("threshold_scale must be a finite number (multiplier of the mean similarity), "
                         f"got {threshold_scale!r}")
    threshold = float(similarity.mean()) * scale
    weights, _ = _mask_weights(similarity > threshold, similarity.dtype)
    return weights, threshold


def _mask_weights(above: torch.Tensor, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(A, |N(u)|)`` from the ``(U, U)`` neighbour mask: ``1/|N(u)|`` on ``N(u)``, ``A_uu = 1`` if empty."""
    counts = above.sum(1)  # (U,)
    weights = above.to(dtype) / counts.clamp(min=1).to(dtype)[:, None]
    lonely = torch.nonzero(counts == 0).flatten()
    weights[lonely, lonely] = 1.0
    return weights, counts


def message_passing(weights: torch.Tensor, tables: torch.Tensor, layers: int = 1,
                    chunk_size: int = 1024) -> torch.Tensor:
    """``r = A^L q``: ``layers`` rounds of neighbour averaging, ``chunk_size`` users at a time.

    Args:
        weights: ``(U, U)`` row-stochastic ``A``.
        tables: ``(U, I, d)`` (or ``(U, F)``) the uploaded tables ``q``.
        layers: ``L >= 1`` (the code's ``--mp_layers``, 1).

    Returns:
        Tensor shaped like ``tables``: row ``u`` is ``r_u``.
    """
    chunk_size = _check_chunk(chunk_size)
    if int(layers) < 1:
        raise ValueError(f"layers must be >= 1 (message-passing steps), got {layers!r}")
    x = flatten_tables(tables)  # (U, F)
    if weights.shape != (x.shape[0], x.shape[0]):
        raise ValueError(f"weights {tuple(weights.shape)} do not match {x.shape[0]} users' tables: expected "
                         f"({x.shape[0]}, {x.shape[0]})")
    weights = weights.to(x.dtype)
    for _ in range(int(layers)):
        out = torch.empty_like(x)
        for start in range(0, x.shape[0], chunk_size):
            stop = min(start + chunk_size, x.shape[0])
            # written in place: no (chunk, F) temporary (1.6 GB on LastFM-2K) to allocate and copy
            torch.mm(weights[start:stop], x, out=out[start:stop])  # (chunk, F)
        x = out
    return x.reshape(tables.shape)


@dataclass
class GraphAggregate:
    """One server step of GPFedRec.

    Attributes:
        personal: ``(U, I, d)`` personalised tables ``r_u``.
        global_table: ``(I, d)`` ``q_g``, the mean of ``personal``.
        weights: ``(U, U)`` ``A``.
        similarity: ``(U, U)`` ``S``, or ``None`` when :func:`complete_graph_threshold` proved
            the graph complete without forming ``S``.
        threshold: ``τ``.
        certified_complete: True when :func:`angle_bound` proved the graph complete.
        wide_users: users with a pair the angle bound does not prove (only such pairs get an entry
            of ``S``); ``None``: ``S`` formed in full.
    """

    personal: torch.Tensor
    global_table: torch.Tensor
    weights: torch.Tensor
    similarity: Optional[torch.Tensor]
    threshold: float
    certified_complete: bool = False
    wide_users: Optional[int] = None


#: Safety margin (in cosine) between a proved lower bound of ``S_uv`` and ``τ``; it absorbs
#: the float rounding of the full path's ``S`` and of the bound itself.
CERTIFICATE_MARGIN = 1e-3


@dataclass
class AngleBound:
    """What :func:`angle_bound` proves about the graph without forming ``S``.

    Attributes:
        threshold: ``τ = κ · mean(S)``, from ``mean(S) = ‖Σ_u x̂_u‖² / U²``.
        angles: ``(U,)`` float64 ``θ_u = ∠(x_u, g)`` to the mean direction ``g`` (π for a zero table).
        wide: ``(U,)`` bool, users whose pairs are not all proved above ``τ``.
        pair_limit: a pair with ``θ_u + θ_v < pair_limit`` is proved above ``τ`` (radians;
            ``-inf`` when no pair is provable). ``wide = θ ≥ pair_limit / 2``.
    """

    threshold: float
    angles: torch.Tensor
    wide: torch.Tensor
    pair_limit: float = -math.inf


def angle_bound(tables: torch.Tensor, threshold_scale: float = 1.0) -> AngleBound:
    r"""Prove most of the graph's edges in ``O(U·I·d)`` instead of forming ``S`` in ``O(U²·I·d)``.

    Why: every client starts a round from the same broadcast ``q_g`` and moves little in one
    round, so the uploaded tables point almost the same way; with the paper's
    ``threshold_scale = 0.5`` nearly every ``S_uv ≈ 1 > τ ≈ 0.5``. Two facts make that cheap:

    * ``mean(S) = ‖Σ_u x̂_u‖² / U²`` with ``x̂_u = x_u / ‖x_u‖``, so ``τ`` needs no ``S``;
    * with ``g`` the mean direction and ``θ_u = ∠(x_u, g)``, the triangle inequality for
      angles gives ``∠(x_u, x_v) ≤ θ_u + θ_v``, so ``S_uv ≥ cos(θ_u + θ_v)``.

    A user is *narrow* when ``θ_u < ½ arccos(τ + CERTIFICATE_MARGIN)``: every pair of narrow
    users is proved to be an edge. Only the *wide* users' rows of ``S`` must be computed.
    Three passes over the tables in their dtype; every angle is widened by a bound on the
    float rounding. Cosine similarity only.
    """
    x = flatten_tables(tables)  # (U, F)
    num_users = x.shape[0]
    norms = x.norm(dim=1)  # (U,)
    inverse = torch.where(norms > 0, 1.0 / norms.clamp(min=torch.finfo(x.dtype).tiny), torch.zeros_like(norms))
    direction = inverse @ x  # (F,) Σ_u x̂_u; zero tables add nothing
    total = float(direction.to(torch.float64).norm())
    threshold = float(threshold_scale) * total ** 2 / num_users ** 2
    angles = torch.full((num_users,), math.pi, dtype=torch.float64, device=x.device)
    if total > 0:
        cosines = ((x @ (direction / total)) * inverse).to(torch.float64)  # (U,) cos θ_u
        angles = torch.where(norms > 0, torch.arccos(cosines.clamp(-1.0, 1.0)), angles)
        # float rounding of the F-term dot products: arccos near 1 turns a cosine error e into
        # an angle error ≈ √(2e); widen every angle by that much (e from F·eps, generous)
        angles = angles + math.sqrt(2.0 * x.shape[1] * torch.finfo(x.dtype).eps)
    floor = threshold + CERTIFICATE_MARGIN
    pair_limit = math.acos(floor) if floor < 1.0 else -math.inf  # no pair provable when τ is near 1
    return AngleBound(threshold, angles, angles >= 0.5 * pair_limit, pair_limit)


def complete_graph_threshold(tables: torch.Tensor, threshold_scale: float = 1.0) -> Optional[float]:
    """``τ`` if :func:`angle_bound` proves every pair above it (the graph is complete), else ``None``."""
    bound = angle_bound(tables, threshold_scale)
    return None if bool(bound.wide.any()) else bound.threshold


def rows_equal(tables: torch.Tensor, other: torch.Tensor, users: Optional[Sequence[int]] = None) -> torch.Tensor:
    """``(n,) bool``: is ``tables[u]`` bitwise equal to ``other[u]`` (or to ``other`` itself when
    it is a single ``(I, d)`` table), for each ``u`` in ``users`` (default: all)?

    One ``torch.equal`` per user: no ``(U, I, d)`` boolean temporary.
    """
    users = range(tables.shape[0]) if users is None else [int(u) for u in users]
    single = other.dim() == tables.dim() - 1
    return torch.tensor([torch.equal(tables[u], other if single else other[u]) for u in users], dtype=torch.bool,
                        device=tables.device)


def _complete_graph(tables: torch.Tensor, threshold: float, certified: bool, wide_users: int) -> GraphAggregate:
    """``A = 1/U`` everywhere: ``A^L = A``, every ``r_u`` and ``q_g`` is the same mean, bit for bit.

    Bitwise equality matters: a client whose download equals its ``r_u`` needs no whole-table
    context in the next round (:meth:`GPFedRecLoss.prepare_round`). ``personal`` is a
    broadcast view of the mean (no ``(U, I, d)`` copy).
    """
    num_users = tables.shape[0]
    mean = tables.mean(0)  # (I, d)
    weights = tables.new_full((num_users, num_users), 1.0 / num_users)
    return GraphAggregate(mean.expand_as(tables), mean, weights, None, threshold, certified, wide_users)


def _uncertified_above(x: torch.Tensor, bound: AngleBound, threshold: float) -> torch.Tensor:
    """The ``(U, U) bool`` neighbour mask ``S > τ``, forming ``S_uv`` only where the angle bound
    does not prove the pair: ``θ_u + θ_v ≥ pair_limit``, each pair once.

    Why: sorted by angle, the pairs user ``i`` needs are a suffix of the users (those with
    ``θ_j ≥ pair_limit − θ_i``), so block row ``[a, b)`` of the sorted Gram's upper triangle
    needs the columns from ``max(a, start of row b − 1)`` on: one matrix product per block. The
    rest of the mask is proved ``True``; the lower triangle is the upper one mirrored (``S`` is
    symmetric). Cost: ``O(P·I·d)`` for ``P`` uncertified pairs, plus one sorted copy of ``x``.

    Args:
        x: ``(U, F)`` the flat tables.
        bound: :func:`angle_bound` of the same tables.
        threshold: ``τ``.
    """
    num_users = x.shape[0]
    angles, order = torch.sort(bound.angles)  # (U,) float64 ascending
    first_needed = torch.searchsorted(angles, bound.pair_limit - angles)  # (U,) non-increasing
    if int(first_needed[-1]) >= num_users:  # even the widest user's pairs are all proved
        return torch.ones((num_users, num_users), dtype=torch.bool, device=x.device)
    x_sorted = x.index_select(0, order.to(x.device))  # (U, F) a copy, so every block's columns are one slice
    norms = x_sorted.norm(dim=1)
    norms = torch.where(norms > 0, norms, torch.ones_like(norms))  # zero rows stay zero
    sorted_above = torch.ones((num_users, num_users), dtype=torch.bool, device=x.device)
    for start in range(0, num_users, GRAM_BLOCK):
        stop = min(start + GRAM_BLOCK, num_users)
        column = max(start, int(first_needed[stop - 1]))
        if column >= num_users:
            continue  # every pair (i ∈ block, j ≥ start) is proved
        rows = (x_sorted[start:stop] @ x_sorted[column:].T) / (norms[start:stop, None] * norms[None, column:])
        sorted_above[start:stop, column:] = rows > threshold  # (block, U − column) exact entries of S
    upper = torch.triu(sorted_above)
    sorted_above = upper | torch.triu(upper, diagonal=1).T
    above = torch.empty_like(sorted_above)
    at = order.to(x.device)
    above[at[:, None], at[None, :]] = sorted_above  # back to the users' order
    return above


#: Most non-neighbours a user's row of ``A X`` is formed from by subtraction: each costs a
#: gathered ``I·d`` row, where the dense row ``A_u X`` costs ``U·I·d`` multiply-adds at matrix
#: product speed (several times faster per element than a gather and a sum).
MAX_DROPPED = 8


def _personalise_by_complement(x: torch.Tensor, above: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """One layer of message passing ``r = A X`` for the mask ``above``: ``(A (U, U), r (U, F))``.

    Why: in GPFedRec's graphs almost every pair is an edge (a handful of non-edges among
    ``U²``), so for user ``u`` with more neighbours than non-neighbours
    ``r_u = (Σ_v x_v − Σ_{v ∉ N(u)} x_v) / |N(u)|`` costs ``O(I·d)`` per non-neighbour instead of
    ``O(U·I·d)``; the other users (more than :data:`MAX_DROPPED` non-neighbours, or users
    without neighbours, ``r_u = x_u``) take ``A_u X`` in one matrix product.
    Equal to ``message_passing(A, x)`` up to float rounding.
    """
    num_users = x.shape[0]
    weights, counts = _mask_weights(above, x.dtype)  # (U, U), (U,)
    outside = ~above
    non_edges = num_users - counts  # (U,)
    by_complement = (counts > non_edges) & (non_edges <= MAX_DROPPED)  # (U,)
    total = x.sum(0)  # (F,)
    personal = torch.empty_like(x)
    torch.div(total[None, :], counts.clamp(min=1).to(x.dtype)[:, None], out=personal)  # rows without non-edges
    # rows that drop some users, one at a time (most drop one or two users: no (R, F) temporary)
    for user in torch.nonzero(by_complement & outside.any(1)).flatten().tolist():
        dropped = torch.nonzero(outside[user]).flatten()
        personal[user] = (total - x[dropped].sum(0)) / counts[user].to(x.dtype)
    direct = torch.nonzero(~by_complement).flatten()
    if direct.numel():
        personal[direct] = weights[direct] @ x  # (D, F)
    return weights, personal


def _graph_personalise_bounded(tables: torch.Tensor, bound: AngleBound) -> GraphAggregate:
    """One-layer server step using :func:`angle_bound`: ``S`` only on the pairs it does not prove.

    :func:`_uncertified_above` forms the unproved pairs' similarities (each pair once), and
    :func:`_personalise_by_complement` passes the messages through the few non-edges.
    ``wide_users`` counts the users with any unproved pair.
    """
    x = flatten_tables(tables)  # (U, F)
    above = _uncertified_above(x, bound, bound.threshold)  # (U, U)
    wide_users = int(bound.wide.sum())
    if bool(above.all()):  # the computed pairs are edges too: the same result as a proved complete graph
        return _complete_graph(tables, bound.threshold, certified=False, wide_users=wide_users)
    weights, personal = _personalise_by_complement(x, above)
    personal = personal.reshape(tables.shape)
    return GraphAggregate(personal, personal.mean(0), weights, None, bound.threshold, False, wide_users)


def graph_personalise(tables: torch.Tensor, similarity: str = "cosine", threshold_scale: float = 1.0,
                      layers: int = 1, chunk_size: int = 1024, certify: bool = True) -> GraphAggregate:
    """The server step, batched: graph, neighbour weights, message passing, global mean.

    Args:
        tables: ``(U, I, d)`` the participants' uploaded tables (``U >= 1``).
        similarity, threshold_scale, layers, chunk_size: see :func:`user_similarity`,
            :func:`neighbour_weights`, :func:`message_passing`.
        certify: first try :func:`angle_bound` (cosine only). A proved complete graph skips ``S``
            and message passing (``r_u`` = the mean); with one layer and fewer than half the
            users wide, only the pairs the bound does not prove get an entry of ``S``
            (:func:`_graph_personalise_bounded`).

    Returns:
        :class:`GraphAggregate`. Cost ``O(U² I d)`` multiply-adds (``X Xᵀ`` from its upper
        triangle, ``U²/2 × I·d``, and ``A X``, ``U² × I·d``), ``O(U I d)`` when the complete graph
        is proved, ``O(P I d)`` for ``P`` unproved pairs on the bounded path.
    """
    if tables.dim() != 3 or tables.shape[0] < 1:
        raise ValueError(f"tables must be (U, I, d) with U >= 1, got shape {tuple(tables.shape)}")
    if certify and similarity == "cosine":
        bound = angle_bound(tables, threshold_scale)
        if not bool(bound.wide.any()):  # proved complete
            return _complete_graph(tables, bound.threshold, certified=True, wide_users=0)
        if int(layers) == 1 and 2 * int(bound.wide.sum()) < tables.shape[0]:
            return _graph_personalise_bounded(tables, bound)
    sim = user_similarity(tables, similarity, chunk_size)  # (U, U)
    weights, threshold = neighbour_weights(sim, threshold_scale)  # (U, U)
    personal = message_passing(weights, tables, layers, chunk_size)  # (U, I, d)
    return GraphAggregate(personal, personal.mean(0), weights, sim, threshold)


def graph_personalise_reference(tables: torch.Tensor, similarity: str = "cosine", threshold_scale: float = 1.0,
                                layers: int = 1) -> GraphAggregate:
    """The same server step as plain per-user loops (the readable reference; ``O(U²)`` Python steps)."""
    _check_choice("similarity", similarity, SIMILARITIES)
    if tables.dim() != 3 or tables.shape[0] < 1:
        raise ValueError(f"tables must be (U, I, d) with U >= 1, got shape {tuple(tables.shape)}")
    num_users = tables.shape[0]
    vectors = [tables[u].flatten() for u in range(num_users)]
    sim = tables.new_zeros((num_users, num_users))
    for u in range(num_users):
        for v in range(num_users):
            norm_u, norm_v = float(vectors[u].norm()), float(vectors[v].norm())
            cos = float(vectors[u] @ vectors[v]) / (norm_u * norm_v) if norm_u > 0 and norm_v > 0 else 0.0
            if similarity == "cosine":
                sim[u, v] = cos
            else:
                sim[u, v] = 0.0 if u == v else min(max(1.0 - cos, 0.0), 2.0)
    threshold = float(sim.sum()) / num_users ** 2 * float(threshold_scale)
    weights = tables.new_zeros((num_users, num_users))
    for u in range(num_users):
        neighbours = [v for v in range(num_users) if float(sim[u, v]) > threshold]
        if not neighbours:
            weights[u, u] = 1.0
        for v in neighbours:
            weights[u, v] = 1.0 / len(neighbours)
    current = [tables[u] for u in range(num_users)]
    for _ in range(int(layers)):
        current = [sum(float(weights[u, v]) * current[v] for v in range(num_users) if float(weights[u, v]) != 0.0)
                   for u in range(num_users)]
    personal = torch.stack(current)
    return GraphAggregate(personal, personal.mean(0), weights, sim, threshold)
