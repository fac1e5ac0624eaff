r"""Many clients' Adam step in compiled loops (the hot part of :func:`fedlib.engine.method.masked_adam_step`).

The torch formulation of the masked, per-client Adam step reads and writes its tensors about
ten times (weight decay, ``lerp``, ``mul``/``addcmul``, ``sqrt``, two divisions, the per-row
step sizes gathered and broadcast, and ``torch.where`` copies when not every row steps). Here
it is three passes: :func:`adam_moments` (both moments, one loop), ``torch.sqrt`` of the
second moment (torch's own: its CPU square root, MKL's, is not always the correctly rounded
one, about one float32 value in five differs by an ulp from ``np.sqrt``, and the result must
be the same bits), and :func:`adam_params` (the parameter update, one loop). Rows whose client
does not step are skipped (left bit for bit as they are).

The arithmetic is the torch formulation's, operation by operation and in the tensors' dtype
(float32 stays float32: every constant is handed over as an array of that dtype, so numba does
not promote to float64): ``g ← grad + wd·param``, ``m ← lerp(m, g, 1 − β₁)``,
``v ← v·β₂ + (1 − β₂)·g·g``, ``param ← param − (s_t·m) / (√v / b_t + ε)``, with the three
multiply–adds fused (one rounding) exactly where torch's CPU kernels fuse them (``add`` with
``alpha``, ``lerp``, ``addcmul``), so the results are the same bits (a float32 training run
is chaotic enough that an ulp per step moves its metrics; ``tests/test_masked_adam.py``).

numba compiles the loops on first use per dtype and memory layout (a second or two, cached on
disk next to this file when the folder is writable).
"""
from __future__ import annotations

import numba
import numpy as np
from numba.extending import intrinsic

__all__ = ["adam_moments", "adam_params"]


@intrinsic
def _fma(typingctx, a, b, c):  # pragma: no cover - compiled
    """``a·b + c`` rounded once (LLVM's ``llvm.fma``), as torch's vectorised kernels compute it."""
    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return a(a, b, c), codegen


# error_model="numpy": IEEE division (inf/nan, as torch) instead of a zero-divisor check per
# division, which also keeps LLVM from vectorising the loop (about 8x slower). No fastmath: no
# reassociation or contraction into fused multiply-adds: each operation rounds as written, and
# the multiply-adds torch fuses are fused explicitly (_fma).
@numba.njit(cache=True, nogil=True, error_model="numpy")
def _adam_moments(param, grad, exp_avg, exp_avg_sq, row_stepping, constants):  # pragma: no cover - compiled
    weight, beta2, one_minus_beta2, weight_decay = constants[0], constants[1], constants[2], constants[4]
    weight_minus_one = constants[5]  # for torch.lerp's large-weight form, rounded in the dtype
    small_weight = abs(weight) < 0.5  # torch.lerp picks its form so
    decay = weight_decay != 0
    rows, width = param.shape
    for r in range(rows):
        if not row_stepping[r]:
            continue
        for e in range(width):
            g = grad[r, e]
            if decay:
                g = _fma(weight_decay, param[r, e], g)  # grad.add(param, alpha=wd)
            m = exp_avg[r, e]
            # lerp(m, g, w): m + w·(g − m), or g + (w − 1)·(g − m) for w ≥ 0.5
            exp_avg[r, e] = _fma(weight, g - m, m) if small_weight else _fma(weight_minus_one, g - m, g)
            exp_avg_sq[r, e] = _fma(one_minus_beta2 * g, g, exp_avg_sq[r, e] * beta2)  # mul_(β₂).addcmul_


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _adam_params(param, exp_avg, sqrt_exp_avg_sq, row_stepping, row_count, step_size, bias2_sqrt,
                 constants):  # pragma: no cover - compiled
    eps = constants[3]
    rows, width = param.shape
    for r in range(rows):
        if not row_stepping[r]:
            continue
        t = row_count[r]
        size, b2 = step_size[t], bias2_sqrt[t]
        for e in range(width):
            param[r, e] = param[r, e] - (size * exp_avg[r, e]) / (sqrt_exp_avg_sq[r, e] / b2 + eps)


def adam_moments(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray,
                 row_stepping: np.ndarray, constants: np.ndarray) -> None:
    """In place, on the stepping rows: ``exp_avg ← lerp(exp_avg, g, 1 − β₁)`` and
    ``exp_avg_sq ← exp_avg_sq·β₂ + (1 − β₂)·g·g`` with ``g = grad + wd·param``.

    Args:
        param, grad, exp_avg, exp_avg_sq: ``(N, E)`` arrays of one float dtype (any strides;
            the moments are written in place, so they may be views of a caller's storage).
        row_stepping: ``(N,) bool`` the rows whose client steps (the others are not touched).
        constants: ``(6,)`` in the dtype: ``1 − β₁`` (lerp weight), ``β₂``, ``1 − β₂``, ``ε``,
            weight decay, and ``(1 − β₁) − 1`` (rounded in the dtype, for lerp's large-weight form).
    """
    if param.size:
        _adam_moments(param, grad, exp_avg, exp_avg_sq, row_stepping, constants)


def adam_params(param: np.ndarray, exp_avg: np.ndarray, sqrt_exp_avg_sq: np.ndarray, row_stepping: np.ndarray,
                row_count: np.ndarray, step_size: np.ndarray, bias2_sqrt: np.ndarray, constants: np.ndarray) -> None:
    """In place, on the stepping rows: ``param ← param − (s_t·exp_avg) / (√exp_avg_sq / b_t + ε)``.

    Args:
        param, exp_avg: ``(N, E)`` (``param`` written in place; any strides).
        sqrt_exp_avg_sq: ``(N, E)`` ``torch.sqrt`` of the updated second moment (torch's, not
            recomputed here: torch's CPU square root is not always the correctly rounded one,
            and the result must be the same bits).
        row_stepping: ``(N,) bool``; row_count: ``(N,) int64`` each row's step count ``t ≥ 1``.
        step_size: ``(T,)`` ``lr / (1 − β₁^t)`` for every count ``t < T`` in use, in the dtype.
        bias2_sqrt: ``(T,)`` ``√(1 − β₂^t)``, in the dtype.
        constants: as :func:`adam_moments`.
    """
    if param.size:
        _adam_params(param, exp_avg, sqrt_exp_avg_sq, row_stepping, row_count, step_size, bias2_sqrt, constants)
