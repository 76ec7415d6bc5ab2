"""Rule-based rewards: GSM8K numeric match, boxed-answer math, format, and their combinations.

A reward function is ``RewardFn = Callable[[completion: str, ground_truth: str], float]``.

Reasoning models write a ``<think>...</think>`` trace before the answer; every reward here first
drops it (:func:`strip_think`), so a number mentioned while thinking never scores. The rules
(decisions documented once, here):

- ``<think>`` handling: everything up to the LAST ``</think>`` is dropped (covers nested blocks and
  a chat template that opens ``<think>`` inside the prompt). A ``<think>`` that is never closed
  means the model ran out of budget while thinking: the completion has NO answer (reward 0).
- GSM8K answer (:func:`extract_gsm8k_answer`): the FIRST ``#### <number>`` (the GSM8K format; the
  first, as lm-eval's strict match, because a model that keeps going after its answer tends to
  invent a follow-up question with its own ``####``); else the last ``\\boxed{...}`` whose content
  is a number; else the last number in the text.
- Numbers: ``,`` thousands separators (only in groups of three: ``1,234``), ``$``, a trailing
  ``.``, ``%`` (dropped: ``50%`` matches ``50``, because GSM8K writes percentage answers as plain
  numbers), a unicode minus ``−`` are normalised; ``a/b`` is a fraction; values are compared
  exactly as rationals (:class:`fractions.Fraction`), so ``72.0 == 72``, ``$1,234.00 == 1234``,
  ``3/4 == 0.75`` and 30-digit integers compare exactly. No words (``seventy-two``), no
  scientific notation.
- Boxed math (:func:`boxed_math_reward`): the last ``\\boxed{...}`` (balanced braces) against the
  ground truth through HF ``math-verify`` (``parse`` + ``verify``: LaTeX to sympy, so
  ``\\sqrt{2}/2 == \\frac{\\sqrt{2}}{2}``, ``10\\%``, ``90^\\circ``, units in ``\\text{}``), the
  library TRL and slime use; an optional extra (``pip install 'slime-gb10[gsm8k]'``).
- Format (:func:`formatted_answer`): the answer the model marked as final, a strict ``#### <n>`` or
  else the last ``\\boxed{...}``; the share of completions that have one is the eval's format
  compliance.
"""

from __future__ import annotations

import logging
import math
import numbers
import re
from collections.abc import Callable, Sequence
from fractions import Fraction

from slime_gb10.utils.errors import UserError

logger = logging.getLogger(__name__)

RewardFn = Callable[[str, str], float]

# A reward is a score (ours are 0..1, weighted sums a few units). A magnitude beyond this is a bug
# in the reward function, not a signal: group advantages normalise it away, but the loss and the
# logged means overflow and the run would end as "diverged", blaming the learning rate.
MAX_ABS_REWARD = 1e6


class RewardError(UserError, ValueError):
    """A reward cannot be built or returned something no reward may return; the message names it."""


class RewardValueError(TypeError):
    """One sample's reward is not a finite real number (counted as a reward error, scored 0)."""


