"""compare_with_paper arithmetic, and writing results tables safely."""
from __future__ import annotations

import math
import os

import pandas as pd
import pytest

from fedlib.reporting import _atomic
from fedlib.reporting.results import (
    NEEDS_DOWNLOAD_NOTE,
    STANDARD_COLUMNS,
    aggregate_runs,
    append_run,
    compare_with_paper,
    read_runs,
)
from fedlib.reporting.results_tables import read_results_table, recorded_or_none, write_results_table

KEYS = ["dataset", "backbone", "method", "metric"]


@pytest.fixture()
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_PROJECT_ROOT", str(tmp_path))
    return tmp_path


def paper_frame():
    """A hand-made paper table in the paper_tables layout."""
    rows = [
        # dataset, backbone, method, metric, value, unit, confidence
        ("ML-100K", "FedMF", "A", "N@20", 0.1000, "fraction", "high"),
        ("ML-100K", "FedMF", "A", "HR@10", 20.00, "percent", "uncertain"),
        ("ML-100K", "FedMF", "B", "N@20", 0.0500, "fraction", "reconstructed"),
        ("HetRec2011", "FedMF", "A", "N@20", 0.2000, "fraction", "high"),
        ("ML-100K", "FedMF", "C", "N@20", math.nan, "fraction", "high"),  # OOM in the paper
        ("ML-100K", "FedMF", "D", "N@20", 0.0, "fraction", "high"),
    ]
    frame = pd.DataFrame(rows, columns=KEYS + ["value", "unit", "confidence"])
    frame.insert(0, "paper", "f3crec")
    frame.insert(1, "table", "table2")
    frame["printed"] = frame["note"] = frame["value_source"] = ""
    return frame


def ours_frame():
    return pd.DataFrame(
        [
            ("ML-100K", "FedMF", "A", "N@20", 0.12, 0.01),
            ("ML-100K", "FedMF", "A", "HR@10", 0.25, 0.02),  # a fraction; the paper prints percent
            ("ML-100K", "FedMF", "B", "N@20", 0.04, math.nan),
            ("ML-100K", "FedMF", "C", "N@20", 0.30, math.nan),
            ("ML-100K", "FedMF", "D", "N@20", 0.01, math.nan),
        ],
        columns=KEYS + ["value", "std"],
    )


def compare(**kwargs):
    kwargs.setdefault("profile", "quick")
    kwargs.setdefault("commit", "abc1234")
    kwargs.setdefault("device", "cpu")
    return compare_with_paper(ours_frame(), paper_frame(), KEYS, **kwargs)


def cell(table, method, metric="N@20", dataset="ML-100K"):
    return table[(table.method == method) & (table.metric == metric) & (table.dataset == dataset)].iloc[0]


def test_columns_follow_the_standard_layout():
    table = compare()
    assert list(table.columns[: len(STANDARD_COLUMNS)]) == list(STANDARD_COLUMNS)
    assert {"backbone", "note", "run_ids", "unit", "ours_unit"} <= set(table.columns)
    assert (table["table"] == "table2").all() and (table["profile"] == "quick").all()
    # The paper's row order is kept.
    assert list(zip(table.dataset, table.method, table.metric)) == list(
        zip(paper_frame().dataset, paper_frame().method, paper_frame().metric)
    )


def test_deltas_are_ours_minus_paper():
    table = compare()
    a = cell(table, "A")
    assert a["value_paper"] == 0.1 and a["value_ours"] == 0.12
    assert a["delta"] == pytest.approx(0.02) and a["delta_rel"] == pytest.approx(0.2)
    b = cell(table, "B")
    assert b["delta"] == pytest.approx(-0.01) and b["delta_rel"] == pytest.approx(-0.2)
    assert b["confidence"] == "reconstructed"
    assert (a["commit"], a["device"], a["n_seeds"]) == ("abc1234", "cpu", 1)


def test_fractions_are_converted_to_the_papers_percent():
    hr = cell(compare(), "A", "HR@10")
    assert hr["unit"] == "percent" and hr["ours_unit"] == "fraction"
    assert hr["value_ours"] == pytest.approx(25.0)
    assert hr["std_ours"] == pytest.approx(2.0)
    assert hr["delta"] == pytest.approx(5.0)  # percentage points
    assert hr["delta_rel"] == pytest.approx(0.25)
    assert hr["confidence"] == "uncertain"


def test_an_explicit_percent_unit_is_not_rescaled():
    ours = ours_frame()
    ours.loc[1, "value"] = 25.0
    ours["ours_unit"] = ["fraction", "percent", "fraction", "fraction", "fraction"]
    table = compare_with_paper(ours, paper_frame(), KEYS, profile="quick", commit="c", device="cpu")
    assert cell(table, "A", "HR@10")["value_ours"] == 25.0


