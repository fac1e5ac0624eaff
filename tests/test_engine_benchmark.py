"""The engine benchmark runs, its implementations agree, and its JSON line has every field."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from conftest import missing_data

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "engine_speed.py"


@pytest.mark.slow
def test_engine_benchmark_json(shared_data, capsys, monkeypatch):
    if not (shared_data / "ml-100k" / "u.data").exists():
        missing_data("ml-100k/u.data not in the data root")
    monkeypatch.setenv("FEDLIB_DATA", str(shared_data))
    spec = importlib.util.spec_from_file_location("engine_speed", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--rounds", "3", "--slow-rounds", "1", "--json-only"])
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    for key in ("batched_s_per_round", "sequential_s_per_round", "reference_loop_s_per_round", "speedup_vs_sequential",
                "speedup_vs_reference_loop", "max_abs_diff", "flop_floor_s_per_round"):
        assert key in result
    assert result["max_abs_diff"] < 1e-4
    assert result["examples_per_round"] == 500_000
    assert result["batched_s_per_round"] < result["sequential_s_per_round"]
