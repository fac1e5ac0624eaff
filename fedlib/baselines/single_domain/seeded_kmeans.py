"""K-Means on the server's item table with seeded initial draws (CoFedRec's item membership).

k-means++ seeding from a list of uniforms the server draws from its round generator
(:func:`server_uniforms`), then Lloyd iterations: a pure function of the table and the round,
with a per-point reference implementation (:func:`kmeans_reference`) the tests compare it with.
Used by CoFedRec's server (:mod:`fedlib.baselines.single_domain.cofedrec`).
"""
from __future__ import annotations

import math
from typing import Tuple

import numpy as np
import torch

__all__ = ["server_uniforms", "pick", "kmeans", "kmeans_reference"]


def _check_positive_int(name: str, value, what: str) -> int:
    if isinstance(value, bool) or int(value) != value or int(value) < 1:
        raise ValueError(f"{name} must be an integer >= 1 ({what}), got {value!r}")
    return int(value)


# ======================================================================================
# Server: item membership (K-Means on V_g)
# ======================================================================================
def server_uniforms(rng: np.random.Generator, num_clusters: int) -> np.ndarray:
    """The server's random numbers of one round, drawn once: ``(K + 2,)`` floats in ``[0, 1)``.

    ``[0:K]`` pick the k-means++ centres, ``[K]`` the core client, ``[K + 1]`` the item
    category. Drawing them up front lets the batched step and its per-user reference use
    exactly the same numbers.
    """
    return rng.random(_check_positive_int("num_clusters", num_clusters, "item clusters K") + 2)


def pick(u: float, n: int) -> int:
    """``floor(u · n)`` clipped to ``[0, n)``: a uniform index from one uniform number."""
    return min(int(math.floor(float(u) * n)), n - 1)


def _kmeans_pp_index(d2: np.ndarray, u: float) -> int:
    """k-means++: index drawn with probability ``∝ d2`` by inverting the CDF at ``u``."""
    total = float(d2.sum())
    if total <= 0.0:  # every point coincides with a centre: uniform
        return pick(u, d2.size)
    cdf = np.cumsum(d2) / total
    return min(int(np.searchsorted(cdf, float(u), side="right")), d2.size - 1)


#: a float64 squared distance below this share of ``‖p‖² + ‖c‖²`` is rounding residue: the points coincide
_COINCIDE = 1e-12


def _squared_distances(points: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """``(n, K)`` float64 ``‖p − c‖²`` as ``‖p‖² + ‖c‖² − 2 p·c``: one matrix product, no ``(n, K, d)`` temporary.

    In float64 the expansion's cancellation error is ~1e-16 of ``‖p‖² + ‖c‖²``, far below the
    rounding of the float32 tables it is applied to; a value under :data:`_COINCIDE` of that
    scale (including the small negatives rounding can give) is set to exactly 0, so coinciding
    points stay at distance 0 (k-means++ never draws them, ties go to the lowest cluster).
    """
    p, c = points.double(), centers.double()
    scale = (p * p).sum(1, keepdim=True) + (c * c).sum(1)[None, :]  # (n, K)
    distances = scale - 2.0 * (p @ c.T)
    return torch.where(distances <= _COINCIDE * scale, torch.zeros_like(distances), distances)


def _check_kmeans_inputs(points: torch.Tensor, num_clusters, uniforms, max_iter) -> Tuple[int, np.ndarray, int]:
    if points.dim() != 2:
        raise ValueError(f"points must be (n, d) (one row per item), got shape {tuple(points.shape)}")
    k = _check_positive_int("num_clusters", num_clusters, "item clusters K")
    if k > points.shape[0]:
        raise ValueError(f"num_clusters={k} exceeds the {points.shape[0]} items to cluster: use K <= number of items")
    uniforms = np.asarray(uniforms, dtype=np.float64).ravel()
    if uniforms.size < k:
        raise ValueError(f"uniforms must hold at least K = {k} numbers in [0, 1) (see server_uniforms), "
                         f"got {uniforms.size}")
    return k, uniforms, _check_positive_int("max_iter", max_iter, "Lloyd iterations")


def kmeans(points: torch.Tensor, num_clusters: int, uniforms, max_iter: int = 100
           ) -> Tuple[torch.Tensor, torch.Tensor, int]:
    """K-Means (k-means++ init, Lloyd iterations), batched over points: the item membership ``M``.

    Args:
        points: ``(n, d)`` e.g. the global item table ``V_g``.
        num_clusters: ``K`` (1 <= K <= n).
        uniforms: ``>= K`` numbers in ``[0, 1)`` (``server_uniforms(...)[:K]``): the first picks
            the first centre uniformly, the others invert the k-means++ ``D²`` distribution.
        max_iter: at most this many assignment/update iterations; stops earlier when no
            assignment changes.

    Returns:
        ``(membership (n,) int64, centers (K, d), iterations)``. Ties go to the lowest cluster
        index; an empty cluster keeps its centre.
    """
    k, uniforms, max_iter = _check_kmeans_inputs(points, num_clusters, uniforms, max_iter)
    n = points.shape[0]
    chosen = [pick(uniforms[0], n)]
    d2 = _squared_distances(points, points[chosen[0]][None])[:, 0]  # (n,)
    for j in range(1, k):
        index = _kmeans_pp_index(d2.double().cpu().numpy(), uniforms[j])
        chosen.append(index)
        d2 = torch.minimum(d2, _squared_distances(points, points[index][None])[:, 0])
    centers = points[torch.as_tensor(chosen, device=points.device)].clone()  # (K, d)
    previous = None
    iterations = 0
    for iterations in range(1, max_iter + 1):
        assign = _squared_distances(points, centers).argmin(1)  # (n,) first minimum on ties
        if previous is not None and torch.equal(assign, previous):
            break
        sums = torch.zeros_like(centers).index_add_(0, assign, points)
        counts = torch.bincount(assign, minlength=k).to(points.dtype)  # (K,)
        centers = torch.where(counts[:, None] > 0, sums / counts.clamp(min=1)[:, None], centers)
        previous = assign
    else:
        assign = _squared_distances(points, centers).argmin(1)
    return assign, centers, iterations


def kmeans_reference(points: torch.Tensor, num_clusters: int, uniforms, max_iter: int = 100
                     ) -> Tuple[torch.Tensor, torch.Tensor, int]:
    """The same K-Means as plain per-point loops (the readable reference of :func:`kmeans`)."""
    k, uniforms, max_iter = _check_kmeans_inputs(points, num_clusters, uniforms, max_iter)
    n = points.shape[0]

    def sq(a, b):
        return float((a - b).pow(2).sum())

    chosen = [pick(uniforms[0], n)]
    for j in range(1, k):
        d2 = np.array([min(sq(points[p], points[c]) for c in chosen) for p in range(n)])
        chosen.append(_kmeans_pp_index(d2, uniforms[j]))
    centers = [points[c].clone() for c in chosen]
    previous = None
    iterations = 0

    def nearest():
        out = []
        for p in range(n):
            dist = [sq(points[p], centers[c]) for c in range(k)]
            out.append(int(np.argmin(dist)))  # first minimum
        return out

    for iterations in range(1, max_iter + 1):
        assign = nearest()
        if previous is not None and assign == previous:
            break
        for c in range(k):
            members = [p for p in range(n) if assign[p] == c]
            if members:
                centers[c] = sum(points[p] for p in members) / len(members)
        previous = assign
    else:
        assign = nearest()
    return (torch.as_tensor(assign, dtype=torch.int64, device=points.device), torch.stack(centers), iterations)
