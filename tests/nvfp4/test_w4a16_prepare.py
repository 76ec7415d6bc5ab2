"""The fused W4A16 kernel's scale bytes (``w4a16_scale_codes``) and the prepared-weight cache of
``NVFP4Linear``: pure PyTorch, so they run here; the kernel itself is in test_kernels_*.py."""

from __future__ import annotations

import struct

import pytest
import torch
from torch import nn

from slime_gb10.nvfp4 import NVFP4Linear, quantize_reference, w4a16


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
    codes = w4a16.w4a16_scale_codes(scales)
    assert codes.dtype == torch.uint8 and codes.shape == scales.shape
    for byte, code in zip(range(0x7F), codes.tolist(), strict=True):
        expected = e4m3_value(byte) * 2.0**119
        got = bf16_from_code(code)
        if byte == 0:
            assert code == w4a16.ZERO_SCALE_CODE and got == 0.0  # -0.0: a zero block stays zero
        else:
            assert got == expected, (hex(byte), code, got, expected)
            assert code <= 143  # the codes of real scales never reach the zero code
    assert len(set(codes.tolist())) == 0x7F  # lossless: one code per scale


@pytest.mark.parametrize("bad", [0xFF, 0x7F, 0xB8])  # NaN, NaN, -1.0
def test_negative_or_nan_scales_are_refused(bad):
    scales = torch.tensor([0x38, bad], dtype=torch.uint8).view(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="finite and >= 0"):
        w4a16.w4a16_scale_codes(scales)


def test_prepare_keeps_the_packed_bytes_and_checks_the_shape():
    q = quantize_reference(torch.randn(48, 64))
    p = w4a16.prepare_w4a16(q)
    assert p.data.data_ptr() == q.data.data_ptr()  # not copied
    assert p.nbytes == q.nbytes  # same memory as the E4M3 scales it stands for
    assert torch.equal(p.global_scale, q.global_scale.reshape(1))
    flat = quantize_reference(torch.randn(2, 3, 64))
    with pytest.raises(ValueError, match="2-D weight"):
        w4a16.prepare_w4a16(flat)


def test_nvfp4_linear_reprepares_when_its_buffers_change():
    torch.manual_seed(0)
    layer = NVFP4Linear.from_linear(nn.Linear(64, 32), backend="reference")
    first = layer._w4a16_prepared(layer.quantized_weight())
    assert layer._w4a16_prepared(layer.quantized_weight()) is first  # cached
    other = NVFP4Linear.from_linear(nn.Linear(64, 32), backend="reference")
    layer.load_state_dict(other.state_dict())  # in-place copies: version counters move
    second = layer._w4a16_prepared(layer.quantized_weight())
    assert second is not first
    assert torch.equal(second.scale_codes, w4a16.w4a16_scale_codes(other.weight_scale))
    layer.set_quantized_weight(quantize_reference(torch.randn(32, 64)))
    assert layer._w4a16_prepared(layer.quantized_weight()) is not second


def test_cuda_kernel_wide_block_plan():
    """M <= 8 takes 8-16 warps per block where that fits, hand-derived from ``wide_block_plan``'s rules.

    4096 x 4096, M = 1: 16 rows per stored token -> 16-row blocks (256 >= 132 / 2 of them); K parts =
    the power of two nearest 32 / 3 segments = 10.7 -> 8, all K-warps of one block (8 warps); minb =
    min(max(ceil(256 / 132), 16 / 8), 32 / 8) = 2; 4 segments per warp -> one segment deep.
    14336 rows: 896 blocks -> minb min(7, 4) = 4. M = 4 stores 4 tokens -> 64 rows: 14336 / 64 = 224
    blocks, two 32-row sets x 8 K-warps = 16 warps, minb min(max(2, 1), 2) = 2; 4096 / 64 = 64 < 66
    blocks -> 32 rows (two 16-row sets), minb 1. 896 x 4864: 38 segments / 3 = 12.7 -> 16 parts,
    ceil(38 / 16) = 3 segments per warp -> two deep. 4096 x 14336 at M = 4: 112 / 3 -> 16 parts, two
    row sets -> 8 K-warps per block x cluster 2, staging 56 segments x 256 B x 4 tokens = 56 KB."""
    from slime_gb10.nvfp4 import _cuda_w4a16 as cuda

    def wide(cluster, rw, depth, rows, minb, warps):
        return cuda.Plan(1, cluster, rw, depth, rows=rows, minb=minb, warps=warps)

    assert cuda.plan(1, 4096, 4096, 132) == wide(1, 1, 1, 16, 2, 8)
    assert cuda.plan(1, 14336, 4096, 132) == wide(1, 1, 1, 16, 4, 8)
    assert cuda.plan(4, 14336, 4096, 132) == wide(1, 2, 1, 32, 2, 16)
    assert cuda.plan(4, 4096, 4096, 132) == wide(1, 2, 1, 16, 1, 16)
    assert cuda.plan(1, 896, 4864, 132) == wide(1, 1, 2, 16, 1, 16)
    assert cuda.plan(1, 4096, 14336, 132) == wide(1, 1, 1, 16, 2, 16)
    assert cuda.plan(4, 4096, 14336, 132) == wide(2, 2, 1, 16, 2, 16)
    assert cuda.shared_bytes(cuda.plan(4, 4096, 14336, 132), 4, 14336) == 56 * 256 * 4
    # GB10's 48 SMs: 64-row blocks already give 64 >= 24 blocks; minb ceil(64 / 48) = 2
    assert cuda.plan(4, 4096, 4096, 48) == wide(1, 2, 1, 32, 2, 16)
    # where it does not fit, the four-warp tiling: 8 tokens x 56 segments x 256 B = 112 KB > 96 KB;
    # 896 x 4864 at M = 8: 38 segments x 256 B x 8 = 76 KB > 64 KB; K = 512: 4 segments < 8 parts
    for args in [(8, 4096, 14336, 132), (8, 896, 4864, 132), (1, 128, 512, 132)]:
        assert cuda.wide_block_plan(*args) is not None
        assert cuda.plan(*args) == cuda.four_warp_plan(*args)
    assert cuda.wide_block_plan(9, 4096, 4096, 132) is None
    # 5120 x 5120: 40 segments / 3 -> 16 parts, 3 segments a warp; 320 blocks of 16 warps are more than
    # one wave at 128 registers, so the ring would be one deep: the four-warp tiling instead
    assert cuda.wide_block_plan(1, 5120, 5120, 132) is None
    assert cuda.plan(1, 5120, 5120, 132) == cuda.four_warp_plan(1, 5120, 5120, 132)
    assert cuda.plan(16, 4096, 4096, 132) == cuda.two_tile_plan(16, 4096, 4096, 132)


