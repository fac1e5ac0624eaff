"""FedKDRec's settings and its client side: what a client holds, trains and uploads (§3.1).

Reference: "Federated Recommendation with Reinforcement Learning based Knowledge
Distillation" (FedKDRec, anonymous ICLR 2026 submission), §3.1, Eqs. 3–4, App. D.3.

* :class:`FedKDRecConfig` (App. D.3 defaults) and :data:`VARIANTS` (the ablations of
  Tables 2 and 4 as config overrides; ``"-m-c~s"`` is PTF-FedRec). They come first because
  both sides read them: the clients here, the server and the rounds in :mod:`.method`.
* :class:`LocalData` and :func:`local_examples`: a round's clients' private data ``D_i``
  (train positives + fresh negatives) and the server's soft labels ``D̃_i``, padded to one
  ``(C, L)`` block; :func:`gather_local` / :func:`scatter_local` move the clients' whole
  models in and out of the stacked tables.
* Local training (Eq. 3, BCE): the two executors, :func:`train_clients_batched` (stacked
  tensors, masked functional Adam) and :func:`train_clients_sequential` (one
  ``torch.optim.Adam`` per client); they give the same numbers (tested).
* The upload (§3.1, Eq. 4): :func:`local_predictions`, then :func:`prepare_uploads` samples
  ``β ~ U[β_lo, β_hi]`` of ``V_i ∪ Ṽ_i``, mixes ``r̄ = α r + (1 − α) r̂`` and swaps the top-λ
  labels; :class:`Uploads` is what reaches the server.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import Pairs
from fedlib.engine.method import masked_adam_step
from fedlib.models.stacked import Backbone
from fedlib.papers.fedkdrec.agents import TEACHER_FEATURES, TRANSFER_REWARDS

__all__ = [
    "FedKDRecConfig", "VARIANTS", "variant_config", "LocalData", "Uploads", "local_examples", "gather_local",
    "scatter_local", "epoch_orders", "train_clients_batched", "train_clients_sequential", "local_predictions",
    "prepare_uploads", "mixed_label_bce",
]

TRANSFER_MODES = ("agent", "confidence", "none")
TEACHER_MODES = ("agent", "uniform")


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


def epoch_orders(data: LocalData, epochs: int, rng: np.random.Generator) -> List[torch.Tensor]:
    """Each epoch's per-client shuffle ``(C, L)``: real examples first, in random order."""
    mask = data.mask.cpu().numpy() > 0
    orders = []
    for _ in range(epochs):
        keys = rng.random(mask.shape)
        keys[~mask] = np.inf
        orders.append(torch.as_tensor(np.argsort(keys, axis=1, kind="stable"), device=data.items.device))
    return orders


def _flat_views(flat: torch.Tensor, shapes: Mapping[str, tuple]) -> Dict[str, torch.Tensor]:
    """Named views of a flat ``(k, F)`` parameter block: ``name -> (k, *shapes[name])``, in order."""
    sizes = [math.prod(shape) for shape in shapes.values()]
    return {n: part.view(flat.shape[0], *shape) for (n, shape), part in zip(shapes.items(), flat.split(sizes, 1))}


def train_clients_batched(backbone: Backbone, params: Dict[str, torch.Tensor], data: LocalData,
                          orders: Sequence[torch.Tensor], batch: int, lr: float, weight_decay: float,
                          group_size: int = 24) -> float:
    """Local training of all ``C`` clients at once (fresh Adam per client); returns the mean loss.

    Client sizes are heavy-tailed (ML-100K: 20 to 700 ratings), so the clients (already sorted
    by size) are trained in groups of ``group_size``, each padded only to its own largest
    member: the work follows the data instead of the biggest client. Inside a group, the
    clients still training at a step are a prefix.

    A group's parameters (its clients' local item rows ``(g, width, d)``, user vectors and
    towers) are copied into one flat ``(g, F)`` block for the group's steps and back at the end,
    so that one :func:`~fedlib.engine.method.masked_adam_step` updates every tensor of a step
    (NeuMF has 12; one call per tensor cost about 0.36 ms for each small tensor, 3.6 ms a batch).
    Every client steps all its tensors together, so one step count per client serves them all
    and each element gets the same Adam arithmetic as with one call per tensor.
    """
    _, item_names = backbone.embedding_names
    rows_per_client = data.row_mask.sum(1).long()
    total, seen = 0.0, 0
    for a in range(0, len(data.clients), group_size):
        b = min(a + group_size, len(data.clients))
        width, length = int(rows_per_client[a:b].max()), int(data.counts[a])
        group = {n: (v[a:b, :width] if n in item_names else v[a:b]) for n, v in params.items()}  # views
        shapes = {n: tuple(v.shape[1:]) for n, v in group.items()}
        flat = torch.cat([v.reshape(b - a, -1) for v in group.values()], dim=1)  # (g, F) copy
        own = data.own[a:b, :width]
        counts = torch.as_tensor(data.counts[a:b])
        exp_avg, exp_avg_sq = torch.zeros_like(flat), torch.zeros_like(flat)
        steps = torch.zeros(b - a, dtype=torch.int64, device=data.items.device)
        stepping = torch.ones(b - a, dtype=torch.bool, device=data.items.device)
        for order in orders:
            order = order[a:b, :length]
            for start in range(0, length, batch):
                k = int((counts > start).sum())  # clients with a batch here: a prefix (sorted by size)
                idx = order[:k, start:start + batch]  # (k, B)
                rows = data.rows[a:a + k].gather(1, idx)
                labels = data.labels[a:a + k].gather(1, idx)
                mask = data.mask[a:a + k].gather(1, idx)
                leaf = flat[:k].detach().requires_grad_()  # (k, F)
                loss = _client_loss(backbone, _flat_views(leaf, shapes), rows, labels, mask, own[:k])
                (grad,) = torch.autograd.grad(loss, [leaf])
                # the prefix steps; the rest is done
                masked_adam_step(flat[:k], grad, exp_avg[:k], exp_avg_sq[:k], steps[:k], stepping[:k],
                                 lr=lr, weight_decay=weight_decay)
                total += float(loss.detach())
                seen += k
        with torch.no_grad():
            for n, trained in _flat_views(flat, shapes).items():
                group[n].copy_(trained)
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
