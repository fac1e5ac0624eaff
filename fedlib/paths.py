"""Where things live: the project checkout, results, figures and the data root; which code it holds."""
from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from pathlib import Path

PAPER_SLUGS = ("fedrkg", "f3crec", "fedkdrec", "fedpcl_cdr", "fedcsr")
"""Paper slugs used for ``results/<slug>/``, ``figures/<slug>/`` and tests, in teaching order."""

INTRO_SLUG = "intro"
"""Slug of notebook 00 (federated recommendation from scratch)."""


def project_root() -> Path:
    """The checkout that holds ``fedlib/``, ``notebooks/`` and ``results/``.

    ``FEDLIB_PROJECT_ROOT`` overrides it (for an installed, non-editable fedlib).
    """
    env = os.environ.get("FEDLIB_PROJECT_ROOT")
    if env:
        return Path(env).resolve()
    return Path(__file__).resolve().parent.parent


#: Environment variable naming another folder to hold the run records and tables instead of
#: ``<project root>/results`` (``python -m fedlib grid ... --results-dir`` sets it; tests use a
#: temporary one so that they never append to the committed records).
RESULTS_DIR_ENV = "FEDLIB_RESULTS_DIR"


def results_root() -> Path:
    """``<project root>/results``, or the folder ``FEDLIB_RESULTS_DIR`` names."""
    env = os.environ.get(RESULTS_DIR_ENV)
    return Path(env).expanduser().resolve() if env else project_root() / "results"


def results_dir(paper: str, profile: str) -> Path:
    """``results/<paper>/`` for the ``paper`` profile, ``results/<paper>/<profile>/`` otherwise.

    Only ``paper``-profile runs write the recorded tables; ``quick`` and ``smoke`` runs
    write below their own sub-folder and can never overwrite them. ``results/`` is
    :func:`results_root`.
    """
    _check_slug(paper)
    base = results_root() / paper
    return base if profile == "paper" else base / profile


def figures_dir(paper: str, profile: str) -> Path:
    """``figures/<paper>/`` for ``quick`` and ``paper`` runs; ``figures/<paper>/smoke/`` for smoke.

    Smoke runs exist for tests: they must not overwrite the committed figures.
    """
    _check_slug(paper)
    base = project_root() / "figures" / paper
    return base / "smoke" if profile == "smoke" else base


def _check_slug(paper: str) -> None:
    if paper not in PAPER_SLUGS + (INTRO_SLUG,):
        raise ValueError(
            f"unknown paper slug {paper!r}; expected one of {', '.join(PAPER_SLUGS + (INTRO_SLUG,))}"
        )


# --------------------------------------------------------------------------------------
# Which code a run ran
# --------------------------------------------------------------------------------------
_GIT_TIMEOUT_S = 10
# Outputs a run writes (results, figures, executed notebooks) do not make the code "dirty".
# executed notebooks at any depth (lessons and notebooks/appendix/): a glob "*" stops at "/"
_PROVENANCE_ONLY_FOLDERS = ("results", "figures", "notebooks/**/*.ipynb", "README.md")


def current_commit(root: str | Path | None = None) -> str:
    """Short commit of the project checkout, ``+dirty`` when tracked code has changes.

    Changes under ``results/`` and ``figures/`` do not count: appending to a committed
    ``runs.jsonl`` is exactly what a paper-profile run does, and must not mark every
    following run dirty. Returns ``"unknown"`` when ``root`` is not the top of a git
    checkout (an installed copy, a temporary project root) or git is unavailable.
    """
    root_path = Path(root) if root is not None else project_root()

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=root_path, capture_output=True, text=True, check=True, timeout=_GIT_TIMEOUT_S
        ).stdout.strip()

    try:
        top_level = git("rev-parse", "--show-toplevel")
        if Path(top_level).resolve() != root_path.resolve():
            return "unknown"
        sha = git("rev-parse", "--short", "HEAD")
        excludes = [f":(exclude,glob){folder}" if "*" in folder else f":(exclude){folder}" for folder in _PROVENANCE_ONLY_FOLDERS]
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", *excludes)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


@functools.lru_cache(maxsize=None)
def source_fingerprint(package: str | Path | None = None) -> str:
    """SHA-256 (first 16 hex digits) of every ``*.py`` file under the ``fedlib/`` package.

    What a checkpoint records of the code that wrote it (:class:`fedlib.engine.Checkpointer`):
    resuming under other code would mix two versions in one run. Unlike :func:`current_commit`
    it needs no git and sees uncommitted changes. Computed once per process (the code a process
    runs is the code it imported). ``package``: another package folder (tests).
    """
    root = Path(package) if package is not None else Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode("utf-8") + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
