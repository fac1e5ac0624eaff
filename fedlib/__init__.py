"""fedlib: a small PyTorch library for federated recommendation, one notebook per paper.

Layers (each has one job):

* :mod:`fedlib.data`      registry, loaders, per-paper protocols, samplers;
* :mod:`fedlib.models`    backbones (MF, NCF, PFedRec, LightGCN, ...);
* :mod:`fedlib.engine`    round loop, executors, aggregation, privacy, communication;
* :mod:`fedlib.methods`   one module per paper method or baseline;
* :mod:`fedlib.metrics`   ranking metrics;
* :mod:`fedlib.reporting` paper-vs-ours tables, results files and figures;
* :mod:`fedlib.notebook`  notebook header/footer, profiles, recorded metrics, runner.
"""
from __future__ import annotations

__version__ = "0.1.0"

from fedlib.paths import project_root  # noqa: E402
from fedlib.device import default_device, keep_freed_memory  # noqa: E402

KEEPS_FREED_MEMORY = keep_freed_memory()  # glibc: reuse freed tensor memory (see fedlib.device)

__all__ = ["__version__", "project_root", "default_device"]
