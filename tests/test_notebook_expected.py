"""The expected-value checker used by ./run quick-check."""
import pytest

from fedlib.notebook import expected


def test_lookup_and_failures(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_PROJECT_ROOT", str(tmp_path))
    (tmp_path / "tests" / "expected_quick").mkdir(parents=True)
    (tmp_path / "tests" / "expected_quick" / "99_demo.toml").write_text(
        """
[[check]]
name = "scalar"
record = "loss"
expected = 1.0
tolerance = 0.1

[[check]]
name = "cell"
record = "table"
row = { method = "B" }
column = "NDCG"
expected = 0.5
tolerance = 0.01
"""
    )
    records = {"loss": 1.05, "table": {"columns": ["method", "NDCG"], "records": [{"method": "A", "NDCG": 0.1}, {"method": "B", "NDCG": 0.52}]}}
    failures = expected.failed_checks("99_demo", records)
    assert failures == ["cell: got 0.52, expected 0.5 ± 0.01"]
    records["table"]["records"][1]["NDCG"] = 0.505
    assert expected.failed_checks("99_demo", records) == []
    with pytest.raises(KeyError, match="recorded no 'loss'"):
        expected.failed_checks("99_demo", {"table": records["table"]})


def test_refresh_fills_expected_and_tolerance_from_a_seed_sweep(tmp_path, monkeypatch):
    import tomllib

    monkeypatch.setenv("FEDLIB_PROJECT_ROOT", str(tmp_path))
    folder = tmp_path / "tests" / "expected_quick"
    folder.mkdir(parents=True)
    (folder / "99_demo.toml").write_text(
        '# header line\n\n[[check]]\nname = "cell"\nrecord = "table"\nrow = { method = "B" }\ncolumn = "NDCG"\n'
        'floor = 0.001\n\n[[check]]\nname = "scalar"\nrecord = "loss"\nfloor = 0.5\n'
    )
    runs = [{"profile": "quick", "loss": loss, "table": {"columns": ["method", "NDCG"],
                                                         "records": [{"method": "B", "NDCG": ndcg}]}}
            for loss, ndcg in ((1.0, 0.50), (1.1, 0.52), (0.9, 0.54))]
    header = "# header line"
    text = expected.refreshed_text(header, expected.read_expected("99_demo")["check"], [0, 1, 2], runs)
    parsed = tomllib.loads(text)
    assert text.startswith("# header line\n")
    assert parsed["seeds"] == [0, 1, 2]
    cell, scalar = parsed["check"]
    assert cell["row"] == {"method": "B"} and cell["expected"] == 0.5
    assert cell["tolerance"] == pytest.approx(3 * 0.02, rel=1e-5)  # sample std of 0.50, 0.52, 0.54 is 0.02
    assert scalar["expected"] == 1.0 and scalar["tolerance"] == 0.5  # 3 × 0.1 < floor
    with pytest.raises(ValueError, match="first run must be seed 0"):
        expected.refreshed_text(header, parsed["check"], [1, 2, 0], runs)
    with pytest.raises(ValueError, match="not 'quick'"):
        expected.refreshed_text(header, parsed["check"], [0, 1, 2], [dict(runs[0], profile="smoke"), *runs[1:]])
    with pytest.raises(ValueError, match="has no floor"):
        expected.refreshed_text(header, [{"name": "x", "record": "loss"}], [0, 1], runs[:2])
    with pytest.raises(ValueError, match="non-finite"):
        expected.tolerance_from_sweep([1.0, float("nan")], 0.1)


def test_fedlib_expected_command_rewrites_the_file_from_executed_notebooks(tmp_path, monkeypatch):
    import nbformat

    from fedlib.cli import main
    from fedlib.notebook.records import RECORD_MIME

    monkeypatch.setenv("FEDLIB_PROJECT_ROOT", str(tmp_path))
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "99_demo.py").write_text("# %% [markdown]\n# # Demo\n")
    folder = tmp_path / "tests" / "expected_quick"
    folder.mkdir(parents=True)
    path = folder / "99_demo.toml"
    path.write_text('# demo header\n\n[[check]]\nname = "loss"\nrecord = "loss"\nfloor = 0.01\n')
    executed = []
    for seed, loss in enumerate((1.0, 1.2, 0.8)):
        notebook = nbformat.v4.new_notebook()
        cell = nbformat.v4.new_code_cell("record('loss', ...)")
        cell.outputs = [nbformat.v4.new_output("display_data", data={
            RECORD_MIME: {"name": name, "value": value}, "text/plain": name})
            for name, value in (("profile", "quick"), ("loss", loss))]
        notebook.cells.append(cell)
        executed.append(tmp_path / f"s{seed}.ipynb")
        nbformat.write(notebook, executed[-1])
    assert main(["expected", "99", *map(str, executed)]) == 0
    written = expected.read_expected("99_demo")
    assert path.read_text().startswith("# demo header\n")
    assert written["seeds"] == [0, 1, 2]
    assert written["check"][0]["expected"] == 1.0
    assert written["check"][0]["tolerance"] == pytest.approx(0.6)          # 3 × sample std 0.2
    assert expected.failed_checks("99_demo", {"loss": 1.5}) == []
    assert expected.failed_checks("99_demo", {"loss": 1.7}) != []


def test_every_committed_expected_file_is_complete_and_refreshable():
    """Each check of tests/expected_quick/ names its record, a floor, and a tolerance >= that floor."""
    files = sorted((expected.expected_file("x").parent).glob("*.toml"))
    assert len(files) >= 6                                                 # notebooks 00-05
    for path in files:
        parsed = expected.read_expected(path.stem)
        assert parsed["seeds"][0] == 0, path.name
        assert parsed["check"], path.name
        for check in parsed["check"]:
            where = f"{path.name}: {check.get('name')}"
            assert {"name", "record", "expected", "tolerance", "floor"} <= set(check), where
            assert check["tolerance"] >= check["floor"] > 0, where
            assert ("column" in check) == ("row" in check), where
