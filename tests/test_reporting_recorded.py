"""The lessons' one definition of flags, deviation summaries, statistics records and table writing:
fedlib.reporting.recorded, fedlib.experiments.grid (statistics, write_tables), spec.metric_units."""
import math

import pandas as pd
import pytest

from fedlib.experiments import grid
from fedlib.experiments.spec import metric_units
from fedlib.reporting import (FLAG_ORDER, FlagRules, append_run, deviations_by_reason, read_runs, recorded_deviations,
                              recorded_table, with_flags)

PAPER = "fedrkg"  # a real slug; every file is written below a temporary project root


@pytest.fixture()
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_PROJECT_ROOT", str(tmp_path))
    return tmp_path


def _run(config, seed, best_round, *, commit="abc123", extra=None):
    return append_run(PAPER, "paper", {**config, "seed": seed}, seed, {"R@10": 0.1 + seed, "best_round": best_round},
                      1.0, extra=extra, commit=commit, device="cpu")


def _cell(value, runs, **columns):
    return {"value_ours": value, "n_seeds": len(runs), "run_ids": ";".join(r.config_hash for r in runs),
            "commit": ";".join(sorted({r.commit for r in runs})), "note": "", **columns}


def test_flags_of_a_frame_come_from_its_row_and_its_runs(root):
    fedavg = {"method": "FedAvg", "rounds": 10}
    dirty_one_seed = _run(fedavg, 0, 4, commit="abc123+dirty")
    capped = [_run({"method": "FedRKG", "rounds": 10}, s, best) for s, best in ((0, 10), (1, 7))]
    central = _run({"method": "Centralized", "rounds": 5}, 0, 5)
    nan_loss = _run({"method": "FedDAE", "rounds": 10}, 0, 3, extra={"diverged_at_round": 6})
    frame = pd.DataFrame([_cell(0.2, [dirty_one_seed]), _cell(0.3, capped), _cell(0.4, [central]),
                          _cell(0.5, [nan_loss], note="SUBSTITUTE split"), _cell(math.nan, capped)])
    records = read_runs(PAPER, "paper")
    # by hand: row 0 one run, its commit dirty; row 1 two seeds, seed 0 selected round 10 of 10;
    # row 2 the centralised run selected its last epoch; row 3 substitute, one seed, NaN loss at round 6;
    # row 4 has no value of ours: no flag
    assert list(with_flags(frame, records)["flags"]) == ["one_seed;dirty", "at_cap", "one_seed;at_cap",
                                                         "substitute;one_seed;diverged", ""]
    exempt = with_flags(frame, records, at_cap_exempt={"method": ["Centralized"]})
    assert list(exempt["flags"])[:3] == ["one_seed;dirty", "at_cap", "one_seed"]
    # without the records only the row's own columns flag: the dirty commit column, n_seeds, the note
    assert list(with_flags(frame)["flags"]) == ["one_seed;dirty", "", "one_seed", "substitute;one_seed", ""]
    assert FLAG_ORDER == ("substitute", "one_seed", "diverged", "at_cap", "grid_edge", "dirty")


