"""Expected quick-profile values: one TOML file per notebook, checked with tolerances.

``tests/expected_quick/<notebook>.toml`` lists checks::

    seeds = [0, 1, 2]            # the seed sweep the tolerances come from
    [[check]]
    name = "FedMF test NDCG@20"
    record = "test_metrics"      # a record of the executed notebook
    row = { method = "FedMF" }   # for table records: the row to read
    column = "NDCG@20"
    expected = 0.0924            # seed-0 value
    tolerance = 0.006            # max(3 × seed std, a floor), from the sweep

``./run quick-check`` executes each notebook at ``quick`` and applies these checks; it is
not part of CI (each notebook takes minutes).
"""
from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Mapping

from fedlib.paths import project_root


def expected_file(notebook: str) -> Path:
    return project_root() / "tests" / "expected_quick" / f"{notebook}.toml"


def read_expected(notebook: str) -> dict:
    path = expected_file(notebook)
    with path.open("rb") as handle:
        return tomllib.load(handle)


def lookup(records: Mapping[str, Any], check: Mapping[str, Any]) -> float:
    """The recorded number a check refers to (a scalar record, or one cell of a table record)."""
    if check["record"] not in records:
        raise KeyError(f"the notebook recorded no {check['record']!r}; it recorded {sorted(records)}")
    value = records[check["record"]]
    if "column" in check:
        rows = [r for r in value["records"] if all(r.get(k) == v for k, v in check.get("row", {}).items())]
        if len(rows) != 1:
            raise KeyError(f"{check['name']}: {len(rows)} rows of {check['record']!r} match {check.get('row')}")
        value = rows[0][check["column"]]
    elif isinstance(value, Mapping) and "key" in check:
        value = value[check["key"]]
    return float(value)


def failed_checks(notebook: str, records: Mapping[str, Any]) -> list[str]:
    """Human-readable failures of the notebook's expected-value checks (empty = all pass)."""
    failures = []
    for check in read_expected(notebook).get("check", []):
        got = lookup(records, check)
        if abs(got - check["expected"]) > check["tolerance"]:
            failures.append(f"{check['name']}: got {got:.6g}, expected {check['expected']:.6g} ± {check['tolerance']:.3g}")
    return failures
