"""Device selection: CUDA when present, CPU otherwise; ``FEDLIB_DEVICE`` overrides."""
from __future__ import annotations

import os

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
