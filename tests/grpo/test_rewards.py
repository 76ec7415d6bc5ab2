"""Rule-based rewards on hand-written completions (expected values decided by the documented rules)."""

from __future__ import annotations

import importlib.util
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slime_gb10.grpo.rewards import (
    REWARDS,
    RewardError,
    arithmetic_reward,
    boxed_math_reward,
    combine_rewards,
    extract_gsm8k_answer,
    format_number,
    format_reward,
    formatted_answer,
    get_reward,
    gsm8k_reward,
    last_boxed,
    parse_number,
    safe_rewards,
    strip_think,
)

# --- think handling --------------------------------------------------------------------------


def test_strip_think():
    assert strip_think("<think>x</think> 5") == " 5"
    assert strip_think("no think 5") == "no think 5"
    assert strip_think("<think>never closed 5") is None
    # prompt opened <think> (chat template); the completion only closes it
    assert strip_think("reasoning 3</think>answer 4") == "answer 4"
    # nested: drop up to the last </think>
    assert strip_think("<think>a <think>b</think> c</think> 9") == " 9"


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think>maybe 5, maybe 6</think>The answer is 7.", "7"),
        ("<think>unterminated 7", None),
        ("<think>1 <think>2</think> 3</think> #### 4", "4"),
        ("Let me think </think> so #### 12", "12"),
    ],
)
def test_extract_with_think(completion, expected):
    assert extract_gsm8k_answer(completion) == expected


# --- GSM8K extraction ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72"),
        ("#### $1,234.00", "1234"),
        ("so she earns $10.\n#### 10.", "10"),
        ("#### 72.0", "72"),
        ("#### 5\nQuestion: next one?\n#### 6", "5"),  # first strict answer wins
        ("#### forty two but 42 at the end", "42"),  # #### without a number: last number
        ("The temperature is -5 degrees", "-5"),
        ("The temperature is \u22125 degrees", "-5"),  # unicode minus
        ("10 - 4", "4"),  # a spaced minus is an operator, not a sign
        ("5-3=2", "2"),
        ("3 apples and 4 pears, total 7", "7"),
        ("it is 3/4 of the cake", "0.75"),
        ("#### 2/3", "2/3"),  # non-terminating fraction stays p/q
        ("the discount is 25%", "25"),
        ("I get \\boxed{18} dollars, not 20", "18"),  # boxed beats last number
        ("\\boxed{\\frac{3}{4}}", "0.75"),
        ("#### 123456789012345678901234567890", "123456789012345678901234567890"),
        ("the answer is .5", "0.5"),
        ("So the total is 1,234, which is the answer", "1234"),  # a comma after a grouped number
        ("values 1,2345", "2345"),  # not a thousands grouping
        ("we get 12,345,678.", "12345678"),
        ("I have no idea", None),
        ("", None),
    ],
)
def test_extract_gsm8k_answer(completion, expected):
    assert extract_gsm8k_answer(completion) == expected


@pytest.mark.parametrize(
    ("completion", "truth", "reward"),
    [
        ("#### 72", "72", 1.0),
        ("The answer is 72.", "72", 1.0),
        ("#### 72.0", "72", 1.0),
        ("#### 72.5", "72", 0.0),
        ("#### $1,234.00", "1234", 1.0),
        ("#### 1234", "1,234", 1.0),
        ("#### 5", "Some solution... #### 5", 1.0),  # full GSM8K answer as ground truth
        ("#### -3", "-3", 1.0),
        ("#### 3", "-3", 0.0),
        ("\\boxed{\\frac{3}{4}}", "0.75", 1.0),
        ("0.75", "3/4", 1.0),
        ("<think>#### 72</think> I guess 71", "72", 0.0),
        ("<think>#### 72", "72", 0.0),
        ("no number", "72", 0.0),
        ("#### 123456789012345678901234567890", "123456789012345678901234567890", 1.0),
        (
            "#### 123456789012345678901234567891",
            "123456789012345678901234567890",
            0.0,
        ),  # float64 would say equal
        ("#### \u221212", "-12", 1.0),
    ],
)
def test_gsm8k_reward(completion, truth, reward):
    assert gsm8k_reward(completion, truth) == reward
    assert arithmetic_reward(completion, truth) == reward


