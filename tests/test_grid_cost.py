"""The grid cost model (benchmarks/grid_cost.py): its unit timer, its fixed cells, and one cell timed on the
current tree as both the old and the new tree (a finite, positive speed-up and a JSON line with every key).

No assertion on a time or on a speed-up's value: machines are shared and noisy.
"""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
from conftest import missing_data

REPO = Path(__file__).resolve().parent.parent
BENCHMARK = REPO / "benchmarks" / "grid_cost.py"


@pytest.fixture(scope="module")
def grid_cost():
    spec = importlib.util.spec_from_file_location("grid_cost", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules["grid_cost"] = module  # its dataclasses resolve their annotations through sys.modules
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("grid_cost", None)


def test_unit_timer_counts_consecutive_units_after_the_warm_up(grid_cost, monkeypatch):
    clock = iter([0.0, 1.0, 3.0, 10.0, 11.5, 20.0])  # process_time at each tick
    monkeypatch.setattr(grid_cost.time, "process_time", lambda: next(clock))
    timer = grid_cost.UnitTimer(warmup=1, timed=3)
    timer.tick(1)  # warm-up round: starts the clock
    timer.tick(2)  # 1 s
    timer.tick(3)  # 2 s
    timer.tick(1)  # a new run (the next block): the 7 s across the two runs are not a round
    with pytest.raises(grid_cost._Enough):
        timer.tick(2)  # 1.5 s: the third counted round stops the training
    assert timer.counted == 3
    assert timer.seconds == pytest.approx(4.5)


def test_unit_timer_refuses_no_units(grid_cost):
    with pytest.raises(ValueError, match="at least 1"):
        grid_cost.UnitTimer(warmup=1, timed=0)


def test_round_number_is_read_from_every_callback_shape(grid_cost):
    assert grid_cost._round_of((7,)) == 7  # progress(round)
    assert grid_cost._round_of(({"round": 4, "train_loss": 0.5},)) == 4  # progress(record)
    assert grid_cost._round_of((object(), {"round": 2})) == 2  # on_round_end(run, record)
    assert grid_cost._round_of((object(),)) is None


def test_round_cells_are_timed_over_one_evaluation_period_by_default(grid_cost):
    cell = grid_cost.Cell("x", "why")
    assert grid_cost.timed_rounds(cell, {"eval_every": 10}, None) == 10  # rounds 2-11: one evaluation
    assert grid_cost.timed_rounds(cell, {"eval_every": 1}, None) == grid_cost.MIN_TIMED_ROUNDS
    assert grid_cost.timed_rounds(cell, {"eval_every": 50}, None) == grid_cost.MIN_TIMED_ROUNDS  # too long
    assert grid_cost.timed_rounds(cell, {}, None) == grid_cost.MIN_TIMED_ROUNDS
    assert grid_cost.timed_rounds(cell, None, None) == grid_cost.MIN_TIMED_ROUNDS  # engine cells
    assert grid_cost.timed_rounds(cell, {"eval_every": 10}, 3) == 3  # --rounds wins
    capped = grid_cost.Cell("y", "why", max_rounds=1)
    assert grid_cost.timed_rounds(capped, {"eval_every": 10}, None) == 1


def test_every_fixed_cell_has_a_record_or_is_an_engine_cell(grid_cost):
    records = grid_cost.read_records(REPO)
    missing = [c.key for c in grid_cost.CELLS if c.key not in records and c.key not in grid_cost.ENGINE_CELLS]
    assert not missing, f"fixed cells without a paper-profile record: {missing}"
    assert len({c.key for c in grid_cost.CELLS}) == len(grid_cost.CELLS)
    assert {c.unit for c in grid_cost.CELLS} <= {"round", "step"}
    # every paper has at least one timed cell, so each paper gets an estimate
    papers = {records[c.key]["paper"] for c in grid_cost.CELLS if c.key in records}
    assert papers == {r["paper"] for r in records.values()}


def test_unknown_cell_and_revision_are_refused(grid_cost):
    with pytest.raises(SystemExit, match="matches 0 of the fixed cells"):
        grid_cost.select_cells("no-such-cell", quick=False)
    with pytest.raises(SystemExit, match="is not a revision"):
        grid_cost.baseline_tree("no-such-revision-43")


def test_current_tree_against_itself(grid_cost, shared_data, capsys, monkeypatch):
    if not (shared_data / "ml-100k" / "u.data").exists():
        missing_data("ml-100k/u.data not in the data root")
    monkeypatch.setenv("FEDLIB_DATA", str(shared_data))
    grid_cost.main(["--cells", "fedmf-noise-touched", "--baseline-tree", str(REPO), "--rounds", "1",
                    "--repeats", "1", "--json-only"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("speedup_geomean", "cells_in_geomean", "cells", "papers", "baseline", "total_s"):
        assert key in result
    (row,) = result["cells"]
    assert row["key"] == "fedmf-noise-touched" and row["unit"] == "round"
    assert row["old_cpu_s"] > 0 and row["new_cpu_s"] > 0
    assert math.isfinite(row["speedup"]) and row["speedup"] > 0
    assert result["speedup_geomean"] == pytest.approx(row["speedup"])
    assert set(result["papers"]) >= {"f3crec", "fedcsr", "fedkdrec", "fedpcl_cdr", "fedrkg"}
    assert all(p["estimated_cpu_hours_now"] is None for p in result["papers"].values())  # no paper cell timed


def test_records_newer_than_the_baseline_are_not_divided_by_the_speed_up(grid_cost):
    records = {"a": {"paper": "p", "wall_time_s": 7200.0, "commit": "old"},
               "b": {"paper": "p", "wall_time_s": 3600.0, "commit": "new+dirty"},
               "c": {"paper": "q", "wall_time_s": 1800.0, "commit": "old"}}
    hours = grid_cost.paper_hours(records, lambda commit: commit.startswith("old"))
    assert hours == {"p": {"total": 3.0, "before": 2.0, "after": 1.0}, "q": {"total": 0.5, "before": 0.5, "after": 0.0}}
    assert grid_cost.paper_hours(records)["p"] == {"total": 3.0, "before": 3.0, "after": 0.0}


def test_commit_predates_follows_the_history(grid_cost):
    import subprocess

    def rev(name):
        done = subprocess.run(["git", "rev-parse", "--short", name], cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"{name} is not in this checkout's history (a shallow clone)")
        return done.stdout.strip()

    baseline = rev(grid_cost.DEFAULT_BASELINE)
    is_before = grid_cost.commit_predates(baseline, REPO)
    assert is_before(baseline) and is_before(baseline + "+dirty") and is_before(rev(baseline + "~1"))
    assert not is_before(rev("HEAD"))  # the baseline is where the speed work started, HEAD is after it
    assert is_before("") and is_before("0123abc0123abc")  # unknown: counted with the old records
