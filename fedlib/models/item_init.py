"""Text-based item-embedding initialisation (a local substitute for FedKDRec's).

What the paper does:
    FedKDRec ("Federated recommendation with RL-based bidirectional knowledge distillation",
    anonymous ICLR-style submission) initialises the item embeddings of **all** compared
    methods from an autoencoder trained with FuxiCTR (Zhu et al., "Open Benchmarking for
    Click-Through Rate Prediction", CIKM 2021) on item side information fused with
    Sentence-T5 embeddings of the item text (Ni et al., "Sentence-T5: Scalable Sentence
    Encoders from Pre-trained Text-to-Text Models", Findings of ACL 2022). The exact
    features, architecture and training of that autoencoder are not given.

What we do instead:
    No pretrained language model can be downloaded here, so the text encoder is replaced by
    TF-IDF over title words. Per item: TF-IDF of the title (unit norm), multi-hot genres
    (unit norm) and the standardised release year, concatenated
    (:func:`item_text_features`); a small autoencoder compresses them to ``dim`` numbers
    (:func:`train_item_autoencoder`), and the codes are centred and rescaled to the standard
    deviation of the random ``N(0, σ²)`` init they replace. TF-IDF only knows shared *words*
    (``Star Wars`` and ``Return of the Jedi`` share none), so most of the similarity comes
    from genres and year: expect a weaker prior than the paper's.

One call: ``text_item_init("ml-100k", split.extra["raw_items"], dim=32, target_std=0.01)``
returns the ``(num_items, dim)`` table whose row ``i`` belongs to dense item id ``i``.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
import pandas as pd
import torch
from sklearn.feature_extraction.text import TfidfVectorizer
from torch import nn

from fedlib.data.side_info import load_side_info

__all__ = ["ItemFeatures", "item_text_features", "train_item_autoencoder", "text_item_init"]

_YEAR_IN_TITLE = re.compile(r"\(\d{4}\)")
_FEATURE_KW = ("max_features", "min_df", "year_weight")
DEFAULT_TARGET_STD = 0.01
"""Default std of the returned table: FedMF's ``N(0, 0.01²)`` init (F3CRec)."""


@dataclass(frozen=True)
class ItemFeatures:
    """Side-information features of items, one row per entry of ``raw_items``.

    Attributes:
        matrix: ``(I, F)`` float32, dense. Blocks: title TF-IDF (unit L2 norm per item),
            genres (multi-hot scaled to unit L2 norm), year (z-score times ``year_weight``).
        columns: ``F`` names: ``"title:<word>"``, ``"genre:<name>"``, ``"year"``.
        missing: ``(I,)`` bool, True for items absent from the side information (zero rows).
        notes: caveats to show to the reader (e.g. how many items are missing).
    """

    matrix: np.ndarray
    columns: Tuple[str, ...]
    missing: np.ndarray
    notes: Tuple[str, ...]


def item_text_features(
    side_info: pd.DataFrame,
    raw_items: np.ndarray,
    max_features: int = 2000,
    min_df: int = 2,
    year_weight: float = 0.5,
) -> ItemFeatures:
    """Feature matrix of the items ``raw_items`` (dense id ``i`` -> raw id ``raw_items[i]``).

    Args:
        side_info: frame of :mod:`fedlib.data.side_info` (index raw item id; ``title``,
            ``year``, ``genres``).
        raw_items: ``(I,)`` raw ids, e.g. ``split.extra["raw_items"]``; must be unique.
        max_features: largest title vocabulary (most frequent words first).
        min_df: a title word must occur in at least this many titles; a word in one title
            links that item to no other, it only adds a column.
        year_weight: scale of the z-scored year column (0 drops its influence).

    Raises:
        ValueError: duplicate ids in ``raw_items``, or none of them in ``side_info``
            (wrong dataset, or ids of another type such as ``"1"`` vs ``1``).
    """
    raw_items = np.asarray(raw_items)
    if pd.Index(raw_items).has_duplicates:
        raise ValueError("raw_items contains duplicate ids; pass the dense-id -> raw-id map (one entry per item).")
    present = pd.Index(raw_items).isin(side_info.index)
    if raw_items.size and not present.any():
        raise ValueError(
            f"None of the {raw_items.size} raw item ids (e.g. {raw_items[:3].tolist()}, dtype {raw_items.dtype}) "
            f"is in the side information (ids e.g. {side_info.index[:3].tolist()}, dtype {side_info.index.dtype}). "
            "Load the side information of the same dataset as the split, and pass split.extra['raw_items']."
        )
    rows = side_info.reindex(raw_items[present])
    blocks: List[np.ndarray] = []
    columns: List[str] = []

    # Title words without the "(1995)" year tag: the year has its own column.
    titles = [_YEAR_IN_TITLE.sub(" ", str(t)) for t in rows["title"].fillna("")]
    try:
        tfidf = TfidfVectorizer(stop_words="english", min_df=min_df, max_features=max_features,
                                sublinear_tf=True, dtype=np.float32)
        blocks.append(tfidf.fit_transform(titles).toarray())
        columns += [f"title:{w}" for w in tfidf.get_feature_names_out()]
    except ValueError:  # no word survives min_df / stop words (tiny catalogues): no title block
        pass

    genres = sorted({g for gs in rows["genres"] for g in gs})
    index = {g: j for j, g in enumerate(genres)}
    multi_hot = np.zeros((len(rows), len(genres)), dtype=np.float32)
    for r, gs in enumerate(rows["genres"]):
        multi_hot[r, [index[g] for g in gs]] = 1.0
    blocks.append(multi_hot / np.maximum(np.linalg.norm(multi_hot, axis=1, keepdims=True), 1e-12))
    columns += [f"genre:{g}" for g in genres]

    year = rows["year"].to_numpy(dtype=np.float64)
    known = np.isfinite(year)
    z = np.zeros_like(year)
    if known.sum() > 1 and year[known].std() > 0:
        z[known] = (year[known] - year[known].mean()) / year[known].std()  # unknown year -> mean
    blocks.append((year_weight * z).astype(np.float32)[:, None])
    columns.append("year")

    matrix = np.zeros((raw_items.size, len(columns)), dtype=np.float32)
    matrix[present] = np.concatenate(blocks, axis=1)
    n_missing = int((~present).sum())
    notes = ((f"{n_missing} of {raw_items.size} items have no side information: zero feature rows",)
             if n_missing else ())
    return ItemFeatures(matrix, tuple(columns), ~present, notes)


