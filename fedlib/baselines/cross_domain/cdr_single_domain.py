r"""Single-domain baselines of FedPCL-CDR's Table 2: NeuMF, LightGCN and FedNCF, one model per domain.

These three rows of Table 2 transfer **nothing** between domains: every domain of a
:class:`~fedlib.data.splits.DomainSplit` trains its own model on its own training pairs only,
and the shared users ``0 .. n_o − 1`` are just users of each domain. They measure what a
domain reaches alone, which the cross-domain methods must beat. All three are evaluated
like every method of the comparison (:mod:`fedlib.baselines.cross_domain.cdr_common`): HR / NDCG / MRR on
the protocol's 1 + 99 candidates, one evaluation of every domain per epoch (round), and
model selection on the **mean** validation HR@10 over the domains (one selected epoch for
the whole run, as for the cross-domain methods).

Notation: ``U`` users, ``I`` items of one domain, ``d`` the embedding size, ``σ`` the
logistic function, ``y_ui ∈ {0, 1}`` (a training pair, or one of ``k`` sampled negatives).

NeuMF
-----
He, Liao, Zhang, Nie, Hu, Chua. "Neural Collaborative Filtering." WWW 2017.
DOI 10.1145/3038912.3052569, arXiv:1708.05031. **Mechanism: NeuMF fusion** of a linear GMF
branch and a non-linear MLP tower, each with its own user and item embeddings, by one output
layer::

    φ_GMF = p_u^G ⊙ q_i^G                                           (d,)
    φ_MLP = ReLU(W_L(… ReLU(W_1 [p_u^M ; q_i^M] + b_1) …) + b_L)     (h_L,)   tower 2d → 64 → 32 → 16
    ŷ_ui  = σ(hᵀ [φ_GMF ; φ_MLP] + b)
    L     = −Σ y_ui log ŷ_ui + (1 − y_ui) log(1 − ŷ_ui)              k = 4 fresh negatives per positive and epoch

The model is :class:`fedlib.models.ncf.NeuMF` (the authors' inits: embeddings ``N(0, 0.01²)``,
Glorot-uniform tower, LeCun-uniform output layer); :func:`ncf_candidate_logits` evaluates the
same maths on ``(n, C)`` candidate blocks without the per-example weight copies of the class's
``forward``.

LightGCN
--------
He, Deng, Wang, Li, Zhang, Wang. "LightGCN: Simplifying and Powering Graph Convolution
Network for Recommendation." SIGIR 2020. DOI 10.1145/3397271.3401063, arXiv:2002.02126.
**Mechanism: linear neighbourhood propagation** with no feature transform and no
non-linearity, and a **mean over the layer outputs**::

    E^{(l+1)} = D^{-1/2} A D^{-1/2} E^{(l)}                         A: (U + I)² training bipartite graph
    e         = 1/(L + 1) Σ_{l=0..L} E^{(l)}                         L = 3
    ŷ_ui      = e_uᵀ e_i
    L_BPR     = −mean log σ(ŷ_ui − ŷ_uj) + λ ‖E^{(0)}_{u,i,j}‖² / (2B)   one negative j per positive, λ = 1e-4

The model is :class:`fedlib.models.lightgcn.LightGCN` (init ``N(0, 0.1²)`` as the authors'
code). The loss is BPR, as in its paper (``loss="bpr"``); ``loss="bce"`` trains it with the
same BCE and one negative as FedPCL-CDR's own predictor, for an ablation only.

FedNCF
------
Perifanis, Efraimidis. "Federated Neural Collaborative Filtering." Knowledge-Based Systems
242, 108441, 2022. DOI 10.1016/j.knosys.2022.108441, arXiv:2106.04405. **Mechanism: NCF
trained by FedAvg with users as clients** inside each domain: user ``u`` keeps ``p_u^G,
p_u^M`` on its device and never uploads them; the item embeddings, the tower and the output
layer ``θ`` are public. In round ``t`` the server samples a fraction ``ρ`` of the domain's
users ``S_t``; each ``c ∈ S_t`` downloads ``θ``, trains the NeuMF above on its own positives
plus ``k`` sampled negatives for ``E`` local epochs with a fresh Adam (its private vectors
too), and uploads its copy ``θ_c``; the server keeps::

    θ ← Σ_{c ∈ S_t} n_c / (Σ_{c'} n_{c'}) · θ_c                     n_c = |positives_c| · (1 + k)

Item rows a client never touched carry its downloaded value, so a row moves only through the
clients that trained on it. The simulation is the project's engine
(:class:`fedlib.engine.loop.ParameterAveraging` of :func:`fedlib.engine.fedncf_method`, the
:class:`fedlib.models.ncf.FedNCF` backbone and ``Aggregation("num_examples")``), one round of
every domain per trainer round: :class:`~fedlib.engine.BatchedExecutor` runs all sampled clients of a round together
(stacked private rows, per-client copies of the dense public tensors and of the item rows each
client touches), :class:`~fedlib.engine.SequentialExecutor` (``executor="sequential"``) is the
plain one-client-at-a-time reference; tests check both give the same numbers.

Simplifications on this machine
-------------------------------
* **One selected epoch for both domains.** Each domain has its own model, but selection and
  early stopping use the mean validation HR@10 over domains (the rule of every method in
  this comparison), not a separate stopping point per domain.
* **Sizes follow FedPCL-CDR's setting**, not each paper's grid: ``d = 64`` everywhere, Adam
  with lr 1e-3, NeuMF batch 256. NCF's tower for ``d = 64`` is ``128 → 64 → 32 → 16`` (its
  "halve each layer" rule). LightGCN keeps its own paper's batch of 2048 positives: every
  step propagates the whole graph, so a step costs the same at 256 or 2048 and 256 would make
  an epoch ~10x slower (≈ 1 min instead of ≈ 6 s for both Amazon phone/sport domains here).
* **NeuMF without pre-training.** The NCF paper optionally initialises NeuMF from trained
  GMF and MLP models (then trains with SGD); we train NeuMF from scratch with Adam, the
  paper's setting without pre-training.
* **FedNCF's privacy layer is not simulated.** Its secure aggregation hides each client's
  upload from the server but leaves the aggregate unchanged, so the numbers here are the
  same. Its proposed "MF-FedAvg" treatment of the item-embedding updates is not implemented:
  every public tensor, item rows included, is averaged by plain FedAvg weighted by sample
  counts. A row's change is then ``Σ_c w_c Δ_c`` over all participants, most of which did not
  touch it, so item embeddings learn much more slowly than in centralised NeuMF (the
  mismatch between FedAvg and latent-factor updates that the FedNCF paper argues about).
* **FedNCF's round budget.** Local training uses the values usually quoted for FedNCF
  (Adam lr 1e-3, batch 64, 2 local epochs, 4 negatives, up to 400 rounds; not checked
  against the paper's text here). The participation fraction ``client_fraction = 0.1`` is
  our choice, not the paper's participation rate. We evaluate every 10 rounds (≈ one pass
  over the users at ``ρ = 0.1``), so ``patience`` counts evaluations of 10 rounds.
* **Users never sampled** keep their initial private vectors (that is FedNCF, not a
  shortcut); they are still evaluated.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import DomainSplit, InteractionSplit
from fedlib.engine.aggregation import Aggregation
from fedlib.engine.communication import CommunicationLedger
from fedlib.engine.executors import make_executor
from fedlib.engine.algorithm import RoundContext, RoundReport
from fedlib.engine.loop import AveragingState, FederatedConfig, ParameterAveraging
from fedlib.engine.method import FederatedMethod, fedncf_method
from fedlib.engine.optim import adam
from fedlib.engine.plan import round_generator
from fedlib.engine.trainer import RunResult
from fedlib.baselines.config_checks import check_positive_ints
from fedlib.baselines.cross_domain.cdr_common import (CrossDomainConfig, CrossDomainAlgorithm, PairScorer, Progress, RunSummary,
                                       check_training_loop, train_with)
from fedlib.models.lightgcn import LightGCN
from fedlib.models.ncf import FedNCF, NeuMF

__all__ = [
    "MODELS", "LIGHTGCN_LOSSES", "EXECUTORS", "NeuMFConfig", "LightGCNConfig", "FedNCFConfig",
    "ncf_candidate_logits", "lightgcn_candidate_logits", "clients_per_round", "fedncf_engine_method",
    "train_neumf", "train_lightgcn", "train_fedncf", "train_single_domain",
]

MODELS = ("NeuMF", "LightGCN", "FedNCF")
LIGHTGCN_LOSSES = ("bpr", "bce")
EXECUTORS = ("batched", "sequential")
DTYPES = ("float32", "float64")

# --------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------

def _positive_float(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _check_hidden(hidden) -> Tuple[int, ...]:
    try:
        sizes = tuple(hidden)
    except TypeError:
        raise ValueError(f"hidden must be a sequence of layer widths such as (64, 32, 16), got {hidden!r}") from None
    if not sizes or any(isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h < 1 for h in sizes):
        raise ValueError(f"hidden must be a non-empty sequence of integers >= 1 (the MLP tower of NeuMF), got {hidden!r}")
    return tuple(int(h) for h in sizes)


@dataclass(frozen=True)
class NeuMFConfig(CrossDomainConfig):
    """NeuMF trained on each domain alone.

    Attributes:
        dim: embedding size ``d`` of each branch (GMF and MLP have their own tables).
        hidden: MLP tower widths after the ``2d`` input (NCF's halving rule for ``d = 64``).
        lr: Adam learning rate. batch_size: examples per step (positives and negatives mixed).
        num_negatives: sampled negatives per positive, redrawn every epoch (NCF: 4).
        epochs: upper bound; early stopping after ``patience`` evaluations without a better
            mean validation HR@10; evaluation every ``eval_every`` epochs.
        select_on: ``"valid"`` (ours) or ``"test"`` (audit). seed: the only randomness.
    """

    hidden: Tuple[int, ...] = (64, 32, 16)
    batch_size: int = 256
    num_negatives: int = 4
    epochs: int = 100

    def __post_init__(self):
        check_training_loop(self)  # dim, lr, patience, eval_every, batch_size, epochs/rounds, seed
        object.__setattr__(self, "hidden", _check_hidden(self.hidden))
        check_positive_ints(self, ["num_negatives"], " (NCF samples 4 per positive)")

    @property
    def model(self) -> str:
        return "NeuMF"


@dataclass(frozen=True)
class LightGCNConfig(CrossDomainConfig):
    """LightGCN trained on each domain's training graph alone.

    Attributes:
        dim, num_layers: ``d`` and ``L`` (paper: 64, 3); layers are averaged.
        lr: Adam learning rate. batch_size: positives per step (LightGCN's 2048: each step
            propagates the whole graph, so small batches only multiply the cost).
        loss: ``"bpr"`` (the paper, one negative per positive) or ``"bce"`` (ablation:
            ``num_negatives`` negatives with label 0).
        l2: BPR's weight decay ``λ`` on the batch's layer-0 embeddings (paper: 1e-4);
            ignored by ``"bce"``.
        num_negatives: negatives per positive for ``"bce"`` (BPR always uses one).
        init_std: embedding init std (authors' code: 0.1).
        epochs, patience, eval_every, select_on, seed: as :class:`NeuMFConfig`.
    """

    num_layers: int = 3
    batch_size: int = 2048
    loss: str = "bpr"
    l2: float = 1e-4
    num_negatives: int = 1
    init_std: float = 0.1
    epochs: int = 300

    def __post_init__(self):
        check_training_loop(self)  # dim, lr, patience, eval_every, batch_size, epochs/rounds, seed
        check_positive_ints(self, ["num_layers"], " (LightGCN uses 3)")
        check_positive_ints(self, ["num_negatives"])
        _positive_float("init_std", self.init_std)
        if self.loss not in LIGHTGCN_LOSSES:
            raise ValueError(f"loss must be one of {LIGHTGCN_LOSSES} ('bpr' is LightGCN's), got {self.loss!r}")
        if isinstance(self.l2, bool) or not isinstance(self.l2, (int, float)) or not math.isfinite(self.l2) or self.l2 < 0:
            raise ValueError(f"l2 must be a finite number >= 0, got {self.l2!r}")

    @property
    def model(self) -> str:
        return "LightGCN"


@dataclass(frozen=True)
class FedNCFConfig(CrossDomainConfig):
    """FedNCF (users are clients) in each domain alone.

    Attributes:
        dim, hidden: the NeuMF backbone (as :class:`NeuMFConfig`).
        lr: every client's local Adam step size (a fresh Adam per client and round).
        batch_size: local mini-batch (FedNCF: 64). local_epochs: passes over the client's
            examples per round (FedNCF: 2). num_negatives: per positive, redrawn each round.
        client_fraction: share ``ρ ∈ (0, 1]`` of the domain's users (with training data)
            sampled per round, at least one; ``1.0`` = every user every round.
        rounds: upper bound on communication rounds (FedNCF: 400).
        eval_every: evaluate every this many rounds (10 ≈ one pass over the users at ρ = 0.1);
            ``patience`` counts evaluations.
        executor: ``"batched"`` (all sampled clients at once) or ``"sequential"`` (one client
            after another, the reference). chunk_size: clients per batched block (memory).
        dtype: ``"float32"`` or ``"float64"`` (tests compare executors in float64).
        select_on, seed: as :class:`NeuMFConfig`.
    """

    hidden: Tuple[int, ...] = (64, 32, 16)
    batch_size: int = 64
    local_epochs: int = 2
    num_negatives: int = 4
    client_fraction: float = 0.1
    rounds: int = 400
    eval_every: int = 10
    executor: str = "batched"
    chunk_size: int = 1024
    dtype: str = "float32"

    def __post_init__(self):
        check_training_loop(self)  # dim, lr, patience, eval_every, batch_size, epochs/rounds, seed
        object.__setattr__(self, "hidden", _check_hidden(self.hidden))
        check_positive_ints(self, ["local_epochs", "num_negatives", "chunk_size"])
        fraction = self.client_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise ValueError(f"client_fraction must lie in (0, 1] (share of users per round, 1.0 = all), "
                             f"got {fraction!r}")
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {self.executor!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")

    @property
    def model(self) -> str:
        return "FedNCF"


AnyConfig = Union[NeuMFConfig, LightGCNConfig, FedNCFConfig]


# --------------------------------------------------------------------------------------
# Scoring (training and evaluation share these)
# --------------------------------------------------------------------------------------
def ncf_candidate_logits(params: Mapping[str, torch.Tensor], num_hidden: int, users: torch.Tensor,
                         items: torch.Tensor) -> torch.Tensor:
    """NeuMF logits ``hᵀ[p^G ⊙ q^G ; MLP([p^M ; q^M])] + b`` of every user for its own candidates.

    Same maths and parameter names as :class:`fedlib.models.ncf.FedNCF` (``variant="neumf"``,
    public head), so it scores a centralised :class:`~fedlib.models.ncf.NeuMF`'s ``params``
    and a FedNCF state ``{**global_state, **private_state}`` alike.

    Args:
        params: ``user_emb_gmf, user_emb (U, d)``, ``item_emb_gmf, item_emb (I, d)``,
            ``mlp{k}_w (out, in)``, ``mlp{k}_b (out,)``, ``head_w (h,)``, ``head_b ()``.
        num_hidden: number of tower layers.
        users: ``(n,) int64``. items: ``(n, C) int64``.

    Returns:
        ``(n, C)`` logits.
    """
    num_cand = items.shape[1]
    gmf = params["user_emb_gmf"][users][:, None, :] * params["item_emb_gmf"][items]  # (n, C, d)
    user = params["user_emb"][users][:, None, :].expand(-1, num_cand, -1)  # (n, C, d)
    hidden = torch.cat([user, params["item_emb"][items]], dim=-1)  # (n, C, 2d)
    for k in range(num_hidden):
        hidden = torch.relu(F.linear(hidden, params[f"mlp{k}_w"], params[f"mlp{k}_b"]))  # (n, C, h_k)
    features = torch.cat([gmf, hidden], dim=-1)  # (n, C, d + h_L)
    return features @ params["head_w"] + params["head_b"]  # (n, C)


def lightgcn_candidate_logits(user_nodes: torch.Tensor, item_nodes: torch.Tensor, users: torch.Tensor,
                              items: torch.Tensor) -> torch.Tensor:
    """``e_uᵀ e_i`` of propagated embeddings: users ``(n,)``, items ``(n, C)`` -> ``(n, C)``."""
    return torch.einsum("nd,ncd->nc", user_nodes[users], item_nodes[items])


# --------------------------------------------------------------------------------------
# One domain of each model
# --------------------------------------------------------------------------------------
def _domain_rng(seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), 9103, int(index)])


def _init_generator(seed: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed) * 1000 + int(index))


@dataclass
class _LocalModel:
    """The live state of one domain's centralised model: the model, its Adam and the epoch generator."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    rng: np.random.Generator


class _NeuMFDomain:
    """One domain's NeuMF: its data, config and sampler (the live model is in a :class:`_LocalModel`)."""

    def __init__(self, split: InteractionSplit, config: NeuMFConfig, index: int, device):
        self.split, self.config, self.index, self.device = split, config, index, device
        self.sampler = NegativeSampler(split.train, split.num_items)

    def init(self) -> _LocalModel:
        config = self.config
        model = NeuMF(self.split.num_users, self.split.num_items, config.dim, config.hidden, init="ncf",
                      generator=_init_generator(config.seed, self.index)).to(self.device)
        return _LocalModel(model, adam(model.parameters(), lr=config.lr), _domain_rng(config.seed, self.index))

    def train_epoch(self, live: _LocalModel) -> Tuple[_LocalModel, Dict[str, float]]:
        """One pass over every positive and ``k`` fresh negatives per positive, shuffled."""
        train, k, rng = self.split.train, self.config.num_negatives, live.rng
        negatives = self.sampler.sample(train.users, k, rng)  # (P, k)
        users = np.concatenate([train.users, np.repeat(train.users, k)])  # (P(1 + k),)
        items = np.concatenate([train.items, negatives.reshape(-1)])
        labels = np.concatenate([np.ones(len(train), np.float32), np.zeros(negatives.size, np.float32)])
        order = rng.permutation(users.size)
        users_t = torch.as_tensor(users[order], device=self.device)
        items_t = torch.as_tensor(items[order], device=self.device)
        labels_t = torch.as_tensor(labels[order], device=self.device)
        live.model.train()
        total, steps = 0.0, 0
        num_hidden = len(self.config.hidden)
        for start in range(0, users.size, self.config.batch_size):
            u = users_t[start:start + self.config.batch_size]
            logits = ncf_candidate_logits(live.model.params, num_hidden, u,
                                          items_t[start:start + self.config.batch_size, None])[:, 0]  # (B,)
            loss = F.binary_cross_entropy_with_logits(logits, labels_t[start:start + self.config.batch_size])
            live.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            live.optimizer.step()
            total, steps = total + loss.item(), steps + 1
        return live, {"loss": total / max(steps, 1)}

    def scorer(self, live: _LocalModel) -> PairScorer:
        live.model.eval()
        params, num_hidden = live.model.params, len(self.config.hidden)
        return lambda users, items: ncf_candidate_logits(params, num_hidden, users, items)

    def model(self, live: _LocalModel):
        return live.model


class _LightGCNDomain:
    """One domain's LightGCN on its training graph (the live model is in a :class:`_LocalModel`)."""

    def __init__(self, split: InteractionSplit, config: LightGCNConfig, index: int, device):
        self.split, self.config, self.index, self.device = split, config, index, device
        self.sampler = NegativeSampler(split.train, split.num_items)

    def init(self) -> _LocalModel:
        config, split = self.config, self.split
        model = LightGCN(split.train, split.num_users, split.num_items, config.dim, config.num_layers,
                         init_std=config.init_std, combine="mean", generator=_init_generator(config.seed, self.index))
        with warnings.catch_warnings():  # "CSR support is in beta": same products, ~1.5x faster on CPU
            warnings.simplefilter("ignore", UserWarning)
            model.adjacency = model.adjacency.to_sparse_csr()
        model.to(self.device)
        return _LocalModel(model, adam(model.parameters(), lr=config.lr), _domain_rng(config.seed, self.index))

    def train_epoch(self, live: _LocalModel) -> Tuple[_LocalModel, Dict[str, float]]:
        """One (u, i, j) triple per training pair (BPR), or ``k`` negatives per pair (BCE)."""
        train, config, model, rng = self.split.train, self.config, live.model, live.rng
        k = 1 if config.loss == "bpr" else config.num_negatives
        order = rng.permutation(len(train))
        users = train.users[order]
        positives = train.items[order]
        negatives = self.sampler.sample(users, k, rng)  # (P, k)
        users_t = torch.as_tensor(users, device=self.device)
        pos_t = torch.as_tensor(positives, device=self.device)
        neg_t = torch.as_tensor(negatives, device=self.device)
        model.train()
        total, steps = 0.0, 0
        for start in range(0, users.size, config.batch_size):
            u = users_t[start:start + config.batch_size]
            pos = pos_t[start:start + config.batch_size]
            neg = neg_t[start:start + config.batch_size]  # (B, k)
            if config.loss == "bpr":
                loss = model.bpr_loss(u, pos, neg[:, 0], l2=config.l2)
            else:
                all_users = torch.cat([u, u.repeat_interleave(k)])
                all_items = torch.cat([pos, neg.reshape(-1)])
                labels = torch.cat([torch.ones_like(pos, dtype=torch.float32),
                                    torch.zeros(neg.numel(), dtype=torch.float32, device=self.device)])
                loss = model.bce_loss(all_users, all_items, labels)
            live.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            live.optimizer.step()
            total, steps = total + loss.item(), steps + 1
        return live, {"loss": total / max(steps, 1)}

    def scorer(self, live: _LocalModel) -> PairScorer:
        live.model.eval()
        with torch.no_grad():
            user_nodes, item_nodes = live.model.propagate()  # one propagation per evaluation (valid and test share it)
        return lambda users, items: lightgcn_candidate_logits(user_nodes, item_nodes, users, items)

    def model(self, live: _LocalModel):
        return live.model


def clients_per_round(num_active: int, fraction: float) -> Optional[int]:
    """Clients sampled per round: ``max(1, round(ρ · active users))``; ``None`` (= all) when that is all."""
    if num_active < 1:
        raise ValueError("the domain has no user with training data, so no client can be sampled")
    count = max(1, int(round(float(fraction) * num_active)))
    return None if count >= num_active else count


def fedncf_engine_method(split: InteractionSplit, config: FedNCFConfig) -> FederatedMethod:
    """FedNCF of one domain as an engine method.

    NeuMF backbone with private user tables (``user_emb``, ``user_emb_gmf``), public item
    tables, tower and head; every client steps all its tensors with a fresh Adam of step
    ``lr``; FedAvg weighted by each client's example count; only touched item rows are sent.
    """
    backbone = FedNCF(split.num_users, split.num_items, config.dim, variant="neumf", hidden=config.hidden,
                      private_head=False, init="ncf")
    return fedncf_method(backbone, lr=config.lr, optimizer="adam", aggregation=Aggregation("num_examples"),
                         upload_mode="rows")


@dataclass
class _FederatedDomain:
    """The live state of one domain's FedNCF: the engine's parameter-averaging state and the bytes sent so far."""

    averaging: AveragingState
    bytes_up: int = 0
    bytes_down: int = 0


class _FedNCFDomain:
    """One domain's FedNCF: the engine's :class:`~fedlib.engine.loop.ParameterAveraging`, one round per epoch.

    The domain's rounds draw their plans from ``round_generator(seed · 1000 + index, t)``, the
    stream of the engine's own runs for this domain.
    """

    def __init__(self, split: InteractionSplit, config: FedNCFConfig, index: int, device):
        self.split, self.config, self.device = split, config, device
        self.method = fedncf_engine_method(split, config)
        if self.method.before_round is not None:
            raise ValueError("FedNCF's engine method has a before_round hook, which this one-round-per-epoch "
                             "driver does not call")
        self.engine_config = FederatedConfig(
            rounds=0, seed=int(config.seed) * 1000 + int(index), num_negatives=config.num_negatives,
            batch_size=config.batch_size, local_epochs=config.local_epochs,
            clients_per_round=clients_per_round(split.train.active_users().size, config.client_fraction),
            eval_every=1, patience=None, test_at_end=False, dtype=config.dtype)
        executor = make_executor(config.executor, **({"chunk_size": config.chunk_size}
                                                     if config.executor == "batched" else {}))
        self.averaging = ParameterAveraging(self.method, split.train, self.engine_config, executor=executor,
                                            sampler=NegativeSampler(split.train, split.num_items), device=device)

    def init(self) -> _FederatedDomain:
        return _FederatedDomain(self.averaging.init(self.engine_config.seed))

    def train_epoch(self, live: _FederatedDomain, round_index: int) -> Tuple[_FederatedDomain, Dict[str, float]]:
        """Communication round ``round_index``: sample clients, local Adam, weighted FedAvg."""
        seed = self.engine_config.seed
        ledger = CommunicationLedger()
        context = RoundContext(index=round_index, seed=seed, rng=round_generator(seed, round_index), ledger=ledger)
        plan = self.averaging.plan_round(live.averaging, context)
        averaging, report = self.averaging.run_round(live.averaging, plan, context)
        live = _FederatedDomain(averaging, live.bytes_up + ledger.total("upload"),
                                live.bytes_down + ledger.total("download"))
        return live, {"loss": float(report.train_loss)}

    def params(self, live: _FederatedDomain) -> Dict[str, torch.Tensor]:
        return {**live.averaging.global_state, **live.averaging.private_state}

    def scorer(self, live: _FederatedDomain) -> PairScorer:
        params, num_hidden = self.params(live), len(self.config.hidden)
        return lambda users, items: ncf_candidate_logits(params, num_hidden, users, items)

    def model(self, live: _FederatedDomain):
        return self.method.model


# --------------------------------------------------------------------------------------
# The algorithm shared by the three baselines
# --------------------------------------------------------------------------------------
@dataclass
class SingleDomainState:
    """Every domain's live state (:class:`_LocalModel` or :class:`_FederatedDomain`), in ``split.domains`` order."""

    domains: List[Any]


class SingleDomainBaseline(CrossDomainAlgorithm):
    """One model per domain, trained side by side: one round = one epoch (one FedNCF round) of every domain.

    Evaluation and selection are the family's (:mod:`fedlib.baselines.cross_domain.cdr_common`): the mean
    over domains of the validation HR@10 selects one round for the whole run.
    """

    def __init__(self, split: DomainSplit, config: AnyConfig, domain_class, device, ks: Sequence[int]):
        self.split, self.config, self.seed, self.device, self.ks = split, config, int(config.seed), device, tuple(ks)
        self.domains = [domain_class(split[name], config, i, device) for i, name in enumerate(split.domains)]

    def init(self, seed: int) -> SingleDomainState:
        return SingleDomainState([domain.init() for domain in self.domains])

    def run_round(self, state: SingleDomainState, plan: int, context: RoundContext
                  ) -> Tuple[SingleDomainState, RoundReport]:
        logged: Dict[str, float] = {}
        lives = []
        for name, domain, live in zip(self.split.domains, self.domains, state.domains):
            args = (context.index,) if isinstance(domain, _FedNCFDomain) else ()
            live, losses = domain.train_epoch(live, *args)
            lives.append(live)
            logged.update({f"{name}/{key}": value for key, value in losses.items()})
        loss = float(np.mean([value for key, value in logged.items() if key.endswith("/loss")]))
        return SingleDomainState(lives), RoundReport(train_loss=loss, logged=logged)

    def scorers(self, state: SingleDomainState) -> Dict[str, PairScorer]:
        return {name: domain.scorer(live) for name, domain, live in zip(self.split.domains, self.domains, state.domains)}

    def models(self, state: SingleDomainState) -> Dict[str, Any]:
        return {name: domain.model(live) for name, domain, live in zip(self.split.domains, self.domains, state.domains)}



def _check_split(split: DomainSplit) -> None:
    if not isinstance(split, DomainSplit):
        raise ValueError(f"split must be a DomainSplit (fedlib.data.protocols.fedpcl_cdr.build or "
                         f"fedlib.data.synthetic.overlapping_domains), got {type(split).__name__}")
    if len(split.domains) < 1:
        raise ValueError("split has no domain")


def _check_config(config, expected: type) -> None:
    if not isinstance(config, expected):
        raise ValueError(f"expected a {expected.__name__}, got {type(config).__name__}; "
                         f"train_single_domain(split, config) picks the trainer from the config type")


def _train(split: DomainSplit, config: AnyConfig, domain_class, rounds: int,
           summarise: Callable[[SingleDomainBaseline, RunResult], RunSummary], **options) -> RunResult:
    """:func:`~fedlib.baselines.cross_domain.cdr_common.train_with` of a :class:`SingleDomainBaseline`
    (``options``: ``device``, ``progress``, ``ks``, ``checkpointer``, ``on_round_end``)."""
    _check_split(split)
    ks = options.pop("ks")
    return train_with(lambda device: SingleDomainBaseline(split, config, domain_class, device, ks), config,
                      method=config.model, rounds=rounds, summarise=summarise, checkpoint_config=_checkpoint_config,
                      **options)


def _checkpoint_config(config) -> Dict[str, Any]:
    """The config as plain values (a checkpoint made under another one is refused)."""
    return {"method": config.model, **{k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()}}


def _epochs_and_models(algorithm: SingleDomainBaseline, run: RunResult) -> RunSummary:
    """NeuMF's and LightGCN's summary: ``epochs_run`` and each domain's trained model."""
    return RunSummary(scalars={"epochs_run": run.round_index}, models=algorithm.models(run.state))


def _fedncf_summary(algorithm: SingleDomainBaseline, run: RunResult) -> RunSummary:
    """FedNCF's: rounds, bytes over all domains and rounds, clients per round; models and engine states."""
    names, lives = algorithm.split.domains, run.state.domains
    scalars: Dict[str, float] = {"rounds_run": run.round_index,
                               "bytes_up": sum(live.bytes_up for live in lives),
                               "bytes_down": sum(live.bytes_down for live in lives)}
    for name, domain in zip(names, algorithm.domains):
        per_round = domain.engine_config.clients_per_round
        scalars[f"{name}/clients_per_round"] = per_round if per_round is not None else domain.split.train.active_users().size
    return RunSummary(scalars=scalars, models=algorithm.models(run.state),
                      artifacts={"states": {name: live.averaging for name, live in zip(names, lives)}})


def train_neumf(split: DomainSplit, config: NeuMFConfig = NeuMFConfig(), *, device=None, progress: Progress = None,
                ks: Sequence[int] = (5, 10), checkpointer=None, on_round_end=None) -> RunResult:
    """NeuMF on every domain of ``split`` alone (see the module docstring).

    Arguments and the family's artifacts: :func:`~fedlib.baselines.cross_domain.cdr_common.train_with`
    (the same for every trainer here); ``models``: the NeuMF of each domain; ``scalars``:
    ``epochs_run``; history rows carry ``<domain>/loss``.
    """
    _check_config(config, NeuMFConfig)
    return _train(split, config, _NeuMFDomain, config.epochs, _epochs_and_models, device=device, progress=progress,
                  ks=ks, checkpointer=checkpointer, on_round_end=on_round_end)


def train_lightgcn(split: DomainSplit, config: LightGCNConfig = LightGCNConfig(), *, device=None,
                   progress: Progress = None, ks: Sequence[int] = (5, 10), checkpointer=None,
                   on_round_end=None) -> RunResult:
    """LightGCN on every domain's training graph alone (see the module docstring).

    ``models``: the LightGCN of each domain; ``scalars``: ``epochs_run``.
    """
    _check_config(config, LightGCNConfig)
    return _train(split, config, _LightGCNDomain, config.epochs, _epochs_and_models, device=device,
                  progress=progress, ks=ks, checkpointer=checkpointer, on_round_end=on_round_end)


def train_fedncf(split: DomainSplit, config: FedNCFConfig = FedNCFConfig(), *, device=None, progress: Progress = None,
                 ks: Sequence[int] = (5, 10), checkpointer=None, on_round_end=None) -> RunResult:
    """FedNCF (users as clients, FedAvg by sample count) in every domain alone.

    ``scalars``: ``rounds_run``, clients per round and measured bytes (``bytes_up``/``bytes_down``
    over all domains and rounds); ``models``: the :class:`~fedlib.models.ncf.FedNCF` backbone of
    each domain; own artifact ``states``: each domain's final engine
    :class:`~fedlib.engine.loop.AveragingState` (public and private tensors). History rows are
    indexed by round.
    """
    _check_config(config, FedNCFConfig)
    return _train(split, config, _FedNCFDomain, config.rounds, _fedncf_summary, device=device, progress=progress,
                  ks=ks, checkpointer=checkpointer, on_round_end=on_round_end)


_TRAINERS = {NeuMFConfig: train_neumf, LightGCNConfig: train_lightgcn, FedNCFConfig: train_fedncf}


def train_single_domain(split: DomainSplit, config: AnyConfig, *, device=None, progress: Progress = None,
                        ks: Sequence[int] = (5, 10), checkpointer=None, on_round_end=None) -> RunResult:
    """Run the baseline named by ``config.model`` (``"NeuMF"``, ``"LightGCN"`` or ``"FedNCF"``)."""
    trainer = _TRAINERS.get(type(config))
    if trainer is None:
        raise ValueError(f"config must be one of NeuMFConfig, LightGCNConfig, FedNCFConfig (models {MODELS}), "
                         f"got {type(config).__name__}")
    return trainer(split, config, device=device, progress=progress, ks=ks, checkpointer=checkpointer,
                   on_round_end=on_round_end)
