"""The course as a static website, built with Jupyter Book 1.x from the executed notebooks.

``python -m fedlib site`` (``./run site``) writes ``build/site/``: a home page with the course
map, one page per lesson and appendix, the results (the status table and every recorded table
in the paper's layout), a page for instructors and the reference documents of ``docs/``.
``--instructor`` writes ``build/site-instructor/``, the same site with the exercises' solution
cells. Nothing is executed: the pages show the outputs of the committed ``quick`` run.

The site works offline (from a USB stick or an air-gapped lab): MathJax 3 is copied into the
build from npm's ``mathjax`` package (pinned version and checksum, fetched once into
``build/vendor/``), the theme's fonts and scripts come with Sphinx, and the notebooks' progress
bars (Jupyter widgets, whose renderer would load from a CDN) become plain text lines.

Pipeline: :func:`write_site_source` lays out a Jupyter Book under ``build/site-src/<variant>/``
(``_config.yml``, ``_toc.yml``, the generated pages and the prepared notebooks);
:func:`build_site` runs ``jupyter-book build`` on it and copies the HTML to the output folder.
"""
from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from fedlib.notebook.course import is_solution
from fedlib.notebook.records import RECORD_MIME
from fedlib.notebook.runner import NotebookInfo, is_appendix, list_notebooks
from fedlib.paths import PAPER_SLUGS, project_root

VARIANTS = ("student", "instructor")
SITE_TITLE = "fedlib: federated recommendation"
HOME_HEADING = "Federated recommendation, one lesson per paper"

# MathJax 3 from npm, checked against the registry's published integrity (sha512) of the tarball.
MATHJAX_VERSION = "3.2.2"
MATHJAX_INTEGRITY = "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw=="
MATHJAX_SCRIPT = "mathjax/tex-chtml-full.js"  # under the site's _static/; its web fonts come along in es5/
# The book's own static folder (MathJax, a style sheet, the icon). Not "_static": when a book has
# one, Jupyter Book adds every .js and .css of every static folder to each page, MathJax's 100 included.
VENDOR_STATIC = "_vendor"
SITE_CSS = "fedlib-site.css"
FAVICON = "favicon.svg"
# A displayed equation wider than the column scrolls sideways instead of being cut off: the theme
# centres it in a flex box, which pushes the overflow past the left edge, where no scrolling reaches.
_SITE_CSS = """div.math { display: block; overflow-x: auto; overflow-y: hidden; }
"""
_FAVICON_SVG = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><rect width="32" height="32" rx="6" '
                'fill="#1f5f8b"/><text x="16" y="22" font-family="sans-serif" font-size="15" font-weight="bold" '
                'fill="#fff" text-anchor="middle">fl</text></svg>\n')

WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE_MIME = "application/vnd.jupyter.widget-state+json"

#: docs/*.md shown under "Reference", in this order (others follow alphabetically).
REFERENCE_ORDER = ("papers", "data", "results", "engine", "speed", "layers", "testing", "adding-a-paper")

_FRONT_FIELDS = {"objectives": "Learning objectives", "prerequisites": "Prerequisites", "time": "Time"}


# --------------------------------------------------------------------------------------------
# Lessons: front matter and the notebook each page shows
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LessonEntry:
    """One lesson of the course map: what the home page says about it (Markdown strings)."""

    number: str           # "00" ... "05"
    title: str            # "00 · Federated recommendation from scratch"
    page: str             # site path of its page without suffix, "00_fedrec_from_scratch"
    objectives: str       # the "Learning objectives" paragraph(s), label removed
    prerequisites: str
    time: str
    appendix: Optional[tuple[str, str]] = None  # (title, page) of its appendix


def _front_matter_text(notebook) -> str:
    """The Markdown before the first code cell (a lesson's title, sources and front matter)."""
    parts = []
    for cell in notebook.cells:
        if cell.cell_type == "code":
            break
        if cell.cell_type == "markdown":
            parts.append(cell.source)
    return "\n\n".join(parts)


