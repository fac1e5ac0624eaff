r"""User groups of FedRKG's analyses (§6.3, Table 4, Figure 5, Tables D.3/D.4) and their statistics.

Pure functions over a training :class:`~fedlib.data.splits.Pairs`, per-user metrics and gate
logits; nothing here trains or evaluates a model.

Groups
======
* **Popular items** (:func:`popular_items`): the top ``top_fraction`` (30 %) of items by
  number of training interactions.
* **Popular share** (:func:`popular_share`): per user, the fraction of their training
  interactions that fall on popular items.
* **Distinct users and followers** (:func:`distinct_and_followers`, Table 4 and Table D.3).
  The paper: "users with a high share of interactions on these items are labeled followers,
  and those with a low share are labeled distinct. We sample 100 users from each group".
  It does not say where "high" and "low" start. **Our reading**: among the users with
  training data, the distinct pool holds the users whose share is at most the share of the
  ``k``-th lowest user and the follower pool those whose share is at least that of the
  ``k``-th highest user, ``k = round(pool_fraction × n)``; users tied with a boundary value
  join the pool (so a pool can be larger than ``k``), except that a value which is both
  boundaries belongs to neither pool. The default ``pool_fraction = 0.5`` is a split at the
  median share: Table D.3 draws up to 500 users per group from Amazon-Video's 1,372 users,
  which a tercile (≈ 457 users per pool) cannot supply. ``group_size`` users are then drawn
  without replacement from each pool.
* **Warm and cold users** (:func:`warm_and_cold`, Figure 5 and Table D.4): the top and the
  bottom ``fraction`` (30 %; D.4 also 10 % and 20 %) of users by number of training
  interactions.

"Top ``f``" of ``n`` objects always means ``k = round(f × n)`` objects, rounding halves up
(:func:`group_count`): 30 % of 7,957 items is 2,387 items, 30 % of 1,372 users is 412 users.
Rankings are deterministic: by count (descending), ties broken by the smaller id first; a
top group is the head of that ranking and a bottom group its tail.

Statistics
==========
* :func:`relative_change` — Table 4: per metric, ``100 × (mean_after − mean_before) /
  mean_before`` of a group's per-user metrics from just before a guidance round to just
  after it.
* :func:`improved_declined` — Table 4's last line: users whose aggregate score (the sum of
  the metrics) went up, down or stayed the same.
* :func:`gate_group_change` — Tables D.3/D.4: ``100 × (ḡ_B − ḡ_A) / ḡ_A`` of the mean gating
  value ``σ(logit)`` and of the mean gating logit from group A to group B over a set of items.

Relative changes divide by the group-A (or "before") mean as the paper's formulas do. When
that mean is exactly 0 the change is undefined: the result is NaN and a ``RuntimeWarning``
names the quantity. When it is negative (possible for logits) the sign of the percentage is
the opposite of the direction of the change; the results carry both means so that this can
be read off.
"""
from __future__ import annotations

import math
import warnings
from typing import Dict, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from fedlib.data.splits import Pairs

__all__ = [
    "group_count", "popular_items", "popular_share",
    "PopularityGroups", "distinct_and_followers",
    "ActivityGroups", "warm_and_cold",
    "relative_change", "ImprovedDeclined", "improved_declined",
    "GateGroupChange", "gate_group_change",
]

ArrayLike = Union[np.ndarray, torch.Tensor, Sequence[float]]
#: Per-user metrics: ``{"NDCG@5": (n,), ...}``, or the ``(users, {...})`` pair returned by
#: :meth:`fedlib.engine.evaluation.RankingEvaluator.per_user`.
MetricsLike = Union[Mapping[str, ArrayLike], Tuple[ArrayLike, Mapping[str, ArrayLike]]]


# ======================================================================================
# Input checks
# ======================================================================================
def _to_numpy(values) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().numpy()
    return np.asarray(values)


