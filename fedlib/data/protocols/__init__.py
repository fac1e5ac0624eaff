"""Per-paper data protocols: raw interactions -> split objects, one module per paper.

Each protocol reproduces the preprocessing, split and evaluation candidates of one paper:

========== ============================ ===================================================
name       returns                      in one line
========== ============================ ===================================================
f3crec     :class:`BlockStream`         k-core, 60 % base block + 3 chronological blocks
fedrkg     :class:`InteractionSplit`    users >= 10 (20 ML-1M), leave-last-out, full ranking
fedkdrec   :class:`InteractionSplit`    leave-one-out; full ranking and 1 + 99 candidates
fedpcl_cdr :class:`DomainSplit`         domains as clients, shared overlap ids, 1 + 99
fedcsr     :class:`SequenceSplit`       C2DSR sequences, 10 platforms, 1 + 999 candidates
========== ============================ ===================================================

Usage::

    from fedlib.data.protocols import get_protocol
    stream = get_protocol("f3crec").build("ml-100k", seed=0)

Every module also exposes a ``*_from_frame(s)`` function that applies the same rules to
an in-memory frame (used by the tests and the synthetic data), and ``statistics(split)``
which returns the paper's dataset-statistics table for a split.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from fedlib.data.errors import UnknownProtocolError
from fedlib.data.protocols import f3crec, fedcsr, fedkdrec, fedpcl_cdr, fedrkg
from fedlib.data.protocols._common import UnsupportedDatasetError


@dataclass(frozen=True)
class Protocol:
    """One paper's data protocol.

    Attributes:
        name: registry key (the paper slug used for ``results/`` and ``paper_tables/``).
        paper: paper title.
        build: ``build(dataset, **options) -> split object``.
        statistics: ``statistics(split) -> pd.DataFrame`` (the paper's dataset table).
        datasets: dataset ids the protocol accepts.
        returns: name of the split class ``build`` returns.
        labels: dataset id -> the dataset's name in the paper's tables.
    """

    name: str
    paper: str
    build: Callable
    statistics: Callable
    datasets: tuple
    returns: str
    labels: dict

    def __call__(self, dataset: str, **options):
        return self.build(dataset, **options)


PROTOCOLS: dict = {
    module.NAME: Protocol(
        name=module.NAME,
        paper=module.PAPER,
        build=module.build,
        statistics=module.statistics,
        datasets=tuple(module.DATASETS),
        returns=returns,
        labels={dataset: config["label"] for dataset, config in module.DATASETS.items()},
    )
    for module, returns in (
        (fedrkg, "InteractionSplit"),
        (f3crec, "BlockStream"),
        (fedkdrec, "InteractionSplit"),
        (fedpcl_cdr, "DomainSplit"),
        (fedcsr, "SequenceSplit"),
    )
}
"""name -> :class:`Protocol`, in teaching order."""


def get_protocol(name: str) -> Protocol:
    """The protocol called ``name`` (case-insensitive; ``-`` and ``_`` are interchangeable).

    Raises:
        UnknownProtocolError: listing the known protocol names.
    """
    key = str(name).strip().lower().replace("-", "_")
    if key not in PROTOCOLS:
        raise UnknownProtocolError(str(name), list(PROTOCOLS))
    return PROTOCOLS[key]


def build_split(protocol: str, dataset: str, **options):
    """Shorthand for ``get_protocol(protocol).build(dataset, **options)``."""
    return get_protocol(protocol).build(dataset, **options)


__all__ = ["PROTOCOLS", "Protocol", "get_protocol", "build_split", "UnsupportedDatasetError"]
