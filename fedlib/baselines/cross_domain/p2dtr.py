r"""P²DTR, a privacy-preserving CDR baseline of FedPCL-CDR's Table 2 (dual-target, :mod:`fedlib.baselines.cross_domain.pp_cdr`).

Lin, Huang, Zhang, Xu, Liu, Liao, Wang, Wang, Tan. "Enhancing Dual-Target Cross-Domain
Recommendation with Federated Privacy-Preserving Learning." IJCAI 2024, pp. 2153–2161
(P²DTR; cited as "Chen et al., 2023b" in FedPCL-CDR's baseline list, as Lin et al. 2024 in
its related work).

**Mechanism: private set intersection (PSI) of the user sets, then prototype-based
federated learning whose averaged prototypes refine the users' embeddings inside each
domain.**

* PSI (simulated, :func:`private_set_intersection`): both domains hash their user
  identifiers with HMAC-SHA256 under a key only they share and exchange the digests; each
  learns which of its own users are in the intersection and a common order for them
  (sorted digests), nothing about the other users.
* Each round, after local training, domain ``i`` clusters the embeddings of its PSI users
  with k-means into ``K`` prototypes ``c_k^i`` (labels ``ℓ^i``) and uploads
  ``(c^i, ℓ^i)``; the server matches ``A``'s clusters to ``B``'s by the co-membership of the
  shared users (Hungarian assignment ``π`` maximising ``|{u : ℓ^A_u = k, ℓ^B_u = π(k)}|``) and
  returns the averaged prototypes::

      ḡ_k = (c_k^A + c_{π(k)}^B) / 2          (A's cluster k and B's cluster π(k))       (8)

* Refinement (our simplification of constrained-dominant-set propagation)::

      a(u) = ℓ^i_u if u is a PSI user, else argmin_k ‖p_u − c_k^i‖   (nearest own prototype)  (9)
      h_u  = (1 − α) p_u + α ḡ_{a(u)}                           ḡ fixed within a round   (10)

  Before the first aggregation ``h_u = p_u``.

Simplification on this machine (besides the family's, :mod:`fedlib.baselines.cross_domain.pp_cdr`)
-----------------------------------------------------------------------------------
* **P²DTR's PSI is a simulation**: a keyed hash is not a secure PSI (a party holding the key
  can test any guessed identifier); real PSI uses a cryptographic protocol (e.g.
  Diffie–Hellman or oblivious-transfer based) that we do not run. Constrained-dominant-set
  propagation is replaced by the nearest-prototype assignment (9) and the fixed mixing (10);
  the cluster labels of the shared users are uploaded for the matching (the server learns
  which shared users share a cluster, as in FedPCL-CDR's uploads). Prototypes carry no
  noise (the paper's protection is PSI + aggregation).
"""
from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from fedlib.data.splits import DomainSplit
from fedlib.engine.trainer import RunResult
from fedlib.baselines.cross_domain.cdr_common import CrossDomainConfig, RunSummary, check_training_loop, train_with
from fedlib.baselines.cross_domain.user_clusters import cluster_users
from fedlib.baselines.cross_domain.pp_cdr import (DualTargetAlgorithm, DualTargetState, Progress, bce_step, check_dual_target,
                                   mean_logs, normal_table, dual_target_checkpoint_config, training_batches)

__all__ = ["P2DTRConfig", "user_identities", "private_set_intersection", "match_clusters", "average_prototypes",
           "nearest_prototype", "P2DTRDomain", "P2DTRAlgorithm", "train_p2dtr"]


