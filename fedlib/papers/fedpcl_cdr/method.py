r"""FedPCL-CDR: domains as clients, noisy cluster prototypes as the only thing that crosses.

Reference:
    "FedPCL-CDR: A Federated Prototype-based Contrastive Learning Framework for
    Privacy-Preserving Cross-domain Recommendation", L. Wang, Q. Wu, M. Xu, arXiv:2409.03294
    (https://arxiv.org/abs/2409.03294); public code https://github.com/Lili1013/FedPCL_CDR
    (``run_ldp.py``, ``models/local_model.py``, ``models/kmeans_ldp.py``).

Notation: ``M`` domains (the clients), domain ``i`` with ``U_i`` users and ``I_i`` items;
users ``0 .. n_o − 1`` are the overlapping users, the same people in every domain; ``d``
the embedding size, ``K`` clusters, ``τ`` the temperature::

    E_l = Â E_{l−1}                                  LightGCN on ID (and review) embeddings   (1)
    e_u = comb_l(E_l^{id})[u] (+ relu(W comb_l(E_l^{rev}))[u])                               (2)
    T^i = KMeans_K({e_u : u ∈ domain i})            all users, not only the overlapping ones (3)
    C^i = clusters holding overlapping users                                                  (4)
    ĉ_k = clip(c_k, β) + Lap(0, η)^d,   clip(c, β) = c / max(1, ‖c‖/β)                       (5)
    O_k^i = overlapping users of cluster k                                                    (6)
    L_glob = −log softmax_k(cos(e_u, g_k)/τ)[k(u)]                                        (7, 8)
    L_loc  = −(1/M_k) Σ_m log e^{s_m} / (e^{s_m} + Σ_{j≠k(u), m'} e^{cos(e_u, l_j^{m'})/τ}),
             s_m = cos(e_u, l_{k(u)}^m)/τ                                                    (9)
    L_prd  = BCE(MLP([e_u; e_v]), r_uv)                 one sampled negative per positive   (10)
    L      = L_prd + α (L_glob + L_loc)                                                    (11)
    C̄_k^i = {ĉ_{k'}^{i'} : O_{k'}^{i'} ∩ O_k^i ≠ ∅}    candidates, every domain i'          (12)
    g_k^i = mean(C̄_k^i)                                                                   (13)
    l_k^{i,m} = argmax_{ĉ ∈ C̄_k^i from domain m} cos(ĉ, ĉ_k^i)                            (14)

**What leaves a domain (Eq. 4).** Only the *representative* prototypes, those of clusters
holding at least one overlapping user, are uploaded (:class:`DomainUpload`), with the
overlapping users' cluster labels (Eq. 6) and the representative clusters' sizes. The rows
are in increasing cluster id, so the ids themselves are the distinct labels of Eq. 6 and
cost no bytes. The public code uploads all ``K`` noisy prototypes, but its server reads a
non-representative one only to send it straight back to its own domain, as that cluster's
global prototype and only local prototype (Eqs. 12–14 only ever link clusters that share an
overlapping user). Here that prototype never leaves: the domain fills those rows in itself
(:func:`complete_prototypes`), which gives the code's numbers exactly while the bytes and the
reconstruction attack (Table 5) see only what is sent. Noise is drawn for all ``K`` centroids
in one call, so the noise stream, and every training number, is the one of the code's rule;
the noise on a prototype that stays home protects nothing and changes nothing.

Readings we chose (each one is a flag or a documented constant; the notebook lists them):

* **Layer combination** ``layer_combine``: ``"sum"`` of ``E_0 .. E_L`` (the code, default) or
  ``"concat"`` (the paper's text for Eq. 2). The ID and review parts are summed (the paper:
  "Here, we use the element-wise sum aggregation method").
* **Predictor**: ``2D → 64 → 32 → 16 → 1`` with Linear → ReLU → BatchNorm per hidden layer (the
  code; the paper says only "MLP layers").
* **Which users enter L_glob / L_loc**: the user of each positive row of the batch (the code
  uses every row, so each user counts twice, once with the negative item).
* **Local loss form**: the paper's mean over ``m`` of per-positive InfoNCE terms (the code
  sums the softmax mass of the ``M`` positives inside one log).
* **Local training**: ``local_epochs`` full passes per round (Algorithm 1, lines 10–11); the
  code trains a single mini-batch per round (``batches_per_round=1`` reproduces it).
* **Cluster labels** for the CL terms come from the k-means of the previous round (as the
  code; there are no prototypes before the first aggregation, Algorithm 1 line 13).
* **Privacy budget**: the paper reports ``ε = 2β/η`` (4 at β = 0.2, η = 0.1). The Laplace
  mechanism on a ``d``-vector clipped to L2 norm β has L1 sensitivity ``2β√d``, so the pure
  LDP guarantee per released prototype is ``2β√d/η`` (32 at d = 64): :func:`privacy_budget`.

Simulation: the domains are few (2–3) and large, so each is trained in turn (Algorithm 1
line 4); within a domain the work is batched (one propagation per step, one k-means per
round, all candidates of all users scored in one pass). The server aggregation is
vectorised over clusters (:func:`aggregate_prototypes`); :func:`aggregate_prototypes_reference`
is the plain per-cluster loop of the code, and tests check both agree.

Files: the prototype and privacy math of Eqs. 4–9 (messages, server, losses) is in
:mod:`fedlib.papers.fedpcl_cdr.prototypes` and the k-means of Eq. 3 in
:mod:`fedlib.baselines.cross_domain.user_clusters` (P²DTR shares it), both re-exported here; this module
holds the config, the domain model, Algorithm 1 as the trainer's :class:`FedPCLAlgorithm` and
:func:`train_fedpcl_cdr`.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import DomainSplit, InteractionSplit
from fedlib.engine.algorithm import RoundContext, RoundReport
from fedlib.engine.trainer import RunResult
from fedlib.baselines.registry import cross_domain, register
from fedlib.baselines.cross_domain.cdr_common import CrossDomainAlgorithm, RunSummary, checkpoint_config_of, train_with
from fedlib.baselines.cross_domain.user_clusters import cluster_users  # Eq. 3; re-exported with the prototype math below
from fedlib.models.lightgcn import normalized_adjacency, symmetric_spmm
# The prototype and privacy math; re-exported, so that this module stays the method's one entry point.
from fedlib.papers.fedpcl_cdr.prototypes import (DomainPrototypes, DomainUpload, ServerPrototypes, aggregate_prototypes,
                                                 aggregate_prototypes_reference, clip_to_norm, complete_prototypes,
                                                 differential_prototypes, global_prototype_loss, local_prototype_loss,
                                                 local_prototype_loss_reference, privacy_budget)

__all__ = [
    "FedPCLConfig", "VARIANTS", "variant_config", "DomainModel", "FedPCLState", "FedPCLAlgorithm", "train_fedpcl_cdr",
    # from prototypes.py (cluster_users from fedlib.baselines.cross_domain.user_clusters)
    "DomainUpload", "ServerPrototypes", "DomainPrototypes", "cluster_users", "clip_to_norm", "differential_prototypes",
    "privacy_budget", "aggregate_prototypes", "complete_prototypes", "aggregate_prototypes_reference",
    "global_prototype_loss", "local_prototype_loss", "local_prototype_loss_reference",
]

LAYER_COMBINES = ("sum", "concat")
SELECTIONS = ("valid", "test")


@dataclass(frozen=True)
class FedPCLConfig:
    """Every setting of one FedPCL-CDR run (paper values as defaults; the code's in ``utils/para_parser.py``).

    Attributes:
        dim: ID embedding size d (64).
        num_layers: LightGCN layers L (3).
        layer_combine: ``"sum"`` (code) or ``"concat"`` (paper text) of ``E_0 .. E_L``.
        num_clusters: K (10).
        clip_norm: β, the L2 clipping bound of a prototype (0.2).
        laplace_scale: η, the Laplace scale b per coordinate (0.1; the paper calls it a
            standard deviation, numpy's parameter is the scale).
        ldp: add the Laplace noise (``False`` = the "w/o LDP" ablation; clipping stays).
        use_global, use_local: the global / local prototype CL terms ("w/o glob-proto",
            "w/o loc-proto").
        alpha: α, the CL weight (0.01). tau: τ (0.2).
        lr, weight_decay: Adam, one persistent optimiser per domain (1e-3, 1e-4).
        batch_size: positives per mini-batch (paper 256, code 512), each with
            ``train_negatives`` uniform negatives (1).
        local_epochs: E, passes over the domain's training positives per round.
        batches_per_round: cap on mini-batches per round (``None`` = full epochs; the code: 1).
        rounds: maximum rounds R. patience: stop after this many evaluations without a better
            selection score. eval_every: rounds between evaluations.
        selection: ``"valid"`` (ours) or ``"test"`` (the code: best mean test HR@10).
        kmeans_restarts: sklearn ``n_init``.
        seed: initialisation, batches, negatives, k-means and noise.
    """

    dim: int = 64
    num_layers: int = 3
    layer_combine: str = "sum"
    num_clusters: int = 10
    clip_norm: float = 0.2
    laplace_scale: float = 0.1
    ldp: bool = True
    use_global: bool = True
    use_local: bool = True
    alpha: float = 0.01
    tau: float = 0.2
    lr: float = 1e-3
    weight_decay: float = 1e-4
    batch_size: int = 256
    train_negatives: int = 1
    local_epochs: int = 1
    batches_per_round: Optional[int] = None
    rounds: int = 100
    patience: int = 10
    eval_every: int = 1
    selection: str = "valid"
    kmeans_restarts: int = 1
    seed: int = 0

    def __post_init__(self):
        if self.layer_combine not in LAYER_COMBINES:
            raise ValueError(f"layer_combine must be one of {LAYER_COMBINES}, got {self.layer_combine!r}")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")
        for name in ("dim", "num_clusters", "batch_size", "train_negatives", "local_epochs", "rounds", "patience",
                     "eval_every", "kmeans_restarts"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_layers < 0:
            raise ValueError(f"num_layers must be >= 0, got {self.num_layers}")
        if self.batches_per_round is not None and self.batches_per_round < 1:
            raise ValueError(f"batches_per_round must be None (full epochs) or >= 1, got {self.batches_per_round}")
        for name in ("clip_norm", "tau"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("laplace_scale", "alpha", "lr", "weight_decay"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


VARIANTS: Dict[str, Dict[str, object]] = {
    "FedPCL-CDR": {},
    "w/o loc-proto": {"use_local": False},
    "w/o glob-proto": {"use_global": False},
    "w/o LDP": {"ldp": False},
    # Not a paper row: no prototype term at all, i.e. every domain trains alone.
    "w/o CL": {"use_local": False, "use_global": False},
}
"""Table 3's ablations as flags on the one implementation (``variant_config``)."""


def variant_config(variant: str, base: Optional[FedPCLConfig] = None) -> FedPCLConfig:
    """``base`` (default :class:`FedPCLConfig`) with the flags of a Table 3 row."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown FedPCL-CDR variant {variant!r}; expected one of {list(VARIANTS)}")
    return replace(base or FedPCLConfig(), **VARIANTS[variant])


# --------------------------------------------------------------------------------------
# Local model (Eqs. 1, 2, 10)
# --------------------------------------------------------------------------------------
def _combine_layers(layers: Sequence[torch.Tensor], how: str) -> torch.Tensor:
    """``"sum"``: ``E^{(0)} + … + E^{(K)}`` added left to right (the same bits as stacking and
    summing, without the ``(K + 1, N, d)`` copy: ~3x faster forward and backward); else concatenated.

    The sum is accumulated in place into the first ``E^{(0)} + E^{(1)}`` (the same bits again):
    one ``(N, d)`` allocation per step instead of ``K``, whose fresh pages cost more than the adds.
    """
    if how != "sum":
        return torch.cat(list(layers), dim=-1)
    if len(layers) == 1:
        return layers[0]
    total = layers[0] + layers[1]
    for layer in layers[2:]:
        total.add_(layer)  # an add's backward needs neither input: in place is safe for autograd
    return total


class DomainModel(nn.Module):
    """One domain's model: LightGCN over ID (and optional frozen review) embeddings + MLP.

    Args:
        split: the domain's split; its training pairs are the graph.
        config: sizes and the layer combination.
        review_users, review_items: optional frozen ``(U, r)`` / ``(I, r)`` review embeddings
            (Doc2Vec in the paper). Propagated like the IDs, combined, then
            ``relu(Linear)`` to the ID part's size and added to it (Eq. 2).
        generator: init randomness (Xavier-uniform ID tables, as the code).

    ``D`` below is the representation size: ``d`` (sum) or ``(L + 1) d`` (concat).
    """

    def __init__(self, split: InteractionSplit, config: FedPCLConfig, *, review_users: Optional[torch.Tensor] = None,
                 review_items: Optional[torch.Tensor] = None, generator: Optional[torch.Generator] = None):
        super().__init__()
        generator = generator if generator is not None else torch.Generator().manual_seed(config.seed)
        self.num_users, self.num_items = split.num_users, split.num_items
        self.num_layers, self.layer_combine = config.num_layers, config.layer_combine
        d = config.dim
        self.user_emb = nn.Parameter(_xavier((self.num_users, d), generator))
        self.item_emb = nn.Parameter(_xavier((self.num_items, d), generator))
        with warnings.catch_warnings():  # "CSR support is in beta": forward and backward are covered by tests
            warnings.simplefilter("ignore", UserWarning)
            # CSR: about 1.5x faster than COO for the forward and backward sparse products on CPU.
            adjacency = normalized_adjacency(split.train, self.num_users, self.num_items).to_sparse_csr()
        self.register_buffer("adjacency", adjacency, persistent=False)
        width = d if config.layer_combine == "sum" else (config.num_layers + 1) * d
        self.representation_size = width
        if (review_users is None) != (review_items is None):
            raise ValueError("pass both review_users and review_items, or neither")
        self.has_reviews = review_users is not None
        if self.has_reviews:
            if review_users.shape[0] != self.num_users or review_items.shape[0] != self.num_items:
                raise ValueError(f"review embeddings must have {self.num_users} user and {self.num_items} item rows, "
                                 f"got {tuple(review_users.shape)} and {tuple(review_items.shape)}")
            r = review_users.shape[1]
            self.register_buffer("review_users", review_users.detach().float().clone())
            self.register_buffer("review_items", review_items.detach().float().clone())
            self.review_in_width = r if config.layer_combine == "sum" else (config.num_layers + 1) * r
        sizes = [2 * width, 64, 32, 16]
        hidden: List[nn.Module] = []
        # nn.Linear draws its init from the global RNG: fork it so a run depends on its seed only.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch.randint(0, 2 ** 31 - 1, (1,), generator=generator)))
            for a, b in zip(sizes[:-1], sizes[1:]):
                hidden += [nn.Linear(a, b), nn.ReLU(), nn.BatchNorm1d(b)]
            self.predictor = nn.Sequential(*hidden, nn.Linear(sizes[-1], 1))
            self.review_proj = nn.Linear(self.review_in_width, width) if self.has_reviews else None

    def _propagate_table(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Eq. 1 on ``(U, ·)`` user and ``(I, ·)`` item inputs → ``(U + I, D)`` node table, users first."""
        layer = torch.cat([users, items], 0)  # (U + I, ·)
        layers = [layer]
        for _ in range(self.num_layers):
            layer = symmetric_spmm(self.adjacency, layer)  # Â is symmetric: backward reuses it
            layers.append(layer)
        return _combine_layers(layers, self.layer_combine)

    def _propagate(self, users: torch.Tensor, items: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        total = self._propagate_table(users, items)
        return total[: self.num_users], total[self.num_users:]

    def propagate(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """Eqs. 1–2: ``(users (U, D), items (I, D))`` representations of every node."""
        users, items = self._propagate(self.user_emb, self.item_emb)
        if self.has_reviews:
            review_u, review_i = self._propagate(self.review_users, self.review_items)
            users = users + torch.relu(self.review_proj(review_u))
            items = items + torch.relu(self.review_proj(review_i))
        return users, items

    def propagate_rows(self, users: torch.Tensor, items: torch.Tensor, anchors: Optional[torch.Tensor] = None
                       ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """Eqs. 1–2 read at a training step's rows: ``(n,)`` user and ``(n,)`` item ids of the pairs
        → ``(n, D)`` user and ``(n, D)`` item vectors, and ``(m, D)`` vectors of the ``(m,)``
        ``anchors`` users (the CL terms' users; ``None`` → ``None``).

        The values and gradients of :meth:`propagate` then indexing (:meth:`propagate_rows_reference`,
        tested). Without review embeddings the pairs' rows are gathered from the ``(U + I, D)``
        node table in one index: its backward fills one ``(U + I, D)`` zero gradient, where
        splitting the table first filled a user and an item one, two ``(U + I, D)`` ones for the
        split, and added those (the user and item rows are disjoint and each index accumulates
        its repeats in the same order, so the bits agree).
        """
        if self.has_reviews:
            return self.propagate_rows_reference(users, items, anchors)
        nodes = self._propagate_table(self.user_emb, self.item_emb)  # (U + I, D)
        pair_rows = nodes[torch.cat([users, items + self.num_users])]  # (2n, D)
        count = users.shape[0]
        return pair_rows[:count], pair_rows[count:], None if anchors is None else nodes[anchors]

    def propagate_rows_reference(self, users: torch.Tensor, items: torch.Tensor,
                                 anchors: Optional[torch.Tensor] = None
                                 ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """:meth:`propagate_rows` as first written: every node's representation, then index."""
        all_users, all_items = self.propagate()
        return all_users[users], all_items[items], None if anchors is None else all_users[anchors]

    def pair_logits(self, user_vectors: torch.Tensor, item_vectors: torch.Tensor) -> torch.Tensor:
        """``(..., D)`` user and item vectors → ``(...)`` logits of the MLP predictor (Eq. 10)."""
        shape = user_vectors.shape[:-1]
        joined = torch.cat([user_vectors, item_vectors], -1).reshape(-1, 2 * self.representation_size)
        return self.predictor(joined).reshape(shape)

    @torch.no_grad()
    def score_candidates(self, users: torch.Tensor, candidates: torch.Tensor,
                         nodes: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        """``(n,)`` users and ``(n, C)`` candidate items → ``(n, C)`` logits (call in eval mode)."""
        all_users, all_items = nodes if nodes is not None else self.propagate()
        u = all_users[users].unsqueeze(1).expand(-1, candidates.shape[1], -1)  # (n, C, D)
        return self.pair_logits(u, all_items[candidates])


def _xavier(shape, generator: torch.Generator) -> torch.Tensor:
    bound = math.sqrt(6.0 / (shape[0] + shape[1]))
    return (torch.rand(shape, generator=generator) * 2 - 1) * bound


# --------------------------------------------------------------------------------------
# One domain: local update, prototypes, evaluation
# --------------------------------------------------------------------------------------
@dataclass
class _Domain:
    name: str
    split: InteractionSplit
    model: DomainModel
    optimizer: torch.optim.Optimizer
    sampler: NegativeSampler
    assignment: Optional[torch.Tensor] = None  # (U,) cluster of each user from the last round
    own_prototypes: Optional[torch.Tensor] = None  # (K, D) differential prototypes of every cluster (stay home)
    received: Optional[DomainPrototypes] = None  # what the CL terms use (server rows + own non-representative)


def _local_update(domain: _Domain, config: FedPCLConfig, rng: np.random.Generator, device) -> Dict[str, float]:
    """Algorithm 1 lines 10–21: E epochs of BCE (+ α·CL once prototypes exist)."""
    model, train = domain.model, domain.split.train
    model.train()
    use_cl = domain.received is not None and domain.assignment is not None and (config.use_global or config.use_local)
    totals = {"loss_prd": 0.0, "loss_global": 0.0, "loss_local": 0.0}
    steps = 0
    for _ in range(config.local_epochs):
        order = rng.permutation(len(train))
        batches = range(0, len(order), config.batch_size)
        for start in batches:
            if config.batches_per_round is not None and steps >= config.batches_per_round:
                break
            rows = order[start: start + config.batch_size]
            users = train.users[rows]
            negatives = domain.sampler.sample(users, config.train_negatives, rng)  # (B, n)
            all_users = np.concatenate([users, np.repeat(users, config.train_negatives)])
            all_items = np.concatenate([train.items[rows], negatives.reshape(-1)])
            labels = np.concatenate([np.ones(len(rows)), np.zeros(negatives.size)])
            u = torch.as_tensor(all_users, device=device)
            v = torch.as_tensor(all_items, device=device)
            y = torch.as_tensor(labels, dtype=torch.float32, device=device)
            anchor_users = torch.as_tensor(users, device=device) if use_cl else None
            user_vectors, item_vectors, anchors = model.propagate_rows(u, v, anchor_users)
            loss_prd = F.binary_cross_entropy_with_logits(model.pair_logits(user_vectors, item_vectors), y)
            loss = loss_prd
            if use_cl:
                clusters = domain.assignment[anchor_users]
                if config.use_global:
                    loss_g = global_prototype_loss(anchors, clusters, domain.received.global_prototypes, config.tau)
                    loss = loss + config.alpha * loss_g
                    totals["loss_global"] += loss_g.item()
                if config.use_local:
                    loss_l = local_prototype_loss(anchors, clusters, domain.received.local_prototypes,
                                                  domain.received.local_mask, config.tau)
                    loss = loss + config.alpha * loss_l
                    totals["loss_local"] += loss_l.item()
            domain.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            domain.optimizer.step()
            totals["loss_prd"] += loss_prd.item()
            steps += 1
        if config.batches_per_round is not None and steps >= config.batches_per_round:
            break
    return {key: value / max(steps, 1) for key, value in totals.items()} | {"steps": steps}


def _make_upload(domain: _Domain, config: FedPCLConfig, num_overlap: int, round_index: int,
                 generator: torch.Generator) -> DomainUpload:
    """Algorithm 1 lines 22–25 (Eqs. 3–6) for one domain: only representative prototypes are sent.

    Noise is drawn for all ``K`` centroids at once (one draw per coordinate, the code's
    stream); the non-representative ones stay in ``domain.own_prototypes``.
    """
    domain.model.eval()
    with torch.no_grad():
        user_nodes, _ = domain.model.propagate()
    centroids, assignment = cluster_users(user_nodes, config.num_clusters, seed=config.seed * 100_003 + round_index,
                                          restarts=config.kmeans_restarts)
    domain.assignment = assignment
    domain.own_prototypes = differential_prototypes(centroids, config.clip_norm, config.laplace_scale, generator,
                                                    ldp=config.ldp)
    sizes = torch.bincount(assignment, minlength=config.num_clusters)
    return DomainUpload.representative(domain.own_prototypes, assignment[:num_overlap].clone(), sizes)


# --------------------------------------------------------------------------------------
# Algorithm 1 as the trainer's algorithm
# --------------------------------------------------------------------------------------
@dataclass
class FedPCLState:
    """The server's and the domains' state between rounds (per-domain lists in ``split.domains`` order).

    Attributes:
        models, optimizers: each domain's :class:`DomainModel` and Adam.
        rng: batches and negatives; noise: the LDP noise of the prototypes.
        assignments: ``(U,)`` cluster of each user from the last round (``None`` before round 1).
        own_prototypes: ``(K, D)`` each domain's differential prototypes (they stay home).
        received: each domain's :class:`DomainPrototypes` (what its CL terms use).
        uploads, prototypes: the last round's :class:`DomainUpload` and :class:`ServerPrototypes`.
        bytes_up, bytes_down: bytes sent so far.
    """

    models: List[DomainModel]
    optimizers: List[torch.optim.Optimizer]
    rng: np.random.Generator
    noise: torch.Generator
    assignments: List[Optional[torch.Tensor]]
    own_prototypes: List[Optional[torch.Tensor]]
    received: List[Optional[DomainPrototypes]]
    uploads: List[DomainUpload] = field(default_factory=list)
    prototypes: List[ServerPrototypes] = field(default_factory=list)
    bytes_up: int = 0
    bytes_down: int = 0


class FedPCLAlgorithm(CrossDomainAlgorithm):
    """Algorithm 1: one trainer round = local updates of every domain, uploads, server prototypes."""

    def __init__(self, split: DomainSplit, config: FedPCLConfig, device, ks: Sequence[int],
                 reviews: Optional[Mapping[str, Tuple[torch.Tensor, torch.Tensor]]] = None):
        self.split, self.config, self.seed, self.device, self.ks = split, config, int(config.seed), device, tuple(ks)
        self.reviews = reviews
        self.samplers = [NegativeSampler(split[name].train, split[name].num_items) for name in split.domains]

    def init(self, seed: int) -> FedPCLState:
        config = self.config
        rng = np.random.default_rng([config.seed, 9002])
        noise = torch.Generator(device="cpu").manual_seed(config.seed + 9002)
        models, optimizers = [], []
        for index, name in enumerate(self.split.domains):
            part = self.split[name]
            review_u, review_i = (self.reviews or {}).get(name, (None, None))
            model = DomainModel(part, config, review_users=review_u, review_items=review_i,
                                generator=torch.Generator().manual_seed(config.seed * 1000 + index)).to(self.device)
            models.append(model)
            # foreach: the same bits as the default per-tensor loop on CPU, in fewer passes over the tables
            # (fused=True is faster but moves the frozen "w/o LDP" tiny cell beyond 1e-6)
            optimizers.append(torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay,
                                               foreach=True))
        count = len(models)
        return FedPCLState(models, optimizers, rng, noise, [None] * count, [None] * count, [None] * count)

    def domains(self, state: FedPCLState) -> List[_Domain]:
        """The per-domain view the round's functions work on (shares the state's tensors and modules)."""
        return [_Domain(name, self.split[name], state.models[i], state.optimizers[i], self.samplers[i],
                        state.assignments[i], state.own_prototypes[i], state.received[i])
                for i, name in enumerate(self.split.domains)]

    def run_round(self, state: FedPCLState, plan: int, context: RoundContext) -> Tuple[FedPCLState, RoundReport]:
        config, round_index = self.config, context.index + 1
        domains = self.domains(state)
        uploads: List[DomainUpload] = []
        logged: Dict[str, float] = {}
        for domain in domains:                                                      # Algorithm 1, line 4
            losses = _local_update(domain, config, state.rng, self.device)          # lines 10-21
            uploads.append(_make_upload(domain, config, self.split.num_overlap_users, round_index,
                                        state.noise))                               # lines 22-25
            logged.update({f"{domain.name}/{key}": value for key, value in losses.items()})
        prototypes = aggregate_prototypes(uploads)                                  # line 7: Eqs. 12-14
        for index, (domain, received) in enumerate(zip(domains, prototypes)):
            domain.received = complete_prototypes(received, domain.own_prototypes, index)
        logged["bytes_up"] = sum(u.nbytes() for u in uploads)
        logged["bytes_down"] = sum(p.nbytes() for p in prototypes)
        state = replace(state, assignments=[d.assignment for d in domains],
                        own_prototypes=[d.own_prototypes for d in domains], received=[d.received for d in domains],
                        uploads=uploads, prototypes=prototypes, bytes_up=state.bytes_up + logged["bytes_up"],
                        bytes_down=state.bytes_down + logged["bytes_down"])
        loss = float(np.mean([losses for key, losses in logged.items() if key.endswith("/loss_prd")]))
        return state, RoundReport(train_loss=loss, logged=logged)

    def scorers(self, state: FedPCLState):
        return {name: _scorer(model) for name, model in zip(self.split.domains, state.models)}

    def load_state(self, saved: Mapping[str, Any]) -> FedPCLState:
        """The generic load, then the messages back into their dataclasses."""
        state = super().load_state(saved)
        def typed(cls, value):
            return cls(**value) if isinstance(value, dict) else value
        return replace(state, received=[typed(DomainPrototypes, r) for r in state.received],
                       uploads=[typed(DomainUpload, u) for u in state.uploads],
                       prototypes=[typed(ServerPrototypes, p) for p in state.prototypes])


def train_fedpcl_cdr(split: DomainSplit, config: FedPCLConfig = FedPCLConfig(), *,
                     reviews: Optional[Mapping[str, Tuple[torch.Tensor, torch.Tensor]]] = None,
                     device=None, progress: Optional[Callable[[int, Dict[str, float]], None]] = None,
                     ks: Sequence[int] = (5, 10), checkpointer=None, on_round_end=None) -> RunResult:
    """Algorithm 1 on a :class:`DomainSplit` (2 or more domains), trained by the one trainer.

    ``split``: from :func:`fedlib.data.protocols.fedpcl_cdr.build` (or the synthetic generator);
    ``config``: see :class:`FedPCLConfig` (:func:`variant_config` gives Table 3's rows; it selects
    on ``config.selection``); ``reviews``: optional ``{domain: (user (U, r), item (I, r))}`` frozen
    review embeddings. The other arguments and the family's artifacts:
    :func:`~fedlib.baselines.cross_domain.cdr_common.train_with`; ``models``: each domain's
    :class:`DomainModel`; ``scalars``: the privacy budgets, total bytes, ``rounds_run``. FedPCL-CDR's
    own artifacts: the last round's ``uploads`` (:class:`DomainUpload`), what the server sent
    (``prototypes``, :class:`ServerPrototypes`), what each domain trained with
    (``domain_prototypes``, :class:`DomainPrototypes`), the cluster labels (``assignments``) and the
    reconstruction attack's pairs (``transmitted``). Its numbers per domain:
    :func:`~fedlib.baselines.cross_domain.cdr_common.selected_blocks`, ``audit_blocks``,
    ``history_rows``, ``flat_metrics``.
    """
    def summarise(algorithm: FedPCLAlgorithm, run: RunResult) -> RunSummary:
        state = run.state
        domains = algorithm.domains(state)
        scalars = {**privacy_budget(config.clip_norm, config.laplace_scale, domains[0].model.representation_size),
                   "bytes_up": state.bytes_up, "bytes_down": state.bytes_down, "rounds_run": run.round_index}
        return RunSummary(scalars=scalars, models={d.name: d.model for d in domains},
                          artifacts={"uploads": state.uploads, "prototypes": state.prototypes,
                                     "domain_prototypes": {d.name: d.received for d in domains},
                                     "assignments": {d.name: d.assignment for d in domains},
                                     "transmitted": _transmitted(domains, state.uploads)})

    return train_with(lambda device: FedPCLAlgorithm(split, config, device, ks, reviews), config, method="FedPCL-CDR",
                      rounds=config.rounds, summarise=summarise, device=device, progress=progress,
                      checkpointer=checkpointer, select_on=config.selection, on_round_end=on_round_end,
                      checkpoint_config=lambda c: {**checkpoint_config_of(c), "reviews": sorted(reviews or {})})


def _transmitted(domains: Sequence[_Domain], uploads: Sequence[DomainUpload]) -> Dict[str, Dict[str, torch.Tensor]]:
    """Per domain, what left it about each user whose cluster was sent: the noisy prototype of
    the user's cluster (``sent (U', D)``) next to the user's true final representation
    (``private (U', D)``), for the ``U'`` users of representative clusters (``users (U',)``).
    These are the pairs of the reconstruction attack (Table 5); nothing about the other users
    left the domain."""
    out = {}
    for domain, upload in zip(domains, uploads):
        domain.model.eval()
        with torch.no_grad():
            private, _ = domain.model.propagate()
        row_of_cluster = torch.full((upload.num_clusters,), -1, dtype=torch.int64, device=domain.assignment.device)
        row_of_cluster[upload.cluster_ids] = torch.arange(len(upload.cluster_ids), device=domain.assignment.device)
        rows = row_of_cluster[domain.assignment]
        users = torch.nonzero(rows >= 0).flatten()
        out[domain.name] = {"sent": upload.prototypes[rows[users]].cpu(), "private": private[users].cpu(),
                            "users": users.cpu()}
    return out


def _scorer(model: DomainModel):
    """A :data:`~fedlib.baselines.cross_domain.cdr_common.PairScorer` of the model as it is now (eval mode, one propagation)."""
    model.eval()
    with torch.no_grad():
        nodes = model.propagate()
    return lambda users, candidates: model.score_candidates(users, candidates, nodes)


# The registry's cross-domain FedPCL-CDR (fedlib.baselines.registry): FedPCLConfig names its
# validation-or-test choice ``selection``.
register("FedPCL-CDR", "cross-domain", FedPCLAlgorithm.__module__, paper="fedpcl_cdr", config=FedPCLConfig,
         train=train_fedpcl_cdr)(
    cross_domain(FedPCLAlgorithm, FedPCLConfig, select_on_field="selection"))
