r"""π-Net: parallel information-sharing network for shared-account cross-domain SR (baseline).

Reference:
    Muyang Ma, Pengjie Ren, Yujie Lin, Zhumin Chen, Jun Ma, Maarten de Rijke. "π-Net: A
    Parallel Information-sharing Network for Shared-account Cross-domain Sequential
    Recommendations." SIGIR 2019, pp. 685–694. doi:10.1145/3331184.3331200. FedCSR
    (Zheng et al., COLING 2025, Tables 2, 6–8) runs it federated with FedProx.

**The mechanism that defines it: the Shared Account Filter Unit (SFU) followed by the
Cross-Domain Transfer Unit (CTU).** An account is shared by ``K`` latent members, each with a
learned embedding ``r_k``. At every step of domain ``A`` the SFU gates, *per member*, which part
of ``A``'s hidden state should reach domain ``B``, and averages the members' filtered states;
the CTU (a GRU over the filtered states) carries that information along ``A``'s timeline and
hands it to ``B``'s predictor. Both directions run in parallel (``A → B`` and ``B → A``).

Notation: ``x_t`` the embedding of the cross-sequence item at step ``t``; ``h^A_t`` / ``h^B_t``
the latest domain-A / domain-B encoder state at step ``t`` (the state of the last item of that
domain at or before ``t``, zero before the first one); ``σ`` the sigmoid; ``⊙`` elementwise::

    h^A_t = GRU_A(x_t, h^A_{t-1})  if s*_t ∈ A,  else h^A_{t-1}          (sequence encoders)   (1)
    f^k_t = σ(W_fA h^A_t + W_fB h^B_t + U_f s_{t-1} + V_f r_k + b_f)     (SFU gate, member k)  (2)
    s̃^k_t = tanh(W_s h^A_t + U_s s_{t-1} + V_s r_k + b_s)               (member candidate)    (3)
    s^k_t = f^k_t ⊙ s̃^k_t + (1 − f^k_t) ⊙ s_{t-1}                       (filtered, member k)  (4)
    s_t   = (1/K) Σ_k s^k_t                                              (SFU output)          (5)
    c_t   = GRU_T(s_t, c_{t-1})                                          (CTU, A → B)          (6)
            (Eqs. 2–6 update at domain-A steps only; elsewhere s_t = s_{t-1}, c_t = c_{t-1})
    P(next B item | s*_{≤t}) = softmax(W_B [h^B_t ; c^{A→B}_t] + b_B)                            (7)
    P(next A item | s*_{≤t}) = softmax(W_A [h^A_t ; c^{B→A}_t] + b_A)   (mirror of Eqs. 2–6)     (8)
    L = − Σ_t [ log P(next A after t) + log P(next B after t) ]  (each a mean over its steps)    (9)

``K = config.num_members`` latent members per account (default 4, the public code's
``num_members``); each direction has its own member embeddings and gate weights. The gate of
Eq. 2 sees both domains (``h^A`` and ``h^B``) and the previous filtered state; the candidate of
Eq. 3 only the source domain, as in the paper.

Readings chosen:

* **Time-aligned encoders.** The two GRUs run over the time-aligned single-domain views of
  ``s*`` (:func:`fedlib.baselines.sequential.sequences.make_batch`): a domain's state only moves at that
  domain's items, so ``h^B_t`` at an A step is the B state of the latest earlier B item — the
  paper's "h_{B_j}, the last B step before A_i" (the public code gathers it by position).
* **Gate orientation** (Eq. 4): ``f`` lets the new member candidate in and ``1 − f`` keeps the
  previous filtered state, so a closed gate (``f = 0``) transfers nothing new.
* **Parallel next-item targets** (Eq. 9): the paper's training pair (next A item, next B item)
  is applied at every real prefix ``t`` of the window: the first A item after ``t`` and the
  first B item after ``t`` (:func:`parallel_targets`). Evaluation scores the GT-domain head at
  the last history step, which is exactly that prediction for the full history.
* Items are embedded per domain (separate tables, as in the paper); dropout on the embeddings
  and on the concatenation before the softmax.

Simplifications on this machine: one GRU layer per encoder / CTU; ``dim = 64`` (embedding =
hidden size; the paper uses 90–100); input window ``maxlen = 15`` (the evaluation protocol's);
full softmax over the domain's items by default.

* ``sampled_negatives``: None (default) = the full softmax of Eqs. 7–8; an int ``S`` trains
  Eq. 9 as a sampled softmax over the target and ``S`` uniform same-domain negatives shared by
  the mini-batch (dropout on the features, then
  :func:`~fedlib.baselines.sequential.sequences.head_cross_entropy` on ``W_A`` / ``W_B``), the grid's stated CPU
  reduction (1000 on real data, as FedCSR); ``score`` stays exact (full logits).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import nn

from fedlib.baselines.sequential.sequences import (SequenceBatch, SequenceInputs, check_fields, check_sampled_negatives, draw_negatives_torch,
                                      head_cross_entropy)
from fedlib.models.dropout import Dropout

__all__ = ["PiNetConfig", "PiNet", "ParallelSequenceModel", "SharedAccountFilter", "masked_gru", "parallel_targets",
           "candidate_scores", "parallel_loss"]


@dataclass(frozen=True)
class PiNetConfig:
    """π-Net hyper-parameters (``num_members`` = K latent users per shared account)."""

    dim: int = 64
    maxlen: int = 15
    num_members: int = 4
    dropout: float = 0.1
    seed: int = 0
    sampled_negatives: Optional[int] = None   # None: full softmax; S: target + S shared uniform negatives

    def __post_init__(self):
        check_fields(self, at_least={"dim": 1, "maxlen": 1, "num_members": 1}, rates=("dropout",))
        check_sampled_negatives(self.sampled_negatives)


# ----------------------------------------------------------------------------- shared helpers
def masked_gru(cell: nn.GRUCell, x: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """Run ``cell`` over time, updating the state only where ``step`` is True (Eq. 1).

    ``x`` (B, L, n_in), ``step`` (B, L) bool → states (B, L, n): at every ``t`` the state after
    the latest updated step ``≤ t`` (zeros before the first one).
    """
    B, L, _ = x.shape
    h = x.new_zeros(B, cell.hidden_size)                                   # (B, n)
    out = []
    for t in range(L):
        m = step[:, t].unsqueeze(1).to(x.dtype)                            # (B, 1)
        h = m * cell(x[:, t], h) + (1.0 - m) * h                           # (B, n)
        out.append(h)
    return torch.stack(out, dim=1)                                         # (B, L, n)


def parallel_targets(batch: SequenceBatch) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first A item and the first B item after every position (head index spaces).

    Built right to left from the unified targets: at ``t`` the next item is A (take it), or it
    is B at ``t + 1`` and the next A item is the one after ``t + 1``. Returns
    ``(next_a (B, L), mask_a (B, L) bool, next_b, mask_b)``.
    """
    ua, ua_m, ub, ub_m = batch.unified_a, batch.unified_a_mask, batch.unified_b, batch.unified_b_mask
    B, L = ua.shape
    na, ma = torch.zeros_like(ua), torch.zeros_like(ua_m)                  # (B, L)
    nb, mb = torch.zeros_like(ub), torch.zeros_like(ub_m)                  # (B, L)
    carry_a, carry_am = ua.new_zeros(B), ua_m.new_zeros(B)                 # (B,) next A after t+1
    carry_b, carry_bm = ub.new_zeros(B), ub_m.new_zeros(B)                 # (B,)
    for t in range(L - 1, -1, -1):
        na[:, t] = torch.where(ua_m[:, t], ua[:, t], carry_a)
        ma[:, t] = ua_m[:, t] | (ub_m[:, t] & carry_am)
        nb[:, t] = torch.where(ub_m[:, t], ub[:, t], carry_b)
        mb[:, t] = ub_m[:, t] | (ua_m[:, t] & carry_bm)
        carry_a, carry_am, carry_b, carry_bm = na[:, t], ma[:, t], nb[:, t], mb[:, t]
    na, nb = torch.where(ma, na, torch.zeros_like(na)), torch.where(mb, nb, torch.zeros_like(nb))
    return na, ma, nb, mb