def test_cuda_kernel_two_tile_plan():
    """M = 9..16 takes 8 warps on 32-256 rows, hand-derived from ``two_tile_plan``'s rules.

    4096 x 4096: K / 2 = 2048 -> cluster 2 (64 KB of activations a block); 256 rows give 16 x 2 = 32
    < 1.5 x 132 blocks, 128 rows 64 < 0.7 x 132 = 92.4, 64 rows 128 -> 4 row sets of 16 rows, 2
    K-warps, ceil(32 / 4) = 8 segments a warp -> two deep, 128 wide. 14336 x 4096: 128 rows give
    224 blocks -> 8 row sets, 1 K-warp, 16 segments -> one 256-wide segment deep. 27648 x 5120:
    2560 > 2048 -> cluster 4; 256 rows: 108 x 4 = 432 >= 198 -> 8 row sets of 32 rows, 10 segments
    -> 256 wide. 896 x 4864: cluster 4; 896 % 256, 28 and 56 blocks -> 32 rows (2 row sets, 4
    K-warps), ceil(38 / 16) = 3 segments -> two deep. 14336 x 4224 (33 segments): cluster 4, 256
    rows (56 x 4 = 224 >= 198 blocks), 9 segments a warp but K % 256 -> two deep, 128 wide. GB10's
    48 SMs: 4096 x 4096 gets 128 rows (64 >= 33.6 blocks)."""
    from slime_gb10.nvfp4 import _cuda_w4a16 as cuda

    def two(cluster, rw, depth, rows, loads):
        return cuda.Plan(2, cluster, rw, depth, rows=rows, loads=loads, minb=2, warps=8)

    assert cuda.plan(16, 4096, 4096, 132) == two(2, 4, 2, 16, 1)
    assert cuda.plan(9, 4096, 4096, 132) == two(2, 4, 2, 16, 1)
    assert cuda.shared_bytes(two(2, 4, 2, 16, 1), 16, 4096) == 64 * 1024
    assert cuda.plan(16, 14336, 4096, 132) == two(2, 8, 1, 16, 2)
    assert cuda.plan(16, 27648, 5120, 132) == two(4, 8, 1, 32, 2)
    assert cuda.plan(12, 896, 4864, 132) == two(4, 2, 2, 16, 1)
    assert cuda.plan(16, 14336, 4224, 132) == two(4, 8, 2, 32, 1)
    assert cuda.plan(16, 4096, 4096, 48) == two(2, 8, 1, 16, 2)
    assert cuda.two_tile_plan(8, 4096, 4096, 132) is None and cuda.two_tile_plan(17, 4096, 4096, 132) is None
    # K > 16384 would need more than 8 blocks a cluster: the four-warp tiling
    assert cuda.two_tile_plan(16, 4096, 32768, 132) is None
    assert cuda.plan(16, 4096, 32768, 132) == cuda.four_warp_plan(16, 4096, 32768, 132)


def test_cuda_kernel_wide_blocks_are_valid_only_within_the_hardware():
    """8 or 16 warps that ``rw`` divides, at most 64 warps per SM for ``minb`` blocks; the partials
    of 16 warps x 16 rows x 9 floats (9 KB) outgrow 8 KB of activations at M = 1, K = 4096."""
    from slime_gb10.nvfp4 import _cuda_w4a16 as cuda

    p = cuda.Plan(1, 1, 1, 1, rows=16, minb=1, warps=16)
    assert cuda.valid(p, 1, 4096, 4096)
    assert cuda.shared_bytes(p, 1, 4096) == 16 * 16 * 9 * 4
    assert not cuda.valid(p._replace(warps=12), 1, 4096, 4096)
    assert not cuda.valid(p._replace(warps=8, rw=16), 1, 4096, 4096)
    assert not cuda.valid(p._replace(minb=8), 1, 4096, 4096)  # 128 warps per SM
    assert not cuda.valid(p, 1, 4096, 128 * 15)  # 16 K-warps, 15 segments


