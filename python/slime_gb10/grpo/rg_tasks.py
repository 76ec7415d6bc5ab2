"""Tasks from ``reasoning-gym`` (procedural reasoning tasks with their own verifiers, used by RL
papers): ``--data rg:<task>[,<task>…]``.

- Held out: for each task, ``data.eval_size / len(tasks)`` items generated with a FIXED seed
  (:data:`HELD_OUT_SEED` plus the task's position), the same whatever the run's seed, so every run
  and every ``slime-gb10 eval`` of the same spec scores the same questions.
- Training: ``data.limit`` items per task (default :data:`DEFAULT_TRAIN_SIZE`) generated with the
  run's seed, without any question of the held-out set (a task with a small question space, such
  as ``coin_flip``, repeats questions across seeds); several tasks are interleaved round-robin.
- Reward ``rg``: the answer is what follows the first ``####`` (to the end of that line), else the
  last ``<answer>…</answer>``, else (numeric references only) the last number of the completion;
  it is scored by the task's own ``score_answer`` (answers of any type:
  numbers, words, lists, fractions), from the task name, reference answer and metadata that each
  example's ground truth carries as JSON.

The package is an extra (``pip install 'slime-gb10[rg]'``): reasoning-gym 0.1.25 pins eleven
dependencies of its own (puzzle generators), which nothing else here needs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import cache
from typing import Any

from slime_gb10.grpo.data import DatasetError, PromptExample

PREFIX = "rg:"
# The held-out set's seed: fixed, so the held-out questions never depend on the run's seed.
HELD_OUT_SEED = 1_000_003
DEFAULT_TRAIN_SIZE = 10_000


def is_rg_spec(spec: str | None) -> bool:
    return bool(spec) and spec.startswith(PREFIX)


def _reasoning_gym():
    try:
        import reasoning_gym
    except ImportError:
        raise DatasetError(
            "--data rg:... needs the reasoning-gym package: pip install 'slime-gb10[rg]'"
        ) from None
    return reasoning_gym


def parse_spec(spec: str) -> list[str]:
    """``"rg:gcd,lcm"`` -> ``["gcd", "lcm"]``, each a reasoning-gym task (else a one-line error)."""
    names = [n.strip() for n in spec[len(PREFIX) :].split(",")]
    if not spec.startswith(PREFIX) or not all(names):
        raise DatasetError(f"dataset spec {spec!r}: write rg:<task>[,<task>...], e.g. rg:gcd,lcm")
    if len(set(names)) != len(names):
        raise DatasetError(f"dataset spec {spec!r} names a task twice")
    known = _reasoning_gym().factory.DATASETS
    unknown = [n for n in names if n not in known]
    if unknown:
        raise DatasetError(
            f"reasoning-gym has no task {', '.join(map(repr, unknown))}; its tasks: {', '.join(sorted(known))}"
        )
    return names


def _example(task: str, entry: dict[str, Any], split: str, index: int) -> PromptExample:
    truth = json.dumps(
        {"rg": task, "answer": entry["answer"], "metadata": entry.get("metadata", {})},
        sort_keys=True,
        default=str,
    )
    return PromptExample(prompt=entry["question"], ground_truth=truth, id=f"rg-{task}-{split}-{index}")


def _generate(task: str, size: int, seed: int) -> list[dict[str, Any]]:
    return list(_reasoning_gym().create_dataset(task, size=size, seed=seed))


def load_splits(
    spec: str, *, eval_size: int, seed: int, train_size: int | None = None
) -> tuple[list[PromptExample], list[PromptExample]]:
    """``(training examples, held-out examples)`` of an ``rg:`` spec (see the module's doc)."""
    tasks = parse_spec(spec)
    per_task_eval, extra = divmod(eval_size, len(tasks))
    train_size = DEFAULT_TRAIN_SIZE if train_size is None else train_size
    held_out: list[PromptExample] = []
    per_task_train: list[list[PromptExample]] = []
    for position, task in enumerate(tasks):
        n_eval = per_task_eval + (1 if position < extra else 0)
        eval_entries = _generate(task, n_eval, HELD_OUT_SEED + position) if n_eval else []
        held_out += [_example(task, e, "test", i) for i, e in enumerate(eval_entries)]
        seen = {e["question"] for e in eval_entries}
        train = [_example(task, e, "train", i) for i, e in enumerate(_generate(task, train_size, seed))]
        kept = [ex for ex in train if ex.prompt not in seen]
        if not kept:
            raise DatasetError(
                f"reasoning-gym task {task!r}: every training question is also a held-out one; "
                "lower data.eval_size"
            )
        per_task_train.append(kept)
    # round-robin: each task's share of every batch stays even
    mixed = [
        task_examples[i]
        for i in range(max(map(len, per_task_train)))
        for task_examples in per_task_train
        if i < len(task_examples)
    ]
    return mixed, held_out


# --- the reward ----------------------------------------------------------------------------------

_HASHES = re.compile(r"####[ \t]*([^\n]*)")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def extract_answer(completion: str, reference: str | None = None) -> str | None:
    """The final answer: the rest of the line after the first ``####``, else the last ``<answer>``;
    else, where the ``reference`` answer is a number, the last number of the completion (what the
    gsm8k reward does: a small model often states "... is 3." without the marker)."""
    match = _HASHES.search(completion)
    if match is not None and match.group(1).strip():
        return match.group(1).strip()
    tags = _ANSWER_TAG.findall(completion)
    if tags:
        return tags[-1].strip()
    if reference is not None and _NUMBER.fullmatch(reference.strip()):
        numbers = _NUMBER.findall(completion)
        return numbers[-1] if numbers else None
    return None


@cache
def _scorer(task: str):
    return _reasoning_gym().get_score_answer_fn(task)


def rg_reward(completion: str, ground_truth: str) -> float:
    """The task's own ``score_answer`` of the completion's final answer (0.0 without one)."""
    truth = json.loads(ground_truth)
    answer = extract_answer(completion, str(truth["answer"]))
    if answer is None:
        return 0.0
    entry = {"answer": truth["answer"], "metadata": truth["metadata"]}
    return float(_scorer(truth["rg"])(answer, entry))


def tasks_of(examples: Sequence[PromptExample]) -> list[str]:
    """The reasoning-gym task of each example (from its ground truth)."""
    return [json.loads(e.ground_truth)["rg"] for e in examples]
