"""Centralised training on pooled data: the one-client case of the algorithm interface.

A :class:`Centralised` algorithm's round is one **epoch** over every training pair: fresh
negatives from the same :class:`~fedlib.data.sampling.NegativeSampler` the federated runs use,
a shuffle, mini-batches of BCE with logits (mean over the batch) and an optimiser step per
batch. Epoch ``e`` draws its negatives and then its shuffle from ``context.rng`` =
``round_generator(seed, e)``, so training in several calls (one epoch at a time, evaluating in
between) or resuming from a checkpoint draws what one uninterrupted run would. The trainer
(:func:`fedlib.engine.trainer.train`) owns the epochs, evaluation, selection and early stopping.

:func:`train_centralised` is the thin entry point for "centralised MF vs FedMF" comparisons:
an ``nn.Module`` (``forward(users, items) -> logits``) trained in place with plain SGD and
optional per-parameter learning rates.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import Pairs
from fedlib.engine.algorithm import RoundContext, RoundReport
from fedlib.engine.plan import round_generator
from fedlib.engine.trainer import Schedule, start_run
from fedlib.engine.trainer import train as train_rounds

__all__ = ["CentralisedState", "EpochPlan", "Centralised", "train_centralised"]

#: ``logits(params, users (B,), items (B,)) -> (B,)`` logits of the pooled model
LogitsFn = Callable[[Mapping[str, torch.Tensor], torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class CentralisedState:
    """The pooled model after ``round_index`` epochs.

    Attributes:
        round_index: completed epochs.
        params: ``name -> tensor`` leaf tensors (``requires_grad``) the optimiser steps in place.
        optimizer: the live optimiser over ``params`` (its moments are part of the state).
    """

    round_index: int
    params: Dict[str, torch.Tensor]
    optimizer: torch.optim.Optimizer


@dataclass
class EpochPlan:
    """One epoch's examples in training order: ``users``, ``items``, ``labels`` ``(n (1 + k),)``."""

    users: torch.Tensor
    items: torch.Tensor
    labels: torch.Tensor


class Centralised:
    """One model trained on every user's examples (the one-client case of the interface).

    Args:
        logits: ``logits(params, users, items) -> (B,)`` (e.g. a backbone's server logits).
        init_params: ``seed -> {name: tensor}`` the model before epoch 0.
        make_optimizer: ``params (list of leaf tensors) -> torch.optim.Optimizer``; the same
            factory rebuilds it when a state is copied or loaded.
        train: the pooled training pairs (every user's positives).
        num_items: size of the item id space (for the sampler).
        batch_size: examples per optimiser step; num_negatives: negatives per positive.
        sampler: training negative sampler (default: excludes only ``train``).
        evaluator: ``evaluator(state, split) -> {metric: value}`` (``split`` = ``"valid"`` or
            ``"test"``); ``None`` when the run is not evaluated.
        epochs_per_round: epochs in one round (FedRKG's centralised baselines count a "round"
            as several epochs); epoch ``e = t E + k`` draws from ``round_generator(seed, e)``,
            so a run of ``R`` rounds of ``E`` epochs draws what ``R E`` rounds of one epoch would.
    """

    def __init__(self, logits: LogitsFn, init_params: Callable[[int], Dict[str, torch.Tensor]],
                 make_optimizer: Callable[[List[torch.Tensor]], torch.optim.Optimizer], train: Pairs,
                 num_items: int, *, batch_size: int, num_negatives: int = 4,
                 sampler: Optional[NegativeSampler] = None,
                 evaluator: Optional[Callable[[CentralisedState, str], Dict[str, float]]] = None,
                 epochs_per_round: int = 1):
        if int(batch_size) < 1 or int(num_negatives) < 0:
            raise ValueError(f"batch_size must be >= 1 and num_negatives >= 0, got {batch_size}, {num_negatives}")
        if isinstance(epochs_per_round, bool) or int(epochs_per_round) < 1:
            raise ValueError(f"epochs_per_round must be an integer >= 1, got {epochs_per_round!r}")
        self.epochs_per_round = int(epochs_per_round)
        self.logits, self.init_params, self.make_optimizer = logits, init_params, make_optimizer
        self.train, self.batch_size, self.num_negatives, self.evaluator = train, int(batch_size), int(num_negatives), \
            evaluator
        self.sampler = sampler if sampler is not None else NegativeSampler(train, num_items)

    # --- state ---------------------------------------------------------------------------
    def state_from(self, params: Dict[str, torch.Tensor], round_index: int = 0) -> CentralisedState:
        """A state over the given leaf tensors (trained in place) with a fresh optimiser."""
        return CentralisedState(round_index, params, self.make_optimizer(list(params.values())))

    def init(self, seed: int) -> CentralisedState:
        params = {n: v.detach().clone().requires_grad_(True) for n, v in self.init_params(seed).items()}
        return self.state_from(params)

    def copy_state(self, state: CentralisedState) -> CentralisedState:
        return self.load_state(self.state_dict(state))

    def state_dict(self, state: CentralisedState) -> Dict[str, Any]:
        return {"round_index": state.round_index, "params": {n: v.detach() for n, v in state.params.items()},
                "optimizer": state.optimizer.state_dict()}

    def load_state(self, saved: Mapping[str, Any]) -> CentralisedState:
        params = {n: v.detach().clone().requires_grad_(True) for n, v in saved["params"].items()}
        state = self.state_from(params, int(saved["round_index"]))
        state.optimizer.load_state_dict(saved["optimizer"])  # copies the moments
        return state

    # --- one epoch -------------------------------------------------------------------------
    def plan_round(self, state: CentralisedState, context: RoundContext) -> List[EpochPlan]:
        """Each epoch of the round: fresh negatives for every positive, then a shuffle.

        With one epoch per round both come from ``context.rng``; epoch ``k`` of ``E`` draws from
        ``round_generator(seed, t E + k)``.
        """
        if self.epochs_per_round == 1:
            return [self._epoch_plan(state, context.rng)]
        first = context.index * self.epochs_per_round
        return [self._epoch_plan(state, round_generator(context.seed, first + k)) for k in range(self.epochs_per_round)]

    def _epoch_plan(self, state: CentralisedState, rng: np.random.Generator) -> EpochPlan:
        train, k = self.train, self.num_negatives
        negatives = self.sampler.sample(train.users, k, rng)  # (P, k)
        users = np.repeat(train.users, 1 + k)
        items = np.concatenate([train.items[:, None], negatives], axis=1).ravel()
        labels = np.tile(np.r_[1.0, np.zeros(k)], len(train)).astype(np.float32)
        order = rng.permutation(users.size)
        first = next(iter(state.params.values()))
        return EpochPlan(users=torch.as_tensor(users[order], device=first.device),
                         items=torch.as_tensor(items[order], device=first.device),
                         labels=torch.as_tensor(labels[order], device=first.device, dtype=first.dtype))

    def run_round(self, state: CentralisedState, plan: List[EpochPlan], context: RoundContext
                  ) -> Tuple[CentralisedState, RoundReport]:
        """Mini-batch steps over the round's epochs; ``train_loss``: the mean over epochs of each
        epoch's example-weighted mean BCE."""
        losses = [self._epoch(state, epoch) for epoch in plan]
        state.round_index = context.index + 1
        return state, RoundReport(train_loss=float(np.mean(losses)) if len(losses) > 1 else losses[0])

    def _epoch(self, state: CentralisedState, plan: EpochPlan) -> float:
        total, n = 0.0, plan.users.numel()
        for start in range(0, n, self.batch_size):
            sl = slice(start, start + self.batch_size)
            state.optimizer.zero_grad()
            loss = F.binary_cross_entropy_with_logits(self.logits(state.params, plan.users[sl], plan.items[sl]),
                                                      plan.labels[sl])
            loss.backward()
            state.optimizer.step()
            total += float(loss.detach()) * (min(start + self.batch_size, n) - start)
        return total / n if n else float("nan")

    def evaluate(self, state: CentralisedState, split: str) -> Dict[str, float]:
        if self.evaluator is None:
            raise ValueError("this Centralised algorithm has no evaluator; pass evaluator= or train with "
                             "evaluate=False")
        return self.evaluator(state, split)


