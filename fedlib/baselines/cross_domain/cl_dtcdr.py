r"""CL-DTCDR: intra-domain and inter-domain contrastive learning for dual-target CDR (centralised baseline).

Reference:
    Jinhu Lu, Guohao Sun, Xiu Fang, Jian Yang, Wei He. "A Contrastive Learning Framework for
    Dual-Target Cross-Domain Recommendation." ACM Multimedia (MM '23), 2023, pp. 6332–6339.
    DOI 10.1145/3581783.3612250. No public code that we know of. FedPCL-CDR
    (Wang, Wu, Xu, arXiv:2409.03294, Table 2) cites it as introducing "both intra-domain and
    inter-domain CL tasks to address the data-sparsity issue and facilitate efficient
    knowledge transfer".

**The mechanism that defines it: two contrastive tasks on top of a dual-target recommender.**
(i) *Intra-domain CL*: in each domain, two augmented views of the user-item graph give two
embeddings of every user and item; InfoNCE makes the two views of a node agree and different
nodes disagree ("more representative user and item embeddings"). (ii) *Inter-domain CL*: a
user's embedding in one domain is pulled towards a positive in the other domain and pushed away
from other users there. The paper's positive is "the user and her/his most similar user between
domains", which is what lets users *outside* the overlap take part in the transfer.

Notation: domains ``a`` and ``b`` (``b`` = the other one), ``n_o`` overlapping users (ids
``0 .. n_o − 1`` in both), ``Â`` a domain's normalised user-item adjacency, ``d`` dimensions,
``B_a`` the distinct users (``I_a`` items) of the batch in domain ``a``::

    Z^a = mean_{l=0..L} Â^l E^a                      LightGCN on the domain's graph           (1)
    z̃_u^a = ω^a ⊙ z_u^a + (1 − ω^a) ⊙ z_u^b  (u < n_o),  z_u^a otherwise,  ω^a = σ(w^a) ∈ (0,1)^d
                                                      element-wise attention (GA-DTCDR)       (2)
    ŷ_ui^a = MLP_a([z̃_u^a ; z_i^a])                  2d → 64 → 32 → 1, BCE                    (3)
    Z'^a, Z''^a = Eq. 1 on two edge-dropped graphs    drop ratio ρ, redrawn every epoch        (4)
    InfoNCE(x, y; τ) = −mean_n log softmax_m(cos(x_n, y_m)/τ)[n]
    L_intra = mean_a [InfoNCE(Z'^a_{B_a}, Z''^a_{B_a}; τ₁) + InfoNCE(Z'^a_{I_a}, Z''^a_{I_a}; τ₁)]   (5)
    p_a(u)  = u  if u < n_o;  else the most similar user of the other domain (below)          (6)
    L_inter = mean_a InfoNCE(Z^a_{B_a}, Z^b_{p_a(B_a)}; τ₂)   in-batch negatives               (7)
    L = BCE + λ₁ L_intra + λ₂ L_inter                                                         (8)

"Most similar user" for a non-overlapping user ``u`` of domain ``a`` (``inter_positive``):

* ``"overlap_neighbour"`` (default): the overlapping user ``o`` with the largest
  ``cos(z_u^a, z_o^a)``, i.e. similarity measured in the domain where both are observed;
  ``u``'s positive is ``o``'s embedding in the other domain ``z_o^b``;
* ``"nearest"``: the user ``v`` of the other domain with the largest ``cos(z_u^a, z_v^b)``
  (a cross-space similarity, only meaningful once L_inter has aligned the spaces).

Positives are recomputed from the current embeddings (no gradient) at the start of every
epoch. In Eq. 7, two anchors that share a positive are not each other's negatives.

Settings the paper's summary does not fix (our choices, all in the config): SGL-style edge dropout
(ρ = 0.1, one pair of views per epoch), τ₁ = τ₂ = 0.2 (the FedPCL-CDR temperature), λ₁ = λ₂ = 0.1,
2 LightGCN layers (mean of layers), cosine similarities. Switch a task off with its weight 0.
Cost: three LightGCN propagations per domain and step (the graph and its two views, as SGL).

Simplifications on this machine:

* **No text.** The original builds its embeddings from ratings *and* side information (review /
  description documents, as its predecessor GA-DTCDR, through a graph embedding); our splits
  carry only implicit interactions, so the graph is the user-item graph and the embeddings are
  trained ID tables.
* The base recommender is LightGCN + MLP trained with BCE on one sampled negative per positive
  (the FedPCL-CDR baseline setting), instead of the original's embedding pipeline; the
  element-wise attention of Eq. 2 keeps the GA-DTCDR-style combination of a common user's two
  domain embeddings.
* Batches mix both domains' training positives (one optimiser, one loss); intra-CL uses the
  batch's distinct users and positive items, inter-CL the batch's distinct users.
* Exactly two domains (dual-target).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import DomainSplit, Pairs
from fedlib.engine.algorithm import RoundContext, RoundReport
from fedlib.engine.trainer import RunResult
from fedlib.baselines.cross_domain.cdr_common import (CrossDomainConfig, CrossDomainAlgorithm, JointModelState, check_training_loop,
                                       Progress, RunSummary, train_with)
from fedlib.models.lightgcn import lightgcn_propagate, normalized_adjacency

__all__ = [
    "CLDTCDRConfig", "INTER_POSITIVES", "info_nce", "drop_edges", "inter_domain_positives", "CLDTCDRModel",
    "train_cl_dtcdr",
]

INTER_POSITIVES = ("overlap_neighbour", "nearest")


@dataclass(frozen=True)
class CLDTCDRConfig(CrossDomainConfig):
    """Every setting of one CL-DTCDR run.

    Attributes:
        dim: embedding size d (64). num_layers: LightGCN layers L (2).
        edge_drop: ρ, the share of training edges each augmented view drops (0.1).
        intra_weight, inter_weight: λ₁, λ₂ of Eq. 8 (0.1 each; 0 switches a task off).
        intra_tau, inter_tau: τ₁, τ₂ (0.2 each).
        inter_positive: ``"overlap_neighbour"`` or ``"nearest"`` (module docstring).
        fuse_overlap: combine an overlapping user's two domain embeddings (Eq. 2).
        lr, weight_decay: Adam (1e-3, 0).
        batch_size: positives per step from both domains together (256), each with
            ``train_negatives`` uniform negatives (1).
        epochs, patience, eval_every, select_on: (100, 10, 1, ``"valid"``).
        seed: initialisation, batches, negatives and views.
    """

    num_layers: int = 2
    edge_drop: float = 0.1
    intra_weight: float = 0.1
    inter_weight: float = 0.1
    intra_tau: float = 0.2
    inter_tau: float = 0.2
    inter_positive: str = "overlap_neighbour"
    fuse_overlap: bool = True
    weight_decay: float = 0.0
    batch_size: int = 256
    train_negatives: int = 1
    epochs: int = 100

    def __post_init__(self):
        check_training_loop(self)
        if self.inter_positive not in INTER_POSITIVES:
            raise ValueError(f"inter_positive must be one of {INTER_POSITIVES}, got {self.inter_positive!r}")
        if self.num_layers < 0:
            raise ValueError(f"num_layers must be >= 0, got {self.num_layers}")
        if not 0.0 <= self.edge_drop < 1.0:
            raise ValueError(f"edge_drop must lie in [0, 1) (a view must keep some edges), got {self.edge_drop}")
        for name in ("intra_tau", "inter_tau"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("intra_weight", "inter_weight"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0 (0 switches the term off), got {getattr(self, name)}")


# --------------------------------------------------------------------------------------
# The two contrastive tasks
# --------------------------------------------------------------------------------------
def info_nce(anchors: torch.Tensor, positives: torch.Tensor, tau: float,
             positive_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``−mean_n log softmax_m(cos(anchors_n, positives_m)/τ)[n]`` with in-batch negatives.

    Args:
        anchors, positives: ``(n, d)``; row ``n`` of ``positives`` is the positive of anchor ``n``
            and every other row is a negative.
        positive_ids: optional ``(n,)`` identity of each positive; rows ``m ≠ n`` with the same id
            as row ``n`` are removed from its negatives (they are the same node).
    """
    logits = F.normalize(anchors, dim=-1) @ F.normalize(positives, dim=-1).T / tau  # (n, n)
    if positive_ids is not None:
        same = positive_ids.unsqueeze(0) == positive_ids.unsqueeze(1)
        same.fill_diagonal_(False)
        logits = logits.masked_fill(same, -math.inf)
    return F.cross_entropy(logits, torch.arange(anchors.shape[0], device=anchors.device))


