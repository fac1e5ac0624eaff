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

Ablations are flags of :class:`~fedlib.papers.fedkdrec.clients.FedKDRecConfig`
(:data:`~fedlib.papers.fedkdrec.clients.VARIANTS`); PTF-FedRec is the paper's ``-m-c~s``
variant (its Table 1 and Table 2 rows are the same numbers).

This file holds the server (its model, the labels it was told and both agents of
:mod:`.agents`: steps 2, 5 and 6), the round as an
:class:`~fedlib.engine.algorithm.Algorithm` (:class:`FedKDRec`), the lesson's step-by-step
:class:`FedKDRecSession`, :func:`train_fedkdrec` (which returns the trainer's
:class:`~fedlib.engine.trainer.RunResult`) and the functions that read a finished run
(:func:`server_scorer`, :func:`curve_rows`); the client side (steps 3 and 4) and the settings
are in :mod:`.clients`.

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
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from fedlib.baselines.registry import register
from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import InteractionSplit, Pairs
from fedlib.device import default_device
from fedlib.engine.algorithm import RoundContext, RoundReport
from fedlib.engine.plan import round_generator
from fedlib.engine.trainer import RunResult, Schedule, start_run
from fedlib.engine.trainer import train as train_rounds
from fedlib.models.stacked import Backbone
from fedlib.papers.fedkdrec.agents import TeacherWeightAgent, TransferAgent, divergence_reward, diversity_reward, zscore
from fedlib.papers.fedkdrec.clients import (
    VARIANTS, FedKDRecConfig, LocalData, Uploads, epoch_orders, gather_local, local_examples, local_predictions,
    prepare_uploads, scatter_local, train_clients_batched, train_clients_sequential,
)

__all__ = [
    "ServerScorer", "FedKDRecState", "FedKDRecRound", "FedKDRec", "FedKDRecSession", "train_fedkdrec", "variant_name",
    "selected_state", "server_scorer", "curve_rows",
]

EXECUTORS = ("batched", "sequential")
#: bytes per transferred prediction: an int32 item id and a float32 label
BYTES_PER_PREDICTION = 8
# independent random streams inside one round (round_generator's ``stream``)
_SELECT, _NEGATIVES, _SHUFFLE, _UPLOAD, _SERVER, _ACTOR = range(1, 7)


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


def _graph_of(backbone: Backbone, pairs, device) -> Optional[torch.Tensor]:
    """LightGCN's graph over the told pairs ``(users (n,), items (n,))``."""
    users, items = pairs
    return backbone.server_graph(Pairs.from_arrays(users.cpu().numpy(), items.cpu().numpy(), backbone.num_users),
                                 device=device)


class _ServerModel:
    """A copy of the server's model only (what evaluation reads): ``params`` and the LightGCN ``graph``."""

    def __init__(self, backbone: Backbone, params: Dict[str, torch.Tensor], graph_pairs, graph=None, device="cpu"):
        self.params, self.graph_pairs = params, graph_pairs
        self.graph = graph if graph is not None or graph_pairs is None else _graph_of(backbone, graph_pairs, device)

    def state_dict(self) -> Dict[str, Any]:
        return {"params": self.params, "graph_pairs": self.graph_pairs}


