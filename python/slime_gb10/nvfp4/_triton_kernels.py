"""The Triton kernels themselves (imported only when Triton is installed; see ``kernels.py``).

Module-level definitions, as Triton resolves the helpers a kernel calls through the module's
globals. Each kernel's pure-PyTorch twin is in ``format.py``.
"""

import triton
import triton.language as tl


@triton.jit
def _abs_bits(x):
    """|x| as the int32 bit pattern of its FP32 value: ordered like the values, NaN > Inf > finite."""
    return x.to(tl.float32).to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def amax_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.atomic_max(out_ptr, tl.max(_abs_bits(x), axis=0))


@triton.jit
def e4m3_rne(s):
    """Round non-negative FP32 (<= 448) to E4M3, exactly (RNE, subnormals). Returns (value, bits)."""
    bits = s.to(tl.int32, bitcast=True)
    exponent = (bits >> 23) & 0xFF
    # quantum: 2**(e-3) for normal E4M3 values, 2**-9 for subnormals (biased FP32 exponent 118)
    q_exp = tl.maximum(exponent - 3, 118)
    quantum = (q_exp << 23).to(tl.float32, bitcast=True)
    inv_quantum = ((254 - q_exp) << 23).to(tl.float32, bitcast=True)
    steps = s * inv_quantum  # exact (power of two), < 16
    steps = (steps + 8388608.0) - 8388608.0  # round half to even to an integer (FP32 magic number)
    value = steps * quantum  # exact
    vbits = value.to(tl.int32, bitcast=True)
    normal_bits = ((((vbits >> 23) & 0xFF) - 120) << 3) | ((vbits >> 20) & 7)
    code = tl.where(value < 0.015625, steps.to(tl.int32), normal_bits)
    return value, code


@triton.jit
def e4m3_decode(b):
    """FP32 value of E4M3 bytes (given as integers)."""
    b = b.to(tl.int32)
    e = (b >> 3) & 15
    m = b & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    return tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)


@triton.jit
def to_bf16_rne(x):
    """FP32 -> BF16, round to nearest even, by integer arithmetic (finite inputs). Identical to the
    GPU's conversion; also exact under TRITON_INTERPRET, whose conversion truncates."""
    bits = x.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def to_output(x, dtype: tl.constexpr):
    if dtype == tl.bfloat16:
        return to_bf16_rne(x)
    else:
        return x.to(dtype)


@triton.jit
def e2m1_code(q):
    """4-bit E2M1 code of FP32 q: RNE (ties to even index) saturating at 6; sign bit = q < 0."""
    a = tl.abs(q)
    index = (
        (a > 0.25).to(tl.int32)
        + (a >= 0.75).to(tl.int32)
        + (a > 1.25).to(tl.int32)
        + (a >= 1.75).to(tl.int32)
        + (a > 2.5).to(tl.int32)
        + (a >= 3.5).to(tl.int32)
        + (a > 5.0).to(tl.int32)
    )
    return index + (q < 0).to(tl.int32) * 8


