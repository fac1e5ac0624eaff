r"""FedPerGNN: a federated graph-attention recommender on privately expanded local graphs.

Reference:
    Wu, Wu, Lyu, Qi, Huang, Xie. "A federated graph neural network framework for
    privacy-preserving personalization." Nature Communications 13:3091, 2022 (FedPerGNN; the
    preprint arXiv:2102.04925 calls it FedGNN). A parameter-transfer baseline of FedKDRec's Table 1.

Notation: ``U`` users, ``I`` items, ``d`` dimensions, ``H`` heads, ``C`` clients of a round. Client
``u`` keeps its embedding ``e_u`` private; the item table ``E (I, d)`` and the GNN
``θ = (W¹, a¹_src, a¹_dst, W², a²_src, a²_dst)`` (``Wˡ (H, d, d)``, ``aˡ (H, d)``) are public::

    N(i)       ≤ n users v ≠ u who interacted with i, matched by the third party    graph expansion
    GAT(x; Y)  = x + 1/H Σ_h W_h (α_h0 x + Σ_j α_hj y_j)                 one attention layer (residual)
                 α_h = softmax over {x} ∪ Y of LeakyReLU_0.2(a_h,dst·W_h x + a_h,src·W_h y)
    h_i        = GAT¹(E_i; {ẽ_v : v ∈ N(i)})        item nodes (ẽ_v: v's last upload to the third party)
    h_u        = GAT²(e_u; {h_i : i ∈ items(u)})     user node: user–item–user information
    z_j        = GAT¹(E_j; ∅) = (I + W̄¹) E_j,  W̄¹ = 1/H Σ_h W¹_h              every scored item
    ŷ_uj       = σ(h_u · z_j) = σ(q_u · E_j),  q_u = (I + W̄¹)ᵀ h_u

One round: the server samples ``C`` clients; the third party gives each the embeddings of up to ``n`` anonymous
neighbours per interacted item; each client trains local copies of ``e_u``, the rows of ``E`` it touches and ``θ`` with
Adam for ``local_epochs`` epochs and uploads ``Δ = local − downloaded`` for those rows, ``M`` pseudo rows and ``θ``
through local differential privacy (clip to ``δ``, add ``Laplace(0, λ)``); the server averages and adds them.

Simplifications and choices (vs the paper):

1. **Objective.** Implicit-feedback ranking: BCE on every training positive plus ``num_negatives`` uniform negatives
   per positive (:class:`~fedlib.data.sampling.NegativeSampler`, excluding only the client's training positives),
   not the paper's rating MSE.
2. **Scored items.** Every scored item (positive, negative, evaluation candidate) is its embedding through layer 1
   with no neighbours (``z_j``); the expanded item nodes enter through ``h_u`` only. Negatives and candidates are
   never in the local graph, so scoring positives with their in-graph embedding would make training and evaluation
   score items differently (the authors' code also scores the target item from its embedding alone).
3. **Architecture.** Two attention levels (item nodes, then the user node): a 2-layer GAT kept to the nodes ``h_u``
   depends on. The client is not a neighbour of its items at level 1 (it is the centre of level 2); a neighbour
   sharing two items appears once per item. Each layer adds its input back (residual; the authors' code likewise
   concatenates a node's own embedding with its aggregate), which keeps ``e_u`` at full weight for users with many
   items and avoids a long initial plateau. No nonlinearity, dropout or extra dense layers.
4. **Graph expansion in plaintext.** The paper matches homomorphically encrypted item ids at a third party; equal
   ciphertexts pair the same users as equal ids, so the encryption changes no number and the ids are matched
   directly. Neighbours per item are capped at ``neighbors_per_item`` and drawn uniformly without replacement from
   a generator seeded by ``(seed, round)``. The third party keeps the embeddings last uploaded: selected clients
   upload ``e_u`` after local training, so its copy equals the user table at every round boundary and neighbour
   embeddings lag one round.
5. **Update rule.** Clients run local Adam (β = 0.9, 0.999, coupled weight decay, fresh moments each round) and
   upload parameter deltas, not gradients. The server adds (learning rate 1) the mean GNN delta over the ``C``
   clients and, per item row, the mean over the clients that sent that row (real or pseudo: it cannot tell).
   Dividing a row by ``C`` instead would shrink an item's step by the share of clients holding it.
6. **LDP.** Each item row's delta and the GNN delta (all of ``θ`` as one vector) are clipped to L2 norm ``≤ δ`` and
   get i.i.d. ``Laplace(0, λ)`` per coordinate. No ε is claimed.
7. **Pseudo items.** Each client adds ``M`` rows (fewer if fewer items are left) for items it neither interacted
   with nor touched this round, drawn without replacement, with deltas ``N(μ, diag σ²)`` (``μ, σ``: per-dimension
   mean and std of its real row deltas; the paper matches the full covariance), clipped and noised like real rows,
   so no uploaded row is all zero. The server averages them in like real rows, as in the paper.

Defaults: ``δ = 0.1`` (the authors' code's clipping constant), ``λ = 0.001``, ``M = 100``; the rest are FedKDRec's
settings for every baseline. Randomness: round plan (clients, negatives, batch order) from
:func:`~fedlib.engine.plan.round_generator` ``(seed, t)``, expansion from stream 2, each client's pseudo items and
noise from :func:`~fedlib.engine.plan.client_noise_generator` ``(round_noise_key(seed, t), u)``: both executors draw
identical numbers.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import InteractionSplit, Pairs
from fedlib.device import default_device
from fedlib.engine.algorithm import RoundContext, RoundReport
from fedlib.engine.communication import CommunicationLedger
from fedlib.engine.plan import RoundPlan, client_noise_generator, make_round_plan, round_generator, round_noise_key
from fedlib.engine.privacy import laplace_noise_like
from fedlib.engine.trainer import RunResult, Schedule
from fedlib.engine.trainer import train as train_rounds
from fedlib.models.base import normal_, uniform_

__all__ = ["FedPerGNNConfig", "FedPerGNNState", "FedPerGNN", "train_fedpergnn", "selected_tensors", "score_users",
           "curve_rows", "ThirdParty", "gat_layer", "clip_rows", "client_noise", "client_upload", "ClientNoise",
           "GNN_NAMES", "EXECUTORS"]

GNN_NAMES = ("w1", "a1_src", "a1_dst", "w2", "a2_src", "a2_dst")
EXECUTORS = ("batched", "sequential")
_EXPANSION_STREAM, _EVAL_STREAM = 2, 3  # round_generator streams (0 is the round plan)
_BETAS, _ADAM_EPS = (0.9, 0.999), 1e-8


@dataclass(frozen=True)
class FedPerGNNConfig:
    """Settings (FedKDRec's shared baseline settings as defaults; ``clip``/``laplace_scale`` = δ/λ).

    ``clip`` may be ``inf`` (no clipping); ``laplace_scale = 0`` adds no noise; ``pseudo_items``
    is ``M`` per client and round; ``neighbors_per_item = 0`` switches the expansion off.
    """

    dim: int = 32
    rounds: int = 200
    client_fraction: float = 0.1
    local_epochs: int = 2
    batch_size: int = 256
    lr: float = 0.01
    weight_decay: float = 0.0
    num_negatives: int = 4
    neighbors_per_item: int = 10
    gat_heads: int = 1
    clip: float = 0.1
    laplace_scale: float = 0.001
    pseudo_items: int = 100
    eval_every: int = 10
    seed: int = 0

    def __post_init__(self):
        for name, low in (("dim", 1), ("rounds", 1), ("local_epochs", 1), ("batch_size", 1), ("gat_heads", 1),
                          ("eval_every", 1), ("num_negatives", 0), ("neighbors_per_item", 0), ("pseudo_items", 0),
                          ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if not 0.0 < float(self.client_fraction) <= 1.0:
            raise ValueError(f"client_fraction must be in (0, 1] (share of users per round), "
                             f"got {self.client_fraction!r}")
        if not math.isfinite(float(self.lr)) or self.lr <= 0:
            raise ValueError(f"lr must be a finite number > 0, got {self.lr!r}")
        if not math.isfinite(float(self.weight_decay)) or self.weight_decay < 0:
            raise ValueError(f"weight_decay must be a finite number >= 0, got {self.weight_decay!r}")
        if math.isnan(float(self.clip)) or self.clip <= 0:
            raise ValueError(f"clip (δ, an L2 bound) must be > 0; use float('inf') for no clipping, got {self.clip!r}")
        if not math.isfinite(float(self.laplace_scale)) or self.laplace_scale < 0:
            raise ValueError(f"laplace_scale (λ) must be a finite number >= 0 (0 = no noise), "
                             f"got {self.laplace_scale!r}")


# ------------------------------------------------------------------------------ third party
class ThirdParty:
    """The third-party server of the graph expansion (plaintext simulation, module note 4).

    Args:
        train: training interactions (the items each client registers).
        num_items: size of the item id space.
    """

    def __init__(self, train: Pairs, num_items: int):
        order = np.argsort(train.items, kind="stable")
        self.item_users = train.users[order]  # (n,) users grouped by item
        self.entry_item = train.items[order]  # (n,) item of each entry
        self.item_indptr = np.concatenate([[0], np.cumsum(np.bincount(train.items, minlength=num_items))])

    def neighbours(self, users: np.ndarray, items: np.ndarray, cap: int, rng: np.random.Generator) -> np.ndarray:
        """``(P, cap) int64``: for pair ``p``, up to ``cap`` users ``≠ users[p]`` who interacted with
        ``items[p]``, uniform without replacement; ``-1`` pads. The draws do not depend on the pairs."""
        users, items = np.asarray(users, np.int64), np.asarray(items, np.int64)
        out = np.full((users.size, cap), -1, dtype=np.int64)
        if cap == 0 or users.size == 0 or self.item_users.size == 0:
            return out
        # One random permutation of every item's user list; a pair takes the first `cap` users that
        # are not the client itself (hence cap + 1 candidates).
        perm = self.item_users[np.lexsort((rng.random(self.item_users.size), self.entry_item))]
        start, count = self.item_indptr[items], self.item_indptr[items + 1] - self.item_indptr[items]
        offset = np.arange(cap + 1)
        ids = perm[np.minimum(start[:, None] + offset, perm.size - 1)]  # (P, cap + 1)
        valid = (offset < count[:, None]) & (ids != users[:, None])
        rank = np.cumsum(valid, axis=1) - 1
        keep = valid & (rank < cap)
        out[np.nonzero(keep)[0], rank[keep]] = ids[keep]
        return out


class _Graphs(NamedTuple):
    """Local graphs of ``C`` clients as (client, item) pairs in CSR order (``P`` pairs)."""

    pair_client: np.ndarray  # (P,) position of the owner in [0, C)
    pair_slot: np.ndarray  # (P,) index of the item in its owner's list
    pair_item: np.ndarray  # (P,) item id
    neighbours: np.ndarray  # (P, n) user ids, -1 = none
    counts: np.ndarray  # (C,) interacted items per client


def _local_graphs(train: Pairs, clients: np.ndarray, third: ThirdParty, cap: int, rng) -> _Graphs:
    indptr = train.indptr
    counts = indptr[clients + 1] - indptr[clients]
    pair_client = np.repeat(np.arange(clients.size), counts)
    pair_slot = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    pair_item = train.items[indptr[clients][pair_client] + pair_slot]
    return _Graphs(pair_client, pair_slot, pair_item, third.neighbours(clients[pair_client], pair_item, cap, rng),
                   counts)


# ------------------------------------------------------------------------------ graph attention
def _attend(centre, nbrs, mask, src, dst):
    """Attention of a centre over itself and its neighbours, aggregated in input space.

    ``centre (..., d)``, ``nbrs (..., N, d)``, ``mask (..., N)`` bool, ``src``/``dst (..., H, d)`` the
    projected attention vectors ``W_hᵀ a_h``. Returns ``agg (..., H, d) = Σ_j α_hj y_j`` (``y_0`` the
    centre) and ``alpha (..., H, 1 + N)``. Aggregating before ``W`` (linear) avoids an ``N``-times
    larger matrix product.
    """
    c = centre.unsqueeze(-2)  # (..., 1, d)
    to_dst = (c * dst).sum(-1, keepdim=True)  # (..., H, 1)
    logits = torch.cat([(c * src).sum(-1, keepdim=True), src @ nbrs.transpose(-1, -2)], -1) + to_dst
    keep = torch.cat([mask.new_ones(mask.shape[:-1] + (1,)), mask], -1).unsqueeze(-2)  # self always kept
    alpha = F.leaky_relu(logits, 0.2).masked_fill(~keep, float("-inf")).softmax(-1)  # (..., H, 1 + N)
    return alpha[..., :1] * c + alpha[..., 1:] @ nbrs, alpha


def _project(weight, att):
    """``(..., H, d_out, d_in)``, ``(..., H, d_out)`` → ``W_hᵀ a_h`` ``(..., H, d_in)``."""
    return (att.unsqueeze(-2) @ weight).squeeze(-2)


def _transform(agg, weight):
    """``agg (B, K, H, d)`` through ``weight (B, H, d, d)``, mean over heads → ``(B, K, d)``."""
    return torch.matmul(agg.transpose(1, 2), weight.transpose(-1, -2)).mean(1)


def gat_layer(centre, nbrs, mask, weight, att_src, att_dst):
    """One graph-attention layer with a self loop, for ``B`` graphs (each with its own parameters).

    Args:
        centre: ``(B, K, d)`` node features; nbrs: ``(B, K, N, d)`` their neighbours' features;
        mask: ``(B, K, N)`` bool, True for real neighbours; weight: ``(B, H, d, d)``;
        att_src, att_dst: ``(B, H, d)``.

    Returns:
        ``out (B, K, d) = x + 1/H Σ_h W_h Σ_j α_hj y_j`` and ``alpha (B, K, H, 1 + N)`` (column 0 =
        self; rows sum to 1; masked entries 0). A node without neighbours gets ``x + 1/H Σ_h W_h x``.
    """
    agg, alpha = _attend(centre, nbrs, mask, _project(weight, att_src)[:, None], _project(weight, att_dst)[:, None])
    return centre + _transform(agg, weight), alpha


def _query(gnn, user, pair_emb, nbr_emb, nbr_mask, pair_client, pair_slot, kmax: int):
    """``q_c = (I + W̄¹)ᵀ h_u`` ``(C, d)`` of ``C`` clients, so that ``ŷ_cj = σ(q_c · E_j)``.

    gnn: ``(C, ...)`` per-client copies (or expanded views); user ``(C, d)``; pair_emb ``(P, d)`` item
    rows of the pairs; nbr_emb ``(P, N, d)``, nbr_mask ``(P, N)``; pair_client/pair_slot ``(P,)``.
    """
    num, heads, dim = user.shape[0], gnn["w1"].shape[1], user.shape[1]
    src, dst = _project(gnn["w1"], gnn["a1_src"]), _project(gnn["w1"], gnn["a1_dst"])  # (C, H, d)
    agg, _ = _attend(pair_emb, nbr_emb, nbr_mask, src[pair_client], dst[pair_client])  # (P, H, d): no padding
    padded = agg.new_zeros(num, kmax, heads, dim).index_put((pair_client, pair_slot), agg)  # (C, K, H, d)
    kmask = torch.zeros(num, kmax, dtype=torch.bool, device=user.device).index_put(
        (pair_client, pair_slot), torch.ones_like(pair_slot, dtype=torch.bool))
    rows = pair_emb.new_zeros(num, kmax, dim).index_put((pair_client, pair_slot), pair_emb)  # (C, K, d)
    h_items = rows + _transform(padded, gnn["w1"])  # (C, K, d), with the residual
    h_user, _ = gat_layer(user[:, None], h_items[:, None], kmask[:, None], gnn["w2"], gnn["a2_src"], gnn["a2_dst"])
    return h_user[:, 0] + torch.einsum("choi,co->ci", gnn["w1"], h_user[:, 0]) / heads


# ------------------------------------------------------------------------------ LDP and uploads
def clip_rows(x: torch.Tensor, bound: float) -> torch.Tensor:
    """Each row of ``x (n, ...)`` scaled to L2 norm ``≤ bound`` (``inf`` returns the values unchanged)."""
    norms = x.reshape(x.shape[0], -1).norm(dim=1).clamp_min(1e-12)
    return x * (bound / norms).clamp(max=1.0).reshape((-1,) + (1,) * (x.dim() - 1))


class ClientNoise(NamedTuple):
    """One client's random draws of one round (CPU): see :func:`client_noise`."""

    perm: torch.Tensor  # (I,) order in which candidate pseudo items are tried
    gaussian: torch.Tensor  # (M, d) standard normals of the pseudo rows
    rows: torch.Tensor  # (R + m, d) Laplace noise of the real rows (item order), then the pseudo rows
    gnn: torch.Tensor  # (G,) Laplace noise of the GNN delta


def client_noise(noise_key: int, client_id: int, *, num_items: int, num_real: int, pseudo_items: int, dim: int,
                 gnn_size: int, scale: float) -> ClientNoise:
    """Draws of client ``client_id``, a function of ``(noise_key, client_id)`` and the sizes only."""
    gen = client_noise_generator(noise_key, client_id)
    perm = torch.randperm(num_items, generator=gen)
    gaussian = torch.randn(pseudo_items, dim, generator=gen)
    sent = num_real + max(0, min(pseudo_items, num_items - num_real))
    return ClientNoise(perm, gaussian, laplace_noise_like(torch.empty(sent, dim), scale, gen),
                       laplace_noise_like(torch.empty(gnn_size), scale, gen))


def client_upload(real_items, real_deltas, gnn_delta, noise: ClientNoise, *, num_items: int, pseudo_items: int,
                  clip: float):
    """One client's privatised upload (module notes 6 and 7).

    Args:
        real_items: ``(R,)`` sorted ids of the rows it trained; real_deltas: ``(R, d)`` their deltas;
        gnn_delta: ``(G,)`` flattened GNN delta; noise: :func:`client_noise` with ``num_real = R``.

    Returns:
        ``items (R + m,)`` sorted (real and pseudo mixed), ``rows (R + m, d)``, ``gnn (G,)``, with
        ``m = min(M, I − R)``.
    """
    dev = real_deltas.device
    m = max(0, min(pseudo_items, num_items - real_items.numel()))
    pseudo = noise.perm[~torch.isin(noise.perm, real_items.cpu())][:m].to(dev)
    if real_items.numel():
        mu, sigma = real_deltas.mean(0), real_deltas.var(0, unbiased=False).sqrt()
    else:
        mu = sigma = real_deltas.new_zeros(real_deltas.shape[1])
    rows = torch.cat([real_deltas, mu + sigma * noise.gaussian[:m].to(dev)])
    rows = clip_rows(rows, clip) + noise.rows.to(dev)
    items = torch.cat([real_items, pseudo])
    order = torch.argsort(items)  # sorted ids: the position reveals nothing
    return items[order], rows[order], clip_rows(gnn_delta[None], clip)[0] + noise.gnn.to(dev)


def _server_mean(item_sum, item_count, gnn_sum, num_clients: int):
    """The server's step: each item row averaged over the clients that sent it (real or pseudo, it cannot
    tell), the GNN over all ``C`` clients. Returns ``((I, d), (G,))``."""
    return item_sum / item_count.clamp(min=1)[:, None].to(item_sum.dtype), gnn_sum / num_clients


def _upload_batched(cfg, clients, noise_key, row_client, row_item, row_delta, gnn_delta, num_items):
    """:func:`client_upload` of all clients at once, then :func:`_server_mean`; also returns the rows sent ``(C,)``."""
    num, dim, dev = gnn_delta.shape[0], row_delta.shape[1], row_delta.device
    n_real = np.bincount(row_client.cpu().numpy(), minlength=num)
    m = np.clip(num_items - n_real, 0, cfg.pseudo_items)
    # Per-client generators: the only per-client loop (draws on the CPU, a few small tensors each).
    draws = [client_noise(noise_key, int(u), num_items=num_items, num_real=int(n), pseudo_items=cfg.pseudo_items,
                          dim=dim, gnn_size=gnn_delta.shape[1], scale=cfg.laplace_scale)
             for u, n in zip(clients, n_real)]
    perm = torch.stack([d.perm for d in draws]).to(dev)  # (C, I)
    gaussian = torch.stack([d.gaussian for d in draws]).to(dev)  # (C, M, d)
    lap = torch.cat([d.rows[:n] for d, n in zip(draws, n_real)] + [d.rows[n:] for d, n in zip(draws, n_real)]).to(dev)
    count = torch.as_tensor(n_real, device=dev).clamp(min=1)[:, None].to(row_delta.dtype)
    mu = row_delta.new_zeros(num, dim).index_add(0, row_client, row_delta) / count  # (C, d)
    sigma = (row_delta.new_zeros(num, dim).index_add(0, row_client, (row_delta - mu[row_client]) ** 2) / count).sqrt()
    touched = torch.zeros(num, num_items, dtype=torch.bool, device=dev).index_put((row_client, row_item),
                                                                                   torch.tensor(True, device=dev))
    free = ~touched.gather(1, perm)
    rank = free.cumsum(1)  # 1-based rank among the free items, in the client's permutation order
    pc, pos = torch.nonzero(free & (rank <= torch.as_tensor(m, device=dev)[:, None]), as_tuple=True)
    pseudo_rows = mu[pc] + sigma[pc] * gaussian[pc, rank[pc, pos] - 1]
    rows = clip_rows(torch.cat([row_delta, pseudo_rows]), cfg.clip) + lap
    sent = torch.cat([row_item, perm[pc, pos]])
    item_sum = row_delta.new_zeros(num_items, dim).index_add_(0, sent, rows)
    gnn = clip_rows(gnn_delta, cfg.clip) + torch.stack([d.gnn for d in draws]).to(dev)
    return _server_mean(item_sum, torch.bincount(sent, minlength=num_items), gnn.sum(0), num), n_real + m


# ------------------------------------------------------------------------------ local training
def _adam(params, grads, moments, step: int, cfg) -> None:
    """One in-place Adam step (coupled weight decay); every client stepping has taken ``step`` steps."""
    (b1, b2), t = _BETAS, step + 1
    with torch.no_grad():
        for p, g, (m, v) in zip(params, grads, moments):
            g = g + cfg.weight_decay * p if cfg.weight_decay else g
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            p.sub_(cfg.lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + _ADAM_EPS))


