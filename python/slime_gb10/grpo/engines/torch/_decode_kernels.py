"""The Triton kernels of :mod:`~slime_gb10.grpo.engines.torch.decode_attention` (imported on first use, so
the engine's CPU path needs no Triton): ``attend_split`` attends one new query per row over a KV
cache, ``merge_splits`` merges the partial results of a row's programs; ``projected`` reads the
fused q/k/v projection, or sums its partial products. Their twins and launch code are in
``decode_attention.py``."""

import triton
import triton.language as tl


@triton.jit
def projected(
    base, offsets, mask, sq_p, bias, PARTS: tl.constexpr, HAS_BIAS: tl.constexpr, OUT: tl.constexpr
):
    """The fused q/k/v projection at ``offsets``: as stored, or (``PARTS`` FP32 partial products
    over slices of K, ``PARTS`` apart) their sum plus the bias, rounded once to ``OUT`` like the
    output of one GEMM."""
    x = tl.load(base + offsets, mask=mask, other=0.0)
    if PARTS > 1 or HAS_BIAS:
        x = x.to(tl.float32)
        for part in tl.static_range(1, PARTS):
            x += tl.load(base + part * sq_p + offsets, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            x += tl.load(bias + offsets, mask=mask, other=0.0).to(tl.float32)
        x = x.to(OUT)
    return x


@triton.jit
def attend_split(
    q, k, v, valid, out, part_out, part_lse,
    slots, scale,
    sq_b, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sm_b, sm_s, so_b, so_h,
    cos, sin, slot_at, sc_b, sq_p, qkv_bias,
    KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_P: tl.constexpr, D: tl.constexpr,
    BLOCK: tl.constexpr, SPLITS: tl.constexpr, PRECISION: tl.constexpr, ROPE: tl.constexpr,
    PARTS: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    pair = tl.program_id(0)  # row * KV_HEADS + kv head
    split = tl.program_id(1)
    row = pair // KV_HEADS
    kv_head = pair % KV_HEADS
    g = tl.arange(0, GROUP_P)
    dims = tl.arange(0, D)
    heads = kv_head * GROUP + g
    real = g < GROUP
    per_split = tl.cdiv(tl.cdiv(slots, BLOCK), SPLITS) * BLOCK
    first = split * per_split
    last = tl.minimum(first + per_split, slots)
    if ROPE:
        # q is the row's fused q/k/v projection ([H + 2 H_kv] heads of D, stride sq_h): rotate q
        # and the new key (HF's x cos + rotate_half(x) sin, rotate_half(x) = [-x2, x1]), round
        # them to the cache dtype as the plain step does, and write the new key and value into
        # the cache slot `slot_at` from the program whose share of the slots holds it
        half = (dims + D // 2) % D
        sign = tl.where(dims < D // 2, -1.0, 1.0)
        c = tl.load(cos + row * sc_b + dims).to(tl.float32)
        s_ = tl.load(sin + row * sc_b + dims).to(tl.float32)
        base = q + row * sq_b
        cache_t = k.dtype.element_ty
        qa = projected(base, heads[:, None] * sq_h + dims[None, :], real[:, None], sq_p, qkv_bias,
                       PARTS, HAS_BIAS, cache_t)  # fmt: skip
        qb = projected(base, heads[:, None] * sq_h + half[None, :], real[:, None], sq_p, qkv_bias,
                       PARTS, HAS_BIAS, cache_t)  # fmt: skip
        qt = (qa.to(tl.float32) * c[None, :] + sign[None, :] * qb.to(tl.float32) * s_[None, :]).to(cache_t)
        slot = tl.load(slot_at)
        # no slot after this one is written yet: its tiles are skipped, not read and masked (a
        # bucket has up to 63 of them; a tile of padding only leaves the softmax state as it is)
        last = tl.minimum(last, slot + 1)
        if (slot >= first) & (slot < last):
            k_head = KV_HEADS * GROUP + kv_head
            every = dims < D
            ka = projected(base, k_head * sq_h + dims, every, sq_p, qkv_bias, PARTS, HAS_BIAS, cache_t)
            kb = projected(base, k_head * sq_h + half, every, sq_p, qkv_bias, PARTS, HAS_BIAS, cache_t)
            k_new = ka.to(tl.float32) * c + sign * kb.to(tl.float32) * s_
            v_head = k_head + KV_HEADS
            v_new = projected(base, v_head * sq_h + dims, every, sq_p, qkv_bias, PARTS, HAS_BIAS, cache_t)
            tl.store(k + row * sk_b + kv_head * sk_h + slot * sk_s + dims, k_new.to(k.dtype.element_ty))
            tl.store(v + row * sv_b + kv_head * sv_h + slot * sv_s + dims, v_new.to(v.dtype.element_ty))
            tl.debug_barrier()  # the writes above before this program's threads read the slot
    else:
        qt = tl.load(q + row * sq_b + heads[:, None] * sq_h + dims[None, :], mask=real[:, None], other=0.0)
    peak = tl.full((GROUP_P,), float("-inf"), tl.float32)
    total = tl.zeros((GROUP_P,), tl.float32)
    acc = tl.zeros((GROUP_P, D), tl.float32)
    k_base = k + row * sk_b + kv_head * sk_h
    v_base = v + row * sv_b + kv_head * sv_h
    for start in range(first, last, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < last
        ok = tl.load(valid + row * sm_b + cols * sm_s, mask=inside, other=0) != 0
        kt = tl.load(k_base + cols[:, None] * sk_s + dims[None, :], mask=inside[:, None], other=0.0)
        scores = tl.dot(qt, tl.trans(kt), input_precision=PRECISION) * scale  # [GROUP_P, BLOCK] in FP32
        scores = tl.where(ok[None, :], scores, float("-inf"))
        new_peak = tl.maximum(peak, tl.max(scores, 1))
        shift = tl.where(new_peak == float("-inf"), 0.0, new_peak)  # a block of padding only
        p = tl.exp(scores - shift[:, None])
        alpha = tl.exp(peak - shift)
        total = total * alpha + tl.sum(p, 1)
        vt = tl.load(v_base + cols[:, None] * sv_s + dims[None, :], mask=inside[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt, input_precision=PRECISION)
        peak = new_peak
    result = acc / tl.where(total > 0, total, 1.0)[:, None]
    if SPLITS == 1:
        target = out + row * so_b + heads[:, None] * so_h + dims[None, :]
        tl.store(target, result.to(out.dtype.element_ty), mask=real[:, None])
    else:
        lse = tl.where(total > 0, peak + tl.log(total), float("-inf"))
        slot = (row * KV_HEADS * GROUP + heads) * SPLITS + split  # [B, H, SPLITS]
        tl.store(part_lse + slot, lse, mask=real)
        tl.store(part_out + slot[:, None] * D + dims[None, :], result, mask=real[:, None])


@triton.jit
def merge_splits(part_out, part_lse, out, heads_total, so_b, so_h, D: tl.constexpr, SPLITS: tl.constexpr):
    pair = tl.program_id(0)  # row * H + head
    row = pair // heads_total
    head = pair % heads_total
    splits = tl.arange(0, SPLITS)
    dims = tl.arange(0, D)
    lse = tl.load(part_lse + pair * SPLITS + splits)
    peak = tl.max(lse, 0)
    weight = tl.where(lse == float("-inf"), 0.0, tl.exp(lse - peak))
    parts = tl.load(part_out + (pair * SPLITS + splits)[:, None] * D + dims[None, :])
    merged = tl.sum(parts * weight[:, None], 0) / tl.sum(weight, 0)
    tl.store(out + row * so_b + head * so_h + dims, merged.to(out.dtype.element_ty))
