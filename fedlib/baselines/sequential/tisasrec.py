r"""TiSASRec: time-interval aware self-attention on the merged cross-domain sequence.

Reference:
    Jiacheng Li, Yujie Wang, Julian McAuley. "Time Interval Aware Self-Attention for Sequential
    Recommendation." WSDM 2020, pp. 322–330. FedCSR (Zheng et al., COLING 2025, Table 2) runs it,
    federated with FedProx (:mod:`fedlib.baselines.sequential.fedcsr_baselines`), as a sequential baseline
    that "combines the advantages of absolute position and relative time interval coding".

**The mechanism that defines it: time-interval aware self-attention.** Every pair of positions
``(i, j)`` of the sequence carries the (personalised, clipped) time interval between the two
interactions; the interval has its own key and value embeddings, added to the item keys/values
together with absolute-position key/value embeddings.

Notation: ``s = (s_1..s_L)`` the input window (left-padded), ``t_i`` its time stamps, ``n``
the feature size, ``k`` the interval clip (``time_span``)::

    r_min   = min_{i≠j, t_i≠t_j} |t_i − t_j|                          (the user's smallest gap)
    r_ij    = min(⌊|t_i − t_j| / r_min⌋, k)                            personalised, clipped (Sec. 3.2)
    m_i     = M[s_i] · √n                                              item embedding
    e_ij    = (m_i W^Q) (m_j W^K + R^K[r_ij] + P^K[j])ᵀ / √n           relation-aware attention (Eq. 5)
    α_ij    = softmax_{j ≤ i, s_j real} e_ij                           causal, padding masked
    z_i     = Σ_j α_ij (m_j W^V + R^V[r_ij] + P^V[j])                  (Eq. 4)
    h_i     = LN(z_i + q_i) → FFN with residual (ReLU(h W1 + b1) W2 + b2), per block
    P(y | s_{≤i}) = softmax(h_i W^d + b^d)                             one head per domain d

The attention query is the layer-normalised block input ``q_i`` (pre-LN as the authors' code);
keys and values use the un-normalised input. Training: next-item cross-entropy; the final
position ``h_i`` predicts ``s*_{i+1}`` with the head of that item's domain (the "unified"
targets of :func:`fedlib.baselines.sequential.sequences.make_batch`), each domain's CE a mean over its
positions, the two summed. ``score``: the head of the ground truth's domain on ``h_L``.

Simplifications on this machine:

* **Intervals from positions.** :class:`fedlib.data.splits.Sequences` keeps time stamps, but
  the batches of the shared interface (:class:`fedlib.baselines.sequential.sequences.SequenceInputs`) carry
  none, so the model derives ``t_i`` from the 1-based position in the cross sequence
  (``pos_cross``): ``r_min = 1`` and ``r_ij = min(|i − j|, k)``, a relative-position (not a
  time) signal. :meth:`TiSASRec.hidden` accepts real stamps (``times``) when a caller has them,
  and :func:`relation_matrix` implements the paper's personalised interval for real stamps.
* Softmax cross-entropy over each domain's items instead of the paper's binary CE with one
  sampled negative; one attention head (the paper's setting); ``dim = 64``, ``maxlen = 15``,
  two blocks.
* Absolute positions count the real items (1..len, padding 0) rather than window columns.
* ``sampled_negatives``: None (default) trains each domain's CE with the full softmax above; an
  int ``S`` uses a sampled softmax over the target and ``S`` uniform same-domain negatives shared
  by the mini-batch (:func:`~fedlib.baselines.sequential.sequences.head_cross_entropy`), the grid's stated CPU
  reduction (1000 on real data, as FedCSR); ``score`` stays exact (full logits).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import nn

from fedlib.baselines.sequential.sequences import (SequenceBatch, SequenceInputs, check_fields, check_sampled_negatives, draw_negatives_torch,
                                      head_cross_entropy)
from fedlib.baselines.sequential.fedcsr_baselines import gather_domain_scores
from fedlib.models.dropout import Dropout

__all__ = ["TiSASRecConfig", "relation_matrix", "TimeIntervalAttention", "TiSASRec"]


@dataclass(frozen=True)
class TiSASRecConfig:
    dim: int = 64
    maxlen: int = 15
    num_blocks: int = 2
    time_span: int = 256
    dropout: float = 0.2
    seed: int = 0
    sampled_negatives: Optional[int] = None   # None: full softmax; S: target + S shared uniform negatives

    def __post_init__(self):
        check_fields(self, at_least={"dim": 1, "maxlen": 2, "num_blocks": 1, "time_span": 1}, rates=("dropout",))
        check_sampled_negatives(self.sampled_negatives)


def relation_matrix(times: torch.Tensor, real: torch.Tensor, time_span: int) -> torch.Tensor:
    """Personalised clipped intervals ``r_ij = min(⌊|t_i − t_j| / r_min⌋, k)`` → (B, L, L) int64.

    Args:
        times: (B, L) time stamps (any unit); real: (B, L) bool, padding False (its pairs → 0).
        time_span: the clip ``k``.
    ``r_min`` is the row's smallest non-zero gap between real stamps (1 if there is none).
    """
    t = times.to(torch.float64)                                             # (B, L)
    diff = (t.unsqueeze(2) - t.unsqueeze(1)).abs()                          # (B, L, L)
    pair = real.unsqueeze(2) & real.unsqueeze(1)                            # (B, L, L)
    pos_gap = torch.where(pair & (diff > 0), diff, torch.full_like(diff, math.inf))
    r_min = pos_gap.flatten(1).amin(dim=1)                                  # (B,)
    r_min = torch.where(torch.isfinite(r_min), r_min, torch.ones_like(r_min)).view(-1, 1, 1)
    rel = torch.floor(diff / r_min).clamp(max=time_span).to(torch.int64)    # (B, L, L)
    return torch.where(pair, rel, torch.zeros_like(rel))


class TimeIntervalAttention(nn.Module):
    """One TiSASRec block: relation-aware causal attention (Eqs. 4–5) + point-wise FFN."""

    def __init__(self, dim: int, maxlen: int, time_span: int, dropout: float):
        super().__init__()
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.pos_k = nn.Embedding(maxlen + 1, dim, padding_idx=0)           # P^K (position 0 = padding)
        self.pos_v = nn.Embedding(maxlen + 1, dim, padding_idx=0)           # P^V
        self.rel_k = nn.Embedding(time_span + 1, dim)                       # R^K, intervals 0..k
        self.rel_v = nn.Embedding(time_span + 1, dim)                       # R^V
        self.attn_norm = nn.LayerNorm(dim, eps=1e-8)
        self.ffn_norm = nn.LayerNorm(dim, eps=1e-8)
        self.ffn = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), Dropout(dropout), nn.Linear(dim, dim),
                                 Dropout(dropout))
        self.drop = Dropout(dropout)
        self.scale = math.sqrt(dim)

    def attention(self, h: torch.Tensor, positions: torch.Tensor, rel: torch.Tensor):
        """Eqs. 4–5 on the normalised query ``LN(h)``; returns (z (B, L, n), weights (B, L, L), query)."""
        B, L, _ = h.shape
        query = self.attn_norm(h)                                           # (B, L, n)
        q, k, v = self.q(query), self.k(h), self.v(h)                       # 3 × (B, L, n)
        pk, pv = self.pos_k(positions), self.pos_v(positions)               # 2 × (B, L, n)
        rk, rv = self.rel_k(rel), self.rel_v(rel)                           # 2 × (B, L, L, n)
        # e_ij = q_i · (k_j + R^K_ij + P^K_j) / √n
        e = (q @ (k + pk).transpose(1, 2) + torch.einsum("bin,bijn->bij", q, rk)) / self.scale  # (B, L, L)
        eye = torch.eye(L, dtype=torch.bool, device=h.device)               # (L, L)
        causal = torch.ones(L, L, dtype=torch.bool, device=h.device).tril()  # (L, L)
        allowed = causal & ((positions > 0).unsqueeze(1) | eye)             # (B, L, L): real keys ≤ query (or self)
        alpha = torch.softmax(e.masked_fill(~allowed, -math.inf), dim=-1)   # (B, L, L)
        a = self.drop(alpha)
        z = a @ (v + pv) + torch.einsum("bij,bijn->bin", a, rv)             # (B, L, n)
        return z, alpha, query

    def forward(self, h: torch.Tensor, positions: torch.Tensor, rel: torch.Tensor) -> torch.Tensor:
        real = (positions > 0).unsqueeze(-1).to(h.dtype)                    # (B, L, 1)
        z, _, query = self.attention(h, positions, rel)
        h = self.ffn_norm(query + z)                                        # (B, L, n)
        return (h + self.ffn(h)) * real                                     # (B, L, n)


class TiSASRec(nn.Module):
    """TiSASRec encoder over the merged sequence ``s*`` + per-domain prediction heads ``W^A, W^B``."""

    def __init__(self, num_items_a: int, num_items_b: int, config: TiSASRecConfig = TiSASRecConfig()):
        super().__init__()
        self.config, self.num_items_a, self.num_items_b = config, num_items_a, num_items_b
        n, d = num_items_a + num_items_b, config.dim
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            self.item_emb = nn.Embedding(n + 1, d, padding_idx=n)            # M, pad row n
            nn.init.xavier_normal_(self.item_emb.weight)
            with torch.no_grad():
                self.item_emb.weight[n].zero_()
            self.blocks = nn.ModuleList(TimeIntervalAttention(d, config.maxlen, config.time_span, config.dropout)
                                        for _ in range(config.num_blocks))
            self.last_norm = nn.LayerNorm(d, eps=1e-8)
            self.head_a = nn.Linear(d, num_items_a)                          # W^A
            self.head_b = nn.Linear(d, num_items_b)                          # W^B
        self.drop = Dropout(config.dropout)

    def hidden(self, inputs: SequenceInputs, times: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Features ``h_i`` (B, L, n), zero at padding; ``times`` (B, L) real stamps, default ``pos_cross``."""
        positions = inputs.pos_cross                                         # (B, L), 0 = padding
        real = positions > 0                                                 # (B, L)
        rel = relation_matrix(positions if times is None else times, real, self.config.time_span)  # (B, L, L)
        h = self.drop(self.item_emb(inputs.cross) * math.sqrt(self.config.dim))  # (B, L, n)
        h = h * real.unsqueeze(-1).to(h.dtype)
        for block in self.blocks:
            h = block(h, positions, rel)                                     # (B, L, n)
        return self.last_norm(h) * real.unsqueeze(-1).to(h.dtype)           # (B, L, n)

    def loss(self, batch: SequenceBatch, negatives: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        """Sum of the two domains' next-item CEs.

        ``negatives``: explicit shared negatives per domain, local ids ``((S_A,), (S_B,))``; by
        default drawn from torch's RNG if ``config.sampled_negatives`` is set, else the full softmax.
        """
        h = self.hidden(batch.inputs)                                        # (B, L, n)
        if negatives is None:
            negatives = draw_negatives_torch(self.num_items_a, self.num_items_b, self.config.sampled_negatives,
                                             h.device)                       # None or ((S_A,), (S_B,))
        neg_a, neg_b = negatives if negatives is not None else (None, None)
        return (head_cross_entropy(self.head_a, h, batch.unified_a, batch.unified_a_mask, neg_a)
                + head_cross_entropy(self.head_b, h, batch.unified_b, batch.unified_b_mask, neg_b))

    def score(self, inputs: SequenceInputs, candidates: torch.Tensor, gt_domain: torch.Tensor) -> torch.Tensor:
        """(B, C) scores of global candidate ids (all of ``gt_domain``) for the item after the history."""
        h_last = self.hidden(inputs)[:, -1]                                  # (B, n): latest item (left padding)
        return gather_domain_scores(self.head_a(h_last), self.head_b(h_last), candidates, gt_domain,
                                    self.num_items_a)
