"""Peak resident memory of a run: the measurement, and that the grids record it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fedlib.experiments import grid
from fedlib.reporting import read_runs

LINUX = sys.platform.startswith("linux") and Path("/proc/self/status").exists()


@pytest.fixture()
def project(tmp_path, monkeypatch):
    """An empty project root: nothing here can touch the real results/."""
    monkeypatch.setenv("FEDLIB_PROJECT_ROOT", str(tmp_path))
    return tmp_path


def in_fresh_process(code: str, project_root: Path) -> dict:
    """Run ``code`` in a new interpreter and return the JSON it prints last.

    Why not in this process: a block's peak counts memory the process already holds. After
    earlier tests have freed hundreds of MB inside the heap, ``malloc`` serves a new tensor
    from those already-resident pages, so allocating it does not raise RSS at all and every
    block reports the same peak. Only a fresh process makes "a bigger tensor, a bigger peak"
    a property of the code rather than of the test order.
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "FEDLIB_PROJECT_ROOT": str(project_root),
                                            "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not LINUX, reason="the per-block peak (VmHWM) is Linux only")
def test_peak_is_positive_and_grows_with_a_large_tensor_allocated_inside_the_block(tmp_path):
    megabytes = 256
    peaks = in_fresh_process(f"""
        import json, torch
        from fedlib.experiments import grid
        with grid.PeakRSS() as idle:
            pass
        with grid.PeakRSS() as busy:
            block = torch.ones({megabytes} * 2**20 // 4, dtype=torch.float32)  # every page written: resident
            del block
        with grid.PeakRSS() as after:
            pass
        print(json.dumps({{name: [p.mb, p.source] for name, p in
                          (("idle", idle), ("busy", busy), ("after", after))}}))
    """, tmp_path)
    (idle, idle_source), (busy, busy_source), (after, _) = peaks["idle"], peaks["busy"], peaks["after"]
    assert idle is not None and idle > 0
    assert idle_source == busy_source == "VmHWM"  # the peak was reset: it is the block's own
    # freed before the block ends, so only a per-block peak can see it; allow for allocator slack
    assert busy - idle > 0.8 * megabytes
    # the next block starts from the current RSS again, not from the earlier peak
    assert after < busy - 0.5 * megabytes


@pytest.mark.skipif(not LINUX, reason="the per-block peak (VmHWM) is Linux only")
def test_a_tensor_reusing_memory_the_process_already_holds_does_not_raise_the_peak(tmp_path):
    """Why a peak is the process's RSS, not a tensor's size: with the project's allocator
    settings, freed heap memory is served again from pages that are already resident."""
    peaks = in_fresh_process("""
        import json, torch, fedlib
        from fedlib.experiments import grid
        holes = [torch.ones(16 * 2**20 // 4) for _ in range(20)]  # 320 MB of heap blocks, below mmap's threshold
        pinned = torch.ones(16 * 2**20 // 4)  # keeps the heap's top in use, so the freed blocks are not trimmed
        del holes
        with grid.PeakRSS() as idle:
            pass
        with grid.PeakRSS() as reused:
            block = torch.ones(128 * 2**20 // 4)
            del block
        print(json.dumps({"keeps": fedlib.KEEPS_FREED_MEMORY, "idle": [idle.mb, idle.source],
                          "reused": [reused.mb, reused.source]}))
    """, tmp_path)
    if not peaks["keeps"]:
        pytest.skip("the allocator settings were not applied (not glibc)")
    (idle, idle_source), (reused, reused_source) = peaks["idle"], peaks["reused"]
    assert idle_source == reused_source == "VmHWM"
    assert reused - idle < 64  # far less than the 128 MB tensor: its pages were resident already


