r"""C2DSR: contrastive cross-domain sequential recommendation (a FedCSR baseline, one platform's model).

Reference:
    J. Cao, X. Cong, J. Sheng, T. Liu, B. Wang, "Contrastive Cross-Domain Sequential
    Recommendation", Proceedings of the 31st ACM International Conference on Information
    and Knowledge Management (CIKM 2022), pp. 138–147. FedCSR (Zheng et al., COLING 2025) builds
    on this backbone and compares with it federated with FedProx (Tables 2, 6–8).

Notation: domains ``A`` (ids ``0..|V^A|−1``) and ``B``; ``s*`` the mixed (cross-domain)
sequence, ``s^d`` its domain-``d`` items (time-aligned with ``s*``, other positions padded);
``σ`` the logistic function; ``n`` the feature size::

    Ê = GNN(E, G)  per table: E' = (E + Â E)/2 on the item-transition graph Â          (graph)
    H* = SA*(Ê*[s*]),  H^A = SA^A(Ê^A[s^A]),  H^B = SA^B(Ê^B[s^B])      (three encoders)
    P^A_j = softmax(W^A (H^A_j + H*_j)),   P^B_j = softmax(W^B (H^B_j + H*_j))             (single-domain prediction)
    P*_j  = softmax(W^d H*_j)  for the domain d of s*_{j+1}                                (mixed prediction)
    L_pred = CE(P^A) + CE(P^B) + CE(P*)           (next-item cross-entropy, mean over positions)
    h^d = mean_{j: s^d_j real} H^d_j,   h* = mean_{j real} H*_j                            (sequence summaries)
    s̃*_{¬d} = s* with every item of the other domain replaced by a random other-domain item   (corruption)
    h̃*_{¬d} = mean H*(s̃*_{¬d})
    D_d(u, v) = σ(u^T M_d v + b_d)                                                          (bilinear discriminator)
    L_cl^d = −log D_d(h^d, h*) − log(1 − D_d(h^d, h̃*_{¬d}))                                (infomax, BCE)
    L = L_pred + λ (L_cl^A + L_cl^B)

Defining mechanism: the **contrastive infomax objective** ("cross-domain contrastive
infomax"): a discriminator must tell the true mixed-sequence representation from one whose
other-domain part was corrupted by random items, given the single-domain representation.
Solving it forces the single-domain and the mixed representation to share exactly the
information the other domain adds, i.e. cross-domain transfer. Next to it: the item graph
(GNN) and the three self-attention encoders.

Scoring (as C2DSR and FedCSR's evaluation): the candidates of domain ``d`` are scored by
``W^d (h*_last + h^d_last)``, the cross feature at the last history position plus the
domain-``d`` feature at the last domain-``d`` position (zero if the history has none).

Simplifications on this machine:

* The graph encoder is FedCSR's :class:`~fedlib.baselines.sequential.sequences.GAEncoder` (one parameter-free
  propagation layer ``(E + Â E)/2`` per table, Â the row-normalised transition graph of the
  platform's own training sequences: the cross graph for the mixed table, the domain graphs
  for the single-domain tables) instead of C2DSR's multi-layer GCN over the mixed item graph.
* Small sizes (``dim`` 64 by default, 2 attention blocks, 1 head); corruption replaces *all*
  other-domain items of the window (rows without any other-domain item, or without any
  domain-``d`` item, are left out of ``L_cl^d`` as they have no informative negative).
* One ``W^d`` is shared by the mixed and single-domain heads of domain ``d``; ``λ`` is untuned.
* ``sampled_negatives``: None (default) = the full softmax of ``P^A, P^B, P*``; an int ``S``
  trains the prediction CEs as a sampled softmax over the target and ``S`` uniform same-domain
  negatives shared by the mini-batch (``prediction_loss`` / ``head_cross_entropy``, as FedCSR),
  the grid's stated CPU reduction (1000 on real data); ``score`` stays exact (full logits).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from fedlib.baselines.sequential.sequences import (GAEncoder, SequenceBatch, SequenceInputs, TransitionGraphs, check_fields,
                                      check_sampled_negatives, cross_domain_scores, draw_negatives_torch, prediction_loss)

__all__ = ["C2DSRConfig", "C2DSR", "BilinearDiscriminator", "corrupt_other_domain", "infomax_loss",
           "masked_mean"]


@dataclass(frozen=True)
class C2DSRConfig:
    """Hyper-parameters; ``lambda_cl`` weighs the infomax terms against the prediction losses."""

    dim: int = 64
    maxlen: int = 15
    num_blocks: int = 2
    num_heads: int = 1
    dropout: float = 0.2
    lambda_cl: float = 0.5
    seed: int = 0
    sampled_negatives: Optional[int] = None   # None: full softmax; S: target + S shared uniform negatives

    def __post_init__(self):
        if not isinstance(self.dim, int) or self.dim < 2 or self.dim % self.num_heads:
            raise ValueError(f"dim must be an int >= 2 divisible by num_heads={self.num_heads}, got {self.dim!r}")
        check_fields(self, at_least={"maxlen": 2, "num_blocks": 1}, rates=("dropout",), non_negative=("lambda_cl",))
        check_sampled_negatives(self.sampled_negatives)


def masked_mean(h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Mean of ``h`` (B, L, n) over the real positions (``positions > 0``, (B, L)) → (B, n); 0 if none."""
    real = (positions > 0).unsqueeze(-1).to(h.dtype)                      # (B, L, 1)
    return (h * real).sum(1) / real.sum(1).clamp(min=1.0)                  # (B, n)


