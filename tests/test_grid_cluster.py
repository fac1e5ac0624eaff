"""A paper's grid on a Dask LocalCluster (``--local-cluster N``): the driver alone writes the records.

Real cells of two papers (F3CRec and FedCSR on their synthetic data, a few rounds each) run on a
``LocalCluster`` of two single-threaded worker processes and in this process, each into its own
temporary results folder (``FEDLIB_RESULTS_DIR``); never into the committed ``results/``.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

if os.environ.get("CI"):
    import distributed  # CI installs the cluster extra: a missing one fails there
else:
    distributed = pytest.importorskip("distributed", reason="needs the cluster extra: pip install -e '.[cluster]'")

from fedlib.experiments.grid import Cluster, CostGuess, makespan_hours, unique_cells  # noqa: E402  (re-exported)
from fedlib.papers.f3crec import experiment as f3crec  # noqa: E402
from fedlib.papers.fedcsr import experiment as fedcsr  # noqa: E402
from fedlib.reporting.results import config_hash  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
FEDCSR_TINY = dict(dim=8, rounds=2, patience=2, local_epochs=1, batch_size=64, maxlen=6)


def f3crec_cells():
    return [f3crec.cell("synthetic", "FedMF", method, rounds=2, patience=2, seed=seed)
            for method in ("FT", "F3CRec") for seed in (0, 1)]


def fedcsr_cells(seeds=(0, 1)):
    return [fedcsr.cell("synthetic", **FEDCSR_TINY, seed=seed) for seed in seeds]


def records(results: Path, paper: str, profile: str = "smoke"):
    path = results / paper / profile / "runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def comparable(record):
    """The record's metrics without its timings (which differ between any two runs)."""
    return {k: v for k, v in record["metrics"].items() if "seconds" not in k}


@pytest.fixture
def results_dirs(tmp_path, monkeypatch):
    """Two empty results folders; the first is FEDLIB_RESULTS_DIR (workers inherit it, and never write there)."""
    monkeypatch.setenv("FEDLIB_DEVICE", "cpu")
    dirs = tmp_path / "in_process", tmp_path / "cluster"

    def use(index):
        monkeypatch.setenv("FEDLIB_RESULTS_DIR", str(dirs[index]))
        return dirs[index]

    return use


def run_both_papers(cache: Path, cluster):
    f3crec.run_grid(f3crec_cells(), "smoke", cache_dir=cache / "f3crec", progress=False, cluster=cluster)
    fedcsr.run_grid(fedcsr_cells(), "smoke", cache_dir=cache / "fedcsr", progress=False, cluster=cluster)


def test_a_local_cluster_records_what_the_in_process_grid_records(results_dirs, tmp_path):
    committed = {path: path.read_bytes() for path in (REPO / "results").glob("*/smoke/runs.jsonl")}
    assert committed, "the checkout holds committed smoke records for this check to protect"
    local = results_dirs(0)
    run_both_papers(tmp_path / "cache_in_process", None)
    on_cluster = results_dirs(1)
    run_both_papers(tmp_path / "cache_cluster", Cluster(local_workers=2))
    assert {path: path.read_bytes() for path in committed} == committed  # the committed records are untouched
    for paper, cells in (("f3crec", f3crec_cells()), ("fedcsr", fedcsr_cells())):
        ours, theirs = records(local, paper), records(on_cluster, paper)
        assert len(theirs) == len(cells) == len({r["config_hash"] for r in theirs})  # one line per cell
        assert {r["config_hash"] for r in theirs} == {r["config_hash"] for r in ours} == \
            {config_hash(c) for c in unique_cells(cells)}
        by_hash = {r["config_hash"]: r for r in ours}
        for record in theirs:
            assert comparable(record) == comparable(by_hash[record["config_hash"]]), record["config"]
            assert record["torch_threads"] == 1 and record["cpu_time_s"] > 0 and record["wall_time_s"] > 0
    # A second run trains nothing and appends nothing.
    before = {paper: (on_cluster / paper / "smoke" / "runs.jsonl").read_bytes() for paper in ("f3crec", "fedcsr")}
    run_both_papers(tmp_path / "cache_cluster_2", Cluster(local_workers=2))  # a fresh cache: the records decide
    for paper, content in before.items():
        assert (on_cluster / paper / "smoke" / "runs.jsonl").read_bytes() == content


