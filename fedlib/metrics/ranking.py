"""Ranking metrics for implicit-feedback recommendation, batched over users.

Two evaluation protocols appear in the papers this library follows, and the two
families of functions below match them:

* **Full ranking** (F3CRec, FedRKG, PTF-FedRec): every item is a candidate, the user's
  already-known items (training, sometimes also validation) are masked out, and the
  held-out items ``T_u`` are looked for in the top-K.
  :func:`full_ranking_metrics`, :func:`full_ranking_metrics_from_score_fn`.
* **Sampled candidates** (FedCSR: 1 positive + 999 negatives, FedPCL-CDR: 1 + 98 or 99):
  one positive is ranked against a few sampled negatives.
  :func:`sampled_metrics`, :func:`rank_of_positive`.

Conventions shared by every function here:

* Inputs are torch tensors; results are torch tensors on the same device. Scores may be
  float32 or float64 (float16/bfloat16 are promoted to float32). Results are float64 (per-user
  values are averaged later, and float64 keeps the mean exact to the last printed digit).
* Results are **per user**: a dict ``{"Recall@20": (U,), "NDCG@20": (U,), ...}``. A user
  who cannot be evaluated (no target items) gets NaN in every metric; use
  :func:`mean_over_users` to average while skipping NaN, and :func:`paired_ttest` to
  compare two methods user by user.
* Per-user item sets (targets, masks) are CSR arrays, the layout of
  :class:`fedlib.data.splits.Pairs`: ``indptr (U + 1,) int64`` and ``items (nnz,) int64``;
  user ``u`` owns ``items[indptr[u]:indptr[u + 1]]``. numpy arrays are accepted too.
  Duplicate items inside one user's set are counted once.
* Ranks are 1-based: the best-scored candidate has rank 1.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch

__all__ = [
    "FULL_RANKING_METRICS",
    "candidate_set_metrics",
    "full_ranking_metrics",
    "full_ranking_metrics_from_score_fn",
    "select_csr_rows",
    "csr_to_dense_mask",
    "rank_of_positive",
    "sampled_metrics",
    "mean_over_users",
    "paired_ttest",
    "PairedTTestResult",
]

ArrayLike = Union[torch.Tensor, np.ndarray, Sequence[int]]

#: Names accepted in the ``metrics`` argument of the full-ranking functions, and the
#: prefix each one gets in the result keys (``"recall"`` -> ``"Recall@20"``).
FULL_RANKING_METRICS: Dict[str, str] = {
    "recall": "Recall",
    "ndcg": "NDCG",
    "hr": "HR",
    "precision": "Precision",
    "mrr": "MRR",
}

_FULL_RANKING_TIE_RULES = ("topk", "pessimistic", "optimistic")
_SAMPLED_TIE_RULES = ("pessimistic", "optimistic", "average")
_RECALL_DENOMINATORS = ("num_targets", "min_k")


# --------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------
def _result_dtype(device: torch.device) -> torch.dtype:
    # Apple's MPS backend has no float64; everywhere else float64 is cheap for (U,) vectors.
    return torch.float32 if device.type == "mps" else torch.float64


def _as_score_tensor(scores: torch.Tensor, name: str = "scores") -> torch.Tensor:
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(scores).__name__}")
    if not torch.is_floating_point(scores):
        raise TypeError(f"{name} must be a floating-point tensor, got {scores.dtype}")
    if scores.dtype in (torch.float16, torch.bfloat16):
        scores = scores.float()
    return scores


class DivergedModelError(ValueError):
    """Scores contain NaN: the model diverged (a too-large learning rate, an overflow)."""


def _check_no_nan(scores: torch.Tensor, name: str) -> None:
    # NaN would silently sort as the largest value in torch.topk and win every ranking.
    if torch.isnan(scores).any():
        raise DivergedModelError(f"{name} contain NaN; a diverged model cannot be ranked "
                                 "(lower the learning rate or clip the updates)")


def _as_index_tensor(values: ArrayLike, device: torch.device, name: str) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        tensor = values
    else:
        array = np.asarray(values)
        if array.size == 0:  # np.asarray([]) is float64; an empty id list is still valid
            array = array.astype(np.int64)
        tensor = torch.as_tensor(array)
    if tensor.dtype.is_floating_point or tensor.dtype == torch.bool:
        raise TypeError(f"{name} must hold integers, got {tensor.dtype}")
    if tensor.ndim != 1:
        raise ValueError(f"{name} must be 1-d, got shape {tuple(tensor.shape)}")
    return tensor.to(device=device, dtype=torch.int64)


def _validate_ks(ks: Iterable[int]) -> Tuple[int, ...]:
    ks = tuple(int(k) for k in ks)
    if not ks:
        raise ValueError("ks must contain at least one cutoff")
    if any(k < 1 for k in ks):
        raise ValueError(f"every cutoff K must be >= 1, got {ks}")
    return ks


def _check_csr(indptr: torch.Tensor, items: torch.Tensor, num_rows: int, num_items: Optional[int], name: str) -> None:
    if indptr.numel() != num_rows + 1:
        raise ValueError(f"{name}_indptr must have {num_rows + 1} entries (rows + 1), got {indptr.numel()}")
    if int(indptr[0]) != 0 or int(indptr[-1]) != items.numel():
        raise ValueError(f"{name}_indptr must start at 0 and end at len({name}_items)={items.numel()}")
    if num_rows and bool((indptr[1:] < indptr[:-1]).any()):
        raise ValueError(f"{name}_indptr must be non-decreasing")
    if items.numel() and num_items is not None:
        if int(items.min()) < 0 or int(items.max()) >= num_items:
            raise ValueError(f"{name}_items must be item ids in [0, {num_items})")


def _csr_on_device(indptr: ArrayLike, items: ArrayLike, device: torch.device, num_items: int, name: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """Validated ``(indptr, items)`` int64 tensors on ``device`` (any number of rows)."""
    indptr = _as_index_tensor(indptr, device, f"{name}_indptr")
    items = _as_index_tensor(items, device, f"{name}_items")
    _check_csr(indptr, items, indptr.numel() - 1, num_items, name)
    return indptr, items


def select_csr_rows(indptr: ArrayLike, items: ArrayLike, rows: ArrayLike) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sub-CSR holding only ``rows`` (in the given order), without a Python loop over rows.

    Args:
        indptr: ``(N + 1,) int64`` row pointer of the full CSR.
        items: ``(nnz,) int64`` column ids of the full CSR.
        rows: ``(m,) int64`` rows to keep (repeats allowed).

    Returns:
        ``(sub_indptr (m + 1,), sub_items (nnz_sub,))`` on the device of ``items`` when it is
        a tensor (CPU otherwise); row ``j`` of the result is row ``rows[j]`` of the input.
    """
    device = items.device if isinstance(items, torch.Tensor) else torch.device("cpu")
    indptr = _as_index_tensor(indptr, device, "indptr")
    items = _as_index_tensor(items, device, "items")
    rows = _as_index_tensor(rows, device, "rows")
    if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= indptr.numel() - 1):
        raise ValueError(f"rows must be in [0, {indptr.numel() - 1})")
    starts = indptr[rows]
    counts = indptr[rows + 1] - starts
    sub_indptr = torch.zeros(rows.numel() + 1, dtype=torch.int64, device=device)
    torch.cumsum(counts, dim=0, out=sub_indptr[1:])
    # Position of every kept entry = its row's start + its offset inside the row.
    offset_in_row = torch.arange(int(sub_indptr[-1]), device=device) - torch.repeat_interleave(sub_indptr[:-1], counts)
    positions = torch.repeat_interleave(starts, counts) + offset_in_row
    return sub_indptr, items[positions]


