"""Paper-profile records come only from committed code that exists (issue 45, clean provenance).

The other tests write paper-profile records into temporary project roots with made-up commits,
so ``tests/conftest.py`` relaxes the rule for them; these tests (marked ``provenance``) keep it.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import fedlib.reporting.results as results
from fedlib.experiments.grid import run_recorded_grid
from fedlib.reporting import append_run, read_runs

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.provenance


def head() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip("the tests do not run from a git checkout")
    return done.stdout.strip()


@pytest.fixture
def scratch_results(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_RESULTS_DIR", str(tmp_path / "results"))
    return tmp_path / "results"


def record(profile: str, commit: str):
    return append_run("f3crec", profile, {"method": "FT", "dataset": "synthetic"}, 0, {"N@20": 0.5}, 1.0,
                      commit=commit)


def test_a_paper_record_needs_committed_code_that_exists(scratch_results):
    sha = head()
    with pytest.raises(ValueError, match=rf"{sha} has uncommitted changes.*commit \(or stash\)"):
        record("paper", f"{sha}+dirty")
    with pytest.raises(ValueError, match="has none .*run the grid from a clone"):
        record("paper", "unknown")
    with pytest.raises(ValueError, match="'0123abc', which is not in the history"):
        record("paper", "0123abc")
    assert not (scratch_results / "f3crec" / "runs.jsonl").exists()  # nothing was written
    assert record("paper", sha).commit == sha
    assert [r.commit for r in read_runs("f3crec", "paper")] == [sha]


def test_quick_and_smoke_records_may_come_from_work_in_progress(scratch_results):
    for profile in ("quick", "smoke"):
        assert record(profile, "0123abc+dirty").commit == "0123abc+dirty"


def test_a_paper_grid_on_uncommitted_code_stops_before_training(scratch_results, tmp_path, monkeypatch):
    monkeypatch.setattr(results, "current_commit", lambda root=None: "0123abc+dirty")

    def must_not_train(config, progress=None, **kwargs):
        raise AssertionError("a cell was trained although its record would be refused")

    with pytest.raises(ValueError, match="uncommitted changes"):
        run_recorded_grid("f3crec", [{"method": "FT", "seed": 0}], must_not_train, "paper",
                          cache_dir=tmp_path / "cache", progress=False)
    run_recorded_grid("f3crec", [{"method": "FT", "seed": 0}],
                      lambda config, progress=None: {"metrics": {"N@20": 0.1}, "extra": {}}, "smoke",
                      cache_dir=tmp_path / "cache", progress=False)  # a smoke grid goes on
    assert len(read_runs("f3crec", "smoke")) == 1
    # Reading cells already recorded (a lesson at the paper profile) needs no clean tree.
    monkeypatch.setattr(results, "current_commit", lambda root=None: head())
    recorded = {"method": "FT", "seed": 1}
    run_recorded_grid("f3crec", [recorded], lambda config, progress=None: {"metrics": {"N@20": 0.2}, "extra": {}},
                      "paper", cache_dir=tmp_path / "cache", progress=False)
    monkeypatch.setattr(results, "current_commit", lambda root=None: "0123abc+dirty")
    frame = run_recorded_grid("f3crec", [recorded], must_not_train, "paper", cache_dir=tmp_path / "fresh_cache",
                              progress=False)
    assert frame["metrics.N@20"].tolist() == [0.2]
