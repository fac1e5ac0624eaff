"""Privacy mechanisms: Laplace sampling, clipping, Gaussian noise, RDP accounting."""
from __future__ import annotations

import math
import warnings

import pytest
import torch
from scipy import stats

from fedlib.engine.privacy import (
    add_laplace,
    clip_per_sample,
    gaussian_mechanism,
    l1_sensitivity_of_l2_clip,
    laplace_epsilon,
    laplace_noise_like,
    noise_multiplier_for_epsilon,
    per_sample_norms,
    rdp_epsilon,
)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------------------
# Laplace
# --------------------------------------------------------------------------------------
def test_laplace_sample_statistics():
    scale = 0.5
    noise = laplace_noise_like(torch.zeros(400_000), scale, gen(1)).double()
    # Laplace(0, b): mean 0, E|X| = b, Var = 2 b^2, median of |X| = b ln 2.
    # Standard errors with n = 4e5: mean ~ sqrt(2)b/632 = 0.0011, E|X| ~ b/632 = 0.0008.
    assert abs(noise.mean().item()) < 0.006
    assert noise.abs().mean().item() == pytest.approx(scale, abs=0.005)
    assert noise.var().item() == pytest.approx(2 * scale**2, rel=0.02)
    assert noise.abs().median().item() == pytest.approx(scale * math.log(2), abs=0.005)
    # Whole distribution against scipy's Laplace CDF (KS distance; ~0.002 expected here).
    ks = stats.kstest(noise[:50_000].numpy(), stats.laplace(loc=0, scale=scale).cdf).statistic
    assert ks < 0.01
    assert torch.isfinite(noise).all()


def test_laplace_reproducible_and_independent_of_global_rng():
    x = torch.zeros(3, 4, dtype=torch.float64)
    rng_state = torch.random.get_rng_state()
    a = laplace_noise_like(x, 0.3, gen(42))
    b = laplace_noise_like(x, 0.3, gen(42))
    c = laplace_noise_like(x, 0.3, gen(43))
    assert torch.equal(torch.random.get_rng_state(), rng_state)  # global RNG untouched
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert a.dtype == torch.float64 and a.shape == (3, 4)
    # One generator advances: two consecutive draws differ.
    g = gen(5)
    assert not torch.equal(laplace_noise_like(x, 1.0, g), laplace_noise_like(x, 1.0, g))


def test_add_laplace_and_zero_scale():
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    noisy = add_laplace(x, 0.2, gen(0))
    assert torch.allclose(noisy - x, laplace_noise_like(x, 0.2, gen(0)))
    assert torch.equal(add_laplace(x, 0.0, gen(0)), x)  # F3CRec's λ = 0 setting
    assert torch.equal(x, torch.arange(6, dtype=torch.float32).reshape(2, 3))  # input not modified


def test_laplace_invalid_arguments():
    x = torch.zeros(3)
    with pytest.raises(ValueError):
        laplace_noise_like(x, -0.1, gen())
    with pytest.raises(ValueError):
        laplace_noise_like(x, float("inf"), gen())
    with pytest.raises(TypeError):
        laplace_noise_like(x, 0.1, None)
    with pytest.raises(TypeError):
        laplace_noise_like(torch.zeros(3, dtype=torch.int64), 0.1, gen())


def test_laplace_epsilon():
    # epsilon = sensitivity / scale
    assert laplace_epsilon(0.4, 0.1) == pytest.approx(4.0)  # FedPCL-CDR's stated 2C/eta
    # L1 sensitivity of an L2-clipped 64-d vector: 2 * 0.2 * sqrt(64) = 3.2 -> epsilon 32
    assert l1_sensitivity_of_l2_clip(0.2, 64) == pytest.approx(3.2)
    assert laplace_epsilon(l1_sensitivity_of_l2_clip(0.2, 64), 0.1) == pytest.approx(32.0)
    assert laplace_epsilon(1.0, 0.0) == math.inf
    assert laplace_epsilon(0.0, 0.0) == 0.0
    with pytest.raises(ValueError):
        laplace_epsilon(-1.0, 1.0)
    with pytest.raises(ValueError):
        laplace_epsilon(1.0, -1.0)
    with pytest.raises(ValueError):
        l1_sensitivity_of_l2_clip(1.0, 0)


# --------------------------------------------------------------------------------------
# Clipping and Gaussian noise
# --------------------------------------------------------------------------------------
def test_clip_per_sample_hand_case():
    grads = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    clipped, norms = clip_per_sample(grads, 1.0, return_norms=True)
    # Row 0 has norm 5 -> scaled by 1/5; row 1 (norm 0.5) and the zero row are unchanged.
    assert torch.allclose(norms, torch.tensor([5.0, 0.5, 0.0]))
    assert torch.allclose(clipped[0], torch.tensor([0.6, 0.8]))
    assert torch.equal(clipped[1], grads[1])  # exactly unchanged, not just close
    assert torch.equal(clipped[2], grads[2])
    assert torch.equal(grads[0], torch.tensor([3.0, 4.0]))  # input not modified


