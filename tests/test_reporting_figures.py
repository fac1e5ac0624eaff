"""The figure helpers the papers share (fedlib.reporting.figures): frames from records and common plots."""
from __future__ import annotations

import math
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.container import BarContainer  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from fedlib.reporting.figures import (curve_frame, grouped_bars, plot_lines, results_from_records,  # noqa: E402
                                      save_figure, seed_summary_frame)
from fedlib.reporting.results import RUN_ID_SEPARATOR, append_run, read_runs  # noqa: E402

CELL = {"dataset": "toy", "method": "A", "lr": 0.1}


@pytest.fixture()
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_PROJECT_ROOT", str(tmp_path))
    yield tmp_path
    plt.close("all")


def run(config, seed, metrics, curve=None):
    append_run("f3crec", "quick", {**config, "seed": seed}, seed, metrics, 1.0,
               {"curve": curve} if curve is not None else None, device="cpu", commit="abc1234")


def test_save_figure_without_a_name_saves_nothing(project):
    fig, ax = plt.subplots()
    assert save_figure(fig, "f3crec", None, "quick") == []
    assert not (project / "figures").exists()
    assert save_figure(fig, "f3crec", "fig1", "quick") == [project / "figures" / "f3crec" / "fig1.png"]


def test_the_frame_helpers_do_not_load_matplotlib():
    # table code builds curve and sweep frames; drawing is the only reason to load matplotlib
    code = "import sys, fedlib.reporting.figures; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_results_from_records_keeps_the_latest_training_run_of_each_config(project):
    run(CELL, 0, {"MRR": 0.1})
    run(CELL, 0, {"MRR": 0.2})  # the same configuration again: the later record wins
    run(CELL, 1, {"MRR": 0.3})
    run({"kind": "data_statistics", "dataset": "toy"}, 0, {"users": 5.0})
    results = results_from_records(read_runs("f3crec", "quick"))
    assert sorted((r["config"]["seed"], r["metrics"]["MRR"]) for r in results) == [(0, 0.2), (1, 0.3)]
    assert set(results[0]) == {"config", "metrics", "extra"}


def test_curve_frame_reads_each_configs_runs_and_every_numeric_column(project):
    run(CELL, 0, {}, [{"round": 1, "valid/MRR": 0.1, "loss": 2, "diverged": False, "note": "x"},
                      {"round": 2, "valid/MRR": 0.3, "loss": 1}])
    run(CELL, 1, {}, [{"round": 1, "valid/MRR": 0.2}])
    run({**CELL, "method": "B"}, 0, {}, [{"round": 1, "valid/MRR": 0.9}])  # not among the configs
    columns = ["dataset", "method", "seed", "round", "series", "value"]
    frame = curve_frame(read_runs("f3crec", "quick"), lambda c: {"dataset": c["dataset"], "method": c["method"] + "!"},
                        columns, configs=[CELL])
    assert list(frame.columns) == columns
    assert frame[["seed", "round", "series", "value"]].values.tolist() == [
        [0, 1, "loss", 2.0], [0, 1, "valid/MRR", 0.1], [0, 2, "loss", 1.0], [0, 2, "valid/MRR", 0.3],
        [1, 1, "valid/MRR", 0.2]]  # in the record's key order; booleans, text and the round are not curves
    assert set(frame["method"]) == {"A!"} and frame["value"].dtype == float


def test_curve_frame_picks_named_series_from_results():
    results = [{"config": {**CELL, "seed": 3}, "extra": {"curve": [{"round": 5, "test/HR": 0.5, "test/NDCG": 0.25},
                                                                  {"round": 6, "test/HR": 0.6}]}},
               {"config": {**CELL, "seed": 4}, "extra": {}}]  # a run without a curve adds no row
    series = {"test/NDCG": {"metric": "NDCG"}, "test/HR": {"metric": "HR"}}
    frame = curve_frame(results, lambda c: {"method": c["method"]}, ["method", "seed", "round", "metric", "value"],
                        series=series)
    assert frame.values.tolist() == [["A", 3, 5, "NDCG", 0.25], ["A", 3, 5, "HR", 0.5], ["A", 3, 6, "HR", 0.6]]
    empty = curve_frame([], lambda c: {}, ["round", "value"])
    assert empty.empty and list(empty.columns) == ["round", "value"]
    with pytest.raises(ValueError, match=r"no column \['sampler'\]"):
        curve_frame(results, lambda c: {"method": c["method"]}, ["method", "sampler", "value"], series=series)