def candidate_scores(logits_a: torch.Tensor, logits_b: torch.Tensor, candidates: torch.Tensor,
                     gt_domain: torch.Tensor, num_items_a: int) -> torch.Tensor:
    """Scores of global-id ``candidates`` (B, C) from the GT domain's head: (B, |A|), (B, |B|) → (B, C)."""
    is_b = gt_domain.to(torch.bool).view(-1, 1)                            # (B, 1)
    idx = torch.where(is_b, candidates - num_items_a, candidates)          # (B, C) head index
    lim_a, lim_b = logits_a.shape[1], logits_b.shape[1]
    if bool(((idx < 0) | (is_b & (idx >= lim_b)) | (~is_b & (idx >= lim_a))).any()):
        raise ValueError("candidates must all lie in the ground truth's domain (gt_domain)")
    sa = logits_a.gather(1, idx.clamp(max=lim_a - 1))                      # (B, C)
    sb = logits_b.gather(1, idx.clamp(max=lim_b - 1))                      # (B, C)
    return torch.where(is_b, sb, sa)


# ----------------------------------------------------------------------------- SFU (Eqs. 2–5)
def parallel_loss(model: nn.Module, batch: SequenceBatch,
                  negatives: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
    """Eq. 9 of π-Net and PSJNet: next-A plus next-B cross-entropy at every prefix (each a mean).

    ``model`` has ``features(inputs) -> (z_A, z_B)`` (B, L, 2n), ``drop``, ``head_a``, ``head_b``
    and ``config.sampled_negatives``. ``negatives``: explicit shared negatives per domain, local
    ids ``((S_A,), (S_B,))``; by default drawn from torch's RNG when ``sampled_negatives`` is set,
    else the full softmax.
    """
    z_a, z_b = model.features(batch.inputs)                                # (B, L, 2n) each
    ta, ma, tb, mb = parallel_targets(batch)
    if negatives is None:
        negatives = draw_negatives_torch(model.num_items_a, model.num_items_b, model.config.sampled_negatives,
                                         z_a.device)                       # None or ((S_A,), (S_B,))
    neg_a, neg_b = negatives if negatives is not None else (None, None)
    return (head_cross_entropy(model.head_a, model.drop(z_a), ta, ma, neg_a)
            + head_cross_entropy(model.head_b, model.drop(z_b), tb, mb, neg_b))


class SharedAccountFilter(nn.Module):
    """Shared Account Filter Unit of one direction (source → target domain), ``K`` members."""

    def __init__(self, dim: int, num_members: int):
        super().__init__()
        self.members = nn.Parameter(torch.empty(num_members, dim))         # r_k: (K, n)
        nn.init.xavier_normal_(self.members)
        self.gate_in = nn.Linear(3 * dim, dim)                             # [W_fA W_fB U_f], b_f
        self.gate_member = nn.Linear(dim, dim, bias=False)                 # V_f
        self.cand_in = nn.Linear(2 * dim, dim)                             # [W_s U_s], b_s
        self.cand_member = nn.Linear(dim, dim, bias=False)                 # V_s

    def step(self, h_src: torch.Tensor, h_tgt: torch.Tensor, prev: torch.Tensor):
        """One SFU step: ``h_src, h_tgt, prev`` (B, n) → ``(s_t (B, n), f (B, K, n), s^k (B, K, n))``."""
        f = torch.sigmoid(self.gate_in(torch.cat([h_src, h_tgt, prev], -1)).unsqueeze(1)
                          + self.gate_member(self.members))                # (B, K, n)   Eq. 2
        cand = torch.tanh(self.cand_in(torch.cat([h_src, prev], -1)).unsqueeze(1)
                          + self.cand_member(self.members))                # (B, K, n)   Eq. 3
        per_member = f * cand + (1.0 - f) * prev.unsqueeze(1)              # (B, K, n)   Eq. 4
        return per_member.mean(dim=1), f, per_member                       # (B, n)      Eq. 5

    def forward(self, h_src: torch.Tensor, h_tgt: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        """``h_src, h_tgt`` (B, L, n), ``step`` (B, L) source-domain steps → filtered states (B, L, n)."""
        B, L, n = h_src.shape
        s = h_src.new_zeros(B, n)                                          # (B, n)
        out = []
        for t in range(L):
            m = step[:, t].unsqueeze(1).to(h_src.dtype)                    # (B, 1)
            new, _, _ = self.step(h_src[:, t], h_tgt[:, t], s)
            s = m * new + (1.0 - m) * s                                    # (B, n)
            out.append(s)
        return torch.stack(out, dim=1)                                     # (B, L, n)


# ----------------------------------------------------------------------------- model
class ParallelSequenceModel(nn.Module):
    """The parallel framework that π-Net and PSJNet share.

    Per domain an item table and a GRU encoder ``h^A, h^B`` (Eq. 1); the subclass's units
    carry each domain's state to the other (:meth:`transfer`); a softmax head per domain
    reads ``[h^A ; x^{B→A}]`` and ``[h^B ; x^{A→B}]`` (Eqs. 7–8), trained with Eq. 9.
    """

    def __init__(self, num_items_a: int, num_items_b: int, config):
        super().__init__()
        self.config = config
        self.num_items_a, self.num_items_b = num_items_a, num_items_b
        n = config.dim
        with torch.random.fork_rng(devices=[]):          # parameters in a fixed order from config.seed
            torch.manual_seed(config.seed)
            self.emb_a = nn.Embedding(num_items_a + 1, n, padding_idx=num_items_a)   # pad row = |A|
            self.emb_b = nn.Embedding(num_items_b + 1, n, padding_idx=num_items_b)   # pad row = |B|
            for emb in (self.emb_a, self.emb_b):
                nn.init.xavier_normal_(emb.weight)
                with torch.no_grad():
                    emb.weight[emb.padding_idx].zero_()
            self.gru_a, self.gru_b = nn.GRUCell(n, n), nn.GRUCell(n, n)               # Eq. 1
            self.build_transfer(n)
            self.head_a = nn.Linear(2 * n, num_items_a)                               # [h^A; x^{B→A}]
            self.head_b = nn.Linear(2 * n, num_items_b)                               # [h^B; x^{A→B}]
        self.drop = Dropout(config.dropout)

    def build_transfer(self, dim: int) -> None:
        """Create the cross-domain units (called inside the seeded construction)."""
        raise NotImplementedError

    def transfer(self, h_a: torch.Tensor, h_b: torch.Tensor, step_a: torch.Tensor, step_b: torch.Tensor
                 ) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(x^{B→A}, x^{A→B})``, two (B, L, n), from the encoders' states (B, L, n) and step masks (B, L)."""
        raise NotImplementedError

    def features(self, inputs: SequenceInputs) -> Tuple[torch.Tensor, torch.Tensor]:
        """Per-step head inputs ``[h^A_t ; x^{B→A}_t]`` and ``[h^B_t ; x^{A→B}_t]``: two (B, L, 2n)."""
        na, nb = self.num_items_a, self.num_items_b
        step_a, step_b = inputs.pos_a > 0, inputs.pos_b > 0                # (B, L) bool
        ids_a = inputs.single_a.clamp(max=na)                              # (B, L); pad → |A|
        ids_b = (inputs.single_b - na).clamp(min=0, max=nb)                # (B, L); pad → |B|
        h_a = masked_gru(self.gru_a, self.drop(self.emb_a(ids_a)), step_a)  # (B, L, n)  Eq. 1
        h_b = masked_gru(self.gru_b, self.drop(self.emb_b(ids_b)), step_b)  # (B, L, n)
        x_ba, x_ab = self.transfer(h_a, h_b, step_a, step_b)               # 2 × (B, L, n)
        return torch.cat([h_a, x_ba], -1), torch.cat([h_b, x_ab], -1)

    def logits(self, inputs: SequenceInputs) -> Tuple[torch.Tensor, torch.Tensor]:
        """Eqs. 7–8: (B, L, |A|) and (B, L, |B|)."""
        z_a, z_b = self.features(inputs)
        return self.head_a(self.drop(z_a)), self.head_b(self.drop(z_b))

    def loss(self, batch: SequenceBatch,
             negatives: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        """Eq. 9: next-A and next-B cross-entropy at every prefix (each a mean over its steps).

        ``negatives``: explicit shared negatives per domain, local ids ``((S_A,), (S_B,))``; by
        default drawn from torch's RNG if ``config.sampled_negatives`` is set, else the full softmax.
        """
        return parallel_loss(self, batch, negatives)

    @torch.no_grad()
    def score(self, inputs: SequenceInputs, candidates: torch.Tensor, gt_domain: torch.Tensor) -> torch.Tensor:
        """(B, C) scores of global-id candidates of the GT domain after each whole history.

        Eqs. 7–8 at the last position only: the heads at the earlier prefixes are training
        targets, and skipping them (L − 1 of L item-sized products per domain) is what makes
        an evaluation round cheap. Equal to ``logits(inputs)[:, -1]`` (tests/test_pinet.py).
        """
        z_a, z_b = self.features(inputs)                                   # (B, L, 2n) each
        logit_a = self.head_a(self.drop(z_a[:, -1]))                       # (B, |A|)
        logit_b = self.head_b(self.drop(z_b[:, -1]))                       # (B, |B|)
        return candidate_scores(logit_a, logit_b, candidates, gt_domain, self.num_items_a)


class PiNet(ParallelSequenceModel):
    """π-Net: the parallel framework with SFU + CTU in both directions (Eqs. 2–6)."""

    def __init__(self, num_items_a: int, num_items_b: int, config: PiNetConfig = PiNetConfig()):
        super().__init__(num_items_a, num_items_b, config)

    def build_transfer(self, dim: int) -> None:
        self.sfu_ab = SharedAccountFilter(dim, self.config.num_members)               # in A, for B
        self.sfu_ba = SharedAccountFilter(dim, self.config.num_members)               # in B, for A
        self.ctu_ab, self.ctu_ba = nn.GRUCell(dim, dim), nn.GRUCell(dim, dim)         # Eq. 6

    def transfer(self, h_a, h_b, step_a, step_b):
        s_ab = self.sfu_ab(h_a, h_b, step_a)                               # (B, L, n)  Eqs. 2–5
        s_ba = self.sfu_ba(h_b, h_a, step_b)                               # (B, L, n)
        c_ab = masked_gru(self.ctu_ab, s_ab, step_a)                       # (B, L, n)  Eq. 6
        c_ba = masked_gru(self.ctu_ba, s_ba, step_b)                       # (B, L, n)
        return c_ba, c_ab
