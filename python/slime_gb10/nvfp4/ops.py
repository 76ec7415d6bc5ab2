"""The NVFP4 entry points: the Triton kernel on a CUDA tensor where Triton runs, the reference elsewhere.

The one place that chooses between :mod:`~slime_gb10.nvfp4.format` (the specification, pure torch)
and :mod:`~slime_gb10.nvfp4.kernels` (the GPU kernels, which import the specification): above both,
so neither imports the other's dispatch.
"""

from __future__ import annotations

import torch

from slime_gb10.nvfp4 import kernels
from slime_gb10.nvfp4.format import (
    NVFP4Tensor,
    check_quantizable,
    dequantize_reference,
    global_scale_from_amax,
    quantize_reference,
)


def quantize(
    x: torch.Tensor, global_scale: float | torch.Tensor | None = None, *, check_finite: bool = True
) -> NVFP4Tensor:
    """Quantize ``x`` (last dimension a multiple of 16) to NVFP4.

    On a CUDA tensor with Triton installed this runs the Triton kernel (bit-identical to
    :func:`~slime_gb10.nvfp4.format.quantize_reference`); elsewhere the reference. ``global_scale``
    defaults to ``amax / (6 * 448)``; a given one must be finite and > 0 (values beyond it saturate).

    Raises ``ValueError`` for a non-float dtype, a last dimension not a multiple of 16, or NaN/Inf.
    ``check_finite=False`` with a CUDA ``global_scale`` tensor costs no host sync (no NaN/Inf check:
    such blocks get NaN scales), for the training loop, where a non-finite weight shows in the loss.
    """
    check_quantizable(x)
    if x.is_cuda and x.numel() and kernels.triton_available():
        return kernels.quantize_triton(x, global_scale, check_finite=check_finite)
    return quantize_reference(x, global_scale)


def quantize_without_sync(x: torch.Tensor, global_scale: torch.Tensor | None = None) -> NVFP4Tensor:
    """:func:`quantize` as the training loop needs it (the QAT forward, the NVFP4 weight sync):
    ``global_scale`` None is ``amax(|x|) / (6 * 448)`` computed on the device, and no NaN/Inf check,
    so on a GPU nothing waits for it (a non-finite weight or input shows in the loss first).
    Bit-identical to ``quantize(x, global_scale)`` for finite ``x``."""
    if global_scale is None:
        if x.numel():
            global_scale = global_scale_from_amax(x.detach().abs().amax())
        else:  # an empty tensor has no amax; any scale quantizes it (to nothing)
            global_scale = torch.ones((), dtype=torch.float32, device=x.device)
    return quantize(x, global_scale, check_finite=False)


def dequantize(q: NVFP4Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Dequantize to ``dtype`` (default: the original dtype). Triton kernel on CUDA, else reference."""
    if q.data.is_cuda and q.data.numel() and kernels.triton_available():
        return kernels.dequantize_triton(q, dtype or q.dtype)
    return dequantize_reference(q, dtype)
