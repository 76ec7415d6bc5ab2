"""The Megatron-core policy backend: :class:`MegatronPolicyBackend` and ``build_backend`` (the
registry's entry point), on the model, optimizer, precision recipes and logprobs of :mod:`.model`.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence

import torch

from slime_gb10.grpo.backends.common import (
    NonFiniteError,
    accumulate_gradients,
    batch_to_device,
    logprob_temperature,
    warmup_factor,
)
from slime_gb10.grpo.backends.megatron.mapping import (
    DecoderArch,
    hf_named_tensors_fn,
    iter_megatron_to_hf,
    megatron_to_hf,
)
from slime_gb10.grpo.backends.megatron.model import (
    availability,
    build_gpt_model,
    build_optimizer,
    init_parallel,
    load_hf_weights,
    megatron_state,
    te_recipe,
    token_logprobs,
)
from slime_gb10.grpo.backends.megatron.tensor_parallel import GatheredState, check_tensor_parallel
from slime_gb10.grpo.config import MegatronConfig, TrainConfig
from slime_gb10.grpo.interfaces import PolicyBackend, TokenBatch, TrainStepResult

log = logging.getLogger(__name__)

# the registry's entry points (grpo/registry.py): availability() and build_backend()
__all__ = ["MegatronPolicyBackend", "NonFiniteError", "availability", "build_backend", "build_gpt_model"]


class MegatronPolicyBackend(PolicyBackend):
    def __init__(
        self,
        hf_model,
        tokenizer,
        device: torch.device | str,
        *,
        train: TrainConfig,
        megatron: MegatronConfig | None = None,  # the megatron section's settings (its defaults if None)
        temperature: float = 1.0,
        transfer_dtype: torch.dtype = torch.bfloat16,
        with_reference: bool = False,
        seed: int = 0,
    ):
        megatron = megatron or MegatronConfig()
        precision, use_distributed_optimizer = megatron.precision, megatron.use_distributed_optimizer
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        if self.device.type != "cuda":
            raise RuntimeError(
                "the Megatron backend needs a CUDA GPU (Megatron-core places RoPE tables and RNG state on "
                "CUDA); on a CPU use trainer: torch"
            )
        torch.cuda.set_device(self.device)
        tp = megatron.tensor_parallel_size
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        check_tensor_parallel(
            DecoderArch.from_hf_config(hf_model.config), tp, world
        )  # before any group forms
        self.data_parallel_size = init_parallel(seed, train.dist_timeout_s, tp)
        from megatron.core import parallel_state

        self.tensor_parallel_size = tp
        self.tensor_parallel_rank = parallel_state.get_tensor_model_parallel_rank()
        self.data_parallel_rank = parallel_state.get_data_parallel_rank()
        self.tp_group = parallel_state.get_tensor_model_parallel_group() if tp > 1 else None
        self.use_distributed_optimizer = use_distributed_optimizer
        self.tokenizer = tokenizer
        self.hf_config = hf_model.config
        self.temperature = logprob_temperature(temperature)
        self.transfer_dtype = transfer_dtype
        self.max_grad_norm = train.max_grad_norm
        self.base_lr, self.warmup_steps, self.steps_done = train.lr, train.warmup_steps, 0
        self.adam_settings = {"betas": tuple(train.adam_betas), "eps": train.adam_eps}
        self.weight_decay = train.weight_decay
        self.precision = precision
        self.recipe = te_recipe(precision)
        self.pad_to = 16 if self.recipe is not None else 1

        hf_state = {k: v.detach() for k, v in hf_model.state_dict().items()}
        self.model, self.arch, self.flavor = build_gpt_model(
            self.hf_config,
            flavor=megatron.transformer_impl,
            params_dtype=torch.bfloat16,
            device=self.device,
            recompute_granularity=megatron.recompute_granularity,
            tensor_parallel_size=tp,
        )
        shard = (tp, self.tensor_parallel_rank)
        load_hf_weights(self.model, hf_state, self.arch, self.flavor, shard)
        self.reference = None
        if with_reference:
            self.reference, _, _ = build_gpt_model(
                self.hf_config, flavor=self.flavor, device=self.device, tensor_parallel_size=tp
            )
            load_hf_weights(self.reference, hf_state, self.arch, self.flavor, shard)
            self.reference.eval().requires_grad_(False)
        del hf_state

        self.ddp_model, self.optimizer = build_optimizer(
            self.model,
            lr=train.lr,
            betas=tuple(train.adam_betas),
            eps=train.adam_eps,
            weight_decay=train.weight_decay,
            max_grad_norm=train.max_grad_norm,
            use_distributed_optimizer=use_distributed_optimizer,
        )
        # the whole model's (this rank holds 1/tp of most of them under tensor parallelism)
        self.num_parameters = (
            hf_model.num_parameters() if tp > 1 else sum(p.numel() for p in self.model.parameters())
        )
        log.info(
            "Megatron-core GPTModel: %.1fM parameters, %s layer spec, precision %s, tensor parallel %d",
            self.num_parameters / 1e6,
            self.flavor,
            precision,
            tp,
        )

    def tensor_parallel_samples(self, samples: list) -> list:
        """The samples of every rank of this rank's tensor-parallel group, in rank order (the same
        list on each). Each rank rolled out its own share of the prompts; the group's layers compute
        together, so its ranks must train on the same micro-batches: all of the group's samples."""
        if self.tp_group is None:
            return samples
        parts: list = [None] * self.tensor_parallel_size
        torch.distributed.all_gather_object(parts, samples, group=self.tp_group)  # our own ranks' lists
        return [sample for part in parts for sample in part]

    # ---------------------------------------------------------------- logprobs
    def _logprobs(self, model, batch: TokenBatch, with_entropy: bool):
        return token_logprobs(
            model,
            self._to_device(batch),
            temperature=self.temperature,
            with_entropy=with_entropy,
            recipe=self.recipe,
            pad_to=self.pad_to,
        )

    @torch.no_grad()
    def logprobs(self, batch: TokenBatch, *, with_entropy: bool = False):
        self.ddp_model.eval()
        return self._logprobs(self.ddp_model, batch, with_entropy)

    @torch.no_grad()
    def reference_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """Logprobs under the frozen initial policy (KL term / metric)."""
        if self.reference is None:
            raise RuntimeError("no reference model was built (algo.beta == 0 and algo.ref_kl_metric is off)")
        return self._logprobs(self.reference, batch, False)[0]

    # ---------------------------------------------------------------- training
    def _lr(self) -> float:
        return self.base_lr * warmup_factor(self.steps_done, self.warmup_steps)

    def _apply_optimizer_settings(self) -> float:
        """The run's settings on every parameter group before a step; returns the lr.

        lr at this point of the warmup (times the group's ``lr_mult``), Adam's betas and eps, and
        the weight decay times the group's ``wd_mult``: Megatron gives biases and norm weights a
        ``wd_mult`` of 0 but leaves applying it to its ``OptimizerParamScheduler``, which this backend
        does not use, so before this the decay reached them too. A resumed run's optimizer state
        brings the checkpoint's betas, eps and decay; the config's replace them, as in the torch
        backend (``--resume`` with changed settings takes effect)."""
        lr = self._lr()
        for group in self.optimizer.param_groups:
            group.update(
                lr=lr * group.get("lr_mult", 1.0),
                weight_decay=self.weight_decay * group.get("wd_mult", 1.0),
                **self.adam_settings,
            )
        return lr

    def train_step(self, microbatches: Sequence[tuple[TokenBatch, dict[str, torch.Tensor]]], loss_fn):
        self.ddp_model.train()
        self.ddp_model.zero_grad_buffer()
        self.optimizer.zero_grad()
        total_loss, metrics = accumulate_gradients(
            microbatches,
            device=self.device,
            forward=lambda batch: self._logprobs(self.ddp_model, batch, True),
            loss_fn=loss_fn,
            discard_gradients=self.ddp_model.zero_grad_buffer,
            # data parallel: every rank reaches the reduction below, and all decide together
            raise_nonfinite=self.data_parallel_size == 1,
        )
        self.ddp_model.finish_grad_sync()  # the one gradient reduction of the step, on every rank
        if not self._all_finite(math.isfinite(total_loss)):
            self.ddp_model.zero_grad_buffer()
            what = "gradient has" if math.isfinite(total_loss) else f"loss is {total_loss}: it has"
            raise NonFiniteError(f"the {what} NaN/Inf entries (on some rank); the optimizer step was skipped")
        lr = self._apply_optimizer_settings()
        update_ok, grad_norm, _ = self.optimizer.step()
        if not update_ok:
            raise NonFiniteError("Megatron's optimizer skipped the step (non-finite gradients)")
        self.steps_done += 1
        metrics["lr"] = lr
        return TrainStepResult(loss=total_loss, grad_norm=float(grad_norm or 0.0), metrics=metrics)

    def _all_finite(self, loss_finite: bool) -> bool:
        """Whether every rank's loss and gradients are finite, the same answer on every rank: under
        the distributed optimizer a rank holds reduced gradients only for its own shard, so a NaN
        may show on one rank alone, and ranks that decided apart would meet in different collectives."""
        finite = (
            torch.stack(
                [p.main_grad.isfinite().all() for p in self.model.parameters() if p.requires_grad]
            ).all()
            & loss_finite
        )
        if torch.distributed.get_world_size() > 1:  # over tensor- and data-parallel ranks alike
            finite = finite.to(torch.int32)
            torch.distributed.all_reduce(finite, op=torch.distributed.ReduceOp.MIN)
        return bool(finite)

    # ---------------------------------------------------------------- weights / checkpoints
    def _whole_state(self):
        """The weights by Megatron name, whole: under tensor parallelism each is gathered from the
        group's shards when read (a collective: every rank of the group reads them)."""
        state = megatron_state(self.model)
        return state if self.tp_group is None else GatheredState(state, self.tp_group)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The current weights under Hugging Face names: the parameters themselves where a name maps to
        one whole, contiguous copies of split views (clone to keep them past a step); a collective
        under tensor parallelism."""
        return megatron_to_hf(self._whole_state(), self.arch, self.flavor)

    def full_model_state(self) -> dict[str, torch.Tensor] | None:
        """Under tensor parallelism, the whole weights by HF name on rank 0's host memory (None on the
        other ranks, which take part in the gathers) for :meth:`save_pretrained`; None without."""
        if self.tp_group is None:
            return None
        keep = torch.distributed.get_rank() == 0
        state = {}
        for name, tensor in iter_megatron_to_hf(self._whole_state(), self.arch, self.flavor):
            if keep:
                state[name] = tensor.to("cpu", copy=True)
        return state if keep else None

    def export_weights(self, bucket_bytes: int, *, nvfp4_codes: bool = False):
        from slime_gb10.grpo.weight_sync import WeightStream

        if nvfp4_codes:  # rollout.weights=nvfp4 is the PyTorch backend's (the config says so)
            raise ValueError("the Megatron backend exports BF16 weights only, not NVFP4 codes")

        named = hf_named_tensors_fn(self._whole_state, self.arch, self.flavor)
        return WeightStream(named, bucket_bytes=bucket_bytes, transfer_dtype=self.transfer_dtype)

    @property
    def streams_state(self) -> bool:
        """A checkpoint is written by :meth:`write_state` (tensor parallelism), not from ``state_dict``."""
        return self.tp_group is not None

    def write_state(self, directory) -> BaseException | None:
        """:func:`.tp_checkpoint.write_whole_state`: a collective; rank 0 passes the directory to
        create, the other ranks None. Returns what failed to be written (after every gather), or None."""
        from slime_gb10.grpo.backends.megatron.tp_checkpoint import write_whole_state

        return write_whole_state(self, directory)

    @property
    def collective_state(self) -> bool:
        """``state_dict`` and ``load_state_dict`` are collectives (every rank calls them; rank 0
        alone writes what ``state_dict`` returns there): the distributed optimizer's shards, or
        the tensor-parallel shards of weights and optimizer."""
        return self.use_distributed_optimizer or self.tp_group is not None

    def state_dict(self) -> dict | None:
        """Weights, optimizer and schedule. The distributed optimizer's ``state_dict`` holds no
        parameter state (Megatron saves it apart): its master weights and Adam moments come
        gathered in Megatron's "dp_zero" layout, whole on rank 0 (None elsewhere), which
        :meth:`load_state_dict` scatters over any number of ranks. Under tensor parallelism:
        :func:`.tp_checkpoint.whole_state`."""
        if self.tp_group is not None:
            from slime_gb10.grpo.backends.megatron.tp_checkpoint import whole_state

            return whole_state(self)
        # Adam's state appears at the first update, on every rank at once: before it (a checkpoint
        # after a step with no trainable sample anywhere) Megatron's distributed optimizer cannot
        # describe itself, and there is nothing of it to save
        started = not self.use_distributed_optimizer or any(o.optimizer.state for o in self._optimizers())
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict() if started else None,
            "steps_done": self.steps_done,
            "flavor": self.flavor,
        }
        if self.use_distributed_optimizer:  # rank 0 holds all of it for a moment: 12 bytes a parameter
            state["optimizer_parameter_state"] = (
                [o.get_parameter_state_dp_zero() for o in self._optimizers()] if started else None
            )
        return state

    def _optimizers(self) -> list:
        """The optimizers inside Megatron's ``ChainedOptimizer`` (one here: a dense model)."""
        return list(getattr(self.optimizer, "chained_optimizers", [self.optimizer]))

    def load_state_dict(self, state: dict) -> None:
        if state.get("flavor", self.flavor) != self.flavor:
            raise RuntimeError(
                f"checkpoint was written with the {state['flavor']!r} layer spec, this run uses {self.flavor!r}; "
                "set megatron.transformer_impl to match"
            )
        from slime_gb10.grpo.backends.megatron import tp_checkpoint

        if tp_checkpoint.is_whole_state(state) or self.tp_group is not None:
            tp_checkpoint.load_whole_state(self, state)  # any tensor-parallel size, or a clear refusal
            return
        sharded = "optimizer_parameter_state" in state
        if sharded != self.use_distributed_optimizer:
            raise RuntimeError(
                f"checkpoint was written with megatron.use_distributed_optimizer={str(sharded).lower()}, "
                f"this run has {str(self.use_distributed_optimizer).lower()}; set it to match"
            )
        self.model.load_state_dict(state["model"])
        if state["optimizer"] is None:  # saved before the first update: a fresh optimizer is that state,
            self.optimizer.reload_model_params()  # its FP32 main weights copied from the loaded ones
            self.steps_done = int(state.get("steps_done", 0))
            return
        self.optimizer.load_state_dict(state["optimizer"])
        if sharded:  # after load_state_dict, which allocates the shards this fills (Megatron's order)
            for optimizer, part in zip(self._optimizers(), state["optimizer_parameter_state"], strict=True):
                _load_dp_zero(optimizer, part)
        self.steps_done = int(state.get("steps_done", 0))

    def save_pretrained(
        self, directory: str, dtype: torch.dtype | None = None, state: dict | None = None
    ) -> None:
        """The model as a HF directory; ``state``: :meth:`full_model_state`'s (tensor parallelism)."""
        dtype = dtype or torch.bfloat16
        from transformers import AutoModelForCausalLM

        hf_model = AutoModelForCausalLM.from_config(self.hf_config, dtype=dtype)
        state = state if state is not None else self.hf_state_dict()
        missing, unexpected = hf_model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not (k == "lm_head.weight" and self.arch.tie_word_embeddings)]
        if missing or unexpected:
            raise RuntimeError(
                f"export does not fill the HF model: missing {missing[:3]}, unexpected {unexpected[:3]}"
            )
        if self.arch.tie_word_embeddings:
            hf_model.tie_weights()
        hf_model.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)

    def _to_device(self, batch: TokenBatch) -> TokenBatch:
        return batch_to_device(batch, self.device)


