"""Quick-profile regression checks (``./run quick-check``; minutes per notebook, not in CI)."""
import pytest

from fedlib.notebook.expected import expected_file, failed_checks
from fedlib.notebook.records import read_records
from fedlib.notebook.runner import list_notebooks, run_notebook

NOTEBOOKS = [nb for nb in list_notebooks() if expected_file(nb.stem).exists()]


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[nb.stem for nb in NOTEBOOKS])
def test_quick_profile_matches_expected_values(nb, tmp_path):
    executed = run_notebook(nb.stem, "quick", output=tmp_path / f"{nb.stem}.ipynb", progress_bar=False)
    records = read_records(executed)
    assert records.get("profile") == "quick"
    assert failed_checks(nb.stem, records) == []
