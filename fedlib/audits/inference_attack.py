r"""Which items did a client train on? Attacks of an honest-but-curious server on row uploads.

F3CRec §5.6: a server that compares a client's uploaded item table ``Q_u`` with the table
``Q`` it sent can tell which rows moved, and so guess the client's positives with
probability ``n⁺/(n⁺ + n⁻)`` (``n⁺`` positives, ``n⁻`` sampled negatives). The paper's
defence is Laplace noise on the upload (:class:`~fedlib.engine.method.UploadNoise`). This
module implements that attack and a sharper one, and scores them against the truth.

Input: :class:`~fedlib.engine.uploads.ClientRowUpdates`, every (client, row) change a
client uploaded in one round, e.g.
``executor.local_updates(..., return_client_updates=True).client_updates["item_emb"]``.
Every function works on all clients at once (grouped tensor operations over the ragged
rows; the only loop is over power-of-two client-size buckets), with no per-client Python loop.

Attacks:

* :func:`changed_rows_attack`: every row whose change has norm ``> threshold`` is a
  positive. Without noise the changed rows are exactly the touched ones (positives and
  negatives), so precision is ``n⁺ / (n⁺ + distinct negatives)`` ≈ ``1 / (1 + k)`` with ``k``
  negatives per positive, and recall is 1. With full-support noise every row changes, so
  precision falls to ``n⁺ / I``.
* :func:`sign_attack`: uses the *direction* of the changes. For FedMF (``s_ui = p_u · q_i``,
  BCE) one local SGD step changes item row ``i`` by

  .. math:: Δq_i = −η_Q\,\frac{σ(p_u·q_i) − y_{ui}}{B}\,p_u,

  a positive multiple of ``p_u`` for a positive (``y = 1``) and a negative multiple for a
  negative (``y = 0``): all changes lie on one line, positives on one side. The server does
  not know ``p_u`` nor which side is which, but it can find the line (the top right-singular
  vector ``v`` of the client's ``(n, d)`` matrix of changes), split the rows by the sign of
  ``Δq_i · v``, and guess the **smaller** side: with ``k ≥ 1`` negatives per positive the
  positives are the minority. PFedRec behaves the same way (``Δq_i ∝ ±w_u``, its private
  head).

  When it works and when it fails:

  - exact (precision 1) for FedMF/PFedRec with one local step and no noise, as long as the
    sampled negatives outnumber the positives (``k ≥ 1`` and few repeated negatives);
  - several local steps: ``p_u`` moves between steps, so the changes are sums of slightly
    different directions; with small user learning rates the line is still dominant and
    the attack still works well, it degrades as ``p_u`` rotates more within a round;
  - noise: the projection of the noise on ``v`` flips signs once its spread (``√2·b`` per
    coordinate) approaches the size of the changes, and precision decays towards that of
    guessing; with full-support noise the untouched rows (pure noise) fall on both sides,
    so ``threshold`` should first discard small changes;
  - it is no longer exact for models whose row changes are not collinear (FedNCF with an
    MLP on ``[p_u; q_i]``: the change of ``q_i`` depends on ``q_i`` itself through the
    network), and it fails when positives are not the minority (``k = 0``, or a client
    whose few negatives collide).

:func:`attack_scores` gives each client's precision and recall of the guesses.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from fedlib.data.splits import Pairs
from fedlib.engine.uploads import ClientRowUpdates

__all__ = ["ClientRowGuesses", "AttackScores", "changed_rows_attack", "sign_attack", "attack_scores"]


@dataclass
class ClientRowGuesses:
    """The server's guess for every uploaded (client, row) pair.

    Attributes:
        clients: ``(R,) int64`` user ids, as in the :class:`ClientRowUpdates` attacked.
        rows: ``(R,) int64`` item ids.
        guessed: ``(R,) bool`` True = guessed to be one of the client's training positives.
        scores: ``(R,)`` the attack's evidence (``guessed == scores > cut``): the change's
            norm for :func:`changed_rows_attack`, the oriented projection for
            :func:`sign_attack`. Useful for ranking-based evaluation.
    """

    clients: torch.Tensor
    rows: torch.Tensor
    guessed: torch.Tensor
    scores: torch.Tensor

    def __len__(self) -> int:
        return int(self.rows.numel())

    def guessed_pairs(self):
        """``(clients, rows)`` of the pairs guessed positive."""
        return self.clients[self.guessed], self.rows[self.guessed]


def _positions(clients: torch.Tensor):
    """Distinct client ids ``(C,)`` and each row's index into them ``(R,)``."""
    ids, position = torch.unique(clients, sorted=True, return_inverse=True)
    return ids, position


def _flat(updates: ClientRowUpdates) -> torch.Tensor:
    return updates.delta.reshape(len(updates), -1)


