"""The procedural arithmetic task: unlimited, seeded arithmetic questions of graded difficulty
(difficulty 0 is single-digit addition, ``What is 3 + 4?``), so a run needs no download. The
default run's task; a generated task beside the file readers of :mod:`~slime_gb10.grpo.data`."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from slime_gb10.grpo.data import PromptExample

_OP_FUNCS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def evaluate_expression(operands: Sequence[int], ops: Sequence[str]) -> int:
    """Integer value of ``operands[0] ops[0] operands[1] ...`` with ``*`` before ``+``/``-``."""
    if len(operands) != len(ops) + 1:
        raise ValueError("need one more operand than operators")
    terms = [operands[0]]
    signs: list[str] = []
    for op, value in zip(ops, operands[1:]):
        if op == "*":
            terms[-1] = terms[-1] * value
        else:
            signs.append(op)
            terms.append(value)
    total = terms[0]
    for op, value in zip(signs, terms[1:]):
        total = _OP_FUNCS[op](total, value)
    return total


class ArithmeticTask:
    """Unlimited seeded arithmetic questions of graded difficulty (no download needed).

    ``difficulty`` ``d`` in ``[0, 1]`` picks a level ``floor(d * L + 0.5)`` of ``L`` steps, where each
    step adds one of: an operator (in the order of ``ops``), a digit per operand (from
    ``min_digits`` to ``max_digits``), an operand (from 2 to ``max_operands``), taken round-robin in
    that order while each has room. With the defaults (``+ - *``, 1-3 digits, up to 3 operands,
    ``L = 5``): level 0 ``3 + 4``; 1 ``7 - 9``; 2 ``42 - 17``; 3 ``42 + 17 - 80``;
    4 ``42 * 17 - 80``; 5 three-digit operands.

    So ``d = 0`` gives single-digit additions (``What is 3 + 4?``) that a 135M instruct model gets
    right some of the time, and reward can rise in a short run (measured once with the embedded
    SmolLM2-135M-Instruct GGUF, greedy, 48 new tokens, the default instruction, on ``eval_set(32)``
    of seed 0: 13/32 right at ``d = 0``, 15/32 at ``d = 0.2``, 0/32 at ``d = 0.4``). The schedule ramps ``d`` linearly
    from ``difficulty`` to ``max_difficulty`` over the first ``ramp_examples`` questions
    (``ramp_examples=0``: constant ``difficulty``).

    Question ``i`` depends only on ``(seed, i)``: :meth:`sample` is deterministic given the seed
    and the position, whatever the batch sizes; :meth:`state_dict` holds the position for resume.
    :meth:`eval_set` draws from a disjoint random stream (``"eval"`` namespace), so eval questions
    are not the training stream replayed (at low difficulty the question space is small, so
    individual questions can still coincide).
    """

    def __init__(
        self,
        seed: int = 0,
        min_digits: int = 1,
        max_digits: int = 3,
        ops: Sequence[str] = ("+", "-", "*"),
        *,
        difficulty: float = 0.0,
        max_difficulty: float = 1.0,
        ramp_examples: int = 0,
        max_operands: int = 3,
    ) -> None:
        if not 1 <= min_digits <= max_digits:
            raise ValueError(f"need 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
        unknown = [op for op in ops if op not in _OP_FUNCS]
        if not ops or unknown:
            raise ValueError(f"ops must be a non-empty subset of {list(_OP_FUNCS)}, got {list(ops)}")
        if not (0.0 <= difficulty <= 1.0 and 0.0 <= max_difficulty <= 1.0):
            raise ValueError("difficulty and max_difficulty must be in [0, 1]")
        if ramp_examples < 0 or max_operands < 2:
            raise ValueError("ramp_examples must be >= 0 and max_operands >= 2")
        self.seed = seed
        self.min_digits = min_digits
        self.max_digits = max_digits
        self.ops = tuple(ops)
        self.difficulty = difficulty
        self.max_difficulty = max_difficulty
        self.ramp_examples = ramp_examples
        self.max_operands = max_operands
        self.position = 0

    def difficulty_at(self, position: int) -> float:
        """The scheduled difficulty of question number ``position``."""
        if self.ramp_examples == 0:
            return self.difficulty
        progress = min(1.0, position / self.ramp_examples)
        return self.difficulty + (self.max_difficulty - self.difficulty) * progress

    @property
    def current_difficulty(self) -> float:
        """The difficulty of the next training question (for logging)."""
        return self.difficulty_at(self.position)

    @property
    def num_levels(self) -> int:
        """``L``: the number of difficulty steps above level 0."""
        return (len(self.ops) - 1) + (self.max_digits - self.min_digits) + (self.max_operands - 2)

    def level_shape(self, difficulty: float) -> tuple[int, int, int]:
        """``(digits per operand, number of allowed ops, number of operands)`` at ``difficulty``."""
        d = min(max(difficulty, 0.0), 1.0)
        budget = int(d * self.num_levels + 0.5)  # round half up
        num_ops, digits, num_operands = 1, self.min_digits, 2
        while budget > 0:
            if num_ops < len(self.ops) and budget > 0:
                num_ops += 1
                budget -= 1
            if digits < self.max_digits and budget > 0:
                digits += 1
                budget -= 1
            if num_operands < self.max_operands and budget > 0:
                num_operands += 1
                budget -= 1
        return digits, num_ops, num_operands

    def make_example(self, rng: random.Random, difficulty: float, example_id: str) -> PromptExample:
        """One question at ``difficulty`` from ``rng``."""
        digits, num_ops, num_operands = self.level_shape(difficulty)
        low = 0 if digits == 1 else 10 ** (digits - 1)
        operands = [rng.randint(low, 10**digits - 1) for _ in range(num_operands)]
        ops = [rng.choice(self.ops[:num_ops]) for _ in range(num_operands - 1)]
        expression = " ".join([str(operands[0])] + [f"{op} {value}" for op, value in zip(ops, operands[1:])])
        answer = evaluate_expression(operands, ops)
        return PromptExample(prompt=f"What is {expression}?", ground_truth=str(answer), id=example_id)

    def example_at(self, position: int) -> PromptExample:
        """Training question number ``position`` (pure function of seed and position)."""
        rng = random.Random(f"arith:{self.seed}:{position}")
        return self.make_example(rng, self.difficulty_at(position), f"arith-{self.seed}-{position}")

    def sample(self, n: int) -> list[PromptExample]:
        """The next ``n`` training questions; advances the position."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        out = [self.example_at(self.position + i) for i in range(n)]
        self.position += n
        return out

    def eval_set(self, n: int, difficulty: float | None = None) -> list[PromptExample]:
        """``n`` fixed eval questions at ``difficulty`` (default: the starting difficulty), disjoint stream."""
        d = self.difficulty if difficulty is None else difficulty
        return [
            self.make_example(random.Random(f"arith-eval:{self.seed}:{i}"), d, f"arith-eval-{self.seed}-{i}")
            for i in range(n)
        ]

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("seed") != self.seed:
            raise ValueError(
                f"arithmetic task state was saved with seed {state.get('seed')}, this task has seed {self.seed}; "
                "resume with the same seed"
            )
        self.position = int(state["position"])
