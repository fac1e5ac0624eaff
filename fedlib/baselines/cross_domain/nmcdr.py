r"""NMCDR: neural node matching between users, within and across domains (centralised baseline).

Reference:
    Wujiang Xu, Shaoshuai Li, Mingming Ha, Xiaobo Guo, Qiongxu Ma, Xiaolei Liu, Linxun Chen,
    Zhenfeng Zhu. "Neural Node Matching for Multi-Target Cross Domain Recommendation."
    ICDE 2023. arXiv:2302.05919. Public code ``WujiangXu/NMCDR`` (``model_matching.py``,
    ``train_matching.py``). FedPCL-CDR (arXiv:2409.03294, Table 2) runs it as a centralised
    baseline: "a neural node matching framework that conducts intra-knowledge and
    inter-knowledge fusion".

**The mechanism that defines it: intra-to-inter node matching.** Every user, overlapping or
not, is matched against a *fully connected* user-user graph: first against users of its own
domain (intra node matching: sparse users borrow from similar users, with separate channels for
head and tail users), then against users of the other domain plus its own counterpart there
(inter node matching). An intra node complementing step then attends over items the user may
never have interacted with. Every stage is supervised by its own prediction loss.

Notation: two domains ``a`` and ``b`` (``b`` = the other one); ``N`` global users (the ``n_o``
shared ones once, then each domain's own users), one embedding ``e_u`` per global user;
``d`` dimensions; ``S_a`` the sampled candidate users of domain ``a``, ``T_a`` the sampled
candidate items; ``att(q, K) = softmax_k(q·k/√d)`` (self excluded)::

    x_u^a     = P_a e_u                                    domain view of the shared user    (1)
    h1_u^a    = ReLU(h_u^a + W_l mean_{i ∈ N_a(u)} v_i^a)   graph encoder, L1 layers           (2)
    α_uv      = att(h_u^a, {h_v^a : v ∈ S_a \ {u}})         intra node matching                (3)
    m_head    = Σ_{v head} α_uv h_v^a,  m_tail = Σ_{v tail} α_uv h_v^a
    g         = σ(G1 W_h m_head + G2 W_t m_tail)
    h2_u^a    = ReLU(h_u^a + g ⊙ W_h m_head + (1 − g) ⊙ W_t m_tail)       L2 layers          (4)
    β_uv      = att(h_u^a, {h_v^b : v ∈ S_b \ {u}})         inter node matching                (5)
    m_match   = W_m Σ_v β_uv h_v^b,  m_self = W_s h_u^b     (h_u^b: the user's counterpart)
    h3_u^a    = ReLU(h_u^a + g' ⊙ m_match + (1 − g') ⊙ m_self),  g' = σ(G1' m_match + G2' m_self)  L3 (6)
    γ_ui      = att(h_u^a, {v_i^a : i ∈ T_a})               intra node complementing           (7)
    h4_u^a    = ReLU(h_u^a + W_c Σ_i γ_ui v_i^a)                                   L4 layers  (8)
    z_u^a     = h4_u^a F_a + h4_u^b (I − F_a)               domain fusion                      (9)
    ŷ_ui^a    = MLP([z_u^a ; v_i^a])                         2d → 32 → 1                       (10)
    L         = BCE(ŷ) + λ Σ_{k=1..3} BCE(MLP_k([h_k^a ; v_i^a]))   stage (matching) losses   (11)

A user's representation in a domain where it has no interactions (the counterpart of a
non-overlapping user) is still defined: its shared embedding through that domain's view ``P``,
enriched by matching with that domain's users (Eqs. 3–4). That is how non-overlapping users
receive transfer: through matched users, while overlapping users also read their real
counterpart (Eq. 6), exactly as in the code (one shared user table with two domain views).

**Candidate sampling (our batched form of the fully connected graphs).** The code matches the
users of a mini-batch against each other. Here, at every training step, ``S_a`` is a fresh
uniform sample (without replacement) of ``num_user_candidates`` users *with training data in
domain a*, and ``T_a`` a uniform sample of ``num_item_candidates`` items of domain ``a``; the
batch's users, ``S_a`` and ``S_b`` form the node set, and all of them are updated layer by layer
(so candidates carry their own matched representations into the next layer). Evaluation uses one
fixed sample per domain drawn from the seed, so the scores are a deterministic function of the
parameters and do not depend on how the candidates are chunked. Head users (the code's "long"
users) have at least ``head_min_interactions`` training interactions in the domain (code: 7).

Readings we chose (the paper and the code disagree or are silent):

* Attention weights are a softmax of scaled dot products. The code L1-normalises raw dot
  products (``F.normalize(p=1)``), which gives negative "weights" for negative similarities.
* The gate of Eq. 4 fuses the *aggregated* head and tail messages; the code gates each
  candidate's transformed message and then averages (a ``(B, B, d)`` tensor).
* Eq. 9 uses ``I − F`` with ``F`` initialised to ``I/2`` (the two domains averaged at start).
  The code writes ``1 − F`` (all-ones minus ``F``, entries drawn from ``U(0, 1)``), which sums
  every coordinate of the other domain into each output coordinate.
* Both directions of inter matching use the representations of the previous layer (the code
  updates domain ``a`` first and matches domain ``b`` against the updated ``a``).
* Stage losses on ``h1, h2, h3`` with weight λ = 1 (the code sums them with the final loss;
  its stage-0 loss is commented out). One predictor per stage, shared by the two domains.

Simplifications on this machine:

* The graph encoder aggregates a user's **whole** training history (a sparse mean) instead of
  the code's last ``seq_len`` items (20 or 150 padded ids, padding included in the mean).
* Default depths 2 / 2 / 2 / 1 (encoder / intra / inter / complement) instead of the code's
  3 / 3 / 4 / 2, 64 dimensions instead of 128 (the FedPCL-CDR setting), candidate sets of 256
  sampled users instead of the code's 512-row batches; one sampled negative per positive in
  training (as the code) and the protocol's 1 + 99 candidates at evaluation (the code: 1 + 199).
* Items have one table per domain (our item ids are per domain; the code uses one joint table).
* Exactly two domains (the paper is multi-target; its code handles two).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import DomainSplit
from fedlib.engine.algorithm import RoundContext, RoundReport
from fedlib.engine.trainer import RunResult
from fedlib.baselines.cross_domain.cdr_common import (CrossDomainConfig, CrossDomainAlgorithm, JointModelState, check_training_loop,
                                       Progress, RunSummary, train_with)

__all__ = [
    "NMCDRConfig", "matching_attention", "GateFusion", "IntraMatchingLayer", "InterMatchingLayer",
    "ComplementLayer", "NMCDRModel", "global_user_ids", "train_nmcdr",
]



@dataclass(frozen=True)
class NMCDRConfig(CrossDomainConfig):
    """Every setting of one NMCDR run.

    Attributes:
        dim: embedding size d (64, the FedPCL-CDR setting; code 128).
        encoder_layers, intra_layers, inter_layers, complement_layers: depths L1..L4 of
            Eqs. 2, 4, 6, 8 (2, 2, 2, 1; code 3, 3, 4, 2). 0 switches a stage off.
        num_user_candidates: users sampled per domain and step as matching candidates (256).
        num_item_candidates: items sampled per domain and step for complementing (256).
        head_min_interactions: training interactions that make a user a head user (7, code).
        hidden: predictor hidden width (32, code ``hid_dim``).
        stage_loss_weight: λ of Eq. 11 (1.0, code).
        lr, weight_decay: Adam (1e-3, 0).
        batch_size: training positives per step, drawn from both domains together (256),
            each with ``train_negatives`` uniform negatives (1).
        epochs: maximum passes over both domains' training positives (100).
        patience, eval_every, select_on: model selection (10, 1, ``"valid"``).
        seed: initialisation, batches, negatives and candidate samples.
    """

    encoder_layers: int = 2
    intra_layers: int = 2
    inter_layers: int = 2
    complement_layers: int = 1
    num_user_candidates: int = 256
    num_item_candidates: int = 256
    head_min_interactions: int = 7
    hidden: int = 32
    stage_loss_weight: float = 1.0
    weight_decay: float = 0.0
    batch_size: int = 256
    train_negatives: int = 1
    epochs: int = 100

    def __post_init__(self):
        check_training_loop(self, ("num_user_candidates", "num_item_candidates", "hidden"))
        for name in ("encoder_layers", "intra_layers", "inter_layers", "complement_layers", "head_min_interactions"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"{name} must be >= 0 (0 switches the stage off), got {getattr(self, name)}")
        if not self.stage_loss_weight >= 0:
            raise ValueError(f"stage_loss_weight must be >= 0, got {self.stage_loss_weight}")


# --------------------------------------------------------------------------------------
# Matching blocks (Eqs. 3-8)
# --------------------------------------------------------------------------------------
def matching_attention(queries: torch.Tensor, keys: torch.Tensor,
                       exclude: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``softmax_k(q·k/√d)`` over candidates: ``(n, d)`` queries, ``(K, d)`` keys → ``(n, K)``.

    ``exclude`` (``(n, K) bool``) removes candidates (a user never matches itself). Each row sums
    to 1; a row whose candidates are all excluded is all zeros (no message).
    """
    scores = queries @ keys.T / math.sqrt(queries.shape[-1])  # (n, K)
    if exclude is not None:
        scores = scores.masked_fill(exclude, -math.inf)
    weights = torch.softmax(scores, dim=-1)
    # softmax of an all -inf row is NaN: such a user simply receives no message.
    return torch.nan_to_num(weights, nan=0.0)


