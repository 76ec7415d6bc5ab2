"""The decode loop's bookkeeping between two steps of the static path, as one Triton kernel.

After each sample the loop pads the rows that had already finished, marks the rows that just drew an
end-of-sequence token, and writes the next step's inputs into the CUDA graph's static buffers: the
token, its cache slot, that slot in the attention mask, and the rotary positions (one further, from
the second step on). Its pure-torch twin, :func:`record_and_feed_reference`, is those eight ops as the
loop ran them: a fill, a ``where``, an ``isin`` and an ``or``, then four writes, eight launches of ~2 us
per decode step outside the graph (shape B on an H100, issue #27). The kernel is one launch with one
program per row; it never reads the host, so the loop stays free of syncs.

Why a kernel of ours: these are the engine's own buffers, and nothing in torch fuses ops outside a
compiled region (compiling the loop body would put a dynamo guard on every step).
"""

from __future__ import annotations

import functools

import torch

from slime_gb10.grpo.engines import triton_importable


def pad_and_mark(token: torch.Tensor, finished: torch.Tensor, eos: torch.Tensor, pad: int) -> torch.Tensor:
    """The recorded tokens (``pad`` where a row had finished); rows whose recorded token is in
    ``eos`` join ``finished`` (in place). The decode loop's own step on every path; the kernel's
    first half."""
    token = torch.where(finished, torch.full_like(token, pad), token)
    finished |= torch.isin(token, eos)
    return token


def record_and_feed_reference(
    token: torch.Tensor,  # [B] int64, the sampled tokens
    finished: torch.Tensor,  # [B] bool, updated in place
    eos: torch.Tensor,  # [E] int64
    pad: int,
    input_ids: torch.Tensor,  # [B, 1] int64: the next step's token
    positions: torch.Tensor,  # [B, 1] int64: its rotary position, + bump
    cache_position: torch.Tensor,  # [1] int64: its cache slot
    mask: torch.Tensor,  # [B, 1, 1, L] bool: slot set
    slot: int,
    bump: int,
) -> torch.Tensor:
    """The twin: the recorded tokens (``pad`` where a row had finished); ``finished`` gains the rows
    whose recorded token is in ``eos``, and the next step's inputs are written."""
    token = pad_and_mark(token, finished, eos, pad)
    input_ids.copy_(token[:, None])
    cache_position.fill_(slot)
    mask[:, 0, 0, slot] = True
    if bump:
        positions.add_(bump)
    return token


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def record_and_feed(
        token, finished, eos, n_eos, pad, recorded,
        input_ids, s_ids, positions, s_pos, cache_position, mask, s_mask, slot, bump,
        EOS_P: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)
        done = tl.load(finished + row) != 0
        drawn = tl.where(done, pad, tl.load(token + row))
        ends = tl.load(eos + tl.arange(0, EOS_P), mask=tl.arange(0, EOS_P) < n_eos, other=-1)
        hit = tl.sum((ends == drawn).to(tl.int32), 0) > 0
        tl.store(recorded + row, drawn)
        tl.store(finished + row, (done | hit).to(tl.int8))
        tl.store(input_ids + row * s_ids, drawn)
        tl.store(positions + row * s_pos, tl.load(positions + row * s_pos) + bump)
        tl.store(mask + row * s_mask + slot, tl.full((), 1, tl.int8))
        if row == 0:
            tl.store(cache_position, slot)

    return record_and_feed


def applies(token: torch.Tensor) -> bool:
    """Whether :func:`record_and_feed` runs the kernel: a CUDA tensor and Triton importable."""
    return token.is_cuda and triton_importable()


def record_and_feed(token, finished, eos, pad, input_ids, positions, cache_position, mask, slot, bump):
    """:func:`record_and_feed_reference` in one kernel (same arguments, same results)."""
    rows = token.shape[0]
    recorded = torch.empty_like(token)
    _kernel()[(rows,)](
        token, finished.view(torch.int8), eos, eos.numel(), pad, recorded,
        input_ids, input_ids.stride(0), positions, positions.stride(0), cache_position,
        mask.view(torch.int8), mask.stride(0), slot, bump,
        EOS_P=max(2, 1 << (eos.numel() - 1).bit_length()),
    )  # fmt: skip
    return recorded
