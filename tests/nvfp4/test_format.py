"""The pure-PyTorch NVFP4 reference against hand-computed vectors and an independent brute-force oracle."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slime_gb10.nvfp4 import (
    E2M1_VALUES,
    NVFP4Tensor,
    dequantize,
    quantize,
    quantize_reference,
    relative_error,
)
from slime_gb10.nvfp4.format import pack_codes, unpack_codes

# ---------------------------------------------------------------------------------------------
# an independent oracle: brute force over every representable value, written without torch casts


def _all_e4m3_values() -> list[float]:
    """Every non-negative finite E4M3 (fn) value, by its definition: bias 7, 3 mantissa bits, max 448."""
    values = [m / 8 * 2.0**-6 for m in range(8)]  # subnormals (and 0)
    for e in range(1, 16):
        for m in range(8):
            if e == 15 and m == 7:  # the NaN encoding of e4m3fn
                continue
            values.append((1 + m / 8) * 2.0 ** (e - 7))
    return values


E4M3_VALUES = _all_e4m3_values()


def e4m3_oracle(v: float) -> tuple[float, int]:
    """Nearest E4M3 value to v >= 0 (ties: even mantissa), saturating at 448; returns (value, bits)."""
    v = min(v, 448.0)
    best = min(range(len(E4M3_VALUES)), key=lambda i: (abs(E4M3_VALUES[i] - v), i % 2))
    return E4M3_VALUES[best], best


def codes_of(q: NVFP4Tensor) -> torch.Tensor:
    return unpack_codes(q.data)


# ---------------------------------------------------------------------------------------------
# hand-computed vectors


def test_e2m1_rounding_boundaries_ties_to_even():
    # global_scale 1 and a block amax of 6 make the block scale exactly 1, so codes = e2m1_rne(x).
    x = torch.tensor([6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.2, 0.3, 5.1, -0.25, -0.75, -2.5, -5.0, -6])
    q = quantize_reference(x, global_scale=1.0)
    assert q.scale.float().tolist() == [1.0]
    assert codes_of(q).tolist() == [7, 0, 2, 2, 4, 4, 6, 6, 0, 1, 7, 8, 10, 12, 14, 15]


def test_every_code_decodes_to_the_e2m1_table():
    codes = torch.arange(16, dtype=torch.uint8)
    q = NVFP4Tensor(
        pack_codes(codes), torch.ones(1, dtype=torch.float8_e4m3fn), torch.tensor(1.0), (16,), torch.float32
    )
    assert dequantize(q).tolist() == list(E2M1_VALUES)
    assert [abs(v) for v in E2M1_VALUES[:8]] == [0, 0.5, 1, 1.5, 2, 3, 4, 6]


def test_packing_even_element_in_low_nibble():
    codes = torch.tensor([1, 2, 15, 0, 7, 8] + [0] * 10, dtype=torch.uint8)
    assert pack_codes(codes)[:3].tolist() == [0x21, 0x0F, 0x87]
    assert torch.equal(unpack_codes(pack_codes(codes)), codes)


def test_saturation_when_block_scale_clamps_at_448():
    # amax_block / (6 * 1) = 896 > 448: the scale saturates at 448, so x / 448 = [12, 6, -3] -> +-6 clamps.
    x = torch.tensor([12 * 448.0, 6 * 448.0, -3 * 448.0] + [0.0] * 13)
    q = quantize_reference(x, global_scale=1.0)
    assert q.scale.float().tolist() == [448.0]
    assert codes_of(q)[:4].tolist() == [7, 7, 13, 0]
    assert dequantize(q)[:3].tolist() == [6 * 448.0, 6 * 448.0, -3 * 448.0]


def test_zero_block_has_scale_zero_and_codes_zero():
    x = torch.zeros(2, 32)
    x[1, 16:] = torch.linspace(-1, 1, 16)
    q = quantize_reference(x)
    assert q.scale.float()[0].tolist() == [0.0, 0.0] and q.scale.float()[1, 0] == 0
    assert q.scale.float()[1, 1] > 0
    assert codes_of(q)[0].eq(0).all() and codes_of(q)[1, :16].eq(0).all()
    assert dequantize(q)[0].eq(0).all()


def test_all_zero_tensor_quantizes_to_zeros():
    q = quantize_reference(torch.zeros(3, 64, dtype=torch.bfloat16))
    assert float(q.global_scale) == 1.0  # not 0: avoids 0/0 (documented choice)
    assert q.data.eq(0).all() and q.scale.float().eq(0).all()
    out = dequantize(q)
    assert out.dtype == torch.bfloat16 and out.eq(0).all()


def test_negative_zero_and_tiny_negatives():
    x = torch.tensor([-0.0, -0.01, 0.01, 6.0] + [0.0] * 12)
    q = quantize_reference(x, global_scale=1.0)
    # sign bit is x < 0 (as ModelOpt): -0.0 -> code 0, a negative that rounds to zero -> code 8 (-0)
    assert codes_of(q)[:4].tolist() == [0, 8, 0, 7]
    out = dequantize(q, torch.float32)
    assert out[:3].abs().eq(0).all()


@pytest.mark.parametrize(
    ("amax_over_6", "scale", "bits"),
    [
        (3 * 2.0**-9, 3 * 2.0**-9, 0x03),  # a subnormal E4M3 scale, exact
        (2.5 * 2.0**-9, 2 * 2.0**-9, 0x02),  # tie between subnormals 2 and 3 -> even (2)
        (0.75 * 2.0**-9, 2.0**-9, 0x01),  # rounds up to the smallest subnormal
        (0.5 * 2.0**-9, 0.0, 0x00),  # tie between 0 and 2**-9 -> even (0): the block flushes to zero
        (2.0**-6 * 1.0625, 2.0**-6, 0x08),  # smallest normal, tie -> even mantissa
        (2.0**-6 * 1.1875, 2.0**-6 * 1.25, 0x0A),  # tie -> even mantissa (up)
    ],
)
def test_subnormal_e4m3_block_scales(amax_over_6, scale, bits):
    x = torch.zeros(16)
    x[3] = 6 * amax_over_6
    x[5] = -2 * amax_over_6
    q = quantize_reference(x, global_scale=1.0)
    assert q.scale.float().item() == scale
    assert q.scale.view(torch.uint8).item() == bits
    assert e4m3_oracle(amax_over_6) == (scale, bits)
    if scale == 0:
        assert codes_of(q).eq(0).all()
    else:
        expected = [_e2m1_oracle_code(v / scale) for v in x.tolist()]
        assert codes_of(q).tolist() == expected


def test_huge_dynamic_range():
    # Block amaxes spanning 2**-12 .. 1 of the tensor amax (the E4M3 scale range is 2**-9 .. 448,
    # i.e. a ratio of 2**17.8): every block keeps the format's ~10% error.
    x = torch.zeros(8, 32, dtype=torch.float64)
    for row, exponent in enumerate([100, 96, 92, 88, 97, 91, 99, 90]):
        x[row] = torch.linspace(-1, 0.7, 32, dtype=torch.float64) * 2.0**exponent
    q = quantize_reference(x)
    out = dequantize(q, torch.float64)
    assert torch.isfinite(out).all()
    for row in range(8):
        err = (out[row] - x[row]).norm() / x[row].norm()
        assert err < 0.2, (row, float(err))


def test_blocks_below_the_e4m3_range_flush_to_zero():
    x = torch.zeros(3, 16)
    x[0] = torch.linspace(-1e38, 1e38, 16)  # near the FP32 maximum: still finite
    x[1] = torch.linspace(-1e30, 1e30, 16)  # amax_block / (6 * gs) = 4.5e-6 < 2**-10: scale 0
    x[2] = torch.linspace(-3e35, 2e35, 16)
    q = quantize_reference(x)
    out = dequantize(q, torch.float64)
    assert torch.isfinite(out).all()
    assert q.scale.float()[1].eq(0).all() and out[1].eq(0).all()
    for row in (0, 2):
        err = (out[row] - x[row].double()).norm() / x[row].double().norm()
        assert err < 0.2, (row, float(err))


def test_user_global_scale_saturates_values_beyond_it():
    x = torch.tensor([100.0, 1.0] + [0.0] * 14)
    q = quantize_reference(x, global_scale=1 / 448)  # largest representable value: 6 * 448 * gs = 6
    assert dequantize(q)[0] == 6.0


def test_relative_error_on_gaussian_is_about_0_1():
    torch.manual_seed(0)
    x = torch.randn(256, 1024)
    err = relative_error(x, quantize_reference(x))
    assert 0.08 < err < 0.12, err


# ---------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize(
    ("x", "message"),
    [
        (torch.ones(4, 15), "multiple of 16"),
        (torch.ones(4, 16, dtype=torch.int32), "floating-point"),
        (torch.ones(4, 16, dtype=torch.bool), "floating-point"),
        (torch.tensor([float("nan")] + [0.0] * 15), "NaN"),
        (torch.tensor([0.0] * 15 + [float("inf")]), "Inf"),
        (torch.tensor([0.0] * 15 + [float("-inf")]).bfloat16(), "Inf"),
        (torch.tensor(1.0), "dimension"),
    ],
)
def test_bad_input_raises_value_error(x, message):
    with pytest.raises(ValueError, match=message):
        quantize(x)
    with pytest.raises(ValueError, match=message):
        quantize_reference(x)


@pytest.mark.parametrize("gs", [0.0, -1.0, float("nan"), float("inf"), torch.ones(2)])
def test_bad_global_scale_raises(gs):
    with pytest.raises(ValueError, match="global_scale"):
        quantize(torch.ones(16), global_scale=gs)


def test_float64_beyond_fp32_range_raises():
    with pytest.raises(ValueError, match="FP32 range"):
        quantize(torch.tensor([1e300] + [0.0] * 15, dtype=torch.float64))


def test_non_tensor_input_raises():
    with pytest.raises(ValueError, match=r"torch\.Tensor"):
        quantize([1.0] * 16)


@pytest.mark.parametrize("shape", [(0, 32), (4, 0), (2, 0, 16)])
def test_empty_tensor_gives_empty_result(shape):
    x = torch.empty(shape, dtype=torch.bfloat16)
    q = quantize(x)
    assert q.data.shape == (*shape[:-1], shape[-1] // 2)
    assert q.scale.shape == (*shape[:-1], shape[-1] // 16)
    out = dequantize(q)
    assert out.shape == shape and out.dtype == torch.bfloat16


# ---------------------------------------------------------------------------------------------
# properties on random shapes, against the brute-force oracle


def _e2m1_oracle_code(q: float) -> int:
    """Nearest E2M1 magnitude by brute force (ties to even index), sign from q < 0."""
    mags = [abs(v) for v in E2M1_VALUES[:8]]
    a = min(abs(q), 6.0)
    index = min(range(8), key=lambda i: (abs(mags[i] - a), i % 2))
    return index + (8 if q < 0 else 0)


def _random_tensor(seed: int, rows: int, blocks: int, dtype: torch.dtype, spread: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, blocks * 16, generator=g)
    x = x * torch.exp(spread * torch.randn(rows, blocks, 1, generator=g)).repeat_interleave(
        16, -1
    ).reshape_as(x)
    limit = torch.finfo(dtype).max / 2  # keep fp16 finite
    return x.clamp(-limit, limit).to(dtype)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    rows=st.integers(1, 5),
    blocks=st.integers(1, 4),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    spread=st.sampled_from([0.0, 2.0, 8.0]),
)
def test_matches_bruteforce_oracle(seed, rows, blocks, dtype, spread):
    x = _random_tensor(seed, rows, blocks, dtype, spread)
    q = quantize_reference(x)
    xf = x.float()
    amax = xf.abs().max()
    gs = torch.tensor(float(amax) / 2688, dtype=torch.float32) if amax > 0 else torch.tensor(1.0)
    assert torch.equal(q.global_scale, gs)
    codes = codes_of(q).reshape(rows, blocks, 16)
    for r in range(rows):
        for b in range(blocks):
            block = xf[r, b * 16 : (b + 1) * 16]
            s_f32 = (block.abs().max() / (torch.tensor(6.0) * gs)).item()
            scale, bits = e4m3_oracle(s_f32)
            assert q.scale[r, b].view(torch.uint8).item() == bits
            denom = (torch.tensor(scale, dtype=torch.float32) * gs).item()
            for k in range(16):
                v = block[k].item()
                expected = 0 if denom == 0 else _e2m1_oracle_code((torch.tensor(v) / denom).item())
                assert codes[r, b, k].item() == expected
    out = dequantize(q, torch.float32)
    assert out.shape == x.shape and torch.isfinite(out).all()


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    shape=st.lists(st.integers(1, 4), min_size=0, max_size=2),
    blocks=st.integers(1, 6),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
)
def test_dequantized_values_requantize_to_themselves(seed, shape, blocks, dtype):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, blocks * 16, generator=g) * 10 ** torch.randn(1, generator=g)).to(dtype)
    q = quantize(x)
    out = dequantize(q, torch.float32)
    again = quantize(out, global_scale=q.global_scale)
    assert torch.equal(dequantize(again, torch.float32), out)
    # the error of each element is at most half a step of the block's grid (1 step at +-6 saturation)
    step = q.scale.float().repeat_interleave(16, -1) * q.global_scale
    assert ((out - x.float()).abs() <= step * 1.0 + 1e-30).all()


def test_dequantize_dtype_and_rounding():
    x = torch.randn(8, 64)
    q = quantize(x)
    f32 = dequantize(q, torch.float32)
    assert dequantize(q).dtype == torch.float32
    assert torch.equal(dequantize(q, torch.bfloat16), f32.to(torch.bfloat16))
    assert math.isclose(float(q.nbytes), 8 * 64 * 4.5 / 8 + 4)