def csr_to_dense_mask(indptr: ArrayLike, items: ArrayLike, num_items: int, device: Optional[torch.device] = None) -> torch.Tensor:
    """Boolean ``(rows, num_items)`` matrix with ``True`` at every (row, item) of the CSR.

    Memory is ``rows × num_items`` bytes, so callers chunk over rows for large matrices.
    """
    if device is None:
        device = items.device if isinstance(items, torch.Tensor) else torch.device("cpu")
    indptr = _as_index_tensor(indptr, device, "indptr")
    items = _as_index_tensor(items, device, "items")
    num_rows = indptr.numel() - 1
    dense = torch.zeros(num_rows, num_items, dtype=torch.bool, device=device)
    if items.numel():
        row_of_entry = torch.repeat_interleave(torch.arange(num_rows, device=device), indptr[1:] - indptr[:-1])
        dense[row_of_entry, items] = True
    return dense


# --------------------------------------------------------------------------------------
# Full ranking
# --------------------------------------------------------------------------------------
def _top_positions_are_targets(
    scores: torch.Tensor, is_target: torch.Tensor, depth: int, tie_rule: str
) -> torch.Tensor:
    """``(rows, depth) bool``: is the item at rank 1..depth a target? (scores already masked)."""
    if tie_rule == "topk":
        top_items = torch.topk(scores, depth, dim=1, largest=True, sorted=True).indices
        return is_target.gather(1, top_items)
    # Deterministic tie rules: first put non-targets (pessimistic) or targets (optimistic)
    # in front, then sort by score with a *stable* sort, so that equal scores keep that
    # front-to-back order. Costs a full sort per row instead of a top-k.
    targets_last = tie_rule == "pessimistic"
    front_key = is_target.to(torch.int8) if targets_last else (~is_target).to(torch.int8)
    pre_order = torch.sort(front_key, dim=1, stable=True).indices
    reordered_scores = scores.gather(1, pre_order)
    order = torch.sort(reordered_scores, dim=1, descending=True, stable=True).indices[:, :depth]
    return is_target.gather(1, pre_order.gather(1, order))