def changed_rows_attack(updates: ClientRowUpdates, *, threshold: float = 0.0) -> ClientRowGuesses:
    """Guess "positive" for every row whose uploaded change has L2 norm ``> threshold``.

    F3CRec §5.6's attack. Without noise a client changes exactly the rows it touched, so
    precision ``= n⁺ / (n⁺ + distinct negatives)`` and recall ``= 1``.
    """
    norms = updates.norms()
    return ClientRowGuesses(updates.clients, updates.rows, norms > float(threshold), norms)


def _top_directions(delta: torch.Tensor, position: torch.Tensor, num_clients: int) -> torch.Tensor:
    """``(C, d)`` unit top right-singular vector of each client's rows ``delta[position == c]``.

    The eigenvector of the largest eigenvalue of the per-client Gram matrix ``D_cᵀ D_c``
    (``d × d``). The Gram matrices are batched matrix products over clients padded to a
    common number of rows; clients are bucketed by ``⌊log₂ n_c⌋`` so padding at most doubles
    the rows (one ``bmm`` per bucket, not per client).
    """
    dim = delta.shape[1]
    order = torch.argsort(position, stable=True)  # rows of each client contiguous
    delta, position = delta[order], position[order]
    counts = torch.bincount(position, minlength=num_clients)  # (C,)
    starts = torch.cumsum(counts, 0) - counts
    gram = delta.new_zeros((num_clients, dim, dim))
    bucket = torch.floor(torch.log2(counts.clamp(min=1).to(torch.float64))).to(torch.int64)
    for level in torch.unique(bucket[counts > 0]).tolist():
        members = torch.nonzero((bucket == level) & (counts > 0)).squeeze(1)  # (C_b,)
        width = int(counts[members].max())
        offsets = torch.arange(width, device=delta.device)
        valid = offsets.unsqueeze(0) < counts[members].unsqueeze(1)  # (C_b, width)
        index = (starts[members].unsqueeze(1) + offsets).clamp(max=delta.shape[0] - 1)
        rows = delta[index] * valid.unsqueeze(-1)  # (C_b, width, d), padding rows zero
        gram[members] = rows.transpose(1, 2) @ rows
    _, vectors = torch.linalg.eigh(gram)  # eigenvalues ascending
    return vectors[:, :, -1]


def _largest_rows(delta: torch.Tensor, position: torch.Tensor, num_clients: int) -> torch.Tensor:
    """``(C, d)`` each client's change of largest norm, normalised (first one on ties)."""
    norms = torch.linalg.vector_norm(delta, dim=1)
    largest = norms.new_full((num_clients,), -1.0).scatter_reduce(0, position, norms, "amax")
    index = torch.arange(delta.shape[0], device=delta.device)
    is_largest = norms == largest[position]
    first = torch.full((num_clients,), delta.shape[0], dtype=torch.int64, device=delta.device)
    first = first.scatter_reduce(0, position[is_largest], index[is_largest], "amin")
    chosen = delta[first.clamp(max=max(delta.shape[0] - 1, 0))]
    return chosen / torch.linalg.vector_norm(chosen, dim=1, keepdim=True).clamp_min(torch.finfo(delta.dtype).tiny)


def sign_attack(updates: ClientRowUpdates, *, direction: str = "singular", threshold: float = 0.0) -> ClientRowGuesses:
    r"""Split each client's row changes by the sign of their projection on one direction and
    guess the smaller side (see the module docstring for why and when this works).

    Per client ``c`` with changes ``Δ_{c,i}`` (rows with norm ``> threshold`` only):

    1. ``v_c`` = top right-singular vector of the ``(n_c, d)`` matrix of changes
       (``direction="singular"``), or the change of largest norm (``"largest"``);
    2. ``s_{c,i} = Δ_{c,i} · v_c``; ``n₊ = #{s > 0}``, ``n₋ = #{s < 0}``;
    3. guess the rows on the side with fewer rows (``s > 0`` on a tie; the non-empty side
       when only one side has rows).

    Returns:
        :class:`ClientRowGuesses` with ``scores`` = the projection oriented so that guessed
        rows score ``> 0`` (rows at or below ``threshold`` score 0 and are not guessed).
    """
    if direction not in ("singular", "largest"):
        raise ValueError(f"direction must be 'singular' or 'largest', got {direction!r}")
    ids, position = _positions(updates.clients)
    num_clients = int(ids.numel())
    delta = _flat(updates)
    if delta.dtype != torch.float64:
        delta = delta.to(torch.float64)  # the d × d eigenproblems are better conditioned in float64
    kept = torch.linalg.vector_norm(delta, dim=1) > float(threshold)
    delta = delta * kept.unsqueeze(1)  # discarded rows take no part in the direction nor the vote
    if num_clients == 0:
        empty = torch.zeros(0, dtype=torch.bool, device=delta.device)
        return ClientRowGuesses(updates.clients, updates.rows, empty, delta.new_zeros(0))
    find = _top_directions if direction == "singular" else _largest_rows
    directions = find(delta, position, num_clients)  # (C, d)
    projection = (delta * directions[position]).sum(1)  # (R,)
    above = torch.zeros(num_clients, dtype=torch.int64, device=delta.device).index_add_(
        0, position, (projection > 0).to(torch.int64))
    below = torch.zeros_like(above).index_add_(0, position, (projection < 0).to(torch.int64))
    # +1: guess the s > 0 side. It is the smaller side, or the only non-empty one (after a
    # threshold only one side may remain; guessing an empty side would reveal nothing).
    guess_above = (above > 0) & ((above <= below) | (below == 0))
    orientation = torch.where(guess_above, 1.0, -1.0).to(delta.dtype)
    scores = projection * orientation[position]
    return ClientRowGuesses(updates.clients, updates.rows, scores > 0, scores.to(updates.delta.dtype))


