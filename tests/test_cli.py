"""python -m fedlib: list, profiles, check-pairing, argument errors, help text."""
import subprocess
import sys

from fedlib.cli import main


def test_list_shows_notebooks_profiles_and_datasets(capsys, shared_data, monkeypatch):
    monkeypatch.setenv("FEDLIB_DATA", str(shared_data))
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "00_fedrec_from_scratch" in out and "smoke" in out and "ml-100k" in out
    assert "complete" in out and "missing" in out  # statuses come from the files present


def test_profiles_table(capsys):
    assert main(["profiles", "00"]) == 0
    out = capsys.readouterr().out
    assert "fedmf_rounds" in out and "smoke" in out.splitlines()[0]


def test_bad_arguments_give_exit_code_2(capsys):
    assert main(["run"]) == 2
    assert "give a notebook name or --all" in capsys.readouterr().err
    assert main(["run", "--all", "--output", "x.ipynb"]) == 2
    assert main(["profiles", "42"]) == 2
    assert "no notebook '42'" in capsys.readouterr().err


def test_help_lists_commands_and_environment():
    result = subprocess.run([sys.executable, "-m", "fedlib", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for word in ("run", "data", "status", "profiles", "FEDLIB_DATA", "FEDLIB_OFFLINE", "FEDLIB_PROFILE"):
        assert word in result.stdout
