"""Triton kernels for NVFP4: quantize (bit-identical to the reference) and dequantize.

Triton is imported lazily (``triton_available()``), so the package works without it. Every kernel
has a pure-PyTorch twin in :mod:`slime_gb10.nvfp4.format` and a test comparing them; the kernels
also run under ``TRITON_INTERPRET=1`` on a CPU (the tests use that), except the inline-PTX decoder
of the GEMM, which has a pure-Triton twin selected by ``use_asm=False``.

Quantize, per 16-element block (see ``format.py`` for the formula and the choices): one thread per
block; ``s = e4m3_rne(min(amax_block / (6 * gs), 448))`` and ``code = e2m1_rne(fl(x / (s * gs)))``
with correctly rounded quotients computed from one reciprocal per block (Markstein's theorem: two
FMAs per element instead of a division), an exact software RNE to E4M3 and one FP32 magic-number
addition for the E2M1 rounding. Bit-identical to the reference.

The fused W4A16 GEMM that decodes these bytes in its MMA loop: :mod:`slime_gb10.nvfp4.w4a16`.
"""

from __future__ import annotations

import functools
import os

import torch

from slime_gb10.nvfp4.format import (
    BLOCK_SIZE,
    NVFP4Tensor,
    as_global_scale,
    check_quantizable,
    global_scale_from_amax,
)


@functools.cache
def _triton():
    try:
        import triton
        import triton.language as tl
    except Exception:
        return None
    return triton, tl


def triton_available() -> bool:
    """True if Triton imports (kernels then run on CUDA tensors, or anywhere with TRITON_INTERPRET=1)."""
    return _triton() is not None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def _kernels():
    """Import the Triton kernels on first use (keeps ``import slime_gb10.nvfp4`` free of Triton)."""
    from slime_gb10.nvfp4 import _triton_kernels as k

    return {
        "amax": k.amax_kernel,
        "quantize": k.quantize_kernel,
        "dequantize": k.dequantize_kernel,
        "w4a16": k.w4a16_kernel,
        "w4a16_wide": k.w4a16_wide_kernel,
        "fma_probe": k.fma_probe_kernel,
    }


@functools.cache
def _interpreter_fma_is_fused() -> bool:
    """Under TRITON_INTERPRET, whether ``tl.fma`` rounds once (Triton >= 3.7's interpreter) or twice
    (older ones): the quantize kernel's reciprocal path needs a real FMA to be exact."""
    out = torch.zeros(1, dtype=torch.float32)
    _kernels()["fma_probe"][(1,)](out)
    return float(out) == 2.0**-24


# ---------------------------------------------------------------------------------------------
# quantize / dequantize

QUANTIZE_BLOCKS = 128  # 16-element blocks per program: 2048 elements, 4 KB of BF16
AMAX_BLOCK = 8192


def _check_device(x: torch.Tensor) -> None:
    if not (x.is_cuda or interpreting()):
        raise ValueError("the Triton NVFP4 kernels need a CUDA tensor (or TRITON_INTERPRET=1)")
    if not triton_available():
        raise ValueError("the Triton NVFP4 kernels need the 'triton' package (pip install triton)")


def _raise_if_not_finite(bits: int, x: torch.Tensor) -> None:
    if bits >= 0x7F800000:
        from slime_gb10.nvfp4.format import check_finite

        check_finite(x)  # raises with the counts of NaN and Inf
        raise ValueError(
            "NVFP4 quantize got float64 values beyond the FP32 range (|x| > 3.4e38); NVFP4 computes in "
            "FP32: scale the tensor down first"
        )