@dataclass
class AttackScores:
    """Per-client quality of an attack's guesses, and their means.

    Attributes:
        clients: ``(C,) int64`` the attacked clients (those present in the guesses), sorted.
        num_guessed: ``(C,)`` rows guessed positive.
        num_positives: ``(C,)`` the client's true training positives (distinct items).
        num_hits: ``(C,)`` guessed rows that are true positives.
        per_client_precision: ``(C,)`` ``num_hits / num_guessed`` (NaN when nothing was guessed).
        per_client_recall: ``(C,)`` ``num_hits / num_positives`` (NaN without positives).

    ``scores.precision`` / ``scores.recall`` (also ``scores["precision"]``, ``scores["recall"]``)
    are the macro means over clients, NaN entries left out.
    """

    clients: np.ndarray
    num_guessed: np.ndarray
    num_positives: np.ndarray
    num_hits: np.ndarray
    per_client_precision: np.ndarray
    per_client_recall: np.ndarray

    @staticmethod
    def _mean(values: np.ndarray) -> float:
        return float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")

    @property
    def precision(self) -> float:
        """Mean precision over clients that guessed anything."""
        return self._mean(self.per_client_precision)

    @property
    def recall(self) -> float:
        """Mean recall over clients with at least one positive."""
        return self._mean(self.per_client_recall)

    def summary(self) -> dict:
        """``{"clients", "precision", "recall"}``: number of clients and the two means."""
        return {"clients": int(self.clients.size), "precision": self.precision, "recall": self.recall}

    def __getitem__(self, key: str):
        return self.summary()[key]

    def to_frame(self) -> pd.DataFrame:
        """One row per client."""
        return pd.DataFrame({"client": self.clients, "guessed": self.num_guessed, "positives": self.num_positives,
                             "hits": self.num_hits, "precision": self.per_client_precision,
                             "recall": self.per_client_recall})


def attack_scores(guesses: ClientRowGuesses, truth_pairs: Pairs) -> AttackScores:
    """Precision and recall of ``guesses`` against each client's training positives.

    Args:
        guesses: output of an attack.
        truth_pairs: the (user, item) training positives (e.g. ``split.train``); only the
            clients present in ``guesses`` are scored.
    """
    clients = guesses.clients.detach().cpu().numpy().astype(np.int64)
    rows = guesses.rows.detach().cpu().numpy().astype(np.int64)
    guessed = guesses.guessed.detach().cpu().numpy().astype(bool)
    ids, position = np.unique(clients, return_inverse=True)
    width = int(max(rows.max(initial=-1), truth_pairs.items.max(initial=-1))) + 1
    truth_users, truth_items = truth_pairs.users, truth_pairs.items
    attacked = np.isin(truth_users, ids)
    truth_keys = np.unique(truth_users[attacked] * width + truth_items[attacked])  # distinct positives
    truth_position = np.searchsorted(ids, truth_keys // width)
    hit = guessed & np.isin(clients * width + rows, truth_keys)
    num_guessed = np.bincount(position, weights=guessed, minlength=ids.size).astype(np.int64)
    num_hits = np.bincount(position, weights=hit, minlength=ids.size).astype(np.int64)
    num_positives = np.bincount(truth_position, minlength=ids.size).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = np.where(num_guessed > 0, num_hits / np.maximum(num_guessed, 1), np.nan)
        recall = np.where(num_positives > 0, num_hits / np.maximum(num_positives, 1), np.nan)
    return AttackScores(ids, num_guessed, num_positives, num_hits, precision, recall)
