"""A memory plan before the first allocation: the run's estimated peak, by part, against what is free.

On a DGX Spark (GB10) CPU and GPU share 128 GB of LPDDR5x; NVML reports no memory there
(``nvidia-smi``: "Not Supported") and running out can freeze the whole host
(open-gpu-kernel-modules #1358, REFERENCE.md). So before any weights load, :func:`check` reads the
model's Hugging Face config, estimates the run's peak (:func:`estimate`) and refuses a run that
would not fit (:class:`MemoryPlanError`, one line naming the settings to change), or logs the plan.

The estimate mirrors what the PyTorch pair allocates (``backends/torch_backend.py``, ``engines/torch/engine.py``), per rank::

    peak = resident + max(training step, rollout)
    resident      = trainer weights + AdamW states (+ reference model)
                    + rollout weights + static KV caches + fixed overhead
    training step = gradients + activations + BF16 weight casts + logprob head
    optimizer step = gradients + torch AdamW's temporaries (Megatron without TE or Apex)
    rollout       = prefill (+ the KV cache of the dynamic decode path, freed after each call)

Gradients are freed at each train step's start, so they do not coexist with the rollout; the static
decode path keeps one KV cache per (batch, cache length). SGLang sizes its own pool and checks it
itself: the plan counts its weights and one step's KV cache. Sequences count at their longest (the
data's longest prompt + ``max_new_tokens``): activations and caches are upper bounds.

The budget is what is free (:func:`available`) or ``train.memory_budget_gib`` (0: no check). Over
:data:`SAFETY_MARGIN` of it a run is refused on host memory (a CPU, a GB10) and warned about on a
discrete GPU, where CUDA's out-of-memory error ends a run cleanly; there too it is refused when the
tensors of known size alone (:data:`EXACT_PARTS`, and the gradients) exceed the
budget, which no estimate's slack can save (a 7B model's training state on one 80 GB GPU).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from slime_gb10.grpo.config import ConfigError
from slime_gb10.grpo.evaluate import eval_rows
from slime_gb10.platform.host_memory import available, uses_host_memory
from slime_gb10.utils.errors import first_line

log = logging.getLogger(__name__)

GIB = 2**30
#: A run is refused when its estimate exceeds this share of the budget.
SAFETY_MARGIN = 0.9
#: CUDA context, cuBLAS/cuDNN workspaces, CUDA-graph pools and allocator slack on a GPU.
CUDA_OVERHEAD_BYTES = GIB // 2
BUDGET_KEY = "train.memory_budget_gib"
#: The torch engine's static cache is rounded up to this many slots (``_generate_batch_static``).
CACHE_ROUND = 64
#: The chunked logprobs' block sizes (``logprobs.py``, ``torch_backend.token_logprobs``).
TOKEN_CHUNK = EAGER_HEAD_CHUNK = 4096
COMPILED_HEAD_CHUNK = 49152
#: The plan's parts that are tensors of a known size, not estimates: weights, gradients and moments
#: (held together in a training step), the reference and the engine's copy.
EXACT_PARTS = (
    "trainer weights", "AdamW states", "reference model", "rollout weights",
    "NVFP4 sync codes", "NVFP4 engine codes",
)  # fmt: skip


class MemoryPlanError(ConfigError):
    """The run's estimated peak memory exceeds the budget; the message names the settings to change."""


