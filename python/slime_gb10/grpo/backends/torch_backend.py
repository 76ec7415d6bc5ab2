"""The portable policy backend: PyTorch + ``transformers``, AdamW, gradient clipping, BF16 autocast.

Logprobs never go through ``model(...).logits``: the decoder runs to its last hidden state and
:func:`slime_gb10.grpo.logprobs.sequence_logprobs_entropy` multiplies only the completion
positions by the LM head, a vocabulary chunk at a time, so the ``[tokens, vocab]`` logits never
exist in FP32 (SmolLM2's vocabulary is 49,152, Qwen's 151,936).

Master weights and AdamW states are FP32; on a GPU the forward/backward run under BF16 autocast.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path

import torch

from slime_gb10.grpo.backends.common import (
    NonFiniteError,
    accumulate_gradients,
    batch_to_device,
    logprob_temperature,
    warmup_factor,
)
from slime_gb10.grpo.batching import right_padded
from slime_gb10.grpo.config import TrainConfig
from slime_gb10.grpo.interfaces import PolicyBackend, TokenBatch, TrainStepResult
from slime_gb10.grpo.logprobs import sequence_logprobs_entropy, unsupported_lm_head_features

log = logging.getLogger(__name__)


#: vocabulary rows per block of the compiled LM head (SmolLM2's whole vocabulary; Qwen's in 4): a
#: compiled block keeps only its BF16 logits (no FP32 copies), so it can be wider than the eager
#: path's 4096, and each block is a guarded call on the host. A training step of shape B on an H100
#: (profile_train.py --head-chunks): eager head 0.739 s; compiled in chunks of 4096 0.706 s, 16384
#: 0.604 s, 49152 0.591 s (issue #27)
COMPILED_HEAD_CHUNK = 49152


def _decoder(model):
    """The HF model without its LM head (``model.model`` for Llama/Qwen)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if decoder is None:
        decoder = getattr(model, model.base_model_prefix)
    return decoder


def compile_decoder_layers(model, backend="inductor") -> int:
    """``torch.compile`` each decoder layer in place; the count of layers compiled.

    ``nn.Module.compile`` keeps the module, so parameter names, state dicts and the weight sync see
    the same model. Inductor fuses what runs between the GEMMs (RMSNorm, rotary, SiLU-and-mul, the
    residual adds, autocast's casts) in the forward and the backward; with ``dynamic=True`` one
    graph serves every layer and every microbatch shape, so a run compiles once (per grad mode).
    """
    layers = getattr(_decoder(model), "layers", None)
    if layers is None:
        return 0
    for layer in layers:
        layer.compile(dynamic=True, backend=backend)
    return len(layers)


def uncompile_decoder_layers(model) -> None:
    """Undo :func:`compile_decoder_layers` (``nn.Module.compile`` sets ``_compiled_call_impl``)."""
    for layer in getattr(_decoder(model), "layers", None) or []:
        layer._compiled_call_impl = None


