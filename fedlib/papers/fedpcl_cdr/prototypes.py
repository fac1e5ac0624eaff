r"""FedPCL-CDR's prototype and privacy math (Eqs. 3–9): what a domain sends, what the server returns, the losses.

The equations are those of :mod:`fedlib.papers.fedpcl_cdr.method` (its docstring has the notation,
the paper and the readings we chose); :class:`~fedlib.papers.fedpcl_cdr.method.FedPCLAlgorithm`
calls these functions once per round and domain. Here:

* Eqs. 4–6, the differential prototypes: :func:`clip_to_norm` and :func:`differential_prototypes`
  (clip to β, add Laplace noise of scale η), :func:`privacy_budget` (the paper's ε and the
  mechanism's). Eq. 3, the k-means over all users of a domain, is
  :func:`fedlib.baselines.cross_domain.user_clusters.cluster_users` (P²DTR clusters with it too);
* the messages: :class:`DomainUpload` (the representative prototypes and the overlapping
  users' labels, Eq. 4), :class:`ServerPrototypes` (Eqs. 13–14, what the server sends a
  domain) and :class:`DomainPrototypes` (what a domain trains with);
* the server: :func:`aggregate_prototypes` (vectorised over clusters) and
  :func:`aggregate_prototypes_reference` (the code's per-cluster loop; tests check they
  agree), then :func:`complete_prototypes` (a domain fills in its non-representative rows);
* Eqs. 7–9, the contrastive losses: :func:`global_prototype_loss`, :func:`local_prototype_loss`
  and its one-user-at-a-time reference :func:`local_prototype_loss_reference`.

No function here holds state or draws randomness except from the generator it is given.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Sequence

import torch
import torch.nn.functional as F

from fedlib.engine.privacy import add_laplace, l1_sensitivity_of_l2_clip, laplace_epsilon

__all__ = [
    "clip_to_norm", "differential_prototypes", "privacy_budget", "DomainUpload", "ServerPrototypes", "DomainPrototypes",
    "aggregate_prototypes", "complete_prototypes", "aggregate_prototypes_reference",
    "global_prototype_loss", "local_prototype_loss", "local_prototype_loss_reference",
]


# --------------------------------------------------------------------------------------
# Differential prototypes (Eqs. 3–6)
# --------------------------------------------------------------------------------------
def clip_to_norm(vectors: torch.Tensor, max_norm: float) -> torch.Tensor:
    """``c / max(1, ‖c‖₂ / β)`` per row of ``(K, D)``: every row ends with norm ≤ β."""
    norms = vectors.norm(dim=-1, keepdim=True)
    return vectors / torch.clamp(norms / max_norm, min=1.0)


def differential_prototypes(centroids: torch.Tensor, clip_norm: float, laplace_scale: float,
                            generator: torch.Generator, ldp: bool = True) -> torch.Tensor:
    """Eq. 5: ``clip(c, β) + Lap(0, η)`` per coordinate; ``(K, D)`` → ``(K, D)``."""
    clipped = clip_to_norm(centroids, clip_norm)
    return add_laplace(clipped, laplace_scale, generator) if ldp else clipped


def privacy_budget(clip_norm: float, laplace_scale: float, dim: int) -> Dict[str, float]:
    """The budget the paper states (``2β/η``) and the Laplace mechanism's for a ``dim``-vector.

    ``paper_epsilon`` treats the L2 bound 2β as if it were the L1 sensitivity; a clipped
    ``d``-vector has L1 sensitivity up to ``2β√d`` (:func:`~fedlib.engine.privacy.l1_sensitivity_of_l2_clip`),
    which gives ``mechanism_epsilon`` per released prototype and round.
    """
    if laplace_scale <= 0:
        return {"paper_epsilon": math.inf, "mechanism_epsilon": math.inf}
    return {"paper_epsilon": 2.0 * clip_norm / laplace_scale,
            "mechanism_epsilon": laplace_epsilon(l1_sensitivity_of_l2_clip(clip_norm, dim), laplace_scale)}


@dataclass(frozen=True)
class DomainUpload:
    """What one domain sends the server in a round (Eqs. 4–6): representative clusters only.

    ``K'`` below is the number of representative clusters (those holding at least one
    overlapping user), ``K' ≤ K``.

    Attributes:
        prototypes: ``(K', D)`` differential prototypes ĉ of the representative clusters, in
            increasing cluster id (:attr:`cluster_ids`).
        overlap_cluster: ``(n_o,) int64`` cluster of every overlapping user, i.e. the sets
            ``O_k = {u < n_o : cluster(u) = k}`` of Eq. 6 written as one label per user. This is
            what lets the server read each overlapping user's exact cross-domain co-membership.
        cluster_sizes: ``(K',)`` users per representative cluster (the code sends sizes; the
            'avg' rule ignores them).
        num_clusters: ``K``, the shared hyperparameter (not a message: no bytes).

    Build it with :meth:`representative` from all ``K`` prototypes of a domain.
    """

    prototypes: torch.Tensor
    overlap_cluster: torch.Tensor
    cluster_sizes: torch.Tensor
    num_clusters: int

    def __post_init__(self):
        ids = self.cluster_ids
        if self.prototypes.shape[0] != ids.numel() or self.cluster_sizes.shape[0] != ids.numel():
            raise ValueError(f"an upload carries one prototype and one size per representative cluster: the overlap "
                             f"labels name {ids.numel()} cluster(s) {ids.tolist()}, got {self.prototypes.shape[0]} "
                             f"prototype(s) and {self.cluster_sizes.shape[0]} size(s); build it with "
                             "DomainUpload.representative(all_prototypes, overlap_cluster, all_sizes)")
        if ids.numel() and not 0 <= int(ids[0]) <= int(ids[-1]) < self.num_clusters:
            raise ValueError(f"overlap labels must be cluster ids in [0, {self.num_clusters}), got {ids.tolist()}")

    @property
    def cluster_ids(self) -> torch.Tensor:
        """``(K',) int64``: the representative clusters, i.e. the distinct labels of Eq. 6, sorted."""
        return torch.unique(self.overlap_cluster)

    @classmethod
    def representative(cls, prototypes: torch.Tensor, overlap_cluster: torch.Tensor,
                       cluster_sizes: torch.Tensor) -> "DomainUpload":
        """Eq. 4: keep the rows of ``(K, D)`` prototypes and ``(K,)`` sizes whose cluster holds an
        overlapping user (a label in ``overlap_cluster (n_o,)``); the others stay in the domain."""
        ids = torch.unique(overlap_cluster)
        return cls(prototypes[ids], overlap_cluster, cluster_sizes[ids], int(prototypes.shape[0]))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.prototypes, self.overlap_cluster, self.cluster_sizes))


