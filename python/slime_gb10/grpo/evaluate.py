"""Evaluation on a held-out split: pass@1 with greedy decoding and pass@k with sampling.

pass@k uses the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models
Trained on Code", eq. 1): with ``n`` samples of which ``c`` pass,
``pass@k = 1 - C(n - c, k) / C(n, k)``, averaged over prompts. Here ``n = k`` samples per
prompt, for which it reduces to "at least one of the k passed".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from slime_gb10.grpo.interfaces import RolloutEngine, SamplingParams


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one prompt with ``n`` samples, ``c`` correct (Chen et al. 2021, eq. 1)."""
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def evaluate(
    engine: RolloutEngine,
    prompt_ids: Sequence[Sequence[int]],
    ground_truths: Sequence[str],
    reward_fn: Callable[[str, str], float],
    *,
    k: int = 4,
    temperature: float = 1.0,
    max_new_tokens: int = 256,
    pass_threshold: float = 1.0,
    seed: int = 0,
    stop: Sequence[str] = (),
    opens_think: Sequence[bool] | None = None,
) -> dict[str, float]:
    """``{"pass@1": ..., f"pass@{k}": ..., "reward_mean": ..., "response_len_mean": ...}``.

    pass@1 is greedy (one completion per prompt); pass@k samples ``k`` completions per prompt at
    ``temperature``. A completion passes when its reward is at least ``pass_threshold``.
    ``opens_think[i]``: prompt ``i`` ends in an open ``<think>`` (``rewards.as_scored``).
    """
    from slime_gb10.grpo.rewards import as_scored, safe_rewards

    opens_think = list(opens_think) if opens_think is not None else [False] * len(prompt_ids)

    if len(prompt_ids) != len(ground_truths):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(ground_truths)} ground truths")
    if not prompt_ids:
        raise ValueError("the evaluation set is empty")
    greedy = engine.generate(
        list(prompt_ids), SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop=tuple(stop))
    )
    greedy_texts = [as_scored(g.text, o) for g, o in zip(greedy, opens_think, strict=True)]
    greedy_rewards, _ = safe_rewards(reward_fn, greedy_texts, list(ground_truths))
    metrics = {
        "pass@1": sum(r >= pass_threshold for r in greedy_rewards) / len(greedy_rewards),
        "reward_mean": sum(greedy_rewards) / len(greedy_rewards),
        "response_len_mean": sum(len(g.completion_ids) for g in greedy) / len(greedy),
        "num_prompts": float(len(prompt_ids)),
    }
    if k > 1:
        repeated = [list(p) for p in prompt_ids for _ in range(k)]
        truths = [t for t in ground_truths for _ in range(k)]
        sampled = engine.generate(
            repeated,
            SamplingParams(
                max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, stop=tuple(stop)
            ),
        )
        sampled_texts = [as_scored(g.text, opens_think[i // k]) for i, g in enumerate(sampled)]
        rewards, _ = safe_rewards(reward_fn, sampled_texts, truths)
        scores = []
        for i in range(len(prompt_ids)):
            passed = sum(r >= pass_threshold for r in rewards[i * k : (i + 1) * k])
            scores.append(pass_at_k(k, passed, k))
        metrics[f"pass@{k}"] = sum(scores) / len(scores)
        metrics["sampled_pass_rate"] = sum(r >= pass_threshold for r in rewards) / len(rewards)
    return metrics
