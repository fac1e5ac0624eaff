"""config_hash: one configuration, one hash; different configurations, different hashes."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from fedlib.reporting.results import canonical_json, config_hash

BASE = {"dataset": "ml-100k", "method": "FedMF", "lr": 0.01, "dim": 32, "betas": (0.9, 0.999), "seed": 0}


def test_hash_is_16_hex_digits_and_pinned():
    # Pinned: caches and run records on disk are keyed by this value. If the canonical
    # form ever changes, every recorded run id changes with it; this test makes that loud.
    digest = config_hash(BASE)
    assert len(digest) == 16 and int(digest, 16) >= 0
    assert canonical_json(BASE) == (
        '{"betas":[0.9,0.999],"dataset":"ml-100k","dim":32,"lr":0.01,"method":"FedMF","seed":0}'
    )
    assert digest == "cc92905ae1856066"


def test_key_order_does_not_matter_at_any_depth():
    a = {"x": 1, "y": {"p": 1.5, "q": [1, 2]}}
    b = {"y": {"q": [1, 2], "p": 1.5}, "x": 1}
    assert config_hash(a) == config_hash(b)


def test_tuples_hash_like_lists():
    assert config_hash({"betas": (0.9, 0.999)}) == config_hash({"betas": [0.9, 0.999]})


def test_floats_are_hashed_exactly():
    assert config_hash({"lr": 1e-3}) == config_hash({"lr": 0.001})
    assert config_hash({"lr": 0.1 + 0.2}) != config_hash({"lr": 0.3})
    assert config_hash({"lr": 0.1}) != config_hash({"lr": 0.1000000000000001})
    # An int and a float are different settings (the cache must not merge them).
    assert config_hash({"epochs": 1}) != config_hash({"epochs": 1.0})


def test_numpy_scalars_and_arrays_hash_like_python_values():
    assert config_hash({"k": np.int64(10)}) == config_hash({"k": 10})
    assert config_hash({"lr": np.float64(0.1)}) == config_hash({"lr": 0.1})
    assert config_hash({"flag": np.bool_(True)}) == config_hash({"flag": True})
    assert config_hash({"grid": np.array([[1, 2], [3, 4]])}) == config_hash({"grid": [[1, 2], [3, 4]]})
    # float32(0.1) is a different number from 0.1; exact hashing keeps them apart.
    assert config_hash({"lr": np.float32(0.1)}) != config_hash({"lr": 0.1})


def test_paths_hash_like_their_text():
    assert config_hash({"data": Path("data/ml-100k")}) == config_hash({"data": "data/ml-100k"})


def test_different_configurations_differ():
    changed = dict(BASE, lr=0.02)
    extended = dict(BASE, rounds=100)
    other_seed = dict(BASE, seed=1)
    hashes = {config_hash(c) for c in (BASE, changed, extended, other_seed)}
    assert len(hashes) == 4


def test_dataclasses_include_their_class_name():
    @dataclasses.dataclass
    class FedMFConfig:
        dim: int = 32

    @dataclasses.dataclass
    class FedNCFConfig:
        dim: int = 32

    assert config_hash(FedMFConfig()) == config_hash(FedMFConfig(dim=32))
    assert config_hash(FedMFConfig()) != config_hash(FedNCFConfig())
    assert config_hash({"model": FedMFConfig()}) != config_hash({"model": FedMFConfig(dim=64)})


@pytest.mark.parametrize(
    "config, fragment",
    [
        ({"opt": {"fn": object()}}, "config['opt']['fn']"),
        ({1: "a"}, "key 1"),
        ({"lr": float("nan")}, "not a finite number"),
        ({"lr": float("inf")}, "not a finite number"),
        ({"items": {1, 2}}, "config['items']"),
    ],
)
def test_unserialisable_values_are_rejected_with_their_location(config, fragment):
    with pytest.raises(TypeError) as error:
        config_hash(config)
    assert fragment in str(error.value)


def test_a_configuration_must_be_a_mapping():
    with pytest.raises(TypeError, match="mapping"):
        config_hash([("lr", 0.1)])