class _Server:
    """The server: its model, optimiser, the labels it has been told, and the two agents."""

    def __init__(self, backbone: Backbone, params, config: FedKDRecConfig, device):
        self.backbone, self.config, self.device = backbone, config, device
        self.params = {n: v.clone().requires_grad_() for n, v in params.items()}
        # fused: torch's one-pass Adam kernel instead of a Python loop of about ten passes per tensor
        # (NeuMF's server has 12; 1.05 -> 0.23 ms a step). The same formula, its operations ordered
        # differently: within one float32 ulp of the per-tensor Adam per step, and equal to it to
        # 1e-12 in float64 (test_server_adam_equals_the_per_tensor_adam); runs recorded before this
        # change do not repeat bit for bit.
        self.optimizer = torch.optim.Adam(list(self.params.values()), lr=config.server_lr,
                                          weight_decay=config.weight_decay, fused=True)
        self.told = torch.full((backbone.num_users, backbone.num_items), float("nan"), device=device)
        self.graph, self.graph_pairs = None, None  # LightGCN: the graph over the told pairs (users (n,), items (n,))
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
            self.graph_pairs = torch.nonzero(self.told > 0.5, as_tuple=True)
            self.graph = _graph_of(self.backbone, self.graph_pairs, self.device)

    def state_dict(self) -> Dict[str, Any]:
        """Everything a resumed server needs (tensors and plain values): model, Adam moments, the
        labels it was told, last round's uploads and both agents (networks and optimisers)."""
        return {"params": {n: v.detach() for n, v in self.params.items()}, "optimizer": self.optimizer.state_dict(),
                "told": self.told, "graph_pairs": self.graph_pairs, "last_items": self.last_items,
                "last_frequency": self.last_frequency, "last_clients": self.last_clients,
                "teacher": {"net": self.teacher.net.state_dict(), "optimizer": self.teacher.optimizer.state_dict()},
                "transfer": {"actor": self.transfer.actor.state_dict(), "critic": self.transfer.critic.state_dict(),
                             "optimizer": self.transfer.optimizer.state_dict()}}

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        """The inverse of :meth:`state_dict` (on a server built with the same backbone and config)."""
        with torch.no_grad():
            for n, v in self.params.items():
                v.copy_(saved["params"][n])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.told = saved["told"].to(self.device)
        self.graph_pairs = None if saved["graph_pairs"] is None else tuple(t.to(self.device) for t in saved["graph_pairs"])
        self.graph = None if self.graph_pairs is None else _graph_of(self.backbone, self.graph_pairs, self.device)
        self.last_items, self.last_frequency = saved["last_items"].to(self.device), saved["last_frequency"].to(self.device)
        self.last_clients = float(saved["last_clients"])
        self.teacher.net.load_state_dict(saved["teacher"]["net"])
        self.teacher.optimizer.load_state_dict(saved["teacher"]["optimizer"])
        for name in ("actor", "critic"):
            getattr(self.transfer, name).load_state_dict(saved["transfer"][name])
        self.transfer.optimizer.load_state_dict(saved["transfer"]["optimizer"])

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


@dataclass
class FedKDRecState:
    """The simulation of a FedKDRec run after ``round_index`` rounds.

    Attributes:
        round_index: completed rounds.
        server: the server (its model ``params``, the LightGCN ``graph``, its Adam, the labels it was
            told and both agents); in a :meth:`FedKDRec.copy_state` copy, its model only.
        clients: every client's whole model, stacked (``(U, I, d)`` item tables; module docstring);
            ``None`` in a copy: the run's output is the server model, and a copy of ``U`` whole
            models per improvement would double the memory of a run.
    """

    round_index: int
    server: Any
    clients: Optional[Dict[str, torch.Tensor]] = None


@dataclass
class FedKDRecRound:
    """One round in progress: the plan (``index`` = the 1-based round ``t``, the sampled
    ``clients (C,)``, sorted) and what each step of Algorithm 1 produced (``None`` until it ran)."""

    index: int
    seed: int
    clients: np.ndarray
    started: float
    sent: Optional[torch.Tensor] = None
    sent_labels: Optional[torch.Tensor] = None
    episode: Optional[Dict[str, torch.Tensor]] = None
    data: Optional[LocalData] = None
    local: Optional[Dict[str, torch.Tensor]] = None
    client_loss: Optional[float] = None
    predictions: Optional[torch.Tensor] = None
    uploads: Optional[Uploads] = None
    info: Optional[Dict[str, Any]] = None
    record: Optional[Dict[str, Any]] = None

    def stream(self, stream: int) -> np.random.Generator:
        """The round's independent random stream ``round_generator(seed, t, stream)``."""
        return round_generator(self.seed, self.index, stream)