def front_matter(notebook, name: str) -> dict[str, str]:
    """A lesson's objectives, prerequisites and time, read from its bold-labelled paragraphs.

    The lesson standard opens every lesson with ``**Learning objectives**`` (a list),
    ``**Prerequisites**`` and ``**Time**`` paragraphs; the label and its ``.``/``:`` are
    dropped. Raises ``ValueError`` naming the lesson and the missing label.
    """
    paragraphs = re.split(r"\n\s*\n", _front_matter_text(notebook))
    found: dict[str, str] = {}
    for field, label in _FRONT_FIELDS.items():
        start = next((i for i, p in enumerate(paragraphs) if p.lstrip().startswith(f"**{label}")), None)
        if start is None:
            raise ValueError(f"{name}: no '**{label}**' paragraph before the first code cell; every lesson "
                             f"opens with objectives, prerequisites and time (notebooks/_template.py)")
        block = [paragraphs[start]]
        if field == "objectives":  # the list may follow the label in its own paragraphs
            for p in paragraphs[start + 1:]:
                if p.lstrip().startswith("**"):
                    break
                block.append(p)
        text = "\n\n".join(block).strip()
        text = re.sub(rf"^\*\*{re.escape(label)}[.:]?\*\*[.:]?\s*", "", text)
        if not text:
            raise ValueError(f"{name}: the '**{label}**' paragraph is empty")
        found[field] = text
    return found


def course_map(notebooks: Optional[list[NotebookInfo]] = None) -> list[LessonEntry]:
    """The lessons in teaching order with their front matter and appendix."""
    import nbformat

    notebooks = list_notebooks() if notebooks is None else notebooks
    entries: list[LessonEntry] = []
    appendices = {nb.stem[:2]: nb for nb in notebooks if is_appendix(nb)}
    for nb in notebooks:
        if is_appendix(nb):
            continue
        _require_executed(nb)
        fields = front_matter(nbformat.read(str(nb.paired), as_version=4), nb.stem)
        appendix = appendices.get(nb.number)
        entries.append(LessonEntry(number=nb.number, title=nb.title, page=nb.stem, **fields,
                                   appendix=(appendix.title, f"appendix/{appendix.stem}") if appendix else None))
    return entries


def _require_executed(nb: NotebookInfo) -> None:
    if not nb.paired.exists():
        raise FileNotFoundError(f"{nb.paired} does not exist: the site shows executed notebooks; "
                                "run ./run notebooks (or python -m fedlib run <name> --in-place) first")


def widget_text(model_id: str, state: dict) -> Optional[str]:
    """A tqdm progress bar (an ``HBox`` of label, progress and counter) as the text line tqdm prints.

    ``state`` is the notebook's saved widget state (model id -> model). Returns ``None`` when
    the widget is not such a bar or its state was not saved.
    """
    model = state.get(model_id)
    if not model or model.get("model_name") != "HBoxModel":
        return None
    pieces = []
    for child in model.get("state", {}).get("children", []):
        child_model = state.get(str(child).removeprefix("IPY_MODEL_"), {})
        child_state = child_model.get("state", {})
        if child_model.get("model_name") == "HTMLModel":
            pieces.append(html.unescape(re.sub(r"<[^>]+>", "", str(child_state.get("value", "")))))
        elif child_model.get("model_name") in ("FloatProgressModel", "IntProgressModel"):
            total = float(child_state.get("max") or 0)
            done = float(child_state.get("value") or 0)
            filled = int(round(10 * done / total)) if total > 0 else 0
            pieces.append("|" + "█" * filled + " " * (10 - filled) + "|")
    return "".join(pieces).strip() or None