def test_gsm8k_non_numeric_truth_is_string_compare():
    assert gsm8k_reward("#### 7", "seven") == 0.0


def test_parse_and_format_number():
    assert parse_number("$1,234.00") == 1234
    assert parse_number("-3/4") == parse_number("-0.75")
    assert parse_number("72.") == 72
    assert parse_number("1/0") is None
    assert parse_number("abc") is None
    assert parse_number("1,23") is None
    assert format_number(parse_number("-0.75")) == "-0.75"
    assert format_number(parse_number("1/3")) == "1/3"
    assert format_number(parse_number("0.05")) == "0.05"


# --- boxed math ------------------------------------------------------------------------------


def test_last_boxed_nested():
    assert last_boxed("\\boxed{1} then \\boxed{\\frac{a}{b^{2}}}") == "\\frac{a}{b^{2}}"
    assert last_boxed("\\boxed 5$") == "5"
    assert last_boxed("\\boxed{unbalanced") is None
    assert last_boxed("none") is None


@pytest.mark.parametrize(
    ("completion", "truth", "reward"),
    [
        ("so \\boxed{\\frac{3}{4}}", "0.75", 1.0),
        ("\\boxed{\\dfrac{1}{2}}", "\\frac12", 1.0),
        ("\\boxed{\\tfrac{1}{2}}", "0.5", 1.0),
        ("\\boxed{-\\frac{3}{4}}", "-0.75", 1.0),
        ("\\boxed{\\frac{-3}{4}}", "\\boxed{-\\frac{3}{4}}", 1.0),
        ("\\boxed{90^\\circ}", "90", 1.0),
        ("\\boxed{90^{\\circ}}", "90", 1.0),
        ("\\boxed{10\\%}", "10", 1.0),
        ("\\boxed{5\\text{ cm}}", "5", 1.0),
        ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)", 1.0),
        ("\\boxed{x = 3}", "3", 1.0),
        ("\\boxed{\\text{(A)}}", "(A)", 1.0),
        ("\\boxed{\\$5}", "5", 1.0),
        ("\\boxed{1,000}", "1000", 1.0),
        ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{\\sqrt{2}}{2}", 1.0),
        ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}", 1.0),  # math-verify: symbolic (sympy)
        ("\\boxed{0.333}", "\\frac13", 0.0),  # rounded answers are not equal (rel_tol 1e-6)
        ("\\boxed{0.3333333333}", "\\frac13", 1.0),  # within rel_tol
        ("\\boxed{4}", "5", 0.0),
        ("the answer is 5", "5", 0.0),  # no box, no reward
        ("<think>\\boxed{5}</think>", "5", 0.0),
        ("\\boxed{1} \\boxed{5}", "5", 1.0),  # last box
        ("\\boxed{}", "", 0.0),
    ],
)
def test_boxed_math_reward(completion, truth, reward):
    pytest.importorskip("math_verify", reason="the boxed_math reward is math-verify's (the gsm8k extra)")
    assert boxed_math_reward(completion, truth) == reward