def _check_pairs(train, name: str = "train") -> Pairs:
    if not isinstance(train, Pairs):
        raise TypeError(f"{name} must be a fedlib.data.splits.Pairs (e.g. split.train), got {type(train).__name__}")
    return train


def _check_fraction(value, name: str, upper: float = 1.0) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number in (0, {upper:g}), got {value!r}") from None
    inclusive = upper < 1.0
    if not (0.0 < value < upper or (inclusive and value == upper)):
        bracket = "]" if inclusive else ")"
        raise ValueError(f"{name} must lie in (0, {upper:g}{bracket}, got {value!r}; e.g. 0.3 for 30 %"
                         + (" (a larger value would make the top and bottom groups overlap)" if inclusive else ""))
    return value


def _check_positive_int(value, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a positive integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return int(value)


def _check_ids(ids, name: str, upper: int, what: str) -> np.ndarray:
    """1-d, integer, unique, non-empty ids in ``[0, upper)``."""
    array = _to_numpy(ids)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-d array of {what} ids, got shape {array.shape}; flatten it (e.g. .ravel())")
    if array.size == 0:
        raise ValueError(f"{name} is empty: pass at least one {what} id")
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} must hold integer {what} ids, got dtype {array.dtype}; convert with .astype(np.int64)")
    array = array.astype(np.int64, copy=False)
    low, high = int(array.min()), int(array.max())
    if low < 0 or high >= upper:
        bad = low if low < 0 else high
        raise ValueError(f"{name} holds {what} id {bad}, outside [0, {upper}); "
                         f"ids must be dense 0-based ids of the same id space")
    if np.unique(array).size != array.size:
        values, counts = np.unique(array, return_counts=True)
        raise ValueError(f"{name} repeats {what} ids {values[counts > 1][:5].tolist()}; "
                         f"each {what} may appear once (use np.unique)")
    return array


def _check_num_items(train: Pairs, num_items) -> int:
    num_items = _check_positive_int(num_items, "num_items")
    if len(train) and int(train.items.max()) >= num_items:
        raise ValueError(f"train holds item id {int(train.items.max())} but num_items={num_items}; "
                         f"pass the split's num_items (item ids must be < num_items)")
    if len(train) and int(train.items.min()) < 0:
        raise ValueError("train holds negative item ids; ids must be dense and 0-based")
    return num_items


def _population(train: Pairs, candidates, name: str = "candidates") -> np.ndarray:
    """Sorted users the groups are formed from: ``candidates``, else every user with training data."""
    counts = train.counts()
    if candidates is None:
        population = np.flatnonzero(counts > 0).astype(np.int64)
        if population.size == 0:
            raise ValueError("train has no interactions: no user can be grouped")
        return population
    population = np.sort(_check_ids(candidates, name, train.num_users, "user"))
    empty = population[counts[population] == 0]
    if empty.size:
        raise ValueError(f"{name} holds {empty.size} users without training interactions "
                         f"(e.g. {empty[:5].tolist()}); groups are defined by training data, drop them "
                         f"(e.g. np.intersect1d({name}, train.active_users()))")
    return population


def group_count(fraction: float, n: int) -> int:
    """Size of "the top ``fraction``" of ``n`` objects: ``round(fraction × n)``, halves rounded up.

    A tolerance of ``1e-9`` keeps products such as ``0.29 × 50 = 14.499999999999998`` from rounding down.
    """
    return int(math.floor(float(fraction) * int(n) + 0.5 + 1e-9))


