r"""FedCSR: model, losses and sequence augmentation (one platform's local objective).

Reference:
    D. Zheng et al., "FedCSR: A Federated Framework for Multi-Platform Cross-Domain
    Sequential Recommendation with Dual Contrastive Learning", COLING 2025
    (https://aclanthology.org/2025.coling-main.581/); public code
    https://github.com/zdy769243418/FedCSR-v1 (``model/CDSR.py``, ``model/trainer.py``). The
    federated round loop is not in this module.

Notation: two domains ``d ∈ {A, B}``; ``s*`` the cross-domain sequence, ``s^d`` its
domain-``d`` items in order; ``n`` the feature size; ``τ`` the temperature::

    H^d = GAEncoder(Emb(s^d), A^d),  H* = GAEncoder(Emb(s*), A*)                     (1)
    r^d = Avg_j(H^d_j + H*_j)                     = f(s^d, s* | w)                    (2)
    r_l^d = f(s^d, s* | w_k),  r_g^d = f(s^d, s* | w_global)  (frozen, no gradient)   (3)
    z^d = φ(r^d),  φ: n → ⌊n/2⌋                                                       (4)
    ig(a, b) = −exp(cos(a, b)/τ)                                                      (5)
    L_MCL = −Σ_d log [ ig(z_l^d, z_g^d) / (ig(z_l^d, z_g^d) + Σ_{d'≠d} ig(z_l^d, z_g^{d'})) ]   (6)
    s̃*  = replace ⌊α·|x|⌋ random items of the first half x of s* by other-domain items  (7, 8)
          + randomly reorder the latest ⌊α·|y|⌋ items of the second half y              (9, 10)
    s̃^d = the domain-d items of s̃*                                                   (11)
    r̃^d = f(s̃^d, s̃* | w_k)                                                           (12)
    p = t(r), p̃ = t(r̃),  t: n → 2n → n (broadened)                                   (13)
    q = g_d(p), q̃ = g_d(p̃)  (one matcher per domain)                                  (14)
    L_SCL = Σ_d −cos(q^d, sg(p̃^d)) − cos(q̃^d, sg(p^d))                               (15)
    P_sd = softmax(h^d_j W^d), P_ud = softmax(h*_j W^d), P_cd = softmax((h^d_j + h*_j) W^d)  (16)
    L_Pre = −Σ_d log P_sd^d + log P_ud^d + log P_cd^d      (six cross-entropy terms)    (17)
    L = λ1 L_Pre + λ2 L_MCL + λ3 L_SCL,  (λ1, λ2, λ3) = (0.5, 1.5, 0.5)  (paper, App. A.2) (18)

Readings chosen where the paper is ambiguous:

* **Eq. 6 sign.** Taken literally, ``log(ig_pos / (ig_pos + Σ ig_neg))`` is the log of a
  softmax probability (the minus signs of ``ig`` cancel), and *minimising* it would push the
  positive pair apart. We minimise the NT-Xent form ``−log softmax`` the text describes
  ("similar to NT-Xent"; positives drawn near); ``g`` in the denominator is read as ``ig``.
  Negatives are the *same user's* other-domain global representations (Eq. 6 has one per
  other domain, not the rest of the batch); the loss is averaged over users, summed over domains.
* **Eq. 4**: one projector ``φ`` (the local model's) is applied to both ``r_l`` and the
  detached ``r_g``; a one-layer ``Linear(n, ⌊n/2⌋) + ReLU``. The global representations
  come from a frozen copy of the global model in eval mode (no dropout, no gradient).
* **Augmentation counts**: halves are ``s*[:⌊|s*|/2⌋]`` and the rest; ``⌊α·len⌋`` items are
  replaced / reordered (floors as in Eq. 9). Eq. 9's indices would reorder from position
  ``⌊l(1+α)⌋`` on, i.e. the latest ``(1−α)`` share; we follow the text ("the latest items
  with a ratio α"). Replacements are uniform over the other domain. The augmentation is
  applied to the encoder input window (the augmented view only feeds SCL).
* **Single-domain sequences stay time-aligned** with ``s*`` (other-domain positions are
  padding, positions count within the domain, padding keys are masked), so ``H^d_j + H*_j``
  in Eqs. 2 and 16 is defined and each single-domain encoder sees exactly ``s^d`` in order.
  ``Avg`` in Eq. 2 runs over the real positions of ``s*`` (``H^d`` is zero elsewhere).
* **Graphs** (Eq. 1): a directed edge ``i → j`` when ``j`` directly follows ``i`` (in ``s*``
  for ``A*``, in ``s^d`` for ``A^d``), binary as the paper states (``binary=False`` counts
  repeats as the code does), row-normalised; built by each platform from its own training
  sequences. Propagation has no parameters: ``E' = (E + A E) / 2``; the encoder input is
  ``(E'[s] + E[s]) · √n`` plus a learned position embedding.
* **Matcher** ``g`` ("a nonlinear layer"): ``Linear–ReLU–Linear`` (n → n → n), so its output can
  match ``p`` of either sign; ``t`` is ``Linear(n, 2n)–ReLU–Linear(2n, n)``, shared by domains.
* **Targets** (as C2DSR): the unified head at position ``j`` predicts ``s*_{j+1}`` for the
  domain it belongs to; the single- and cross-domain heads of ``d`` predict, at each
  domain-``d`` position, the next domain-``d`` item. Each term is a mean over its positions.
  ``W^d`` is shared by the three heads of domain ``d``; its index space is ``item`` for A and
  ``item − num_items_a`` for B (``num_items_a`` is the first B item).

Where the public code differs (``model/trainer.py``, ``train_rec.py``): it optimises only the six CE terms (MCL
and SCL are computed but not added; the paper's MCL is absent); its augmentation shuffles
positions 10..L−2; the graph is built centrally from all platforms; a projector MLP with
BatchNorm is applied to every position; a padding class ``lin_PAD`` is added to each head;
the loss uses only the last 10 positions; and a B target equal to ``num_items_a`` is
treated as not-B (``> |X|`` instead of ``>= |X|``).

Ablations are flags of :class:`FedCSRConfig`: ``use_mcl``, ``use_scl``, ``use_unified``,
``use_single``.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Dict, Optional, Sequence as SequenceT, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedlib.baselines.sequential.sequences import (GAEncoder, SequenceBatch, SequenceInputs, TransitionGraphs, check_sampled_negatives,
                                      cross_domain_scores, draw_negatives, inputs_from_cross, prediction_loss)


@dataclass(frozen=True)
class FedCSRConfig:
    """Hyper-parameters of the FedCSR model and local loss (paper / code defaults).

    ``lambdas`` = (λ1, λ2, λ3) multiply (L_Pre, L_MCL, L_SCL) as in Eq. 18.
    ``sampled_negatives``: ``None`` trains every head with the full softmax over its domain
    (Eqs. 16-17); an int ``S`` uses a sampled softmax over the target and ``S`` uniform
    same-domain items shared by the batch (a stated reduction for CPU runs; evaluation is
    unchanged).
    """

    dim: int = 256
    maxlen: int = 15
    num_blocks: int = 2
    num_heads: int = 1
    dropout: float = 0.3
    alpha: float = 0.3
    tau: float = 0.5
    lambdas: Tuple[float, float, float] = (0.5, 1.5, 0.5)
    use_mcl: bool = True
    use_scl: bool = True
    use_unified: bool = True
    use_single: bool = True
    binary_graph: bool = True
    sampled_negatives: Optional[int] = None   # None: full softmax (paper); else shared uniform negatives
    scl_hidden_factor: float = 2.0            # t: n → factor·n → n (paper: 2, "broadened"; Figure 6 sweeps 1/4..4)

    def __post_init__(self):
        if not isinstance(self.dim, int) or self.dim < 2:
            raise ValueError(f"dim must be an int >= 2 (the MCL projector maps to dim // 2), got {self.dim!r}")
        if not isinstance(self.num_heads, int) or self.num_heads < 1 or self.dim % self.num_heads:
            raise ValueError(f"num_heads must be a positive divisor of dim={self.dim}, got {self.num_heads!r}; "
                             "use num_heads=1 (the paper's code) or change dim")
        if not isinstance(self.maxlen, int) or self.maxlen < 2:
            raise ValueError(f"maxlen must be an int >= 2 (input window length), got {self.maxlen!r}; the code uses 15")
        if not isinstance(self.num_blocks, int) or self.num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive int, got {self.num_blocks!r}; the code uses 2")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}; the paper searches {{0.1, 0.2, 0.3}}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha (augmentation ratio) must be in [0, 1], got {self.alpha!r}; the paper's best is 0.3")
        if not self.tau > 0:
            raise ValueError(f"tau must be > 0, got {self.tau!r}; the paper uses 0.5")
        check_sampled_negatives(self.sampled_negatives)
        if not self.scl_hidden_factor > 0 or int(self.scl_hidden_factor * self.dim) < 1:
            raise ValueError(f"scl_hidden_factor must make t's hidden layer >= 1 unit (factor * dim), got "
                             f"{self.scl_hidden_factor!r} with dim={self.dim}; the paper uses 2")
        if len(tuple(self.lambdas)) != 3 or any(not (float(x) >= 0) for x in self.lambdas):
            raise ValueError(f"lambdas must be three non-negative weights (λ1 for L_Pre, λ2 for L_MCL, λ3 for "
                             f"L_SCL), got {self.lambdas!r}; the paper uses (0.5, 1.5, 0.5)")


# ----------------------------------------------------------------------------- augmentation (Eqs. 7–11)
def augment_sequence(seq, num_items_a: int, num_items_b: int, alpha: float,
                     rng: np.random.Generator) -> np.ndarray:
    """Cross-domain augmentation of one cross sequence ``s*`` (no padding): replace, then reorder."""
    seq = np.array(seq, dtype=np.int64)                  # (T,)
    half = seq.size // 2
    # Eqs. 7–8: replace ⌊α·|x|⌋ random items of the first half by items of the other domain.
    k_rep = int(math.floor(alpha * half))
    if k_rep:
        at = rng.choice(half, size=k_rep, replace=False)  # (k_rep,)
        from_a = seq[at] < num_items_a                    # (k_rep,)
        seq[at] = np.where(from_a, num_items_a + rng.integers(0, num_items_b, size=k_rep),
                           rng.integers(0, num_items_a, size=k_rep))
    # Eq. 9: randomly reorder the latest ⌊α·|y|⌋ items of the second half.
    k_ord = int(math.floor(alpha * (seq.size - half)))
    if k_ord > 1:
        seq[seq.size - k_ord:] = seq[seq.size - k_ord:][rng.permutation(k_ord)]
    return seq


def augment_inputs(inputs: SequenceInputs, num_items_a: int, num_items_b: int, alpha: float,
                   rng: np.random.Generator) -> SequenceInputs:
    """Augment every row's cross sequence (Eq. 10) and re-derive the single-domain rows (Eq. 11)."""
    pad = num_items_a + num_items_b
    cross = inputs.cross.cpu().numpy().copy()            # (B, L)
    for r in range(cross.shape[0]):                       # rows are short (L ≤ maxlen); one pass per batch
        real = cross[r] != pad                            # (L,)
        cross[r, real] = augment_sequence(cross[r, real], num_items_a, num_items_b, alpha, rng)
    return inputs_from_cross(cross, num_items_a, num_items_b).to(inputs.cross.device)