def test_boxed_math_without_math_verify_names_the_extra(monkeypatch):
    """Without the optional extra the reward is a one-line error with the install command."""
    import builtins

    real_import = builtins.__import__

    def no_math_verify(name, *args, **kwargs):
        if name == "math_verify" or name.startswith("math_verify."):
            raise ImportError("No module named 'math_verify'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_math_verify)
    with pytest.raises(RewardError, match=r"math-verify.*pip install 'slime-gb10\[gsm8k\]'"):
        boxed_math_reward("\\boxed{5}", "5")
    # the GSM8K reward needs no extra: a boxed number is read by our own small parser
    assert gsm8k_reward("so \\boxed{\\$1,234}", "1234") == 1.0
    assert gsm8k_reward("\\boxed{-\\frac{3}{4}}", "-0.75") == 1.0


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("so #### 72", "72"),
        ("#### 5 and later \\boxed{6}", "5"),  # the strict #### first
        ("thus \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("the answer is 72", None),  # a bare number is not a marked final answer
        ("\\boxed{}", None),
        ("<think>#### 5", None),  # never closed: no answer
        ("<think>#### 4</think> \\boxed{5}", "5"),
    ],
)
def test_formatted_answer(completion, answer):
    assert formatted_answer(completion) == answer


# --- format, combine, registry ---------------------------------------------------------------


def test_format_reward():
    assert format_reward("blah #### 5") == 1.0
    assert format_reward("blah \\boxed{5}") == 1.0
    assert format_reward("the answer is 5") == 0.0
    assert format_reward("<think>#### 5</think> 5") == 0.0
    assert format_reward("<think>#### 5") == 0.0
    assert format_reward("#### $-1") == 1.0
    assert format_reward("Answer: 5", pattern=r"Answer: \d") == 1.0


def test_combine_and_get_reward():
    fn = get_reward("gsm8k:1.0,format:0.1")
    assert fn("#### 5", "5") == pytest.approx(1.1)
    assert fn("it is 5", "5") == pytest.approx(1.0)
    assert fn("#### 4", "5") == pytest.approx(0.1)
    assert get_reward("gsm8k") is gsm8k_reward
    assert get_reward(" boxed_math , format:0.5 ")("\\boxed{2}", "2") == pytest.approx(1.5)
    assert set(REWARDS) == {"gsm8k", "boxed_math", "format", "arithmetic", "rg"}
    assert combine_rewards([(gsm8k_reward, 2.0)])("#### 1", "1") == 2.0
    with pytest.raises(ValueError, match=r"unknown reward 'gsm9k'.*gsm8k, boxed_math, format, arithmetic"):
        get_reward("gsm9k")
    with pytest.raises(ValueError, match="not a number"):
        get_reward("gsm8k:heavy")
    with pytest.raises(ValueError, match="empty"):
        get_reward("")
    with pytest.raises(ValueError):
        combine_rewards([])


def test_safe_rewards_counts_failures_and_warns_once(caplog):
    def flaky_reward(completion: str, truth: str) -> float:
        if completion == "boom":
            raise RuntimeError("parser exploded")
        if completion == "nan":
            return float("nan")
        return 1.0

    with caplog.at_level(logging.WARNING, logger="slime_gb10.grpo.rewards"):
        rewards, failures = safe_rewards(flaky_reward, ["ok", "boom", "nan", "boom"], ["1"] * 4)
        assert rewards == [1.0, 0.0, 0.0, 0.0]
        assert failures == 3
        rewards, failures = safe_rewards(flaky_reward, ["boom"], ["1"])
        assert (rewards, failures) == ([0.0], 1)
    warnings = [r for r in caplog.records if "flaky_reward" in r.getMessage()]
    assert len(warnings) == 1 and "parser exploded" in warnings[0].getMessage()
    with pytest.raises(ValueError, match="2 completions but 1"):
        safe_rewards(flaky_reward, ["a", "b"], ["1"])


# --- properties ------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    st.integers(min_value=-(10**15), max_value=10**15),
    st.sampled_from(["plain", "commas", "dollar", "dot0", "boxed"]),
)
def test_any_integer_in_any_accepted_format_scores(n, style):
    text = {
        "plain": f"#### {n}",
        "commas": f"#### {n:,}",
        "dollar": f"#### ${n:,}" if n >= 0 else f"#### -${-n:,}",
        "dot0": f"The answer is {n}.0.",
        "boxed": f"so \\boxed{{{n}}}",
    }[style]
    assert gsm8k_reward(f"<think>maybe {n + 1}</think>{text}", str(n)) == 1.0
    assert gsm8k_reward(text, str(n + 1)) == 0.0
    if importlib.util.find_spec("math_verify") is not None:
        assert boxed_math_reward(f"\\boxed{{{n}}}", f"{n}.0") == 1.0


