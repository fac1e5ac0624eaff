r"""Audit of the FedRKG test leak: negative coverage, test-item ranks, duplicated pairs.

Mechanism. The public FedRKG/PFedRec/FedRAP code (FedRKG's ``utils/data.py``,
https://github.com/Jaehyung-Lim/fedrkg, inherited from PFedRec and FedRAP) draws training
negatives for user ``u`` from ``I \ (train_u ∪ valid_u ∪ test_u)``. With a personal item
table per user, the row of item ``i`` only moves when ``i`` is one of ``u``'s
positives or sampled negatives. After ``R`` rounds (all users, 4 negatives per positive,
~1000 rounds) nearly every other candidate has been pushed down by at least one negative
step, but the validation and test rows never are. Full ranking masks train (+ valid) items,
so the test item becomes the only never-penalised candidate and lands at rank 1, whatever
the model learned. A second, independent effect on LastFM-2K: one row per *tag assignment*
repeats the same (user, artist) pair, so the held-out pair often also sits in train; it is
masked at evaluation and can never be hit (a ceiling on Recall@K).

What this module measures, all vectorised:

* :class:`NegativeCoverage` - per user, which items were drawn as a negative at least once;
  the never-sampled share of the candidates and whether the test item was ever drawn.
* :func:`test_item_rank` - pessimistic full-ranking rank of each user's test item.
* :class:`LeakTrace` - both per round, as a ``pandas.DataFrame`` (attached to a federated run
  by :mod:`fedlib.audits.leak_trace`, which needs the engine: this module does not).
* :func:`duplicate_pair_leak`, :func:`lastfm_duplicate_leak` - test pairs that also occur in
  train, on any split and on the LastFM-2K raw files.

Conventions: ``U`` users, ``I`` items, ids dense and 0-based (``int64``); per-user item sets are
:class:`~fedlib.data.splits.Pairs`; a *candidate* of ``u`` is an item not in ``train_u``; a
*competitor* is a candidate that is neither ``u``'s test item nor one of its valid items (what the
test item is ranked against at evaluation).
"""
from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd
import torch

from fedlib.data.splits import Pairs
from fedlib.metrics.ranking import DivergedModelError

__all__ = [
    "NegativeCoverage", "negatives_from_plan",
    "test_item_rank", "exclusion_mask",
    "LeakTrace",
    "DuplicatePairLeak", "duplicate_pair_leak", "reference_code_leave_last_out", "lastfm_duplicate_leak",
]

#: ``NegativeCoverage(storage="auto")`` keeps a dense ``(U, I)`` bool table up to this many cells
#: (128 MiB) and a bitset (``I / 8`` bytes per user) above it.
DENSE_COVERAGE_MAX_CELLS = 1 << 27

ArrayLike = Union[np.ndarray, torch.Tensor, Sequence[int]]
PairsLike = Union[Pairs, Tuple[ArrayLike, ArrayLike]]


# ======================================================================================
# Input checks: say what is wrong and how to fix it
# ======================================================================================
def _as_int_array(values: ArrayLike, name: str) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.size == 0:
        array = array.astype(np.int64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-d array of ids, got shape {array.shape}; flatten it (e.g. .ravel())")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must hold integer ids, got dtype {array.dtype}; convert with .astype(np.int64)")
    return array.astype(np.int64, copy=False)


def _as_pairs_arrays(pairs: PairsLike, name: str) -> Tuple[np.ndarray, np.ndarray]:
    if isinstance(pairs, Pairs):
        return pairs.users, pairs.items
    if isinstance(pairs, (tuple, list)) and len(pairs) == 2:
        users, items = _as_int_array(pairs[0], f"{name} users"), _as_int_array(pairs[1], f"{name} items")
        if users.shape != items.shape:
            raise ValueError(f"{name}: users and items must have equal length, got {users.size} and {items.size}")
        if users.size and (users.min() < 0 or items.min() < 0):
            raise ValueError(f"{name}: ids must be non-negative (dense 0-based ids, as in fedlib.data.splits.Pairs)")
        return users, items
    raise ValueError(f"{name} must be a fedlib Pairs or a (users, items) pair of 1-d integer arrays, "
                     f"got {type(pairs).__name__}")


def _check_range(values: np.ndarray, upper: int, name: str, hint: str) -> None:
    if values.size and (values.min() < 0 or values.max() >= upper):
        bad = values[(values < 0) | (values >= upper)][:5].tolist()
        raise ValueError(f"{name} must lie in [0, {upper}), got {bad}; {hint}")