def site_notebook(notebook, *, solutions: bool):
    """A copy of an executed notebook fit for a static page.

    * ``solutions=False`` (student site) drops the cells tagged ``solution``; with ``True``
      (instructor site) their code is folded behind a toggle (Jupyter Book's ``hide-input``);
    * progress-bar widgets become the text line they showed last (from the saved widget
      state), and the notebook's widget state is dropped, so no page loads a widget renderer
      from a CDN;
    * the machine-readable metric records (``application/vnd.fedlib.record+json``) are dropped:
      they are for the tests, not for readers.
    """
    import copy

    import nbformat

    page = copy.deepcopy(notebook)
    state = page.metadata.get("widgets", {}).get(WIDGET_STATE_MIME, {}).get("state", {})
    if not solutions:
        page.cells = [cell for cell in page.cells if not is_solution(cell)]
    for cell in page.cells:
        if is_solution(cell):  # instructor edition: the solution's code folds behind a "show" toggle
            tags = cell.metadata.setdefault("tags", [])
            if "hide-input" not in tags:
                tags.append("hide-input")
    for cell in page.cells:
        if cell.cell_type != "code":
            continue
        outputs = []
        for output in cell.get("outputs", []):
            data = output.get("data")
            if data is not None and WIDGET_VIEW_MIME in data:
                line = widget_text(data[WIDGET_VIEW_MIME].get("model_id", ""), state)
                if line:
                    outputs.append(nbformat.v4.new_output("stream", name="stderr", text=line + "\n"))
                continue
            if data is not None and RECORD_MIME in data:
                data = {k: v for k, v in data.items() if k != RECORD_MIME}
                if not data:
                    continue
                output = copy.deepcopy(output)
                output["data"] = data
            outputs.append(output)
        cell["outputs"] = outputs
    page.metadata.pop("widgets", None)
    return page


# --------------------------------------------------------------------------------------------
# Generated pages
# --------------------------------------------------------------------------------------------
def home_page(entries: list[LessonEntry], *, variant: str, intro: str) -> str:
    """``index.md``: ``intro`` (what the course is), the course map, and where everything else is."""
    lines = [f"# {HOME_HEADING}", "", intro, ""]
    if variant == "instructor":
        lines += ["```{note}", "This is the **instructor** edition: the exercises' solution cells are included.",
                  "The student edition leaves them out.", "```", ""]
    lines += ["## Course map", "",
              "The lessons in teaching order. Each one teaches one paper: the setting, the method from its "
              "equations with the code of each one, a live training run, the paper's tables next to the numbers "
              "it reports, an audit, takeaways, review questions and exercises. The pages show the outputs of a "
              "real run at the `quick` profile; open the notebooks in JupyterLab (`./run lab`) to run them.", ""]
    lines += ["| lesson | appendix |", "|---|---|"]
    for entry in entries:
        appendix = f"[appendix]({entry.appendix[1]}.ipynb)" if entry.appendix else "none"
        lines.append(f"| [{entry.title}]({entry.page}.ipynb) | {appendix} |")
    lines.append("")
    for entry in entries:
        # a list that starts right after the label would run into the label's paragraph
        starts_list = re.match(r"\s*(\d+\.|[*-])\s", entry.objectives) is not None
        lines += [f"### [{entry.title}]({entry.page}.ipynb)", "",
                  f"**Objectives.**{chr(10) * 2 if starts_list else ' '}{entry.objectives}", "",
                  f"**Prerequisites.** {entry.prerequisites}", "",
                  f"**Time.** {entry.time}", ""]
        if entry.appendix:
            lines += [f"**Appendix.** [{entry.appendix[0]}]({entry.appendix[1]}.ipynb)", ""]
    lines += ["## Also here", "",
              "* [Results](results/index.md): the status of every reproduced table, and each paper's tables in "
              "the paper's layout, ours beside the paper's numbers.",
              "* [For instructors](instructors.md): the student and instructor editions, running the grids, "
              "adding a paper.",
              "* [Reference](reference/papers.md): the papers and their code, data, results files, the engine, "
              "speed, the library's layers and the tests.", ""]
    return "\n".join(lines)


def _readme_introduction() -> str:
    """The README's opening paragraphs (between its title and its first section), written once there."""
    text = (project_root() / "README.md").read_text()
    body = text.split("\n", 1)[1]
    intro = body.split("\n## ", 1)[0].strip()
    if not intro:
        raise ValueError("README.md has no introduction between its title and its first '## ' section")
    return intro