def train_item_autoencoder(
    features,
    dim: int = 32,
    hidden: int = 128,
    epochs: int = 20,
    lr: float = 5e-3,
    batch_size: int = 256,
    target_std: float = DEFAULT_TARGET_STD,
    seed: int = 0,
    device=None,
    num_threads: Optional[int] = 1,
) -> Tuple[torch.Tensor, List[float]]:
    """Train ``F -> hidden -> dim -> hidden -> F`` (ReLU, MSE, Adam) and return the codes.

    Args:
        features: ``(I, F)`` array, tensor or :class:`ItemFeatures`.
        dim: code (embedding) size. hidden: width of the two hidden layers.
        epochs: passes over the items in shuffled mini-batches of ``batch_size``.
        target_std: standard deviation of the returned table (over all entries), i.e. the
            ``σ`` of the random ``N(0, σ²)`` init being replaced (FedMF uses 0.01).
        seed: fixes weights and batch order; the global torch RNG is left untouched.
        device: where to train (``None`` = CPU; ML-100K takes a few seconds on one CPU core).
        num_threads: torch CPU threads while training, restored afterwards (``None`` = keep).
            The matrices are small: more threads barely help and, on a busy machine,
            oversubscribed threads make training many times slower.

    Returns:
        ``(embeddings, losses)``: ``(I, dim)`` float32 on the CPU, centred per dimension
        and scaled to ``target_std``; ``losses[e]`` is the mean reconstruction MSE of epoch ``e``.
    """
    if isinstance(features, ItemFeatures):
        features = features.matrix
    device = torch.device(device or "cpu")
    x = torch.as_tensor(np.asarray(features, dtype=np.float32)).to(device)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"features must be an (I, F) matrix with at least 2 items, got shape {tuple(x.shape)}")
    f = x.shape[1]
    with torch.random.fork_rng(devices=[]):  # seeded layer init without touching the caller's RNG
        torch.manual_seed(seed)
        encoder = nn.Sequential(nn.Linear(f, hidden), nn.ReLU(), nn.Linear(hidden, dim))
        decoder = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, f))
    model = nn.Sequential(encoder, decoder).to(device)
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    order_rng = torch.Generator().manual_seed(seed)
    losses: List[float] = []
    threads = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        _fit(model, optimiser, x, order_rng, epochs, batch_size, losses)
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():
        codes = encoder(x).cpu()
    codes = codes - codes.mean(dim=0, keepdim=True)  # zero mean, like the random init
    codes = codes * (target_std / codes.std().clamp_min(1e-12))
    return codes.float(), losses


def _fit(model: nn.Module, optimiser, x: torch.Tensor, order_rng, epochs: int, batch_size: int, losses: List[float]):
    """Shuffled mini-batch epochs of MSE reconstruction; appends each epoch's mean loss."""
    n = x.shape[0]
    for _ in range(epochs):
        total = 0.0
        for batch in torch.randperm(n, generator=order_rng).split(batch_size):
            xb = x[batch.to(x.device)]
            loss = nn.functional.mse_loss(model(xb), xb)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            total += loss.item() * len(batch)
        losses.append(total / n)


def text_item_init(
    dataset: str,
    raw_items,
    dim: int = 32,
    seed: int = 0,
    root=None,
    **kw,
) -> torch.Tensor:
    """Initial item table for ``dataset`` from its side information: ``(I, dim)`` float32.

    Args:
        dataset: ``"ml-100k"``, ``"ml-1m"`` or ``"amazon-industrial"``.
        raw_items: ``(I,)`` raw item ids in dense-id order (``split.extra["raw_items"]``).
        seed: autoencoder seed, and the seed of the random rows of items without side
            information (``N(0, target_std²)``, so they do not share one identical row).
        root: data root (``None`` = ``FEDLIB_DATA``).
        **kw: ``max_features``, ``min_df``, ``year_weight`` for :func:`item_text_features`;
            everything else (``hidden``, ``epochs``, ``lr``, ``target_std``, ``device`` ...)
            for :func:`train_item_autoencoder`.

    Raises:
        MissingDataError: the side-information file is absent (always for amazon-industrial
            unless its metadata was placed by hand).
    """
    feature_kw = {k: kw.pop(k) for k in _FEATURE_KW if k in kw}
    features = item_text_features(load_side_info(dataset, root=root), np.asarray(raw_items), **feature_kw)
    for note in features.notes:
        warnings.warn(f"text_item_init({dataset!r}): {note}; those items get random rows", stacklevel=2)
    embeddings, _ = train_item_autoencoder(features, dim=dim, seed=seed, **kw)
    if features.missing.any():
        std = float(kw.get("target_std", DEFAULT_TARGET_STD))
        gen = torch.Generator().manual_seed(seed)
        random_rows = torch.randn((int(features.missing.sum()), dim), generator=gen) * std
        embeddings[torch.from_numpy(features.missing)] = random_rows
    return embeddings
