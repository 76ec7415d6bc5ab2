"""Evaluation on a held-out split: pass@1 with greedy decoding and pass@k with sampling.

Greedy pass@1 comes with Wilson's 95% interval (:mod:`slime_gb10.grpo.stats`), the format
compliance (share of completions with a marked final answer: ``rewards.formatted_answer``), the
mean response length and the share cut at the token limit; every question's outcome is kept
(:class:`EvalResult`), so two evaluations of the same questions can be compared pairwise.

pass@k is the unbiased estimator of Chen et al. 2021 (:func:`slime_gb10.grpo.stats.pass_at_k`),
averaged over prompts. Here ``n = k`` samples per prompt, for which it reduces to "at least one of
the k passed".
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from slime_gb10.grpo.interfaces import RolloutEngine, SamplingParams, step_seed

log = logging.getLogger(__name__)


@dataclass
class EvalResult:
    """``metrics``: the summary numbers; ``questions``: one record per question (id, correct, reward,
    the marked final answer or None, response length in tokens, truncated)."""

    metrics: dict[str, float]
    questions: list[dict] = field(default_factory=list)


def _held_out_bound(data) -> int | None:
    """How many held-out prompts there are, where the config alone says (arithmetic, rg:, a split file)."""
    if data.eval_path:
        return None
    if data.task == "arithmetic" or (data.path or "").startswith("rg:"):
        return data.eval_size
    from slime_gb10.grpo.data import NAMED_DATASETS

    return None if data.path in NAMED_DATASETS or (data.path or "").startswith("hf:") else data.eval_size


def eval_rows(config) -> list[int]:
    """What :func:`evaluate` decodes at once (for the memory plan): the rows of each ``generate`` call
    on rank 0, greedy (the prompts of one ``eval.batch_size`` batch) and, with ``eval.k > 1``, sampled
    (``k`` times as many); [] without eval."""
    ev = config.eval
    if not ev.every and not ev.at_end:
        return []
    held = _held_out_bound(config.data)
    if held == 0:
        return []
    counts = [c for c in (held, None if ev.at_end else ev.num_prompts) if c]
    prompts = min(counts) if counts else None
    batch = ev.batch_size if not prompts else min(prompts, ev.batch_size or prompts)
    if not batch:  # unknown held-out size, all at once: guess the training batch
        batch = config.rollout.prompts_per_step
    return [batch] + ([batch * ev.k] if ev.k > 1 else [])


def _generate(
    engine: RolloutEngine, prompts: list[list[int]], params: SamplingParams, batch_size: int | None
):
    if not batch_size or len(prompts) <= batch_size:
        return engine.generate(prompts, params)
    out = []
    for start in range(0, len(prompts), batch_size):
        out.extend(engine.generate(prompts[start : start + batch_size], params))
    return out


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
    stop_regex: Sequence[str] = (),
    opens_think: Sequence[bool] | None = None,
    ids: Sequence[str] | None = None,
    batch_size: int | None = None,
) -> EvalResult:
    """Greedy pass@1 (with its Wilson interval, format compliance, lengths) and sampled pass@k.

    Metrics: ``pass@1``, ``pass@1_ci_low`` / ``pass@1_ci_high`` (95%), ``format_rate``,
    ``reward_mean``, ``response_len_mean``, ``truncated_rate``, ``num_prompts``; with ``k > 1`` also
    ``pass@{k}`` (``k`` samples per prompt at ``temperature``) and ``sampled_pass_rate``. A
    completion passes when its reward is at least ``pass_threshold``. ``opens_think[i]``: prompt
    ``i`` ends in an open ``<think>`` (``rewards.as_scored``). ``batch_size``: prompts generated
    together (None: all at once).
    """
    from slime_gb10.grpo.rewards import formatted_answer, score_completions
    from slime_gb10.grpo.stats import pass_at_k, wilson_interval

    opens_think = list(opens_think) if opens_think is not None else [False] * len(prompt_ids)
    ids = list(ids) if ids is not None else [str(i) for i in range(len(prompt_ids))]

    if len(prompt_ids) != len(ground_truths):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(ground_truths)} ground truths")
    if not prompt_ids:
        raise ValueError("the evaluation set is empty")
    greedy = _generate(
        engine,
        [list(p) for p in prompt_ids],
        SamplingParams(
            max_new_tokens=max_new_tokens, temperature=0.0, stop=tuple(stop), stop_regex=tuple(stop_regex)
        ),
        batch_size,
    )
    sampled = []
    if k > 1:  # k samples of each prompt, after the greedy answers; both scored below
        sampled = _generate(
            engine,
            [list(p) for p in prompt_ids for _ in range(k)],
            SamplingParams(
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                seed=seed,
                stop=tuple(stop),
                stop_regex=tuple(stop_regex),
            ),
            batch_size * k if batch_size else None,
        )
    greedy_texts, greedy_rewards, _ = score_completions(
        reward_fn, [g.text for g in greedy], opens_think, ground_truths
    )
    _, rewards, _ = score_completions(
        reward_fn,
        [g.text for g in sampled],
        [o for o in opens_think for _ in range(k)] if sampled else [],
        [t for t in ground_truths for _ in range(k)] if sampled else [],
    )
    questions = []
    for i, (g, text, reward) in enumerate(zip(greedy, greedy_texts, greedy_rewards, strict=True)):
        length = len(g.completion_ids)
        questions.append(
            {
                "id": ids[i],
                "correct": reward >= pass_threshold,
                "reward": reward,
                "answer": formatted_answer(text),
                "ground_truth": str(ground_truths[i]),
                "length": length,
                "truncated": g.truncated,
            }
        )
    n = len(questions)
    passed = sum(q["correct"] for q in questions)
    low, high = wilson_interval(passed, n)
    metrics = {
        "pass@1": passed / n,
        "pass@1_ci_low": low,
        "pass@1_ci_high": high,
        "format_rate": sum(q["answer"] is not None for q in questions) / n,
        "reward_mean": sum(greedy_rewards) / n,
        "response_len_mean": sum(q["length"] for q in questions) / n,
        "truncated_rate": sum(q["truncated"] for q in questions) / n,
        "num_prompts": float(n),
    }
    if sampled:
        scores = []
        for i in range(len(prompt_ids)):
            correct = sum(r >= pass_threshold for r in rewards[i * k : (i + 1) * k])
            scores.append(pass_at_k(k, correct, k))
            questions[i][f"correct_of_{k}"] = correct
        metrics[f"pass@{k}"] = sum(scores) / len(scores)
        metrics["sampled_pass_rate"] = sum(r >= pass_threshold for r in rewards) / len(rewards)
    return EvalResult(metrics, questions)


def evaluate_examples(
    engine: RolloutEngine, prompts, examples: Sequence, reward_fn, config, *, seed: int
) -> EvalResult:
    """:func:`evaluate` on held-out ``examples`` with a run's settings (``config.eval``, ``.data``,
    ``.rollout``); ``prompts`` is the run's ``prompts.PromptEncoder``. Training and ``slime-gb10 eval``
    both evaluate through here. Each question's record carries a digest of its text
    (:func:`~slime_gb10.grpo.stats.question_digest`), so ``compare`` can tell two sets of questions apart that share ids."""
    result = evaluate(
        engine,
        [prompts.ids(e) for e in examples],
        [str(e.ground_truth) for e in examples],
        reward_fn,
        opens_think=[prompts.opens_think(e) for e in examples],
        ids=[e.id for e in examples],
        k=config.eval.k,
        temperature=config.eval.temperature,
        max_new_tokens=config.eval.max_new_tokens or config.rollout.max_new_tokens,
        pass_threshold=config.data.pass_threshold,
        seed=seed,
        stop=config.rollout.stop,
        stop_regex=config.rollout.stop_regex,
        batch_size=config.eval.batch_size,
    )
    from slime_gb10.grpo.stats import question_digest

    for record, example in zip(result.questions, examples, strict=True):
        record["question_digest"] = question_digest(example.prompt)
    return result


# ------------------------------------------------------------------------- during a training run
def eval_run(run, num_prompts: int | None, prefix: str = "eval") -> tuple[dict, EvalResult]:
    """The policy of a training run (``GRPOTrainer``: its engine, prompts, held-out examples,
    reward and step) on its first ``num_prompts`` held-out examples (None: all), between steps:
    ``({"<prefix>/<metric>": value, "<prefix>_time_s": seconds}, result)``."""
    cfg = run.config
    start = time.perf_counter()
    run.engine.wake()
    try:
        result = evaluate_examples(
            run.engine,
            run.prompts,
            run.eval_examples[:num_prompts],
            run.reward_fn,
            cfg,
            seed=step_seed(cfg.train.seed + 1, run.step),
        )
    finally:
        run.engine.sleep()
    row = {f"{prefix}/{key}": value for key, value in result.metrics.items()}
    row[f"{prefix}_time_s"] = time.perf_counter() - start
    return row, result


def final_eval(run) -> None:
    """``eval.at_end``: the whole held-out split after the last step -> a metrics row and
    ``eval_final.json`` (every question's outcome, for ``slime-gb10 compare``)."""
    from slime_gb10.utils.atomic import atomic_write_text

    row, result = eval_run(run, None, "final_eval")
    run.logger.log_step({"step": run.step, **row})
    document = {"step": run.step, "metrics": result.metrics, "questions": result.questions}
    atomic_write_text(Path(run.run_dir) / "eval_final.json", json.dumps(document, indent=1) + "\n")
    m = result.metrics
    log.info(
        "final eval on all %d held-out prompts: pass@1 %.4f [%.4f, %.4f], format %.3f (%.0f s)",
        len(result.questions), m["pass@1"], m["pass@1_ci_low"], m["pass@1_ci_high"], m["format_rate"],
        row["final_eval_time_s"],
    )  # fmt: skip
