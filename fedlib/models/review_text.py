r"""Review-text side information for FedPCL-CDR: Doc2Vec user and item documents, and their leak.

FedPCL-CDR (Sec. 3.3.1; code ``doc2vec_amazon.py``) concatenates, per domain, every review a
user wrote into one *user document* and every review an item received into one *item
document*, trains Doc2Vec (vector 64, window 5, min_count 1, 50 epochs) and feeds the frozen
vectors to LightGCN's review branch (:class:`fedlib.papers.fedpcl_cdr.method.DomainModel`).

**The leak.** The code builds the documents from *all* reviews, before the train/test split.
The review of a held-out test interaction is then inside both the user's and the test item's
document: the two vectors are pulled together by the very text that says "this user bought
this item", and the model is scored on whether it ranks that item first.
:func:`review_documents` takes the interactions to build from, so ``train`` pairs give the
clean version and train + valid + test the code's version; :func:`review_leak_effect`
measures the difference with a text-only scorer.

No substitute dataset here has review text, so the runs on them switch the branch off; the
original-format tasks (:func:`fedlib.data.protocols.fedpcl_cdr.build_original`, once their
files are placed) switch it on with vectors from training reviews only.
:func:`synthetic_reviews` writes reviews with the structure that makes the leak bite (each
review names the product and carries the reviewer's habits of speech), for tests and the
notebook's demonstration.
"""
from __future__ import annotations

import hashlib
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch

from fedlib.data.splits import InteractionSplit, Pairs
from fedlib.metrics.scorer import evaluate_scorer

__all__ = ["review_documents", "doc2vec_vectors", "review_embeddings", "synthetic_reviews", "review_leak_effect"]

ReviewTexts = Dict[Tuple[int, int], str]
"""``{(user, item): review text}`` of one domain (dense ids)."""


def review_documents(pairs: Pairs, texts: ReviewTexts, num_users: int, num_items: int) -> Tuple[List[str], List[str]]:
    """One document per user and per item: the concatenated reviews of ``pairs``.

    A pair without a review contributes nothing; a user or item with no review gets ``""``.
    Returns ``(user_documents (num_users,), item_documents (num_items,))``.
    """
    user_parts: List[List[str]] = [[] for _ in range(num_users)]
    item_parts: List[List[str]] = [[] for _ in range(num_items)]
    for user, item in zip(pairs.users.tolist(), pairs.items.tolist()):
        text = texts.get((user, item))
        if text:
            user_parts[user].append(text)
            item_parts[item].append(text)
    return [" ".join(p) for p in user_parts], [" ".join(p) for p in item_parts]


def _stable_hash(text: str) -> int:
    # gensim seeds each vector from hash(word); Python's str hash changes per process.
    return int(hashlib.md5(text.encode("utf-8")).hexdigest()[:8], 16)


def doc2vec_vectors(documents: Sequence[str], dim: int = 64, *, window: int = 5, min_count: int = 1,
                    epochs: int = 50, seed: int = 0) -> np.ndarray:
    """Doc2Vec (PV-DM, gensim) vectors ``(len(documents), dim)`` of whitespace-tokenised documents.

    One worker and a stable word hash, so the vectors depend only on the inputs and ``seed``.
    """
    try:
        from gensim.models.doc2vec import Doc2Vec, TaggedDocument
    except ImportError as error:  # pragma: no cover - gensim is a declared dependency
        raise ImportError("Doc2Vec needs gensim: pip install 'gensim>=4.4,<5' (it is in fedlib's dependencies)") from error
    tagged = [TaggedDocument(doc.split() or ["<empty>"], [index]) for index, doc in enumerate(documents)]
    model = Doc2Vec(tagged, vector_size=dim, window=window, min_count=min_count, epochs=epochs, seed=seed,
                    workers=1, hashfxn=_stable_hash)
    return np.stack([model.dv[index] for index in range(len(documents))]).astype(np.float32)


def review_embeddings(split: InteractionSplit, texts: ReviewTexts, dim: int = 64, *, include_heldout: bool = False,
                      epochs: int = 50, seed: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """Frozen ``(user (U, dim), item (I, dim))`` review vectors of one domain.

    ``include_heldout=False`` (ours) builds the documents from training interactions only;
    ``True`` reproduces the code, whose documents include the validation and test reviews.
    User and item documents share one Doc2Vec model, as in the code.
    """
    pairs = split.train
    if include_heldout:
        pairs = Pairs.from_arrays(np.concatenate([split.train.users, split.valid.users, split.test.users]),
                                  np.concatenate([split.train.items, split.valid.items, split.test.items]),
                                  split.num_users)
    user_docs, item_docs = review_documents(pairs, texts, split.num_users, split.num_items)
    vectors = torch.as_tensor(doc2vec_vectors(user_docs + item_docs, dim, epochs=epochs, seed=seed))
    return vectors[: split.num_users], vectors[split.num_users:]


def synthetic_reviews(split: InteractionSplit, *, words_per_review: int = 8, vocabulary: int = 200,
                      seed: int = 0) -> ReviewTexts:
    """A review for every train, valid and test pair of ``split``.

    Each review names the product (``item<i>``, twice) and mixes the reviewer's own habitual
    words (three per user, drawn from ``vocabulary``) with generic words: the two properties
    of real reviews that make the documents of a user and of the items they reviewed overlap.
    """
    rng = np.random.default_rng([seed, 4242])
    habits = rng.integers(0, vocabulary, size=(split.num_users, 3))
    texts: ReviewTexts = {}
    for pairs in (split.train, split.valid, split.test):
        for user, item in zip(pairs.users.tolist(), pairs.items.tolist()):
            filler = rng.integers(0, vocabulary, size=max(0, words_per_review - 5))
            words = [f"item{item}", f"item{item}"] + [f"w{w}" for w in habits[user]] + [f"w{w}" for w in filler]
            rng.shuffle(words)
            texts[(user, item)] = " ".join(words)
    return texts


def review_leak_effect(split: InteractionSplit, texts: ReviewTexts, dim: int = 32, *, epochs: int = 30,
                       seed: int = 0) -> Dict[str, float]:
    """Test HR@10 of a text-only scorer ``cos(user vector, item vector)`` with clean vs leaky documents.

    The scorer knows nothing but the review vectors, so any gap is what the held-out reviews
    put into them. Returns ``{"clean/HR@10", "leaky/HR@10", "clean/NDCG@10", "leaky/NDCG@10"}``.
    """
    out: Dict[str, float] = {}
    for label, leaky in (("clean", False), ("leaky", True)):
        users, items = review_embeddings(split, texts, dim, include_heldout=leaky, epochs=epochs, seed=seed)
        users, items = torch.nn.functional.normalize(users, dim=1), torch.nn.functional.normalize(items, dim=1)
        metrics = evaluate_scorer(lambda u, c: (users[u].unsqueeze(1) * items[c]).sum(-1), split, "test", ks=(10,))
        out.update({f"{label}/{key}": value for key, value in metrics.items() if key != "MRR"})
    return out
