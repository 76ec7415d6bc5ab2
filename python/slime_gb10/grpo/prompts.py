"""Prompts as training and evaluation both see them: the splits of ``data``, and their token ids.

- :func:`load_splits`: the training source (a list of examples, or the procedural arithmetic task)
  and the held-out examples, from a :class:`~slime_gb10.grpo.config.DataConfig`.
- :func:`format_prompt` / :func:`encode_prompt`: a question through the tokenizer's chat template
  (or a plain fallback), the user's text unable to inject control tokens.
- :class:`PromptSampler`: batches over epochs with a seeded shuffle (or drawn from a task), resumed
  exactly from its ``state_dict``.
- :class:`PromptEncoder`: a question -> the token ids of the chat-templated prompt (with the
  configured system prompt and instruction), whether that prompt opens a ``<think>``, and the
  prompts over ``rollout.max_prompt_tokens`` left out (logged) rather than failing mid-run.

The trainer and ``slime-gb10 eval`` use the same two, so an evaluation scores exactly the prompts
training sees.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from slime_gb10.grpo import arithmetic, data, rewards, rg_tasks

log = logging.getLogger("slime_gb10.grpo")


class PromptTooLongError(data.DatasetError):
    """A prompt has more tokens than ``rollout.max_prompt_tokens``."""


def load_splits(cfg: Any, seed: int) -> tuple[Any, list[data.PromptExample]]:
    """``(training source, held-out examples)`` of a ``DataConfig``.

    Held-out examples come from ``cfg.eval_path`` when set, else from a hub dataset's test split,
    else ``cfg.eval_size`` examples are held out of the training file (none when it is 0).
    ``rg:<task>[,…]`` (reasoning-gym) has its own fixed held-out set of ``cfg.eval_size`` questions.
    """
    if cfg.task == "arithmetic":
        task = arithmetic.ArithmeticTask(seed=seed, **cfg.arithmetic)
        return task, list(task.eval_set(cfg.eval_size)) if cfg.eval_size else []
    if rg_tasks.is_rg_spec(cfg.path):
        if cfg.eval_path:
            raise data.DatasetError(
                f"data.eval_path is set, but {cfg.path} holds its own fixed held-out set: unset data.eval_path"
            )
        return rg_tasks.load_splits(cfg.path, eval_size=cfg.eval_size, seed=seed, train_size=cfg.limit)
    columns = {"prompt_key": cfg.prompt_key, "answer_key": cfg.answer_key, "layout": cfg.layout}
    # a GSM8K answer with no number can never be rewarded by a reward that compares numbers only
    columns["numeric_answers"] = rewards.compares_numbers_only(cfg.reward_spec())
    examples = data.load_dataset_spec(cfg.path, "train", limit=cfg.limit, **columns)
    eval_spec = cfg.eval_path or (cfg.path if data.hub_dataset(cfg.path) is not None else None)
    if eval_spec is not None:
        return examples, data.load_dataset_spec(eval_spec, "test", **columns)
    if cfg.eval_size:
        return data.split_train_eval(examples, eval_size=cfg.eval_size, seed=seed)
    return examples, []


class PromptEncoder:
    """Token ids of the prompts of one run (cached per example), and the ``<think>`` flag of each."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        system_prompt: str | None,
        instruction: str | None,
        max_prompt_tokens: int,
    ):
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.instruction = instruction
        self.max_prompt_tokens = max_prompt_tokens
        self._ids: dict[str, list[int]] = {}
        self._opens_think: dict[str, bool] = {}

    @classmethod
    def from_config(cls, tokenizer: Any, config: Any) -> PromptEncoder:
        return cls(
            tokenizer,
            system_prompt=config.data.system_prompt,
            instruction=config.data.instruction,
            max_prompt_tokens=config.rollout.max_prompt_tokens,
        )

    @staticmethod
    def _key(example: Any) -> str:
        return f"{getattr(example, 'id', '')}\x00{example.prompt}"

    def ids(self, example: Any) -> list[int]:
        """The prompt's token ids; :class:`PromptTooLongError` over ``max_prompt_tokens``."""
        key = self._key(example)
        ids = self._ids.get(key)
        if ids is None:
            from slime_gb10.grpo.rewards import prompt_opens_think

            text, ids = encode_prompt(self.tokenizer, example.prompt, self.system_prompt, self.instruction)
            self._opens_think[key] = prompt_opens_think(text)
            if len(ids) > self.max_prompt_tokens:
                raise PromptTooLongError(
                    f"prompt '{getattr(example, 'id', '?')}' has {len(ids)} tokens, more than "
                    f"rollout.max_prompt_tokens={self.max_prompt_tokens}; raise the limit or filter the data"
                )
            self._ids[key] = ids
        return ids

    def opens_think(self, example: Any) -> bool:
        """Whether the formatted prompt ends in an open ``<think>`` (see ``rewards.as_scored``)."""
        self.ids(example)
        return self._opens_think[self._key(example)]

    def drop_long(self, examples: list, what: str) -> list:
        """``examples`` without those over ``max_prompt_tokens`` (how many were left out is logged)."""
        kept = []
        for example in examples:
            try:
                self.ids(example)
            except PromptTooLongError:
                continue
            kept.append(example)
        if len(kept) < len(examples):
            log.warning(
                "%d of %d %s prompts are longer than rollout.max_prompt_tokens=%d tokens and were left out",
                len(examples) - len(kept),
                len(examples),
                what,
                self.max_prompt_tokens,
            )
        return kept


