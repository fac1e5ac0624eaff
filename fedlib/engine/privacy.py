r"""Noise mechanisms and privacy accounting for client uploads.

Three papers in this library perturb what clients send:

* **F3CRec** (Table 8) adds ``Laplace(0, λ)`` noise to every uploaded item table,
  ``λ ∈ {0, 0.1, …, 0.5}``. The paper itself says this is "not a formal LDP mechanism":
  nothing bounds the sensitivity of an item table, so no ε can be attached to λ.
* **FedPCL-CDR** clips each cluster prototype to L2 norm ``C = 0.2`` (the paper's β) and adds
  ``Laplace(0, η = 0.1)`` per dimension, claiming ``ε ≤ 2C/η = 4``. Two caveats worth
  showing in a notebook: the Laplace mechanism needs the **L1** sensitivity, and two
  vectors of L2 norm ≤ C in ``d`` dimensions can differ by up to ``2C√d`` in L1
  (:func:`l1_sensitivity_of_l2_clip`): with ``d = 64`` that is ``ε = 3.2 / 0.1 = 32``,
  not 4. And the paper calls η a standard deviation, while the code passes it as the
  Laplace *scale* b (standard deviation ``√2·b``).
* **FedRKG** (§5.2) uses Gaussian noise with gradient clipping and a moments/RDP
  accountant (Opacus); see :func:`gaussian_mechanism` for its granularity. The engine runs
  it inside local training (:class:`~fedlib.engine.method.GradientNoise`) and
  :func:`dp_epsilon` turns its settings into an ε.

Conventions:

* Every random draw takes an explicit ``torch.Generator`` or explicit counter keys
  (:func:`laplace_from_counters`, :func:`gaussian_from_counters`); nothing touches the global
  RNG. Noise is drawn on the generator's device and then moved to the tensor's device,
  so a CPU generator gives bit-identical noise whether the data live on CPU or GPU.
* Functions return new tensors; inputs are never modified in place.
* Laplace: density ``p(x) = exp(−|x|/b) / (2b)``, scale ``b``, variance ``2b²``.
  For a query with L1 sensitivity ``Δ₁`` the mechanism is ``ε``-DP with ``ε = Δ₁ / b``.
* Gaussian: noise ``N(0, (σ·C)²)`` per coordinate, where ``C`` is the clipping norm
  (the L2 sensitivity of one clipped contribution) and ``σ`` the *noise multiplier*,
  the quantity Opacus' accountants take.

These mechanisms are for experiments. They are not hardened against floating-point
attacks on noise sampling, and the float32 Laplace sampler truncates tails beyond about
``16·b`` (a tail probability of about 1e-7).
"""
from __future__ import annotations

import math
import sys
import warnings
from typing import Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from fedlib.engine.counter_kernel import laplace_uniforms, scale_and_sign, scale_sign_add_rows, splitmix64_rows

__all__ = [
    "laplace_noise_like",
    "add_laplace",
    "splitmix64",
    "counter_bits",
    "laplace_from_counters",
    "add_laplace_from_counters",
    "gaussian_from_counters",
    "laplace_epsilon",
    "l1_sensitivity_of_l2_clip",
    "per_sample_norms",
    "clip_factors",
    "clip_per_sample",
    "gaussian_noise_like",
    "gaussian_mechanism",
    "rdp_epsilon",
    "dp_epsilon",
    "ADJACENCIES",
    "noise_multiplier_for_epsilon",
]

Grads = Union[torch.Tensor, Mapping[str, torch.Tensor]]


def _check_non_negative_finite(value: float, name: str) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    return value


def _check_positive_finite(value: float, name: str) -> float:
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


def _check_generator(generator: torch.Generator) -> None:
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            "pass an explicit torch.Generator (e.g. torch.Generator().manual_seed(0)); "
            "the global RNG is never used for privacy noise"
        )


def _sampling_dtype(dtype: torch.dtype) -> torch.dtype:
    # Draw in float64 only for float64 data: a float64 draw for a float32 item table stack
    # would double the memory of the noise for no visible gain.
    return torch.float64 if dtype == torch.float64 else torch.float32


