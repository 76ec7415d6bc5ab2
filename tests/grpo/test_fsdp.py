"""FSDP's demand on the loop (train.sharding=fsdp, issue #40): every rank runs as many micro-batches
as the rank with the most, the extra ones weighing nothing. The sharded step itself runs under real
torchrun in test_distributed.py."""

from __future__ import annotations

import torch

from slime_gb10.grpo.backends.fsdp import pad_microbatches
from slime_gb10.grpo.batching import Sample, update_policy
from slime_gb10.grpo.config import build_config
from slime_gb10.grpo.interfaces import TrainStepResult


class FakeDist:
    """Another rank holds ``theirs`` micro-batches per minibatch; sums add ``their_count``."""

    enabled = True

    def __init__(self, theirs: list[int], their_count: float = 0.0):
        self.theirs, self.their_count = theirs, their_count

    def max(self, values):
        return [max(v, t) for v, t in zip(values, self.theirs, strict=True)]

    def sum(self, values):
        return [v + self.their_count for v in values]


class RecordingBackend:
    sharded = True

    def __init__(self):
        self.steps = []

    def train_step(self, micro, loss_fn):
        self.steps.append(micro)
        return TrainStepResult(loss=0.0, grad_norm=1.0, metrics={})


def sample(tokens: int, advantage: float = 1.0) -> Sample:
    return Sample([1, 2], list(range(3, 3 + tokens)), [-0.5] * tokens, advantage, 1.0, truncated=False)


def test_pad_microbatches_evens_out_the_counts_with_empty_ones():
    groups = [[["a"]], [["b"], ["c"]], []]
    pad_microbatches(groups, FakeDist([3, 1, 2]), lambda: None)
    assert groups == [[["a"], None, None], [["b"], ["c"]], [None, None]]


def test_a_sharded_update_pads_with_micro_batches_that_weigh_nothing():
    """Two local micro-batches (micro_batch_size 2, three samples) against another rank's four: two
    padding ones, whose completion mask is empty and loss scale 0, and the global token count is
    the real tokens' (5 here + the other rank's 7), as without padding."""
    cfg = build_config(overrides={"train.micro_batch_size": 2})
    backend = RecordingBackend()
    samples = [sample(2), sample(1), sample(2)]
    update_policy(backend, samples, cfg, FakeDist([4], their_count=7.0), pad_token_id=0)
    (micro,) = backend.steps
    assert len(micro) == 4
    real, padding = micro[:2], micro[2:]
    assert sum(float(b.completion_mask.sum()) for b, _ in real) == 5
    for batch, extras in padding:
        assert float(batch.completion_mask.sum()) == 0 and extras["loss_scale"] == 0.0
    assert all(extras["global_count"] == 12.0 for _, extras in micro)


def test_an_unsharded_update_is_not_padded():
    cfg = build_config(overrides={"train.micro_batch_size": 2})
    backend = RecordingBackend()
    backend.sharded = False
    update_policy(backend, [sample(2), sample(1), sample(2)], cfg, FakeDist([4]), pad_token_id=0)
    assert len(backend.steps[0]) == 2
    assert all("loss_scale" not in extras for _, extras in backend.steps[0])


def test_a_padding_micro_batch_adds_nothing_to_the_loss_or_its_gradient():
    """The real loss on a padding micro-batch (one masked completion token): zero, and a zero
    gradient, so the extra forward and backward FSDP needs change no weight (its loss scale of 0
    guards that once more)."""
    from slime_gb10.grpo import algo
    from slime_gb10.grpo.batching import _empty_sample, collate

    cfg = build_config()
    batch, extras = collate([_empty_sample(0)], 0)
    extras["global_count"] = 5.0
    logprobs = torch.zeros(batch.input_ids.shape, requires_grad=True)
    loss, _ = algo.build_loss(cfg.algo, cfg.rollout.max_new_tokens)(logprobs, None, batch, extras)
    loss.backward()  # unscaled: the masked token alone gives no gradient; loss_scale 0 is a second guard
    assert float(loss.detach()) == 0.0 and float(logprobs.grad.abs().sum()) == 0.0