def test_without_the_proc_files_it_falls_back_to_the_process_wide_maximum(monkeypatch, tmp_path):
    monkeypatch.setattr(grid.PeakRSS, "_STATUS", tmp_path / "absent-status")
    monkeypatch.setattr(grid.PeakRSS, "_CLEAR_REFS", tmp_path / "absent-dir" / "clear_refs")
    with grid.PeakRSS() as peak:
        pass
    resource = pytest.importorskip("resource")
    assert peak.source == "ru_maxrss"
    # ru_maxrss only grows: the fallback is at least the process's current peak in MiB (kB on Linux)
    if LINUX:
        assert peak.mb == pytest.approx(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, rel=0.05)
    assert peak.mb > 0


def test_nothing_measurable_gives_none(monkeypatch, tmp_path):
    monkeypatch.setattr(grid.PeakRSS, "_STATUS", tmp_path / "absent-status")
    monkeypatch.setattr(grid.PeakRSS, "_CLEAR_REFS", tmp_path / "absent-dir" / "clear_refs")
    monkeypatch.setattr(grid.PeakRSS, "_ru_maxrss_mb", staticmethod(lambda: None))
    with grid.PeakRSS() as peak:
        pass
    assert peak.mb is None and peak.source is None


@pytest.mark.skipif(not LINUX, reason="the per-block peak (VmHWM) is Linux only")
def test_live_and_recorded_grids_write_each_runs_peak_memory(project):
    peaks = in_fresh_process("""
        import json, os
        from pathlib import Path
        import torch
        from fedlib.experiments import grid
        from fedlib.reporting import read_runs
        import fedlib.reporting.results as results

        # a temporary project root has no commit: relax the paper-record rule, as tests/conftest.py does
        results.check_recordable_commit = lambda commit, root=None: commit
        megabytes = {"small": 8, "large": 192}

        import time

        def train(config, progress=None):
            block = torch.ones(megabytes[config["size"]] * 2**20 // 4)
            for _ in range(config["rounds"]):
                if progress is not None:
                    progress()
            if config["size"] == "large":  # CPU work the record's cpu_time_s must see; "small" sleeps instead
                spin_until = time.process_time() + 0.3
                while time.process_time() < spin_until:
                    pass
            else:
                time.sleep(0.3)
            return {"metrics": {"total": float(block[:10].sum())}, "extra": {}}

        cells = [{"size": size, "rounds": 2, "seed": 0} for size in ("large", "small")]
        grid.run_cells("fedrkg", cells, "quick", train, label=lambda c: c["size"])
        live = {r.config["size"]: [r.peak_rss_mb, r.cpu_time_s, r.wall_time_s] for r in read_runs("fedrkg", "quick")}
        grid.run_recorded_grid("fedrkg", cells, train, "paper", cache_dir=Path(os.environ["FEDLIB_PROJECT_ROOT"]) / "cache", progress=False)
        recorded = {r.config["size"]: [r.peak_rss_mb, r.cpu_time_s, r.wall_time_s] for r in read_runs("fedrkg", "paper")}
        print(json.dumps({"live": live, "recorded": recorded}))
    """, project)
    cpu = {grid_kind: {size: values[1] for size, values in runs.items()} for grid_kind, runs in peaks.items()}
    wall = {grid_kind: {size: values[2] for size, values in runs.items()} for grid_kind, runs in peaks.items()}
    peaks = {grid_kind: {size: values[0] for size, values in runs.items()} for grid_kind, runs in peaks.items()}
    for grid_kind in ("live", "recorded"):
        # the spinning run used at least its 0.3 s of CPU; the sleeping one far less than its wall time
        assert cpu[grid_kind]["large"] >= 0.3
        assert wall[grid_kind]["small"] >= 0.3 and cpu[grid_kind]["small"] < wall[grid_kind]["small"] - 0.2
    for peaks_of_grid in (peaks["live"], peaks["recorded"]):
        assert set(peaks_of_grid) == {"small", "large"}
        assert all(v is not None and v > 0 for v in peaks_of_grid.values())
        # the small run comes after the large one: its peak is its own, not the process's
        assert peaks_of_grid["large"] - peaks_of_grid["small"] > 0.5 * (192 - 8)