def test_grid_edge_flags_a_tuned_value_at_the_end_of_the_values_tried(root):
    base = {"method": "FedMF", "rounds": 10, "dataset": "FilmTrust"}
    swept = {lr: _run({**base, "lr": lr}, 0, 4) for lr in (1e-3, 1e-2, 1e-1)}
    other_seed = _run({**base, "lr": 1e-2}, 1, 4)
    alone = _run({**base, "dataset": "LastFM", "lr": 1e-1}, 0, 4)  # never tuned: one value tried
    nested = {beta: _run({**base, "method": "F3CRec", "params": {"beta": beta, "eps": 1.0}}, 0, 4)
              for beta in (0.1, 0.5)}
    records = read_runs(PAPER, "paper")
    rules = FlagRules(tuned=["lr", "params.beta"])
    frame = pd.DataFrame([_cell(0.1, [swept[1e-3]]), _cell(0.1, [swept[1e-2], other_seed]), _cell(0.1, [swept[1e-1]]),
                          _cell(0.1, [alone]), _cell(0.1, [nested[0.5]])])
    # by hand: 1e-3 and 1e-1 are the ends of {1e-3, 1e-2, 1e-1}; 1e-2 is interior (two seeds);
    # LastFM tried one rate; beta 0.5 is the largest of {0.1, 0.5} (eps equal, so the same cell)
    assert list(with_flags(frame, records, rules=rules)["flags"]) == [
        "one_seed;grid_edge", "", "one_seed;grid_edge", "one_seed", "one_seed;grid_edge"]
    # without the rules nothing is tuned, so nothing is at a grid's edge
    assert "grid_edge" not in ";".join(with_flags(frame, records)["flags"])
    # an explicit grid (a sweep around other defaults) replaces the neighbours' values
    wider = FlagRules(tuned=["lr"], grids=lambda config: {"lr": [1e-4, 1e-3, 1e-2, 1e-1, 1.0]})
    assert list(with_flags(frame.iloc[:3], records, rules=wider)["flags"]) == ["one_seed", "", "one_seed"]
    # a written table's flags are kept when it is read again without the rules
    written = with_flags(frame, records, rules=rules)
    assert list(with_flags(written, records)["flags"]) == list(written["flags"])
    # an empty flags cell read from a CSV is NaN: it adds nothing
    empty = written.assign(flags=[math.nan, "grid_edge", math.nan, math.nan, math.nan])
    assert list(with_flags(empty, records)["flags"]) == ["one_seed", "grid_edge", "one_seed", "one_seed", "one_seed"]


def test_a_written_table_carries_its_flags_in_the_csv(root):
    from fedlib.reporting import compare_with_paper, write_results_table
    from fedlib.reporting.results_tables import read_results_table

    runs = [_run({"method": "FedMF", "rounds": 10, "lr": lr}, 0, best) for lr, best in ((1e-3, 10), (1e-2, 4))]
    ours = pd.DataFrame([{"dataset": "FilmTrust", "method": f"FedMF lr={r.config['lr']:g}", "metric": "R@10", "value": 0.1,
                          "n_seeds": 1, "run_ids": r.config_hash, "commit": r.commit} for r in runs])
    paper = pd.DataFrame({"table": ["table1"] * 2, "dataset": ["FilmTrust"] * 2, "method": list(ours["method"]),
                          "metric": ["R@10"] * 2, "value": [0.1, 0.1], "unit": ["fraction"] * 2, "confidence": ["high"] * 2})
    table = compare_with_paper(ours, paper, ["dataset", "method", "metric"], profile="paper")
    write_results_table(PAPER, "table1", table, "paper", flag_rules=FlagRules(tuned=["lr"]), validate=False)
    written = read_results_table(PAPER, "table1", "paper")
    # by hand: both rates are ends of the two tried; 1e-3 also selected its last round (10 of 10)
    assert list(written["flags"]) == ["one_seed;at_cap;grid_edge", "one_seed;grid_edge"]


def test_flag_rules_come_from_a_spec_section_and_reject_bad_input():
    rules = FlagRules.from_spec({"at_cap_exempt": {"method": ["Centralized"]}, "tuned": ["lr"]})
    assert rules.tuned == ("lr",) and rules.at_cap_exempt == {"method": ["Centralized"]}
    with pytest.raises(ValueError, match="unknown key 'tuning'"):
        FlagRules.from_spec({"tuning": ["lr"]})
    with pytest.raises(TypeError, match="dotted paths"):
        FlagRules(tuned="lr")


def test_a_run_that_records_selected_round_is_at_cap_too(root):
    # the cross-domain and sequential families record the selected round as selected_round
    runs = [append_run(PAPER, "paper", {"method": "FedCSR", "rounds": 20, "seed": s}, s,
                       {"MRR": 0.1, "selected_round": selected}, 1.0, commit="abc", device="cpu")
            for s, selected in ((0, 20), (1, 12))]
    frame = pd.DataFrame([_cell(0.1, runs), _cell(0.1, runs[1:])])
    assert list(with_flags(frame, runs)["flags"]) == ["at_cap", "one_seed"]