def token_logprobs(
    model,
    batch: TokenBatch,
    *,
    temperature: float,
    with_entropy: bool,
    autocast_dtype: torch.dtype | None,
    chunk_size: int | None = None,
    compile_backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[B, T]`` logprobs (and entropy) of ``batch.input_ids[:, t]`` predicted at ``t - 1``.

    Zero where ``completion_mask`` is 0. Differentiable when called with grad enabled.
    ``compile_backend``: the LM head's blocks through ``torch.compile`` (``logprobs.py``), in
    vocabulary chunks of :data:`COMPILED_HEAD_CHUNK` (else 4096) unless ``chunk_size`` says.
    """
    if chunk_size is None:
        chunk_size = COMPILED_HEAD_CHUNK if compile_backend else 4096
    input_ids, attention_mask = batch.input_ids, batch.attention_mask
    device_type = input_ids.device.type
    autocast = (
        torch.autocast(device_type=device_type, dtype=autocast_dtype)
        if autocast_dtype is not None
        else contextlib.nullcontext()
    )
    # Right padding needs no attention mask: under causal attention a token sees only the tokens
    # before it, all real, so the padding after it changes nothing it computes (the padded
    # positions' own outputs are garbage, and masked out below). Without a mask SDPA runs its
    # flash kernel instead of the masked kernel reading a [B, 1, T, T] mask (issue #27).
    mask = None if right_padded(attention_mask) else attention_mask
    if mask is None:
        # 0, 1, 2, ... on every row, through the padding too: a real token's position is the same
        # as counted over the mask, and transformers sees no restart (the count over the mask
        # repeats the last position on padding, which transformers takes for packed sequences and
        # answers with a block mask: the masked SDPA kernel and, after a first batch without
        # padding, a second compile of the layers; issue #27)
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    else:
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    # sharded (backends/fsdp.py): the same computation, registered with FSDP as a forward of the model
    forward = getattr(model, FORWARD_LOGPROBS, None) or functools.partial(forward_logprobs, model)
    with autocast:
        return forward(
            input_ids,
            mask,
            position_ids,
            batch.completion_mask,
            temperature=temperature,
            chunk_size=chunk_size,
            with_entropy=with_entropy,
            compile_backend=compile_backend,
        )


#: the model attribute under which a sharded model holds :func:`forward_logprobs` (backends/fsdp.py)
FORWARD_LOGPROBS = "slime_gb10_logprobs"


def forward_logprobs(model, input_ids, mask, position_ids, completion_mask, **head_kwargs):
    """The decoder's forward, then the chunked LM head's logprobs (and entropy) of the targets."""
    hidden = _decoder(model)(
        input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state
    head = model.get_output_embeddings()
    return sequence_logprobs_entropy(
        hidden,
        head.weight,
        input_ids,
        completion_mask,
        lm_head_bias=getattr(head, "bias", None),
        **head_kwargs,
    )


def _adam_settings(train: TrainConfig) -> dict:
    """AdamW's settings from the config but the learning rate (which the warmup schedules)."""
    return {"betas": tuple(train.adam_betas), "eps": train.adam_eps, "weight_decay": train.weight_decay}


def _optimizer_state_by_name(model, state: dict) -> dict:
    """``torch.optim``'s state dict, whose parameters are numbered in the order the optimizer got
    them (the model's parameters that require grad, as :class:`TorchPolicyBackend` passes them),
    keyed by parameter name instead: the form the sharded state-dict API takes."""
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    numbers = [i for g in state["param_groups"] for i in g["params"]]
    if sorted(numbers) != list(range(len(names))):
        raise ValueError(
            f"its optimizer state is of {len(numbers)} parameters, this model trains {len(names)}: "
            "another model's checkpoint"
        )
    by_name = lambda i: names[i] if isinstance(i, int) else i  # noqa: E731
    return {
        "state": {by_name(i): value for i, value in state["state"].items()},
        "param_groups": [{**g, "params": [by_name(i) for i in g["params"]]} for g in state["param_groups"]],
    }


class TorchPolicyBackend(PolicyBackend):
    def __init__(
        self,
        model,
        tokenizer,
        device: torch.device | str,
        *,
        train: TrainConfig,
        temperature: float = 1.0,
        autocast_dtype: torch.dtype | None = None,
        transfer_dtype: torch.dtype = torch.float32,
        gradient_checkpointing: bool = False,
        reference_model=None,
        compile_backend=None,
        rollout_weights: str = "bf16",
        quantization: str = "none",
        sharding: str = "none",
    ):
        self.device = torch.device(device)
        self.model = model.to(self.device)
        # issue #39: the rollout's weights as NVFP4 at each sync; NVFP4 QAT (before the optimizer
        # sees the parameters: the layers are replaced in place)
        self.rollout_weights = rollout_weights
        self._code_changes = None  # quantized.CodeChanges of the NVFP4 syncs (rollout.weights=nvfp4)
        if rollout_weights == "nvfp4":
            from slime_gb10.grpo.quantized import CodeChanges

            self._code_changes = CodeChanges()
        self.quantization = quantization
        if quantization == "nvfp4-qat":
            from slime_gb10.grpo.quantized import apply_qat

            apply_qat(self.model)
        self.tokenizer = tokenizer
        self.temperature = logprob_temperature(temperature)
        self.autocast_dtype = autocast_dtype
        self.transfer_dtype = transfer_dtype
        self.max_grad_norm = train.max_grad_norm
        self.train_config = train
        if gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model.config.use_cache = False
        self.reference_model = (
            reference_model.to(self.device).eval().requires_grad_(False) if reference_model else None
        )
        if quantization == "nvfp4-qat" and self.reference_model is not None:
            apply_qat(self.reference_model)  # the reference is the starting policy: quantized too
        # FSDP2 under torchrun (backends/fsdp.py): before the optimizer, whose state is then sharded too
        self.sharded = False
        if (
            sharding == "fsdp"
            and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1
        ):
            from slime_gb10.grpo.backends import fsdp
            from slime_gb10.grpo.distributed import weights_digest

            # what this rank loaded, for the ranks' weights check (distributed.agree_on_weights): once
            # sharded, every rank's export gathers the same mix of all ranks' shards
            self.loaded_digest = weights_digest(self.export_weights(64 << 20))
            gather = autocast_dtype if quantization != "nvfp4-qat" else None  # fsdp.py says why
            fsdp.shard_model(self.model, FORWARD_LOGPROBS, forward_logprobs, param_dtype=gather)
            if self.reference_model is not None:  # sharded alike: its logprobs are computed as the
                # policy's (BF16 gathers), so KL is 0 before the first update, and it holds 1/world
                fsdp.shard_model(self.reference_model, FORWARD_LOGPROBS, forward_logprobs, param_dtype=gather)
            self.sharded = True
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=train.lr, fused=self.device.type == "cuda", **_adam_settings(train)
        )
        warmup = train.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: warmup_factor(s, warmup))
        self.num_parameters = sum(p.numel() for p in self.model.parameters())
        # compile_backend: the torch.compile backend of the decoder layers ("inductor"), None: the
        # plain layers. The CPU tests pass "eager" (Dynamo's tracing without a C++ toolchain).
        self.compiled = bool(compile_backend) and compile_decoder_layers(self.model, compile_backend) > 0
        self.compile_backend = compile_backend
        self._compile_proven = False  # set by the first train step that ran compiled
        self.grad_sync = (
            None  # set by the trainer under torchrun (distributed.DistContext.all_reduce_gradients)
        )

    def stats(self) -> dict[str, float]:
        """This step's backend facts: compiled layers, and under NVFP4 rollouts the share of codes
        and scales the last sync changed (read once per step: the counts reset)."""
        changes = self._code_changes.take() if self._code_changes is not None else {}
        return {"compiled": float(self.compiled), **changes}

    def _head_backend(self) -> str | None:
        """The compile backend of the chunked LM-head arithmetic: the layers' while they run compiled
        (a compile failure turns both off, :meth:`_compiled_or_plain`)."""
        return self.compile_backend if self.compiled else None

    def _compiled_or_plain(self, run, *, proves: bool = False):
        """``run()``; if the compiled layers fail before a train step has proven them, once more
        with the plain layers (a warning and ``train/compiled`` 0 say so): a compiler that cannot
        build for this GPU costs speed, never the run. Non-finite losses and OOM are not compile
        failures and propagate."""
        # sharded: no retry, a failure is the run's (a rank that retried alone would run collectives
        # the others do not, and a backward that failed halfway has already reduced some gradients)
        if not self.compiled or self._compile_proven or self.sharded:
            return run()
        try:
            out = run()
        except (NonFiniteError, torch.OutOfMemoryError):
            raise
        except Exception as exc:  # any compiler/codegen error means "run uncompiled"
            root = exc  # Dynamo wraps the compiler's own error (BackendCompilerFailed): name that one
            while (inner := getattr(root, "inner_exception", None) or root.__cause__) is not None:
                root = inner
            first_line = (str(root).strip().splitlines() or [""])[0][:300]
            log.warning(
                "compiled decoder layers unusable (%s: %s); training with the plain layers",
                type(root).__name__,
                first_line,
            )
            uncompile_decoder_layers(self.model)
            self.compiled = False
            self.optimizer.zero_grad(set_to_none=True)
            return run()
        self._compile_proven = proves
        return out

    # ---------------------------------------------------------------- logprobs
    def _token_logprobs(self, model, batch: TokenBatch, *, with_entropy: bool, head: bool = True):
        """:func:`token_logprobs` at this backend's temperature and autocast; ``head``: the LM head's
        blocks compiled as the layers are (the reference model's head runs plain)."""
        return token_logprobs(
            model,
            batch,
            temperature=self.temperature,
            with_entropy=with_entropy,
            autocast_dtype=self.autocast_dtype,
            compile_backend=self._head_backend() if head else None,
        )

    @torch.no_grad()
    def logprobs(self, batch: TokenBatch, *, with_entropy: bool = False):
        self.model.eval()
        batch = self._to_device(batch)
        return self._compiled_or_plain(
            lambda: self._token_logprobs(self.model, batch, with_entropy=with_entropy)
        )

    @torch.no_grad()
    def reference_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """Logprobs under the frozen initial policy (KL term / metric)."""
        if self.reference_model is None:
            raise RuntimeError("no reference model was loaded (algo.beta == 0 and algo.ref_kl_metric is off)")
        lp, _ = self._token_logprobs(
            self.reference_model, self._to_device(batch), with_entropy=False, head=False
        )
        return lp

    # ---------------------------------------------------------------- training
    def train_step(self, microbatches: Sequence[tuple[TokenBatch, dict[str, torch.Tensor]]], loss_fn):
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        # ranks that reduce their gradients (data-parallel or sharded) meet in collectives after the
        # pass: a non-finite loss poisons this rank's gradients instead of raising here, so the norm
        # every rank computes after the reduction is not finite and all of them stop together (a rank
        # that raised alone left the others waiting in a collective until train.dist_timeout_s)
        together = self.sharded or self.grad_sync is not None
        total_loss, metrics = self._compiled_or_plain(
            lambda: accumulate_gradients(
                microbatches,
                device=self.device,
                forward=lambda batch: self._token_logprobs(self.model, batch, with_entropy=True),
                loss_fn=loss_fn,
                discard_gradients=self._poison_gradients
                if together
                else lambda: self.optimizer.zero_grad(set_to_none=True),
                raise_nonfinite=not together,
            ),
            proves=True,
        )
        # data-parallel ranks: sum the gradients before clipping (FSDP has reduced every parameter's:
        # shard_model leaves none whole)
        if self.grad_sync is not None and not self.sharded:
            self.grad_sync(self.model.parameters())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        if self.sharded:  # the norm of the sharded gradients: a DTensor over the ranks
            from slime_gb10.grpo.backends.fsdp import full_tensor

            grad_norm = full_tensor(grad_norm)
        grad_norm = float(grad_norm)
        if not math.isfinite(total_loss) or not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            if not math.isfinite(total_loss):
                raise NonFiniteError(f"the loss is {total_loss} (not finite)")
            raise NonFiniteError(
                f"the gradient norm is {grad_norm} (not finite{'; on this rank or another' if together else ''})"
            )
        self.optimizer.step()
        self.scheduler.step()
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        return TrainStepResult(loss=total_loss, grad_norm=grad_norm, metrics=metrics)

    def _poison_gradients(self) -> None:
        """A NaN in this rank's gradients (:meth:`train_step`: a non-finite loss among ranks that
        reduce them): the first local gradient element that exists."""
        for p in self.model.parameters():
            grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            if grad is not None and grad.numel():
                grad[(0,) * grad.dim()] = float("nan")
                return

    # ---------------------------------------------------------------- weights / checkpoints
    def export_weights(self, bucket_bytes: int, *, nvfp4_codes: bool = False):
        from slime_gb10.grpo.weight_sync import WeightStream

        if nvfp4_codes and self.rollout_weights != "nvfp4":
            raise ValueError(
                "NVFP4 codes were asked of a backend built with rollout_weights='bf16': the engine and the "
                "backend disagree on rollout.weights"
            )

        def named_tensors(metadata_only: bool = False):
            named = ((name, param.detach()) for name, param in self.model.named_parameters())
            if self.sharded:  # one weight gathered at a time; the planning pass gathers nothing
                from slime_gb10.grpo.backends import fsdp

                named = fsdp.meta_tensors(named) if metadata_only else fsdp.full_tensors(named)
            if self.rollout_weights == "nvfp4":
                from slime_gb10.grpo.quantized import rollout_weights

                named = rollout_weights(
                    self.model,
                    named,
                    self.transfer_dtype,
                    self._code_changes,
                    metadata_only=metadata_only,
                    codes=nvfp4_codes,
                )
            yield from named

        return WeightStream(
            named_tensors,
            bucket_bytes=bucket_bytes,
            transfer_dtype=self.transfer_dtype,
            metadata_fn=lambda: named_tensors(metadata_only=True),
        )

    def state_dict(self) -> dict:
        """Model, optimizer and schedule, whole (unsharded: a sharded run checkpoints
        :meth:`sharded_state` instead)."""
        if self.sharded:
            raise RuntimeError(
                "a sharded backend's state is written by sharded_state (sharded_checkpoint.py)"
            )
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }

    def sharded_state(self, with_optimizer: bool = False) -> dict:
        """This rank's part of model, optimizer and schedule for a sharded checkpoint
        (``torch.distributed.checkpoint``): the weights and Adam moments keyed by parameter name, as
        DTensor shards when sharded, whole tensors when not, so any world size reads them back.
        ``with_optimizer``: the optimizer's part even before its first step (the template a
        checkpoint with moments loads into)."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if not self.optimizer.state and not with_optimizer:
            # before the first step there are no moments: none are written (get_state_dict would
            # make some, by taking a step of zero gradients, and count it: step 1 before any step)
            return {"model": get_model_state_dict(self.model), "scheduler": self.scheduler.state_dict()}
        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optimizer, "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's policy state: ``{"sharded_checkpoint": dir}`` (read through DCP at this
        run's world size and sharding, whatever they were when written), or a whole state dict."""
        if "sharded_checkpoint" in state:
            from slime_gb10.grpo.sharded_checkpoint import has_optimizer_state, load_sharded

            path = Path(state["sharded_checkpoint"])
            state = load_sharded(path, self.sharded_state(with_optimizer=has_optimizer_state(path)))
            self._set_state(state["model"], state.get("optimizer"))  # none in a checkpoint of step 0
        elif self.sharded:
            # a whole state (an unsharded run's checkpoint): every rank read it; rank 0's is scattered
            from torch.distributed.checkpoint.state_dict import StateDictOptions

            moments = state["optimizer"] if state["optimizer"]["state"] else None  # none before step 1
            self._set_state(
                state["model"],
                moments and _optimizer_state_by_name(self.model, moments),
                StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
            )
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self._apply_optimizer_settings()

    def _set_state(self, model_state: dict, optimizer_state: dict | None, options=None) -> None:
        """Weights (and Adam's state, where there is one) through the state-dict API that takes
        sharded and whole states alike; without one the fresh optimizer stays empty."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if optimizer_state is None:
            set_model_state_dict(self.model, model_state, options=options)
        else:
            set_state_dict(
                self.model,
                self.optimizer,
                model_state_dict=model_state,
                optim_state_dict=optimizer_state,
                options=options,
            )

    def _apply_optimizer_settings(self) -> None:
        """The run's optimizer settings over those a checkpoint restored: the Adam moments and the step
        count come from the checkpoint, lr (at this point of the warmup), betas, eps and weight decay
        from the config. A resumed run's config is its saved one unless flags change it, so an
        unchanged resume is exact (the same numbers), while ``--resume --lr ...`` -- what the trainer
        advises after a divergence -- takes effect (the optimizer's saved ``lr`` used to win)."""
        train = self.train_config
        self.scheduler.base_lrs = [train.lr] * len(self.optimizer.param_groups)
        lr = train.lr * warmup_factor(self.scheduler.last_epoch, train.warmup_steps)
        for group in self.optimizer.param_groups:
            group.update(initial_lr=train.lr, lr=lr, **_adam_settings(train))

    def full_model_state(self) -> dict[str, torch.Tensor] | None:
        """Sharded (FSDP): the whole model state, gathered (a collective every rank calls before rank
        0 writes the final model); else None (rank 0 reads its own)."""
        if not self.sharded:
            return None
        from slime_gb10.grpo.backends.fsdp import full_model_state_dict
        from slime_gb10.grpo.quantized import plain_state_dict

        keep = set(plain_state_dict(self.model))  # a QAT layer's input_amax has no place in HF files
        if self.model.config.tie_word_embeddings:  # gathered apart from the embedding: written once
            keep.discard("lm_head.weight")
        return {k: v for k, v in full_model_state_dict(self.model).items() if k in keep}

    def save_pretrained(
        self, directory: str, dtype: torch.dtype | None = None, state: dict | None = None
    ) -> None:
        dtype = dtype or torch.bfloat16
        # A cast copy of each tensor (the FP32 master weights stay as they are); the config's
        # dtype says what the files hold. Tensors that share storage (a tied lm_head) share their
        # copy too, so save_pretrained still sees them tied and writes one.
        from slime_gb10.grpo.quantized import plain_state_dict

        copies: dict[tuple, torch.Tensor] = {}
        cast = {}
        for key, value in (state if state is not None else plain_state_dict(self.model)).items():
            if not value.is_floating_point():
                cast[key] = value
                continue
            ident = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape))
            if ident not in copies:
                copies[ident] = value.detach().to(dtype)
            cast[key] = copies[ident]
        self.model.save_pretrained(directory, state_dict=cast, safe_serialization=True)
        # save_pretrained records the dtype of the model in memory (FP32); say what the files hold
        config_path = Path(directory) / "config.json"
        config = json.loads(config_path.read_text())
        for key in ("dtype", "torch_dtype"):  # transformers >= 5 / 4.x
            if key in config:
                config[key] = str(dtype).removeprefix("torch.")
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        self.tokenizer.save_pretrained(directory)

    def _to_device(self, batch: TokenBatch) -> TokenBatch:
        return batch_to_device(batch, self.device)


