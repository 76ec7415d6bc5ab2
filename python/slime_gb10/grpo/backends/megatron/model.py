"""The production policy backend's model: Megatron-core ``GPTModel`` (+ TransformerEngine when it
imports), its optimizer, precision recipes and logprobs; :mod:`.backend` is the backend around them.

What slime trains with, on one GPU or under torchrun:

* the model is a Megatron-core ``GPTModel`` built from the Hugging Face config (Llama / Qwen2 /
  SmolLM2 family, see :mod:`.mapping`), with the TransformerEngine layer spec when
  ``transformer_engine`` imports and Megatron's local spec otherwise;
* weights come in from the HF checkpoint and go out (to the rollout engine, to
  ``save_pretrained``) through the bit-exact HF ↔ Megatron mapping;
* parameters are BF16; Megatron's ``DistributedDataParallel`` accumulates FP32 main grads and
  its mixed-precision optimizer keeps FP32 master weights and Adam states; under torchrun the
  DDP sums the gradients over the ranks, and ``megatron.use_distributed_optimizer`` shards the
  master weights and Adam states over them (ZeRO-1: 12 of the 18 bytes a parameter costs here:
  BF16 weights 2, FP32 main weights 4, Adam 8, FP32 gradients 4);
* ``megatron.tensor_parallel_size`` splits every layer over consecutive ranks (Megatron's
  column/row-parallel linears and vocabulary-parallel embedding; the weights are sharded on load
  by :mod:`.tensor_parallel`), and the groups of them are data-parallel;
* logprobs use the same chunked-vocabulary path as the PyTorch backend
  (:func:`slime_gb10.grpo.logprobs.chunked_logprobs_entropy`) on the decoder's final hidden states,
  so the ``[tokens, vocab]`` logits never exist;
* ``megatron.precision: fp8 | nvfp4`` wraps the forward in a TransformerEngine autocast with an
  explicit recipe (:func:`te_recipe`): on sm_12x (GB10) NVFP4 needs ``disable_rht=True``
  (TransformerEngine issue #2372) and keeps the weight-gradient GEMM in BF16.

Megatron-core is imported lazily inside functions except for the availability check below, so
this module imports on any machine that has the package (importing it proves only that).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import os
import socket
from typing import Any

import torch

from slime_gb10.grpo.backends.megatron.mapping import (
    DecoderArch,
    LayerSpecFlavor,
    hf_to_megatron,
)
from slime_gb10.grpo.batching import right_padded
from slime_gb10.grpo.interfaces import TokenBatch

if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
    raise ImportError(
        "megatron-core is not installed: pip install 'slime-gb10[megatron]' (or use trainer: torch)"
    )

log = logging.getLogger(__name__)


def _te_importable() -> bool:
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:  # ImportError, or a broken CUDA library raising OSError/RuntimeError
        return False
    return True


def availability() -> tuple[bool, str]:
    """Can this machine train with the Megatron backend? ``(ok, reason)`` for the doctor."""
    try:
        import megatron.core
        from megatron.core.models.gpt import GPTModel  # noqa: F401
    except Exception as exc:
        return False, f"megatron-core does not import ({exc.__class__.__name__}: {exc})"
    version = getattr(megatron.core, "__version__", "?")
    if not torch.cuda.is_available():
        return False, f"megatron-core {version} imports, but there is no CUDA GPU"
    te = (
        "TransformerEngine layer spec"
        if _te_importable()
        else "local layer spec (TransformerEngine not importable)"
    )
    return True, f"megatron-core {version} on {torch.cuda.get_device_name()} ({te})"


# ---------------------------------------------------------------- model construction


def resolve_flavor(transformer_impl: str) -> LayerSpecFlavor:
    """``auto`` → ``te`` when TransformerEngine imports, else ``local``."""
    if transformer_impl in ("transformer_engine", "te"):
        if not _te_importable():
            raise ImportError(
                "megatron.transformer_impl is 'transformer_engine' but transformer_engine does not import; "
                "install slime-gb10[te] or set megatron.transformer_impl: local"
            )
        return "te"
    if transformer_impl == "local":
        return "local"
    if transformer_impl == "auto":
        return "te" if _te_importable() else "local"
    raise ValueError(
        f"megatron.transformer_impl must be auto, transformer_engine or local, got {transformer_impl!r}"
    )


def transformer_config(
    arch: DecoderArch,
    *,
    params_dtype: torch.dtype = torch.bfloat16,
    use_cpu_initialization: bool = False,
    recompute_granularity: str = "none",
    tensor_parallel_size: int = 1,
):
    """Megatron-core ``TransformerConfig`` equivalent to a Llama-family HF config.

    Fusions that need Apex/TE kernels are off so the local spec runs on plain PyTorch; dropout
    is 0 (HF's ``attention_dropout`` is 0 for these models and RL fine-tuning uses none).
    """
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    recompute = {} if recompute_granularity == "none" else {"recompute_granularity": recompute_granularity}
    if recompute_granularity == "full":
        recompute |= {"recompute_method": "uniform", "recompute_num_layers": 1}
    return TransformerConfig(
        tensor_model_parallel_size=tensor_parallel_size,  # no sequence parallelism: activations whole
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.intermediate_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_key_value_heads,
        kv_channels=arch.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=arch.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        attention_softmax_in_fp32=True,
        bf16=params_dtype == torch.bfloat16,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        use_cpu_initialization=use_cpu_initialization,
        perform_initialization=False,  # every weight is loaded from the HF checkpoint
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        # Data parallel: Megatron's DDP sums the ranks' gradients instead of averaging them (its
        # 1/dp scaling is off with this flag, the only other thing it changes is Megatron's own
        # loss helpers, unused here): each rank's loss is already divided by the token count of
        # the whole global batch (grpo/batching.py), as under the PyTorch backend's all-reduce.
        calculate_per_token_loss=True,
        **recompute,
    )


def build_gpt_model(
    hf_config: Any,
    *,
    flavor: str = "auto",
    params_dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cuda",
    recompute_granularity: str = "none",
    tensor_parallel_size: int = 1,
):
    """``(GPTModel, DecoderArch, flavor)`` for a HF config; needs ``parallel_state`` initialised (with
    the same tensor-parallel size: each rank's layers hold its shards).

    The vocabulary keeps the exact HF size (no padding to a multiple), so logprobs compare 1:1.
    """
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )

    from slime_gb10.grpo.backends.megatron.tensor_parallel import check_tensor_parallel

    arch = DecoderArch.from_hf_config(hf_config)
    check_tensor_parallel(arch, tensor_parallel_size)
    flavor = resolve_flavor(flavor)
    device = torch.device(device)
    config = transformer_config(
        arch,
        params_dtype=params_dtype,
        use_cpu_initialization=device.type == "cpu",
        recompute_granularity=recompute_granularity,
        tensor_parallel_size=tensor_parallel_size,
    )
    if flavor == "te":
        layer_spec = get_gpt_layer_with_transformer_engine_spec()
    else:
        layer_spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec,
        vocab_size=arch.vocab_size,
        max_sequence_length=arch.max_position_embeddings,
        pre_process=True,
        post_process=True,
        share_embeddings_and_output_weights=arch.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=int(arch.rope_theta),
    )
    model.slime_layer_spec = flavor  # token_logprobs: TE builds its own causal mask
    if tensor_parallel_size > 1:
        mark_tensor_parallel(model)
    model = model.to(device)
    # Every parameter in params_dtype, as Megatron's Float16Module (module.bfloat16()) leaves them;
    # the local spec's torch norms are created in FP32. Buffers (RoPE tables) keep their dtype.
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.to(params_dtype)
    return model, arch, flavor


def mark_tensor_parallel(model) -> None:
    """Mark each split parameter as Megatron-core's layers do (``tensor_model_parallel``,
    ``partition_dim``, ``partition_stride``). Its local layers set the marks only while they
    initialise a weight, which ``perform_initialization=False`` skips (every weight is loaded here);
    unmarked, its optimizer takes the shards of every rank but the first for copies of the first's
    and leaves them out of the gradient norm and the clipping (found in review, after a TP=2 run's
    gradient norm came out 22% below TP=1's). The layout is :mod:`.tensor_parallel`'s."""
    from slime_gb10.grpo.backends.megatron.tensor_parallel import GLU, ROW, WHOLE, split_kind

    for name, param in model.named_parameters():
        kind = split_kind(name)
        if kind != WHOLE and not getattr(param, "tensor_model_parallel", False):
            param.tensor_model_parallel = True
            param.partition_dim = 1 if kind == ROW else 0
            param.partition_stride = 2 if kind == GLU else 1  # [gate_r; up_r]: Megatron's gated fc1 says 2


def init_parallel(seed: int = 0, timeout_s: int = 1800, tensor_parallel_size: int = 1) -> int:
    """Megatron's parallel groups over every rank of ``torch.distributed`` (a one-member group of
    its own when no launcher formed one): tensor-parallel groups of ``tensor_parallel_size``
    consecutive ranks (Megatron's order: on one box before across boxes), pipeline parallel size 1,
    and data parallelism over the groups (torchrun: ``grpo/distributed.py`` formed the world). Its
    groups' collectives time out after ``timeout_s`` (``train.dist_timeout_s``). Returns the
    data-parallel size."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if os.environ.get("TORCHELASTIC_RUN_ID"):
            # torchrun with one rank (grpo/distributed.py forms no group for it): its rendezvous;
            # a tcp:// address of our own would wait for torchrun's agent store and hang
            dist.init_process_group(backend, rank=0, world_size=1)
        else:
            with socket.socket() as s:  # a free local port for the (single-member) rendezvous
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tensor_parallel_size,
            pipeline_model_parallel_size=1,
            distributed_timeout_minutes=timeout_s / 60,  # megatron makes timedelta(minutes=...) of it
        )
    if torch.cuda.is_available():  # the same on every rank (Megatron offsets its tensor-parallel
        model_parallel_cuda_manual_seed(seed)  # stream per rank; nothing here draws from it: no dropout)
    return parallel_state.get_data_parallel_world_size()


def load_hf_weights(
    model,
    hf_state: dict[str, torch.Tensor],
    arch: DecoderArch,
    flavor: LayerSpecFlavor,
    tensor_parallel: tuple[int, int] = (1, 0),
) -> None:
    """Copy a HF state dict into a Megatron ``GPTModel`` (strict: every parameter, matching shapes);
    ``tensor_parallel = (size, rank)``: this rank's shards."""
    from slime_gb10.grpo.backends.megatron.tensor_parallel import iter_hf_to_megatron_shard

    size, rank = tensor_parallel
    converted = (
        dict(iter_hf_to_megatron_shard(hf_state, arch, flavor, size, rank))
        if size > 1
        else hf_to_megatron(hf_state, arch, flavor)
    )
    params = dict(model.named_parameters())
    if set(converted) != set(params):
        missing, extra = sorted(set(params) - set(converted)), sorted(set(converted) - set(params))
        raise RuntimeError(
            f"Megatron model and mapping disagree: missing {missing[:3]}, unexpected {extra[:3]}"
        )
    with torch.no_grad():
        for name, tensor in converted.items():
            if params[name].shape != tensor.shape:
                raise RuntimeError(
                    f"{name}: model {tuple(params[name].shape)} vs checkpoint {tuple(tensor.shape)}"
                )
            params[name].copy_(tensor)


def megatron_state(model) -> dict[str, torch.Tensor]:
    """Parameters of a (possibly DDP-wrapped) GPTModel by Megatron name, detached, no copies."""
    module = getattr(model, "module", model)
    return {name: p.detach() for name, p in module.named_parameters()}


def build_optimizer(
    model,
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.99),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    max_grad_norm: float = 1.0,
    use_distributed_optimizer: bool = False,
):
    """Megatron's ``DistributedDataParallel`` (FP32 main-grad buffers) and mixed-precision Adam.

    With BF16 parameters, ``get_megatron_optimizer`` returns ``Float16OptimizerWithFloat16Params``:
    FP32 master copies of the weights and FP32 Adam moments, gradient clipping at
    ``max_grad_norm`` (``clip_grad``), weights copied back to BF16 after each step. Weight decay
    is decoupled (AdamW) and skips biases and norm weights, Megatron's default.
    """
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=False,
        use_distributed_optimizer=use_distributed_optimizer,
    )
    ddp_model = DistributedDataParallel(model.config, ddp_config, model)
    params_dtype = next(model.parameters()).dtype
    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=lr,
        min_lr=0.0,
        weight_decay=weight_decay,
        adam_beta1=betas[0],
        adam_beta2=betas[1],
        adam_eps=eps,
        clip_grad=max_grad_norm,
        bf16=params_dtype == torch.bfloat16,
        params_dtype=params_dtype,
        use_distributed_optimizer=use_distributed_optimizer,
    )
    return ddp_model, get_megatron_optimizer(opt_config, [ddp_model])


