"""The graph-propagation benchmark runs, and its three paths compute the same thing."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "graph_propagation.py"


def test_graph_propagation_benchmark_json(capsys):
    spec = importlib.util.spec_from_file_location("graph_propagation", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--dataset", "synthetic", "--dim", "8", "--repeats", "2"])
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert "symmetric" in lines[-2] and result["nonzeros"] > 0
    for path in module.PATHS:
        assert result[f"{path}_ms"] > 0
        assert result[f"{path}_max_diff"] < 1e-5  # outputs and both gradients, against the COO path
    assert result["coo_max_diff"] == 0.0
    assert result["symmetric_speedup_vs_coo"] > 0
    with pytest.raises(SystemExit):
        module.main(["--dataset", "synthetic", "--repeats", "0"])
