"""The shipped recipes load by name and say what they claim (slime's GB10 run: PR #1835's numbers)."""

from __future__ import annotations

from slime_gb10.grpo.config import build_config, recipes


def test_every_recipe_is_a_valid_config():
    assert recipes() == ["gsm8k-qwen2.5-0.5b-gb10", "gsm8k-smollm2-135m"]
    for name in recipes():
        config = build_config(name, {}, [])
        assert config.data.path == "gsm8k" and config.eval.at_end


def test_the_gb10_recipe_is_slimes_run():
    c = build_config("gsm8k-qwen2.5-0.5b-gb10", {}, [])
    assert c.model.name_or_path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert (c.rollout.prompts_per_step, c.rollout.group_size, c.train.steps) == (20, 8, 100)
    assert (c.train.lr, c.train.warmup_steps, c.algo.eps_low, c.algo.eps_high) == (1e-6, 0, 0.2, 0.28)
    assert (c.backends.rollout, c.backends.trainer) == ("sglang", "megatron")
    assert "\\boxed{}" in c.data.instruction and c.data.reward == "boxed_math"


def test_flags_override_a_recipe():
    c = build_config("gsm8k-smollm2-135m", {"train.steps": 3}, ["data.path=/data/train.jsonl"])
    assert c.train.steps == 3 and c.data.path == "/data/train.jsonl" and c.rollout.group_size == 16


def test_the_auto_reward_is_decided_in_one_place():
    from slime_gb10.grpo.config import DataConfig

    assert DataConfig().reward_spec() == "arithmetic"
    assert DataConfig(task="file", path="x.jsonl").reward_spec() == "gsm8k"
    assert DataConfig(task="file", path="x.jsonl", reward="boxed_math").reward_spec() == "boxed_math"