def test_cuda_kernel_plan():
    """The four-warp tiling rules (``four_warp_plan``; ``plan`` takes them where the wide blocks do
    not fit), hand-derived. K is split into the power of two nearest to
    ``log2(8 * SMs * 32 / N)`` parts (cluster x K-warps), smallest cluster first: 14336 rows on 132 SMs
    -> 2.36 -> 2 parts -> 1 block x 2 K-warps (rw 2); 4096 rows -> 8.25 -> 8 -> cluster 2 x 4 K-warps;
    896 rows -> 37.7 -> 32 -> cluster 8 x 4; 48 SMs, 4096 rows -> 3 -> 4 (log distance 0.42 < 0.58).
    ``line`` (whole 128-byte lines into the L2) where a warp of the ring streams >= 8 segments with
    its activations staged once: 32 segments / 2 parts = 16 yes, / 8 parts = 4 no, 38 / 32 = 2 no,
    32 / 4 = 8 yes, 112 / 8 = 14 yes."""
    from slime_gb10.nvfp4 import _cuda_w4a16 as cuda

    def ring(nt, cluster, rw, line):  # the cp.async pipeline the rules prefer
        return cuda.Plan(nt, cluster, rw, 1, stages=3, minb=4, line=line)

    assert cuda.four_warp_plan(1, 14336, 4096, 132) == ring(1, 1, 2, True)
    assert cuda.four_warp_plan(4, 4096, 4096, 132) == ring(1, 2, 1, False)
    assert cuda.four_warp_plan(1, 896, 4864, 132) == ring(1, 8, 1, False)
    assert cuda.four_warp_plan(4, 4096, 4096, 48) == ring(1, 1, 1, True)
    # at M = 8 the same 4 parts: cluster 1 would stage 32 segments x 2 KB (+ 30 KB ring = 94 KB), so
    # cluster 2 x 2 K-warps (16 x 2 + 30 = 62 KB), see below
    assert cuda.four_warp_plan(8, 4096, 4096, 48) == ring(1, 2, 2, True)
    # M = 16, K = 14336, 8 parts: cluster 2 or 4 would stage 229 or 114 KB of activations; cluster 8
    # stages 57 KB, plus a 30 KB ring is over 64 KB, so the codes go through registers (256 wide)
    assert cuda.four_warp_plan(16, 4096, 14336, 132) == cuda.Plan(2, 8, 4, 2, rows=32, loads=2)
    # M = 17..32: the cp.async ring and the widest activation window within 96 KB (no lines: windows). 4096 rows: 8 parts
    # -> 4 segments per warp; a segment of 4 K-warps x 256 B x 8 tokens x 4 tiles is 32 KB, so with the
    # 30 KB ring a window of 2 (94 KB); 14336 rows: 2 K-warps -> 16 KB a segment, window 4; 896 rows
    # at M = 20: 32 parts -> 2 segments of 24 KB, all staged at once (window 0)
    assert cuda.four_warp_plan(32, 4096, 4096, 132) == cuda.Plan(4, 2, 1, 1, stages=3, window=2)
    assert cuda.four_warp_plan(32, 14336, 4096, 132) == cuda.Plan(4, 1, 2, 1, stages=3, window=4)
    assert cuda.four_warp_plan(20, 896, 4864, 132) == cuda.Plan(3, 8, 1, 1, stages=3)
    # M = 5..8 stores 8 tokens: tilings over 64 KB come after the others with as many K parts.
    # 4096 x 14336, 8 parts: cluster 2 stages 56 segments x 2 KB = 112 KB (does not fit), cluster 4
    # 28 x 2 KB + 30 KB ring = 86 KB, cluster 8 14 x 2 KB + 30 KB = 58 KB; 14336 x 4096, 2 parts:
    # cluster 1 (2 K-warps) 64 + 30 KB, cluster 2 (4 row warps, 1 K-warp) 32 + 30 KB; 4096 x 4096
    # keeps cluster 2 (16 x 2 + 30 = 62 KB); M = 4 stores 4 tokens and keeps the old order.
    assert cuda.four_warp_plan(8, 4096, 14336, 132) == ring(1, 8, 4, True)
    assert cuda.four_warp_plan(5, 4096, 14336, 132) == ring(1, 8, 4, True)
    assert cuda.four_warp_plan(8, 14336, 4096, 132) == ring(1, 2, 4, True)
    assert cuda.four_warp_plan(8, 4096, 4096, 132) == ring(1, 2, 1, False)
    assert cuda.four_warp_plan(4, 4096, 14336, 132) == ring(1, 2, 1, True)  # 112 / 8 = 14
    # the field reaches the ring's copies in the source, and only there
    assert '#define RING_L2 ".L2::128B"' in cuda._source(ring(1, 1, 2, True))
    assert '#define RING_L2 ""' in cuda._source(ring(1, 2, 1, False))
    assert cuda._source(ring(1, 1, 2, True)).count('shared.global" RING_L2 " [') == 2
    assert cuda.four_warp_plan(33, 4096, 4096, 132) is None
    assert cuda.four_warp_plan(1, 4100, 4096, 132) is None  # N not a multiple of 32
    assert cuda.four_warp_plan(1, 4096, 4000, 132) is None  # K not a multiple of 128


def test_cuda_kernel_shared_memory():
    """Activations are stored for M rounded up to a power of two (all 8 of a tile for M > 8):
    1 block of 32 segments x 256 B x 1 token = 8 KB (more than the 4 x 32 x 9 x 4 = 4.5 KB of partials),
    plus 4 warps x 3 stages x 4 row groups x 32 lanes x 20 B = 30 KB of cp.async ring."""
    from slime_gb10.nvfp4 import _cuda_w4a16 as cuda

    p = cuda.Plan(1, 1, 2, 1, stages=3, minb=4)
    assert [cuda.stored_tokens(p, m) for m in (1, 2, 3, 4, 5, 8)] == [1, 2, 4, 4, 8, 8]
    assert cuda.stored_tokens(cuda.Plan(2, 1, 1, 2), 9) == 8
    assert cuda.shared_bytes(p, 1, 4096) == 8192 + 30720
    assert cuda.shared_bytes(p, 8, 4096) == 8 * 8192 + 30720
    assert cuda.shared_bytes(cuda.Plan(1, 8, 4, 2), 1, 4096) == 4 * 32 * 9 * 4  # partials > 4 segments
    assert cuda.valid(p, 8, 4096, 4096) and not cuda.valid(p, 9, 4096, 4096)
    assert not cuda.valid(cuda.Plan(1, 8, 1, 2), 1, 4096, 128 * 31)  # 32 K-parts, 31 segments
    assert not cuda.valid(cuda.Plan(1, 1, 1, 2), 8, 4096, 14336)  # 112 KB of activations
    # a window: 4 K-warps x 2 segments x 256 B x 8 tokens x 4 tiles, then the ring
    wide = cuda.Plan(4, 2, 1, 1, stages=3, window=2)
    assert cuda.window(wide, 4096) == 2 and cuda.window(wide._replace(window=0), 4096) == 4
    assert cuda.shared_bytes(wide, 32, 4096) == 4 * 2 * 256 * 8 * 4 + 30720
    assert cuda.valid(wide, 32, 4096, 4096) and not cuda.valid(wide, 33, 4096, 4096)
    assert not cuda.valid(cuda.Plan(4, 2, 1, 2, window=2), 32, 4096, 4096)  # the register ring stages once