# ---------------------------------------------------------------- precision recipes


def te_recipe(precision: str, compute_capability: tuple[int, int] | None = None):
    """The TransformerEngine recipe for ``precision`` (``None`` for ``bf16``).

    * ``fp8``: ``Float8CurrentScaling`` (per-tensor current scaling, HYBRID E4M3/E5M2), which
      needs no amax history; falls back to ``DelayedScaling`` on TE versions without it.
    * ``nvfp4``: ``NVFP4BlockScaling`` (16-element blocks, E4M3 block scales, FP32 tensor scale).
      On sm_12x (GB10 = sm_121) its random Hadamard transform kernel fails with "invalid argument"
      for M > 32 (TransformerEngine issue #2372), so ``disable_rht=True``, and its stochastic
      rounding needs more shared memory than sm_12x has (TE #3062), so
      ``disable_stochastic_rounding=True`` where the field exists; the weight-gradient
      GEMM stays BF16 as the GB10 nanochat port does: ``override_linear_precision=(False, False,
      True)`` on TE versions whose recipe has that field, else ``backward_override=
      "high_precision"`` (newer TE: the whole backward from BF16 operands).
    """
    if precision == "bf16":
        return None
    try:
        from transformer_engine.common import recipe as te_recipes
    except Exception as exc:
        raise ImportError(
            f"megatron.precision={precision!r} needs TransformerEngine (pip install 'slime-gb10[te]'; "
            f"on a GB10 the flake builds it): {exc}"
        ) from exc
    if compute_capability is None and torch.cuda.is_available():
        compute_capability = torch.cuda.get_device_capability()
    if precision == "fp8":
        if hasattr(te_recipes, "Float8CurrentScaling"):
            return te_recipes.Float8CurrentScaling(fp8_format=te_recipes.Format.HYBRID)
        return te_recipes.DelayedScaling(fp8_format=te_recipes.Format.HYBRID)
    if precision == "nvfp4":
        if not hasattr(te_recipes, "NVFP4BlockScaling"):
            raise ImportError("this TransformerEngine has no NVFP4BlockScaling recipe (needs TE >= 2.8)")
        from slime_gb10.nvfp4.te_backend import nvfp4_recipe_kwargs, recipe_field_names

        cls = te_recipes.NVFP4BlockScaling
        from slime_gb10.platform.devices import is_sm12x

        sm12x = is_sm12x(compute_capability)
        # The sm_12x workarounds (RHT and stochastic rounding off, BF16 weight gradients) are
        # NVFP4Linear's; weights keep TE's 16x16 training tiles here.
        return cls(**nvfp4_recipe_kwargs(recipe_field_names(cls), sm12x, one_d_weights=False))
    raise ValueError(f"megatron.precision must be bf16, fp8 or nvfp4, got {precision!r}")


