"""Paper experiment grids: a cell configuration in, one trained run and its metrics out.

One module per paper. Each turns a plain, hashable cell configuration (a dict) into a
training run through the lower layers (data protocols, backbones, engine, methods,
metrics), and returns JSON-ready metrics that :mod:`fedlib.reporting` caches, records and
compares with the paper. Notebooks call these functions; long ``paper``-profile grids run
through the same code from one command line::

    python -m fedlib grid <paper> <parts> [--pending] [--rerun] [--seeds 0 1 2] ...

:data:`GRID_COMMANDS` is the registry behind it: paper slug -> the paper's grid command.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence

__all__ = ["GRID_COMMANDS", "grid_command"]


def _f3crec(argv):
    from fedlib.experiments import f3crec
    return f3crec.main(argv)


def _fedrkg(argv):
    from fedlib.experiments import fedrkg
    return fedrkg.main(argv)


def _fedkdrec(argv):
    from fedlib.experiments import fedkdrec
    return fedkdrec.main(argv)


def _fedpcl_cdr(argv):
    from fedlib.experiments import fedpcl_cdr
    return fedpcl_cdr.main(argv)


def _fedcsr(argv):
    from fedlib.experiments import fedcsr
    return fedcsr.main(argv)


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
