"""The README's commands and its ten-line example stay true."""
import re
import subprocess
import sys

from conftest import REPO


def test_readme_example_runs(shared_data, monkeypatch):
    """The first python block of the README, shortened to 2 rounds, runs and prints metrics."""
    text = (REPO / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert "rounds=200" in code
    code = code.replace("rounds=200", "rounds=2")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**__import__("os").environ, "FEDLIB_DATA": str(shared_data)})
    assert result.returncode == 0, result.stderr
    assert "NDCG@20" in result.stdout


def test_readme_names_the_two_commands_and_run_script_knows_them():
    text = (REPO / "README.md").read_text()
    assert "./run notebooks" in text and "./run test" in text
    run = (REPO / "run").read_text()
    assert "\n    notebooks)" in run and "\n    test)" in run
    ci = (REPO / ".ci" / "run").read_text()
    assert "./run test" in ci