def _self_mask(num_nodes: int, key_positions: torch.Tensor) -> torch.Tensor:
    """``(n, K) bool``: node ``i`` is candidate ``k`` (keys are positions in the node array)."""
    return torch.arange(num_nodes, device=key_positions.device).unsqueeze(1) == key_positions.unsqueeze(0)


class GateFusion(nn.Module):
    """``g = σ(G1 a + G2 b)``; returns ``g ⊙ a + (1 − g) ⊙ b`` (the code's ``GateFuseCell``)."""

    def __init__(self, dim: int):
        super().__init__()
        self.first, self.second = nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.first(a) + self.second(b))
        return gate * a + (1 - gate) * b


class IntraMatchingLayer(nn.Module):
    """Eqs. 3–4: every node reads similar candidate users of its own domain, head and tail apart."""

    def __init__(self, dim: int):
        super().__init__()
        self.head_proj, self.tail_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.gate = GateFusion(dim)

    def forward(self, nodes: torch.Tensor, key_positions: torch.Tensor, key_is_head: torch.Tensor) -> torch.Tensor:
        """``nodes (n, d)``, candidates = ``nodes[key_positions] (K,)``, ``key_is_head (K,) bool`` → ``(n, d)``."""
        keys = nodes[key_positions]  # (K, d)
        weights = matching_attention(nodes, keys, _self_mask(nodes.shape[0], key_positions))  # (n, K)
        head_weights = weights * key_is_head.to(weights.dtype)
        from_head, from_tail = head_weights @ keys, (weights - head_weights) @ keys  # (n, d) each
        return torch.relu(nodes + self.gate(self.head_proj(from_head), self.tail_proj(from_tail)))