_COLUMN_KEYS = ("dataset", "task", "domain", "metric")
_FACET_KEYS = ("sampler", "protocol", "stat")
_IGNORED_KEYS = ("table", "repeats_paper_value", "p_value_ours", "marker_ours")
_ROW_ORDER = ("method_group", "backbone", "method", "variant", "setting", "dim", "block")


def results_table_html(table) -> list[tuple[str, str]]:
    """One recorded results table in a paper-like layout: ``[(heading, html), ...]``.

    Rows are the method-like keys (method, backbone, setting, ...), columns the dataset, domain
    and metric; sampler, protocol and statistic split the table into one grid each. Each cell
    reads ``ours (paper)`` shaded by the difference (:func:`fedlib.reporting.paper_grid`).
    """
    from fedlib.reporting import paper_grid
    from fedlib.reporting.results import key_columns

    keys = [k for k in key_columns(table) if k not in _IGNORED_KEYS and table[k].nunique() > 1]
    facets = [k for k in keys if k in _FACET_KEYS]
    columns = [k for k in keys if k in _COLUMN_KEYS]
    rows = sorted((k for k in keys if k not in facets and k not in columns),
                  key=lambda k: _ROW_ORDER.index(k) if k in _ROW_ORDER else len(_ROW_ORDER))
    if not rows:
        rows, columns = columns[:1], columns[1:]
    if not columns:
        table = table.assign(value="score")
        columns = ["value"]
    unit = str(table["unit"].iloc[0]) if "unit" in table.columns and len(table) else ""
    decimals = 2 if unit == "percent" else 4 if unit == "fraction" else 3
    groups = table.groupby(facets, sort=False) if facets else [((), table)]
    out = []
    for values, part in groups:
        values = values if isinstance(values, tuple) else (values,)
        heading = ", ".join(f"{k} {v}" for k, v in zip(facets, values))
        # columns grouped key by key (every metric of a dataset together), each key in its order of appearance
        rank = {k: {v: i for i, v in enumerate(dict.fromkeys(part[k]))} for k in columns}
        labels = sorted(dict.fromkeys(zip(*(part[k] for k in columns))), key=lambda t: [rank[k][v] for k, v in zip(columns, t)])
        order = [t if len(columns) > 1 else t[0] for t in labels]
        styled = paper_grid(part, rows=rows, columns=columns, decimals=decimals, column_order=order)
        # the legend as a paragraph above the table (a caption is as wide as a wide table, and
        # clipped with it); the table scrolls sideways inside the page instead of running past it
        legend, styled.caption = html.escape(styled.caption or ""), None
        out.append((heading, f'<p class="fedlib-legend">{legend}</p>'
                             f'<div class="fedlib-wide-table" style="overflow-x: auto">{styled.to_html()}</div>'))
    return out


def results_pages(root: Optional[Path] = None) -> dict[str, str]:
    """``results/index.md`` (the status table) and ``results/<paper>.md`` (its recorded tables)."""
    from fedlib.reporting.results import read_results_csv
    from fedlib.reporting.status import render_status_markdown

    root = Path(root) if root else project_root()
    lessons = {nb.stem[3:]: nb for nb in list_notebooks(appendices=False)}
    index = ["# Results: the status of every table", "",
             "What the `paper` profile has reproduced so far: per paper and table, how many of the paper's "
             "cells we produced and how far ours are from the paper's numbers. The numbers are recorded in "
             "`results/<paper>/*.csv` by the resumable grids (`python -m fedlib grid`), each run traced to the "
             "commit that produced it.", "", render_status_markdown(root), "",
             "Each paper's tables in the paper's layout:", ""]
    pages = {}
    for slug in PAPER_SLUGS:
        lesson = lessons.get(slug)
        title = lesson.title if lesson else slug
        index.append(f"* [{title}]({slug}.md)")
        lines = [f"# {_short_name(title)}: the recorded tables", ""]
        if lesson:
            lines += [f"The lesson: [{lesson.title}](../{lesson.stem}.ipynb).", ""]
        lines += ["Each cell reads *ours (paper)*, ours recorded at the `paper` profile (`results/" + slug + "/`). "
                  "Green: within 5 % of the paper's number; amber: within 20 %; red: further; grey: not produced "
                  "(the lesson says why). Marks after a number are the flags of its run (the legend under "
                  "each table).", ""]
        tables = sorted((root / "results" / slug).glob("*.csv"))
        if not tables:
            lines += ["*Not yet run at the paper profile.*", ""]
        for path in tables:
            table = read_results_csv(path)
            if table.empty:
                continue
            lines += [f"## {_table_title(path.stem)}", ""]
            for heading, block in results_table_html(table):
                if heading:
                    lines += [f"**{heading}**", ""]
                lines += [_raw_html(block), ""]
        pages[f"results/{slug}.md"] = "\n".join(lines)
    pages["results/index.md"] = "\n".join(index) + "\n"
    return pages


