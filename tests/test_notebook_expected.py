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