def _metrics_from_hits(
    hits: torch.Tensor,
    num_targets: torch.Tensor,
    ks: Tuple[int, ...],
    metrics: Tuple[str, ...],
    recall_denominator: str,
    out_dtype: torch.dtype,
) -> Dict[str, torch.Tensor]:
    """Turn ``hits (rows, K_max)`` (is rank r a target?) into per-user metric vectors."""
    device = hits.device
    k_max = max(ks)
    if hits.shape[1] < k_max:  # fewer candidates than K: the missing ranks are empty, not hits
        hits = torch.nn.functional.pad(hits, (0, k_max - hits.shape[1]), value=False)
    hits_f = hits.to(out_dtype)
    ranks = torch.arange(1, k_max + 1, device=device, dtype=out_dtype)
    discounts = 1.0 / torch.log2(ranks + 1.0)  # 1 / log2(r + 1), r = 1..K_max
    cum_hits = hits_f.cumsum(dim=1)  # cum_hits[:, k-1] = #targets in the top-k
    cum_dcg = (hits_f * discounts).cumsum(dim=1)
    cum_ideal = discounts.cumsum(dim=0)  # IDCG for n relevant items = cum_ideal[min(n, K) - 1]
    n_targets = num_targets.to(out_dtype)
    no_targets = num_targets == 0
    nan = torch.tensor(float("nan"), dtype=out_dtype, device=device)
    # Reciprocal rank of the first target (0 when none is in the top-K_max).
    first_hit = torch.argmax(hits.to(torch.int8), dim=1)
    reciprocal_first = torch.where(hits.any(dim=1), 1.0 / (first_hit.to(out_dtype) + 1.0), torch.zeros((), dtype=out_dtype, device=device))

    out: Dict[str, torch.Tensor] = {}
    for k in ks:
        hits_at_k = cum_hits[:, k - 1]
        for metric in metrics:
            key = f"{FULL_RANKING_METRICS[metric]}@{k}"
            if metric == "recall":
                denom = n_targets if recall_denominator == "num_targets" else n_targets.clamp(max=k)
                value = hits_at_k / denom.clamp(min=1)
            elif metric == "precision":
                value = hits_at_k / k
            elif metric == "hr":
                value = (hits_at_k > 0).to(out_dtype)
            elif metric == "ndcg":
                ideal_len = num_targets.clamp(min=1, max=k) - 1
                value = cum_dcg[:, k - 1] / cum_ideal[ideal_len]
            else:  # "mrr": first target's reciprocal rank, 0 beyond K
                value = torch.where(first_hit < k, reciprocal_first, torch.zeros_like(reciprocal_first))
            out[key] = torch.where(no_targets, nan, value)
    return out


def _validate_full_ranking_options(metrics, recall_denominator: str, tie_rule: str, chunk_size: int) -> Tuple[str, ...]:
    if isinstance(metrics, str):
        metrics = (metrics,)
    metrics = tuple(m.lower() for m in metrics)
    unknown = [m for m in metrics if m not in FULL_RANKING_METRICS]
    if unknown or not metrics:
        raise ValueError(f"unknown metrics {unknown}; choose from {sorted(FULL_RANKING_METRICS)}")
    if recall_denominator not in _RECALL_DENOMINATORS:
        raise ValueError(f"recall_denominator must be one of {_RECALL_DENOMINATORS}, got {recall_denominator!r}")
    if tie_rule not in _FULL_RANKING_TIE_RULES:
        raise ValueError(f"tie_rule must be one of {_FULL_RANKING_TIE_RULES}, got {tie_rule!r}")
    if int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return metrics


def _full_ranking_chunk(
    scores: torch.Tensor,
    target_indptr: torch.Tensor,
    target_items: torch.Tensor,
    mask_indptr: Optional[torch.Tensor],
    mask_items: Optional[torch.Tensor],
    ks: Tuple[int, ...],
    metrics: Tuple[str, ...],
    recall_denominator: str,
    tie_rule: str,
) -> Dict[str, torch.Tensor]:
    """Metrics for one chunk; CSR arrays are already restricted to the chunk's rows."""
    num_items = scores.shape[1]
    is_target = csr_to_dense_mask(target_indptr, target_items, num_items, scores.device)
    num_targets = is_target.sum(dim=1)  # counted before masking: a masked target is a sure miss
    if mask_indptr is not None:
        is_masked = csr_to_dense_mask(mask_indptr, mask_items, num_items, scores.device)
        scores = scores.masked_fill(is_masked, float("-inf"))
        # A masked item can still reach the top-K when fewer than K items are unmasked; it
        # must not count as a hit then.
        is_target = is_target & ~is_masked
    depth = min(max(ks), num_items)
    hits = _top_positions_are_targets(scores, is_target, depth, tie_rule)
    return _metrics_from_hits(hits, num_targets, ks, metrics, recall_denominator, _result_dtype(scores.device))