class InterMatchingLayer(nn.Module):
    """Eqs. 5–6: a node reads matched users of the other domain and its own counterpart there."""

    def __init__(self, dim: int):
        super().__init__()
        self.match_proj, self.self_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.gate = GateFusion(dim)

    def forward(self, own: torch.Tensor, other: torch.Tensor, other_key_positions: torch.Tensor) -> torch.Tensor:
        """``own (n, d)`` this domain, ``other (n, d)`` the same nodes in the other domain → ``(n, d)``.

        The counterpart (row ``i`` of ``other``) is excluded from the matched candidates because
        it has its own path (``m_self``), as the code's zeroed diagonal.
        """
        keys = other[other_key_positions]  # (K, d)
        weights = matching_attention(own, keys, _self_mask(own.shape[0], other_key_positions))
        matched = self.match_proj(weights @ keys)
        counterpart = self.self_proj(other)
        return torch.relu(own + self.gate(matched, counterpart))


class ComplementLayer(nn.Module):
    """Eqs. 7–8: attention over sampled items of the domain, observed or not."""

    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """``users (n, d)``, candidate items ``(K, d)`` → ``(n, d)``."""
        return torch.relu(users + self.proj(matching_attention(users, items) @ items))


# --------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------
def global_user_ids(split: DomainSplit) -> Tuple[List[np.ndarray], int]:
    """Per domain, ``(U_d,) int64`` global id of every local user, and the number ``N`` of global users.

    Users ``0 .. n_o − 1`` keep their id; each domain's own users follow, domain after domain.
    """
    n_o, offset, out = split.num_overlap_users, split.num_overlap_users, []
    for name in split.domains:
        local = np.arange(split[name].num_users, dtype=np.int64)
        out.append(np.where(local < n_o, local, offset + local - n_o))
        offset += split[name].num_users - n_o
    return out, int(offset)