# ======================================================================================
# Popular items and popular share
# ======================================================================================
def popular_items(train: Pairs, num_items: int, top_fraction: float = 0.3) -> np.ndarray:
    """``(num_items,) bool``: the top ``top_fraction`` of items by training interaction count.

    Exactly ``k = group_count(top_fraction, num_items)`` items are marked. Items are ranked by
    count (every interaction counts, repeats included), ties broken by the smaller item id,
    so the mask is deterministic; when fewer than ``k`` items occur in ``train`` the rest of
    the top ``k`` are never-seen items of the smallest ids.

    Raises:
        ValueError: ``top_fraction`` outside (0, 1), item ids out of range, or ``k = 0``.
    """
    train = _check_pairs(train)
    num_items = _check_num_items(train, num_items)
    top_fraction = _check_fraction(top_fraction, "top_fraction")
    k = group_count(top_fraction, num_items)
    if k == 0:
        raise ValueError(f"top_fraction={top_fraction} of num_items={num_items} rounds to 0 popular items; "
                         f"raise top_fraction to at least {0.5 / num_items:.3g}")
    counts = np.bincount(train.items, minlength=num_items)
    order = np.lexsort((np.arange(num_items), -counts))  # count descending, then id ascending
    mask = np.zeros(num_items, dtype=bool)
    mask[order[:k]] = True
    return mask


def popular_share(train: Pairs, popular_mask: ArrayLike) -> np.ndarray:
    """``(num_users,) float64``: each user's share of training interactions on popular items.

    Every interaction counts (a repeated pair counts twice). Users without training
    interactions get NaN.
    """
    train = _check_pairs(train)
    mask = _to_numpy(popular_mask)
    if mask.ndim != 1 or mask.dtype != np.bool_:
        raise ValueError(f"popular_mask must be a 1-d bool array over items (from popular_items), "
                         f"got dtype {mask.dtype} and shape {mask.shape}")
    if len(train) and int(train.items.max()) >= mask.size:
        raise ValueError(f"train holds item id {int(train.items.max())} but popular_mask covers only "
                         f"{mask.size} items; build the mask with the split's num_items")
    counts = train.counts().astype(np.float64)
    on_popular = np.bincount(train.users, weights=mask[train.items].astype(np.float64), minlength=train.num_users)
    share = np.full(train.num_users, np.nan)
    has = counts > 0
    share[has] = on_popular[has] / counts[has]
    return share


# ======================================================================================
# Distinct users vs. followers (Table 4, Table D.3)
# ======================================================================================
class PopularityGroups(NamedTuple):
    """Result of :func:`distinct_and_followers`.

    Attributes:
        distinct, followers: sorted ``int64`` user ids sampled from each pool.
        distinct_threshold: the distinct pool holds users with share ``<=`` this value.
        follower_threshold: the follower pool holds users with share ``>=`` this value. When the
            two thresholds are equal, users at exactly that share are in neither pool.
        distinct_pool_size, follower_pool_size: users in each pool before sampling.
        population_size: users the pools were formed from.
        popular: ``(num_items,) bool`` popular-item mask (for :func:`gate_group_change`).
        share: ``(num_users,) float64`` popular share of every user (NaN without training data).
    """

    distinct: np.ndarray
    followers: np.ndarray
    distinct_threshold: float
    follower_threshold: float
    distinct_pool_size: int
    follower_pool_size: int
    population_size: int
    popular: np.ndarray
    share: np.ndarray


