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
* ``douban-gadtcdr``: GA-DTCDR's Douban Book and Music subsets (``domains=`` picks which);
  Movie is a manual download, so the substitute task is Book-Music (two domains) until
  ``douban_movie/ratings.dat`` is placed, after which Movie-Music and Book-Movie-Music can be
  built. Filtered with ``min_count = 5`` like the reference code's Douban preprocessing (the
  paper says 10). Ratings only: no review text.

**The original format** (:func:`build_original`): FedPCL-CDR's own data are, per domain, one
CSV of ratings with their review text, the input of the reference code's preprocessing
(``data_preprocess/douban_preprocess.py`` reads ``douban_book/book_review_data.csv``). We
read them from the data root as::

    <root>/fedpcl-cdr/<source>_<domain>/<domain>_review_data.csv
    e.g. fedpcl-cdr/douban_book/book_review_data.csv, fedpcl-cdr/amazon_phone/phone_review_data.csv

with a header holding ``user_id``, ``item_id``, ``rating`` and the review text in ``reviews``
(``review`` is accepted: the code's Amazon scripts use that name); other columns are ignored.
User ids must be the raw ids shared across the domains of a source. The same steps as above
apply (duplicates count once; the code's single-pass filter: 10 for Amazon, 5 for Douban), and
the review texts come back per domain keyed by the split's dense ids, ready for
:func:`fedlib.models.review_text.review_embeddings`. None of these files is in the reference
collection: :data:`ORIGINAL_SOURCES` names the canonical download of each.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from fedlib.data.candidates import sample_candidates
from fedlib.data.download import data_root, describe_root
from fedlib.data.errors import EmptyUserError, MalformedDataError, MissingDataError
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

ORIGINAL_FOLDER = "fedpcl-cdr"
ORIGINAL_SOURCES = {
    "amazon": {"domains": ("phone", "sport", "elec", "cloth"), "min_count": 10,
               "download": "https://cseweb.ucsd.edu/~jmcauley/datasets/amazon/links.html (Amazon 2014: the "
                           "'ratings only' CSV and the review file of Cell Phones and Accessories, Sports and "
                           "Outdoors, Electronics, Clothing Shoes and Jewelry; join them on reviewerID and asin)"},
    "douban": {"domains": ("book", "movie", "music"), "min_count": 5,
               "download": "https://www.researchgate.net/publication/350793434_Douban_dataset_ratings_item_details"
                           "_user_profiles_and_reviews (ratings and reviews of books, movies and music; needs a "
                           "ResearchGate login)"},
}
"""FedPCL-CDR's original data: the domains of each source, the code's count filter, the canonical download."""
ORIGINAL_COLUMNS = ("user_id", "item_id", "rating")
REVIEW_COLUMNS = ("reviews", "review")

ReviewTexts = Dict[Tuple[int, int], str]
"""``{(user, item): review text}`` of one domain, dense ids of the split (as :mod:`fedlib.models.review_text`)."""


def build(
    dataset: str,
    *,
    variant: Optional[str] = None,
    domains: Optional[Sequence[str]] = None,
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
        domains: ``douban-gadtcdr`` only: the domains of the task, in order (e.g.
            ``("movie", "music")``); each is loaded on its own, so a missing Movie file is an
            error naming it. ``None`` = every domain present (book, music, and movie if placed).
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
    if domains is not None:
        if dataset != "douban-gadtcdr" or variant is not None:
            raise ValueError(f"domains= picks the Douban domains of a task (dataset 'douban-gadtcdr', no variant); "
                             f"got dataset {dataset!r} with variant {variant!r}")
        parts, notes = [], []
        for domain in domains:
            part = C.load_interactions(dataset, variant=domain, root=root)
            parts.append(part.frame.assign(domain=domain))
            notes += [n for n in part.notes if n not in notes]
        loaded = C.Loaded(dataset, None, pd.concat(parts, ignore_index=True), "substitute", tuple(notes))
    else:
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
        name=f"{dataset}{'/' + variant if variant else ''}{'/' + '_'.join(domains) if domains else ''}/{NAME}",
        notes=notes,
    )


# ---------------------------------------------------------------------------------------
# The original format: ratings with review text, one CSV per domain
# ---------------------------------------------------------------------------------------
def original_source(domain: str) -> str:
    """The source (``"amazon"`` or ``"douban"``) of an original-format domain."""
    for source, spec in ORIGINAL_SOURCES.items():
        if domain in spec["domains"]:
            return source
    known = [d for spec in ORIGINAL_SOURCES.values() for d in spec["domains"]]
    raise ValueError(f"unknown FedPCL-CDR domain {domain!r}; the original data have {known}")


def original_relpath(domain: str) -> str:
    """``fedpcl-cdr/<source>_<domain>/<domain>_review_data.csv``: where a domain's file lives under the data root."""
    return f"{ORIGINAL_FOLDER}/{original_source(domain)}_{domain}/{domain}_review_data.csv"


def original_files_present(domains: Sequence[str], root=None) -> bool:
    """Whether every domain's original-format file is under the data root (no reading)."""
    base = data_root(root)
    return all((base / original_relpath(d)).is_file() for d in domains)


def _read_original(domain: str, root) -> pd.DataFrame:
    """One domain's original CSV as ``user, item, rating, review`` (raw ids, file order)."""
    base = data_root(root)
    relpath = original_relpath(domain)
    path = base / relpath
    if not path.is_file():
        source = original_source(domain)
        raise MissingDataError(
            f"FedPCL-CDR original data: missing file {relpath}\n"
            f"  looked for: {path}\n"
            f"  data root searched: {describe_root(root)}\n"
            "  fedlib cannot download it (not in the reference collection).\n"
            f"  canonical download: {ORIGINAL_SOURCES[source]['download']}\n"
            f"  expected format: CSV with a header holding {', '.join(ORIGINAL_COLUMNS)} and the review text in "
            f"'reviews' (or 'review'); save it as {path} . Or set FEDLIB_DATA to the folder that contains "
            f"'{ORIGINAL_FOLDER}/'.",
            dataset=ORIGINAL_FOLDER, missing=[relpath], root=base)
    frame = pd.read_csv(path, dtype={"user_id": str, "item_id": str}, keep_default_na=False, na_values={"rating": [""]})
    missing = [c for c in ORIGINAL_COLUMNS if c not in frame.columns]
    text_column = next((c for c in REVIEW_COLUMNS if c in frame.columns), None)
    if missing or text_column is None:
        raise MalformedDataError(
            path, 1, ",".join(map(str, frame.columns)),
            f"the header must hold {', '.join(ORIGINAL_COLUMNS)} and a review column ('reviews' or 'review')"
            + (f"; missing {missing}" if missing else "; no review column"))
    rating = pd.to_numeric(frame["rating"], errors="coerce")
    if rating.isna().any():
        row = int(np.flatnonzero(rating.isna().to_numpy())[0])
        # line = data row + 1 for the header (a review spanning several lines shifts it)
        raise MalformedDataError(path, row + 2, ",".join(frame.iloc[row].astype(str)),
                                 f"data row {row + 1}: the rating {frame['rating'].iloc[row]!r} is not a number")
    out = pd.DataFrame({"user": frame["user_id"].str.strip(), "item": frame["item_id"].str.strip(),
                        "rating": rating.to_numpy(np.float64), "review": frame[text_column].astype(str)})
    # The code's preprocessing drops exact duplicate rows first (drop_duplicates(keep='first')).
    return out.drop_duplicates(keep="first").reset_index(drop=True)


def _dense_texts(frame: pd.DataFrame, split) -> ReviewTexts:
    """Review texts keyed by the split's dense ``(user, item)``; several reviews of a pair are joined."""
    users = pd.Index(split.extra["raw_users"]).get_indexer(frame["user"].to_numpy())
    items = pd.Index(split.extra["raw_items"]).get_indexer(frame["item"].to_numpy())
    keep = (users >= 0) & (items >= 0)
    texts: ReviewTexts = {}
    for user, item, review in zip(users[keep].tolist(), items[keep].tolist(), frame["review"].to_numpy()[keep]):
        review = review.strip()
        if review:
            texts[(user, item)] = f"{texts[(user, item)]} {review}" if (user, item) in texts else review
    return texts


def build_original(
    domains: Sequence[str],
    *,
    overlap_ratio: Optional[float] = None,
    num_negatives: int = 99,
    valid_holdout: bool = True,
    min_count="dataset default",
    seed: int = 0,
    root=None,
) -> Tuple[DomainSplit, Dict[str, ReviewTexts]]:
    """FedPCL-CDR's own data (ratings + review text per domain) as a split and its review texts.

    Args:
        domains: the task's domains in order, all from one source, e.g. ``("phone", "sport")``
            (Task 1) or ``("book", "movie", "music")`` (Task 4); see :data:`ORIGINAL_SOURCES`.
        min_count: the single-pass item-then-user filter; the default is the code's (10 for
            Amazon, 5 for Douban); ``None`` = no filter.
        overlap_ratio, num_negatives, valid_holdout, seed: as :func:`build`.
        root: data root (``None`` = ``FEDLIB_DATA``).

    Returns:
        ``(split, texts)``: ``texts[domain]`` maps the split's dense ``(user, item)`` of every
        kept interaction (train, valid and test) to its review; build review vectors from the
        training pairs only (:func:`fedlib.models.review_text.review_embeddings`).

    Raises:
        MissingDataError: a domain's file is absent; the message names the file, the data root
            it looked in and the canonical download.
        MalformedDataError: a file lacks a required column or has a non-numeric rating.
    """
    domains = list(domains)
    if len(domains) < 2 or len(set(domains)) != len(domains):
        raise ValueError(f"a FedPCL-CDR task needs at least two distinct domains, got {domains}")
    sources = {original_source(d) for d in domains}
    if len(sources) != 1:
        raise ValueError(f"the domains of a task must come from one source (user ids are only shared within one): "
                         f"got {domains} from {sorted(sources)}")
    source = sources.pop()
    raw = {d: _read_original(d, root) for d in domains}
    k = ORIGINAL_SOURCES[source]["min_count"] if min_count == DATASET_DEFAULT else min_count
    split = split_from_frames(
        {d: frame[["user", "item", "rating"]] for d, frame in raw.items()},
        overlap_ratio=overlap_ratio, num_negatives=num_negatives, valid_holdout=valid_holdout, min_count=k,
        seed=seed, name=f"{ORIGINAL_FOLDER}/{source}/{'_'.join(domains)}/{NAME}",
        notes=(f"FedPCL-CDR original format ({source}: ratings with review text), read from "
               f"{data_root(root) / ORIGINAL_FOLDER}",),
    )
    return split, {d: _dense_texts(raw[d], split[d]) for d in domains}


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