def reward_value(value: object, name: str) -> float:
    """``value`` as a float, or an error: a non-number (``"0.5"``, None) or a non-finite number is a
    :class:`RewardValueError` (that sample scores 0 and is counted); a magnitude above
    :data:`MAX_ABS_REWARD` is a :class:`RewardError` that stops the run, naming the reward."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        item = getattr(value, "item", None)  # a 0-d numpy / torch scalar
        if callable(item) and getattr(value, "ndim", None) == 0:
            value = item()
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise RewardValueError(f"reward {name} returned {type(value).__name__} {value!r}, not a number")
    result = float(value)
    if not math.isfinite(result):
        raise RewardValueError(f"reward {name} returned a non-finite value {result}")
    if abs(result) > MAX_ABS_REWARD:
        raise RewardError(
            f"reward {name} returned {result:g}, beyond +-{MAX_ABS_REWARD:g}: a reward is a score (ours are "
            "0..1), so this is a bug in the reward function; fix it (or rescale it) and restart"
        )
    return result


_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"


def strip_think(text: str) -> str | None:
    """The answer part of a completion: after the last ``</think>``; ``None`` if ``<think>`` is never closed."""
    close = text.rfind(_THINK_CLOSE)
    if close >= 0:
        return text[close + len(_THINK_CLOSE) :]
    if _THINK_OPEN in text:
        return None
    return text


def prompt_opens_think(prompt_text: str) -> bool:
    """True when a chat-formatted prompt ends inside an open ``<think>`` block.

    Reasoning templates (Qwen3 thinking mode, DeepSeek-R1 distills) put ``<think>`` at the end of
    the prompt, so the completion continues a trace whose opening tag it never contains.
    """
    return prompt_text.rfind(_THINK_OPEN) > prompt_text.rfind(_THINK_CLOSE)


def as_scored(completion: str, opens_think: bool) -> str:
    """The text a reward sees: the completion, with the prompt's open ``<think>`` restored.

    Without it, a trace cut off before ``</think>`` would be scored on its last number instead of
    counting as "no answer".
    """
    return _THINK_OPEN + completion if opens_think else completion


# --- numbers -----------------------------------------------------------------------------------

# A number: optional sign (not glued to a preceding word/number, so "5-3" is 5 and 3; and glued to
# the digits, so "10 - 4" is 10 and 4), optional $, an integer with thousands groups of three or
# plain digits, optional decimals, optional /denominator; or a bare decimal ".5".
_NUMBER = (
    r"(?:(?<![\w.)\]])[-+])?\$?"
    r"(?:(?:\d{1,3}(?:,\d{3})+(?!\d|,\d)|\d+)(?:\.\d+)?(?:\s?/\s?\d+(?:\.\d+)?)?|\.\d+)"
)
# Every number starts with a sign, ``$``, a digit or ``.``: the lookahead lets the scanner reject any
# other position at once. Without it Python's ``re`` tries the whole pattern at every character,
# which made the rewards of 160 random 512-token completions (the benchmark's shape B) take ~65 ms
# on a 2-core CPU, against ~13 ms with it, for the same matches (issue #27).
_NUMBER_RE = re.compile(r"(?=[-+$.\d])" + _NUMBER)
_STRICT_RE = re.compile(r"####\s*(" + _NUMBER + r")")
_FULL_NUMBER_RE = re.compile(r"^\s*(?:" + _NUMBER + r")\s*$")


def _normalise_text(text: str) -> str:
    return text.replace("\u2212", "-").replace("\u2013", "-").replace("\uff0c", ",")


def parse_number(text: str) -> Fraction | None:
    """``Fraction`` of a single number written as text (``"$1,234.00"``, ``"-3/4"``, ``"72."``, ``"50%"``), else None."""
    s = _normalise_text(text).strip()
    s = s.rstrip(".").rstrip()
    s = s.removesuffix("%").removesuffix("\\%").rstrip()
    if not s or not _FULL_NUMBER_RE.match(s):
        return None
    s = s.replace("$", "").replace(",", "").replace(" ", "")
    sign = 1
    if s[0] in "+-":
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    try:
        if "/" in s:
            num, den = s.split("/")
            if Fraction(den) == 0:
                return None
            return sign * Fraction(num) / Fraction(den)
        return sign * Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def format_number(value: Fraction) -> str:
    """Canonical text of a rational: ``72``, ``-5``, ``0.75``; ``p/q`` when the decimal does not terminate."""
    if value.denominator == 1:
        return str(value.numerator)
    den = value.denominator
    for p in (2, 5):
        while den % p == 0:
            den //= p
    if den != 1:
        return f"{value.numerator}/{value.denominator}"
    digits = 0
    scaled = value
    while scaled.denominator != 1:
        scaled *= 10
        digits += 1
    sign = "-" if scaled < 0 else ""
    mag = str(abs(scaled.numerator)).rjust(digits + 1, "0")
    return f"{sign}{mag[:-digits]}.{mag[-digits:]}"


def _numbers_in(text: str) -> list[str]:
    return [m.group(0) for m in _NUMBER_RE.finditer(_normalise_text(text))]


# --- boxed answers -----------------------------------------------------------------------------


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced nested braces, else None.

    ``\\boxed 5`` (no braces) yields ``5``. An unbalanced last box yields None.
    """
    starts = [m for m in re.finditer(r"\\(?:boxed|fbox)\s*(\{|\s+)", text)]
    for m in reversed(starts):
        if m.group(1) != "{":
            token = re.match(r"\S+", text[m.end() :])
            return token.group(0).rstrip("$.") if token else None
        depth = 1
        for i in range(m.end(), len(text)):
            ch = text[i]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[m.end() : i]
        return None
    return None


