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
def amax_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    """Per program: max |x| bits of BLOCK elements (no atomics: the host reduces the partials)."""
    pid = tl.program_id(0)
    first = pid.to(tl.int64) * BLOCK
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + first + offs, mask=offs < n - first, other=0.0)
    tl.store(partial_ptr + pid, tl.max(_abs_bits(x), axis=0))


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
def _f32_at_least(p):
    """Smallest FP32 >= p (p: non-negative FP64), via the RNE conversion and a one-step fix-up."""
    r = p.to(tl.float32)
    bits = r.to(tl.int32, bitcast=True)
    return tl.where(r.to(tl.float64) < p, (bits + 1).to(tl.float32, bitcast=True), r)


@triton.jit
def _f32_above(p):
    """Smallest FP32 > p (p: non-negative FP64)."""
    r = p.to(tl.float32)
    bits = r.to(tl.int32, bitcast=True)
    bits = tl.where(r.to(tl.float64) > p, bits - 1, bits)  # largest FP32 <= p
    return (bits + 1).to(tl.float32, bitcast=True)


@triton.jit
def _threshold(d, t, half_ulp, AT_LEAST: tl.constexpr):
    """The least |x| (FP32) for which fl(|x| / d) passes an E2M1 decision point t, exactly.

    fl(y) >= t  <=>  y >= t - ulp/2  (t has an even significand, so the tie rounds to t), and
    fl(y) > t   <=>  y > t + ulp/2. The boundary ``d * t +- d * ulp/2`` is exact in FP64 (both
    products are, and their sum needs < 53 bits; t and ulp/2 are passed separately because a
    float literal is rounded to FP32 by Triton); since |x| is an FP32 number, comparing it with
    the nearest FP32 on the right side of the boundary is exact too.
    """
    d64 = d.to(tl.float64)
    if AT_LEAST:
        r = _f32_at_least(d64 * t - d64 * half_ulp)
    else:
        r = _f32_above(d64 * t + d64 * half_ulp)
    return tl.where(d > 0, r, float("inf"))


