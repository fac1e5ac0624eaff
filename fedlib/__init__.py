"""fedlib: a small PyTorch library for federated recommendation, one notebook per paper.

Layers, bottom to top (a module imports only from its own layer or the layers below;
docs/layers.md, checked by import-linter):

* :mod:`fedlib.data`        registry, loaders, per-paper protocols, samplers;
* :mod:`fedlib.metrics`     ranking metrics and audits of what they are given;
* :mod:`fedlib.models`      backbones (MF, NCF, PFedRec, LightGCN, ...);
* :mod:`fedlib.engine`      the algorithm interface, the one trainer, parameter averaging, privacy;
* :mod:`fedlib.baselines`   the baselines by family, and the registry of methods by name;
  :mod:`fedlib.audits`      attacks and leak traces run against federated training;
* :mod:`fedlib.reporting`   paper-vs-ours tables, results files and figures;
* :mod:`fedlib.experiments` the grid runner, the spec reader and table builder;
* :mod:`fedlib.papers`      one folder per paper: its method, experiment, tables, figures;
* :mod:`fedlib.notebook`    notebook header/footer, profiles, recorded metrics, runner.
"""
from __future__ import annotations

__version__ = "0.1.0"

from fedlib.paths import project_root  # noqa: E402
from fedlib.device import default_device, keep_freed_memory  # noqa: E402

KEEPS_FREED_MEMORY = keep_freed_memory()  # glibc: reuse freed tensor memory (see fedlib.device)

__all__ = ["__version__", "project_root", "default_device"]
