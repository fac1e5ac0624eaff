r"""CCDR baseline (contrastive cross-domain matching) adapted to cross-domain sequences.

Reference:
    R. Xie, Q. Liu, L. Wang, S. Liu, B. Zhang, L. Lin, "Contrastive Cross-domain
    Recommendation in Matching", Proc. 28th ACM SIGKDD Conference on Knowledge Discovery and
    Data Mining (KDD 2022), pp. 4226–4236 (arXiv:2112.00999). FedCSR (COLING 2025, Tables 2,
    6–8) uses it as a cross-domain baseline, federated with FedProx.

Model (paper): a graph-based matching model per domain (user/item encoders on a diversified
preference network) trained with the matching loss, an **intra-domain contrastive loss** between
two graph-augmented views of every node, and three **inter-domain contrastive losses** that
transfer knowledge across domains: user CL (the same user's representations in the two
domains), taxonomy CL (items sharing a tag/category across domains) and neighbour CL (a user
in one domain vs. their neighbour items in the other). With ``InfoNCE(x, y) = −log
exp(cos(x, y)/τ) / Σ_{y'} exp(cos(x, y')/τ)`` over in-batch negatives ``y'``::

    E'_d = (1/(K+1)) Σ_{k=0..K} Â_d^k E_d           (graph item encoder, domain d)        (1)
    u_d(j) = MLP_d(mean_{t ≤ j, s_t ∈ d} E'_d[s_t])   (user = aggregated neighbour items)   (2)
    L_match = Σ_d CE(softmax_i(u_d(j) · E'_d[i]), next item of domain d)                    (3)
    L_intra = Σ_d InfoNCE(E'_d^{(1)}[i], E'_d^{(2)}[i]) + InfoNCE(u_d^{(1)}, u_d^{(2)})     (4)
              (views (1), (2): the graph encoder on two independently edge-dropped Â_d)
    L_user  = InfoNCE(u_A, u_B) + InfoNCE(u_B, u_A)                                         (5)
    L_neigh = InfoNCE(u_A, E'_B[last B item]) + InfoNCE(u_B, E'_A[last A item])             (6)
    L = L_match + λ_intra L_intra + λ_inter (L_user + L_neigh)                              (7)

Defining mechanism: **inter-domain contrastive learning** (Eqs. 5–6): each sequence's
domain-A and domain-B user representations (and its neighbour items in the other domain) are
pulled together against the other sequences of the batch, so knowledge moves between two
otherwise separate matching models; plus the **graph-augmentation intra-domain CL** (Eq. 4).

Adaptation to sequences (CCDR is **not** a sequential model; these are our choices):

* A "user" is a sequence owner; ``u_d`` pools (mean) the graph item representations of the
  domain-``d`` items of the history up to position ``j`` (causal) and passes them through a
  per-domain MLP (GraphSAGE-like aggregation of the user's item neighbours; no user ids, so
  unseen test users work). Users without a domain-``d`` item get ``MLP_d(0)``.
* Graphs: each platform's domain item-transition graphs (``transition_graphs(...).a`` / ``.b``
  from :mod:`fedlib.baselines.sequential.sequences`), made undirected and unweighted, mean-aggregated per
  layer (LightGCN-style, no weights), set with :meth:`CCDR.set_graphs`. Edge dropout with rate
  ``edge_drop`` gives the two intra-CL views.
* Matching targets: at every real position the next cross-domain item, scored by the user
  tower of its domain (``unified_*`` targets of :func:`fedlib.baselines.sequential.sequences.make_batch`);
  full softmax over the domain's items (the paper uses sampled / in-batch softmax).
* Intra-CL runs on the items present in the batch and on the users (last position); inter-CL
  on the rows whose window has items of both domains, last position only.

Simplifications on this machine: no taxonomy CL (no tags/categories in the data), no user
profiles or other node types of the diversified preference network (only item–item edges),
one propagation layer (``gnn_layers = 1``), ``dim = 64``, λ_intra = λ_inter = 0.1, τ = 0.2.
``sampled_negatives``: None (default) = the full softmax of Eq. 3; an int ``S`` trains Eq. 3 as a
sampled softmax over the target and ``S`` uniform same-domain negatives shared by the mini-batch
(scores ``u_d · E'_d[i]``; a negative equal to the target is dropped), the grid's stated CPU
reduction (1000 on real data, as FedCSR); ``score`` stays exact.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from fedlib.baselines.sequential.sequences import (SequenceBatch, SequenceInputs, TransitionGraphs, check_fields,
                                      check_sampled_negatives, draw_negatives_torch)
from fedlib.models.dropout import Dropout


@dataclass(frozen=True)
class CCDRConfig:
    """CCDR hyper-parameters (``lambda_*`` weight the CL terms of Eq. 7)."""

    dim: int = 64
    maxlen: int = 15
    gnn_layers: int = 1
    edge_drop: float = 0.2
    tau: float = 0.2
    lambda_intra: float = 0.1
    lambda_inter: float = 0.1
    use_neighbour_cl: bool = True
    dropout: float = 0.1
    seed: int = 0
    sampled_negatives: Optional[int] = None   # None: full softmax (Eq. 3); S: target + S shared uniform negatives

    def __post_init__(self):
        check_fields(self, at_least={"dim": 1, "maxlen": 1, "gnn_layers": 0}, rates=("edge_drop", "dropout"),
                     non_negative=("lambda_intra", "lambda_inter"))
        if not self.tau > 0:
            raise ValueError(f"CCDRConfig.tau must be > 0, got {self.tau!r}")
        check_sampled_negatives(self.sampled_negatives)


def info_nce(x: torch.Tensor, y: torch.Tensor, tau: float) -> torch.Tensor:
    """Mean InfoNCE of positives ``(x_r, y_r)`` with in-batch negatives ``y_{r'}``; x, y (R, n) → scalar."""
    if x.shape[0] < 2:
        return x.sum() * 0.0 + y.sum() * 0.0                               # no negatives: no signal
    sim = F.normalize(x, dim=-1) @ F.normalize(y, dim=-1).T / tau          # (R, R) cosine / τ
    return F.cross_entropy(sim, torch.arange(x.shape[0], device=x.device))


def undirected_edges(graph: torch.Tensor) -> torch.Tensor:
    """Unique undirected edges (both directions, no self-loops) of a sparse (n, n) graph → (2, E) int64."""
    idx = graph.coalesce().indices()                                       # (2, E0)
    both = torch.cat([idx, idx.flip(0)], dim=1)                            # (2, 2·E0)
    both = both[:, both[0] != both[1]]
    return torch.unique(both, dim=1)                                       # (2, E)


def propagate_mean(table: torch.Tensor, edges: torch.Tensor, layers: int, drop: float = 0.0) -> torch.Tensor:
    """Eq. 1: mean over layers ``k = 0..K`` of ``Â^k E`` (Â = neighbour mean over the kept edges).

    ``table`` (n, dim) item rows (no padding row), ``edges`` (2, E) src → dst; edges are dropped
    independently with probability ``drop`` (the augmentation of the intra-domain CL).
    """
    if drop > 0 and edges.shape[1]:
        edges = edges[:, torch.rand(edges.shape[1], device=edges.device) >= drop]   # (2, E')
    src, dst = edges[0], edges[1]                                          # (E',)
    deg = torch.zeros(table.shape[0], device=table.device, dtype=table.dtype).index_add_(
        0, src, torch.ones_like(src, dtype=table.dtype)).clamp(min=1.0).unsqueeze(1)  # (n, 1)
    h, acc = table, table
    for _ in range(layers):
        h = torch.zeros_like(table).index_add_(0, src, h[dst]) / deg       # (n, dim)
        acc = acc + h
    return acc / (layers + 1)                                              # (n, dim)


class CCDR(nn.Module):
    """Per-domain graph item encoder + user MLP; matching loss + intra- and inter-domain CL."""

    def __init__(self, num_items_a: int, num_items_b: int, config: CCDRConfig = CCDRConfig(),
                 graphs: Optional[TransitionGraphs] = None):
        super().__init__()
        self.config, self.num_items_a, self.num_items_b = config, num_items_a, num_items_b
        d = config.dim
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            self.emb = nn.ParameterList([nn.Parameter(torch.randn(n, d) * 0.1) for n in (num_items_a, num_items_b)])
            self.user_mlp = nn.ModuleList(nn.Sequential(nn.Linear(d, d), nn.ReLU(), Dropout(config.dropout),
                                                        nn.Linear(d, d)) for _ in range(2))
        self.edges: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
        if graphs is not None:
            self.set_graphs(graphs)

    def set_graphs(self, graphs: TransitionGraphs) -> None:
        """Use a platform's own domain graphs (data, not parameters)."""
        self.edges = (undirected_edges(graphs.a), undirected_edges(graphs.b))

    # ------------------------------------------------------------------ encoders
    def item_reps(self, d: int, drop: float = 0.0) -> torch.Tensor:
        """Eq. 1 for domain ``d`` → (n_d + 1, dim), last row = zero padding."""
        if self.edges is None:
            raise ValueError("CCDR has no item graphs: call set_graphs(transition_graphs(train_sequences, ...)) "
                             "with the platform's own training sequences first")
        table = self.emb[d]                                                # (n_d, dim)
        reps = propagate_mean(table, self.edges[d].to(table.device), self.config.gnn_layers, drop)
        return torch.cat([reps, reps.new_zeros(1, reps.shape[1])], dim=0)  # (n_d + 1, dim)

    def _local(self, inputs: SequenceInputs, d: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Domain-``d`` local ids (pad = n_d) and real mask, both (B, L)."""
        na, n_d = self.num_items_a, (self.num_items_a, self.num_items_b)[d]
        real = (inputs.pos_b if d else inputs.pos_a) > 0                   # (B, L)
        ids = (inputs.single_b - na) if d else inputs.single_a             # (B, L)
        return torch.where(real, ids, torch.full_like(ids, n_d)), real

    def user_reps(self, inputs: SequenceInputs, d: int, reps: torch.Tensor) -> torch.Tensor:
        """Eq. 2 at every position: (B, L, dim) from item representations ``reps`` (n_d + 1, dim)."""
        ids, real = self._local(inputs, d)                                 # (B, L)
        x = reps[ids] * real.unsqueeze(-1)                                 # (B, L, dim)
        pooled = x.cumsum(1) / real.cumsum(1).clamp(min=1).unsqueeze(-1)   # (B, L, dim) causal mean
        return self.user_mlp[d](pooled)                                    # (B, L, dim)

    # ------------------------------------------------------------------ losses
    def loss_parts(self, batch: SequenceBatch,
                   negatives: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> Dict[str, torch.Tensor]:
        """``match``, ``intra``, ``user_cl``, ``neigh_cl`` (scalars) of Eqs. 3–6.

        ``negatives``: explicit shared negatives per domain, local ids ``((S_A,), (S_B,))``; by
        default drawn from torch's RNG if ``config.sampled_negatives`` is set, else the full softmax.
        """
        cfg, x = self.config, batch.inputs
        reps = [self.item_reps(d) for d in (0, 1)]                         # (n_A + 1, n), (n_B + 1, n)
        users = [self.user_reps(x, d, reps[d]) for d in (0, 1)]            # 2 × (B, L, n)
        if negatives is None:
            negatives = draw_negatives_torch(self.num_items_a, self.num_items_b, cfg.sampled_negatives,
                                             users[0].device)              # None or ((S_A,), (S_B,))
        parts = {"match": users[0].new_zeros(()), "intra": users[0].new_zeros(())}
        targets = ((batch.unified_a, batch.unified_a_mask), (batch.unified_b, batch.unified_b_mask))
        for d, (target, mask) in enumerate(targets):
            if bool(mask.any()) and negatives is None:                     # Eq. 3, full softmax over domain d
                logits = users[d][mask] @ reps[d][:-1].T                   # (P, n_d)
                parts["match"] = parts["match"] + F.cross_entropy(logits, target[mask])
            elif bool(mask.any()):                                         # Eq. 3, sampled softmax
                u, tgt, neg = users[d][mask], target[mask], negatives[d]   # (P, n), (P,), (S,)
                pos = (u * reps[d][tgt]).sum(-1)                           # (P,)
                other = (u @ reps[d][neg].T).masked_fill(neg.unsqueeze(0) == tgt.unsqueeze(1), float("-inf"))  # (P, S)
                logits = torch.cat([pos.unsqueeze(1), other], dim=1)       # (P, 1 + S); target at 0
                parts["match"] = parts["match"] + F.cross_entropy(logits, torch.zeros_like(tgt))
            if cfg.lambda_intra > 0:                                       # Eq. 4, two edge-dropped views
                v1, v2 = self.item_reps(d, cfg.edge_drop), self.item_reps(d, cfg.edge_drop)  # 2 × (n_d + 1, n)
                ids, real = self._local(x, d)
                items = torch.unique(torch.cat([ids[real], target[mask]]))  # (I,) local ids in the batch
                has = real.any(1)                                          # (B,) rows with a domain-d item
                u1 = self.user_reps(x, d, v1)[has, -1]                     # (b, n)
                u2 = self.user_reps(x, d, v2)[has, -1]                     # (b, n)
                parts["intra"] = parts["intra"] + info_nce(v1[items], v2[items], cfg.tau) + info_nce(u1, u2, cfg.tau)
        # Eqs. 5–6 on the rows whose window holds both domains (last position).
        both = (x.pos_a > 0).any(1) & (x.pos_b > 0).any(1)                 # (B,)
        u_a, u_b = users[0][both, -1], users[1][both, -1]                  # 2 × (b, n)
        parts["user_cl"] = info_nce(u_a, u_b, cfg.tau) + info_nce(u_b, u_a, cfg.tau)
        parts["neigh_cl"] = users[0].new_zeros(())
        if cfg.use_neighbour_cl:
            last = []
            for d in (0, 1):
                ids, real = self._local(x, d)                              # (B, L)
                col = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
                last_col = torch.where(real, col, torch.zeros_like(col)).amax(1, keepdim=True)  # (B, 1)
                last.append(ids.gather(1, last_col).squeeze(1)[both])      # (b,) latest domain-d item
            parts["neigh_cl"] = info_nce(u_a, reps[1][last[1]], cfg.tau) + info_nce(u_b, reps[0][last[0]], cfg.tau)
        return parts

    def loss(self, batch: SequenceBatch, negatives: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        """Eq. 7 (``negatives`` as in :meth:`loss_parts`)."""
        p = self.loss_parts(batch, negatives)
        cfg = self.config
        return p["match"] + cfg.lambda_intra * p["intra"] + cfg.lambda_inter * (p["user_cl"] + p["neigh_cl"])

    def score(self, inputs: SequenceInputs, candidates: torch.Tensor, gt_domain: torch.Tensor) -> torch.Tensor:
        """``(B, C)`` dot products ``u_d · E'_d[i]`` of global candidate ids (the GT's domain)."""
        out = torch.empty(candidates.shape, device=candidates.device)     # (B, C)
        for d in (0, 1):
            m = gt_domain == d                                             # (B,)
            if not bool(m.any()):
                continue
            n_d = (self.num_items_a, self.num_items_b)[d]
            local = candidates[m] - (self.num_items_a if d else 0)         # (b, C)
            if bool((local < 0).any()) or bool((local >= n_d).any()):
                raise ValueError("candidates must all lie in the ground truth's domain")
            reps = self.item_reps(d)                                       # (n_d + 1, n)
            sub = SequenceInputs(*(t[m] for t in inputs))
            u = self.user_reps(sub, d, reps)[:, -1]                        # (b, n)
            out[m] = (reps[local] * u.unsqueeze(1)).sum(-1)                # (b, C)
        return out


__all__ = ["CCDRConfig", "CCDR", "info_nce", "undirected_edges", "propagate_mean"]
