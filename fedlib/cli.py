"""``python -m fedlib``: list datasets, notebooks and profiles; run notebooks; inspect data.

Examples::

    python -m fedlib list                          # datasets, notebooks, profiles
    python -m fedlib run 00 --profile smoke        # execute notebook 00 at the smoke profile
    python -m fedlib run 02_f3crec --in-place      # refresh the committed .ipynb (quick profile)
    python -m fedlib run --all --in-place          # every notebook (what ./run notebooks does)
    python -m fedlib profiles 00                   # every setting under every profile
    python -m fedlib data list                     # dataset status under $FEDLIB_DATA
    python -m fedlib data stats ml-100k --protocol f3crec
    python -m fedlib status --write-readme         # rebuild the README status table
    python -m fedlib course build                  # build/course/student and build/course/instructor
    python -m fedlib course budget                 # each lesson's cells, output size and time
    python -m fedlib site [--instructor]           # the course website in build/site/
    python -m fedlib grid fedcsr table2 --pending  # what is left of a paper-profile grid
    python -m fedlib grid fedrkg table1 --seeds 0 1 2 3 4   # run it (resumable)
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from fedlib.notebook.profiles import DEFAULT_PROFILE, PROFILE_DESCRIPTIONS, PROFILES


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fedlib",
        description=textwrap.dedent(
            """\
            fedlib: federated recommendation, one notebook per paper.

            Notebooks live in notebooks/NN_name.py (jupytext percent format, the source of
            truth) with a paired .ipynb carrying the outputs of a real quick-profile run.
            Each runs at one of three profiles:
            """
        )
        + "".join(f"  {p:<6} {d}\n" for p, d in PROFILE_DESCRIPTIONS.items())
        + textwrap.dedent(
            """
            Environment:
              FEDLIB_DATA      data root (default ~/.cache/fedlib/data); CI uses ../shared/data
              FEDLIB_OFFLINE   1 = never download; a missing file is an error naming it
              FEDLIB_PROFILE   default profile for notebooks (smoke|quick|paper)
              FEDLIB_DEVICE    force a device (cpu, cuda, cuda:1); default: CUDA when present
            """
        ),
        epilog=__doc__.split("Examples::", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p_list = sub.add_parser("list", help="list datasets, notebooks and profiles")
    p_list.set_defaults(func=_cmd_list)

    p_run = sub.add_parser(
        "run",
        help="execute a notebook headlessly at a profile",
        description="Execute a notebook from its .py source with papermill. By default the executed "
        "notebook goes to build/notebooks/<profile>/; --in-place refreshes the committed .ipynb "
        "(quick profile only).",
    )
    p_run.add_argument("notebook", nargs="?", help="notebook number or name, e.g. 00 or 02_f3crec")
    p_run.add_argument("--all", action="store_true", help="run every notebook in teaching order")
    p_run.add_argument(
        "--profile", choices=PROFILES, default=None, help=f"profile (default: $FEDLIB_PROFILE or {DEFAULT_PROFILE})"
    )
    target = p_run.add_mutually_exclusive_group()
    target.add_argument("--output", help="path of the executed notebook (one notebook only)")
    target.add_argument("--in-place", action="store_true", help="overwrite the committed notebooks/NN_name.ipynb")
    p_run.add_argument("--log-output", action="store_true", help="stream cell output to the terminal")
    p_run.add_argument("--timeout", type=int, default=None, help="per-cell timeout in seconds")
    p_run.set_defaults(func=_cmd_run)

    p_prof = sub.add_parser("profiles", help="show every setting of a notebook under every profile")
    p_prof.add_argument("notebook", help="notebook number or name")
    p_prof.set_defaults(func=_cmd_profiles)

    p_pair = sub.add_parser("check-pairing", help="check that every .ipynb matches its .py source")
    p_pair.set_defaults(func=_cmd_check_pairing)

    p_exp = sub.add_parser("expected", help="fill a notebook's expected quick-profile values from a seed sweep",
                           description="Rewrite tests/expected_quick/<notebook>.toml: expected = the seed-0 run's "
                           "value, tolerance = max(3 x std over the runs, the check's floor). Execute the notebook "
                           "at quick once per seed first, e.g. FEDLIB_OVERRIDE='{\"seed\": 1}' fedlib run 03 "
                           "--output /tmp/03_s1.ipynb.")
    p_exp.add_argument("notebook", help="notebook number or name, e.g. 03 or 03_fedkdrec")
    p_exp.add_argument("executed", nargs="+", type=Path, help="the executed .ipynb files, seed 0 first")
    p_exp.add_argument("--seeds", nargs="+", type=int, help="the seed of each file (default 0 1 2 ...)")
    p_exp.set_defaults(func=_cmd_expected)

    p_course = sub.add_parser("course", help="student/instructor copies of the lessons; lesson budgets")
    course_sub = p_course.add_subparsers(dest="course_command", metavar="ACTION", required=True)
    p_build = course_sub.add_parser("build", help="write build/course/student (no solution cells) and build/course/instructor")
    p_build.add_argument("--output", type=Path, default=None, help="folder to write (default build/course)")
    p_build.set_defaults(func=_cmd_course_build)
    p_budget = course_sub.add_parser("budget", help="code cells, longest cell, text output and recorded time per notebook")
    p_budget.set_defaults(func=_cmd_course_budget)

    p_site = sub.add_parser("site", help="the course website (Jupyter Book) from the executed notebooks: build/site/")
    p_site.add_argument("--instructor", action="store_true",
                        help="the instructor edition, with the solution cells (default output build/site-instructor)")
    p_site.add_argument("--output", type=Path, default=None, help="folder to write (default build/site)")
    p_site.set_defaults(func=_cmd_site)

    p_grid = sub.add_parser(
        "grid", help="run (or list what is left of) parts of a paper's paper-profile grid",
        description="Run parts of a paper's recorded grid, resumably: every finished cell is appended to "
        "results/<paper>/runs.jsonl and skipped next time. Everything after the paper is the paper's own "
        "options: python -m fedlib grid <paper> --help lists them (parts, --pending, --rerun, --seeds, filters).",
        add_help=False)
    p_grid.add_argument("paper", help="paper slug: " + ", ".join(_grid_papers()))
    p_grid.add_argument("options", nargs=argparse.REMAINDER, help="the paper's grid options")
    p_grid.set_defaults(func=_cmd_grid)

    _add_optional_commands(sub)
    return parser


def _grid_papers():
    from fedlib.papers import GRID_COMMANDS

    return list(GRID_COMMANDS)


def _cmd_grid(args) -> int:
    from fedlib.papers import grid_command

    try:
        command = grid_command(args.paper)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    command(list(args.options))
    return 0


def _cmd_course_build(args) -> int:
    from fedlib.notebook.course import build_course, is_solution

    targets = build_course(args.output)
    import nbformat

    for kind, folder in targets.items():
        notebooks = sorted(folder.rglob("*.ipynb"))
        solutions = sum(is_solution(c) for path in notebooks for c in nbformat.read(str(path), as_version=4).cells)
        print(f"{kind:<10} {folder}  ({len(notebooks)} notebooks, {solutions} solution cells)")
    return 0


def _cmd_site(args) -> int:
    import time

    from fedlib.notebook.site import build_site

    variant = "instructor" if args.instructor else "student"
    start = time.perf_counter()
    try:
        output = build_site(variant, args.output)
    except (FileNotFoundError, RuntimeError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    pages = len(list(output.rglob("*.html")))
    print(f"{variant} site: {pages} pages in {output} ({time.perf_counter() - start:.0f} s); "
          f"open {output / 'index.html'} or serve it: python -m http.server -d {output}")
    return 0


def _cmd_course_budget(args) -> int:
    from fedlib.notebook.course import (MAX_CELL_LINES, MAX_CODE_CELLS, MAX_QUICK_MINUTES,
                                        MAX_TEXT_OUTPUT_CHARS, budget_frame)

    frame = budget_frame()
    print(frame.to_string(index=False))
    print(f"\nlimits: {MAX_CODE_CELLS} code cells (solutions not counted), {MAX_CELL_LINES} lines per code cell, "
          f"{MAX_TEXT_OUTPUT_CHARS:,} characters of text output, {MAX_QUICK_MINUTES} min per lesson at quick "
          "(times as recorded by papermill in the committed quick run; measure on an idle machine)")
    return 1 if frame["problems"].astype(bool).any() else 0


def _add_optional_commands(sub) -> None:
    """Commands contributed by the data and reporting layers."""
    from fedlib.data.cli import add_data_commands
    from fedlib.reporting.status import add_status_command

    add_data_commands(sub)
    add_status_command(sub)


def _cmd_list(args) -> int:
    from fedlib.notebook.runner import list_notebooks

    print("Notebooks (teaching order):")
    for nb in list_notebooks():
        state = "executed" if nb.paired.exists() else "not executed"
        print(f"  {nb.stem:<26} {nb.title}  [{state}]")
    print("\nProfiles:")
    for name, description in PROFILE_DESCRIPTIONS.items():
        print(f"  {name:<6} {description}")
    print("\nDatasets (status under the data root; details: python -m fedlib data list):")
    from fedlib.data import data_root, dataset_status, list_specs

    for spec in list_specs():
        print(f"  {spec.id:<32} {dataset_status(spec)}")
    print(f"\nData root: {data_root()} (set FEDLIB_DATA to change)")
    return 0


def _cmd_run(args) -> int:
    from fedlib.notebook.runner import list_notebooks, run_notebook

    if args.all == bool(args.notebook):
        print("give a notebook name or --all (not both)", file=sys.stderr)
        return 2
    names = [nb.stem for nb in list_notebooks()] if args.all else [args.notebook]
    if args.output and args.all:
        print("--output takes one notebook; use --in-place or the default build/ folder with --all", file=sys.stderr)
        return 2
    import time

    times = []
    for name in names:
        began = time.perf_counter()
        run_notebook(
            name,
            args.profile,
            output=args.output,
            in_place=args.in_place,
            log_output=args.log_output,
            timeout_s=args.timeout,
        )
        times.append((name, time.perf_counter() - began))
    if len(times) > 1:
        print("\nwall time per notebook (this machine, now; budgets are judged on an idle machine):")
        for name, seconds in times:
            print(f"  {name:<32} {seconds:7.1f} s")
    return 0


def _cmd_profiles(args) -> int:
    from fedlib.notebook.profiles import settings_frame
    from fedlib.notebook.runner import find_notebook

    nb = find_notebook(args.notebook)
    print(settings_frame(nb.stem).to_string())
    return 0


def _cmd_expected(args) -> int:
    from fedlib.notebook.expected import refresh
    from fedlib.notebook.runner import find_notebook

    print(f"wrote {refresh(find_notebook(args.notebook).stem, args.executed, args.seeds)}")
    return 0


def _cmd_check_pairing(args) -> int:
    from fedlib.notebook.runner import list_notebooks, pairing_problems

    problems = [p for nb in list_notebooks() for p in pairing_problems(nb)]
    for problem in problems:
        print(problem)
    print("all notebooks match their sources" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
