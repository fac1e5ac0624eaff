"""The runner: executes a .py notebook at a profile, never clobbers the committed .ipynb."""

import nbformat
import pytest

from fedlib.notebook import runner
from fedlib.notebook.records import read_records

PROFILE_TOML = """
[base]
value = 1
[smoke]
value = 2
[quick]
[paper]
value = 3
"""

NOTEBOOK = '''# %% [markdown]
# # 99 · Demo notebook

# %%
import fedlib.notebook as fnb
fnb.start("99_demo")

# %% tags=["parameters"]
PROFILE = None

# %%
settings = fnb.use_profile(PROFILE)
fnb.record("value", settings.value)
{extra}
# %%
fnb.finish()
'''


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "notebooks" / "profiles").mkdir(parents=True)
    (tmp_path / "notebooks" / "profiles" / "99_demo.toml").write_text(PROFILE_TOML)
    (tmp_path / "notebooks" / "99_demo.py").write_text(NOTEBOOK.format(extra=""))
    monkeypatch.setenv("FEDLIB_PROJECT_ROOT", str(tmp_path))
    monkeypatch.delenv("FEDLIB_RECORD_DIR", raising=False)
    return tmp_path


@pytest.mark.notebook
def test_run_at_profile_records_profile_values(project):
    out = runner.run_notebook("99", "smoke", output=project / "out.ipynb", progress_bar=False)
    records = read_records(out)
    assert records["profile"] == "smoke" and records["value"] == 2 and records["__finished__"] is True
    assert not (project / "notebooks" / "99_demo.ipynb").exists()  # output went where asked


@pytest.mark.notebook
def test_in_place_only_at_quick_and_failure_keeps_committed_notebook(project):
    with pytest.raises(ValueError, match="refusing to overwrite"):
        runner.run_notebook("99_demo", "smoke", in_place=True)
    committed = runner.run_notebook("99_demo", "quick", in_place=True, progress_bar=False)
    assert read_records(committed)["value"] == 1
    before = committed.read_bytes()
    # a cell that raises: the run fails and the committed notebook is untouched
    (project / "notebooks" / "99_demo.py").write_text(NOTEBOOK.format(extra="raise RuntimeError('boom')\n"))
    with pytest.raises(Exception, match="boom"):
        runner.run_notebook("99_demo", "quick", in_place=True, progress_bar=False)
    assert committed.read_bytes() == before


def test_pairing_detects_an_edited_ipynb_cell(project):
    nb = runner.find_notebook("99")
    executed = runner.source_as_notebook(nb)
    nbformat.write(executed, nb.paired)
    assert runner.pairing_problems(nb) == []
    edited = nbformat.read(nb.paired, as_version=4)
    code = [c for c in edited.cells if c.cell_type == "code"]
    code[-1].source = "fnb.finish()  # edited in the .ipynb only"
    nbformat.write(edited, nb.paired)
    problems = runner.pairing_problems(nb)
    assert len(problems) == 1 and "code cell 3 differs" in problems[0]


def test_pairing_reports_missing_ipynb(project):
    problems = runner.pairing_problems(runner.find_notebook("99_demo"))
    assert problems and "99_demo.ipynb is missing" in problems[0]


def test_unknown_notebook_lists_known_ones(project):
    with pytest.raises(FileNotFoundError, match="no notebook '42'.*99_demo"):
        runner.find_notebook("42")


def test_a_lesson_runs_the_same_twice_on_two_threads(shared_data):
    """``fnb.start`` turns on PyTorch's deterministic algorithms, so a lesson's live training repeats
    bit for bit with two threads. Without it, two runs of this same centralised NeuMF cell (ML-100K,
    2 epochs) in one process gave validation N@10 0.244504 and 0.244258: a multi-threaded kernel
    summed in a varying order."""
    import os
    import subprocess
    import sys

    script = """
import torch
import fedlib.notebook as fnb
from fedlib.papers.fedkdrec import experiment as X
torch.set_num_threads(2)
fnb.start("03_fedkdrec")
assert torch.are_deterministic_algorithms_enabled()
cell = X.cell("ML-100K", "Centralized", backbone="NeuMF", central_epochs=2, eval_every=1, seed=0)
first, second = (X.run_cell(cell)["metrics"]["valid/sampled/NDCG@10"] for _ in range(2))
print("identical" if first == second else f"differ: {first!r} {second!r}")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "FEDLIB_DATA": str(shared_data)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "identical", done.stdout[-500:]
