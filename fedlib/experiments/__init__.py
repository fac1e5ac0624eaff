"""Paper experiment grids: a cell configuration in, one trained run and its metrics out.

One module per paper. Each turns a plain, hashable cell configuration (a dict) into a
training run through the lower layers (data protocols, backbones, engine, methods,
metrics), and returns JSON-ready metrics that :mod:`fedlib.reporting` caches, records and
compares with the paper. Notebooks call these functions; long ``paper``-profile grids run
through the same code from one command line::

    python -m fedlib grid <paper> <parts> [--pending] [--rerun] [--seeds 0 1 2] ...

whose registry (paper slug -> the paper's grid command) is :data:`fedlib.papers.GRID_COMMANDS`.
The papers move one by one into their own folders (``fedlib/papers/<slug>/``, FedRKG first);
what stays here is shared by every paper (:mod:`fedlib.experiments.grid`) or not moved yet.
"""