def test_cuda_kernel_stays_under_48_kb_without_the_opt_in(monkeypatch):
    """A torch whose NVRTC kernels cannot opt in above 48 KB (no ``set_shared_memory_config``): the
    57 KB tiling of M = 16, K = 14336 is not valid and nothing else fits, so the plan is None (the
    Triton kernel runs) instead of a launch that fails."""
    from torch.cuda import _utils

    from slime_gb10.nvfp4 import _cuda_w4a16 as cuda

    big = cuda.Plan(2, 8, 4, 2, rows=32, loads=2)
    assert cuda.valid(big, 16, 4096, 14336)  # this torch has the opt-in
    monkeypatch.setattr(_utils, "_CudaKernel", type("OldKernel", (), {}))
    assert cuda.max_shared_bytes() == 48 * 1024
    assert not cuda.valid(big, 16, 4096, 14336)
    assert cuda.plan(16, 4096, 14336, 132) is None
    assert cuda.four_warp_plan(1, 4096, 4096, 132) == cuda.Plan(
        1, 2, 1, 1, stages=3, minb=4
    )  # small tilings unchanged
    assert cuda.plan(1, 4096, 4096, 132).warps == 8


def test_fused_crossover():
    """Where ``w4a16_linear`` takes a fused kernel (the H100 crossovers of BENCHMARKS.md): any weight
    up to M = 16; the CUDA kernels, where they run and tile the shape (N % 32, K % 128), up to M = 32,
    and the GEMM one (N % 64) up to M = 64;
    the wide kernel on weights of >= 2**24 parameters that it tiles (N % 64, K % 128) up to M = 128
    (4096 x 4096 is 16.8 M; 896 x 4864 is 4.4 M); other weights of >= 2**25 up to M = 64."""
    assert w4a16.fused_is_faster(16, 4100, 4000)
    assert not w4a16.fused_is_faster(17, 896, 4864)
    assert w4a16.fused_is_faster(32, 4096, 4096, cuda_kernel=True)
    assert not w4a16.fused_is_faster(32, 4100, 4096, cuda_kernel=True)  # N not a multiple of 32
    assert not w4a16.fused_is_faster(32, 4096, 4000, cuda_kernel=True)  # K not a multiple of 128
    assert not w4a16.fused_is_faster(65, 896, 4864, cuda_kernel=True)  # too small for the wide kernel
    assert w4a16.fused_is_faster(64, 896, 4864, cuda_kernel=True)  # the CUDA GEMM kernel
    assert not w4a16.fused_is_faster(33, 896, 4864)  # ... which needs the CUDA kernels to run
    assert w4a16.fused_is_faster(17, 4096, 4096) and w4a16.fused_is_faster(128, 4096, 4096)
    assert w4a16.fused_is_faster(17, 896, 4864, cuda_kernel=True)  # the CUDA kernel
    assert not w4a16.fused_is_faster(129, 4096, 4096)
    assert w4a16.fused_is_faster(128, 14336, 4096) and not w4a16.fused_is_faster(129, 14336, 4096)
    assert w4a16.fused_is_faster(64, 4100, 8192) and not w4a16.fused_is_faster(65, 4100, 8192)  # N % 64


def test_wide_config_by_hand():
    """Tiles of the wide kernel: 64 tokens and K tiles of 256 up to M = 64, else 128 and 128; split-K
    the largest of 2, 4, 8 that keeps (row tiles x token tiles x split) <= 2 x SMs, divides K into
    whole K tiles and leaves each split at least two of them."""
    cfg = w4a16.wide_config(64, 4096, 4096, 132)
    assert cfg == {"engine": "wide", "BN": 64, "BM": 64, "BK": 256, "split": 4, "num_stages": 3}
    assert w4a16.wide_config(24, 4096, 4096, 132)["BM"] == 32
    assert w4a16.wide_config(64, 14336, 4096, 132)["split"] == 1  # 224 row tiles already
    big = w4a16.wide_config(128, 4096, 14336, 132)
    assert (big["BM"], big["BK"], big["split"]) == (128, 128, 4)  # 64 tiles: x4 = 256 <= 264, x8 > 264
    assert w4a16.wide_config(256, 4096, 4096, 132)["split"] == 2  # 128 tiles
    assert w4a16.wide_config(64, 4096, 4096, 48)["split"] == 1  # GB10's 48 SMs: 64 tiles x 2 > 2 x 48
    small = w4a16.wide_config(64, 896, 4864, 132)  # 14 tiles; 4864 = 19 x 256: no split into whole tiles
    assert (small["BK"], small["split"]) == (256, 1)
    assert w4a16.wide_config(128, 896, 4864, 132)["split"] == 2  # BK = 128: 4864 / 2 = 19 x 128
    assert w4a16.wide_config(64, 4100, 4096, 132) is None and w4a16.wide_config(64, 4096, 4000, 132) is None
    assert w4a16.wide_config(64, 4096, 4096, 132, BN=128, BM=128, BK=64)["split"] == 8  # 32 tiles


def test_wide_kernel_choice():
    """The wide kernel is the fused kernel above M = 16 on weights of >= 2**24 parameters, and above
    M = 32 on any weight it tiles; never where it cannot tile (N % 64, K % 128)."""
    assert not w4a16.wide_is_faster(16, 4096, 4096) and w4a16.wide_is_faster(17, 4096, 4096)
    assert not w4a16.wide_is_faster(32, 896, 4864) and w4a16.wide_is_faster(33, 896, 4864)
    assert not w4a16.wide_is_faster(40, 4100, 4096) and not w4a16.wide_is_faster(40, 4096, 4000)


