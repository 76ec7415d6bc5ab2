"""NVFP4 weights that a rollout engine decodes from (``rollout.weights: nvfp4``, issue #39).

:class:`DecodeWeight` holds one ``[N, K]`` weight as a ModelOpt checkpoint stores it (packed E2M1
codes, E4M3 block scales, the FP32 ``weight_scale_2``) and the fused kernel's scale codes, in buffers
that never move: a CUDA graph captured over them replays with whatever the last weight sync copied
in. :func:`decode_linear` multiplies by it through one custom op, ``slime_gb10::w4a16_linear``, so
that ``torch.compile`` traces a decode step around it (dynamo cannot trace the NVRTC launches) and the
CUDA graph captures its kernel. On a GPU the op runs the fused W4A16 kernel
(:func:`~slime_gb10.nvfp4.w4a16.w4a16_matmul`), which reads the 4-bit codes and never writes a BF16
weight; elsewhere the reference dequantization and a matmul, the same numbers for CPU tests.
"""

from __future__ import annotations

import torch

from slime_gb10.nvfp4.format import BLOCK_SIZE, NVFP4Tensor
from slime_gb10.nvfp4.ops import dequantize
from slime_gb10.nvfp4.w4a16 import FUSED_MAX_M, W4A16Weight, fused_pays, w4a16_matmul, w4a16_scale_codes


@torch.library.custom_op(
    "slime_gb10::w4a16_linear",
    mutates_args=(),
    schema="(Tensor x, Tensor data, Tensor scale, Tensor scale_codes, Tensor global_scale, Tensor? bias) -> Tensor",
)
def _w4a16_linear(x, data, scale, scale_codes, global_scale, bias):
    shape = torch.Size((data.shape[0], data.shape[1] * 2))
    if x.is_cuda and x.dtype == torch.bfloat16:
        return w4a16_matmul(x, W4A16Weight(data, scale_codes, global_scale, shape), bias)
    weight = dequantize(NVFP4Tensor(data, scale, global_scale, shape, x.dtype), x.dtype)
    return torch.nn.functional.linear(x, weight, bias)


@_w4a16_linear.register_fake
def _w4a16_linear_shape(x, data, scale, scale_codes, global_scale, bias):
    return x.new_empty((*x.shape[:-1], data.shape[0]))


class DecodeWeight:
    """An NVFP4 ``[N, K]`` weight in place for decoding: ``data`` uint8 ``[N, K/2]``, ``scale``
    E4M3 ``[N, K/16]``, ``scale_codes`` (the fused kernel's form of ``scale``, :func:`refresh`),
    ``global_scale`` FP32 ``[1]``. :meth:`rows` views a slice of the rows (q, k or v of a fused
    q/k/v weight), whose buffers are this weight's."""

    def __init__(self, shape: tuple[int, int], device: torch.device, *, _buffers=None):
        n, k = shape
        if k % BLOCK_SIZE:
            raise ValueError(f"an NVFP4 weight needs K a multiple of {BLOCK_SIZE}, got {tuple(shape)}")
        self.shape = torch.Size((n, k))
        if _buffers is None:
            _buffers = (
                torch.zeros((n, k // 2), dtype=torch.uint8, device=device),
                torch.zeros((n, k // BLOCK_SIZE), dtype=torch.float8_e4m3fn, device=device),
                torch.zeros((n, k // BLOCK_SIZE), dtype=torch.uint8, device=device),
                torch.ones((1,), dtype=torch.float32, device=device),
            )
        self.data, self.scale, self.scale_codes, self.global_scale = _buffers

    def rows(self, start: int, stop: int) -> DecodeWeight:
        """Rows ``start:stop``: views of this weight's codes and scales and the same global scale (one
        ``weight_scale_2`` for fused siblings, :func:`~slime_gb10.nvfp4.linear.shared_global_scale`)."""
        views = (
            self.data[start:stop],
            self.scale[start:stop],
            self.scale_codes[start:stop],
            self.global_scale,
        )
        return DecodeWeight((stop - start, self.shape[1]), self.data.device, _buffers=views)

    @property
    def nbytes(self) -> int:
        """What a decode step reads: the codes, the scale codes and the global scale."""
        return self.data.numel() + self.scale_codes.numel() + 4

    def tensor(self, dtype: torch.dtype = torch.bfloat16) -> NVFP4Tensor:
        return NVFP4Tensor(self.data, self.scale, self.global_scale.reshape(()), self.shape, dtype)

    @torch.no_grad()
    def refresh(self) -> None:
        """The fused kernel's scale codes from ``scale`` (after a copy into it), without a host sync:
        the scales come from our quantizer, and the sync checks them once (:func:`scales_valid`)."""
        self.scale_codes.copy_(w4a16_scale_codes(self.scale, check=False))

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return dequantize(self.tensor(dtype), dtype)


def scales_valid(weights) -> torch.Tensor:
    """A device bool: every block scale of ``weights`` finite and >= 0 (what the fused kernel's scale
    codes need), for one host sync per weight sync rather than one per weight."""
    flags = [((s := w.scale.to(torch.float32)) >= 0).logical_and(s.isfinite()).all() for w in weights]
    return torch.stack(flags).all() if flags else torch.ones((), dtype=torch.bool)


def decode_linear(x: torch.Tensor, weight: DecodeWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ dequantize(weight)^T (+ bias)``: the fused W4A16 kernel on a GPU (one custom op)."""
    return _w4a16_linear(x, weight.data, weight.scale, weight.scale_codes, weight.global_scale, bias)


def decode_pays(weight: DecodeWeight, rows: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a decode step of ``rows`` rows should multiply by the NVFP4 codes rather than by the
    engine's BF16 copy of the same weight: off a GPU always (the reference path: CPU runs test the
    wiring); on a GPU where the fused kernel was measured faster than a BF16 GEMM at this M
    (:func:`~slime_gb10.nvfp4.w4a16.fused_pays`). Above it a BF16 GEMM reads 3.6x the bytes but
    wins on compute (large decode batches). Decide before ``torch.compile`` traces the step (the
    decoder does, once per batch size): the answer may load NVRTC, which dynamo does not trace."""
    if torch.device(device).type != "cuda":
        return True
    if dtype != torch.bfloat16:  # the fused kernel takes BF16 activations; else it would dequantize
        return False
    n, k = weight.shape
    if rows > DECODE_MAX_ROWS or (rows > FUSED_MAX_M and n * k < DECODE_MIN_PARAMS):
        return False
    return fused_pays(rows, n, k, dtype, torch.device(device))


#: Where a decode step takes the codes, measured in the engine (``slime-gb10 bench decode``, an H100;
#: BENCHMARKS.md, "NVFP4 decode"): up to M = 16 everywhere (shape B's 0.5B body 1.05-1.22x BF16,
#: the 7B body 1.76-2.11x); above, only on weights of at least 16 M parameters (with every layer on
#: codes shape B ran 0.91-0.98x at M = 32-64, the 7B body 1.28-1.33x), and not above M = 64 (at
#: 128 rows: B 0.85x, C 0.83x, 7B 1.04x). These are the H100's; a GB10 takes them too until its own
#: are measured (``slime-gb10 verify``'s step bench-decode prints them; nothing feeds them back yet).
DECODE_MAX_ROWS = 64
DECODE_MIN_PARAMS = 1 << 24
