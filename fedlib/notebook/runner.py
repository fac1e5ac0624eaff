"""Execute a notebook headlessly at a profile (papermill), from its jupytext source.

The ``.py`` (percent format) is the source of truth. The runner converts it to a
notebook, executes it with papermill in ``notebooks/`` with ``FEDLIB_PROFILE`` set, and
writes the executed notebook to an output path. The committed ``.ipynb`` is replaced
only when asked (``in_place=True``), and only after a successful run: a failing run never
leaves a half-executed committed notebook behind.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from fedlib.notebook.profiles import PROFILES, resolve_profile
from fedlib.paths import project_root

NOTEBOOK_NAME = re.compile(r"^(\d\d)_[a-z0-9_]+$")


@dataclass(frozen=True)
class NotebookInfo:
    """One paper notebook: ``notebooks/<stem>.py`` and its paired ``.ipynb``."""

    stem: str
    source: Path
    paired: Path
    title: str

    @property
    def number(self) -> str:
        return self.stem[:2]


def notebooks_dir() -> Path:
    return project_root() / "notebooks"


def appendix_dir() -> Path:
    return notebooks_dir() / "appendix"


def list_notebooks(*, appendices: bool = True) -> list[NotebookInfo]:
    """Every lesson ``notebooks/NN_name.py`` in teaching order, each followed by its appendix
    ``notebooks/appendix/NN_name_appendix.py`` when there is one (``appendices=False``: lessons only)."""
    lessons = [source for source in sorted(notebooks_dir().glob("*.py")) if NOTEBOOK_NAME.match(source.stem)]
    extra = sorted(appendix_dir().glob("*.py")) if appendices else []
    found = []
    for source in lessons:
        found.append(NotebookInfo(source.stem, source, source.with_suffix(".ipynb"), _title_of(source)))
        for appendix in extra:
            if appendix.stem.startswith(source.stem[:3]) and NOTEBOOK_NAME.match(appendix.stem):
                found.append(NotebookInfo(appendix.stem, appendix, appendix.with_suffix(".ipynb"), _title_of(appendix)))
    return found


def is_appendix(nb: NotebookInfo) -> bool:
    return nb.source.parent.resolve() == appendix_dir().resolve()


def _title_of(source: Path) -> str:
    for line in source.read_text().splitlines():
        match = re.match(r"^#\s+#\s+(.+)$", line)  # first markdown heading "# # Title"
        if match:
            return match.group(1).strip()
    return source.stem


def find_notebook(name: str) -> NotebookInfo:
    """Resolve ``"00"``, ``"00_fedrec_from_scratch"``, ``"01_fedrkg_appendix"`` or a path to a notebook."""
    notebooks = list_notebooks()
    candidate = Path(name)
    for nb in notebooks:  # a bare number names the lesson, never its appendix
        if name == nb.stem or (name == nb.number and not is_appendix(nb)) \
                or candidate.resolve() in (nb.source.resolve(), nb.paired.resolve()):
            return nb
    known = ", ".join(nb.stem for nb in notebooks) or "(none)"
    raise FileNotFoundError(f"no notebook {name!r} in {notebooks_dir()}; known notebooks: {known}")


def source_as_notebook(nb: NotebookInfo):
    """The ``.py`` source read as an nbformat notebook, with the python3 kernel."""
    import jupytext

    notebook = jupytext.read(nb.source)
    notebook.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    notebook.metadata.setdefault("jupytext", {})["formats"] = "ipynb,py:percent"
    return notebook


def default_output(nb: NotebookInfo, profile: str) -> Path:
    return project_root() / "build" / "notebooks" / profile / f"{nb.stem}.ipynb"


def run_notebook(
    name: str,
    profile: Optional[str] = None,
    *,
    output: Optional[Path] = None,
    in_place: bool = False,
    log_output: bool = False,
    progress_bar: bool = True,
    timeout_s: Optional[int] = None,
    extra_env: Optional[dict] = None,
) -> Path:
    """Execute notebook ``name`` at ``profile`` and return the executed notebook's path.

    Args:
        output: where to write the executed notebook (default ``build/notebooks/<profile>/``).
        in_place: write the committed ``notebooks/<stem>.ipynb`` instead (refreshing its
            outputs). Only the ``quick`` profile may do this: the committed outputs are
            the ones nbval compares against and readers see.
        timeout_s: per-cell timeout.
    """
    import nbformat
    import papermill

    nb = find_notebook(name)
    profile = resolve_profile(profile)
    if in_place and output is not None:
        raise ValueError("give either output= or in_place=True, not both")
    if in_place and profile != "quick":
        raise ValueError(
            f"refusing to overwrite {nb.paired.name} with a {profile!r} run: committed notebooks carry "
            "quick-profile outputs. Use --output PATH for other profiles."
        )
    target = nb.paired if in_place else Path(output) if output else default_output(nb, profile)
    target.parent.mkdir(parents=True, exist_ok=True)

    work = Path(tempfile.mkdtemp(prefix=f"fedlib-{nb.stem}-"))
    source_ipynb = work / f"{nb.stem}.source.ipynb"
    executed = work / f"{nb.stem}.ipynb"
    nbformat.write(source_as_notebook(nb), source_ipynb)

    saved_env = {k: os.environ.get(k) for k in ["FEDLIB_PROFILE", *(extra_env or {})]}
    os.environ["FEDLIB_PROFILE"] = profile  # the kernel inherits this environment
    os.environ.update({k: str(v) for k, v in (extra_env or {}).items()})
    began = time.perf_counter()
    try:
        papermill.execute_notebook(
            str(source_ipynb),
            str(executed),
            kernel_name="python3",
            cwd=str(nb.source.parent),  # as nbval and JupyterLab run it
            progress_bar=progress_bar,
            log_output=log_output,
            execution_timeout=timeout_s,
        )
    except Exception:
        failed = target.with_name(f"{nb.stem}.FAILED.ipynb") if not in_place else default_output(nb, profile).with_name(f"{nb.stem}.FAILED.ipynb")
        failed.parent.mkdir(parents=True, exist_ok=True)
        if executed.exists():
            shutil.copyfile(executed, failed)
            print(f"the failing notebook (with the traceback) was written to {failed}")
        raise
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    _strip_volatile_metadata(executed)
    tmp_target = target.with_name(f".{target.name}.tmp")
    shutil.copyfile(executed, tmp_target)
    os.replace(tmp_target, target)  # atomic: the committed notebook is never half-written
    shutil.rmtree(work, ignore_errors=True)
    print(f"{nb.stem}: executed at profile {profile!r} in {time.perf_counter() - began:.1f} s -> {target}")
    return target


def _strip_volatile_metadata(path: Path) -> None:
    """Drop papermill's input/output paths (machine-specific temp dirs) from the metadata."""
    import nbformat

    notebook = nbformat.read(str(path), as_version=4)
    pm = notebook.metadata.get("papermill", {})
    for key in ("input_path", "output_path"):
        pm.pop(key, None)
    nbformat.write(notebook, str(path))


def code_cells(notebook) -> list[str]:
    """Sources of the code cells, ignoring papermill's injected-parameters cell."""
    sources = []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        if "injected-parameters" in cell.get("metadata", {}).get("tags", []):
            continue
        sources.append(cell.source.rstrip())
    return sources


def pairing_problems(nb: NotebookInfo) -> list[str]:
    """Differences between a notebook's ``.py`` source and its committed ``.ipynb``."""
    import nbformat

    if not nb.paired.exists():
        return [f"{nb.paired.name} is missing: run ./run notebooks (or python -m fedlib run {nb.stem} --in-place)"]
    source = code_cells(source_as_notebook(nb))
    committed = code_cells(nbformat.read(str(nb.paired), as_version=4))
    problems = []
    if len(source) != len(committed):
        problems.append(f"{nb.stem}: {len(source)} code cells in .py but {len(committed)} in .ipynb")
    for index, (a, b) in enumerate(zip(source, committed)):
        if a != b:
            first_a = a.splitlines()[0] if a else ""
            problems.append(f"{nb.stem}: code cell {index} differs between .py and .ipynb (cell starts {first_a!r})")
    return problems


def check_profile_name(profile: str) -> str:
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    return profile
