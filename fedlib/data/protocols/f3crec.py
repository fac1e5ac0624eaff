"""F3CRec (federated continual recommendation): a chronological stream of four data blocks.

Procedure (paper Sec. 5.1, with the details of the authors' processing notebook):

1. implicit feedback: every rating > 0 is a positive;
2. iterative k-core on users and items until stable (k = 10; 5 for Lastfm-2K);
3. global stable sort by timestamp (ties keep file order); users and items get dense ids in
   order of first appearance in time, so the ids of blocks ``0..t`` are a prefix of the ids
   of block ``t+1`` (embedding tables grow by appending rows);
4. the first 60 % of interactions (``floor(0.6 n)``) form ``D0``; the remaining ones are cut
   into three chronological blocks of ``floor(rest / 3)`` interactions, the last block
   taking the remainder;
5. per user and block, 80/10/10 train/valid/test: a user with ``n >= 3`` interactions in
   the block gets ``ceil(n/10)`` test and ``ceil(n/10)`` valid interactions; a user with
   fewer keeps everything in train (and is not evaluated in that block).

Two ways of choosing the held-out interactions:

* ``split="random"`` (default; what the paper states): a seeded random choice per user in
  every block;
* ``split="chronological"`` (what the official code does): ``D0`` random, ``D1..D3`` hold
  out each user's latest interactions of the block (test = latest, valid = just before).

How many interactions are held out for validation (``valid_rule``; the test count is
``ceil(n/10)`` under both):

* ``valid_rule="tenth"`` (default): ``ceil(n/10)`` valid interactions, the 80/10/10 rule of
  step 5;
* ``valid_rule="code"`` (what the official code does): the notebook splits each user's block
  with scikit-learn's ``train_test_split`` twice, test ``1/10`` of the ``n`` interactions,
  then valid ``1/9`` of the remaining ``n − ceil(n/10)``, i.e. ``ceil((n − ceil(n/10)) / 9)``
  valid interactions (:func:`holdout_sizes`): one fewer than ``"tenth"`` when ``n = 10k + 1``
  (``k ≥ 1``: 11, 21, 31, ...), the same otherwise. The notebook does this in **every**
  block (``D0`` through ``split_base_data`` with sizes ``1/(8+1+1)`` and ``1/(8+1)``, the
  incremental blocks through ``split_inc_block_userwise`` with ``1/10`` and ``1/9``: the
  same sizes), so the rule applies to every block here too, ``D0`` included, under either
  ``split``. It changes only which interactions are valid or train, never the test ones (a
  row the rule no longer holds out goes back to train). scikit-learn computes
  ``ceil(0.1 · n)`` in floating point; for every ``n`` up to 10⁶ that equals the exact
  integer ``ceil(n/10)`` used here (likewise for ``1/9``). With ``split="chronological"``
  and ``valid_rule="code"``, ML-100K's train/valid/test sizes equal those of the authors'
  processed files (``fcrec_data/dataset/ml-100k/TASK_*.pickle``) user by user in all four
  blocks (``"tenth"`` holds out 10 to 63 more valid interactions per block).

With these rules the block statistics of Table 1 are reproduced exactly for ML-100K and
ML-Latest-Small (see :func:`statistics` and ``python -m fedlib data stats``).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from fedlib.data.protocols import _common as C
from fedlib.data.splits import BlockStream

NAME = "f3crec"
PAPER = "F3CRec: Federated Continual Recommendation (CIKM'25)"

# dataset id -> how the paper uses it. ``label`` is the name in the paper's tables.
DATASETS = {
    "ml-100k": {"label": "ML-100K", "k_core": 10, "variant": None},
    "ml-latest-small": {"label": "ML-Latest-Small", "k_core": 10, "variant": None},
    "hetrec2011-lastfm-2k": {"label": "Lastfm-2K", "k_core": 5, "variant": "tag_days"},
    "hetrec2011-movielens-2k": {"label": "HetRec2011", "k_core": 10, "variant": None},
}

BASE_FRACTION = (6, 10)  # D0 = floor(n * 6 / 10) interactions
NUM_INCREMENTAL_BLOCKS = 3
HOLDOUT_PERCENT = 10  # test (and, under valid_rule "tenth", valid): ceil(n * 10 / 100) per user and block
MIN_FOR_HOLDOUT = 3  # a user with fewer interactions in a block keeps them all in train
#: How many of a user's block interactions are validation (see the module docstring):
#: ``"tenth"`` = ``ceil(n/10)`` (default), ``"code"`` = ``ceil((n − ceil(n/10)) / 9)`` (official code).
VALID_RULES = ("tenth", "code")


def build(
    dataset: str,
    *,
    split: str = "random",
    seed: int = 0,
    variant: Optional[str] = None,
    root=None,
    k_core: Optional[int] = None,
    valid_rule: str = "tenth",
) -> BlockStream:
    """Load ``dataset`` and build its F3CRec block stream.

    Args:
        dataset: one of :data:`DATASETS`.
        split: ``"random"`` (paper) or ``"chronological"`` (official code), see module doc.
        seed: seeds every random per-user split (block ``t`` uses ``[seed, t]``).
        valid_rule: ``"tenth"`` (default) or ``"code"`` (official code): how many valid
            interactions per user and block, see the module docstring.
        variant: loader variant; defaults to the one closest to the paper (Lastfm-2K:
            distinct (user, artist, tagging day) events, see the notes of the result).
        root: data root (default: the loaders' default, ``$FEDLIB_DATA``).
        k_core: override the paper's k (10; 5 for Lastfm-2K).

    Returns:
        A :class:`BlockStream` with 4 blocks.
    """
    config = _config(dataset)
    variant = variant if variant is not None else config["variant"]
    frame, notes = _load(dataset, variant, root)
    k = int(k_core if k_core is not None else config["k_core"])
    return stream_from_frame(
        frame,
        k_core=k,
        split=split,
        seed=seed,
        name=f"{dataset}/{NAME}",
        notes=notes,
        valid_rule=valid_rule,
    )


def stream_from_frame(
    frame: pd.DataFrame,
    *,
    k_core: int = 10,
    split: str = "random",
    seed: int = 0,
    name: str = NAME,
    notes=(),
    valid_rule: str = "tenth",
) -> BlockStream:
    """The F3CRec block stream of any interaction frame (columns user, item, rating, timestamp).

    Rows must be in file order (it breaks timestamp ties). See the module docstring for the
    rules (``split``, ``valid_rule``); this function is what :func:`build` calls after loading.
    The stream's ``extra`` records ``split``, ``seed`` and ``valid_rule``.

    Raises:
        ValueError: an unknown ``split`` or ``valid_rule``, nothing survives the k-core
            filter, timestamps are missing, or a block would be empty.
    """
    if split not in ("random", "chronological"):
        raise ValueError(f"split must be 'random' (paper) or 'chronological' (official code), got {split!r}")
    _check_valid_rule(valid_rule)
    timestamps = frame["timestamp"].to_numpy(dtype=np.int64)
    if np.any(timestamps == -1):  # the loaders mark a missing time with -1
        raise ValueError(
            f"{name}: {int((timestamps == -1).sum())} interactions have no timestamp; the F3CRec stream "
            "needs a time for every interaction."
        )
    keep = C.implicit_rows(frame)
    users_raw = frame["user"].to_numpy()[keep]
    items_raw = frame["item"].to_numpy()[keep]
    timestamps = timestamps[keep]
    core = C.iterative_k_core(users_raw, items_raw, k_core, k_core)
    users_raw, items_raw, timestamps = users_raw[core], items_raw[core], timestamps[core]
    n = users_raw.size
    if n == 0:
        raise ValueError(f"{name}: no interaction survives the {k_core}-core filter")

    order = C.chronological_order(timestamps)
    users, raw_users = C.dense_ids(users_raw[order])
    items, raw_items = C.dense_ids(items_raw[order])
    timestamps = timestamps[order]
    positions = np.arange(n, dtype=np.int64)

    n_base = n * BASE_FRACTION[0] // BASE_FRACTION[1]
    per_block = (n - n_base) // NUM_INCREMENTAL_BLOCKS
    cuts = [0, n_base] + [n_base + per_block * (b + 1) for b in range(NUM_INCREMENTAL_BLOCKS - 1)] + [n]
    if min(np.diff(cuts)) <= 0:
        raise ValueError(
            f"{name}: {n} interactions are too few to form {NUM_INCREMENTAL_BLOCKS + 1} non-empty blocks"
        )

    # Users/items accumulated up to block t are exactly the ids below the running maximum,
    # because ids were assigned in order of first appearance in time.
    acc_users = np.maximum.accumulate(users) + 1
    acc_items = np.maximum.accumulate(items) + 1

    blocks, active = [], []
    for t in range(len(cuts) - 1):
        lo, hi = cuts[t], cuts[t + 1]
        block_users = users[lo:hi]
        mode = "random" if (split == "random" or t == 0) else "chronological"
        roles = holdout_roles(block_users, mode=mode, rng=np.random.default_rng([seed, t]), valid_rule=valid_rule)
        rule_note = "" if valid_rule == "tenth" else ", valid ceil((n - ceil(n/10)) / 9) (official code)"
        blocks.append(
            C.build_split(
                block_users,
                items[lo:hi],
                roles,
                num_users=int(acc_users[hi - 1]),
                num_items=int(acc_items[hi - 1]),
                positions=positions[lo:hi],
                timestamps=timestamps[lo:hi],
                name=f"{name}/D{t}",
                notes=(f"block D{t}: {mode} per-user 80/10/10 split{rule_note}",),
                extra={"block": t, "interactions": hi - lo},
            )
        )
        active.append(np.unique(block_users))

    return BlockStream(
        blocks=tuple(blocks),
        active_users=tuple(active),
        name=name,
        notes=tuple(notes) + (
            f"implicit (rating > 0), iterative {k_core}-core, ids by first appearance in time",
            f"split={split!r}, seed={seed}" + ("" if valid_rule == "tenth" else f", valid_rule={valid_rule!r}"),
        ),
        extra={"raw_users": raw_users, "raw_items": raw_items, "cuts": np.asarray(cuts, dtype=np.int64),
               "k_core": k_core, "split": split, "seed": seed, "valid_rule": valid_rule},
    )


def _check_valid_rule(valid_rule: str) -> None:
    if valid_rule not in VALID_RULES:
        raise ValueError(f"valid_rule must be one of {VALID_RULES} ('tenth': ceil(n/10) valid interactions per "
                         "user and block; 'code': ceil((n - ceil(n/10)) / 9), the official code's), "
                         f"got {valid_rule!r}")


def holdout_sizes(counts: np.ndarray, valid_rule: str = "tenth") -> tuple[np.ndarray, np.ndarray]:
    """Test and valid sizes of users with ``counts`` interactions in a block (exact integers).

    Args:
        counts: ``(m,)`` interactions per user in the block.
        valid_rule: ``"tenth"`` or ``"code"`` (see the module docstring).

    Returns:
        ``(n_test (m,) int64, n_valid (m,) int64)``: ``ceil(n/10)`` test and ``ceil(n/10)``
        (``"tenth"``) or ``ceil((n − ceil(n/10)) / 9)`` (``"code"``) valid interactions for
        ``n >= 3``; both 0 for ``n < 3`` (everything in train).
    """
    _check_valid_rule(valid_rule)
    counts = np.asarray(counts, dtype=np.int64)
    holds = counts >= MIN_FOR_HOLDOUT
    n_test = np.where(holds, C.ceil_percent(counts, HOLDOUT_PERCENT), 0)
    if valid_rule == "tenth":
        n_valid = n_test.copy()
    else:  # sklearn's second split: ceil(rest / 9) of the rest = n - n_test, as an exact integer ceiling
        n_valid = np.where(holds, (counts - n_test + 8) // 9, 0)
    return n_test, n_valid


def holdout_roles(users: np.ndarray, *, mode: str, rng: np.random.Generator, valid_rule: str = "tenth") -> np.ndarray:
    """Per-user train/valid/test roles of one block's rows (given in chronological order).

    Args:
        users: ``(n,)`` user of each row of the block, in chronological order.
        mode: ``"chronological"`` (latest rows held out) or ``"random"`` (drawn from ``rng``).
        rng: the block's generator (only ``mode="random"`` draws from it).
        valid_rule: ``"tenth"`` or ``"code"`` (:func:`holdout_sizes`).

    ``valid_rule="tenth"`` is :func:`fedlib.data.protocols._common.holdout_roles` with its
    10 %/10 % defaults. ``"code"`` draws the same per-user order (the same ``rng`` draws in
    ``mode="random"``, time in ``"chronological"``), so the test rows are identical and the
    valid rows are the last :func:`holdout_sizes` ones before them in that order: a subset of
    the ``"tenth"`` valid rows, the others returned to train.

    Returns:
        ``(n,) int8`` roles (``C.TRAIN`` / ``C.VALID`` / ``C.TEST``).
    """
    _check_valid_rule(valid_rule)
    if valid_rule == "tenth":
        return C.holdout_roles(users, mode=mode, rng=rng, valid_percent=HOLDOUT_PERCENT,
                               test_percent=HOLDOUT_PERCENT, min_for_holdout=MIN_FOR_HOLDOUT)
    users = np.asarray(users)
    # The rank of every row inside its user, exactly as C.holdout_roles draws it.
    if mode == "chronological":
        rank = C.within_group_rank(users)
    elif mode == "random":
        order = np.lexsort((rng.random(users.size), users))
        rank = np.empty(users.size, dtype=np.int64)
        rank[order] = C.within_group_rank(users[order])
    else:
        raise ValueError(f"unknown split mode {mode!r}; use 'random' or 'chronological'")
    codes, _ = pd.factorize(users)
    counts = np.bincount(codes)[codes]
    n_test, n_valid = holdout_sizes(counts, valid_rule)
    roles = np.full(users.size, C.TRAIN, dtype=np.int8)
    roles[rank >= counts - n_test] = C.TEST
    roles[(rank >= counts - n_test - n_valid) & (rank < counts - n_test)] = C.VALID
    return roles


def _load(dataset: str, variant: Optional[str], root) -> tuple:
    """The interaction frame of ``dataset`` plus provenance notes.

    Lastfm-2K variants: ``"tag_days"`` (default) = distinct (user, artist, tagging day)
    events, the reading of the paper's "timestamped interactions" that comes closest to its
    Table 1 with the day-level dates available offline; ``"tag_assignments"`` = every tag
    assignment; any loader variant (``"tagged"``: one row per pair at its first tag day).
    """
    if dataset == C.LASTFM and variant in ("tag_days", C.LASTFM_ASSIGNMENTS):
        loaded = C.lastfm_tag_assignments(root)
        frame = loaded.frame
        notes = list(loaded.notes)
        if variant == "tag_days":
            frame = frame.drop_duplicates(["user", "item", "timestamp"], keep="first").reset_index(drop=True)
            notes.append(
                f"Lastfm-2K variant 'tag_days': {len(frame):,} distinct (user, artist, tagging day) events; "
                "the same pair tagged on different days stays a separate interaction. Table 1 is not "
                "reproduced exactly (see `python -m fedlib data stats hetrec2011-lastfm-2k --protocol f3crec`)."
            )
        return frame, notes
    loaded = C.load_interactions(dataset, variant=variant, root=root)
    return loaded.frame, list(loaded.notes)


def statistics(stream: BlockStream) -> pd.DataFrame:
    """Table 1 of the paper for a stream: one row per block.

    Columns: ``block`` (D0..D3), ``users`` and ``items`` (accumulated up to the block),
    ``interactions`` (in the block), ``sparsity`` (percent, 2 decimals) =
    ``100 * (1 - interactions / (users * items))``.
    """
    rows = []
    for t, block in enumerate(stream.blocks):
        inter = len(block.train) + len(block.valid) + len(block.test)
        rows.append({
            "block": f"D{t}",
            "users": block.num_users,
            "items": block.num_items,
            "interactions": inter,
            "sparsity": round(C.sparsity_percent(inter, block.num_users, block.num_items), 2),
        })
    return pd.DataFrame(rows)


def _config(dataset: str) -> dict:
    if dataset not in DATASETS:
        reason = ""
        if dataset.startswith("c2dsr"):
            reason = "It holds cross-domain sequences without the user-item rating stream F3CRec cuts into blocks."
        elif dataset in ("amazon-cdr-disencdr", "douban-gadtcdr", "filmtrust", "amazon-video"):
            reason = "It has no real timestamps or is not one of the paper's datasets."
        raise C.UnsupportedDatasetError(NAME, dataset, list(DATASETS), reason)
    return DATASETS[dataset]