@triton.jit
def e2m1_value(code):
    """FP32 value of 4-bit codes, built from bits: 2**(e-1)*(1+m/2) for index >= 2, 0 and 0.5 below."""
    code = code.to(tl.int32)
    index = code & 7
    magnitude = tl.where(index >= 2, (index << 22) + 0x3F000000, index * 0x3F000000)
    return (magnitude | ((code & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def quantize_kernel(x_ptr, data_ptr, scale_ptr, gs_ptr, flag_ptr, n_blocks, BLOCKS: tl.constexpr):
    blocks = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    valid = blocks < n_blocks
    offs = blocks[:, None] * 16 + tl.arange(0, 16)[None, :]
    x = tl.load(x_ptr + offs, mask=valid[:, None], other=0.0).to(tl.float32)
    tl.atomic_max(
        flag_ptr, tl.max(tl.max(_abs_bits(x), axis=1), axis=0)
    )  # NaN/Inf check on the host afterwards
    gs = tl.load(gs_ptr)
    amax = tl.max(tl.abs(x), axis=1)
    s = tl.minimum(tl.math.div_rn(amax, 6.0 * gs), 448.0)
    s, s_bits = e4m3_rne(s)
    tl.store(scale_ptr + blocks, s_bits.to(tl.uint8), mask=valid)
    denominator = s * gs
    has_scale = denominator > 0
    safe = tl.where(has_scale, denominator, 1.0)
    q = tl.where(has_scale[:, None], tl.math.div_rn(x, safe[:, None]), 0.0)
    even, odd = tl.split(tl.reshape(q, [BLOCKS, 8, 2]))
    packed = e2m1_code(even) | (e2m1_code(odd) << 4)
    out = blocks[:, None] * 8 + tl.arange(0, 8)[None, :]
    tl.store(data_ptr + out, packed.to(tl.uint8), mask=valid[:, None])


@triton.jit
def dequantize_kernel(data_ptr, scale_ptr, gs_ptr, out_ptr, n_blocks, BLOCKS: tl.constexpr):
    blocks = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    valid = blocks < n_blocks
    packed = tl.load(data_ptr + blocks[:, None] * 8 + tl.arange(0, 8)[None, :], mask=valid[:, None], other=0)
    packed = packed.to(tl.int32)
    block_scale = e4m3_decode(tl.load(scale_ptr + blocks, mask=valid, other=0)) * tl.load(gs_ptr)
    low = e2m1_value(packed & 15) * block_scale[:, None]
    high = e2m1_value(packed >> 4) * block_scale[:, None]
    values = tl.reshape(tl.join(low, high), [BLOCKS, 16])
    offs = blocks[:, None] * 16 + tl.arange(0, 16)[None, :]
    tl.store(out_ptr + offs, to_output(values, out_ptr.dtype.element_ty), mask=valid[:, None])


@triton.jit
def decode_prmt(packed, scale):
    """Inline-PTX decoder (sm_90+): 4 bytes (8 codes) -> two BF16 tensors times the group scale.

    For bytes b0..b3 holding nibbles n0..n7 (n_2i low, n_2i+1 high), output A gets
    (n0, n4, n2, n6) and B gets (n1, n5, n3, n7): the GEMM reads x in the same order.
    Magnitudes come from two 8-entry byte tables (low and high byte of the BF16 value) through
    ``prmt``; the sign is OR-ed in; ``mul.rn.bf16x2`` applies the scale.
    """
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 ie, io, se, so, t, r_le, r_he, r_lo, r_ho, m0, m1, m2, m3, tlo_a, tlo_b, thi_a, thi_b;
        mov.b32 tlo_a, 0xC0800000;
        mov.b32 tlo_b, 0xC0804000;
        mov.b32 thi_a, 0x3F3F3F00;
        mov.b32 thi_b, 0x40404040;
        and.b32 ie, $4, 0x07070707;
        shr.b32 io, $4, 4;
        and.b32 io, io, 0x07070707;
        shr.b32 t, ie, 12;
        or.b32 se, ie, t;
        shr.b32 t, io, 12;
        or.b32 so, io, t;
        prmt.b32 r_le, tlo_a, tlo_b, se;
        prmt.b32 r_he, thi_a, thi_b, se;
        prmt.b32 r_lo, tlo_a, tlo_b, so;
        prmt.b32 r_ho, thi_a, thi_b, so;
        prmt.b32 m0, r_le, r_he, 0x5140;
        prmt.b32 m1, r_le, r_he, 0x7362;
        prmt.b32 m2, r_lo, r_ho, 0x5140;
        prmt.b32 m3, r_lo, r_ho, 0x7362;
        shl.b32 t, $4, 12;
        lop3.b32 m0, m0, 0x80008000, t, 0xf8;
        shl.b32 t, $4, 4;
        lop3.b32 m1, m1, 0x80008000, t, 0xf8;
        shl.b32 t, $4, 8;
        lop3.b32 m2, m2, 0x80008000, t, 0xf8;
        lop3.b32 m3, m3, 0x80008000, $4, 0xf8;
        mul.rn.bf16x2 $0, m0, $5;
        mul.rn.bf16x2 $1, m1, $5;
        mul.rn.bf16x2 $2, m2, $5;
        mul.rn.bf16x2 $3, m3, $5;
        }
        """,
        constraints="=r,=r,=r,=r,r,r,r",
        args=[packed, scale],
        dtype=(tl.bfloat16, tl.bfloat16),
        is_pure=True,
        pack=4,
    )


@triton.jit
def w4a16_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    gs_ptr,
    out_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_xm,
    tiles_per_split,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    USE_ASM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_n = tl.cdiv(N, BN)
    pid_m = pid // num_n
    pid_n = pid % num_n
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    m_mask = offs_m < M
    n_mask = offs_n < N
    G: tl.constexpr = BK // 16
    group = tl.arange(0, G)
    byte = tl.arange(0, 8)
    half = tl.arange(0, BK // 2)
    if USE_ASM:  # the order decode_prmt produces: within each 8 elements (0, 4, 2, 6) and (1, 5, 3, 7)
        x_index = 8 * (half // 4) + ((half & 1) << 2) + (half & 2)
    else:
        x_index = 2 * half
    half_k = K // 2
    k_groups = K // 16
    gs = tl.load(gs_ptr)
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None, None] * half_k
    s_rows = s_ptr + offs_n.to(tl.int64)[:, None] * k_groups
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    first = pid_k * tiles_per_split
    for tile in range(first, first + tiles_per_split):
        g = tile * G + group
        g_mask = g < k_groups
        packed = tl.load(
            w_rows + (g[None, :, None] * 8 + byte[None, None, :]),
            mask=n_mask[:, None, None] & g_mask[None, :, None],
            other=0,
        )
        scale_bytes = tl.load(s_rows + g[None, :], mask=n_mask[:, None] & g_mask[None, :], other=0)
        scale = e4m3_decode(scale_bytes) * gs
        if USE_ASM:
            w_a, w_b = decode_prmt(packed, scale.to(tl.bfloat16)[:, :, None])
        else:
            packed = packed.to(tl.int32)
            w_a = to_bf16_rne(e2m1_value(packed & 15) * scale[:, :, None])
            w_b = to_bf16_rne(e2m1_value(packed >> 4) * scale[:, :, None])
        w_a = tl.reshape(w_a, [BN, BK // 2])
        w_b = tl.reshape(w_b, [BN, BK // 2])
        k = tile * BK + x_index
        x_mask = m_mask[:, None] & (k < K)[None, :]
        x_a = tl.load(x_rows + k[None, :], mask=x_mask, other=0.0)
        x_b = tl.load(x_rows + (k + 1)[None, :], mask=x_mask, other=0.0)
        if INTERPRET:  # the interpreter's BF16 dot is wrong; FP32 products of BF16 values are exact
            acc = tl.dot(x_a.to(tl.float32), tl.trans(w_a.to(tl.float32)), acc)
            acc = tl.dot(x_b.to(tl.float32), tl.trans(w_b.to(tl.float32)), acc)
        else:
            acc = tl.dot(x_a, tl.trans(w_a), acc)
            acc = tl.dot(x_b, tl.trans(w_b), acc)
    out_mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT:
        offs = pid_k.to(tl.int64) * M * N + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.store(out_ptr + offs, acc, mask=out_mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        offs = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.store(out_ptr + offs, to_output(acc, out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def split_sum_kernel(
    partial_ptr, bias_ptr, out_ptr, MN, N, SPLITS, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLITS):
        acc += tl.load(partial_ptr + s * MN + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, to_output(acc, out_ptr.dtype.element_ty), mask=mask)