class FedKDRec:
    """FedKDRec (and its variants, PTF-FedRec included) as an :class:`~fedlib.engine.algorithm.Algorithm`.

    Round ``t`` (1-based; the trainer's ``context.index + 1``) draws from six independent
    streams ``round_generator(seed, t, stream)`` (client selection, negatives, local shuffles,
    upload sampling, the server's shuffle, the actor's draws): a pure function of
    ``(seed, t)``, so a resumed run redraws exactly what an uninterrupted one would. The steps
    (:meth:`send`, :meth:`train_clients`, :meth:`upload`, :meth:`train_server`, :meth:`learn`)
    are public so that :class:`FedKDRecSession` can show them one at a time.

    Args:
        split: the leave-one-out split (``split.train`` is what the clients hold).
        config: the run's settings (ablation flags included).
        item_init: ``(I, d)`` initial item embeddings for the server and every client.
        executor: ``"batched"`` or ``"sequential"`` local training.
        evaluate: ``evaluate(round, scorer) -> float or (float, dict)``: the validation value of
            the server model (a :class:`ServerScorer`); :meth:`evaluate` reports it as ``valid``,
            as ``score`` (NaN read as ``-inf``: what the trainer selects on) and the dict's
            entries as ``extra/<key>``.
    """

    def __init__(self, split: InteractionSplit, config: FedKDRecConfig, *, item_init: Optional[torch.Tensor] = None,
                 executor: str = "batched", evaluate: Optional[Callable] = None, device=None):
        if executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
        self.device = device = torch.device(device) if device is not None else default_device()
        self.split, self.config, self.item_init, self.callback = split, config, item_init, evaluate
        train = split.train
        self.backbone = Backbone(config.backbone, split.num_users, split.num_items, config.dim, config.hidden)
        self.sampler = NegativeSampler(train, split.num_items)
        self.train_sizes = torch.as_tensor(train.counts(), device=device)
        self.candidates = train.active_users()
        self.per_round = max(1, int(round(config.client_fraction * self.candidates.size)))
        self.local_train = train_clients_batched if executor == "batched" else train_clients_sequential

    def _config(self, seed: int) -> FedKDRecConfig:
        return self.config if int(seed) == self.config.seed else dataclasses.replace(self.config, seed=int(seed))

    # --- state ---------------------------------------------------------------------------
    def init(self, seed: int) -> FedKDRecState:
        """Server and clients start from one model drawn from ``seed`` (``item_init`` for the item tables)."""
        init = self.backbone.init_server(torch.Generator().manual_seed(int(seed)), self.item_init, device=self.device)
        server = _Server(self.backbone, init, self._config(seed), self.device)
        everyone = torch.arange(self.split.num_users, device=self.device)
        return FedKDRecState(0, server, self.backbone.client_copies({n: v.detach() for n, v in init.items()}, everyone))

    def copy_state(self, state: FedKDRecState) -> FedKDRecState:
        """The server model only (see :class:`FedKDRecState`)."""
        server = state.server
        return FedKDRecState(state.round_index, _ServerModel(self.backbone, {n: v.detach().clone()
                                                                              for n, v in server.params.items()},
                                                             server.graph_pairs, server.graph))

    def state_dict(self, state: FedKDRecState) -> Dict[str, Any]:
        return {"round_index": state.round_index, "server": state.server.state_dict(), "clients": state.clients}

    def load_state(self, saved: Mapping[str, Any]) -> FedKDRecState:
        server = saved["server"]
        params = {n: v.to(self.device) for n, v in server["params"].items()}
        if saved["clients"] is None:  # a copy: the model only
            return FedKDRecState(int(saved["round_index"]), _ServerModel(self.backbone, params, server["graph_pairs"],
                                                                        device=self.device))
        live = _Server(self.backbone, params, self.config, self.device)
        live.load_state_dict(server)
        return FedKDRecState(int(saved["round_index"]), live, {n: v.to(self.device) for n, v in saved["clients"].items()})

    # --- one round: the steps of Algorithm 1 ----------------------------------------------------
    def plan_round(self, state: FedKDRecState, context: RoundContext) -> FedKDRecRound:
        """Step 1: sample ``C = client_fraction`` of the clients (stream 1 of round ``t = index + 1``)."""
        t = context.index + 1
        rnd = FedKDRecRound(index=t, seed=context.seed, clients=np.empty(0, np.int64), started=time.perf_counter())
        rnd.clients = np.sort(rnd.stream(_SELECT).choice(self.candidates, self.per_round, replace=False))
        return rnd

    def send(self, state: FedKDRecState, rnd: FedKDRecRound):
        """Step 2 (§3.3): the items ``(C, S)`` (-1 = none) the server sends each client, and their soft labels."""
        clients_t = torch.as_tensor(rnd.clients, device=self.device)
        actor_gen = torch.Generator().manual_seed(int(rnd.stream(_ACTOR).integers(2 ** 62)))
        rnd.sent, rnd.sent_labels, rnd.episode = state.server.select(clients_t, self.train_sizes[clients_t], actor_gen)
        return rnd.sent, rnd.sent_labels

    def train_clients(self, state: FedKDRecState, rnd: FedKDRecRound) -> float:
        """Step 3 (Eq. 3): each client trains its whole model on ``D_i ∪ D̃_i``; returns the mean BCE."""
        config, split = self.config, self.split
        rnd.data = local_examples(split.train, rnd.clients, split.num_items, self.sampler, config.num_negatives,
                                  rnd.stream(_NEGATIVES), rnd.sent.cpu().numpy(), rnd.sent_labels.cpu().numpy(),
                                  device=self.device)
        rnd.local = gather_local(self.backbone, state.clients, rnd.data)
        orders = epoch_orders(rnd.data, config.client_epochs, rnd.stream(_SHUFFLE))
        rnd.client_loss = self.local_train(self.backbone, rnd.local, rnd.data, orders, config.client_batch,
                                           config.client_lr, config.weight_decay)
        scatter_local(self.backbone, state.clients, rnd.local, rnd.data)
        return rnd.client_loss

    def upload(self, state: FedKDRecState, rnd: FedKDRecRound) -> Uploads:
        """Step 4 (§3.1, Eq. 4): each client samples, mixes and swaps its labels; returns the uploads."""
        rnd.predictions = local_predictions(self.backbone, rnd.local, rnd.data)  # (C, L) r̂
        rnd.uploads = prepare_uploads(rnd.data, rnd.predictions, self.config, rnd.stream(_UPLOAD))
        return rnd.uploads

    def train_server(self, state: FedKDRecState, rnd: FedKDRecRound) -> Dict[str, Any]:
        """Step 5 (Eqs. 5–7, 10): teacher weights ``ω``, the server's epochs, the agent's update."""
        data_clients = torch.as_tensor(rnd.data.clients, device=self.device)
        rnd.info = state.server.train(rnd.uploads, data_clients, rnd.stream(_SERVER))
        return rnd.info

    def learn(self, state: FedKDRecState, rnd: FedKDRecRound, ledger=None) -> Dict[str, Any]:
        """Step 6 (Eqs. 8, 9, 11, 12): the actor–critic learns; the bytes are charged; returns the round's record."""
        agent = {}
        if rnd.episode is not None:
            # the episode rows follow ``clients``; the rewards follow ``data.clients``
            order = torch.as_tensor(np.searchsorted(rnd.clients, rnd.data.clients), device=self.device)
            reordered = {k: v[order] for k, v in rnd.episode.items()}
            agent = state.server.learn_transfer(reordered, rnd.sent[order], rnd.info, len(rnd.clients))
        sent_count = (rnd.sent >= 0).sum(1)
        uploads, t = rnd.uploads, rnd.index
        uploaded = uploads.keep.sum(1)
        if ledger is not None:
            ledger.download(t, rnd.clients, "predictions",
                            (sent_count.cpu().numpy() * BYTES_PER_PREDICTION).astype(np.int64), per_client=False)
            ledger.upload(t, rnd.data.clients, "predictions",
                          (uploaded.cpu().numpy() * BYTES_PER_PREDICTION).astype(np.int64), per_client=False)
        private_kept = uploads.keep & uploads.private
        revealed = ((uploads.labels > 0.5) == (uploads.hard == 1)) & private_kept
        rnd.record = {
            "round": t, "server_loss": rnd.info["server_loss"], "client_loss": rnd.client_loss,
            "sent_per_client": float(sent_count.float().mean()), "uploaded_per_client": float(uploaded.float().mean()),
            "teacher_entropy": rnd.info["teacher_entropy"], "teacher_loss": rnd.info["teacher_loss"],
            "label_revealed": float(revealed.sum() / private_kept.sum().clamp(min=1)),
            "seconds": time.perf_counter() - rnd.started, **agent,
        }
        state.round_index = t
        return rnd.record

    def run_round(self, state: FedKDRecState, rnd: FedKDRecRound, context: RoundContext
                  ) -> Tuple[FedKDRecState, RoundReport]:
        """Steps 2–6 of Algorithm 1 (the state is updated in place); ``train_loss`` = the clients' mean BCE."""
        self.send(state, rnd)
        self.train_clients(state, rnd)
        self.upload(state, rnd)
        self.train_server(state, rnd)
        record = self.learn(state, rnd, context.ledger)
        return state, RoundReport(train_loss=rnd.client_loss, logged={k: v for k, v in record.items() if k != "round"})

    def scorer(self, state: FedKDRecState) -> "ServerScorer":
        return ServerScorer(self.backbone, state.server.params, state.server.graph)

    def evaluate(self, state: FedKDRecState, split: str) -> Dict[str, Any]:
        if self.callback is None:
            raise ValueError("FedKDRec was built without evaluate=; pass one or train with evaluate=False")
        if split != "valid":
            raise ValueError(f"FedKDRec's evaluate callback scores validation only, got split {split!r}")
        return _evaluation(self.callback(state.round_index, self.scorer(state)))


