"""The papers: one subpackage per paper, its method, model pieces and experiment in one place.

A paper's folder (``fedlib/papers/<slug>/``) holds everything of that paper that no other
paper or baseline uses: the method's equations and its engine hooks, the model pieces only
it trains, the experiment specification (cells, parts, ``run_cell``, its grid command), and
the tables and figures built from its records. Shared pieces sit in the layers below
(``fedlib.experiments.grid``, ``fedlib.methods``, ``fedlib.engine``, ...); the paper folders
never import each other (an import-linter ``independence`` contract in pyproject.toml).

:data:`GRID_COMMANDS` is the registry behind ``python -m fedlib grid <paper> <parts>
[--pending] [--rerun] [--seeds 0 1 2] ...``: paper slug -> the paper's grid command. Papers
not yet moved into a folder are still served from ``fedlib.experiments.<paper>`` (a
downward import).
"""
from __future__ import annotations

import importlib
from typing import Callable, Dict, Optional, Sequence

__all__ = ["GRID_COMMANDS", "grid_command"]


def _grid_main(paper: str) -> Callable[[Optional[Sequence[str]]], object]:
    def command(argv):
        # The paper's folder; papers not yet moved there keep their grid in fedlib.experiments.
        try:
            module = importlib.import_module(f"fedlib.papers.{paper}.experiment")
        except ModuleNotFoundError as error:
            if error.name not in (f"fedlib.papers.{paper}", f"fedlib.papers.{paper}.experiment"):
                raise
            module = importlib.import_module(f"fedlib.experiments.{paper}")
        return module.main(argv)
    return command


#: paper slug -> ``command(argv)``, the paper's resumable grid (:func:`fedlib.experiments.grid.grid_main`).
#: Each imports its paper's module only when called, so listing the papers loads no model code.
GRID_COMMANDS: Dict[str, Callable[[Optional[Sequence[str]]], object]] = {
    paper: _grid_main(paper) for paper in ("fedrkg", "f3crec", "fedkdrec", "fedpcl_cdr", "fedcsr")
}


def grid_command(paper: str) -> Callable[[Optional[Sequence[str]]], object]:
    """The grid command of ``paper``; a clear error for an unknown slug."""
    try:
        return GRID_COMMANDS[paper]
    except KeyError:
        raise ValueError(f"no grid for paper {paper!r}; the papers with a grid are {', '.join(GRID_COMMANDS)}") from None
