"""Every lesson follows the lesson standard: its sections in order, source next to equations,
exercises with solutions, and the size budgets (cells, lines, text output).

Times are not asserted here (the machines are shared and noisy): ``python -m fedlib course
budget`` reports them from the committed quick runs.
"""
import re

import nbformat
import pytest

from fedlib.notebook.course import build_course, is_solution, measure, strip_solutions
from fedlib.notebook.runner import is_appendix, list_notebooks

LESSONS = [nb for nb in list_notebooks() if not is_appendix(nb)]
APPENDICES = [nb for nb in list_notebooks() if is_appendix(nb)]
PAPER_LESSONS = [nb for nb in LESSONS if not nb.stem.startswith("00_")]

# Lessons still being rewritten from reproduction reports into lessons. A lesson leaves this
# set in the change that converts it; strict xfail makes a converted lesson that is still
# listed here fail, so the set cannot go stale.
PENDING: set[str] = set()

SECTIONS = [  # (what the heading must say, regex) in the lesson order
    ("the problem and the setting", r"^# ## .*(problem|setting)"),
    ("the method from its equations", r"^# ## .*equation"),
    ("train it live", r"^# ## .*live"),
    ("the paper's tables and figures", r"^# ## .*(table|figure)"),
    ("the audit", r"^# ## .*audit"),
    ("takeaways", r"^# ## .*takeaway"),
    ("review questions", r"^# ##+ .*question"),
    ("exercises", r"^# ##+ .*exercise"),
]


def pending(nb):
    marks = [pytest.mark.xfail(strict=True, reason="lesson conversion in progress (issue: lessons first)")]
    return pytest.param(nb, id=nb.stem, marks=marks if nb.stem in PENDING else [])


def _front_matter(nb) -> str:
    text = nb.source.read_text()
    first_heading = text.index("# # ")
    first_code = text.index("# %%\n", first_heading)
    return text[first_heading:first_code]


def _section(text: str, heading_regex: str) -> str:
    match = re.search(heading_regex, text, re.M | re.I)
    assert match, heading_regex
    rest = text[match.end():]
    following = re.search(r"^# ##+ ", rest, re.M)
    return rest[: following.start()] if following else rest


@pytest.mark.parametrize("nb", [pending(nb) for nb in LESSONS])
def test_front_matter(nb):
    front = _front_matter(nb)
    for part in ("Learning objectives", "Prerequisites", "Time", "Glossary"):
        assert re.search(rf"^# #+ .*{part}|\*\*{part}", front, re.M | re.I), f"{nb.stem}: front matter lacks '{part}'"
    objectives = _section(front, r"^# #+ .*Learning objectives|\*\*Learning objectives")
    assert 3 <= len(re.findall(r"^# (\d+\.|-|\*) ", objectives, re.M)) <= 5, "3-5 learning objectives"
    if nb in PAPER_LESSONS:
        assert re.search(r"https?://(doi\.org|arxiv\.org|openreview\.net|aclanthology\.org|dl\.acm\.org|ieeexplore|link\.springer|www\.)", front), \
            f"{nb.stem}: the citation needs a DOI, arXiv or publisher link"


@pytest.mark.parametrize("nb", [pending(nb) for nb in LESSONS])
def test_sections_in_the_lesson_order(nb):
    text = nb.source.read_text()
    positions = []
    for name, regex in SECTIONS:
        if name == "the paper's tables and figures" and nb not in PAPER_LESSONS:
            continue
        match = re.search(regex, text, re.M | re.I)
        assert match, f"{nb.stem}: no section heading for {name!r} (regex {regex})"
        positions.append((match.start(), name))
    assert positions == sorted(positions), f"{nb.stem}: sections out of order: {[n for _, n in sorted(positions)]}"


@pytest.mark.parametrize("nb", [pending(nb) for nb in LESSONS])
def test_equations_are_followed_by_their_source(nb):
    notebook = nbformat.read(str(nb.paired), as_version=4)
    shown = [c for c in notebook.cells if c.cell_type == "code" and "fnb.show_source(" in c.source]
    assert len(shown) >= 3, f"{nb.stem}: at least three equations with their implementing source displayed"
    for cell in shown:
        markdown = [o for o in cell.get("outputs", []) if "text/markdown" in o.get("data", {})]
        assert markdown, f"{nb.stem}: a show_source cell produced no source display"
    assert len(re.findall(r"\$\$", nb.source.read_text())) >= 6, f"{nb.stem}: at least three display equations"


@pytest.mark.parametrize("nb", [pending(nb) for nb in LESSONS])
def test_takeaways_questions_and_exercises(nb):
    text = nb.source.read_text()
    takeaways = _section(text, r"^# ## .*takeaway")
    assert len(re.findall(r"^# (\d+\.|-) ", takeaways, re.M)) == 5, f"{nb.stem}: five takeaways"
    questions = _section(text, r"^# ##+ .*question")
    assert 8 <= len(re.findall(r"^# \d+\. ", questions, re.M)) <= 10, f"{nb.stem}: 8-10 review questions"
    notebook = nbformat.read(str(nb.paired), as_version=4)
    solutions = [c for c in notebook.cells if is_solution(c)]
    assert len(solutions) >= 4, f"{nb.stem}: at least four exercises with cells tagged 'solution'"
    assert all(c.cell_type == "code" and c.get("outputs") for c in solutions if c.cell_type == "code"), \
        f"{nb.stem}: solution cells are executed in the committed quick run"


@pytest.mark.parametrize("nb", [pending(nb) for nb in LESSONS] + [pytest.param(nb, id=nb.stem) for nb in APPENDICES])
def test_size_budget(nb):
    assert measure(nb).problems() == []


@pytest.mark.parametrize("nb", [pytest.param(nb, id=nb.stem, marks=[pytest.mark.xfail(
    strict=False, reason="lesson conversion in progress")] if nb.stem in PENDING else []) for nb in LESSONS + APPENDICES])
def test_no_path_of_the_development_checkout(nb):
    for path in (nb.source, nb.paired):
        assert not re.search(r"shared/(seeds|notes)", path.read_text()), \
            f"{path.name} cites ../shared/...: cite the paper by authors, venue, year and link"


def test_stripping_removes_every_solution_cell_and_nothing_else():
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_markdown_cell("# Exercise 1"),
        nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["solution"]}),
        nbformat.v4.new_code_cell("y = 2", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_markdown_cell("**Solution.**", metadata={"tags": ["solution", "other"]}),
        nbformat.v4.new_code_cell("z = 3"),
    ]
    notebook.cells[4].outputs = [nbformat.v4.new_output("stream", text="3\n")]
    student = strip_solutions(notebook)
    assert [c.source for c in student.cells] == ["# Exercise 1", "y = 2", "z = 3"]
    assert student.cells[2].outputs == notebook.cells[4].outputs
    assert len(notebook.cells) == 5, "stripping must not change the instructor's notebook"


def test_student_build_has_no_solution_cell_and_instructor_build_has_all(tmp_path):
    targets = build_course(tmp_path)
    for nb in list_notebooks():
        committed = nbformat.read(str(nb.paired), as_version=4)
        relative = ("appendix/" if is_appendix(nb) else "") + nb.paired.name
        instructor = nbformat.read(str(targets["instructor"] / relative), as_version=4)
        student = nbformat.read(str(targets["student"] / relative), as_version=4)
        assert instructor.cells == committed.cells
        assert not any(is_solution(c) for c in student.cells)
        assert student.cells == [c for c in committed.cells if not is_solution(c)]
