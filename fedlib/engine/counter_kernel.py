r"""SplitMix64 words of many counter streams in one compiled loop (the hot part of the counter-based noise).

:func:`fedlib.engine.privacy.counter_bits` defines the words: element pair ``j`` of a row with
base ``B`` is ``splitmix64(B + (j + 1)·γ)``. In numpy that is nine passes over a temporary
``uint64`` array per block (add, then three shift–xor pairs and two multiplies), about 8 ns
per 64-bit word on one core; the compiled loop below keeps each word in a register and writes
it once, about 1 ns. The words are integers, so both give exactly the same bits
(``tests/test_counter_noise.py`` compares them).

numba compiles the loop on first use (a second or two, cached on disk next to this file when
the folder is writable).
"""
from __future__ import annotations

import numba
import numpy as np

__all__ = ["splitmix64_rows", "laplace_uniforms", "scale_and_sign", "scale_sign_add_rows"]

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
# Typed constants: numba promotes uint64 mixed with a plain int literal to float64.
_S30, _S27, _S31, _ONE = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(1)


@numba.njit(cache=True, nogil=True)
def _splitmix64_rows(row_base, out):  # pragma: no cover - compiled; tested against numpy
    rows, pairs = out.shape
    for r in range(rows):
        z0 = row_base[r]
        for j in range(pairs):
            z = z0 + (np.uint64(j) + _ONE) * _GAMMA  # wraps mod 2^64
            z = (z ^ (z >> _S30)) * _MIX_1
            z = (z ^ (z >> _S27)) * _MIX_2
            out[r, j] = z ^ (z >> _S31)


def splitmix64_rows(row_base: np.ndarray, pairs: int) -> np.ndarray:
    """``(R, pairs) uint64``: ``splitmix64(row_base[r] + (j + 1)·γ)`` for ``j < pairs``.

    Args:
        row_base: ``(R,) uint64`` each row's ``K + (s/2)·γ`` (key ``K``, first element ``s``).
        pairs: 64-bit words per row (two 32-bit elements each), ``≥ 0``.
    """
    row_base = np.ascontiguousarray(row_base, dtype=np.uint64).reshape(-1)
    out = np.empty((row_base.size, int(pairs)), dtype=np.uint64)
    if out.size:
        _splitmix64_rows(row_base, out)
    return out


_MANTISSA_SHIFT, _LOW_BIT, _LOW_WORD, _HIGH_SHIFT = np.uint32(9), np.uint32(1), np.uint64(0xFFFFFFFF), np.uint64(32)
_TWO_23 = np.int64(1 << 23)
_INV_TWO_23 = np.float32(2.0 ** -23)


