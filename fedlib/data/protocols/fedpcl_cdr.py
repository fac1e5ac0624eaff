"""FedPCL-CDR (federated prototype contrastive cross-domain rec.): domains as clients.

Procedure (paper Sec. 5.1 and the reference code's preprocessing):

1. implicit feedback: every rating is a positive; repeated (user, item) pairs count once;
2. optional count filter, single pass as in the reference code: items with fewer than
   ``min_count`` interactions are dropped, then users with fewer than ``min_count``;
3. overlapping users = users present in every domain of the task. They get ids
   ``0 .. n_o - 1`` (sorted by raw id) in **every** domain; the other users of a domain
   follow (sorted by raw id), so ``n_o`` is the only shared id range;
4. per user and domain: one random interaction is test (the paper's leave-one-out), one
   more random interaction is valid (not in the paper, which selects models on the test
   set; pass ``valid_holdout=False`` to drop it), the rest train;
5. candidate sets: the test (and valid) item against ``num_negatives`` items the user never
   interacted with in that domain, fixed by seed. The paper says 99; the reference code
   effectively uses 98 (it stores 99 and reads back 98): pass ``num_negatives=98`` for it.

**Overlap ratio** (paper Table 4: 30/50/70 %): ``overlap_ratio=x`` keeps a seeded random
``round(x * n)`` of the ``n`` naturally overlapping users in every domain; each other
overlapping user keeps their data in one domain only, chosen uniformly at random (seeded).
On the substitute Amazon pairs every user is shared, so ``x`` is exactly the share of users
present in both domains.

**Data (substitutes, not the paper's preprocessing):**

* ``amazon-cdr-disencdr`` (variant = pair, e.g. ``phone_sport``): DisenCDR's processed
  Amazon pairs (implicit, every user in both domains, re-indexed per pair, no reviews).
  The provided train and test rows are pooled and re-split here. Users of different pairs
  cannot be aligned, so the three-domain Task 2 (Elec-Cloth-Phone) cannot be built.
* ``douban-gadtcdr``: GA-DTCDR's Douban Book and Music subsets; Movie is missing, so the
  substitute task is Book-Music (two domains), filtered with ``min_count = 5`` like the
  reference code's Douban preprocessing (the paper says 10).
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from fedlib.data.candidates import sample_candidates
from fedlib.data.errors import EmptyUserError
from fedlib.data.protocols import _common as C
from fedlib.data.splits import DomainSplit

NAME = "fedpcl_cdr"
PAPER = "FedPCL-CDR: federated prototype-based contrastive learning for privacy-preserving CDR"

DATASETS = {
    "amazon-cdr-disencdr": {"label": "Amazon (DisenCDR substitute)", "min_count": None, "needs_variant": True},
    "douban-gadtcdr": {"label": "Douban (GA-DTCDR substitute)", "min_count": 5, "needs_variant": False},
}

# Domain names of the substitute files -> the names the paper's Table 1 uses.
PAPER_DOMAIN_NAMES = {
    "phone": "Phone", "sport": "Sport", "electronic": "Elec", "elec": "Elec", "cloth": "Cloth",
    "book": "Book", "movie": "Movie", "music": "Music",
}
PAIRS = ("phone_sport", "phone_electronic", "sport_cloth", "electronic_cloth")
DATASET_DEFAULT = "dataset default"
"""``min_count`` value meaning "the filter :data:`DATASETS` lists for this dataset"."""


def build(
    dataset: str,
    *,
    variant: Optional[str] = None,
    overlap_ratio: Optional[float] = None,
    num_negatives: int = 99,
    valid_holdout: bool = True,
    min_count="dataset default",
    seed: int = 0,
    root=None,
) -> DomainSplit:
    """Load a cross-domain dataset and build the FedPCL-CDR split.

    Args:
        dataset: ``amazon-cdr-disencdr`` (with ``variant`` = pair) or ``douban-gadtcdr``.
        overlap_ratio: share of the overlapping users kept in every domain (``None``: all).
        num_negatives: 99 (paper) or 98 (reference code).
        valid_holdout: also hold out one random validation interaction per user.
        min_count: single-pass item-then-user filter threshold; the default uses the
            dataset's entry in :data:`DATASETS` (none for the processed Amazon pairs, 5 for
            Douban); ``None`` = no filter.
        seed: fixes overlap selection, the split and the candidate sets.
    """
    config = _config(dataset)
    if config["needs_variant"] and not variant:
        raise ValueError(f"{dataset} needs variant=<pair>, one of {', '.join(PAIRS)}")
    loaded = C.load_interactions(dataset, variant=variant, root=root)
    frame = loaded.frame
    if "domain" not in frame.columns:
        raise C.UnsupportedDatasetError(NAME, dataset, list(DATASETS), "The loaded frame has no 'domain' column.")
    domains = list(pd.unique(frame["domain"]))
    if dataset == "amazon-cdr-disencdr" and len(domains) == 1 and variant and "_" in variant:
        # One direction of a DisenCDR pair holds one domain: load the reverse directory too.
        first, second = variant.split("_", 1)
        other = C.load_interactions(dataset, variant=f"{second}_{first}", root=root).frame
        frame = pd.concat([frame, other], ignore_index=True)
        domains = list(pd.unique(frame["domain"]))
    frames = {d: frame[frame["domain"] == d] for d in domains}
    k = config["min_count"] if min_count == DATASET_DEFAULT else min_count
    notes = list(loaded.notes) + [
        f"SUBSTITUTE data ({config['label']}): not FedPCL-CDR's own preprocessing; no review text."
    ]
    return split_from_frames(
        frames,
        overlap_ratio=overlap_ratio,
        num_negatives=num_negatives,
        valid_holdout=valid_holdout,
        min_count=k,
        seed=seed,
        name=f"{dataset}{'/' + variant if variant else ''}/{NAME}",
        notes=notes,
    )


def split_from_frames(
    frames: Mapping[str, pd.DataFrame],
    *,
    overlap_ratio: Optional[float] = None,
    num_negatives: int = 99,
    valid_holdout: bool = True,
    min_count: Optional[int] = None,
    seed: int = 0,
    name: str = NAME,
    notes: Sequence[str] = (),
) -> DomainSplit:
    """FedPCL-CDR split of per-domain frames (columns user, item[, rating]; raw user ids
    comparable across domains). See the module docstring for the rules.

    Raises:
        EmptyUserError: a user has too few interactions in a domain for the holdout
            (fewer than 3 with ``valid_holdout``, fewer than 2 without).
        ValueError: ``overlap_ratio`` outside ``[0, 1]`` or fewer than two domains.
    """
    domains = list(frames)
    if len(domains) < 2:
        raise ValueError(f"{name}: a cross-domain task needs at least two domains, got {domains}")
    if overlap_ratio is not None and not 0.0 <= overlap_ratio <= 1.0:
        raise ValueError(f"overlap_ratio must be in [0, 1] (a share, e.g. 0.3), got {overlap_ratio}")

    pairs = {}
    for d in domains:
        f = frames[d]
        keep = C.implicit_rows(f) if "rating" in f.columns else np.ones(len(f), dtype=bool)
        p = f.loc[keep, ["user", "item"]].drop_duplicates()
        if min_count:
            p = p[p["item"].map(p["item"].value_counts()) >= min_count]
            p = p[p["user"].map(p["user"].value_counts()) >= min_count]
        pairs[d] = (p["user"].to_numpy(), p["item"].to_numpy())

    shared = pairs[domains[0]][0]
    for d in domains[1:]:
        shared = np.intersect1d(shared, pairs[d][0])
    shared = np.unique(shared)
    natural_overlap = shared.size

    owner_of_dropped = {}
    if overlap_ratio is not None:
        rng = np.random.default_rng([seed, 0])
        n_keep = int(round(overlap_ratio * shared.size))
        kept = np.sort(rng.choice(shared, size=n_keep, replace=False))
        dropped = np.setdiff1d(shared, kept)
        owner = rng.integers(0, len(domains), size=dropped.size)
        owner_of_dropped = dict(zip(dropped.tolist(), owner.tolist()))
        for index, d in enumerate(domains):
            users, items = pairs[d]
            # A dropped overlapping user stays only in the domain drawn for them.
            leave = np.isin(users, dropped[owner != index])
            pairs[d] = (users[~leave], items[~leave])
        shared = kept

    min_needed = 3 if valid_holdout else 2
    splits = {}
    for index, d in enumerate(domains):
        users_raw, items_raw = pairs[d]
        only_here = np.setdiff1d(np.unique(users_raw), shared)
        raw_users = np.concatenate([shared, only_here])
        # Shared users first (ids 0 .. n_o - 1 in every domain), then this domain's own users.
        users = pd.Index(raw_users).get_indexer(users_raw).astype(np.int64)
        items, raw_items = C.dense_ids(items_raw)
        counts = np.bincount(users, minlength=raw_users.size)
        if np.any(counts < min_needed):
            bad = raw_users[counts < min_needed][:5]
            raise EmptyUserError(
                f"{name}/{d}: {int((counts < min_needed).sum())} user(s) have fewer than {min_needed} "
                f"interactions (e.g. raw ids {', '.join(map(str, bad))}); the leave-one-out holdout would "
                "leave their training set empty. Raise min_count or set valid_holdout=False."
            )
        rng = np.random.default_rng([seed, 20 + index])
        order = np.lexsort((rng.random(users.size), users))
        rank = np.empty(users.size, dtype=np.int64)
        rank[order] = C.within_group_rank(users[order])
        roles = np.full(users.size, C.TRAIN, dtype=np.int8)
        roles[rank == 0] = C.TEST
        if valid_holdout:
            roles[rank == 1] = C.VALID
        split = C.build_split(
            users, items, roles,
            num_users=raw_users.size, num_items=raw_items.size,
            name=f"{name}/{d}",
            notes=(f"domain {d}: random leave-one-out, 1 + {num_negatives} candidates",),
            extra={"raw_users": raw_users, "raw_items": raw_items, "domain": d},
        )
        known_users = np.concatenate([split.train.users, split.valid.users, split.test.users])
        known_items = np.concatenate([split.train.items, split.valid.items, split.test.items])
        for role_index, role in ((1, "valid"), (2, "test")):
            held = getattr(split, role)
            split.extra[f"{role}_candidates"] = sample_candidates(
                held.users, held.items, known_users, known_items,
                num_negatives=num_negatives, seed=[seed, 10 + index, role_index], num_items=split.num_items,
            )
        splits[d] = split

    return DomainSplit(
        domains=tuple(domains),
        splits=splits,
        num_overlap_users=int(shared.size),
        name=name,
        notes=tuple(notes) + (
            f"overlapping users: {shared.size} of {natural_overlap} naturally shared"
            + (f" (overlap_ratio={overlap_ratio})" if overlap_ratio is not None else ""),
            f"min_count={min_count}, num_negatives={num_negatives}, valid_holdout={valid_holdout}, seed={seed}",
        ),
        extra={"natural_overlap_users": natural_overlap, "overlap_ratio": overlap_ratio,
               "dropped_overlap_owner": owner_of_dropped},
    )


def statistics(split: DomainSplit) -> pd.DataFrame:
    """Table 1 columns per domain: users, items, overlapping users, interactions, density (%, 3 dp)."""
    rows = []
    for d in split.domains:
        s = split[d]
        inter = len(s.train) + len(s.valid) + len(s.test)
        rows.append({
            "domain": PAPER_DOMAIN_NAMES.get(str(d).lower(), str(d)),
            "users": s.num_users,
            "items": s.num_items,
            "overlapping_users": split.num_overlap_users,
            "interactions": inter,
            "density": round(100.0 * inter / (s.num_users * s.num_items), 3),
        })
    return pd.DataFrame(rows)


def _config(dataset: str) -> dict:
    if dataset not in DATASETS:
        reason = "FedPCL-CDR needs a multi-domain rating dataset with a 'domain' column."
        if dataset.startswith("c2dsr"):
            reason = "It is a sequential cross-domain dataset (use protocol 'fedcsr')."
        raise C.UnsupportedDatasetError(NAME, dataset, list(DATASETS), reason)
    return DATASETS[dataset]