def distinct_and_followers(train: Pairs, num_items: int, group_size: Optional[int] = 100, top_fraction: float = 0.3,
                           seed: int = 0, pool_fraction: float = 0.5,
                           candidates: Optional[ArrayLike] = None) -> PopularityGroups:
    """FedRKG's popularity-based groups: distinct users (low popular share) and followers (high share).

    Steps (see the module docstring for why the pools are defined this way):

    1. ``popular = popular_items(train, num_items, top_fraction)``, ``share = popular_share(...)``.
    2. Population: ``candidates`` (e.g. the users evaluated at test), else every user with
       training data; ``n`` users, ``k = group_count(pool_fraction, n)``.
    3. ``distinct_threshold`` = the ``k``-th lowest share, ``follower_threshold`` = the
       ``k``-th highest; distinct pool = share ``<= distinct_threshold``, follower pool = share
       ``>= follower_threshold`` (strict inequalities when the thresholds are equal, so the
       pools never share a user).
    4. ``rng = np.random.default_rng(seed)``; ``group_size`` distinct users are drawn without
       replacement, then ``group_size`` followers, from the same generator. ``group_size=None``
       keeps the whole pools.

    Args:
        train: training interactions.
        num_items: size of the item id space.
        group_size: users per group (paper: 100; Table D.3 also 300 and 500), or ``None``.
        top_fraction: share of items that are popular (paper: 0.3).
        seed: seed of the sampling generator.
        pool_fraction: in (0, 0.5]; 0.5 splits at the median share, 1/3 keeps the terciles.
        candidates: optional user ids to form the pools from (each with training data).

    Raises:
        ValueError: invalid fractions or ids, or a pool smaller than ``group_size``.
    """
    train = _check_pairs(train)
    popular = popular_items(train, num_items, top_fraction)
    pool_fraction = _check_fraction(pool_fraction, "pool_fraction", upper=0.5)
    if group_size is not None:
        group_size = _check_positive_int(group_size, "group_size")
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an integer, got {seed!r}")
    share = popular_share(train, popular)
    population = _population(train, candidates)
    n = population.size
    k = group_count(pool_fraction, n)
    if k == 0:
        raise ValueError(f"pool_fraction={pool_fraction} of {n} users rounds to 0 users per pool; raise pool_fraction")
    values = share[population]
    ordered = np.sort(values)
    low, high = float(ordered[k - 1]), float(ordered[n - k])
    in_low, in_high = values <= low, values >= high
    distinct_pool = population[in_low & ~in_high]
    follower_pool = population[in_high & ~in_low]
    if group_size is None:
        distinct, followers = distinct_pool, follower_pool
    else:
        for label, pool, rule in (("distinct", distinct_pool, f"share <= {low:.4g}" if low < high else f"share < {low:.4g}"),
                                  ("follower", follower_pool, f"share >= {high:.4g}" if low < high else f"share > {high:.4g}")):
            if pool.size < group_size:
                raise ValueError(
                    f"the {label} pool has {pool.size} users ({rule}, pool_fraction={pool_fraction:g} of {n} users), "
                    f"fewer than group_size={group_size}; lower group_size, raise pool_fraction (at most 0.5), "
                    f"or pass group_size=None to keep the whole pools")
        rng = np.random.default_rng(int(seed))
        distinct = np.sort(rng.choice(distinct_pool, size=group_size, replace=False))
        followers = np.sort(rng.choice(follower_pool, size=group_size, replace=False))
    return PopularityGroups(
        distinct=distinct.astype(np.int64), followers=followers.astype(np.int64),
        distinct_threshold=low, follower_threshold=high,
        distinct_pool_size=int(distinct_pool.size), follower_pool_size=int(follower_pool.size),
        population_size=int(n), popular=popular, share=share,
    )


# ======================================================================================
# Warm vs. cold users (Figure 5, Table D.4)
# ======================================================================================
class ActivityGroups(NamedTuple):
    """Result of :func:`warm_and_cold`.

    Attributes:
        warm, cold: sorted ``int64`` user ids, ``group_count(fraction, population_size)`` each.
        warm_min_count: fewest training interactions of a warm user.
        cold_max_count: most training interactions of a cold user.
        population_size: users ranked.
    """

    warm: np.ndarray
    cold: np.ndarray
    warm_min_count: int
    cold_max_count: int
    population_size: int


