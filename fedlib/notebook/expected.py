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
    floor = 0.003                # optional: the smallest tolerance ``refresh`` may write

``./run quick-check`` executes each notebook at ``quick`` and applies these checks; it is
not part of CI (each notebook takes minutes).

A new file can be written with only ``name``, ``record``, ``row``/``column`` (or ``key``)
and ``floor`` per check; ``python -m fedlib expected NN SEED0.ipynb SEED1.ipynb ...`` then
fills ``expected`` and ``tolerance`` from notebooks executed at ``quick`` with
``FEDLIB_OVERRIDE='{"seed": s}'`` (the first one must be seed 0).
"""
from __future__ import annotations

import json
import math
import statistics
import tomllib
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

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


# ----------------------------------------------------------------------------- writing a file from a seed sweep
CHECK_KEYS = ("name", "record", "row", "column", "key", "floor")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if isinstance(value, int) else f"{value:.6g}"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a TOML basic string is a JSON string for these names
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_toml_value(str(k))} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} to an expected-values file")


def tolerance_from_sweep(values: Sequence[float], floor: float) -> float:
    """``max(3 × sample std of values, floor)`` (``values`` from two or more seeds)."""
    if len(values) < 2:
        raise ValueError(f"a tolerance needs values from at least two seeds, got {len(values)}")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"the sweep produced a non-finite value: {list(values)}")
    return max(3 * statistics.stdev(values), float(floor))


def refreshed_text(header: str, checks: Sequence[Mapping[str, Any]], seeds: Sequence[int],
                   runs: Sequence[Mapping[str, Any]]) -> str:
    """The text of an expected-values file whose checks are re-derived from ``runs``.

    Args:
        header: comment lines written first (``#`` included).
        checks: the checks; each needs ``floor`` (``expected``/``tolerance`` are replaced).
        seeds: the seed of each run, ``seeds[0] == 0``.
        runs: the records of each executed notebook (:func:`~fedlib.notebook.records.read_records`).
    """
    if len(seeds) != len(runs):
        raise ValueError(f"{len(seeds)} seeds for {len(runs)} runs")
    if not seeds or seeds[0] != 0:
        raise ValueError(f"the first run must be seed 0 (its values are the expected ones), got seeds {list(seeds)}")
    for run, seed in zip(runs, seeds):
        if run.get("profile") != "quick":
            raise ValueError(f"the seed-{seed} run was executed at profile {run.get('profile')!r}, not 'quick'")
    lines = [header.rstrip("\n"), f"seeds = {_toml_value(list(seeds))}"]
    for check in checks:
        if "floor" not in check:
            raise ValueError(f"check {check.get('name')!r} has no floor: add floor = <smallest tolerance>")
        values = [lookup(run, check) for run in runs]
        lines += ["", "[[check]]"]
        lines += [f"{k} = {_toml_value(check[k])}" for k in CHECK_KEYS if k in check]
        lines += [f"expected = {_toml_value(values[0])}",
                  f"tolerance = {_toml_value(tolerance_from_sweep(values, check['floor']))}",
                  f"# seeds {', '.join(map(str, seeds))}: " + ", ".join(f"{v:.4g}" for v in values)]
    return "\n".join(lines) + "\n"


def refresh(notebook: str, executed: Sequence[Path], seeds: Optional[Sequence[int]] = None) -> Path:
    """Rewrite ``tests/expected_quick/<notebook>.toml`` from notebooks executed at ``quick``."""
    from fedlib.notebook.records import read_records

    path = expected_file(notebook)
    text = path.read_text()
    header = "\n".join(line for line in text.split("[[check]]", 1)[0].splitlines() if line.startswith("#"))
    seeds = list(seeds) if seeds is not None else list(range(len(executed)))
    runs = [read_records(p) for p in executed]
    path.write_text(refreshed_text(header, read_expected(notebook).get("check", []), seeds, runs))
    return path
