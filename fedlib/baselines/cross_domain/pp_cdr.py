r"""What the privacy-preserving CDR baselines of FedPCL-CDR's Table 2 (PriCDR, P2FCDR, P²DTR) share.

All three are **dual-target**: a :class:`~fedlib.data.splits.DomainSplit` with exactly two
domains ``A``, ``B``, users ``0 .. n_o − 1`` the same people in both, every domain a target
(each gets its own recommender, evaluated with :mod:`fedlib.baselines.cross_domain.cdr_common`). What
differs is what crosses the domain boundary and how it is protected.

Notation: ``U`` users, ``I`` items of a domain, ``d`` the embedding size, ``n_o`` shared
users, ``p_u`` / ``q_i`` a domain's user / item embeddings, ``σ`` the logistic function.
Every domain recommender scores ``ŷ_ui = σ(h_uᵀ q_i)`` with a method-specific user vector
``h_u`` and is trained with BCE on each training pair plus one sampled negative (the common
setting of this comparison)::

    L_rec = −mean_{(u,i,y)} [y log ŷ_ui + (1 − y) log(1 − ŷ_ui)]

Each method has its module, with its paper, equations and simplifications:
:mod:`fedlib.baselines.cross_domain.pricdr` (differentially private publication of the source rating matrix),
:mod:`fedlib.baselines.cross_domain.p2fcdr` (orthogonal mapping + LDP on the shared users' embeddings, gated
fusion) and :mod:`fedlib.baselines.cross_domain.p2dtr` (PSI of the user sets, prototype federated learning).
This module holds their common side of the trainer: :class:`DualTargetState` (the live state
of a run), :class:`DualTargetAlgorithm` (one round = one epoch of both domains, evaluated by
:mod:`fedlib.baselines.cross_domain.cdr_common`), :func:`dual_target_checkpoint_config`, the BCE step and the epoch's
batches, and the checks every config shares.

What left a domain (Table 5's reconstruction attack)
---------------------------------------------------
``result.artifacts["transmitted"][domain] = {"sent": (n, ·), "private": (n, d)}``, one row
per shared user in user-id order, from the last round: P2FCDR ``sent`` = the noisy
messages ``m_u`` and ``private`` = the embeddings ``p_u`` they were computed from; P²DTR
``sent`` = the prototype of the user's cluster ``c_{ℓ_u}`` and ``private`` = the embeddings
the k-means summarised. PriCDR publishes a matrix instead (``artifacts["published"]``).

Simplifications on this machine
-------------------------------
* **One backbone.** Every domain recommender is a dot-product embedding model with BCE and
  one sampled negative (``d = 64``, Adam 1e-3, batch 256): PriCDR's target DNN (DMF towers
  over rating rows) is reduced to embedding tables, P2FCDR's and P²DTR's backbones likewise.
  The methods differ only in their defining mechanism (each module's docstring).
* **Exactly two domains**, one selected epoch for both (mean validation HR@10, patience), as
  every method of this comparison.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import DomainSplit, InteractionSplit
from fedlib.engine.algorithm import RoundContext, RoundReport
from fedlib.baselines.cross_domain.cdr_common import CrossDomainAlgorithm, Progress

__all__ = ["DualTargetState", "DualTargetAlgorithm", "dual_target_checkpoint_config", "bce_step", "mean_logs", "training_batches",
           "normal_table", "child_seed", "require_non_negative", "check_dual_target", "Progress"]

# --------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------
def require_non_negative(config, *keys: str) -> None:
    """Raise ``ValueError`` naming ``<Config>.<key>`` unless every key is a finite number >= 0."""
    for key in keys:
        value = getattr(config, key)
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{type(config).__name__}.{key} must be a finite number >= 0, got {value!r}")


def check_dual_target(split: DomainSplit, method: str) -> None:
    """Raise ``ValueError`` unless ``split`` has exactly two domains sharing at least one user."""
    if len(split.domains) != 2:
        raise ValueError(f"{method} is a dual-target method and needs exactly two domains, got "
                         f"{len(split.domains)} ({list(split.domains)}); run it once per pair of domains")
    if split.num_overlap_users < 1:
        raise ValueError(f"{method} transfers knowledge through shared users, but the split has none "
                         f"(num_overlap_users = 0); build the split with overlapping users")


def normal_table(shape: Tuple[int, ...], std: float, generator: torch.Generator) -> torch.Tensor:
    """An embedding table of ``shape`` drawn from ``N(0, std²)`` by ``generator``."""
    return torch.randn(shape, generator=generator) * std


def child_seed(generator: torch.Generator) -> int:
    """A seed in ``[0, 2³¹ − 1)`` drawn from ``generator`` (for a layer initialised by the global generator)."""
    return int(torch.randint(0, 2 ** 31 - 1, (1,), generator=generator))


def training_batches(part: InteractionSplit, sampler: NegativeSampler, batch_size: int, negatives: int,
                     rng: np.random.Generator):
    """One epoch of ``(users, items, labels)`` numpy batches: ``B`` positives then ``B·n`` negatives."""
    train = part.train
    order = rng.permutation(len(train))
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        users = train.users[rows]
        sampled = sampler.sample(users, negatives, rng)  # (B, n)
        yield (np.concatenate([users, np.repeat(users, negatives)]),
               np.concatenate([train.items[rows], sampled.reshape(-1)]),
               np.concatenate([np.ones(len(rows), np.float32), np.zeros(sampled.size, np.float32)]))


def _dot_scores(user_vectors: torch.Tensor, item_table: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """``(n, d)`` users and ``(n, C)`` item ids → ``(n, C)`` dot products."""
    return torch.einsum("nd,ncd->nc", user_vectors, item_table[items])


def _scorer(model: nn.Module):
    """A :data:`~fedlib.baselines.cross_domain.cdr_common.PairScorer` of ``model.user_vectors`` · item embeddings."""
    model.eval()

    def score(users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return _dot_scores(model.user_vectors(users), model.item_emb, items)

    return score


@dataclass
class DualTargetState:
    """The live state of a dual-target run: per domain its model and Adam, the epoch generator
    ``rng`` (batches, negatives, sampled rows), and ``torch_rng``, the global torch generator's
    state (dropout draws from it), restored around every epoch so that checkpoints capture it;
    ``messages``: what the method exchanged last (P2FCDR's messages, P²DTR's uploads), plain tensors."""

    models: Dict[str, nn.Module]
    optimizers: Dict[str, torch.optim.Optimizer]
    rng: np.random.Generator
    torch_rng: torch.Tensor
    generators: Dict[str, torch.Generator] = field(default_factory=dict)
    messages: Dict[str, Dict[str, object]] = field(default_factory=dict)


class DualTargetAlgorithm(CrossDomainAlgorithm):
    """The three methods' side of the trainer: one round = one epoch of both domains.

    A subclass builds the state in :meth:`_build` (models, optimisers, generators, in the order
    of the original setup) and trains one epoch in :meth:`_epoch`; both run with the global
    torch generator seeded by ``config.seed`` (init) or restored from the state (epochs), inside
    ``fork_rng`` so the caller's global generator is untouched.
    """

    def __init__(self, split: DomainSplit, config, device, ks: Sequence[int]):
        self.split, self.config, self.seed, self.device, self.ks = split, config, int(config.seed), device, tuple(ks)
        self.names = list(split.domains)
        self.samplers = {d: NegativeSampler(split[d].train, split[d].num_items) for d in self.names}

    def _build(self) -> DualTargetState:
        raise NotImplementedError

    def _epoch(self, state: DualTargetState, epoch: int) -> Dict[str, float]:
        raise NotImplementedError

    def init(self, seed: int) -> DualTargetState:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.seed)  # dropout draws from the global RNG
            state = self._build()
            state.torch_rng = torch.get_rng_state()
        return state

    def run_round(self, state: DualTargetState, plan: int, context: RoundContext
                  ) -> Tuple[DualTargetState, RoundReport]:
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(state.torch_rng)
            logged = self._epoch(state, context.index + 1)
            state.torch_rng = torch.get_rng_state()
        losses = [value for key, value in logged.items() if key.endswith("/loss_rec")]
        return state, RoundReport(train_loss=float(np.mean(losses)) if losses else math.nan, logged=logged)

    def scorers(self, state: DualTargetState):
        return {d: _scorer(state.models[d]) for d in self.names}

    def _models_and_optimizers(self, make_model) -> Tuple[Dict[str, nn.Module], Dict[str, torch.optim.Optimizer]]:
        """``make_model(index, name)`` for both domains, each with its Adam (lr, weight decay of the config)."""
        models, optimizers = {}, {}
        for index, name in enumerate(self.names):
            models[name] = make_model(index, name).to(self.device)
            optimizers[name] = torch.optim.Adam(models[name].parameters(), lr=self.config.lr,
                                                weight_decay=self.config.weight_decay)
        return models, optimizers


def dual_target_checkpoint_config(config) -> Dict[str, object]:
    """The config as plain values under its class name (the ``checkpoint_config`` of PriCDR, P2FCDR and P²DTR
    for :func:`~fedlib.baselines.cross_domain.cdr_common.train_with`: a checkpoint made under others is refused)."""
    return {"method": type(config).__name__, **asdict(config)}


def bce_step(model: nn.Module, optimizer: torch.optim.Optimizer, users, items, labels, device,
             extra_loss: Optional[Callable[[torch.Tensor], Dict[str, torch.Tensor]]] = None) -> Dict[str, float]:
    """One Adam step on ``L_rec`` (+ the weighted extra terms ``extra_loss(users)`` returns)."""
    u = torch.as_tensor(users, device=device)
    v = torch.as_tensor(items, device=device)
    y = torch.as_tensor(labels, device=device)
    logits = (model.user_vectors(u) * model.item_emb[v]).sum(-1)  # (B(1+n),)
    loss_rec = F.binary_cross_entropy_with_logits(logits, y)
    terms = extra_loss(u) if extra_loss is not None else {}
    loss = loss_rec + sum(terms.values()) if terms else loss_rec
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return {"loss_rec": loss_rec.item(), **{key: value.item() for key, value in terms.items()}}


def mean_logs(rows: List[Dict[str, float]], prefix: str) -> Dict[str, float]:
    """``{"<prefix>/<key>": mean over the batches' rows}`` (``{}`` for no rows)."""
    if not rows:
        return {}
    return {f"{prefix}/{key}": float(np.mean([row[key] for row in rows])) for key in rows[0]}
