"""A step's completions as training batches: :class:`Sample`, right-padded :func:`collate`, and
length-sorted microbatches (:func:`split_microbatches`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slime_gb10.grpo.interfaces import TokenBatch


@dataclass
class Sample:
    """One completion ready for training."""

    prompt_ids: list[int]
    completion_ids: list[int]
    rollout_logprobs: list[float]
    advantage: float
    reward: float
    truncated: bool
    train: bool = True  # False: masked out (overlong filtering)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


def collate(samples: list[Sample], pad_token_id: int) -> tuple[TokenBatch, dict[str, torch.Tensor]]:
    """Right-padded :class:`TokenBatch` + per-sequence advantages and per-token rollout logprobs."""
    width = max(s.length for s in samples)
    batch = len(samples)
    input_ids = torch.full((batch, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    completion_mask = torch.zeros((batch, width), dtype=torch.float32)
    rollout_logprobs = torch.zeros((batch, width), dtype=torch.float32)
    for row, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        input_ids[row, : p + c] = torch.tensor(s.prompt_ids + s.completion_ids, dtype=torch.long)
        attention_mask[row, : p + c] = 1
        if s.train and c:
            completion_mask[row, p : p + c] = 1.0
        if c:
            rollout_logprobs[row, p : p + c] = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
    extras = {
        "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        "rollout_logprobs": rollout_logprobs,
    }
    return TokenBatch(input_ids, attention_mask, completion_mask), extras


def right_padded(attention_mask: torch.Tensor) -> bool:
    """True when every row is its tokens followed by padding only (:class:`TokenBatch`'s layout,
    what :func:`collate` builds): causal attention then needs no padding mask."""
    return bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())


def split_microbatches(samples: list[Sample], micro_batch_size: int) -> list[list[Sample]]:
    """Sort by length (less padding) and cut into microbatches of at most ``micro_batch_size``."""
    ordered = sorted(samples, key=lambda s: s.length)
    return [ordered[i : i + micro_batch_size] for i in range(0, len(ordered), micro_batch_size)]
