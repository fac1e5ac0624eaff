"""FedRKG's experiment: what a cell measures besides training, and the paper's §5.1 memory table.

The pieces :func:`fedlib.papers.fedrkg.experiment.run_cell` composes around the engine's run
(kept apart so that the experiment module reads as the specification of the grid):

* :class:`SelectionRecorder`: model selection as the public code does it, validation and
  test scored at every evaluation, the test metrics kept at the best validation one;
* :func:`run_centralised`: the centralised baselines (MF, NeuMF) on the pooled data,
  evaluated and stopped through the same recorder;
* :func:`guidance_probe`: every user measured just before and after one guidance step, with
  the gate's logits (Tables 4, D.3, D.4);
* :func:`ldp_params`, :func:`ldp_epsilon`: which tables the LDP noise touches and the ε a
  cell's noise buys (Table 5);
* :func:`client_numbers`, :func:`client_memory`: the numbers one client stores, per method
  (§5.1, Table C.1).

Reference: Lim et al., "Federated Recommendation with Knowledge Guidance" (FedRKG),
https://openreview.net/forum?id=oj2Xj8WXih (arXiv:2511.12959); public code
https://github.com/Jaehyung-Lim/fedrkg (``main.py``, ``utils/evaluation_all.py``).
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import pandas as pd
import torch

from fedlib.engine import RankingEvaluator
from fedlib.engine.knowledge import global_knowledge
from fedlib.engine.method import GradientNoise
from fedlib.engine.plan import guidance_participants
from fedlib.engine.selection import Selection
from fedlib.metrics import DivergedModelError, mean_over_users
from fedlib.papers.fedrkg.guidance import gate_logits, guided_backbone
from fedlib.papers.fedrkg.method import GATE_BIAS_KEY, GATE_WEIGHT_KEY, client_parameter_counts

__all__ = ["SELECTION_METRIC", "SelectionRecorder", "run_centralised", "guidance_probe", "ldp_params", "ldp_epsilon",
           "client_numbers", "client_memory"]

#: the validation metric that selects the reported evaluation (the public code's ``>=`` on R@10)
SELECTION_METRIC = "Recall@10"


# ======================================================================================
# Model selection: validation and test at every evaluation, test kept at the best one
# ======================================================================================
class SelectionRecorder:
    """An evaluator for ``run_federated`` that also scores the test set at every evaluation.

    The engine selects on what this returns (validation metrics). The public code evaluates
    the test set at every round and reports it at the best-validation round; storing test
    metrics as we go gives the same numbers without keeping a copy of the best state (whose
    personal tables would double the memory of FedRKG and FedDAE).

    Attributes after the run: ``curve`` (one dict per evaluation: ``valid/<m>``, ``test/<m>``),
    ``best`` (index into ``curve``), ``best_per_user`` (``{metric: (n,) numpy}``, ``best_users``).
    """

    def __init__(self, evaluator: RankingEvaluator, selection_metric: str = SELECTION_METRIC,
                 prefer_later_ties: bool = True):
        self.evaluator, self.selection_metric, self.prefer_later_ties = evaluator, selection_metric, prefer_later_ties
        self.curve: List[Dict[str, float]] = []
        self.best: Optional[int] = None
        self.best_per_user: Dict[str, np.ndarray] = {}
        self.best_users: Optional[np.ndarray] = None
        self.diverged = False  # set once the scores contained NaN (see ``__call__``)

    def __call__(self, model, global_state, private_state, which: str = "valid") -> Dict[str, float]:
        if self.diverged:
            return {self.selection_metric: float("-inf")}
        try:
            both = self.evaluator.per_user_splits(model, global_state, private_state, ("valid", "test"))
        except DivergedModelError:
            # Record the divergence instead of crashing the grid: the run keeps the test
            # metrics of its best evaluation before it, and ``run_cell`` stops training.
            self.diverged = True
            return {self.selection_metric: float("-inf")}
        valid = {k: float(v) for k, v in mean_over_users(both["valid"][1]).items()}
        users, per_user = both["test"]
        test = {k: float(v) for k, v in mean_over_users(per_user).items()}
        self.curve.append({**{f"valid/{k}": v for k, v in valid.items()}, **{f"test/{k}": v for k, v in test.items()}})
        score = valid[self.selection_metric]
        best_score = None if self.best is None else self.curve[self.best][f"valid/{self.selection_metric}"]
        if Selection.improves(score, best_score, self.prefer_later_ties):  # the trainer's rule
            self.best = len(self.curve) - 1
            self.best_users = np.asarray(users)
            self.best_per_user = {k: v.detach().cpu().numpy().astype(np.float32) for k, v in per_user.items()}
        return valid

    def state_dict(self) -> Dict[str, Any]:
        """What a checkpoint keeps of the recorder (tensors and plain values, for ``weights_only`` loads)."""
        return {"curve": [dict(row) for row in self.curve], "best": self.best, "diverged": self.diverged,
                "best_users": None if self.best_users is None else torch.as_tensor(self.best_users),
                "best_per_user": {k: torch.from_numpy(v) for k, v in self.best_per_user.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.curve = [dict(row) for row in state["curve"]]
        self.best, self.diverged = state["best"], bool(state["diverged"])
        self.best_users = None if state["best_users"] is None else state["best_users"].numpy()
        self.best_per_user = {k: v.numpy() for k, v in state["best_per_user"].items()}

    def test_metrics(self) -> Dict[str, float]:
        if self.best is None:
            return {}
        return {k.split("/", 1)[1]: v for k, v in self.curve[self.best].items() if k.startswith("test/")}


class _CentralModel:
    """Adapter: a centralised ``nn.Module`` scored through the federated evaluator."""

    def __init__(self, module):
        self.module = module

    def score_users(self, global_state, private_state, users):
        return self.module.score_users(users)


def run_centralised(config, split, sampler, recorder, device):
    """MF / NeuMF trained on the pooled data by the one trainer, one "round" = ``epochs_per_round`` epochs.

    The recorder is the evaluator (validation selects, the test numbers of the selected round
    are kept); patience counts evaluations, ``ceil(patience_rounds / eval_every)``. Returns the
    trainer's history (one row per round: ``round``, ``train_loss``, ``valid/<metric>`` when
    evaluated).
    """
    from fedlib.engine.centralised import sgd_centralised
    from fedlib.engine.trainer import Schedule, start_run, train
    from fedlib.models.mf import MF
    from fedlib.models.ncf import NeuMF

    p = config["params"]
    generator = torch.Generator().manual_seed(int(config["seed"]))
    if config["method"] == "MF":
        module = MF(split.num_users, split.num_items, config["dim"], generator=generator)
    else:
        module = NeuMF(split.num_users, split.num_items, config["dim"], hidden=tuple(p["hidden"]), generator=generator)
    module = module.to(device)
    model = _CentralModel(module)
    probe = {"device": torch.empty(0, device=device)}

    def evaluate(state, which):
        with torch.no_grad():  # the module holds the state's parameters: it is trained in place
            return recorder(model, probe, {}, which)

    algorithm = sgd_centralised(module, split.train, split.num_items, lr=p["lr"], batch_size=config["batch_size"],
                                num_negatives=config["num_negatives"], sampler=sampler, evaluator=evaluate,
                                epochs_per_round=int(p["epochs_per_round"]))
    schedule = Schedule(rounds=config["rounds"], eval_every=config["eval_every"],
                        patience=math.ceil(config["patience_rounds"] / config["eval_every"]),
                        selection_metric=recorder.selection_metric, prefer_later_ties=recorder.prefer_later_ties,
                        test_at_end=False, keep_best_state=False)
    start = start_run(algorithm, schedule, config["seed"], state=algorithm.state_from(dict(module.named_parameters())))
    return train(algorithm, schedule, seed=config["seed"], start=start).history


# ======================================================================================
# The guidance probe (Tables 4, D.3, D.4)
# ======================================================================================
def guidance_probe(method, config, split, evaluator, fed_config):
    """Wrap ``method.before_round`` to measure every user just before and after one guidance step.

    Records (in the returned dict, filled during the run): per-user test metrics before and
    after, and for adaptive guidance each user's mean gate logit and value over all items and
    over the popular items, computed on the tables just before the commit against that
    round's ``P_g`` with the freshly trained gates (Tables 4, D.3, D.4). ``fed_config`` is the
    run's :class:`~fedlib.engine.FederatedConfig` (its seed replays the round's participants).
    """
    probe: Dict[str, Any] = {"round": config["probe_round"]}
    inner = method.before_round
    model = method.model
    popular = _popular_items(split)

    def per_user(state):
        users, values = evaluator.per_user(model, state.global_state, state.private_state, "test")
        return np.asarray(users).tolist(), {k: v.cpu().numpy().tolist() for k, v in values.items()}

    def hook(run, t, plan):
        if t != config["probe_round"]:
            if inner is not None:
                inner(run, t, plan)
            return
        users, before = per_user(run.state)
        tables_before = run.state.private_state["personal_item_emb"].clone()
        if inner is not None:
            inner(run, t, plan)
        _, after = per_user(run.state)
        probe.update(users=users, before=before, after=after)
        if GATE_WEIGHT_KEY in run.state.extra:
            participants = guidance_participants(split.train, fed_config, t - 1)
            p_g = global_knowledge(tables_before, participants)
            weight, bias = run.state.extra[GATE_WEIGHT_KEY], run.state.extra[GATE_BIAS_KEY]
            rows = {"logit_all": [], "value_all": [], "logit_popular": [], "value_popular": []}
            mask = torch.as_tensor(popular, device=tables_before.device)
            with torch.no_grad():
                for start in range(0, tables_before.shape[0], 256):
                    part = slice(start, start + 256)
                    logits = gate_logits(tables_before[part], p_g, weight[part], bias[part])  # (c, I)
                    values = torch.sigmoid(logits)
                    rows["logit_all"].append(logits.mean(1))
                    rows["value_all"].append(values.mean(1))
                    rows["logit_popular"].append(logits[:, mask].mean(1))
                    rows["value_popular"].append(values[:, mask].mean(1))
            probe["gates"] = {k: torch.cat(v).cpu().numpy().tolist() for k, v in rows.items()}
        del tables_before

    return dataclasses.replace(method, before_round=hook), probe


def _popular_items(split, top_fraction: float = 0.3) -> np.ndarray:
    """Top 30 % of items by training interactions (Table 4's "popular items"), ties by item id."""
    counts = np.bincount(split.train.items, minlength=split.num_items)
    order = np.lexsort((np.arange(split.num_items), -counts))
    mask = np.zeros(split.num_items, dtype=bool)
    mask[order[: int(round(top_fraction * split.num_items))]] = True
    return mask


# ======================================================================================
# Local differential privacy (Table 5)
# ======================================================================================
def ldp_params(method: str) -> Tuple[str, ...]:
    """The parameters whose local gradients are clipped and noised (the uploaded/guided table)."""
    return {"FedRKG": ("personal_item_emb",), "FedRAP": ("personal_item_emb", "item_emb")}.get(method, ("item_emb",))


def ldp_epsilon(config: Mapping[str, Any], split) -> Optional[float]:
    """ε of a cell's LDP setting at δ = 1/#users (Opacus' RDP accountant, one step per round).

    Each user's clipped local gradient is released once per local step with noise of standard
    deviation ``noise_std``, i.e. noise multiplier ``σ = noise_std / clip``; every user takes part
    in every round (sample rate 1). With the paper's ``σ = 0.001 / 0.1 = 0.01`` the guarantee is
    vacuous (ε in the millions), which the notebook states.
    """
    if config["ldp"] is None:
        return None
    from fedlib.engine.privacy import dp_epsilon
    noise = GradientNoise.from_std(clip_norm=config["ldp"]["clip"], noise_std=config["ldp"]["noise_std"])
    steps = max(1, int(math.ceil(np.max(np.diff(split.train.indptr)) * (1 + config["num_negatives"])
                                 / config["batch_size"])))
    with warnings.catch_warnings():
        # Opacus warns that the optimal RDP order is its smallest α: with σ = 0.01 no order gives
        # a useful bound, which is the point the notebook makes with this ε.
        warnings.filterwarnings("ignore", message="Optimal order is the smallest alpha")
        return float(dp_epsilon(noise, steps_per_round=steps, rounds=config["rounds"], sample_rate=1.0,
                                delta=1.0 / split.num_users))


# ======================================================================================
# §5.1, the memory argument: numbers one client stores, per method
# ======================================================================================
def client_numbers(model) -> int:
    """Numbers one client holds: its row of every private tensor + every public tensor.

    Counted from the model's own initialisers on the ``meta`` device (nothing is allocated).
    """
    generator = torch.Generator().manual_seed(0)
    private = model.init_private(generator, device="meta")
    public = model.init_global(generator, device="meta")
    return sum(t[0].numel() for t in private.values()) + sum(t.numel() for t in public.values())


def client_memory(num_items: int = 2042, dim: int = 32) -> pd.DataFrame:
    """Table of §5.1: numbers per client for every method, ours next to the paper's formula.

    Columns: ``method``, ``knowledge`` (single / dual), ``numbers per client (ours)``,
    ``paper formula`` (``None`` where the paper gives none) and ``MiB (float32)``. Default
    sizes: FilmTrust (``m`` = 2,042 items, ``d`` = 32).
    """
    from fedlib.baselines.single_domain.cofedrec import CoFedRecModel
    from fedlib.baselines.single_domain.feddae import FedDAEModel
    from fedlib.baselines.single_domain.fedrap import FedRAP
    from fedlib.baselines.single_domain.gpfedrec import GPFedRecModel
    from fedlib.models import FedMF, FedNCF, PFedRec

    m, d = int(num_items), int(dim)
    rows = [
        ("FedMF", "single", client_numbers(FedMF(2, m, d)), m * d + d),
        ("FedNCF", "single", client_numbers(FedNCF(2, m, d, variant="mlp", hidden=(32,))), None),
        ("PFedRec", "single", client_numbers(PFedRec(2, m, d)), m * d + d + 1),
        ("GPFedRec", "single", client_numbers(GPFedRecModel(2, m, d, hidden=(32, 16, 8))), None),
        ("CoFedRec", "single", client_numbers(CoFedRecModel(2, m, d)), None),
        ("FedRAP", "dual", client_numbers(FedRAP(2, m, d)), 2 * m * d + d + 1),
        ("FedDAE", "dual", client_numbers(FedDAEModel(2, m, latent_dim=d, hidden=(64,))), None),
    ]
    counts = client_parameter_counts(guided_backbone("FedMF", 2, m, d), "adaptive")
    rows.append(("FedRKG (stored)", "single + gate", counts["stored"], m * d + 4 * d + 1))
    rows.append(("FedRKG (peak, during guidance)", "", counts["peak"], 2 * m * d + 4 * d + 1))
    frame = pd.DataFrame(rows, columns=["method", "knowledge", "numbers per client (ours)", "paper formula"])
    frame["MiB (float32)"] = frame["numbers per client (ours)"] * 4 / 2**20
    return frame
