"""The course website (fedlib.notebook.site): what it is built from, and how it looks in a real browser.

The first tests check the pieces without a browser (front matter, the notebooks the pages show,
links, the offline MathJax). The browser tests build the student and instructor editions once
(``build_site``, as ``./run site`` does), serve them on 127.0.0.1 and open every page in
Chromium (tests/site_browser.py); a deliberately broken copy shows that the checks can fail.
"""
from __future__ import annotations

import io
import os
import re
import shutil
import tarfile
from pathlib import Path

import nbformat
import pytest

from fedlib.notebook import site
from fedlib.notebook.course import is_solution
from fedlib.notebook.records import RECORD_MIME
from fedlib.notebook.runner import find_notebook, list_notebooks
from fedlib.paths import project_root

from site_browser import check_pages, launch, require_browser, serve, site_pages

ROOT = project_root()
SCREENSHOTS = ROOT / "build" / "screenshots"


def _lesson(name: str):
    return nbformat.read(str(find_notebook(name).paired), as_version=4)


# --------------------------------------------------------------------------------------------
# Without a browser
# --------------------------------------------------------------------------------------------
def test_course_map_reads_every_lessons_front_matter():
    entries = site.course_map()
    lessons = [nb for nb in list_notebooks(appendices=False)]
    assert [e.page for e in entries] == [nb.stem for nb in lessons]
    for entry in entries:
        assert re.search(r"^\s*(\d+\.|[*-])\s+\S", entry.objectives, re.M), (entry.page, entry.objectives)
        assert len(entry.prerequisites) > 10 and not entry.prerequisites.startswith("**"), entry.page
        assert "quick" in entry.time, (entry.page, entry.time)  # every lesson states its quick-profile time
    assert entries[0].appendix is None
    assert all(e.appendix and e.appendix[1] == f"appendix/{e.page}_appendix" for e in entries[1:])


def test_front_matter_without_a_label_names_the_lesson_and_the_label():
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# 09 · X\n\n**Learning objectives**\n\n1. one\n\n**Prerequisites**: none"),
        nbformat.v4.new_code_cell("1")])
    with pytest.raises(ValueError, match=r"09_x: no '\*\*Time\*\*' paragraph"):
        site.front_matter(notebook, "09_x")
    notebook.cells.insert(1, nbformat.v4.new_markdown_cell("**Time** (2 cores): quick 3 minutes"))
    fields = site.front_matter(notebook, "09_x")
    assert fields == {"objectives": "1. one", "prerequisites": "none", "time": "(2 cores): quick 3 minutes"}


def test_site_notebook_drops_solutions_widgets_and_records_only():
    original = _lesson("00")
    student = site.site_notebook(original, solutions=False)
    instructor = site.site_notebook(original, solutions=True)
    solutions = [c for c in original.cells if is_solution(c)]
    assert solutions, "lesson 00 has exercises with solution cells"
    assert not any(is_solution(c) for c in student.cells)
    assert [c.source for c in student.cells] == [c.source for c in original.cells if not is_solution(c)]
    assert [c.source for c in instructor.cells] == [c.source for c in original.cells]
    assert all("hide-input" in c.metadata["tags"] for c in instructor.cells if is_solution(c))
    assert not any("hide-input" in c.metadata.get("tags", []) for c in original.cells)  # the original is untouched
    for page in (student, instructor):
        assert "widgets" not in page.metadata
        mimes = {m for c in page.cells for o in c.get("outputs", []) for m in o.get("data", {})}
        assert site.WIDGET_VIEW_MIME not in mimes and RECORD_MIME not in mimes
    # every other output survives: the figures and the printed text
    def kinds(nb):
        return sum(1 for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {}))
    assert kinds(instructor) == kinds(original) > 0
    assert original.metadata.get("widgets"), "the executed lesson saved its progress bars' state"


def test_a_progress_bar_becomes_its_last_text_line():
    state = {
        "box": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_a", "IPY_MODEL_b", "IPY_MODEL_c"]}},
        "a": {"model_name": "HTMLModel", "state": {"value": "FedMF:&nbsp;100%"}},
        "b": {"model_name": "FloatProgressModel", "state": {"value": 40, "max": 40}},
        "c": {"model_name": "HTMLModel", "state": {"value": " 40/40 [00:02&lt;00:00, 19.5it/s]"}},
        "half": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_d"]}},
        "d": {"model_name": "FloatProgressModel", "state": {"value": 1, "max": 2}},
    }
    assert site.widget_text("box", state) == "FedMF:\xa0100%|██████████| 40/40 [00:02<00:00, 19.5it/s]"
    assert site.widget_text("half", state) == "|█████     |"
    assert site.widget_text("missing", state) is None
    # on a real lesson: each bar reads as tqdm printed it last (a run may stop early: 240/400)
    notebook = _lesson("00")
    bars = sum(1 for c in notebook.cells for o in c.get("outputs", []) if site.WIDGET_VIEW_MIME in o.get("data", {}))
    lines = [o["text"] for c in site.site_notebook(notebook, solutions=False).cells
             for o in c.get("outputs", []) if o.get("output_type") == "stream"]
    progress = [line for line in lines if re.search(r"\|█*\s*\|\s*\d+/\d+\s*\[", line)]
    assert bars > 0 and len(progress) == bars, progress[:3]