def te_autocast(recipe):
    """TransformerEngine's autocast context for ``recipe`` (a no-op for ``None``)."""
    if recipe is None:
        return contextlib.nullcontext()
    import transformer_engine.pytorch as te

    if hasattr(te, "autocast"):  # TE >= 2.8
        return te.autocast(enabled=True, recipe=recipe)
    return te.fp8_autocast(enabled=True, fp8_recipe=recipe)


# ---------------------------------------------------------------- forward


@contextlib.contextmanager
def _hidden_states_only(model):
    """Make ``GPTModel.forward`` return the final (normed) hidden states ``[b, s, h]``.

    ``GPTModel._postprocess`` calls ``output_layer(hidden, weight=..., runtime_gather_output=...)``
    and returns its result transposed to ``[b, s, ...]``; an identity output layer turns that into
    the decoder's output, so the LM head can be applied a vocabulary chunk at a time.
    """
    layer = model.output_layer
    original = layer.forward
    layer.forward = lambda hidden, *args, **kwargs: (hidden, None)
    try:
        yield
    finally:
        layer.forward = original


def _check_right_padded(attention_mask: torch.Tensor) -> None:
    if not right_padded(attention_mask):
        raise ValueError(
            "the Megatron backend expects right-padded TokenBatches (a 0 before a 1 in attention_mask)"
        )