def drop_edges(train: Pairs, num_users: int, num_items: int, ratio: float,
               rng: np.random.Generator) -> torch.Tensor:
    """Eq. 4's augmentation: normalised adjacency of the graph without a random ``ratio`` of its edges.

    Degrees are recomputed on the kept edges (as SGL). Returns a sparse CSR ``(U + I, U + I)``
    matrix (symmetric: :meth:`CLDTCDRModel.propagate` uses the transpose-free backward).
    """
    keep = rng.random(len(train)) >= ratio
    kept = Pairs.from_arrays(train.users[keep], train.items[keep], num_users)
    return normalized_adjacency(kept, num_users, num_items, layout="csr")


@torch.no_grad()
def inter_domain_positives(own: torch.Tensor, other: torch.Tensor, num_overlap: int, how: str,
                           chunk_size: int = 4096) -> torch.Tensor:
    """Eq. 6: ``(U_a,) int64`` index (into the other domain's users) of every user's positive.

    Args:
        own: ``(U_a, d)`` user embeddings of this domain; other: ``(U_b, d)`` of the other.
        num_overlap: ``n_o``; users below it are their own positive.
        how: ``"overlap_neighbour"`` (most similar overlapping user, measured in this domain) or
            ``"nearest"`` (most similar user of the other domain, measured across domains).
    """
    if how not in INTER_POSITIVES:
        raise ValueError(f"how must be one of {INTER_POSITIVES}, got {how!r}")
    if num_overlap < 1 and how == "overlap_neighbour":
        raise ValueError("inter_positive='overlap_neighbour' needs at least one overlapping user; "
                         "use 'nearest' or inter_weight=0")
    out = torch.arange(own.shape[0], device=own.device)
    targets = F.normalize(own[:num_overlap] if how == "overlap_neighbour" else other, dim=-1)
    unit = F.normalize(own, dim=-1)
    for start in range(num_overlap, own.shape[0], chunk_size):
        stop = min(start + chunk_size, own.shape[0])
        out[start:stop] = (unit[start:stop] @ targets.T).argmax(-1)
    return out