def test_a_cell_failing_on_its_worker_leaves_the_others_recorded(results_dirs, tmp_path, monkeypatch):
    results = results_dirs(1)
    empty = tmp_path / "no_data"
    empty.mkdir()
    monkeypatch.setenv("FEDLIB_DATA", str(empty))  # the workers start with an empty data root
    monkeypatch.setenv("FEDLIB_OFFLINE", "1")
    needs_data = f3crec.cell("ML-100K", "FedMF", "FT", rounds=2, patience=2, seed=0)
    cells = [needs_data, *f3crec_cells()]
    from fedlib.experiments.cluster import CellsFailed

    with pytest.raises(CellsFailed) as failed:
        f3crec.run_grid(cells, "smoke", cache_dir=tmp_path / "cache", progress=False, cluster=Cluster(local_workers=2))
    assert list(failed.value.errors) == [config_hash(needs_data)]
    assert "MissingDataError" in failed.value.errors[config_hash(needs_data)]
    assert "ml-100k" in str(failed.value).lower() and "retries only these" in str(failed.value)
    recorded = {r["config_hash"] for r in records(results, "f3crec")}
    assert recorded == {config_hash(c) for c in f3crec_cells()}  # every other cell is recorded


DRIVER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from fedlib.experiments.grid import Cluster
    from fedlib.papers.fedcsr import experiment as fedcsr

    TINY = dict(dim=8, rounds=6, patience=6, local_epochs=1, batch_size=64, maxlen=6)
    if __name__ == "__main__":
        cells = [fedcsr.cell("synthetic", **TINY, seed=seed) for seed in range(6)]
        fedcsr.run_grid(cells, "smoke", cache_dir=Path(sys.argv[1]), progress=False,
                        cluster=Cluster(local_workers=2))