def _boxed_number(content: str) -> Fraction | None:
    """A ``\\boxed{}`` content that is a plain number (``72``, ``\\$1,234``, ``-\\frac{3}{4}``), else None.

    Only what a GSM8K answer needs; anything else (sympy-level LaTeX) is :func:`boxed_math_reward`'s.
    """
    s = content.strip().strip("$").replace("\\$", "").replace("\\%", "").replace("\\!", "").replace("\\,", "")
    s = re.sub(r"\\text\{[^{}]*\}\s*$", "", s).strip()
    frac = re.fullmatch(r"(-?)\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}", s)
    if frac:
        num, den = parse_number(frac.group(2)), parse_number(frac.group(3))
        if num is None or den is None or den == 0:
            return None
        value = num / den
        return -value if frac.group(1) else value
    return parse_number(s)


# --- reward functions --------------------------------------------------------------------------


def extract_gsm8k_answer(text: str) -> str | None:
    """The model's final numeric answer as canonical text (``"1234"``, ``"-5"``, ``"0.75"``), or None.

    Order: first strict ``#### <n>``, else last ``\\boxed{}`` holding a number, else the last
    number; all after dropping ``<think>...</think>``.
    """
    answer_part = strip_think(text)
    if answer_part is None:
        return None
    answer_part = _normalise_text(answer_part)
    strict = _STRICT_RE.search(answer_part)
    if strict:
        value = parse_number(strict.group(1))
        if value is not None:
            return format_number(value)
    boxed = last_boxed(answer_part)
    if boxed is not None:
        value = _boxed_number(boxed)
        if value is not None:
            return format_number(value)
    for candidate in reversed(_numbers_in(answer_part)):
        value = parse_number(candidate)
        if value is not None:
            return format_number(value)
    return None


def _ground_truth_number(ground_truth: str) -> Fraction | None:
    gt = ground_truth.strip()
    if "####" in gt:  # a full GSM8K solution was passed as the ground truth
        gt = gt.rsplit("####", 1)[1]
    return parse_number(gt)


def gsm8k_reward(completion: str, ground_truth: str) -> float:
    """1.0 if the completion's final number (:func:`extract_gsm8k_answer`) equals ``ground_truth`` exactly, else 0.0.

    ``ground_truth`` is a number (``"72"``, ``"1,234"``, ``"-3"``) or a full GSM8K solution ending
    in ``#### n``. A ground truth that is not a number is compared as stripped text.
    """
    predicted = extract_gsm8k_answer(completion)
    if predicted is None:
        return 0.0
    expected = _ground_truth_number(ground_truth)
    if expected is None:
        return float(predicted == ground_truth.strip())
    value = parse_number(predicted)
    return float(value is not None and value == expected)


def arithmetic_reward(completion: str, ground_truth: str) -> float:
    """Reward of the procedural arithmetic task (``slime_gb10.grpo.arithmetic.ArithmeticTask``): GSM8K-style numeric match."""
    return gsm8k_reward(completion, ground_truth)


def _math_verify():
    try:
        import math_verify
    except ImportError:
        raise RewardError(
            "the boxed_math reward compares LaTeX answers with HF math-verify, which is not installed: "
            "pip install 'slime-gb10[gsm8k]' (or use the gsm8k reward for numeric answers)"
        ) from None
    return math_verify