def test_a_paper_cell_without_ours_keeps_the_paper_value_and_says_why():
    missing = cell(compare(missing_note=NEEDS_DOWNLOAD_NOTE), "A", dataset="HetRec2011")
    assert missing["value_paper"] == 0.2
    assert math.isnan(missing["value_ours"]) and math.isnan(missing["delta"]) and math.isnan(missing["delta_rel"])
    assert missing["note"] == NEEDS_DOWNLOAD_NOTE and missing["n_seeds"] == 0 and missing["run_ids"] == ""
    by_row = compare(missing_note=lambda row: f"{row['dataset']} is not downloaded")
    assert cell(by_row, "A", dataset="HetRec2011")["note"] == "HetRec2011 is not downloaded"


def test_undefined_deltas_stay_empty():
    table = compare()
    no_paper_value = cell(table, "C")
    assert no_paper_value["value_ours"] == 0.3 and math.isnan(no_paper_value["delta"])
    assert "no value" in no_paper_value["note"]
    zero = cell(table, "D")
    assert zero["delta"] == pytest.approx(0.01) and math.isnan(zero["delta_rel"])


def test_our_cells_must_match_a_paper_cell():
    ours = pd.concat([ours_frame(), pd.DataFrame([("ML-100K", "FedMF", "Typo", "N@20", 0.1, math.nan)], columns=list(ours_frame().columns))])
    with pytest.raises(ValueError, match="Typo"):
        compare_with_paper(ours, paper_frame(), KEYS, profile="quick", commit="c", device="cpu")
    kept = compare_with_paper(ours, paper_frame(), KEYS, profile="quick", commit="c", device="cpu", unmatched="keep")
    extra = cell(kept, "Typo")
    assert math.isnan(extra["value_paper"]) and extra["value_ours"] == 0.1 and extra["note"]


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="not unique"):
        compare_with_paper(pd.concat([ours_frame(), ours_frame()]), paper_frame(), KEYS, profile="quick", commit="c", device="cpu")
    with pytest.raises(ValueError, match="cannot convert"):
        compare_with_paper(ours_frame(), paper_frame(), KEYS, profile="quick", ours_unit="count", commit="c", device="cpu")
    with pytest.raises(KeyError, match="block"):
        compare_with_paper(ours_frame(), paper_frame(), KEYS + ["block"], profile="quick")
    with pytest.raises(ValueError, match="unknown profile"):
        compare_with_paper(ours_frame(), paper_frame(), KEYS, profile="full")


# ----------------------------------------------------------------------------- writing


def recorded_table(profile):
    """A results table whose every value is backed by runs recorded at ``profile``."""
    values = {"A": [0.11, 0.13], "B": [0.04, 0.04]}
    for method, per_seed in values.items():
        for seed, value in enumerate(per_seed):
            config = {"dataset": "ML-100K", "backbone": "FedMF", "method": method}
            metrics = {"N@20": value, "HR@10": value * 2} if method == "A" else {"N@20": value}
            append_run("f3crec", profile, config, seed, metrics, 1.0, device="cpu", commit="abc1234")
    ours = aggregate_runs(
        read_runs("f3crec", profile),
        lambda r: {k: r.config[k] for k in ("dataset", "backbone", "method")},
    )
    return compare_with_paper(ours, paper_frame(), KEYS, profile=profile, missing_note=NEEDS_DOWNLOAD_NOTE, unmatched="error")


def test_written_tables_read_back_exactly(project):
    table = recorded_table("paper")
    path = write_results_table("f3crec", "table2", table, "paper")
    assert path == project / "results" / "f3crec" / "table2.csv"
    back = read_results_table("f3crec", "table2")
    assert back.attrs["recorded"] is True
    # the writer adds the flags column: two seeds per value, a clean commit, no rounds: nothing to flag
    assert set(back["flags"]) == {""}
    pd.testing.assert_frame_equal(back.drop(columns=["flags"]), table.fillna({c: "" for c in table.columns if table[c].dtype == object}), check_dtype=False)
    assert recorded_or_none("f3crec", "table2") is not None
    assert recorded_or_none("f3crec", "table3") is None


def test_quick_and_smoke_can_never_overwrite_recorded_results(project):
    paper_path = write_results_table("f3crec", "table2", recorded_table("paper"), "paper")
    recorded_bytes = paper_path.read_bytes()

    quick = recorded_table("quick")
    quick_path = write_results_table("f3crec", "table2", quick, "quick")
    assert quick_path == project / "results" / "f3crec" / "quick" / "table2.csv"

    with pytest.raises(PermissionError):  # a quick run trying to write paper-labelled rows
        write_results_table("f3crec", "table2", read_results_table("f3crec", "table2"), "quick")
    with pytest.raises(PermissionError):  # quick rows presented as the paper profile
        write_results_table("f3crec", "table2", quick, "paper")
    for bad_profile in ("", "Paper", "../f3crec"):
        with pytest.raises(ValueError, match="unknown profile"):
            write_results_table("f3crec", "table2", quick.assign(profile=bad_profile), bad_profile)
    assert paper_path.read_bytes() == recorded_bytes