# ------------------------------------------------------------------------- the model's shapes
@dataclass(frozen=True)
class Shapes:
    """What the estimate needs from a Hugging Face decoder config (read before any weights load)."""

    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool = False  # biases on q/k/v (Qwen2 always; Llama/Qwen3 with attention_bias)
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3's RMSNorm over each head's q and k
    sliding_window: bool = False  # on: the torch engine decodes through the HF forward (dynamic cache)

    @classmethod
    def from_hf(cls, config: Any) -> Shapes:
        """From a ``transformers`` config (a multimodal one's text part); AttributeError if a size is missing."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        hidden, heads = int(text.hidden_size), int(text.num_attention_heads)
        kind, bias = str(getattr(text, "model_type", "")), bool(getattr(text, "attention_bias", False))
        window = getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True)
        return cls(
            kind, hidden, int(text.num_hidden_layers), heads,
            int(getattr(text, "num_key_value_heads", None) or heads),
            int(getattr(text, "head_dim", None) or hidden // heads),
            int(text.intermediate_size), int(text.vocab_size),
            tied=bool(getattr(text, "tie_word_embeddings", getattr(config, "tie_word_embeddings", True))),
            qkv_bias=bias or kind == "qwen2", o_bias=bias and kind != "qwen2",
            mlp_bias=bool(getattr(text, "mlp_bias", False)), qk_norm=kind == "qwen3", sliding_window=bool(window),
        )  # fmt: skip

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


def parameter_count(s: Shapes) -> int:
    """Parameters of a Llama-family decoder (Llama, Qwen2, Qwen3, Mistral; others approximately)::

    embedding     V h
    per layer     h q + 2 h kv + q h                (q, k, v, o projections; q = heads x head_dim,
                + [q + 2 kv] + [h]                   kv = kv_heads x head_dim; biases if present)
                + [2 head_dim]                       (Qwen3's q/k norms)
                + 3 h i + [2 i + h]                  (gate, up, down; MLP biases if present)
                + 2 h                                (the two RMSNorms)
    final norm    h
    LM head       V h, unless tied to the embedding
    """
    h, q, kv, i = s.hidden, s.q_dim, s.kv_dim, s.intermediate
    layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
    layer += (q + 2 * kv) * s.qkv_bias + h * s.o_bias + (2 * i + h) * s.mlp_bias + 2 * s.head_dim * s.qk_norm
    return s.vocab * h * (1 if s.tied else 2) + s.layers * layer + h


# ------------------------------------------------------------------------- the parts (bytes)
def trainer_weight_bytes(params: int, trainer: str = "torch", zero1: int = 1) -> int:
    """torch: FP32 master weights, ``4 N``; megatron: BF16 weights + FP32 main weights over zero1 ranks."""
    return 2 * params + 4 * params // zero1 if trainer == "megatron" else 4 * params


def gradient_bytes(params: int) -> int:
    """FP32 gradients, ``4 N`` (torch: ``.grad`` of the FP32 weights; megatron: its FP32 grad buffer)."""
    return 4 * params


def adamw_bytes(params: int) -> int:
    """AdamW's two FP32 moments, ``8 N``."""
    return 8 * params


def reference_bytes(params: int, trainer: str = "torch") -> int:
    """The frozen reference policy (``algo.beta > 0`` or ``algo.ref_kl_metric``): an FP32 copy, ``4 N``
    (torch); a BF16 model, ``2 N`` (megatron)."""
    return (2 if trainer == "megatron" else 4) * params


def rollout_weight_bytes(params: int, value_bytes: int) -> int:
    """The rollout engine's own copy of the weights, ``N x value_bytes`` (BF16 on a GPU: 2; FP32 on a CPU: 4)."""
    return params * value_bytes


def nvfp4_bytes(s: Shapes, sixteenths: int) -> int:
    """``rollout.weights: nvfp4``: ``sixteenths``/16 byte per weight of the decoder's linear layers,
    ``layers x (2 h (heads + kv_heads) head_dim + 3 h i)``: 9 for the last sync's codes and block
    scales, kept to count what the next sync changes (``quantized.CodeChanges``); 10 for the torch
    engine's codes, block scales and the fused kernel's scale codes, beside its BF16 copy."""
    per_layer = 2 * s.hidden * (s.heads + s.kv_heads) * s.head_dim + 3 * s.hidden * s.intermediate
    return s.layers * per_layer * sixteenths // 16


def kv_cache_bytes(s: Shapes, rows: int, tokens: int, value_bytes: int) -> int:
    """``2 (K and V) x layers x kv_heads x head_dim x value_bytes x tokens x rows``."""
    return 2 * s.layers * s.kv_dim * value_bytes * tokens * rows


def static_cache_len(prompt_tokens: int, new_tokens: int) -> int:
    """The torch engine's static cache length: ``prompt + new`` rounded up to a multiple of 64."""
    return -(-(prompt_tokens + new_tokens) // CACHE_ROUND) * CACHE_ROUND


def call_batches(rows: int, batch_size: int | None) -> list[int]:
    """The batches the torch engine decodes ``rows`` in: ``generation_batch_size`` each, then the rest."""
    if not batch_size or rows <= batch_size:
        return [rows]
    full, rest = divmod(rows, batch_size)
    return [batch_size] * full + ([rest] if rest else [])


def activation_bytes_per_token(s: Shapes, autocast: bool) -> int:
    """Bytes one decoder layer keeps for the backward, per token (a rough bound).

    Counted from what a Llama layer saves (q = heads x head_dim, kv = kv_heads x head_dim,
    i = intermediate): the two RMSNorms run in FP32 (input and normalised input, ``16 h``); under
    BF16 autocast each projection saves its own BF16 cast of its input (``10 h``), attention its
    rotated q, output and o-projection input (``6 q``) and rotated k and v (``4 kv``), the MLP gate,
    up, SiLU and product (``8 i``); Qwen3's q/k norms add ``6 (q + kv)``. In FP32 (no autocast):
    ``24 h + 12 q + 8 kv + 16 i`` (+ ``8 (q + kv)``). Saved-tensor bytes measured on a CPU
    (transformers 5.24, SDPA) for SmolLM2-135M, Qwen2.5-0.5B and Qwen3-0.6B shapes came out 3-13%
    below these numbers. These are the plain layers'; the compiled layers (``train.compile``, on by
    default on a GPU) keep less (BENCHMARKS.md, shape B on an H100: peak 45.4 GiB compiled, 64.6 GiB
    plain), so on a GPU the activations are an upper bound by up to about a third.
    """
    h, q, kv, i = s.hidden, s.q_dim, s.kv_dim, s.intermediate
    if autocast:
        return 26 * h + 6 * q + 4 * kv + 8 * i + 6 * (q + kv) * s.qk_norm
    return 24 * h + 12 * q + 8 * kv + 16 * i + 8 * (q + kv) * s.qk_norm


def activation_bytes(s: Shapes, rows: int, seq_len: int, *, autocast: bool, checkpointing: bool) -> int:
    """Activations of one training micro-batch of ``rows x seq_len`` tokens ``T``::

        without checkpointing   T (a (layers + 1) + 12 h)
        with checkpointing      T (4 h layers + 2 a + 12 h)

    with ``a`` = :func:`activation_bytes_per_token`; the extra layer is the backward's gradients of
    the layer it is in (and, checkpointed, that layer's recomputed activations); ``12 h``: the final
    norm's FP32 input and output."""
    tokens = rows * seq_len
    a = activation_bytes_per_token(s, autocast)
    outside = 12 * s.hidden
    if checkpointing:
        return tokens * (4 * s.hidden * s.layers + 2 * a + outside)
    return tokens * (a * (s.layers + 1) + outside)


def weight_cast_bytes(s: Shapes, params: int, autocast: bool) -> int:
    """BF16 copies of the FP32 decoder weights that autocast makes (and keeps for the backward) in a
    training forward: ``2 (N - embedding - untied LM head)``; 0 without autocast."""
    if not autocast:
        return 0
    return 2 * (params - s.vocab * s.hidden * (1 if s.tied else 2))


def logprob_head_bytes(
    s: Shapes, completion_tokens: int, *, autocast: bool, compiled: bool, weight_bytes: int = 4
) -> int:
    """The chunked LM head of the logprobs (``logprobs.py``: the ``[tokens, vocab]`` logits never exist)::

        block     min(n, 4096) x min(V, chunk) x (24 B eager, 6 B compiled)   one block's logits and
                                                                              their FP32 temporaries
        head      V h x 2 (its BF16 cast under autocast) + V h x weight_bytes (its gradient)
        rows      n h x (4 + 4 [+ 2])     the selected hidden rows, their FP32 gradient (and BF16 cast)

    with ``n`` the completion tokens of the micro-batch and ``chunk`` 4096 (eager) or 49,152 (the
    compiled head)."""
    n = completion_tokens
    chunk = COMPILED_HEAD_CHUNK if compiled else EAGER_HEAD_CHUNK
    block = min(n, TOKEN_CHUNK) * min(s.vocab, chunk) * (6 if compiled else 24)
    head = s.vocab * s.hidden * ((2 if autocast else 0) + weight_bytes)
    rows = n * s.hidden * (8 + (2 if autocast else 0))
    return block + head + rows


def prefill_bytes(s: Shapes, rows: int, width: int, value_bytes: int) -> int:
    """The live tensors of one layer of the rollout prefill (inference mode frees each layer's):
    ``rows x width x value_bytes x (4 h + 3 i)`` (residual, norm, attention output; gate, up, product)."""
    return rows * width * value_bytes * (4 * s.hidden + 3 * s.intermediate)


# ------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Plan:
    """The estimated peak of a run, by part (bytes); ``phase``: which phase the peak is in."""

    parts: dict[str, int]
    params: int
    phase: str
    basis: str = ""
    other_phase: dict[str, int] = field(default_factory=dict)
    #: the bytes of :data:`EXACT_PARTS` that coexist at the worst moment (:func:`estimate`)
    exact: int = 0
    trainer: str = "torch"  # the policy backend planned for

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def biggest(self, count: int = 3) -> list[tuple[str, int]]:
        return sorted(((k, v) for k, v in self.parts.items() if v > 0), key=lambda kv: -kv[1])[:count]

    def describe(self) -> str:
        """``trainer weights 0.50 GiB, gradients 0.50 GiB, ...`` (parts of at least 0.01 GiB)."""
        shown = [f"{name} {gib(value)}" for name, value in self.parts.items() if value >= GIB / 100]
        return ", ".join(shown) or "nothing over 0.01 GiB"


def gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def estimate(
    config,
    model_config,
    *,
    device: torch.device | str = "cuda",
    rollout: str = "torch",
    trainer: str = "torch",
    world_size: int = 1,
    prompt_tokens: int | None = None,
    host_memory: bool = False,
) -> Plan:
    """The peak memory of one rank of the run ``config`` (a :class:`~slime_gb10.grpo.config.GRPOConfig`)
    of the model ``model_config`` (its ``transformers`` config) on ``device`` with the engine
    ``rollout`` and the backend ``trainer`` (resolved names, not ``auto``); ``host_memory``: the
    device's memory is the host's (a GB10), which a checkpoint's host copies also take. ``prompt_tokens``: the
    longest prompt of the data (:func:`~slime_gb10.grpo.prompts.longest_prompt`); unset:
    ``rollout.max_prompt_tokens``."""
    s = model_config if isinstance(model_config, Shapes) else Shapes.from_hf(model_config)
    gpu = torch.device(device).type == "cuda"
    roll, train, algo = config.rollout, config.train, config.algo
    bf16 = gpu and config.model.precision != "float32"
    n = parameter_count(s)

    # --- the rollout engine
    engine_bytes = 2 if (bf16 or rollout == "sglang") else 4
    prompts = max(1, roll.prompts_per_step // max(1, world_size))
    rows = prompts * roll.group_size
    width = min(prompt_tokens or roll.max_prompt_tokens, roll.max_prompt_tokens)
    eval_new = config.eval.max_new_tokens or roll.max_new_tokens
    from slime_gb10.grpo.engines.torch.static_decoder import STATIC_ARCHITECTURES

    # as TorchRolloutEngine.__init__: "auto" is the static cache on a GPU where StaticDecoder runs
    static_ok = s.model_type in STATIC_ARCHITECTURES and not s.sliding_window
    static = rollout == "torch" and static_ok and roll.decode != "dynamic" and (gpu or roll.decode != "auto")
    static_kv = dynamic_kv = prefill = 0
    calls = [(r, roll.max_new_tokens) for r in call_batches(rows, roll.generation_batch_size)]
    calls += [(r, eval_new) for e in eval_rows(config) for r in call_batches(e, roll.generation_batch_size)]
    if rollout == "sglang":
        static_kv = kv_cache_bytes(s, rows, width + roll.max_new_tokens, engine_bytes)
    elif static:
        caches = {(r, static_cache_len(width, new)) for r, new in calls}  # the engine's _decoders
        static_kv = sum(kv_cache_bytes(s, r, length, engine_bytes) for r, length in caches)
        # a rollout's distinct prompts prefill once, in a cache of their own (_prefill); an
        # evaluation's (all distinct) in the decoding cache itself
        greedy = max(
            [
                prompts,
                *(r for e in eval_rows(config)[:1] for r in call_batches(e, roll.generation_batch_size)),
            ]
        )
        prefill = kv_cache_bytes(s, prompts, width, engine_bytes) + prefill_bytes(
            s, greedy, width, engine_bytes
        )
    else:
        dynamic_kv = max(kv_cache_bytes(s, r, width + new, engine_bytes) for r, new in calls)
        prefill = max(prefill_bytes(s, r, width, engine_bytes) for r, _ in calls)

    # --- the policy backend
    autocast = bf16 and trainer == "torch"
    checkpointing = (
        config.megatron.recompute_granularity == "full"
        if trainer == "megatron"
        else config.model.gradient_checkpointing
    )
    compiled = train.compile if train.compile is not None else gpu and not config.model.gradient_checkpointing
    tp = config.megatron.tensor_parallel_size if trainer == "megatron" else 1
    per_minibatch = max(1, math.ceil(rows * tp / train.minibatches))  # a TP group trains on its ranks' rows
    mb_rows = min(train.micro_batch_size, per_minibatch)
    seq = width + roll.max_new_tokens
    with_reference = algo.beta > 0 or algo.ref_kl_metric

    # train.sharding=fsdp: 1/world of the FP32 weights, gradients and moments per rank, plus, gathered, the
    # outer group (embeddings, head, norm: the root, unsharded from its forward to the end of the backward,
    # and its gradient, reduce-scattered only then) and ~3 layers (computing, prefetched, unsharded gradient)
    # (the reference, when there is one, is sharded alike); gathered in BF16 under autocast (no NVFP4
    # QAT: backends/fsdp.py), so autocast makes no BF16 copies of them
    shards = world_size if train.sharding == "fsdp" and trainer == "torch" and world_size > 1 else 1
    outer = s.vocab * s.hidden * (1 if s.tied else 2) + s.hidden
    bf16_gathers = shards > 1 and autocast and config.train.quantization != "nvfp4-qat"
    gathered = (
        (2 if bf16_gathers else 4) * (2 * outer + 3 * (n - outer) // max(1, s.layers)) if shards > 1 else 0
    )
    zero1 = world_size if trainer == "megatron" and config.megatron.use_distributed_optimizer else 1  # ZeRO-1
    # Megatron tensor parallelism: a rank holds 1/tp of the weights, gradients and moments (norms whole, a
    # rounding) and of the heads', MLP's and vocabulary's activations (r: its shapes; no sequence parallelism)
    r = replace(s, **{k: getattr(s, k) // tp for k in ("heads", "kv_heads", "intermediate", "vocab")})
    resident = {
        "trainer weights": trainer_weight_bytes(n, trainer, zero1) // shards // tp,
        "AdamW states": adamw_bytes(n) // shards // zero1 // tp,
        "FSDP gathered weights": gathered,
        "reference model": reference_bytes(n, trainer) // shards // tp if with_reference else 0,
        "rollout weights": rollout_weight_bytes(n, engine_bytes),
        "NVFP4 sync codes": nvfp4_bytes(s, 9) if roll.weights == "nvfp4" else 0,
        "NVFP4 engine codes": nvfp4_bytes(s, 10) if roll.weights == "nvfp4" and static else 0,
        "KV cache": static_kv,
        "overhead": CUDA_OVERHEAD_BYTES if gpu else 0,
    }
    training = {
        "gradients": gradient_bytes(n) // shards // tp,
        "activations": activation_bytes(
            r, mb_rows, seq, autocast=autocast or (trainer == "megatron" and gpu), checkpointing=checkpointing
        ),
        "BF16 weight casts": 0 if bf16_gathers else weight_cast_bytes(s, n, autocast),
        "logprob head": logprob_head_bytes(
            r,
            mb_rows * roll.max_new_tokens,
            autocast=autocast,
            compiled=bool(compiled) and trainer == "torch",
            weight_bytes=2 if trainer == "megatron" else 4,
        ),
    }
    rolling = {"prefill": prefill, "KV cache (decoding)": dynamic_kv}
    # megatron.use_distributed_optimizer: a checkpoint gathers the FP32 main weights and moments onto
    # rank 0's host memory (12 N, whatever the world size) beside the gradient buffer; on a GB10 that
    # memory is the GPU's
    gather = {"gradients": gradient_bytes(n), "checkpoint gather (rank 0)": 12 * n}
    # tensor parallelism: whole tensors gathered onto rank 0 and written a file at a time (tp_checkpoint)
    whole = {
        "gradients": gradient_bytes(n) // tp,
        "checkpoint gather (rank 0)": min(14 * n, _streamed(s)),
    }
    saving = (gather if zero1 > 1 else whole if tp > 1 else {}) if host_memory else {}
    # Megatron without TransformerEngine or Apex steps torch's AdamW (foreach), whose update divides by a
    # temporary square root of every second moment it steps: 4 bytes each, once the activations are gone
    # (7B at TP=2 on H200s peaked 6.56 GiB above the training step's plan; this adds 6.57). Ours is fused
    stepping = {"gradients": training["gradients"], "AdamW step temporaries": 4 * n // zero1 // tp}
    stepping = stepping if trainer == "megatron" and gpu and megatron_steps_torch_adamw() else {}
    phases = [("training step", training), ("rollout", rolling), ("checkpoint save", saving)]
    phases.append(("optimizer step", stepping))
    (phase, peak), (_, other) = sorted(phases, key=lambda p: -sum(p[1].values()))[:2]
    parts = {k: v for k, v in {**resident, **peak}.items() if v}
    decode = "SGLang" if rollout == "sglang" else ("static-cache" if static else "dynamic-cache")
    basis = (
        f"{n / 1e6:.0f}M parameters; {max(call_batches(rows, roll.generation_batch_size))} rollouts x "
        f"{seq} tokens decoded at once ({decode}); "
        f"training micro-batch {mb_rows} x {seq} tokens ({trainer} backend"
        f"{', gradient checkpointing' if checkpointing else ''})"
    )
    # the tensors of known size that coexist: in a training step (gradients; SGLang's memory saver has
    # released its weights then) or in a rollout, whichever holds more
    known = sum(v for k, v in resident.items() if k in EXACT_PARTS)
    released = resident["rollout weights"] if rollout == "sglang" and config.sglang.enable_memory_saver else 0
    exact = max(known + training["gradients"] - released, known + sum(saving.values()))
    return Plan(
        parts=parts, params=n, phase=phase, basis=basis, other_phase=other, exact=exact, trainer=trainer
    )


def _streamed(s: Shapes) -> int:
    from slime_gb10.grpo.backends.megatron.tp_checkpoint import host_bytes_while_writing

    return host_bytes_while_writing(s.hidden, s.vocab, s.intermediate)


def megatron_steps_torch_adamw() -> bool:
    """Whether Megatron-core falls back to torch's AdamW (neither TransformerEngine's FusedAdam nor
    Apex's imports): its own flag, read by importing its optimizer module as the backend will."""
    try:
        from megatron.core import optimizer
    except Exception:  # no Megatron to run: nothing to plan for it
        return False
    return bool(getattr(optimizer, "USING_PYTORCH_OPTIMIZER", False))


# ------------------------------------------------------------------------- the check
def refusal(
    config, plan: Plan, budget: int, source: str, where: str, ranks: int = 1, world_size: int = 1
) -> str:
    """The one-line message of a run that does not fit (``ranks`` of it sharing the budget; one of
    ``world_size`` ranks)."""
    roll = config.rollout
    biggest = ", ".join(f"{name} {gib(value)}" for name, value in plan.biggest())
    fixes = (
        f"train.micro_batch_size ({config.train.micro_batch_size}), rollout.prompts_per_step x "
        f"rollout.group_size ({roll.prompts_per_step} x {roll.group_size} decoded at once; or set "
        f"rollout.generation_batch_size), rollout.max_new_tokens ({roll.max_new_tokens})"
    )
    if not config.model.gradient_checkpointing:
        fixes += ", or set model.gradient_checkpointing=true"
    state = sum(plan.parts.get(k, 0) for k in ("trainer weights", "AdamW states", "gradients"))
    if "checkpoint gather (rank 0)" in plan.parts:
        fixes += ("; or train with --trainer torch --set train.sharding=fsdp, whose checkpoints every rank "
                  "writes in shards (Megatron gathers 12 to 14 bytes a parameter onto rank 0 to save)")  # fmt: skip
    mostly_state = state * 2 >= plan.total
    megatron = config.megatron
    if mostly_state and plan.trainer == "megatron" and megatron.tensor_parallel_size == 1:
        fixes += ("; or split every layer over N GPUs: torchrun --nproc-per-node N ... --set "
                  "megatron.tensor_parallel_size=N")  # fmt: skip
        if not megatron.use_distributed_optimizer:
            fixes += (
                "; or shard the optimizer state: torchrun ... --set megatron.use_distributed_optimizer=true"
            )
    if mostly_state and plan.trainer == "torch":  # mostly training state, and FSDP can shard it
        if "FSDP gathered weights" in plan.parts:
            fixes += f"; or shard the training state ({gib(state)} per rank) over more than {world_size} GPUs"
        else:
            fixes += (f"; or shard the training state ({gib(state)}) over N GPUs: torchrun --nproc-per-node N (two "
                      "Sparks: --nnodes 2, README) -m slime_gb10 train ... --set train.sharding=fsdp")  # fmt: skip
    need = gib(plan.total * ranks) + (f" ({ranks} ranks x {gib(plan.total)})" if ranks > 1 else "")
    has = (
        f"the budget is {gib(budget)} ({source})"
        if source.startswith(BUDGET_KEY)
        else f"{where} has {gib(budget)} free ({source})"
    )
    if plan.exact * ranks > budget:  # fails whatever the estimate's slack
        need += f", of which weights, gradients and optimizer states alone are {gib(plan.exact * ranks)}"
    return (
        f"memory plan: this run needs about {need} at its peak (the {plan.phase}) but {has} "
        f"and runs are refused above {SAFETY_MARGIN:.0%} of that; biggest parts: "
        f"{biggest}. Lower {fixes}. {BUDGET_KEY}=N sets the budget to N GiB "
        "(0: no check)"
    )


def read_model_config(config):
    """The model's ``transformers`` config (no weights), or None (logged) where it cannot be read."""
    from transformers import AutoConfig

    from slime_gb10.grpo.models import resolve_model_path

    path = resolve_model_path(config.model.name_or_path)
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=config.model.trust_remote_code)
    except Exception as exc:  # a hub id offline, an unknown architecture: loading will say what is wrong
        first = first_line(exc)
        log.warning("memory plan: skipped, the config of %s cannot be read (%s)", path, first)
        return None


def check(
    config, *, world_size: int = 1, prompt_tokens: int | None = None, ranks_per_host: int = 1
) -> Plan | None:
    """Refuse (:class:`MemoryPlanError`) a run whose estimated peak exceeds ``SAFETY_MARGIN`` of the
    budget, else log the plan (one INFO line). Called by the trainer before any weights load; returns
    the plan (None when the check is off or the model's config cannot be read). On host memory (a
    CPU, a GB10) the ``ranks_per_host`` ranks of a torchrun job share the budget."""
    budget_gib = config.train.memory_budget_gib
    if budget_gib == 0:
        log.info("memory plan: not checked (%s=0)", BUDGET_KEY)
        return None
    from slime_gb10.grpo import registry

    device = registry.resolve_device(config.backends.device)
    choice = registry.resolve(config.backends.rollout, config.backends.trainer, device)
    model_config = read_model_config(config)
    if model_config is None:
        return None
    host = uses_host_memory(device)
    try:
        plan = estimate(config, model_config, device=device, rollout=choice.rollout, trainer=choice.trainer,
                        world_size=world_size, prompt_tokens=prompt_tokens, host_memory=host)  # fmt: skip
    except (AttributeError, TypeError, ValueError) as exc:  # a config without the usual sizes
        log.warning("memory plan: skipped, cannot estimate this model (%s: %s)", type(exc).__name__, exc)
        return None
    where = "this machine" if device.type == "cpu" else str(device)
    if budget_gib is None:
        budget, source = available(device)
    else:
        budget, source = int(budget_gib * GIB), f"{BUDGET_KEY}={budget_gib:g}"
    if budget is None:
        log.info("memory plan: about %s (%s); not checked: %s", gib(plan.total), plan.describe(), source)
        return plan
    ranks = ranks_per_host if ranks_per_host > 1 and host else 1
    if plan.total * ranks > SAFETY_MARGIN * budget:
        message = refusal(config, plan, budget, source, where, ranks, world_size)
        # a CPU, a GB10: running out takes the OOM killer or a wedged host, so refuse; a discrete
        # GPU: refuse when the tensors of known size alone do not fit (a certain out-of-memory
        # error, minutes into loading)
        if host or plan.exact * ranks > budget:
            raise MemoryPlanError(message)
        # else CUDA's out-of-memory error stops the run cleanly, and the estimate runs high
        # (1.2-1.8x the peaks measured on an H100, compiled layers): a warning, not a refusal
        log.warning("%s [a warning on a discrete GPU]", message)
        return plan
    log.info(
        "memory plan: about %s of %s on %s (%s), peak in the %s: %s [%s]",
        gib(plan.total),
        gib(budget),
        where,
        source,
        plan.phase,
        plan.describe(),
        plan.basis,
    )
    return plan


def check_run(trainer) -> Plan | None:
    """:func:`check` for a :class:`~slime_gb10.grpo.trainer.GRPOTrainer` in its setup: its config,
    world size and the longest prompt of its data (loaded, tokenizer known, no weights yet). Under
    torchrun every rank checks before any rank loads weights (the gather waits for all), and all
    refuse if one does."""
    from slime_gb10.grpo.prompts import longest_prompt

    source = getattr(trainer, "_train_source", None)
    longest = longest_prompt(trainer.prompts, source, getattr(trainer, "eval_examples", None))
    dist = trainer.dist
    plan, problem = None, None
    try:
        plan = check(
            trainer.config,
            world_size=dist.world_size,
            prompt_tokens=longest,
            ranks_per_host=int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if dist.enabled else 1,
        )
    except MemoryPlanError as exc:
        problem = str(exc)
    refused = [p for p in dist.gather(problem) if p]
    if refused:
        raise MemoryPlanError(refused[0])
    return plan
