"""FedRKG cells resumed from a mid-run checkpoint give the uninterrupted run's result, for every federated method.

A LastFM-2K cell (3,000 rounds) can outlast a working session, so the paper grid saves each
cell's state on a clock and resumes it. The run is "killed" here by an exception raised from
the progress hook a few rounds after a save; a fresh ``run_cell`` (new split, sampler, method,
recorder) then continues from the file.
"""
import json

import pytest
import torch

import fedlib.papers.fedrkg.experiment as X
from fedlib.engine import Checkpointer, FederatedConfig, checkpoint_progress
from fedlib.engine.loop import config_dict
from fedlib.experiments import grid

torch.set_num_threads(1)

ROUNDS, SAVE_EVERY, KILL_AT = 12, 3, 8  # the run dies in round 8; the last save was after round 6


class Killed(RuntimeError):
    pass


def _kill_at(round_number):
    def progress(record):
        if record["round"] == round_number:
            raise Killed(f"killed in round {round_number}")
    return progress


CASES = {
    "FedMF": dict(method="FedMF"),
    "FedNCF": dict(method="FedNCF"),
    "PFedRec": dict(method="PFedRec"),
    "GPFedRec": dict(method="GPFedRec"),
    "CoFedRec": dict(method="CoFedRec"),
    "FedRAP": dict(method="FedRAP"),
    "FedDAE": dict(method="FedDAE"),
    # guidance before rounds 5 and 9: one before the save, one after the resume
    "FedRKG": dict(method="FedRKG", interval=4),
    "FedRKG w/o AG": dict(method="FedRKG", guidance="fixed", interval=4),
    "PFedRec w/ AG": dict(method="FedRKG", backbone="PFedRec", interval=4),
    "FedRKG LDP": dict(method="FedRKG", interval=4, ldp=X.LDP),
}


def _comparable(result):
    metrics = {k: v for k, v in result["metrics"].items() if k != "seconds"}
    extra = {k: v for k, v in result["extra"].items() if k != "resumed_at"}
    return json.loads(json.dumps({"metrics": metrics, "extra": extra}))


@pytest.mark.parametrize("name", list(CASES))
def test_a_killed_cell_resumes_to_the_uninterrupted_result(tmp_path, name):
    config = X.cell("synthetic", rounds=ROUNDS, eval_every=2, **CASES[name])
    assert X.checkpointable(config)
    full = X.run_cell(config, device="cpu")

    first = Checkpointer(tmp_path, name=X.config_hash(config), every=SAVE_EVERY)
    with pytest.raises(Killed):
        X.run_cell(config, device="cpu", progress=_kill_at(KILL_AT), checkpointer=first)
    assert checkpoint_progress(first.path)["round_index"] == 6

    second = Checkpointer(tmp_path, name=X.config_hash(config), every=SAVE_EVERY)
    resumed = X.run_cell(config, device="cpu", checkpointer=second)
    assert resumed["extra"]["resumed_at"] == [6]
    assert second.earlier_seconds > 0
    assert resumed["metrics"]["seconds"] >= second.earlier_seconds
    assert _comparable(resumed) == _comparable(full)
    assert len(resumed["extra"]["curve"]) == ROUNDS // 2  # the restored evaluations are in the curve once


def test_the_resume_check_can_fail(tmp_path):
    """A recorder that forgets its curve on resume (what a checkpoint without it would do) is caught."""
    config = X.cell("synthetic", "FedMF", rounds=ROUNDS, eval_every=2)
    full = X.run_cell(config, device="cpu")
    with pytest.raises(Killed):
        X.run_cell(config, device="cpu", progress=_kill_at(KILL_AT),
                   checkpointer=Checkpointer(tmp_path, name="x", every=SAVE_EVERY))
    original = X.SelectionRecorder.load_state_dict
    try:
        X.SelectionRecorder.load_state_dict = lambda self, state: None
        resumed = X.run_cell(config, device="cpu", checkpointer=Checkpointer(tmp_path, name="x", every=SAVE_EVERY))
    finally:
        X.SelectionRecorder.load_state_dict = original
    assert _comparable(resumed) != _comparable(full)


