"""Every recorded results folder is consistent; the checker catches each kind of mistake.

The first test runs the checker over the real ``results/<paper>/`` folders (and their
``quick/`` sub-folders) that exist. The others build a small results folder with the real
pipeline (runs -> aggregate -> compare -> write), check that it passes, then break it one
way at a time and check that each break is reported.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fedlib.paths import PAPER_SLUGS, project_root
from fedlib.reporting.consistency import check_results_dir
from fedlib.data.paper_tables import load_paper_table
from fedlib.reporting.results import (
    NEEDS_DOWNLOAD_NOTE,
    aggregate_runs,
    append_run,
    compare_with_paper,
    read_results_csv,
    read_runs,
)
from fedlib.reporting.results_tables import write_results_table

# ------------------------------------------------------------------ the real results


@pytest.mark.parametrize("profile", ["paper", "quick"])
@pytest.mark.parametrize("paper", PAPER_SLUGS)
def test_recorded_results_are_consistent(paper, profile):
    directory = project_root() / "results" / paper
    if profile != "paper":
        directory = directory / profile
    if not (list(directory.glob("*.csv")) or (directory / "runs.jsonl").exists()):
        pytest.skip(f"no {profile}-profile results for {paper} yet")
    assert check_results_dir(directory) == []


# ------------------------------------------------------------------ a synthetic results folder

BLOCKS = ("D1", "D2", "D3")
PAPER_ROWS = [
    # method, metric, block, value, unit, confidence
    ("FT", "N@20", "D1", 0.0794, "fraction", "high"),
    ("FT", "N@20", "D2", 0.0768, "fraction", "high"),
    ("FT", "N@20", "D3", 0.1002, "fraction", "uncertain"),
    ("FT", "N@20", "Avg", 0.0855, "fraction", "high"),
    ("F3CRec", "N@20", "D1", 0.0933, "fraction", "high"),
    ("F3CRec", "N@20", "D2", 0.0885, "fraction", "high"),
    ("F3CRec", "N@20", "D3", 0.1284, "fraction", "high"),
    ("F3CRec", "N@20", "Avg", 0.1034, "fraction", "high"),
    ("F3CRec", "N@20", "Improv", 21.00, "percent", "reconstructed"),
]


def _paper_table(root):
    """A small stand-in for paper_tables/f3crec/table2_main.csv."""
    rows = [("f3crec", "table2", "ML-100K", "FedMF", *row[:4], row[4], row[3], "", row[5], "printed", "") for row in PAPER_ROWS]
    rows.append(("f3crec", "table2", "HetRec2011", "FedMF", "FT", "N@20", "Avg", 0.0807, "fraction", "0.0807", "", "high", "printed", ""))
    columns = ["paper", "table", "dataset", "backbone", "method", "metric", "block", "value", "unit", "printed",
               "marker", "confidence", "value_source", "note"]
    path = root / "paper_tables" / "f3crec" / "table2_main.csv"
    path.parent.mkdir(parents=True)
    pd.DataFrame(rows, columns=columns).to_csv(path, index=False)


def build_results(root, *, avg_offset=0.0, validate=True):
    """Record two seeds of FT and F3CRec on ML-100K and write table2 (HetRec2011 needs download)."""
    _paper_table(root)
    for method in ("FT", "F3CRec"):
        for seed in (0, 1):
            rng = np.random.default_rng([seed, len(method)])
            metrics = {f"N@20/{block}": float(0.08 + 0.04 * rng.random()) for block in BLOCKS}
            metrics["N@20/Avg"] = float(np.mean([metrics[f"N@20/{b}"] for b in BLOCKS])) + avg_offset
            config = {"dataset": "ML-100K", "backbone": "FedMF", "method": method, "rounds": 3}
            append_run("f3crec", "paper", config, seed, metrics, 0.5, device="cpu", commit="abc1234")
    ours = aggregate_runs(
        read_runs("f3crec", "paper"),
        lambda r: {k: r.config[k] for k in ("dataset", "backbone", "method")},
        metric_cells=lambda name: dict(zip(("metric", "block"), name.split("/"))),
    )
    table = compare_with_paper(
        ours,
        load_paper_table("f3crec", "table2"),
        ["dataset", "backbone", "method", "metric", "block"],
        profile="paper",
        missing_note=lambda row: NEEDS_DOWNLOAD_NOTE if row["dataset"] == "HetRec2011" else "Improv is computed in the notebook",
    )
    return write_results_table("f3crec", "table2", table, "paper", validate=validate)


@pytest.fixture()
def results(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_PROJECT_ROOT", str(tmp_path))
    path = build_results(tmp_path)
    return path.parent


def test_a_consistent_folder_has_no_problems(results):
    assert check_results_dir(results) == []
    table = read_results_csv(results / "table2.csv")
    assert table["value_ours"].notna().sum() == 8 and (table["note"] == NEEDS_DOWNLOAD_NOTE).sum() == 1


def _edit_table(directory, edit):
    path = directory / "table2.csv"
    table = read_results_csv(path)
    table = edit(table)
    table.to_csv(path, index=False)


def _first_ours(table):
    return table.index[table["value_ours"].notna()][0]


def _set(column, value, row=_first_ours):
    def edit(table):
        table.loc[row(table), column] = value
        return table

    return edit


def _shift_ours_consistently(table):
    """Change a value and fix delta/delta_rel, so that only the run-record check can object."""
    i = _first_ours(table)
    table.loc[i, "value_ours"] += 0.01
    table.loc[i, "delta"] = table.loc[i, "value_ours"] - table.loc[i, "value_paper"]
    table.loc[i, "delta_rel"] = table.loc[i, "delta"] / table.loc[i, "value_paper"]
    return table


def _change_paper_value(table):
    i = table.index[table["value_ours"].isna() & (table["dataset"] == "HetRec2011")][0]
    table.loc[i, "value_paper"] = 0.0999  # paper_tables says 0.0807
    return table


def _tamper_record(directory):
    path = directory / "runs.jsonl"
    lines = path.read_text().splitlines()
    record = json.loads(lines[0])
    record["config"]["rounds"] = 4
    lines[0] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")


BAD_TABLES = {
    "missing column": (lambda t: t.drop(columns=["delta_rel"]), "missing required column"),
    "wrong delta": (_set("delta", 0.5), "!= value_ours - value_paper"),
    "wrong delta_rel": (_set("delta_rel", 0.5), "!= delta / value_paper"),
    "unknown run": (_set("run_ids", "0123456789abcdef;fedcba9876543210"), "is not in runs.jsonl"),
    "no run ids": (_set("run_ids", ""), "has no run_ids"),
    "seed count": (_set("n_seeds", 3), "n_seeds = 3 but 2 run id(s)"),
    "value not from its runs": (_shift_ours_consistently, "mean of 'N@20/"),
    "duplicated key": (lambda t: pd.concat([t, t.iloc[[0]]]), "duplicated key"),
    "silent missing cell": (_set("note", "", row=lambda t: t.index[t["value_ours"].isna()][0]), "without a note"),
    "wrong profile label": (lambda t: t.assign(profile="quick"), "profile ['quick']"),
    "paper value drifted": (_change_paper_value, "but paper_tables has 0.0807"),
    "wrong confidence": (_set("confidence", "high", row=lambda t: t.index[t["confidence"] == "uncertain"][0]), "confidence 'high'"),
}


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
def test_each_kind_of_bad_table_is_detected(results, case):
    edit, expected = BAD_TABLES[case]
    _edit_table(results, edit)
    problems = check_results_dir(results)
    assert any(expected in problem for problem in problems), problems


def test_an_average_that_is_not_the_mean_of_its_blocks_is_detected(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_PROJECT_ROOT", str(tmp_path))
    with pytest.raises(ValueError, match="mean of D1, D2, D3"):  # refused at write time...
        build_results(tmp_path, avg_offset=0.001)
    assert not (tmp_path / "results" / "f3crec" / "table2.csv").exists()
    directory = build_results(tmp_path / "again", avg_offset=0.001, validate=False).parent
    problems = check_results_dir(directory)  # ...and caught if written anyway
    assert problems and all("mean of D1, D2, D3" in p for p in problems)


def test_run_log_problems_are_detected(results):
    _tamper_record(results)
    assert any("!= hash of its config" in p for p in check_results_dir(results))
    with open(results / "runs.jsonl", "a") as handle:
        handle.write("{not json\n")
    assert any("not a valid run record" in p for p in check_results_dir(results))


def test_missing_folder_is_a_problem(tmp_path):
    assert check_results_dir(tmp_path / "absent") == [f"{tmp_path / 'absent'} is not a directory"]