def test_seed_summary_frame_averages_the_seeds_of_each_point(project):
    run(CELL, 0, {"A/test/HR": 0.10, "A/test/NDCG": 0.05, "loss": 1.0})
    run(CELL, 1, {"A/test/HR": 0.20, "A/test/NDCG": None, "loss": 1.0})
    run({**CELL, "lr": 0.2}, 0, {"A/test/HR": 0.40})
    records = read_runs("f3crec", "quick")
    points = [({"lr": 0.1}, CELL), ({"lr": 0.2}, {**CELL, "lr": 0.2}), ({"lr": 0.3}, {**CELL, "lr": 0.3})]
    columns = ["lr", "domain", "metric", "value", "std", "n_seeds", "run_ids"]

    def score(name):  # "A/test/HR" -> its columns; other metrics are skipped
        parts = name.split("/")
        return {"domain": parts[0], "metric": parts[2]} if len(parts) == 3 else None

    frame = seed_summary_frame(records, points, score, columns, scale=100.0)
    assert list(frame.columns) == columns
    assert frame[["lr", "metric", "n_seeds"]].values.tolist() == [[0.1, "HR", 2], [0.1, "NDCG", 1], [0.2, "HR", 1]]
    hr = frame.iloc[0]
    assert hr["value"] == pytest.approx(15.0) and hr["std"] == pytest.approx(100 * np.std([0.1, 0.2], ddof=1))
    assert hr["run_ids"].split(RUN_ID_SEPARATOR) == [r.config_hash for r in records if r.config["lr"] == 0.1]
    assert math.isnan(frame.iloc[1]["std"]) and frame.iloc[1]["value"] == pytest.approx(5.0)  # the None is skipped
    ordered = seed_summary_frame(records, points[:1], {"A/test/NDCG": {"metric": "N"}, "A/test/HR": {"metric": "H"}},
                                 ["metric", "value"])
    assert ordered.values.tolist() == [["N", pytest.approx(0.05)], ["H", pytest.approx(0.15)]]


def test_grouped_bars_centre_each_group_and_skip_missing_errors():
    fig, ax = plt.subplots()
    grouped_bars(ax, ["g1", "g2"], {"ours": [1.0, 2.0], "paper": [3.0, math.nan]},
                 {"ours": [0.1, math.nan], "paper": [math.nan, math.nan]})
    bars = ax.patches
    assert [round(b.get_x() + b.get_width() / 2, 6) for b in bars] == [-0.2, 0.8, 0.2, 1.2]
    assert [b.get_height() for b in bars[:3]] == [1.0, 2.0, 3.0]
    ours, paper = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert len(ours.errorbar.lines[2][0].get_segments()) == 2  # "ours" has error bars (NaN -> 0)
    assert paper.errorbar is None  # "paper" has none
    assert [t.get_text() for t in ax.get_xticklabels()] == ["g1", "g2"]
    fig, ax = plt.subplots()
    grouped_bars(ax, ["a", "b", "c"], {"x": [1, 2, 3]}, horizontal=True, colors=["red"])
    assert [b.get_width() for b in ax.patches] == [1, 2, 3] and ax.patches[0].get_facecolor()[:3] == (1.0, 0.0, 0.0)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]
    plt.close("all")


def test_plot_lines_draws_one_sorted_line_per_group():
    frame = pd.DataFrame({"task": ["t", "t", "t", "s"], "domain": ["B", "B", "A", "A"], "x": [2, 1, 1, 1],
                          "y": [0.2, 0.1, 0.5, 0.7], "std": [0.01, math.nan, 0.02, 0.0]})
    fig, ax = plt.subplots()
    plot_lines(ax, frame, ["task", "domain"], "x", "y", label=lambda key: f"{key[1]} ({key[0]})")
    assert [line.get_label() for line in ax.lines] == ["A (s)", "A (t)", "B (t)"]  # sorted groups
    assert ax.lines[2].get_xydata().tolist() == [[1, 0.1], [2, 0.2]]  # sorted by x
    fig, ax = plt.subplots()
    plot_lines(ax, frame, "domain", "x", "y", yerr="std", sort=False)
    assert [c.get_label() for c in ax.containers] == ["B", "A"]  # first appearance
    caps = ax.containers[0].lines[2][0].get_segments()
    assert [float(s[1][1] - s[0][1]) for s in caps] == pytest.approx([0.0, 0.02])  # NaN std draws no bar
    plt.close("all")
