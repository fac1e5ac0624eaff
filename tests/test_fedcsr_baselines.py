"""FedProx trainer for the FedCSR baselines: proximal gradient, μ = 0 is FedAvg, evaluation, loop."""
import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from fedlib.data.synthetic import cross_domain_sequences
from fedlib.baselines.sequential import fedcsr_baselines as FB
from fedlib.baselines.sequential.c2dsr import C2DSRConfig
from fedlib.baselines.sequential.ccdr import CCDRConfig
from fedlib.baselines.sequential.clsr import CLSRConfig
from fedlib.baselines.sequential.conet import CoNetConfig
from fedlib.baselines.sequential.sequences import make_batch
from fedlib.baselines.sequential.sequence_training import (audit_blocks, history_rows, platform_blocks, platform_graphs,
                                                           rank_metrics, selected_blocks)
from fedlib.baselines.sequential.mifn import MIFNConfig
from fedlib.baselines.sequential.pinet import PiNetConfig
from fedlib.baselines.sequential.psjnet import PSJNetConfig
from fedlib.baselines.sequential.tisasrec import TiSASRec, TiSASRecConfig

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def split():
    return cross_domain_sequences(num_users=120, items_a=30, items_b=30, topics=4, num_negatives=20,
                                  num_platforms=3, seed=0)


class Toy(nn.Module):
    """One scalar ``w``; loss ``0.5 (w − c)²`` with ``c`` the batch mean of the last input item / 10."""

    graph_log = []

    def __init__(self, w0=0.5, with_graphs=False):
        super().__init__()
        self.config = SimpleNamespace(maxlen=5)
        self.w = nn.Parameter(torch.tensor(float(w0)))
        if with_graphs:
            self.set_graphs = self._set_graphs
        self.graphs = None

    def _set_graphs(self, graphs):
        self.graphs = graphs

    @staticmethod
    def target(batch):
        return batch.inputs.cross[:, -1].double().mean().float() / 10.0

    def loss(self, batch):
        if self.graphs is not None:
            Toy.graph_log.append(int(self.graphs.cross._nnz()))
        return 0.5 * (self.w - self.target(batch)) ** 2

    def score(self, inputs, candidates, gt_domain):
        return candidates.float() * (1.0 + 0.0 * self.w)      # higher id ranks higher


def _c(split, rows):
    return float(Toy.target(make_batch(split.train, split.num_items_a, split.num_items_b, 5, rows=rows)))


def _tc(**kw):
    base = dict(rounds=1, local_epochs=2, batch_size=100_000, optimizer="sgd", lr=0.1, mu=0.0, seed=0)
    base.update(kw)
    return FB.FedProxConfig(**base)


# ----------------------------------------------------------------------------- FedProx mechanism
def test_proximal_term_value_and_gradient_hand_computed():
    lin = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 2.0]]))
    anchor = {"weight": torch.tensor([[0.0, 1.0]])}
    term = FB.proximal_term(lin, anchor, mu=0.5)
    assert term.item() == pytest.approx(0.25 * (1.0 + 1.0))           # (μ/2)‖w − w_g‖²
    term.backward()
    assert torch.allclose(lin.weight.grad, torch.tensor([[0.5, 0.5]]))  # μ (w − w_g)
    assert FB.proximal_term(lin, anchor, mu=0.0).item() == 0.0


def test_two_local_sgd_steps_with_the_proximal_pull_hand_computed(split):
    one = dataclasses.replace(split, platforms=(split.platforms[0],))
    c, w0, lr, mu = _c(split, split.platforms[0]), 0.5, 0.1, 2.0
    w1 = w0 - lr * (w0 - c)                                   # step 1: w = w_global, no proximal gradient
    w2 = w1 - lr * ((w1 - c) + mu * (w1 - w0))                 # step 2: + μ (w − w_global)
    res = FB.train_federated_baseline(lambda: Toy(w0), one, _tc(mu=mu))
    assert res.artifacts["models"][0].w.item() == pytest.approx(w2, abs=1e-6)
    assert res.history[0]["local_steps"] == 2
    assert res.history[0]["prox"] == pytest.approx(0.5 * (0.0 + 0.5 * mu * (w1 - w0) ** 2), abs=1e-7)
    plain = FB.train_federated_baseline(lambda: Toy(w0), one, _tc(mu=0.0))
    assert abs(plain.artifacts["models"][0].w.item() - w2) > 1e-4   # the proximal term changed the update