def _client_bce(logits, labels, owner, num: int):
    """``(C,)`` mean BCE of each client's examples in this step (0 for clients without any)."""
    losses = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    counts = torch.bincount(owner, minlength=num).clamp(min=1).to(logits.dtype)
    return logits.new_zeros(num).index_add(0, owner, losses) / counts


def _round_batched(cfg, plan: RoundPlan, graphs: _Graphs, state, nbr_emb, nbr_mask, noise_key):
    """All clients stacked: ``(C, ...)`` GNN copies and a ragged ``(R, d)`` table of their touched rows.

    ``plan`` lists clients by decreasing number of local steps, so the clients with an ``s``-th
    batch are a prefix ``[0, a_s)``; step ``s`` trains views of that prefix only (rows and pairs
    are sorted by client, so theirs are prefixes too). Memory: neighbour embeddings ``(P, n, d)``
    (``P = Σ_c K_c`` pairs), rows ``(R, d)`` plus two Adam moments, the padded item level
    ``(C, K_max, H, d)`` and the pseudo-item selection ``(C, I)``.
    """
    item, dev, num, num_items = state["item"], state["item"].device, plan.num_clients, state["item"].shape[0]
    row_client_np, row_item_np = plan.touched_rows(num_items)  # (R,) sorted by client, then item
    keys = row_client_np * num_items + row_item_np
    as_t = lambda x: torch.as_tensor(x, device=dev)  # noqa: E731
    row_client, row_item = as_t(row_client_np), as_t(row_item_np)
    ex_client = as_t(plan.example_positions())  # (E,)
    ex_row = as_t(np.searchsorted(keys, plan.example_positions() * num_items + plan.items))  # (E,)
    pc, ps = as_t(graphs.pair_client), as_t(graphs.pair_slot)
    pair_row = as_t(np.searchsorted(keys, graphs.pair_client * num_items + graphs.pair_item))  # (P,)
    row_end = np.cumsum(np.bincount(row_client_np, minlength=num))  # rows of clients [0, a): row_end[a - 1]
    pair_end = np.cumsum(graphs.counts)
    labels = as_t(plan.labels).to(item.dtype)
    local = {"user": state["user"][as_t(plan.clients)].clone(), "rows": item[row_item].clone()}
    local.update({n: state[n].expand(num, *state[n].shape).clone() for n in GNN_NAMES})
    moments = {n: (torch.zeros_like(p), torch.zeros_like(p)) for n, p in local.items()}
    by_step = np.argsort(plan.steps, kind="stable")
    bounds = np.searchsorted(plan.steps[by_step], np.arange(int(plan.num_steps.max()) + 1))
    losses = item.new_zeros(num)
    for s in range(int(plan.num_steps.max())):
        a = int((plan.num_steps > s).sum())  # clients [0, a) have an s-th batch
        size = {n: int(row_end[a - 1]) if n == "rows" else a for n in local}
        views = {n: local[n][:size[n]].detach().requires_grad_(True) for n in local}  # leaves sharing storage
        ex, pairs = as_t(by_step[bounds[s]:bounds[s + 1]]), slice(0, int(pair_end[a - 1]))
        q = _query(views, views["user"], views["rows"][pair_row[pairs]], nbr_emb[pairs], nbr_mask[pairs],
                   pc[pairs], ps[pairs], max(1, int(graphs.counts[:a].max())))
        logits = (views["rows"][ex_row[ex]] * q[ex_client[ex]]).sum(-1)
        per_client = _client_bce(logits, labels[ex], ex_client[ex], a)
        params = list(views.values())
        grads = torch.autograd.grad(per_client.sum(), params)  # client c gets the gradient of its own loss
        losses[:a] += per_client.detach()
        _adam(params, grads, [(m[:size[n]], v[:size[n]]) for n, (m, v) in moments.items()], s, cfg)
    with torch.no_grad():
        gnn_delta = torch.cat([(local[n] - state[n]).reshape(num, -1) for n in GNN_NAMES], 1)  # (C, G)
        sums = _upload_batched(cfg, plan.clients, noise_key, row_client, row_item, local["rows"] - item[row_item],
                               gnn_delta, num_items)
    return sums + (local["user"], losses / as_t(plan.num_steps))