def test_a_statistics_run_without_rounds_is_not_at_cap(root):
    statistics = append_run(PAPER, "paper", grid.statistics_config(PAPER, "X"), 0, {"users": 3.0}, 0.1, commit="abc")
    frame = pd.DataFrame([_cell(3.0, [statistics])])
    assert list(with_flags(frame, [statistics])["flags"]) == ["one_seed"]


def test_at_cap_exemption_must_map_keys_to_lists():
    with pytest.raises(TypeError, match="list of values"):
        with_flags(pd.DataFrame({"value_ours": [1.0]}), at_cap_exempt={"method": "Centralized"})


def test_recorded_table_reads_the_csv_and_flags_it_from_runs_jsonl(root):
    run = _run({"method": "FedAvg", "rounds": 10}, 0, 10)
    folder = root / "results" / PAPER
    pd.DataFrame([{"table": "table1", "dataset": "A", "method": "FedAvg", "setting": "", "value_ours": 0.2,
                   "n_seeds": 1, "run_ids": run.config_hash, "commit": run.commit, "note": ""}]
                 ).to_csv(folder / "table1.csv", index=False)
    table = recorded_table(PAPER, "table1")
    assert table.loc[0, "flags"] == "one_seed;at_cap" and table.loc[0, "setting"] == ""
    with pytest.raises(FileNotFoundError, match="table9"):
        recorded_table(PAPER, "table9")


def _results(rows):
    return pd.DataFrame([dict(zip(("table", "dataset", "method", "metric", "value_ours", "value_paper"), r))
                         for r in rows])


def test_deviations_are_grouped_by_reason_and_every_cell_is_named():
    table1 = _results([("table1", "A", "FedMF", "R@10", 0.5, 1.0), ("table1", "A", "FedMF", "N@10", 0.32, 0.2),
                       ("table1", "A", "FedRKG", "R@10", 1.05, 1.0), ("table1", "B", "FedMF", "R@10", 2.0, 1.0)])
    table2 = _results([("table2", "A", "FedMF", "R@10", 0.1, 1.0)]).drop(columns="method")  # no method column
    reasons = [({"method": "FedMF", "dataset": "A"}, "slow"), ({}, "other")]
    keys = ["table", "dataset", "method", "metric"]
    found = recorded_deviations({"t1": table1, "t2": table2}, reasons, keys)
    # FedRKG is within 20 %: four cells deviate; table2's row has method "" and falls to the catch-all
    assert sorted(zip(found["table"], found["method"], found["reason"])) == [
        ("table1", "FedMF", "other"), ("table1", "FedMF", "slow"), ("table1", "FedMF", "slow"), ("table2", "", "other")]
    summary = deviations_by_reason(found, keys).set_index("reason")
    assert summary.loc["slow", "cells"] == 2 and summary.loc["other", "cells"] == 2
    assert summary.loc["slow", "Δ % from"] == pytest.approx(-50.0) and summary.loc["slow", "Δ % to"] == pytest.approx(60.0)
    # the metrics of one table row together, ours then the paper's in brackets, the largest |Δ| first
    # (|Δ|: table1 B 100 %, table2 A 90 %, table1 A N@10 60 %, table1 A R@10 50 %)
    assert summary.loc["slow", "ours (paper)"] == "table1 A FedMF: N@10 0.32 (0.2), R@10 0.5 (1)"
    assert summary.loc["other", "ours (paper)"] == "table1 B FedMF: R@10 2 (1); table2 A: R@10 0.1 (1)"
    by_table = deviations_by_reason(found, keys, by=["table"], detail=None)
    assert list(zip(by_table["table"], by_table["reason"], by_table["cells"])) == [
        ("table1", "other", 1), ("table1", "slow", 2), ("table2", "other", 1)]
    assert by_table.loc[1, "ours (paper)"] == "A FedMF N@10: 0.32 (0.2); A FedMF R@10: 0.5 (1)"
    # a long list names the largest and counts the rest; the counts and ranges keep every cell
    short = deviations_by_reason(found, keys, by=["table"], detail=None, max_named=1)
    assert short.loc[1, "ours (paper)"] == "A FedMF N@10: 0.32 (0.2); … and 1 more"
    assert list(short["cells"]) == list(by_table["cells"]) and list(short["Δ % to"]) == list(by_table["Δ % to"])
    with pytest.raises(ValueError, match="max_named"):
        deviations_by_reason(found, keys, max_named=0)


