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
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence as SequenceT, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedlib.data.splits import Sequences
from fedlib.models.dropout import Dropout, dropout as drop_out


# ----------------------------------------------------------------------------- config
def check_sampled_negatives(value) -> None:
    """Raise ``ValueError`` unless ``value`` is None (full softmax) or a positive int (sampled softmax)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"sampled_negatives must be None (full softmax over the domain's items) or a positive int "
                         f"(uniform same-domain negatives shared by the mini-batch), got {value!r}")


def check_fields(config: Any, *, at_least: Mapping[str, int] = {}, rates: SequenceT[str] = (),
                 non_negative: SequenceT[str] = ()) -> None:
    """Validate a sequential model's config; errors name ``<Config>.<field>`` and the bad value.

    Args:
        at_least: field -> the smallest allowed int (``{"dim": 1, "maxlen": 2}``).
        rates: fields that must lie in ``[0, 1)`` (dropout-like).
        non_negative: fields that must be finite numbers ``>= 0`` (loss weights).
    """
    name = type(config).__name__
    for field, low in at_least.items():
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}.{field} must be an int >= {low}, got {value!r}")
    for field in rates:
        value = getattr(config, field)
        if not 0.0 <= value < 1.0:                                         # NaN fails too
            raise ValueError(f"{name}.{field} must be in [0, 1), got {value!r}")
    for field in non_negative:
        value = getattr(config, field)
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name}.{field} must be a finite number >= 0, got {value!r}")


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


# ----------------------------------------------------------------------------- batching
class SequenceInputs(NamedTuple):
    """Encoder inputs, left-padded ``(B, L)``; single-domain rows are time-aligned with ``cross``.

    ``cross``/``single_a``/``single_b`` hold global item ids (pad = num_items_a + num_items_b);
    ``pos_*`` hold 1-based positions within that sequence (0 = padding).
    """

    cross: torch.Tensor     # (B, L) int64
    single_a: torch.Tensor  # (B, L) int64, A items at A positions, pad elsewhere
    single_b: torch.Tensor  # (B, L) int64, B items at B positions, pad elsewhere
    pos_cross: torch.Tensor  # (B, L) int64
    pos_a: torch.Tensor      # (B, L) int64
    pos_b: torch.Tensor      # (B, L) int64

    def to(self, device) -> "SequenceInputs":
        return SequenceInputs(*(t.to(device) for t in self))


class SequenceBatch(NamedTuple):
    """Inputs plus next-item targets (head index spaces: A = item, B = item − num_items_a)."""

    inputs: SequenceInputs
    unified_a: torch.Tensor       # (B, L) int64 target of the unified A head (0 where masked)
    unified_a_mask: torch.Tensor  # (B, L) bool: the next cross item is an A item
    unified_b: torch.Tensor       # (B, L) int64
    unified_b_mask: torch.Tensor  # (B, L) bool
    next_a: torch.Tensor          # (B, L) int64 next A item after an A position (single/cross heads)
    next_a_mask: torch.Tensor     # (B, L) bool
    next_b: torch.Tensor          # (B, L) int64
    next_b_mask: torch.Tensor     # (B, L) bool

    def to(self, device) -> "SequenceBatch":
        return SequenceBatch(self.inputs.to(device), *(t.to(device) for t in self[1:]))


def domain_index(items, num_items_a: int):
    """``(is_b, index)``: B items are ``items >= num_items_a`` and index ``items − num_items_a``."""
    items = torch.as_tensor(items)
    is_b = items >= num_items_a
    return is_b, torch.where(is_b, items - num_items_a, items)


def inputs_from_cross(cross: np.ndarray, num_items_a: int, num_items_b: int) -> SequenceInputs:
    """Derive both single-domain rows and all positions from a left-padded cross matrix ``(B, L)``."""
    cross = np.asarray(cross, dtype=np.int64)            # (B, L)
    pad = num_items_a + num_items_b
    real = cross != pad                                  # (B, L)
    is_a = real & (cross < num_items_a)                  # (B, L)
    is_b = real & ~is_a                                  # (B, L)
    single_a = np.where(is_a, cross, pad)                # (B, L)
    single_b = np.where(is_b, cross, pad)                # (B, L)
    positions = [np.cumsum(m, axis=1) * m for m in (real, is_a, is_b)]  # 3 × (B, L)
    return SequenceInputs(*(torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64))
                            for x in (cross, single_a, single_b, *positions)))


def _next_of_domain(window: np.ndarray, in_domain: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """For every column j < W−1: the first in-domain item in columns > j (and whether one exists)."""
    rows, width = window.shape
    nxt = np.zeros((rows, width - 1), dtype=np.int64)    # (B, L)
    has = np.zeros((rows, width - 1), dtype=bool)        # (B, L)
    cur = np.zeros(rows, dtype=np.int64)                 # (B,)
    cur_has = np.zeros(rows, dtype=bool)                 # (B,)
    for j in range(width - 1, 0, -1):                    # right to left over columns (L steps)
        cur = np.where(in_domain[:, j], window[:, j], cur)
        cur_has = cur_has | in_domain[:, j]
        nxt[:, j - 1], has[:, j - 1] = cur, cur_has
    return nxt, has


def make_batch(sequences: Union[Sequences, SequenceT], num_items_a: int, num_items_b: int,
               maxlen: int = 15, rows=None) -> SequenceBatch:
    """Left-padded inputs (the last ``maxlen`` items before each row's final item) and targets.

    Args:
        sequences: a :class:`Sequences` or a list of item-id sequences (oldest first).
        rows: optional subset of rows of ``sequences``.
    """
    if not isinstance(sequences, Sequences):
        sequences = Sequences.from_lists(np.arange(len(sequences)), [list(s) for s in sequences])
    if rows is not None:
        sequences = sequences.subset(rows)
    if len(sequences) and sequences.lengths().min() < 2:
        raise ValueError("every sequence needs at least 2 items (an input and a next-item target)")
    pad = num_items_a + num_items_b
    window = sequences.padded(maxlen + 1, pad)           # (B, L+1): inputs window[:, :-1], next items window[:, 1:]
    cross = window[:, :-1]                               # (B, L)
    nxt = window[:, 1:]                                  # (B, L)
    real = cross != pad                                  # (B, L)
    # Unified heads: the next cross-domain item, routed to the head of its domain.
    uni_b_mask = real & (nxt >= num_items_a)             # (B, L); ">=": num_items_a is the first B item
    uni_a_mask = real & (nxt < num_items_a)              # (B, L)
    # Single/cross heads: at a domain-d position, the next domain-d item (anywhere later).
    in_a = window < num_items_a                          # (B, L+1)
    in_b = (window >= num_items_a) & (window != pad)     # (B, L+1)
    next_a, has_a = _next_of_domain(window, in_a)        # (B, L)
    next_b, has_b = _next_of_domain(window, in_b)        # (B, L)
    next_a_mask = in_a[:, :-1] & has_a                   # (B, L)
    next_b_mask = in_b[:, :-1] & has_b                   # (B, L)
    t = lambda x: torch.from_numpy(np.ascontiguousarray(x))
    return SequenceBatch(
        inputs_from_cross(cross, num_items_a, num_items_b),
        t(np.where(uni_a_mask, nxt, 0)), t(uni_a_mask),
        t(np.where(uni_b_mask, nxt - num_items_a, 0)), t(uni_b_mask),
        t(np.where(next_a_mask, next_a, 0)), t(next_a_mask),
        t(np.where(next_b_mask, next_b - num_items_a, 0)), t(next_b_mask),
    )


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


# ----------------------------------------------------------------------------- graphs (Eq. 1)
class TransitionGraphs(NamedTuple):
    cross: torch.Tensor  # (n, n) sparse, row-normalised, n = num_items_a + num_items_b
    a: torch.Tensor      # (num_items_a, num_items_a) sparse
    b: torch.Tensor      # (num_items_b, num_items_b) sparse, local ids item − num_items_a


def _row_normalised(src: np.ndarray, dst: np.ndarray, size: int, binary: bool) -> torch.Tensor:
    flat = src * size + dst                               # (E,)
    if binary:
        flat = np.unique(flat)
    keys, counts = np.unique(flat, return_counts=True)    # (E',)
    rows, cols = keys // size, keys % size
    weights = counts.astype(np.float64)
    out_deg = np.bincount(rows, weights=weights, minlength=size)  # (size,)
    values = weights / out_deg[rows]
    index = torch.from_numpy(np.stack([rows, cols]).astype(np.int64))
    return torch.sparse_coo_tensor(index, torch.from_numpy(values).float(), (size, size),
                                   check_invariants=True).coalesce()


def transition_graphs(sequences: Union[Sequences, SequenceT], num_items_a: int, num_items_b: int,
                      *, binary: bool = True) -> TransitionGraphs:
    """Directed item-transition graphs of the given (training) sequences, row-normalised.

    Edge ``i → j`` when ``j`` directly follows ``i`` in ``s*`` (cross graph) or in ``s^d``
    (domain graph, local ids). ``binary=False`` weights an edge by its number of occurrences.
    """
    if not isinstance(sequences, Sequences):
        sequences = Sequences.from_lists(np.arange(len(sequences)), [list(s) for s in sequences])
    items, indptr = sequences.items, sequences.indptr
    n = num_items_a + num_items_b
    if items.size and (items.min() < 0 or items.max() >= n):
        raise ValueError(f"item ids must be in [0, {n}); got range [{items.min()}, {items.max()}]")
    row_of = np.repeat(np.arange(len(sequences)), np.diff(indptr))  # (total,)
    is_b = items >= num_items_a                                      # (total,)
    graphs = []
    for keep, offset, size in ((np.ones_like(is_b), 0, n), (~is_b, 0, num_items_a), (is_b, num_items_a, num_items_b)):
        it, rw = items[keep] - offset, row_of[keep]                  # order kept within each row
        same = rw[1:] == rw[:-1]                                     # consecutive pairs in one sequence
        graphs.append(_row_normalised(it[:-1][same], it[1:][same], size, binary))
    return TransitionGraphs(*graphs)


# ----------------------------------------------------------------------------- encoder (Eqs. 1–2)
class CausalSelfAttention(nn.Module):
    """SASRec-style encoder: learned positions, pre-LN attention blocks, causal + padding mask.

    Two paths give the same function (tested, with dropout off):

    * :meth:`forward` (packed): every per-token layer (the q/k/v and output projections, the
      layer norms, the feed-forward net, dropout) runs on the **real** tokens only, ``(T, n)``
      with ``T`` = number of non-padding positions; only the ``(B, L, L)`` attention itself is
      laid out padded. A padding position's output is zero and no real position attends to
      one, so the padding rows of the reference path are pure waste: on Food-Kitchen a batch
      is ~45 % padding in the cross-domain sequence and ~70 % in each single-domain sequence
      (they are time-aligned with the cross sequence).
    * :meth:`forward_reference`: the plain padded form with :class:`torch.nn.MultiheadAttention`.

    The attention parameters live in ``nn.MultiheadAttention`` modules in both paths, so the
    state dict (and what FedAvg averages) is the same.
    """

    def __init__(self, dim: int, maxlen: int, num_blocks: int, num_heads: int, dropout: float):
        super().__init__()
        self.num_heads = num_heads
        self.pos = nn.Embedding(maxlen + 1, dim, padding_idx=0)
        self.drop = Dropout(dropout)
        self.attn_norm = nn.ModuleList(nn.LayerNorm(dim, eps=1e-8) for _ in range(num_blocks))
        self.attn = nn.ModuleList(nn.MultiheadAttention(dim, num_heads, dropout=dropout, batch_first=True)
                                  for _ in range(num_blocks))
        self.ffn_norm = nn.ModuleList(nn.LayerNorm(dim, eps=1e-8) for _ in range(num_blocks))
        self.ffn = nn.ModuleList(nn.Sequential(nn.Linear(dim, dim), Dropout(dropout), nn.ReLU(),
                                               nn.Linear(dim, dim), Dropout(dropout))
                                 for _ in range(num_blocks))
        self.last_norm = nn.LayerNorm(dim, eps=1e-8)

    @staticmethod
    def _allowed(positions: torch.Tensor) -> torch.Tensor:
        """(B, L, L) bool: query i may read key j when j ≤ i and j is real (or j = i)."""
        L = positions.shape[1]
        eye = torch.eye(L, dtype=torch.bool, device=positions.device)          # (L, L)
        causal = torch.ones(L, L, dtype=torch.bool, device=positions.device).tril()  # (L, L)
        return causal & ((positions > 0).unsqueeze(1) | eye)                   # (B, L, L)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``x`` (B, L, n) item features, ``positions`` (B, L) (0 = padding) → (B, L, n), zero at padding."""
        B, L, n = x.shape
        heads, head_dim = self.num_heads, n // self.num_heads
        token = (positions > 0).reshape(-1).nonzero().squeeze(1)              # (T,) real positions of B·L
        h = self.drop(x.reshape(B * L, n)[token] + self.pos(positions.reshape(-1)[token]))  # (T, n)
        blocked = ~self._allowed(positions).unsqueeze(1)                       # (B, 1, L, L)
        for norm, attn, fnorm, ffn in zip(self.attn_norm, self.attn, self.ffn_norm, self.ffn):
            q = norm(h)                                                        # (T, n); keys/values read h
            w, b = attn.in_proj_weight, attn.in_proj_bias                      # (3n, n), (3n,)
            qkv = torch.cat([F.linear(q, w[:n], b[:n]), F.linear(h, w[n:], b[n:])], dim=1)  # (T, 3n)
            padded = qkv.new_zeros(B * L, 3 * n).index_copy(0, token, qkv)   # (B·L, 3n)
            qp, kp, vp = padded.view(B, L, 3, heads, head_dim).permute(2, 0, 3, 1, 4)  # 3 × (B, heads, L, d_h)
            scores = (qp @ kp.transpose(-1, -2)) / math.sqrt(head_dim)         # (B, heads, L, L)
            weights = drop_out(torch.softmax(scores.masked_fill(blocked, float("-inf")), dim=-1),
                               attn.dropout, self.training)                   # (B, heads, L, L)
            mixed = (weights @ vp).transpose(1, 2).reshape(B * L, n)[token]    # (T, n)
            a = F.linear(mixed, attn.out_proj.weight, attn.out_proj.bias)      # (T, n)
            h = fnorm(q + a)                                                   # (T, n)
            h = h + ffn(h)                                                     # (T, n)
        out = self.last_norm(h)                                                # (T, n)
        return out.new_zeros(B * L, n).index_copy(0, token, out).view(B, L, n)  # (B, L, n)

    def forward_reference(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` in the plain padded form (``nn.MultiheadAttention`` on all B·L positions)."""
        real = (positions > 0).unsqueeze(-1).to(x.dtype)                  # (B, L, 1)
        h = self.drop(x + self.pos(positions)) * real                      # (B, L, n)
        blocked = (~self._allowed(positions)).repeat_interleave(self.num_heads, dim=0)  # (B·heads, L, L)
        for norm, attn, fnorm, ffn in zip(self.attn_norm, self.attn, self.ffn_norm, self.ffn):
            q = norm(h)                                                    # (B, L, n)
            a, _ = attn(q, h, h, attn_mask=blocked, need_weights=False)    # (B, L, n)
            h = fnorm(q + a)                                               # (B, L, n)
            h = (h + ffn(h)) * real                                        # (B, L, n)
        return self.last_norm(h) * real                                    # (B, L, n)


def propagate(graph: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Parameter-free graph layer ``(E + A E) / 2`` on the first ``graph.shape[0]`` rows (the rest: pad)."""
    n = graph.shape[0]
    items = table[:n]                                                      # (n, dim)
    mixed = 0.5 * (items + torch.sparse.mm(graph, items))                  # (n, dim)
    return torch.cat([mixed, table[n:]], dim=0)                            # (n + 1, dim)


def propagate_rows(graph: torch.Tensor, table: torch.Tensor, ids: torch.Tensor, *,
                   residual: bool = False) -> torch.Tensor:
    """``propagate(graph, table)[ids]`` (plus ``table[ids]`` if ``residual``), from the rows ``ids`` need.

    A batch touches a few thousand of the tens of thousands of items, so mixing only those
    rows costs their out-degree instead of the whole graph, forward and backward (FedCSR's
    training step on Food-Kitchen: the full propagation was a fifth of it). Same values as the
    full propagation up to the order of the float sums (tested).

    The table is read through **one** gather of the rows involved (the batch's items and their
    successors). Every index into a parameter costs its backward a zero-filled gradient of the
    whole table (tens of thousands of rows) and an add into ``.grad``; one gather pays that once
    instead of four times per table and forward.

    Args:
        graph: ``(n, n)`` sparse COO, row-normalised (:func:`transition_graphs`).
        table: ``(n + 1, d)`` item table, row ``n`` = padding.
        ids: ``(...)`` item ids in ``[0, n]``.
        residual: add the raw rows ``table[ids]`` (the encoder's ``E + propagate(E)`` input, Eq. 1).
    Returns:
        ``(..., d)`` graph-mixed rows.
    """
    n = graph.shape[0]
    graph = graph if graph.is_coalesced() else graph.coalesce()           # edges sorted by row
    edge_rows, edge_cols = graph.indices()                                 # (E,), (E,)
    weights = graph.values()                                               # (E,)
    row_start = torch.zeros(n + 1, dtype=torch.long, device=table.device)  # CSR row pointers
    row_start[1:] = torch.bincount(edge_rows, minlength=n).cumsum(0)
    unique_ids, inverse = torch.unique(ids.reshape(-1), return_inverse=True)  # (U,) sorted: pad (n) last
    real = int((unique_ids < n).sum())
    rows = unique_ids[:real]                                               # (R,) real items
    first, degree = row_start[rows], row_start[rows + 1] - row_start[rows]  # (R,), (R,)
    owner = torch.repeat_interleave(torch.arange(real, device=table.device), degree)  # (S,)
    offset_in_row = torch.arange(owner.numel(), device=table.device) - (degree.cumsum(0) - degree)[owner]
    edges = first[owner] + offset_in_row                                   # (S,) positions in the COO arrays
    needed, local = torch.unique(torch.cat([unique_ids, edge_cols[edges]]), return_inverse=True)  # (N,), (U + S,)
    gathered = table[needed]                                               # (N, d): the one read of the table
    own = gathered[local[:unique_ids.numel()]]                             # (U, d) = table[unique_ids]
    messages = weights[edges, None].to(table.dtype) * gathered[local[unique_ids.numel():]]  # (S, d)
    neighbours = torch.zeros(real, table.shape[1], dtype=table.dtype, device=table.device)
    neighbours = neighbours.index_add(0, owner, messages)                  # (R, d) = (A E)[rows]
    mixed = torch.cat([0.5 * (own[:real] + neighbours), own[real:]])       # (U, d)
    if residual:
        mixed = mixed + own
    return mixed[inverse].view(*ids.shape, table.shape[1])                 # (..., d)


class GAEncoder(nn.Module):
    """Item tables (cross, A, B) + graph layer + three causal encoders → ``H*, H^A, H^B``.

    The graphs are platform data, not parameters: set them with :meth:`set_graphs`.
    """

    def __init__(self, num_items_a: int, num_items_b: int, config: FedCSRConfig,
                 graphs: Optional[TransitionGraphs] = None):
        super().__init__()
        self.num_items_a, self.num_items_b = num_items_a, num_items_b
        n, d = num_items_a + num_items_b, config.dim
        self.emb_cross = nn.Embedding(n + 1, d, padding_idx=n)            # pad row n
        self.emb_a = nn.Embedding(num_items_a + 1, d, padding_idx=num_items_a)
        self.emb_b = nn.Embedding(num_items_b + 1, d, padding_idx=num_items_b)
        for emb in (self.emb_cross, self.emb_a, self.emb_b):
            nn.init.xavier_normal_(emb.weight)
            with torch.no_grad():
                emb.weight[emb.padding_idx].zero_()
        args = (d, config.maxlen, config.num_blocks, config.num_heads, config.dropout)
        self.enc_cross, self.enc_a, self.enc_b = (CausalSelfAttention(*args) for _ in range(3))
        self.scale = math.sqrt(d)
        self.graphs = graphs

    def set_graphs(self, graphs: TransitionGraphs) -> None:
        self.graphs = graphs

    def _features(self, emb: nn.Embedding, graph: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        table = emb.weight                                                 # (rows + 1, n)
        mixed = propagate_rows(graph.to(table.device), table, ids, residual=True)  # (B, L, n) = propagate(...)[ids] + table[ids]
        return mixed * self.scale                                          # (B, L, n)

    def forward(self, inputs: SequenceInputs) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.graphs is None:
            raise ValueError("GAEncoder has no item graphs: call set_graphs(transition_graphs(train_sequences, ...)) "
                             "with the platform's own training sequences first")
        na, nb = self.num_items_a, self.num_items_b
        ids_a = inputs.single_a.clamp(max=na)                              # (B, L); pad → na
        ids_b = (inputs.single_b - na).clamp(min=0, max=nb)                # (B, L); pad (na+nb) → nb
        h_cross = self.enc_cross(self._features(self.emb_cross, self.graphs.cross, inputs.cross), inputs.pos_cross)
        h_a = self.enc_a(self._features(self.emb_a, self.graphs.a, ids_a), inputs.pos_a)
        h_b = self.enc_b(self._features(self.emb_b, self.graphs.b, ids_b), inputs.pos_b)
        return h_cross, h_a, h_b                                           # 3 × (B, L, n)


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
        h_cross, h_a, h_b = self.encoder(inputs)
        r_a, r_b = sequence_representations(h_cross, h_a, h_b, inputs.pos_cross)
        return h_cross, h_a, h_b, r_a, r_b

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


def cross_domain_scores(hidden: Tuple[torch.Tensor, torch.Tensor, torch.Tensor], inputs: SequenceInputs,
                        heads: Tuple[nn.Linear, nn.Linear], candidates: torch.Tensor, gt_domain: torch.Tensor,
                        num_items_a: int) -> torch.Tensor:
    """Domain ``d``'s cross-domain head of Eq. 16 at the last position, ``(h*_last + h^d_last) W^d``,
    read at the candidates (as C2DSR and the public code score).

    ``h*_last`` is the cross encoder's feature at the last history position, ``h^d_last`` the
    domain-``d`` encoder's at the last domain-``d`` position (column 0's feature, a padding row,
    when the history has no domain-``d`` item).

    Args:
        hidden: ``(H*, H^A, H^B)``, three (B, L, n); ``heads``: ``(W^A, W^B)``.
        candidates: (B, C) global ids, all in the row's ``gt_domain`` (B,) (0 = A, 1 = B).
    Returns: (B, C) scores. Raises ``ValueError`` when a candidate lies outside its row's domain.
    """
    h_cross, h_a, h_b = hidden
    col = torch.arange(inputs.cross.shape[1], device=h_cross.device)        # (L,)
    out = torch.empty(candidates.shape, dtype=h_cross.dtype, device=h_cross.device)  # (B, C)
    for d, (h_d, pos_d, head, offset) in enumerate(((h_a, inputs.pos_a, heads[0], 0),
                                                    (h_b, inputs.pos_b, heads[1], num_items_a))):
        m = gt_domain == d                                                  # (B,)
        if not bool(m.any()):
            continue
        last_d = ((pos_d[m] > 0) * col).amax(dim=1)                         # (b,) last domain-d column (0 if none)
        h_last = h_d[m].gather(1, last_d.view(-1, 1, 1).expand(-1, 1, h_d.shape[2])).squeeze(1)  # (b, n)
        logits = head(h_cross[m][:, -1] + h_last)                           # (b, |V^d|)
        idx = candidates[m] - offset                                        # (b, C) head index space
        if bool((idx < 0).any()) or bool((idx >= logits.shape[1]).any()):
            raise ValueError("all candidates of a row must lie in that row's gt_domain")
        out[m] = logits.gather(1, idx)
    return out


def frozen_copy(model: FedCSRModel) -> FedCSRModel:
    """A copy of the (global) model for MCL: eval mode, no parameter requires grad."""
    twin = copy.deepcopy(model).eval()
    twin.requires_grad_(False)
    return twin


# ----------------------------------------------------------------------------- losses
def head_cross_entropy(head: nn.Linear, hidden: torch.Tensor, target: torch.Tensor, mask: torch.Tensor,
                       negatives: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mean CE of the linear ``head`` over the masked positions only; 0 (still in the graph) if none.

    With ``negatives=None`` this equals ``F.cross_entropy(head(hidden)[mask], target[mask])`` (the
    full softmax of Eq. 16), but the head runs on the masked rows alone: over ~30k items the full
    (B, L, |V|) logits cost ~7x more time and memory than the ~13 % of positions a term uses.

    With ``negatives`` (S,) item ids of the head's index space, the softmax runs over the target
    and those shared negatives (sampled softmax; a negative equal to a row's target is masked
    out). Uniform negatives need no log-Q correction; the estimate converges to the full
    softmax as S grows.

    Args: hidden (B, L, n); target, mask (B, L); ``head``: ``nn.Linear(n, |V^d|)``.
    """
    return sampled_head_losses(head, [(hidden, target, mask)], negatives)[0]


def sampled_head_losses(head: nn.Linear, terms: SequenceT[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                        negatives: Optional[torch.Tensor] = None) -> List[torch.Tensor]:
    """:func:`head_cross_entropy` of several ``(hidden, target, mask)`` terms that share one head.

    With a sampled softmax the head's rows (every term's targets and the shared negatives) are
    read in **one** gather: each index into a (|V^d|, n) parameter costs its backward a zero-filled
    gradient of the whole head, so one gather instead of two per term is several times cheaper
    for the three terms of a domain in Eq. 17. Same values as separate calls.
    """
    losses: List[Optional[torch.Tensor]] = [None] * len(terms)
    live = []                                                               # (term index, rows (P, n), targets (P,))
    for index, (hidden, target, mask) in enumerate(terms):
        if not bool(mask.any()):
            losses[index] = hidden.sum() * 0.0
        else:
            live.append((index, hidden[mask], target[mask]))
    if negatives is None:
        for index, rows, tgt in live:
            losses[index] = F.cross_entropy(head(rows), tgt)                # over (P, |V^d|)
        return losses
    if live:
        ids = torch.cat([negatives] + [tgt for _, _, tgt in live])         # (S + Σ P,)
        weight, bias = head.weight[ids], head.bias[ids]                     # (S + Σ P, n), (S + Σ P,): one gather
        neg_w, neg_b = weight[:negatives.numel()], bias[:negatives.numel()]  # (S, n), (S,)
        start = negatives.numel()
        for index, rows, tgt in live:
            stop = start + tgt.numel()
            pos = (rows * weight[start:stop]).sum(-1) + bias[start:stop]   # (P,)
            neg = rows @ neg_w.T + neg_b                                    # (P, S)
            neg = neg.masked_fill(negatives.unsqueeze(0) == tgt.unsqueeze(1), float("-inf"))
            logits = torch.cat([pos.unsqueeze(1), neg], dim=1)              # (P, 1 + S); target at 0
            losses[index] = F.cross_entropy(logits, torch.zeros_like(tgt))
            start = stop
    return losses


def draw_negatives(num_items_a: int, num_items_b: int, count: Optional[int], rng: np.random.Generator,
                   device) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """``count`` uniform item ids per domain (local index spaces), or None for the full softmax."""
    if count is None:
        return None
    return tuple(torch.as_tensor(rng.integers(0, n, size=min(int(count), n)), device=device)
                 for n in (num_items_a, num_items_b))


def draw_negatives_torch(num_items_a: int, num_items_b: int, count: Optional[int],
                         device) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """:func:`draw_negatives` from torch's global RNG (the baselines' ``loss``; FedProx seeds it).

    ``count`` uniform ids per domain (with replacement, local index spaces, ``min(count, |V^d|)``
    each), or None (no draw, no RNG use) for the full softmax.
    """
    if count is None:
        return None
    return tuple(torch.randint(0, n, (min(int(count), n),), device=device) for n in (num_items_a, num_items_b))


def prediction_loss(heads: Tuple[nn.Linear, nn.Linear], h_cross: torch.Tensor, h_a: torch.Tensor, h_b: torch.Tensor,
                    batch: SequenceBatch, *, use_unified: bool = True, use_single: bool = True,
                    negatives: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> Dict[str, torch.Tensor]:
    """Eq. 17 as separate CE terms (cross-domain heads always; unified / single by flag).

    ``heads = (W^A, W^B)``; the three hidden states are (B, L, n). The logits of Eq. 16 are
    those of :meth:`FedCSRModel.logits`, evaluated only where a term has a target.
    ``negatives``: per-domain shared negatives for a sampled softmax (:func:`draw_negatives`).
    """
    head_a, head_b = heads
    neg_a, neg_b = negatives if negatives is not None else (None, None)
    names = ["cross"] + (["single"] if use_single else []) + (["unified"] if use_unified else [])
    inputs = {"cross": ((h_a + h_cross, batch.next_a, batch.next_a_mask), (h_b + h_cross, batch.next_b, batch.next_b_mask)),
              "single": ((h_a, batch.next_a, batch.next_a_mask), (h_b, batch.next_b, batch.next_b_mask)),
              "unified": ((h_cross, batch.unified_a, batch.unified_a_mask), (h_cross, batch.unified_b, batch.unified_b_mask))}
    losses_a = sampled_head_losses(head_a, [inputs[name][0] for name in names], neg_a)
    losses_b = sampled_head_losses(head_b, [inputs[name][1] for name in names], neg_b)
    terms = {}
    for name, loss_a, loss_b in zip(names, losses_a, losses_b):
        terms[f"{name}_a"], terms[f"{name}_b"] = loss_a, loss_b
    return terms


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


def fedcsr_loss(model: FedCSRModel, batch: SequenceBatch, *, augmented: Optional[SequenceInputs] = None,
                global_model: Optional[FedCSRModel] = None, rng: Optional[np.random.Generator] = None,
                config: Optional[FedCSRConfig] = None) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """Eq. 18: ``λ1 L_Pre + λ2 L_MCL + λ3 L_SCL`` with the ablation flags of ``config`` (default: model's).

    Args:
        augmented: the augmented view of ``batch.inputs`` (SCL); drawn from ``rng`` when omitted.
        global_model: the frozen global model (:func:`frozen_copy`) for MCL.
    Returns:
        total loss and a dict of its parts (``pre``, ``mcl``, ``scl`` and the CE terms), all scalars.
    """
    cfg = config or model.config
    h_cross, h_a, h_b, r_a, r_b = model.represent(batch.inputs)           # 3 × (B, L, n), 2 × (B, n)
    negatives = None
    if cfg.sampled_negatives is not None:
        if rng is None:
            raise ValueError("sampled_negatives needs rng=np.random.default_rng(...) to draw the negatives")
        negatives = draw_negatives(model.num_items_a, model.num_items_b, cfg.sampled_negatives, rng,
                                   h_cross.device)
    terms = prediction_loss((model.head_a, model.head_b), h_cross, h_a, h_b, batch,
                            use_unified=cfg.use_unified, use_single=cfg.use_single, negatives=negatives)
    parts = {"pre": sum(terms.values())}
    parts.update({f"ce_{k}": v for k, v in terms.items()})
    lam_pre, lam_mcl, lam_scl = cfg.lambdas
    total = lam_pre * parts["pre"]
    if cfg.use_mcl:
        if global_model is None:
            raise ValueError("use_mcl=True needs global_model=frozen_copy(<global model>) "
                             "(or set use_mcl=False for the w/o-MCL ablation)")
        with torch.no_grad():
            *_, g_a, g_b = global_model.represent(batch.inputs)            # 2 × (B, n), no gradient
        z_l = [model.projector(r_a), model.projector(r_b)]                 # 2 × (B, n/2)
        z_g = [model.projector(g_a), model.projector(g_b)]                 # 2 × (B, n/2)
        parts["mcl"] = mcl_loss(z_l, z_g, cfg.tau)
        total = total + lam_mcl * parts["mcl"]
    if cfg.use_scl:
        if augmented is None:
            if rng is None:
                raise ValueError("use_scl=True needs augmented=augment_inputs(...) or rng=np.random.default_rng(...) "
                                 "(or set use_scl=False for the w/o-SCL ablation)")
            augmented = augment_inputs(batch.inputs, model.num_items_a, model.num_items_b, cfg.alpha, rng)
        *_, ra_aug, rb_aug = model.represent(augmented)                    # 2 × (B, n)
        scl = r_a.new_zeros(())
        for d, (r, r_aug) in enumerate(((r_a, ra_aug), (r_b, rb_aug))):
            p, p_aug = model.transform(r), model.transform(r_aug)          # 2 × (B, n)
            q, q_aug = model.matchers[d](p), model.matchers[d](p_aug)      # 2 × (B, n)
            scl = scl + scl_loss(q, p_aug, q_aug, p)
        parts["scl"] = scl
        total = total + lam_scl * scl
    return total, parts


__all__ = [
    "FedCSRConfig", "SequenceInputs", "SequenceBatch", "TransitionGraphs", "CausalSelfAttention", "GAEncoder",
    "FedCSRModel", "domain_index", "inputs_from_cross", "make_batch", "augment_sequence", "augment_inputs",
    "transition_graphs", "propagate", "propagate_rows", "sequence_representations", "frozen_copy", "cross_domain_scores",
    "head_cross_entropy", "sampled_head_losses", "check_sampled_negatives", "draw_negatives",
    "draw_negatives_torch", "prediction_loss",
    "information_gap", "mcl_loss", "scl_loss", "fedcsr_loss",
]