def warm_and_cold(train: Pairs, fraction: float = 0.3, candidates: Optional[ArrayLike] = None) -> ActivityGroups:
    """Warm = top ``fraction`` of users by training interactions, cold = bottom ``fraction``.

    Both groups have exactly ``k = group_count(fraction, n)`` users, ``n`` = users with
    training data (or ``candidates``). One ranking is used for both: count descending, ties
    broken by the smaller user id first; warm = its first ``k`` users, cold = its last ``k``.
    Users tied at a boundary count are thus split deterministically (smaller ids count as
    warmer), and the groups never overlap.

    Raises:
        ValueError: ``fraction`` outside (0, 0.5], ``k = 0``, or groups that would overlap.
    """
    train = _check_pairs(train)
    fraction = _check_fraction(fraction, "fraction", upper=0.5)
    population = _population(train, candidates)
    n = population.size
    k = group_count(fraction, n)
    if k == 0:
        raise ValueError(f"fraction={fraction} of {n} users rounds to 0 users per group; raise fraction")
    if 2 * k > n:
        raise ValueError(f"fraction={fraction} of {n} users gives {k} users per group, so warm and cold would "
                         f"overlap; use fraction < 0.5 (or more users)")
    counts = train.counts()[population]
    order = np.lexsort((population, -counts))  # count descending, then id ascending
    warm, cold = order[:k], order[n - k:]
    return ActivityGroups(warm=np.sort(population[warm]), cold=np.sort(population[cold]),
                          warm_min_count=int(counts[warm].min()), cold_max_count=int(counts[cold].max()),
                          population_size=int(n))


# ======================================================================================
# Guidance effect on per-user metrics (Table 4)
# ======================================================================================
def _metric_table(metrics: MetricsLike, name: str) -> Tuple[Optional[np.ndarray], Dict[str, np.ndarray]]:
    """``(row_users or None, {metric: (n,) float64})``."""
    row_users = None
    if isinstance(metrics, tuple) and len(metrics) == 2 and isinstance(metrics[1], Mapping):
        row_users, metrics = metrics
        row_users = _to_numpy(row_users)
        if row_users.ndim != 1 or not np.issubdtype(row_users.dtype, np.integer):
            raise ValueError(f"{name}: the users of a (users, metrics) pair must be a 1-d integer array, "
                             f"got dtype {row_users.dtype} and shape {row_users.shape}")
        row_users = row_users.astype(np.int64, copy=False)
        if np.unique(row_users).size != row_users.size:
            raise ValueError(f"{name}: the users of a (users, metrics) pair repeat ids; each row must be one user")
    if not isinstance(metrics, Mapping) or not metrics:
        raise TypeError(f"{name} must be a non-empty mapping {{'NDCG@5': per-user values, ...}} or the "
                        f"(users, mapping) pair returned by RankingEvaluator.per_user, got {type(metrics).__name__}")
    table, length = {}, None
    for key, values in metrics.items():
        array = _to_numpy(values).astype(np.float64)
        if array.ndim != 1:
            raise ValueError(f"{name}[{key!r}] must be 1-d (one value per user), got shape {array.shape}")
        if length is None:
            length = array.size
        elif array.size != length:
            raise ValueError(f"{name}: metrics have different lengths ({length} and {array.size} for {key!r}); "
                             f"every metric must have one value per user row")
        table[key] = array
    if row_users is not None and row_users.size != length:
        raise ValueError(f"{name}: {row_users.size} users but {length} values per metric; they must align")
    return row_users, table


def _rows_of(users: np.ndarray, row_users: Optional[np.ndarray], length: int, name: str) -> np.ndarray:
    """Row of each group user in a metric table."""
    if row_users is None:
        if int(users.max()) >= length:
            raise ValueError(f"{name} has {length} rows (indexed by user id) but the group holds user "
                             f"{int(users.max())}; pass the (users, metrics) pair from RankingEvaluator.per_user "
                             f"so that rows can be matched to user ids")
        return users
    lookup = {int(u): r for r, u in enumerate(row_users.tolist())}
    rows = np.array([lookup.get(int(u), -1) for u in users], dtype=np.int64)
    missing = users[rows < 0]
    if missing.size:
        raise ValueError(f"{name} has no row for {missing.size} group users (e.g. {missing[:5].tolist()}); they were "
                         f"not evaluated (no target in that split): drop them from the group or evaluate them")
    return rows


