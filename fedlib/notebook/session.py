"""The first and last code cells of every notebook: provenance header and wall time."""
from __future__ import annotations

import os
import platform
import time
from datetime import datetime, timezone
from typing import Optional

from fedlib.notebook.profiles import Settings, load_settings
from fedlib.notebook.records import FINISHED_KEY, record, set_current_notebook

_started: dict[str, float] = {}
_active: dict[str, str] = {}


def git_revision() -> str:
    """Short commit of the checkout, ``+dirty`` when tracked code has uncommitted changes."""
    from fedlib.reporting.results import current_commit

    return current_commit()


def start(notebook: str) -> None:
    """The notebook's first code cell: print the provenance header.

    Prints the notebook, git revision, fedlib, torch and Python versions, the device, the
    profile requested by the environment (``$FEDLIB_PROFILE`` or the default; the
    ``parameters`` cell that follows may still override it) and the start time.

    It also turns on PyTorch's deterministic algorithms: with more than one CPU thread some
    kernels accumulate in a run-dependent order, so two executions of the same lesson gave
    different numbers (lesson 03's quick FedKDRec run: sampled N@10 0.2531, then 0.2513). The grids
    run one thread per cell and were not affected. ``warn_only``: an operation without a
    deterministic implementation (on a GPU) warns instead of failing the lesson.
    """
    import torch

    torch.use_deterministic_algorithms(True, warn_only=True)

    import fedlib
    from fedlib.device import default_device
    from fedlib.notebook.profiles import resolve_profile

    _started[notebook] = time.perf_counter()
    _active["notebook"] = notebook
    set_current_notebook(notebook)
    device = default_device()
    lines = {
        "notebook": notebook,
        "git revision": git_revision(),
        "fedlib": fedlib.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""),
        "torch threads": torch.get_num_threads(),
        "profile": f"{resolve_profile(None)} (environment/default; the parameters cell may override)",
        "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }
    width = max(map(len, lines))
    for key, value in lines.items():
        print(f"{key:<{width}} : {value}")


def use_profile(profile: Optional[str] = None, notebook: Optional[str] = None) -> Settings:
    """The cell after ``parameters``: resolve the profile, record it, return its settings."""
    notebook = notebook or _active.get("notebook")
    if notebook is None:
        raise RuntimeError("call fedlib.notebook.start(<notebook name>) in the first code cell first")
    settings = load_settings(notebook, profile)
    source = "parameters cell" if profile else ("FEDLIB_PROFILE" if os.environ.get("FEDLIB_PROFILE") else "default")
    print(f"profile: {settings.profile} (from the {source})")
    overrides = os.environ.get("FEDLIB_OVERRIDE", "").strip()
    if overrides:
        print(f"settings overridden by FEDLIB_OVERRIDE: {overrides}")
    record("profile", settings.profile, show=False)
    return settings


def finish(notebook: Optional[str] = None) -> None:
    """Print and record the notebook's wall time in seconds (the last code cell)."""
    notebook = notebook or _active.get("notebook")
    began = _started.get(notebook)
    if began is None:
        raise RuntimeError(f"finish({notebook!r}) called without start({notebook!r}) in the first code cell")
    wall = time.perf_counter() - began
    print(f"wall time: {wall:.1f} s ({wall / 60:.1f} min)")
    record("wall_time_s", wall, show=False)
    record(FINISHED_KEY, True, show=False)