def token_logprobs(
    model,
    batch: TokenBatch,
    *,
    temperature: float,
    with_entropy: bool,
    recipe=None,
    chunk_size: int = 4096,
    pad_to: int = 1,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[B, T]`` logprobs (and entropy) of ``input_ids[:, t]`` predicted at ``t - 1`` by a GPTModel.

    Zero where ``completion_mask`` is 0; differentiable when grad is enabled. The batch is
    right-padded, so causal attention alone keeps padding out of every real position.
    """
    from slime_gb10.grpo.logprobs import sequence_logprobs_entropy

    module = getattr(model, "module", model)
    input_ids = batch.input_ids
    _check_right_padded(batch.attention_mask)
    bsz, seq = input_ids.shape
    padded = math.ceil(seq / pad_to) * pad_to  # FP8/NVFP4 GEMMs want token counts in multiples of 16
    if padded != seq:
        input_ids = torch.nn.functional.pad(input_ids, (0, padded - seq), value=0)
    position_ids = torch.arange(padded, device=input_ids.device).expand(bsz, padded)
    if getattr(module, "slime_layer_spec", "local") == "te":
        mask = None  # TE's fused attention applies the causal mask itself (attn_mask_type=causal)
    else:  # [1, 1, s, s] bool, True = masked out: the causal mask, on the input's device
        mask = torch.triu(torch.ones(padded, padded, dtype=torch.bool, device=input_ids.device), diagonal=1)[
            None, None
        ]
    with _hidden_states_only(module), te_autocast(recipe):
        hidden = model(input_ids, position_ids, mask)  # [b, s, h]
    if module.share_embeddings_and_output_weights:
        head = module.shared_embedding_or_output_weight()
    else:
        head = module.output_layer.weight
    from megatron.core import parallel_state

    group = None  # tensor parallelism: the head is this rank's rows of the vocabulary
    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        group = parallel_state.get_tensor_model_parallel_group()
    return sequence_logprobs_entropy(
        hidden[:, :seq],
        head,
        batch.input_ids,
        batch.completion_mask,
        temperature=temperature,
        chunk_size=chunk_size,
        with_entropy=with_entropy,
        vocab_parallel_group=group,
    )
