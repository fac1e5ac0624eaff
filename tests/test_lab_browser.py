"""A student's first minutes, in a real browser: JupyterLab opens lesson 00's ``.py`` source as a
notebook (through jupytext) and runs its first code cells with Shift+Enter.

JupyterLab is started on 127.0.0.1 with a token, in a scratch folder holding a copy of the
lesson's source (so nothing it saves touches the project), with its settings told to open
Python files as Jupytext notebooks, the way ``./run lab`` users set it once. Chromium is
Debian's (tests/site_browser.py); every request outside 127.0.0.1 is refused, as offline.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fedlib.notebook.runner import find_notebook

from site_browser import launch, require_browser

FIRST_CODE_CELLS = 3  # provenance, the parameters cell, the profile and imports


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _cells_through_code_cell(source: str, count: int) -> int:
    """How many cells (markdown included) of a jupytext percent file come up to its ``count``-th code cell."""
    cells = seen = 0
    for line in source.splitlines():
        if line.startswith("# %%"):
            cells += 1
            if "[markdown]" not in line:
                seen += 1
                if seen == count:
                    return cells
    raise ValueError(f"the file has fewer than {count} code cells")


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on 127.0.0.1 serving a copy of lesson 00's source; yields (url, token)."""
    require_browser()
    lesson = find_notebook("00").source
    root = tmp_path / "lab"
    root.mkdir()
    shutil.copy(lesson, root / lesson.name)
    settings = tmp_path / "settings" / "@jupyterlab" / "docmanager-extension"
    settings.mkdir(parents=True)
    (settings / "plugin.jupyterlab-settings").write_text(json.dumps({"defaultViewers": {"python": "Jupytext Notebook"}}))
    news = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"  # no "fetch the news?" pop-up
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    token, port = secrets.token_hex(16), _free_port()
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "FEDLIB_PROFILE": "smoke"}
    log = (tmp_path / "lab.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--allow-root",  # CI containers run as root
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.extension_manager=readonly"],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}api/status?token={token}", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"JupyterLab did not start:\n{(tmp_path / 'lab.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield url, token, lesson
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def test_lesson_00_source_opens_as_a_notebook_and_its_first_cells_run(lab):
    url, token, lesson = lab
    presses = _cells_through_code_cell(lesson.read_text(), FIRST_CODE_CELLS)
    with launch() as browser:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(url)
                      else route.abort())
        tab = context.new_page()
        tab.goto(f"{url}lab/tree/{lesson.name}?token={token}")
        notebook = tab.locator(".jp-NotebookPanel .jp-Notebook")
        notebook.wait_for(timeout=120_000)  # the .py opened as a notebook, not in the text editor
        assert tab.locator(".jp-FileEditor").count() == 0
        # the kernel named in the file's header starts by itself; cells run before it is ready would
        # make JupyterLab ask which kernel to use
        tab.get_by_text(re.compile(r"Python 3 \(ipykernel\) \| Idle")).wait_for(timeout=120_000)
        tab.locator(".jp-Notebook .jp-Cell").first.click()  # select the first cell (command mode)
        for _ in range(presses):
            tab.keyboard.press("Shift+Enter")
            tab.wait_for_timeout(200)
        tab.wait_for_function(
            """n => Array.from(document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt'))
                   .filter(p => /\\[\\d+\\]/.test(p.textContent)).length >= n""",
            arg=FIRST_CODE_CELLS, timeout=180_000)
        code_cells = tab.locator(".jp-Notebook .jp-CodeCell")
        prompts = [code_cells.nth(i).locator(".jp-InputPrompt").inner_text() for i in range(FIRST_CODE_CELLS)]
        outputs = [code_cells.nth(i).locator(".jp-OutputArea").inner_text() for i in range(FIRST_CODE_CELLS)]
        errors = tab.locator('.jp-Notebook .jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
        error_texts = [errors.nth(i).inner_text() for i in range(errors.count())]
        tab.screenshot(path=str(Path(__file__).resolve().parents[1] / "build" / "screenshots" / "lab-lesson-00.png"))
        context.close()
    assert [re.sub(r"\s", "", p) for p in prompts] == [f"[{i}]:" for i in range(1, FIRST_CODE_CELLS + 1)], prompts
    assert not [t for t in error_texts if re.search(r"Traceback|Error\b|Exception", t)], error_texts
    assert re.search(r"notebook\s*:\s*00_fedrec_from_scratch", outputs[0]), outputs[0]
    assert "profile: smoke" in outputs[2], outputs[2]  # the kernel saw FEDLIB_PROFILE and the cell ran to its end