def _evaluation(out) -> Dict[str, Any]:
    """An evaluate callback's answer (``value`` or ``(value, extras)``) as the metrics of
    :meth:`FedKDRec.evaluate`: ``valid``, ``score`` (NaN read as ``-inf``) and ``extra/<key>``."""
    value, extra = (out if isinstance(out, tuple) else (out, {}))
    value = float(value)
    return {"valid": value, "score": -math.inf if math.isnan(value) else value,
            **{f"extra/{k}": v for k, v in extra.items()}}


class FedKDRecSession:
    """Algorithm 1 one step at a time, for a lesson: the steps of :class:`FedKDRec`, opened up.

    One round is ``begin_round`` → ``send`` (§3.3) → ``train_clients`` (Eq. 3) → ``upload``
    (§3.1, Eq. 4) → ``train_server`` (Eqs. 5–7, 10) → ``learn`` (Eqs. 8, 9, 11, 12);
    :meth:`step_round` runs them in that order (the numbers of :func:`train_fedkdrec`, which runs
    the same steps through the trainer). After each step, the attribute it names holds what it
    produced (``clients``, ``sent``/``sent_labels``/``episode``, ``data``/``local``, ``uploads``,
    ``info``: read from the current :class:`FedKDRecRound`), so a lesson can show every stage of
    a round. ``run`` is the run so far as the trainer's
    :class:`~fedlib.engine.trainer.RunResult` with the rows and selection :func:`train_fedkdrec`
    gives: :meth:`learn` appends the round's history row, :meth:`evaluate` adds ``valid/...`` to
    it and keeps the best-validation server with the trainer's
    :class:`~fedlib.engine.selection.Selection` (earliest best wins).

    Args:
        split: the leave-one-out split (``split.train`` is what the clients hold).
        config: the run's settings (ablation flags included).
        item_init: ``(I, d)`` initial item embeddings for the server and every client.
        ledger: a :class:`~fedlib.engine.communication.CommunicationLedger` for the bytes of
            the predictions each client receives and sends.
        executor: ``"batched"`` or ``"sequential"`` local training.
    """

    _ROUND_FIELDS = ("clients", "sent", "sent_labels", "episode", "data", "local", "client_loss", "predictions",
                     "uploads", "info")

    def __init__(self, split: InteractionSplit, config: FedKDRecConfig, *, item_init: Optional[torch.Tensor] = None,
                 ledger=None, executor: str = "batched", device=None):
        self.algorithm = FedKDRec(split, config, item_init=item_init, executor=executor, device=device)
        self.split, self.config, self.ledger = split, config, ledger
        self.device, self.backbone = self.algorithm.device, self.algorithm.backbone
        self.state = self.algorithm.init(config.seed)
        self.server, self.clients_state = self.state.server, self.state.clients
        self.run = start_run(self.algorithm, _schedule(config, keep_best_state=True), config.seed, state=self.state)
        self.run.method, self.run.artifacts = _method_and_artifacts(self.algorithm)
        self.round_index = 0
        self.current: Optional[FedKDRecRound] = None

    def __getattr__(self, name):
        if name in FedKDRecSession._ROUND_FIELDS:
            current = self.__dict__.get("current")
            if current is None:
                raise AttributeError(f"{name!r} is produced by a round's steps: call begin_round() first")
            return getattr(current, name)
        raise AttributeError(name)

    def begin_round(self) -> np.ndarray:
        """Step 1: sample ``C = client_fraction`` of the clients; returns their ids ``(C,)``, sorted."""
        context = RoundContext(index=self.round_index, seed=self.config.seed,
                               rng=round_generator(self.config.seed, self.round_index))
        self.current = self.algorithm.plan_round(self.state, context)
        self.round_index += 1
        return self.current.clients

    def send(self):
        """Step 2 (§3.3): the items ``(C, S)`` (-1 = none) the server sends each client, and their soft labels."""
        return self.algorithm.send(self.state, self.current)

    def train_clients(self) -> float:
        """Step 3 (Eq. 3): each client trains its whole model on ``D_i ∪ D̃_i``; returns the mean BCE."""
        return self.algorithm.train_clients(self.state, self.current)

    def upload(self) -> Uploads:
        """Step 4 (§3.1, Eq. 4): each client samples, mixes and swaps its labels; returns the uploads."""
        return self.algorithm.upload(self.state, self.current)

    def train_server(self) -> Dict[str, Any]:
        """Step 5 (Eqs. 5–7, 10): teacher weights ``ω``, the server's epochs, the agent's update."""
        return self.algorithm.train_server(self.state, self.current)

    def learn(self) -> Dict[str, Any]:
        """Step 6 (Eqs. 8, 9, 11, 12): the actor–critic learns from the round; returns the round's
        record and appends it to ``run.history`` as the trainer's row (``round``, ``train_loss`` =
        the clients' mean BCE, the record's other entries)."""
        record = self.algorithm.learn(self.state, self.current, self.ledger)
        self.run.round_index = record["round"]
        self.run.history.append({"round": record["round"], "train_loss": float(self.current.client_loss),
                                 **{k: v for k, v in record.items() if k != "round"}})
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
        """Score the server model after the last :meth:`learn` (``evaluate(round, scorer) -> value
        or (value, dict)``) as the trainer does: the metrics of :meth:`FedKDRec.evaluate` join the
        round's history row as ``valid/...``, and the server is kept when it is the best so far
        (earliest best wins). Returns the validation value.

        Raises:
            ValueError: no round has finished its :meth:`learn` step yet.
        """
        run = self.run
        if not run.history or run.history[-1]["round"] != self.round_index:
            raise ValueError("FedKDRecSession.evaluate scores a finished round: call it after learn() "
                             "(or step_round()), not before the first round or in the middle of one")
        metrics = {f"valid/{k}": v for k, v in _evaluation(evaluate(run.round_index,
                                                                    self.algorithm.scorer(self.state))).items()}
        run.history[-1].update(metrics)
        if run.selection.update(run.round_index, metrics):
            run.best_state = self.algorithm.copy_state(self.state)
        return metrics["valid/valid"]


