"""The FedCSR step benchmark runs, and all its variants train the same model."""
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
    from fedlib.baselines.sequential import sequences
    originals = (sequences.propagate_rows, sequences.sampled_head_losses, sequences.Dropout,
                 sequences.CausalSelfAttention.forward)
    module.main(["--dataset", "synthetic", "--dim", "16", "--steps", "2", "--negatives", "10", "--json-only"])
    assert (sequences.propagate_rows, sequences.sampled_head_losses, sequences.Dropout,
            sequences.CausalSelfAttention.forward) == originals                  # swaps are undone
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for layout in module.ENCODERS:        # same encoder layout: same model after the same steps
        sampled = [result[f"{key}_last_loss"] for key, *_, encoder in module.VARIANTS
                   if key.endswith("_sampled") and encoder == layout]
        assert sampled and sampled == pytest.approx([sampled[0]] * len(sampled), rel=1e-5), layout
    assert result["speedup_over_padded_torch_dropout"] > 0
    assert all(result[f"{key}_s_per_step"] > 0 for key, *_ in module.VARIANTS)
    assert result["default_full_softmax_last_loss"] != pytest.approx(result["default_sampled_last_loss"])
    assert result["speedup_over_full_graph"] > 0 and result["speedup_over_separate_reads"] > 0
    with pytest.raises(SystemExit):
        module.main(["--dataset", "synthetic", "--steps", "0"])
