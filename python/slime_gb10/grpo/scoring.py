"""A step's completions scored: rewards, the length remedies, group advantages and the samples to
train on (step 2 of the loop in :mod:`slime_gb10.grpo.trainer`). The math is :mod:`algo`'s; this
module applies it to one batch of generations under the run's settings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from slime_gb10.grpo import algo
from slime_gb10.grpo.batching import Sample
from slime_gb10.grpo.interfaces import Generation
from slime_gb10.grpo.rewards import score_completions


@dataclass
class ScoredBatch:
    rewards: list[float]  # the task's reward of each completion
    reward_errors: int  # completions whose reward function raised (scored 0)
    shaped: torch.Tensor  # what the advantages saw (the length remedies applied)
    zero_variance: torch.Tensor  # per group: every answer scored alike
    samples: list[Sample]  # every completion, with its advantage
    trainable: list[Sample]  # the ones the update trains on


def score_generations(
    generations: Sequence[Generation], truths: Sequence[str], opens_think: Sequence[bool], reward_fn, cfg: Any
) -> ScoredBatch:
    """Rewards, shaped rewards, group advantages and samples of one step's ``generations`` (groups of
    ``cfg.rollout.group_size`` consecutive completions of one prompt)."""
    G = cfg.rollout.group_size
    _, rewards, reward_errors = score_completions(
        reward_fn, [g.text for g in generations], opens_think, truths
    )
    # the length remedies (algo.truncated_reward, algo.overlong_buffer): what advantages see
    shaping = {
        "lengths": torch.tensor([len(g.completion_ids) for g in generations]),
        "truncated": torch.tensor([g.truncated for g in generations]),
        "max_new_tokens": cfg.rollout.max_new_tokens,
        "truncated_reward": cfg.algo.truncated_reward,
    }
    task_t = torch.tensor(rewards, dtype=torch.float32)
    shaped = algo.shape_rewards(
        task_t, **shaping, overlong_buffer=cfg.algo.overlong_buffer, overlong_factor=cfg.algo.overlong_penalty
    )
    advantages = algo.group_advantages(shaped, G, scale_std=cfg.algo.scale_rewards)
    # A group without signal is one whose answers score alike (DAPO's dynamic sampling filters on
    # accuracy, as verl does): the overlong penalty alone must not keep an all-right group whose
    # one long answer would then get the advantage of a wrong one.
    zero_var = algo.zero_variance_groups(algo.shape_rewards(task_t, **shaping), G)
    samples = [
        Sample(
            prompt_ids=list(g.prompt_ids),
            completion_ids=list(g.completion_ids),
            rollout_logprobs=list(g.completion_logprobs),
            advantage=float(advantages[i]),
            reward=rewards[i],
            truncated=g.truncated,
            # DAPO's overlong filtering (Yu et al. 2025, sec. 3.4): a completion cut at the
            # budget has no final answer; its reward would punish length, not reasoning
            train=not (cfg.algo.mask_truncated and g.truncated),
        )
        for i, g in enumerate(generations)
    ]
    # Groups where every sample got the same reward have zero advantage: no gradient, skip them.
    skip = cfg.algo.skip_zero_variance_groups and cfg.algo.beta == 0 and cfg.algo.entropy_coef == 0
    trainable = [
        s
        for i, s in enumerate(samples)
        if not (skip and bool(zero_var[i // G])) and s.train and s.completion_ids
    ]
    return ScoredBatch(rewards, reward_errors, shaped, zero_var, samples, trainable)
