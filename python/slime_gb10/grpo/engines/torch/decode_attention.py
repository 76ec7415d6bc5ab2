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
    """Import the Triton kernels on first use (``_decode_kernels.py``)."""
    from slime_gb10.grpo.engines.torch import _decode_kernels as k

    return k.attend_split, k.merge_splits


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
    qkv_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """The kernels with ``splits`` programs per (row, KV head), a power of two (tests and
    ``benchmarks/grpo/dev/decode_kernel_sweep.py`` choose it and the tile).

    ``rope = (heads, cos, sin, slot)``: ``q`` is the fused q/k/v projection ``[B, (heads + 2 H_kv) D]``
    (or its FP32 partial products ``[P, B, ...]``, summed with ``qkv_bias`` in the kernel) before
    rotary embedding, ``cos``/``sin`` ``[B, D]``, ``slot`` a one-element tensor; the kernel
    rotates q and the new key, writes the new key and value into ``keys``/``values`` (the whole
    buffers; attention reads the first ``S`` slots of ``valid`` ``[B, S]``, none after ``slot``) and
    attends (:func:`decode_step`)."""
    parts, bias = 1, qkv_bias
    if rope is not None:
        heads, cos, sin, slot = rope
        parts = q.shape[0] if q.dim() == 3 else 1
        rows, d = q.shape[-2], keys.shape[3]
        kv_heads, slots = keys.shape[1], valid.shape[1]
        q_heads = q.reshape(parts, rows, -1, d)  # [P, B, H + 2 H_kv, D], a view
        sq_p, sq_b, sq_h = q_heads.stride(0), q_heads.stride(1), q_heads.stride(2)
        cos, sin = cos.reshape(rows, d).contiguous(), sin.reshape(rows, d).contiguous()
        if q.stride(-1) != 1 or sq_h != d or (bias is not None and bias.stride(-1) != 1):
            raise ValueError("the fused q/k/v projection and its bias must be contiguous per row")
        extra = (cos, sin, slot, d, sq_p, q if bias is None else bias)
        if keys.stride(-1) != 1 or values.stride(-1) != 1:
            raise ValueError("the cache the kernel writes must have contiguous head dimensions")
    else:
        rows, heads, _, d = q.shape
        kv_heads, slots = keys.shape[1], keys.shape[2]
        q = q if q.stride(-1) == 1 else q.contiguous()
        sq_b, sq_h = q.stride(0), q.stride(1)
        keys = keys if keys.stride(-1) == 1 else keys.contiguous()
        values = values if values.stride(-1) == 1 else values.contiguous()
        extra = (q, q, q, 0, 0, q)  # unused
    group = heads // kv_heads
    valid = valid.view(torch.uint8) if valid.dtype == torch.bool else valid
    out = torch.empty((rows, heads, 1, d), dtype=keys.dtype, device=q.device)
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
        BLOCK=block, SPLITS=splits, PRECISION="ieee" if keys.dtype == torch.float32 else "tf32",
        ROPE=rope is not None, PARTS=parts, HAS_BIAS=bias is not None,
        num_warps=num_warps, num_stages=num_stages,
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


def reference_step(
    qkv, cos, sin, keys, values, valid, slot, heads: int, scale: float, bias=None
) -> torch.Tensor:
    """The twin of :func:`decode_step`: the partial products summed with the bias in FP32 and rounded
    once, rotate, write the new key and value into the cache at ``slot``, SDPA over the first
    ``valid.shape[1]`` slots up to ``slot`` where ``valid`` allows."""
    if qkv.dim() == 3 or bias is not None:
        summed = qkv.float().sum(0) if qkv.dim() == 3 else qkv.float()
        qkv = (summed if bias is None else summed + bias.float()).to(keys.dtype)
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
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """One decode step's attention from the fused q/k/v projection ``qkv`` ``[B, (heads + 2 H_kv) D]``
    (or ``[P, B, (heads + 2 H_kv) D]``: ``P`` FP32 partial products over slices of K, which the kernel
    sums with ``bias`` and rounds once to the cache dtype; see ``static_decoder.split_k_partials``)
    before rotary embedding: rotates q and the new key by ``cos``/``sin`` (``[B, D]``, any leading
    ones), writes the new key and value into the cache buffers ``keys``/``values`` ``[B, H_kv, L, D]``
    at ``slot`` (a one-element tensor, below ``S``: the program whose share of the ``S`` slots holds
    it writes it) and attends over the slots up to ``slot`` where ``valid`` ``[B, S]`` is true (the
    later slots of the bucket, not written yet, are not read); returns ``[B, heads, 1, D]``. Replaces the rotary, the two cache writes and
    the attention of a decode step by one kernel (three launches of ~1.2-2.7 us per layer and
    step of shape B, issue #27)."""
    rows, kv_heads = qkv.shape[-2], keys.shape[1]
    splits = splits_for(rows, kv_heads, valid.shape[1], qkv.device)
    return launch(qkv, keys, values, valid, scale, splits, rope=(heads, cos, sin, slot), qkv_bias=bias)


@decode_step.register_fake
def _(qkv, cos, sin, keys, values, valid, slot, heads, scale, bias=None):
    return qkv.new_empty((qkv.shape[-2], heads, 1, keys.shape[3]), dtype=keys.dtype)