@dataclass(frozen=True)
class ServerPrototypes:
    """What the server sends one domain (Eqs. 13–14): rows for the domain's representative clusters.

    Attributes:
        cluster_ids: ``(K',)`` the domain's representative clusters (it sent them; not a message).
        global_prototypes: ``(K', D)`` g_k.
        local_prototypes: ``(K', M, D)`` l_k^m (row ``m`` = the chosen prototype of domain ``m``;
            zeros where ``local_mask`` is False).
        local_mask: ``(K', M) bool``: which local slots exist (domain ``m`` has a slot when one
            of its clusters shares an overlapping user with cluster ``k``).
    """

    cluster_ids: torch.Tensor
    global_prototypes: torch.Tensor
    local_prototypes: torch.Tensor
    local_mask: torch.Tensor

    def nbytes(self) -> int:
        kept = self.local_prototypes[self.local_mask]
        return (self.global_prototypes.numel() * self.global_prototypes.element_size()
                + kept.numel() * kept.element_size())


@dataclass(frozen=True)
class DomainPrototypes:
    """What a domain trains with (Eqs. 7–9): the server's rows completed with its own prototypes.

    Attributes:
        global_prototypes: ``(K, D)``; local_prototypes: ``(K, M, D)``; local_mask: ``(K, M) bool``.
    A cluster without overlapping users has its own noisy prototype as global prototype and
    as its only local prototype, in its own domain's column (the code's rule; the paper does
    not say).
    """

    global_prototypes: torch.Tensor
    local_prototypes: torch.Tensor
    local_mask: torch.Tensor


def _co_membership(uploads: Sequence[DomainUpload], num_clusters: int) -> List[List[torch.Tensor]]:
    """``links[i][m]``: ``(K, K) bool``, cluster k of domain i shares an overlapping user with cluster k' of m."""
    onehots = [F.one_hot(u.overlap_cluster, num_clusters).to(torch.float64) for u in uploads]  # (n_o, K)
    return [[(a.T @ b) > 0 for b in onehots] for a in onehots]


def _dense(upload: DomainUpload) -> torch.Tensor:
    """``(K, D)``: the upload's rows at their cluster ids, zeros for the clusters that were not sent.

    Eqs. 12–14 only link clusters that share an overlapping user, so a zero row is never
    read: every weight and similarity that touches it is masked out.
    """
    out = upload.prototypes.new_zeros((upload.num_clusters, upload.prototypes.shape[1]))
    out[upload.cluster_ids] = upload.prototypes
    return out


