"""What every policy backend does the same way: moving a batch, and one gradient-accumulation pass.

Both backends (PyTorch and Megatron-core) run the same microbatch loop: forward to
logprobs/entropy, the trainer's loss and its backward, token-weighted metrics, and a finiteness
check of the summed loss before anything is stepped (a NaN must never reach the optimizer). Only the forward and "forget the gradients"
differ, so those are the two callables this module takes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from slime_gb10.grpo.interfaces import TokenBatch
from slime_gb10.utils.errors import UserError


class NonFiniteError(UserError, FloatingPointError):
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
    raise_nonfinite: bool = True,
) -> tuple[float, dict[str, float]]:
    """Backpropagate ``loss_fn`` over every microbatch; return (summed loss, token-weighted metrics).

    ``loss_fn(logprobs, entropy, batch, extras) -> (loss, metrics)`` returns microbatch losses that
    already sum to the minibatch loss (``interfaces.PolicyBackend.train_step``); each is multiplied by
    ``extras["loss_scale"]`` (default 1), and its metrics weighted by ``extras["metric_weight"]``
    (default 1; 0 for FSDP's padding micro-batches). A metric that is not finite in a microbatch (``kl`` without
    a reference model) counts as absent there; one absent everywhere is left out.

    Losses and metrics stay on the device until the pass ends: one host round trip per pass, not one
    per microbatch before its backward (which left the GPU idle while the host caught up, issue #27).
    A non-finite loss then calls ``discard_gradients`` and raises :class:`NonFiniteError`, so its
    gradients never reach the optimizer, as the check before each backward ensured; with
    ``raise_nonfinite=False`` (ranks that meet in collectives after the pass) it returns the loss
    and no metrics, and the caller raises once every rank can tell.
    """
    losses, weights = [], []
    on_device: dict[str, list[torch.Tensor]] = {}  # metric -> [v * weight, finite] per microbatch
    on_host: dict[str, list[tuple[float, int]]] = {}  # python numbers: (v, microbatch index)
    for batch, extras in microbatches:
        batch = batch_to_device(batch, device)
        extras = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in extras.items()}
        logprobs, entropy = forward(batch)
        loss, metrics = loss_fn(logprobs, entropy, batch, extras)
        loss = loss * float(extras.get("loss_scale", 1.0))
        loss.backward()
        losses.append(loss.detach().float().reshape(()))
        weight = batch.completion_mask.sum().float() * float(extras.get("metric_weight", 1.0))
        weights.append(weight)
        for key, value in metrics.items():
            if isinstance(value, torch.Tensor):
                v = value.detach().float().reshape(())
                finite = torch.isfinite(v)
                on_device.setdefault(key, []).append(
                    torch.stack([torch.where(finite, v * weight, 0.0), finite.float()])
                )
            else:
                on_host.setdefault(key, []).append((float(value), len(weights) - 1))
    if not losses:
        return 0.0, {}
    keys = list(on_device)
    parts = [torch.stack(losses).sum()[None], torch.stack(weights)]
    parts += [torch.stack(on_device[key]).sum(0) for key in keys]
    values = torch.cat(parts).tolist()  # the pass's one host round trip
    total_loss, per_batch_weight = values[0], values[1 : 1 + len(weights)]
    weight_total = max(sum(per_batch_weight), 1.0)
    if not math.isfinite(total_loss):
        discard_gradients()
        if not raise_nonfinite:
            return total_loss, {}
        raise NonFiniteError(f"the loss is {total_loss} (not finite)")
    if not any(per_batch_weight):  # no token of the pass counts (FSDP's padding alone): no metrics
        return total_loss, {}
    sums: dict[str, float] = {}
    offset = 1 + len(weights)
    for index, key in enumerate(keys):
        summed, finite_count = values[offset + 2 * index], values[offset + 2 * index + 1]
        if finite_count > 0:
            sums[key] = summed
    for key, pairs in on_host.items():
        finite = [v * per_batch_weight[index] for v, index in pairs if math.isfinite(v)]
        if finite:
            sums[key] = sums.get(key, 0.0) + sum(finite)
    return total_loss, {k: v / weight_total for k, v in sums.items()}