def test_cuda_gemm_plan():
    """The GEMM kernel's tiling rule, hand-derived: blocks of 4 warps x 16 rows (64 rows); 32 tokens
    per block up to M = 32 and while 64-row x 32-token blocks fit in one wave, else 64 tokens; the
    largest cluster (1, 2, 4, 8) that keeps the blocks within one wave; 4 stages."""
    from slime_gb10.nvfp4 import _cuda_gemm as gemm

    def tiling(nt, cluster):
        return gemm.GemmPlan(4, 1, 1, nt, stages=4, cluster=cluster)

    # M = 32: 4096 rows = 64 blocks -> x2 = 128 <= 132 (x4 = 256 is not); 14336 rows = 224 blocks
    # (no cluster, and still 32 tokens: 64 would not make fewer blocks); 896 rows = 14 -> x8 = 112
    assert gemm.plan(32, 4096, 4096, 132) == tiling(4, 2)
    assert gemm.plan(17, 4096, 14336, 132) == tiling(4, 2)
    assert gemm.plan(32, 14336, 4096, 132) == tiling(4, 1)
    assert gemm.plan(9, 896, 4864, 132) == tiling(4, 8)
    # M = 64: 4096 rows x 2 token blocks = 128 blocks fit; 14336 rows x 2 = 448 do not -> 64 tokens
    # (224 blocks); 896 rows x 2 = 28 -> x4 = 112
    assert gemm.plan(64, 4096, 4096, 132) == tiling(4, 1)
    assert gemm.plan(64, 14336, 4096, 132) == tiling(8, 1)
    assert gemm.plan(64, 896, 4864, 132) == tiling(4, 4)
    # GB10's 48 SMs (not measured): 4096 rows are 64 blocks already; 896 rows at M = 64: 28 blocks
    assert gemm.plan(32, 4096, 4096, 48) == tiling(4, 1)
    assert gemm.plan(40, 4096, 4096, 48) == tiling(8, 1)
    assert gemm.plan(64, 896, 4864, 48) == tiling(4, 1)
    assert gemm.plan(32, 4128, 4096, 132) is None  # N not a multiple of 64
    assert gemm.plan(32, 4096, 4160, 132) is None  # K not a multiple of 128
    assert gemm.plan(32, 896, 128 * 6, 132) == tiling(4, 4)  # 14 blocks, but 6 steps of 128: a cluster of 4


def test_cuda_gemm_shared_memory_and_validity(monkeypatch):
    """A stage is 72 B per weight row (64 of codes, 8 of scale codes) and 256 B per token; after the
    K loop the same memory holds the FP32 partials [rows][tokens + 1]."""
    from torch.cuda import _utils

    from slime_gb10.nvfp4 import _cuda_gemm as gemm

    assert gemm.shared_bytes(gemm.GemmPlan(4, 1, 1, 4, stages=4)) == 4 * (64 * 72 + 32 * 256)
    assert gemm.shared_bytes(gemm.GemmPlan(4, 1, 1, 8, stages=4)) == 4 * (64 * 72 + 64 * 256)
    assert gemm.shared_bytes(gemm.GemmPlan(8, 1, 2, 16, stages=1)) == 256 * 129 * 4  # partials larger
    p = gemm.GemmPlan(4, 1, 1, 8, stages=4, cluster=8)
    assert gemm.valid(p, 300, 4096, 1024) and not gemm.valid(p, 300, 4096, 128 * 7)  # 7 steps, 8 blocks
    assert not gemm.valid(p, 1, 4096 + 32, 4096)  # rows in blocks of 64
    assert not gemm.valid(gemm.GemmPlan(4, 1, 1, 3), 8, 4096, 4096)  # ldmatrix.x4 takes token tiles in pairs
    assert not gemm.valid(gemm.GemmPlan(4, 1, 1, 4, stages=1), 8, 4096, 4096)  # no pipeline
    # without the opt-in above 48 KB: 4 stages of 64 tokens (84 KB) do not fit, 2 stages (42 KB) do
    monkeypatch.setattr(_utils, "_CudaKernel", type("OldKernel", (), {}))
    assert gemm.plan(64, 14336, 4096, 132) == gemm.GemmPlan(4, 1, 1, 8, stages=2)
    assert gemm.plan(32, 4096, 4096, 132) == gemm.GemmPlan(4, 1, 1, 4, stages=3, cluster=2)  # 37.5 KB


def test_cuda_gemm_choice():
    """The GEMM kernel at M = 9..16 only where N < K and N < 4096 (or K > 16384, beyond the two-tile
    plan), at M = 17..32 everywhere, at M = 33..64 except on layers with K > N of >= 2**24 weights."""
    assert not w4a16.gemm_is_faster(8, 896, 4864) and w4a16.gemm_is_faster(9, 896, 4864)
    assert w4a16.gemm_is_faster(16, 1024, 4096) and w4a16.gemm_is_faster(16, 1536, 8960)
    for n, k in [(4096, 4096), (4096, 14336), (4096, 11008), (2048, 2048), (14336, 4096)]:
        assert not w4a16.gemm_is_faster(9, n, k) and not w4a16.gemm_is_faster(16, n, k)
        assert w4a16.gemm_is_faster(17, n, k) and w4a16.gemm_is_faster(32, n, k)
    assert w4a16.gemm_is_faster(16, 4096, 32768)  # no two-tile plan
    assert w4a16.gemm_is_faster(64, 4096, 4096) and not w4a16.gemm_is_faster(65, 4096, 4096)
    assert not w4a16.gemm_is_faster(33, 4096, 14336)
    assert w4a16.gemm_is_faster(64, 14336, 4096)
    assert w4a16.gemm_is_faster(64, 896, 4864)  # 4.4 M weights
    assert not w4a16.gemm_is_faster(24, 4128, 4096) and not w4a16.gemm_is_faster(24, 4096, 4160)


def _source_int(pattern: str, source: str) -> list[int]:
    import re

    match = re.search(pattern, source)
    assert match, pattern
    return [int(v, 0) for v in match.groups()]