def boxed_math_reward(completion: str, ground_truth: str) -> float:
    """1.0 if the last ``\\boxed{...}`` of the completion equals ``ground_truth`` mathematically, else 0.0.

    Both sides are parsed and compared by HF ``math-verify`` (``parse`` / ``verify``; the gold may
    be plain (``0.75``), LaTeX or itself boxed). Only the LAST box counts (math-verify alone would
    read ``\\boxed{1} \\boxed{5}`` as the set {1, 5}). No box, or an unclosed ``<think>``: 0.0.
    Needs the ``gsm8k`` extra; without it :class:`RewardError` says how to install it.
    """
    mv = _math_verify()
    answer_part = strip_think(completion)
    if answer_part is None:
        return 0.0
    boxed = last_boxed(answer_part)
    if boxed is None or not boxed.strip():
        return 0.0
    gold_text = ground_truth if ("\\boxed" in ground_truth or "$" in ground_truth) else f"${ground_truth}$"
    gold = mv.parse(gold_text, extraction_config=[mv.LatexExtractionConfig(), mv.ExprExtractionConfig()])
    predicted = mv.parse(f"\\boxed{{{boxed}}}", extraction_config=[mv.LatexExtractionConfig()])
    if not gold or not predicted:
        return 0.0
    return float(mv.verify(gold, predicted))


def formatted_answer(completion: str) -> str | None:
    """The answer the completion marks as final: a strict ``#### <n>`` (first), else the last ``\\boxed{}``.

    None when it has neither, or its ``<think>`` never closes. The eval's format compliance is the
    share of completions for which this is not None (slime's GB10 table counts answers without
    ``\\boxed{}`` the same way).
    """
    answer_part = strip_think(completion)
    if answer_part is None:
        return None
    strict = _STRICT_RE.search(_normalise_text(answer_part))
    if strict:
        return strict.group(1)
    boxed = last_boxed(answer_part)
    return boxed if boxed is not None and boxed.strip() else None


DEFAULT_FORMAT_PATTERN = r"####\s*\$?\s*[-+\u2212]?\s*\$?\s*\.?\d|\\boxed\s*\{"


def format_reward(
    completion: str, ground_truth: str = "", pattern: str | re.Pattern = DEFAULT_FORMAT_PATTERN
) -> float:
    """1.0 if the answer part (after ``</think>``) contains ``pattern`` (default: ``#### <number>`` or ``\\boxed{``).

    ``ground_truth`` is ignored (the signature matches :data:`RewardFn`). An unclosed ``<think>``
    scores 0.0.
    """
    answer_part = strip_think(completion)
    if answer_part is None:
        return 0.0
    regex = pattern if isinstance(pattern, re.Pattern) else re.compile(pattern)
    return float(regex.search(answer_part) is not None)


def combine_rewards(functions: Sequence[tuple[RewardFn, float]]) -> RewardFn:
    """Weighted sum ``sum_k w_k * f_k(completion, ground_truth)`` as one :data:`RewardFn`."""
    parts = list(functions)
    if not parts:
        raise ValueError("combine_rewards needs at least one (reward_fn, weight) pair")

    def combined(completion: str, ground_truth: str) -> float:
        return sum(
            weight * reward_value(fn(completion, ground_truth), getattr(fn, "__name__", "reward"))
            for fn, weight in parts
        )

    combined.__name__ = "+".join(f"{weight:g}*{getattr(fn, '__name__', 'reward')}" for fn, weight in parts)
    return combined


_warned: set[str] = set()


def safe_rewards(
    fn: RewardFn, completions: Sequence[str], ground_truths: Sequence[str]
) -> tuple[list[float], int]:
    """Score every sample; a reward that raises or returns a non-number scores 0.0 and is counted.

    Returns ``(rewards, num_failures)``. The first failure of each reward function (by name) in
    this process is logged as a warning with the exception. A value beyond
    :data:`MAX_ABS_REWARD` raises :class:`RewardError` (a broken reward, see :func:`reward_value`);
    the trainer stops a run whose every sample fails for several steps in a row. A length mismatch
    between the two lists is a caller bug and raises ``ValueError``.
    """
    if len(completions) != len(ground_truths):
        raise ValueError(f"{len(completions)} completions but {len(ground_truths)} ground truths")
    name = getattr(fn, "__name__", repr(fn))
    rewards: list[float] = []
    failures = 0
    for i, (completion, truth) in enumerate(zip(completions, ground_truths)):
        try:
            value = reward_value(fn(completion, truth), name)
        except RewardError:
            raise
        except Exception as exc:
            failures += 1
            rewards.append(0.0)
            if name not in _warned:
                _warned.add(name)
                logger.warning(
                    "reward %s failed on sample %d (scored 0; further failures are only counted): %r",
                    name,
                    i,
                    exc,
                )
            continue
        rewards.append(value)
    return rewards, failures


