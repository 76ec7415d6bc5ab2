"""Rollout engines: ``torch_engine`` (portable reference), ``sglang_engine`` (GB10 production).

The torch engine's GPU kernels (``sampling_kernel``, ``decode_attention``, ``step_kernel``) are
Triton's, imported lazily: the package and its CPU path work without Triton.
"""

from __future__ import annotations

import functools


@functools.cache
def triton_importable() -> bool:
    """Whether ``import triton`` works here (the engine's kernels run only where it does)."""
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True
