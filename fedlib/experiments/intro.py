"""Lesson 00 (federated recommendation from scratch): the two steps its cells and exercises call.

* :func:`train_centralised_selected`: centralised MF on pooled data, one epoch at a time,
  selected on validation like the federated runs (best state, patience);
* :func:`attack_one_round`: one round of FedMF uploads seen by an honest-but-curious server,
  scored for the changed-rows and sign attacks of :mod:`fedlib.audits.inference_attack`;
* :func:`short_run`: a few rounds of a federated method, summarised (exercises 1-2).
"""
from __future__ import annotations

import time
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import pandas as pd
import torch

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import Pairs
from fedlib.engine.centralised import CentralisedState, sgd_centralised
from fedlib.engine.executors import BatchedExecutor
from fedlib.engine.loop import FederatedConfig, ParameterAveraging, run_federated
from fedlib.engine.method import FederatedMethod
from fedlib.engine.plan import make_round_plan, round_generator
from fedlib.engine.trainer import Schedule, start_run
from fedlib.engine.trainer import train as train_rounds
from fedlib.audits.inference_attack import attack_scores, changed_rows_attack, sign_attack
from fedlib.models.mf import MF

__all__ = ["train_centralised_selected", "attack_one_round", "short_run", "NOISE_FLOOR_FACTOR"]

#: A ``d``-dimensional vector of i.i.d. Laplace(λ) entries has norm about ``√(2d)·λ``; a
#: noise-aware server keeps only rows whose change exceeds ``NOISE_FLOOR_FACTOR · √d · λ``.
NOISE_FLOOR_FACTOR = 3.0


def train_centralised_selected(model: MF, train: Pairs, num_items: int, evaluate_valid: Callable, *, epochs: int,
                               lr: float, batch_size: int, num_negatives: int, seed: int, eval_every: int,
                               patience: Optional[int], sampler: Optional[NegativeSampler] = None,
                               ) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor], pd.DataFrame]:
    """Train centralised MF epoch by epoch with the trainer and keep the state best on validation.

    The :class:`~fedlib.engine.centralised.Centralised` algorithm (one round = one epoch over
    the pooled data) under a :class:`~fedlib.engine.trainer.Schedule` with ``eval_every`` and
    ``patience``: the trainer's one selection rule (the first best wins ties).

    Args:
        model: a :class:`~fedlib.models.mf.MF` (trained in place).
        evaluate_valid: ``(global_state, private_state) -> score`` (higher is better), with the
            states in FedMF's layout ``{"item_emb": (I, d)}``, ``{"user_emb": (U, d)}``.
        eval_every: evaluate every k epochs and after the last one; ``patience``: stop after
            that many evaluations without improvement (``None`` = never).
        Other arguments as :func:`~fedlib.engine.centralised.train_centralised` (epoch ``e``
        draws from ``round_generator(seed, e)``).

    Returns:
        ``(global_state, private_state, history)``: the best states (copies) and one history
        row per evaluated epoch (``round`` = epoch, ``train_loss``, ``valid/score``).
    """
    def fedmf_layout(state: CentralisedState):
        return ({"item_emb": state.params["item_emb"].detach().clone()},
                {"user_emb": state.params["user_emb"].detach().clone()})

    def evaluator(state: CentralisedState, split: str) -> Dict[str, float]:
        return {"score": float(evaluate_valid(*fedmf_layout(state)))}

    algorithm = sgd_centralised(model, train, num_items, lr=lr, batch_size=batch_size, num_negatives=num_negatives,
                                sampler=sampler, evaluator=evaluator)
    schedule = Schedule(rounds=epochs, eval_every=eval_every, patience=patience, selection_metric="score",
                        test_at_end=False)
    start = start_run(algorithm, schedule, seed)
    start.state = algorithm.state_from(dict(model.named_parameters()))  # the model itself is trained
    run = train_rounds(algorithm, schedule, seed=seed, start=start)
    history = [{k: row[k] for k in ("round", "train_loss", "valid/score")} for row in run.history
               if "valid/score" in row]
    best_global, best_private = fedmf_layout(run.best_state)
    return best_global, best_private, pd.DataFrame(history)