def test_cuda_gemm_byte_decoder_constants():
    """The GEMM kernel's byte decoder, evaluated from its CUDA source for all 256 bytes: the two codes
    of byte b (k even in the low nibble) come out as the BF16 pair ``e2m1(code) * 2**-126`` (the
    E2M1 table, signs included: -0 for code 8), which ``mul.rn.bf16x2`` by ``s * 2**119`` turns into
    ``e2m1 * s * 2**-7``. The scale pair of every code byte is the BF16 of the scale code's E4M3 value
    times 2**119 in both halves (the codes of :func:`w4a16.w4a16_scale_codes`)."""
    import struct

    from slime_gb10.nvfp4 import _cuda_gemm as gemm
    from slime_gb10.nvfp4.format import E2M1_VALUES

    source = gemm._source(gemm.GemmPlan(4, 1, 1, 4))
    mag_mul, mag_mask, sign_mul, sign_mask = _source_int(
        r"\(\(b \* (\d+)u\) & (0x[0-9A-F]+)u\) \| \(\(b \* (\d+)u\) & (0x[0-9A-F]+)u\)", source
    )

    def bf16(bits: int) -> float:
        return struct.unpack("<f", struct.pack("<I", bits << 16))[0]

    for b in range(256):
        r = (((b * mag_mul) & mag_mask) | ((b * sign_mul) & sign_mask)) & 0xFFFFFFFF
        for half, code in ((r & 0xFFFF, b & 15), (r >> 16, b >> 4)):
            got = bf16(half)
            assert got == E2M1_VALUES[code] * 2.0**-126, (b, code)
            assert struct.pack("<f", got)[3] >> 7 == code >> 3, (b, code)  # the sign, zeros included
    (shift_mul,) = _source_int(r"\* (\d+)u \+ \(\(237u << 7\) \| \(237u << 23\)\)", source)
    bias = 237 << 7
    scales = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn)  # every finite E4M3 >= 0
    codes = w4a16.w4a16_scale_codes(scales)
    for s, code in zip(scales.float().tolist(), codes.tolist(), strict=True):
        pair = (code | code << 16) * shift_mul + (bias | bias << 16)  # the byte in both halves
        expected = s * 2.0**119 if s > 0 else -0.0  # a zero scale decodes as -0.0 (ZERO_SCALE_CODE)
        assert bf16(pair & 0xFFFF) == expected and bf16(pair >> 16) == expected, (s, code)


def test_wgmma_plan():
    """The wgmma kernel's tiling rule, hand-derived for 132 SMs: the first block shape of (2 warpgroups,
    256 tokens), (2, 192), (2, 128), (1, 128), (1, 64) with at most M rounded up to 64 tokens (blocks
    of more than 128 tokens only where >= 80% of their tokens are real) whose blocks x a cluster of
    <= 2 (then <= 4; 4 at once for (1, 128) where each block keeps >= 8 steps of 128) reach 99 (3/4
    of 132) within one wave; else (1, 64) with the largest cluster
    (up to 8 where K > 1024, else 4) that fits one wave. A wave is 132 blocks; 120 with clusters of 4
    blocks of one SM each; 264 (1, 64) blocks (two an SM) where each keeps >= 8 steps of 128;
    (2, 192) instead of a (2, 256) that takes more than one wave where 0.8 x its last-wave use is
    higher; as many stages as fit up to 5 (a stage: 256 B per token + 72 B per row, 1024-aligned)."""
    from slime_gb10.nvfp4.hopper import wgmma as wg

    def tiling(wgs, bm, stages, cluster):
        return wg.WgmmaPlan(wgs, bm, stages, cluster, depth=2)

    # M = 64: only (1, 64); 4096 rows = 64 blocks x 2 = 128 >= 99
    assert wg.plan(64, 4096, 4096, 132) == tiling(1, 64, 5, 2)
    # M = 128 on 14336 rows: (2, 128) = 112 blocks, no cluster fits (224 > 132)
    assert wg.plan(128, 14336, 4096, 132) == tiling(2, 128, 5, 1)
    # M = 256 on 4096 rows: (2, 256) = 32 blocks x 2 = 64 < 99; (2, 192) would use 256 of 384 tokens;
    # (2, 128) = 64 x 2 = 128
    assert wg.plan(256, 4096, 4096, 132) == tiling(2, 128, 5, 2)
    # M = 192 on 14336 rows: (2, 192) = 112 blocks; its stage is 58368 B: 3 fit
    assert wg.plan(192, 14336, 4096, 132) == tiling(2, 192, 3, 1)
    # M = 384: (2, 256) would use 384 of 512 tokens (75%); (2, 192) = 32 x 2 blocks x 2 = 128
    assert wg.plan(384, 4096, 4096, 132) == tiling(2, 192, 3, 2)
    # M = 768: (2, 256) = 96 blocks (a cluster of 2 would be 192 > 132); (2, 192) = 128 blocks
    assert wg.plan(768, 4096, 4096, 132) == tiling(2, 192, 3, 1)
    assert wg.plan(768, 14336, 4096, 132) == tiling(2, 256, 3, 1)  # 336 blocks
    # M = 1024: (2, 256) = 32 x 4 = 128 blocks; its stage is 74752 B: 3 fit in 227 KB, 4 do not
    assert wg.plan(1024, 4096, 4096, 132) == tiling(2, 256, 3, 1)
    # more than one wave of (2, 256): 5120 rows at M = 1024 are 40 x 4 = 160 blocks, a second wave of
    # 28 (use 160 / 264 = 0.61); (2, 192) are 40 x 6 = 240 (1024 of 1152 tokens: 0.89 >= 0.8), use
    # 240 / 264 = 0.91, x 0.8 = 0.73 > 0.61: 192 tokens
    assert wg.plan(1024, 5120, 5120, 132) == tiling(2, 192, 3, 1)
    # 11008 rows at M = 1024: 86 x 4 = 344 blocks, use 344 / 396 = 0.87; (2, 192): 86 x 6 = 516, use
    # 516 / 528 = 0.98, x 0.8 = 0.78 < 0.87: 256 tokens
    assert wg.plan(1024, 11008, 4096, 132) == tiling(2, 256, 3, 1)
    # at M = 512: 86 x 2 = 172 blocks (0.65); (2, 192): 86 x 3 = 258 (0.98 x 0.8 = 0.78): 192 tokens
    assert wg.plan(512, 11008, 4096, 132) == tiling(2, 192, 3, 1)
    # 896 rows at M = 128: nothing reaches 99 with clusters of 2; with 4, (1, 64) = 28 x 4 = 112
    assert wg.plan(128, 896, 4864, 132) == tiling(1, 64, 5, 4)
    # at M = 256, (1, 128) blocks take clusters of 4 on the first pass (38 steps: 9 a block): 14 x 2
    # x 4 = 112 <= 120, before (1, 64) with 2 (56 x 2 = 112); 1024 x 1024 has 2 steps a block with 4
    assert wg.plan(256, 896, 4864, 132) == tiling(1, 128, 5, 4)
    assert wg.plan(256, 1024, 1024, 132) == tiling(1, 64, 5, 2)
    # at M = 64: 14 blocks x 4 = 56 never reach 99: the smallest shape with the largest cluster, up to
    # 8 where K has more than 8 steps of 128 (14 x 8 = 112 <= 132)
    assert wg.plan(64, 896, 4864, 132) == tiling(1, 64, 5, 8)
    assert wg.plan(48, 576, 1536, 132) == tiling(1, 64, 5, 8)  # 9 x 8 = 72, 12 steps
    assert wg.plan(64, 1024, 1024, 132) == tiling(1, 64, 5, 4)  # 8 steps: one a block with 8
    assert wg.plan(64, 2048, 4864, 132) == tiling(1, 64, 5, 4)  # 32 x 4 = 128: the second pass
    # two (1, 64) blocks an SM: 1536 rows at M = 192 are 24 x 3 = 72 blocks, x 2 = 144 <= 264 (35
    # steps a block); 4864 x 896 at M = 64: 76 x 2 = 152 blocks of 3-4 steps are not a wave, 76 < 99
    # and no larger cluster fits: clusters of 1
    assert wg.plan(192, 1536, 8960, 132) == tiling(1, 64, 5, 2)
    assert wg.plan(64, 8192, 8192, 132) == tiling(1, 64, 5, 2)  # 128 x 2 = 256 <= 264
    assert wg.plan(64, 4864, 896, 132) == tiling(1, 64, 5, 1)
    # clusters of 4 of (1, 128) blocks: 1024 rows at M = 192 are 16 x 2 = 32 blocks, x 4 = 128 > 120;
    # (1, 64): 16 x 3 = 48, x 4 = 192 <= 264 (8 steps a block)
    assert wg.plan(192, 1024, 4096, 132) == tiling(1, 64, 5, 4)
    # 4160 rows (65 x 64, not a multiple of 128): one warpgroup; M = 1024 -> (1, 128) = 520 blocks
    assert wg.plan(1024, 4160, 4096, 132) == tiling(1, 128, 5, 1)
    # a 100 KB limit: (1, 64) stages of 21504 B -> 4 (87040 B with the alignment slack)
    assert wg.plan(64, 4096, 4096, 132, smem_limit=100 * 1024) == tiling(1, 64, 4, 2)
    assert wg.plan(64, 4096 + 32, 4096, 132) is None  # N not a multiple of 64
    assert wg.plan(64, 4096, 4096 + 64, 132) is None  # K not a multiple of 128
    assert wg.plan(0, 4096, 4096, 132) is None