class NMCDRModel(nn.Module):
    """Shared user table, two domain views, the four stages and the predictors (Eqs. 1–10).

    Args:
        split: two domains; their training pairs are the graphs.
        config: sizes and depths.
        generator: initialisation randomness (tables ``N(0, 0.1²)``; ``nn.Linear`` layers are
            built under a forked global RNG seeded from it).
    """

    def __init__(self, split: DomainSplit, config: NMCDRConfig, generator: torch.Generator):
        super().__init__()
        if len(split.domains) != 2:
            raise ValueError(f"NMCDR needs exactly 2 domains, got {len(split.domains)}: {split.domains}")
        d = config.dim
        self.dim, self.domains = d, tuple(split.domains)
        global_ids, self.num_global_users = global_user_ids(split)
        self.num_items = [split[name].num_items for name in self.domains]
        for index, ids in enumerate(global_ids):
            self.register_buffer(f"global_of_{index}", torch.as_tensor(ids), persistent=False)
        members, heads = [], []
        for index, name in enumerate(self.domains):
            train = split[name].train
            users = global_ids[index][train.users]
            keys = np.unique(users * self.num_items[index] + train.items)  # duplicates count once
            rows, cols = keys // self.num_items[index], keys % self.num_items[index]
            degree = np.bincount(rows, minlength=self.num_global_users)
            values = torch.as_tensor(1.0 / degree[rows], dtype=torch.float32)
            mean_items = torch.sparse_coo_tensor(torch.as_tensor(np.stack([rows, cols])), values,
                                                 (self.num_global_users, self.num_items[index]),
                                                 check_invariants=False).coalesce()
            self.register_buffer(f"mean_items_{index}", mean_items, persistent=False)  # (N, I_d) row-normalised
            # (N + 1,) where each user's entries start in mean_items' (row-sorted) indices: a step reads
            # only the rows of its node set (history_of)
            self.register_buffer(f"history_rowptr_{index}", torch.as_tensor(
                np.concatenate([[0], np.cumsum(degree)]), dtype=torch.int64), persistent=False)
            self.register_buffer(f"is_head_{index}", torch.as_tensor(degree >= config.head_min_interactions),
                                 persistent=False)
            members.append(np.flatnonzero(degree > 0))
            heads.append(int((degree >= config.head_min_interactions).sum()))
        self.members = members  # per domain, global ids with training data (the candidate pools)
        self.head_counts = heads
        self.user_emb = nn.Parameter(_normal((self.num_global_users, d), generator))
        self.item_emb = nn.ParameterList([nn.Parameter(_normal((n, d), generator)) for n in self.num_items])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch.randint(0, 2 ** 31 - 1, (1,), generator=generator)))
            self.views = nn.ModuleList([nn.Linear(d, d) for _ in self.domains])
            def per_domain(make, depth: int) -> nn.ModuleList:  # [domain][layer]
                return nn.ModuleList([nn.ModuleList([make(d) for _ in range(depth)]) for _ in self.domains])

            self.encoder = per_domain(lambda width: nn.Linear(width, width), config.encoder_layers)
            self.intra = per_domain(IntraMatchingLayer, config.intra_layers)
            self.inter = per_domain(InterMatchingLayer, config.inter_layers)
            self.complement = per_domain(ComplementLayer, config.complement_layers)
            self.predictor = _mlp(2 * d, config.hidden)
            self.stage_predictors = nn.ModuleList([_mlp(2 * d, config.hidden) for _ in range(3)])
        self.fusion = nn.Parameter(0.5 * torch.eye(d).repeat(2, 1, 1))  # (2, d, d) F_a of Eq. 9

    def global_of(self, domain: int) -> torch.Tensor:
        """``(U_d,) int64`` global id of each local user of ``domain``."""
        return getattr(self, f"global_of_{domain}")

    def history_of(self, domain: int, nodes: torch.Tensor) -> torch.Tensor:
        """Eq. 2's history mean ``mean_{i ∈ N_a(u)} v_i^a`` of the nodes: ``(n,)`` sorted unique global ids → ``(n, d)``.

        Multiplies only the nodes' rows of the ``(N, I_d)`` row-normalised history matrix (a
        training step's node set is about a thousand of Elec-Cloth's 15,761 users): the forward
        and, above all, the backward product (the item table's gradient) shrink by ``N / n``.
        The rows keep their entries' order and the left-out rows only added exact zeros, so the
        result and the gradients are those of :meth:`history_reference` (the same bits in float32
        on CPU; tested to 1e-6 in float64).
        """
        mean_items, item_table = getattr(self, f"mean_items_{domain}"), self.item_emb[domain]
        if nodes.numel() == self.num_global_users:  # sorted and unique: every user, in order (evaluation)
            return torch.sparse.mm(mean_items, item_table)
        rowptr = getattr(self, f"history_rowptr_{domain}")
        starts = rowptr[nodes]  # (n,) first entry of each node's row
        counts = rowptr[nodes + 1] - starts  # (n,) the node's distinct training items
        row = torch.repeat_interleave(torch.arange(nodes.numel(), device=nodes.device), counts)  # (m,) node position
        first_of_row = torch.cumsum(counts, 0) - counts  # (n,) where each node's entries start among the m
        entries = starts[row] + torch.arange(row.numel(), device=nodes.device) - first_of_row[row]  # (m,)
        rows_of_nodes = torch.sparse_coo_tensor(torch.stack([row, mean_items.indices()[1, entries]]),
                                                mean_items.values()[entries], (nodes.numel(), item_table.shape[0]),
                                                is_coalesced=True, check_invariants=False)  # (n, I_d)
        return torch.sparse.mm(rows_of_nodes, item_table)

    def history_reference(self, domain: int, nodes: torch.Tensor) -> torch.Tensor:
        """:meth:`history_of` as first written: every user's history mean, then the nodes' rows ``(n, d)``."""
        return torch.sparse.mm(getattr(self, f"mean_items_{domain}"), self.item_emb[domain])[nodes]

    def represent(self, nodes: torch.Tensor, user_keys: Sequence[torch.Tensor],
                  item_keys: Sequence[torch.Tensor]) -> Dict[str, List[torch.Tensor]]:
        """Eqs. 1–9 for a node set.

        Args:
            nodes: ``(n,) int64`` global user ids (sorted, unique).
            user_keys: per domain ``(K_d,)`` *positions in* ``nodes`` of the candidate users.
            item_keys: per domain ``(T_d,)`` item ids of the candidate items.

        Returns:
            ``{"h1", "h2", "h3", "h4", "z"}`` → per domain ``(n, d)``; ``z`` is the fused
            representation that scores items (Eq. 10), the others feed the stage losses.
        """
        out: Dict[str, List[torch.Tensor]] = {}
        shared = self.user_emb[nodes]  # (n, d)
        h = []
        for a in range(2):
            x = self.views[a](shared)                                             # Eq. 1
            history = self.history_of(a, nodes)  # (n, d)
            for layer in self.encoder[a]:                                         # Eq. 2
                x = torch.relu(x + layer(history))
            h.append(x)
        out["h1"] = list(h)
        for a in range(2):                                                        # Eqs. 3-4
            key_is_head = getattr(self, f"is_head_{a}")[nodes[user_keys[a]]]
            for layer in self.intra[a]:
                h[a] = layer(h[a], user_keys[a], key_is_head)
        out["h2"] = list(h)
        for depth in range(len(self.inter[0])):                                  # Eqs. 5-6
            h = [self.inter[0][depth](h[0], h[1], user_keys[1]), self.inter[1][depth](h[1], h[0], user_keys[0])]
        out["h3"] = list(h)
        for a in range(2):                                                        # Eqs. 7-8
            items = self.item_emb[a][item_keys[a]]
            for layer in self.complement[a]:
                h[a] = layer(h[a], items)
        out["h4"] = list(h)
        eye = torch.eye(self.dim, device=shared.device, dtype=shared.dtype)
        out["z"] = [h[a] @ self.fusion[a] + h[1 - a] @ (eye - self.fusion[a]) for a in range(2)]  # Eq. 9
        return out

    @staticmethod
    def pair_logits(predictor: nn.Module, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """``(..., d)`` user and item vectors → ``(...)`` logits of ``predictor`` (Eq. 10)."""
        joined = torch.cat([users, items], dim=-1)
        return predictor(joined.reshape(-1, joined.shape[-1])).reshape(joined.shape[:-1])


def _normal(shape, generator: torch.Generator, std: float = 0.1) -> torch.Tensor:
    return torch.randn(shape, generator=generator) * std


def _mlp(width: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, 1))


