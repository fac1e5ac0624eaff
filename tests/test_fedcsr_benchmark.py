"""The FedCSR step benchmark runs, and its two graph-layer paths train the same model."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "fedcsr_step.py"


def test_fedcsr_step_benchmark_json(capsys):
    spec = importlib.util.spec_from_file_location("fedcsr_step", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--dataset", "synthetic", "--dim", "16", "--steps", "2", "--negatives", "10", "--json-only"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for loss in ("sampled", "full_softmax"):
        full, rows = result[f"full_graph_{loss}_last_loss"], result[f"batch_rows_{loss}_last_loss"]
        assert rows == pytest.approx(full, rel=1e-5)                   # same model after the same steps
        assert result[f"batch_rows_{loss}_s_per_step"] > 0
    assert result["full_graph_sampled_last_loss"] != pytest.approx(result["full_graph_full_softmax_last_loss"])
    assert result["graph_layer_speedup_sampled"] > 0
    with pytest.raises(SystemExit):
        module.main(["--dataset", "synthetic", "--steps", "0"])
