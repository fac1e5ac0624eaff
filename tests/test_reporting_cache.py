"""ResultCache: finished cells are never recomputed and never lost."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from fedlib.reporting.cache import ResultCache
from fedlib.reporting.results import config_hash

GRID = [{"method": m, "seed": s} for m in ("FT", "KD") for s in (0, 1)] + [{"method": "SPP", "seed": 0}]


def score(config):
    return {"ndcg": 0.1 * (1 + config["seed"]) + (0.5 if config["method"] == "KD" else 0.0)}


def test_put_get_contains(tmp_path):
    cache = ResultCache(tmp_path)
    config = {"lr": 0.1, "dims": (32, 16)}
    assert not cache.contains(config) and cache.get(config) is None and cache.get(config, "absent") == "absent"
    path = cache.put(config, {"ndcg": np.float64(0.25), "curve": np.array([1.0, 2.0]), "bad": float("nan")})
    assert path.name == f"{config_hash(config)}.json"
    assert config in cache and cache.contains({"dims": [32, 16], "lr": 0.1})
    assert cache.get(config) == {"ndcg": 0.25, "curve": [1.0, 2.0], "bad": None}
    with pytest.raises(TypeError, match="mapping"):
        cache.put(config, 0.25)


def test_a_file_holding_another_configuration_is_an_error(tmp_path):
    cache = ResultCache(tmp_path)
    cache.put({"lr": 0.1}, {"ndcg": 0.2})
    os.replace(cache.path_for({"lr": 0.1}), cache.path_for({"lr": 0.2}))
    with pytest.raises(ValueError, match="different configuration"):
        cache.get({"lr": 0.2})


def test_an_interrupted_grid_resumes_with_only_the_missing_cells(tmp_path):
    cache = ResultCache(tmp_path / "cache")
    calls = []

    def crashes_on_third(config):
        calls.append(config)
        if len(calls) == 3:
            raise RuntimeError("killed")
        return score(config)

    with pytest.raises(RuntimeError, match="killed"):
        cache.run_grid(GRID, crashes_on_third, progress=False)
    assert len(calls) == 3
    assert sorted(os.listdir(tmp_path / "cache")) == sorted(f"{config_hash(c)}.json" for c in GRID[:2])

    resumed = []

    def counting(config):
        resumed.append(config)
        return score(config)

    frame = cache.run_grid(GRID, counting, progress=True)
    assert resumed == GRID[2:]  # only the three missing cells, in grid order
    assert list(frame.columns) == ["method", "seed", "ndcg"]
    assert frame[["method", "seed"]].to_dict("records") == GRID
    assert frame["ndcg"].tolist() == pytest.approx([score(c)["ndcg"] for c in GRID])

    again = []
    frame_again = cache.run_grid(GRID, lambda c: again.append(c) or score(c), progress=False)
    assert again == []
    assert frame_again.equals(frame)


def test_duplicates_run_once_and_results_are_reported_for_every_row(tmp_path):
    cache = ResultCache(tmp_path)
    calls = []
    frame = cache.run_grid(
        [{"a": 1}, {"a": 1}, {"a": 2}], lambda c: calls.append(c) or {"value": c["a"] * 2}, progress=False
    )
    assert len(calls) == 2
    assert frame["value"].tolist() == [2, 2, 4]


def test_the_run_record_hook_runs_before_the_cell_is_cached(tmp_path):
    cache = ResultCache(tmp_path)
    seen = []

    def hook(config, result, wall_time_s):
        assert not cache.contains(config)  # a cached cell must already have its record
        assert wall_time_s >= 0
        seen.append((config["a"], result["value"]))

    cache.run_grid([{"a": 1}, {"a": 2}], lambda c: {"value": c["a"]}, progress=False, on_new_result=hook)
    cache.run_grid([{"a": 1}, {"a": 2}, {"a": 3}], lambda c: {"value": c["a"]}, progress=False, on_new_result=hook)
    assert seen == [(1, 1), (2, 2), (3, 3)]


def test_nested_configs_are_flattened_and_name_clashes_refused(tmp_path):
    cache = ResultCache(tmp_path)
    frame = cache.run_grid([{"model": {"dim": 8}, "seed": 0}], lambda c: {"loss": math.pi}, progress=False)
    assert list(frame.columns) == ["model.dim", "seed", "loss"]
    with pytest.raises(ValueError, match="seed"):
        cache.run_grid([{"seed": 1}], lambda c: {"seed": 1}, progress=False)


def test_cache_files_are_complete_json(tmp_path):
    cache = ResultCache(tmp_path)
    cache.run_grid(GRID, score, progress=False)
    for name in os.listdir(tmp_path):
        assert name.endswith(".json") and not name.startswith(".")
        entry = json.loads((tmp_path / name).read_text())
        assert entry["config_hash"] == name[:-5] and "result" in entry and entry["wall_time_s"] >= 0


def test_a_cell_finished_by_another_process_meanwhile_is_skipped(tmp_path):
    """Two processes share a cache: a cell the other one finished while this grid ran is not rerun."""
    cache = ResultCache(tmp_path)
    other = ResultCache(tmp_path)  # the second process's view of the same directory
    ran = []

    def fn(config):
        ran.append(config["x"])
        if config["x"] == 1:  # while cell 1 trains, the other process finishes cell 3
            other.put({"x": 3}, {"y": 30})
        return {"y": config["x"] * 10}

    frame = cache.run_grid([{"x": 1}, {"x": 2}, {"x": 3}], fn, progress=False)
    assert ran == [1, 2]
    assert frame["y"].tolist() == [10, 20, 30]


# ---------------------------------------------------------------------------- claims
def _foreign_claim(cache, config, pid, start_time=None):
    from fedlib.reporting.cache import _process_identity

    pid_, host, started = _process_identity(pid)
    cache.claim_path(config).parent.mkdir(parents=True, exist_ok=True)
    cache.claim_path(config).write_text(f"{pid_} {host} {start_time or started}", encoding="utf-8")


def test_a_cell_claimed_by_a_live_process_is_left_to_it(tmp_path):
    """Two workers meeting in the middle of a grid: the second never trains the first's cell."""
    import subprocess
    import sys

    cache = ResultCache(tmp_path)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _foreign_claim(cache, GRID[1], other.pid)
        calls = []

        def train(config):
            calls.append(config)
            if len(calls) == 2:  # meanwhile the other worker finishes its cell
                cache.put(GRID[1], score(GRID[1]))
            return score(config)

        frame = cache.run_grid(GRID, train, progress=False, poll_s=0.01)
        assert GRID[1] not in calls and len(calls) == len(GRID) - 1
        assert frame["ndcg"].tolist() == pytest.approx([score(c)["ndcg"] for c in GRID])
    finally:
        other.kill()
        other.wait()
    assert not cache.claim_path(GRID[1]).exists() or cache.claim_path(GRID[1]).read_text().split()[0] == str(other.pid)
    assert not any(cache.claim_path(c).exists() for c in GRID if c != GRID[1])  # ours are released