def _schedule(config: FedKDRecConfig, keep_best_state: bool) -> Schedule:
    """Evaluate every ``eval_every`` rounds and after the last; select the highest validation
    value (``score``: NaN read as ``-inf``), the earliest on ties; no patience, no test set."""
    return Schedule(rounds=config.rounds, eval_every=config.eval_every, selection_metric="score",
                    test_at_end=False, keep_best_state=keep_best_state)


def variant_name(config: FedKDRecConfig) -> str:
    """The method's label: the :data:`~fedlib.papers.fedkdrec.clients.VARIANTS` entry whose flags
    ``config`` carries, as the tables name it after FedKDRec (``"FedKDRec"``, ``"FedKDRec-c"``,
    ``"FedKDRec w/o R_i"``, ``"PTF-FedRec"``), else ``"FedKDRec (custom)"``."""
    flags = {key for overrides in VARIANTS.values() for key in overrides}
    defaults = FedKDRecConfig()
    for name in ("PTF-FedRec", *VARIANTS):
        wanted = {key: VARIANTS[name].get(key, getattr(defaults, key)) for key in flags}
        if all(_plain(getattr(config, key)) == _plain(value) for key, value in wanted.items()):
            return name if name in ("FedKDRec", "PTF-FedRec") else f"FedKDRec{'' if name[0] in '-~' else ' '}{name}"
    return "FedKDRec (custom)"


