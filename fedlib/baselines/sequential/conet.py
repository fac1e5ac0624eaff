r"""CoNet baseline (cross-domain, non-sequential) adapted to cross-domain sequences.

Reference:
    G. Hu, Y. Zhang, Q. Yang, "CoNet: Collaborative Cross Networks for Cross-Domain
    Recommendation", Proc. 27th ACM International Conference on Information and Knowledge
    Management (CIKM 2018), pp. 667–676. FedCSR (COLING 2025, Tables 2, 6–8) uses it as a
    cross-domain baseline, federated with FedProx.

Model (paper, Sec. 3): one feed-forward tower per domain; the input of tower ``d`` is the
concatenation of a user representation (shared by both domains) and the embedding of an item
of domain ``d``; the towers are joined by **cross connections**, a transfer matrix ``H^l``
shared by both directions between every pair of consecutive layers::

    a^0_A = [u ; e_A(i)],            a^0_B = [u ; e_B(j)]                                  (1)
    a^{l+1}_A = σ(W^l_A a^l_A + b^l_A + H^l a^l_B)                                          (2)
    a^{l+1}_B = σ(W^l_B a^l_B + b^l_B + H^l a^l_A)       (the same H^l in both directions)  (3)
    ŷ_A(u, i) = sigmoid(h_A · a^L_A),  ŷ_B(u, j) = sigmoid(h_B · a^L_B)                    (4)
    L = L_A + L_B,  L_d = −Σ_{(u,i)∈pos ∪ neg} y log ŷ_d + (1 − y) log(1 − ŷ_d)            (5)

with ``σ`` = ReLU and negatives sampled uniformly from the domain's items (paper: log loss
with negative sampling; joint training of both domains sharing ``u`` and ``H``).
Defining mechanism: the **cross connection units** (``H^l``, Eqs. 2–3) through which each
domain's tower reads the other tower's hidden state at every layer (dual knowledge transfer).

Adaptation to sequences (CoNet is **not** a sequential model; this is our choice):

* **User representation.** CoNet learns a one-hot user embedding shared by the domains. Our
  users are sequences (unseen users at test time), so ``u = [mean_A ; mean_B]`` where
  ``mean_d`` is the mean of a user-side embedding table over the domain-``d`` items of the
  history so far (zero if there are none). Order inside the history is ignored (pooling).
* **The other tower's input.** CoNet trains on pairs of a user's items in both domains. At
  prediction time only candidates of the target domain ``d`` exist, so tower ``d`` gets the
  candidate and the other tower ``d'`` gets the user's **latest domain-``d'`` item** of the
  history (padding embedding = 0 if there is none). Training uses the same construction, so
  train and test match; ``L = L_A + L_B`` sums the two domains' instances of a batch.
* **Instances.** At every real position ``j`` of the window the user state is the history up to
  ``j`` (causal) and the positive is the next cross-domain item (``unified_*`` targets of
  :func:`fedlib.baselines.sequential.sequences.make_batch`), scored by the tower of its domain against
  ``num_negatives`` uniform negatives of that domain (Eq. 5).

Simplifications on this machine: ``dim = 64`` embeddings, towers ``3·dim → 64 → 32 → 16``
(paper: larger towers, embedding 32–64), ``num_negatives = 4``, dropout on hidden layers,
no L2 term (use the optimiser's weight decay), no user ids, history pooling as above.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import nn

from fedlib.baselines.sequential.sequences import SequenceBatch, SequenceInputs, check_fields
from fedlib.models.dropout import Dropout


@dataclass(frozen=True)
class CoNetConfig:
    """CoNet hyper-parameters (``hidden``: tower layer sizes after the ``3·dim`` input)."""

    dim: int = 64
    maxlen: int = 15
    hidden: Tuple[int, ...] = (64, 32, 16)
    dropout: float = 0.1
    num_negatives: int = 4
    seed: int = 0

    def __post_init__(self):
        check_fields(self, at_least={"dim": 1, "maxlen": 1, "num_negatives": 1}, rates=("dropout",))
        if len(tuple(self.hidden)) < 1 or any(not isinstance(h, int) or h < 1 for h in self.hidden):
            raise ValueError(f"CoNetConfig.hidden must be one or more positive layer sizes, got {self.hidden!r}")


class CrossUnit(nn.Module):
    """One layer of both towers with a shared cross connection ``H`` (Eqs. 2–3)."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.lin_a = nn.Linear(d_in, d_out)                 # W_A, b_A
        self.lin_b = nn.Linear(d_in, d_out)                 # W_B, b_B
        self.cross = nn.Linear(d_in, d_out, bias=False)     # H (shared by both directions)

    def forward(self, a_a: torch.Tensor, a_b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``a_a``, ``a_b`` (..., d_in) → two (..., d_out)."""
        return (F.relu(self.lin_a(a_a) + self.cross(a_b)),
                F.relu(self.lin_b(a_b) + self.cross(a_a)))


def _causal_mean(table: nn.Embedding, ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Mean of ``table[ids]`` over real positions ``≤ j`` for every ``j``: ids/real (B, L) → (B, L, n)."""
    emb = table(ids) * real.unsqueeze(-1)                   # (B, L, n)
    count = real.cumsum(dim=1).clamp(min=1).unsqueeze(-1)   # (B, L, 1)
    return emb.cumsum(dim=1) / count                        # (B, L, n)


def _latest(ids: torch.Tensor, real: torch.Tensor, pad: int) -> torch.Tensor:
    """The latest real id at or before each position (``pad`` if none): (B, L) → (B, L)."""
    L = ids.shape[1]
    col = torch.arange(L, device=ids.device).expand_as(ids)          # (B, L)
    last = torch.where(real, col, torch.zeros_like(col)).cummax(dim=1).values  # (B, L)
    seen = real.cumsum(dim=1) > 0                                      # (B, L)
    return torch.where(seen, ids.gather(1, last), torch.full_like(ids, pad))


class CoNet(nn.Module):
    """Two towers (A, B) with cross connections; user = pooled per-domain history."""

    def __init__(self, num_items_a: int, num_items_b: int, config: CoNetConfig = CoNetConfig()):
        super().__init__()
        self.config, self.num_items_a, self.num_items_b = config, num_items_a, num_items_b
        d = config.dim
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            # User-side tables (pooled into u) and item-side tables (tower inputs); last row = padding.
            self.user_a = nn.Embedding(num_items_a + 1, d, padding_idx=num_items_a)
            self.user_b = nn.Embedding(num_items_b + 1, d, padding_idx=num_items_b)
            self.item_a = nn.Embedding(num_items_a + 1, d, padding_idx=num_items_a)
            self.item_b = nn.Embedding(num_items_b + 1, d, padding_idx=num_items_b)
            for emb in (self.user_a, self.user_b, self.item_a, self.item_b):
                nn.init.normal_(emb.weight, std=0.1)
                with torch.no_grad():
                    emb.weight[emb.padding_idx].zero_()
            sizes = (3 * d, *config.hidden)
            self.units = nn.ModuleList(CrossUnit(i, o) for i, o in zip(sizes[:-1], sizes[1:]))
            self.out_a = nn.Linear(sizes[-1], 1)            # h_A (Eq. 4)
            self.out_b = nn.Linear(sizes[-1], 1)            # h_B
        self.drop = Dropout(config.dropout)

    # ------------------------------------------------------------------ pieces
    def user_states(self, inputs: SequenceInputs):
        """Per position: ``u`` (B, L, 2n), latest A item (B, L) local id, latest B item (B, L) local id."""
        na, nb = self.num_items_a, self.num_items_b
        real_a, real_b = inputs.pos_a > 0, inputs.pos_b > 0                     # (B, L)
        ids_a = torch.where(real_a, inputs.single_a, torch.full_like(inputs.single_a, na))   # (B, L) local A
        ids_b = torch.where(real_b, inputs.single_b - na, torch.full_like(inputs.single_b, nb))  # (B, L) local B
        u = torch.cat([_causal_mean(self.user_a, ids_a, real_a),
                       _causal_mean(self.user_b, ids_b, real_b)], dim=-1)       # (B, L, 2n)
        return u, _latest(ids_a, real_a, na), _latest(ids_b, real_b, nb)

    def towers(self, u: torch.Tensor, items: torch.Tensor, context: torch.Tensor, domain: int) -> torch.Tensor:
        """Logits ``h_d · a^L_d`` of candidate ``items`` (..., C) of ``domain`` (local ids).

        ``u`` (..., 2n) user part, ``context`` (...,) the other tower's item (local id of the other domain).

        The first layer is split by its input blocks. Of ``W_A [u; e] + H [u; e']`` only the
        candidate's blocks change along C, so the user and context blocks are computed once per
        row and each candidate pays ``2·n·h_1`` multiply-adds instead of ``4·3n·h_1``; when the
        candidates outnumber the domain's items (full ranking) the candidate blocks are taken
        from the projected item table. Same function as :meth:`towers_reference` (tested).
        """
        n, table = self.config.dim, (self.item_a if domain == 0 else self.item_b)
        other = self.item_b if domain == 0 else self.item_a
        first = self.units[0]
        own, cross = (first.lin_a, first.lin_b) if domain == 0 else (first.lin_b, first.lin_a)
        h = first.cross.weight                                                   # (h_1, 3n)
        ctx = other(context)                                                     # (..., n)
        # per row: the candidate's tower reads [u; ·] through W_own and the other tower's input
        # [u; ctx] through H; the other tower reads [u; ctx] through W_other and [u; ·] through H
        row_own = F.linear(u, own.weight[:, :2 * n] + h[:, :2 * n], own.bias) + F.linear(ctx, h[:, 2 * n:])  # (..., h_1)
        row_other = F.linear(u, cross.weight[:, :2 * n] + h[:, :2 * n], cross.bias) + F.linear(ctx, cross.weight[:, 2 * n:])
        blocks = torch.cat([own.weight[:, 2 * n:], h[:, 2 * n:]], dim=0)         # (2·h_1, n): W_own^e, H^e
        if items.numel() > table.num_embeddings:                                 # project the table once
            per_item = F.linear(table.weight, blocks)                            # (|V_d| + 1, 2·h_1)
            cand = F.embedding(items, per_item, padding_idx=table.padding_idx)  # (..., C, 2·h_1)
        else:
            cand = F.linear(table(items), blocks)                                # (..., C, 2·h_1)
        c_own, c_other = cand.split(h.shape[0], dim=-1)                          # 2 × (..., C, h_1)
        a_t = self.drop(F.relu(row_own.unsqueeze(-2) + c_own))                   # (..., C, h_1)
        a_o = self.drop(F.relu(row_other.unsqueeze(-2) + c_other))               # (..., C, h_1)
        a_a, a_b = (a_t, a_o) if domain == 0 else (a_o, a_t)
        for unit in self.units[1:]:
            a_a, a_b = unit(a_a, a_b)                                            # 2 × (..., C, h_l)
            a_a, a_b = self.drop(a_a), self.drop(a_b)
        out = self.out_a(a_a) if domain == 0 else self.out_b(a_b)                # (..., C, 1)
        return out.squeeze(-1)                                                   # (..., C)

    def towers_reference(self, u: torch.Tensor, items: torch.Tensor, context: torch.Tensor, domain: int
                         ) -> torch.Tensor:
        """:meth:`towers` as Eqs. 1–4 read: both towers on the concatenated inputs of every candidate."""
        C = items.shape[-1]
        u_c = u.unsqueeze(-2).expand(*items.shape, u.shape[-1])                # (..., C, 2n)
        if domain == 0:
            cand, ctx = self.item_a(items), self.item_b(context)                # (..., C, n), (..., n)
        else:
            cand, ctx = self.item_b(items), self.item_a(context)
        ctx = ctx.unsqueeze(-2).expand(*items.shape, ctx.shape[-1])             # (..., C, n)
        x_t, x_o = torch.cat([u_c, cand], -1), torch.cat([u_c, ctx], -1)        # 2 × (..., C, 3n)
        a_a, a_b = (x_t, x_o) if domain == 0 else (x_o, x_t)
        for unit in self.units:
            a_a, a_b = unit(a_a, a_b)                                           # 2 × (..., C, h_l)
            a_a, a_b = self.drop(a_a), self.drop(a_b)
        out = self.out_a(a_a) if domain == 0 else self.out_b(a_b)               # (..., C, 1)
        assert out.shape[-2] == C
        return out.squeeze(-1)                                                  # (..., C)

    # ------------------------------------------------------------------ interface
    def loss(self, batch: SequenceBatch) -> torch.Tensor:
        """Eq. 5: BCE of the next cross item (positive) vs ``num_negatives`` uniform negatives, L_A + L_B."""
        u, last_a, last_b = self.user_states(batch.inputs)                      # (B, L, 2n), 2 × (B, L)
        K = self.config.num_negatives
        total = u.new_zeros(())
        for d, (target, mask, n_items, ctx) in enumerate((
                (batch.unified_a, batch.unified_a_mask, self.num_items_a, last_b),
                (batch.unified_b, batch.unified_b_mask, self.num_items_b, last_a))):
            if not bool(mask.any()):
                continue
            pos = target[mask].unsqueeze(-1)                                    # (P, 1) local ids
            neg = torch.randint(0, n_items, (pos.shape[0], K), device=pos.device)  # (P, K)
            logits = self.towers(u[mask], torch.cat([pos, neg], 1), ctx[mask], d)  # (P, 1 + K)
            labels = torch.zeros_like(logits)
            labels[:, 0] = 1.0
            total = total + F.binary_cross_entropy_with_logits(logits, labels)
        return total

    def score(self, inputs: SequenceInputs, candidates: torch.Tensor, gt_domain: torch.Tensor) -> torch.Tensor:
        """``(B, C)`` logits of global candidate ids (all of the GT's domain) after the last position."""
        u, last_a, last_b = self.user_states(inputs)                            # (B, L, 2n), 2 × (B, L)
        u, last_a, last_b = u[:, -1], last_a[:, -1], last_b[:, -1]              # (B, 2n), (B,), (B,)
        out = torch.empty(candidates.shape, dtype=u.dtype, device=u.device)     # (B, C)
        for d in (0, 1):
            m = gt_domain == d                                                  # (B,)
            if not bool(m.any()):
                continue
            local = candidates[m] - (self.num_items_a if d else 0)              # (b, C)
            if bool((local < 0).any()) or bool((local >= (self.num_items_b if d else self.num_items_a)).any()):
                raise ValueError("candidates must all lie in the ground truth's domain")
            ctx = last_b[m] if d == 0 else last_a[m]                            # (b,)
            out[m] = self.towers(u[m], local, ctx, d)
        return out


__all__ = ["CoNetConfig", "CrossUnit", "CoNet"]