def _round_sequential(cfg, plan: RoundPlan, graphs: _Graphs, state, nbr_emb, nbr_mask, noise_key):
    """Reference path: one client at a time, its own local graph, no padding."""
    item, dev, num_items = state["item"], state["item"].device, state["item"].shape[0]
    item_sum, gnn_sum = torch.zeros_like(item), item.new_zeros(sum(state[n].numel() for n in GNN_NAMES))
    item_count = torch.zeros(num_items, dtype=torch.int64, device=dev)
    users, losses, sent = [], [], []
    for c, u in enumerate(plan.clients):
        part = plan.client_examples(c)
        real = np.unique(plan.items[part])  # sorted rows this client trains
        ex_row = torch.as_tensor(np.searchsorted(real, plan.items[part]), device=dev)
        labels, steps = torch.as_tensor(plan.labels[part], device=dev).to(item.dtype), plan.steps[part]
        mine = torch.as_tensor(np.flatnonzero(graphs.pair_client == c), device=dev)
        pair_row = torch.as_tensor(np.searchsorted(real, graphs.pair_item[graphs.pair_client == c]), device=dev)
        real_t = torch.as_tensor(real, device=dev)
        local = {"user": state["user"][int(u)].clone(), "rows": item[real_t].clone()}
        local.update({n: state[n].clone() for n in GNN_NAMES})
        params = [p.requires_grad_(True) for p in local.values()]
        moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
        total = 0.0
        for s in range(int(plan.num_steps[c])):
            g = {n: local[n][None] for n in GNN_NAMES}
            h_items, _ = gat_layer(local["rows"][pair_row][None], nbr_emb[mine][None], nbr_mask[mine][None],
                                   g["w1"], g["a1_src"], g["a1_dst"])  # (1, K, d)
            h_user, _ = gat_layer(local["user"][None, None], h_items[:, None],
                                  torch.ones(1, 1, mine.numel(), dtype=torch.bool, device=dev),
                                  g["w2"], g["a2_src"], g["a2_dst"])  # (1, 1, d)
            q = h_user[0, 0] + local["w1"].mean(0).T @ h_user[0, 0]  # (d,)
            batch = torch.as_tensor(np.flatnonzero(steps == s), device=dev)
            loss = F.binary_cross_entropy_with_logits(local["rows"][ex_row[batch]] @ q, labels[batch])
            grads = torch.autograd.grad(loss, params)
            total += loss.item()
            _adam(params, grads, moments, s, cfg)
        with torch.no_grad():
            gnn_delta = torch.cat([(local[n] - state[n]).reshape(-1) for n in GNN_NAMES])
            noise = client_noise(noise_key, int(u), num_items=num_items, num_real=real.size,
                                 pseudo_items=cfg.pseudo_items, dim=item.shape[1], gnn_size=gnn_delta.numel(),
                                 scale=cfg.laplace_scale)
            items, rows, gnn = client_upload(real_t, local["rows"] - item[real_t], gnn_delta, noise,
                                             num_items=num_items, pseudo_items=cfg.pseudo_items, clip=cfg.clip)
            item_sum.index_add_(0, items, rows)
            item_count.index_add_(0, items, torch.ones_like(items))
            gnn_sum += gnn
        users.append(local["user"].detach())
        losses.append(total / int(plan.num_steps[c]))
        sent.append(items.numel())
    update = _server_mean(item_sum, item_count, gnn_sum, plan.num_clients)
    return update, np.asarray(sent), torch.stack(users), torch.tensor(losses, device=dev)


