"""Wilson interval and McNemar's exact test against hand-computed values (and scipy where installed)."""

from __future__ import annotations

import json
import math

import pytest

from slime_gb10.grpo import stats as stats_module
from slime_gb10.grpo.stats import compare_evaluations, mcnemar_exact, wilson_interval


def test_wilson_interval_hand_computed():
    # 0 of 10: low 0, high z^2 / (n + z^2) = 3.8415 / 13.8415
    z2 = 1.959963984540054**2
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(z2 / (10 + z2), rel=1e-12)
    # 5 of 10: symmetric around 0.5, half-width z*sqrt(0.025 + z^2/400)/(1 + z^2/10)
    low, high = wilson_interval(5, 10)
    half = 1.959963984540054 * math.sqrt(0.025 + z2 / 400) / (1 + z2 / 10)
    assert (low, high) == (pytest.approx(0.5 - half), pytest.approx(0.5 + half))
    assert (round(low, 4), round(high, 4)) == (0.2366, 0.7634)  # the textbook value
    # slime's starting point on GSM8K: 575 of 1,319 (43.59%)
    low, high = wilson_interval(575, 1319)
    assert (round(low, 4), round(high, 4)) == (
        0.4094,
        0.4628,
    )  # by hand: centre 0.436126, half-width 0.026723
    with pytest.raises(ValueError):
        wilson_interval(3, 2)
    with pytest.raises(ValueError):
        wilson_interval(0, 0)


def test_wilson_interval_matches_scipy():
    stats = pytest.importorskip("scipy.stats", reason="scipy as a second implementation")
    for k, n in [(0, 5), (1, 7), (28, 1318), (661, 1319), (40, 40)]:
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert wilson_interval(k, n) == (pytest.approx(ci.low, abs=1e-12), pytest.approx(ci.high, abs=1e-12))


def test_mcnemar_exact_hand_computed():
    assert mcnemar_exact(0, 0) == 1.0
    # b=0, c=5: 2 * (1/32) = 0.0625
    assert mcnemar_exact(0, 5) == pytest.approx(0.0625)
    # b=1, c=9: 2 * (1 + 10) / 1024
    assert mcnemar_exact(1, 9) == pytest.approx(22 / 1024)
    assert mcnemar_exact(9, 1) == mcnemar_exact(1, 9)
    assert mcnemar_exact(5, 5) == 1.0  # 2 * P(X <= 5) > 1: capped
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


def test_mcnemar_matches_scipy_binomtest():
    stats = pytest.importorskip("scipy.stats", reason="scipy as a second implementation")
    for b, c in [(3, 17), (40, 61), (12, 12), (0, 9)]:
        assert mcnemar_exact(b, c) == pytest.approx(stats.binomtest(b, b + c, 0.5).pvalue, rel=1e-9)


def test_compare_evaluations_pairs_by_id():
    first = {"questions": [{"id": i, "correct": c} for i, c in zip("abcdef", [1, 1, 0, 0, 1, 0])]}
    second = {"questions": [{"id": i, "correct": c} for i, c in zip("fedcbaz", [1, 1, 1, 1, 0, 1, 1])]}
    # paired on a..f: a 1/1, b 1/0, c 0/1, d 0/1, e 1/1, f 0/1 ("z" only in the second: ignored)
    got = compare_evaluations(first, second)
    assert got["questions"] == 6
    assert (got["both_right"], got["only_first_right"], got["only_second_right"], got["both_wrong"]) == (
        2,
        1,
        3,
        0,
    )
    assert got["pass@1_first"] == pytest.approx(3 / 6) and got["pass@1_second"] == pytest.approx(5 / 6)
    assert got["mcnemar_p"] == pytest.approx(2 * (1 + 4) / 16)
    with pytest.raises(ValueError, match="share no question"):
        compare_evaluations(first, {"questions": [{"id": "q", "correct": 1}]})


def test_the_constant_answer_baseline_and_the_spread_of_right_answers():
    """A held-out gain can be a constant answer (session 23: letter_counting's trained model answered
    "1" to everything and scored exactly the share of questions whose answer is 1). compare reports
    what always giving the most common reference scores, and how many different answers were right."""
    rg_truth = json.dumps({"rg": "gcd", "answer": "1", "metadata": {}})
    truths = [rg_truth, "1", "2", "3"]
    first = {
        "questions": [
            {"id": i, "correct": c, "ground_truth": t} for i, c, t in zip("abcd", [1, 0, 1, 0], truths)
        ]
    }
    second = {"questions": [{"id": i, "correct": c, "ground_truth": t}
                            for i, c, t in zip("abcd", [1, 1, 0, 0], [rg_truth, "1", "2", "3"])]}  # fmt: skip
    got = compare_evaluations(first, second)
    assert (got["constant_answer"], got["constant_answer_rate"]) == ("1", 0.5)
    assert (got["distinct_right_first"], got["distinct_right_second"]) == (2, 1)
    assert stats_module.reference_answer(rg_truth) == "1" and stats_module.reference_answer(" 72 ") == "72"
    assert stats_module.constant_answer_baseline(second["questions"]) == ("1", 0.5)


