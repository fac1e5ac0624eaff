r"""CLSR: contrastive disentanglement of long- and short-term interests (sequential baseline).

Reference:
    Yu Zheng, Chen Gao, Jianxin Chang, Yanan Niu, Yang Song, Depeng Jin, Yong Li.
    "Disentangling Long and Short-Term Interests for Recommendation." WWW 2022, pp. 2256–2267.
    FedCSR (Zheng et al., COLING 2025, Table 2) runs it, federated with FedProx
    (:mod:`fedlib.baselines.sequential.fedcsr_baselines`), "to disentangle long and short interests with a
    contrastive learning method".

**The mechanism that defines it: self-supervised disentanglement.** Two separate encoders
produce a long-term interest ``u_l`` and a short-term interest ``u_s``; each is pulled, by a
pairwise (BPR) contrastive loss, towards its own *proxy* computed from the raw history (the
mean of the whole history for the long term, the mean of the latest ``k`` items for the short
term) and pushed from the other one's, and vice versa. An attention network then fuses the two
adaptively, per (history, target item).

Notation: ``x_j = E[s_j]`` (item embeddings, global ids), position ``t`` the latest item of the
history, ``q`` a learned long-term query, ``τ(a, b) = MLP([a, b, a − b, a ⊙ b])`` (``4n → n →
1``), ``⟨·,·⟩`` the inner product::

    α_j  = softmax_{j ≤ t} τ_l(W_l x_j, q),     u_l = Σ_j α_j x_j               long-term encoder
    o_j  = GRU(W_s x_1..x_j),  β_j = softmax_{j ≤ t} τ_s(o_j, o_t),  u_s = Σ_j β_j o_j   short-term
    p_l  = mean_{j ≤ t} x_j,    p_s = mean_{t−k < j ≤ t} x_j                    proxies
    f(a, p, q) = softplus(⟨a, q⟩ − ⟨a, p⟩)                                       BPR contrast
    L_con = f(u_l, p_l, p_s) + f(p_l, u_l, u_s) + f(u_s, p_s, p_l) + f(p_s, u_s, u_l)
    h_t  = GRU'(x_1..x_t)                                                        history state
    a    = σ(MLP_f([h_t, u_l, u_s, x_v]))                                        adaptive fusion
    u    = a · u_l + (1 − a) · u_s,   ŷ_v = ⟨u, x_v⟩ + b_v                       prediction
    L    = L_rec + β · L_con

``L_rec`` is a sampled softmax: at every position ``t`` whose next merged-sequence item ``y``
is known, ``−log softmax([ŷ_y, ŷ_{n_1}, ..., ŷ_{n_N}])[0]`` with ``N`` negatives drawn
uniformly from ``y``'s domain (the fusion depends on the target, so every candidate gets its
own fused interest); ``L_con`` is averaged over all real positions. On the merged cross-domain
sequence, candidates of domain ``d`` are scored by the same item table (one head per domain =
that domain's rows of ``E`` and ``b``), negatives always from the GT's domain.

Simplifications on this machine:

* **No user embedding.** The paper's long-term encoder queries the history with the user's
  own embedding; validation/test users never appear in training here and a per-user table
  cannot be federated, so the query ``q`` is one learned vector shared by all users.
* **Long term = the input window.** Both encoders see the latest ``maxlen`` (15) items, so the
  long-term proxy is the window mean; the short-term proxy uses the latest ``short_k`` (3).
* Encoders are causal over the window (every position is a training example); GRUs are
  single-layer with masked left padding (the state stays 0 until the first real item); the
  prediction is an inner product plus an item bias (not the paper's optional MLP scorer);
  ``dim = 64``, 20 sampled negatives, ``β = 0.1``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict

import torch
import torch.nn.functional as F
from torch import nn

from fedlib.baselines.sequential.sequences import SequenceBatch, SequenceInputs, check_fields
from fedlib.models.dropout import Dropout

__all__ = ["CLSRConfig", "CLSR", "bpr_contrast", "contrastive_loss", "interest_proxies", "masked_gru"]


@dataclass(frozen=True)
class CLSRConfig:
    dim: int = 64
    maxlen: int = 15
    short_k: int = 3
    num_negatives: int = 20
    beta: float = 0.1
    dropout: float = 0.2
    seed: int = 0

    def __post_init__(self):
        check_fields(self, at_least={"dim": 1, "maxlen": 2, "short_k": 1, "num_negatives": 1}, rates=("dropout",),
                     non_negative=("beta",))
        if self.short_k > self.maxlen:
            raise ValueError(f"CLSRConfig.short_k must be at most maxlen={self.maxlen}, got {self.short_k!r}")


# ----------------------------------------------------------------------------- pieces
def bpr_contrast(anchor: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """``f(a, p, q) = softplus(⟨a, q⟩ − ⟨a, p⟩)`` elementwise over leading dims; (..., n) → (...)."""
    return F.softplus((anchor * neg).sum(-1) - (anchor * pos).sum(-1))


def contrastive_loss(u_l: torch.Tensor, u_s: torch.Tensor, p_l: torch.Tensor, p_s: torch.Tensor) -> torch.Tensor:
    """``L_con`` per example: the four BPR terms aligning each interest with its proxy; (..., n) → (...)."""
    return (bpr_contrast(u_l, p_l, p_s) + bpr_contrast(p_l, u_l, u_s)
            + bpr_contrast(u_s, p_s, p_l) + bpr_contrast(p_s, u_s, u_l))


def interest_proxies(x: torch.Tensor, positions: torch.Tensor, short_k: int):
    """Causal proxies at every position ``i``: ``p_l`` = mean of real ``x_j`` (j ≤ i), ``p_s`` = of the last k.

    x (B, L, n), positions (B, L) (1-based count of real items, 0 = padding) → two (B, L, n).
    """
    B, L, _ = x.shape
    real = positions > 0                                                    # (B, L)
    causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()     # (L, L): j ≤ i
    long_w = causal & real.unsqueeze(1)                                     # (B, L, L) [i, j]
    recent = (positions.unsqueeze(2) - positions.unsqueeze(1)) < short_k    # (B, L, L): pos_i − pos_j < k
    short_w = long_w & recent                                               # (B, L, L)
    out = []
    for w in (long_w, short_w):
        w = w.to(x.dtype)
        out.append((w @ x) / w.sum(-1, keepdim=True).clamp(min=1.0))        # (B, L, n)
    return out[0], out[1]


def masked_gru(cell: nn.GRUCell, x: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Run ``cell`` left to right; the state is carried (not updated) over padding. → (B, L, n)."""
    B, L, _ = x.shape
    h = x.new_zeros(B, cell.hidden_size)                                    # (B, n)
    outs = []
    for j in range(L):                                                      # L ≤ maxlen steps
        nxt = cell(x[:, j], h)                                              # (B, n)
        h = torch.where(real[:, j:j + 1], nxt, h)
        outs.append(h)
    return torch.stack(outs, dim=1)                                         # (B, L, n)