# --- chat templates ----------------------------------------------------------------------------


def format_prompt(
    tokenizer: Any,
    question: str,
    system_prompt: str | None = None,
    instruction: str | None = data.DEFAULT_INSTRUCTION,
) -> str:
    """The text the model sees: the question (+ ``instruction``) through the tokenizer's chat template.

    With a chat template: ``tokenizer.apply_chat_template(messages, add_generation_prompt=True,
    tokenize=False)`` with an optional system message. Without one (base models, or
    ``tokenizer=None``): ``"{system}\\n\\nQuestion: {question}\\n{instruction}\\nAnswer:"``.
    """
    content = question.strip()
    if instruction:
        content = f"{content}\n{instruction}"
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        messages = []
        if system_prompt:
            messages.append({"role": "system", "content": system_prompt})
        messages.append({"role": "user", "content": content})
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prefix = f"{system_prompt}\n\n" if system_prompt else ""
    return f"{prefix}Question: {content}\nAnswer:"


# Stands in for the user's text while the chat template is rendered (Unicode private-use
# characters: no template, tokenizer or dataset produces them), so the template's own text and
# the user's text can be tokenized apart.
_USER_TEXT_MARKER = "\ue000slime-gb10-user-text\ue000"


def encode_prompt(
    tokenizer: Any,
    question: str,
    system_prompt: str | None = None,
    instruction: str | None = data.DEFAULT_INSTRUCTION,
) -> tuple[str, list[int]]:
    """``(text, token ids)`` of :func:`format_prompt`, with the user's text unable to inject control tokens.

    A dataset question that contains ``<|im_end|><|im_start|>system`` must stay plain text: the
    template's part of the prompt is tokenized as usual (its special tokens are real), the
    question with ``split_special_tokens=True`` (special-token strings become ordinary text
    tokens). Pieces meet at the template's own boundaries (a newline or a special token), where a
    BPE tokenizer splits anyway, so a clean question gets the same ids as tokenizing the whole text.
    """
    text = format_prompt(tokenizer, question, system_prompt, instruction)
    templated = format_prompt(tokenizer, _USER_TEXT_MARKER, system_prompt, instruction)
    pieces = templated.split(_USER_TEXT_MARKER)
    if len(pieces) != 2:  # a template that changes or repeats the user text: fall back, refuse tokens
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        special = set(getattr(tokenizer, "all_special_ids", []))
        plain = tokenizer(question.strip(), add_special_tokens=False)["input_ids"]
        if special & set(plain):
            raise data.DatasetError(
                "a prompt contains special-token text (e.g. '<|im_end|>') and this chat template does not "
                "keep the user text apart; remove it from the data"
            )
        return text, ids
    before, after = pieces

    def encode(part: str, **kwargs) -> list[int]:
        return tokenizer(part, add_special_tokens=False, **kwargs)["input_ids"] if part else []

    ids = encode(before) + encode(question.strip(), split_special_tokens=True) + encode(after)
    return text, ids


