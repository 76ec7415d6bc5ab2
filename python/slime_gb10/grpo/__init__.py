"""GRPO post-training: algorithm, rewards, data, rollout engines, policy backends, weight sync, trainer."""
