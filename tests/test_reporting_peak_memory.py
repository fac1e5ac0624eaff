"""Peak resident memory of a run: the measurement, and that the grids record it."""
from __future__ import annotations

import sys
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


@pytest.mark.skipif(not LINUX, reason="the per-block peak (VmHWM) is Linux only")
def test_peak_is_positive_and_grows_with_a_large_tensor_allocated_inside_the_block():
    with grid.PeakRSS() as idle:
        pass
    megabytes = 256
    with grid.PeakRSS() as busy:
        block = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)  # every page written: resident
        del block
    assert idle.mb is not None and idle.mb > 0
    assert idle.source == busy.source == "VmHWM"  # the peak was reset: it is the block's own
    # freed before the block ends, so only a per-block peak can see it; allow for allocator slack
    assert busy.mb - idle.mb > 0.8 * megabytes
    # the next block starts from the current RSS again, not from the earlier peak
    with grid.PeakRSS() as after:
        pass
    assert after.mb < busy.mb - 0.5 * megabytes


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
    megabytes = {"small": 8, "large": 192}

    def train(config, progress=None):
        block = torch.ones(megabytes[config["size"]] * 2**20 // 4)
        for _ in range(config["rounds"]):
            if progress is not None:
                progress()
        return {"metrics": {"total": float(block[:10].sum())}, "extra": {}}

    cells = [{"size": size, "rounds": 2, "seed": 0} for size in ("large", "small")]
    grid.run_cells("fedrkg", cells, "quick", train, label=lambda c: c["size"])
    live = {r.config["size"]: r.peak_rss_mb for r in read_runs("fedrkg", "quick")}
    grid.run_recorded_grid("fedrkg", cells, train, "paper", cache_dir=project / "cache", progress=False)
    recorded = {r.config["size"]: r.peak_rss_mb for r in read_runs("fedrkg", "paper")}
    for peaks in (live, recorded):
        assert set(peaks) == {"small", "large"} and all(v is not None and v > 0 for v in peaks.values())
        # the small run comes after the large one: its peak is its own, not the process's
        assert peaks["large"] - peaks["small"] > 0.5 * (megabytes["large"] - megabytes["small"])
