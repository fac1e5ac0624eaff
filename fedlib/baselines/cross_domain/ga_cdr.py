r"""GA-DTCDR and GA-MTCDR-P: per-domain graph embeddings fused by element-wise attention (centralised).

References:
    GA-DTCDR: Feng Zhu, Yan Wang, Chaochao Chen, Guanfeng Liu, Xiaolin Zheng. "A Graphical and
    Attentional Framework for Dual-Target Cross-Domain Recommendation." IJCAI 2020, pp. 3001–3008.
    Authors' code ``fengzhu1/GA-DTCDR`` (TensorFlow, Node2vec embeddings from ``gensim``).

    GA-MTCDR-P: Feng Zhu, Yan Wang, Jun Zhou, Chaochao Chen, Longfei Li, Guanfeng Liu. "A Unified
    Framework for Cross-Domain and Cross-System Recommendations." IEEE TKDE 35(2):1171–1184, 2023
    (online 2021). DOI: 10.1109/TKDE.2021.3104873, arXiv:2108.07976. The journal extension of
    GA-DTCDR to multiple target domains (MTCDR), with a graph-neural-network embedding and a
    **P**\ ersonalised training strategy.

Both are **centralised** cross-domain models: one process sees every domain's interactions (no
privacy, no communication). FedPCL-CDR's Table 2 uses them as non-private baselines.

Notation: ``M`` domains; domain ``m`` has ``U_m`` users and ``I_m`` items; users ``0 .. n_o − 1``
are the common (overlapping) users, the same people in every domain; ``d`` the embedding size;
``sg`` stop-gradient; ``⊙`` the element-wise product::

    z^m_u, z^m_i = Emb_m(G_m)                  graph embedding of domain m's user-item graph      (1)
    h^m_u = W^m_U z^m_u,   h^m_i = W^m_I z^m_i  domain-specific projections (d × d)                 (2)
    ũ^t_u = Σ_m a^t_{u,m} ⊙ h^m_u              element-wise attention, common users u < n_o        (3)
            a^t_{u,·,k} = softmax_m(α^t_{u,m,k})  one weight per (target t, user, source m, dim k)
    ũ^t_u = h^t_u                              users of domain t only (no counterpart)            (4)
    p^t_u = MLP^t_U(ũ^t_u),  q^t_i = MLP^t_I(h^t_i)   ReLU towers per target domain              (5)
    ŷ^t_{ui} = clamp(cos(p^t_u, q^t_i), ε, 1 − ε)                                                 (6)
    L^t = −Σ [ r̂ log ŷ + (1 − r̂) log(1 − ŷ) ] + λ_o (‖p‖² + ‖q‖²)/2,  r̂ = r / max(r)          (7)

Eq. 7 is the paper's normalised-rating cross-entropy; with implicit feedback ``r̂ = 1`` for an
observed pair and ``0`` for a sampled negative, i.e. BCE on the cosine (we average over the
pairs of a batch where the code sums; Adam makes the two equivalent up to the λ_o balance, which
is kept). ``λ_o`` (1e-3) is the authors' code's L2 penalty on the tower outputs. Every domain has its own loss and the domains
are trained in alternating mini-batches (as the authors' code does: one step on A, one on B, ...).

**The mechanism that defines GA-DTCDR is the element-wise attention (Eq. 3)**: for every
common user and every target domain, a learned per-dimension convex combination of the
user's embeddings from all domains, separately for each target (``a^A ≠ a^B``: domain A may
keep dimension k mostly from A while domain B takes it from A as well). It replaces the fixed
combination operators (average, max-pooling, concatenation) of its predecessor DTCDR. The
weights are a free table ``α^t (n_o, M, d)`` as in the authors' code (one row per user), here
parameterised by a softmax over the source domains so that they are positive and sum to one
per dimension, as the paper's convex combination requires (the code stores the raw weight
``w`` and uses ``1 − w`` for the other domain, unconstrained and initialised near ``w = 0``);
``α = 0`` at start (equal weights).
:func:`element_wise_attention` is Eq. 3 on its own.

**GA-MTCDR-P** keeps Eqs. 3–7 and changes two things:

* **Embedding (Eq. 1)**: a graph neural network trained end to end with the recommender
  instead of a fixed, pre-trained graph embedding. We use LightGCN propagation
  ``E_{l+1} = Â E_l`` of trainable ID embeddings with the mean of ``E_0 .. E_L``
  (:func:`fedlib.models.lightgcn.lightgcn_propagate`), ``Â = D^{-1/2} A D^{-1/2}``.
* **Personalised training strategy ("P")**, the mechanism that defines the ``-P`` models: "to
  avoid negative transfer, ... minimize the embedding difference of common entities between a
  richer dataset and a sparser dataset" (the paper's abstract). What we implement: domains are
  ranked by richness ``ρ_m`` = training interactions of the common users in domain ``m``; the
  loss of every domain ``s`` that has richer domains ``R(s) = {r : ρ_r > ρ_s}`` gets ::

        L^s_P = λ_P · mean_{r ∈ R(s)} Σ_u ‖h^s_u − sg(h^r_u)‖² / Σ_u ‖sg(h^r_u)‖²             (8)

  with ``u`` over the common users of the mini-batch (the relative squared error, so that
  ``λ_P`` does not depend on the scale of the embeddings). So each common user's single-domain embedding in the sparser domain is pulled towards the
  richer domain's embedding, while the richer domain is never pulled towards the sparser one
  (stop-gradient) and its own loss has no such term. The training is thus personalised per
  domain: the richest domain trains on its own objective, the sparser ones are anchored to it.
  :func:`personalized_alignment_loss` is Eq. 8 on its own.

On two domains GA-MTCDR-P is GA-DTCDR with (i) a GNN embedding trained end to end instead of a
fixed graph embedding plus projection and (ii) Eq. 8; the multi-target part (attention over
``M > 2`` sources, Eq. 3 with a softmax over ``M``) degenerates to the dual-target one. Both
run through :func:`train_ga`; the flags are ``embedding`` ("spectral" | "gnn") and
``personalized`` (so "GA-DTCDR-P" = spectral + personalised is available too).

Simplifications on this machine (each a documented choice):

* **No text, implicit feedback only.** GA-DTCDR's heterogeneous graph also links users and
  items whose Doc2vec document vectors (reviews, profiles, tags) are similar; our data have
  no text, so each domain's graph has the user–item rating edges only. Ratings are binary, so
  the normalised rating of Eq. 7 is 1 / 0 (observed / sampled negative).
* **Graph embedding = truncated SVD instead of Node2vec** (GA-DTCDR, ``embedding="spectral"``).
  Node2vec (biased random walks + skip-gram) needs ``gensim`` and minutes of walks per graph.
  Skip-gram on random walks implicitly factorises a matrix of random-walk co-occurrences of the
  graph (Qiu et al., "Network Embedding as Matrix Factorization", WSDM 2018), so we factorise
  the graph directly: the rank-``d`` SVD ``R̃ ≈ U_d S_d V_dᵀ`` of the normalised bi-adjacency
  ``R̃ = D_U^{-1/2} R D_I^{-1/2}`` gives ``z_u = (U_d S_d^{1/2})_u``, ``z_i = (V_d S_d^{1/2})_i``
  (:func:`spectral_embedding`; exact SVD on small graphs, seeded randomised SVD on large ones),
  rescaled to unit RMS. As in the original, these embeddings are fixed; the projections
  ``W^m`` (Eq. 2), attention and towers are trained.
* **GNN = LightGCN-style propagation** (GA-MTCDR-P, ``embedding="gnn"``), ``num_layers`` = 3.
* **Towers**: the authors' code uses ``d → 2d → 4d → 8d → 4d → 2d → d`` per tower (four towers);
  the default here is ``tower=(128, 64)`` (``d → 2d → d``) to fit the CPU budget; pass
  ``tower=(128, 256, 512, 256, 128, 64)`` for the code's depth.
* **Negatives and batches**: the code samples 7 negatives per positive and uses batches of 4096;
  we use the shared baseline setting (1 negative, batch 256) unless configured.
* **Eq. 8** is our reading of the one-sentence description of the personalised strategy (the
  form of the distance, its weight ``λ_P`` and where it is applied are ours); the richness
  ranking is by training interactions of the common users. Common items (the paper's
  cross-system scenario) do not exist in our domains, so only users are combined.
* Selection on validation HR@10 with patience (shared rule); the authors' code keeps the best
  test HR per domain over a fixed number of epochs.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
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
from fedlib.models.base import normal_
from fedlib.models.lightgcn import lightgcn_propagate, normalized_adjacency

__all__ = [
    "GAConfig", "GADTCDRConfig", "GAMTCDRPConfig", "EMBEDDINGS", "spectral_embedding", "element_wise_attention",
    "personalized_alignment_loss", "normalized_rating_cross_entropy", "richer_domains", "GAModel", "method_name",
    "train_ga", "train_ga_dtcdr", "train_ga_mtcdr_p",
]

EMBEDDINGS = ("spectral", "gnn")
# Exact (dense) SVD up to this many user × item cells; above it, seeded randomised SVD.
_DENSE_SVD_MAX_CELLS = 1 << 22


@dataclass(frozen=True)
class GAConfig(CrossDomainConfig):
    """Every setting of one GA run (GA-DTCDR defaults; :class:`GAMTCDRPConfig` for GA-MTCDR-P).

    Attributes:
        dim: embedding size d (64) of the graph embedding, the projections and the attention.
        embedding: ``"spectral"`` (fixed truncated-SVD graph embedding, the Node2vec substitute of
            GA-DTCDR) or ``"gnn"`` (LightGCN propagation trained end to end, GA-MTCDR-P).
        num_layers: propagation layers L of the GNN (3; ignored by ``"spectral"``).
        init_std: std of the GNN's ID embeddings (0.1, LightGCN).
        attention: combine common users' embeddings across domains (Eq. 3). ``False`` = every
            domain uses its own embedding only (the "w/o attention" ablation: single-domain towers).
        personalized: add the personalised alignment term (Eq. 8) to sparser domains' losses.
        personal_weight: λ_P of Eq. 8 (1.0).
        tower: hidden widths of each ReLU tower after the d-dim input; the last is the output size
            ((128, 64); the authors' code: (2d, 4d, 8d, 4d, 2d, d)).
        output_l2: λ_o, the L2 penalty on tower outputs (1e-3, the authors' code).
        eps: clamp of the cosine prediction into ``[ε, 1 − ε]`` (1e-6, the authors' code's floor).
        num_negatives: sampled negatives per positive (1; the code: 7).
        lr, weight_decay: one Adam over all parameters (1e-3, 0).
        batch_size: positives per mini-batch and domain (256).
        epochs: maximum epochs (one epoch = one pass over every domain's training positives,
            batches of the domains interleaved). patience, eval_every, select_on: selection.
        seed: initialisation, the randomised SVD, shuffling and negatives.
    """

    embedding: str = "spectral"
    num_layers: int = 3
    init_std: float = 0.1
    attention: bool = True
    personalized: bool = False
    personal_weight: float = 1.0
    tower: Tuple[int, ...] = (128, 64)
    output_l2: float = 1e-3
    eps: float = 1e-6
    num_negatives: int = 1
    weight_decay: float = 0.0
    batch_size: int = 256
    epochs: int = 50

    def __post_init__(self):
        if self.embedding not in EMBEDDINGS:
            raise ValueError(f"embedding must be one of {EMBEDDINGS}, got {self.embedding!r}")
        check_training_loop(self, ("num_negatives",))
        if int(self.num_layers) < 0:
            raise ValueError(f"num_layers must be >= 0, got {self.num_layers}")
        tower = tuple(self.tower)
        if not tower or any(int(w) < 1 for w in tower):
            raise ValueError(f"tower must be a non-empty tuple of positive widths, e.g. (128, 64); got {self.tower!r}")
        object.__setattr__(self, "tower", tuple(int(w) for w in tower))
        if not 0.0 < self.eps < 0.5:
            raise ValueError(f"eps must lie in (0, 0.5), got {self.eps}")
        for name in ("init_std", "personal_weight", "output_l2"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class GADTCDRConfig(GAConfig):
    """GA-DTCDR: fixed spectral graph embedding + element-wise attention, no personalised term."""


@dataclass(frozen=True)
class GAMTCDRPConfig(GAConfig):
    """GA-MTCDR-P: GNN embedding trained end to end + element-wise attention + personalised term (Eq. 8)."""

    embedding: str = "gnn"
    personalized: bool = True


def method_name(config: GAConfig) -> str:
    """``"GA-DTCDR"`` / ``"GA-MTCDR"`` by embedding, ``-P`` with the personalised term."""
    base = "GA-DTCDR" if config.embedding == "spectral" else "GA-MTCDR"
    return base + ("-P" if config.personalized else "")


# --------------------------------------------------------------------------------------
# The mechanisms, each on its own
# --------------------------------------------------------------------------------------
def spectral_embedding(pairs: Pairs, num_users: int, num_items: int, dim: int, seed: int = 0,
                       dense_max_cells: int = _DENSE_SVD_MAX_CELLS) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eq. 1 (GA-DTCDR substitute): rank-``dim`` SVD of the normalised user-item bi-adjacency.

    ``R̃ = D_U^{-1/2} R D_I^{-1/2}`` (duplicate pairs count once) ``≈ U S Vᵀ``; returns
    ``(users (U, dim) = U S^{1/2}, items (I, dim) = V S^{1/2}, singular values (dim,))`` in
    float64, so ``users @ items.T`` is the best rank-``dim`` approximation of ``R̃``. Columns
    beyond the rank ``min(U, I)`` are zero. Exact SVD when ``U · I <= dense_max_cells``, else
    randomised SVD (Halko et al.) seeded by ``seed``, so the result is deterministic.
    """
    keys = np.unique(np.asarray(pairs.users, dtype=np.int64) * num_items + np.asarray(pairs.items, dtype=np.int64))
    users, items = keys // num_items, keys % num_items
    deg_u = np.bincount(users, minlength=num_users).astype(np.float64)
    deg_i = np.bincount(items, minlength=num_items).astype(np.float64)
    values = 1.0 / np.sqrt(deg_u[users] * deg_i[items]) if keys.size else np.zeros(0)
    rank = min(dim, num_users, num_items)
    out_u = torch.zeros(num_users, dim, dtype=torch.float64)
    out_i = torch.zeros(num_items, dim, dtype=torch.float64)
    sigma = torch.zeros(dim, dtype=torch.float64)
    if rank == 0 or keys.size == 0:
        return out_u, out_i, sigma
    index = torch.as_tensor(np.stack([users, items]))
    matrix = torch.sparse_coo_tensor(index, torch.as_tensor(values), (num_users, num_items),
                                     check_invariants=False).coalesce()
    if num_users * num_items <= dense_max_cells:
        left, s, right_t = torch.linalg.svd(matrix.to_dense(), full_matrices=False)
        left, s, right = left[:, :rank], s[:rank], right_t[:rank].T
    else:
        q = min(rank + 10, num_users, num_items)
        # svd_lowrank draws its Gaussian test matrix from the global RNG: fork it so the
        # embedding depends on ``seed`` only and the caller's RNG state is untouched.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            left, s, right = torch.svd_lowrank(matrix, q=q, niter=6)
        left, s, right = left[:, :rank], s[:rank], right[:, :rank]
    root = s.clamp_min(0).sqrt()
    out_u[:, :rank] = left * root
    out_i[:, :rank] = right * root
    sigma[:rank] = s
    return out_u, out_i, sigma


def element_wise_attention(views: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Eq. 3: ``Σ_m softmax_m(logits)[:, m] ⊙ views[:, m]``.

    Args:
        views: ``(n, M, d)`` the users' embeddings from the ``M`` domains.
        logits: ``(n, M, d)`` attention logits α for one target domain.
    Returns:
        ``(n, d)``: per user and dimension, a convex combination of the ``M`` domains' values.
    """
    if views.shape != logits.shape:
        raise ValueError(f"views and logits must have the same (n, M, d) shape, got {tuple(views.shape)} "
                         f"and {tuple(logits.shape)}")
    return (torch.softmax(logits, dim=1) * views).sum(1)


def personalized_alignment_loss(views: torch.Tensor, target: int, richer: torch.Tensor) -> torch.Tensor:
    """Eq. 8 without λ_P: pull the sparser ``target`` domain's embeddings towards richer domains'.

    Args:
        views: ``(n, M, d)`` common users' single-domain embeddings ``h^m_u``.
        target: the domain whose loss this is (``s``).
        richer: ``(M, M) bool``, ``richer[s, r]``: domain ``r`` is richer than ``s``.
    Returns:
        ``mean_{r ∈ R(s)} ‖H^s − sg(H^r)‖²_F / ‖sg(H^r)‖²_F`` over the ``n`` users (the relative
        squared error, so λ_P does not depend on the embeddings' scale); exactly 0 when ``R(s)``
        is empty or ``n = 0``: the richest domain is never pulled towards a sparser one.
    """
    sources = torch.nonzero(richer[target]).flatten().tolist()
    if not sources or views.shape[0] == 0:
        return views.new_zeros(())
    own = views[:, target].unsqueeze(1)  # (n, 1, d)
    anchors = views[:, sources].detach()  # (n, |R(s)|, d): the richer domains do not move
    per_source = (own - anchors).pow(2).sum((0, 2)) / anchors.pow(2).sum((0, 2)).clamp_min(1e-12)  # (|R(s)|,)
    return per_source.mean()


def normalized_rating_cross_entropy(predictions: torch.Tensor, ratings: torch.Tensor,
                                    max_rating: float = 1.0) -> torch.Tensor:
    """Eq. 7's data term (mean over pairs): ``−[r̂ log ŷ + (1 − r̂) log(1 − ŷ)]``, ``r̂ = r / max_rating``.

    ``predictions`` must already lie in ``(0, 1)`` (the clamped cosine).
    """
    target = ratings / max_rating
    return -(target * predictions.log() + (1 - target) * (1 - predictions).log()).mean()


def richer_domains(split: DomainSplit) -> Tuple[torch.Tensor, List[int]]:
    """``(richer (M, M) bool, richness per domain)``; richness = training pairs of the common users."""
    n_o = split.num_overlap_users
    richness = [int(np.count_nonzero(split[d].train.users < n_o)) for d in split.domains]
    values = torch.as_tensor(richness)
    return values.unsqueeze(0) > values.unsqueeze(1), richness


# --------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------
def _tower(width_in: int, widths: Sequence[int]) -> nn.Sequential:
    layers: List[nn.Module] = []
    for a, b in zip((width_in,) + tuple(widths[:-1]), widths):
        layers += [nn.Linear(a, b), nn.ReLU()]  # ReLU after the last layer too (the code): cos ∈ [0, 1]
    return nn.Sequential(*layers)


class GAModel(nn.Module):
    """All domains of a GA model: embeddings (Eq. 1), projections (2), attention (3–4), towers (5).

    Args:
        split: the domains; every domain's training pairs are its graph.
        config: sizes and flags.
        generator: initialisation randomness.

    ``D`` below is the tower output size ``config.tower[-1]``.
    """

    def __init__(self, split: DomainSplit, config: GAConfig, generator: Optional[torch.Generator] = None):
        super().__init__()
        generator = generator if generator is not None else torch.Generator().manual_seed(config.seed)
        self.config = config
        self.domains = tuple(split.domains)
        self.num_domains = len(self.domains)
        self.num_overlap = int(split.num_overlap_users)
        self.num_users = [split[d].num_users for d in self.domains]
        self.num_items = [split[d].num_items for d in self.domains]
        d = config.dim
        self.singular_values: List[torch.Tensor] = []
        if config.embedding == "spectral":
            for m, name in enumerate(self.domains):
                users, items, sigma = spectral_embedding(split[name].train, self.num_users[m], self.num_items[m], d,
                                                         seed=config.seed * 1000 + m)
                rms = torch.cat([users, items]).pow(2).mean().sqrt().clamp_min(1e-12)
                self.register_buffer(f"feat_users_{m}", (users / rms).float())
                self.register_buffer(f"feat_items_{m}", (items / rms).float())
                self.singular_values.append(sigma.float())
        else:
            self.user_emb = nn.ParameterList()
            self.item_emb = nn.ParameterList()
            for m, name in enumerate(self.domains):
                self.user_emb.append(nn.Parameter(normal_((self.num_users[m], d), config.init_std, generator,
                                                          torch.float32, "cpu")))
                self.item_emb.append(nn.Parameter(normal_((self.num_items[m], d), config.init_std, generator,
                                                          torch.float32, "cpu")))
                with warnings.catch_warnings():  # "CSR support is in beta"
                    warnings.simplefilter("ignore", UserWarning)
                    adjacency = normalized_adjacency(split[name].train, self.num_users[m],
                                                     self.num_items[m]).to_sparse_csr()
                self.register_buffer(f"adjacency_{m}", adjacency, persistent=False)
        # nn.Linear draws its init from the global RNG: fork it so a run depends on its seed only.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch.randint(0, 2 ** 31 - 1, (1,), generator=generator)))
            self.user_proj = nn.ModuleList([nn.Linear(d, d, bias=False) for _ in self.domains])
            self.item_proj = nn.ModuleList([nn.Linear(d, d, bias=False) for _ in self.domains])
            self.user_tower = nn.ModuleList([_tower(d, config.tower) for _ in self.domains])
            self.item_tower = nn.ModuleList([_tower(d, config.tower) for _ in self.domains])
        self.use_attention = bool(config.attention) and self.num_domains > 1 and self.num_overlap > 0
        # α^t (n_o, M, d) per target t; zeros = equal weights at start.
        self.attention_logits = nn.Parameter(torch.zeros(self.num_domains, self.num_overlap, self.num_domains, d)) \
            if self.use_attention else None

    # ---- Eq. 1
    def base_tables(self) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """Per domain ``(users (U_m, d), items (I_m, d))`` graph embeddings ``z`` (propagated for the GNN)."""
        if self.config.embedding == "spectral":
            return [(getattr(self, f"feat_users_{m}"), getattr(self, f"feat_items_{m}")) for m in range(self.num_domains)]
        return [lightgcn_propagate(getattr(self, f"adjacency_{m}"), self.user_emb[m], self.item_emb[m],
                                   self.config.num_layers, combine="mean", symmetric=True)  # Â symmetric: fast backward
                for m in range(self.num_domains)]

    # ---- Eqs. 2-4
    def user_embeddings(self, tables, target: int, users: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``(ũ^t (B, d), views (n_c, M, d) of the batch's common users or None)`` for ``users (B,)``."""
        own = self.user_proj[target](tables[target][0][users])  # (B, d)
        if not self.use_attention:
            return own, None
        common = users < self.num_overlap
        cu = users[common]  # (n_c,)
        views = torch.stack([self.user_proj[m](tables[m][0][cu]) for m in range(self.num_domains)], 1)  # (n_c, M, d)
        combined = element_wise_attention(views, self.attention_logits[target, cu])  # (n_c, d)
        return own.masked_scatter(common.unsqueeze(-1), combined), views

    # ---- Eqs. 5-6
    def user_vectors(self, tables, target: int, users: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``(p (B, D), views)``: the target domain's user tower on the attended embeddings."""
        combined, views = self.user_embeddings(tables, target, users)
        return self.user_tower[target](combined), views

    def item_vectors(self, tables, target: int, items: torch.Tensor) -> torch.Tensor:
        """``items (...)`` → ``q (..., D)``."""
        return self.item_tower[target](self.item_proj[target](tables[target][1][items]))

    def attention_weights(self, target: int) -> Optional[torch.Tensor]:
        """``(n_o, M, d)`` softmax weights ``a^t`` of the target domain (``None`` without attention)."""
        if not self.use_attention:
            return None
        return torch.softmax(self.attention_logits[target].detach(), dim=1)

    @torch.no_grad()
    def scorer(self, target: int):
        """A :data:`~fedlib.baselines.cross_domain.cdr_common.PairScorer` (cosine, Eq. 6 without the clamp) of the model now."""
        self.eval()
        tables = self.base_tables()
        device = tables[target][0].device
        p, _ = self.user_vectors(tables, target, torch.arange(self.num_users[target], device=device))
        q = self.item_vectors(tables, target, torch.arange(self.num_items[target], device=device))
        p, q = F.normalize(p, dim=-1), F.normalize(q, dim=-1)
        return lambda users, candidates: torch.einsum("nd,ncd->nc", p[users], q[candidates])


def _cosine(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``p (B, D)``, ``q (B, C, D)`` → ``(B, C)`` cosine (0 for a zero vector)."""
    dot = torch.einsum("bd,bcd->bc", p, q)
    return dot / (p.norm(dim=-1, keepdim=True) * q.norm(dim=-1)).clamp_min(1e-12)


# --------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------
def _step(model: GAModel, optimizer, config: GAConfig, target: int, users: np.ndarray, positives: np.ndarray,
          negatives: np.ndarray, richer: torch.Tensor, device) -> Tuple[float, float]:
    """One mini-batch of domain ``target``'s loss (Eq. 7 + λ_P Eq. 8); returns ``(L^t, Eq. 8)``."""
    u = torch.as_tensor(users, device=device)
    items = torch.as_tensor(np.concatenate([positives[:, None], negatives], 1), device=device)  # (B, 1 + n)
    labels = torch.zeros(items.shape, device=device)
    labels[:, 0] = 1.0
    tables = model.base_tables()
    p, views = model.user_vectors(tables, target, u)  # (B, D)
    q = model.item_vectors(tables, target, items)  # (B, 1 + n, D)
    prediction = _cosine(p, q).clamp(config.eps, 1 - config.eps)
    loss = normalized_rating_cross_entropy(prediction, labels)
    loss = loss + config.output_l2 * 0.5 * (p.pow(2).sum(-1, keepdim=True) + q.pow(2).sum(-1)).mean()
    personal = torch.zeros((), device=device)
    if config.personalized and views is not None:
        personal = personalized_alignment_loss(views, target, richer)
        loss = loss + config.personal_weight * personal
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach()), float(personal.detach())


class GAAlgorithm(CrossDomainAlgorithm):
    """A GA model as the trainer's algorithm: one round = one epoch over every domain's pairs,
    the domains' mini-batches interleaved (one step per domain), as the authors' code."""

    def __init__(self, split: DomainSplit, config: GAConfig, device, ks: Sequence[int]):
        self.split, self.config, self.seed, self.device, self.ks = split, config, int(config.seed), device, tuple(ks)
        self.names = list(split.domains)
        self.samplers = [NegativeSampler(split[d].train, split[d].num_items) for d in self.names]
        richer, self.richness = richer_domains(split)
        self.richer = richer.to(device)

    def init(self, seed: int) -> JointModelState:
        config = self.config
        rng = np.random.default_rng([config.seed, 9203])
        model = GAModel(self.split, config, torch.Generator().manual_seed(config.seed)).to(self.device)
        return JointModelState(model, torch.optim.Adam(model.parameters(), lr=config.lr,
                                                       weight_decay=config.weight_decay), rng)

    def run_round(self, state: JointModelState, plan: int, context: RoundContext
                  ) -> Tuple[JointModelState, RoundReport]:
        config, names, model, rng = self.config, self.names, state.model, state.rng
        model.train()
        trains = [self.split[d].train for d in names]
        orders = [rng.permutation(len(t)) for t in trains]
        batches = [math.ceil(len(t) / config.batch_size) for t in trains]
        sums = {f"{d}/{key}": 0.0 for d in names for key in ("loss", "personal")}
        for b in range(max(batches)):
            # Interleave the domains' mini-batches (one step per domain), as the authors' code.
            for m, name in enumerate(names):
                if b >= batches[m]:
                    continue
                rows = orders[m][b * config.batch_size:(b + 1) * config.batch_size]
                users = trains[m].users[rows]
                negatives = self.samplers[m].sample(users, config.num_negatives, rng)  # (B, n)
                loss, personal = _step(model, state.optimizer, config, m, users, trains[m].items[rows], negatives,
                                       self.richer, self.device)
                sums[f"{name}/loss"] += loss / batches[m]
                sums[f"{name}/personal"] += personal / batches[m]
        logged = dict(sums)
        for m, name in enumerate(names):
            weights = model.attention_weights(m)
            if weights is not None and weights.numel():
                logged[f"{name}/own_attention"] = float(weights[:, m].mean())
        loss = float(np.mean([sums[f"{d}/loss"] for d in names]))
        return state, RoundReport(train_loss=loss, logged=logged)

    def scorers(self, state: JointModelState):
        return {name: state.model.scorer(m) for m, name in enumerate(self.names)}


def train_ga(split: DomainSplit, config: GAConfig = GADTCDRConfig(), *, device=None,
             progress: Progress = None, ks: Sequence[int] = (5, 10), checkpointer=None,
             on_round_end=None) -> RunResult:
    """Train a GA model (GA-DTCDR, GA-DTCDR-P, GA-MTCDR, GA-MTCDR-P by the config's flags).

    ``split``: 2 or more domains, users ``0 .. n_o − 1`` common to all; ``config``:
    :class:`GADTCDRConfig`, :class:`GAMTCDRPConfig` or any :class:`GAConfig`; the other arguments
    and the family's artifacts: :func:`~fedlib.baselines.cross_domain.cdr_common.train_with`. The run
    is named by :func:`method_name`; ``models`` maps every domain to the one shared
    :class:`GAModel`; ``scalars``: ``epochs_run``; own artifacts: ``attention_weights`` per target
    domain, the ``richness`` ranking, ``richer`` and (spectral) the ``singular_values``.
    """
    if len(split.domains) < 2:
        raise ValueError(f"GA models combine domains: need at least 2 domains, got {len(split.domains)}")

    def summarise(algorithm: GAAlgorithm, run: RunResult) -> RunSummary:
        names, model = algorithm.names, run.state.model
        artifacts = {
            "attention_weights": {name: model.attention_weights(m) for m, name in enumerate(names)},
            "richness": dict(zip(names, algorithm.richness)),
            "richer": algorithm.richer.cpu(),
        }
        if model.singular_values:
            artifacts["singular_values"] = dict(zip(names, model.singular_values))
        return RunSummary(scalars={"epochs_run": run.round_index}, models={name: model for name in names},
                          artifacts=artifacts)

    return train_with(lambda device: GAAlgorithm(split, config, device, ks), config, method=method_name(config),
                      rounds=config.epochs, summarise=summarise, device=device, progress=progress,
                      checkpointer=checkpointer, on_round_end=on_round_end)


def train_ga_dtcdr(split: DomainSplit, config: GAConfig = GADTCDRConfig(), *, device=None,
                   progress: Progress = None,
                   ks: Sequence[int] = (5, 10)) -> RunResult:
    """GA-DTCDR (IJCAI 2020): :func:`train_ga` with :class:`GADTCDRConfig` defaults."""
    return train_ga(split, config, device=device, progress=progress, ks=ks)


def train_ga_mtcdr_p(split: DomainSplit, config: GAConfig = GAMTCDRPConfig(), *, device=None,
                     progress: Progress = None,
                     ks: Sequence[int] = (5, 10)) -> RunResult:
    """GA-MTCDR-P (TKDE 2021): :func:`train_ga` with :class:`GAMTCDRPConfig` defaults."""
    return train_ga(split, config, device=device, progress=progress, ks=ks)
