"""FedRKG (federated recommendation with knowledge guidance): leave-last-out, full ranking.

Procedure (paper App. C and the reference code's data pipeline):

1. implicit feedback: every rating counts as a positive; repeated (user, item) rows are
   kept as separate interactions (Table C.1 counts them, e.g. one row per tag assignment
   on LastFM-2K);
2. keep users with at least 10 interactions (20 for ML-1M); no item filter, no iteration;
3. dense ids in order of first appearance in the file;
4. per user: the most recent interaction is test, the second most recent valid, the rest
   train. Among equal timestamps the row **higher up in the file** counts as more recent,
   which is what the reference code's ``rank(method="first", ascending=False)`` does.

Evaluation is full ranking over all items (no candidate sets).

Datasets and how close they are to the paper (Table C.1):

* ``amazon-video``: FedRKG's own processed file; reproduced exactly.
* ``filmtrust`` (variant ``raw``, default): the LibRec ratings file has no timestamps.
  Like the FedRKG processing notebook, each row gets as "timestamp" the rank of its item's
  first appearance in the file, so "most recent" means "item that appeared latest in the
  file" (an item-driven, not a temporal, split). Counts reproduced exactly. Variant
  ``fedrkg`` is the processed file shipped with the reference code (1,227 users: it does
  not match the paper's table).
* ``hetrec2011-lastfm-2k``: every tag assignment of ``user_taggedartists.dat`` is one
  interaction (day-level dates); counts reproduced exactly. The same (user, artist) pair
  can be in train and test; such test items are masked at evaluation (see the notes).
* ``ml-1m``: needs the full ``ratings.dat`` (only a partial copy is available offline).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from fedlib.data.protocols import _common as C
from fedlib.data.splits import InteractionSplit

NAME = "fedrkg"
PAPER = "FedRKG: Federated Recommendation with Knowledge Guidance"

DATASETS = {
    "amazon-video": {"label": "Amazon-Video", "min_user": 10, "variant": None},
    "filmtrust": {"label": "FilmTrust", "min_user": 10, "variant": "raw"},
    "hetrec2011-lastfm-2k": {"label": "LastFM-2K", "min_user": 10, "variant": "tag_assignments"},
    "ml-1m": {"label": "ML-1M", "min_user": 20, "variant": None},
}

TIE_BREAK = "file_first_is_latest"


def build(
    dataset: str,
    *,
    variant: Optional[str] = None,
    root=None,
    allow_partial: bool = False,
    min_user_interactions: Optional[int] = None,
) -> InteractionSplit:
    """Load ``dataset`` and build its FedRKG leave-last-out split.

    Args:
        dataset: one of :data:`DATASETS`.
        variant: loader variant (default: the one matching the paper).
        allow_partial: accept a partial copy (ML-1M offline); never for reported results.
        min_user_interactions: override the paper's threshold (10; 20 for ML-1M).
    """
    config = _config(dataset)
    variant = variant if variant is not None else config["variant"]
    if dataset == C.LASTFM and variant == C.LASTFM_ASSIGNMENTS:
        loaded = C.lastfm_tag_assignments(root)
    else:
        loaded = C.load_interactions(dataset, variant=variant, root=root, allow_partial=allow_partial)
    frame = loaded.frame
    notes = list(loaded.notes)
    if dataset == "filmtrust" and np.all(frame["timestamp"].to_numpy() == -1):
        frame = frame.assign(timestamp=item_first_appearance_rank(frame["item"].to_numpy()))
        notes.append(
            "FilmTrust has no timestamps: 'time' = rank of the item's first appearance in the file "
            "(as in the FedRKG processing), so leave-last-out is item-driven, not temporal."
        )
    k = int(min_user_interactions if min_user_interactions is not None else config["min_user"])
    split = split_from_frame(frame, min_user_interactions=k, name=f"{dataset}/{NAME}", notes=notes)
    repeated = _test_pairs_also_in_train(split)
    if repeated:
        split = InteractionSplit(
            num_users=split.num_users, num_items=split.num_items, train=split.train, valid=split.valid,
            test=split.test, name=split.name,
            notes=split.notes + (
                f"{repeated} of {len(split.test)} test (user, item) pairs also occur in train (repeated "
                "interactions); full ranking masks train items, so these test items cannot be hit.",
            ),
            extra=split.extra,
        )
    return split


def split_from_frame(
    frame: pd.DataFrame,
    *,
    min_user_interactions: int = 10,
    tie_break: str = TIE_BREAK,
    name: str = NAME,
    notes=(),
) -> InteractionSplit:
    """FedRKG split of any frame with columns user, item, rating, timestamp (file order).

    Raises:
        EmptyUserError: a kept user has fewer than 3 interactions (only possible with
            ``min_user_interactions < 3``).
        ValueError: no user passes the filter or timestamps are missing.
    """
    users_raw = frame["user"].to_numpy()
    timestamps = frame["timestamp"].to_numpy(dtype=np.int64)
    if np.any(timestamps == -1):
        raise ValueError(f"{name}: {int((timestamps == -1).sum())} rows have no timestamp; leave-last-out needs one")
    keep = C.users_with_min_count(users_raw, min_user_interactions)
    if not keep.any():
        raise ValueError(f"{name}: no user has {min_user_interactions} or more interactions")
    users, raw_users = C.dense_ids(users_raw[keep])
    items, raw_items = C.dense_ids(frame["item"].to_numpy()[keep])
    timestamps = timestamps[keep]
    roles = C.leave_last_out_roles(users, timestamps, tie_break=tie_break)
    return C.build_split(
        users, items, roles,
        num_users=raw_users.size, num_items=raw_items.size,
        timestamps=timestamps,
        name=name,
        notes=tuple(notes) + (
            f"implicit; users with >= {min_user_interactions} interactions; leave-last-out "
            f"(ties: {tie_break}); full-ranking evaluation",
        ),
        extra={"raw_users": raw_users, "raw_items": raw_items},
    )


def item_first_appearance_rank(items: np.ndarray) -> np.ndarray:
    """``(n,) int64``: for every row, the rank of its item's first appearance in the file."""
    codes, _ = pd.factorize(items)
    return codes.astype(np.int64)


def statistics(split: InteractionSplit) -> pd.DataFrame:
    """Table C.1 columns for one dataset: #users, #items, #interactions, sparsity (%)."""
    return C.interaction_statistics(split)


def _test_pairs_also_in_train(split: InteractionSplit) -> int:
    stride = max(split.num_items, 1)
    train_keys = np.unique(split.train.users * stride + split.train.items)
    test_keys = split.test.users * stride + split.test.items
    return int(np.isin(test_keys, train_keys).sum())


def _config(dataset: str) -> dict:
    if dataset not in DATASETS:
        reason = ""
        if dataset.startswith("c2dsr"):
            reason = "It holds cross-domain sequences, not a single-domain rating log."
        raise C.UnsupportedDatasetError(NAME, dataset, list(DATASETS), reason)
    return DATASETS[dataset]