def test_a_deviation_without_a_reason_or_columns_is_refused():
    frame = _results([("table1", "A", "FedMF", "R@10", 0.5, 1.0)])
    with pytest.raises(ValueError, match="without a reason"):
        recorded_deviations([frame], [({"dataset": "B"}, "only B")], ["table", "dataset"])
    with pytest.raises(ValueError, match="at least one table"):
        recorded_deviations([], [], ["table"])
    with pytest.raises(ValueError, match="no column"):
        deviations_by_reason(frame, ["table"])


def test_statistics_are_recorded_once_with_their_kind_metrics_and_extra(root):
    measured = []

    def load(dataset):
        measured.append(dataset)
        return {"rows": 10 * len(dataset)}

    first = grid.record_split_statistics(PAPER, "quick", ["A", "BB"], load, metrics_of=lambda s: {"rows": s["rows"]},
                                         extra_of=lambda s: {"even": s["rows"] % 20 == 0}, kind="data_blocks")
    again = grid.record_split_statistics(PAPER, "quick", ["A", "BB"], load, read_runs(PAPER, "quick"),
                                         metrics_of=lambda s: {"rows": -1.0}, kind="data_blocks")
    assert measured == ["A", "BB"]  # the second call finds both recorded
    assert [r.metrics["rows"] for r in again] == [10, 20] and [r.extra for r in first] == [{"even": False},
                                                                                           {"even": True}]
    assert first[0].config == {"paper": PAPER, "kind": "data_blocks", "dataset": "A", "seed": 0}
    assert [r.config_hash for r in again] == [r.config_hash for r in first]


def test_split_statistics_count_every_interaction():
    class Split:
        train, valid, test = range(6), range(2), range(2)
        num_users, num_items = 5, 4

    assert grid.split_statistics(Split()) == {"users": 5.0, "items": 4.0, "interactions": 10.0, "sparsity": 50.0}


def test_write_tables_records_first_then_writes_each_frame_under_its_table_id(root, monkeypatch):
    import fedlib.reporting

    calls = []
    monkeypatch.setattr(fedlib.reporting, "write_results_table",
                        lambda paper, table_id, frame, profile, flag_rules: calls.append((paper, table_id, len(frame), profile,
                                                                                          flag_rules.tuned)))

    def record(records):
        calls.append(("recorded", len(records)))
        append_run(PAPER, "quick", {"kind": "stats"}, 0, {"users": 1.0}, 0.1)

    def build(records):
        calls.append(("built", len(records)))
        return {"table1_main": pd.DataFrame({"table": ["table1", "table1"]}), "empty": pd.DataFrame()}

    tables = grid.write_tables(PAPER, "quick", build, record)
    assert set(tables) == {"table1_main", "empty"}
    assert calls == [("recorded", 0), ("built", 1), (PAPER, "table1", 2, "quick", ("params.lr", "params.server_lr"))]  # the paper's [report.flags]


def test_metric_units_hook_sets_each_rows_unit():
    ours = pd.DataFrame({"metric": ["users", "sparsity"]})
    assert list(metric_units({"sparsity": "percent"})(ours, None)["ours_unit"]) == ["count", "percent"]
    assert metric_units({})(pd.DataFrame(columns=["metric"]), None).empty
