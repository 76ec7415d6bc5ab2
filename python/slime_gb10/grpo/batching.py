"""A step's completions as training batches: :class:`Sample`, right-padded :func:`collate`,
length-sorted microbatches (:func:`split_microbatches`), and the update that trains on them
(:func:`update_policy`: minibatches, epochs, the global token count under torchrun)."""

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


def _empty_sample(pad_token_id: int) -> Sample:
    """What a padding micro-batch holds (:func:`~slime_gb10.grpo.backends.fsdp.pad_microbatches`):
    a prompt token and one completion token in the loss's mask, so that every parameter, the LM
    head's too, gets a gradient (zero: the loss is scaled by 0) and FSDP reduces the same tensors
    on every rank; its metrics weigh nothing and its tokens are not counted."""
    return Sample([pad_token_id], [pad_token_id], [0.0], 0.0, 0.0, truncated=False)


def has_reference_model(backend) -> bool:
    """True when the backend overrides ``PolicyBackend.reference_logprobs`` (keeps a frozen reference)."""
    from slime_gb10.grpo.interfaces import PolicyBackend

    method = getattr(type(backend), "reference_logprobs", None)
    return method is not None and method is not PolicyBackend.reference_logprobs


def update_policy(
    backend, samples: list[Sample], cfg, dist, pad_token_id: int
) -> tuple[dict, int, float, float]:
    """All optimizer steps of one GRPO step (``train.epochs`` x ``train.minibatches``, each cut into
    microbatches); returns (mean metrics, tokens processed, mean grad norm, mean loss).

    With one epoch and one minibatch the "old" policy of the PPO ratio is the current one (no extra
    forward); otherwise its logprobs are computed once before the first update. Under torchrun
    (``dist``) every rank takes the same number of optimizer steps, and each loss is divided by the
    token (or sequence) count of the whole global minibatch."""
    from slime_gb10.grpo import algo

    # Megatron tensor parallelism: the ranks of a group train on all of the group's samples together,
    # so each sample is counted once per rank of its group; the group's first rank reports it
    samples = (
        backend.tensor_parallel_samples(samples) if hasattr(backend, "tensor_parallel_samples") else samples
    )
    tp = getattr(backend, "tensor_parallel_size", 1)
    on_policy = cfg.train.epochs == 1 and cfg.train.minibatches == 1
    need_ref = cfg.algo.beta > 0 or cfg.algo.ref_kl_metric
    if need_ref and not has_reference_model(backend):
        if cfg.algo.beta > 0:
            raise RuntimeError("algo.beta > 0 needs a backend with reference_logprobs()")
        need_ref = False
    # several ranks: the same number of optimizer steps everywhere, even with few local samples
    count = cfg.train.minibatches if dist.enabled else min(cfg.train.minibatches, len(samples))
    # Deterministic split into minibatches (every count-th sample), each cut into microbatches.
    groups = [split_microbatches(samples[i::count], cfg.train.micro_batch_size) for i in range(count)]
    if getattr(backend, "sharded", False):  # FSDP: the same number of forwards on every rank
        from slime_gb10.grpo.backends.fsdp import pad_microbatches

        pad_microbatches(groups, dist, lambda: None)
    prepared, counts = [], []
    for mb_groups in groups:
        micro, count_here = [], 0.0
        for group in mb_groups:
            batch, extras = collate(group or [_empty_sample(pad_token_id)], pad_token_id)
            if group is None:  # a padding micro-batch: no weight in the loss or the metrics
                extras["loss_scale"], extras["metric_weight"] = 0.0, 0.0
            elif cfg.algo.loss_agg == "token-mean":
                count_here += float(batch.completion_mask.sum())
            else:
                count_here += float(batch.input_ids.shape[0])
            if not on_policy:
                extras["old_logprobs"], _ = backend.logprobs(batch)
            if need_ref:
                extras["ref_logprobs"] = backend.reference_logprobs(batch)
            micro.append((batch, extras))
        counts.append(count_here)
        prepared.append(micro)
    for micro, total in zip(prepared, dist.sum(counts), strict=True):
        for _, extras in micro:
            extras["global_count"] = max(total / tp, 1.0)  # integers: exact

    loss_fn = algo.build_loss(cfg.algo, cfg.rollout.max_new_tokens)
    tokens, sums, grad_norms, losses = 0, {}, [], []
    for _ in range(cfg.train.epochs):
        for micro in prepared:
            result = backend.train_step(micro, loss_fn)
            grad_norms.append(result.grad_norm)
            losses.append(result.loss)
            for key, value in result.metrics.items():
                sums[key] = sums.get(key, 0.0) + value
            tokens += sum(int(b.attention_mask.sum()) for b, e in micro if e.get("metric_weight", 1.0))
    steps = len(grad_norms)
    if getattr(backend, "tensor_parallel_rank", 0):  # its group's first rank reports the group's share
        return {}, 0, sum(grad_norms) / steps, 0.0
    return {k: v / steps for k, v in sums.items()}, tokens, sum(grad_norms) / steps, sum(losses) / steps