def _load_dp_zero(optimizer, part: dict) -> None:
    """``DistributedOptimizer.load_parameter_state_from_dp_zero`` with PyTorch's Adam inside (the
    fallback without TransformerEngine or Apex), working around two defects of megatron-core 0.16:

    * it saves a parameter's master weight and two moments in this format but loads every key of
      its ``torch.optim`` state, which for PyTorch's Adam also holds ``step``: a KeyError. The step
      is not lost (Megatron keeps it in the param groups and ``load_state_dict`` put it back), so
      it steps aside while the shards load;
    * that ``load_state_dict`` gives every parameter the same ``step`` tensor, which PyTorch's Adam
      increments in place once per parameter: after one more step the bias correction of every
      parameter counted N steps (measured: a resumed run's weights differed from the run's own).
      Each parameter gets its own copy."""
    steps = [(state, state.pop("step")) for state in optimizer.optimizer.state.values() if "step" in state]
    try:
        optimizer.load_parameter_state_from_dp_zero(part)
    finally:
        for state, step in steps:
            state["step"] = step.detach().clone()


def build_backend(config, tokenizer, device) -> MegatronPolicyBackend:
    """Registry entry point (``backends.trainer: megatron``)."""
    from slime_gb10.grpo.config import ConfigError
    from slime_gb10.grpo.models import load_causal_lm, resolve_model_path

    if config.rollout.weights != "bf16" or config.train.quantization != "none":
        raise ConfigError(  # issue #39: the PyTorch backend first
            "rollout.weights=nvfp4 and train.quantization=nvfp4-qat run with the PyTorch backend only: "
            "set backends.trainer=torch (or leave them at bf16 / none)"
        )

    device = torch.device(device)
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # Megatron's usual setting
    path = resolve_model_path(config.model.name_or_path)
    hf_model = load_causal_lm(path, dtype=torch.float32, trust_remote_code=config.model.trust_remote_code)
    try:
        from slime_gb10.grpo.engines.torch.engine import engine_dtype

        transfer_dtype = engine_dtype(config, device)
    except ImportError:
        transfer_dtype = torch.bfloat16
    return MegatronPolicyBackend(
        hf_model,
        tokenizer,
        device,
        train=config.train,
        megatron=config.megatron,
        temperature=config.rollout.temperature,
        transfer_dtype=transfer_dtype,
        with_reference=config.algo.beta > 0 or config.algo.ref_kl_metric,
        seed=config.train.seed,
    )