""")


def test_a_killed_driver_loses_no_record_and_a_restart_records_the_rest(results_dirs, tmp_path):
    results = results_dirs(1)
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "FEDLIB_RESULTS_DIR": str(results)}
    command = [sys.executable, str(script), str(tmp_path / "cache")]
    # Its own process group: killing the group kills the driver and its LocalCluster's workers at once.
    driver = subprocess.Popen(command, env=env, cwd=REPO, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not records(results, "fedcsr") and driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert driver.poll() is None, f"the driver ended before it could be killed: {driver.stderr.read().decode()[-2000:]}"
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait(timeout=60)
    driver.stderr.close()
    first = records(results, "fedcsr")
    assert 1 <= len(first) < 6, "the kill came after the first record and before the last"
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    final = records(results, "fedcsr")
    assert final[:len(first)] == first  # the records written before the kill are kept as they were
    hashes = [r["config_hash"] for r in final]
    assert len(hashes) == len(set(hashes)) == 6  # each cell once: nothing lost, nothing trained twice


def test_cost_guesses_and_schedules():
    assert makespan_hours([3600.0] * 4, 2) == pytest.approx(2.0)
    assert makespan_hours([7200.0, 1800.0, 1800.0, 1800.0], 2) == pytest.approx(2.0)  # the longest cell bounds it
    assert makespan_hours([7200.0, 1800.0, 1800.0, 1800.0], 100) == pytest.approx(2.0)
    assert makespan_hours([3600.0, float("nan")], 1) == pytest.approx(1.0)  # a cell without a guess is left out
    with pytest.raises(ValueError, match="workers must be at least 1"):
        makespan_hours([1.0], 0)

    class Record:
        def __init__(self, method, dataset, seed, wall):
            self.config = {"method": method, "dataset": dataset, "seed": seed}
            self.wall_time_s = wall

    guess = CostGuess([Record("A", "x", 0, 10.0), Record("A", "x", 1, 30.0), Record("A", "y", 0, 100.0)])
    assert guess({"method": "A", "dataset": "x", "seed": 2}) == pytest.approx(20.0)  # the same cell's other seeds
    assert guess({"method": "A", "dataset": "y", "seed": 1}) == pytest.approx(100.0)  # the label on that dataset
    assert math.isnan(guess({"method": "B", "dataset": "x", "seed": 0}))  # a label never run: no guess

    class Capped(Record):
        def __init__(self, method, dataset, seed, wall, rounds, lr):
            super().__init__(method, dataset, seed, wall)
            self.config.update(rounds=rounds, lr=lr)

    capped = CostGuess([Capped("A", "x", 0, 100.0, 20, 1e-3), Capped("A", "x", 0, 400.0, 20, 5e-4)])
    # a longer round cap scales the nearest run (the one at the same rate) by the caps' ratio
    assert capped({"method": "A", "dataset": "x", "seed": 1, "rounds": 100, "lr": 1e-3}) == pytest.approx(500.0)
    assert capped({"method": "A", "dataset": "x", "seed": 1, "rounds": 10, "lr": 5e-4}) == pytest.approx(200.0)


def test_a_cluster_needs_exactly_one_place():
    with pytest.raises(ValueError, match="exactly one of local_workers"):
        Cluster().check()
    with pytest.raises(ValueError, match="exactly one of local_workers"):
        Cluster(local_workers=2, scheduler="tcp://127.0.0.1:8786").check()
    with pytest.raises(ValueError, match="local_workers must be at least 1"):
        Cluster(local_workers=0).check()
    assert Cluster(local_workers=2).check().threads == 1


def test_the_command_line_reports_failed_cells_and_a_missing_dask(monkeypatch, tmp_path, capsys):
    import importlib.util

    monkeypatch.setenv("FEDLIB_RESULTS_DIR", str(tmp_path / "elsewhere"))  # restored after the test

    from fedlib.experiments.cluster import CellsFailed

    def failing_grid(cells, profile, **kwargs):
        assert kwargs["cluster"] == Cluster(local_workers=2)
        raise CellsFailed("f3crec", {"abc": "MissingDataError: ml-100k is not in the data root"})

    monkeypatch.setattr(f3crec, "run_grid", failing_grid)
    argv = ["table2", "--datasets", "ML-100K", "--backbones", "FedMF", "--methods", "FT", "--seeds", "9",
            "--results-dir", str(tmp_path / "results"), "--local-cluster", "2"]
    with pytest.raises(SystemExit, match=r"(?s)1 f3crec cell.*failed.*abc: MissingDataError"):
        f3crec.main(argv)
    assert os.environ["FEDLIB_RESULTS_DIR"] == str((tmp_path / "results").resolve())
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "distributed" else
                        real_find_spec(name, *a))
    with pytest.raises(SystemExit) as exited:  # argparse's error: the install hint on stderr
        f3crec.main(argv)
    assert exited.value.code == 2 and 'pip install -e ".[cluster]"' in capsys.readouterr().err


def test_a_running_scheduler_is_used_through_its_address(results_dirs, tmp_path):
    """--scheduler ADDRESS: the cluster is someone else's (started here as a stand-in); the grid only connects."""
    import logging

    results = results_dirs(1)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=logging.ERROR) as running:
        f3crec.run_grid(f3crec_cells()[:2], "smoke", cache_dir=tmp_path / "cache", progress=False,
                        cluster=Cluster(scheduler=running.scheduler_address))
        assert len(running.scheduler_info["workers"]) == 1  # still running: the grid did not close it
    assert {r["config_hash"] for r in records(results, "f3crec")} == {config_hash(c) for c in f3crec_cells()[:2]}
