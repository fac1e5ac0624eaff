"""FedKDRec and PTF-FedRec: federated recommendation by transferring predictions.

References:
    "Federated Recommendation with Reinforcement Learning based Knowledge Distillation"
    (FedKDRec, anonymous ICLR 2026 submission; no public code), §3, Alg. 1, App. C–D.
    Yuan, Yang, Qu, Nguyen, Li, Yin. "Hide Your Model: A Parameter Transmission-free
    Federated Recommender System." ICDE 2024 (PTF-FedRec).

No parameter ever leaves a client or the server. Every client owns a whole model; the
server owns another (with a row for every user). One round of Algorithm 1:

1. sample ``C = 10 %`` of the clients;
2. the server picks each client's auxiliary items ``Ṽ_i`` and sends them with its own
   predictions as soft labels (§3.3: the actor–critic agent; ``~s``: PTF-FedRec's
   confidence rule; ``-s``: nothing);
3. each client trains on its private data ``D_i`` (train positives + fresh negatives) and
   ``D̃_i`` with BCE (Eq. 3, 2 epochs, Adam);
4. each client samples a fraction ``β ~ U[0.3, 0.7]`` of ``V_i ∪ Ṽ_i``, mixes hard labels
   into its predictions on private items ``r̄ = α r + (1 − α) r̂`` (Eq. 4), swaps the labels of
   its top-λ positives with its top negatives, and uploads ``D̂_i``;
5. the server weighs the clients with ``ω = softmax(M_R(s))`` (§3.2) and trains for 4
   epochs on ``L = Σ_i ω_i L_i`` (Eqs. 5–7);
6. both agents learn from the round (Eq. 10; Eqs. 8, 9, 11, 12).

Ablations are flags of :class:`FedKDRecConfig` (:data:`VARIANTS`); PTF-FedRec is the
paper's ``-m-c~s`` variant (its Table 1 and Table 2 rows are the same numbers).

Choices the paper leaves open (each one is a config field, documented in the notebook):
negatives are drawn afresh each time a client trains (PTF-FedRec draws them once); a
client's Adam state starts fresh each round it is selected; the server's Adam persists;
``L_i`` is the **sum** of BCE over ``D̂_i`` (Eq. 6) for the rewards and the **mean** for
the agent's state ("average loss"); a LightGCN server propagates over every pair it has
been told with a current label above 0.5.

Two executors run step 3 (local training): ``"batched"`` trains the round's clients as
stacked tensors with a masked functional Adam; ``"sequential"`` loops over clients with
``torch.optim.Adam``. Everything else is shared, so both give the same numbers (tested).
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import InteractionSplit, Pairs
from fedlib.device import default_device
from fedlib.engine.method import masked_adam_step
from fedlib.engine.plan import round_generator
from fedlib.methods.kd_agents import (
    TEACHER_FEATURES, TRANSFER_REWARDS, TeacherWeightAgent, TransferAgent, divergence_reward, diversity_reward, zscore,
)
from fedlib.models.stacked import Backbone

__all__ = [
    "FedKDRecConfig", "VARIANTS", "variant_config", "LocalData", "Uploads", "FedKDRecRun", "FedKDRecSession",
    "train_fedkdrec", "local_examples", "local_predictions", "prepare_uploads", "mixed_label_bce",
]

TRANSFER_MODES = ("agent", "confidence", "none")
TEACHER_MODES = ("agent", "uniform")
EXECUTORS = ("batched", "sequential")
#: bytes per transferred prediction: an int32 item id and a float32 label
BYTES_PER_PREDICTION = 8
# independent random streams inside one round (round_generator's ``stream``)
_SELECT, _NEGATIVES, _SHUFFLE, _UPLOAD, _SERVER, _ACTOR = range(1, 7)


@dataclass(frozen=True)
class FedKDRecConfig:
    """Every setting of one FedKDRec / PTF-FedRec run (paper App. D.3 defaults).

    Ablation flags: ``mix`` (``-m``: upload raw predictions), ``teacher_weights``
    (``-c``: ``"uniform"``), ``transfer`` (``-s``: ``"none"``; ``~s``: ``"confidence"``),
    ``teacher_features`` / ``transfer_rewards`` (Table 4).
    """

    backbone: str = "neumf"
    hidden: tuple = (64, 32, 16)
    dim: int = 32
    rounds: int = 200
    client_fraction: float = 0.1
    client_epochs: int = 2
    server_epochs: int = 4
    client_batch: int = 256
    server_batch: int = 1024
    client_lr: float = 1e-3
    server_lr: float = 1e-3
    weight_decay: float = 0.0
    num_negatives: int = 4
    alpha: float = 0.5
    beta_range: tuple = (0.3, 0.7)
    swap_ratio: float = 0.1
    mu: int = 30
    rho: float = 4.0
    gamma: float = 0.9
    agent_lr: float = 1e-3
    agent_hidden: int = 32
    mix: bool = True
    teacher_weights: str = "agent"
    transfer: str = "agent"
    teacher_features: tuple = TEACHER_FEATURES
    transfer_rewards: tuple = TRANSFER_REWARDS
    eval_every: int = 10
    seed: int = 0

    def __post_init__(self):
        problems = []
        if self.transfer not in TRANSFER_MODES:
            problems.append(f"transfer must be one of {TRANSFER_MODES}, got {self.transfer!r}")
        if self.teacher_weights not in TEACHER_MODES:
            problems.append(f"teacher_weights must be one of {TEACHER_MODES}, got {self.teacher_weights!r}")
        if not 0.0 < self.client_fraction <= 1.0:
            problems.append(f"client_fraction must be in (0, 1], got {self.client_fraction}")
        lo, hi = self.beta_range
        if not 0.0 < lo <= hi <= 1.0:
            problems.append(f"beta_range must satisfy 0 < low <= high <= 1, got {self.beta_range}")
        if not 0.0 <= self.alpha <= 1.0 or not 0.0 <= self.swap_ratio <= 1.0:
            problems.append(f"alpha and swap_ratio must be in [0, 1], got {self.alpha}, {self.swap_ratio}")
        for name in ("rounds", "client_epochs", "server_epochs", "client_batch", "server_batch", "dim", "mu",
                     "eval_every"):
            if int(getattr(self, name)) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_negatives < 0 or self.weight_decay < 0:
            problems.append("num_negatives and weight_decay must be >= 0")
        if problems:
            raise ValueError("invalid FedKDRecConfig: " + "; ".join(problems))

    def to_dict(self) -> Dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}


#: the paper's variants (Tables 2 and 4) as config overrides; "-m-c~s" is PTF-FedRec
VARIANTS: Dict[str, Dict[str, Any]] = {
    "FedKDRec": {},
    "-m": {"mix": False},
    "-c": {"teacher_weights": "uniform"},
    "-s": {"transfer": "none"},
    "~s": {"transfer": "confidence"},
    "-m-c~s": {"mix": False, "teacher_weights": "uniform", "transfer": "confidence"},
    "w/o sample size": {"teacher_features": ("statistics", "server_loss")},
    "w/o statistics info": {"teacher_features": ("volume", "server_loss")},
    "w/o BCE loss": {"teacher_features": ("volume", "statistics")},
    "w/o R_i": {"transfer_rewards": ("diversity", "divergence")},
    "w/o R_i^s": {"transfer_rewards": ("server", "divergence")},
    "w/o R_i^l": {"transfer_rewards": ("server", "diversity")},
}
VARIANTS["PTF-FedRec"] = VARIANTS["-m-c~s"]


def variant_config(name: str, **settings) -> FedKDRecConfig:
    """The config of a named variant (:data:`VARIANTS`) on top of ``settings``."""
    if name not in VARIANTS:
        raise ValueError(f"unknown FedKDRec variant {name!r}; expected one of {list(VARIANTS)}")
    return FedKDRecConfig(**{**settings, **VARIANTS[name]})


# ======================================================================================
# Client data (shared by both executors)
# ======================================================================================
@dataclass
class LocalData:
    """The round's local datasets ``D_i ∪ D̃_i``, padded to a common length ``L``.

    Clients are ordered by decreasing size, so the clients still training at local step
    ``s`` are always a prefix (the batched executor slices instead of masking).

    A client's Adam state is fresh each round, so an item row the client never touches this
    round keeps zero moments and does not move: local training only needs the ``R`` distinct
    rows each client touches (``row_items``), indexed by ``rows``.

    Attributes:
        clients: ``(C,) int64`` user ids. items: ``(C, L) int64`` global ids (0 on padding).
        rows: ``(C, L) int64`` the same items as indices into ``row_items``.
        row_items: ``(C, R) int64`` each client's distinct local items; row_mask ``(C, R)`` 0/1.
        labels: ``(C, L)`` float32 targets (1/0 private, the server's soft label for auxiliary).
        private: ``(C, L) bool`` item from ``D_i``. mask: ``(C, L)`` float32 1 = real example.
        counts: ``(C,) int64`` examples per client. own: ``(C, R)`` 0/1 training positives
            (LightGCN's star graph), in local rows.
    """

    clients: np.ndarray
    items: torch.Tensor
    rows: torch.Tensor
    row_items: torch.Tensor
    row_mask: torch.Tensor
    labels: torch.Tensor
    private: torch.Tensor
    mask: torch.Tensor
    counts: np.ndarray
    own: torch.Tensor


def _pad_by_owner(owner: np.ndarray, num_rows: int, *columns: np.ndarray):
    """Scatter flat per-example arrays into ``(num_rows, L)`` matrices, keeping input order.

    Returns ``(counts (num_rows,), valid (num_rows, L) bool, [matrices], position (n,))``
    with ``position[j]`` the column of example ``j``.
    """
    counts = np.bincount(owner, minlength=num_rows)
    order = np.argsort(owner, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    position = np.empty(owner.size, dtype=np.int64)
    position[order] = np.arange(owner.size) - np.repeat(starts, counts)
    width = max(int(counts.max()) if counts.size else 0, 1)
    out = []
    for column in columns:
        matrix = np.zeros((num_rows, width), dtype=column.dtype)
        matrix[owner, position] = column
        out.append(matrix)
    valid = np.zeros((num_rows, width), dtype=bool)
    valid[owner, position] = True
    return counts, valid, out, position


def local_examples(train: Pairs, clients: np.ndarray, num_items: int, sampler: NegativeSampler, num_negatives: int,
                   rng: np.random.Generator, aux_items: Optional[np.ndarray] = None,
                   aux_labels: Optional[np.ndarray] = None, device="cpu") -> LocalData:
    """Build ``D_i`` (positives + ``num_negatives`` fresh negatives each) ``∪ D̃_i`` per client.

    Args:
        clients: ``(C,)`` user ids. aux_items / aux_labels: ``(C, A)`` items sent by the
            server (``-1`` = none) and their soft labels; items already in ``D_i`` are dropped
            (``D̃_i`` ranges over ``Ṽ_i \\ V_i``, Eq. 3).
    """
    clients = np.asarray(clients, dtype=np.int64)
    indptr = train.indptr
    sizes = indptr[clients + 1] - indptr[clients]
    owner_pos = np.repeat(np.arange(clients.size), sizes)
    take = np.repeat(indptr[clients], sizes) + (np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes))
    positives = train.items[take]
    negatives = sampler.sample(clients[owner_pos], num_negatives, rng).reshape(-1)  # (P * k,)
    owner_neg = np.repeat(owner_pos, num_negatives)
    owner = [owner_pos, owner_neg]
    items = [positives, negatives]
    labels = [np.ones(positives.size, np.float32), np.zeros(negatives.size, np.float32)]
    private = [np.ones(positives.size + negatives.size, bool)]
    if aux_items is not None and aux_items.size:
        c_idx, a_idx = np.nonzero(aux_items >= 0)
        keys_private = np.unique(np.concatenate([owner_pos, owner_neg]) * num_items + np.concatenate([positives, negatives]))
        keep = ~np.isin(c_idx * num_items + aux_items[c_idx, a_idx], keys_private)
        owner.append(c_idx[keep])
        items.append(aux_items[c_idx, a_idx][keep])
        labels.append(aux_labels[c_idx, a_idx][keep].astype(np.float32))
        private.append(np.zeros(int(keep.sum()), bool))
    owner, items, labels, private = (np.concatenate(x) for x in (owner, items, labels, private))
    counts, valid, (item_m, label_m, private_m), _ = _pad_by_owner(owner, clients.size, items, labels, private)
    # each client's distinct items -> local rows
    distinct, inverse = np.unique(owner * num_items + items, return_inverse=True)
    distinct_owner, distinct_item = distinct // num_items, distinct % num_items
    _, row_valid, (row_item_m,), row_position = _pad_by_owner(distinct_owner, clients.size, distinct_item)
    rows_flat = row_position[inverse]
    _, _, (rows_m,), _ = _pad_by_owner(owner, clients.size, rows_flat)
    own_m = np.zeros(row_valid.shape, dtype=np.float32)
    own_m[owner_pos, rows_flat[: positives.size]] = 1.0
    order = np.argsort(-counts, kind="stable")  # biggest first: active clients form a prefix

    def as_t(a, dtype=None):
        return torch.as_tensor(a[order], device=device, dtype=dtype)

    return LocalData(clients=clients[order], items=as_t(item_m), rows=as_t(rows_m), row_items=as_t(row_item_m),
                     row_mask=as_t(row_valid, torch.float32), labels=as_t(label_m), private=as_t(private_m),
                     mask=as_t(valid, torch.float32), counts=counts[order], own=as_t(own_m))


def gather_local(backbone: Backbone, clients_state: Mapping[str, torch.Tensor], data: LocalData) -> Dict[str, torch.Tensor]:
    """The round's client models restricted to their local rows: item tables ``(C, R, d)``."""
    users = torch.as_tensor(data.clients, device=data.items.device)
    _, item_names = backbone.embedding_names
    out = {}
    for name, table in clients_state.items():
        if name in item_names:
            out[name] = table[users[:, None], data.row_items].clone()  # (C, R, d)
        else:
            out[name] = table[users].clone()
    return out


def scatter_local(backbone: Backbone, clients_state: Dict[str, torch.Tensor], local: Mapping[str, torch.Tensor],
                  data: LocalData) -> None:
    """Write trained local models back (only real rows: padding rows alias item 0)."""
    users = torch.as_tensor(data.clients, device=data.items.device)
    _, item_names = backbone.embedding_names
    c_idx, r_idx = torch.nonzero(data.row_mask > 0, as_tuple=True)
    for name, value in local.items():
        if name in item_names:
            clients_state[name][users[c_idx], data.row_items[c_idx, r_idx]] = value[c_idx, r_idx].detach()
        else:
            clients_state[name][users] = value.detach()


# ======================================================================================
# Local training (the two executors)
# ======================================================================================
def _client_loss(backbone: Backbone, params, items, labels, mask, own) -> torch.Tensor:
    """Sum over clients of each client's mean BCE on its batch (Eq. 3)."""
    logits = backbone.client_logits(params, items, own)  # (k, B)
    losses = F.binary_cross_entropy_with_logits(logits, labels, reduction="none") * mask
    return (losses.sum(1) / mask.sum(1).clamp(min=1)).sum()


def _epoch_orders(data: LocalData, epochs: int, rng: np.random.Generator) -> List[torch.Tensor]:
    """Each epoch's per-client shuffle ``(C, L)``: real examples first, in random order."""
    mask = data.mask.cpu().numpy() > 0
    orders = []
    for _ in range(epochs):
        keys = rng.random(mask.shape)
        keys[~mask] = np.inf
        orders.append(torch.as_tensor(np.argsort(keys, axis=1, kind="stable"), device=data.items.device))
    return orders


def train_clients_batched(backbone: Backbone, params: Dict[str, torch.Tensor], data: LocalData,
                          orders: Sequence[torch.Tensor], batch: int, lr: float, weight_decay: float,
                          group_size: int = 24) -> float:
    """Local training of all ``C`` clients at once (fresh Adam per client); returns the mean loss.

    Client sizes are heavy-tailed (ML-100K: 20 to 700 ratings), so the clients (already sorted
    by size) are trained in groups of ``group_size``, each padded only to its own largest
    member: the work follows the data instead of the biggest client. Inside a group, the
    clients still training at a step are a prefix.
    """
    _, item_names = backbone.embedding_names
    rows_per_client = data.row_mask.sum(1).long()
    total, seen = 0.0, 0
    for a in range(0, len(data.clients), group_size):
        b = min(a + group_size, len(data.clients))
        width, length = int(rows_per_client[a:b].max()), int(data.counts[a])
        group = {n: (v[a:b, :width] if n in item_names else v[a:b]) for n, v in params.items()}  # views
        own = data.own[a:b, :width]
        counts = torch.as_tensor(data.counts[a:b])
        exp_avg = {n: torch.zeros_like(v) for n, v in group.items()}
        exp_avg_sq = {n: torch.zeros_like(v) for n, v in group.items()}
        steps = {n: torch.zeros(b - a, dtype=torch.int64, device=data.items.device) for n in group}
        stepping = torch.ones(b - a, dtype=torch.bool, device=data.items.device)
        for order in orders:
            order = order[a:b, :length]
            for start in range(0, length, batch):
                k = int((counts > start).sum())  # clients with a batch here: a prefix (sorted by size)
                idx = order[:k, start:start + batch]  # (k, B)
                rows = data.rows[a:a + k].gather(1, idx)
                labels = data.labels[a:a + k].gather(1, idx)
                mask = data.mask[a:a + k].gather(1, idx)
                views = {n: v[:k].detach().requires_grad_() for n, v in group.items()}
                loss = _client_loss(backbone, views, rows, labels, mask, own[:k])
                grads = torch.autograd.grad(loss, list(views.values()))
                for (n, v), grad in zip(group.items(), grads):  # the prefix steps; the rest is done
                    masked_adam_step(v[:k], grad, exp_avg[n][:k], exp_avg_sq[n][:k], steps[n][:k], stepping[:k],
                                     lr=lr, weight_decay=weight_decay)
                total += float(loss.detach())
                seen += k
    return total / max(seen, 1)


def train_clients_sequential(backbone: Backbone, params: Dict[str, torch.Tensor], data: LocalData,
                             orders: Sequence[torch.Tensor], batch: int, lr: float, weight_decay: float) -> float:
    """The reference path: one client at a time with ``torch.optim.Adam``."""
    total, seen = 0.0, 0
    for c in range(len(data.clients)):
        model = {n: params[n][c:c + 1].clone().requires_grad_() for n in params}
        optimizer = torch.optim.Adam(list(model.values()), lr=lr, weight_decay=weight_decay)
        n_examples = int(data.counts[c])
        for order in orders:
            for start in range(0, n_examples, batch):
                idx = order[c:c + 1, start:min(start + batch, n_examples)]
                items, labels = data.rows[c:c + 1].gather(1, idx), data.labels[c:c + 1].gather(1, idx)
                logits = backbone.client_logits(model, items, data.own[c:c + 1])
                loss = F.binary_cross_entropy_with_logits(logits, labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += float(loss.detach())
                seen += 1
        with torch.no_grad():
            for n in params:
                params[n][c:c + 1] = model[n]
    return total / max(seen, 1)


# ======================================================================================
# Upload preparation: sample, mix, swap (§3.1)
# ======================================================================================
def local_predictions(backbone: Backbone, params: Mapping[str, torch.Tensor], data: LocalData,
                      group_size: int = 24) -> torch.Tensor:
    """``(C, L)`` each client's ``r̂ = σ(logit)`` on its local items; padding entries are 0.

    Grouped like :func:`train_clients_batched`: each group of ``group_size`` clients (sorted by
    size) is scored up to its own largest member, not the round's (a 700-rating client would
    otherwise pad every other client ~7x). Each entry is the same computation as on the full
    padded matrix, up to float rounding (a narrower batch may take another GEMM kernel: about
    one float32 ulp, ``test_local_predictions_equal_the_padded_computation``).
    """
    _, item_names = backbone.embedding_names
    rows_per_client = data.row_mask.sum(1).long()
    out = torch.zeros(data.rows.shape, device=data.rows.device)
    with torch.no_grad():
        for a in range(0, len(data.clients), group_size):
            b = min(a + group_size, len(data.clients))
            width, length = int(rows_per_client[a:b].max()), int(data.counts[a])
            group = {n: (v[a:b, :width] if n in item_names else v[a:b]) for n, v in params.items()}
            logits = backbone.client_logits(group, data.rows[a:b, :length], data.own[a:b, :width])  # (b - a, length)
            out[a:b, :length] = torch.sigmoid(logits) * data.mask[a:b, :length]
    return out


@dataclass
class Uploads:
    """What the round's clients send (``D̂_i``), as ``(C, L)`` matrices plus flat views.

    ``keep`` marks uploaded entries; ``labels`` are the uploaded ``r̄`` (after mixing and
    swapping). ``hard``, ``private`` and ``swapped`` stay on the client side: the server's
    code never reads them (they feed the audit of what the labels reveal).
    """

    clients: np.ndarray
    items: torch.Tensor
    labels: torch.Tensor
    keep: torch.Tensor
    private: torch.Tensor
    hard: torch.Tensor
    swapped: torch.Tensor

    def flat(self):
        """``(client_row (N,), items (N,), labels (N,))`` of the uploaded triples."""
        rows, cols = torch.nonzero(self.keep, as_tuple=True)
        return rows, self.items[rows, cols], self.labels[rows, cols]


def _descending_rank(scores: torch.Tensor) -> torch.Tensor:
    """Rank of each entry within its row, 0 = largest (ties by position)."""
    order = torch.argsort(scores, dim=1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(scores.shape[1], device=scores.device).expand_as(order))
    return rank


def prepare_uploads(data: LocalData, predictions: torch.Tensor, config: FedKDRecConfig,
                    rng: np.random.Generator) -> Uploads:
    """Sample (ratio ``β ~ U[β_lo, β_hi]``), mix (Eq. 4) and swap (ratio λ) each client's upload.

    Args:
        predictions: ``(C, L)`` the client models' ``r̂`` on their local items.
    Swap: ``k = ⌊λ · #uploaded positives⌋`` (at most the uploaded negatives); the ``j``-th most
    confident positive and the ``j``-th most confident negative exchange labels.
    """
    c, length = predictions.shape
    device = predictions.device
    beta = torch.as_tensor(rng.uniform(*config.beta_range, size=c), device=device)
    keys = torch.as_tensor(rng.random((c, length)), device=device).masked_fill(data.mask == 0, float("inf"))
    rank = torch.argsort(torch.argsort(keys, dim=1, stable=True), dim=1)
    quota = torch.round(beta * torch.as_tensor(data.counts, device=device)).long().clamp(min=1)
    keep = (rank < quota[:, None]) & (data.mask > 0)
    hard = torch.where(data.private, data.labels, torch.full_like(data.labels, -1.0))
    alpha = config.alpha if config.mix else 0.0
    labels = torch.where(data.private, alpha * data.labels + (1 - alpha) * predictions, predictions)
    positive = keep & data.private & (hard == 1)
    negative = keep & data.private & (hard == 0)
    k = torch.minimum((config.swap_ratio * positive.sum(1)).floor().long(), negative.sum(1))  # (C,)
    neg_inf = torch.full_like(labels, -float("inf"))
    pos_rank = _descending_rank(torch.where(positive, labels, neg_inf))
    neg_rank = _descending_rank(torch.where(negative, labels, neg_inf))
    swap_pos = positive & (pos_rank < k[:, None])
    swap_neg = negative & (neg_rank < k[:, None])
    # pair the j-th positive with the j-th negative: sort both by rank and exchange values
    pos_order = torch.argsort(torch.where(swap_pos, pos_rank, length + 1), dim=1, stable=True)
    neg_order = torch.argsort(torch.where(swap_neg, neg_rank, length + 1), dim=1, stable=True)
    width = int(k.max()) if c else 0
    swapped_labels = labels.clone()
    if width:
        cols = torch.arange(width, device=device)[None]
        active = cols < k[:, None]  # (C, width)
        p_idx, n_idx = pos_order[:, :width], neg_order[:, :width]
        p_val, n_val = labels.gather(1, p_idx), labels.gather(1, n_idx)
        swapped_labels.scatter_(1, p_idx, torch.where(active, n_val, p_val))
        swapped_labels.scatter_(1, n_idx, torch.where(active, p_val, n_val))
    return Uploads(clients=data.clients, items=data.items, labels=swapped_labels, keep=keep, private=data.private,
                   hard=hard, swapped=swap_pos | swap_neg)


def mixed_label_bce(student_logits: torch.Tensor, hard: torch.Tensor, teacher: torch.Tensor, alpha: float):
    """App. C.1 both ways: ``(BCE(s, α r + (1−α) r̂), α·BCE(s, r) + (1−α)·BCE(s, r̂))`` (equal)."""
    mixed = F.binary_cross_entropy_with_logits(student_logits, alpha * hard + (1 - alpha) * teacher)
    split = alpha * F.binary_cross_entropy_with_logits(student_logits, hard) + \
        (1 - alpha) * F.binary_cross_entropy_with_logits(student_logits, teacher)
    return mixed, split


# ======================================================================================
# The run
# ======================================================================================
ScoreFn = Callable[[torch.Tensor], torch.Tensor]


class ServerScorer:
    """A server model as the evaluators take it: ``scorer(users) -> (n, I)`` logits, and
    ``scorer.pairs(users (n,), items (n, K)) -> (n, K)`` for sampled candidates only."""

    def __init__(self, backbone: Backbone, params: Mapping[str, torch.Tensor], graph: Optional[torch.Tensor]):
        self.backbone, self.params, self.graph = backbone, params, graph

    def __call__(self, users: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.backbone.server_scores(self.params, users, self.graph)

    def pairs(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.backbone.server_pair_scores(self.params, users, items, self.graph)


@dataclass
class FedKDRecRun:
    """A finished run: the best-validation server model and the per-round record.

    Attributes:
        curve: one dict per evaluation (``round``, ``valid``, plus what ``evaluate`` returned).
        history: one dict per round: server loss, items sent/uploaded per client, the
            teacher weights' entropy, the fraction of uploaded private labels that reveal the
            hard label (``r̄ > 0.5 ⇔ r = 1``), agent losses, seconds.
    """

    config: FedKDRecConfig
    backbone: Backbone
    server: Dict[str, torch.Tensor]
    best_server: Dict[str, torch.Tensor]
    graph: Optional[torch.Tensor]
    best_graph: Optional[torch.Tensor]
    clients: Dict[str, torch.Tensor]
    own_all: torch.Tensor
    best_round: int = 0
    best_valid: float = -math.inf
    curve: List[Dict[str, Any]] = field(default_factory=list)
    history: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def scorer(self) -> "ServerScorer":
        """The best-validation server model (the paper's output), as a scorer."""
        return ServerScorer(self.backbone, self.best_server, self.best_graph)

    def score_users(self, users: torch.Tensor) -> torch.Tensor:
        """``(n, I)`` logits of the best-validation server model."""
        return self.scorer(users)

    def client_score_users(self, users: torch.Tensor) -> torch.Tensor:
        """``(n, I)`` logits of the users' own (final) client models."""
        with torch.no_grad():
            params = {n: v[users] for n, v in self.clients.items()}
            return self.backbone.client_scores(params, self.own_all[users])


class _Server:
    """The server: its model, optimiser, the labels it has been told, and the two agents."""

    def __init__(self, backbone: Backbone, params, config: FedKDRecConfig, device):
        self.backbone, self.config, self.device = backbone, config, device
        self.params = {n: v.clone().requires_grad_() for n, v in params.items()}
        self.optimizer = torch.optim.Adam(list(self.params.values()), lr=config.server_lr,
                                          weight_decay=config.weight_decay)
        self.told = torch.full((backbone.num_users, backbone.num_items), float("nan"), device=device)
        self.graph = None
        g = torch.Generator().manual_seed(int(config.seed) * 7919 + 17)
        self.teacher = TeacherWeightAgent(config.teacher_features, config.agent_hidden, config.agent_lr, g, device)
        self.transfer = TransferAgent(2 * config.dim + 3, config.mu, config.rho, config.gamma, config.transfer_rewards,
                                      config.agent_hidden, config.agent_lr, g, device)
        self.last_items = torch.zeros(0, dtype=torch.long, device=device)  # items of last round's uploads
        self.last_frequency = torch.zeros(backbone.num_items, device=device)
        self.last_clients = 0.0

    def predict(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return torch.sigmoid(self.backbone.server_logits(self.params, users, items, self.graph))

    def refresh_graph(self):
        if self.backbone.kind == "lightgcn":
            users, items = torch.nonzero(self.told > 0.5, as_tuple=True)
            pairs = Pairs.from_arrays(users.cpu().numpy(), items.cpu().numpy(), self.backbone.num_users)
            self.graph = self.backbone.server_graph(pairs, device=self.device)

    # ------------------------------------------------------------------ server → clients
    def select(self, clients: torch.Tensor, train_sizes: torch.Tensor, generator: torch.Generator):
        """Items ``(C, S)`` (-1 = none) and soft labels to send; plus the agent's episode."""
        c = clients.numel()
        empty = (torch.full((c, 0), -1, dtype=torch.long, device=self.device), torch.zeros(c, 0, device=self.device))
        if self.config.transfer == "none" or self.last_items.numel() == 0:
            return (*empty, None)
        with torch.no_grad():
            scores = self.backbone.server_scores(self.params, clients, self.graph)  # (C, I) logits
        if self.config.transfer == "confidence":
            return (*self._confidence(scores, train_sizes), None)
        candidate_scores = scores[:, self.last_items]  # (C, |V^s|)
        length = min(self.config.mu, self.last_items.numel())
        top = candidate_scores.topk(length, dim=1).indices  # ordered by server prediction
        items = self.last_items[top]  # (C, S)
        prob = torch.sigmoid(candidate_scores.gather(1, top))
        with torch.no_grad():
            user_emb, item_emb = self.backbone.server_embeddings(self.params, self.graph)
            base = torch.cat([prob[..., None], (self.last_frequency[items] / max(1.0, self.last_clients))[..., None],
                              user_emb[clients][:, None, :].expand(-1, length, -1), item_emb[items]], dim=-1)
        valid = torch.ones(c, length, device=self.device)
        states, actions = self.transfer.act(base, valid, generator)
        sent = torch.where(actions > 0, items, torch.full_like(items, -1))
        return sent, prob, {"states": states, "actions": actions, "valid": valid, "items": items}

    def _confidence(self, scores: torch.Tensor, train_sizes: torch.Tensor):
        """PTF-FedRec: half the most uploaded items, half the client's top predictions (≤ μ, ≤ |train|)."""
        mu = self.config.mu
        c = scores.shape[0]
        quota = torch.clamp(train_sizes, max=mu)  # (C,)
        popular_k = min(mu // 2, self.last_items.numel())
        popular = self.last_items[self.last_frequency[self.last_items].topk(popular_k).indices]  # (k,)
        chosen = torch.full((c, mu), -1, dtype=torch.long, device=self.device)
        n_pop = torch.clamp(quota // 2, max=popular_k)
        cols = torch.arange(mu, device=self.device)[None]
        chosen[:, :popular_k] = popular[None].expand(c, -1)
        chosen = torch.where(cols < n_pop[:, None], chosen, torch.full_like(chosen, -1))
        masked = scores.clone()  # the personal half skips the popular items already chosen
        if popular_k:
            pop_cols = popular[None].expand(c, -1)  # (C, k)
            used = torch.arange(popular_k, device=self.device)[None] < n_pop[:, None]
            masked.scatter_(1, pop_cols, torch.where(used, torch.full_like(masked[:, :popular_k], -float("inf")),
                                                     masked.gather(1, pop_cols)))
        width = min(mu, scores.shape[1])
        best = masked.topk(width, dim=1).indices  # (C, width)
        fill_slot = cols - n_pop[:, None]  # position among the personal picks
        take = (cols >= n_pop[:, None]) & (cols < quota[:, None]) & (fill_slot < width)
        personal = best.gather(1, fill_slot.clamp(min=0, max=width - 1))
        chosen = torch.where(take, personal, chosen)
        labels = torch.sigmoid(scores.gather(1, chosen.clamp(min=0))) * (chosen >= 0)
        return chosen, labels

    # ------------------------------------------------------------------ clients → server
    def train(self, uploads: Uploads, clients: torch.Tensor, rng: np.random.Generator) -> Dict[str, Any]:
        """Eqs. 5–7 with ``ω`` from ``M_R``; then Eq. 10. Returns what the agents need."""
        rows, items, labels = uploads.flat()
        users = clients[rows]
        c = clients.numel()
        before = self.predict(users, items)
        bce_before = F.binary_cross_entropy(before.clamp(1e-7, 1 - 1e-7), labels, reduction="none")
        volume = torch.bincount(rows, minlength=c).float()
        mean = torch.zeros(c, device=self.device).index_add_(0, rows, labels) / volume.clamp(min=1)
        var = torch.zeros(c, device=self.device).index_add_(0, rows, (labels - mean[rows]) ** 2) / volume.clamp(min=1)
        loss_mean = torch.zeros(c, device=self.device).index_add_(0, rows, bce_before) / volume.clamp(min=1)
        states = self.teacher.states(volume, mean, var, loss_mean)
        if self.config.teacher_weights == "agent":
            weights = self.teacher.weights(states)
        else:
            weights = torch.full((c,), 1.0 / c, device=self.device)
        # what the server now knows, for LightGCN's graph (latest label per pair)
        self.told[users, items] = labels
        self.refresh_graph()
        example_weight = weights[rows] * c  # uniform ω -> 1 per example
        n = labels.numel()
        total = 0.0
        for _ in range(self.config.server_epochs):
            order = torch.as_tensor(rng.permutation(n), device=self.device)
            for start in range(0, n, self.config.server_batch):
                idx = order[start:start + self.config.server_batch]
                logits = self.backbone.server_logits(self.params, users[idx], items[idx], self.graph)
                loss = (example_weight[idx] * F.binary_cross_entropy_with_logits(logits, labels[idx],
                                                                                  reduction="none")).mean()
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                total += float(loss.detach()) * idx.numel()
        after = self.predict(users, items)
        bce_after = F.binary_cross_entropy(after.clamp(1e-7, 1 - 1e-7), labels, reduction="none")
        loss_sum = torch.zeros(c, device=self.device).index_add_(0, rows, bce_after)  # L_i (Eq. 6)
        reward = zscore(-loss_sum)
        agent_loss = self.teacher.update(states, reward) if self.config.teacher_weights == "agent" else float("nan")
        # remember this round's uploads: V^s and item frequencies for next round's states
        self.last_items = torch.unique(items)
        self.last_frequency = torch.bincount(items, minlength=self.backbone.num_items).float()
        self.last_clients = float(c)
        entropy = float(-(weights * weights.clamp(min=1e-12).log()).sum())
        return {"rows": rows, "items": items, "labels": labels, "before": before, "reward": reward,
                "server_loss": total / max(n * self.config.server_epochs, 1), "teacher_entropy": entropy,
                "teacher_loss": agent_loss, "weights": weights,
                "teacher_state": {"volume": volume, "label_mean": mean, "label_var": var, "server_bce": loss_mean}}

    def learn_transfer(self, episode, sent_items: torch.Tensor, round_info, c: int) -> Dict[str, float]:
        """Eqs. 8, 9, 11, 12 for the clients that walked a sequence this round."""
        with torch.no_grad():
            _, item_emb = self.backbone.server_embeddings(self.params, self.graph)
            rows = round_info["rows"]
            volume = torch.bincount(rows, minlength=c).float().clamp(min=1)
            uploaded_mean = torch.zeros(c, item_emb.shape[1], device=self.device).index_add_(
                0, rows, item_emb[round_info["items"]]) / volume[:, None]
            sent_mask = (sent_items >= 0).float()
            sent_count = sent_mask.sum(1)
            sent_mean = (item_emb[sent_items.clamp(min=0)] * sent_mask[..., None]).sum(1) / sent_count.clamp(min=1)[:, None]
            diversity = diversity_reward(uploaded_mean, sent_mean, sent_count > 0)
            width = int(torch.bincount(rows, minlength=c).max())
            position = torch.arange(rows.numel(), device=self.device) - torch.searchsorted(rows, rows)
            client_labels = torch.zeros(c, width, device=self.device)
            server_pred = torch.zeros(c, width, device=self.device)
            mask = torch.zeros(c, width, device=self.device)
            client_labels[rows, position] = round_info["labels"]
            server_pred[rows, position] = round_info["before"]
            mask[rows, position] = 1.0
            divergence = divergence_reward(client_labels, server_pred, mask)
            episode_reward = self.transfer.episode_reward(round_info["reward"], diversity, divergence)
        return self.transfer.update(episode["states"], episode["actions"], episode["valid"], episode_reward)


class FedKDRecSession:
    """Algorithm 1 one step at a time: the loop of :func:`train_fedkdrec`, opened up for a lesson.

    One round is ``begin_round`` → ``send`` (§3.3) → ``train_clients`` (Eq. 3) → ``upload``
    (§3.1, Eq. 4) → ``train_server`` (Eqs. 5–7, 10) → ``learn`` (Eqs. 8, 9, 11, 12);
    :meth:`step_round` runs them in that order. After each step, the attribute it names holds
    what it produced (``clients``, ``sent``/``sent_labels``/``episode``, ``data``/``local``,
    ``uploads``, ``info``, ``run.history[-1]``), so a lesson can show every stage of a round.

    Args:
        split: the leave-one-out split (``split.train`` is what the clients hold).
        config: the run's settings (ablation flags included).
        item_init: ``(I, d)`` initial item embeddings for the server and every client.
        ledger: a :class:`~fedlib.engine.communication.CommunicationLedger` for the bytes of
            the predictions each client receives and sends.
        executor: ``"batched"`` or ``"sequential"`` local training.
    """

    def __init__(self, split: InteractionSplit, config: FedKDRecConfig, *, item_init: Optional[torch.Tensor] = None,
                 ledger=None, executor: str = "batched", device=None):
        if executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
        self.device = device = torch.device(device) if device is not None else default_device()
        self.split, self.config, self.ledger = split, config, ledger
        train = split.train
        self.backbone = backbone = Backbone(config.backbone, split.num_users, split.num_items, config.dim,
                                            config.hidden)
        init = backbone.init_server(torch.Generator().manual_seed(int(config.seed)), item_init, device=device)
        self.server = _Server(backbone, init, config, device)
        everyone = torch.arange(split.num_users, device=device)
        self.clients_state = backbone.client_copies({n: v.detach() for n, v in init.items()}, everyone)
        own_all = torch.zeros(split.num_users, split.num_items, device=device)
        own_all[torch.as_tensor(train.users, device=device), torch.as_tensor(train.items, device=device)] = 1.0
        self.sampler = NegativeSampler(train, split.num_items)
        self.train_sizes = torch.as_tensor(train.counts(), device=device)
        self.candidates = train.active_users()
        self.per_round = max(1, int(round(config.client_fraction * self.candidates.size)))
        self.run = FedKDRecRun(config=config, backbone=backbone, server=self.server.params, best_server={}, graph=None,
                               best_graph=None, clients=self.clients_state, own_all=own_all)
        self.local_train = train_clients_batched if executor == "batched" else train_clients_sequential
        self.round_index = 0

    def _stream(self, stream: int) -> np.random.Generator:
        return round_generator(self.config.seed, self.round_index, stream)

    def begin_round(self) -> np.ndarray:
        """Step 1: sample ``C = client_fraction`` of the clients; returns their ids ``(C,)``, sorted."""
        self.round_index += 1
        self._started = time.perf_counter()
        self.clients = np.sort(self._stream(_SELECT).choice(self.candidates, self.per_round, replace=False))
        return self.clients

    def send(self):
        """Step 2 (§3.3): the items ``(C, S)`` (-1 = none) the server sends each client, and their soft labels."""
        clients_t = torch.as_tensor(self.clients, device=self.device)
        actor_gen = torch.Generator().manual_seed(int(self._stream(_ACTOR).integers(2 ** 62)))
        self.sent, self.sent_labels, self.episode = self.server.select(clients_t, self.train_sizes[clients_t],
                                                                       actor_gen)
        return self.sent, self.sent_labels

    def train_clients(self) -> float:
        """Step 3 (Eq. 3): each client trains its whole model on ``D_i ∪ D̃_i``; returns the mean BCE."""
        config, split = self.config, self.split
        self.data = local_examples(split.train, self.clients, split.num_items, self.sampler, config.num_negatives,
                                   self._stream(_NEGATIVES), self.sent.cpu().numpy(), self.sent_labels.cpu().numpy(),
                                   device=self.device)
        self.local = gather_local(self.backbone, self.clients_state, self.data)
        orders = _epoch_orders(self.data, config.client_epochs, self._stream(_SHUFFLE))
        self.client_loss = self.local_train(self.backbone, self.local, self.data, orders, config.client_batch,
                                            config.client_lr, config.weight_decay)
        scatter_local(self.backbone, self.clients_state, self.local, self.data)
        return self.client_loss

    def upload(self) -> Uploads:
        """Step 4 (§3.1, Eq. 4): each client samples, mixes and swaps its labels; returns the uploads."""
        self.predictions = local_predictions(self.backbone, self.local, self.data)  # (C, L) r̂
        self.uploads = prepare_uploads(self.data, self.predictions, self.config, self._stream(_UPLOAD))
        return self.uploads

    def train_server(self) -> Dict[str, Any]:
        """Step 5 (Eqs. 5–7, 10): teacher weights ``ω``, the server's epochs, the agent's update."""
        data_clients = torch.as_tensor(self.data.clients, device=self.device)
        self.info = self.server.train(self.uploads, data_clients, self._stream(_SERVER))
        return self.info

    def learn(self) -> Dict[str, Any]:
        """Step 6 (Eqs. 8, 9, 11, 12): the actor–critic learns from the round; returns the round's record."""
        agent = {}
        if self.episode is not None:
            # the episode rows follow ``clients``; the rewards follow ``data.clients``
            order = torch.as_tensor(np.searchsorted(self.clients, self.data.clients), device=self.device)
            reordered = {k: v[order] for k, v in self.episode.items()}
            agent = self.server.learn_transfer(reordered, self.sent[order], self.info, len(self.clients))
        sent_count = (self.sent >= 0).sum(1)
        uploads, t = self.uploads, self.round_index
        uploaded = uploads.keep.sum(1)
        if self.ledger is not None:
            self.ledger.download(t, self.clients, "predictions",
                                 (sent_count.cpu().numpy() * BYTES_PER_PREDICTION).astype(np.int64), per_client=False)
            self.ledger.upload(t, self.data.clients, "predictions",
                               (uploaded.cpu().numpy() * BYTES_PER_PREDICTION).astype(np.int64), per_client=False)
        private_kept = uploads.keep & uploads.private
        revealed = ((uploads.labels > 0.5) == (uploads.hard == 1)) & private_kept
        record = {
            "round": t, "server_loss": self.info["server_loss"], "client_loss": self.client_loss,
            "sent_per_client": float(sent_count.float().mean()), "uploaded_per_client": float(uploaded.float().mean()),
            "teacher_entropy": self.info["teacher_entropy"], "teacher_loss": self.info["teacher_loss"],
            "label_revealed": float(revealed.sum() / private_kept.sum().clamp(min=1)),
            "seconds": time.perf_counter() - self._started, **agent,
        }
        self.run.history.append(record)
        return record

    def step_round(self) -> Dict[str, Any]:
        """One whole round of Algorithm 1 (steps 1–6); returns the round's record."""
        self.begin_round()
        self.send()
        self.train_clients()
        self.upload()
        self.train_server()
        return self.learn()

    def evaluate(self, evaluate: Callable[[int, "ServerScorer"], Any]) -> float:
        """Score the current server model (``evaluate(round, scorer) -> value or (value, dict)``);
        keeps the best-validation server (earliest best wins). Returns the validation value."""
        out = evaluate(self.round_index, ServerScorer(self.backbone, self.server.params, self.server.graph))
        value, extra = (out if isinstance(out, tuple) else (out, {}))
        run = self.run
        run.curve.append({"round": self.round_index, "valid": float(value), **extra})
        if value > run.best_valid:
            run.best_valid, run.best_round = float(value), self.round_index
            run.best_server = {n: v.detach().clone() for n, v in self.server.params.items()}
            run.best_graph = self.server.graph
        return float(value)

    def finish(self) -> FedKDRecRun:
        """The finished run (the last server stands in when nothing was evaluated)."""
        run = self.run
        if not run.best_server:
            run.best_server = {n: v.detach().clone() for n, v in self.server.params.items()}
            run.best_graph, run.best_round = self.server.graph, self.round_index
        run.graph = self.server.graph
        return run


def train_fedkdrec(split: InteractionSplit, config: FedKDRecConfig, *, item_init: Optional[torch.Tensor] = None,
                   evaluate: Optional[Callable[[int, ScoreFn], Any]] = None, ledger=None,
                   progress: Optional[Callable[[int], None]] = None, executor: str = "batched",
                   device=None) -> FedKDRecRun:
    """Algorithm 1: train FedKDRec (or a variant) on ``split.train`` (a :class:`FedKDRecSession` loop).

    Args:
        item_init: ``(I, d)`` initial item embeddings for the server and every client.
        evaluate: ``evaluate(round, scorer) -> float or (float, dict)``: the validation value
            (higher is better) of the server model (a :class:`ServerScorer`); called every
            ``eval_every`` rounds and at the end; the best-validation server is kept.
        ledger: a :class:`~fedlib.engine.communication.CommunicationLedger` for the bytes of
            the predictions each client receives and sends.
        executor: ``"batched"`` or ``"sequential"`` local training.
    """
    session = FedKDRecSession(split, config, item_init=item_init, ledger=ledger, executor=executor, device=device)
    for t in range(1, config.rounds + 1):
        session.step_round()
        if evaluate is not None and (t % config.eval_every == 0 or t == config.rounds):
            session.evaluate(evaluate)
        if progress is not None:
            progress(t)
    return session.finish()