def _short_name(title: str) -> str:
    """``"01 · FedRKG: federated ..."`` -> ``"FedRKG"`` (a lesson title's paper name)."""
    match = re.match(r"^\d+\s*·\s*([^:]+)", title)
    return match.group(1).strip() if match else title


def _table_title(stem: str) -> str:
    match = re.fullmatch(r"(table|figure|appendix)([A-Z]?\d+)", stem)
    if match:
        return f"{match.group(1).capitalize()} {match.group(2)}"
    return stem.replace("_", " ").capitalize()


def _raw_html(block: str) -> str:
    """An HTML fragment as one raw block of Markdown (no blank lines, which would end the block)."""
    return "\n".join(line for line in block.splitlines() if line.strip())


_LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")


def rewrite_links(markdown: str, source: Path, pages: dict[Path, str], page: str) -> str:
    """Point a document's relative links at the site's pages.

    ``source`` is the document's path in the repository, ``pages`` maps a repository path to its
    site path, ``page`` is the document's own site path. A link to a file the site does not
    carry (source code, a CSV folder) becomes its text followed by the path in code, so no page
    links to something that is not there.
    """
    here = Path(page).parent

    def replace(match: re.Match) -> str:
        text, target = match.group(1), match.group(2)
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            return match.group(0)
        path, _, anchor = target.partition("#")
        resolved = (source.parent / path).resolve()
        if resolved in pages:
            relative = os.path.relpath(pages[resolved], here)
            return f"[{text}]({relative}{'#' + anchor if anchor else ''})"
        shown = os.path.relpath(resolved, project_root())
        return text if text.strip("`") == shown else f"{text} (`{shown}`)"

    return _LINK.sub(replace, markdown)


# --------------------------------------------------------------------------------------------
# Offline MathJax
# --------------------------------------------------------------------------------------------
def vendor_mathjax(cache: Optional[Path] = None) -> Path:
    """MathJax's ``es5/`` folder from npm's ``mathjax`` package, verified and unpacked once.

    ``FEDLIB_MATHJAX_TGZ`` may point at a downloaded ``mathjax-<version>.tgz`` (for a machine
    without npm); otherwise ``npm pack`` fetches it from the npm registry. The tarball's sha512
    must match :data:`MATHJAX_INTEGRITY`. Returns the ``es5`` folder.
    """
    cache = Path(cache) if cache else project_root() / "build" / "vendor"
    target = cache / f"mathjax-{MATHJAX_VERSION}"
    if (target / "es5" / Path(MATHJAX_SCRIPT).name).exists():
        return target / "es5"
    cache.mkdir(parents=True, exist_ok=True)
    given = os.environ.get("FEDLIB_MATHJAX_TGZ")
    if given:
        tarball = Path(given)
        if not tarball.exists():
            raise FileNotFoundError(f"FEDLIB_MATHJAX_TGZ={given} does not exist")
    else:
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError(
                "the site renders its math offline with MathJax from npm, and npm was not found. Install "
                "Node.js with npm (Debian: apt-get install npm), or download "
                f"https://registry.npmjs.org/mathjax/-/mathjax-{MATHJAX_VERSION}.tgz and set FEDLIB_MATHJAX_TGZ "
                "to its path")
        done = subprocess.run([npm, "pack", f"mathjax@{MATHJAX_VERSION}", "--silent"], cwd=cache,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"npm pack mathjax@{MATHJAX_VERSION} failed:\n{done.stderr.strip()}")
        tarball = cache / f"mathjax-{MATHJAX_VERSION}.tgz"
    digest = "sha512-" + base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
    if digest != MATHJAX_INTEGRITY:
        raise ValueError(f"{tarball}: checksum {digest} is not the published {MATHJAX_INTEGRITY} of "
                         f"mathjax {MATHJAX_VERSION}; delete it and build again")
    partial = cache / f".mathjax-{MATHJAX_VERSION}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    with tarfile.open(tarball) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith("package/es5/") and m.isfile()]
        archive.extractall(partial, members=members, filter="data")
    shutil.rmtree(target, ignore_errors=True)
    (partial / "package").rename(target)
    shutil.rmtree(partial, ignore_errors=True)
    return target / "es5"


