"""FedAvg weightings and the server-mixing hook."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlib.engine import Aggregation, client_weights, fedavg, interpolate_with_previous


def test_client_weights():
    np.testing.assert_allclose(client_weights([10, 30], "uniform"), [0.5, 0.5])
    np.testing.assert_allclose(client_weights([10, 30], "num_examples"), [0.25, 0.75])
    with pytest.raises(ValueError):
        client_weights([1, 2], "median")


def test_fedavg_is_the_mean_of_uploaded_tables():
    theta = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    uploads = torch.stack([theta + 1.0, theta - 3.0, theta])  # three clients' full tables
    deltas = uploads - theta
    out = fedavg({"t": theta}, {"t": deltas}, client_weights([5, 5, 5]))
    torch.testing.assert_close(out["t"], uploads.mean(0))
    weighted = fedavg({"t": theta}, {"t": deltas}, client_weights([1, 0, 3], "num_examples"))
    torch.testing.assert_close(weighted["t"], 0.25 * uploads[0] + 0.75 * uploads[2])


def test_apply_and_mix_do_not_modify_inputs():
    theta = {"t": torch.ones(3)}
    new = Aggregation().apply(theta, {"t": torch.full((3,), 2.0)})
    assert torch.equal(theta["t"], torch.ones(3)) and torch.equal(new["t"], torch.full((3,), 3.0))
    mixed = interpolate_with_previous({"t": torch.zeros(3)}, beta=0.25)(theta, new, 0)
    torch.testing.assert_close(mixed["t"], torch.full((3,), 2.25))
