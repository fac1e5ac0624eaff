"""Shared cross-domain evaluation, schedule and result: train_cross_domain, finish_run and the layouts of a run.

Selection and early stopping are the trainer's (fedlib.engine.selection.Selection); these tests
check the family's use of them: select on the mean validation HR@10 with patience, keep the
best-on-test evaluation as the audit, select on test when asked, and the family's errors.
"""
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from fedlib.data.synthetic import overlapping_domains
from fedlib.engine.algorithm import RoundReport
from fedlib.baselines.cross_domain import cdr_single_domain as S
from fedlib.baselines.cross_domain.cdr_common import (CrossDomainAlgorithm, audit_blocks, check_training_loop, evaluate_both,
                                                     evaluate_scorer, finish_run, flat_metrics, history_rows,
                                                     RunSummary, selected_blocks, train_cross_domain, train_with)

DOMAINS = ("A", "B")


@dataclass
class Rounds:
    """The toy's state: how many rounds it has run."""

    done: int


class Scripted(CrossDomainAlgorithm):
    """A cross-domain algorithm whose evaluation after round ``t`` reports the scripted
    ``(valid, test)`` HR@10 of ``script[t - 1]`` in both domains (the family's metric layout)."""

    def __init__(self, script):
        self.script = list(script)
        self.split, self.seed, self.device = SimpleNamespace(domains=DOMAINS), 0, torch.device("cpu")

    def init(self, seed):
        return Rounds(0)

    def run_round(self, state, plan, context):
        done = state.done + 1
        return Rounds(done), RoundReport(train_loss=float(done), logged={f"{d}/loss": float(done) for d in DOMAINS})

    def scorers(self, state):
        raise AssertionError("the scripted algorithm evaluates through evaluate_splits only")

    def evaluate_splits(self, state, splits):
        scores = dict(zip(("valid", "test"), self.script[state.done - 1]))
        return {split: {**{f"{d}/HR@10": scores[split] for d in DOMAINS}, "HR@10": scores[split]}
                for split in splits}


def _config(patience, select_on="valid", eval_every=1):
    return SimpleNamespace(patience=patience, select_on=select_on, eval_every=eval_every)


def _result(script, config, rounds=None):
    run = train_cross_domain(Scripted(script), config, rounds=len(script) if rounds is None else rounds)
    return finish_run(run, "toy", config, DOMAINS, seconds=1.5, scalars={"bytes_up": 7}, models={"A": "model A"},
                      artifacts={"messages": "sent"})


def test_train_with_builds_on_the_device_trains_and_labels_the_run_with_the_methods_summary(tmp_path):
    """train_with: ``build(device)``, the family's schedule (select_on overridable), ``summarise(algorithm, run)``
    into finish_run's artifacts; the checkpoint config is asked for only when a checkpointer is given."""
    from fedlib.engine import Checkpointer

    built, asked = [], []

    def build(device):
        built.append(device)
        return Scripted([(0.3, 0.2), (0.5, 0.1), (0.4, 0.9)])

    def summarise(algorithm, run):
        return RunSummary(scalars={"rounds": run.round_index}, models={"A": f"model after {run.state.done}"},
                          artifacts={"script": algorithm.script})

    def checkpoint_config(config):
        asked.append(config)
        return {"patience": config.patience}

    config = _config(patience=5)
    run = train_with(build, config, method="toy", rounds=3, summarise=summarise, checkpoint_config=checkpoint_config)
    assert built == [torch.device("cpu")] and asked == []
    assert run.method == "toy" and run.artifacts["domains"] == DOMAINS and run.artifacts["config"] is config
    assert run.artifacts["scalars"] == {"rounds": 3} and run.artifacts["models"] == {"A": "model after 3"}
    assert run.artifacts["script"] == [(0.3, 0.2), (0.5, 0.1), (0.4, 0.9)] and run.artifacts["seconds"] >= 0
    assert run.best_round == 2 and flat_metrics(run)["A/test/HR@10"] == 0.1
    on_test = train_with(build, config, method="toy", rounds=3, summarise=summarise, select_on="test",
                         device="cpu", checkpointer=Checkpointer(tmp_path, name="toy", every=1),
                         checkpoint_config=checkpoint_config)
    assert on_test.best_round == 3 and asked == [config]


