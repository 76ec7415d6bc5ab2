"""The NVFP4 format, exactly as NVIDIA's ModelOpt / TransformerEngine store it, in pure PyTorch.

This module is the reference (the oracle for every kernel): it runs on any device and is
written for clarity, not speed.

Format (NVIDIA, "Pretraining LLMs with NVFP4", arXiv:2509.25149; ModelOpt ``NVFP4QTensor``):

* element: FP4 E2M1, magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}; a 4-bit code is ``sign * 8 + index``;
* block: 16 consecutive elements along the last dimension share one FP8 E4M3 scale ``s``;
* tensor: one FP32 ``global_scale = amax / (6 * 448)`` (ModelOpt's ``weight_scale_2``);
* ``s = e4m3_rne(amax_block / (6 * global_scale))``;
  ``code = e2m1_rne(x / (s * global_scale))`` saturating at +-6, ties to even;
  ``value = e2m1(code) * (s * global_scale)``;
* packing: two codes per byte, the even element in the low nibble.

Choices made where the format leaves room (each one is tested):

* Arithmetic is FP32 and follows the formula literally: ``6 * global_scale`` then a correctly
  rounded division for ``s``; ``s * global_scale`` then a correctly rounded division for the
  element (NVIDIA's CUDA kernels multiply by a reciprocal instead, which can differ by one ulp
  right at an E2M1 rounding boundary). The Triton kernel uses the same operations bit for bit.
* A block whose scale rounds to 0 (an all-zero block, or one below E4M3's smallest subnormal
  relative to the tensor's amax) stores scale 0 and codes 0, as SGLang's FP4 quantizer does.
  ModelOpt writes 1.0 (or 2**-9) there instead; both decode to the same zeros for all-zero blocks.
  Everywhere else our bytes are ModelOpt's (``tests/nvfp4/test_modelopt_parity.py`` runs it).
* The sign bit is ``x < 0`` (as ModelOpt's ``_cast_fp4``): ``-0.0`` gets code 0, a small negative
  number that rounds to zero gets code 8 (``-0``); both dequantize to a zero.
* An all-zero (or empty) tensor gets ``global_scale = 1.0`` instead of ``0`` (which would make
  ``amax_block / (6 * global_scale)`` a 0/0); its codes and scales are all zero either way.
* Input is converted to FP32 first (exact for BF16/FP16; FP64 is rounded to FP32).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

BLOCK_SIZE = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E4M3_MIN_SUBNORMAL = 2.0**-9
#: ``global_scale = amax / GLOBAL_SCALE_DIVISOR``
GLOBAL_SCALE_DIVISOR = E2M1_MAX * E4M3_MAX  # 2688

#: E2M1 value of each 4-bit code (bit 3 is the sign).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

#: Round-to-nearest-even decision points between consecutive E2M1 magnitudes. At a boundary
#: equal to the midpoint, the tie goes to the neighbour with the even code index: 0.25 -> 0,
#: 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0, 5.0 -> 4.0.
E2M1_BOUNDARIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
#: True where a magnitude exactly at the boundary rounds up (to an even index).
E2M1_TIE_ROUNDS_UP = (False, True, False, True, False, True, False)

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclass
class NVFP4Tensor:
    """A tensor in NVFP4: packed E2M1 codes, E4M3 block scales, one FP32 global scale.

    ``data``: uint8 ``[..., K/2]`` (even element in the low nibble);
    ``scale``: ``torch.float8_e4m3fn`` ``[..., K/16]``;
    ``global_scale``: FP32 scalar tensor; ``shape``/``dtype``: those of the original tensor.
    """

    data: torch.Tensor
    scale: torch.Tensor
    global_scale: torch.Tensor
    shape: torch.Size
    dtype: torch.dtype

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        """Bytes in memory: 4 bits per element + 1 byte per 16 elements + 4 (the global scale)."""
        return self.data.numel() + self.scale.numel() + 4

    def to(self, device: torch.device | str) -> NVFP4Tensor:
        return NVFP4Tensor(
            self.data.to(device),
            self.scale.to(device),
            self.global_scale.to(device),
            self.shape,
            self.dtype,
        )


# ---------------------------------------------------------------------------------------------
# validation


def check_quantizable(x: torch.Tensor) -> None:
    """Raise ``ValueError`` naming the problem if ``x`` cannot be quantized to NVFP4.

    Checks dtype and shape only (cheap, no device sync); :func:`check_finite` checks the values.
    """
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"NVFP4 quantize expects a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(
            f"NVFP4 quantize expects a floating-point tensor (bfloat16, float16, float32 or float64), "
            f"got dtype {x.dtype}; convert it first, e.g. x.to(torch.bfloat16)"
        )
    if x.dim() == 0:
        raise ValueError("NVFP4 quantize needs at least one dimension (blocks run along the last one)")
    if x.shape[-1] % BLOCK_SIZE != 0:
        raise ValueError(
            f"NVFP4 quantize needs the last dimension to be a multiple of {BLOCK_SIZE} "
            f"(one E4M3 scale per {BLOCK_SIZE} elements), got shape {tuple(x.shape)}; pad it first"
        )


def check_finite(x: torch.Tensor) -> None:
    """Raise ``ValueError`` if ``x`` holds a NaN or an Inf (NVFP4 has no encoding for them)."""
    if x.numel() and not bool(torch.isfinite(x).all()):
        n_nan = int(torch.isnan(x).sum())
        n_inf = int(torch.isinf(x).sum())
        raise ValueError(
            f"NVFP4 quantize got non-finite values ({n_nan} NaN, {n_inf} Inf) in a tensor of shape "
            f"{tuple(x.shape)}; NVFP4 cannot represent them: find where they come from"
        )


def as_global_scale(global_scale: float | torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """Validate a user-supplied global scale (finite, > 0) and return it as an FP32 scalar tensor."""
    gs = torch.as_tensor(global_scale, dtype=torch.float32).detach()
    if gs.numel() != 1:
        raise ValueError(f"global_scale must be a scalar, got a tensor of shape {tuple(gs.shape)}")
    value = float(gs)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(
            f"global_scale must be finite and > 0, got {value}; leave it None to use amax / (6 * 448)"
        )
    return gs.reshape(()).to(device)


def global_scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """``amax / (6 * 448)`` in FP32; 1.0 where that is 0 (all-zero tensor), to avoid 0/0 later."""
    amax = amax.to(torch.float32)
    # a tensor divisor: a correctly rounded division on every device (CUDA turns division by a
    # Python scalar into multiplication by its reciprocal, which can differ in the last bit)
    # (torch.full, not torch.tensor: a fill on the device rather than a copy from the host, which
    # would wait for the GPU)
    gs = amax / torch.full((), GLOBAL_SCALE_DIVISOR, dtype=torch.float32, device=amax.device)
    return torch.where(gs > 0, gs, torch.ones_like(gs)).reshape(())


# ---------------------------------------------------------------------------------------------
# element and scale rounding


def e2m1_round_to_code(q: torch.Tensor) -> torch.Tensor:
    """Round FP32 values (already divided by the block scale) to 4-bit E2M1 codes (uint8).

    Round to nearest, ties to even, saturating at +-6: the index is the number of decision
    points the magnitude passes (``>`` where a tie rounds down, ``>=`` where it rounds up).
    The sign bit is ``q < 0``.
    """
    a = q.abs()
    index = torch.zeros(q.shape, dtype=torch.uint8, device=q.device)
    for boundary, tie_up in zip(E2M1_BOUNDARIES, E2M1_TIE_ROUNDS_UP):
        index += (a >= boundary) if tie_up else (a > boundary)
    return index + (q < 0).to(torch.uint8) * 8


def e2m1_code_to_float(codes: torch.Tensor) -> torch.Tensor:
    """FP32 value of each 4-bit code."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    return table[codes.long()]


