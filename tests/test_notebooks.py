"""Every notebook: paired with its source, executed for real, and its smoke records sane."""
import re

import nbformat
import pytest

from fedlib.notebook.records import read_records
from fedlib.notebook.runner import list_notebooks, pairing_problems
from fedlib.notebook.profiles import read_profile_table

NOTEBOOKS = list_notebooks()
IDS = [nb.stem for nb in NOTEBOOKS]


def test_there_is_at_least_one_notebook():
    assert NOTEBOOKS, "notebooks/ holds no NN_name.py notebook"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=IDS)
def test_ipynb_code_cells_match_py_source(nb):
    assert pairing_problems(nb) == []


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=IDS)
def test_committed_ipynb_carries_a_finished_quick_run(nb):
    records = read_records(nb.paired)
    assert records.get("profile") == "quick", f"{nb.paired.name} was not executed at the quick profile"
    assert records.get("__finished__") is True, f"{nb.paired.name} did not run to its last cell"
    notebook = nbformat.read(nb.paired, as_version=4)
    errors = [o for c in notebook.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=IDS)
def test_notebook_conventions(nb):
    text = nb.source.read_text()
    notebook = nbformat.read(nb.paired, as_version=4)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert f'fnb.start("{nb.stem}")' in code[0].source, "the first code cell must print the provenance header"
    assert "fnb.finish()" in code[-1].source, "the last code cell must print the wall time"
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and "PROFILE" in tagged[0].source, "exactly one parameters cell selecting PROFILE"
    read_profile_table(nb.stem)  # the profile file exists and is valid
