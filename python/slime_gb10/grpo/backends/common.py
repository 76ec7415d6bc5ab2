"""What every policy backend does the same way: moving a batch, and one gradient-accumulation pass.

Both backends (PyTorch and Megatron-core) run the same microbatch loop: forward to
logprobs/entropy, the trainer's loss, a finiteness check before ``backward`` (a NaN must never
reach the optimizer), and token-weighted metrics. Only the forward and "forget the gradients"
differ, so those are the two callables this module takes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from slime_gb10.grpo.interfaces import TokenBatch


class NonFiniteError(FloatingPointError):
    """A loss or gradient was NaN/Inf; the optimizer step was not taken."""


def warmup_factor(step: int, warmup_steps: int) -> float:
    """The learning-rate multiplier at optimizer step ``step`` (0-based): linear warmup over
    ``warmup_steps`` steps, ``(step + 1) / warmup_steps`` up to 1, then constant (0: no warmup).
    Both policy backends schedule through it."""
    return min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0


def logprob_temperature(rollout_temperature: float) -> float:
    """The temperature the trainer's logprobs use: the rollout's (its tokens were sampled from
    ``softmax(logits / T)``), or 1 after greedy rollouts (``T == 0`` has no softmax to match)."""
    return rollout_temperature if rollout_temperature > 0 else 1.0


def batch_to_device(batch: TokenBatch, device: torch.device) -> TokenBatch:
    if batch.input_ids.device == device:
        return batch
    return TokenBatch(
        input_ids=batch.input_ids.to(device, non_blocking=True),
        attention_mask=batch.attention_mask.to(device, non_blocking=True),
        completion_mask=batch.completion_mask.to(device, non_blocking=True),
    )


def accumulate_gradients(
    microbatches: Sequence[tuple[TokenBatch, dict[str, torch.Tensor]]],
    *,
    device: torch.device,
    forward: Callable[[TokenBatch], tuple[torch.Tensor, torch.Tensor | None]],
    loss_fn,
    discard_gradients: Callable[[], None],
) -> tuple[float, dict[str, float]]:
    """Backpropagate ``loss_fn`` over every microbatch; return (summed loss, token-weighted metrics).

    ``loss_fn(logprobs, entropy, batch, extras) -> (loss, metrics)`` returns microbatch losses that
    already sum to the minibatch loss (``interfaces.PolicyBackend.train_step``); each is multiplied by
    ``extras["loss_scale"]`` (default 1). A non-finite loss calls ``discard_gradients`` and raises
    :class:`NonFiniteError` before anything is stepped.
    """
    total_loss, weight_total = 0.0, 0.0
    sums: dict[str, float] = {}
    for batch, extras in microbatches:
        batch = batch_to_device(batch, device)
        extras = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in extras.items()}
        logprobs, entropy = forward(batch)
        loss, metrics = loss_fn(logprobs, entropy, batch, extras)
        scale = float(extras.get("loss_scale", 1.0))
        if not torch.isfinite(loss.detach()):
            discard_gradients()
            raise NonFiniteError(f"the loss is {loss.item()} (not finite)")
        (loss * scale).backward()
        total_loss += float(loss.detach()) * scale
        weight = float(batch.completion_mask.sum())
        weight_total += weight
        for key, value in metrics.items():
            v = float(value.detach()) if isinstance(value, torch.Tensor) else float(value)
            if math.isfinite(v):
                sums[key] = sums.get(key, 0.0) + v * weight
    return total_loss, {k: v / max(weight_total, 1.0) for k, v in sums.items()}