def test_probe_trace_and_centralised_cells_run_without_checkpoints(tmp_path):
    assert not X.checkpointable(X.cell("synthetic", "MF", rounds=2))
    assert not X.checkpointable(X.cell("synthetic", "FedRKG", rounds=8, interval=2, probe_round=3))
    assert not X.checkpointable(X.cell("synthetic", "FedMF", rounds=4, trace_every=2))
    config = X.cell("synthetic", "FedMF", rounds=4, trace_every=2)
    checkpointer = Checkpointer(tmp_path, name="trace", every=1)
    result = X.run_cell(config, device="cpu", checkpointer=checkpointer)
    assert "trace" in result["extra"] and not checkpointer.path.exists()


def test_a_checkpoint_without_an_attachment_is_refused(tmp_path):
    config = config_dict(FederatedConfig(rounds=4, seed=0))
    Checkpointer(tmp_path, name="c").save_snapshot({"round_index": 2, "state": {"p": torch.zeros(2)}}, config)
    later = Checkpointer(tmp_path, name="c")
    later.attach("selection", X.SelectionRecorder(evaluator=None))
    with pytest.raises(ValueError, match="no state for the attachments"):
        later.load_snapshot(config)
    with pytest.raises(TypeError, match="state_dict"):
        later.attach("other", object())


def test_the_clock_schedule_saves_after_enough_wall_time(tmp_path, monkeypatch):
    now = [100.0]
    monkeypatch.setattr("fedlib.engine.checkpoint.time.perf_counter", lambda: now[0])
    config = config_dict(FederatedConfig(rounds=50, seed=0))
    checkpointer = Checkpointer(tmp_path, name="clock", every=None, every_seconds=60)

    def after_round(round_index):  # what the trainer does after each round
        if not checkpointer.due(round_index):
            return False
        checkpointer.save_snapshot({"round_index": round_index, "state": {"p": torch.zeros(2)}}, config)
        return True

    assert not after_round(1)
    now[0] = 161.0
    assert after_round(2)
    now[0] = 200.0
    assert not after_round(3)  # 39 s since the last save
    assert torch.load(checkpointer.path, weights_only=True)["elapsed_s"] == pytest.approx(61.0)
    again = Checkpointer(tmp_path, name="clock", every=None, every_seconds=60)
    assert again.load_snapshot(config)["round_index"] == 2
    assert again.earlier_seconds == pytest.approx(61.0) and again.resumed_at == [2]
    with pytest.raises(ValueError, match="every_seconds"):
        Checkpointer(tmp_path, every=None, every_seconds=0)
    with pytest.raises(ValueError, match="or both"):
        Checkpointer(tmp_path, every=None)


def test_the_recorded_grid_resumes_a_killed_cell_and_adds_its_earlier_time(tmp_path, monkeypatch):
    """A cell killed after a save is resumed by the next grid run; its record counts both sessions."""
    recorded = []
    monkeypatch.setattr("fedlib.reporting.append_run",
                        lambda paper, profile, config, seed, metrics, wall, **kw: recorded.append((config, metrics, wall, kw)))
    monkeypatch.setattr("fedlib.reporting.cache.restore_cache_from_records", lambda *args, **kwargs: None)
    fed_config = config_dict(FederatedConfig(rounds=4, seed=0))
    calls = []

    def train(config, progress, checkpointer=None):
        calls.append(checkpointer)
        saved = checkpointer.load_snapshot(fed_config)
        if saved is None:  # first session: 40 s of training up to a save, then killed
            checkpointer.earlier_seconds = 40.0
            checkpointer.save_snapshot({"round_index": 2, "state": {"p": torch.zeros(1)}}, fed_config)
            raise Killed("session ended")
        return {"metrics": {"resumed_round": saved["round_index"]}, "extra": {}}

    cell = {"paper": "toy", "seed": 0, "x": 1}
    with pytest.raises(Killed):
        grid.run_recorded_grid("toy", [cell], train, cache_dir=tmp_path, progress=False, checkpoint_every_s=600)
    assert not recorded and calls[0].path.exists()
    grid.run_recorded_grid("toy", [cell], train, cache_dir=tmp_path, progress=False, checkpoint_every_s=600)
    (config, metrics, wall, _), = recorded
    assert metrics == {"resumed_round": 2}
    assert 40.0 <= wall < 40.0 + 30.0  # this session's seconds plus the 40 s before the save
    assert calls[1].path.parent == tmp_path / "paper" / "checkpoints"
    assert not calls[1].path.exists()  # deleted once recorded
