"""Sampling the next token: keyed per-row uniforms and an exact inverse-CDF categorical sample.

Each row draws from its own counter-based stream (:func:`row_uniforms`: a hash of the row's key and
the decode step), so a completion does not depend on what else shares the batch -- the property
that lets N data-parallel ranks reproduce a 1-rank run (issue #28) and SGLang's per-request seeds
match. :func:`sample_next_token` inverts the row's CDF (float64) at that uniform and returns the
token's logprob under ``softmax(logits / T)`` before top-k/top-p.
"""

from __future__ import annotations

import torch

from slime_gb10.grpo.engines.torch import sampling_kernel
from slime_gb10.grpo.interfaces import SamplingParams


def filter_logits(logits: torch.Tensor, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """Set logits outside the top-k / nucleus (top-p) set to -inf (Holtzman et al. 2020)."""
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # drop a token when the mass BEFORE it already reaches top_p (the first token is always kept)
        drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, sorted_idx, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (Mueller's: xor-shift, multiply by 0x45d9f3b, twice) on int64 tensors
    holding values in [0, 2^32); the constant is < 2^27, so no product overflows int64."""
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _M32
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _M32
    return x ^ (x >> 16)


def row_uniforms(keys: torch.Tensor, step: int | torch.Tensor) -> torch.Tensor:
    """One uniform in [0, 1) (53 bits, float64) per row, a pure function of the row's key and the
    decode step: the same sample whatever else shares the batch (counter-based, like Philox).
    ``step`` may be a tensor that broadcasts against ``keys`` (``keys[None, :]`` and
    ``steps[:, None]``: every step's draws at once, as the decode loop takes them).

    Why not a ``torch.Generator``: its stream is consumed in batch order, so a row's tokens would
    depend on its neighbours, and N data-parallel ranks could not reproduce a 1-rank run (issue
    #28). No library offers a keyed per-row draw inside torch's ops, hence these few lines.
    """
    low, high = keys & _M32, (keys >> 32) & _M32
    step = torch.as_tensor(step, dtype=torch.long, device=keys.device)
    draws = []
    for lane in (0, 1):
        counter = _mix32((2 * step + lane) & _M32)
        draws.append(_mix32(_mix32(low ^ counter) ^ high))
    return draws[0].double() * 2.0**-32 + (draws[1] >> 11).double() * 2.0**-53


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor, block: int = 256) -> torch.Tensor:
    """Per row, the token whose CDF interval holds ``uniforms * total``: an exact categorical sample
    from (unnormalised) ``probs`` ``[B, V]`` at ``uniforms`` ``[B]`` (float64, in [0, 1)).

    The CDF is accumulated in float64 in two levels -- the mass of each block of ``block`` tokens,
    their running sum, then the running sum inside the one block the target falls in -- instead of
    one float64 cumsum over the whole vocabulary (on an H100 that cumsum was 8% of a decode step's
    GPU time for 160 x 49,152 logits; issue #27). A token of probability 0 is never returned, also
    where rounding puts the target at the very end of a row or of a block.
    """
    rows, vocab = probs.shape
    pad = (-vocab) % block
    blocks = torch.nn.functional.pad(probs, (0, pad)).view(rows, -1, block)
    mass = blocks.sum(-1, dtype=torch.float64)  # [B, blocks]
    cdf = mass.cumsum(-1)
    target = uniforms[:, None] * cdf[:, -1:]
    positions = torch.arange(mass.shape[1], device=probs.device)
    last_block = torch.where(mass > 0, positions, 0).amax(-1, keepdim=True)
    which = torch.searchsorted(cdf, target, right=True).clamp(max=last_block)  # [B, 1]
    before = torch.where(which > 0, cdf.gather(1, (which - 1).clamp(min=0)), 0.0)
    inside = blocks.gather(1, which[:, :, None].expand(rows, 1, block)).squeeze(1)  # [B, block]
    offsets = torch.arange(block, device=probs.device)
    last_token = torch.where(inside > 0, offsets, 0).amax(-1, keepdim=True)
    within = torch.searchsorted(inside.double().cumsum(-1), target - before, right=True).clamp(max=last_token)
    return (which * block + within).squeeze(-1)


def sample_next_token(
    logits: torch.Tensor,
    params: SamplingParams,
    keys: torch.Tensor | None = None,
    step: int = 0,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row and its logprob under ``softmax(logits / T)`` (before top-k/top-p).

    Sampling inverts each row's CDF (:func:`inverse_cdf`, float64) at :func:`row_uniforms` of its
    key ``keys[row]`` and ``step`` (or at ``uniforms`` ``[B]``, those draws computed ahead): an exact
    categorical sample, reproducible per row. On a GPU without top-k/top-p, one Triton kernel does
    the same (:mod:`~slime_gb10.grpo.engines.torch.sampling_kernel`). Greedy (``T == 0``) takes the argmax and reports the
    logprob under ``softmax(logits)``.
    """
    if params.greedy:
        logits = logits.float()
        tokens = logits.argmax(dim=-1)
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
        return tokens, logprobs
    if uniforms is None:
        if keys is None:
            keys = torch.randint(0, 2**62, (logits.shape[0],), device=logits.device)
        uniforms = row_uniforms(keys, step)
    if sampling_kernel.applies(logits, params):  # the same draw in one kernel (sampling_kernel.py)
        return sampling_kernel.sample_rows(logits.contiguous(), uniforms, params.temperature)
    logits = logits.float()
    scaled = logits / params.temperature
    lse = torch.logsumexp(scaled, dim=-1, keepdim=True)
    if params.truncates(scaled.shape[-1]):
        probs = torch.softmax(filter_logits(scaled, params.top_k, params.top_p), dim=-1)
    else:  # the probabilities are exp(scaled - lse): no second softmax pass over the vocabulary
        probs = torch.exp(scaled - lse)
    tokens = inverse_cdf(probs, uniforms)
    return tokens, (scaled.gather(-1, tokens[:, None]) - lse).squeeze(-1)