# --------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------
def _sample(pool: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Uniform sample without replacement of ``min(size, len(pool))`` entries, sorted."""
    if size >= pool.size:
        return np.sort(pool)
    return np.sort(rng.choice(pool, size=size, replace=False))


def _candidates(model: NMCDRModel, config: NMCDRConfig, rng: np.random.Generator):
    users = [_sample(model.members[a], config.num_user_candidates, rng) for a in range(2)]
    items = [_sample(np.arange(model.num_items[a]), config.num_item_candidates, rng) for a in range(2)]
    return users, items


def _node_set(query_users: np.ndarray, candidate_users: Sequence[np.ndarray], device):
    """Sorted unique node ids and the positions of each domain's candidates among them."""
    nodes = np.unique(np.concatenate([query_users, *candidate_users]))
    keys = [torch.as_tensor(np.searchsorted(nodes, c), device=device) for c in candidate_users]
    return nodes, keys


class NMCDRAlgorithm(CrossDomainAlgorithm):
    """NMCDR as the trainer's algorithm: one round = one epoch over both domains' pairs, mixed."""

    def __init__(self, split: DomainSplit, config: NMCDRConfig, device, ks: Sequence[int]):
        self.split, self.config, self.seed, self.device, self.ks = split, config, int(config.seed), device, tuple(ks)
        self.samplers = [NegativeSampler(split[name].train, split[name].num_items) for name in split.domains]
        # Every training positive of both domains, tagged with its domain.
        self.row_domain = np.concatenate([np.full(len(split[name].train), a) for a, name in enumerate(split.domains)])
        self.row_user = np.concatenate([split[name].train.users for name in split.domains])
        self.row_item = np.concatenate([split[name].train.items for name in split.domains])

    def init(self, seed: int) -> JointModelState:
        """The model, its Adam, and the fixed evaluation candidates (drawn once, from their own generator)."""
        config, device = self.config, self.device
        rng = np.random.default_rng([config.seed, 5919])
        eval_rng = np.random.default_rng([config.seed, 5920])
        generator = torch.Generator().manual_seed(config.seed + 5919)
        model = NMCDRModel(self.split, config, generator).to(device)
        # fused: one pass per tensor instead of about ten; the same formula with its operations ordered
        # differently (within a float32 ulp per step of the per-tensor loop, 1e-12 in float64: tested)
        optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay, fused=True)
        self.global_ids = [model.global_of(a).cpu().numpy() for a in range(2)]
        self.eval_users, self.eval_items = _candidates(model, config, eval_rng)
        return JointModelState(model, optimizer, rng)

    def run_round(self, state: JointModelState, plan: int, context: RoundContext
                  ) -> Tuple[JointModelState, RoundReport]:
        config, device, model, rng = self.config, self.device, state.model, state.rng
        row_domain, row_user, row_item, global_ids = self.row_domain, self.row_user, self.row_item, self.global_ids
        model.train()
        totals, steps = {"loss": 0.0, "loss_final": 0.0, "loss_stages": 0.0}, 0
        order = rng.permutation(row_domain.size)
        for begin in range(0, order.size, config.batch_size):
            rows = order[begin: begin + config.batch_size]
            parts = []
            for a in range(2):
                mine = rows[row_domain[rows] == a]
                users = row_user[mine]
                negatives = self.samplers[a].sample(users, config.train_negatives, rng)  # (B_a, n)
                items = np.concatenate([row_item[mine], negatives.reshape(-1)])
                labels = np.concatenate([np.ones(mine.size), np.zeros(negatives.size)])
                parts.append((global_ids[a][np.concatenate([users, np.repeat(users, config.train_negatives)])],
                              items, labels))
            user_keys, item_keys = _candidates(model, config, rng)
            nodes, key_positions = _node_set(np.concatenate([p[0] for p in parts]), user_keys, device)
            reps = model.represent(torch.as_tensor(nodes, device=device), key_positions,
                                   [torch.as_tensor(t, device=device) for t in item_keys])
            loss_final, loss_stages, count = 0.0, 0.0, 0
            for a, (users, items, labels) in enumerate(parts):
                if users.size == 0:
                    continue
                at = torch.as_tensor(np.searchsorted(nodes, users), device=device)
                item_vectors = model.item_emb[a][torch.as_tensor(items, device=device)]
                y = torch.as_tensor(labels, dtype=torch.float32, device=device)
                # Sums over rows, divided once by the batch size below: both domains weigh by their rows.
                loss_final = loss_final + F.binary_cross_entropy_with_logits(
                    model.pair_logits(model.predictor, reps["z"][a][at], item_vectors), y, reduction="sum")
                for predictor, stage in zip(model.stage_predictors, ("h1", "h2", "h3")):
                    loss_stages = loss_stages + F.binary_cross_entropy_with_logits(
                        model.pair_logits(predictor, reps[stage][a][at], item_vectors), y, reduction="sum")
                count += users.size
            loss_final, loss_stages = loss_final / count, loss_stages / count
            loss = loss_final + config.stage_loss_weight * loss_stages
            state.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            state.optimizer.step()
            totals["loss"] += loss.item()
            totals["loss_final"] += loss_final.item()
            totals["loss_stages"] += loss_stages.item()
            steps += 1
        logged = {key: value / max(steps, 1) for key, value in totals.items()}
        return state, RoundReport(train_loss=logged["loss"], logged=logged)

    def scorers(self, state: JointModelState):
        scorers = _scorers(state.model, self.eval_users, self.eval_items, self.device)
        return dict(zip(self.split.domains, scorers))


