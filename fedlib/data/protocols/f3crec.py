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


def build(
    dataset: str,
    *,
    split: str = "random",
    seed: int = 0,
    variant: Optional[str] = None,
    root=None,
    k_core: Optional[int] = None,
) -> BlockStream:
    """Load ``dataset`` and build its F3CRec block stream.

    Args:
        dataset: one of :data:`DATASETS`.
        split: ``"random"`` (paper) or ``"chronological"`` (official code), see module doc.
        seed: seeds every random per-user split (block ``t`` uses ``[seed, t]``).
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
    )


def stream_from_frame(
    frame: pd.DataFrame,
    *,
    k_core: int = 10,
    split: str = "random",
    seed: int = 0,
    name: str = NAME,
    notes=(),
) -> BlockStream:
    """The F3CRec block stream of any interaction frame (columns user, item, rating, timestamp).

    Rows must be in file order (it breaks timestamp ties). See the module docstring for the
    rules; this function is what :func:`build` calls after loading.

    Raises:
        ValueError: nothing survives the k-core filter, timestamps are missing, or a block
            would be empty.
    """
    if split not in ("random", "chronological"):
        raise ValueError(f"split must be 'random' (paper) or 'chronological' (official code), got {split!r}")
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
        roles = C.holdout_roles(block_users, mode=mode, rng=np.random.default_rng([seed, t]))
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
                notes=(f"block D{t}: {mode} per-user 80/10/10 split",),
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
            f"split={split!r}, seed={seed}",
        ),
        extra={"raw_users": raw_users, "raw_items": raw_items, "cuts": np.asarray(cuts, dtype=np.int64),
               "k_core": k_core, "split": split, "seed": seed},
    )


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