@numba.njit(cache=True, nogil=True)
def _laplace_uniforms(row_base, uniforms, negative):  # pragma: no cover - compiled; tested against numpy
    rows, width = uniforms.shape
    for r in range(rows):
        z0 = row_base[r]
        for j in range(width // 2):
            z = z0 + (np.uint64(j) + _ONE) * _GAMMA
            z = (z ^ (z >> _S30)) * _MIX_1
            z = (z ^ (z >> _S27)) * _MIX_2
            z = z ^ (z >> _S31)
            for half in range(2):
                word = np.uint32(z & _LOW_WORD) if half == 0 else np.uint32(z >> _HIGH_SHIFT)
                # v = 2 − f with f = 1 + m·2⁻²³ (m = top 23 bits): (2²³ − m)·2⁻²³, exact in float32
                mantissa = np.int64(word >> _MANTISSA_SHIFT)
                uniforms[r, 2 * j + half] = np.float32(_TWO_23 - mantissa) * _INV_TWO_23
                negative[r, 2 * j + half] = (word & _LOW_BIT) != np.uint32(0)


@numba.njit(cache=True, nogil=True)
def _scale_and_sign(values, row_factor, negative):  # pragma: no cover - compiled; tested against numpy
    rows, width = values.shape
    for r in range(rows):
        factor = row_factor[r]
        for e in range(width):
            x = values[r, e] * factor  # float32 × float32, one rounding, as torch's mul_
            values[r, e] = -x if negative[r, e] else x


def laplace_uniforms(row_base: np.ndarray, width: int, out: np.ndarray = None):
    """The uniforms and signs of float32 Laplace noise: ``(v, negative)``, both ``(R, width)``.

    Element ``2j + h`` of row ``r`` uses the low (``h = 0``) or high 32-bit half ``w`` of
    ``splitmix64(row_base[r] + (j + 1)·γ)``: ``v = 1 − ⌊w / 2⁹⌋·2⁻²³ ∈ (0, 1]`` (float32) and
    ``negative = w & 1``, as :func:`fedlib.engine.privacy.laplace_from_counters` defines them.

    Args:
        row_base: ``(R,) uint64`` each row's ``K + (s/2)·γ``.
        width: elements per row, even.
        out: ``(R, width) float32`` C-contiguous array to write ``v`` into (default: a new one).
    """
    row_base = np.ascontiguousarray(row_base, dtype=np.uint64).reshape(-1)
    uniforms = np.empty((row_base.size, int(width)), dtype=np.float32) if out is None else out
    if uniforms.shape != (row_base.size, int(width)) or uniforms.dtype != np.float32 or not uniforms.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous ({row_base.size}, {int(width)}) float32 array")
    negative = np.empty((row_base.size, int(width)), dtype=np.bool_)
    if uniforms.size:
        _laplace_uniforms(row_base, uniforms, negative)
    return uniforms, negative


def scale_and_sign(values: np.ndarray, row_factor: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """In place: ``values[r, e] ← ±values[r, e]·row_factor[r]`` (minus where ``negative``); float32.

    Args:
        values: ``(R, width) float32`` C-contiguous (e.g. ``ln v``).
        row_factor: ``(R,) float32`` (e.g. ``−b`` or ``−b·w_r``).
        negative: ``(R, width) bool``.
    """
    if values.size:
        _scale_and_sign(values, np.ascontiguousarray(row_factor, dtype=np.float32), negative)
    return values


@numba.njit(cache=True, nogil=True)
def _scale_sign_add_rows(values, row_factor, negative, destination, table):  # pragma: no cover - compiled
    rows, width = values.shape
    for r in range(rows):
        factor = row_factor[r]
        target = destination[r]
        for e in range(width):
            x = values[r, e] * factor  # as _scale_and_sign
            table[target, e] += -x if negative[r, e] else x  # one rounding, as index_add_


def scale_sign_add_rows(values: np.ndarray, row_factor: np.ndarray, negative: np.ndarray, destination: np.ndarray,
                        table: np.ndarray) -> None:
    """In place: ``table[destination[r]] += ±values[r]·row_factor[r]`` (minus where ``negative``), rows in order.

    :func:`scale_and_sign` followed by ``index_add_`` in one pass, with the same float32 bits:
    each element is rounded once by the product and once by the addition, and the rows are added
    in increasing ``r`` as ``index_add_`` on the CPU adds them (``tests/test_counter_noise.py``).
    Saves writing the noise and reading it back: the upload noise of a round is summed into the
    aggregate without being kept.

    Args:
        values: ``(R, width) float32`` C-contiguous (e.g. ``ln v``); left unchanged.
        row_factor: ``(R,) float32``.
        negative: ``(R, width) bool``.
        destination: ``(R,) int64`` row of ``table`` that row ``r`` is added to, in ``[0, T)``.
        table: ``(T, width) float32`` C-contiguous, updated in place.
    """
    destination = np.ascontiguousarray(destination, dtype=np.int64)
    if table.dtype != np.float32 or not table.flags.c_contiguous or table.ndim != 2 or table.shape[1] != values.shape[1]:
        raise ValueError(f"table must be a C-contiguous (T, {values.shape[1]}) float32 array, got "
                         f"{table.dtype} {table.shape}")
    if destination.shape != values.shape[:1]:
        raise ValueError(f"destination must have one row index per row ({values.shape[0]}), got {destination.shape}")
    if destination.size and (destination.min() < 0 or destination.max() >= table.shape[0]):
        raise ValueError(f"destination rows must lie in [0, {table.shape[0]})")
    if values.size:
        _scale_sign_add_rows(values, np.ascontiguousarray(row_factor, dtype=np.float32), negative, destination, table)