def test_selects_on_validation_stops_on_patience_and_keeps_the_best_test_evaluation_as_audit():
    script = [(0.3, 0.2), (0.5, 0.3), (0.4, 0.6), (0.45, 0.1), (0.9, 0.9)]
    run = _result(script, _config(patience=2))
    assert run.round_index == 4  # round 4 is the second evaluation without a better validation score
    history = history_rows(run)
    assert [row["round"] for row in history] == [1, 2, 3, 4]
    assert run.best_round == 2 and run.audit_round == 3  # round 3: best test, not best valid
    assert selected_blocks(run)["A"] == {"valid/HR@10": 0.5, "test/HR@10": 0.3}
    assert audit_blocks(run)["B"] == {"valid/HR@10": 0.4, "test/HR@10": 0.6}
    flat = flat_metrics(run)
    assert flat["A/test/HR@10"] == 0.3 and flat["test_selected/B/test/HR@10"] == 0.6
    assert flat["selected_round"] == 2.0 and flat["test_selected_round"] == 3.0
    assert flat["seconds"] == 1.5 and flat["bytes_up"] == 7.0  # the train function's seconds and scalars
    # the run carries the family's artifacts next to the method's own
    assert run.method == "toy" and run.artifacts["domains"] == DOMAINS and run.artifacts["messages"] == "sent"
    assert run.artifacts["models"] == {"A": "model A"} and run.artifacts["config"].patience == 2
    # history rows: the round, what it logged, every domain's numbers, then the means
    assert list(history[0]) == ["round", "A/loss", "B/loss", "seconds", "A/valid/HR@10", "A/test/HR@10",
                                "B/valid/HR@10", "B/test/HR@10", "valid/HR@10", "test/HR@10"]
    assert history[2]["valid/HR@10"] == 0.4 and history[2]["B/test/HR@10"] == 0.6


def test_can_select_on_test_from_the_config_or_the_argument():
    script = [(0.9, 0.1), (0.1, 0.9)]
    assert _result(script, _config(patience=5)).best_round == 1
    assert _result(script, _config(patience=5, select_on="test")).best_round == 2
    run = train_cross_domain(Scripted(script), _config(patience=5), rounds=2, select_on="test")
    assert flat_metrics(finish_run(run, "toy", None, DOMAINS, seconds=0.0))["selected_round"] == 2.0


def test_bad_settings_and_a_run_without_evaluation_are_refused():
    config = SimpleNamespace(dim=8, patience=3, eval_every=1, lr=1e-3, select_on="train", seed=0)
    with pytest.raises(ValueError, match="select_on"):
        check_training_loop(config)
    with pytest.raises(ValueError, match="patience must be an integer >= 1"):
        check_training_loop(SimpleNamespace(**{**vars(config), "select_on": "valid", "patience": 0}))
    with pytest.raises(ValueError, match="select_on"):
        train_cross_domain(Scripted([(0.1, 0.1)]), _config(patience=1, select_on="train"), rounds=1)
    run = train_cross_domain(Scripted([]), _config(patience=1), rounds=0)  # a run that never evaluated
    with pytest.raises(RuntimeError, match="no evaluation"):
        finish_run(run, "toy", None, DOMAINS, seconds=0.0)
    run = train_cross_domain(Scripted([(0.1, 0.1)]), _config(patience=1), rounds=1)
    with pytest.raises(ValueError, match="family's own keys"):  # a method's artifact may not hide the family's
        finish_run(run, "toy", None, DOMAINS, seconds=0.0, artifacts={"models": {}})
    with pytest.raises(ValueError, match="no 'domains'"):  # a run that did not go through finish_run
        selected_blocks(run)


def test_one_embedding_pass_scores_valid_and_test_with_the_numbers_of_separate_passes():
    torch.set_num_threads(1)
    split = overlapping_domains(num_users=60, items_per_domain=150, overlap=0.5, seed=1)
    config = S.LightGCNConfig(dim=8, epochs=3, patience=3)
    algorithm = S.SingleDomainBaseline(split, config, S._LightGCNDomain, torch.device("cpu"), (5, 10))
    passes = []
    build_scorers = algorithm.scorers
    algorithm.scorers = lambda state: passes.append(1) or build_scorers(state)
    run = train_cross_domain(algorithm, config, rounds=config.epochs)
    evaluations = [record for record in run.history if "valid/HR@10" in record]
    assert len(evaluations) == 3 and len(passes) == 3  # one propagation per evaluation, not one per split
    both = algorithm.evaluate_splits(run.state, ("valid", "test"))
    for split_name in ("valid", "test"):
        assert both[split_name] == algorithm.evaluate(run.state, split_name)
        assert {f"{split_name}/{k}": v for k, v in both[split_name].items()}.items() <= evaluations[-1].items()


def test_constant_scorer_gets_zero_and_an_oracle_gets_one():
    split = overlapping_domains(num_users=60, items_per_domain=150, seed=1)
    part = split[split.domains[0]]
    constant = lambda users, items: torch.zeros(items.shape)
    assert evaluate_scorer(constant, part, "test")["HR@10"] == 0.0  # ties count against the positive
    oracle = lambda users, items: torch.cat([torch.ones(items.shape[0], 1), torch.zeros(items.shape[0], items.shape[1] - 1)], 1)
    both = evaluate_both(oracle, part)
    assert both["valid/HR@10"] == 1.0 and both["test/NDCG@10"] == 1.0 and both["test/MRR"] == 1.0
