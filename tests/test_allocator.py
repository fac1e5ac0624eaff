"""fedlib keeps freed memory for reuse (glibc), can be told not to, and trains the same numbers either way."""
from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

import fedlib
from fedlib.device import ALLOCATOR_SETTINGS, keep_freed_memory

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "allocator.py"
ON_GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def test_switched_off_by_the_environment():
    assert keep_freed_memory({"FEDLIB_KEEP_FREED_MEMORY": "0"}) is False
    assert keep_freed_memory({"FEDLIB_KEEP_FREED_MEMORY": " 0 "}) is False


@pytest.mark.skipif(not ON_GLIBC, reason="mallopt is glibc's")
def test_glibc_accepts_every_setting_and_import_applies_them():
    assert keep_freed_memory({}) is True
    assert fedlib.KEEPS_FREED_MEMORY is True
    # glibc caps the mmap threshold at 32 MiB on 64-bit: a larger value would be refused
    assert ALLOCATOR_SETTINGS["mmap_threshold"] <= 32 << 20


@pytest.mark.skipif(not ON_GLIBC, reason="mallopt is glibc's")
def test_import_honours_the_switch():
    code = "import fedlib; print(fedlib.KEEPS_FREED_MEMORY)"
    for value, expected in (("0", "False"), ("1", "True")):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**os.environ, "FEDLIB_KEEP_FREED_MEMORY": value})
        assert done.stdout.strip() == expected


def test_benchmark_trains_the_same_parameters_under_both_settings(capsys):
    spec = importlib.util.spec_from_file_location("allocator_benchmark", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.main(["--task", "synthetic", "--epochs", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert json.loads(lines[-1]) == result
    assert result["same_parameters"] is True and result["steps_per_epoch"] > 0
    for setting in module.SETTINGS:
        assert result[f"{setting}/epoch_s"] > 0 and result[f"{setting}/product_ms"] > 0
    with pytest.raises(SystemExit):
        module.main(["--task", "synthetic", "--epochs", "0"])