def e4m3_round(s: torch.Tensor) -> torch.Tensor:
    """Round non-negative FP32 block scales to E4M3 (RNE, subnormals kept), clamped at 448.

    ``torch``'s cast is round-to-nearest-even; its overflow behaviour differs between devices
    (saturate or NaN), so values are clamped to 448 first.
    """
    return s.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte along the last dimension, the even element in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_codes(data: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: ``[..., K/2]`` bytes -> ``[..., K]`` codes."""
    low = data & 0x0F
    high = data >> 4
    return torch.stack((low, high), dim=-1).reshape(*data.shape[:-1], data.shape[-1] * 2)


# ---------------------------------------------------------------------------------------------
# reference quantize / dequantize


def quantize_reference(x: torch.Tensor, global_scale: float | torch.Tensor | None = None) -> NVFP4Tensor:
    """Pure-PyTorch NVFP4 quantization of ``x`` (any device), the definition the kernels match."""
    check_quantizable(x)
    check_finite(x)
    xf = x.detach().to(torch.float32)
    if x.dtype == torch.float64 and xf.numel() and not bool(torch.isfinite(xf).all()):
        raise ValueError(
            "NVFP4 quantize got float64 values beyond the FP32 range (|x| > 3.4e38); NVFP4 computes in "
            "FP32: scale the tensor down first"
        )
    if global_scale is None:
        amax = xf.abs().amax() if xf.numel() else torch.zeros((), device=x.device)
        gs = global_scale_from_amax(amax)
    else:
        gs = as_global_scale(global_scale, x.device)

    blocks = xf.reshape(*x.shape[:-1], x.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)
    amax_block = blocks.abs().amax(dim=-1) if blocks.numel() else blocks.sum(dim=-1)
    scale = e4m3_round(amax_block / (E2M1_MAX * gs))
    denominator = (scale.to(torch.float32) * gs).unsqueeze(-1)
    safe = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    q = torch.where(denominator > 0, blocks / safe, torch.zeros_like(blocks))
    codes = e2m1_round_to_code(q).reshape(x.shape)
    return NVFP4Tensor(pack_codes(codes), scale, gs, x.shape, x.dtype)


def dequantize_reference(q: NVFP4Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``e2m1(code) * (s * global_scale)`` in FP32, then rounded once to ``dtype``."""
    dtype = dtype or q.dtype
    values = e2m1_code_to_float(unpack_codes(q.data))
    blocks = values.reshape(*values.shape[:-1], values.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)
    block_scale = q.scale.to(torch.float32) * q.global_scale.to(torch.float32)
    return (blocks * block_scale.unsqueeze(-1)).reshape(q.shape).to(dtype)


def relative_error(x: torch.Tensor, q: NVFP4Tensor) -> float:
    """``||x - dequantize(q)|| / ||x||`` in FP64 (about 0.1 on Gaussian data: the format's, not a bug)."""
    ref = x.detach().to(torch.float64)
    err = dequantize_reference(q, torch.float64) - ref
    denom = ref.norm()
    return float(err.norm() / denom) if denom > 0 else float(err.norm())
