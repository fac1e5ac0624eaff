"""``--pending``: what is left of a resumable paper-profile grid, without training anything."""
import math

import pytest

from fedlib.experiments import grid
from fedlib.reporting import append_run

PAPER = "fedkdrec"  # any paper slug; the runs file lives under the temporary project root


@pytest.fixture()
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_PROJECT_ROOT", str(tmp_path))
    return tmp_path


def _cell(method, seed):
    return {"paper": PAPER, "method": method, "seed": seed, "rounds": 3}


def test_pending_cells_and_report_count_recorded_runs(project):
    cells = [_cell("A", 0), _cell("A", 1), _cell("A", 1), _cell("B", 0), _cell("C", 0)]  # one repeat
    append_run(PAPER, "paper", _cell("A", 0), 0, {"x": 1.0}, 100.0)
    append_run(PAPER, "paper", _cell("A", 7), 7, {"x": 1.0}, 300.0)      # not selected, still times label A
    append_run(PAPER, "paper", _cell("B", 0), 0, {"x": 1.0}, 50.0)
    append_run(PAPER, "smoke", _cell("C", 0), 0, {"x": 1.0}, 1.0)        # another profile: not a paper run

    pending = grid.pending_cells(PAPER, "paper", cells)
    assert [(c["method"], c["seed"]) for c in pending] == [("A", 1), ("C", 0)]

    report = grid.pending_report(PAPER, "paper", cells, label=lambda c: c["method"]).set_index("label")
    assert report.loc["A", "recorded"] == 1 and report.loc["A", "pending"] == 1
    assert report.loc["A", "median_s"] == pytest.approx(200.0)           # median of 100 s and 300 s
    assert report.loc["A", "pending_h"] == pytest.approx(200.0 / 3600)
    assert report.loc["B", "pending"] == 0 and report.loc["B", "pending_h"] == 0
    assert report.loc["C", "pending"] == 1 and math.isnan(report.loc["C", "median_s"])


def test_pending_cost_follows_the_same_cell_with_other_seeds(project):
    """One label mixing a cheap and a dear backbone: each pending cell is priced by its own runs."""
    cheap, dear = ({**_cell("A", 0), "backbone": b} for b in ("small", "large"))
    append_run(PAPER, "paper", cheap, 0, {"x": 1.0}, 100.0)
    append_run(PAPER, "paper", dear, 0, {"x": 1.0}, 3600.0)
    append_run(PAPER, "paper", {**_cell("B", 0), "backbone": "other"}, 0, {"x": 1.0}, 40.0)
    cells = [{**cheap, "seed": 1}, {**dear, "seed": 1}, {**dear, "seed": 2}, {**_cell("B", 1), "backbone": "new"}]
    report = grid.pending_report(PAPER, "paper", cells, label=lambda c: c["method"]).set_index("label")
    assert report.loc["A", "pending"] == 3
    assert report.loc["A", "pending_h"] == pytest.approx((100.0 + 2 * 3600.0) / 3600)  # not 3 x the label median
    assert report.loc["B", "pending_h"] == pytest.approx(40.0 / 3600)  # no run of that cell: the label's median


def test_pending_cost_scales_with_the_dataset(project):
    """A label timed on a small task only is priced on a large one by how much dearer other labels ran there."""
    def on(method, task, seed=0):
        return {**_cell(method, seed), "task": task}

    append_run(PAPER, "paper", on("A", "small"), 0, {"x": 1.0}, 100.0)
    append_run(PAPER, "paper", on("A", "large"), 0, {"x": 1.0}, 900.0)   # A: 9x dearer on the large task
    append_run(PAPER, "paper", on("B", "small"), 0, {"x": 1.0}, 10.0)
    append_run(PAPER, "paper", on("B", "small", 1), 1, {"x": 1.0}, 30.0)
    append_run(PAPER, "paper", {**on("C", "small", 5), "rounds": 7}, 5, {"x": 1.0}, 50.0)  # another cell
    cells = [on("B", "large"), on("C", "small"), on("C", "unseen")]
    report = grid.pending_report(PAPER, "paper", cells, label=lambda c: c["method"]).set_index("label")
    # "large" ran 9x dearer than "small" for A, the one label run on both: B's 20 s on "small" x 9
    assert report.loc["B", "pending_h"] == pytest.approx(20.0 * 9.0 / 3600)
    # C on "small": no run of that very cell, but C's own run on "small" (50 s over a cap of 7
    # rounds) scaled to the cell's cap of 3 rounds; C on a task nobody has run yet: C's median unscaled
    assert report.loc["C", "pending_h"] == pytest.approx((50.0 * 3 / 7 + 50.0) / 3600)