@dataclass(frozen=True)
class P2DTRConfig(CrossDomainConfig):
    """One P²DTR run.

    Attributes:
        dim: d (64). lr, weight_decay, batch_size, train_negatives: as :class:`~fedlib.baselines.cross_domain.pricdr.PriCDRConfig`.
        num_clusters: K prototypes per domain (10, FedPCL-CDR's K).
        propagation_weight: α in Eq. 10 (0.3).
        kmeans_restarts: scikit-learn ``n_init`` (1).
        epochs (= rounds, one local epoch each), patience, eval_every, select_on, seed (also
            keys the simulated PSI).
    """

    weight_decay: float = 0.0
    batch_size: int = 256
    train_negatives: int = 1
    num_clusters: int = 10
    propagation_weight: float = 0.3
    kmeans_restarts: int = 1
    epochs: int = 100

    def __post_init__(self):
        check_training_loop(self)
        for key in ("num_clusters", "kmeans_restarts"):
            if int(getattr(self, key)) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if not 0 <= self.propagation_weight <= 1:
            raise ValueError(f"propagation_weight (α) must be in [0, 1], got {self.propagation_weight}")


def user_identities(split: DomainSplit, domain: str) -> List[str]:
    """Each local user id's identifier as its owner knows it (the raw id of the data files).

    Falls back to the split's convention when the raw ids are missing: ids below
    ``num_overlap_users`` are the same person in every domain, the others are local.
    """
    part = split[domain]
    raw = part.extra.get("raw_users")
    if raw is not None and len(raw) == part.num_users:
        return [str(value) for value in raw]
    return [f"shared:{u}" if u < split.num_overlap_users else f"{domain}:{u}" for u in range(part.num_users)]


def private_set_intersection(ids_a: Sequence, ids_b: Sequence, key: bytes) -> Tuple[np.ndarray, np.ndarray]:
    """Simulated PSI: each party learns only its own rows of the intersection, in a common order.

    Both parties compute ``HMAC-SHA256(key, id)`` of their identifiers and exchange the
    digests; the intersection of the digests, sorted, gives the common order. (A real PSI
    protocol is cryptographic; a keyed hash is not secure against a key holder guessing ids.)

    Returns:
        ``(rows_a, rows_b)`` int64 arrays of equal length: ``ids_a[rows_a[r]] == ids_b[rows_b[r]]``.
    Raises:
        ValueError: an identifier appears twice in one party's list.
    """
    def digests(ids: Sequence, party: str) -> Dict[bytes, int]:
        table = {hmac.new(key, str(x).encode("utf-8"), hashlib.sha256).digest(): row for row, x in enumerate(ids)}
        if len(table) != len(ids):
            raise ValueError(f"party {party}'s identifiers must be unique, got {len(ids) - len(table)} duplicate(s)")
        return table

    table_a, table_b = digests(ids_a, "A"), digests(ids_b, "B")
    common = sorted(table_a.keys() & table_b.keys())
    return (np.array([table_a[h] for h in common], dtype=np.int64),
            np.array([table_b[h] for h in common], dtype=np.int64))


def match_clusters(labels_a: torch.Tensor, labels_b: torch.Tensor, num_clusters: int) -> torch.Tensor:
    """``(K,)`` ``π``: B's cluster for each of A's, maximising the shared users both put together.

    ``labels_a``, ``labels_b``: ``(n,)`` cluster of each PSI user (same rows) in A and in B.
    """
    from scipy.optimize import linear_sum_assignment

    k = int(num_clusters)
    co = torch.bincount(labels_a.cpu() * k + labels_b.cpu(), minlength=k * k).reshape(k, k)  # co[k, k']
    rows, cols = linear_sum_assignment(-co.numpy())
    perm = torch.empty(k, dtype=torch.int64)
    perm[torch.as_tensor(rows)] = torch.as_tensor(cols, dtype=torch.int64)
    return perm


