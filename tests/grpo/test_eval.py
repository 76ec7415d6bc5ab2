"""pass@k (hand-computed) and ``evaluate`` on a scripted engine."""

from __future__ import annotations

import math

import pytest

from slime_gb10.grpo.evaluate import evaluate
from slime_gb10.grpo.interfaces import Generation, RolloutEngine
from slime_gb10.grpo.rewards import gsm8k_reward
from slime_gb10.grpo.stats import pass_at_k


def test_pass_at_k_hand_computed():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 4, 4) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - math.comb(7, 4) / math.comb(10, 4))
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


class ScriptedEngine(RolloutEngine):
    """Answers from a script (an engine's outputs are the input of evaluate; the model is not under test)."""

    def __init__(self, greedy: dict, sampled: dict):
        self.greedy, self.sampled, self.calls = greedy, sampled, []

    def generate(self, prompts, params):
        self.calls.append(params)
        table = self.greedy if params.greedy else self.sampled
        out, seen = [], {}
        for p in prompts:
            key = tuple(p)
            i = seen.get(key, 0)
            seen[key] = i + 1
            text = table[key][i] if isinstance(table[key], list) else table[key]
            out.append(Generation(list(p), [1, 2], [-0.1, -0.2], text, "stop"))
        return out

    def update_weights(self, stream):
        raise NotImplementedError


def test_evaluate_pass1_greedy_and_pass_at_k():
    engine = ScriptedEngine(
        greedy={(1,): "#### 7", (2,): "#### 5"},
        sampled={
            (1,): ["#### 7", "#### 1", "#### 2", "#### 3"],
            (2,): ["#### 0", "#### 0", "#### 9", "#### 0"],
        },
    )
    metrics = evaluate(engine, [[1], [2]], ["7", "9"], gsm8k_reward, k=4, max_new_tokens=8).metrics
    assert metrics["pass@1"] == 0.5  # greedy: first right, second wrong
    assert metrics["pass@4"] == 1.0  # each prompt has one right sample among 4
    assert metrics["sampled_pass_rate"] == 2 / 8
    assert engine.calls[0].greedy and not engine.calls[1].greedy


def test_evaluate_rejects_empty_and_mismatched():
    engine = ScriptedEngine({}, {})
    with pytest.raises(ValueError, match="empty"):
        evaluate(engine, [], [], gsm8k_reward)
    with pytest.raises(ValueError, match="ground truths"):
        evaluate(engine, [[1]], [], gsm8k_reward)


def test_evaluate_reports_interval_format_lengths_and_every_question():
    """Four questions, scripted: right, wrong but formatted, unformatted and right by its last
    number (the gsm8k reward's fallback), cut at the limit. Batched in twos."""
    engine = ScriptedEngine(
        greedy={(1,): "#### 7", (2,): "#### 4", (3,): "it is 9", (4,): "\\boxed{2"},
        sampled={},
    )
    result = evaluate(
        engine,
        [[1], [2], [3], [4]],
        ["7", "5", "9", "2"],
        gsm8k_reward,
        k=1,
        ids=["a", "b", "c", "d"],
        batch_size=2,
    )
    m = result.metrics
    assert len(engine.calls) == 2  # two batches of two
    assert m["pass@1"] == 0.75 and m["num_prompts"] == 4
    # Wilson 95% for 3/4 (hand-computed: centre (0.75 + z^2/8)/(1 + z^2/4), z = 1.95996)
    assert m["pass@1_ci_low"] == pytest.approx(0.3006418, abs=1e-6)
    assert m["pass@1_ci_high"] == pytest.approx(0.9544127, abs=1e-6)
    assert m["format_rate"] == 0.5  # "#### 7", "#### 4"; "it is 9" and an unclosed box are not
    assert m["response_len_mean"] == 2 and m["truncated_rate"] == 0
    assert [q["id"] for q in result.questions] == ["a", "b", "c", "d"]
    assert [q["correct"] for q in result.questions] == [True, False, True, True]
    assert [q["answer"] for q in result.questions] == ["7", "4", None, None]
