"""fedlib.models.dropout: same distribution as torch's dropout, reproducible, with its gradient."""
import math

import pytest
import torch

from fedlib.models.dropout import Dropout, dropout, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_drop_rate_and_scale_match_the_requested_rate(p):
    torch.manual_seed(0)
    n = 200_000
    mask = keep_mask((n,), p)
    dropped = float((mask == 0).float().mean())
    # binomial standard error: a 6-sigma band cannot flag a correct mask, and it catches a
    # mask that keeps with probability p instead of 1 - p (every p here but 0.5)
    assert abs(dropped - p) < 6 * math.sqrt(p * (1 - p) / n)
    kept = mask[mask != 0]
    assert torch.allclose(kept, torch.full_like(kept, 1.0 / (1.0 - p)))
    # the mean is preserved in expectation
    assert abs(float(mask.mean()) - 1.0) < 6 * math.sqrt(p / (1 - p) / n)


def test_masks_are_uncorrelated_with_the_position():
    torch.manual_seed(1)
    mask = keep_mask((400, 500), 0.3)
    rows, cols = (mask == 0).float().mean(1), (mask == 0).float().mean(0)
    assert float(rows.std()) < 0.05 and float(cols.std()) < 0.05     # std of a 500/400-draw rate is ~0.02


def test_follows_torch_manual_seed_and_differs_between_calls():
    x = torch.randn(64, 15, 8)
    torch.manual_seed(3)
    first, second = dropout(x, 0.3), dropout(x, 0.3)
    torch.manual_seed(3)
    again = dropout(x, 0.3)
    assert torch.equal(first, again)
    assert not torch.equal(first, second)


def test_gradient_is_the_mask():
    torch.manual_seed(4)
    x = torch.randn(32, 10, requires_grad=True)
    y = dropout(x, 0.4)
    y.sum().backward()
    expected = torch.where(y.detach() != 0, torch.full_like(x, 1 / 0.6), torch.zeros_like(x))
    assert torch.allclose(x.grad, expected)
    assert torch.allclose(y.detach(), x.detach() * expected)


def test_module_is_the_identity_in_eval_mode_and_at_rate_zero():
    x = torch.randn(5, 7)
    layer = Dropout(0.5).eval()
    assert layer(x) is x
    assert Dropout(0.0).train()(x) is x
    assert "p=0.5" in repr(Dropout(0.5))


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, True, "0.3", None])
def test_invalid_rate_is_rejected(bad):
    with pytest.raises(ValueError, match="dropout rate"):
        Dropout(bad)
    with pytest.raises(ValueError, match="dropout rate"):
        dropout(torch.ones(3), bad)


def test_dtype_is_kept():
    x = torch.randn(100, dtype=torch.float64)
    assert dropout(x, 0.3).dtype == torch.float64