def average_prototypes(prototypes_a: torch.Tensor, prototypes_b: torch.Tensor,
                       perm: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Eq. 8: ``ḡ`` for each domain's own cluster order, ``((K, d), (K, d))``."""
    perm = perm.to(prototypes_a.device)
    averaged_a = (prototypes_a + prototypes_b[perm]) / 2
    averaged_b = torch.empty_like(averaged_a)
    averaged_b[perm] = averaged_a
    return averaged_a, averaged_b


def nearest_prototype(vectors: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
    """``(U, d)``, ``(K, d)`` → ``(U,)`` index of the nearest prototype (Euclidean, as k-means)."""
    return torch.cdist(vectors, prototypes).argmin(dim=1)


class P2DTRDomain(nn.Module):
    """One P²DTR client: embeddings and the averaged prototypes of the last round (Eq. 10)."""

    def __init__(self, num_users: int, num_items: int, config: P2DTRConfig, generator: torch.Generator):
        super().__init__()
        d = config.dim
        self.alpha = float(config.propagation_weight)
        self.user_emb = nn.Parameter(normal_table((num_users, d), 0.1, generator))
        self.item_emb = nn.Parameter(normal_table((num_items, d), 0.1, generator))
        self.register_buffer("prototypes", torch.zeros(config.num_clusters, d))  # ḡ, own cluster order
        self.register_buffer("assignment", torch.zeros(num_users, dtype=torch.int64))  # a(u)
        self.has_prototypes = False

    def set_prototypes(self, averaged: torch.Tensor, assignment: torch.Tensor) -> None:
        self.prototypes.copy_(averaged.detach())
        self.assignment.copy_(assignment)
        self.has_prototypes = True

    def user_vectors(self, users: torch.Tensor) -> torch.Tensor:
        """``(B,)`` → ``(B, d)``: ``(1 − α) p_u + α ḡ_{a(u)}`` once prototypes exist."""
        own = self.user_emb[users]
        if not self.has_prototypes:
            return own
        return (1 - self.alpha) * own + self.alpha * self.prototypes[self.assignment[users]]


class P2DTRAlgorithm(DualTargetAlgorithm):
    """P²DTR: PSI once (in the constructor), then rounds of local training, k-means prototypes and
    server averaging. ``state.messages``: the last round's ``uploads`` ``{d: (prototypes (K, d),
    labels (n,))}`` and the ``summarised`` PSI users' embeddings ``{d: (n, d)}``."""

    def __init__(self, split: DomainSplit, config, device, ks: Sequence[int]):
        super().__init__(split, config, device, ks)
        names = self.names
        key = hashlib.sha256(f"p2dtr-psi-key/{config.seed}".encode()).digest()  # shared by the two domains only
        self.rows_a, self.rows_b = private_set_intersection(user_identities(split, names[0]),
                                                            user_identities(split, names[1]), key)
        if self.rows_a.size < config.num_clusters:
            raise ValueError(f"P2DTR clusters the shared users, but the PSI found {self.rows_a.size} < num_clusters="
                             f"{config.num_clusters}; lower num_clusters")
        self.psi_rows = {names[0]: torch.as_tensor(self.rows_a, device=device),
                         names[1]: torch.as_tensor(self.rows_b, device=device)}

    def _build(self) -> DualTargetState:
        config, split = self.config, self.split
        rng = np.random.default_rng([config.seed, 2024])
        models, optimizers = self._models_and_optimizers(
            lambda index, name: P2DTRDomain(split[name].num_users, split[name].num_items, config,
                                            torch.Generator().manual_seed(config.seed * 1000 + index)))
        return DualTargetState(models, optimizers, rng, torch.get_rng_state(),
                               messages={"uploads": {}, "summarised": {}})

    def _epoch(self, state: DualTargetState, epoch: int) -> Dict[str, float]:
        config, names, models, psi_rows = self.config, self.names, state.models, self.psi_rows
        logged: Dict[str, float] = {}
        for name in names:
            model = models[name]
            model.train()
            rows = [bce_step(model, state.optimizers[name], u, v, y, self.device)
                    for u, v, y in training_batches(self.split[name], self.samplers[name], config.batch_size,
                                                     config.train_negatives, state.rng)]
            logged.update(mean_logs(rows, name))
        uploads, summarised = {}, {}
        for index, name in enumerate(names):  # local clustering of the PSI users, then upload
            with torch.no_grad():
                summarised[name] = models[name].user_emb[psi_rows[name]].detach().clone()  # (n, d)
            uploads[name] = cluster_users(summarised[name], config.num_clusters,
                                          seed=config.seed * 100_003 + epoch * 2 + index,
                                          restarts=config.kmeans_restarts)
        state.messages = {"uploads": uploads, "summarised": summarised}
        (protos_a, labels_a), (protos_b, labels_b) = uploads[names[0]], uploads[names[1]]
        perm = match_clusters(labels_a, labels_b, config.num_clusters)  # server
        averaged = dict(zip(names, average_prototypes(protos_a, protos_b, perm)))
        for name in names:  # download, then propagate inside the domain (Eq. 9)
            protos, labels = uploads[name]
            with torch.no_grad():
                assignment = nearest_prototype(models[name].user_emb.detach(), protos)
            assignment[psi_rows[name]] = labels
            models[name].set_prototypes(averaged[name], assignment)
        k, d = protos_a.shape
        logged["bytes_up"] = float(2 * (k * d * 4 + self.rows_a.size * 8))
        logged["bytes_down"] = float(2 * k * d * 4)
        return logged


def train_p2dtr(split: DomainSplit, config: P2DTRConfig = P2DTRConfig(), *, device=None,
                progress: Progress = None, ks: Sequence[int] = (5, 10), checkpointer=None,
                on_round_end=None) -> RunResult:
    """P²DTR: PSI once, then rounds of local training, k-means prototypes and server averaging.

    Arguments and the family's artifacts: :func:`~fedlib.baselines.cross_domain.cdr_common.train_with`;
    ``scalars``: ``psi_size``, ``psi_matches_split`` (1.0 when the PSI found exactly users
    ``0 .. n_o − 1``), bytes; own artifacts: ``psi`` rows, last ``prototypes`` / ``labels``, ``transmitted``.
    """
    check_dual_target(split, "P2DTR")

    def summarise(algorithm: P2DTRAlgorithm, run: RunResult) -> RunSummary:
        names, rounds = list(split.domains), run.round_index
        rows_a, rows_b, psi_rows = algorithm.rows_a, algorithm.rows_b, algorithm.psi_rows
        expected = np.arange(split.num_overlap_users)
        matches = bool(np.array_equal(np.sort(rows_a), expected) and np.array_equal(rows_a, rows_b))
        uploads, summarised = run.state.messages["uploads"], run.state.messages["summarised"]
        transmitted = {}
        for name in names:
            protos, labels = uploads[name]
            order = torch.argsort(psi_rows[name])  # rows in the domain's user-id order
            transmitted[name] = {"sent": protos[labels][order].cpu(), "private": summarised[name][order].cpu()}
        k, d = config.num_clusters, config.dim
        scalars = {"psi_size": float(rows_a.size), "psi_matches_split": float(matches),
                   "bytes_up": float(rounds * 2 * (k * d * 4 + rows_a.size * 8)),
                   "bytes_down": float(rounds * 2 * k * d * 4), "epochs_run": rounds}
        return RunSummary(scalars=scalars, models=run.state.models,
                          artifacts={"psi": {names[0]: rows_a, names[1]: rows_b},
                                     "prototypes": {n: uploads[n][0].cpu() for n in names},
                                     "labels": {n: uploads[n][1].cpu() for n in names}, "transmitted": transmitted})

    return train_with(lambda device: P2DTRAlgorithm(split, config, device, ks), config, method="P2DTR",
                      rounds=config.epochs, summarise=summarise, device=device, progress=progress,
                      checkpointer=checkpointer, checkpoint_config=dual_target_checkpoint_config,
                      on_round_end=on_round_end)