def _plain(value):
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _method_and_artifacts(algorithm: FedKDRec) -> Tuple[str, Dict[str, Any]]:
    return variant_name(algorithm.config), {"config": algorithm.config, "backbone": algorithm.backbone}


def train_fedkdrec(split: InteractionSplit, config: FedKDRecConfig, *, item_init: Optional[torch.Tensor] = None,
                   evaluate: Optional[Callable[[int, ScoreFn], Any]] = None, ledger=None,
                   progress: Optional[Callable[[int], None]] = None, executor: str = "batched",
                   device=None, checkpointer=None) -> RunResult[FedKDRecState]:
    """Algorithm 1: train FedKDRec (or a variant) on ``split.train`` with the trainer.

    Args:
        item_init: ``(I, d)`` initial item embeddings for the server and every client.
        evaluate: ``evaluate(round, scorer) -> float or (float, dict)``: the validation value
            (higher is better) of the server model (a :class:`ServerScorer`); called every
            ``eval_every`` rounds and at the end; the best-validation server is kept (earliest
            best wins).
        ledger: a :class:`~fedlib.engine.communication.CommunicationLedger` for the bytes of
            the predictions each client receives and sends.
        progress: ``progress(round)`` after every round (1-based).
        executor: ``"batched"`` or ``"sequential"`` local training.
        checkpointer: a :class:`~fedlib.engine.checkpoint.Checkpointer`; a resumed run equals the
            uninterrupted one (the evaluate callback's own records aside).

    Returns:
        The trainer's :class:`~fedlib.engine.trainer.RunResult`: ``state`` (the last
        :class:`FedKDRecState`: ``state.server.params``, ``state.server.graph``, every client's
        model ``state.clients``), ``best_state`` (a copy of the best-validation server, with
        ``evaluate``), ``history`` (one row per round: ``round``, ``train_loss`` = the clients'
        mean BCE, ``server_loss``, ``client_loss``, items sent/uploaded per client, the teacher
        weights' entropy, ``label_revealed`` = the fraction of uploaded private labels that reveal
        the hard label (``r̄ > 0.5 ⇔ r = 1``), agent losses, ``seconds``; evaluated rounds add
        ``valid/valid``, ``valid/score`` and ``valid/extra/<key>``), ``method``
        (:func:`variant_name`) and ``artifacts``: ``config``, ``backbone``. Read the paper's
        output with :func:`server_scorer` and the evaluations with :func:`curve_rows`.
    """
    algorithm = FedKDRec(split, config, item_init=item_init, executor=executor, evaluate=evaluate, device=device)
    run = train_rounds(algorithm, _schedule(config, keep_best_state=evaluate is not None), seed=config.seed,
                       ledger=ledger, evaluate=evaluate is not None,
                       on_round_end=None if progress is None else (lambda run, record: progress(record["round"])),
                       checkpointer=checkpointer, checkpoint_config=None if checkpointer is None else config.to_dict())
    run.method, run.artifacts = _method_and_artifacts(algorithm)
    return run