def train_centralised(
    model: nn.Module,
    train: Pairs,
    num_items: int,
    *,
    epochs: int,
    lr: Union[float, Mapping[str, float]],
    batch_size: int = 512,
    num_negatives: int = 4,
    seed: int = 0,
    sampler: Optional[NegativeSampler] = None,
    first_epoch: int = 0,
) -> List[float]:
    """Train ``model`` (``forward(users, items) -> logits``) in place for ``epochs`` epochs with SGD.

    Args:
        lr: one learning rate, or ``{parameter name: lr}`` (names from ``named_parameters``;
            unnamed parameters use ``lr["default"]``), e.g. ``{"user_emb": 1.0,
            "item_emb": 1.0, "default": 0.1}``.
        seed: epoch ``e`` draws its negatives and shuffle from ``round_generator(seed, e)``.
        first_epoch: index of the first epoch of this call, so that training in several calls
            (e.g. one epoch at a time, evaluating in between) draws what one call would (plain
            SGD keeps no moments between calls).

    Returns:
        Mean training loss of each epoch.
    """
    algorithm = sgd_centralised(model, train, num_items, lr=lr, batch_size=batch_size, num_negatives=num_negatives,
                                sampler=sampler)
    schedule = Schedule(rounds=int(first_epoch) + int(epochs))
    start = start_run(algorithm, schedule, seed, state=algorithm.state_from(dict(model.named_parameters()),
                                                                            int(first_epoch)), round_index=first_epoch)
    run = train_rounds(algorithm, schedule, seed=seed, start=start, evaluate=False)
    return [float(row["train_loss"]) for row in run.history]


def sgd_centralised(model: nn.Module, train: Pairs, num_items: int, *, lr: Union[float, Mapping[str, float]],
                    batch_size: int, num_negatives: int, sampler: Optional[NegativeSampler] = None,
                    evaluator: Optional[Callable[[CentralisedState, str], Dict[str, float]]] = None,
                    epochs_per_round: int = 1) -> Centralised:
    """:class:`Centralised` over an ``nn.Module``'s parameters with SGD (``lr`` as :func:`train_centralised`).

    The state's parameters are the module's own when the run starts from
    ``state_from(dict(model.named_parameters()))``, so the module is trained in place.
    """
    rates = {"default": lr} if not isinstance(lr, Mapping) else dict(lr)
    names = [name for name, _ in model.named_parameters()]

    def make_optimizer(params: List[torch.Tensor]) -> torch.optim.Optimizer:
        return torch.optim.SGD([{"params": [p], "lr": rates.get(name, rates.get("default", 0.0))}
                                for name, p in zip(names, params)])

    def init_params(seed: int) -> Dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in model.named_parameters()}

    def logits(params, users, items):
        return functional_call(model, dict(params), (users, items))

    return Centralised(logits, init_params, make_optimizer, train, num_items, batch_size=batch_size,
                       num_negatives=num_negatives, sampler=sampler, evaluator=evaluator,
                       epochs_per_round=epochs_per_round)