def score_completions(
    fn: RewardFn, completions: Sequence[str], opens_think: Sequence[bool], ground_truths: Sequence[str]
) -> tuple[list[str], list[float], int]:
    """:func:`safe_rewards` of what the reward sees (:func:`as_scored`): ``(texts, rewards,
    num_failures)``; for the training step and the evaluation alike."""
    texts = [as_scored(c, o) for c, o in zip(completions, opens_think, strict=True)]
    rewards, failures = safe_rewards(fn, texts, ground_truths)
    return texts, rewards, failures


def rg_reward(completion: str, ground_truth: str) -> float:
    """A reasoning-gym task's own score of the completion's final answer (``rg_tasks.rg_reward``;
    the ground truth is the JSON its ``rg:`` examples carry)."""
    from slime_gb10.grpo.rg_tasks import rg_reward as score

    return score(completion, ground_truth)


REWARDS: dict[str, RewardFn] = {
    "gsm8k": gsm8k_reward,
    "boxed_math": boxed_math_reward,
    "format": format_reward,
    "arithmetic": arithmetic_reward,
    "rg": rg_reward,
}


class FailureStreak:
    """Stops a run whose reward failed on every sample for ``limit`` steps in a row."""

    def __init__(self, limit: int, reward_fn: RewardFn):
        self.limit, self.name, self.steps = limit, getattr(reward_fn, "__name__", "the reward"), 0

    def check(self, errors: int, total: int, step: int) -> None:
        self.steps = self.steps + 1 if errors == total else 0
        if self.steps >= self.limit:
            raise RewardError(
                f"step {step}: reward {self.name} failed on every sample for {self.limit} steps in a row (the "
                "first error is logged above), so there is nothing to learn from; fix the reward or the data "
                "(data.reward, the ground-truth column) and start again"
            )


def compares_numbers_only(name_or_spec: str) -> bool:
    """Whether every part of a reward spec that can score an answer compares numbers (gsm8k,
    arithmetic): then a ground truth with no number in it can never be rewarded."""
    names = {part.split(":", 1)[0].strip() for part in name_or_spec.split(",")} - {"format"}
    return bool(names) and names <= {"gsm8k", "arithmetic"}


def get_reward(name_or_spec: str) -> RewardFn:
    """A reward by name (``"gsm8k"``) or a weighted sum spec (``"gsm8k:1.0,format:0.1"``)."""
    spec = name_or_spec.strip()
    if not spec:
        raise RewardError(
            f"empty reward spec; choose from {', '.join(REWARDS)} (e.g. 'gsm8k:1.0,format:0.1')"
        )
    parts: list[tuple[RewardFn, float]] = []
    for item in spec.split(","):
        name, _, weight_text = item.strip().partition(":")
        name = name.strip()
        if name not in REWARDS:
            raise RewardError(
                f"unknown reward {name!r} in {name_or_spec!r}; choose from {', '.join(REWARDS)} "
                "(a weighted sum is written 'gsm8k:1.0,format:0.1')"
            )
        try:
            weight = float(weight_text) if weight_text.strip() else 1.0
        except ValueError:
            raise RewardError(
                f"reward weight {weight_text!r} of {name!r} in {name_or_spec!r} is not a number"
            ) from None
        if not math.isfinite(weight):
            raise RewardError(f"reward weight of {name!r} must be finite, got {weight_text!r}")
        parts.append((REWARDS[name], weight))
    if len(parts) == 1 and parts[0][1] == 1.0:
        return parts[0][0]
    return combine_rewards(parts)
