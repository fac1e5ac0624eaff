"""k-means of user representations: the clustering step shared by the prototype-based cross-domain methods.

FedPCL-CDR clusters all users of a domain into ``K`` prototypes every round (its Eq. 3,
:mod:`fedlib.papers.fedpcl_cdr.prototypes`); P²DTR clusters the users found by its private
set intersection (:mod:`fedlib.baselines.cross_domain.p2dtr`). Both call :func:`cluster_users`, so it sits
here, below the paper folders and the baselines alike.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np
import torch

__all__ = ["cluster_users"]


def cluster_users(user_vectors: torch.Tensor, num_clusters: int, seed: int = 0,
                  restarts: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """k-means (scikit-learn) over the rows of ``user_vectors`` (FedPCL-CDR's Eq. 3: **all** users of a domain).

    Args:
        user_vectors: ``(U, D)`` representations.
        num_clusters: ``K``.
        seed: scikit-learn's ``random_state`` (the same seed gives the same clusters).
        restarts: scikit-learn's ``n_init``.
    Returns:
        ``(centroids (K, D), assignment (U,) int64)`` on the device and in the dtype of
        ``user_vectors``. Fewer distinct users than ``K`` is an error.
    """
    from sklearn.cluster import KMeans

    data = user_vectors.detach().to("cpu", torch.float64).numpy()
    distinct = np.unique(np.round(data, 12), axis=0).shape[0]
    if distinct < num_clusters:
        raise ValueError(f"k-means with K={num_clusters} needs at least {num_clusters} distinct user vectors, "
                         f"got {distinct}; lower num_clusters")
    kmeans = KMeans(n_clusters=num_clusters, n_init=restarts, random_state=int(seed)).fit(data)
    centroids = torch.as_tensor(kmeans.cluster_centers_, dtype=user_vectors.dtype, device=user_vectors.device)
    assignment = torch.as_tensor(kmeans.labels_.astype(np.int64), device=user_vectors.device)
    return centroids, assignment
