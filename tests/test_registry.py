"""The registry of methods: every registered method, a paper's or a baseline's, trains through the one trainer.

One tiny dataset per family (shared by all its methods), two rounds each. For every method the
test checks that the trainer ran the rounds (its history), that each round's training loss is
finite, and that training moved the state away from its initialisation; the families that
evaluate themselves (cross-domain, sequential) must also report finite validation metrics.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from fedlib.baselines import registry
from fedlib.baselines.continual.continual import fedmf_backbone, run_continual
from fedlib.data.synthetic import clustered_interactions, cross_domain_sequences, drifting_stream, overlapping_domains
from fedlib.engine.loop import FederatedConfig
from fedlib.engine.trainer import train
from fedlib.papers import all_methods

torch.set_num_threads(1)
ROUNDS, DIM = 2, 8
METHODS = all_methods()
#: Each paper's own method is registered by its folder (fedlib.papers.<slug>).
PAPER_METHODS = {"fedrkg": "FedRKG", "f3crec": "F3CRec", "fedkdrec": "FedKDRec", "fedpcl_cdr": "FedPCL-CDR",
                 "fedcsr": "FedCSR"}
#: Small settings where a method's defaults are sized for real data (its own hyperparameters otherwise).
SMALL = {
    ("single-domain", "CoFedRec"): {"num_clusters": 4},
    ("single-domain", "MF"): {"lr": 1.0},          # centralised SGD: no default step size
    ("single-domain", "NeuMF"): {"lr": 1.0},
    ("single-domain", "FedKDRec"): {"hidden": (8, 4), "eval_every": 1},
    ("single-domain", "FedPerGNN"): {"pseudo_items": 5, "eval_every": 1},
    ("cross-domain", "FedPCL-CDR"): {"num_clusters": 3, "num_layers": 1},
    ("sequential", "FedCSR"): {"maxlen": 5},
}


@pytest.fixture(scope="module")
def data():
    return {
        "single-domain": clustered_interactions(num_users=40, num_items=60, interactions_per_user=12, clusters=3,
                                                num_negatives=20, seed=0),
        "cross-domain": overlapping_domains(seed=0),
        "sequential": cross_domain_sequences(num_users=60, items_a=20, items_b=20, topics=3, num_negatives=10,
                                             num_platforms=2, seed=0),
        "continual": drifting_stream(num_users=60, num_items=80, interactions_per_user=30, seed=0),
    }


def _leaves(value, path=()) -> dict:
    """``path -> float64 tensor`` of every floating tensor in a (nested) state dict."""
    if isinstance(value, torch.Tensor):
        return {path: value.detach().double().cpu()} if value.is_floating_point() else {}
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    return {k: v for key, item in items for k, v in _leaves(item, path + (key,)).items()}


def _moved(before: dict, after: dict) -> bool:
    """Whether training changed any tensor present before and after (optimiser moments appear only after)."""
    shared = [p for p in before if p in after and before[p].shape == after[p].shape]
    assert shared, "the state dict before and after training share no tensor"
    return any(not torch.equal(before[p], after[p]) for p in shared)


def _job(method: registry.Method, data):
    params = SMALL.get((method.family, method.name), {})
    split = data[method.family]
    if method.family == "single-domain":
        config = FederatedConfig(rounds=ROUNDS, seed=0, batch_size=64, num_negatives=2)
        return method.build(split, config, dim=DIM, device="cpu", **params)
    return method.build(split, dim=DIM, rounds=ROUNDS, seed=0, device="cpu", **params)


def test_the_registry_holds_every_family_and_every_paper():
    assert set(registry.FAMILIES) == {m.family for m in METHODS.values()}
    papers = {m.paper: m.name for m in METHODS.values() if m.paper}
    assert papers == PAPER_METHODS
    # every method's source cites its paper: a year of publication, an arXiv id or a link
    for method in METHODS.values():
        assert re.search(r"\b(19|20)\d\d\b|arXiv|https?://", method.reference), (method.name, method.reference)


@pytest.mark.parametrize("key", [k for k in METHODS if k[0] != "continual"], ids=lambda k: f"{k[0]}:{k[1]}")
def test_every_method_trains_through_the_trainer(key, data):
    method = METHODS[key]
    job = _job(method, data)
    assert isinstance(job, registry.Trainable)
    initial = _leaves(job.algorithm.state_dict(job.algorithm.init(0)))
    run = train(job.algorithm, job.schedule, seed=0, evaluate=method.family in ("cross-domain", "sequential"))
    assert [int(r["round"]) for r in run.history] == list(range(1, ROUNDS + 1))
    losses = [r["train_loss"] for r in run.history if "train_loss" in r]
    assert losses and all(math.isfinite(v) for v in losses), run.history
    assert _moved(initial, _leaves(job.algorithm.state_dict(run.state))), "training did not change the state"
    if method.family in ("cross-domain", "sequential"):
        assert run.selection.best_round >= 1 and math.isfinite(run.selection.best_score)


@pytest.mark.parametrize("name", registry.names("continual"))
def test_every_continual_method_trains_block_by_block(name, data):
    stream = data["continual"]
    config = FederatedConfig(rounds=ROUNDS, seed=0, batch_size=64)
    params = {"lambda_reg": 1.0} if name == "Reg" else {}
    result = run_continual(stream, fedmf_backbone(dim=DIM, lr=4.0), METHODS[("continual", name)].build(**params),
                           config, device="cpu")
    assert len(result.blocks) == stream.num_blocks
    assert all(1 <= block.round_index <= ROUNDS for block in result.blocks)
    scores = [block.test_metrics for block in result.blocks]
    assert all(s and np.isfinite(list(s.values())).all() for s in scores), scores


def test_lookup_errors_name_the_closest_methods_and_the_families():
    with pytest.raises(KeyError, match="did you mean 'GPFedRec'"):
        registry.get("GPFedrec")
    with pytest.raises(KeyError, match="several families"):
        registry.get("FedNCF")
    assert registry.get("FedNCF", "cross-domain").family == "cross-domain"
    with pytest.raises(ValueError, match="the families are"):
        registry.names("graph")
    with pytest.raises(ValueError, match="registered twice"):
        registry.register("GPFedRec", "single-domain")(lambda *a, **k: None)


def test_the_optional_parts_fit_their_family(data):
    """config/train/model, where a method has them: the config dataclass takes the sizes the
    grids set, a sequential model is a module built from it, and cross-domain train functions
    are the ones their experiment calls (split, config)."""
    import dataclasses
    import inspect

    for method in METHODS.values():
        if method.config is not None:
            assert dataclasses.is_dataclass(method.config) and "dim" in {f.name for f in dataclasses.fields(method.config)}
        if method.train is not None:
            assert list(inspect.signature(method.train).parameters)[:2] == ["split", "config"], method.name
        if method.model is not None:
            assert method.family == "sequential" and method.config is not None
            model = method.model(data["sequential"], method.config(dim=DIM, maxlen=5, seed=0))
            assert isinstance(model, torch.nn.Module) and sum(p.numel() for p in model.parameters()) > 0
    assert {m.name for m in METHODS.values() if m.model is not None} == set(registry.names("sequential")) - {"FedCSR"}