def test_wgmma_shared_memory_and_validity():
    from slime_gb10.nvfp4.hopper import wgmma as wg

    # a stage: 256 B per token (two 128-byte swizzled K halves), 64 B of codes and 8 of scale codes per
    # row, rounded up to 1024 B; plus 1024 B of slack to align the first stage
    assert wg.shared_bytes(wg.WgmmaPlan(2, 256, 3)) == 3 * 74752 + 1024
    assert wg.shared_bytes(wg.WgmmaPlan(1, 64, 5)) == 5 * 21504 + 1024  # 20992 -> 21504
    assert wg.shared_bytes(wg.WgmmaPlan(1, 16, 3)) == 3 * 9216 + 1024  # 4096 + 4608 -> 9216
    assert wg.valid(wg.WgmmaPlan(2, 256, 3), 1, 128, 128)
    assert not wg.valid(wg.WgmmaPlan(2, 256, 4), 1, 128, 128)  # 4 stages: 300 KB
    assert not wg.valid(wg.WgmmaPlan(2, 64), 1, 4096 + 64, 4096)  # 128-row blocks
    assert not wg.valid(wg.WgmmaPlan(1, 72), 1, 4096, 4096)  # tokens in multiples of 16
    assert not wg.valid(wg.WgmmaPlan(1, 272), 1, 4096, 4096)  # the MMA's N is at most 256
    assert not wg.valid(wg.WgmmaPlan(1, 64, stages=1), 1, 4096, 4096)  # one fills while another is read
    assert wg.valid(wg.WgmmaPlan(1, 64, stages=2), 1, 4096, 4096)
    assert not wg.valid(wg.WgmmaPlan(1, 64, depth=3), 1, 4096, 4096)  # register sets must divide 8 steps
    assert wg.valid(wg.WgmmaPlan(1, 64, depth=8), 1, 4096, 4096)
    assert not wg.valid(wg.WgmmaPlan(1, 64, cluster=8), 1, 4096, 128 * 7)  # 7 steps for 8 blocks
    assert wg.valid(wg.WgmmaPlan(1, 64, cluster=8), 1, 4096, 1024)