# ------------------------------------------------------------------------------ run
def _init_state(num_users, num_items, cfg, device) -> Dict[str, torch.Tensor]:
    gen, dtype, d, h = torch.Generator().manual_seed(int(cfg.seed)), torch.float32, cfg.dim, cfg.gat_heads
    glorot_w, glorot_a = math.sqrt(6.0 / (2 * d)), math.sqrt(6.0 / (2 * d + 1))  # GAT's Glorot init
    state = {"item": normal_((num_items, d), 0.1, gen, dtype, device),
             "user": normal_((num_users, d), 0.1, gen, dtype, device)}
    for layer in ("1", "2"):
        state["w" + layer] = uniform_((h, d, d), glorot_w, gen, dtype, device)
        state[f"a{layer}_src"] = uniform_((h, d), glorot_a, gen, dtype, device)
        state[f"a{layer}_dst"] = uniform_((h, d), glorot_a, gen, dtype, device)
    return state


def _score(state, train: Pairs, third: ThirdParty, cfg, users: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """``(n, I)`` logits ``q_u · E_j``; neighbours from a fixed generator (same scores on every call)."""
    dev, ids = state["item"].device, users.detach().to("cpu", torch.int64).numpy()
    out = []
    with torch.no_grad():
        for start in range(0, ids.size, chunk):
            us = ids[start:start + chunk]
            g = _local_graphs(train, us, third, cfg.neighbors_per_item, round_generator(cfg.seed, 0, _EVAL_STREAM))
            nbr, pair_client, pair_slot, us_t, pair_item = (torch.as_tensor(x, device=dev) for x in (
                g.neighbours, g.pair_client, g.pair_slot, us, g.pair_item))
            mask = nbr >= 0
            views = {n: state[n].expand(us.size, *state[n].shape) for n in GNN_NAMES}  # shared parameters, no copy
            nbr_emb = state["user"][nbr.clamp(min=0)] * mask[..., None]  # (P, n, d)
            q = _query(views, state["user"][us_t], state["item"][pair_item], nbr_emb, mask, pair_client, pair_slot,
                       max(1, int(g.counts.max(initial=0))))
            out.append(q @ state["item"].T)
    return torch.cat(out) if out else state["item"].new_zeros(0, state["item"].shape[0])


@dataclass
class FedPerGNNState:
    """The server's view of a FedPerGNN run after ``round_index`` rounds.

    Attributes:
        round_index: completed rounds.
        tensors: ``item (I, d)`` public item table, ``user (U, d)`` every client's private
            embedding (also the third party's copy: module note 4) and the public GNN tensors
            (:data:`GNN_NAMES`).
    """

    round_index: int
    tensors: Dict[str, torch.Tensor]


class RoundGraphs(NamedTuple):
    """One round's plan: the clients' examples and batch order, and their expanded local graphs."""

    plan: RoundPlan
    graphs: _Graphs


class FedPerGNN:
    """FedPerGNN as an :class:`~fedlib.engine.algorithm.Algorithm` (the module docstring's round).

    Args:
        split: the leave-one-out split (``split.train`` is what the clients hold).
        config: the settings. executor: ``"batched"`` or ``"sequential"`` (same numbers).
        evaluate: ``evaluate(round, score_fn) -> float`` (higher is better), ``score_fn(users (n,))
            -> (n, I)``; what :meth:`evaluate` reports as ``valid`` (and ``score``: the same with
            NaN read as ``-inf``, the value the trainer selects on).
    """

    def __init__(self, split: InteractionSplit, config: FedPerGNNConfig, *, executor: str = "batched",
                 evaluate: Optional[Callable] = None, device=None):
        if executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
        if not isinstance(config, FedPerGNNConfig):
            raise TypeError(f"config must be a FedPerGNNConfig, got {type(config).__name__}")
        candidates = split.train.active_users()
        if candidates.size == 0:
            raise ValueError("split.train has no interactions: nothing to train on")
        self.split, self.config, self.callback = split, config, evaluate
        self.device = torch.device(device) if device is not None else default_device()
        self.third = ThirdParty(split.train, split.num_items)
        self.sampler = NegativeSampler(split.train, split.num_items)  # excludes the client's training positives only
        self.per_round = max(1, int(round(config.client_fraction * candidates.size)))
        self.local_round = _round_batched if executor == "batched" else _round_sequential

    def init(self, seed: int) -> FedPerGNNState:
        return FedPerGNNState(0, _init_state(self.split.num_users, self.split.num_items,
                                             dataclasses.replace(self.config, seed=int(seed)), self.device))

    def copy_state(self, state: FedPerGNNState) -> FedPerGNNState:
        return FedPerGNNState(state.round_index, {k: v.clone() for k, v in state.tensors.items()})

    def state_dict(self, state: FedPerGNNState) -> Dict[str, Any]:
        return {"round_index": state.round_index, "tensors": state.tensors}

    def load_state(self, saved: Mapping[str, Any]) -> FedPerGNNState:
        return FedPerGNNState(int(saved["round_index"]), {k: v.to(self.device) for k, v in saved["tensors"].items()})

    def plan_round(self, state: FedPerGNNState, context: RoundContext) -> RoundGraphs:
        """Clients, negatives and batch order from ``context.rng``; the expansion from stream 2 of round ``t``."""
        cfg, t = self.config, context.index
        plan = make_round_plan(self.split.train, self.sampler, context.rng, round_index=t,
                               num_negatives=cfg.num_negatives, batch_size=cfg.batch_size,
                               local_epochs=cfg.local_epochs, clients_per_round=self.per_round)
        plan = plan.subset(np.argsort(-plan.num_steps, kind="stable"))  # most local steps first (batched prefix)
        graphs = _local_graphs(self.split.train, plan.clients, self.third, cfg.neighbors_per_item,
                               round_generator(context.seed, t, _EXPANSION_STREAM))
        return RoundGraphs(plan, graphs)

    def run_round(self, state: FedPerGNNState, plan: RoundGraphs, context: RoundContext
                  ) -> Tuple[FedPerGNNState, RoundReport]:
        """Local training on the expanded graphs, LDP uploads, the server's mean update (in place)."""
        tensors, (round_plan, graphs) = state.tensors, plan
        nbr = torch.as_tensor(graphs.neighbours, device=tensors["item"].device)  # (P, n)
        nbr_mask = nbr >= 0
        nbr_emb = tensors["user"][nbr.clamp(min=0)] * nbr_mask[..., None]  # the third party's copy, before the round
        (item_step, gnn_step), sent, users, losses = self.local_round(
            self.config, round_plan, graphs, tensors, nbr_emb, nbr_mask, round_noise_key(context.seed, context.index))
        with torch.no_grad():
            tensors["item"] += item_step
            offset = 0
            for n in GNN_NAMES:
                tensors[n] += gnn_step[offset:offset + tensors[n].numel()].view_as(tensors[n])
                offset += tensors[n].numel()
            tensors["user"][torch.as_tensor(round_plan.clients, device=tensors["user"].device)] = users  # third party too
        if context.ledger is not None:
            _record(context.ledger, context.index + 1, round_plan.clients, graphs, tensors, sent, self.config.dim)
        state.round_index = context.index + 1
        return state, RoundReport(train_loss=float(losses.mean()))

    def score_fn(self, state: FedPerGNNState) -> Callable[[torch.Tensor], torch.Tensor]:
        """``users (n,) -> (n, I)`` logits of ``state`` (fixed evaluation neighbours)."""
        return lambda users: _score(state.tensors, self.split.train, self.third, self.config, users)

    def evaluate(self, state: FedPerGNNState, split: str) -> Dict[str, float]:
        if self.callback is None:
            raise ValueError("FedPerGNN was built without evaluate=; pass one or train with evaluate=False")
        if split != "valid":
            raise ValueError(f"FedPerGNN's evaluate callback scores validation only, got split {split!r}")
        value = float(self.callback(state.round_index, self.score_fn(state)))
        return {"valid": value, "score": -math.inf if math.isnan(value) else value}


def _schedule(config: FedPerGNNConfig, keep_best_state: bool) -> Schedule:
    """Evaluate every ``eval_every`` rounds and after the last; select the highest validation
    value (``score``: NaN read as ``-inf``), the first on ties; no patience, no test set."""
    return Schedule(rounds=config.rounds, eval_every=config.eval_every, selection_metric="score",
                    test_at_end=False, keep_best_state=keep_best_state)


def train_fedpergnn(split: InteractionSplit, config: FedPerGNNConfig, *, evaluate: Optional[Callable] = None,
                    ledger: Optional[CommunicationLedger] = None, progress: Optional[Callable] = None,
                    executor: str = "batched", checkpointer=None) -> RunResult[FedPerGNNState]:
    """Train FedPerGNN on ``split.train`` with the trainer (see the module docstring).

    Args:
        evaluate: ``evaluate(round, score_fn) -> float`` (higher is better), ``score_fn(users (n,)) -> (n, I)``;
            called every ``eval_every`` rounds and after the last; the best state is kept (the first best
            on ties; the final state when ``evaluate`` is None). ledger: records every selected client's traffic.
        progress: ``progress(round)`` after every round (rounds are 1-based).
        executor: ``"batched"`` (all clients stacked) or ``"sequential"`` (one client at a time).
        checkpointer: a :class:`~fedlib.engine.checkpoint.Checkpointer`; a run resumed from it equals the
            uninterrupted one (the evaluate callback's own records aside).

    Returns:
        The trainer's :class:`~fedlib.engine.trainer.RunResult`: ``state`` (the last
        :class:`FedPerGNNState`), ``best_state`` (a copy at the best validation value, with ``evaluate``),
        ``history`` (one row per round: ``round``, ``train_loss`` = the mean local BCE of the round's
        clients, and ``valid/valid``, ``valid/score`` when evaluated), ``method`` (``"FedPerGNN"``) and
        ``artifacts``: ``config`` and ``algorithm`` (the :class:`FedPerGNN`, whose :meth:`~FedPerGNN.score_fn`
        scores a state). Read it with :func:`selected_tensors`, :func:`score_users` and :func:`curve_rows`.

    Raises:
        ValueError: unknown executor, or no training interactions. TypeError: ``config`` of another type.
    """
    algorithm = FedPerGNN(split, config, executor=executor, evaluate=evaluate)
    run = train_rounds(algorithm, _schedule(config, keep_best_state=evaluate is not None), seed=config.seed,
                       ledger=ledger, evaluate=evaluate is not None,
                       on_round_end=None if progress is None else (lambda run, record: progress(record["round"])),
                       checkpointer=checkpointer,
                       checkpoint_config=None if checkpointer is None else dataclasses.asdict(config))
    run.method, run.artifacts = "FedPerGNN", {"config": config, "algorithm": algorithm}
    return run


# The finished run: plain functions of train_fedpergnn's RunResult.
def _algorithm(run: RunResult) -> FedPerGNN:
    if not isinstance(run.artifacts.get("algorithm"), FedPerGNN):
        raise ValueError("run.artifacts has no FedPerGNN 'algorithm': pass the RunResult of train_fedpergnn")
    return run.artifacts["algorithm"]


def selected_tensors(run: RunResult) -> Dict[str, torch.Tensor]:
    """The selected parameters (``item (I, d)``, ``user (U, d)``, the GNN tensors): the best-validation
    state when an evaluation scored above ``-inf``, else the last one (no ``evaluate``, or only NaN)."""
    found = run.best_state is not None and run.best_score is not None and run.best_score > -math.inf
    return (run.best_state if found else run.state).tensors


def score_users(run: RunResult, users) -> torch.Tensor:
    """``(n, I)`` logits of every item for ``users (n,)`` under :func:`selected_tensors` (fixed
    evaluation neighbours: the same scores on every call)."""
    return _algorithm(run).score_fn(FedPerGNNState(run.round_index, selected_tensors(run)))(
        torch.as_tensor(users, dtype=torch.int64))


def curve_rows(run: RunResult) -> List[Dict[str, float]]:
    """One ``{"round", "valid", "loss"}`` per scheduled evaluation (``loss``: that round's mean local
    BCE; ``valid``: NaN when the run had no ``evaluate``)."""
    schedule = _schedule(_algorithm(run).config, keep_best_state=False)
    return [{"round": row["round"], "valid": row.get("valid/valid", math.nan), "loss": row["train_loss"]}
            for row in run.history if schedule.evaluates_after(row["round"])]


def _record(ledger, r, clients, graphs: _Graphs, state, sent, dim) -> None:
    """Bytes of one round per selected client: the whole item table and the GNN down, the neighbour
    embeddings from the third party; item ids (8 bytes each, a stand-in for ciphertexts) and ``e_u`` to the
    third party, the privatised rows (``d`` floats + an 8-byte index each) and the GNN up."""
    f = state["item"].element_size()
    gnn_bytes = sum(state[n].numel() for n in GNN_NAMES) * f
    valid = np.bincount(graphs.pair_client, weights=(graphs.neighbours >= 0).sum(1), minlength=clients.size)
    ledger.download(r, clients, "item_table", state["item"])
    ledger.download(r, clients, "gnn", gnn_bytes)
    ledger.download(r, clients, "neighbour_embeddings", valid.astype(np.int64) * dim * f, per_client=False)
    ledger.upload(r, clients, "item_ids_to_third_party", graphs.counts.astype(np.int64) * 8, per_client=False)
    ledger.upload(r, clients, "user_embedding_to_third_party", dim * f)
    ledger.upload(r, clients, "item_rows", np.asarray(sent, np.int64) * (dim * f + 8), per_client=False)
    ledger.upload(r, clients, "gnn", gnn_bytes)
