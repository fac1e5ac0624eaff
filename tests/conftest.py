"""Shared fixtures: the data root, and one smoke execution per notebook shared by all tests."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# tests/quick executes notebooks at the quick profile (minutes each): only `./run quick-check`
# (which sets FEDLIB_QUICK_CHECK=1) collects it.
collect_ignore = [] if os.environ.get("FEDLIB_QUICK_CHECK") == "1" else ["quick"]


def data_root() -> Path:
    """``$FEDLIB_DATA``, else ``../shared/data`` beside the checkout (the CI layout)."""
    env = os.environ.get("FEDLIB_DATA")
    return Path(env) if env else (REPO.parent / "shared" / "data")


@pytest.fixture(scope="session")
def xdg_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("xdg-cache")


@pytest.fixture
def isolated_data_env(monkeypatch, xdg_cache):
    """No network, a private cache folder (user caches are never touched), verification on."""
    from fedlib.data import download

    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg_cache))
    monkeypatch.setenv("FEDLIB_OFFLINE", "1")
    monkeypatch.delenv("FEDLIB_VERIFY", raising=False)
    download._FAILED_URLS.clear()


def missing_data(message: str) -> None:
    """Skip a test whose data is absent, except in CI (``CI=true``), where that is a failure.

    CI runs beside the shared data root; a missing root or dataset there means the
    checkout or the data layout is broken, and skipping would hide it.
    """
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"{message} (CI=true: a missing data root is an error, not a skip)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    root = data_root()
    if not root.is_dir():
        missing_data(f"data root {root} not found: set FEDLIB_DATA to the folder holding the raw datasets")
    return root


@pytest.fixture(scope="session")
def smoke_records(tmp_path_factory):
    """``smoke_records(stem) -> {name: value}`` from a finished smoke execution of a notebook.

    ``./run test`` executes every notebook once under nbval with ``FEDLIB_RECORD_DIR`` set;
    its records are reused here. When they are absent (pytest run directly), the notebook
    is executed at ``smoke`` with papermill, once per session.
    """
    from fedlib.notebook.records import FINISHED_KEY, read_record_file, read_records
    from fedlib.notebook.runner import run_notebook

    cache: dict[str, dict] = {}
    out_dir = tmp_path_factory.mktemp("smoke-notebooks")

    def get(stem: str) -> dict:
        if stem in cache:
            return cache[stem]
        records = None
        record_dir = os.environ.get("FEDLIB_RECORD_DIR")
        if record_dir and (Path(record_dir) / f"{stem}.jsonl").exists():
            candidate = read_record_file(Path(record_dir) / f"{stem}.jsonl")
            if candidate.get(FINISHED_KEY) and candidate.get("profile") == "smoke":
                records = candidate
        if records is None:
            executed = run_notebook(stem, "smoke", output=out_dir / f"{stem}.ipynb", progress_bar=False)
            records = read_records(executed)
        assert records.get(FINISHED_KEY), f"{stem} did not reach its last cell at the smoke profile"
        cache[stem] = records
        return records

    return get


@pytest.fixture(scope="module")
def records(request, smoke_records):
    """The smoke records of the notebook named by the test module's ``STEM`` (``tests/test_notebook_NN.py``)."""
    stem = getattr(request.module, "STEM", None)
    if stem is None:
        raise ValueError(f"{request.module.__name__} asks for the 'records' fixture but sets no STEM "
                         "(the notebook name, e.g. STEM = \"05_fedcsr\")")
    return smoke_records(stem)


def pytest_terminal_summary(terminalreporter):
    """Report each notebook's smoke wall time (budgets are read from reports, never asserted)."""
    record_dir = os.environ.get("FEDLIB_RECORD_DIR")
    if not record_dir or not Path(record_dir).is_dir():
        return
    from fedlib.notebook.records import read_record_file

    rows = []
    for path in sorted(Path(record_dir).glob("*.jsonl")):
        try:
            records = read_record_file(path)
        except ValueError:
            continue
        if "wall_time_s" in records:
            rows.append((path.stem, records["wall_time_s"], records.get("profile", "?")))
    if rows:
        terminalreporter.section("notebook wall time (this machine, now; the smoke budget is 60 s on an idle machine)")
        for stem, seconds, profile in rows:
            terminalreporter.write_line(f"{stem:<34} {seconds:7.1f} s  ({profile})")


@pytest.fixture(autouse=True)
def _paper_records_in_temporary_roots(request, monkeypatch):
    """Let tests write ``paper``-profile records into temporary project roots.

    Those roots are not git checkouts, and the records' commits are made up, so the rule that
    a paper-profile record needs committed code that exists
    (:func:`fedlib.reporting.results.check_recordable_commit`) would refuse them. Tests marked
    ``provenance`` keep the rule (they test it).
    """
    if request.node.get_closest_marker("provenance") is not None:
        return
    import fedlib.reporting.results as results

    monkeypatch.setattr(results, "check_recordable_commit", lambda commit, root=None: commit)
