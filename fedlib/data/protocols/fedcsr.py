"""FedCSR (federated multi-platform cross-domain sequential rec.): C2DSR sequences on 10 platforms.

Data format (C2DSR ``*_new.txt`` files): one time-sorted cross-domain sequence per line;
item ids ``< num_items_a`` are domain A (e.g. Food), the others domain B (e.g. Kitchen).
A valid/test sequence's last item is the ground truth (GT); its domain decides which
domain's metrics the row counts for.

**Platforms.** The training sequences are split over 10 platforms of unequal size and
sequence length with disjoint users, as in the reference code: users are sorted by the
length of their (longest) training sequence and cut into 10 contiguous groups with the
fixed fractions :data:`PLATFORM_FRACTIONS` (the last group takes the remainder). Valid and
test sequences are cut the same way, independently (``extra["valid_platforms"]`` /
``["test_platforms"]``); with one global model evaluated on the server this grouping only
matters for per-platform reports.

**Training file.** The original ``traindata_new.txt`` (34,117 / 58,515 sequences) is not
available offline. When it is absent, a documented substitute is built: the users of the
valid and test files (disjoint, one sequence each) are pooled and split at random (seeded)
into 80 / 10 / 10 % train / valid / test users; training users contribute their whole
sequence (GT included), valid and test users keep theirs with the last item as GT. When
the training file is present, the original train/valid/test split is used unchanged.

**Evaluation candidates.** 1 GT + 999 negatives drawn uniformly from the GT's domain,
fixed by seed. By default negatives exclude every item of that user's sequences in that
domain; ``exclude_history=False`` reproduces the reference code (only the GT is excluded).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from fedlib.data.candidates import sample_candidates
from fedlib.data.protocols import _common as C
from fedlib.data.splits import Sequences, SequenceSplit

NAME = "fedcsr"
PAPER = "FedCSR: federated multi-platform cross-domain sequential recommendation (COLING'25)"

DATASETS = {
    "c2dsr-food-kitchen": {"label": "Food-Kitchen", "domains": ("Food", "Kitchen")},
    "c2dsr-movie-book": {"label": "Movie-Book", "domains": ("Movie", "Book")},
}

# Share of training users per platform in the reference code (sums to 0.9999; the last
# platform takes the remainder).
PLATFORM_FRACTIONS = (0.0457, 0.2931, 0.1282, 0.0889, 0.0165, 0.0165, 0.0058, 0.1958, 0.0895, 0.1199)
SUBSTITUTE_USER_FRACTIONS = (0.8, 0.1, 0.1)


def build(
    dataset: str,
    *,
    num_negatives: int = 999,
    seed: int = 0,
    exclude_history: bool = True,
    root=None,
) -> SequenceSplit:
    """Load a C2DSR dataset and build the FedCSR platforms and candidate sets.

    Args:
        dataset: ``c2dsr-food-kitchen`` or ``c2dsr-movie-book``.
        num_negatives: negatives per evaluation row (999 in the paper's code).
        seed: fixes the substitute user split and the candidate sets.
        exclude_history: exclude the user's own items from the negatives (see module doc).
    """
    config = _config(dataset)
    loaded = C.load_sequences(dataset, root=root)
    notes = list(getattr(loaded, "notes", ()))
    label = config["label"]
    if loaded.train is None:
        notes.append(
            f"SUBSTITUTE split ({label}): the original training file is missing; the users of the valid "
            "and test files were pooled and split 80/10/10 into train/valid/test users (seeded); training "
            "users contribute their whole sequence."
        )
    return split_from_frames(
        loaded.train, loaded.valid, loaded.test,
        num_items_a=loaded.num_items_a, num_items_b=loaded.num_items_b,
        num_negatives=num_negatives, seed=seed, exclude_history=exclude_history,
        domain_names=tuple(getattr(loaded, "domain_names", config["domains"])),
        name=f"{dataset}/{NAME}", notes=notes,
    )


def split_from_frames(
    train: Optional[pd.DataFrame],
    valid: pd.DataFrame,
    test: pd.DataFrame,
    *,
    num_items_a: int,
    num_items_b: int,
    num_negatives: int = 999,
    seed: int = 0,
    exclude_history: bool = True,
    platform_fractions=PLATFORM_FRACTIONS,
    user_fractions=SUBSTITUTE_USER_FRACTIONS,
    domain_names=("A", "B"),
    name: str = NAME,
    notes=(),
) -> SequenceSplit:
    """FedCSR split from sequence frames (columns user, items, timestamps; ``train`` may be ``None``).

    Raises:
        ValueError: an empty sequence, an item id outside ``[0, num_items_a + num_items_b)``,
            or fractions that do not describe a partition.
    """
    if abs(sum(user_fractions) - 1.0) > 1e-9 or len(user_fractions) != 3:
        raise ValueError(f"user_fractions must be three shares summing to 1, got {user_fractions}")
    valid_seq = _to_sequences(valid)
    test_seq = _to_sequences(test)
    num_items = num_items_a + num_items_b
    substitute = train is None
    if substitute:
        pooled = _concat(valid_seq, test_seq)
        rng = np.random.default_rng([seed, 0])
        perm = rng.permutation(len(pooled))
        n = len(pooled)
        n_train = int(np.floor(user_fractions[0] * n))
        n_valid = int(np.floor(user_fractions[1] * n))
        # Keep each part in file order so that results do not depend on the permutation order.
        train_rows = np.sort(perm[:n_train])
        valid_rows = np.sort(perm[n_train:n_train + n_valid])
        test_rows = np.sort(perm[n_train + n_valid:])
        train_seq, valid_seq, test_seq = pooled.subset(train_rows), pooled.subset(valid_rows), pooled.subset(test_rows)
    else:
        train_seq = _to_sequences(train)

    # Dense user ids over all three parts, in order of first appearance (train first).
    all_raw = np.concatenate([train_seq.users, valid_seq.users, test_seq.users])
    dense, raw_users = C.dense_ids(all_raw)
    n_tr, n_va = len(train_seq), len(valid_seq)
    train_seq = _with_users(train_seq, dense[:n_tr])
    valid_seq = _with_users(valid_seq, dense[n_tr:n_tr + n_va])
    test_seq = _with_users(test_seq, dense[n_tr + n_va:])
    for part, seqs in (("train", train_seq), ("valid", valid_seq), ("test", test_seq)):
        if len(seqs) and seqs.lengths().min() < 1:
            raise ValueError(f"{name}: empty {part} sequence")
        if seqs.items.size and (seqs.items.min() < 0 or seqs.items.max() >= num_items):
            raise ValueError(f"{name}: {part} item id outside [0, {num_items})")
    for part, seqs in (("valid", valid_seq), ("test", test_seq)):
        if len(seqs) and seqs.lengths().min() < 2:
            raise ValueError(f"{name}: a {part} sequence has no history before its target")

    platforms = platform_rows(train_seq, platform_fractions)
    # Every (user, item) of the user's sequences, for excluding history from the negatives.
    if exclude_history:
        known_users = np.concatenate([np.repeat(s.users, s.lengths()) for s in (train_seq, valid_seq, test_seq)])
        known_items = np.concatenate([train_seq.items, valid_seq.items, test_seq.items])
    else:
        known_users = known_items = np.empty(0, np.int64)

    candidates = {}
    for role_index, (role, seqs) in enumerate((("valid", valid_seq), ("test", test_seq)), start=1):
        target = seqs.last_items()
        in_b = target >= num_items_a
        candidates[role] = sample_candidates(
            seqs.users, target, known_users, known_items,
            num_negatives=num_negatives, seed=[seed, role_index],
            item_low=np.where(in_b, num_items_a, 0), item_high=np.where(in_b, num_items, num_items_a),
        )

    return SequenceSplit(
        num_items_a=int(num_items_a),
        num_items_b=int(num_items_b),
        num_users=int(raw_users.size),
        train=train_seq,
        valid=valid_seq,
        test=test_seq,
        platforms=platforms,
        valid_candidates=candidates["valid"],
        test_candidates=candidates["test"],
        name=name,
        notes=tuple(notes) + (
            f"{len(platforms)} platforms (disjoint users, sorted by sequence length, fractions "
            f"{', '.join(f'{f:g}' for f in platform_fractions)})",
            f"candidates: 1 GT + {num_negatives} same-domain negatives, "
            + ("excluding the user's own items" if exclude_history else "excluding only the GT")
            + f", seed={seed}",
        ),
        extra={
            "raw_users": raw_users,
            "substitute_train": substitute,
            "valid_platforms": platform_rows(valid_seq, platform_fractions),
            "test_platforms": platform_rows(test_seq, platform_fractions),
            "platform_fractions": tuple(platform_fractions),
            "domain_names": tuple(domain_names),
        },
    )


def platform_rows(seqs: Sequences, fractions=PLATFORM_FRACTIONS) -> tuple:
    """Cut sequences into platforms: users sorted by sequence length, contiguous groups.

    Each user's sequences stay together (a user's length key is their longest sequence;
    ties keep the order of first appearance). Group ``p`` gets ``floor(cum_p * n_users) -
    floor(cum_{p-1} * n_users)`` users, the last group the remainder.

    Returns:
        tuple of ``int64`` row-index arrays into ``seqs``, one per platform.
    """
    if len(seqs) == 0:
        return tuple(np.empty(0, np.int64) for _ in fractions)
    user_codes, _ = pd.factorize(seqs.users)
    n_users = int(user_codes.max()) + 1
    longest = np.zeros(n_users, dtype=np.int64)
    np.maximum.at(longest, user_codes, seqs.lengths())
    user_order = np.argsort(longest, kind="stable")
    bounds = np.floor(np.cumsum(fractions) * n_users).astype(np.int64)
    bounds[-1] = n_users
    platform_of_user = np.empty(n_users, dtype=np.int64)
    platform_of_user[user_order] = np.searchsorted(bounds, np.arange(n_users), side="right")
    row_platform = platform_of_user[user_codes]
    order = np.argsort(row_platform, kind="stable")
    cuts = np.searchsorted(row_platform[order], np.arange(len(fractions) + 1))
    return tuple(order[cuts[p]:cuts[p + 1]].astype(np.int64) for p in range(len(fractions)))


def statistics(split: SequenceSplit) -> pd.DataFrame:
    """Table 1 columns: users, items per domain (``items_<domain name>``), train/valid/test
    sequences, Avg.Len, sparsity.

    ``avg_len`` is the mean length over all sequences (2 dp); ``sparsity`` is
    ``100 * (1 - total items in all sequences / (users * (items_A + items_B)))`` (3 dp), the
    definition that matches the paper's printed values.
    """
    domains = split.extra.get("domain_names", ("A", "B"))
    lengths = np.concatenate([split.train.lengths(), split.valid.lengths(), split.test.lengths()])
    total = int(lengths.sum())
    return pd.DataFrame([{
        "users": split.num_users,
        f"items_{domains[0]}": split.num_items_a,
        f"items_{domains[1]}": split.num_items_b,
        "train": len(split.train),
        "valid": len(split.valid),
        "test": len(split.test),
        "avg_len": round(float(lengths.mean()), 2) if lengths.size else float("nan"),
        "sparsity": round(C.sparsity_percent(total, split.num_users, split.num_items), 3),
    }])


def platform_statistics(split: SequenceSplit) -> pd.DataFrame:
    """One row per platform: how the ten platforms differ (the paper's setting, Sec. 3).

    Columns: ``platform`` (1-based, as the paper), ``users`` and ``train_sequences`` (training
    data), ``share_of_users`` (percent of all training users), ``valid`` / ``test`` (rows held
    out on that platform), ``mean_length`` (training sequence length, items), ``share_<A>``
    (percent of the platform's training interactions in domain A), ``items_seen`` (distinct
    items in its training data) and ``popularity_of_top_item`` (percent of the platform's
    interactions that go to its most frequent item; a skew measure).
    """
    names = split.extra.get("domain_names", ("A", "B"))
    lengths = split.train.lengths()
    total_users = max(1, np.unique(split.train.users).size)
    rows = []
    for k, platform in enumerate(split.platforms):
        platform = np.asarray(platform, dtype=np.int64)
        seqs = split.train.subset(platform)
        items = seqs.items
        counts = np.bincount(items) if items.size else np.zeros(1, np.int64)
        users = np.unique(seqs.users).size
        rows.append({
            "platform": k + 1,
            "users": int(users),
            "share_of_users": round(100.0 * users / total_users, 2),
            "train_sequences": int(platform.size),
            "valid": int(len(split.extra["valid_platforms"][k])) if "valid_platforms" in split.extra else 0,
            "test": int(len(split.extra["test_platforms"][k])) if "test_platforms" in split.extra else 0,
            "mean_length": round(float(lengths[platform].mean()), 2) if platform.size else float("nan"),
            f"share_{names[0]}": round(100.0 * float((items < split.num_items_a).mean()), 1) if items.size
            else float("nan"),
            "items_seen": int((counts > 0).sum()),
            "popularity_of_top_item": round(100.0 * counts.max() / max(1, items.size), 2),
        })
    return pd.DataFrame(rows)


def _to_sequences(frame: pd.DataFrame) -> Sequences:
    stamps = frame["timestamps"].tolist() if "timestamps" in frame.columns else None
    return Sequences.from_lists(frame["user"].to_numpy(), frame["items"].tolist(), stamps)


def _concat(a: Sequences, b: Sequences) -> Sequences:
    return Sequences(
        users=np.concatenate([a.users, b.users]),
        indptr=np.concatenate([a.indptr, a.indptr[-1] + b.indptr[1:]]),
        items=np.concatenate([a.items, b.items]),
        timestamps=np.concatenate([a.timestamps, b.timestamps]),
    )


def _with_users(seqs: Sequences, users: np.ndarray) -> Sequences:
    return Sequences(users=np.asarray(users, dtype=np.int64), indptr=seqs.indptr, items=seqs.items, timestamps=seqs.timestamps)


def _config(dataset: str) -> dict:
    if dataset not in DATASETS:
        reason = "FedCSR needs C2DSR cross-domain sequence files."
        if dataset == "c2dsr-entertainment-education":
            reason = "Only its item lists are available; the sequence files are missing."
        raise C.UnsupportedDatasetError(NAME, dataset, list(DATASETS), reason)
    return DATASETS[dataset]