def sequence_representations(h_cross: torch.Tensor, h_a: torch.Tensor, h_b: torch.Tensor,
                             pos_cross: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Eq. 2: ``r^d`` = mean over the real positions of ``s*`` of ``H^d + H*`` → two (B, n)."""
    real = (pos_cross > 0).unsqueeze(-1).to(h_cross.dtype)                 # (B, L, 1)
    count = real.sum(dim=1).clamp(min=1.0)                                 # (B, 1)
    return ((h_a + h_cross) * real).sum(1) / count, ((h_b + h_cross) * real).sum(1) / count


# ----------------------------------------------------------------------------- full model
class FedCSRModel(nn.Module):
    """GAEncoder + per-domain prediction layers ``W^A, W^B`` + MCL projector + SCL transform/matchers."""

    def __init__(self, num_items_a: int, num_items_b: int, config: FedCSRConfig = FedCSRConfig(),
                 graphs: Optional[TransitionGraphs] = None):
        super().__init__()
        d = config.dim
        self.config = config
        self.num_items_a, self.num_items_b = num_items_a, num_items_b
        self.encoder = GAEncoder(num_items_a, num_items_b, config, graphs)
        self.head_a = nn.Linear(d, num_items_a)                            # W^A: n → |V^A|
        self.head_b = nn.Linear(d, num_items_b)                            # W^B: n → |V^B|
        self.projector = nn.Sequential(nn.Linear(d, d // 2), nn.ReLU())   # φ (Eq. 4)
        hidden = int(config.scl_hidden_factor * d)                       # paper: 2n (broadened)
        self.transform = nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, d))  # t (Eq. 13)
        self.matchers = nn.ModuleList(nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))
                                      for _ in range(2))                  # g_A, g_B (Eq. 14)

    def set_graphs(self, graphs: TransitionGraphs) -> None:
        self.encoder.set_graphs(graphs)

    def represent(self, inputs: SequenceInputs):
        """``(H*, H^A, H^B, r^A, r^B)``: three (B, L, n) and two (B, n)."""
        return self.represent_views([inputs])[0]

    def represent_views(self, views: SequenceT[SequenceInputs]):
        """:meth:`represent` of each view, the item tables read once for all (:meth:`GAEncoder.encode_views`)."""
        return [(h_cross, h_a, h_b, *sequence_representations(h_cross, h_a, h_b, view.pos_cross))
                for view, (h_cross, h_a, h_b) in zip(views, self.encoder.encode_views(views))]

    def logits(self, h_cross, h_a, h_b) -> Dict[str, torch.Tensor]:
        """Eq. 16 logits per head: (B, L, |V^A|) for ``*_a``, (B, L, |V^B|) for ``*_b``."""
        return {
            "single_a": self.head_a(h_a), "single_b": self.head_b(h_b),
            "unified_a": self.head_a(h_cross), "unified_b": self.head_b(h_cross),
            "cross_a": self.head_a(h_a + h_cross), "cross_b": self.head_b(h_b + h_cross),
        }

    def score(self, inputs: SequenceInputs, candidates: torch.Tensor, gt_domain: torch.Tensor) -> torch.Tensor:
        """(B, C) scores of global candidate ids (all of the row's ``gt_domain``) after each history
        (:func:`cross_domain_scores`)."""
        return cross_domain_scores(self.encoder(inputs), inputs, (self.head_a, self.head_b), candidates, gt_domain,
                                   self.num_items_a)


def frozen_copy(model: FedCSRModel) -> FedCSRModel:
    """A copy of the (global) model for MCL: eval mode, no parameter requires grad."""
    twin = copy.deepcopy(model).eval()
    twin.requires_grad_(False)
    return twin




# ----------------------------------------------------------------------------- losses (Eqs. 5-6, 15, 18)
def information_gap(a: torch.Tensor, b: torch.Tensor, tau: float) -> torch.Tensor:
    """Eq. 5: ``ig(a, b) = −exp(cos(a, b)/τ)``; a, b (B, h) → (B,)."""
    return -torch.exp(F.cosine_similarity(a, b, dim=-1) / tau)


def mcl_loss(z_local: SequenceT[torch.Tensor], z_global: SequenceT[torch.Tensor], tau: float) -> torch.Tensor:
    """Eq. 6 (NT-Xent sign): per domain, positive ``(z_l^d, z_g^d)``, negatives ``(z_l^d, z_g^{d'})``.

    Args: lists over domains of (B, h) tensors. Returns a scalar (mean over users, sum over domains).
    """
    total = z_local[0].new_zeros(())
    for d, zl in enumerate(z_local):
        # ig_pos / Σ_d' ig(z_l^d, z_g^d') = softmax(cos/τ)[d] (the minus signs cancel); log-softmax is the
        # numerically stable form of the same ratio.
        logits = torch.stack([F.cosine_similarity(zl, zg, dim=-1) / tau for zg in z_global], dim=1)  # (B, m)
        total = total - F.log_softmax(logits, dim=1)[:, d].mean()
    return total


def scl_loss(q: torch.Tensor, p_aug: torch.Tensor, q_aug: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Eq. 15 for one domain: ``−cos(q, sg(p̃)) − cos(q̃, sg(p))`` averaged over the batch; (B, n) each."""
    return -(F.cosine_similarity(q, p_aug.detach(), dim=-1).mean()
             + F.cosine_similarity(q_aug, p.detach(), dim=-1).mean())


def global_representations(global_model: FedCSRModel, inputs: SequenceInputs) -> Tuple[torch.Tensor, torch.Tensor]:
    """The frozen global model's ``(r_g^A, r_g^B)`` of ``inputs`` (Eq. 3), two (B, n), without gradient.

    The global model is in eval mode (no dropout, no random draw), so a row's representations do
    not change while the model is frozen: the training loop computes them once per row and round
    (:func:`fedlib.papers.fedcsr.training._local_epochs`) and passes them to :func:`fedcsr_loss`.
    """
    with torch.no_grad():
        *_, g_a, g_b = global_model.represent(inputs)
    return g_a, g_b


def fedcsr_loss(model: FedCSRModel, batch: SequenceBatch, *, augmented: Optional[SequenceInputs] = None,
                global_model: Optional[FedCSRModel] = None, rng: Optional[np.random.Generator] = None,
                config: Optional[FedCSRConfig] = None,
                global_reps: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
                ) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """Eq. 18: ``λ1 L_Pre + λ2 L_MCL + λ3 L_SCL`` with the ablation flags of ``config`` (default: model's).

    Args:
        augmented: the augmented view of ``batch.inputs`` (SCL); drawn from ``rng`` when omitted.
        global_model: the frozen global model (:func:`frozen_copy`) for MCL.
        global_reps: ``global_representations(global_model, batch.inputs)``, two (B, n), when already
            known (then ``global_model`` is not needed); computed from ``global_model`` when omitted.
    Returns:
        total loss and a dict of its parts (``pre``, ``mcl``, ``scl`` and the CE terms), all scalars.
    """
    cfg = config or model.config
    if cfg.sampled_negatives is not None and rng is None:
        raise ValueError("sampled_negatives needs rng=np.random.default_rng(...) to draw the negatives")
    if cfg.use_mcl and global_model is None and global_reps is None:
        raise ValueError("use_mcl=True needs global_model=frozen_copy(<global model>) (or its global_reps) "
                         "(or set use_mcl=False for the w/o-MCL ablation)")
    if cfg.use_scl and augmented is None and rng is None:
        raise ValueError("use_scl=True needs augmented=augment_inputs(...) or rng=np.random.default_rng(...) "
                         "(or set use_scl=False for the w/o-SCL ablation)")
    # rng draws the negatives, then the augmentation (the order of the numpy stream); the dropout masks
    # come from torch's generator, view by view, so drawing both before the encoder changes no number.
    negatives = None
    if cfg.sampled_negatives is not None:
        negatives = draw_negatives(model.num_items_a, model.num_items_b, cfg.sampled_negatives, rng,
                                   model.head_a.weight.device)
    views = [batch.inputs]
    if cfg.use_scl:
        if augmented is None:
            augmented = augment_inputs(batch.inputs, model.num_items_a, model.num_items_b, cfg.alpha, rng)
        views.append(augmented)
    represented = model.represent_views(views)                              # the item tables read once per step
    h_cross, h_a, h_b, r_a, r_b = represented[0]                            # 3 × (B, L, n), 2 × (B, n)
    terms = prediction_loss((model.head_a, model.head_b), h_cross, h_a, h_b, batch,
                            use_unified=cfg.use_unified, use_single=cfg.use_single, negatives=negatives,
                            sparse_grads=model.encoder.sparse_table_grads)
    parts = {"pre": sum(terms.values())}
    parts.update({f"ce_{k}": v for k, v in terms.items()})
    lam_pre, lam_mcl, lam_scl = cfg.lambdas
    total = lam_pre * parts["pre"]
    if cfg.use_mcl:
        g_a, g_b = global_reps if global_reps is not None else global_representations(global_model, batch.inputs)
        z_l = [model.projector(r_a), model.projector(r_b)]                 # 2 × (B, n/2)
        z_g = [model.projector(g_a), model.projector(g_b)]                 # 2 × (B, n/2)
        parts["mcl"] = mcl_loss(z_l, z_g, cfg.tau)
        total = total + lam_mcl * parts["mcl"]
    if cfg.use_scl:
        *_, ra_aug, rb_aug = represented[1]                                 # 2 × (B, n)
        scl = r_a.new_zeros(())
        for d, (r, r_aug) in enumerate(((r_a, ra_aug), (r_b, rb_aug))):
            p, p_aug = model.transform(r), model.transform(r_aug)          # 2 × (B, n)
            q, q_aug = model.matchers[d](p), model.matchers[d](p_aug)      # 2 × (B, n)
            scl = scl + scl_loss(q, p_aug, q_aug, p)
        parts["scl"] = scl
        total = total + lam_scl * scl
    return total, parts


__all__ = ["FedCSRConfig", "FedCSRModel", "augment_sequence", "augment_inputs", "sequence_representations", "frozen_copy",
           "global_representations", "information_gap", "mcl_loss", "scl_loss", "fedcsr_loss"]