# ======================================================================================
# The finished run: plain functions of the RunResult (train_fedkdrec's or FedKDRecSession.run)
# ======================================================================================
def selected_state(run: RunResult) -> FedKDRecState:
    """The paper's output: the best-validation state when an evaluation scored above ``-inf``,
    else the last one (nothing evaluated, or every validation value NaN)."""
    found = run.best_state is not None and run.best_score is not None and run.best_score > -math.inf
    return run.best_state if found else run.state


def server_scorer(run: RunResult) -> ServerScorer:
    """The selected server model (:func:`selected_state`) as a :class:`ServerScorer`:
    ``scorer(users (n,)) -> (n, I)`` logits, ``scorer.pairs(users, items (n, K)) -> (n, K)``."""
    if "backbone" not in run.artifacts:
        raise ValueError("run.artifacts has no 'backbone': pass the RunResult of train_fedkdrec or FedKDRecSession.run")
    server = selected_state(run).server
    return ServerScorer(run.artifacts["backbone"], server.params, server.graph)


def curve_rows(run: RunResult) -> List[Dict[str, Any]]:
    """One row per evaluation: ``round``, ``valid`` (the callback's value) and the callback's
    extras under their own keys."""
    return [{"round": row["round"], "valid": row["valid/valid"],
             **{k[len("valid/extra/"):]: v for k, v in row.items() if k.startswith("valid/extra/")}}
            for row in run.history if "valid/valid" in row]


@register("FedKDRec", "single-domain", paper="fedkdrec")
def build_fedkdrec(split: InteractionSplit, config, *, dim: int, device=None, **params):
    """FedKDRec for the registry: ``params`` override :class:`FedKDRecConfig`'s defaults; rounds and
    seed are the :class:`~fedlib.engine.loop.FederatedConfig`'s. Selection as :func:`train_fedkdrec`."""
    from fedlib.baselines.registry import Trainable

    kd = FedKDRecConfig(dim=dim, rounds=config.rounds, seed=config.seed, **params)
    return Trainable(FedKDRec(split, kd, device=device), _schedule(kd, keep_best_state=False))