def aggregate_prototypes(uploads: Sequence[DomainUpload]) -> List[ServerPrototypes]:
    """Eqs. 12–14 for every domain and representative cluster at once (vectorised over clusters).

    Returns one :class:`ServerPrototypes` per domain, in the order of ``uploads``: rows for
    that domain's representative clusters only (:func:`complete_prototypes` adds the rest).
    """
    _check_uploads(uploads)
    num_domains = len(uploads)
    k = uploads[0].num_clusters
    links = _co_membership(uploads, k)
    protos = [_dense(u) for u in uploads]
    unit = [F.normalize(p, dim=-1) for p in protos]
    out = []
    for i in range(num_domains):
        link_rows = torch.stack([links[i][m] for m in range(num_domains)], 1)  # (K, M, K')
        weights = link_rows.to(protos[i].dtype)
        total = sum(weights[:, m, :] @ protos[m] for m in range(num_domains))  # (K, D)
        count = weights.sum((1, 2)).unsqueeze(-1)  # (K, 1)  = |C̄_k|
        global_p = total / count.clamp_min(1)
        local_p = torch.zeros(k, num_domains, protos[i].shape[1], dtype=protos[i].dtype, device=protos[i].device)
        for m in range(num_domains):
            similarity = unit[i] @ unit[m].T  # (K, K')
            similarity = similarity.masked_fill(~links[i][m], -math.inf)
            local_p[:, m] = protos[m][similarity.argmax(-1)]
        mask = link_rows.any(-1)  # (K, M)
        local_p = local_p * mask.unsqueeze(-1)
        ids = uploads[i].cluster_ids
        out.append(ServerPrototypes(ids, global_p[ids], local_p[ids], mask[ids]))
    return out


def complete_prototypes(received: ServerPrototypes, own_prototypes: torch.Tensor, domain_index: int
                        ) -> DomainPrototypes:
    """The domain's side of Eqs. 13–14: the server's rows plus its own clusters that were not sent.

    Args:
        received: from :func:`aggregate_prototypes` for this domain.
        own_prototypes: ``(K, D)`` the domain's differential prototypes of every cluster.
        domain_index: this domain's column ``i`` in the ``M`` local slots.
    """
    k, dim = own_prototypes.shape
    num_domains = received.local_mask.shape[1]
    global_p = own_prototypes.clone()
    global_p[received.cluster_ids] = received.global_prototypes
    local_p = own_prototypes.new_zeros((k, num_domains, dim))
    local_p[received.cluster_ids] = received.local_prototypes
    mask = torch.zeros(k, num_domains, dtype=torch.bool, device=own_prototypes.device)
    mask[received.cluster_ids] = received.local_mask
    kept_home = torch.ones(k, dtype=torch.bool, device=own_prototypes.device)
    kept_home[received.cluster_ids] = False
    local_p[kept_home, domain_index] = own_prototypes[kept_home]
    mask[kept_home, domain_index] = True
    return DomainPrototypes(global_p, local_p, mask)


def aggregate_prototypes_reference(prototypes: Sequence[torch.Tensor], overlap_clusters: Sequence[torch.Tensor]
                                   ) -> List[DomainPrototypes]:
    """The code's server, one cluster at a time, on **all** ``K`` prototypes of every domain.

    Args:
        prototypes: per domain ``(K, D)`` differential prototypes (what the code uploads).
        overlap_clusters: per domain ``(n_o,)`` cluster label of every overlapping user.
    Returns what each domain trains with; :func:`aggregate_prototypes` on the representative
    uploads followed by :func:`complete_prototypes` must give the same (tests check it).
    """
    if len(prototypes) < 2 or len(prototypes) != len(overlap_clusters):
        raise ValueError(f"need one (K, D) prototype matrix and one label vector per domain, at least two domains; "
                         f"got {len(prototypes)} and {len(overlap_clusters)}")
    num_domains = len(prototypes)
    k, dim = prototypes[0].shape
    out = []
    for i, own in enumerate(prototypes):
        global_p = own.clone()
        local_p = torch.zeros(k, num_domains, dim, dtype=own.dtype)
        mask = torch.zeros(k, num_domains, dtype=torch.bool)
        for cluster in range(k):
            members = torch.nonzero(overlap_clusters[i] == cluster).flatten()
            if members.numel() == 0:
                local_p[cluster, i] = own[cluster]
                mask[cluster, i] = True
                continue
            candidates = []
            for m, other in enumerate(prototypes):
                linked = sorted(set(overlap_clusters[m][members].tolist()))
                candidates += [other[c] for c in linked]
                best, best_sim = None, -math.inf
                for c in linked:
                    sim = float(F.cosine_similarity(own[cluster], other[c], dim=0))
                    if sim > best_sim:
                        best, best_sim = c, sim
                local_p[cluster, m] = other[best]
                mask[cluster, m] = True
            global_p[cluster] = torch.stack(candidates).mean(0)
        out.append(DomainPrototypes(global_p, local_p, mask))
    return out