def build_backend(config, tokenizer, device) -> TorchPolicyBackend:
    """Registry entry point: FP32 master weights, BF16 autocast on a GPU unless precision is float32."""
    from slime_gb10.grpo.engines.torch.engine import engine_dtype
    from slime_gb10.grpo.models import load_causal_lm, resolve_model_path

    device = torch.device(device)
    if config.rollout.weights == "nvfp4" and config.train.quantization == "none":
        # the config's default pairs NVFP4 rollouts with QAT; this run sets (or resumed with) none
        log.warning(
            "NVFP4 rollouts with a BF16 trainer (train.quantization=none): on an H100 this ran at "
            "KL(rollout || trainer) 0.13-0.25 per token and ended 25 points under QAT (BENCHMARKS.md); "
            "--set train.quantization=nvfp4-qat trains the policy the rollouts sample"
        )
    path = resolve_model_path(config.model.name_or_path)
    kwargs = {
        "attn_implementation": config.model.attn_implementation,
        "trust_remote_code": config.model.trust_remote_code,
    }
    model = load_causal_lm(path, dtype=torch.float32, **kwargs)
    unsupported = unsupported_lm_head_features(model.config)
    if unsupported:
        from slime_gb10.grpo.models import ModelLoadError

        raise ModelLoadError(
            f"{path}: the model's LM head is not a plain linear layer ({', '.join(unsupported)}); the "
            "trainer's chunked logprobs would not match the model's own. Supported: Llama, Qwen2/3, "
            "Mistral, SmolLM2 and other models whose logits are hidden @ lm_head.weight.T."
        )
    reference = None
    if config.algo.beta > 0 or config.algo.ref_kl_metric:
        # Same FP32 weights under the same autocast as the policy: KL is exactly what the policy
        # moved (0 before the first update), not BF16 rounding. Costs one FP32 copy of the model.
        reference = copy.deepcopy(model)
    autocast = torch.bfloat16 if device.type == "cuda" and config.model.precision != "float32" else None
    compile_layers = config.train.compile
    if compile_layers is None:
        # on where it was measured to pay (issue #27, BENCHMARKS.md); a CPU run is too short to
        # earn back the compile, and checkpointed layers re-enter the forward in the backward
        compile_layers = device.type == "cuda" and not config.model.gradient_checkpointing
    return TorchPolicyBackend(
        model,
        tokenizer,
        device,
        train=config.train,
        temperature=config.rollout.temperature,
        autocast_dtype=autocast,
        transfer_dtype=engine_dtype(config, device),
        gradient_checkpointing=config.model.gradient_checkpointing,
        reference_model=reference,
        compile_backend="inductor" if compile_layers else None,
        rollout_weights=config.rollout.weights,
        quantization=config.train.quantization,
        sharding=config.train.sharding,
    )