def test_a_claim_whose_process_died_is_taken_over(tmp_path):
    import subprocess
    import sys

    cache = ResultCache(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _foreign_claim(cache, GRID[0], dead.pid)  # killed worker: its claim stayed behind
    calls = []
    cache.run_grid(GRID, lambda c: calls.append(c) or score(c), progress=False, poll_s=0.01)
    assert calls == GRID  # in grid order: the stale claim did not defer anything
    assert not any(cache.claim_path(c).exists() for c in GRID)


def test_a_failing_cell_releases_its_claim(tmp_path):
    cache = ResultCache(tmp_path)

    def fails(config):
        assert cache.claim_path(config).exists()  # claimed while it trains
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        cache.run_grid(GRID, fails, progress=False)
    assert os.listdir(tmp_path) == []


def test_a_deferred_cell_is_trained_here_when_its_process_dies_without_a_result(tmp_path):
    import subprocess
    import sys

    cache = ResultCache(tmp_path)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    _foreign_claim(cache, GRID[2], other.pid)
    calls = []

    def train(config):
        calls.append(config)
        if len(calls) == len(GRID) - 1:  # the other worker is killed while we train our last own cell
            other.kill()
            other.wait()
        return score(config)

    cache.run_grid(GRID, train, progress=False, poll_s=0.01)
    assert calls == [c for c in GRID if c != GRID[2]] + [GRID[2]]  # left for last, then taken over
    assert not any(cache.claim_path(c).exists() for c in GRID)


def test_a_recycled_pid_does_not_keep_a_stale_claim_alive(tmp_path):
    """The claim's process died and its pid now belongs to another process (here: this one)."""
    if not os.path.exists(f"/proc/{os.getpid()}/stat"):
        pytest.skip("process start times need /proc")
    cache = ResultCache(tmp_path)
    _foreign_claim(cache, GRID[0], os.getppid())  # the parent process: alive, and it is the holder
    assert not cache.try_claim(GRID[0]) and cache.claim_holder(GRID[0]).startswith(f"{os.getppid()}@")
    _foreign_claim(cache, GRID[0], os.getppid(), start_time="1")  # same pid, another start time
    assert cache.try_claim(GRID[0])
    cache.release(GRID[0])
    assert not cache.claim_path(GRID[0]).exists()