def test_mu_zero_is_fedavg_weighted_by_users(split):
    w0, lr = 0.5, 0.1
    locals_, weights = [], []
    for rows in split.platforms:
        c, w = _c(split, rows), w0
        for _ in range(2):                                    # two full-batch SGD steps, no proximal term
            w = w - lr * (w - c)
        locals_.append(w)
        weights.append(np.unique(split.train.users[rows]).size)
    fedavg = float(np.average(locals_, weights=weights))
    res = FB.train_federated_baseline(lambda: Toy(w0), split, _tc(mu=0.0))
    assert res.artifacts["models"][0].w.item() == pytest.approx(fedavg, abs=1e-6)
    assert res.method == "FedAvg-Toy"
    prox = FB.train_federated_baseline(lambda: Toy(w0), split, _tc(mu=5.0))
    assert abs(prox.artifacts["models"][0].w.item() - w0) < abs(fedavg - w0)   # FedProx stays closer to w_global


def test_each_platform_trains_with_its_own_graphs(split):
    Toy.graph_log.clear()
    FB.train_federated_baseline(lambda: Toy(0.5, with_graphs=True), split, _tc(local_epochs=1))
    expected = [int(g.cross._nnz()) for g in platform_graphs(split)]
    assert Toy.graph_log == expected


# ----------------------------------------------------------------------------- evaluation
def test_evaluation_pools_platform_ranks_per_gt_domain(split):
    out = FB.evaluate_baseline(Toy(), split, "test")
    rows = np.concatenate(split.extra["test_platforms"])
    cand = split.test_candidates[rows]
    ranks = 1 + (cand[:, 1:] > cand[:, :1]).sum(1)             # Toy scores = candidate ids
    dom = cand[:, 0] >= split.num_items_a
    assert out["A"] == pytest.approx(rank_metrics(ranks[~dom]))
    assert out["B"] == pytest.approx(rank_metrics(ranks[dom]))
    assert len(out["per_platform"]) == len(split.platforms)


# ----------------------------------------------------------------------------- loop on a real baseline
def test_fedprox_tisasrec_loop_records_history_and_is_deterministic(split):
    cfg = TiSASRecConfig(dim=8, maxlen=8, num_blocks=1, dropout=0.0, seed=0)
    factory = lambda: TiSASRec(split.num_items_a, split.num_items_b, cfg)
    tc = FB.FedProxConfig(rounds=2, local_epochs=1, batch_size=32, mu=0.01, seed=1, patience=5)
    seen = []
    a = FB.train_federated_baseline(factory, split, tc, progress=seen.append)
    b = FB.train_federated_baseline(factory, split, tc)
    rows = history_rows(a)
    assert len(rows) == 2 and seen == rows
    assert [r["loss"] for r in rows] == [r["loss"] for r in history_rows(b)]
    assert rows[1]["loss"] < rows[0]["loss"]
    for key in ("valid/MRR", "test/MRR", "A/test/NDCG@10", "B/valid/HR@1", "prox", "bytes_up"):
        assert key in rows[0] and math.isfinite(rows[0][key]), key
    selected = selected_blocks(a)
    assert set(selected) == {"A", "B"} and "test/MRR" in selected["A"]
    assert a.best_round in (1, 2) and a.audit_round in (1, 2)
    best = max(rows, key=lambda r: r["valid/MRR"])
    assert selected["A"]["valid/MRR"] == pytest.approx(best["A/valid/MRR"])
    audited = max(rows, key=lambda r: r["test/MRR"])                  # the audit: best mean test MRR
    assert a.audit_round == audited["round"]
    assert audit_blocks(a)["B"]["test/MRR"] == pytest.approx(audited["B/test/MRR"])
    assert platform_blocks(a) == []                               # the baselines score no platform on its own
    assert a.method == "FedProx-TiSASRec"


class _Killed(RuntimeError):
    pass