def test_links_point_at_site_pages_or_become_text(tmp_path):
    docs = ROOT / "docs"
    pages = {(ROOT / "notebooks" / "01_fedrkg.ipynb").resolve(): "01_fedrkg.ipynb",
             (docs / "engine.md").resolve(): "reference/engine.md"}
    text = ("See [lesson 01](../notebooks/01_fedrkg.ipynb), [the engine](engine.md#executors), "
            "[the tables](../paper_tables/README.md), [web](https://example.org/x) and ![fig](a.png).")
    out = site.rewrite_links(text, docs / "results.md", pages, "reference/results.md")
    assert "[lesson 01](../01_fedrkg.ipynb)" in out
    assert "[the engine](engine.md#executors)" in out
    assert "the tables (`paper_tables/README.md`)" in out and "](../paper_tables" not in out
    assert "[web](https://example.org/x)" in out and "![fig](a.png)" in out


def test_mathjax_is_checked_against_its_published_checksum(tmp_path, monkeypatch):
    fake = tmp_path / "mathjax-3.2.2.tgz"
    with tarfile.open(fake, "w:gz") as archive:
        data = b"window.MathJax = {};"
        info = tarfile.TarInfo("package/es5/tex-svg-full.js")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    monkeypatch.setenv("FEDLIB_MATHJAX_TGZ", str(fake))
    with pytest.raises(ValueError, match="checksum .* is not the published"):
        site.vendor_mathjax(tmp_path / "cache")
    assert not (tmp_path / "cache" / "mathjax-3.2.2").exists()  # nothing half-unpacked is left to be reused

    monkeypatch.delenv("FEDLIB_MATHJAX_TGZ")
    monkeypatch.setattr(site.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="npm was not found.*FEDLIB_MATHJAX_TGZ"):
        site.vendor_mathjax(tmp_path / "empty-cache")


def test_a_downloaded_mathjax_tarball_is_used_as_is(tmp_path, monkeypatch):
    """``FEDLIB_MATHJAX_TGZ`` (a machine without npm): the real tarball unpacks to the es5 folder the site loads."""
    es5 = site.vendor_mathjax()  # the project's cache (fetched with npm once)
    tarball = Path(os.environ.get("FEDLIB_MATHJAX_TGZ") or es5.parent.parent / f"mathjax-{site.MATHJAX_VERSION}.tgz")
    monkeypatch.setenv("FEDLIB_MATHJAX_TGZ", str(tarball))
    monkeypatch.setattr(site.shutil, "which", lambda name: None)  # npm is not asked
    unpacked = site.vendor_mathjax(tmp_path / "cache")
    assert (unpacked / Path(site.MATHJAX_SCRIPT).name).stat().st_size > 1_000_000
    assert (unpacked / "output" / "chtml" / "fonts" / "woff-v2").is_dir()  # the web fonts travel with it
    assert not list((tmp_path / "cache").glob(".mathjax-*"))  # no half-unpacked folder left


def test_results_table_in_a_paper_like_layout():
    import pandas as pd

    table = pd.DataFrame({
        "table": "table9", "dataset": ["A", "A", "B", "B"], "method": ["X", "Y", "X", "Y"], "metric": "R@10",
        "sampler": "leaky", "value_paper": [2.0, 4.0, 6.0, 8.0], "value_ours": [1.0, 4.1, float("nan"), 8.0],
        "delta": 0.0, "delta_rel": float("nan"), "confidence": "high", "profile": "paper", "n_seeds": 1,
        "commit": "abc1234", "device": "cpu", "unit": "percent", "flags": ["one_seed", "", "", "at_cap"],
        "note": ""})
    two_metrics = pd.concat([table, table.assign(metric="N@10")], ignore_index=True)
    [(_, grouped)] = site.results_table_html(two_metrics)
    header = grouped[grouped.index("<thead"):grouped.index("</thead>")]
    assert header.index("R@10") < header.index("N@10")  # every metric of dataset A, then of B
    assert header.count(">A<") == 1 and header.count(">B<") == 1 and 'colspan="2"' in header
    [(heading, html)] = site.results_table_html(table)
    assert heading == ""  # one sampler, one metric: nothing to split or to show as a column level
    assert "1.00¹ (2.00)" in html and "— (6.00)" in html and "8.00ᶜ (8.00)" in html
    assert html.index(">X<") < html.index(">Y<") and html.index(">A<") < html.index(">B<")
    assert 'overflow-x: auto' in html
    legend = html[:html.index("<div")]  # the legend precedes the table, which has no caption of its own
    assert "Shading" in legend and "one seed" in legend and "<caption" not in html


