r"""PSJNet-II: parallel split-join network for shared-account cross-domain SR (baseline).

Reference:
    Wenchao Sun, Muyang Ma, Pengjie Ren, Yujie Lin, Zhumin Chen, Zhaochun Ren, Jun Ma,
    Maarten de Rijke. "Parallel Split-Join Networks for Shared Account Cross-domain Sequential
    Recommendations." ACM TOIS 2021 (arXiv:1910.02448). FedCSR (Zheng et al., COLING 2025,
    Tables 2, 6–8) runs it federated with FedProx. PSJNet-I is π-Net
    (:mod:`fedlib.baselines.sequential.pinet`); this module is **PSJNet-II** ("split-and-join").

**The mechanism that defines it: split, then join.** A shared account mixes ``K`` latent user
roles. The *split* unit gates each domain's hidden states into ``K`` role-specific
representations, one recurrent gated state per role, each keeping only what is relevant to the
other domain (unlike π-Net / PSJNet-I, which averages the members inside the recurrence:
"split-by-join"). The *join* unit then carries every role's representation along the source
timeline and joins the ``K`` transferred role representations into one cross-domain
representation, weighting the roles by their match with the target domain's current state; a
hybrid decoder predicts from the target domain's own state plus the joined representation.

Notation as in :mod:`fedlib.baselines.sequential.pinet` (``h^A_t``, ``h^B_t``: time-aligned GRU states;
``r_k``: role embeddings, ``k = 1..K``); direction ``A → B`` shown, ``B → A`` mirrors it::

    h^A_t = GRU_A(x_t, h^A_{t-1})  if s*_t ∈ A,  else h^A_{t-1}                             (1)
    f^k_t = σ(W_fA h^A_t + W_fB h^B_t + U_f s^k_{t-1} + V_f r_k + b_f)     split gate, role k  (2)
    s̃^k_t = tanh(W_s h^A_t + U_s s^k_{t-1} + V_s r_k + b_s)                                  (3)
    s^k_t = f^k_t ⊙ s̃^k_t + (1 − f^k_t) ⊙ s^k_{t-1}          role-specific state (kept apart)  (4)
    c^k_t = GRU_J(s^k_t, c^k_{t-1})                           join: transfer of role k          (5)
            (Eqs. 2–5 update at domain-A steps only; one GRU_J shared by the K roles)
    e^k_t = v^T tanh(W_1 c^k_t + W_2 h^B_t),  α_t = softmax_k(e_t)       role weights        (6)
    j^{A→B}_t = Σ_k α^k_t c^k_t                                          joined representation (7)
    P(next B item | s*_{≤t}) = softmax(W_B [h^B_t ; j^{A→B}_t] + b_B)    hybrid decoder       (8)
    L = − Σ_t [ log P(next A after t) + log P(next B after t) ]                               (9)

``K = config.num_roles`` latent roles (default 4); each direction has its own role embeddings.

Readings chosen (our reconstruction of the paper's description; details we could not confirm
are ours):

* The split gate (Eq. 2) has π-Net's form but each role keeps its **own** previous state
  ``s^k_{t-1}`` (split-and-join), instead of the member average (π-Net's split-by-join).
* The join (Eqs. 5–7) transfers each role with one shared GRU and combines the roles by an
  additive attention against the target domain's current state ``h^B_t``, so which role is
  "speaking" can differ per step and per target domain.
* Targets, time alignment, gate orientation and evaluation as in :mod:`fedlib.baselines.sequential.pinet`
  (next A / next B item after every prefix; the GT-domain head at the last history step).

Simplifications on this machine: one GRU layer everywhere; ``dim = 64``; ``maxlen = 15``; full
softmax over the domain's items by default.

* ``sampled_negatives``: None (default) = the full softmax of Eq. 8; an int ``S`` trains Eq. 9
  as a sampled softmax over the target and ``S`` uniform same-domain negatives shared by the
  mini-batch (dropout on the features, then :func:`~fedlib.baselines.sequential.sequences.head_cross_entropy`
  on ``W_A`` / ``W_B``), the grid's stated CPU reduction (1000 on real data, as FedCSR);
  ``score`` stays exact (full logits).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from fedlib.baselines.sequential.sequences import check_fields, check_sampled_negatives
from fedlib.baselines.sequential.pinet import ParallelSequenceModel, masked_gru

__all__ = ["PSJNetConfig", "PSJNet", "SplitUnit", "JoinUnit"]


@dataclass(frozen=True)
class PSJNetConfig:
    """PSJNet-II hyper-parameters (``num_roles`` = K latent user roles per shared account)."""

    dim: int = 64
    maxlen: int = 15
    num_roles: int = 4
    dropout: float = 0.1
    seed: int = 0
    sampled_negatives: Optional[int] = None   # None: full softmax; S: target + S shared uniform negatives

    def __post_init__(self):
        check_fields(self, at_least={"dim": 1, "maxlen": 1, "num_roles": 1}, rates=("dropout",))
        check_sampled_negatives(self.sampled_negatives)


class SplitUnit(nn.Module):
    """Eqs. 2–4: ``K`` role-specific gated states of the source domain, for the target domain."""

    def __init__(self, dim: int, num_roles: int):
        super().__init__()
        self.roles = nn.Parameter(torch.empty(num_roles, dim))             # r_k: (K, n)
        nn.init.xavier_normal_(self.roles)
        self.gate_in = nn.Linear(2 * dim, dim)                             # [W_fA W_fB], b_f
        self.gate_state = nn.Linear(dim, dim, bias=False)                  # U_f
        self.gate_role = nn.Linear(dim, dim, bias=False)                   # V_f
        self.cand_in = nn.Linear(dim, dim)                                 # W_s, b_s
        self.cand_state = nn.Linear(dim, dim, bias=False)                  # U_s
        self.cand_role = nn.Linear(dim, dim, bias=False)                   # V_s

    def step(self, h_src: torch.Tensor, h_tgt: torch.Tensor, prev: torch.Tensor):
        """``h_src, h_tgt`` (B, n), ``prev`` (B, K, n) → ``(s^k_t (B, K, n), f (B, K, n))``."""
        f = torch.sigmoid(self.gate_in(torch.cat([h_src, h_tgt], -1)).unsqueeze(1)
                          + self.gate_state(prev) + self.gate_role(self.roles))  # (B, K, n)  Eq. 2
        cand = torch.tanh(self.cand_in(h_src).unsqueeze(1) + self.cand_state(prev)
                          + self.cand_role(self.roles))                    # (B, K, n)  Eq. 3
        return f * cand + (1.0 - f) * prev, f                              # (B, K, n)  Eq. 4

    def forward(self, h_src: torch.Tensor, h_tgt: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        """``h_src, h_tgt`` (B, L, n), ``step`` (B, L) → role states (B, L, K, n)."""
        B, L, n = h_src.shape
        s = h_src.new_zeros(B, self.roles.shape[0], n)                     # (B, K, n)
        out = []
        for t in range(L):
            m = step[:, t].view(B, 1, 1).to(h_src.dtype)                   # (B, 1, 1)
            new, _ = self.step(h_src[:, t], h_tgt[:, t], s)
            s = m * new + (1.0 - m) * s                                    # (B, K, n)
            out.append(s)
        return torch.stack(out, dim=1)                                     # (B, L, K, n)


class JoinUnit(nn.Module):
    """Eqs. 5–7: per-role transfer GRU (shared weights) + role attention against the target state."""

    def __init__(self, dim: int):
        super().__init__()
        self.gru = nn.GRUCell(dim, dim)                                    # GRU_J
        self.w_role = nn.Linear(dim, dim, bias=False)                      # W_1
        self.w_tgt = nn.Linear(dim, dim)                                   # W_2 (+ bias)
        self.v = nn.Linear(dim, 1, bias=False)                             # v

    def transfer(self, roles: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        """Eq. 5: role states (B, L, K, n), ``step`` (B, L) → transferred states (B, L, K, n)."""
        B, L, K, n = roles.shape
        flat = roles.permute(0, 2, 1, 3).reshape(B * K, L, n)              # (B·K, L, n)
        c = masked_gru(self.gru, flat, step.repeat_interleave(K, dim=0))   # (B·K, L, n)
        return c.view(B, K, L, n).permute(0, 2, 1, 3)                      # (B, L, K, n)

    def weights(self, c: torch.Tensor, h_tgt: torch.Tensor) -> torch.Tensor:
        """Eq. 6: ``c`` (B, L, K, n), ``h_tgt`` (B, L, n) → α (B, L, K), summing to 1 over K."""
        e = self.v(torch.tanh(self.w_role(c) + self.w_tgt(h_tgt).unsqueeze(2))).squeeze(-1)  # (B, L, K)
        return torch.softmax(e, dim=-1)

    def forward(self, roles: torch.Tensor, h_tgt: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        """Joined cross-domain representation ``j_t`` (B, L, n) (Eq. 7)."""
        c = self.transfer(roles, step)                                     # (B, L, K, n)
        alpha = self.weights(c, h_tgt)                                     # (B, L, K)
        return (alpha.unsqueeze(-1) * c).sum(dim=2)                        # (B, L, n)


class PSJNet(ParallelSequenceModel):
    """PSJNet-II: π-Net's parallel framework with split and join units in both directions."""

    def __init__(self, num_items_a: int, num_items_b: int, config: PSJNetConfig = PSJNetConfig()):
        super().__init__(num_items_a, num_items_b, config)

    def build_transfer(self, dim: int) -> None:
        self.split_ab, self.split_ba = SplitUnit(dim, self.config.num_roles), SplitUnit(dim, self.config.num_roles)
        self.join_ab, self.join_ba = JoinUnit(dim), JoinUnit(dim)

    def transfer(self, h_a, h_b, step_a, step_b):
        j_ab = self.join_ab(self.split_ab(h_a, h_b, step_a), h_b, step_a)  # (B, L, n)  A → B
        j_ba = self.join_ba(self.split_ba(h_b, h_a, step_b), h_a, step_b)  # (B, L, n)  B → A
        return j_ba, j_ab
