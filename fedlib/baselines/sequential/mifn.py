r"""MIFN: mixed information flow network for cross-domain sequential recommendation (a FedCSR baseline).

Reference:
    M. Ma, P. Ren, Z. Chen, Z. Ren, L. Zhao, P. Liu, J. Ma, M. de Rijke, "Mixed Information
    Flow for Cross-domain Sequential Recommendations", ACM Transactions on Knowledge
    Discovery from Data (TKDD) 16(4), 2022 (arXiv:2012.00485). FedCSR (Zheng et al., COLING 2025)
    compares with it federated with FedProx (Tables 2, 6–8).

MIFN models two flows over a user's mixed (cross-domain) sequence ``s* = x_1..x_T``: the
*behaviour* flow (sequential patterns across domains, its behaviour transfer unit) and the
*knowledge* flow (relations between items of the two domains in a knowledge graph, its
knowledge transfer unit), decides per step whether the next item comes from domain A or B
(the **switch**), and decodes with a **mixed generation / pointer** head: an item is either
generated from the whole domain vocabulary or pointed to among the items the history and its
knowledge-graph relations make available. Notation (``σ`` logistic, ``E`` item embeddings,
``R`` the relation matrix, ``n`` feature size)::

    h_t = GRU_b(E[x_t], h_{t−1})                                         behaviour flow
    k_t = GRU_k((Â E)[x_t], k_{t−1})                                     knowledge flow: the relation-graph
                                                                         neighbourhood of x_t, propagated per step
    g_t = σ(W_g [h_t; k_t]),  o_t = h_t + g_t ⊙ k_t                      transfer gate (when / which knowledge)
    ψ_t = σ(w_s^T o_t + b_s) = P(x_{t+1} ∈ B),  P(x_{t+1} ∈ A) = 1 − ψ_t  switch
    G^d_t = softmax(W^d o_t)  over V^d                                    generation mode
    α_tj = softmax_{j ≤ t} ((W_q o_t)^T E[x_j] / √n)                      attention over the history
    R = (I + Â)/2;  π_t(i) = Σ_{j≤t} α_tj R[x_j, i]                        pointer over history items and their relations
    Z^d_t = Σ_{i ∈ V^d} π_t(i);   q^d_t = σ(w_p^d·o_t + b_p^d)  (q^d_t := 1 if Z^d_t = 0)
    P(i | d) = q^d_t G^d_t(i) + (1 − q^d_t) π_t(i) / Z^d_t                 mixed generation / pointer head
    P(i) = P(d(i)) · P(i | d(i))                                          mixed-domain distribution (sums to 1)
    L = −mean_t log P(x_{t+1})            (one loss for the next item of either domain)

Defining mechanisms: the **knowledge flow** (per-step propagation of item relations from a
graph), the **switch** (domain of the next item) and the **mixed generation / pointer head**.
``score`` returns ``log P(i)`` at the last history step for the candidates (the switch term
is common to all candidates of one domain, so the ranking is that of ``P(i | d)``).

Simplifications on this machine:

* **No knowledge graph.** The paper links items through a product knowledge graph
  (attribute relations across domains). We have none, so the relation graph ``Â`` is the
  platform's own row-normalised **item-transition graph** over both domains
  (``fedlib.baselines.sequential.sequences.transition_graphs(...).cross``, set with :meth:`MIFN.set_graphs`).
  It is data of the platform, not a parameter (not in ``state_dict``).
* The behaviour and knowledge transfer units are one GRU over the mixed sequence and one
  GRU over the per-step relation-graph neighbourhood, fused by a gate; the paper's
  domain-specific encoders, multi-relation graph and its hierarchical attention over graph
  nodes are reduced to one relation type and one-hop neighbourhoods (``R = (I + Â)/2``).
* The switch is trained only through ``log P(d)`` inside the likelihood (no separate loss);
  small sizes (``dim`` 64 by default).
* ``sampled_negatives``: None (default) = the exact ``G^d``; an int ``S`` estimates, in training
  only, the generator's normaliser ``Z_gen = Σ_{j ∈ V^d} exp(l_j)`` (``l = W^d o_t``) from the
  target ``i`` and ``S`` uniform same-domain negatives ``n_1..n_S`` shared by the mini-batch:
  ``Ẑ = exp(l_i) + (|V^d|/S) Σ_{s: n_s ≠ i} exp(l_{n_s})``, ``G̃^d(i) = exp(l_i)/Ẑ`` — the
  grid's stated CPU reduction (1000 on real data). ``Ẑ`` is unbiased for ``Z_gen`` (so ``G̃``
  keeps the scale of the pointer term it is mixed with; an unscaled sampled softmax would
  inflate it up to ~|V^d|/S-fold and tilt ``q``), ``log G̃`` is biased by Jensen (on average slightly
  too large), and it is exact when the negatives are every item of ``V^d`` once. The switch,
  the pointer, ``q`` and the mixture are unchanged; ``score`` stays exact (full softmax).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from fedlib.baselines.sequential.sequences import (SequenceBatch, SequenceInputs, TransitionGraphs, check_fields,
                                      check_sampled_negatives, draw_negatives_torch)
from fedlib.models.dropout import Dropout

__all__ = ["MIFNConfig", "MIFN", "RelationGraph"]


@dataclass(frozen=True)
class MIFNConfig:
    dim: int = 64
    maxlen: int = 15
    dropout: float = 0.2
    seed: int = 0
    sampled_negatives: Optional[int] = None   # None: exact G^d; S: normaliser from target + S shared negatives

    def __post_init__(self):
        check_fields(self, at_least={"dim": 1, "maxlen": 2}, rates=("dropout",))
        check_sampled_negatives(self.sampled_negatives)


class RelationGraph:
    """``Â`` (sparse, for propagation) and ``R = (I + Â)/2`` as sorted keys for O(log E) lookups.

    Attributes:
        adj: (n, n) sparse ``Â``; keys/values: (E,) sorted ``row·n + col`` and ``R`` entries;
        mass: (n + 1, 2) per row, the mass of ``R[x]`` in domain A / B (pad row n: 0).
    """

    def __init__(self, adj: torch.Tensor, num_items_a: int):
        adj = adj.coalesce().float()
        n = adj.shape[0]
        eye = torch.arange(n)
        idx = torch.cat([adj.indices(), torch.stack([eye, eye])], dim=1)          # (2, E + n)
        val = torch.cat([adj.values(), torch.ones(n)]) * 0.5                       # (E + n,)
        r = torch.sparse_coo_tensor(idx, val, (n, n), check_invariants=True).coalesce()  # R = (I + Â)/2
        self.n, self.adj = n, adj
        rows, cols = r.indices()
        self.keys = rows * n + cols                                                # (E',) sorted (coalesced)
        self.values = r.values()                                                   # (E',)
        mass = torch.zeros(n + 1, 2)
        mass.index_put_((rows, (cols >= num_items_a).long()), self.values, accumulate=True)
        self.mass = mass                                                           # (n + 1, 2)

    def lookup(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """``R[rows, cols]`` elementwise (any equal shapes; pad rows give 0)."""
        key = rows * self.n + cols
        keys = self.keys.to(key.device)
        pos = torch.searchsorted(keys, key.reshape(-1)).clamp(max=keys.numel() - 1).view_as(key)
        return torch.where(keys[pos] == key, self.values.to(key.device)[pos], torch.zeros((), device=key.device))


class MIFN(nn.Module):
    """Behaviour GRU + knowledge GRU over relation-graph neighbourhoods + switch + generation/pointer heads."""

    def __init__(self, num_items_a: int, num_items_b: int, config: MIFNConfig = MIFNConfig()):
        super().__init__()
        self.config = config
        self.num_items_a, self.num_items_b = num_items_a, num_items_b
        n, d = num_items_a + num_items_b, config.dim
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            self.emb = nn.Embedding(n + 1, d, padding_idx=n)                       # E, pad row n
            nn.init.normal_(self.emb.weight, std=d ** -0.5)
            with torch.no_grad():
                self.emb.weight[n].zero_()
            self.behaviour = nn.GRUCell(d, d)                                      # GRU_b
            self.knowledge = nn.GRUCell(d, d)                                      # GRU_k
            self.gate = nn.Linear(2 * d, d)                                        # W_g
            self.switch = nn.Linear(d, 1)                                          # w_s, b_s
            self.query = nn.Linear(d, d, bias=False)                               # W_q
            self.p_gen = nn.Linear(d, 2)                                           # w_p^A, w_p^B
            self.head_a = nn.Linear(d, num_items_a)                                # W^A
            self.head_b = nn.Linear(d, num_items_b)                                # W^B
        self.drop = Dropout(config.dropout)
        self.relations: Optional[RelationGraph] = None

    def set_graphs(self, graphs: TransitionGraphs) -> None:
        """Use the platform's cross-domain transition graph as the relation graph ``Â``."""
        self.relations = RelationGraph(graphs.cross, self.num_items_a)

    # ------------------------------------------------------------------ flows
    def flows(self, inputs: SequenceInputs) -> Tuple[torch.Tensor, torch.Tensor]:
        """``o`` (B, L, n) mixed representation and the history attention ``α`` (B, L, L)."""
        if self.relations is None:
            raise ValueError("MIFN has no relation graph: call set_graphs(transition_graphs(train_sequences, ...))")
        x = inputs.cross                                                          # (B, L)
        B, L = x.shape
        table = self.emb.weight                                                   # (N + 1, n)
        rel = self.relations
        neigh = torch.sparse.mm(rel.adj.to(table.device), table[:rel.n])         # (N, n) Â E
        neigh = torch.cat([neigh, table[rel.n:]], dim=0)                          # (N + 1, n)
        e = self.drop(table[x])                                                   # (B, L, n)
        kin = self.drop(neigh[x])                                                 # (B, L, n)
        real = inputs.pos_cross > 0                                               # (B, L)
        h = e.new_zeros(B, e.shape[2])                                            # (B, n)
        k = e.new_zeros(B, e.shape[2])                                            # (B, n)
        hs, ks = [], []
        for t in range(L):                                                        # left padding: state waits at 0
            m = real[:, t:t + 1]                                                  # (B, 1)
            h = torch.where(m, self.behaviour(e[:, t], h), h)                     # (B, n)
            k = torch.where(m, self.knowledge(kin[:, t], k), k)                   # (B, n)
            hs.append(h)
            ks.append(k)
        h, k = torch.stack(hs, 1), torch.stack(ks, 1)                             # 2 × (B, L, n)
        o = h + torch.sigmoid(self.gate(torch.cat([h, k], -1))) * k               # (B, L, n)
        att = self.query(o) @ table[x].transpose(1, 2) / math.sqrt(o.shape[2])    # (B, L, L)
        eye = torch.eye(L, dtype=torch.bool, device=x.device)
        allowed = torch.ones(L, L, dtype=torch.bool, device=x.device).tril() & (real.unsqueeze(1) | eye)  # (B, L, L)
        alpha = att.masked_fill(~allowed, float("-inf")).softmax(-1)              # (B, L, L)
        return o, alpha

    def sampled_generation(self, o: torch.Tensor, items: torch.Tensor,
                           negatives: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """``G̃^d(i)`` (module docstring): the generator probability of global ids ``items`` (B, L', C)
        with the normaliser estimated from shared negatives (local ids ``((S_A,), (S_B,))``) → (B, L', C)."""
        return self.log_sampled_generation(o, items, negatives).exp()

    def log_sampled_generation(self, o: torch.Tensor, items: torch.Tensor,
                               negatives: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """``log G̃^d(i)`` of :meth:`sampled_generation`, computed in log space → (B, L', C)."""
        na, gen = self.num_items_a, None
        for d, (head, neg, offset, size) in enumerate(((self.head_a, negatives[0], 0, na),
                                                       (self.head_b, negatives[1], na, self.num_items_b))):
            local = (items - offset).clamp(min=0, max=size - 1)                   # (B, L', C) (other domain: unused)
            l_item = (o.unsqueeze(2) * head.weight[local]).sum(-1) + head.bias[local]  # (B, L', C)
            l_neg = o @ head.weight[neg].T + head.bias[neg]                       # (B, L', S)
            same = neg.view(1, 1, 1, -1) == local.unsqueeze(-1)                   # (B, L', C, S)
            scale = math.log(size / neg.numel())                                  # log(|V^d| / S)
            l_neg = l_neg.unsqueeze(2).masked_fill(same, float("-inf")) + scale  # (B, L', C, S)
            log_z = torch.logsumexp(torch.cat([l_item.unsqueeze(-1), l_neg], dim=-1), dim=-1)  # (B, L', C) log Ẑ
            g = l_item - log_z                                                    # (B, L', C) log G̃
            gen = g if gen is None else torch.where(items >= na, g, gen)
        return gen

    def log_probs(self, inputs: SequenceInputs, items: torch.Tensor, last_only: bool = False,
                  negatives: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        """``log P(i)`` of global item ids ``items`` (B, L', C) at every step (L' = L) or the last (L' = 1).

        ``negatives`` (training only): shared per-domain negatives, local ids ``((S_A,), (S_B,))``;
        the generator term then uses :meth:`sampled_generation` instead of the exact softmax.
        """
        o, alpha = self.flows(inputs)                                             # (B, L, n), (B, L, L)
        if last_only:
            o, alpha = o[:, -1:], alpha[:, -1:]                                   # (B, 1, n), (B, 1, L)
        na, rel = self.num_items_a, self.relations
        is_b = items >= na                                                        # (B, L', C)
        # switch: log P(d(i))
        s = self.switch(o)                                                        # (B, L', 1)
        log_dom = torch.where(is_b, F.logsigmoid(s), F.logsigmoid(-s))            # (B, L', C)
        # generation mode log G^d(i)
        if negatives is None:
            gen_a = self.head_a(o).log_softmax(-1)                                # (B, L', |V^A|)
            gen_b = self.head_b(o).log_softmax(-1)                                # (B, L', |V^B|)
            log_gen = torch.where(is_b, gen_b.gather(2, (items - na).clamp(min=0, max=self.num_items_b - 1)),
                                  gen_a.gather(2, items.clamp(max=na - 1)))       # (B, L', C)
        else:
            log_gen = self.log_sampled_generation(o, items, negatives)            # (B, L', C) log G̃^d(i)
        # pointer mode π(i) / Z^d over history items and their relations
        x = inputs.cross                                                          # (B, L)
        B, Lq, C = items.shape
        rows = x.view(B, 1, 1, -1).expand(B, Lq, C, x.shape[1])                   # (B, L', C, L)
        cols = items.unsqueeze(-1).expand_as(rows)                                # (B, L', C, L)
        pi = (rel.lookup(rows, cols).to(o.dtype) * alpha.unsqueeze(2)).sum(-1)    # (B, L', C)
        z = alpha @ rel.mass.to(o.device, o.dtype)[x]                             # (B, L', 2)
        z_i = torch.where(is_b, z[..., 1:], z[..., :1])                           # (B, L', C)
        logit_q = self.p_gen(o)                                                   # (B, L', 2)
        logit_q = torch.where(is_b, logit_q[..., 1:], logit_q[..., :1])           # (B, L', C)
        # P(i | d) = q G + (1 − q) π / Z, in log space: a probability far below float32's range
        # (a rare item's G under a 30k-item softmax) keeps its order instead of being clamped to a
        # floor that every such candidate shares, which would tie them and rank the GT first
        # under the protocol's optimistic tie rule. Log space also keeps its gradient.
        in_support = (pi > 0) & (z_i > 0)                                         # (B, L', C)
        log_ptr = torch.where(in_support, torch.log(torch.where(in_support, pi, torch.ones_like(pi)))
                              - torch.log(torch.where(in_support, z_i, torch.ones_like(z_i))),
                              torch.full_like(pi, float("-inf")))                 # (B, L', C) log π / Z
        mixed = torch.logaddexp(F.logsigmoid(logit_q) + log_gen, F.logsigmoid(-logit_q) + log_ptr)
        log_in_domain = torch.where(z_i > 0, mixed, log_gen)                      # q := 1 without pointer mass
        return log_dom + log_in_domain                                            # (B, L', C)

    # ------------------------------------------------------------------ interface
    def loss(self, batch: SequenceBatch, negatives: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        """``−mean log P(x_{t+1})`` over every real step with a next item (either domain).

        ``negatives``: explicit shared negatives per domain, local ids ``((S_A,), (S_B,))``; by
        default drawn from torch's RNG if ``config.sampled_negatives`` is set, else the exact ``G^d``.
        """
        mask = batch.unified_a_mask | batch.unified_b_mask                        # (B, L)
        target = torch.where(batch.unified_b_mask, batch.unified_b + self.num_items_a, batch.unified_a)  # (B, L)
        if negatives is None:
            negatives = draw_negatives_torch(self.num_items_a, self.num_items_b, self.config.sampled_negatives,
                                             target.device)                     # None or ((S_A,), (S_B,))
        lp = self.log_probs(batch.inputs, target.unsqueeze(-1), negatives=negatives).squeeze(-1)  # (B, L)
        if not bool(mask.any()):
            return lp.sum() * 0.0
        return -lp[mask].mean()

    def score(self, inputs: SequenceInputs, candidates: torch.Tensor, gt_domain: torch.Tensor) -> torch.Tensor:
        """``log P(i)`` after the last history item for candidates (B, C) (all of domain ``gt_domain`` (B,))."""
        is_b = candidates >= self.num_items_a                                     # (B, C)
        if bool((is_b != gt_domain.bool().unsqueeze(1)).any()):
            raise ValueError("all candidates of a row must lie in that row's gt_domain")
        return self.log_probs(inputs, candidates.unsqueeze(1), last_only=True).squeeze(1)  # (B, C)