def _check_uploads(uploads: Sequence[DomainUpload]) -> None:
    if len(uploads) < 2:
        raise ValueError(f"prototype aggregation needs at least two domains, got {len(uploads)}")
    sizes = {(u.num_clusters, int(u.prototypes.shape[1])) for u in uploads}
    overlaps = {int(u.overlap_cluster.numel()) for u in uploads}
    if len(sizes) != 1 or len(overlaps) != 1:
        raise ValueError(f"every domain must use the same K and prototype size D and send one label per overlapping "
                         f"user; got (K, D) {sorted(sizes)} and overlap counts {sorted(overlaps)}")


# --------------------------------------------------------------------------------------
# Prototype contrastive losses (Eqs. 7–9)
# --------------------------------------------------------------------------------------
def global_prototype_loss(user_vectors: torch.Tensor, clusters: torch.Tensor, global_prototypes: torch.Tensor,
                          tau: float) -> torch.Tensor:
    """Eqs. 7–8: mean InfoNCE of ``(B, D)`` users against ``(K, D)`` global prototypes.

    The positive is the prototype of the user's cluster ``clusters (B,)``; the negatives are
    the other ``K − 1``. Equals cross-entropy over ``cos(e_u, g_k)/τ``.
    """
    logits = F.normalize(user_vectors, dim=-1) @ F.normalize(global_prototypes, dim=-1).T / tau  # (B, K)
    return F.cross_entropy(logits, clusters)


def local_prototype_loss(user_vectors: torch.Tensor, clusters: torch.Tensor, local_prototypes: torch.Tensor,
                         local_mask: torch.Tensor, tau: float) -> torch.Tensor:
    """Eq. 9: mean over users of ``−(1/M_k) Σ_m log e^{s_m} / (e^{s_m} + Σ_negatives e^{s})``.

    Args:
        user_vectors: ``(B, D)``; clusters: ``(B,)`` the user's cluster k.
        local_prototypes: ``(K, M, D)``; local_mask: ``(K, M)`` existing slots.
    The positives are the existing slots of cluster k; the negatives every existing slot of
    every other cluster.
    """
    unit_users = F.normalize(user_vectors, dim=-1)
    unit_protos = F.normalize(local_prototypes, dim=-1)
    sims = torch.einsum("bd,kmd->bkm", unit_users, unit_protos) / tau  # (B, K, M)
    own = F.one_hot(clusters, local_prototypes.shape[0]).bool().unsqueeze(-1)  # (B, K, 1)
    exists = local_mask.unsqueeze(0)  # (1, K, M)
    negatives = sims.masked_fill(~(exists & ~own), -math.inf).flatten(1)  # (B, K·M)
    negative_lse = torch.logsumexp(negatives, dim=1, keepdim=True)  # (B, 1)
    positives = sims[torch.arange(len(clusters)), clusters]  # (B, M)
    positive_mask = local_mask[clusters]  # (B, M)
    log_prob = positives - torch.logaddexp(positives, negative_lse)  # (B, M)
    per_user = -(log_prob * positive_mask).sum(1) / positive_mask.sum(1).clamp_min(1)
    return per_user.mean()


def local_prototype_loss_reference(user_vectors, clusters, local_prototypes, local_mask, tau) -> torch.Tensor:
    """Eq. 9 one user and one positive at a time (the reference for :func:`local_prototype_loss`)."""
    total = 0.0
    k_count, m_count = local_mask.shape
    for b in range(user_vectors.shape[0]):
        e, k = user_vectors[b], int(clusters[b])
        negatives = [F.cosine_similarity(e, local_prototypes[j, m], dim=0) / tau
                     for j in range(k_count) for m in range(m_count) if j != k and local_mask[j, m]]
        terms = []
        for m in range(m_count):
            if not local_mask[k, m]:
                continue
            positive = F.cosine_similarity(e, local_prototypes[k, m], dim=0) / tau
            denominator = torch.exp(positive) + sum(torch.exp(n) for n in negatives)
            terms.append(torch.log(torch.exp(positive) / denominator))
        total = total - torch.stack(terms).mean()
    return total / user_vectors.shape[0]
