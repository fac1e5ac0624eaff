"""Data layer: dataset registry, loaders, per-paper protocols, samplers, synthetic data.

::

    from fedlib.data import load_interactions, get_protocol
    raw = load_interactions("ml-100k")               # tidy frame + status + caveats
    stream = get_protocol("f3crec")("ml-100k")      # blocks D0..D3 of InteractionSplit
"""
from fedlib.data.download import data_root, dataset_status
from fedlib.data.loaders import LoadedInteractions, LoadedSequences, load_interactions, load_sequences
from fedlib.data.registry import get_spec, list_specs
from fedlib.data.splits import InteractionSplit, Pairs

__all__ = [
    "InteractionSplit",
    "LoadedInteractions",
    "LoadedSequences",
    "Pairs",
    "data_root",
    "dataset_status",
    "get_spec",
    "list_specs",
    "load_interactions",
    "load_sequences",
]