def _concat_chunks(chunks: Sequence[Dict[str, torch.Tensor]], keys: Sequence[str], device, dtype) -> Dict[str, torch.Tensor]:
    if not chunks:
        return {key: torch.empty(0, dtype=dtype, device=device) for key in keys}
    return {key: torch.cat([chunk[key] for chunk in chunks]) for key in keys}


def _result_keys(ks: Tuple[int, ...], metrics: Tuple[str, ...]) -> list:
    return [f"{FULL_RANKING_METRICS[m]}@{k}" for k in ks for m in metrics]


def full_ranking_metrics(
    scores: torch.Tensor,
    target_indptr: ArrayLike,
    target_items: ArrayLike,
    ks: Iterable[int] = (20,),
    mask_indptr: Optional[ArrayLike] = None,
    mask_items: Optional[ArrayLike] = None,
    metrics: Iterable[str] = ("recall", "ndcg"),
    *,
    recall_denominator: str = "num_targets",
    tie_rule: str = "topk",
    chunk_size: int = 1024,
) -> Dict[str, torch.Tensor]:
    r"""Full-ranking metrics over all items, one value per user (row of ``scores``).

    For user ``u`` with target set ``T_u`` (held-out items) and masked set ``M_u``
    (items already known to be positive, e.g. training items), every item not in ``M_u``
    is a candidate. Masked items get score ``-inf`` before ranking; let ``rel_r = 1`` if
    the item at rank ``r`` is in ``T_u`` (and not masked), else 0.

    * ``Recall@K = Σ_{r≤K} rel_r / |T_u|`` (``recall_denominator="num_targets"``, F3CRec's
      definition) or ``Σ_{r≤K} rel_r / min(K, |T_u|)`` (``"min_k"``, so that a perfect
      ranking scores 1 even when ``|T_u| > K``).
    * ``Precision@K = Σ_{r≤K} rel_r / K`` (K also when fewer than K candidates exist).
    * ``HR@K = 1 if Σ_{r≤K} rel_r > 0 else 0`` (hit ratio; equals Recall@K when ``|T_u| = 1``).
    * ``NDCG@K = DCG@K / IDCG@K`` with binary relevance,
      ``DCG@K = Σ_{r=1..K} rel_r / log2(r + 1)`` and
      ``IDCG@K = Σ_{r=1..min(K, |T_u|)} 1 / log2(r + 1)`` (the ideal ordering truncated at K).
    * ``MRR@K = 1 / r_first`` where ``r_first`` is the rank of the best-ranked target,
      0 when no target is in the top-K.

    ``|T_u|`` counts distinct target items **including targets that are also masked**: such
    a target cannot be retrieved and counts as a miss (this is what the reference code of
    F3CRec/FedRKG does when the same pair occurs in train and test). Users with
    ``|T_u| = 0`` get NaN in every metric.

    Ties (equal scores) are broken according to ``tie_rule``:

    * ``"topk"`` (default, fastest): whatever order ``torch.topk`` returns. It is not
      specified among equal values and may differ between CPU and CUDA. This is also what
      the reference implementations do (top-k or argsort on the score matrix). With
      continuous scores from a trained model exact ties are rare.
    * ``"pessimistic"``: a target tied with non-targets is placed **after** them, which gives
      a lower bound on every metric. Use it for models that output many equal scores
      (popularity, untrained or constant models). Costs a full sort per user.
    * ``"optimistic"``: a target tied with non-targets is placed before them (upper bound).

    Args:
        scores: ``(U, I)`` float32/float64 scores, higher = more relevant. Row ``u`` belongs
            to the user owning row ``u`` of the CSR arrays.
        target_indptr, target_items: CSR of target items, ``(U + 1,)`` and ``(nnz,)`` int64.
        ks: cutoffs K (K may exceed ``I``; missing ranks count as misses).
        mask_indptr, mask_items: optional CSR of items to exclude from the ranking.
        metrics: any of ``"recall", "ndcg", "hr", "precision", "mrr"``.
        recall_denominator: ``"num_targets"`` (|T_u|) or ``"min_k"`` (min(K, |T_u|)).
        tie_rule: ``"topk"``, ``"pessimistic"`` or ``"optimistic"`` (see above).
        chunk_size: users processed at once; peak extra memory is about
            ``chunk_size × I × 10`` bytes (``× 34`` bytes with a deterministic tie rule).

    Returns:
        ``{"Recall@20": (U,), "NDCG@20": (U,), ...}`` float64 tensors on ``scores.device``.
    """
    scores = _as_score_tensor(scores)
    if scores.ndim != 2:
        raise ValueError(f"scores must be (users, items), got shape {tuple(scores.shape)}")
    ks = _validate_ks(ks)
    metrics = _validate_full_ranking_options(metrics, recall_denominator, tie_rule, chunk_size)
    if (mask_indptr is None) != (mask_items is None):
        raise ValueError("give both mask_indptr and mask_items, or neither")
    num_users, num_items = scores.shape
    device = scores.device
    target_indptr = _as_index_tensor(target_indptr, device, "target_indptr")
    target_items = _as_index_tensor(target_items, device, "target_items")
    _check_csr(target_indptr, target_items, num_users, num_items, "target")
    if mask_indptr is not None:
        mask_indptr = _as_index_tensor(mask_indptr, device, "mask_indptr")
        mask_items = _as_index_tensor(mask_items, device, "mask_items")
        _check_csr(mask_indptr, mask_items, num_users, num_items, "mask")

    chunks = []
    for start in range(0, num_users, int(chunk_size)):
        stop = min(start + int(chunk_size), num_users)
        rows = torch.arange(start, stop, device=device)
        chunk_scores = scores[start:stop]
        _check_no_nan(chunk_scores, "scores")
        t_ptr, t_items = select_csr_rows(target_indptr, target_items, rows)
        m_ptr = m_items = None
        if mask_indptr is not None:
            m_ptr, m_items = select_csr_rows(mask_indptr, mask_items, rows)
        chunks.append(
            _full_ranking_chunk(chunk_scores, t_ptr, t_items, m_ptr, m_items, ks, metrics, recall_denominator, tie_rule)
        )
    return _concat_chunks(chunks, _result_keys(ks, metrics), device, _result_dtype(device))