def test_pending_cost_follows_the_nearest_configs_of_the_label(project):
    """A label's runs on a dataset mix a stale config version and a dear width: a pending cell
    of the current version at the usual width is priced by the run nearest its own config."""
    def on(task, seed=0, **settings):
        return {**_cell("A", seed), "task": task, "version": 2, "dim": 64, **settings}

    append_run(PAPER, "paper", on("small", version=1), 0, {"x": 1.0}, 5000.0)   # an earlier version
    append_run(PAPER, "paper", on("small"), 0, {"x": 1.0}, 1300.0)
    append_run(PAPER, "paper", on("small", dim=256), 0, {"x": 1.0}, 6400.0)     # a width sweep's cell
    append_run(PAPER, "paper", {**on("small"), "method": "B"}, 0, {"x": 1.0}, 100.0)
    append_run(PAPER, "paper", {**on("large"), "method": "B"}, 0, {"x": 1.0}, 200.0)  # "large": 2x dearer
    cells = [on("small", alpha=0.5), on("large"), on("large", dim=256)]
    report = grid.pending_report(PAPER, "paper", cells, label=lambda c: c["method"]).set_index("label")
    # small, other alpha: one setting from the 1,300 s run, two from the others (not their median 5,000 s);
    # large: the nearest run on "small" x 2; the dear width x 2
    assert report.loc["A", "pending_h"] == pytest.approx((1300.0 + 2 * 1300.0 + 2 * 6400.0) / 3600)


def test_command_line_pending_trains_nothing(project, capsys):
    append_run(PAPER, "paper", _cell("A", 0), 0, {"x": 1.0}, 60.0)
    ran = []

    def grid_cells(part):
        return [_cell("A", 0), _cell("B", 0)]

    out = grid.grid_main(["main", "--seeds", "0", "1", "--pending"], paper=PAPER, title="T", parts=("main",),
                         grid_cells=grid_cells, run_grid=lambda *a, **k: ran.append(a), label=lambda c: c["method"])
    assert ran == []                                                      # nothing trained
    assert sorted((c["method"], c["seed"]) for c in out) == [("A", 1), ("B", 0), ("B", 1)]
    printed = capsys.readouterr().out
    assert "3 of 4 cells pending" in printed and "labels without a recorded run: 1" in printed  # B has none


def test_records_carry_the_commit_the_worker_started_from(project, monkeypatch):
    """A commit made while a worker trains does not relabel the code that worker runs."""
    from fedlib.reporting import read_runs
    from fedlib.reporting import results

    head = {"sha": "aaaa111"}
    monkeypatch.setattr(results, "current_commit", lambda root=None: head["sha"])

    def train(config, progress=None):
        head["sha"] = "bbbb222"  # someone commits new code while this cell trains
        return {"metrics": {"x": float(config["seed"])}, "extra": {}}

    cells = [_cell("A", 0), _cell("A", 1)]
    grid.run_recorded_grid(PAPER, cells, train, "paper", cache_dir=project / "cache", progress=False)
    records = read_runs(PAPER, "paper")
    assert len(records) == 2 and {r.commit for r in records} == {"aaaa111"}


def test_pending_counts_the_cells_a_checkpoint_will_continue(project, capsys):
    """A pending cell with a mid-run checkpoint is reported with the time its checkpoint holds."""
    import torch

    from fedlib.engine import Checkpointer, checkpoint_progress
    from fedlib.reporting.results import config_hash

    append_run(PAPER, "paper", _cell("A", 0), 0, {"x": 1.0}, 60.0)
    cache = project / ".cache"
    started = Checkpointer(cache / "paper" / "checkpoints", name=config_hash(_cell("A", 1)), every=1)
    started.earlier_seconds = 1800.0
    started.save_snapshot({"round_index": 2, "w": torch.zeros(3)}, {"rounds": 3})
    assert checkpoint_progress(started.path)["round_index"] == 2

    report = grid.pending_report(PAPER, "paper", [_cell("A", 1), _cell("B", 0)], label=lambda c: c["method"],
                                 cache_dir=cache).set_index("label")
    assert report.loc["A", "checkpointed"] == 1 and report.loc["A", "spent_h"] >= 0.5
    assert report.loc["B", "checkpointed"] == 0 and report.loc["B", "spent_h"] == 0
    assert "checkpointed" not in grid.pending_report(PAPER, "paper", [_cell("A", 1)]).columns  # no cache: no column

    grid.grid_main(["main", "--seeds", "1", "--pending", "--cache-dir", str(cache)], paper=PAPER, title="T",
                   parts=("main",), grid_cells=lambda part: [_cell("A", 0)], run_grid=None, label=lambda c: c["method"])
    assert "1 of them continue from a checkpoint" in capsys.readouterr().out
    (cache / "paper" / "checkpoints" / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="junk.pt is not a readable checkpoint"):
        checkpoint_progress(cache / "paper" / "checkpoints" / "junk.pt")
    torch.save({"format": 1, "elsewhere": {}}, cache / "paper" / "checkpoints" / "other.pt")
    with pytest.raises(ValueError, match="other.pt is not a checkpoint"):
        checkpoint_progress(cache / "paper" / "checkpoints" / "other.pt")


