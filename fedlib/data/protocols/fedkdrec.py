"""FedKDRec (RL-based bidirectional knowledge distillation): leave-one-out, two evaluations.

The paper reports only dataset sizes (Table 5: the raw datasets, no filtering) and
H@10/N@10; it does not say how it splits the data or whether it ranks all items or a
sampled candidate set. This protocol therefore offers both on the same split:

* split: per user, the latest interaction is test and the second latest valid, the rest
  train (ties: the row further down the file counts as later);
* full ranking: use ``split.train/valid/test`` directly;
* sampled ranking: ``split.extra["valid_candidates"]`` / ``["test_candidates"]`` hold
  ``(num_users, 1 + 99)`` arrays (positive in column 0; negatives never any item of the
  user's train/valid/test; fixed by ``seed``). Row ``r`` belongs to user ``valid.users[r]``
  / ``test.users[r]`` (every user has exactly one valid and one test item).

Datasets: ``ml-100k`` (complete), ``ml-1m`` (needs the full ``ratings.dat``; a partial
copy is accepted only with ``allow_partial=True``), Amazon Industrial (not available).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from fedlib.data.candidates import candidates_for
from fedlib.data.protocols import _common as C
from fedlib.data.splits import InteractionSplit

NAME = "fedkdrec"
PAPER = "FedKDRec: federated recommendation with RL-based bidirectional knowledge distillation"

DATASETS = {
    "ml-100k": {"label": "ML100K"},
    "ml-1m": {"label": "ML1M"},
    "amazon-industrial": {"label": "Industrial"},
}

TIE_BREAK = "file_last_is_latest"


def build(
    dataset: str,
    *,
    num_negatives: int = 99,
    seed: int = 0,
    root=None,
    allow_partial: bool = False,
) -> InteractionSplit:
    """Load ``dataset`` and build the leave-one-out split with sampled candidate sets.

    Args:
        num_negatives: negatives per candidate row (99 -> 1 + 99 candidates).
        seed: fixes the candidate sets (valid uses ``[seed, 1]``, test ``[seed, 2]``).
        allow_partial: accept the partial ML-1M copy (never for reported results).
    """
    _config(dataset)
    loaded = C.load_interactions(dataset, root=root, allow_partial=allow_partial)
    return split_from_frame(
        loaded.frame, num_negatives=num_negatives, seed=seed, name=f"{dataset}/{NAME}", notes=loaded.notes
    )


def split_from_frame(
    frame: pd.DataFrame,
    *,
    num_negatives: int = 99,
    seed: int = 0,
    name: str = NAME,
    notes=(),
) -> InteractionSplit:
    """Leave-one-out split + candidate sets for any frame (user, item, rating, timestamp).

    Raises:
        EmptyUserError: a user has fewer than 3 interactions.
    """
    timestamps = frame["timestamp"].to_numpy(dtype=np.int64)
    if np.any(timestamps == -1):
        raise ValueError(f"{name}: {int((timestamps == -1).sum())} rows have no timestamp; leave-one-out by time needs one")
    keep = C.implicit_rows(frame)
    users, raw_users = C.dense_ids(frame["user"].to_numpy()[keep])
    items, raw_items = C.dense_ids(frame["item"].to_numpy()[keep])
    timestamps = timestamps[keep]
    roles = C.leave_last_out_roles(users, timestamps, tie_break=TIE_BREAK)
    split = C.build_split(
        users, items, roles,
        num_users=raw_users.size, num_items=raw_items.size,
        timestamps=timestamps, name=name,
        notes=tuple(notes) + (
            "implicit, no filtering; leave-one-out by time (test = latest, valid = second latest)",
            f"sampled candidates: 1 + {num_negatives}, negatives exclude all of the user's interactions, seed={seed}",
        ),
        extra={"raw_users": raw_users, "raw_items": raw_items},
    )
    known = (split.train, split.valid, split.test)
    split.extra["valid_candidates"] = candidates_for(
        split.valid, known, num_items=split.num_items, num_negatives=num_negatives, seed=[seed, 1]
    )
    split.extra["test_candidates"] = candidates_for(
        split.test, known, num_items=split.num_items, num_negatives=num_negatives, seed=[seed, 2]
    )
    return split


def statistics(split: InteractionSplit) -> pd.DataFrame:
    """Table 5 columns: users, items, interactions, sparsity (%)."""
    return C.interaction_statistics(split)


def _config(dataset: str) -> dict:
    if dataset not in DATASETS:
        raise C.UnsupportedDatasetError(NAME, dataset, list(DATASETS), "It is not one of the paper's datasets.")
    return DATASETS[dataset]