def _group_rows(before: MetricsLike, after: MetricsLike, users, metrics) -> Tuple[list, Dict[str, np.ndarray], Dict[str, np.ndarray], int]:
    rows_b, table_b = _metric_table(before, "before")
    rows_a, table_a = _metric_table(after, "after")
    if metrics is None:
        if set(table_b) != set(table_a):
            raise ValueError(f"before and after hold different metrics ({sorted(table_b)} vs {sorted(table_a)}); "
                             f"pass metrics=[...] to choose common ones")
        names = list(table_b)
    else:
        names = [metrics] if isinstance(metrics, str) else list(metrics)
        if not names:
            raise ValueError("metrics is empty: name at least one metric, e.g. ['NDCG@5', 'Recall@5']")
        for key in names:
            for label, table in (("before", table_b), ("after", table_a)):
                if key not in table:
                    raise KeyError(f"metric {key!r} is not in {label} (it has {sorted(table)})")
    len_b, len_a = next(iter(table_b.values())).size, next(iter(table_a.values())).size
    if users is None:
        same = (rows_b is None and rows_a is None and len_b == len_a) or (
            rows_b is not None and rows_a is not None and np.array_equal(rows_b, rows_a))
        if not same:
            raise ValueError("users=None uses every row, which needs before and after to cover the same users "
                             "in the same order; pass the group's user ids instead")
        group_b = group_a = np.arange(len_b)
        n = len_b
    else:
        upper = np.iinfo(np.int64).max
        users = _check_ids(users, "users", upper, "user")
        group_b = _rows_of(users, rows_b, len_b, "before")
        group_a = _rows_of(users, rows_a, len_a, "after")
        n = users.size
    if n == 0:
        raise ValueError("no users to compare: before/after are empty")
    sel_b = {k: table_b[k][group_b] for k in names}
    sel_a = {k: table_a[k][group_a] for k in names}
    for label, sel in (("before", sel_b), ("after", sel_a)):
        for key, values in sel.items():
            if not np.all(np.isfinite(values)):
                raise ValueError(f"{label}[{key!r}] is NaN or infinite for {int((~np.isfinite(values)).sum())} group "
                                 f"users (users that could not be evaluated); drop them from the group")
    return names, sel_b, sel_a, n


def _percent_change(old: float, new: float, what: str) -> float:
    if old == 0.0:
        warnings.warn(f"relative change of {what} is undefined: the reference mean is 0 (returning NaN)",
                      RuntimeWarning, stacklevel=3)
        return float("nan")
    return 100.0 * (new - old) / old


def relative_change(before: MetricsLike, after: MetricsLike, users: Optional[ArrayLike] = None,
                    metrics: Optional[Sequence[str]] = None) -> Dict[str, float]:
    """Table 4: ``{metric: 100 × (mean_after − mean_before) / mean_before}`` over a user group.

    Args:
        before, after: per-user metrics just before / just after a guidance round, either a
            mapping ``{"NDCG@5": (n,), ...}`` whose row ``u`` is user ``u``, or the
            ``(users, mapping)`` pair returned by ``RankingEvaluator.per_user`` (rows are then
            matched to user ids; the two may cover different users).
        users: the group's user ids; ``None`` uses every row (before and after must then
            cover the same users).
        metrics: metric names to report (default: all, which must be the same in both).

    Returns:
        Percent change per metric, in float64. A metric whose group mean before is exactly 0
        gives NaN (the change is undefined), with a ``RuntimeWarning`` naming the metric.

    Raises:
        ValueError: misaligned inputs, group users without a row, or NaN metrics in the group.
    """
    names, sel_b, sel_a, n = _group_rows(before, after, users, metrics)
    return {key: _percent_change(float(sel_b[key].mean()), float(sel_a[key].mean()),
                                 f"{key} (mean before over {n} users)") for key in names}


