"""The statistics of an evaluation: pass@k, a binomial confidence interval and a paired test.

- :func:`pass_at_k`: the unbiased pass@k of one prompt (Chen et al. 2021).
- :func:`question_digest`: a question's fingerprint, so that two evaluations pair the same questions.

- :func:`wilson_interval`: Wilson's score interval for a proportion (Wilson 1927), the interval that
  keeps its coverage near 0 and 1, where a 2% pass@1 lives (the normal approximation would give a
  negative lower bound).
- :func:`mcnemar_exact`: McNemar's exact test for two evaluations of the same questions: only the
  discordant questions (right before and wrong after, or the reverse) carry information; under "no
  change" each is either kind with probability 1/2, so the two-sided p-value is a binomial tail.

Written here (a dozen lines) rather than taken from scipy/statsmodels, which are not dependencies of
the package; the tests check both against hand-computed values and against scipy where installed.
"""

from __future__ import annotations

import math
from collections import Counter

Z_95 = 1.959963984540054  # the 97.5% quantile of the standard normal


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """``(low, high)``: Wilson's score interval for ``successes`` out of ``n`` (95% by default)."""
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval needs 0 <= successes <= n and n > 0, got {successes}/{n}")
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one prompt with ``n`` samples, ``c`` correct (Chen et al. 2021,
    "Evaluating Large Language Models Trained on Code", eq. 1): ``1 - C(n - c, k) / C(n, k)``."""
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def question_digest(question: str) -> str:
    """A short fingerprint of a question's text (the first 16 hex digits of its SHA-256), kept in
    each record of an evaluation so that :func:`compare_evaluations` pairs the same questions."""
    import hashlib

    return hashlib.sha256(question.strip().encode("utf-8")).hexdigest()[:16]


def mcnemar_exact(only_first: int, only_second: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts.

    ``only_first``: questions the first evaluation got right and the second wrong; ``only_second``:
    the reverse. ``p = min(1, 2 * P(X <= min(b, c)))`` with ``X ~ Binomial(b + c, 1/2)``; 1.0 when
    there are no discordant questions.
    """
    if only_first < 0 or only_second < 0:
        raise ValueError(f"discordant counts must be >= 0, got {only_first} and {only_second}")
    n = only_first + only_second
    if n == 0:
        return 1.0
    k = min(only_first, only_second)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def reference_answer(ground_truth: str) -> str:
    """The reference answer a question's ground truth names: the ground truth itself, or for
    reasoning-gym examples the answer their JSON holds (``rg_tasks.reference_of``)."""
    from slime_gb10.grpo.rg_tasks import reference_of

    reference = reference_of(ground_truth)
    return reference if reference is not None else str(ground_truth).strip()


def constant_answer_baseline(questions: list[dict]) -> tuple[str | None, float | None]:
    """``(the most common reference answer, the share of questions it answers)``: what a model that
    always gives that one answer would score under exact match. A trained model whose pass@1 is no
    higher, and whose right answers are all that one, has learned a constant, not the task."""
    counts = Counter(reference_answer(q["ground_truth"]) for q in questions)
    for empty in ("", "None"):  # no reference (tasks scored otherwise): not an answer anyone gives
        counts.pop(empty, None)
    if not counts:
        return None, None
    answer, n = counts.most_common(1)[0]
    return answer, n / len(questions)


def _paired(a: dict[str, bool], b: dict[str, bool], shared: list[str], by_id: dict[str, dict]) -> dict:
    """McNemar counts, pass@1 and the constant-answer baseline of ``shared`` question ids."""
    both = sum(a[i] and b[i] for i in shared)
    only_first = sum(a[i] and not b[i] for i in shared)
    only_second = sum(b[i] and not a[i] for i in shared)
    n = len(shared)
    truths = {i: reference_answer(by_id[i]["ground_truth"]) for i in shared if "ground_truth" in by_id[i]}
    # over every shared question, as pass@1 is (one without a ground truth counts as not answered)
    constant, constant_rate = (None, None)
    if truths:
        constant, rate = constant_answer_baseline([by_id[i] for i in truths])
        constant_rate = None if rate is None else rate * len(truths) / n
    return {
        "questions": n,
        # always answering the most common reference: the score a constant-answer shortcut reaches
        "constant_answer": constant,
        "constant_answer_rate": constant_rate,
        # how many different reference answers the right answers cover (1: a constant answer)
        "distinct_right_first": len({truths[i] for i in truths if a[i]}),
        "distinct_right_second": len({truths[i] for i in truths if b[i]}),
        "both_right": both,
        "only_first_right": only_first,
        "only_second_right": only_second,
        "both_wrong": n - both - only_first - only_second,
        "pass@1_first": (both + only_first) / n,
        "pass@1_second": (both + only_second) / n,
        "difference": (only_second - only_first) / n,
        "mcnemar_p": mcnemar_exact(only_first, only_second),
    }


def compare_evaluations(first: dict, second: dict) -> dict:
    """Paired comparison of two ``slime-gb10 eval --output`` files on the questions both answered.

    Questions are matched by id; returns the counts, both pass@1 on the shared questions, their
    difference and McNemar's exact p-value. Questions of several reasoning-gym tasks (a multi-task
    held-out set) are also compared task by task, under ``"tasks"``.
    """
    from slime_gb10.grpo.rg_tasks import task_of

    a = {q["id"]: bool(q["correct"]) for q in first["questions"]}
    b = {q["id"]: bool(q["correct"]) for q in second["questions"]}
    shared = [i for i in a if i in b]
    if not shared:
        raise ValueError("the two evaluations share no question ids: they are not of the same questions")
    by_id = {q["id"]: q for q in second["questions"]}
    first_by_id = {q["id"]: q for q in first["questions"]}
    for i in shared:  # ids alone can coincide (gsm8k-0 of two different files)
        x, y = first_by_id[i], by_id[i]
        # the question's text where both files carry its digest; else (older files) its ground truth.
        # Not the ground truth when digests exist: a task with several right answers (reasoning-gym's
        # word_ladder) can store another reference for the same question in another process.
        key = "question_digest" if "question_digest" in x and "question_digest" in y else "ground_truth"
        if x.get(key) is not None and y.get(key) is not None and x[key] != y[key]:
            what = "question texts" if key == "question_digest" else "ground truths"
            raise ValueError(
                f"question {i!r} has different {what} in the two files ({str(x[key])[:40]!r} vs "
                f"{str(y[key])[:40]!r}): they evaluate different questions that share ids; evaluate both "
                "models on the same data"
            )
    result = _paired(a, b, shared, by_id)
    groups: dict[str, list[str]] = {}
    for i in shared:
        task = task_of(by_id[i].get("ground_truth", ""))
        if task is not None:
            groups.setdefault(task, []).append(i)
    if len(groups) > 1:
        result["tasks"] = {task: _paired(a, b, ids, by_id) for task, ids in sorted(groups.items())}
    return result