def test_a_multi_task_held_out_set_is_compared_task_by_task():
    """A run on rg:gcd,chain_sum is judged on every task in it: compare pairs each task's questions
    apart (counts worked by hand below), besides the pooled numbers."""

    def q(i, task, answer, correct):
        truth = json.dumps({"rg": task, "answer": answer, "metadata": {}})
        return {"id": f"{task}-{i}", "correct": correct, "ground_truth": truth}

    # gcd: 4 questions, first right on 0, second on 0, 1, 2; chain_sum: 3, first 0, 1, second 1
    tasks = [("gcd", "2"), ("gcd", "2"), ("gcd", "4"), ("gcd", "6")] + [("chain_sum", a) for a in "579"]
    right = {"first": [1, 0, 0, 0, 1, 1, 0], "second": [1, 1, 1, 0, 0, 1, 0]}

    def questions(which):
        return [q(i % 4, t, a, c) for i, ((t, a), c) in enumerate(zip(tasks, right[which]))]

    first, second = {"questions": questions("first")}, {"questions": questions("second")}
    got = compare_evaluations(first, second)
    assert got["questions"] == 7 and (got["only_first_right"], got["only_second_right"]) == (1, 2)
    gcd, chain = got["tasks"]["gcd"], got["tasks"]["chain_sum"]
    assert (gcd["questions"], gcd["only_first_right"], gcd["only_second_right"], gcd["both_right"]) == (
        4,
        0,
        2,
        1,
    )
    assert gcd["pass@1_first"] == pytest.approx(1 / 4) and gcd["pass@1_second"] == pytest.approx(3 / 4)
    assert gcd["mcnemar_p"] == pytest.approx(2 * 1 / 4)  # 0 vs 2 discordant: 2 * P(X <= 0 | n=2)
    assert (gcd["constant_answer"], gcd["constant_answer_rate"]) == ("2", 0.5)
    assert (chain["questions"], chain["only_first_right"], chain["only_second_right"]) == (3, 1, 0)
    assert chain["difference"] == pytest.approx(-1 / 3) and chain["mcnemar_p"] == pytest.approx(1.0)
    # one task (or none): no per-task part
    assert "tasks" not in compare_evaluations({"questions": first["questions"][:4]}, second)


def test_two_different_question_sets_that_share_ids_are_refused():
    """Issue #41: ids alone coincide across files (gsm8k-0 of two different data files); the ground
    truth and the question's digest tell them apart, and compare refuses to pair them."""
    first = {"questions": [{"id": "q-0", "correct": 1, "ground_truth": "72", "question_digest": "aa"}]}
    same = {"questions": [{"id": "q-0", "correct": 0, "ground_truth": "72", "question_digest": "aa"}]}
    assert compare_evaluations(first, same)["only_first_right"] == 1
    other_text = {"questions": [{"id": "q-0", "correct": 0, "ground_truth": "72", "question_digest": "bb"}]}
    with pytest.raises(ValueError, match="different question texts"):
        compare_evaluations(first, other_text)
    # the same question, another of its right answers stored (reasoning-gym's word_ladder draws one of
    # several paths per process): the digests agree, so the pair stands
    ladder = {
        "questions": [
            {"id": "q-0", "correct": 0, "ground_truth": "COLD,CORD,CARD,WARD,WARM", "question_digest": "aa"}
        ]
    }
    assert compare_evaluations(first, ladder)["questions"] == 1
    # files without digests (written before them): the ground truths decide
    old_a = {"questions": [{"id": "q-0", "correct": 1, "ground_truth": "72"}]}
    old_b = {"questions": [{"id": "q-0", "correct": 0, "ground_truth": "10"}]}
    with pytest.raises(ValueError, match="different ground truths"):
        compare_evaluations(old_a, old_b)
    older = {"questions": [{"id": "q-0", "correct": 0, "ground_truth": "72"}]}  # a file without digests
    assert compare_evaluations(first, older)["questions"] == 1