# --------------------------------------------------------------------------------------------
# The book
# --------------------------------------------------------------------------------------------
def _config_yml(variant: str) -> str:
    config = {
        "title": SITE_TITLE + (" (instructor edition)" if variant == "instructor" else ""),
        "author": "the fedlib authors",
        "copyright": "2026",
        "only_build_toc_files": True,
        "execute": {"execute_notebooks": "off"},
        "launch_buttons": {"binderhub_url": "", "jupyterhub_url": "", "colab_url": "", "thebe": False},
        "parse": {"myst_enable_extensions": ["dollarmath", "amsmath", "colon_fence", "linkify", "html_image"]},
        "sphinx": {"config": {
            # Jupyter Book's extensions without the two that reach the network: thebe (live code from
            # a CDN, and its script twice on every page) and the comment widgets.
            "extensions": ["sphinx_togglebutton", "sphinx_copybutton", "myst_nb", "jupyter_book",
                           "sphinx_external_toc", "sphinx_design", "sphinx_book_theme"],
            # default_mode: without it the theme's first script reads an empty mode and logs an error
            "html_context": {"default_mode": "light"},
            "html_theme_options": {"search_bar_text": "Search the course...",
                                   "use_download_button": True, "use_fullscreen_button": True,
                                   "use_repository_button": False},
            "mathjax_path": MATHJAX_SCRIPT,
            "html_favicon": f"{VENDOR_STATIC}/{FAVICON}",
            "html_css_files": [SITE_CSS],
            "html_static_path": [VENDOR_STATIC],
            "html_show_sourcelink": False,
            "nb_output_stderr": "show",
            "suppress_warnings": ["mystnb.unknown_mime_type"],
        }},
    }
    return json.dumps(config, indent=2, ensure_ascii=False)  # YAML 1.2 reads JSON


def _toc_yml(entries: list[LessonEntry], references: list[str]) -> str:
    lessons = []
    for entry in entries:
        item = {"file": entry.page}
        if entry.appendix:
            item["sections"] = [{"file": entry.appendix[1]}]
        lessons.append(item)
    toc = {
        "format": "jb-book",
        "root": "index",
        "parts": [
            {"caption": "Lessons", "chapters": lessons},
            {"caption": "Results", "chapters": [{"file": "results/index",
                                                  "sections": [{"file": f"results/{s}"} for s in PAPER_SLUGS]}]},
            {"caption": "Teaching", "chapters": [{"file": "instructors"}]},
            {"caption": "Reference", "chapters": [{"file": f"reference/{name}"} for name in references]},
        ],
    }
    return json.dumps(toc, indent=2)