def test_rerun_trains_recorded_cells_again_and_the_new_record_wins(project):
    """``rerun``: the selected recorded cells train again; the others are still skipped."""
    from fedlib.reporting import read_runs
    from fedlib.reporting.results import latest_records

    trained = []

    def train(config, progress=None):
        trained.append(config["method"])
        return {"metrics": {"x": 10.0 * len(trained)}, "extra": {}}

    cells = [_cell("A", 0), _cell("B", 0)]
    grid.run_recorded_grid(PAPER, cells, train, "paper", cache_dir=project / "cache", progress=False)
    grid.run_recorded_grid(PAPER, cells, train, "paper", cache_dir=project / "cache", progress=False)
    assert trained == ["A", "B"]                                        # recorded: not trained again
    grid.run_recorded_grid(PAPER, [_cell("A", 0)], train, "paper", cache_dir=project / "cache", progress=False,
                           rerun=True)
    assert trained == ["A", "B", "A"]
    records = read_runs(PAPER, "paper")
    assert [r.config["method"] for r in records] == ["A", "B", "A"]     # the first record of A is kept
    latest = {r.config["method"]: r.metrics["x"] for r in latest_records(records).values()}
    assert latest == {"A": 30.0, "B": 20.0}
    # the cache now holds the rerun's result, so a plain grid (or a fresh clone) skips A again
    frame = grid.run_recorded_grid(PAPER, cells, train, "paper", cache_dir=project / "cache", progress=False)
    assert trained == ["A", "B", "A"] and sorted(frame["metrics.x"]) == [20.0, 30.0]


def test_rerun_dirty_trains_the_cells_whose_latest_record_is_dirty_and_the_pending_ones(project, capsys):
    """``--rerun-dirty``: B's only record is dirty and D has none; A is clean and C was re-recorded
    cleanly after a dirty record, so neither trains."""
    append_run(PAPER, "paper", _cell("A", 0), 0, {"x": 1.0}, 60.0, commit="aaaa111")
    append_run(PAPER, "paper", _cell("B", 0), 0, {"x": 1.0}, 60.0, commit="aaaa111+dirty")
    append_run(PAPER, "paper", _cell("C", 0), 0, {"x": 1.0}, 60.0, commit="aaaa111+dirty")
    append_run(PAPER, "paper", _cell("C", 0), 0, {"x": 2.0}, 60.0, commit="bbbb222")
    calls = []

    def grid_cells(part):
        return [_cell(method, 0) for method in "ABCD"]

    def run(*args, **kwargs):
        calls.append((args, kwargs))
    common = dict(paper=PAPER, title="T", parts=("main",), grid_cells=grid_cells, run_grid=run,
                  label=lambda c: c["method"])
    out = grid.grid_main(["main", "--rerun-dirty"], **common)
    (cells, profile), kwargs = calls[0]
    assert [c["method"] for c in cells] == ["B", "D"] == [c["method"] for c in out]
    assert profile == "paper" and kwargs["rerun"] is True
    assert "2 selected cells have a dirty latest record or none" in capsys.readouterr().out
    # a dirty record written after a clean one makes the cell dirty again
    append_run(PAPER, "paper", _cell("A", 0), 0, {"x": 3.0}, 60.0, commit="cccc333+dirty")
    assert [c["method"] for c in grid.dirty_or_pending_cells(PAPER, "paper", grid_cells("main"))] == ["A", "B", "D"]
    for other in ("--rerun", "--pending"):
        with pytest.raises(SystemExit):
            grid.grid_main(["main", "--rerun-dirty", other], **common)
    assert len(calls) == 1