def corrupt_other_domain(cross: torch.Tensor, num_items_a: int, num_items_b: int, keep_domain: int,
                         generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Negative mixed sequence for ``L_cl^{keep_domain}``: other-domain items → random other-domain items.

    ``cross`` (B, L) global ids with padding ``num_items_a + num_items_b``; items of
    ``keep_domain`` (0 = A, 1 = B) and padding are kept. Returns (B, L).
    """
    pad = num_items_a + num_items_b
    is_b = (cross >= num_items_a) & (cross != pad)                          # (B, L)
    is_a = cross < num_items_a                                              # (B, L)
    if keep_domain == 0:   # replace B items by uniform B items
        rand = torch.randint(num_items_a, pad, cross.shape, generator=generator, device=cross.device)
        return torch.where(is_b, rand, cross)
    if keep_domain == 1:   # replace A items by uniform A items
        rand = torch.randint(0, num_items_a, cross.shape, generator=generator, device=cross.device)
        return torch.where(is_a, rand, cross)
    raise ValueError(f"keep_domain must be 0 (A) or 1 (B), got {keep_domain!r}")


class BilinearDiscriminator(nn.Module):
    """``D(u, v) = u^T M v + b`` as a logit (the sigmoid is applied inside the BCE)."""

    def __init__(self, dim: int):
        super().__init__()
        self.bilinear = nn.Bilinear(dim, dim, 1)
        nn.init.xavier_uniform_(self.bilinear.weight)
        nn.init.zeros_(self.bilinear.bias)

    def forward(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.bilinear(u, v).squeeze(-1)                              # (B,)


def infomax_loss(disc: BilinearDiscriminator, h_single: torch.Tensor, h_pos: torch.Tensor, h_neg: torch.Tensor,
                 mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``−log D(h^d, h*) − log(1 − D(h^d, h̃*))`` averaged over rows (``mask`` (B,) bool selects rows)."""
    pos = disc(h_single, h_pos)                                             # (B,)
    neg = disc(h_single, h_neg)                                             # (B,)
    per_row = (F.binary_cross_entropy_with_logits(pos, torch.ones_like(pos), reduction="none")
               + F.binary_cross_entropy_with_logits(neg, torch.zeros_like(neg), reduction="none"))  # (B,)
    if mask is None:
        return per_row.mean()
    if not bool(mask.any()):
        return per_row.sum() * 0.0
    return per_row[mask].mean()


class C2DSR(nn.Module):
    """Graph-enhanced three-encoder model with prediction heads and two infomax discriminators."""

    def __init__(self, num_items_a: int, num_items_b: int, config: C2DSRConfig = C2DSRConfig()):
        super().__init__()
        self.config = config
        self.num_items_a, self.num_items_b = num_items_a, num_items_b
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            self.encoder = GAEncoder(num_items_a, num_items_b, config)   # reads dim, maxlen, num_blocks, num_heads, dropout
            self.head_a = nn.Linear(config.dim, num_items_a)                # W^A
            self.head_b = nn.Linear(config.dim, num_items_b)                # W^B
            self.disc_a = BilinearDiscriminator(config.dim)                 # D_A
            self.disc_b = BilinearDiscriminator(config.dim)                 # D_B

    def set_graphs(self, graphs: TransitionGraphs) -> None:
        self.encoder.set_graphs(graphs)

    def _cross_features(self, cross: torch.Tensor, pos_cross: torch.Tensor) -> torch.Tensor:
        """H* of a (possibly corrupted) mixed sequence (B, L) → (B, L, n)."""
        enc = self.encoder
        if enc.graphs is None:
            raise ValueError("C2DSR has no item graphs: call set_graphs(transition_graphs(train_sequences, ...))")
        return enc.enc_cross(enc._features(enc.emb_cross, enc.graphs.cross, cross), pos_cross)

    def loss_parts(self, batch: SequenceBatch, generator: Optional[torch.Generator] = None,
                   negatives: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> Dict[str, torch.Tensor]:
        """``pred`` (sum of the four CE terms), ``cl_a``, ``cl_b`` and ``total``; all scalars.

        ``negatives``: explicit shared negatives per domain, local ids ``((S_A,), (S_B,))``; by
        default drawn from torch's RNG if ``config.sampled_negatives`` is set, else the full softmax.
        """
        x = batch.inputs
        h_cross, h_a, h_b = self.encoder(x)                                 # 3 × (B, L, n)
        if negatives is None:
            negatives = draw_negatives_torch(self.num_items_a, self.num_items_b, self.config.sampled_negatives,
                                             h_cross.device)                # None or ((S_A,), (S_B,))
        terms = prediction_loss((self.head_a, self.head_b), h_cross, h_a, h_b, batch, use_unified=True,
                                use_single=False, negatives=negatives)
        parts = {"pred": sum(terms.values())}
        h_star = masked_mean(h_cross, x.pos_cross)                          # (B, n)
        has_a, has_b = (x.pos_a > 0).any(1), (x.pos_b > 0).any(1)           # (B,), (B,)
        for d, (h_d, pos_d, disc, keep) in enumerate(((h_a, x.pos_a, self.disc_a, has_a & has_b),
                                                     (h_b, x.pos_b, self.disc_b, has_a & has_b))):
            corrupted = corrupt_other_domain(x.cross, self.num_items_a, self.num_items_b, d, generator)  # (B, L)
            h_neg = masked_mean(self._cross_features(corrupted, x.pos_cross), x.pos_cross)             # (B, n)
            parts["cl_" + "ab"[d]] = infomax_loss(disc, masked_mean(h_d, pos_d), h_star, h_neg, keep)
        parts["total"] = parts["pred"] + self.config.lambda_cl * (parts["cl_a"] + parts["cl_b"])
        return parts

    def loss(self, batch: SequenceBatch, negatives: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        return self.loss_parts(batch, negatives=negatives)["total"]

    def score(self, inputs: SequenceInputs, candidates: torch.Tensor, gt_domain: torch.Tensor) -> torch.Tensor:
        """``W^d (h*_last + h^d_last)`` at the candidates (B, C) of the GT domain ``gt_domain`` (B,) → (B, C)."""
        return cross_domain_scores(self.encoder(inputs), inputs, (self.head_a, self.head_b), candidates, gt_domain,
                                   self.num_items_a)