def write_site_source(variant: str = "student", source_dir: Optional[Path] = None,
                      notebooks: Optional[list[NotebookInfo]] = None) -> Path:
    """Lay out the Jupyter Book of ``variant`` under ``source_dir`` (default ``build/site-src/<variant>``)."""
    import nbformat

    if variant not in VARIANTS:
        raise ValueError(f"unknown site variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    root = project_root()
    source_dir = Path(source_dir) if source_dir else root / "build" / "site-src" / variant
    notebooks = list_notebooks() if notebooks is None else notebooks
    entries = course_map(notebooks)
    if source_dir.exists():
        shutil.rmtree(source_dir)
    (source_dir / "appendix").mkdir(parents=True)

    site_paths: dict[Path, str] = {}
    for nb in notebooks:
        _require_executed(nb)
        page = f"appendix/{nb.stem}" if is_appendix(nb) else nb.stem
        notebook = site_notebook(nbformat.read(str(nb.paired), as_version=4), solutions=variant == "instructor")
        nbformat.write(notebook, str(source_dir / f"{page}.ipynb"))
        site_paths[nb.paired.resolve()] = f"{page}.ipynb"

    docs = root / "docs"
    names = [p.stem for p in sorted(docs.glob("*.md")) if p.stem != "instructors"]
    references = [n for n in REFERENCE_ORDER if n in names] + [n for n in names if n not in REFERENCE_ORDER]
    for name in references:
        site_paths[(docs / f"{name}.md").resolve()] = f"reference/{name}.md"
    site_paths[(docs / "instructors.md").resolve()] = "instructors.md"
    site_paths[(root / "README.md").resolve()] = "index.md"

    (source_dir / "reference").mkdir()
    for name in references:
        text = (docs / f"{name}.md").read_text()
        (source_dir / "reference" / f"{name}.md").write_text(
            rewrite_links(text, docs / f"{name}.md", site_paths, f"reference/{name}.md"))
    instructors = docs / "instructors.md"
    (source_dir / "instructors.md").write_text(
        rewrite_links(instructors.read_text(), instructors, site_paths, "instructors.md"))
    intro = rewrite_links(_readme_introduction(), root / "README.md", site_paths, "index.md")
    (source_dir / "index.md").write_text(home_page(entries, variant=variant, intro=intro))
    for relative, text in results_pages(root).items():
        (source_dir / relative).parent.mkdir(parents=True, exist_ok=True)
        (source_dir / relative).write_text(text)

    shutil.copytree(vendor_mathjax(), source_dir / VENDOR_STATIC / "mathjax")
    (source_dir / VENDOR_STATIC / FAVICON).write_text(_FAVICON_SVG)  # else browsers ask for a missing /favicon.ico
    (source_dir / VENDOR_STATIC / SITE_CSS).write_text(_SITE_CSS)
    (source_dir / "_config.yml").write_text(_config_yml(variant))
    (source_dir / "_toc.yml").write_text(_toc_yml(entries, references))
    return source_dir


def default_output(variant: str) -> Path:
    return project_root() / "build" / ("site" if variant == "student" else f"site-{variant}")


def build_site(variant: str = "student", output: Optional[Path] = None, *, quiet: bool = True) -> Path:
    """Build the site of ``variant`` into ``output`` (default ``build/site`` or ``build/site-instructor``).

    Runs ``jupyter-book build`` (Sphinx) on the source :func:`write_site_source` lays out; the
    output folder is replaced only when the build succeeded, so a failed build never leaves a
    half-written site. Returns the output folder (open its ``index.html``).
    """
    output = Path(output) if output else default_output(variant)
    source = write_site_source(variant)
    work = source.parent / f"{variant}-build"
    shutil.rmtree(work, ignore_errors=True)
    command = [sys.executable, "-c", "from jupyter_book.cli.main import main; main()", "build", str(source), "--path-output", str(work),
               "--builder", "html"]
    if quiet:
        command.append("--quiet")
    done = subprocess.run(command, capture_output=quiet, text=True, env={**os.environ, "PYDEVD_DISABLE_FILE_VALIDATION": "1"})
    html_dir = work / "_build" / "html"
    if done.returncode != 0 or not (html_dir / "index.html").exists():
        detail = (done.stderr or "") + (done.stdout or "") if quiet else ""
        raise RuntimeError(f"jupyter-book build of the {variant} site failed (exit {done.returncode}):\n{detail[-4000:]}")
    staged = output.with_name(output.name + ".partial")
    shutil.rmtree(staged, ignore_errors=True)
    shutil.copytree(html_dir, staged)
    shutil.rmtree(output, ignore_errors=True)
    staged.rename(output)
    return output