class PromptSampler:
    """Batches of prompts, forever: epochs over a list with a seeded shuffle, or draws from a task.

    For a list, epoch ``e`` visits the examples in the order of ``random.Random(f"{seed}:{e}")``'s
    shuffle; a batch that crosses the end of an epoch continues into the next one. The state
    (epoch, position in the epoch) restores the exact stream, mid-epoch included.
    ``order="easy_first"``: the first epoch goes from the lowest ``difficulty`` up (ties in the
    seeded shuffle's order), a curriculum measured on the training data only; later epochs shuffle.
    """

    def __init__(
        self,
        examples_or_task: Sequence[data.PromptExample] | Any,  # or a task (arithmetic.ArithmeticTask)
        batch_size: int,
        seed: int = 0,
        order: Literal["shuffle", "easy_first"] = "shuffle",
    ):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.batch_size = batch_size
        self.seed = seed
        self.task: Any = None  # a task that generates question i by position (example_at)
        self.examples: list[data.PromptExample] = []
        if hasattr(examples_or_task, "example_at"):  # a task: its question i by position
            self.task = examples_or_task
        else:
            self.examples = list(examples_or_task)
            if not self.examples:
                raise ValueError("PromptSampler needs at least one example")
        if order not in ("shuffle", "easy_first"):
            raise data.DatasetError(f"unknown data order {order!r}; choose shuffle or easy_first")
        if order == "easy_first" and any(e.difficulty is None for e in self.examples):
            raise data.DatasetError(
                "data.order=easy_first needs a difficulty for every training example (the GSM8K layout "
                "measures it: the reference solution's length); this dataset has none"
            )
        self.order = order
        self.epoch = 0
        self.index = 0  # position inside the current epoch's order
        self._order: list[int] | None = None

    def _epoch_order(self) -> list[int]:
        if self._order is None:
            order = list(range(len(self.examples)))
            random.Random(f"{self.seed}:{self.epoch}").shuffle(order)
            if self.order == "easy_first" and self.epoch == 0:
                order.sort(key=lambda i: self.examples[i].difficulty)  # stable: ties keep the shuffle
            self._order = order
        return self._order

    def next_batch(self) -> list[data.PromptExample]:
        """The next ``batch_size`` prompts."""
        if self.task is not None:
            return self.task.sample(self.batch_size)
        batch = []
        while len(batch) < self.batch_size:
            order = self._epoch_order()
            take = min(self.batch_size - len(batch), len(order) - self.index)
            batch.extend(self.examples[i] for i in order[self.index : self.index + take])
            self.index += take
            if self.index == len(order):
                self.epoch += 1
                self.index = 0
                self._order = None
        return batch

    def __iter__(self) -> Iterator[list[data.PromptExample]]:
        return self

    def __next__(self) -> list[data.PromptExample]:
        return self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        if self.task is not None:
            return {"kind": "task", "task": self.task.state_dict()}
        return {
            "kind": "examples",
            "seed": self.seed,
            "epoch": self.epoch,
            "index": self.index,
            "num_examples": len(self.examples),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        kind = "task" if self.task is not None else "examples"
        if state.get("kind") != kind:
            raise ValueError(
                f"sampler state is for {state.get('kind')!r} data, this sampler draws from {kind!r}"
            )
        if self.task is not None:
            self.task.load_state_dict(state["task"])
            return
        if state["num_examples"] != len(self.examples) or state["seed"] != self.seed:
            raise ValueError(
                f"sampler state was saved for {state['num_examples']} examples with seed {state['seed']}, "
                f"this sampler has {len(self.examples)} with seed {self.seed}; resume with the same data and seed"
            )
        self.epoch = int(state["epoch"])
        self.index = int(state["index"])
        self._order = None


def run_splits(config: Any, dist: Any) -> tuple[Any, list[data.PromptExample]]:
    """A training run's ``(training source, held-out examples)``: :func:`load_splits` of
    ``config.data``, the same on every rank of ``dist`` (or all refuse)."""
    cfg = config.data
    source, eval_examples = dist.agreed_data(cfg, load_splits(cfg, config.train.seed))
    if isinstance(source, list) and not source:
        raise data.DatasetError(
            f"no training prompts left in '{cfg.path}' after holding out {cfg.eval_size} for eval"
        )
    return source, eval_examples


def run_sampler(
    config: Any, prompts: PromptEncoder, source: Any, eval_examples: list
) -> tuple[PromptSampler, list[data.PromptExample]]:
    """The prompt sampler of a run's training source and its held-out examples, both less the
    prompts over ``rollout.max_prompt_tokens``."""
    if isinstance(source, list):
        source = prompts.drop_long(source, "training")
        if not source:
            raise data.DatasetError(
                f"every training prompt is longer than rollout.max_prompt_tokens="
                f"{config.rollout.max_prompt_tokens}; raise it"
            )
    sampler = PromptSampler(
        source, batch_size=config.rollout.prompts_per_step, seed=config.train.seed, order=config.data.order
    )
    return sampler, prompts.drop_long(eval_examples, "eval")


def longest_prompt(prompts, train_source, eval_examples) -> int | None:
    """Tokens of the longest prompt a run will decode (at most ``rollout.max_prompt_tokens``: longer
    ones are left out): over the training examples when they are a list, else over the held-out
    ones (a procedural task's questions are alike); None when there are none to look at.
    ``prompts``: the run's :class:`PromptEncoder` (which caches the ids, so the sampler's own pass
    over them costs nothing more); the memory plan sizes its caches with it."""
    examples = list(eval_examples or [])
    if isinstance(train_source, list):
        examples = train_source + examples
    longest = None
    for example in examples:
        try:
            length = len(prompts.ids(example))
        except PromptTooLongError:
            return prompts.max_prompt_tokens
        longest = length if longest is None else max(longest, length)
    return longest