def test_a_think_block_opened_by_the_chat_template_counts_as_open():
    """Found in review: Qwen3-thinking / R1-distill templates end the prompt with '<think>\\n', so a
    trace cut off before '</think>' has no tags at all and was scored on its last number."""
    from slime_gb10.grpo.rewards import as_scored, prompt_opens_think

    prompt = "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n<think>\n"
    cut_off = "Okay, maybe 42? Let me recheck the second part"
    assert prompt_opens_think(prompt)
    assert gsm8k_reward(cut_off, "42") == 1.0  # what scoring the bare completion used to give
    assert gsm8k_reward(as_scored(cut_off, prompt_opens_think(prompt)), "42") == 0.0
    finished = "6 * 7 = 42.\n</think>\n#### 42"
    assert gsm8k_reward(as_scored(finished, True), "42") == 1.0
    closed_in_prompt = "<think>\nfirst thoughts\n</think>\nassistant:"
    assert not prompt_opens_think(closed_in_prompt) and not prompt_opens_think("plain prompt")
    assert as_scored("#### 5", False) == "#### 5"


# ---------------------------------------------------------------- what no reward may return
def test_non_numbers_are_reward_errors_not_rewards():
    from slime_gb10.grpo.rewards import safe_rewards

    def as_text(completion: str, truth: str):
        return "0.5"

    def as_none(completion: str, truth: str):
        return None

    for fn in (as_text, as_none):
        rewards, errors = safe_rewards(fn, ["a", "b"], ["1", "1"])
        assert rewards == [0.0, 0.0] and errors == 2
    # numpy / torch scalars and bools-as-ints that are numbers still count
    import numpy as np
    import torch

    rewards, errors = safe_rewards(lambda c, t: np.float32(0.25), ["a"], ["1"])
    assert rewards == [0.25] and errors == 0
    rewards, errors = safe_rewards(lambda c, t: torch.tensor(1.0), ["a"], ["1"])
    assert rewards == [1.0] and errors == 0


def test_absurd_magnitudes_are_refused_naming_the_reward():
    from slime_gb10.grpo.rewards import RewardError, combine_rewards, safe_rewards

    def exploding(completion: str, truth: str) -> float:
        return 1e39

    with pytest.raises(RewardError, match=r"reward exploding returned 1e\+39"):
        safe_rewards(exploding, ["a"], ["1"])
    with pytest.raises(RewardError, match="reward exploding"):
        safe_rewards(combine_rewards([(exploding, 1.0), (lambda c, t: 0.0, 0.1)]), ["a"], ["1"])
    assert safe_rewards(lambda c, t: 1e6, ["a"], ["1"]) == ([1e6], 0)  # the bound itself is allowed


def test_unknown_reward_spec_is_a_reward_error():
    from slime_gb10.grpo.rewards import RewardError

    with pytest.raises(RewardError, match="unknown reward 'nosuch'"):
        get_reward("nosuch")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("0123456789٣-+$.,/ %)]x\\{}#\n")), max_size=60))
def test_the_number_scanner_finds_what_the_plain_pattern_finds(text):
    """The scanner's lookahead (a speed-up) changes no match: the same numbers, at the same places,
    as the bare number pattern on text dense in digits, signs, separators and brackets."""
    import re

    from slime_gb10.grpo import rewards

    plain = [(m.start(), m.group(0)) for m in re.compile(rewards._NUMBER).finditer(text)]
    fast = [(m.start(), m.group(0)) for m in rewards._NUMBER_RE.finditer(text)]
    assert fast == plain
