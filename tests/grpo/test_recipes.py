"""The shipped recipes load by name and say what they claim (slime's GB10 run: PR #1835's numbers)."""

from __future__ import annotations

import pytest

from slime_gb10.grpo.config import build_config, recipes


def test_every_recipe_is_a_valid_config():
    assert recipes() == [
        "gsm8k-qwen2.5-0.5b-gb10",
        "gsm8k-smollm2-135m",
        "rg-arithmetic-mix-smollm2-135m",
        "rg-nvfp4-smollm2-135m",
        "rg-smollm2-135m",
    ]
    for name in recipes():
        config = build_config(name, {}, [])
        assert config.data.path == "gsm8k" or config.data.path.startswith("rg:")
        assert config.eval.at_end


def test_the_mixed_rg_recipe_is_the_single_task_recipe_on_three_tasks_500_held_out_each():
    pytest.importorskip(
        "reasoning_gym", reason="reasoning-gym is not installed (pip install 'slime-gb10[rg]')"
    )
    from slime_gb10.grpo import rg_tasks

    mix = build_config("rg-arithmetic-mix-smollm2-135m", {}, [])
    single = build_config("rg-smollm2-135m", {"data.path": mix.data.path}, [])
    tasks = rg_tasks.parse_spec(mix.data.path)
    assert [t.split(":")[0] for t in tasks] == ["chain_sum", "basic_arithmetic", "decimal_chain_sum"]
    assert mix.data.eval_size == 1500 == mix.eval.num_prompts == 500 * len(tasks)
    differs = {"data": {"eval_size"}, "eval": {"num_prompts"}, "output": {"dir"}}
    for section, fields in mix.model_dump().items():
        for key, value in fields.items():
            if key not in differs.get(section, ()):
                assert value == single.model_dump()[section][key], f"{section}.{key}"
    _, held = rg_tasks.load_splits(mix.data.path, eval_size=mix.data.eval_size, seed=0, train_size=50)
    assert [rg_tasks.tasks_of(held).count(t) for t in tasks] == [500, 500, 500]


def test_the_nvfp4_recipe_is_the_rg_recipe_with_nvfp4_rollouts_and_qat():
    """What the three-arm experiment ran as arm C (BENCHMARKS.md): only the task, the rollout weights,
    the quantization, 500 steps, evals every 100 and the output folder differ from rg-smollm2-135m."""
    nvfp4 = build_config("rg-nvfp4-smollm2-135m", {}, [])
    single = build_config("rg-smollm2-135m", {"data.path": nvfp4.data.path}, [])
    assert (nvfp4.rollout.weights, nvfp4.train.quantization) == ("nvfp4", "nvfp4-qat")
    differs = {
        "rollout": {"weights"},
        "train": {"quantization", "steps"},
        "eval": {"every"},
        "output": {"dir"},
    }
    for section, fields in nvfp4.model_dump().items():
        for key, value in fields.items():
            if key not in differs.get(section, ()):
                assert value == single.model_dump()[section][key], f"{section}.{key}"
    assert (nvfp4.train.steps, nvfp4.eval.every) == (500, 100)


def test_the_rg_recipe_takes_any_task_and_scores_it_with_the_tasks_own_verifier():
    c = build_config("rg-smollm2-135m", {"data.path": "rg:leg_counting,lcm"}, [])
    assert c.data.reward_spec() == "rg" and c.data.eval_size == 500 == c.eval.num_prompts
    assert (c.rollout.prompts_per_step, c.rollout.group_size, c.train.steps) == (32, 8, 150)


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


def test_the_gsm8k_recipe_stops_at_the_answer_line_the_reward_reads():
    """rollout.stop_regex ends a completion with its first `#### n` line: the gsm8k reward of the cut
    text equals that of the whole text (it reads the first answer), and the tail it would have
    rewarded is gone; the overlong penalty covers the last quarter of the budget (DAPO)."""
    import re

    from slime_gb10.grpo.rewards import gsm8k_reward

    c = build_config("gsm8k-smollm2-135m", {}, [])
    assert c.algo.overlong_buffer == c.rollout.max_new_tokens // 4
    (pattern,) = c.rollout.stop_regex
    texts = [
        "3 + 4 = 7\n#### 7\nNow a harder one: 8 + 9 = 17 #### 17\n",
        "So she pays $1,234.50.\n#### $1,234.50\nExtra words to the cap",
        "#### -3 degrees\nand more",
    ]
    for text in texts:
        match = re.search(pattern, text)
        assert match is not None, text
        cut = text[: match.end()]
        assert cut.endswith("\n") and gsm8k_reward(cut, "7") == gsm8k_reward(text, "7")
        for truth in ("7", "1234.5", "-3"):
            assert gsm8k_reward(cut, truth) == gsm8k_reward(text, truth)
    assert re.search(pattern, "no final answer yet #### ") is None  # nothing to stop at
