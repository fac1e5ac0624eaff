"""Run records: append, read back, provenance, and averaging over seeds."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import threading

import pytest

from fedlib.reporting.results import (
    RunRecord,
    aggregate_runs,
    append_run,
    config_hash,
    current_commit,
    read_run_file,
    read_runs,
    runs_path,
)


@pytest.fixture()
def project(tmp_path, monkeypatch):
    """An empty project root: nothing here can touch the real results/."""
    monkeypatch.setenv("FEDLIB_PROJECT_ROOT", str(tmp_path))
    return tmp_path


CONFIG = {"dataset": "ML-100K", "backbone": "FedMF", "method": "FT", "lr": 0.01}


def test_append_run_round_trips(project):
    record = append_run(
        "f3crec", "paper", CONFIG, 3, {"N@20": 0.1, "R@20": float("nan")}, 12.5, {"note": "x"},
        device="cpu", commit="abc1234",
    )
    path = project / "results" / "f3crec" / "runs.jsonl"
    assert path.exists() and runs_path("f3crec", "paper") == path
    assert read_runs("f3crec", "paper") == [record]
    assert record.config == {**CONFIG, "seed": 3}
    assert record.config_hash == config_hash({**CONFIG, "seed": 3})
    assert record.metrics == {"N@20": 0.1, "R@20": None}  # NaN is not JSON; stored as null
    assert (record.seed, record.profile, record.paper, record.device, record.commit) == (3, "paper", "f3crec", "cpu", "abc1234")
    assert record.wall_time_s == 12.5 and record.extra == {"note": "x"}
    assert record.torch_version and record.fedlib_version and record.timestamp.endswith("+00:00")
    line = json.loads(path.read_text().splitlines()[0])
    assert RunRecord.from_dict(line) == record
    result = record.result()
    assert result == {"config": record.config, "metrics": record.metrics, "extra": {"note": "x"}}
    result["extra"]["note"] = "changed"  # a copy: editing it leaves the record alone
    assert record.extra == {"note": "x"}


def test_peak_memory_round_trips_and_old_records_without_it_still_load(project):
    measured = append_run("f3crec", "paper", CONFIG, 0, {"N@20": 0.1}, 1.0, device="cpu", commit="c",
                          peak_rss_mb=1234.5)
    unmeasured = append_run("f3crec", "paper", CONFIG, 1, {"N@20": 0.2}, 1.0, device="cpu", commit="c")
    assert measured.peak_rss_mb == 1234.5 and unmeasured.peak_rss_mb is None
    assert read_runs("f3crec", "paper") == [measured, unmeasured]
    lines = [json.loads(line) for line in runs_path("f3crec", "paper").read_text().splitlines()]
    assert lines[0]["peak_rss_mb"] == 1234.5 and lines[1]["peak_rss_mb"] is None
    # a record written before the field existed, and one from a later version with a field we do not know
    old = {key: value for key, value in lines[0].items() if key != "peak_rss_mb"}
    assert RunRecord.from_dict(old) == RunRecord.from_dict({**lines[0], "peak_rss_mb": None})
    assert RunRecord.from_dict({**lines[0], "gpu_memory_mb": 9.0}).peak_rss_mb == 1234.5
    # the fields without a default stay required
    with pytest.raises(ValueError, match="lacks wall_time_s"):
        RunRecord.from_dict({key: value for key, value in lines[0].items() if key != "wall_time_s"})
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="peak_rss_mb"):
            append_run("f3crec", "paper", CONFIG, 2, {}, 1.0, device="cpu", commit="c", peak_rss_mb=bad)


def test_cpu_time_round_trips_and_old_records_without_it_still_load(project):
    measured = append_run("f3crec", "paper", CONFIG, 0, {"N@20": 0.1}, 9.0, device="cpu", commit="c", cpu_time_s=4.5)
    unmeasured = append_run("f3crec", "paper", CONFIG, 1, {"N@20": 0.2}, 9.0, device="cpu", commit="c")
    assert (measured.cpu_time_s, unmeasured.cpu_time_s) == (4.5, None)
    assert read_runs("f3crec", "paper") == [measured, unmeasured]
    line = json.loads(runs_path("f3crec", "paper").read_text().splitlines()[0])
    assert line["cpu_time_s"] == 4.5
    assert RunRecord.from_dict({key: value for key, value in line.items() if key != "cpu_time_s"}).cpu_time_s is None
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="cpu_time_s"):
            append_run("f3crec", "paper", CONFIG, 2, {}, 1.0, device="cpu", commit="c", cpu_time_s=bad)


def test_records_carry_torchs_thread_count(project):
    import torch

    default = append_run("f3crec", "paper", CONFIG, 0, {"N@20": 0.1}, 1.0, device="cpu", commit="c")
    given = append_run("f3crec", "paper", CONFIG, 1, {"N@20": 0.1}, 1.0, device="cpu", commit="c", torch_threads=3)
    assert (default.torch_threads, given.torch_threads) == (torch.get_num_threads(), 3)
    line = json.loads(runs_path("f3crec", "paper").read_text().splitlines()[1])
    assert line["torch_threads"] == 3
    assert RunRecord.from_dict({key: value for key, value in line.items() if key != "torch_threads"}).torch_threads is None
    with pytest.raises(ValueError, match="torch_threads"):
        append_run("f3crec", "paper", CONFIG, 2, {}, 1.0, device="cpu", commit="c", torch_threads=0)


def test_each_seed_is_its_own_run_and_the_seed_must_agree(project):
    first = append_run("f3crec", "paper", CONFIG, 0, {"N@20": 0.1}, 1.0, device="cpu", commit="c")
    second = append_run("f3crec", "paper", CONFIG, 1, {"N@20": 0.2}, 1.0, device="cpu", commit="c")
    assert first.config_hash != second.config_hash
    assert append_run("f3crec", "paper", {**CONFIG, "seed": 0}, 0, {"N@20": 0.1}, 1.0, device="cpu", commit="c").config_hash == first.config_hash
    with pytest.raises(ValueError, match="disagrees"):
        append_run("f3crec", "paper", {**CONFIG, "seed": 5}, 0, {}, 1.0, device="cpu", commit="c")
    assert len(read_runs("f3crec", "paper")) == 3


def test_quick_runs_go_to_their_own_folder_and_profiles_are_checked(project):
    append_run("f3crec", "quick", CONFIG, 0, {"N@20": 0.1}, 1.0, device="cpu", commit="c")
    assert (project / "results" / "f3crec" / "quick" / "runs.jsonl").exists()
    assert not (project / "results" / "f3crec" / "runs.jsonl").exists()
    for bad in ("", "Paper", "../paper"):
        with pytest.raises(ValueError, match="unknown profile"):
            append_run("f3crec", bad, CONFIG, 0, {}, 1.0, device="cpu", commit="c")
    with pytest.raises(ValueError, match="wall_time_s"):
        append_run("f3crec", "quick", CONFIG, 0, {}, -1.0, device="cpu", commit="c")


def test_parallel_appends_never_interleave(project):
    def worker(index):
        for seed in range(25):
            append_run("f3crec", "paper", {**CONFIG, "worker": index}, seed, {"N@20": seed / 100}, 0.1, device="cpu", commit="c")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    records = read_runs("f3crec", "paper")
    assert len(records) == 200
    assert len({r.config_hash for r in records}) == 200


def test_a_torn_last_line_does_not_swallow_the_next_record(project):
    path = project / "results" / "f3crec" / "runs.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text('{"config_hash": "trunc')  # a writer killed mid-line
    record = append_run("f3crec", "paper", CONFIG, 0, {"N@20": 0.1}, 1.0, device="cpu", commit="c")
    lines = path.read_text().splitlines()
    assert RunRecord.from_dict(json.loads(lines[-1])) == record
    with pytest.raises(ValueError, match=r"runs.jsonl:1:"):
        read_run_file(path)


def test_commit_is_unknown_outside_a_checkout(project):
    assert current_commit() == "unknown"


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_commit_is_short_sha_and_dirty_ignores_results(tmp_path):
    def git(*args):
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
            cwd=tmp_path, check=True, capture_output=True, text=True,
        ).stdout.strip()

    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "runs.jsonl").write_text("")
    git("add", ".")
    git("commit", "-q", "-m", "init")
    sha = git("rev-parse", "--short", "HEAD")
    assert current_commit(tmp_path) == sha
    (tmp_path / "results" / "runs.jsonl").write_text("{}\n")  # recording runs is not a code change
    assert current_commit(tmp_path) == sha
    for executed in ("notebooks/00_intro.ipynb", "notebooks/appendix/01_x_appendix.ipynb"):
        (tmp_path / executed).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / executed).write_text("{}")
        git("add", executed)
        git("commit", "-q", "-m", f"add {executed}")
        sha = git("rev-parse", "--short", "HEAD")
        (tmp_path / executed).write_text('{"executed": true}')  # re-executing a notebook is not a code change
        assert current_commit(tmp_path) == sha, executed
    (tmp_path / "code.py").write_text("x = 2\n")
    assert current_commit(tmp_path) == f"{sha}+dirty"
    assert current_commit(tmp_path / "results") == "unknown"  # not the top of the checkout


def _record(seed, metrics, method="FT", config_extra=None):
    config = {"dataset": "ML-100K", "method": method, "seed": seed, **(config_extra or {})}
    return RunRecord(
        config_hash=config_hash(config), paper="f3crec", profile="paper", seed=seed, config=config,
        metrics=metrics, wall_time_s=1.0, commit="c1", device="cpu", fedlib_version="0",
        torch_version="0", python_version="3", timestamp="t",
    )


def test_aggregate_runs_averages_seeds_and_links_run_ids():
    runs = [
        _record(1, {"N@20/D1": 0.30, "N@20/D2": 0.1}),
        _record(0, {"N@20/D1": 0.10, "N@20/D2": 0.2}),
        _record(0, {"N@20/D1": 0.50, "N@20/D2": 0.5}, method="F3CRec"),
    ]
    ours = aggregate_runs(
        runs,
        lambda r: {"dataset": r.config["dataset"], "method": r.config["method"]},
        metric_cells=lambda name: dict(zip(("metric", "block"), name.split("/"))),
    )
    cell = ours[(ours.method == "FT") & (ours.block == "D1")].iloc[0]
    assert cell["value"] == pytest.approx(0.2)
    assert cell["std"] == pytest.approx(math.sqrt(0.02))  # sample std of 0.1 and 0.3
    assert cell["n_seeds"] == 2 and cell["run_metric"] == "N@20/D1" and cell["ours_unit"] == "fraction"
    assert cell["run_ids"] == f"{runs[1].config_hash};{runs[0].config_hash}"  # ordered by seed
    single = ours[(ours.method == "F3CRec") & (ours.block == "D2")].iloc[0]
    assert single["n_seeds"] == 1 and math.isnan(single["std"])
    assert len(ours) == 4


def test_aggregate_runs_uses_the_latest_record_and_rejects_ambiguous_cells():
    old, new = _record(0, {"N@20": 0.1}), _record(0, {"N@20": 0.4})
    ours = aggregate_runs([old, new], lambda r: {"method": r.config["method"]})
    assert ours["value"].tolist() == [0.4] and ours["n_seeds"].tolist() == [1]
    clash = [_record(0, {"N@20": 0.1}), _record(0, {"N@20": 0.2}, config_extra={"lr": 0.1})]
    with pytest.raises(ValueError, match="same seed"):
        aggregate_runs(clash, lambda r: {"method": r.config["method"]})