class ImprovedDeclined(NamedTuple):
    """Result of :func:`improved_declined`.

    Shares of all users: ``improved + declined + unchanged = 1``. Shares of changed users
    (``*_of_changed``) leave the unchanged users out, so ``improved_of_changed +
    declined_of_changed = 1`` (NaN when no user changed).
    """

    n_users: int
    n_improved: int
    n_declined: int
    n_unchanged: int
    improved: float
    declined: float
    unchanged: float
    improved_of_changed: float
    declined_of_changed: float


def improved_declined(before: MetricsLike, after: MetricsLike, users: Optional[ArrayLike] = None,
                      metrics: Optional[Sequence[str]] = None, atol: float = 0.0) -> ImprovedDeclined:
    """Table 4's "Improved users / Declined users": users whose aggregate score went up or down.

    The aggregate score of a user is the sum of the given metrics (default: all of them, in
    the order of ``before``); a user improved when ``after − before > atol``, declined when
    it is ``< −atol``, and is unchanged otherwise. Identical metric values sum identically,
    so with ``atol = 0`` "unchanged" means exactly equal scores.

    The paper's two shares add up to 100 % (94.1 % / 5.9 %, 94.68 % / 5.32 %), so they
    apparently leave unchanged users out (many users hit or miss the top-K identically before
    and after a single round); both ways are returned. Its population is not stated either:
    94.68 % is no count out of the 200 sampled users, but is e.g. 89/94 or 1,299/1,372
    (all Amazon-Video users).

    Args: as in :func:`relative_change`; ``atol >= 0`` is the dead band around 0.
    """
    atol = float(atol)
    if not atol >= 0.0:
        raise ValueError(f"atol must be >= 0, got {atol}")
    names, sel_b, sel_a, n = _group_rows(before, after, users, metrics)
    score_b = np.zeros(n)
    score_a = np.zeros(n)
    for key in names:
        score_b = score_b + sel_b[key]
        score_a = score_a + sel_a[key]
    diff = score_a - score_b
    n_up, n_down = int((diff > atol).sum()), int((diff < -atol).sum())
    n_same = n - n_up - n_down
    changed = n_up + n_down
    return ImprovedDeclined(
        n_users=n, n_improved=n_up, n_declined=n_down, n_unchanged=n_same,
        improved=n_up / n, declined=n_down / n, unchanged=n_same / n,
        improved_of_changed=n_up / changed if changed else float("nan"),
        declined_of_changed=n_down / changed if changed else float("nan"),
    )


# ======================================================================================
# Gating values of two groups (Tables D.3, D.4)
# ======================================================================================
class GateGroupChange(NamedTuple):
    """Result of :func:`gate_group_change` (percent changes from group A to group B).

    Attributes:
        value_change: ``100 × (v̄_B − v̄_A) / v̄_A`` with ``v̄`` the mean of ``σ(logit)``.
        logit_change: ``100 × (l̄_B − l̄_A) / l̄_A`` with ``l̄`` the mean logit (its sign flips
            when ``l̄_A < 0``).
        mean_value_a, mean_value_b, mean_logit_a, mean_logit_b: the group means.
        n_a, n_b, n_items: users per group and items averaged over.
    """

    value_change: float
    logit_change: float
    mean_value_a: float
    mean_value_b: float
    mean_logit_a: float
    mean_logit_b: float
    n_a: int
    n_b: int
    n_items: int


