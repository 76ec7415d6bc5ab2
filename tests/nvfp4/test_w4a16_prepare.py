"""The fused W4A16 kernel's scale bytes (``w4a16_scale_codes``) and the prepared-weight cache of
``NVFP4Linear``: pure PyTorch, so they run here; the kernel itself is in test_kernels_*.py."""

from __future__ import annotations

import struct

import pytest
import torch
from torch import nn

from slime_gb10.nvfp4 import NVFP4Linear, kernels, quantize_reference


def e4m3_value(byte: int) -> float:
    """E4M3 (fn) value of a byte 0x00-0x7E, from the format's definition (bias 7, subnormals)."""
    e, m = (byte >> 3) & 15, byte & 7
    return m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)


def bf16_from_code(code: int) -> float:
    """What the kernel's ``scale_code_to_bf16`` computes: bits ``(code << 4) + (237 << 7)``."""
    bits = ((code << 4) + (237 << 7)) & 0xFFFF
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def test_every_e4m3_scale_round_trips_exactly_through_its_code():
    scales = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn)
    codes = kernels.w4a16_scale_codes(scales)
    assert codes.dtype == torch.uint8 and codes.shape == scales.shape
    for byte, code in zip(range(0x7F), codes.tolist(), strict=True):
        expected = e4m3_value(byte) * 2.0**119
        got = bf16_from_code(code)
        if byte == 0:
            assert code == kernels.ZERO_SCALE_CODE and got == 0.0  # -0.0: a zero block stays zero
        else:
            assert got == expected, (hex(byte), code, got, expected)
            assert code <= 143  # the codes of real scales never reach the zero code
    assert len(set(codes.tolist())) == 0x7F  # lossless: one code per scale


@pytest.mark.parametrize("bad", [0xFF, 0x7F, 0xB8])  # NaN, NaN, -1.0
def test_negative_or_nan_scales_are_refused(bad):
    scales = torch.tensor([0x38, bad], dtype=torch.uint8).view(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="finite and >= 0"):
        kernels.w4a16_scale_codes(scales)


def test_prepare_keeps_the_packed_bytes_and_checks_the_shape():
    q = quantize_reference(torch.randn(48, 64))
    p = kernels.prepare_w4a16(q)
    assert p.data.data_ptr() == q.data.data_ptr()  # not copied
    assert p.nbytes == q.nbytes  # same memory as the E4M3 scales it stands for
    assert torch.equal(p.global_scale, q.global_scale.reshape(1))
    flat = quantize_reference(torch.randn(2, 3, 64))
    with pytest.raises(ValueError, match="2-D weight"):
        kernels.prepare_w4a16(flat)


def test_nvfp4_linear_reprepares_when_its_buffers_change():
    torch.manual_seed(0)
    layer = NVFP4Linear.from_linear(nn.Linear(64, 32), backend="reference")
    first = layer._w4a16_prepared(layer.quantized_weight())
    assert layer._w4a16_prepared(layer.quantized_weight()) is first  # cached
    other = NVFP4Linear.from_linear(nn.Linear(64, 32), backend="reference")
    layer.load_state_dict(other.state_dict())  # in-place copies: version counters move
    second = layer._w4a16_prepared(layer.quantized_weight())
    assert second is not first
    assert torch.equal(second.scale_codes, kernels.w4a16_scale_codes(other.weight_scale))
    layer.set_quantized_weight(quantize_reference(torch.randn(32, 64)))
    assert layer._w4a16_prepared(layer.quantized_weight()) is not second


def test_cuda_kernel_split_plan():
    """About one wave of 4 blocks per SM, among splits that cut K into 128-multiples <= 1024 (hand-derived:
    14336 rows -> 112 tiles -> target 4.7 -> 4; 4096 rows -> 32 tiles -> 16.5 -> 16; 896 -> 7 tiles -> 75.4
    -> 38, the largest of 4864's splits with 128-multiples; 48 SMs -> 192 / 32 = 6 -> 4 or 8, tie to 4)."""
    from slime_gb10.nvfp4 import _cuda_w4a16 as cuda

    assert cuda.plan_split(14336, 4096, 132) == 4
    assert cuda.plan_split(4096, 14336, 132) == 16
    assert cuda.plan_split(4096, 4096, 132) == 16
    assert cuda.plan_split(896, 4864, 132) == 38
    assert cuda.plan_split(4096, 4096, 48) == 4
    assert cuda.plan_split(130, 4096, 132) is None  # N not a multiple of 128
    assert cuda.plan_split(4096, 4000, 132) is None  # K not a multiple of 128
