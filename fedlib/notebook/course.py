"""The course: student and instructor copies of the executed lessons, and the lesson budgets.

``python -m fedlib course build`` writes

* ``build/course/instructor/``: every executed lesson and appendix, as committed;
* ``build/course/student/``: the same notebooks with every cell tagged ``solution``
  removed, and nothing else changed (other outputs stay, so figures are still there).

``python -m fedlib course budget`` measures each committed notebook against the lesson
standard's size limits (code cells, lines per cell, characters of text output, and the
per-cell and total execution time papermill recorded in the ``quick`` run).
"""
from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from fedlib.notebook.records import RECORD_MIME
from fedlib.notebook.runner import NotebookInfo, is_appendix, list_notebooks
from fedlib.paths import project_root

SOLUTION_TAG = "solution"
MAX_CODE_CELLS = 45
MAX_CELL_LINES = 25
MAX_TEXT_OUTPUT_CHARS = 60_000
MAX_QUICK_MINUTES = 8
MAX_TRAINING_CELL_S = 120


def is_solution(cell) -> bool:
    return SOLUTION_TAG in cell.get("metadata", {}).get("tags", [])


def strip_solutions(notebook):
    """A copy of ``notebook`` without its ``solution`` cells; every other cell untouched."""
    import copy

    student = copy.deepcopy(notebook)
    student.cells = [cell for cell in student.cells if not is_solution(cell)]
    return student


def build_course(out_dir: Optional[Path] = None, notebooks: Optional[list[NotebookInfo]] = None) -> dict[str, Path]:
    """Write the student and instructor copies; return ``{"student": dir, "instructor": dir}``.

    Raises ``FileNotFoundError`` naming the notebook when a lesson has no executed
    ``.ipynb`` (run ``./run notebooks`` first): a course is built from executed lessons only.
    """
    import nbformat

    out_dir = Path(out_dir) if out_dir else project_root() / "build" / "course"
    notebooks = list_notebooks() if notebooks is None else notebooks
    missing = [nb.paired for nb in notebooks if not nb.paired.exists()]
    if missing:
        raise FileNotFoundError(f"not executed yet: {', '.join(str(p) for p in missing)}; run ./run notebooks first")
    targets = {"student": out_dir / "student", "instructor": out_dir / "instructor"}
    for target in targets.values():
        if target.exists():
            shutil.rmtree(target)
        (target / "appendix").mkdir(parents=True)
    for nb in notebooks:
        notebook = nbformat.read(str(nb.paired), as_version=4)
        relative = Path("appendix", nb.paired.name) if is_appendix(nb) else Path(nb.paired.name)
        nbformat.write(notebook, str(targets["instructor"] / relative))
        nbformat.write(strip_solutions(notebook), str(targets["student"] / relative))
    return targets


@dataclass(frozen=True)
class LessonBudget:
    """Size and time of one executed notebook, measured on its committed ``.ipynb``."""

    notebook: str
    code_cells: int              # code cells without solution cells
    solution_cells: int
    longest_cell_lines: int      # lines of the longest code cell (solutions included)
    text_output_chars: int       # stream + text/* outputs; images and records excluded
    total_s: Optional[float]     # papermill's recorded execution time, all cells
    slowest_cell_s: Optional[float]

    def problems(self) -> list[str]:
        """The lesson standard's structural limits this notebook exceeds (times are reported, not judged)."""
        found = []
        if self.code_cells > MAX_CODE_CELLS:
            found.append(f"{self.code_cells} code cells (at most {MAX_CODE_CELLS}, solutions not counted)")
        if self.longest_cell_lines > MAX_CELL_LINES:
            found.append(f"a code cell of {self.longest_cell_lines} lines (at most {MAX_CELL_LINES})")
        if self.text_output_chars > MAX_TEXT_OUTPUT_CHARS:
            found.append(f"{self.text_output_chars:,} characters of text output (at most {MAX_TEXT_OUTPUT_CHARS:,})")
        return found


def text_output_chars(cell) -> int:
    """Characters of a cell's stream and ``text/*`` outputs (``text/html`` included).

    Recorded-metric outputs (:data:`RECORD_MIME`) and images do not count. A display with
    both ``text/html`` and ``text/plain`` counts the larger one: a reader sees one of them.
    """
    total = 0
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            total += len("".join(output.get("text", "")))
            continue
        data = output.get("data", {})
        if RECORD_MIME in data:
            continue
        if any(key.startswith("image/") for key in data):
            continue
        sizes = [len("".join(value)) if isinstance(value, list) else len(str(value))
                 for key, value in data.items() if key.startswith("text/")]
        total += max(sizes, default=0)
    return total


def measure(nb: NotebookInfo) -> LessonBudget:
    """The :class:`LessonBudget` of a notebook's committed ``.ipynb``."""
    import nbformat

    notebook = nbformat.read(str(nb.paired), as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"
            and "injected-parameters" not in cell.get("metadata", {}).get("tags", [])]
    durations = [cell.get("metadata", {}).get("papermill", {}).get("duration") for cell in code]
    durations = [float(d) for d in durations if isinstance(d, (int, float))]
    return LessonBudget(
        notebook=nb.stem,
        code_cells=sum(not is_solution(cell) for cell in code),
        solution_cells=sum(is_solution(cell) for cell in code),
        longest_cell_lines=max((len(cell.source.rstrip().splitlines()) for cell in code), default=0),
        text_output_chars=sum(text_output_chars(cell) for cell in code),
        total_s=round(sum(durations), 1) if durations else None,
        slowest_cell_s=round(max(durations), 1) if durations else None,
    )


def budget_frame(notebooks: Optional[list[NotebookInfo]] = None):
    """One row per notebook: its :class:`LessonBudget` and the limits it exceeds."""
    import pandas as pd

    rows = []
    for nb in list_notebooks() if notebooks is None else notebooks:
        if not nb.paired.exists():
            continue
        budget = measure(nb)
        rows.append({**asdict(budget), "problems": "; ".join(budget.problems())})
    return pd.DataFrame(rows)
