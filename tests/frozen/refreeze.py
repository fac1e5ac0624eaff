"""Regenerate the frozen experiment specification in ``tests/frozen/`` from the code as it is now.

**When you may run it:** only when a change to a grid is *intended*: a part, dataset, method or
default added or removed on purpose, or new runs appended to a ``runs.jsonl`` (which changes what is
pending and the committed tables). Say in the commit message that the frozen files were
regenerated and why. Never run it to make ``tests/test_experiment_freeze.py`` pass after a
refactor: a refactor must reproduce the frozen files as they are.

Usage (from the project root)::

    FEDLIB_DATA=<data root> python tests/frozen/refreeze.py

It rewrites ``grid_cells.json`` (per paper and command line, the ordered ``[config hash, label]``
of its cells), ``grid_configs.json`` (hash -> configuration), ``pending.json`` (what ``--pending``
lists per command line) and the ``csv_sha256`` part of ``tables.json``. It leaves alone what a
person writes with a reason: ``known_orphans.json`` and the ``known_exceptions`` of
``tables.json``; the record counts live in the test module (``EXPECTED_RECORD_COUNTS``).
"""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

FROZEN = Path(__file__).resolve().parent
TESTS = FROZEN.parent


def load_freeze_module():
    """``tests/test_experiment_freeze.py`` (which imports ``conftest`` from ``tests/``)."""
    sys.path.insert(0, str(TESTS))
    return importlib.import_module("test_experiment_freeze")


def main() -> None:
    import torch

    torch.set_num_threads(1)
    freeze = load_freeze_module()
    grids, configs = freeze.build_grid_freeze()
    tables_path = FROZEN / "tables.json"
    previous = json.loads(tables_path.read_text(encoding="utf-8")) if tables_path.exists() else {}
    outputs = {
        "grid_cells.json": freeze.dumps_frozen(grids),
        "grid_configs.json": freeze.dumps_frozen(configs, compact_from_depth=1),
        "pending.json": freeze.dumps_frozen(freeze.build_pending_freeze()),
        "tables.json": freeze.dumps_frozen(freeze.build_tables_freeze(previous)),
    }
    for name, text in outputs.items():
        (FROZEN / name).write_text(text + "\n", encoding="utf-8")
    cells = sum(len(pairs) for commands in grids.values() for pairs in commands.values())
    print(f"wrote {', '.join(outputs)} to {FROZEN}: {len(configs)} distinct configurations, {cells} cells over "
          f"{sum(len(c) for c in grids.values())} command lines; review `git diff tests/frozen` before committing")


if __name__ == "__main__":
    main()
