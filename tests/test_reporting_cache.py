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