def test_a_fedprox_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_numbers(split, tmp_path):
    """Killed in round 3 after the round-2 checkpoint: the same history, selection and weights as
    one run, and patience stops both at the same round (dropout: torch's generator is resumed too)."""
    from fedlib.engine import Checkpointer

    cfg = TiSASRecConfig(dim=8, maxlen=8, num_blocks=1, dropout=0.2, seed=0)
    factory = lambda: TiSASRec(split.num_items_a, split.num_items_b, cfg)
    tc = FB.FedProxConfig(rounds=6, local_epochs=1, batch_size=32, lr=0.05, mu=0.01, seed=2, patience=2)
    whole = FB.train_federated_baseline(factory, split, tc)

    def kill_at_round_3(row):
        if row["round"] == 3:
            raise _Killed

    with pytest.raises(_Killed):
        FB.train_federated_baseline(factory, split, tc, progress=kill_at_round_3,
                                    checkpointer=Checkpointer(tmp_path, name="cell", every=2))
    again = Checkpointer(tmp_path, name="cell", every=2)
    resumed = FB.train_federated_baseline(factory, split, tc, checkpointer=again)
    strip = lambda run: [{k: v for k, v in row.items() if k != "seconds"} for row in history_rows(run)]
    assert again.resumed_at == [2] and len(resumed.history) == len(whole.history) >= 3
    assert strip(resumed) == strip(whole)
    assert (selected_blocks(resumed), resumed.best_round) == (selected_blocks(whole), whole.best_round)
    assert (audit_blocks(resumed), resumed.audit_round) == (audit_blocks(whole), whole.audit_round)
    [resumed_model], [whole_model] = resumed.artifacts["models"], whole.artifacts["models"]
    for (name, x), y in zip(resumed_model.state_dict().items(), whole_model.state_dict().values()):
        assert torch.equal(x, y), name
    with pytest.raises(ValueError, match="different configuration.*mu"):
        FB.train_federated_baseline(factory, split, dataclasses.replace(tc, mu=0.1),
                                    checkpointer=Checkpointer(tmp_path, name="cell", every=2))


def test_patience_stops_the_run_and_the_selection_is_the_first_best_validation_round(split):
    cfg = TiSASRecConfig(dim=8, maxlen=8, num_blocks=1, dropout=0.0, seed=0)
    factory = lambda: TiSASRec(split.num_items_a, split.num_items_b, cfg)
    res = FB.train_federated_baseline(factory, split, FB.FedProxConfig(rounds=8, local_epochs=1, batch_size=32,
                                                                       lr=0.05, seed=2, patience=1))
    valid = [row["valid/MRR"] for row in res.history]
    first_best = valid.index(max(valid)) + 1
    assert res.best_round == first_best and len(valid) == first_best + 1 < 8   # one round without gain
    test = [row["test/MRR"] for row in res.history]
    assert res.audit_round == test.index(max(test)) + 1


def test_config_validation():
    with pytest.raises(ValueError, match="mu"):
        FB.FedProxConfig(mu=-1.0)
    with pytest.raises(ValueError, match="optimizer"):
        FB.FedProxConfig(optimizer="lbfgs")


# ----------------------------------------------------------------------------- configs
BAD_FIELDS = [
    (TiSASRecConfig, "maxlen", 1, "int >= 2"), (TiSASRecConfig, "time_span", 0, "int >= 1"),
    (TiSASRecConfig, "num_blocks", 1.5, "int >= 1"), (TiSASRecConfig, "dropout", 1.0, r"\[0, 1\)"),
    (PiNetConfig, "num_members", 0, "int >= 1"), (PiNetConfig, "dim", True, "int >= 1"),
    (PSJNetConfig, "num_roles", -1, "int >= 1"), (PSJNetConfig, "dropout", float("nan"), r"\[0, 1\)"),
    (CLSRConfig, "beta", -0.1, "finite number >= 0"), (CLSRConfig, "short_k", 0, "int >= 1"),
    (CLSRConfig, "short_k", 99, "at most maxlen"), (CoNetConfig, "num_negatives", 0, "int >= 1"),
    (CoNetConfig, "hidden", (8, 0), "positive layer sizes"), (CCDRConfig, "gnn_layers", -1, "int >= 0"),
    (CCDRConfig, "edge_drop", -0.2, r"\[0, 1\)"), (CCDRConfig, "lambda_inter", float("inf"), "finite number >= 0"),
    (CCDRConfig, "tau", 0.0, "> 0"), (MIFNConfig, "maxlen", 1, "int >= 2"),
    (C2DSRConfig, "lambda_cl", -1.0, "finite number >= 0"), (C2DSRConfig, "maxlen", 1, "int >= 2"),
]


@pytest.mark.parametrize("config_class, field, value, message", BAD_FIELDS,
                         ids=[f"{c.__name__}.{f}={v!r}" for c, f, v, _ in BAD_FIELDS])
def test_baseline_configs_refuse_bad_values_naming_the_field(config_class, field, value, message):
    config_class()                                                    # the defaults are valid
    with pytest.raises(ValueError, match=rf"{config_class.__name__}\.{field} must .*{message}"):
        config_class(**{field: value})
    config_class(**{field: getattr(config_class(), field)})           # and the default value passes again
