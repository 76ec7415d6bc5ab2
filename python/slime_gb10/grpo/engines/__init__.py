"""Rollout engines: ``torch`` (the portable PyTorch engine and its kernels), ``sglang_engine`` (GB10 production).

The torch engine's GPU kernels (``torch.sampling_kernel``, ``torch.decode_attention``, ``torch.step_kernel``) are
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