def gate_group_change(logits: ArrayLike, users_a: ArrayLike, users_b: ArrayLike,
                      item_mask: Optional[ArrayLike] = None, kind: str = "logits") -> GateGroupChange:
    """Tables D.3/D.4: relative change of the mean gate value and mean gate logit from group A to B.

    For each group, the mean is taken over every (user, item) cell of its users and the chosen
    items (equivalently: the mean of the per-user means, since every user has the same items).
    Table D.3 compares distinct users (A) with followers (B) on popular items
    (``item_mask = groups.popular``); Table D.4 compares cold (A) with warm (B) users on all
    items (``item_mask=None``; its caption says all items, its text says popular items).

    Args:
        logits: ``(U, I)`` gate logits ``w_uᵀ[P_ui ; P_gi ; P_ui − P_gi] + b_u``
            (``fedlib.papers.fedrkg.guidance.gate_logits``), numpy or torch; with ``kind="values"``,
            gate values in (0, 1) (``gate_values``), turned into logits by ``σ⁻¹``.
        users_a, users_b: user ids of the two groups (rows of ``logits``).
        item_mask: ``(I,) bool`` or integer item ids to average over; ``None`` = all items.
        kind: ``"logits"`` or ``"values"``.

    Means are computed in float64. A zero mean in group A gives NaN (with a warning).
    A zero-initialised gate has logit 0 everywhere, so logit means near 0 inflate
    ``logit_change`` while ``value_change`` stays tiny.
    """
    if kind not in ("logits", "values"):
        raise ValueError(f"kind must be 'logits' or 'values', got {kind!r}")
    table = logits if isinstance(logits, torch.Tensor) else torch.as_tensor(_to_numpy(logits))
    table = table.detach()
    if table.dim() != 2:
        raise ValueError(f"{kind} must be a (U, I) matrix (one row per user), got shape {tuple(table.shape)}")
    if not (table.dtype.is_floating_point):
        raise TypeError(f"{kind} must be floating point, got {table.dtype}")
    num_users, num_items = table.shape
    if num_items == 0:
        raise ValueError(f"{kind} has no item columns")
    users_a = torch.as_tensor(_check_ids(users_a, "users_a", num_users, "user"))
    users_b = torch.as_tensor(_check_ids(users_b, "users_b", num_users, "user"))
    if item_mask is None:
        items = None
        n_items = num_items
    else:
        mask = _to_numpy(item_mask)
        if mask.dtype == np.bool_:
            if mask.shape != (num_items,):
                raise ValueError(f"item_mask must be a bool array of shape ({num_items},) (one entry per column of "
                                 f"{kind}), got shape {mask.shape}")
            ids = np.flatnonzero(mask)
            if ids.size == 0:
                raise ValueError("item_mask selects no item; pass a mask with at least one True (or None for all items)")
        else:
            ids = _check_ids(mask, "item_mask", num_items, "item")
        items = torch.as_tensor(ids.astype(np.int64))
        n_items = int(ids.size)

    def means(users: torch.Tensor) -> Tuple[float, float]:
        rows = table.index_select(0, users.to(table.device))
        if items is not None:
            rows = rows.index_select(1, items.to(table.device))
        rows = rows.to(torch.float64)
        if kind == "values":
            if bool(((rows <= 0) | (rows >= 1) | torch.isnan(rows)).any()):
                raise ValueError("gate values must lie strictly inside (0, 1) to be turned into logits; "
                                 "pass the logits (fedlib.papers.fedrkg.guidance.gate_logits) with kind='logits'")
            values, rows = rows, torch.logit(rows)
        else:
            if not bool(torch.isfinite(rows).all()):
                raise ValueError("logits hold NaN or infinite values for the selected users/items")
            values = torch.sigmoid(rows)
        return float(rows.mean()), float(values.mean())

    logit_a, value_a = means(users_a)
    logit_b, value_b = means(users_b)
    return GateGroupChange(
        value_change=_percent_change(value_a, value_b, "the gate value (group A mean)"),
        logit_change=_percent_change(logit_a, logit_b, "the gate logit (group A mean)"),
        mean_value_a=value_a, mean_value_b=value_b, mean_logit_a=logit_a, mean_logit_b=logit_b,
        n_a=int(users_a.numel()), n_b=int(users_b.numel()), n_items=n_items,
    )
