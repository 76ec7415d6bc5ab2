"""Tasks from ``reasoning-gym`` (procedural reasoning tasks with their own verifiers, used by RL
papers): ``--data rg:<task>[,<task>…]``.

- A task may carry settings of its reasoning-gym config (its difficulty), each ``:key=value``:
  ``rg:chain_sum:max_terms=3:max_digits=2,lcm:max_value=20``. A value is an int, a float,
  ``true``/``false``, else a string; ``a|b`` is a tuple (``basic_arithmetic:operators=+|-``). The
  task's label (its name with the settings, sorted) names it in ids, per-task tables and errors;
  the settings travel in each example's ground truth, and the verifier is the configured task's.

- Held out: for each task, the first ``data.eval_size / len(tasks)`` items reasoning-gym generates
  with a FIXED seed (:data:`HELD_OUT_SEED`, whatever the run's seed and the task's place in the
  spec), so every run and every ``slime-gb10 eval`` of a task scores the same questions; several
  tasks are interleaved.
- Training: ``data.limit`` items per task (default :data:`DEFAULT_TRAIN_SIZE`) generated with the
  run's seed, without any question of the first :data:`HELD_OUT_POOL` held-out-seed items (a task
  with a small question space, such as ``string_splitting``, repeats questions across seeds; the pool also
  keeps a larger later eval clean; where the pool would leave under a tenth of the items, only the
  held-out questions themselves are kept out, with a warning); the sampler shuffles the tasks'
  items together.
- Tasks whose reference answers span several lines, or whose verifier does not accept its own
  reference once the example has passed through JSON (tuples in the metadata), are refused.
- Reward ``rg``: the answer is what follows the first ``####`` (to the end of that line), else the
  last ``<answer>…</answer>``, else (numeric references only) the last number of the completion;
  it is scored by the task's own ``score_answer`` (answers of any type:
  numbers, words, lists, fractions), from the task name, reference answer and metadata that each
  example's ground truth carries as JSON.

The package is an extra (``pip install 'slime-gb10[rg]'``): reasoning-gym 0.1.25 pins eleven
dependencies of its own (puzzle generators), which nothing else here needs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from slime_gb10.grpo.data import DatasetError, PromptExample

log = logging.getLogger("slime_gb10.grpo")

PREFIX = "rg:"
# The held-out set's seed: fixed, so the held-out questions never depend on the run's seed.
HELD_OUT_SEED = 1_000_003
# held-out-seed items per task that training never sees (the held-out set is their first ones)
HELD_OUT_POOL = 2_000
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


@dataclass(frozen=True)
class Task:
    """One task of a spec: reasoning-gym's name and the config settings given after it."""

    name: str
    config: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        """``"chain_sum"``, ``"chain_sum:max_digits=2:max_terms=3"`` (settings sorted)."""
        return ":".join([self.name, *(f"{k}={_format_value(v)}" for k, v in self.config)])

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.config)