@triton.jit
def quantize_kernel(
    x_ptr, data_ptr, scale_ptr, gs_ptr, flag_ptr, n_blocks, BLOCKS: tl.constexpr, DIVIDE: tl.constexpr
):
    """BLOCKS 16-element blocks per program: read x once, write codes and E4M3 scales.

    Element codes are decided without dividing: ``e2m1_rne(fl(x / d))`` only depends on which
    decision points fl(|x| / d) passes, and each such test is equivalent to comparing |x| with a
    per-block FP32 boundary (see ``_threshold``), so the result is bit-identical to the reference's
    correctly rounded division. ``DIVIDE=True`` computes ``fl(x / d)`` with ``div_rn`` instead (the
    literal formula; same bits, kept for comparison in the benchmark).
    """
    pid = tl.program_id(0)
    first = pid.to(tl.int64) * BLOCKS  # 64-bit offsets through the (scalar) base pointers
    x_ptr += first * 16
    data_ptr += first * 8
    scale_ptr += first
    n_here = n_blocks - first
    elems = tl.arange(0, BLOCKS * 16)  # a flat, contiguous range: vectorized 16-byte loads
    x = tl.load(x_ptr + elems, mask=elems < n_here * 16, other=0.0).to(tl.float32)
    x = tl.reshape(x, [BLOCKS, 16])
    amax_bits = tl.max(_abs_bits(x), axis=1)  # integer max of |x| bits: the amax, and NaN > Inf > finite
    tl.store(flag_ptr + pid, tl.max(amax_bits, axis=0))  # NaN/Inf: checked on the host
    gs = tl.load(gs_ptr)
    amax = amax_bits.to(tl.float32, bitcast=True)
    s = tl.minimum(tl.math.div_rn(amax, 6.0 * gs), 448.0)
    s, s_bits = e4m3_rne(s)
    blocks = tl.arange(0, BLOCKS)
    tl.store(scale_ptr + blocks, s_bits.to(tl.uint8), mask=blocks < n_here)
    d = s * gs
    if DIVIDE:
        has_scale = d > 0
        safe = tl.where(has_scale, d, 1.0)
        q = tl.where(has_scale[:, None], tl.math.div_rn(x, safe[:, None]), 0.0)
        q_even, q_odd = tl.split(tl.reshape(q, [BLOCKS, 8, 2]))
        codes_even = e2m1_code(q_even)
        codes_odd = e2m1_code(q_odd)
    else:
        # decision points of e2m1_code: q > 0.25, q >= 0.75, q > 1.25, q >= 1.75, q > 2.5, q >= 3.5, q > 5
        c0 = _threshold(d, 0.25, 2.0**-26, False)[:, None]
        c1 = _threshold(d, 0.75, 2.0**-25, True)[:, None]
        c2 = _threshold(d, 1.25, 2.0**-24, False)[:, None]
        c3 = _threshold(d, 1.75, 2.0**-24, True)[:, None]
        c4 = _threshold(d, 2.5, 2.0**-23, False)[:, None]
        c5 = _threshold(d, 3.5, 2.0**-23, True)[:, None]
        c6 = _threshold(d, 5.0, 2.0**-22, False)[:, None]
        nonzero = _threshold(d, 0.0, 2.0**-150, False)[:, None]  # fl(|x| / d) != 0
        even, odd = tl.split(tl.reshape(x, [BLOCKS, 8, 2]))
        codes_even = _e2m1_code_from_thresholds(even, c0, c1, c2, c3, c4, c5, c6, nonzero)
        codes_odd = _e2m1_code_from_thresholds(odd, c0, c1, c2, c3, c4, c5, c6, nonzero)
    packed = tl.reshape(codes_even | (codes_odd << 4), [BLOCKS * 8])
    out = tl.arange(0, BLOCKS * 8)
    tl.store(data_ptr + out, packed.to(tl.uint8), mask=out < n_here * 8)


