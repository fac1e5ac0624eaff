"""fedlib.engine.optim.adam: the fused Adam takes the same steps as torch's default Adam."""
import pytest
import torch

from fedlib.engine import optim


def _steps(optimizer_factory, seed=0, steps=5):
    torch.manual_seed(seed)
    table = torch.nn.Parameter(torch.randn(50, 8))
    bias = torch.nn.Parameter(torch.randn(50))
    optimizer = optimizer_factory([table, bias])
    for step in range(steps):
        g = torch.Generator().manual_seed(100 + step)
        table.grad = torch.randn(50, 8, generator=g)
        table.grad[step::3] = 0.0                              # untouched rows still decay their moments
        bias.grad = torch.randn(50, generator=g)
        optimizer.step()
    return table.detach(), bias.detach(), optimizer


@pytest.mark.parametrize("kwargs", [dict(lr=1e-2), dict(lr=3e-3, betas=(0.9, 0.98), weight_decay=1e-4)])
def test_fused_adam_matches_the_default_adam(kwargs):
    fused_table, fused_bias, fused = _steps(lambda p: optim.adam(p, **kwargs))
    plain_table, plain_bias, plain = _steps(lambda p: torch.optim.Adam(p, **kwargs))
    assert fused.defaults.get("fused") is True                  # the CPU build has the fused kernel
    assert not plain.defaults.get("fused")
    torch.testing.assert_close(fused_table, plain_table, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(fused_bias, plain_bias, rtol=1e-6, atol=1e-7)
    start, _, _ = _steps(lambda p: torch.optim.Adam(p, lr=0.0))
    assert (fused_table - start).abs().max() > 1e-3             # the steps did move the parameters


def test_adam_falls_back_when_the_fused_kernel_is_refused(monkeypatch):
    real = torch.optim.Adam

    def no_fused(params, fused=None, **kwargs):
        if fused:
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported devices")
        return real(params, **kwargs)

    monkeypatch.setattr(torch.optim, "Adam", no_fused)
    optimizer = optim.adam([torch.nn.Parameter(torch.zeros(3))], lr=0.1)
    assert isinstance(optimizer, real) and not optimizer.defaults.get("fused")