def _parse_value(text: str) -> Any:
    if "|" in text:
        return tuple(_parse_value(part) for part in text.split("|"))
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _format_value(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return "|".join(_format_value(v) for v in value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def _parse_task(part: str, spec: str) -> Task:
    name, *settings = (s.strip() for s in part.split(":"))
    config = {}
    for setting in settings:
        key, eq, value = setting.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise DatasetError(
                f"dataset spec {spec!r}: {setting!r} is not a setting; write <task>:<key>=<value>, "
                "e.g. rg:chain_sum:max_terms=3"
            )
        if key.strip() in config:
            raise DatasetError(f"dataset spec {spec!r} sets {key.strip()!r} twice for {name!r}")
        config[key.strip()] = _parse_value(value.strip())
    return Task(name, tuple(sorted(config.items())))


def parse_tasks(spec: str) -> list[Task]:
    """``"rg:gcd,lcm:max_value=20"`` -> the tasks with their settings (else a one-line error)."""
    parts = [n.strip() for n in spec[len(PREFIX) :].split(",")]
    if not spec.startswith(PREFIX) or not all(parts) or not all(p.split(":")[0].strip() for p in parts):
        raise DatasetError(
            f"dataset spec {spec!r}: write rg:<task>[:<key>=<value>...][,<task>...], e.g. rg:gcd,lcm"
        )
    tasks = [_parse_task(part, spec) for part in parts]
    labels = [t.label for t in tasks]
    if len(set(labels)) != len(labels):
        raise DatasetError(f"dataset spec {spec!r} names a task twice")
    known = _reasoning_gym().factory.DATASETS
    unknown = [t.name for t in tasks if t.name not in known]
    if unknown:
        raise DatasetError(
            f"reasoning-gym has no task {', '.join(map(repr, unknown))}; its tasks: {', '.join(sorted(known))}"
        )
    for task in tasks:
        _dataset(task.name, _config_json(task.kwargs))  # a bad setting is refused before any work
    return tasks


def parse_spec(spec: str) -> list[str]:
    """``"rg:gcd,lcm"`` -> ``["gcd", "lcm"]``: the labels of the spec's tasks (:func:`parse_tasks`)."""
    return [t.label for t in parse_tasks(spec)]


def _config_json(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)


def _create(name: str, config_json: str, *, size: int, seed: int):
    """reasoning-gym's dataset of a task with its settings (a bad setting: a one-line error naming
    the task's settings)."""
    rg = _reasoning_gym()
    fields = {f.name: f for f in dataclasses.fields(rg.factory.DATASETS[name][1])}
    config = json.loads(config_json)
    for key, value in config.items():
        # JSON has no tuples, and one value of a tuple setting (styles=plain) is written bare
        if isinstance(value, list) or (key in fields and isinstance(fields[key].default, tuple)):
            config[key] = tuple(value) if isinstance(value, list | tuple) else (value,)
    try:
        return rg.create_dataset(name, size=size, seed=seed, **config)
    except (TypeError, ValueError, AssertionError) as exc:
        known = [f for f in fields if f not in ("size", "seed")]
        raise DatasetError(
            f"reasoning-gym task {name!r} refuses the settings {config}: {exc or type(exc).__name__}; "
            f"its settings: {', '.join(known)}"
        ) from None


@cache
def _dataset(name: str, config_json: str):
    """The task with its settings, for its verifier (``score_answer`` reads no generated item)."""
    return _create(name, config_json, size=1, seed=0)


def _example(task: Task | str, entry: dict[str, Any], split: str, index: int) -> PromptExample:
    task = Task(task) if isinstance(task, str) else task
    truth = {"rg": task.name, "answer": entry["answer"], "metadata": entry.get("metadata", {})}
    if task.config:  # only then: a task without settings keeps the ground truths (and digests) it had
        truth["config"] = task.kwargs
    return PromptExample(
        prompt=entry["question"],
        ground_truth=json.dumps(truth, sort_keys=True, default=str),
        id=f"rg-{task.label}-{split}-{index}",
    )


def _generate(task: Task, size: int, seed: int) -> list[dict[str, Any]]:
    return list(_create(task.name, _config_json(task.kwargs), size=size, seed=seed))


def _check_task(task: Task, entries: list[dict[str, Any]]) -> None:
    """Refuse a task the ``####`` reward cannot score: multi-line references, or a verifier that
    does not accept its own reference once the example went through JSON (its ground truth)."""
    if any("\n" in str(e["answer"]) for e in entries):
        raise DatasetError(
            f"reasoning-gym task {task.label!r} has answers over several lines, and the reward reads the one "
            "line after ####: not supported"
        )
    for entry in entries[:8]:
        example = _example(task, entry, "check", 0)
        if rg_reward(f"#### {entry['answer']}", example.ground_truth) < 1.0:
            raise DatasetError(
                f"reasoning-gym task {task.label!r}: its verifier does not accept its own reference answer once "
                "the example is stored as JSON (its metadata holds non-JSON values): not supported"
            )
    defect = constant_answer_defect(task, entries)
    if defect is not None:
        answer, passed, right = defect
        raise DatasetError(
            f"reasoning-gym task {task.label!r}: its verifier gives full reward to the one answer {answer!r} on "
            f"{passed:.0%} of its first {len(entries)} questions (the right answer to {right:.0%}): a policy "
            "learns that answer instead of the task; not supported"
        )


# Answers a policy can give to every question; with the most common reference answers, what
# constant_answer_defect tries.
TRIVIAL_ANSWERS = ("0", "1", "-1", "2", "0.5", "yes", "no", "True", "False", "A", "none")
# A verifier may pass a constant answer this much more often than it is the right answer (a share)
DEFECT_MARGIN = 0.1


def constant_answer_defect(
    task: Task | str, entries: list[dict[str, Any]]
) -> tuple[str, float, float] | None:
    """``(answer, share of questions it gets full reward on, share it is the right answer to)`` of the
    worst constant answer where the task's verifier rewards it more than :data:`DEFECT_MARGIN` more
    often than it is right, else None.

    Found on the H100s (session 24): reasoning-gym 0.1.25's ``coin_flip`` gives full reward to ``0``
    for every probability below 1 (its partial credit divides the matching prefix by the SHORTER
    string: ``"0"`` against ``"0.11328125"`` is 1/1), and GRPO drove held-out pass@1 from 0.11 to 0.89
    by answering 0; ``game_of_life_halting`` rewards ``0`` everywhere. A run on such a task measures
    the verifier, not the model, so the task is refused.
    """
    examples = [_example(task, e, "check", i) for i, e in enumerate(entries)]
    references = [str(e["answer"]).strip() for e in entries]
    common = [answer for answer, _ in Counter(references).most_common(3)]  # ties: first seen first

    def extracted(answer: str, reference: str) -> str:
        got = extract_answer(f"#### {answer}", reference)
        return "" if got is None else got.strip().lower()

    worst = None
    for answer in dict.fromkeys([*TRIVIAL_ANSWERS, *common]):
        passed = sum(rg_reward(f"#### {answer}", e.ground_truth) >= 1.0 for e in examples) / len(examples)
        right = sum(extracted(answer, r) == extracted(r, r) for r in references) / len(references)
        if passed - right > DEFECT_MARGIN and (worst is None or passed - right > worst[1] - worst[2]):
            worst = (answer, passed, right)
    return worst


def load_splits(
    spec: str, *, eval_size: int, seed: int, train_size: int | None = None
) -> tuple[list[PromptExample], list[PromptExample]]:
    """``(training examples, held-out examples)`` of an ``rg:`` spec (see the module's doc)."""
    tasks = parse_tasks(spec)
    per_task_eval, extra = divmod(eval_size, len(tasks))
    train_size = DEFAULT_TRAIN_SIZE if train_size is None else train_size
    held_out_per_task: list[list[PromptExample]] = []
    train: list[PromptExample] = []
    for position, task in enumerate(tasks):
        n_eval = per_task_eval + (1 if position < extra else 0)
        pool = _generate(task, max(n_eval, HELD_OUT_POOL), HELD_OUT_SEED)
        _check_task(task, pool[:64])
        held_out_per_task.append([_example(task, e, "test", i) for i, e in enumerate(pool[:n_eval])])
        generated = _generate(task, train_size, seed)
        seen = {e["question"] for e in pool}
        if sum(e["question"] not in seen for e in generated) < len(generated) // 10:
            # a small question space (string_splitting has a few hundred): the pool would leave nothing
            log.warning(
                "reasoning-gym task %r has few distinct questions: only its %d held-out questions are kept "
                "out of training (an eval of more of them than data.eval_size would score trained ones)",
                task.label,
                n_eval,
            )
            seen = {e["question"] for e in pool[:n_eval]}
        kept = [_example(task, e, "train", i) for i, e in enumerate(generated) if e["question"] not in seen]
        if not kept:
            raise DatasetError(
                f"reasoning-gym task {task.label!r}: every training question is also a held-out one; "
                "lower data.eval_size"
            )
        train += kept
    # the held-out tasks interleaved, so that a periodic eval of its first questions sees every task
    held_out = [
        task_examples[i]
        for i in range(max(map(len, held_out_per_task)))
        for task_examples in held_out_per_task
        if i < len(task_examples)
    ]
    return train, held_out


# --- the reward ----------------------------------------------------------------------------------

_HASHES = re.compile(r"####[ \t]*([^\n]*)")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_NUMERIC_REFERENCE = re.compile(r"-?\d+(?:\.\d+)?")


def _plain_number(text: str) -> str:
    """``"1,000."`` -> ``"1000"``, ``"3.0"`` -> ``"3"``, ``"0.25"`` -> ``"0.25"`` (a reasoning-gym
    default verifier compares strings: a right number written otherwise would score as wrong)."""
    digits = text.replace(",", "").rstrip(".")
    if "." in digits:
        whole, _, fraction = digits.partition(".")
        if not fraction.strip("0"):
            return whole
    return digits


def extract_answer(completion: str, reference: str | None = None) -> str | None:
    """The final answer: the rest of the line after the first ``####``, else the last ``<answer>``.
    Where the ``reference`` answer is a number: the first number of that answer, else the last number
    of the completion (what the gsm8k reward does: a small model often states "... is 3." without
    the marker), written plainly (no thousands commas, no ``.0``)."""
    numeric = reference is not None and _NUMERIC_REFERENCE.fullmatch(reference.strip()) is not None
    match = _HASHES.search(completion)
    if match is not None and match.group(1).strip():
        answer = match.group(1).strip()
    else:
        tags = _ANSWER_TAG.findall(completion)
        answer = tags[-1].strip() if tags else None
    if not numeric:
        return answer
    # a numeric reference: the first number of the marked answer, else the completion's last number
    numbers = _NUMBER.findall(answer) if answer is not None else _NUMBER.findall(completion)
    if not numbers:
        return answer
    return _plain_number(numbers[0] if answer is not None else numbers[-1])


def _scorer(task: str, config: dict[str, Any] | None = None):
    """The verifier of the task with its settings (those of the spec, carried in the ground truth)."""
    return _dataset(task, _config_json(config or {})).score_answer


def rg_reward(completion: str, ground_truth: str) -> float:
    """The task's own ``score_answer`` of the completion's final answer (0.0 without one)."""
    truth = json.loads(ground_truth)
    answer = extract_answer(completion, str(truth["answer"]))
    if answer is None:
        return 0.0
    entry = {"answer": truth["answer"], "metadata": truth["metadata"]}
    score = _scorer(truth["rg"], truth.get("config"))  # a task or settings it refuses: an error, not 0
    try:
        return float(score(answer, entry))
    except Exception:  # a verifier that cannot read an answer scores it wrong
        # Some reasoning-gym 0.1.25 verifiers raise on answers they cannot parse (prime_factorization
        # on "0.5": int("0.5")); a policy's answer must never end the run.
        return 0.0


def _truth(ground_truth: str) -> dict[str, Any] | None:
    text = str(ground_truth).strip()
    if not text.startswith("{"):
        return None
    try:
        truth = json.loads(text)
    except ValueError:
        return None
    return truth if isinstance(truth, dict) and "rg" in truth else None


def reference_of(ground_truth: str) -> str | None:
    """The reference answer an ``rg:`` example's ground truth (JSON, :func:`_example`) holds; None
    for any other ground truth."""
    truth = _truth(ground_truth)
    return None if truth is None or "answer" not in truth else str(truth["answer"]).strip()


def task_of(ground_truth: str) -> str | None:
    """The label of the reasoning-gym task an ``rg:`` example's ground truth names (its name, with
    its settings when it has any: :attr:`Task.label`); None for any other ground truth."""
    truth = _truth(ground_truth)
    if truth is None:
        return None
    return Task(str(truth["rg"]).strip(), tuple(sorted((truth.get("config") or {}).items()))).label


def tasks_of(examples: Sequence[PromptExample]) -> list[str]:
    """The reasoning-gym task of each example (from its ground truth; None for a non-rg example)."""
    return [task_of(e.ground_truth) for e in examples]