def full_ranking_metrics_from_score_fn(
    score_fn: Callable[[torch.Tensor], torch.Tensor],
    user_ids: ArrayLike,
    target_indptr: ArrayLike,
    target_items: ArrayLike,
    ks: Iterable[int] = (20,),
    mask_indptr: Optional[ArrayLike] = None,
    mask_items: Optional[ArrayLike] = None,
    metrics: Iterable[str] = ("recall", "ndcg"),
    *,
    recall_denominator: str = "num_targets",
    tie_rule: str = "topk",
    chunk_size: int = 1024,
    device: Optional[Union[str, torch.device]] = None,
) -> Dict[str, torch.Tensor]:
    """Same metrics as :func:`full_ranking_metrics`, scoring ``chunk_size`` users at a time.

    The ``(U, I)`` score matrix is never materialised: ``score_fn`` is called once per
    chunk, so peak memory is bounded by ``chunk_size × I``. Typical use::

        per_user = full_ranking_metrics_from_score_fn(
            lambda users: user_table[users] @ item_table.T,
            user_ids=split.test.active_users(),
            target_indptr=split.test.indptr, target_items=split.test.items,
            mask_indptr=train_and_valid.indptr, mask_items=train_and_valid.items,
            ks=(5, 10, 20),
        )

    Args:
        score_fn: maps ``(n,) int64`` user ids (on ``device``) to ``(n, I)`` scores.
        user_ids: ``(m,)`` users to evaluate, in the order of the returned vectors.
        target_indptr, target_items: CSR **indexed by user id** (``indptr`` has
            ``num_users + 1`` entries), e.g. ``Pairs.indptr`` / ``Pairs.items``.
        mask_indptr, mask_items: optional CSR of masked items, also indexed by user id.
        device: device of the user-id tensors passed to ``score_fn`` (default CPU).
            Metrics are computed on the device of the scores ``score_fn`` returns.
        Other arguments: as in :func:`full_ranking_metrics`.

    Returns:
        ``{"Recall@20": (m,), ...}`` aligned with ``user_ids``.
    """
    ks = _validate_ks(ks)
    metrics = _validate_full_ranking_options(metrics, recall_denominator, tie_rule, chunk_size)
    if (mask_indptr is None) != (mask_items is None):
        raise ValueError("give both mask_indptr and mask_items, or neither")
    id_device = torch.device(device) if device is not None else torch.device("cpu")
    user_ids = _as_index_tensor(user_ids, id_device, "user_ids")

    chunks = []
    target_csr = mask_csr = None  # moved once, to the device the scores come back on
    for start in range(0, user_ids.numel(), int(chunk_size)):
        users = user_ids[start : start + int(chunk_size)]
        chunk_scores = _as_score_tensor(score_fn(users), "score_fn output")
        if chunk_scores.ndim != 2 or chunk_scores.shape[0] != users.numel():
            raise ValueError(f"score_fn must return ({users.numel()}, I) scores, got {tuple(chunk_scores.shape)}")
        _check_no_nan(chunk_scores, "scores")
        num_items = chunk_scores.shape[1]
        if target_csr is None:
            target_csr = _csr_on_device(target_indptr, target_items, chunk_scores.device, num_items, "target")
            if mask_indptr is not None:
                mask_csr = _csr_on_device(mask_indptr, mask_items, chunk_scores.device, num_items, "mask")
        rows = users.to(chunk_scores.device)
        t_ptr, t_items = select_csr_rows(*target_csr, rows)
        m_ptr = m_items = None
        if mask_csr is not None:
            m_ptr, m_items = select_csr_rows(*mask_csr, rows)
        chunks.append(
            _full_ranking_chunk(chunk_scores, t_ptr, t_items, m_ptr, m_items, ks, metrics, recall_denominator, tie_rule)
        )
    out_device = chunks[0][next(iter(chunks[0]))].device if chunks else id_device
    return _concat_chunks(chunks, _result_keys(ks, metrics), out_device, _result_dtype(out_device))


