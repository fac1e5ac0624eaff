"""The one integer-field checker (fedlib.baselines.config_checks) and the configs that use it.

FedProxConfig (sequential baselines), FedCSRTrainConfig (FedCSR's training) and every
cross-domain config (through ``cdr_common.check_training_loop``) validate their counts and
seed with it: the same rule (bool refused, NumPy integers accepted) and the same message,
``<ConfigClass>.<field> must be an integer >= <minimum>, got <value>``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pytest

from fedlib.baselines.config_checks import check_positive_ints, check_seed
from fedlib.baselines.cross_domain.cdr_single_domain import NeuMFConfig
from fedlib.baselines.sequential.fedcsr_baselines import FedProxConfig
from fedlib.papers.fedcsr.training import FedCSRTrainConfig


@dataclass
class Counts:
    rounds: object = 3
    seed: object = 0


@pytest.mark.parametrize("value", [0, -2, 2.0, 2.5, True, "3", None])
def test_a_count_that_is_not_an_integer_of_at_least_one_names_the_class_field_and_value(value):
    with pytest.raises(ValueError, match=re.escape(f"Counts.rounds must be an integer >= 1, got {value!r}")):
        check_positive_ints(Counts(rounds=value), ["rounds"])


@pytest.mark.parametrize("value", [1, 7, np.int64(4), np.int32(1)])
def test_integers_of_at_least_one_pass_numpy_ones_included(value):
    check_positive_ints(Counts(rounds=value), ["rounds"])


def test_the_hint_ends_the_message_and_the_first_bad_field_is_named():
    with pytest.raises(ValueError, match=r"Counts\.rounds must be an integer >= 1, got 0 \(rounds of the trainer\)$"):
        check_positive_ints(Counts(rounds=0, seed=0), ["rounds"], hint=" (rounds of the trainer)")


@pytest.mark.parametrize("value", [-1, 1.0, False, "0"])
def test_a_seed_must_be_an_integer_of_at_least_zero(value):
    with pytest.raises(ValueError, match=re.escape(f"Counts.seed must be an integer >= 0, got {value!r}")):
        check_seed(Counts(seed=value))
    check_seed(Counts(seed=0))
    check_seed(Counts(seed=np.int64(12)))


@pytest.mark.parametrize("config_class", [FedProxConfig, FedCSRTrainConfig, NeuMFConfig])
@pytest.mark.parametrize("field, value, minimum", [
    ("patience", 0, 1), ("patience", 2.0, 1), ("patience", True, 1), ("batch_size", -5, 1), ("seed", -1, 0),
])
def test_every_config_refuses_a_bad_count_with_the_same_message(config_class, field, value, minimum):
    expected = f"{config_class.__name__}.{field} must be an integer >= {minimum}, got {value!r}"
    with pytest.raises(ValueError, match=re.escape(expected)):
        config_class(**{field: value})


@pytest.mark.parametrize("config_class", [FedProxConfig, FedCSRTrainConfig])
@pytest.mark.parametrize("field", ["rounds", "local_epochs", "eval_batch_size"])
def test_the_sequential_configs_check_each_of_their_counts(config_class, field):
    with pytest.raises(ValueError, match=re.escape(f"{config_class.__name__}.{field} must be an integer >= 1, got 0")):
        config_class(**{field: 0})
    assert getattr(config_class(**{field: np.int64(2)}), field) == 2
