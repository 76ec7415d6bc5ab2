"""The sampler of :mod:`slime_gb10.grpo.engines.torch.sampling` as one Triton kernel (one program per row).

Its pure-torch twin is :func:`~slime_gb10.grpo.engines.torch.sampling.sample_next_token` without
top-k/top-p: ``logsumexp`` of ``logits / T``, ``probs = exp(logits / T - lse)`` (FP32), the CDF
accumulated in float64 in two levels (block masses, then one block), the token whose interval holds
``u * total``, never a token of probability 0, and its logprob ``logits[token] / T - lse``. The twin
runs ~20 kernels over ``[B, V]`` FP32/FP64 copies of the logits: on an H100, 14% of a decode step
of shape B (160 x 49,152; issue #27). Here each row's logits are read three times from the BF16
tensor the LM head wrote (max and sum, block masses, the one block the target falls in) and
nothing is written but a token and a logprob per row.

The block masses live in registers (``CHUNKS`` of them, a power of two >= ``ceil(V / BLOCK)``), so
the second pass needs no scratch memory. Blocks are ``BLOCK`` tokens here and 256 in the twin, so
the float64 sums are associated differently: the two pick different tokens only when ``u * total``
falls within float64 rounding of a CDF boundary (the tests compare them token for token).

Why a kernel of ours: no library samples a categorical at a caller's uniform (FlashInfer's sampling
kernels draw their own Philox numbers, and FlashInfer is not a dependency of the PyTorch engine;
Liger-Kernel has no sampler).
"""

from __future__ import annotations

import functools

import torch

from slime_gb10.grpo.engines import triton_importable

#: tokens per block: one row of shape B's 49,152-token vocabulary is 6 blocks. On an H100
#: (``benchmarks/grpo/dev/sampler_sweep.py``, 160 rows, 8 warps): 23.9 us a call against 25.6 us with
#: 4096 and 31.1 us with 16,384
BLOCK = 8192


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def sample_rows(
        logits,  # [B, V] (any float dtype), row stride ``stride``
        stride,
        uniforms,  # [B] float64 in [0, 1)
        tokens,  # [B] int64 (out)
        logprobs,  # [B] float32 (out)
        vocab,
        temperature,
        BLOCK: tl.constexpr,
        CHUNKS: tl.constexpr,
    ):
        row = tl.program_id(0)
        base = logits + row.to(tl.int64) * stride
        offsets = tl.arange(0, BLOCK)
        # 1. logsumexp of logits / T, online over the blocks (FP32, like torch.logsumexp)
        peak = tl.full((), -3.0e38, tl.float32)
        total = tl.full((), 0.0, tl.float32)
        for start in range(0, vocab, BLOCK):
            x = tl.load(base + start + offsets, mask=start + offsets < vocab, other=float("-inf"))
            x = x.to(tl.float32) / temperature
            new_peak = tl.maximum(peak, tl.max(x, 0))
            total = total * tl.exp(peak - new_peak) + tl.sum(tl.exp(x - new_peak), 0)
            peak = new_peak
        lse = peak + tl.log(total)
        # 2. the float64 mass of every block, kept in registers
        chunk_ids = tl.arange(0, CHUNKS)
        masses = tl.zeros((CHUNKS,), dtype=tl.float64)
        for chunk in range(0, tl.cdiv(vocab, BLOCK)):
            start = chunk * BLOCK
            x = tl.load(base + start + offsets, mask=start + offsets < vocab, other=float("-inf"))
            p = tl.exp(x.to(tl.float32) / temperature - lse)
            masses = tl.where(chunk_ids == chunk, tl.sum(p.to(tl.float64), 0), masses)
        cdf = tl.cumsum(masses, 0)
        target = tl.load(uniforms + row) * tl.max(cdf, 0)
        # the first block whose CDF passes the target (searchsorted, right), never an empty one
        last_chunk = tl.max(tl.where(masses > 0, chunk_ids, 0), 0)
        which = tl.minimum(tl.sum((cdf <= target).to(tl.int32), 0), last_chunk)
        before = tl.sum(tl.where(chunk_ids == which - 1, cdf, 0.0), 0)
        # 3. inside that block: the float64 running sum and the first token past the target
        start = which * BLOCK
        x = tl.load(base + start + offsets, mask=start + offsets < vocab, other=float("-inf"))
        p = tl.exp(x.to(tl.float32) / temperature - lse)
        inside = tl.cumsum(p.to(tl.float64), 0)
        last_token = tl.max(tl.where(p > 0, offsets, 0), 0)
        within = tl.minimum(tl.sum((inside <= target - before).to(tl.int32), 0), last_token)
        token = start + within
        tl.store(tokens + row, token.to(tl.int64))
        chosen = tl.load(base + token).to(tl.float32) / temperature
        tl.store(logprobs + row, chosen - lse)

    return sample_rows


def applies(logits: torch.Tensor, params) -> bool:
    """Whether :func:`sample_rows` serves this draw: random sampling without top-k/top-p, logits on a
    CUDA device, Triton importable (the CPU keeps the torch twin)."""
    if params.greedy or logits.dim() != 2 or params.truncates(logits.shape[-1]):
        return False
    return logits.is_cuda and triton_importable()


def sample_rows(
    logits: torch.Tensor, uniforms: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens ``[B]`` (int64) and logprobs ``[B]`` (FP32) sampled from ``softmax(logits / T)`` at
    ``uniforms`` ``[B]`` (float64): what ``sample_next_token`` returns without top-k/top-p."""
    if logits.dim() != 2 or logits.stride(-1) != 1:
        raise ValueError("sample_rows takes [B, V] logits with contiguous rows")
    rows, vocab = logits.shape
    tokens = torch.empty(rows, dtype=torch.long, device=logits.device)
    logprobs = torch.empty(rows, dtype=torch.float32, device=logits.device)
    chunks = max(2, 1 << (-(-vocab // BLOCK) - 1).bit_length())
    _kernel()[(rows,)](
        logits,
        logits.stride(0),
        uniforms.to(device=logits.device, dtype=torch.float64).contiguous(),
        tokens,
        logprobs,
        vocab,
        float(temperature),
        BLOCK=BLOCK,
        CHUNKS=chunks,
        num_warps=8,
    )
    return tokens, logprobs
