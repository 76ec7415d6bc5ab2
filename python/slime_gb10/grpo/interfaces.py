"""The two seams of the trainer: a rollout engine and a policy backend.

The GRPO loop (``slime_gb10.grpo.trainer``) talks to nothing else. The portable
implementations are PyTorch + ``transformers`` (``engines/torch/engine.py``,
``backends/torch_backend.py``); on a GB10 the production ones are SGLang
(``engines/sglang_engine.py``) and Megatron-core + TransformerEngine
(``backends/megatron/``).

Weights travel from the backend to the engine as a :class:`slime_gb10.grpo.weight_sync.WeightStream`:
metadata first, then packed buckets, both built from ONE chunk plan (see that module).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

    from slime_gb10.grpo.weight_sync import WeightStream


def step_seed(seed: int, step: int) -> int:
    """A distinct, reproducible sampling seed per step (resume-safe: no hidden RNG state)."""
    return (seed * 1_000_003 + step * 7919 + 17) % (2**31 - 1)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters, mapped 1:1 onto every engine (SGLang uses the same names)."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no top-k
    stop: tuple[str, ...] = ()  # stop strings; the stop string is kept in the text
    # regular expressions: the completion ends where the first match ends (kept in the text)
    stop_regex: tuple[str, ...] = ()
    seed: int | None = None

    @classmethod
    def of_rollout(cls, rollout, seed: int | None = None) -> SamplingParams:
        """The sampling of a ``RolloutConfig`` (a run's ``rollout`` section)."""
        return cls(
            max_new_tokens=rollout.max_new_tokens,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            stop=tuple(rollout.stop),
            stop_regex=tuple(rollout.stop_regex),
            seed=seed,
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def truncates(self, vocab: int) -> bool:
        """Whether top-k or top-p removes tokens from a ``vocab``-token distribution (what
        ``engines.torch.sampling.filter_logits`` then does); the samplers dispatch on it."""
        return (self.top_k is not None and 0 < self.top_k < vocab) or self.top_p < 1.0


@dataclass
class Generation:
    """One sampled completion of one prompt."""

    prompt_ids: list[int]
    completion_ids: list[int]
    # log p(token) under the temperature-scaled distribution (softmax(logits / T), before
    # top-p/top-k truncation; SGLang's convention), one float per completion token.
    # The trainer computes its logprobs at the same temperature, so the two can be compared
    # for truncated importance sampling.
    completion_logprobs: list[float]
    text: str
    finish_reason: Literal["stop", "length"]

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


class RolloutEngine(abc.ABC):
    """Generates completions with per-token logprobs; receives new weights; can hand memory back."""

    #: Whether ``update_weights`` takes the NVFP4-quantized layers as their codes
    #: (``rollout.weights: nvfp4`` on the torch engine, which decodes from them)
    receives_nvfp4_codes: bool = False

    @abc.abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """One :class:`Generation` per prompt, in order. Callers repeat a prompt G times for a group."""

    @abc.abstractmethod
    def update_weights(self, stream: WeightStream) -> None:
        """Load weights in place from a chunk stream (``weight_sync.receive`` checks names)."""

    def sleep(self) -> None:  # noqa: B027 - optional hook
        """Release GPU memory (KV cache, weights if possible) before the training phase."""

    def wake(self) -> None:  # noqa: B027 - optional hook
        """Take the memory back after training."""

    def stats(self) -> dict[str, float]:
        """Numbers about the engine itself for the step's metrics row (``rollout/<key>``)."""
        return {}

    def health_check(self) -> None:  # noqa: B027 - optional hook
        """Raise ``RuntimeError`` with a clear message if the engine is dead."""

    def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Free everything; the engine is unusable afterwards."""


@dataclass
class TokenBatch:
    """Right-padded prompt+completion token ids for logprob/loss computation.

    ``input_ids[i]`` is prompt ``i`` followed by its completion, padded on the right.
    ``completion_mask[i, t]`` is 1 where ``input_ids[i, t]`` is a completion token whose
    logprob enters the loss (0 on the prompt and on padding). The logprob of token ``t``
    is predicted from position ``t - 1``.
    """

    input_ids: torch.Tensor  # [B, T] int64
    attention_mask: torch.Tensor  # [B, T] int64/bool
    completion_mask: torch.Tensor  # [B, T] float32


@dataclass
class TrainStepResult:
    """What ``PolicyBackend.train_step`` reports for one optimizer step."""

    loss: float
    grad_norm: float
    metrics: dict[str, float] = field(default_factory=dict)


class PolicyBackend(abc.ABC):
    """The model being trained: logprobs of given tokens, optimizer steps, weight export."""

    @abc.abstractmethod
    def logprobs(
        self, batch: TokenBatch, *, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token logprobs ``[B, T]`` (0 where ``completion_mask`` is 0) and optionally entropy ``[B, T]``.

        No gradient. Computed in vocabulary chunks (``slime_gb10.grpo.logprobs``): the full
        ``[tokens, vocab]`` logits are never materialised in FP32.
        """

    @abc.abstractmethod
    def train_step(
        self, microbatches: Sequence[tuple[TokenBatch, dict[str, torch.Tensor]]], loss_fn
    ) -> TrainStepResult:
        """Accumulate gradients over ``microbatches`` and take ONE optimizer step.

        ``loss_fn(logprobs, entropy, batch, extras) -> (loss, metrics)`` is called per
        microbatch with the differentiable logprobs/entropy; ``extras`` carries advantages,
        old/rollout/reference logprobs etc. ``loss_fn`` returns microbatch losses that sum to
        the minibatch loss (the trainer passes ``global_count`` to ``algo.grpo_loss``); the
        backend sums them, times ``extras.get("loss_scale", 1.0)``, clips gradients and steps
        the optimizer.
        """

    def reference_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """Logprobs ``[B, T]`` under the frozen reference policy (for the KL term; ``algo.beta > 0``).

        Backends that keep no reference model need not implement it; the trainer then refuses
        ``beta > 0`` with a clear error.
        """
        raise NotImplementedError(f"{type(self).__name__} keeps no reference model")

    def stats(self) -> dict[str, float]:
        """Numbers about the backend itself for the step's metrics row (``train/<key>``)."""
        return {}

    @abc.abstractmethod
    def export_weights(self, bucket_bytes: int, *, nvfp4_codes: bool = False) -> WeightStream:
        """The current weights, in Hugging Face names, as a chunk stream for ``RolloutEngine.update_weights``
        (``nvfp4_codes``: NVFP4 layers as their codes, for an engine that ``receives_nvfp4_codes``)."""

    @abc.abstractmethod
    def state_dict(self) -> dict:
        """Model + optimizer (+ scheduler) state for checkpoints."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict` (resume)."""

    @abc.abstractmethod
    def save_pretrained(self, directory: str, dtype: torch.dtype | None = None) -> None:
        """Write the policy as a Hugging Face model directory (config, tokenizer, safetensors in
        ``dtype``; None: bfloat16)."""
