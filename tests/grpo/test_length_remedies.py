"""The length remedies (issue #42): DAPO's soft overlong punishment, a fixed reward for truncated
answers, and the drift to the token cap they exist to stop.

The drift: GSM8K's reward reads the first ``#### n`` and nothing after it, so every rewarded sample
also rewards whatever follows; where writing more raises the chance that a right answer appears
somewhere, GRPO's advantages favour long completions and the policy runs to the cap (the shipped
recipe's run: truncated at the cap 0.42 -> 0.99 in 250 steps). A small case reproduces it below
with the real reward shaping and advantages (``algo.shape_rewards``, ``algo.group_advantages``) and
the exact policy gradient of a one-parameter length policy, and shows it gone with the remedies.
"""

from __future__ import annotations

import pytest
import torch

from slime_gb10.grpo import algo
from slime_gb10.grpo.config import ConfigError, build_config


def test_overlong_penalty_by_hand():
    # cap 10, buffer 4: no penalty up to 6 tokens, then -1/4 per token, -1 at the cap (DAPO eq. 13)
    lengths = torch.tensor([0, 5, 6, 7, 8, 9, 10])
    got = algo.overlong_penalty(lengths, max_new_tokens=10, buffer=4)
    assert got.tolist() == [0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0]
    assert algo.overlong_penalty(lengths, 10, 0).tolist() == [0.0] * 7
    with pytest.raises(ValueError, match="overlong buffer"):
        algo.overlong_penalty(lengths, 10, 11)


def test_shape_rewards_by_hand():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0])
    lengths = torch.tensor([3, 10, 10, 8])
    truncated = torch.tensor([False, True, True, False])
    unchanged = algo.shape_rewards(rewards, lengths, truncated, max_new_tokens=10)
    assert unchanged.tolist() == rewards.tolist()
    got = algo.shape_rewards(
        rewards,
        lengths,
        truncated,
        max_new_tokens=10,
        overlong_buffer=4,
        overlong_factor=0.5,
        truncated_reward=0.0,
    )
    # 1 | 0 (truncated) + 0.5 * -1 | 0 + 0.5 * -1 | 1 + 0.5 * -0.5
    assert got.tolist() == [1.0, -0.5, -0.5, 0.75]


def _length_policy_run(overlong_buffer: int, truncated_reward: float | None, steps: int = 150) -> dict:
    """GRPO on a length policy: at each of ``cap`` positions the completion stops with probability
    sigmoid(theta) (else it is cut at the cap, truncated). Each token is independently "the right
    answer" with probability q and the reward reads the first answer, so P(reward 1 | length L) =
    1 - (1 - q)^L: longer pays, as in the GSM8K run. The loss is REINFORCE with GRPO's group
    advantages of the shaped rewards (the clipped surrogate's gradient at ratio 1), log-probs exact."""
    gen = torch.Generator().manual_seed(0)
    cap, group, prompts, q = 32, 8, 16, 0.04
    theta = torch.tensor(-2.0, requires_grad=True)  # stop probability 0.12: mean length ~8
    opt = torch.optim.Adam([theta], lr=0.05)
    for _ in range(steps):
        p = torch.sigmoid(theta)
        stops = torch.rand(prompts * group, cap, generator=gen) < p.detach()
        stopped = stops.any(dim=1)
        lengths = torch.where(
            stopped, stops.float().argmax(dim=1) + 1, torch.full_like(stopped, cap, dtype=torch.long)
        )
        truncated = ~stopped
        written = torch.arange(cap)[None, :] < lengths[:, None]
        rewards = ((torch.rand(prompts * group, cap, generator=gen) < q) & written).any(dim=1).float()
        shaped = algo.shape_rewards(
            rewards,
            lengths,
            truncated,
            max_new_tokens=cap,
            overlong_buffer=overlong_buffer,
            truncated_reward=truncated_reward,
        )
        advantages = algo.group_advantages(shaped, group)
        logp = torch.where(truncated, cap * torch.log1p(-p), (lengths - 1) * torch.log1p(-p) + torch.log(p))
        loss = -(advantages * logp).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {"truncated": truncated.float().mean().item(), "length": lengths.float().mean().item()}


def test_the_drift_to_the_cap_is_reproduced_and_the_remedies_stop_it():
    old = _length_policy_run(overlong_buffer=0, truncated_reward=None)
    assert old["truncated"] > 0.8 and old["length"] > 30  # from ~8 tokens and 2% truncated at the start
    new = _length_policy_run(overlong_buffer=8, truncated_reward=0.0)
    assert new["truncated"] < 0.1 and new["length"] < 32 - 8
    # each remedy alone already holds the policy well below the cap
    for buffer, truncated_reward in ((8, None), (0, 0.0)):
        alone = _length_policy_run(overlong_buffer=buffer, truncated_reward=truncated_reward)
        assert alone["truncated"] < 0.25, (buffer, truncated_reward, alone)


def test_the_buffer_must_fit_the_generation_budget():
    with pytest.raises(ConfigError, match=r"overlong_buffer=64 is longer than rollout\.max_new_tokens=32"):
        build_config(overrides={"algo.overlong_buffer": 64, "rollout.max_new_tokens": 32})
    with pytest.raises(ConfigError, match="is not a regular expression"):
        build_config(overrides={"rollout.stop_regex": ["(("]})
    with pytest.raises(ConfigError, match="matches the empty text"):
        build_config(overrides={"rollout.stop_regex": ["\\n?"]})
