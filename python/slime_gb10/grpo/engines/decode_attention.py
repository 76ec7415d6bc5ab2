"""Decode attention (one new query per row) over a KV cache with grouped-query heads, as a Triton kernel.

Its pure-torch twin is :func:`reference`: ``scaled_dot_product_attention`` of ``q`` ``[B, H, 1, D]``
over the cache slots ``[B, H_kv, S, D]`` where ``valid`` ``[B, S]`` allows. The kernel gives each
(row, KV head) one program that holds the ``H / H_kv`` query heads sharing that KV head as the rows
of its tiles, so the cache is read once per KV head, not once per query head; BF16 tensor-core dots,
FP32 online softmax (Dao et al.'s FlashAttention recurrence). When the batch has fewer (row, KV
head) pairs than twice the GPU's SMs the slots are split among several programs and a second kernel
merges their partial results by their log-sum-exp (flash-decoding). :func:`decode_step` is the same
kernel fed with the fused q/k/v projection before rotary embedding: it also rotates q and the new key
and writes the new key and value into the cache (its twin :func:`reference_step`).

Why a kernel: the attention torch picks for this (cuDNN's SM80 flash kernel, taking each query head
separately) was a quarter of a decode step of shape B on an H100 (19.1 us per call; this kernel 15.1 us
in the same step, BENCHMARKS.md, issue #27); FlexAttention through inductor ran 40x slower in the same
step (``benchmarks/grpo/dev/rollout_variants.py``), and FlashInfer's decode kernels, which do this in
SGLang, are not in the PyTorch engine's dependencies.
"""

from __future__ import annotations

import functools

import torch

from slime_gb10.grpo.engines import triton_importable

#: cache slots per tile; with 4 warps and a 2-stage pipeline the fastest of 81 launches on an H100 for
#: shape B (benchmarks/grpo/dev/decode_kernel_sweep.py with the KV in L2: 10.0 us against SDPA's 19.9)
BLOCK_N = 128


def reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, scale: float):
    """The twin: SDPA with a boolean mask ``valid`` ``[B, S]`` broadcast over heads."""
    return torch.nn.functional.scaled_dot_product_attention(
        q,
        keys,
        values,
        attn_mask=valid[:, None, None, :],
        scale=scale,
        enable_gqa=keys.shape[1] != q.shape[1],
    )


