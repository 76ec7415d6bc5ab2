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
def e2m1_value(code):
    """FP32 value of 4-bit codes, built from bits: 2**(e-1)*(1+m/2) for index >= 2, 0 and 0.5 below."""
    code = code.to(tl.int32)
    index = code & 7
    magnitude = tl.where(index >= 2, (index << 22) + 0x3F000000, index * 0x3F000000)
    return (magnitude | ((code & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def e2m1_index(a):
    """E2M1 index 0..7 (0, 0.5, 1, 1.5, 2, 3, 4, 6) of FP32 a in [0, 6], round to nearest, ties to even.

    One FP32 addition does the rounding: ``fl(a + M)`` rounds a to a multiple of ``M * 2**-23``
    (ties to an even multiple), so M = 2**22 rounds to the 0.5 steps of the grid below 2, 2**23
    to the 1 steps from 2 to 4 and 2**24 to the 2 steps from 4 to 6. With e = 0, 1, 2 that binade
    offset, the number of steps k = bits(fl(a + M)) - bits(M) plus 2e is the index. An even k is
    an even index, so the ties go where the format wants them.
    """
    e = tl.maximum((a.to(tl.int32, bitcast=True) >> 23) - 127, 0)
    magic_bits = (e + 149) << 23
    steps = (a + magic_bits.to(tl.float32, bitcast=True)).to(tl.int32, bitcast=True) - magic_bits
    return steps + 2 * e


@triton.jit
def div_rn_by_reciprocal(x, d, r):
    """Correctly rounded ``x / d`` given ``r = RN(1 / d)``, with two FMAs instead of a division.

    Markstein's theorem (Handbook of Floating-Point Arithmetic, 2nd ed., Thm 4.10/4.11): for
    ``q0 = RN(x * r)`` the remainder ``x - q0 * d`` is exact in FP32 and ``RN(q0 + rem * r)`` is
    ``RN(x / d)``, barring underflow and overflow (callers keep quotients and remainders in the
    normal range). Checked here over all 2**23 significands of x for 96 divisors, and against
    ``div_rn`` by the tests.
    """
    q0 = x * r
    return tl.fma(tl.fma(-q0, d, x), r, q0)


@triton.jit
def _zero_quotient_bound(d):
    """Bits of the largest FP32 t with ``fl(t / d) == 0``: the largest t <= d * 2**-150 (the tie at
    2**-150 rounds to 0). That is ``floor(d / 2)`` subnormal steps of 2**-149 for d < 2**24, and
    the exact normal number ``d * 2**-150`` above; 0x7FFFFFFF for d == 0 (every quotient is 0)."""
    normal = ((d * 2.0**-75) * 2.0**-75).to(tl.int32, bitcast=True)
    subnormal = tl.floor(tl.minimum(d, 16777216.0) * 0.5).to(tl.int32)
    return tl.where(d > 0, tl.where(d < 16777216.0, subnormal, normal), 0x7FFFFFFF)


@triton.jit
def _to_f32(x):
    """FP32 value of loaded input: BF16 by a bit shift (exact for subnormals also under
    TRITON_INTERPRET, whose BF16 conversion flushes them; the same instruction on the GPU)."""
    if x.dtype == tl.bfloat16:
        return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def _packed_codes(x, d, r, zero_bound, FAST: tl.constexpr):
    """Codes of 8 elements per row of x (FP32 ``[BLOCKS, 8]``) packed into one int32 per row
    (element j in bits 4j..4j+3, so the word's little-endian bytes are the format's byte order)."""
    if FAST:
        q = div_rn_by_reciprocal(x, d[:, None], r[:, None])  # 0 where d == 0 (r = 0)
        # the sign bit is fl(x / d) < 0: x < 0 and |x| above the block's zero-quotient bound, one
        # unsigned compare of the bits (the sign of q alone can be wrong in the subnormal range)
        bits = x.to(tl.uint32, bitcast=True)
        negative = bits > (zero_bound.to(tl.uint32, bitcast=True) | 0x80000000)[:, None]
    else:
        has_scale = (d > 0)[:, None]
        q = tl.where(has_scale, tl.math.div_rn(x, tl.where(has_scale, d[:, None], 1.0)), 0.0)
        negative = q < 0
    codes = e2m1_index(tl.minimum(tl.abs(q), 6.0)) + tl.where(negative, 8, 0)
    return tl.sum(codes << (4 * tl.arange(0, 8))[None, :], axis=1)


@triton.jit
def fma_probe_kernel(out_ptr):
    """fma(1 + 2**-12, 1 + 2**-12, -(1 + 2**-11)) = 2**-24 when fused; 0 with two roundings (the
    Triton interpreter before 3.7 computes ``x * y + z``)."""
    x = tl.full((1,), 1.0 + 2.0**-12, tl.float32)
    tl.store(out_ptr + tl.arange(0, 1), tl.fma(x, x, tl.full((1,), -(1.0 + 2.0**-11), tl.float32)))


@triton.jit
def quantize_kernel(
    x_ptr, words_ptr, scale_ptr, gs_ptr, n_blocks, BLOCKS: tl.constexpr, DIVIDE: tl.constexpr
):
    """BLOCKS 16-element blocks per program, one block per thread: read x once, write the codes (as
    two int32 words per block) and the E4M3 scale bytes.

    Per block ``s = e4m3_rne(min(amax / fl(6 gs), 448))`` and ``d = s * gs``; per element
    ``code = e2m1_rne(fl(x / d))``. The divisions are correctly rounded like the reference's: by
    ``div_rn`` (``DIVIDE=True``, or a global scale outside [2**-90, 2**100], where Markstein's
    conditions could fail), else by :func:`div_rn_by_reciprocal` with one reciprocal per block
    (3 instructions per element instead of ~10). A block holding NaN or Inf gets the scale byte
    0x7F (E4M3 NaN, which no finite block produces): the host checks the scales, not the input.
    Each block is loaded as two 16-byte halves, so one thread owns it (its amax and scale need
    no shuffles, and per-block work is not repeated).
    """
    pid = tl.program_id(0)
    first = pid.to(tl.int64) * BLOCKS  # 64-bit offsets through the (scalar) base pointers
    x_ptr += first * 16
    words_ptr += first * 2
    scale_ptr += first
    blocks = tl.arange(0, BLOCKS)
    valid = blocks < n_blocks - first
    eight = tl.arange(0, 8)
    rows = x_ptr + blocks[:, None] * 16 + eight[None, :]
    x_lo = _to_f32(tl.load(rows, mask=valid[:, None], other=0.0))
    x_hi = _to_f32(tl.load(rows + 8, mask=valid[:, None], other=0.0))
    # integer max of |x| bits: the amax, with NaN > Inf > finite
    amax_bits = tl.maximum(tl.max(_abs_bits(x_lo), axis=1), tl.max(_abs_bits(x_hi), axis=1))
    amax = amax_bits.to(tl.float32, bitcast=True)
    gs = tl.load(gs_ptr)
    six_gs = 6.0 * gs
    if DIVIDE:
        s = tl.math.div_rn(amax, six_gs)
    else:
        r6 = tl.math.div_rn(1.0, six_gs)  # one correctly rounded reciprocal per program
        # a quotient >= 1024 clamps to 448 anyway (and keeps overflow out of the remainder)
        s = tl.where(amax * r6 >= 1024.0, 1024.0, div_rn_by_reciprocal(amax, six_gs, r6))
    s, s_bits = e4m3_rne(tl.minimum(s, 448.0))
    tl.store(scale_ptr + blocks, tl.where(amax_bits >= 0x7F800000, 0x7F, s_bits).to(tl.uint8), mask=valid)
    d = s * gs
    has_scale = d > 0
    r = tl.where(has_scale, tl.math.div_rn(1.0, tl.where(has_scale, d, 1.0)), 0.0)
    zero_bound = _zero_quotient_bound(d)
    if DIVIDE:
        word_lo = _packed_codes(x_lo, d, r, zero_bound, False)
        word_hi = _packed_codes(x_hi, d, r, zero_bound, False)
    elif (gs >= 2.0**-90) & (gs <= 2.0**100):
        word_lo = _packed_codes(x_lo, d, r, zero_bound, True)
        word_hi = _packed_codes(x_hi, d, r, zero_bound, True)
    else:
        word_lo = _packed_codes(x_lo, d, r, zero_bound, False)
        word_hi = _packed_codes(x_hi, d, r, zero_bound, False)
    words = tl.join(word_lo, word_hi)  # [BLOCKS, 2]: one 8-byte store per block
    tl.store(words_ptr + blocks[:, None] * 2 + tl.arange(0, 2)[None, :], words, mask=valid[:, None])


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


def _pair_decoder_ptx() -> str:
    """PTX of :func:`decode_e2m1_pairs`: output register i takes codes i and i+4 of the input word
    (16 bits apart). Per register: shift the magnitudes (code bits 0-2) to BF16 bits 6-8/22-24 and
    the signs (code bit 3) to 15/31, mask, merge, multiply by the scale pair ($5)."""
    lines = ["{", ".reg .b32 m, s, r;"]
    for out, shift in enumerate((6, 2, -2, -6)):  # magnitude shift; the sign's is 6 more
        lines.append(f"shl.b32 m, $4, {shift};" if shift > 0 else f"shr.b32 m, $4, {-shift};")
        sign = shift + 6
        lines += (
            [f"shl.b32 s, $4, {sign};", "and.b32 s, s, 0x80008000;"]
            if sign
            else ["and.b32 s, $4, 0x80008000;"]
        )
        lines += ["and.b32 m, m, 0x01C001C0;", "or.b32 r, m, s;", f"mul.rn.bf16x2 ${out}, r, $5;"]
    return "\n".join([*lines, "}"])


_PAIR_DECODER_PTX = tl.constexpr(_pair_decoder_ptx())  # a global a kernel may read


@triton.jit
def decode_e2m1_pairs(packed, scale):
    """Inline-PTX decoder (sm_90+): 4 bytes of ModelOpt codes (k0..k7, code k at bits 4k..4k+3) and
    the group scale as BF16 ``s * 2**119`` -> A = (k0, k4, k1, k5), B = (k2, k6, k3, k7) in BF16.

    Each BF16x2 register takes codes k and k+4, which sit 16 bits apart, so one shift puts both
    magnitudes (3 bits) at bits 6-8 and 22-24 and one shift both signs at 15 and 31: that is the
    BF16 number ``e2m1(code) * 2**-126`` (the zero and 0.5 codes come out as zero and a subnormal),
    and ``mul.rn.bf16x2`` by the scale gives ``e2m1(code) * s * 2**-7``, exactly (2 + 4 significant
    bits). Four instructions per register (three for the last), five per two weights with the
    multiply; the caller feeds the activations in the matching order (k permuted within each 8)
    and multiplies the FP32 result by ``global_scale * 2**7``.
    """
    return tl.inline_asm_elementwise(
        asm=_PAIR_DECODER_PTX,
        constraints="=r,=r,=r,=r,r,r,r",
        args=[packed, scale],
        dtype=(tl.bfloat16, tl.bfloat16),
        is_pure=True,
        pack=4,
    )


@triton.jit
def scale_code_to_bf16(code):
    """BF16 ``s * 2**119`` from the kernel's scale byte (see ``w4a16.w4a16_scale_codes``): every
    E4M3 value times 2**119 is a BF16 number with a biased exponent in 237..254 and 3 mantissa
    bits, stored as ``(exponent - 237) << 3 | mantissa``; one shift-and-add gives its bits."""
    return ((code.to(tl.int32) << 4) + (237 << 7)).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _w4a16_k_tile(x, packed, scale_codes, ASM: tl.constexpr, INTERPRET: tl.constexpr, acc):
    """acc += x[BM, BK] @ (W * 2**-7 / gs)^T for one K tile of packed codes [BN, G, 8] and scale
    codes [BN, G]: two ``tl.dot`` over halves of the tile, the asm decoder's A and B outputs against
    the matching activation columns (k = 8w + 4a + 2b + c: A is b = 0 in (c, a) order, B is b = 1),
    or the even and odd elements for the pure-Triton decoder (same weights, exact either way).
    """
    BM: tl.constexpr = x.shape[0]
    BK: tl.constexpr = x.shape[1]
    BN: tl.constexpr = packed.shape[0]
    scale = scale_code_to_bf16(scale_codes)
    if ASM:
        w_a, w_b = decode_e2m1_pairs(packed, scale[:, :, None])
        x = tl.permute(tl.reshape(x, [BM, BK // 8, 2, 2, 2]), [0, 1, 4, 2, 3])
        x_a, x_b = tl.split(tl.reshape(x, [BM, BK // 8, 4, 2]))
    else:
        scale = scale.to(tl.float32)[:, :, None] * 2.0**-126
        packed = packed.to(tl.int32)
        w_a = (e2m1_value(packed & 15) * scale).to(tl.bfloat16)  # exact: 6 significant bits
        w_b = (e2m1_value(packed >> 4) * scale).to(tl.bfloat16)
        x_a, x_b = tl.split(tl.reshape(x, [BM, BK // 2, 2]))
    w_a = tl.reshape(w_a, [BN, BK // 2])
    w_b = tl.reshape(w_b, [BN, BK // 2])
    x_a = tl.reshape(x_a, [BM, BK // 2])
    x_b = tl.reshape(x_b, [BM, BK // 2])
    if INTERPRET:  # the interpreter's BF16 dot is wrong; FP32 products of BF16 values are exact
        acc = tl.dot(x_a.to(tl.float32), tl.trans(w_a.to(tl.float32)), acc)
        acc = tl.dot(x_b.to(tl.float32), tl.trans(w_b.to(tl.float32)), acc)
    else:
        acc = tl.dot(x_a, tl.trans(w_a), acc)
        acc = tl.dot(x_b, tl.trans(w_b), acc)
    return acc


@triton.jit
def _store_tile(
    acc, out_ptr, offs, mask, gs_ptr, bias, partial_ptr, counter_ptr, tile, pid_k, MN, SPLIT: tl.constexpr
):
    """Write an output tile of the W4A16 kernels: ``acc * global_scale * 2**7 + bias``, rounded to the
    output type. With SPLIT > 1, ``acc`` is this program's FP32 partial: it goes to ``partial_ptr``
    and the last of the tile's SPLIT programs (``counter_ptr[tile]``, an atomic counter it resets)
    adds the partials in split order (deterministic) and writes the result: one launch."""
    if SPLIT > 1:
        tl.store(partial_ptr + pid_k * MN + offs, acc, mask=mask)
        done = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel")
        if done == SPLIT - 1:  # the last program of this output tile: reduce in split order
            acc = tl.zeros(acc.shape, dtype=tl.float32)
            for s in range(SPLIT):
                acc += tl.load(partial_ptr + s * MN + offs, mask=mask, other=0.0, cache_modifier=".cg")
            acc = acc * (tl.load(gs_ptr) * 128.0) + bias
            tl.store(out_ptr + offs, to_output(acc, out_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(counter_ptr + tile, 0)  # ready for the next call
    else:
        acc = acc * (tl.load(gs_ptr) * 128.0) + bias
        tl.store(out_ptr + offs, to_output(acc, out_ptr.dtype.element_ty), mask=mask)


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
    EVEN: tl.constexpr,
):
    """out[M, N] = x[M, K] @ dequantize(W)[N, K]^T (+ bias), W streamed as packed NVFP4 bytes.

    ``s_ptr``: one scale code byte per 16 weights (``w4a16.w4a16_scale_codes``). Decoded weights
    are exact (``e2m1 * s * 2**-7``, no rounding) and stay in registers: Triton loads the packed
    bytes straight into the dot-operand layout. The FP32 result is multiplied by ``gs * 2**7``.
    Grid: (M tiles x N tiles, SPLIT). With SPLIT > 1 each program writes an FP32 partial; the last
    program to finish an output tile (an atomic counter, reset afterwards) adds the partials in
    split order (deterministic) and writes the result: one launch (:func:`_store_tile`).
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
    k_groups = K // 16
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None, None] * (K // 2) + group[None, :, None] * 8
    w_rows += tl.arange(0, 8)[None, None, :]
    s_rows = s_ptr + offs_n.to(tl.int64)[:, None] * k_groups + group[None, :]
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + tl.arange(0, BK)[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    first = pid_k * tiles_per_split
    if EVEN:  # N % BN == 0 and K % (BK * tiles_per_split) == 0: no bounds checks on the stream
        # The scale bytes are loaded one K tile ahead, by hand: Triton's pipeliner prefetches the
        # codes and activations (cp.async) but not these 1-byte loads. (Prefetching the codes by
        # hand as well moves the decode off the dot-operand layout: worse, see docs/nvfp4-notes.md.)
        next_codes = tl.load(s_rows + first * G)
        for tile in range(first, first + tiles_per_split):
            scale_codes = next_codes
            next_codes = tl.load(s_rows + tl.minimum(tile + 1, first + tiles_per_split - 1) * G)
            packed = tl.load(w_rows + tile * (BK // 2))
            x = tl.load(x_rows + tile * BK, mask=m_mask[:, None], other=0.0)
            acc = _w4a16_k_tile(x, packed, scale_codes, USE_ASM, INTERPRET, acc)
    else:
        for tile in range(first, first + tiles_per_split):
            g_mask = n_mask[:, None] & (tile * G + group < k_groups)[None, :]
            packed = tl.load(w_rows + tile * (BK // 2), mask=g_mask[:, :, None], other=0)
            scale_codes = tl.load(s_rows + tile * G, mask=g_mask, other=0)
            k_mask = m_mask[:, None] & (tile * BK + tl.arange(0, BK) < K)[None, :]
            x = tl.load(x_rows + tile * BK, mask=k_mask, other=0.0)
            acc = _w4a16_k_tile(x, packed, scale_codes, USE_ASM, INTERPRET, acc)
    out_mask = m_mask[:, None] & n_mask[None, :]
    tile_offs = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    else:
        bias = 0.0
    _store_tile(
        acc, out_ptr, tile_offs, out_mask, gs_ptr, bias, partial_ptr, counter_ptr, pid, pid_k, MN, SPLIT
    )


@triton.jit
def decode_e2m1_natural(packed, scale_codes, INTERPRET: tl.constexpr):
    """Packed ModelOpt codes ``[BN, BK/2]`` and scale codes ``[BN, BK/16]`` -> the weights
    ``e2m1 * s * 2**-7`` as BF16 ``[BN, BK]`` in natural k order (exact, as :func:`decode_e2m1_pairs`).

    Integer ops only: a code's magnitude bits (0-2) shifted to BF16 bits 6-8 and its sign (bit 3) to
    bit 15 are the BF16 number ``e2m1(code) * 2**-126``; one BF16 multiply by ``s * 2**119`` scales it.
    The two codes of a byte become k and k+1 (``tl.join``), which is the pair a thread holds in an
    MMA operand, so Triton keeps the decoded weights in registers as the MMA's A operand.
    Triton's interpreter gets the BF16 bitcast of the joined codes wrong (values off by about
    2**126), so under it the same numbers come from FP32 arithmetic.
    """
    BN: tl.constexpr = packed.shape[0]
    BK: tl.constexpr = packed.shape[1] * 2
    if INTERPRET:
        code = packed.to(tl.int32)
        w = tl.reshape(tl.join(e2m1_value(code & 15), e2m1_value(code >> 4)), [BN, BK // 16, 16])
        scale = scale_code_to_bf16(scale_codes).to(tl.float32) * 2.0**-126
        return tl.reshape(w * scale[:, :, None], [BN, BK]).to(tl.bfloat16)
    code = packed.to(tl.int16)
    low = ((code & 7) << 6) | ((code & 8) << 12)
    high = ((code & 0x70) << 2) | ((code & 0x80) << 8)
    w = tl.reshape(tl.join(low, high), [BN, BK // 16, 16]).to(tl.bfloat16, bitcast=True)
    w = w * scale_code_to_bf16(scale_codes)[:, :, None]
    return tl.reshape(w, [BN, BK])


@triton.jit
def w4a16_wide_kernel(
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
    k_per_split,
    BN: tl.constexpr,
    BM: tl.constexpr,
    BK: tl.constexpr,
    GROUP: tl.constexpr,
    SPLIT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """out[M, N] = x[M, K] @ dequantize(W)[N, K]^T (+ bias) for M of tens to hundreds of tokens.

    The weights are the MMA's first operand: a program computes the transposed tile
    ``W[BN rows, :] @ x[BM tokens, :]^T``, the decoded weights stay in registers (on sm_90 Triton
    issues ``wgmma`` with its A operand in registers) and the activations stream through shared
    memory in their natural order. :func:`w4a16_kernel` has it the other way round (x in registers,
    decoded weights in shared memory), which suits M <= 16 but stores every decoded weight to shared
    memory, 2 bytes at a time. Requires ``N % BN == 0`` and ``K % (BK * SPLIT) == 0``.

    Grid: (N tiles x M tiles, SPLIT), N tiles in groups of GROUP that share the activations in L2.
    SPLIT > 1 splits K: FP32 partials, the last program of an output tile adds them in split order
    (deterministic, an atomic counter it resets): :func:`_store_tile`, as in :func:`w4a16_kernel`.
    """
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_n = N // BN
    num_m = tl.cdiv(M, BM)
    per_group = GROUP * num_m
    first_n = (pid // per_group) * GROUP
    group_size = tl.minimum(num_n - first_n, GROUP)
    pid_n = first_n + (pid % per_group) % group_size
    pid_m = (pid % per_group) // group_size
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_m = pid_m * BM + tl.arange(0, BM)
    m_mask = offs_m < M
    k0 = pid_k * k_per_split
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * (K // 2) + (k0 // 2 + tl.arange(0, BK // 2))[None, :]
    s_rows = s_ptr + offs_n.to(tl.int64)[:, None] * (K // 16) + (k0 // 16 + tl.arange(0, BK // 16))[None, :]
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + (k0 + tl.arange(0, BK))[None, :]
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    for k in range(0, k_per_split, BK):
        w = decode_e2m1_natural(tl.load(w_rows + k // 2), tl.load(s_rows + k // 16), INTERPRET)
        x = tl.load(x_rows + k, mask=m_mask[:, None], other=0.0)
        if INTERPRET:  # the interpreter's BF16 dot is wrong; FP32 products of BF16 values are exact
            acc = tl.dot(w.to(tl.float32), tl.trans(x.to(tl.float32)), acc)
        else:
            acc = tl.dot(w, tl.trans(x), acc)
    out_offs = offs_m.to(tl.int64)[None, :] * N + offs_n[:, None]
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n).to(tl.float32)[:, None]
    else:
        bias = 0.0
    tile = pid_m * num_n + pid_n
    _store_tile(
        acc,
        out_ptr,
        out_offs,
        m_mask[None, :],
        gs_ptr,
        bias,
        partial_ptr,
        counter_ptr,
        tile,
        pid_k,
        MN,
        SPLIT,
    )