# --------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------
class CLDTCDRModel(nn.Module):
    """Both domains: ID tables, LightGCN graphs, element-wise attention and MLP predictors.

    Args:
        split: two domains; their training pairs are the graphs.
        config: sizes.
        generator: initialisation randomness (tables ``N(0, 0.1²)``; ``nn.Linear`` layers are
            built under a forked global RNG seeded from it).
    """

    def __init__(self, split: DomainSplit, config: CLDTCDRConfig, generator: torch.Generator):
        super().__init__()
        if len(split.domains) != 2:
            raise ValueError(f"CL-DTCDR is dual-target: it needs exactly 2 domains, got {split.domains}")
        d = config.dim
        self.domains, self.num_layers, self.fuse_overlap = tuple(split.domains), config.num_layers, config.fuse_overlap
        self.num_overlap = split.num_overlap_users
        self.num_users = [split[name].num_users for name in self.domains]
        self.num_items = [split[name].num_items for name in self.domains]
        self.user_emb = nn.ParameterList([nn.Parameter(torch.randn(n, d, generator=generator) * 0.1)
                                          for n in self.num_users])
        self.item_emb = nn.ParameterList([nn.Parameter(torch.randn(n, d, generator=generator) * 0.1)
                                          for n in self.num_items])
        self.attention = nn.Parameter(torch.zeros(2, d))  # w^a of Eq. 2; σ(0) = ½: the two domains averaged
        for index, name in enumerate(self.domains):
            adjacency = normalized_adjacency(split[name].train, self.num_users[index], self.num_items[index],
                                             layout="csr")
            self.register_buffer(f"adjacency_{index}", adjacency, persistent=False)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch.randint(0, 2 ** 31 - 1, (1,), generator=generator)))
            self.predictors = nn.ModuleList([
                nn.Sequential(nn.Linear(2 * d, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))
                for _ in self.domains])

    def propagate(self, domain: int, adjacency: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Eq. 1 on ``adjacency`` (default: the domain's training graph) → ``(users (U, d), items (I, d))``.

        Graphs are symmetric CSR (:func:`~fedlib.models.lightgcn.symmetric_spmm`): the backward
        reuses ``Â`` instead of building ``Âᵀ`` at every step.
        """
        adjacency = adjacency if adjacency is not None else getattr(self, f"adjacency_{domain}")
        return lightgcn_propagate(adjacency, self.user_emb[domain], self.item_emb[domain], self.num_layers, "mean",
                                  symmetric=True)

    def fused_users(self, own: torch.Tensor, other: torch.Tensor, domain: int) -> torch.Tensor:
        """Eq. 2: ``(U_a, d)`` with the overlapping rows mixed with their other-domain embedding."""
        if not self.fuse_overlap or self.num_overlap == 0:
            return own
        n_o = self.num_overlap
        weight = torch.sigmoid(self.attention[domain])  # (d,)
        mixed = weight * own[:n_o] + (1 - weight) * other[:n_o]
        return torch.cat([mixed, own[n_o:]], dim=0)

    def pair_logits(self, domain: int, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """``(..., d)`` user and item vectors → ``(...)`` logits (Eq. 3)."""
        joined = torch.cat([users, items], dim=-1)
        return self.predictors[domain](joined.reshape(-1, joined.shape[-1])).reshape(joined.shape[:-1])


# --------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------
@dataclass
class CLDTCDRState(JointModelState):
    """:class:`~fedlib.baselines.cross_domain.cdr_common.JointModelState` plus the last epoch's inter-domain
    positives per domain (``[(n_o,) int64] * 2``; empty before the first epoch or without Eq. 7)."""

    positives: List[torch.Tensor] = field(default_factory=list)


class CLDTCDRAlgorithm(CrossDomainAlgorithm):
    """CL-DTCDR as the trainer's algorithm: one round = one epoch over both domains' pairs, mixed."""

    def __init__(self, split: DomainSplit, config: CLDTCDRConfig, device, ks: Sequence[int]):
        self.split, self.config, self.seed, self.device, self.ks = split, config, int(config.seed), device, tuple(ks)
        names = split.domains
        self.samplers = [NegativeSampler(split[name].train, split[name].num_items) for name in names]
        self.row_domain = np.concatenate([np.full(len(split[name].train), a) for a, name in enumerate(names)])
        self.row_user = np.concatenate([split[name].train.users for name in names])
        self.row_item = np.concatenate([split[name].train.items for name in names])

    def init(self, seed: int) -> CLDTCDRState:
        config = self.config
        rng = np.random.default_rng([config.seed, 6332])
        model = CLDTCDRModel(self.split, config, torch.Generator().manual_seed(config.seed + 6332)).to(self.device)
        optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        return CLDTCDRState(model, optimizer, rng)

    def run_round(self, state: CLDTCDRState, plan: int, context: RoundContext) -> Tuple[CLDTCDRState, RoundReport]:
        config, device, split, model, rng = self.config, self.device, self.split, state.model, state.rng
        names, samplers = split.domains, self.samplers
        row_domain, row_user, row_item = self.row_domain, self.row_user, self.row_item
        use_intra, use_inter = config.intra_weight > 0, config.inter_weight > 0
        model.train()
        views = []
        if use_intra:  # one pair of augmented graphs per domain and epoch (SGL)
            views = [[drop_edges(split[name].train, model.num_users[a], model.num_items[a], config.edge_drop, rng)
                      .to(device) for _ in range(2)] for a, name in enumerate(names)]
        positives = state.positives
        if use_inter:
            with torch.no_grad():
                users_now = [model.propagate(a)[0] for a in range(2)]
            positives = [inter_domain_positives(users_now[a], users_now[1 - a], split.num_overlap_users,
                                                config.inter_positive) for a in range(2)]
            state.positives = positives
        totals = {"loss": 0.0, "loss_bce": 0.0, "loss_intra": 0.0, "loss_inter": 0.0}
        steps = 0
        order = rng.permutation(row_domain.size)
        for begin in range(0, order.size, config.batch_size):
            rows = order[begin: begin + config.batch_size]
            nodes = [model.propagate(a) for a in range(2)]  # [(users (U, d), items (I, d))] Eq. 1
            fused = [model.fused_users(nodes[a][0], nodes[1 - a][0], a) for a in range(2)]
            loss_bce, loss_intra, loss_inter, count = 0.0, 0.0, 0.0, 0
            for a in range(2):
                mine = rows[row_domain[rows] == a]
                if mine.size == 0:
                    continue
                users = row_user[mine]
                negatives = samplers[a].sample(users, config.train_negatives, rng)  # (B_a, n)
                u = torch.as_tensor(np.concatenate([users, np.repeat(users, config.train_negatives)]), device=device)
                i = torch.as_tensor(np.concatenate([row_item[mine], negatives.reshape(-1)]), device=device)
                y = torch.as_tensor(np.concatenate([np.ones(mine.size), np.zeros(negatives.size)]),
                                    dtype=torch.float32, device=device)
                # Summed, divided once by the row count: both domains weigh by their rows.
                loss_bce = loss_bce + F.binary_cross_entropy_with_logits(
                    model.pair_logits(a, fused[a][u], nodes[a][1][i]), y, reduction="sum")
                count += y.numel()
                distinct_users = torch.as_tensor(np.unique(users), device=device)
                if use_intra:                                                     # Eq. 5
                    first, second = model.propagate(a, views[a][0]), model.propagate(a, views[a][1])
                    distinct_items = torch.as_tensor(np.unique(row_item[mine]), device=device)
                    loss_intra = loss_intra + 0.5 * (
                        info_nce(first[0][distinct_users], second[0][distinct_users], config.intra_tau)
                        + info_nce(first[1][distinct_items], second[1][distinct_items], config.intra_tau))
                if use_inter:                                                     # Eq. 7
                    target = positives[a][distinct_users]
                    loss_inter = loss_inter + 0.5 * info_nce(nodes[a][0][distinct_users], nodes[1 - a][0][target],
                                                             config.inter_tau, positive_ids=target)
            loss_bce = loss_bce / count
            loss = loss_bce + config.intra_weight * loss_intra + config.inter_weight * loss_inter
            state.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            state.optimizer.step()
            for key, value in (("loss", loss), ("loss_bce", loss_bce), ("loss_intra", loss_intra),
                               ("loss_inter", loss_inter)):
                totals[key] += value.item() if torch.is_tensor(value) else float(value)
            steps += 1
        logged = {key: value / max(steps, 1) for key, value in totals.items()}
        return state, RoundReport(train_loss=logged["loss"], logged=logged)

    def scorers(self, state: CLDTCDRState):
        return dict(zip(self.split.domains, _scorers(state.model, self.device)))


def train_cl_dtcdr(split: DomainSplit, config: CLDTCDRConfig = CLDTCDRConfig(), *, device=None,
                   progress: Progress = None, ks: Sequence[int] = (5, 10), checkpointer=None,
                   on_round_end=None) -> RunResult:
    """Train CL-DTCDR on both domains at once and evaluate each domain on its candidates.

    ``split``: two domains, users ``0 .. n_o − 1`` shared; ``config``: :class:`CLDTCDRConfig`; the
    other arguments and the family's artifacts: :func:`~fedlib.baselines.cross_domain.cdr_common.train_with`.
    ``models``: the joint model under every domain name; ``scalars``: ``epochs_run``,
    ``num_parameters``; own artifact ``inter_positives``: the last epoch's inter-domain positives per domain.
    """
    def summarise(algorithm: CLDTCDRAlgorithm, run: RunResult) -> RunSummary:
        model, positives, names = run.state.model, run.state.positives, split.domains
        return RunSummary(scalars={"epochs_run": run.round_index,
                                   "num_parameters": sum(p.numel() for p in model.parameters())},
                          models={name: model for name in names},
                          artifacts={"inter_positives": {name: (positives[a].cpu() if positives else None)
                                                         for a, name in enumerate(names)}})

    return train_with(lambda device: CLDTCDRAlgorithm(split, config, device, ks), config, method="CL-DTCDR",
                      rounds=config.epochs, summarise=summarise, device=device, progress=progress,
                      checkpointer=checkpointer, on_round_end=on_round_end)


def _scorers(model: CLDTCDRModel, device):
    """One :data:`~fedlib.baselines.cross_domain.cdr_common.PairScorer` per domain (one propagation each)."""
    model.eval()
    with torch.no_grad():
        nodes = [model.propagate(a) for a in range(2)]
        users = [model.fused_users(nodes[a][0], nodes[1 - a][0], a) for a in range(2)]

    def scorer_for(a: int):
        def score(user_ids: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                u = users[a][user_ids.to(device)].unsqueeze(1).expand(-1, candidates.shape[1], -1)  # (n, C, d)
                return model.pair_logits(a, u, nodes[a][1][candidates.to(device)])
        return score

    return [scorer_for(0), scorer_for(1)]