def test_inconsistent_or_incomplete_tables_are_refused(project):
    table = recorded_table("paper")
    with pytest.raises(ValueError, match="delta_rel"):
        write_results_table("f3crec", "table2", table.drop(columns=["delta_rel"]), "paper")
    broken = table.copy()
    broken.loc[0, "delta"] = 1.0
    with pytest.raises(ValueError, match="delta"):
        write_results_table("f3crec", "table2", broken, "paper")
    unbacked = table.copy()
    unbacked.loc[0, "run_ids"] = "0000000000000000"
    with pytest.raises(ValueError, match="not in runs.jsonl"):
        write_results_table("f3crec", "table2", unbacked, "paper")
    with pytest.raises(ValueError, match="table =="):
        write_results_table("f3crec", "table3", table, "paper")
    with pytest.raises(ValueError, match="safe file name"):
        write_results_table("f3crec", "../table2", table, "paper")
    assert not (project / "results" / "f3crec" / "table2.csv").exists()


def test_a_writer_that_fails_midway_leaves_no_partial_file(project, monkeypatch):
    table = recorded_table("paper")
    path = write_results_table("f3crec", "table2", table, "paper")
    before = path.read_bytes()
    real_to_csv = pd.DataFrame.to_csv

    def to_csv_then_crash(self, handle, **kwargs):
        text = real_to_csv(self, None, **kwargs)
        handle.write(text[: len(text) // 2])  # half the table reaches the disk...
        raise OSError("disk full")  # ...then the writer dies

    monkeypatch.setattr(pd.DataFrame, "to_csv", to_csv_then_crash)
    changed = table.assign(note="changed")
    with pytest.raises(OSError, match="disk full"):
        write_results_table("f3crec", "table2", changed, "paper")
    with pytest.raises(OSError, match="disk full"):
        write_results_table("f3crec", "table9", changed.assign(table="table9"), "paper", validate=False)
    assert path.read_bytes() == before
    assert not (path.parent / "table9.csv").exists()
    assert sorted(os.listdir(path.parent)) == ["runs.jsonl", "table2.csv"]  # no temporary files left


def test_atomic_writer_keeps_the_old_file_when_the_block_raises(tmp_path):
    target = tmp_path / "x.txt"
    _atomic.atomic_write_text(target, "old")
    with pytest.raises(RuntimeError):
        with _atomic.atomic_writer(target) as handle:
            handle.write("new, but incomplete")
            raise RuntimeError("interrupted")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["x.txt"]


def test_cell_index_maps_every_recorded_seed_of_a_cell_to_its_keys():
    from types import SimpleNamespace

    from fedlib.reporting.results import cell_index, config_hash, recorded_seeds

    assert recorded_seeds([]) == [0]
    records = [SimpleNamespace(seed=s) for s in (3, 1, 3)]
    assert recorded_seeds(records) == [1, 3]
    cell = {"method": "FedMF", "seed": 0}
    index = cell_index(records, [({"row": "a"}, cell)])
    assert index == {config_hash({"method": "FedMF", "seed": 1}): {"row": "a"},
                     config_hash({"method": "FedMF", "seed": 3}): {"row": "a"}}


def test_quick_records_replace_their_configuration_and_paper_records_accumulate(project):
    """A notebook re-run refreshes its quick records instead of growing the tracked file."""
    config = {"dataset": "ML-100K", "method": "A", "lr": 0.1}
    for value in (0.1, 0.2, 0.3):
        append_run("intro", "quick", config, 0, {"N@20": value}, 1.0, device="cpu", commit="abc1234")
    append_run("intro", "quick", {**config, "lr": 0.5}, 0, {"N@20": 0.4}, 1.0, device="cpu", commit="abc1234")
    quick = read_runs("intro", "quick")
    assert [(r.config["lr"], r.metrics["N@20"]) for r in quick] == [(0.1, 0.3), (0.5, 0.4)]
    for value in (0.1, 0.2):
        append_run("intro", "paper", config, 0, {"N@20": value}, 1.0, device="cpu", commit="abc1234")
    assert [r.metrics["N@20"] for r in read_runs("intro", "paper")] == [0.1, 0.2]  # every paper run is kept
    leftovers = [p.name for p in (project / "results" / "intro" / "quick").iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
