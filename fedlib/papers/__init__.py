"""The papers: one subpackage per paper, its method, model pieces and experiment in one place.

A paper's folder (``fedlib/papers/<slug>/``) holds everything of that paper that no other
paper or baseline uses: the method's equations and its engine hooks, the model pieces only
it trains, the experiment specification (cells, parts, ``run_cell``, its grid command), and
the tables and figures built from its records; importing the folder registers the paper's
method by name in :mod:`fedlib.baselines.registry`. Shared pieces sit in the layers below
(``fedlib.experiments.grid``, ``fedlib.baselines``, ``fedlib.engine``, ...); the paper folders
never import each other (an import-linter ``independence`` contract in pyproject.toml).

:data:`GRID_COMMANDS` is the registry behind ``python -m fedlib grid <paper> <parts>
[--pending] [--rerun] [--seeds 0 1 2] ...``: paper slug -> the paper's grid command.
:func:`all_methods` is the whole method registry, every paper's own method included.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence

__all__ = ["GRID_COMMANDS", "grid_command", "all_methods"]


def _fedrkg(argv):
    from fedlib.papers.fedrkg import experiment
    return experiment.main(argv)


def _f3crec(argv):
    from fedlib.papers.f3crec import experiment
    return experiment.main(argv)


def _fedkdrec(argv):
    from fedlib.papers.fedkdrec import experiment
    return experiment.main(argv)


def _fedpcl_cdr(argv):
    from fedlib.papers.fedpcl_cdr import experiment
    return experiment.main(argv)


def _fedcsr(argv):
    from fedlib.papers.fedcsr import experiment
    return experiment.main(argv)


#: paper slug -> ``command(argv)``, the paper's resumable grid (:func:`fedlib.experiments.grid.grid_main`).
#: Each imports its paper's module only when called, so listing the papers loads no model code.
GRID_COMMANDS: Dict[str, Callable[[Optional[Sequence[str]]], object]] = {
    "fedrkg": _fedrkg, "f3crec": _f3crec, "fedkdrec": _fedkdrec, "fedpcl_cdr": _fedpcl_cdr, "fedcsr": _fedcsr,
}


def grid_command(paper: str) -> Callable[[Optional[Sequence[str]]], object]:
    """The grid command of ``paper``; a clear error for an unknown slug."""
    try:
        return GRID_COMMANDS[paper]
    except KeyError:
        raise ValueError(f"no grid for paper {paper!r}; the papers with a grid are {', '.join(GRID_COMMANDS)}") from None


def all_methods():
    """The whole registry of methods (:data:`fedlib.baselines.registry.METHODS`), the papers' own included.

    The baselines register when :mod:`fedlib.baselines.registry` is imported; each paper registers
    its method when its folder is imported, which this does for every paper with a grid."""
    import importlib

    from fedlib.baselines import registry

    for slug in GRID_COMMANDS:
        importlib.import_module(f"fedlib.papers.{slug}")
    return registry.METHODS
