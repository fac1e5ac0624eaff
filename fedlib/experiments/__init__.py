"""Paper experiment grids: a cell configuration in, one trained run and its metrics out.

One module per paper. Each turns a plain, hashable cell configuration (a dict) into a
training run through the lower layers (data protocols, backbones, engine, methods,
metrics), and returns JSON-ready metrics that :mod:`fedlib.reporting` caches, records and
compares with the paper. Notebooks call these functions; long ``paper``-profile grids run
through the same code from the command line (``python -m fedlib.experiments.<paper>``).
"""