def train_nmcdr(split: DomainSplit, config: NMCDRConfig = NMCDRConfig(), *, device=None,
                progress: Progress = None, ks: Sequence[int] = (5, 10), checkpointer=None,
                on_round_end=None) -> RunResult:
    """Train NMCDR on both domains at once and evaluate each domain on its candidates.

    ``split``: two domains, users ``0 .. n_o − 1`` shared; ``config``: :class:`NMCDRConfig`; the
    other arguments and the family's artifacts: :func:`~fedlib.baselines.cross_domain.cdr_common.train_with`.
    ``models``: the one joint model under every domain name; ``scalars``: ``epochs_run``,
    ``num_global_users``, ``num_parameters``; own artifacts: the ``global_user_ids`` and the fixed
    evaluation candidates (``eval_user_candidates``, ``eval_item_candidates``).
    """
    def summarise(algorithm: NMCDRAlgorithm, run: RunResult) -> RunSummary:
        model = run.state.model
        return RunSummary(scalars={"epochs_run": run.round_index, "num_global_users": model.num_global_users,
                                   "num_parameters": sum(p.numel() for p in model.parameters())},
                          models={name: model for name in split.domains},
                          artifacts={"global_user_ids": algorithm.global_ids,
                                     "eval_user_candidates": algorithm.eval_users,
                                     "eval_item_candidates": algorithm.eval_items})

    return train_with(lambda device: NMCDRAlgorithm(split, config, device, ks), config, method="NMCDR",
                      rounds=config.epochs, summarise=summarise, device=device, progress=progress,
                      checkpointer=checkpointer, on_round_end=on_round_end)


def _scorers(model: NMCDRModel, user_keys: Sequence[np.ndarray], item_keys: Sequence[np.ndarray], device):
    """One :data:`~fedlib.baselines.cross_domain.cdr_common.PairScorer` per domain (every user represented once)."""
    model.eval()
    with torch.no_grad():
        nodes = torch.arange(model.num_global_users, device=device)
        reps = model.represent(nodes, [torch.as_tensor(k, device=device) for k in user_keys],
                               [torch.as_tensor(t, device=device) for t in item_keys])

    def scorer_for(a: int):
        def score(users: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                z = reps["z"][a][model.global_of(a)[users.to(device)]]  # (n, d)
                u = z.unsqueeze(1).expand(-1, candidates.shape[1], -1)  # (n, C, d)
                return model.pair_logits(model.predictor, u, model.item_emb[a][candidates.to(device)])
        return score

    return [scorer_for(0), scorer_for(1)]