def test_clip_per_sample_dict_uses_joint_norm():
    grads = {"user": torch.tensor([[3.0], [0.0]]), "items": torch.tensor([[[4.0, 0.0]], [[0.1, 0.0]]])}
    # Client 0: joint norm sqrt(3^2 + 4^2) = 5 -> factor 1/5. Client 1: norm 0.1 -> unchanged.
    assert torch.allclose(per_sample_norms(grads), torch.tensor([5.0, 0.1]))
    clipped = clip_per_sample(grads, 1.0)
    assert torch.allclose(clipped["user"], torch.tensor([[0.6], [0.0]]))
    assert torch.allclose(clipped["items"], torch.tensor([[[0.8, 0.0]], [[0.1, 0.0]]]))
    with pytest.raises(ValueError):
        clip_per_sample({"a": torch.zeros(2, 3), "b": torch.zeros(3, 3)}, 1.0)


def test_clip_per_sample_random_norms_bounded():
    grads = torch.randn(200, 7, 5, generator=gen(3)) * torch.linspace(0.01, 3, 200).reshape(-1, 1, 1)
    max_norm = 1.5
    clipped = clip_per_sample(grads, max_norm)
    after = per_sample_norms(clipped)
    before = per_sample_norms(grads)
    assert torch.all(after <= max_norm * (1 + 1e-6))
    small = before <= max_norm
    assert small.any() and (~small).any()
    assert torch.equal(clipped[small], grads[small])
    assert torch.allclose(after[~small], torch.full_like(after[~small], max_norm))
    with pytest.raises(ValueError):
        clip_per_sample(grads, 0.0)
    with pytest.raises(ValueError):
        clip_per_sample(grads, -1.0)


def test_gaussian_mechanism_statistics_and_reproducibility():
    zeros = torch.zeros(200_000)
    noisy = gaussian_mechanism(zeros, max_norm=0.5, noise_multiplier=2.0, generator=gen(0))
    # std = noise_multiplier * max_norm = 1.0
    assert noisy.std().item() == pytest.approx(1.0, rel=0.01)
    assert abs(noisy.mean().item()) < 0.01
    again = gaussian_mechanism(zeros, 0.5, 2.0, gen(0))
    assert torch.equal(noisy, again)
    x = {"b": torch.ones(3), "a": torch.zeros(2, 2, dtype=torch.float64)}
    out = gaussian_mechanism(x, 1.0, 0.0, gen(0))  # no noise: unchanged copy
    assert torch.equal(out["b"], x["b"]) and torch.equal(out["a"], x["a"]) and out["a"].dtype == torch.float64
    reordered = {"a": x["a"], "b": x["b"]}
    assert torch.equal(gaussian_mechanism(x, 1.0, 1.0, gen(9))["a"], gaussian_mechanism(reordered, 1.0, 1.0, gen(9))["a"])
    with pytest.raises(ValueError):
        gaussian_mechanism(zeros, 1.0, -1.0, gen(0))
    with pytest.raises(ValueError):
        gaussian_mechanism(zeros, 0.0, 1.0, gen(0))


# --------------------------------------------------------------------------------------
# Accounting
# --------------------------------------------------------------------------------------
def test_rdp_epsilon_matches_opacus_step_by_step():
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    for _ in range(50):
        accountant.step(noise_multiplier=1.1, sample_rate=0.02)
    direct = accountant.get_epsilon(delta=1e-5)
    assert rdp_epsilon(1.1, 0.02, 50, 1e-5) == pytest.approx(direct, rel=1e-12)
    assert direct > 0


def test_rdp_epsilon_monotone():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # opacus warns when the best order is at the grid edge
        eps = [rdp_epsilon(sigma, 0.05, 200, 1e-5) for sigma in (0.6, 0.8, 1.0, 2.0, 4.0)]
    assert all(a > b for a, b in zip(eps, eps[1:]))  # more noise, less privacy loss
    assert rdp_epsilon(1.0, 0.05, 400, 1e-5) > rdp_epsilon(1.0, 0.05, 200, 1e-5)  # more steps, more loss
    assert rdp_epsilon(1.0, 0.05, 0, 1e-5) == 0.0
    assert rdp_epsilon(0.0, 0.05, 10, 1e-5) == math.inf


def test_noise_multiplier_for_epsilon_round_trip():
    sigma = noise_multiplier_for_epsilon(target_epsilon=3.0, sample_rate=0.01, steps=1000, delta=1e-5)
    eps = rdp_epsilon(sigma, 0.01, 1000, 1e-5)
    assert eps <= 3.0 and eps > 3.0 - 0.05
    assert noise_multiplier_for_epsilon(1.0, 0.01, 1000, 1e-5) > sigma  # tighter budget, more noise


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(noise_multiplier=-1.0, sample_rate=0.1, steps=10, delta=1e-5),
        dict(noise_multiplier=1.0, sample_rate=0.0, steps=10, delta=1e-5),
        dict(noise_multiplier=1.0, sample_rate=1.5, steps=10, delta=1e-5),
        dict(noise_multiplier=1.0, sample_rate=0.1, steps=-1, delta=1e-5),
        dict(noise_multiplier=1.0, sample_rate=0.1, steps=2.5, delta=1e-5),
        dict(noise_multiplier=1.0, sample_rate=0.1, steps=10, delta=0.0),
        dict(noise_multiplier=1.0, sample_rate=0.1, steps=10, delta=1.0),
    ],
)
def test_rdp_epsilon_invalid_arguments(kwargs):
    with pytest.raises(ValueError):
        rdp_epsilon(**kwargs)


def test_noise_multiplier_for_epsilon_invalid_arguments():
    with pytest.raises(ValueError):
        noise_multiplier_for_epsilon(-1.0, 0.1, 10, 1e-5)
    with pytest.raises(ValueError):
        noise_multiplier_for_epsilon(1.0, 0.1, 0, 1e-5)