class PairAttention(nn.Module):
    """``τ(a, b) = MLP([a, b, a − b, a ⊙ b])`` → one logit; (..., n), (..., n) → (...)."""

    def __init__(self, dim: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(4 * dim, dim), nn.ReLU(), nn.Linear(dim, 1))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([a, b, a - b, a * b], dim=-1)).squeeze(-1)

    def pairs(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``τ(a_j, b_i)`` for every pair: a (B, L, n), b (B, L, n) → (B, L, L) ``[i, j]``.

        The same function as :meth:`forward` on the broadcast pairs, by the first layer's
        linearity: ``W [a, b, a − b, a ⊙ b] = (W_1 + W_3) a + (W_2 − W_3) b + W_4 (a ⊙ b)``.
        The first two terms are per token, so only ``a ⊙ b`` is formed per pair: one n × n
        product per pair instead of a 4n × n one, and no (B, L, L, 4n) concatenation.
        """
        first, relu, last = self.mlp
        w1, w2, w3, w4 = first.weight.chunk(4, dim=1)                       # 4 × (n, n)
        own = F.linear(a, w1 + w3)                                          # (B, L, n): the a_j term
        other = F.linear(b, w2 - w3, first.bias)                            # (B, L, n): the b_i term and bias
        mixed = F.linear(a.unsqueeze(1) * b.unsqueeze(2), w4)               # (B, L, L, n): [i, j] = W_4 (a_j ⊙ b_i)
        hidden = relu(mixed + own.unsqueeze(1) + other.unsqueeze(2))        # (B, L, L, n)
        return last(hidden).squeeze(-1)                                     # (B, L, L)


# ----------------------------------------------------------------------------- model
class CLSR(nn.Module):
    """Long-/short-term encoders, proxies + contrast, target-aware adaptive fusion."""

    def __init__(self, num_items_a: int, num_items_b: int, config: CLSRConfig = CLSRConfig()):
        super().__init__()
        self.config, self.num_items_a, self.num_items_b = config, num_items_a, num_items_b
        n, d = num_items_a + num_items_b, config.dim
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            self.item_emb = nn.Embedding(n + 1, d, padding_idx=n)            # E, pad row n
            nn.init.normal_(self.item_emb.weight, std=1.0 / math.sqrt(d))
            with torch.no_grad():
                self.item_emb.weight[n].zero_()
            self.item_bias = nn.Parameter(torch.zeros(n + 1))               # b
            self.long_query = nn.Parameter(torch.randn(d) / math.sqrt(d))   # q (stands in for the user)
            self.long_proj = nn.Linear(d, d, bias=False)                    # W_l
            self.long_att = PairAttention(d)                                # τ_l
            self.short_proj = nn.Linear(d, d, bias=False)                   # W_s
            self.short_gru = nn.GRUCell(d, d)
            self.short_att = PairAttention(d)                               # τ_s
            self.hist_gru = nn.GRUCell(d, d)                                # GRU' (fusion context)
            self.fuse_h = nn.Linear(d, d)                                   # MLP_f layer 1, split by input:
            self.fuse_l = nn.Linear(d, d, bias=False)                       #   [h_t, u_l, u_s, x_v] W = h W_h
            self.fuse_s = nn.Linear(d, d, bias=False)                       #   + u_l W_l + u_s W_s + x_v W_v
            self.fuse_v = nn.Linear(d, d, bias=False)
            self.fuse_out = nn.Linear(d, 1)                                 # MLP_f layer 2
        self.drop = Dropout(config.dropout)

    # -- encoders
    def interests(self, inputs: SequenceInputs) -> Dict[str, torch.Tensor]:
        """Every position's ``u_l, u_s, p_l, p_s, h`` (B, L, n) and the ``real`` mask (B, L)."""
        positions = inputs.pos_cross                                         # (B, L)
        real = positions > 0                                                 # (B, L)
        B, L = positions.shape
        x = self.drop(self.item_emb(inputs.cross))                           # (B, L, n)
        causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()  # (L, L)
        allowed = causal & real.unsqueeze(1)                                 # (B, L, L) [i, j]: real j ≤ i
        eye = torch.eye(L, dtype=torch.bool, device=x.device)
        allowed = allowed | (eye & ~real.unsqueeze(2))                       # padding rows: self only (no NaN)
        # Long term: α_ij ∝ exp τ_l(W_l x_j, q) over real j ≤ i.
        e_l = self.long_att(self.long_proj(x), self.long_query.expand_as(x))  # (B, L)
        alpha = torch.softmax(e_l.unsqueeze(1).expand(B, L, L).masked_fill(~allowed, -math.inf), dim=-1)
        u_l = alpha @ x                                                      # (B, L, n)
        # Short term: o = GRU(W_s x); β_ij ∝ exp τ_s(o_j, o_i) over real j ≤ i.
        o = masked_gru(self.short_gru, self.short_proj(x), real)             # (B, L, n)
        e_s = self.short_att.pairs(o, o)                                     # (B, L, L): [i, j] = τ_s(o_j, o_i)
        beta = torch.softmax(e_s.masked_fill(~allowed, -math.inf), dim=-1)   # (B, L, L)
        u_s = beta @ o                                                       # (B, L, n)
        p_l, p_s = interest_proxies(x, positions, self.config.short_k)       # 2 × (B, L, n)
        h = masked_gru(self.hist_gru, x, real)                               # (B, L, n)
        return {"u_l": u_l, "u_s": u_s, "p_l": p_l, "p_s": p_s, "h": h, "real": real}

    def fused_scores(self, h: torch.Tensor, u_l: torch.Tensor, u_s: torch.Tensor, items: torch.Tensor):
        """``ŷ_v`` for candidate ids ``items`` (P, C) given (P, n) states → scores (P, C), fusion a (P, C)."""
        v = self.item_emb(items)                                             # (P, C, n)
        ctx = self.fuse_h(h) + self.fuse_l(u_l) + self.fuse_s(u_s)           # (P, n)
        a = torch.sigmoid(self.fuse_out(torch.relu(ctx.unsqueeze(1) + self.fuse_v(v)))).squeeze(-1)  # (P, C)
        u = a.unsqueeze(-1) * u_l.unsqueeze(1) + (1 - a.unsqueeze(-1)) * u_s.unsqueeze(1)           # (P, C, n)
        return (u * v).sum(-1) + self.item_bias[items], a                    # (P, C), (P, C)

    # -- interface
    def loss_parts(self, batch: SequenceBatch) -> Dict[str, torch.Tensor]:
        """``rec`` (sampled softmax), ``con`` (L_con mean over real positions) and ``total``."""
        cfg, na, nb = self.config, self.num_items_a, self.num_items_b
        z = self.interests(batch.inputs)
        has = batch.unified_a_mask | batch.unified_b_mask                    # (B, L): next item known
        is_b = batch.unified_b_mask[has]                                     # (P,)
        target = torch.where(is_b, batch.unified_b[has] + na, batch.unified_a[has])  # (P,) global ids
        P = target.numel()
        u = torch.rand(P, cfg.num_negatives, device=target.device)          # (P, N)
        size = torch.where(is_b, nb, na).unsqueeze(1)                        # (P, 1)
        negs = (u * size).long().clamp(max=size - 1) + torch.where(is_b, na, 0).unsqueeze(1)  # (P, N) same domain
        items = torch.cat([target.unsqueeze(1), negs], dim=1)                # (P, 1 + N), positive first
        scores, _ = self.fused_scores(z["h"][has], z["u_l"][has], z["u_s"][has], items)  # (P, 1 + N)
        rec = F.cross_entropy(scores, torch.zeros(P, dtype=torch.long, device=scores.device)) if P \
            else scores.sum() * 0.0
        real = z["real"]
        con = contrastive_loss(z["u_l"][real], z["u_s"][real], z["p_l"][real], z["p_s"][real]).mean()
        return {"rec": rec, "con": con, "total": rec + cfg.beta * con}

    def loss(self, batch: SequenceBatch) -> torch.Tensor:
        return self.loss_parts(batch)["total"]

    def score(self, inputs: SequenceInputs, candidates: torch.Tensor, gt_domain: torch.Tensor) -> torch.Tensor:
        """(B, C) fused scores of global candidate ids (all of ``gt_domain``) after each history."""
        if bool(((candidates >= self.num_items_a) != gt_domain.view(-1, 1).bool()).any()):
            raise ValueError("every candidate must lie in its row's ground-truth domain (gt_domain)")
        z = self.interests(inputs)
        scores, _ = self.fused_scores(z["h"][:, -1], z["u_l"][:, -1], z["u_s"][:, -1], candidates)
        return scores                                                        # (B, C)