def _require_float(tensor: torch.Tensor, name: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if not torch.is_floating_point(tensor):
        raise TypeError(f"{name} must be a floating-point tensor, got {tensor.dtype}")


# --------------------------------------------------------------------------------------
# Laplace mechanism
# --------------------------------------------------------------------------------------
def laplace_noise_like(tensor: torch.Tensor, scale: float, generator: torch.Generator) -> torch.Tensor:
    r"""i.i.d. ``Laplace(0, scale)`` noise with the shape, dtype and device of ``tensor``.

    Sampled by the inverse CDF from one uniform ``p ~ U[0, 1)`` per element:
    ``x = b·ln(2p)`` if ``p < 1/2`` else ``x = −b·ln(2(1 − p))``.
    (Both branches are exact on their half; no ``1 − 2|p − 1/2|`` cancellation.)

    Args:
        tensor: any floating-point tensor; only its shape/dtype/device are used.
        scale: Laplace scale ``b ≥ 0`` (F3CRec's λ, FedPCL-CDR's η). ``0`` gives zeros.
        generator: source of randomness; its device decides where uniforms are drawn.

    Returns:
        Noise tensor, same shape/dtype/device as ``tensor``.
    """
    _require_float(tensor, "tensor")
    scale = _check_non_negative_finite(scale, "scale")
    _check_generator(generator)
    if scale == 0.0:
        return torch.zeros_like(tensor)
    dtype = _sampling_dtype(tensor.dtype)
    uniform = torch.rand(tensor.shape, generator=generator, device=generator.device, dtype=dtype)
    # p = 0 would give ln(0) = −inf; move it to half the smallest grid step instead.
    uniform = uniform.clamp_min(torch.finfo(dtype).eps / 2)
    lower_half = uniform < 0.5
    noise = torch.where(lower_half, torch.log(2.0 * uniform), -torch.log(2.0 * (1.0 - uniform))) * scale
    return noise.to(device=tensor.device, dtype=tensor.dtype)


def add_laplace(tensor: torch.Tensor, scale: float, generator: torch.Generator) -> torch.Tensor:
    """``tensor + Laplace(0, scale)`` noise (a new tensor), e.g. a client's item table upload."""
    return tensor + laplace_noise_like(tensor, scale, generator)


# --------------------------------------------------------------------------------------
# Counter-based noise: many clients' draws in one vectorised call
# --------------------------------------------------------------------------------------
#: SplitMix64's increment (2⁶⁴ / golden ratio, odd) and its two finaliser multipliers (Stafford's mix 13).
SPLITMIX_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
#: Elements per vectorised block: large enough that numpy's per-call overhead is small, small
#: enough that the intermediate arrays stay in the CPU's cache (the values do not depend on it).
COUNTER_BLOCK_ELEMENTS = 1 << 17


def splitmix64(z: np.ndarray, scratch: Optional[np.ndarray] = None) -> np.ndarray:
    """SplitMix64's finaliser, elementwise on ``uint64`` (modifies and returns ``z``).

    A bijection of 64-bit words whose outputs, on consecutive inputs spaced by
    :data:`SPLITMIX_GAMMA`, pass BigCrush (it is ``java.util.SplittableRandom``'s generator).
    Wrap-around arithmetic is numpy's ``uint64`` arithmetic. ``scratch``: an array like ``z``
    to hold the shifted words (saves an allocation per step).
    """
    scratch = np.empty_like(z) if scratch is None else scratch
    for shift, multiplier in ((30, _MIX_1), (27, _MIX_2), (31, None)):
        np.right_shift(z, np.uint64(shift), out=scratch)
        np.bitwise_xor(z, scratch, out=z)
        if multiplier is not None:
            np.multiply(z, multiplier, out=z)
    return z


def counter_bits(keys: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    r"""``(R, width) uint32`` random words: element ``e`` of the stream keyed ``K``.

    Row ``r`` holds elements ``starts[r] … starts[r] + width − 1`` of the stream of key
    ``keys[r]``; element ``e`` of stream ``K`` is the low (``e`` even) or high (``e`` odd)
    half of ``splitmix64(K + (⌊e/2⌋ + 1)·γ)``, i.e. of SplitMix64's output ``⌊e/2⌋`` when
    seeded with ``K``. A pure function of ``(K, e)``: the same element has the same value
    however the rows are cut, ordered or batched. (Two streams overlap only if their keys
    differ by a multiple of ``γ`` smaller than their length: about ``n/2⁶⁴`` for a pair.)

    Args:
        keys: ``(R,) uint64`` stream keys (e.g. :func:`~fedlib.engine.plan.client_noise_keys`).
        starts: ``(R,)`` non-negative integers, the element index of each row's first element.
        width: elements per row, ``≥ 0``.
    """
    keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
    starts = np.asarray(starts).reshape(-1)
    width = int(width)
    if keys.shape != starts.shape:
        raise ValueError(f"keys and starts must have the same length, got {keys.size} and {starts.size}")
    if width < 0:
        raise ValueError(f"width must be >= 0, got {width}")
    starts = _element_starts(starts)
    return _counter_words(keys, starts, width, _pairs_aligned(starts, width))


def _element_starts(starts) -> np.ndarray:
    """``starts`` as ``uint64``, refusing negative values."""
    starts = np.asarray(starts).reshape(-1)
    if starts.size and int(starts.min()) < 0:
        raise ValueError(f"starts must be >= 0, got {int(starts.min())}")
    return starts.astype(np.uint64, copy=False)


def _pairs_aligned(starts: np.ndarray, width: int) -> bool:
    """Whether every row covers whole pairs of elements (even width and starts): the fast path."""
    return width % 2 == 0 and sys.byteorder == "little" and not (starts & np.uint64(1)).any()


def _counter_words(keys: np.ndarray, starts: np.ndarray, width: int, aligned: bool) -> np.ndarray:
    """:func:`counter_bits` without the checks (``starts`` already ``uint64``)."""
    if aligned:
        # Fast path: one 64-bit word per pair of elements, read as its (low, high) halves.
        # K + (s/2 + j + 1)·γ = (K + (s/2)·γ) + (j + 1)·γ: one broadcast addition.
        # K + (s/2 + j + 1)·γ = (K + (s/2)·γ) + (j + 1)·γ, hashed in one compiled loop
        # (the same bits as splitmix64 on the sums, several times faster than numpy's passes).
        row_base = keys + (starts >> np.uint64(1)) * SPLITMIX_GAMMA
        return splitmix64_rows(row_base, width // 2).view(np.uint32).reshape(keys.size, width)
    elements = starts[:, None] + np.arange(width, dtype=np.uint64)[None, :]
    words = splitmix64(keys[:, None] + ((elements >> np.uint64(1)) + np.uint64(1)) * SPLITMIX_GAMMA)
    return ((words >> ((elements & np.uint64(1)) << np.uint64(5))) & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def _counter_blocks(num_rows: int, width: int):
    """Row slices of about :data:`COUNTER_BLOCK_ELEMENTS` elements each."""
    step = max(1, COUNTER_BLOCK_ELEMENTS // max(int(width), 1))
    return (slice(start, min(start + step, num_rows)) for start in range(0, num_rows, step))


def laplace_from_counters(keys: np.ndarray, starts: np.ndarray, width: int, scale: float,
                          dtype: torch.dtype = torch.float32, device=None,
                          row_weights: Optional[np.ndarray] = None) -> torch.Tensor:
    r"""``(R, width)`` i.i.d. ``Laplace(0, scale)`` noise, element ``e`` of row ``r`` from stream ``keys[r]``.

    Each element uses one 32-bit word ``w`` of :func:`counter_bits`: its lowest bit is the sign,
    its top bits a uniform ``v ∈ (0, 1]``, and ``x = ±b·(−ln v)``: a Laplace variable is an
    exponential one ``b·(−ln v)`` with an independent fair sign. Float32: the top 23 bits are the
    mantissa of a float ``f ∈ [1, 2)`` (``w >> 9`` or'ed with the bits of 1.0, no int-to-float
    conversion) and ``v = 2 − f``; float64: ``v = (⌊w/2⌋ + 1)·2⁻³¹``. The tails are truncated at
    ``b·ln 2²³ ≈ 15.9·b`` (float32) or ``b·ln 2³¹ ≈ 21.5·b`` (float64), tail probabilities about
    1.2e-7 and 5e-10.

    Args:
        keys, starts, width: as in :func:`counter_bits`.
        scale: Laplace scale ``b ≥ 0``; ``0`` gives zeros.
        dtype: ``torch.float64`` computes in float64, anything else in float32 (then cast).
        device: of the result (computed on the CPU, so every device gets the same numbers).
        row_weights: ``(R,)`` factors ``≥ 0`` multiplying each row's noise (an aggregation
            weight), applied with the scale in one pass: row ``r`` is ``Laplace(0, b·w_r)``
            drawn from the same words.
    """
    scale = _check_non_negative_finite(scale, "scale")
    if row_weights is not None:
        row_weights = np.asarray(row_weights, dtype=np.float64).reshape(-1)
        if row_weights.shape != np.shape(keys)[-1:] or not (np.isfinite(row_weights).all() and (row_weights >= 0).all()):
            raise ValueError(f"row_weights must be {np.size(keys)} finite numbers >= 0 (one per row)")
    keys, starts = np.asarray(keys, dtype=np.uint64).reshape(-1), np.asarray(starts).reshape(-1)
    width = int(width)
    wide = dtype == torch.float64
    float_type, uint_type = (np.float64, np.uint64) if wide else (np.float32, np.uint32)
    if scale == 0.0 or keys.size * width == 0:
        return torch.zeros((keys.size, width), dtype=dtype, device=device)
    wide_bits = 31  # of float64's uniform; float32's takes 23 bits through the bits of f ∈ [1, 2)
    starts = _element_starts(starts)
    if starts.shape != keys.shape:
        raise ValueError(f"keys and starts must have the same length, got {keys.size} and {starts.size}")
    aligned = _pairs_aligned(starts, width)
    values = np.empty((keys.size, width), dtype=float_type)
    if aligned and not wide:
        return _laplace_float32_compiled(keys, starts, width, scale, row_weights, values).to(device=device, dtype=dtype)
    for rows in _counter_blocks(keys.size, width):
        words = _counter_words(keys[rows], starts[rows], width, aligned)
        block = values[rows]
        if wide:
            scratch = np.right_shift(words, np.uint32(32 - wide_bits))
            np.add(scratch, np.uint32(1), out=scratch)  # v·2^31 ∈ [1, 2^31], exact in float64
            block[...] = scratch
            magnitude = torch.from_numpy(block).mul_(2.0 ** -wide_bits).log_()  # ln v ≤ 0
        else:
            bits = block.view(np.uint32)
            np.right_shift(words, np.uint32(9), out=bits)
            np.bitwise_or(bits, np.uint32(0x3F800000), out=bits)  # f ∈ [1, 2): exponent bits of 1.0
            np.subtract(np.float32(2.0), block, out=block)  # v = 2 − f ∈ (0, 1]
            magnitude = torch.from_numpy(block).log_()  # ln v ≤ 0
        if row_weights is None:
            magnitude.mul_(-scale)  # b·(−ln v) ≥ 0
        else:
            magnitude.mul_(torch.from_numpy((-scale * row_weights[rows]).astype(float_type))[:, None])
        # The sign: the word's lowest bit, moved into the float's sign bit.
        if wide:
            sign = (words & np.uint32(1)).astype(np.uint64) << np.uint64(63)
        else:
            sign = np.left_shift(words, np.uint32(31), out=words)  # the words are not needed any more
        bits = block.view(uint_type)
        np.bitwise_xor(bits, sign, out=bits)
    return torch.from_numpy(values).to(device=device, dtype=dtype)


def _float32_log_uniform_blocks(keys: np.ndarray, starts: np.ndarray, width: int, scale: float,
                                row_weights: Optional[np.ndarray], out: Optional[np.ndarray] = None):
    """Blocks ``(rows, ln v, negative, factor)`` of float32 Laplace noise before its sign and scale.

    One compiled pass writes the uniforms ``v`` and the signs, torch takes ``ln v`` in place
    (the same function as the numpy path, so the same bits); ``factor`` is ``−b`` (or ``−b·w_r``)
    per row in float32. ``out``: ``(R, width)`` float32 to write the blocks into; ``None``: one
    reused block-sized buffer (the caller consumes each block before the next).
    """
    row_base = keys + (starts >> np.uint64(1)) * SPLITMIX_GAMMA
    buffer = None if out is not None else np.empty(
        (min(keys.size, max(1, COUNTER_BLOCK_ELEMENTS // max(width, 1))), width), dtype=np.float32)
    for rows in _counter_blocks(keys.size, width):
        block = out[rows] if out is not None else buffer[:rows.stop - rows.start]
        uniforms, negative = laplace_uniforms(row_base[rows], width, out=block)
        torch.from_numpy(uniforms).log_()  # ln v ≤ 0
        factor = np.full(uniforms.shape[0], -scale) if row_weights is None else -scale * row_weights[rows]
        yield rows, uniforms, negative, factor.astype(np.float32)


def _laplace_float32_compiled(keys: np.ndarray, starts: np.ndarray, width: int, scale: float,
                              row_weights: Optional[np.ndarray], values: np.ndarray) -> torch.Tensor:
    """The float32 case of :func:`laplace_from_counters` on whole pairs, the same bits in three passes:
    :func:`_float32_log_uniform_blocks`, then a compiled pass applies the factor and the sign."""
    for _, log_uniforms, negative, factor in _float32_log_uniform_blocks(keys, starts, width, scale, row_weights,
                                                                          out=values):
        scale_and_sign(log_uniforms, factor, negative)
    return torch.from_numpy(values)


def add_laplace_from_counters(table: torch.Tensor, destination: np.ndarray, keys: np.ndarray, starts: np.ndarray,
                              width: int, scale: float, row_weights: Optional[np.ndarray] = None) -> torch.Tensor:
    r"""``table.index_add_(0, destination, laplace_from_counters(keys, starts, width, scale, ...))``, the same bits.

    The upload noise of a round is summed into the aggregate and never read again, so on the
    CPU in float32 (the engine's default) the noise is added row by row as it is drawn: the
    sign, the scale and the addition in one compiled pass per block of
    :data:`COUNTER_BLOCK_ELEMENTS`, without writing the ``(R, width)`` noise out. Rows are added in
    increasing ``r``, as ``index_add_`` adds them, so the sums are bit-identical
    (``tests/test_counter_noise.py``). Other dtypes, devices and unaligned ``starts`` draw the
    noise with :func:`laplace_from_counters` and call ``index_add_``.

    Args:
        table: ``(T, *row)`` with ``prod(row) = width``, updated in place and returned.
        destination: ``(R,) int64`` row of ``table`` each noise row is added to.
        keys, starts, width, scale, row_weights: as in :func:`laplace_from_counters`.
    """
    scale = _check_non_negative_finite(scale, "scale")
    keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
    destination = np.asarray(destination, dtype=np.int64).reshape(-1)
    width = int(width)
    if destination.shape != keys.shape:
        raise ValueError(f"destination must have one row per key ({keys.size}), got {destination.size}")
    if table.dim() < 1 or math.prod(table.shape[1:]) != width:
        raise ValueError(f"table rows must have {width} elements, got shape {tuple(table.shape)}")
    starts_array = _element_starts(np.asarray(starts).reshape(-1))
    fused = (table.device.type == "cpu" and table.dtype == torch.float32 and table.is_contiguous()
             and starts_array.shape == keys.shape and _pairs_aligned(starts_array, width))
    if not fused or scale == 0.0 or keys.size * width == 0:
        noise = laplace_from_counters(keys, starts, width, scale, table.dtype, table.device, row_weights=row_weights)
        return table.index_add_(0, torch.as_tensor(destination, device=table.device), noise.view(-1, *table.shape[1:]))
    if row_weights is not None:
        row_weights = np.asarray(row_weights, dtype=np.float64).reshape(-1)
        if row_weights.shape != keys.shape or not (np.isfinite(row_weights).all() and (row_weights >= 0).all()):
            raise ValueError(f"row_weights must be {keys.size} finite numbers >= 0 (one per row)")
    rows_of_table = table.view(table.shape[0], width).numpy()
    for rows, log_uniforms, negative, factor in _float32_log_uniform_blocks(keys, starts_array, width, scale,
                                                                             row_weights):
        scale_sign_add_rows(log_uniforms, factor, negative, destination[rows], rows_of_table)
    return table


def gaussian_from_counters(keys: np.ndarray, starts: np.ndarray, width: int, std: float,
                           dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    r"""``(R, width)`` i.i.d. ``N(0, std²)`` noise, element ``e`` of row ``r`` from stream ``keys[r]``.

    Box-Muller on SplitMix64's output ``⌊e/2⌋`` (:func:`counter_bits`): its low word gives
    ``u₁ ∈ (0, 1]``, its high word ``u₂ ∈ [0, 1)`` (32 bits each), ``ρ = σ·√(−2 ln u₁)``, and
    element ``e`` is ``ρ cos 2πu₂`` (``e`` even) or ``ρ sin 2πu₂`` (``e`` odd): the two
    elements of a pair are independent normals. Tails are truncated at ``√(2 ln 2³²) ≈ 6.7σ``
    (tail probability about 2e-11).

    Args:
        keys, starts, width: as in :func:`counter_bits`.
        std: ``σ ≥ 0``; ``0`` gives zeros.
        dtype, device: as in :func:`laplace_from_counters`.
    """
    std = _check_non_negative_finite(std, "std")
    keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
    starts = _element_starts(starts)
    width = int(width)
    if starts.shape != keys.shape:
        raise ValueError(f"keys and starts must have the same length, got {keys.size} and {starts.size}")
    wide = dtype == torch.float64
    if std == 0.0 or keys.size * width == 0:
        return torch.zeros((keys.size, width), dtype=dtype, device=device)
    float_type = np.float64 if wide else np.float32
    values = np.empty((keys.size, width), dtype=float_type)
    if _pairs_aligned(starts, width):
        # Whole pairs: one word, one radius and one angle per pair, its cosine to the even
        # element and its sine to the odd one (the same bits as the per-element form below).
        row_base = keys + (starts >> np.uint64(1)) * SPLITMIX_GAMMA
        pairs = torch.from_numpy(values).view(keys.size, width // 2, 2)
        for rows in _counter_blocks(keys.size, width):
            words = splitmix64_rows(row_base[rows], width // 2)
            low = torch.from_numpy(((words & np.uint64(0xFFFFFFFF)) + np.uint64(1)).astype(float_type))
            high = torch.from_numpy((words >> np.uint64(32)).astype(float_type))
            radius = low.mul_(2.0 ** -32).log_().mul_(-2.0).sqrt_().mul_(std)
            angle = high.mul_(2.0 * math.pi * 2.0 ** -32)
            torch.mul(torch.cos(angle), radius, out=pairs[rows, :, 0])
            torch.mul(torch.sin(angle), radius, out=pairs[rows, :, 1])
        return torch.from_numpy(values).to(device=device, dtype=dtype)
    offsets = np.arange(width, dtype=np.uint64)[None, :]
    for rows in _counter_blocks(keys.size, width):
        elements = starts[rows, None] + offsets
        words = splitmix64(keys[rows, None] + ((elements >> np.uint64(1)) + np.uint64(1)) * SPLITMIX_GAMMA)
        low = torch.from_numpy(((words & np.uint64(0xFFFFFFFF)) + np.uint64(1)).astype(float_type))
        high = torch.from_numpy((words >> np.uint64(32)).astype(float_type))
        radius = low.mul_(2.0 ** -32).log_().mul_(-2.0).sqrt_().mul_(std)
        angle = high.mul_(2.0 * math.pi * 2.0 ** -32)
        odd = torch.from_numpy((elements & np.uint64(1)).astype(bool))
        values[rows] = torch.where(odd, torch.sin(angle), torch.cos(angle)).mul_(radius).numpy()
    return torch.from_numpy(values).to(device=device, dtype=dtype)


def laplace_epsilon(sensitivity: float, scale: float) -> float:
    r"""Pure-DP ``ε = Δ₁ / b`` of the Laplace mechanism with L1 sensitivity ``Δ₁`` and scale ``b``.

    ``scale = 0`` (no noise) gives ``ε = inf`` unless the sensitivity is 0 too (then 0).
    Example (FedPCL-CDR, d = 64): ``laplace_epsilon(l1_sensitivity_of_l2_clip(0.2, 64), 0.1)``
    is 32.
    """
    sensitivity = _check_non_negative_finite(sensitivity, "sensitivity")
    scale = _check_non_negative_finite(scale, "scale")
    if sensitivity == 0.0:
        return 0.0
    if scale == 0.0:
        return math.inf
    return sensitivity / scale


def l1_sensitivity_of_l2_clip(max_norm: float, dim: int) -> float:
    r"""L1 sensitivity ``2·C·√d`` of a ``d``-dim vector clipped to L2 norm ``≤ C``.

    Replacing one vector by another of norm ≤ C changes it by at most ``2C`` in L2, and
    ``‖v‖₁ ≤ √d·‖v‖₂`` (tight for a vector with equal-magnitude coordinates).
    """
    max_norm = _check_non_negative_finite(max_norm, "max_norm")
    if int(dim) < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    return 2.0 * max_norm * math.sqrt(int(dim))


# --------------------------------------------------------------------------------------
# Clipping and the Gaussian mechanism
# --------------------------------------------------------------------------------------
def _leading_size(grads: Grads) -> int:
    if isinstance(grads, torch.Tensor):
        _require_float(grads, "grads")
        if grads.ndim < 1:
            raise ValueError("grads must have a leading per-sample dimension (C, ...)")
        return grads.shape[0]
    if not grads:
        raise ValueError("grads dict is empty")
    sizes = set()
    for name, tensor in grads.items():
        _require_float(tensor, f"grads[{name!r}]")
        if tensor.ndim < 1:
            raise ValueError(f"grads[{name!r}] must have a leading per-sample dimension (C, ...)")
        sizes.add(tensor.shape[0])
    if len(sizes) != 1:
        raise ValueError(f"all tensors in grads must share the leading size C, got {sorted(sizes)}")
    return sizes.pop()


def per_sample_norms(grads: Grads) -> torch.Tensor:
    r"""``(C,)`` L2 norm of each sample's (client's) gradient.

    For a tensor ``(C, ...)``: ``‖g_c‖₂`` over all non-leading dimensions. For a dict of
    such tensors: the joint norm ``sqrt(Σ_name ‖g_name[c]‖₂²)`` across all tensors of
    sample ``c``, i.e. the norm of the concatenated flat gradient.
    """
    _leading_size(grads)
    if isinstance(grads, torch.Tensor):
        return torch.linalg.vector_norm(grads.reshape(grads.shape[0], -1), dim=1)
    squared = [torch.linalg.vector_norm(t.reshape(t.shape[0], -1), dim=1) ** 2 for t in grads.values()]
    return torch.stack(squared).sum(dim=0).sqrt()


def clip_factors(norms: torch.Tensor, max_norm: float) -> torch.Tensor:
    r"""``(C,)`` clipping factors ``min(1, C / ‖g_c‖₂)`` for gradients of the given norms.

    The one formula every clipping path of the library shares: :func:`clip_per_sample` and
    the batched executor's per-client clipping (whose gradients are ragged row slots rather
    than a ``(C, ...)`` stack) both multiply by these factors. A zero norm gets factor 1.

    Args:
        norms: ``(C,)`` L2 norms ``≥ 0``.
        max_norm: clipping threshold ``C > 0``.
    """
    max_norm = _check_positive_finite(max_norm, "max_norm")
    # A zero-norm row would divide by zero; its factor is irrelevant (0 · anything = 0).
    return (max_norm / norms.clamp_min(torch.finfo(norms.dtype).tiny)).clamp(max=1.0)


def clip_per_sample(
    grads: Grads, max_norm: float, *, return_norms: bool = False
) -> Union[Grads, Tuple[Grads, torch.Tensor]]:
    r"""Scale each sample's gradient to L2 norm at most ``max_norm``.

    ``g_c ← g_c · min(1, C / ‖g_c‖₂)``: gradients already inside the ball are returned
    unchanged (factor exactly 1), larger ones are shrunk onto its surface.

    *Sample* means the unit the privacy guarantee protects. With per-example DP (DP-SGD)
    it is one training example; with user-level (local) DP in federated recommendation it
    is one client's whole contribution to a step, e.g. FedRKG clips the gradient of
    ``P_u`` computed on the client's mini-batch, every local step (see
    :func:`gaussian_mechanism`). The leading dimension of ``grads`` indexes these units,
    so one call clips all clients of a vectorised round at once.

    Args:
        grads: ``(C, ...)`` tensor, or dict of ``(C, ...)`` tensors clipped jointly per sample.
        max_norm: clipping threshold ``C > 0`` (L2).
        return_norms: also return the ``(C,)`` norms before clipping (to log how often
            clipping is active).

    Returns:
        Clipped gradients of the same structure (new tensors); with ``return_norms`` a
        tuple ``(clipped, norms)``.
    """
    max_norm = _check_positive_finite(max_norm, "max_norm")
    norms = per_sample_norms(grads)
    factor = clip_factors(norms, max_norm)

    def scale(tensor: torch.Tensor) -> torch.Tensor:
        return tensor * factor.to(tensor.dtype).reshape((-1,) + (1,) * (tensor.ndim - 1))

    clipped = scale(grads) if isinstance(grads, torch.Tensor) else {name: scale(t) for name, t in grads.items()}
    return (clipped, norms) if return_norms else clipped


def gaussian_noise_like(tensor: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """i.i.d. ``N(0, std²)`` noise with the shape, dtype and device of ``tensor``.

    Drawn with ``torch.randn`` on the generator's device (float64 for float64 tensors,
    float32 otherwise), then moved: a CPU generator gives the same numbers on any device.
    ``std = 0`` gives zeros.
    """
    _require_float(tensor, "tensor")
    std = _check_non_negative_finite(std, "std")
    _check_generator(generator)
    if std == 0.0:
        return torch.zeros_like(tensor)
    dtype = _sampling_dtype(tensor.dtype)
    noise = torch.randn(tensor.shape, generator=generator, device=generator.device, dtype=dtype) * std
    return noise.to(device=tensor.device, dtype=tensor.dtype)


def gaussian_mechanism(
    clipped_sum: Grads,
    max_norm: float,
    noise_multiplier: float,
    generator: torch.Generator,
) -> Grads:
    r"""Add ``N(0, (σ·C)²)`` noise to every coordinate of clipped gradients (or their sum).

    ``C = max_norm`` is the L2 sensitivity of one clipped contribution and ``σ =
    noise_multiplier``; accounting for repeated use is done by :func:`rdp_epsilon` with
    the same σ. Averaging (dividing by the batch size) is left to the caller.

    Two ways to use it:

    * central DP-SGD: clip per example, sum over the batch, call this once on the sum;
    * local / user-level DP in a vectorised round: clip each client's gradient with
      :func:`clip_per_sample` on the ``(C, ...)`` stack and call this on the stack — each
      row receives independent noise, i.e. each client noises its own upload.

    **FedRKG (paper §5.2) granularity.** Adjacency is *user-level*: two datasets differ in
    the whole local dataset of one client. During local training the gradient of the
    client's personal item table ``P_u`` is clipped to norm ``C`` at **every local step**
    (``∇ ← ∇·min(1, C/‖∇‖₂)``; the clipped unit is the client's mini-batch gradient, not a
    single example). Because only the accumulated update between two guidance rounds
    (every ``T_int`` rounds, ``E`` local steps per round, learning rate ``η``) is uploaded,
    the paper bounds its sensitivity by ``‖ΔP_u − ΔP'_u‖₂ ≤ 2·η·T_int·E·C``, then adds
    Gaussian noise to the gradients of ``P_u`` with standard deviation proportional to
    ``C`` and reports ε from a moments accountant via Opacus. Under user-level adjacency
    the client's data enter every one of its steps, so account with ``sample_rate = 1``
    (no amplification by subsampling) and ``steps`` = the number of noisy local steps.
    The experiments (Table 5) use "sensitivity 0.1 and σ = 0.001": read as C = 0.1 and
    noise std 0.001, the noise multiplier is 0.01, for which
    ``rdp_epsilon(0.01, 1.0, 1000, 1e-5)`` is about 5.5·10⁶ (read as Opacus'
    ``noise_multiplier = 0.001`` it is larger still). Either way there is no meaningful
    guarantee: the table measures the utility cost of clipping plus very small noise.
    (:func:`dp_epsilon` gives the same number from a
    :class:`~fedlib.engine.method.GradientNoise`, and 4× larger RDP under the paper's
    replace adjacency.)

    Args:
        clipped_sum: tensor or dict of tensors (already clipped / summed).
        max_norm: clipping norm ``C > 0`` used to clip the contributions.
        noise_multiplier: ``σ ≥ 0``; ``0`` returns an unchanged copy.
        generator: explicit ``torch.Generator``.

    Returns:
        Noisy copy of the same structure.
    """
    max_norm = _check_positive_finite(max_norm, "max_norm")
    noise_multiplier = _check_non_negative_finite(noise_multiplier, "noise_multiplier")
    _check_generator(generator)
    std = noise_multiplier * max_norm

    def noisy(tensor: torch.Tensor) -> torch.Tensor:
        _require_float(tensor, "clipped_sum")
        if std == 0.0:
            return tensor.clone()
        return tensor + gaussian_noise_like(tensor, std, generator)

    if isinstance(clipped_sum, torch.Tensor):
        return noisy(clipped_sum)
    # Iterate in a fixed (sorted) order so the noise a parameter gets does not depend on
    # dict insertion order.
    noisy_items = {name: noisy(clipped_sum[name]) for name in sorted(clipped_sum)}
    return {name: noisy_items[name] for name in clipped_sum}


# --------------------------------------------------------------------------------------
# Accounting (Opacus RDP accountant)
# --------------------------------------------------------------------------------------
def _validate_accounting_args(sample_rate: float, steps: int, delta: float) -> Tuple[float, int, float]:
    sample_rate = float(sample_rate)
    if not (0.0 < sample_rate <= 1.0):
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
    if int(steps) != steps or int(steps) < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps}")
    delta = float(delta)
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return sample_rate, int(steps), delta


def rdp_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    alphas: Optional[Sequence[float]] = None,
) -> float:
    r"""ε after ``steps`` uses of the subsampled Gaussian mechanism, by RDP accounting.

    Uses :class:`opacus.accountants.RDPAccountant`. Its ``history`` is a list of
    ``(noise_multiplier, sample_rate, num_steps)`` entries and ``step()`` merges
    consecutive identical steps into one entry, so setting
    ``history = [(σ, q, steps)]`` is exactly ``steps`` calls of
    ``step(noise_multiplier=σ, sample_rate=q)`` (Opacus' own ``get_noise_multiplier``
    does the same) without a Python loop over steps.

    Args:
        noise_multiplier: ``σ`` (noise std / clipping norm); ``0`` gives ``inf``.
        sample_rate: probability ``q ∈ (0, 1]`` that a unit's data enters a step
            (batch size / dataset size for DP-SGD; 1 for user-level LDP on own data;
            the client participation rate for client-level central DP).
        steps: number of noisy steps.
        delta: target ``δ ∈ (0, 1)``.
        alphas: RDP orders; Opacus' defaults when ``None``.

    Returns:
        ε (float) for ``(ε, δ)``-DP; 0 when ``steps == 0``.
    """
    noise_multiplier = _check_non_negative_finite(noise_multiplier, "noise_multiplier")
    sample_rate, steps, delta = _validate_accounting_args(sample_rate, steps, delta)
    if steps == 0:
        return 0.0
    if noise_multiplier == 0.0:
        return math.inf
    from opacus.accountants import RDPAccountant  # local import keeps `import fedlib` light

    accountant = RDPAccountant()
    accountant.history = [(noise_multiplier, sample_rate, steps)]
    return float(accountant.get_epsilon(delta=delta, alphas=list(alphas) if alphas is not None else None))


#: Neighbouring relations :func:`dp_epsilon` accounts for (both user-level: the unit is one
#: client's whole local data).
ADJACENCIES = ("add_remove", "replace")


def dp_epsilon(
    gradient_noise,
    *,
    steps_per_round: int,
    rounds: int,
    sample_rate: float,
    delta: float,
    adjacency: str = "add_remove",
) -> float:
    r"""User-level ε of one client that trains with :class:`~fedlib.engine.method.GradientNoise`.

    Accounting model (one client ``u``; the same bound holds for every client):

    * **user-level**: the protected unit is ``u``'s whole local data (all its interactions,
      hence also the negatives sampled for it). Nothing about other clients is assumed.
    * **per round**: when ``u`` takes part it runs ``k = steps_per_round`` noisy local steps;
      each is a Gaussian mechanism on a gradient clipped to ``C`` with noise std ``σ·C``
      (``σ = gradient_noise.noise_multiplier``). RDP adds up over adaptive steps, and ``k``
      Gaussian mechanisms of multiplier ``σ`` have exactly the RDP curve ``α·k / (2σ²)`` of one
      Gaussian mechanism of multiplier ``σ/√k``: a round is one mechanism of multiplier
      ``σ/√k``.
    * **over rounds**: ``u`` takes part in a round with probability ``q = sample_rate``
      (``clients_per_round / num_clients``; 1.0 when every client trains every round, as in
      FedRKG, and then nothing is amplified). The ``rounds`` rounds are composed by Opacus'
      RDP accountant (:func:`rdp_epsilon`) as ``rounds`` steps of the sampled Gaussian
      mechanism ``(σ/√k, q)``. Sampling is per round, not per local step: a participating
      client runs all its ``k`` steps, so ``rdp_epsilon(σ, q, k·rounds, δ)`` would be too
      optimistic for ``q < 1`` (for ``q = 1`` both agree). Opacus' amplification assumes
      Poisson sampling; the engine samples a fixed number of clients per round, the usual
      approximation.
    * **adjacency** (``Δ`` = L2 sensitivity of one clipped step):

      - ``"add_remove"`` (default; the convention of DP-SGD, Opacus and user-level
        DP-FedAvg): ``u``'s data present versus absent, i.e. a clipped gradient versus
        none, ``Δ = C``: the accountant sees ``σ``;
      - ``"replace"``: any two local datasets of ``u`` (how FedRKG §5.2 defines its LDP,
        "two global datasets differ only in the local dataset of a single client"; its own
        bound ``2ηT_int·E·C`` has the same factor 2): two clipped gradients can differ by
        ``Δ = 2C``, so the accountant sees ``σ/2``. Opacus' amplification formula is for
        add/remove, so this needs ``sample_rate = 1`` (not amplifying is a valid, if
        loose, bound for ``q < 1``: pass 1.0).

    Args:
        gradient_noise: a :class:`~fedlib.engine.method.GradientNoise`.
        steps_per_round: noisy local steps of the client per round, ``≥ 0``: its batches per
            round (``plan.num_steps``, local epochs included) times
            :attr:`~fedlib.engine.method.FederatedMethod.noised_steps_per_batch`. Clients
            differ; the largest count bounds them all.
        rounds: rounds the client may take part in, ``≥ 0``.
        sample_rate: ``q ∈ (0, 1]``.
        delta: target ``δ ∈ (0, 1)`` (e.g. ``1e-5``, or below ``1 / num_clients``).
        adjacency: one of :data:`ADJACENCIES`.

    Returns:
        ε of ``(ε, δ)``-DP; ``0`` without steps, ``inf`` with ``noise_multiplier = 0``.

    Example (FedRKG Table 5, "sensitivity 0.1 and σ = 0.001", read as clip norm 0.1 and noise
    std 0.001, one noisy step per round over 1000 rounds, every client every round)::

        dp_epsilon(GradientNoise.from_std(0.1, 0.001), steps_per_round=1, rounds=1000,
                   sample_rate=1.0, delta=1e-5)   # ≈ 5.5e6: no meaningful guarantee
    """
    from fedlib.engine.method import GradientNoise  # local import: method imports this module

    if not isinstance(gradient_noise, GradientNoise):
        raise TypeError(
            f"gradient_noise must be a GradientNoise, got {type(gradient_noise).__name__} "
            "(for a bare noise multiplier use GradientNoise(clip_norm, noise_multiplier) or rdp_epsilon)")
    if adjacency not in ADJACENCIES:
        raise ValueError(f"adjacency must be one of {ADJACENCIES}, got {adjacency!r}")
    for value, name in ((steps_per_round, "steps_per_round"), (rounds, "rounds")):
        if isinstance(value, bool) or int(value) != value or int(value) < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    steps_per_round, rounds = int(steps_per_round), int(rounds)
    sample_rate, rounds, delta = _validate_accounting_args(sample_rate, rounds, delta)
    if adjacency == "replace" and sample_rate < 1.0:
        raise ValueError(
            "amplification by client sampling is only accounted for add/remove adjacency; with "
            "adjacency='replace' pass sample_rate=1.0 (a valid bound without amplification)")
    if steps_per_round == 0 or rounds == 0:
        return 0.0
    sigma = float(gradient_noise.noise_multiplier) / (2.0 if adjacency == "replace" else 1.0)
    return rdp_epsilon(sigma / math.sqrt(steps_per_round), sample_rate, rounds, delta)


def noise_multiplier_for_epsilon(
    target_epsilon: float,
    sample_rate: float,
    steps: int,
    delta: float,
    epsilon_tolerance: float = 0.01,
) -> float:
    """Smallest noise multiplier σ (up to the tolerance) reaching ``target_epsilon`` after ``steps``.

    Wraps :func:`opacus.accountants.utils.get_noise_multiplier` with the RDP accountant
    (binary search on σ); the result satisfies ``rdp_epsilon(σ, ...) ≤ target_epsilon``.
    """
    target_epsilon = _check_positive_finite(target_epsilon, "target_epsilon")
    epsilon_tolerance = _check_positive_finite(epsilon_tolerance, "epsilon_tolerance")
    sample_rate, steps, delta = _validate_accounting_args(sample_rate, steps, delta)
    if steps == 0:
        raise ValueError("steps must be >= 1: zero steps spend no privacy at any noise level")
    from opacus.accountants.utils import get_noise_multiplier

    with warnings.catch_warnings():
        # The search evaluates very large trial σ, for which Opacus warns that the best RDP
        # order is at the edge of its grid; that concerns the trial values, not the answer.
        warnings.filterwarnings("ignore", message="Optimal order is the", category=UserWarning)
        sigma = get_noise_multiplier(
            target_epsilon=target_epsilon,
            target_delta=delta,
            sample_rate=sample_rate,
            steps=steps,
            accountant="rdp",
            epsilon_tolerance=epsilon_tolerance,
        )
    return float(sigma)