def available(device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether :func:`decode_attention` serves a model of these sizes here: a CUDA device, BF16/FP16
    (tensor-core dots) or FP32 (exact FP32 dots, for tests that need tokens equal to the plain
    path's), whole query groups, a power-of-two head dimension of 16..256, Triton importable."""
    return (
        torch.device(device).type == "cuda"
        and dtype in (torch.bfloat16, torch.float16, torch.float32)
        and heads % kv_heads == 0
        and 16 <= head_dim <= 256
        and head_dim & (head_dim - 1) == 0
        and triton_importable()
    )


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def attend_split(
        q, k, v, valid, out, part_out, part_lse,
        slots, scale,
        sq_b, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sm_b, sm_s, so_b, so_h,
        cos, sin, slot_at, sc_b,
        KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_P: tl.constexpr, D: tl.constexpr,
        BLOCK: tl.constexpr, SPLITS: tl.constexpr, PRECISION: tl.constexpr, ROPE: tl.constexpr,
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
            qa = tl.load(base + heads[:, None] * sq_h + dims[None, :], mask=real[:, None], other=0.0)
            qb = tl.load(base + heads[:, None] * sq_h + half[None, :], mask=real[:, None], other=0.0)
            qt = (qa.to(tl.float32) * c[None, :] + sign[None, :] * qb.to(tl.float32) * s_[None, :]).to(
                qa.dtype
            )
            slot = tl.load(slot_at)
            # no slot after this one is written yet: its tiles are skipped, not read and masked (a
            # bucket has up to 63 of them; a tile of padding only leaves the softmax state as it is)
            last = tl.minimum(last, slot + 1)
            if (slot >= first) & (slot < last):
                k_head = KV_HEADS * GROUP + kv_head
                ka = tl.load(base + k_head * sq_h + dims).to(tl.float32)
                kb = tl.load(base + k_head * sq_h + half).to(tl.float32)
                k_new = ka * c + sign * kb * s_
                v_new = tl.load(base + (k_head + KV_HEADS) * sq_h + dims)
                tl.store(k + row * sk_b + kv_head * sk_h + slot * sk_s + dims, k_new.to(k.dtype.element_ty))
                tl.store(v + row * sv_b + kv_head * sv_h + slot * sv_s + dims, v_new.to(v.dtype.element_ty))
                tl.debug_barrier()  # the writes above before this program's threads read the slot
        else:
            qt = tl.load(
                q + row * sq_b + heads[:, None] * sq_h + dims[None, :], mask=real[:, None], other=0.0
            )
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

    return attend_split, merge_splits


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    """The device's SMs; off a GPU (the interpreter, in tests) a nominal 8."""
    if device.type != "cuda":
        return 8
    return torch.cuda.get_device_properties(device.index or 0).multi_processor_count


def splits_for(rows: int, kv_heads: int, slots: int, device: torch.device) -> int:
    """Programs per (row, KV head), a power of two: 1 when those pairs already fill the GPU twice,
    else enough to, but no more than one tile of slots each (16 rows x 512 slots on an H100, KV in
    L2: 4 splits 5.1 us, SDPA 11.6 us)."""
    sms = _multiprocessors(torch.device(device))
    want = -(-2 * sms // max(1, rows * kv_heads))
    tiles = max(1, slots // BLOCK_N)
    return min(1 << (want - 1).bit_length(), 1 << (tiles.bit_length() - 1), 16)


@torch.library.custom_op("slime_gb10::decode_attention", mutates_args=())
def decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, scale: float
) -> torch.Tensor:
    """``q`` ``[B, H, 1, D]`` over ``keys``/``values`` ``[B, H_kv, S, D]`` (any strides but the last)
    where ``valid`` ``[B, S]`` is true; returns ``[B, H, 1, D]``. A custom op, so that ``torch.compile``
    keeps it as one call and CUDA graphs capture its launches."""
    return launch(
        q, keys, values, valid, scale, splits_for(q.shape[0], keys.shape[1], keys.shape[2], q.device)
    )


def launch(
    q,
    keys,
    values,
    valid,
    scale: float,
    splits: int,
    block: int = BLOCK_N,
    num_warps: int = 4,
    num_stages: int = 2,
    rope: tuple | None = None,
) -> torch.Tensor:
    """The kernels with ``splits`` programs per (row, KV head), a power of two (tests and
    ``benchmarks/grpo/dev/decode_kernel_sweep.py`` choose it and the tile).

    ``rope = (heads, cos, sin, slot)``: ``q`` is the fused q/k/v projection ``[B, (heads + 2 H_kv) D]``
    before rotary embedding, ``cos``/``sin`` ``[B, D]``, ``slot`` a one-element tensor; the kernel
    rotates q and the new key, writes the new key and value into ``keys``/``values`` (the whole
    buffers; attention reads the first ``S`` slots of ``valid`` ``[B, S]``, none after ``slot``) and
    attends (:func:`decode_step`)."""
    if rope is not None:
        heads, cos, sin, slot = rope
        rows, d = q.shape[0], keys.shape[3]
        kv_heads, slots = keys.shape[1], valid.shape[1]
        q_heads = q.view(rows, -1, d)  # [B, H + 2 H_kv, D]
        sq_b, sq_h = q_heads.stride(0), q_heads.stride(1)
        cos, sin = cos.reshape(rows, d).contiguous(), sin.reshape(rows, d).contiguous()
        extra = (cos, sin, slot, d)
        if keys.stride(-1) != 1 or values.stride(-1) != 1:
            raise ValueError("the cache the kernel writes must have contiguous head dimensions")
    else:
        rows, heads, _, d = q.shape
        kv_heads, slots = keys.shape[1], keys.shape[2]
        q = q if q.stride(-1) == 1 else q.contiguous()
        sq_b, sq_h = q.stride(0), q.stride(1)
        keys = keys if keys.stride(-1) == 1 else keys.contiguous()
        values = values if values.stride(-1) == 1 else values.contiguous()
        extra = (q, q, q, 0)  # unused
    group = heads // kv_heads
    valid = valid.view(torch.uint8) if valid.dtype == torch.bool else valid
    out = torch.empty((rows, heads, 1, d), dtype=q.dtype, device=q.device)
    if splits > 1:
        part_out = torch.empty((rows, heads, splits, d), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((rows, heads, splits), dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out  # unused
    attend_split, merge_splits = _kernels()
    attend_split[(rows * kv_heads, splits)](
        q, keys, values, valid, out, part_out, part_lse,
        slots, scale,
        sq_b, sq_h, keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2), valid.stride(0), valid.stride(1),
        out.stride(0), out.stride(1),
        *extra,
        KV_HEADS=kv_heads, GROUP=group, GROUP_P=max(16, 1 << (group - 1).bit_length()), D=d,
        BLOCK=block, SPLITS=splits, PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        ROPE=rope is not None, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    if splits > 1:
        merge_splits[(rows * heads,)](
            part_out, part_lse, out, heads, out.stride(0), out.stride(1), D=d, SPLITS=splits
        )
    return out


@decode_attention.register_fake
def _(q, keys, values, valid, scale):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's rotary embedding ``x cos + rotate_half(x) sin`` in FP32, rounded once to ``x``'s dtype."""
    half = x.shape[-1] // 2
    xf = x.float()
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos.float() + rotated * sin.float()).to(x.dtype)


def reference_step(qkv, cos, sin, keys, values, valid, slot, heads: int, scale: float) -> torch.Tensor:
    """The twin of :func:`decode_step`: rotate, write the new key and value into the cache at
    ``slot``, SDPA over the first ``valid.shape[1]`` slots up to ``slot`` where ``valid`` allows."""
    rows, d = qkv.shape[0], keys.shape[3]
    kv_heads = keys.shape[1]
    parts = qkv.view(rows, heads + 2 * kv_heads, d)
    cos, sin = cos.reshape(rows, 1, d), sin.reshape(rows, 1, d)
    q = rotate(parts[:, :heads], cos, sin)
    k = rotate(parts[:, heads : heads + kv_heads], cos, sin)
    keys.index_copy_(2, slot, k[:, :, None].to(keys.dtype))
    values.index_copy_(2, slot, parts[:, heads + kv_heads :, None].to(values.dtype))
    span = valid.shape[1]
    valid = valid & (torch.arange(span, device=valid.device) <= slot)  # nothing is written after slot
    return reference(q[:, :, None], keys[:, :, :span], values[:, :, :span], valid, scale)


@torch.library.custom_op("slime_gb10::decode_step_attention", mutates_args=("keys", "values"))
def decode_step(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    valid: torch.Tensor,
    slot: torch.Tensor,
    heads: int,
    scale: float,
) -> torch.Tensor:
    """One decode step's attention from the fused q/k/v projection ``qkv`` ``[B, (heads + 2 H_kv) D]``
    before rotary embedding: rotates q and the new key by ``cos``/``sin`` (``[B, D]``, any leading
    ones), writes the new key and value into the cache buffers ``keys``/``values`` ``[B, H_kv, L, D]``
    at ``slot`` (a one-element tensor, below ``S``: the program whose share of the ``S`` slots holds
    it writes it) and attends over the slots up to ``slot`` where ``valid`` ``[B, S]`` is true (the
    later slots of the bucket, not written yet, are not read); returns ``[B, heads, 1, D]``. Replaces the rotary, the two cache writes and
    the attention of a decode step by one kernel (three launches of ~1.2-2.7 us per layer and
    step of shape B, issue #27)."""
    rows, kv_heads = qkv.shape[0], keys.shape[1]
    splits = splits_for(rows, kv_heads, valid.shape[1], qkv.device)
    return launch(qkv, keys, values, valid, scale, splits, rope=(heads, cos, sin, slot))


@decode_step.register_fake
def _(qkv, cos, sin, keys, values, valid, slot, heads, scale):
    return qkv.new_empty((qkv.shape[0], heads, 1, keys.shape[3]))