# --------------------------------------------------------------------------------------------
# In a browser
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The student and instructor editions, built as ``./run site`` does."""
    require_browser()
    out = tmp_path_factory.mktemp("site")
    return {variant: site.build_site(variant, out / variant) for variant in site.VARIANTS}


@pytest.fixture(scope="module")
def browser():
    with launch() as chromium:
        yield chromium


def test_every_page_loads_clean_offline(built, browser):
    root = built["student"]
    pages = site_pages(root)
    lessons = [nb.stem for nb in list_notebooks(appendices=False)]
    assert {"index.html", "instructors.html", "results/index.html"} <= set(pages)
    assert all(f"{stem}.html" in pages for stem in lessons)
    assert all(f"results/{slug}.html" in pages for slug in ("fedrkg", "f3crec", "fedkdrec", "fedpcl_cdr", "fedcsr"))
    with serve(root) as url:
        problems = check_pages(browser, root, pages, url)
    assert problems == [], "\n".join(problems)


def test_home_page_and_a_lesson_as_a_reader_sees_them(built, browser):
    root = built["student"]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with serve(root) as url:
        tab = browser.new_page(viewport={"width": 1280, "height": 900})
        tab.goto(url + "index.html", wait_until="networkidle")
        text = tab.inner_text("main")
        for entry in site.course_map():
            assert entry.title in text
            assert tab.locator(f'main a[href="{entry.page}.html"]').count() >= 1
        assert "Course map" in text and "Objectives." in text and "Prerequisites." in text
        assert tab.locator("main ol").count() >= len(site.course_map())  # each lesson's objectives, as a list
        tab.screenshot(path=str(SCREENSHOTS / "site-home.png"), full_page=True)  # the whole course map
        tab.goto(url + "00_fedrec_from_scratch.html", wait_until="networkidle")
        tab.evaluate("() => MathJax.startup.promise.then(() => true)")
        assert tab.locator("mjx-container").count() > 10
        figures = sum(1 for c in site.site_notebook(_lesson("00"), solutions=False).cells
                      for o in c.get("outputs", []) if "image/png" in o.get("data", {}))
        assert figures >= 2 and tab.locator("main img").count() >= figures
        tab.locator("div.math mjx-container").first.scroll_into_view_if_needed()  # a displayed equation
        tab.screenshot(path=str(SCREENSHOTS / "site-lesson-00-math.png"))
        tab.locator("main img").first.scroll_into_view_if_needed()  # the first figure
        tab.screenshot(path=str(SCREENSHOTS / "site-lesson-00-figure.png"))
        tab.close()
    for name in ("site-home.png", "site-lesson-00-math.png", "site-lesson-00-figure.png"):
        assert (SCREENSHOTS / name).stat().st_size > 20_000, name


def test_the_instructor_editions_lessons_load_clean(built, browser):
    root = built["instructor"]
    pages = ["index.html"] + [f"{nb.stem}.html" for nb in list_notebooks(appendices=False)]
    with serve(root) as url:
        problems = check_pages(browser, root, pages, url)
    assert problems == [], "\n".join(problems)


def test_the_instructor_edition_alone_shows_the_solutions(built):
    solution = next(c for c in _lesson("00").cells if is_solution(c))
    line = next(l for l in solution.source.splitlines() if len(l.strip()) > 20 and not l.startswith("#"))
    token = re.findall(r"[A-Za-z_]{6,}", line)[0]
    student = (built["student"] / "00_fedrec_from_scratch.html").read_text()
    instructor = (built["instructor"] / "00_fedrec_from_scratch.html").read_text()
    assert "instructor" in (built["instructor"] / "index.html").read_text()
    assert instructor.count(token) > student.count(token), (token, line)


def test_the_checks_fail_on_a_broken_page(built, browser, tmp_path):
    root = tmp_path / "broken"
    shutil.copytree(built["student"], root)
    page = root / "instructors.html"
    clean = page.read_text()
    page.write_text(clean.replace(
        "</main>", '<img src="_images/no-such-figure.png"><a href="no-such-page.html">x</a>'
                   '<a href="index.html#no-such-anchor">y</a><p>$$x^2$$</p>'
                   '<script>console.error("deliberate error")</script></main>', 1))
    assert page.read_text() != clean
    with serve(root) as url:
        problems = check_pages(browser, root, ["instructors.html"], url)
    text = "\n".join(problems)
    assert "image '_images/no-such-figure.png' did not load" in text
    assert "deliberate error" in text
    assert "no-such-page.html" in text and "#no-such-anchor" in text
    assert "raw '$$'" in text
    with serve(built["student"]) as url:
        assert check_pages(browser, built["student"], ["instructors.html"], url) == []
