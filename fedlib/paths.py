"""Where things live: the project checkout, results, figures and the data root."""
from __future__ import annotations

import os
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