@triton.jit
def _e2m1_code_from_thresholds(x, c0, c1, c2, c3, c4, c5, c6, nonzero):
    """Number of boundaries c0 <= ... <= c6 that |x| reaches (a 3-step binary search), plus the sign."""
    a = tl.abs(x)
    upper = a >= c3
    middle = a >= tl.where(upper, c5, c1)
    lower = a >= tl.where(upper, tl.where(middle, c6, c4), tl.where(middle, c2, c0))
    index = upper.to(tl.int32) * 4 + middle.to(tl.int32) * 2 + lower.to(tl.int32)
    negative = (x < 0) & (a >= nonzero)
    return index + negative.to(tl.int32) * 8


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
    """Inline-PTX decoder (sm_90+): 4 bytes (8 codes n0..n7) -> two BF16 tensors times the group scale.

    Output A gets the low nibbles (n0, n2, n4, n6: the even elements), B the high nibbles (odd
    elements), in order, as ``e2m1_value`` would. Magnitudes come from two 8-entry byte tables (the
    low and high byte of each BF16 value) looked up by ``prmt``; sign bits are moved into place by
    ``prmt`` too; ``mul.rn.bf16x2`` applies the scale. About 4 instructions per element.
    """
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 ie, io, se, so, r4, t, r_le, r_he, r_lo, r_ho, m0, m1, m2, m3, tla, tlb, tha, thb;
        mov.b32 tla, 0xC0800000;
        mov.b32 tlb, 0xC0804000;
        mov.b32 tha, 0x3F3F3F00;
        mov.b32 thb, 0x40404040;
        and.b32 ie, $4, 0x07070707;
        shr.b32 io, $4, 4;
        and.b32 io, io, 0x07070707;
        shr.b32 t, ie, 4;
        or.b32 ie, ie, t;
        prmt.b32 se, ie, 0, 0x0020;
        shr.b32 t, io, 4;
        or.b32 io, io, t;
        prmt.b32 so, io, 0, 0x0020;
        prmt.b32 r_le, tla, tlb, se;
        prmt.b32 r_he, tha, thb, se;
        prmt.b32 r_lo, tla, tlb, so;
        prmt.b32 r_ho, tha, thb, so;
        prmt.b32 m0, r_le, r_he, 0x5140;
        prmt.b32 m1, r_le, r_he, 0x7362;
        prmt.b32 m2, r_lo, r_ho, 0x5140;
        prmt.b32 m3, r_lo, r_ho, 0x7362;
        shl.b32 r4, $4, 4;
        prmt.b32 t, r4, 0, 0x1404;
        lop3.b32 m0, m0, 0x80008000, t, 0xf8;
        prmt.b32 t, r4, 0, 0x3424;
        lop3.b32 m1, m1, 0x80008000, t, 0xf8;
        prmt.b32 t, $4, 0, 0x1404;
        lop3.b32 m2, m2, 0x80008000, t, 0xf8;
        prmt.b32 t, $4, 0, 0x3424;
        lop3.b32 m3, m3, 0x80008000, t, 0xf8;
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
    partial_ptr,
    counter_ptr,
    M,
    N,
    K,
    MN,
    stride_xm,
    tiles_per_split,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT: tl.constexpr,
    USE_ASM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """out[M, N] = x[M, K] @ dequantize(W)[N, K]^T (+ bias), W streamed as packed NVFP4.

    Grid: (M tiles x N tiles, SPLIT). With SPLIT > 1 each program writes an FP32 partial; the last
    program to finish an output tile (an atomic counter, reset afterwards) adds the partials in
    split order (deterministic) and writes the BF16 result: one launch.
    """
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
    kk = tl.arange(0, BK)
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
            w_even, w_odd = decode_prmt(packed, scale.to(tl.bfloat16)[:, :, None])
        else:
            packed = packed.to(tl.int32)
            w_even = to_bf16_rne(e2m1_value(packed & 15) * scale[:, :, None])
            w_odd = to_bf16_rne(e2m1_value(packed >> 4) * scale[:, :, None])
        w_even = tl.reshape(w_even, [BN, BK // 2])
        w_odd = tl.reshape(w_odd, [BN, BK // 2])
        k = tile * BK + kk
        x = tl.load(x_rows + k[None, :], mask=m_mask[:, None] & (k < K)[None, :], other=0.0)
        x_even, x_odd = tl.split(tl.reshape(x, [BM, BK // 2, 2]))
        if INTERPRET:  # the interpreter's BF16 dot is wrong; FP32 products of BF16 values are exact
            acc = tl.dot(x_even.to(tl.float32), tl.trans(w_even.to(tl.float32)), acc)
            acc = tl.dot(x_odd.to(tl.float32), tl.trans(w_odd.to(tl.float32)), acc)
        else:
            acc = tl.dot(x_even, tl.trans(w_even), acc)
            acc = tl.dot(x_odd, tl.trans(w_odd), acc)
    out_mask = m_mask[:, None] & n_mask[None, :]
    tile_offs = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    if SPLIT > 1:
        tl.store(partial_ptr + pid_k * MN + tile_offs, acc, mask=out_mask)
        done = tl.atomic_add(counter_ptr + pid, 1, sem="acq_rel")
        if done == SPLIT - 1:  # the last program of this output tile: reduce in split order
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for s in range(SPLIT):
                acc += tl.load(
                    partial_ptr + s * MN + tile_offs, mask=out_mask, other=0.0, cache_modifier=".cg"
                )
            if HAS_BIAS:
                acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
            tl.store(out_ptr + tile_offs, to_output(acc, out_ptr.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(counter_ptr + pid, 0)  # ready for the next call
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + tile_offs, to_output(acc, out_ptr.dtype.element_ty), mask=out_mask)
