"""Device selection (CUDA when present, CPU otherwise; ``FEDLIB_DEVICE`` overrides) and the
CPU memory allocator's settings (:func:`keep_freed_memory`, applied when fedlib is imported)."""
from __future__ import annotations

import ctypes
import os
import sys

import torch


def default_device() -> torch.device:
    """The device every notebook and benchmark uses unless told otherwise.

    ``FEDLIB_DEVICE=cpu`` (or ``cuda:1`` ...) forces a device; asking for CUDA on a
    machine without it is an error rather than a silent fall-back to the CPU.
    """
    requested = os.environ.get("FEDLIB_DEVICE", "").strip()
    if requested:
        device = torch.device(requested)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(
                f"FEDLIB_DEVICE={requested!r} asks for CUDA, but torch {torch.__version__} "
                "sees no GPU. Unset FEDLIB_DEVICE or set it to 'cpu'."
            )
        return device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# glibc's mallopt() parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
ALLOCATOR_SETTINGS = {"mmap_threshold": 32 << 20, "trim_threshold": 256 << 20, "top_pad": 64 << 20}
"""Bytes: blocks below ``mmap_threshold`` come from the heap; up to ``trim_threshold`` of freed
heap stays with the process, and the heap grows ``top_pad`` beyond each request."""


def keep_freed_memory(environ=os.environ) -> bool:
    """Make glibc's ``malloc`` keep freed memory for reuse instead of returning it to the OS.

    A training step here allocates and frees tensors of a few MB (a graph layer of 25k nodes
    × 64 floats is 6.6 MB). By default glibc serves many such blocks with ``mmap`` and unmaps
    them on ``free``, so the next step page-faults all of that memory in again: zero-filling
    and first writes then cost more than the arithmetic. With :data:`ALLOCATOR_SETTINGS`, a
    FedPCL-CDR local epoch on Phone-Sport's Phone graph takes 3.87 s instead of 4.50 s and one
    CSR product 1.40 ms instead of 1.91 ms (one thread, idle machine, ``benchmarks/allocator.py``).
    Numbers do not change, only where the memory comes from (the benchmark checks the trained
    parameters bit for bit).

    Does nothing (returns ``False``) off glibc, or when ``FEDLIB_KEEP_FREED_MEMORY=0``.
    Returns ``True`` when every setting was accepted.
    """
    if environ.get("FEDLIB_KEEP_FREED_MEMORY", "1").strip() == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only: musl has mallopt but no such call (AttributeError)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    accepted = [mallopt(_M_MMAP_THRESHOLD, ALLOCATOR_SETTINGS["mmap_threshold"]),
                mallopt(_M_TRIM_THRESHOLD, ALLOCATOR_SETTINGS["trim_threshold"]),
                mallopt(_M_TOP_PAD, ALLOCATOR_SETTINGS["top_pad"])]
    return all(value == 1 for value in accepted)