def attack_one_round(method: FederatedMethod, global_state: Dict[str, torch.Tensor],
                     private_state: Dict[str, torch.Tensor], train: Pairs, sampler: NegativeSampler, *,
                     clients_per_round: int, seed: int, round_index: int = 10_000, num_negatives: int = 4,
                     batch_size: int = 512, local_epochs: int = 1) -> pd.DataFrame:
    """Run one round of local updates from the given state and attack every client's upload.

    The server sees each client's uploaded change of the item table ``item_emb`` (noise
    included when ``method.upload_noise`` is set) and guesses the client's training
    positives with four attacks: changed rows, sign, and both restricted to rows whose
    change exceeds the noise floor ``NOISE_FLOOR_FACTOR · √d · λ`` (λ = the upload noise
    scale, 0 without noise). The states are not modified (the executor updates a copy of
    the private state).

    Returns:
        One row per attack: ``attack``, ``precision``, ``recall`` (means over the attacked
        clients), ``noise scale λ``, ``negatives``, ``local epochs`` and ``positive share``: the
        mean over the attacked clients of ``n⁺/I`` (the precision of guessing every item).
    """
    plan = make_round_plan(train, sampler, round_generator(seed, round_index), round_index=round_index,
                           num_negatives=num_negatives, batch_size=batch_size, local_epochs=local_epochs,
                           clients_per_round=clients_per_round)
    private_copy = {name: tensor.clone() for name, tensor in private_state.items()}
    result = BatchedExecutor().local_updates(method, global_state, private_copy, plan,
                                             method.aggregation.client_weights(plan.num_examples),
                                             return_client_updates=True, noise_seed=seed)
    uploads = result.client_updates["item_emb"]
    scale = float(method.upload_noise.scale) if method.adds_upload_noise else 0.0
    noise_floor = NOISE_FLOOR_FACTOR * np.sqrt(global_state["item_emb"].shape[1]) * scale
    positive_share = float(np.mean(train.counts()[plan.clients] / global_state["item_emb"].shape[0]))
    rows = []
    for name, attack, threshold in (("changed rows", changed_rows_attack, 0.0), ("sign", sign_attack, 0.0),
                                    ("changed rows, above noise", changed_rows_attack, noise_floor),
                                    ("sign, above noise", sign_attack, noise_floor)):
        score = attack_scores(attack(uploads, threshold=threshold), train)
        rows.append({"noise scale λ": scale, "attack": name, "precision": score.precision, "recall": score.recall,
                     "negatives": num_negatives, "local epochs": local_epochs, "positive share": positive_share})
    return pd.DataFrame(rows)


def short_run(method: FederatedMethod, train: Pairs, evaluator: Callable, *, rounds: int, seed: int,
              num_negatives: int = 4, batch_size: int = 512, clients_per_round: Optional[int] = None,
              metric: str = "NDCG@20", device=None) -> Dict[str, float]:
    """Train ``method`` for ``rounds`` rounds and summarise what changed (the lesson's exercises 1-2).

    Args:
        evaluator: e.g. :class:`~fedlib.engine.evaluation.RankingEvaluator`; evaluated on
            validation once, after the last round.
        clients_per_round: users sampled per round (``None`` = all).

    Returns:
        ``{"valid <metric>": after the last round, "valid <metric> at start": before training,
        "item table change": relative Frobenius change ‖Q_T − Q_0‖ / ‖Q_0‖ of ``item_emb``,
        "users trained": share of users whose private state changed (took part at least once),
        "seconds per round": wall time of training / rounds}``.
    """
    config = FederatedConfig(rounds=rounds, seed=seed, num_negatives=num_negatives, batch_size=batch_size,
                             clients_per_round=clients_per_round, eval_every=rounds, test_at_end=False,
                             selection_metric=metric)
    start = ParameterAveraging(method, None, config, device=device).init(config.seed)  # what run_federated draws
    initial_items = start.global_state["item_emb"].clone()
    initial_private = {name: tensor.clone() for name, tensor in start.private_state.items()}
    at_start = float(evaluator(method.model, start.global_state, start.private_state, "valid")[metric])
    t0 = time.perf_counter()
    run = run_federated(method, train, config, evaluator=evaluator, state=start)
    seconds = time.perf_counter() - t0
    last = run.state
    change = torch.linalg.norm(last.global_state["item_emb"] - initial_items) / torch.linalg.norm(initial_items)
    trained = torch.zeros(method.model.num_users, dtype=torch.bool)
    for name, before in initial_private.items():  # a user was trained if any of its private rows moved
        trained |= (last.private_state[name] != before).reshape(before.shape[0], -1).any(1).cpu()
    return {f"valid {metric}": float(run.history[-1][f"valid/{metric}"]), f"valid {metric} at start": at_start,
            "item table change": float(change), "users trained": float(trained.float().mean()),
            "seconds per round": seconds / rounds}