# --------------------------------------------------------------------------------------
# Sampled candidates
# --------------------------------------------------------------------------------------
def _count_negatives_above_and_tied(
    pos_scores: torch.Tensor,
    neg_scores: torch.Tensor,
    neg_valid: Optional[torch.Tensor],
    tie_tolerance: float,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(#neg ranked above the positive, #neg tied with it, #valid negatives)``, each ``(U,)``."""
    pos_scores = _as_score_tensor(pos_scores, "pos_scores")
    neg_scores = _as_score_tensor(neg_scores, "neg_scores")
    if pos_scores.ndim != 1 or neg_scores.ndim != 2 or neg_scores.shape[0] != pos_scores.shape[0]:
        raise ValueError(
            f"expected pos_scores (U,) and neg_scores (U, C), got {tuple(pos_scores.shape)} and {tuple(neg_scores.shape)}"
        )
    if tie_tolerance < 0:
        raise ValueError(f"tie_tolerance must be >= 0, got {tie_tolerance}")
    _check_no_nan(pos_scores, "pos_scores")
    _check_no_nan(neg_scores, "neg_scores")
    dtype = torch.promote_types(pos_scores.dtype, neg_scores.dtype)
    pos = pos_scores.to(dtype).unsqueeze(1)
    neg = neg_scores.to(dtype)
    above = neg > pos + tie_tolerance
    tied = (neg - pos).abs() <= tie_tolerance if tie_tolerance > 0 else neg == pos
    if neg_valid is not None:
        if neg_valid.shape != neg.shape or neg_valid.dtype != torch.bool:
            raise ValueError("neg_valid must be a bool tensor shaped like neg_scores")
        above = above & neg_valid
        tied = tied & neg_valid
        num_candidates = neg_valid.sum(dim=1)
    else:
        num_candidates = torch.full((neg.shape[0],), neg.shape[1], dtype=torch.int64, device=neg.device)
    return above.sum(dim=1), tied.sum(dim=1), num_candidates


def rank_of_positive(
    pos_scores: torch.Tensor,
    neg_scores: torch.Tensor,
    tie_rule: str = "pessimistic",
    *,
    neg_valid: Optional[torch.Tensor] = None,
    tie_tolerance: float = 0.0,
) -> torch.Tensor:
    r"""1-based rank of each user's positive among itself and its sampled negatives.

    With ``g = #{neg > pos}`` and ``e = #{neg = pos}``:

    * ``"pessimistic"`` (default): ties count against the positive, ``rank = 1 + g + e``.
    * ``"optimistic"``: ties favour the positive, ``rank = 1 + g`` (FedCSR's code, and
      FedPCL-CDR's stable ``heapq`` ranking which lists the positive first).
    * ``"average"``: expected rank under uniformly random tie-breaking,
      ``rank = 1 + g + e / 2`` (may be fractional).

    With ``tie_tolerance = τ > 0`` a negative is "above" when ``neg > pos + τ`` and "tied"
    when ``|neg − pos| ≤ τ``; FedCSR's code is ``optimistic`` with ``τ = 1e-5``.

    Args:
        pos_scores: ``(U,)`` score of each user's positive item.
        neg_scores: ``(U, C)`` scores of the sampled negatives.
        tie_rule: ``"pessimistic"``, ``"optimistic"`` or ``"average"``.
        neg_valid: optional ``(U, C) bool``; ``False`` marks padding columns when users
            have different numbers of negatives.
        tie_tolerance: ``τ`` above (score units), default 0 = exact equality.

    Returns:
        ``(U,)`` float64 ranks on the device of the scores.
    """
    if tie_rule not in _SAMPLED_TIE_RULES:
        raise ValueError(f"tie_rule must be one of {_SAMPLED_TIE_RULES}, got {tie_rule!r}")
    above, tied, _ = _count_negatives_above_and_tied(pos_scores, neg_scores, neg_valid, tie_tolerance)
    dtype = _result_dtype(above.device)
    above, tied = above.to(dtype), tied.to(dtype)
    if tie_rule == "pessimistic":
        return 1.0 + above + tied
    if tie_rule == "optimistic":
        return 1.0 + above
    return 1.0 + above + tied / 2.0


def sampled_metrics(
    pos_scores: torch.Tensor,
    neg_scores: torch.Tensor,
    ks: Iterable[int] = (1, 5, 10),
    tie_rule: str = "pessimistic",
    *,
    neg_valid: Optional[torch.Tensor] = None,
    tie_tolerance: float = 0.0,
) -> Dict[str, torch.Tensor]:
    r"""HR@K, NDCG@K and MRR for one positive ranked against sampled negatives, per user.

    With ``rank`` from :func:`rank_of_positive`:

    * ``HR@K = 1 if rank ≤ K else 0``
    * ``NDCG@K = 1 / log2(rank + 1) if rank ≤ K else 0`` (one relevant item, so IDCG = 1)
    * ``MRR = 1 / rank`` (no cutoff; over the ``1 + C`` candidates)

    For ``tie_rule="average"`` the values are the **expected metrics** under uniformly
    random tie-breaking, not the metrics of the (fractional) expected rank: if ``g``
    negatives are above and ``e`` tied, the positive is equally likely to sit at each rank
    ``g+1, …, g+e+1``, so ``E[f] = (1/(e+1)) Σ_{r=g+1}^{g+e+1} f(r)``. This is exact, e.g. an
    all-constant scorer gets ``HR@K = K / (C+1)``, the random-guess level.

    Args:
        pos_scores: ``(U,)`` positive scores.
        neg_scores: ``(U, C)`` negative scores.
        ks: cutoffs K.
        tie_rule: ``"pessimistic"`` (default), ``"optimistic"`` or ``"average"``.
        neg_valid: optional ``(U, C) bool`` mask of real (non-padding) negatives.
        tie_tolerance: see :func:`rank_of_positive`.

    Returns:
        ``{"HR@1": (U,), "NDCG@1": (U,), ..., "MRR": (U,)}`` float64 tensors.
    """
    ks = _validate_ks(ks)
    if tie_rule not in _SAMPLED_TIE_RULES:
        raise ValueError(f"tie_rule must be one of {_SAMPLED_TIE_RULES}, got {tie_rule!r}")
    above, tied, num_negatives = _count_negatives_above_and_tied(pos_scores, neg_scores, neg_valid, tie_tolerance)
    device = above.device
    dtype = _result_dtype(device)
    out: Dict[str, torch.Tensor] = {}

    if tie_rule in ("pessimistic", "optimistic"):
        rank = (1 + above + tied) if tie_rule == "pessimistic" else (1 + above)
        rank_f = rank.to(dtype)
        zero = torch.zeros((), dtype=dtype, device=device)
        for k in ks:
            inside = rank <= k
            out[f"HR@{k}"] = inside.to(dtype)
            out[f"NDCG@{k}"] = torch.where(inside, 1.0 / torch.log2(rank_f + 1.0), zero)
        out["MRR"] = 1.0 / rank_f
        return out

    # "average": closed-form expectations through cumulative sums over ranks 1..C+1.
    # F(n) = Σ_{r=1..n} f(r) with F(0) = 0, then E[f] = (F(g+e+1) − F(g)) / (e+1).
    max_rank = int(num_negatives.max()) + 1 if num_negatives.numel() else 1
    ranks = torch.arange(1, max_rank + 1, device=device, dtype=dtype)
    zero_row = torch.zeros(1, device=device, dtype=dtype)
    cum_reciprocal = torch.cat([zero_row, (1.0 / ranks).cumsum(0)])
    cum_discount = torch.cat([zero_row, (1.0 / torch.log2(ranks + 1.0)).cumsum(0)])
    low = above  # ranks low+1 .. high are equally likely
    high = above + tied + 1
    spread = (tied + 1).to(dtype)
    for k in ks:
        clipped_low, clipped_high = low.clamp(max=k), high.clamp(max=k)
        out[f"HR@{k}"] = (clipped_high - clipped_low).to(dtype) / spread
        out[f"NDCG@{k}"] = (cum_discount[clipped_high] - cum_discount[clipped_low]) / spread
    out["MRR"] = (cum_reciprocal[high] - cum_reciprocal[low]) / spread
    return out


# --------------------------------------------------------------------------------------
# Aggregation and significance
# --------------------------------------------------------------------------------------
def mean_over_users(per_user: Union[torch.Tensor, Mapping[str, torch.Tensor]]) -> Union[float, Dict[str, float]]:
    """Mean over users ignoring NaN (users that could not be evaluated).

    Accepts one ``(U,)`` tensor (returns a float) or a dict of them (returns a dict of
    floats). All-NaN input gives NaN.
    """
    if isinstance(per_user, Mapping):
        return {key: mean_over_users(value) for key, value in per_user.items()}
    values = torch.as_tensor(per_user).detach()
    if values.dtype != torch.float64 and values.device.type != "mps":
        values = values.double()
    valid = ~torch.isnan(values)
    count = int(valid.sum())
    if count == 0:
        return float("nan")
    return float(values[valid].sum() / count)


class PairedTTestResult(NamedTuple):
    """Outcome of :func:`paired_ttest`: t statistic, two-sided p-value (by default), users used."""

    statistic: float
    pvalue: float
    n: int


def paired_ttest(
    per_user_a: ArrayLike,
    per_user_b: ArrayLike,
    alternative: str = "two-sided",
) -> PairedTTestResult:
    """Paired t-test of two methods' per-user metric values (``scipy.stats.ttest_rel``).

    Both inputs are ``(U,)`` vectors aligned by user (same evaluation users, same order).
    Users that are NaN in either vector are dropped, so the test runs on the ``n`` users
    evaluated by both. The statistic is positive when ``a`` is better on average.
    With fewer than 2 common users, or identical vectors, statistic and p-value are NaN.
    """
    from scipy import stats  # local import: scipy is only needed for significance tests

    a = per_user_a.detach().double().cpu().numpy() if isinstance(per_user_a, torch.Tensor) else np.asarray(per_user_a, dtype=np.float64)
    b = per_user_b.detach().double().cpu().numpy() if isinstance(per_user_b, torch.Tensor) else np.asarray(per_user_b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"per-user vectors must be 1-d and aligned, got shapes {a.shape} and {b.shape}")
    both = ~(np.isnan(a) | np.isnan(b))
    n = int(both.sum())
    if n < 2 or np.array_equal(a[both], b[both]):
        return PairedTTestResult(float("nan"), float("nan"), n)
    result = stats.ttest_rel(a[both], b[both], alternative=alternative)
    return PairedTTestResult(float(result.statistic), float(result.pvalue), n)


def candidate_set_metrics(
    score_fn: Callable[[torch.Tensor], torch.Tensor],
    users: np.ndarray,
    candidates: np.ndarray,
    ks: Iterable[int] = (10,),
    tie_rule: str = "pessimistic",
    *,
    chunk_size: int = 1024,
    device=None,
    pair_fn: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None,
) -> Dict[str, torch.Tensor]:
    r"""Sampled-candidate metrics from a candidate matrix with the positive in column 0.

    For row ``r``, user ``users[r]`` scores the ``1 + n`` items ``candidates[r]``; the
    positive ``candidates[r, 0]`` is ranked against the ``n`` negatives with
    :func:`sampled_metrics` (``HR@K``, ``NDCG@K``, ``MRR``; ties per ``tie_rule``).

    Args:
        score_fn: ``score_fn(user_ids (n,)) -> (n, I)`` scores of every item.
        users: ``(R,) int64`` user of each candidate row.
        candidates: ``(R, 1 + n) int64`` item ids (e.g. a protocol's ``test_candidates``).
        pair_fn: optional ``pair_fn(user_ids (n,), items (n, 1 + k)) -> (n, 1 + k)`` scoring only
            the candidates (much cheaper than every item for models with an MLP tower); used
            instead of ``score_fn`` when given.

    Returns:
        per-row metric vectors ``(R,)``.
    """
    users = np.asarray(users, dtype=np.int64)
    candidates = np.asarray(candidates, dtype=np.int64)
    if candidates.ndim != 2 or candidates.shape[0] != users.shape[0] or candidates.shape[1] < 2:
        raise ValueError(f"candidates must be (R, 1 + n) with R = len(users) = {users.shape[0]}, got {candidates.shape}")
    parts: Dict[str, list] = {}
    for start in range(0, users.size, chunk_size):
        user_chunk = torch.as_tensor(users[start : start + chunk_size], device=device)
        if pair_fn is not None:
            cand = torch.as_tensor(candidates[start : start + chunk_size], device=user_chunk.device)
            picked = pair_fn(user_chunk, cand)  # (n, 1 + negatives)
        else:
            scores = score_fn(user_chunk)  # (n, I)
            cand = torch.as_tensor(candidates[start : start + chunk_size], device=scores.device)
            picked = scores.gather(1, cand)  # (n, 1 + negatives)
        for key, value in sampled_metrics(picked[:, 0], picked[:, 1:], ks=ks, tie_rule=tie_rule).items():
            parts.setdefault(key, []).append(value)
    return {key: torch.cat(values) for key, values in parts.items()}