def test_wgmma_tensor_maps_match_what_the_kernel_reads():
    """The producer's copies and the consumers' reads describe the same stage. The activation map
    moves 2-byte elements in boxes of 64 K x ``bm`` tokens (a box row is 128 bytes, the span of the
    128-byte swizzle) with the swizzle ``wgmma``'s descriptor declares (layout type 1 at bits 62-63,
    1024 bytes per 8 tokens); the two K halves of a step land ``bm * 128`` bytes apart, and the
    descriptor of k16 step s points at K 16 s: half s / 4, byte 32 (s % 4) of the row. The code map
    moves boxes of 64 bytes (128 K) x ``64 wg`` rows, unswizzled, read back at ``64 * row``. The bytes
    the full barrier expects are the boxes' bytes. Constants and expressions are read from the
    source and evaluated."""
    import re

    from slime_gb10.nvfp4.hopper import wgmma as wg

    for wgs, bm in ((1, 64), (2, 256), (1, 16), (2, 192)):
        p = wg.WgmmaPlan(wgs, bm)
        M, N, K = 300, 64 * wgs * 3, 1024
        x_spec, code_spec = wg.map_specs(p, M, N, K, x_row_bytes=2 * 1032)
        assert x_spec == wg.MapSpec(wg._TMA_UINT16, K, M, 2 * 1032, (64, bm), wg._TMA_SWIZZLE_128B)
        assert code_spec == wg.MapSpec(wg._TMA_UINT8, K // 2, N, K // 2, (64, 64 * wgs), wg._TMA_SWIZZLE_NONE)
        assert x_spec.box[0] * 2 == 128 and code_spec.box[0] == 64
        source = wg._source(p)
        env = {"BM": bm, "BN": 64 * wgs, "WG": wgs, "k": 0, "st": 0, "CODE_OFFSET": bm * 256}
        loads = re.findall(r"tma_load\((.+?), &(\w+), (.+?), (\w+), full\);", source)
        boxes = {(m, eval(c0.replace(">>", "//2**"), {}, env)): eval(dst, {}, env) for dst, m, c0, _ in loads}
        assert boxes == {("xmap", 0): 0, ("xmap", 64): bm * 128, ("cmap", 0): bm * 256}, boxes
        expected_tx = 2 * (64 * 2 * bm) + 64 * (64 * wgs)  # two activation boxes + one code box
        tx = re.search(r"#define TMA_BYTES \((.+)\)", source).group(1)
        assert eval(tx, {}, env) == expected_tx
        step = re.search(r"desc \+ \(\(\(\(s >> 2\) \* BM \* 128\) \+ \(s & 3\) \* 32\) >> 4\)", source)
        assert step, "the descriptor offset of step s"
        for s_ in range(8):
            offset = (s_ >> 2) * bm * 128 + (s_ & 3) * 32  # bytes into the stage, as in the source
            half, byte = divmod(offset, bm * 128)
            assert byte < 128 and 64 * half + byte // 2 == 16 * s_  # K of the step's first element
        assert "CODE_OFFSET + 64 * row" in source and "CODE_OFFSET + 64 * (row + 8)" in source
    desc = re.search(r"return \(unsigned long long\)\(\(addr & 0x3FFFF\) >> 4\) \| (.+);", source).group(1)
    assert desc == "(1ull << 16) | (64ull << 32) | (1ull << 62)"  # LBO 1 (unused), SBO 1024 B, 128-B swizzle
    assert wg._TMA_SWIZZLE_128B == 3 and wg._TMA_UINT16 == 1 and wg._TMA_UINT8 == 0  # cuda.h's enums


def test_wgmma_instruction_text():
    """The generated ``wgmma`` takes ``bm / 2`` FP32 accumulators, four A registers and the B
    descriptor, with scale-d true, no negation and B not transposed (K-major)."""
    from slime_gb10.nvfp4.hopper import wgmma as wg

    for bm in (16, 64, 256):
        text = wg.wgmma_step_source(bm)
        assert f"wgmma.mma_async.sync.aligned.m64n{bm}k16.f32.bf16.bf16" in text
        n = bm // 2
        assert "{" + ",".join(f"%{r}" for r in range(n)) + "}" in text
        assert f"{{%{n},%{n + 1},%{n + 2},%{n + 3}}}, %{n + 4}, p, 1, 1, 0;" in text
        assert text.count('"+f"') == n


def test_wgmma_choice():
    """The wgmma kernel at M = 33..2048 on shapes it tiles of >= 2**24 parameters (N > K or not); on
    smaller weights up to 256 where N <= K, up to 128 where N > K; and ``fused_is_faster`` takes it
    only where it runs (sm_90)."""
    assert not w4a16.wgmma_is_faster(32, 4096, 4096) and w4a16.wgmma_is_faster(33, 4096, 4096)
    assert w4a16.wgmma_is_faster(2048, 4096, 14336) and not w4a16.wgmma_is_faster(2049, 4096, 14336)
    assert w4a16.wgmma_is_faster(2048, 14336, 4096) and not w4a16.wgmma_is_faster(2049, 14336, 4096)
    assert w4a16.wgmma_is_faster(1024, 4096, 4096)  # N = K
    assert w4a16.wgmma_is_faster(256, 896, 4864) and not w4a16.wgmma_is_faster(257, 896, 4864)
    assert w4a16.wgmma_is_faster(256, 2048, 2048) and not w4a16.wgmma_is_faster(257, 2048, 2048)
    assert w4a16.wgmma_is_faster(128, 4864, 896) and not w4a16.wgmma_is_faster(129, 4864, 896)
    assert not w4a16.fused_is_faster(129, 4864, 896, cuda_kernel=True, wgmma=True)  # dequantize + cuBLAS
    assert not w4a16.wgmma_is_faster(64, 4096 + 32, 4096) and not w4a16.wgmma_is_faster(64, 4096, 4096 + 64)
    assert w4a16.fused_is_faster(1024, 4096, 4096, cuda_kernel=True, wgmma=True)
    assert not w4a16.fused_is_faster(1024, 4096, 4096, cuda_kernel=True)  # not on GB10 / Blackwell
    assert w4a16.fused_is_faster(2048, 4096, 4096, cuda_kernel=True, wgmma=True)
    assert not w4a16.fused_is_faster(2049, 4096, 4096, cuda_kernel=True, wgmma=True)
