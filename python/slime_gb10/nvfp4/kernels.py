"""Triton kernels for NVFP4 (filled in below); Triton is imported lazily."""

from __future__ import annotations


def triton_available() -> bool:
    return False