def amax_triton(x: torch.Tensor) -> torch.Tensor:
    """max |x| as an FP32 scalar tensor on x's device (one pass; NaN/Inf show up as >= Inf)."""
    x = x.contiguous().view(-1)
    if not x.numel():
        return torch.zeros((), dtype=torch.float32, device=x.device)
    programs = -(-x.numel() // AMAX_BLOCK)
    partial = torch.empty(programs, dtype=torch.int32, device=x.device)
    _kernels()["amax"][(programs,)](x, partial, x.numel(), BLOCK=AMAX_BLOCK)
    return partial.max().view(torch.float32).reshape(())


def quantize_triton(
    x: torch.Tensor,
    global_scale: float | torch.Tensor | None = None,
    *,
    blocks_per_program: int = QUANTIZE_BLOCKS,
    num_warps: int = 4,
    check_finite: bool = True,
    divide: bool = False,
) -> NVFP4Tensor:
    """Triton NVFP4 quantization, bit-identical to :func:`~slime_gb10.nvfp4.format.quantize_reference`.

    With ``global_scale=None`` a first pass computes the amax (and checks for NaN/Inf). With a
    given scale, one pass: blocks holding NaN/Inf get the scale byte 0x7F (E4M3 NaN, never
    produced for finite blocks), and ``check_finite`` looks for it in the scales (1/32 of the
    input's bytes; one host sync) and raises ``ValueError``. ``check_finite=False`` skips that,
    e.g. inside a CUDA graph: NaN/Inf input then leaves NaN scales. ``divide=True`` selects the
    literal variant (a correctly rounded division per element, same bits, slower).
    """
    check_quantizable(x)
    _check_device(x)
    if interpreting() and not divide and not _interpreter_fma_is_fused():
        divide = True  # this interpreter's tl.fma rounds twice: the division path stays exact
    shape, dtype = x.shape, x.dtype
    flat = x.detach().contiguous().view(-1)
    if flat.dtype == torch.float64:
        flat = flat.to(torch.float32)
    n_blocks = flat.numel() // BLOCK_SIZE
    data = torch.empty((*shape[:-1], shape[-1] // 2), dtype=torch.uint8, device=x.device)
    scale = torch.empty((*shape[:-1], shape[-1] // BLOCK_SIZE), dtype=torch.uint8, device=x.device)
    if global_scale is None:
        amax = amax_triton(flat)
        _raise_if_not_finite(int(amax.view(torch.int32)), x)
        gs = global_scale_from_amax(amax)
    elif isinstance(global_scale, torch.Tensor) and global_scale.is_cuda and not check_finite:
        gs = global_scale.detach().to(torch.float32)  # no validation (it would sync): caller's duty
    else:
        gs = as_global_scale(global_scale, x.device)
    gs = gs.reshape(1).contiguous()
    if n_blocks:
        _kernels()["quantize"][(-(-n_blocks // blocks_per_program),)](
            flat,
            data.view(torch.int32),  # two int32 words of codes per block (K/2 bytes: a multiple of 8)
            scale,
            gs,
            n_blocks,
            BLOCKS=blocks_per_program,
            DIVIDE=divide,
            num_warps=num_warps,
        )
        if global_scale is not None and check_finite and bool(((scale & 0x7F) == 0x7F).any()):
            _raise_if_not_finite(0x7F800000, x)
    return NVFP4Tensor(data, scale.view(torch.float8_e4m3fn), gs.reshape(()), shape, dtype)


def dequantize_triton(q: NVFP4Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Triton dequantization, bit-identical to :func:`~slime_gb10.nvfp4.format.dequantize_reference`."""
    _check_device(q.data)
    dtype = dtype or q.dtype
    out = torch.empty(q.shape, dtype=dtype, device=q.data.device)
    n_blocks = out.numel() // BLOCK_SIZE
    if n_blocks:
        grid = (-(-n_blocks // QUANTIZE_BLOCKS),)
        _kernels()["dequantize"][grid](
            q.data.contiguous(),
            q.scale.contiguous().view(torch.uint8),
            q.global_scale.to(torch.float32).reshape(1).contiguous(),
            out,
            n_blocks,
            BLOCKS=QUANTIZE_BLOCKS,
        )
    return out