# ======================================================================================
# 1. Negative coverage
# ======================================================================================
def negatives_from_plan(plan) -> Tuple[np.ndarray, np.ndarray]:
    """The sampled negatives of one :class:`~fedlib.engine.plan.RoundPlan`.

    A plan stores every local example of every client (``items``, ``labels``; label 0 = a
    sampled negative) in client blocks given by ``example_indptr``. Every example is trained
    on, so "drawn as a negative" and "pushed down by a negative step" are the same event.

    Returns:
        ``(user_ids, item_ids)``: two ``(N,) int64`` arrays, one entry per negative example
        (repeats kept; with ``local_epochs > 1`` each negative appears once per epoch).
    """
    for attribute in ("clients", "example_indptr", "items", "labels"):
        if not hasattr(plan, attribute):
            raise ValueError(f"plan must be a fedlib.engine.plan.RoundPlan (missing {attribute!r}); "
                             "for other engines pass the (user_ids, item_ids) of the negatives to update()")
    owners = np.asarray(plan.clients, dtype=np.int64)[plan.example_positions()]
    negative = np.asarray(plan.labels) == 0
    return owners[negative], np.asarray(plan.items, dtype=np.int64)[negative]


class NegativeCoverage:
    """Which items each user has drawn as a training negative at least once.

    Feed it every round's negatives (:meth:`update` with ``(user_ids, item_ids)``, or
    :meth:`update_from_plan`); read per-user results or a one-line :meth:`summary`.

    Bookkeeping is incremental: each update marks the new ``(user, item)`` cells and adds them
    to per-user counters (candidates sampled, competitors sampled, test item sampled), so a
    round costs ``O(negatives)``, never ``O(U × I)``. The "seen" table is a dense ``(U, I)``
    bool array or, above :data:`DENSE_COVERAGE_MAX_CELLS`, a bitset ``(U, ceil(I / 8)) uint8``
    (``np.packbits`` bit order); both give identical results (LastFM-2K 1.9k × 17.6k and
    ML-1M 6k × 3.7k fit the dense table).

    Args:
        train: training pairs; defines each user's candidates ``I \\ train_u``.
        num_items: ``I``.
        test: at most one test pair per user (leave-one-out); enables the test-item results.
        valid: validation pairs; excluded from the competitors (they are masked at test time).
        users: users averaged over in :meth:`summary` (default: users with a test pair when
            ``test`` is given, else users with training data; users without any candidate are
            skipped).
        storage: ``"auto"``, ``"dense"`` or ``"bits"``.
    """

    def __init__(self, train: Pairs, num_items: int, *, test: Optional[Pairs] = None, valid: Optional[Pairs] = None,
                 users: Optional[ArrayLike] = None, storage: str = "auto"):
        if not isinstance(train, Pairs):
            raise ValueError(f"train must be a fedlib Pairs (split.train), got {type(train).__name__}; build one with "
                             "Pairs.from_arrays(users, items, num_users)")
        num_items = int(num_items)
        if num_items <= 0:
            raise ValueError(f"num_items must be positive (the split's num_items), got {num_items}")
        num_users = max([train.num_users] + [p.num_users for p in (test, valid) if p is not None])
        self.num_users, self.num_items = int(num_users), num_items
        for name, pairs in (("train", train), ("test", test), ("valid", valid)):
            if pairs is not None:
                _check_range(pairs.items, num_items, f"{name} item ids", "pass the split's num_items")
        if storage not in ("auto", "dense", "bits"):
            raise ValueError(f"storage must be 'auto', 'dense' or 'bits', got {storage!r}")
        if storage == "auto":
            storage = "dense" if self.num_users * num_items <= DENSE_COVERAGE_MAX_CELLS else "bits"
        self.storage = storage
        if storage == "dense":
            self._seen = np.zeros((self.num_users, num_items), dtype=bool)
        else:
            self._seen = np.zeros((self.num_users, (num_items + 7) // 8), dtype=np.uint8)

        self._train_keys = self._keys(train.users, train.items)
        self.num_candidates = num_items - np.bincount(self._train_keys // num_items, minlength=self.num_users)  # (U,)
        self.has_test = test is not None
        self.test_item = np.full(self.num_users, -1, dtype=np.int64)  # (U,) -1 = no test pair
        if test is not None:
            counts = test.counts()
            if counts.max(initial=0) > 1:
                raise ValueError(f"test must hold at most one pair per user (leave-one-out), but user "
                                 f"{int(np.argmax(counts))} has {int(counts.max())}; audit one held-out item per user "
                                 "(e.g. the latest one)")
            self.test_item[test.users] = test.items
        # Items that are not competitors of the test item: train ∪ valid ∪ {test item}.
        parts = [train] + [p for p in (valid, test) if p is not None]
        self._non_competitor_keys = self._keys(np.concatenate([p.users for p in parts]),
                                               np.concatenate([p.items for p in parts]))
        self.num_competitors = num_items - np.bincount(self._non_competitor_keys // num_items, minlength=self.num_users)

        if users is None:
            users = np.flatnonzero(self.test_item >= 0) if self.has_test else train.active_users()
        users = np.unique(_as_int_array(users, "users"))
        _check_range(users, self.num_users, "users", "pass ids of users present in the split")
        self.users = users[self.num_candidates[users] > 0]  # (n,) users averaged over

        self.sampled_candidates = np.zeros(self.num_users, dtype=np.int64)  # (U,)
        self.sampled_competitors = np.zeros(self.num_users, dtype=np.int64)  # (U,)
        self.test_sampled = np.zeros(self.num_users, dtype=bool)  # (U,)
        self.rounds = 0

    # ----------------------------------------------------------------------------------
    def _keys(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Sorted unique ``user * I + item`` keys."""
        return np.unique(np.asarray(users, dtype=np.int64) * self.num_items + np.asarray(items, dtype=np.int64))

    @staticmethod
    def _member(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
        if sorted_keys.size == 0:
            return np.zeros(keys.shape, dtype=bool)
        pos = np.minimum(np.searchsorted(sorted_keys, keys), sorted_keys.size - 1)
        return sorted_keys[pos] == keys

    def _is_seen(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        if self.storage == "dense":
            return self._seen[users, items]
        return (self._seen[users, items >> 3] & (np.uint8(128) >> (items & 7).astype(np.uint8))) != 0

    def _mark(self, users: np.ndarray, items: np.ndarray) -> None:
        if self.storage == "dense":
            self._seen[users, items] = True
        else:  # several new cells can share a byte: an unbuffered OR
            np.bitwise_or.at(self._seen, (users, items >> 3), np.uint8(128) >> (items & 7).astype(np.uint8))

    # ----------------------------------------------------------------------------------
    def update(self, user_ids: ArrayLike, item_ids: ArrayLike) -> None:
        """Add one round's negatives and advance the round counter.

        Args:
            user_ids, item_ids: ``(N,)`` integer arrays or tensors; entry ``j`` says that user
                ``user_ids[j]`` drew item ``item_ids[j]`` as a negative (repeats are fine).
                Draws of a user's own training items are not candidates and are ignored.
        """
        users, items = _as_int_array(user_ids, "user_ids"), _as_int_array(item_ids, "item_ids")
        if users.shape != items.shape:
            raise ValueError(f"user_ids and item_ids must have equal length (one entry per negative), "
                             f"got {users.size} and {items.size}")
        _check_range(users, self.num_users, "user_ids", "build the coverage with the split used for training")
        _check_range(items, self.num_items, "item_ids", "pass the split's num_items")
        keys = self._keys(users, items)
        users, items = keys // self.num_items, keys % self.num_items
        new = ~self._is_seen(users, items)
        keys, users, items = keys[new], users[new], items[new]
        self._mark(users, items)
        candidate = ~self._member(self._train_keys, keys)
        competitor = ~self._member(self._non_competitor_keys, keys)
        self.sampled_candidates += np.bincount(users[candidate], minlength=self.num_users)
        self.sampled_competitors += np.bincount(users[competitor], minlength=self.num_users)
        hit_test = users[items == self.test_item[users]]
        self.test_sampled[hit_test] = True
        self.rounds += 1

    def update_from_plan(self, plan) -> None:
        """:meth:`update` with the negatives of a :class:`~fedlib.engine.plan.RoundPlan`."""
        self.update(*negatives_from_plan(plan))

    # ----------------------------------------------------------------------------------
    def never_sampled_fraction(self) -> np.ndarray:
        """``(U,) float64``: share of each user's candidates never drawn as a negative (NaN: no candidate)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            out = (self.num_candidates - self.sampled_candidates) / self.num_candidates
        return np.where(self.num_candidates > 0, out, np.nan)

    def never_sampled_competitors(self) -> np.ndarray:
        """``(U,) int64``: competitors (candidates except test and valid items) never drawn as a negative.

        0 means that under the leaky sampler the test item is the only untouched row left.
        """
        return self.num_competitors - self.sampled_competitors

    def test_item_sampled(self) -> np.ndarray:
        """``(U,) bool``: has the user's test item been drawn as a negative (False without test pair)?"""
        if not self.has_test:
            raise ValueError("no test pairs were given; build NegativeCoverage(..., test=split.test)")
        return self.test_sampled.copy()

    def sampled_mask(self, users: Optional[ArrayLike] = None) -> np.ndarray:
        """``(n, I) bool``: every cell drawn as a negative so far, for ``users`` (default: all)."""
        rows = np.arange(self.num_users) if users is None else _as_int_array(users, "users")
        _check_range(rows, self.num_users, "users", "pass ids of users present in the split")
        if self.storage == "dense":
            return self._seen[rows].copy()
        return np.unpackbits(self._seen[rows], axis=1, count=self.num_items).astype(bool)

    def summary(self) -> Dict[str, float]:
        """Means over :attr:`users` after :attr:`rounds` updates.

        Keys: ``rounds``; ``never_sampled_fraction`` (mean of the per-user share of candidates
        never drawn); and with test pairs ``test_item_sampled_share`` (share of users whose test
        item was drawn at least once) and ``never_sampled_competitors`` (mean count).
        """
        users = self.users
        out = {"rounds": self.rounds,
               "never_sampled_fraction": float(np.mean(self.never_sampled_fraction()[users])) if users.size else np.nan}
        if self.has_test:
            out["test_item_sampled_share"] = float(np.mean(self.test_sampled[users])) if users.size else np.nan
            out["never_sampled_competitors"] = (float(np.mean(self.never_sampled_competitors()[users]))
                                                if users.size else np.nan)
        return out


# ======================================================================================
# 2. Rank of the test item
# ======================================================================================
def exclusion_mask(users: ArrayLike, num_items: int, *pairs: Pairs, device=None) -> torch.Tensor:
    """``(n, I) bool``: ``True`` at every item of ``users[j]`` in any of ``pairs`` (train, valid, ...).

    The mask of full-ranking evaluation: ``exclusion_mask(users, I, split.train, split.valid)``
    for the test set. Memory ``n × I`` bytes: call it per chunk of users for large splits.
    """
    from fedlib.metrics.ranking import csr_to_dense_mask, select_csr_rows

    rows = torch.as_tensor(_as_int_array(users, "users"))
    mask = torch.zeros(rows.numel(), int(num_items), dtype=torch.bool)
    for p in pairs:
        if not isinstance(p, Pairs):
            raise ValueError(f"exclusion_mask takes fedlib Pairs (split.train, split.valid), got {type(p).__name__}")
        _check_range(rows.numpy(), p.num_users, "users", "pass user ids of the split the pairs come from")
        indptr, items = select_csr_rows(p.indptr, p.items, rows)
        mask |= csr_to_dense_mask(indptr, items, int(num_items))
    return mask if device is None else mask.to(device)


def test_item_rank(scores: torch.Tensor, test_items: ArrayLike, exclude_mask: torch.Tensor, *,
                   on_masked_test: str = "raise") -> torch.Tensor:
    """Full-ranking rank (1 = best) of each user's test item, ties counted pessimistically.

    ``rank_u = 1 + #{j unmasked, j ≠ t_u : s_uj > s_ut} + #{j unmasked, j ≠ t_u : s_uj = s_ut}``.

    Pessimistic ties: an item scored exactly like the test item is placed in front of it. A
    model that does not separate the test item from other candidates (e.g. constant scores,
    or rows never trained and still equal) therefore gets a bad rank, never a lucky rank 1;
    a rank of 1 means the test item is *strictly* above every other unmasked candidate. This
    matches ``tie_rule="pessimistic"`` of :mod:`fedlib.metrics.ranking`.

    Args:
        scores: ``(U, I)`` float tensor (no NaN), row ``u`` = scores of one user.
        test_items: ``(U,)`` test item id of each row.
        exclude_mask: ``(U, I)`` bool, ``True`` = masked (train items; + valid items for test).
        on_masked_test: what to do when a test item is itself masked (the same pair is also in
            train, e.g. LastFM-2K tag rows): ``"raise"`` (default) or ``"worst"`` (rank
            ``1 + #unmasked others``: behind every candidate, it can never be hit).

    Returns:
        ``(U,) int64`` ranks on the device of ``scores``. Memory: a few ``(U, I)`` bool
        temporaries, so chunk over users for very large score matrices.
    """
    if not isinstance(scores, torch.Tensor) or not torch.is_floating_point(scores) or scores.dim() != 2:
        raise ValueError("scores must be a 2-d floating-point torch tensor (users × items), got "
                         f"{type(scores).__name__} {getattr(scores, 'shape', '')}")
    if torch.isnan(scores).any():
        raise DivergedModelError("scores contain NaN (a diverged model); NaN cannot be ranked, fix or clip the model first")
    if on_masked_test not in ("raise", "worst"):
        raise ValueError(f"on_masked_test must be 'raise' or 'worst', got {on_masked_test!r}")
    num_users, num_items = scores.shape
    test = torch.as_tensor(_as_int_array(test_items, "test_items"), device=scores.device)
    if test.numel() != num_users:
        raise ValueError(f"test_items must have one entry per row of scores ({num_users}), got {test.numel()}")
    _check_range(test.cpu().numpy(), num_items, "test_items", "use item ids of the scored item space")
    if not isinstance(exclude_mask, torch.Tensor) or exclude_mask.dtype != torch.bool:
        raise ValueError("exclude_mask must be a bool torch tensor (True = masked); build one with exclusion_mask()")
    if tuple(exclude_mask.shape) != tuple(scores.shape):
        raise ValueError(f"exclude_mask must have the shape of scores {tuple(scores.shape)}, "
                         f"got {tuple(exclude_mask.shape)}")
    exclude_mask = exclude_mask.to(scores.device)
    rows = torch.arange(num_users, device=scores.device)
    masked_test = exclude_mask[rows, test]
    if on_masked_test == "raise" and bool(masked_test.any()):
        first = int(torch.nonzero(masked_test)[0])
        raise ValueError(f"{int(masked_test.sum())} test item(s) are masked (first: row {first}, item "
                         f"{int(test[first])}): the pair is also in train/valid. Pass on_masked_test='worst' to rank "
                         "them behind every candidate, or drop those users")
    others = ~exclude_mask
    others[rows, test] = False  # the test item does not compete with itself
    target = scores[rows, test].unsqueeze(1)  # (U, 1)
    above_or_tied = ((scores >= target) & others).sum(dim=1)
    rank = 1 + above_or_tied
    if on_masked_test == "worst":
        rank = torch.where(masked_test, 1 + others.sum(dim=1), rank)
    return rank.to(torch.int64)


# The name starts with "test": keep pytest from collecting it when a test module imports it.
test_item_rank.__test__ = False


# ======================================================================================
# 3. Per-round trace
# ======================================================================================
class LeakTrace:
    """Per-round record of negative coverage and test-item rank, as a DataFrame.

    Call :meth:`record` once per round, or hook it into the round loop with
    :func:`fedlib.audits.leak_trace.leak_trace_hook` (see
    :func:`fedlib.audits.leak_trace.trace_federated_run`).

    Args:
        train, test, num_items, valid, storage: as in :class:`NegativeCoverage`; ranks mask
            train (+ valid) items, as the test evaluation does.

    Columns of :meth:`frame`: ``round`` (rounds completed), ``never_sampled_fraction``,
    ``test_item_sampled_share``, ``never_sampled_competitors`` (coverage, means over users) and,
    in rounds with scores, ``test_rank_mean``, ``test_rank_median``, ``test_rank1_share`` over
    the users whose test item is not masked, and ``masked_test_users`` (those that cannot be hit).
    """

    def __init__(self, train: Pairs, test: Pairs, num_items: int, *, valid: Optional[Pairs] = None,
                 storage: str = "auto"):
        if test is None:
            raise ValueError("LeakTrace needs the test pairs (split.test)")
        self.coverage = NegativeCoverage(train, num_items, test=test, valid=valid, storage=storage)
        self.users = self.coverage.users  # (n,) traced users
        self.test_items = self.coverage.test_item[self.users]  # (n,)
        self._masking = tuple(p for p in (train, valid) if p is not None)
        self.rows: List[dict] = []

    def ranks(self, score_fn: Callable[[torch.Tensor], torch.Tensor], *, chunk_size: int = 256,
              device=None) -> torch.Tensor:
        """``(n,) int64`` test-item ranks of :attr:`users` (masked test items: ``"worst"``).

        Args:
            score_fn: ``score_fn(user_ids (c,) int64 tensor) -> (c, I) scores``, called per chunk.
        """
        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        out = []
        for start in range(0, self.users.size, int(chunk_size)):
            chunk = self.users[start:start + int(chunk_size)]
            with torch.no_grad():
                scores = score_fn(torch.as_tensor(chunk, device=device))
            mask = exclusion_mask(chunk, self.coverage.num_items, *self._masking, device=scores.device)
            out.append(test_item_rank(scores, self.test_items[start:start + int(chunk_size)], mask,
                                      on_masked_test="worst").cpu())
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)

    def record(self, round_index: int, negatives: Optional[Tuple[ArrayLike, ArrayLike]] = None,
               score_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None, *, chunk_size: int = 256,
               device=None) -> dict:
        """Add one round: its negatives (``(user_ids, item_ids)``, or a plan) and optionally ranks.

        Returns the row appended to the trace.
        """
        if negatives is not None:
            if hasattr(negatives, "labels"):
                self.coverage.update_from_plan(negatives)
            else:
                self.coverage.update(*negatives)
        row = {"round": int(round_index), **{k: v for k, v in self.coverage.summary().items() if k != "rounds"}}
        if score_fn is not None:
            ranks = self.ranks(score_fn, chunk_size=chunk_size, device=device).numpy()
            mask = exclusion_mask(self.users, self.coverage.num_items, *self._masking)
            masked = mask[torch.arange(self.users.size), torch.as_tensor(self.test_items)].numpy()
            reachable = ranks[~masked]
            row.update(test_rank_mean=float(reachable.mean()) if reachable.size else np.nan,
                       test_rank_median=float(np.median(reachable)) if reachable.size else np.nan,
                       test_rank1_share=float((reachable == 1).mean()) if reachable.size else np.nan,
                       masked_test_users=int(masked.sum()))
        self.rows.append(row)
        return row

    def frame(self) -> pd.DataFrame:
        """One row per recorded round."""
        return pd.DataFrame(self.rows)


# ======================================================================================
# 4. Duplicated (user, item) pairs
# ======================================================================================
class DuplicatePairLeak(NamedTuple):
    """Test pairs that also occur in train.

    Attributes:
        test_pairs: number of test pairs.
        also_in_train: how many of them also occur in train.
        fraction: ``also_in_train / test_pairs`` (NaN without test pairs).
        duplicated: ``(n_test,) bool`` per test pair, in the order given.
    """

    test_pairs: int
    also_in_train: int
    fraction: float
    duplicated: np.ndarray


def duplicate_pair_leak(train_pairs: PairsLike, test_pairs: PairsLike) -> DuplicatePairLeak:
    """How many test ``(user, item)`` pairs also occur in the training pairs.

    Such a test item is masked by full-ranking evaluation (train items are excluded), so it
    can never be hit: with leave-one-out it caps Recall@K at ``1 - fraction``. Pass
    ``union_pairs(train, valid)`` as ``train_pairs`` for the mask of the test evaluation.

    Args:
        train_pairs, test_pairs: :class:`~fedlib.data.splits.Pairs` or ``(users, items)``
            tuples of ``(n,)`` integer arrays (same id spaces).
    """
    train_users, train_items = _as_pairs_arrays(train_pairs, "train_pairs")
    test_users, test_items = _as_pairs_arrays(test_pairs, "test_pairs")
    stride = int(max(train_items.max(initial=-1), test_items.max(initial=-1))) + 1
    train_keys = np.unique(train_users * stride + train_items)
    duplicated = np.isin(test_users * stride + test_items, train_keys)
    count = int(duplicated.sum())
    return DuplicatePairLeak(int(test_users.size), count, count / test_users.size if test_users.size else np.nan,
                             duplicated)


def reference_code_leave_last_out(frame: pd.DataFrame, *, min_user_interactions: int = 10) -> Dict[str, pd.DataFrame]:
    """The reference code's split (PFedRec ``data.py``, used by FedRKG), rebuilt in pandas.

    Independent of :mod:`fedlib.data.protocols`: every row is one interaction (repeated pairs
    kept), users with fewer than ``min_user_interactions`` rows are dropped, and per user
    ``rank = groupby(user).timestamp.rank(method="first", ascending=False)``: rank 1 is test,
    rank 2 valid, the rest train (ties: the row higher up in the file counts as more recent).

    Args:
        frame: columns ``user, item, timestamp`` in file order.

    Returns:
        ``{"train", "valid", "test"}`` frames with columns ``user, item`` (raw ids).
    """
    missing = {"user", "item", "timestamp"} - set(frame.columns)
    if missing:
        raise ValueError(f"frame needs columns user, item, timestamp; missing {sorted(missing)}")
    rows = frame[["user", "item", "timestamp"]]
    rows = rows[rows.groupby("user")["item"].transform("size") >= int(min_user_interactions)]
    rank = rows.groupby("user")["timestamp"].rank(method="first", ascending=False)
    return {"test": rows[rank == 1][["user", "item"]], "valid": rows[rank == 2][["user", "item"]],
            "train": rows[rank > 2][["user", "item"]]}


def _leak_row(construction: str, train, valid, test, users: int) -> dict:
    in_train = duplicate_pair_leak(train, test)
    union = (np.concatenate([train[0], valid[0]]), np.concatenate([train[1], valid[1]]))
    in_known = duplicate_pair_leak(union, test)
    return {"construction": construction, "users": int(users), "test_pairs": in_train.test_pairs,
            "also_in_train": in_train.also_in_train, "fraction": in_train.fraction,
            "also_in_train_or_valid": in_known.also_in_train, "fraction_train_or_valid": in_known.fraction,
            "reachable_share": 1.0 - in_known.fraction}


def _codes(frame: pd.DataFrame) -> Tuple[np.ndarray, np.ndarray]:
    return frame["user"].to_numpy(dtype=np.int64), frame["item"].to_numpy(dtype=np.int64)


def lastfm_duplicate_leak(root=None) -> pd.DataFrame:
    """Test pairs also in train on LastFM-2K (HetRec ``user_taggedartists.dat``), three constructions.

    * ``fedrkg protocol (tag_assignments)``: :func:`fedlib.data.protocols.fedrkg.build` as the
      project uses it - every tag assignment is an interaction (the loader's
      ``tag_assignments`` variant; the default ``listens`` variant reads ``user_artists.dat``
      and is not used by FedRKG). Repeated pairs are *not* removed.
    * ``reference code (rebuilt)``: the same raw rows split by
      :func:`reference_code_leave_last_out` (the PFedRec/FedRKG pandas code), independently of
      the project's split code.
    * ``de-duplicated pairs (tagged)``: the FedRKG split of the loader's ``tagged`` variant (one
      row per (user, artist) pair, first tag time): a test pair cannot occur in train.

    Returns:
        one row per construction: ``users, test_pairs, also_in_train, fraction,
        also_in_train_or_valid, fraction_train_or_valid`` (the test mask is train + valid) and
        ``reachable_share`` (``1 - fraction_train_or_valid``: the Recall@K ceiling).

    Raises:
        fedlib.data.errors.FedlibDataError: the raw files are missing under ``root``
            (default ``$FEDLIB_DATA``); the message says where to put them.
    """
    from fedlib.data.protocols import _common as C
    from fedlib.data.protocols import fedrkg

    rows = []
    split = fedrkg.build(C.LASTFM, root=root)  # variant tag_assignments
    pairs = lambda p: (p.users, p.items)  # noqa: E731
    rows.append(_leak_row("fedrkg protocol (tag_assignments)", pairs(split.train), pairs(split.valid),
                          pairs(split.test), split.test.active_users().size))
    frame = C.lastfm_tag_assignments(root).frame
    ref = reference_code_leave_last_out(frame, min_user_interactions=fedrkg.DATASETS[C.LASTFM]["min_user"])
    rows.append(_leak_row("reference code (rebuilt)", _codes(ref["train"]), _codes(ref["valid"]),
                          _codes(ref["test"]), ref["test"]["user"].nunique()))
    tagged = fedrkg.build(C.LASTFM, variant="tagged", root=root)
    rows.append(_leak_row("de-duplicated pairs (tagged)", pairs(tagged.train), pairs(tagged.valid),
                          pairs(tagged.test), tagged.test.active_users().size))
    return pd.DataFrame(rows)
