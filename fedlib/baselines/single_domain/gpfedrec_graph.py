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

    ``S_uv = x_uᵀ x_v / (‖x_u‖ ‖x_v‖)``, computed ``chunk_size`` rows at a time (each block is
    ``(chunk, I·d) @ (I·d, U)``; no normalised copy of the tables is made). A zero table has
    similarity 0 with everyone (sklearn's convention).

    Args:
        tables: ``(U, I, d)`` or ``(U, F)``.
        similarity: ``"cosine"``, or ``"cosine_distance_as_in_code"``: ``clip(1 − cos, 0, 2)``
            with a zero diagonal, i.e. sklearn's ``pairwise_distances(metric="cosine")``,
            which the public code then uses as a similarity.
        chunk_size: rows of ``S`` per block.

    Returns:
        ``(U, U)`` in the tables' dtype.
    """
    _check_choice("similarity", similarity, SIMILARITIES)
    chunk_size = _check_chunk(chunk_size)
    x = flatten_tables(tables)  # (U, F)
    num_users = x.shape[0]
    norms = x.norm(dim=1)
    norms = torch.where(norms > 0, norms, torch.ones_like(norms))  # (U,) zero rows stay zero
    out = x.new_empty((num_users, num_users))
    for start in range(0, num_users, chunk_size):
        stop = min(start + chunk_size, num_users)
        out[start:stop] = (x[start:stop] @ x.T) / (norms[start:stop, None] * norms[None, :])  # (chunk, U)
    if similarity == "cosine_distance_as_in_code":
        out = (1.0 - out).clamp_(0.0, 2.0)
        out.fill_diagonal_(0.0)
    return out


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
            out[start:stop] = weights[start:stop] @ x  # (chunk, F)
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
        wide_users: how many users' rows of ``S`` were computed (``None``: all, the full path).
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
    """

    threshold: float
    angles: torch.Tensor
    wide: torch.Tensor


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
    half_limit = 0.5 * math.acos(floor) if floor < 1.0 else -1.0  # no pair provable when τ is near 1
    return AngleBound(threshold, angles, angles >= half_limit)


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


def _graph_personalise_bounded(tables: torch.Tensor, bound: AngleBound) -> GraphAggregate:
    """One-layer server step using :func:`angle_bound`: exact rows of ``S`` for the wide users only.

    Narrow user ``u`` has every narrow user as a neighbour, so
    ``r_u = (Σ_v x_v − Σ_{wide w ∉ N(u)} x_w) / |N(u)|`` and the wide rows
    ``r_w = A_w X`` cost ``O(W·U·I·d)`` for ``W`` wide users.
    """
    x = flatten_tables(tables)  # (U, F)
    num_users = x.shape[0]
    wide = torch.nonzero(bound.wide).flatten()  # (W,)
    above = torch.ones((num_users, num_users), dtype=torch.bool, device=x.device)  # narrow pairs: proved
    norms = x.norm(dim=1)
    norms = torch.where(norms > 0, norms, torch.ones_like(norms))
    wide_rows = (x[wide] @ x.T) / (norms[wide, None] * norms[None, :])  # (W, U) exact rows of S
    above[wide] = wide_rows > bound.threshold
    above[:, wide] = above[wide].T  # S is symmetric
    if bool(above.all()):  # the wide rows are complete too: the same result as a proved complete graph
        return _complete_graph(tables, bound.threshold, certified=False, wide_users=int(wide.numel()))
    weights, counts = _mask_weights(above, x.dtype)
    total = x.sum(0)  # (F,)
    personal = torch.empty_like(x)
    narrow = torch.nonzero(~bound.wide).flatten()
    if narrow.numel():
        missing = (~above[narrow][:, wide]).to(x.dtype)  # (N, W) wide users outside N(u)
        personal[narrow] = (total[None, :] - missing @ x[wide]) / counts[narrow].to(x.dtype)[:, None]
    personal[wide] = weights[wide] @ x  # (W, F)
    personal = personal.reshape(tables.shape)
    return GraphAggregate(personal, personal.mean(0), weights, None, bound.threshold, False, int(wide.numel()))


def graph_personalise(tables: torch.Tensor, similarity: str = "cosine", threshold_scale: float = 1.0,
                      layers: int = 1, chunk_size: int = 1024, certify: bool = True) -> GraphAggregate:
    """The server step, batched: graph, neighbour weights, message passing, global mean.

    Args:
        tables: ``(U, I, d)`` the participants' uploaded tables (``U >= 1``).
        similarity, threshold_scale, layers, chunk_size: see :func:`user_similarity`,
            :func:`neighbour_weights`, :func:`message_passing`.
        certify: first try :func:`angle_bound` (cosine only). A proved complete graph skips ``S``
            and message passing (``r_u`` = the mean); with one layer and fewer than half the
            users wide, only the wide users' rows of ``S`` are computed.

    Returns:
        :class:`GraphAggregate`. Cost ``O(U² I d)`` multiply-adds (two ``U × U × I·d`` products),
        ``O(U I d)`` when the complete graph is proved, ``O(W U I d)`` with ``W`` wide users.
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
