"""NVFP4 checkpoints in NVIDIA ModelOpt's Hugging Face layout (what SGLang/vLLM/TRT-LLM load).

Per quantized linear ``<name>`` (SGLang ``ModelOptFp4LinearMethod.create_weights``):

=========================  ==================  ===================
tensor                     dtype               shape
=========================  ==================  ===================
``<name>.weight``          uint8 (2 codes/B)   ``[out, in/2]``
``<name>.weight_scale``    float8_e4m3fn       ``[out, in/16]``
``<name>.weight_scale_2``  float32             ``[]`` (global scale)
``<name>.input_scale``     float32             ``[]`` (activation amax / 2688)
=========================  ==================  ===================

Everything else (``lm_head``, norms, embeddings) is stored in BF16, except tensors matching
``keep_fp32`` (e.g. MoE router biases, which BF16 rounding corrupts). ``config.json`` gets a flat
``quantization_config`` (``quant_method: modelopt``, ``quant_algo: NVFP4``, ``group_size: 16``,
``config_groups``, ``ignore``/``exclude_modules``), the form ModelOpt writes today and SGLang's
``ModelOptFp4Config.from_config`` reads first; ``hf_quant_config.json`` carries the legacy nested
form (``{"producer": ..., "quantization": {...}}``). Sibling projections that engines fuse
(q/k/v, gate/up) are written with one shared ``weight_scale_2`` and ``input_scale``, because the
fused layer keeps only one (SGLang takes the max over the shards). A tied weight (``lm_head`` =
``embed_tokens``) is written once, under its first name, as transformers and ModelOpt do.
Calibrated with ``quantize_model(..., forward_loop=...)``, the checkpoint's tensors are
byte-for-byte those of ModelOpt's ``export_hf_checkpoint`` (tests/nvfp4/test_modelopt_parity.py).
"""

from __future__ import annotations

import fnmatch
import json
import os
import warnings
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from slime_gb10 import __version__
from slime_gb10.nvfp4.format import BLOCK_SIZE, GLOBAL_SCALE_DIVISOR, NVFP4Tensor
from slime_gb10.nvfp4.linear import (
    NVFP4Linear,
    default_backend,
    fused_groups,
    nvfp4_layers,
    quantize_model,
)
from slime_gb10.nvfp4.ops import dequantize, quantize
from slime_gb10.utils.atomic import atomic_directory
from slime_gb10.utils.errors import UserError

WEIGHTS_NAME = "model.safetensors"
HF_QUANT_CONFIG_NAME = "hf_quant_config.json"
CONFIG_NAME = "config.json"
QUANT_ALGO = "NVFP4"
DEFAULT_KEEP_FP32 = ("*e_score_correction_bias",)


class CheckpointError(UserError, ValueError):
    """A checkpoint directory is not a usable NVFP4 checkpoint; the message says why."""


def quantization_config(exclude_modules: list[str]) -> dict:
    """The flat ``quantization_config`` for ``config.json`` (ModelOpt's current form).

    ``config_groups`` is what ModelOpt 0.47's ``export_hf_checkpoint`` writes (llm-compressor's
    schema: static FP4 weights and activations in groups of 16, on ``Linear`` layers); the top-level
    ``group_size`` is what SGLang's ``ModelOptFp4Config.from_config`` reads first.
    """
    fp4_groups = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": BLOCK_SIZE}
    return {
        "quant_method": "modelopt",
        "quant_algo": QUANT_ALGO,
        "config_groups": {
            "group_0": {"input_activations": fp4_groups, "weights": dict(fp4_groups), "targets": ["Linear"]}
        },
        "group_size": BLOCK_SIZE,
        "kv_cache_quant_algo": None,
        "exclude_modules": list(exclude_modules),
        "ignore": list(exclude_modules),
        "producer": {"name": "slime-gb10", "version": __version__},
    }


def hf_quant_config(exclude_modules: list[str]) -> dict:
    """The legacy nested ``hf_quant_config.json``."""
    return {
        "producer": {"name": "slime-gb10", "version": __version__},
        "quantization": {
            "quant_algo": QUANT_ALGO,
            "kv_cache_quant_algo": None,
            "group_size": BLOCK_SIZE,
            "exclude_modules": list(exclude_modules),
        },
    }


def _input_scale(layer: NVFP4Linear) -> torch.Tensor | None:
    """``input_amax / (6 * 448)`` from calibration, else a loaded ``input_scale``; None if neither."""
    amax = layer.input_amax.detach().float().cpu()
    if amax > 0:
        return (amax / GLOBAL_SCALE_DIVISOR).reshape(())
    if layer.packed and layer.input_scale > 0:
        return layer.input_scale.detach().float().cpu().reshape(())
    return None


def _shared_quantized_weights(model: nn.Module) -> dict[str, NVFP4Tensor]:
    """Each layer's NVFP4 weight, re-quantized where fused siblings disagree on ``weight_scale_2``."""
    layers = dict(nvfp4_layers(model))
    weights = {name: layer.quantized_weight() for name, layer in layers.items()}
    for group in fused_groups(layers):
        scales = [weights[n].global_scale.float().cpu() for n in group]
        if all(torch.equal(s, scales[0]) for s in scales):
            continue
        shared = torch.stack(scales).max()
        if any(layers[n].packed for n in group):
            warnings.warn(
                f"fused layers {group} have different weight_scale_2; re-quantizing them with the "
                "largest one (quantize_model(share_fused_scales=True) avoids this)",
                stacklevel=3,
            )
        for n in group:
            source = dequantize(weights[n], torch.float32) if layers[n].packed else layers[n].weight.detach()
            weights[n] = quantize(source, shared.to(source.device))
    return weights


def _refuse_fused_experts(model: nn.Module) -> None:
    """MoE experts stored as 3-D parameters (transformers' fused ``*Experts`` modules) are not
    ``nn.Linear`` layers, so they stay unquantized, under names (``experts.gate_up_proj``) that
    differ from the per-expert ones checkpoints use and SGLang loads. Refuse rather than write that."""
    fused = [
        f"{name}.{pname} {list(p.shape)}" if name else f"{pname} {list(p.shape)}"
        for name, module in model.named_modules()
        if not isinstance(module, nn.modules.conv._ConvNd)
        for pname, p in module.named_parameters(recurse=False)
        if p.dim() >= 3 and p.is_floating_point()
    ]
    if fused:
        raise CheckpointError(
            f"the model has {len(fused)} fused MoE expert weights (e.g. {fused[:2]}); NVFP4Linear "
            "replaces nn.Linear layers only, and a checkpoint with these unquantized under their fused "
            "names is not what SGLang or vLLM load. Quantize and export this model with NVIDIA ModelOpt "
            "(mtq.quantize(model, mtq.NVFP4_DEFAULT_CFG, forward_loop) + export_hf_checkpoint)."
        )


def nvfp4_state_dict(
    model: nn.Module, keep_fp32: tuple[str, ...] = DEFAULT_KEEP_FP32, *, allow_uncalibrated: bool = False
) -> dict[str, torch.Tensor]:
    """The tensors of the ModelOpt NVFP4 checkpoint of ``model`` (on the CPU, contiguous)."""
    _refuse_fused_experts(model)
    layers = dict(nvfp4_layers(model))
    weights = _shared_quantized_weights(model)
    input_scales = {name: _input_scale(layer) for name, layer in layers.items()}
    uncalibrated = sorted(name for name, scale in input_scales.items() if scale is None)
    if uncalibrated and not allow_uncalibrated:
        raise CheckpointError(
            f"{len(uncalibrated)} NVFP4 layers have no activation scale (e.g. {uncalibrated[:3]}): "
            "SGLang quantizes activations with input_scale, so a made-up one (1.0) clips or flushes "
            "them to zero. Quantize with quantize_model(model, forward_loop=...) running a few "
            "representative batches, or run them inside `with slime_gb10.nvfp4.calibration(model): "
            "...` before exporting, or pass allow_uncalibrated=True to write input_scale = 1.0 knowingly."
        )
    for name in uncalibrated:
        input_scales[name] = torch.ones((), dtype=torch.float32)
    for group in fused_groups(layers):
        shared = torch.stack([input_scales[n] for n in group]).max()
        for n in group:
            input_scales[n] = shared

    out: dict[str, torch.Tensor] = {}
    for name, layer in layers.items():
        prefix = f"{name}." if name else ""
        q = weights[name]
        out[prefix + "weight"] = q.data
        out[prefix + "weight_scale"] = q.scale
        out[prefix + "weight_scale_2"] = q.global_scale.float().reshape(())
        out[prefix + "input_scale"] = input_scales[name]
        if layer.bias is not None:
            out[prefix + "bias"] = layer.bias.detach().to(torch.bfloat16)

    layer_prefixes = tuple(f"{name}." for name in layers)
    written: set[tuple] = set()
    for key, tensor in model.state_dict().items():
        if "" in layers or key.startswith(layer_prefixes):  # an NVFP4 layer's own tensors: done above
            continue
        if _storage_key(tensor) in written:
            # a tied weight (lm_head = embed_tokens): written once under its first name, as
            # transformers' save_pretrained and ModelOpt's export do; loading re-ties it
            continue
        written.add(_storage_key(tensor))
        tensor = tensor.detach()
        if tensor.is_floating_point() and not any(fnmatch.fnmatchcase(key, p) for p in keep_fp32):
            tensor = tensor.to(torch.bfloat16)
        out[key] = tensor
    return {k: v.detach().cpu().contiguous().clone() for k, v in out.items()}


def _storage_key(tensor: torch.Tensor) -> tuple:
    """Equal for two state-dict entries that are the same tensor (tied weights)."""
    return (tensor.device, tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))


def excluded_modules(model: nn.Module) -> list[str]:
    """Names of the linear layers left unquantized (they go to ``ignore``/``exclude_modules``)."""
    return [name for name, m in model.named_modules() if type(m) is nn.Linear]


def export_nvfp4(
    model: nn.Module,
    output_dir: str | os.PathLike,
    *,
    config: dict | None = None,
    keep_fp32: tuple[str, ...] = DEFAULT_KEEP_FP32,
    allow_uncalibrated: bool = False,
) -> Path:
    """Write ``model`` (with :class:`NVFP4Linear` layers) as a ModelOpt NVFP4 HF checkpoint.

    ``config`` defaults to ``model.config.to_dict()`` for a Hugging Face model. The directory is
    written atomically: a crash leaves the previous one (or none), never a half-written one.
    """
    if not any(True for _ in nvfp4_layers(model)):
        raise CheckpointError(
            "the model has no NVFP4Linear layers; call slime_gb10.nvfp4.quantize_model(model) first"
        )
    tensors = nvfp4_state_dict(model, keep_fp32, allow_uncalibrated=allow_uncalibrated)
    exclude = excluded_modules(model)
    if config is None and hasattr(model, "config") and hasattr(model.config, "to_dict"):
        config = model.config.to_dict()
    config = dict(config or {})
    config["quantization_config"] = quantization_config(exclude)
    # every unquantized tensor is written in BF16: say so under both spellings transformers uses
    # (a stale "float32" would make engines pick FP32/FP16 activations)
    config["torch_dtype"] = config["dtype"] = "bfloat16"
    with atomic_directory(output_dir) as tmp:
        save_file(tensors, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2, default=str) + "\n")
        (tmp / HF_QUANT_CONFIG_NAME).write_text(json.dumps(hf_quant_config(exclude), indent=2) + "\n")
    return Path(output_dir)


def read_quantization_config(checkpoint_dir: str | os.PathLike) -> dict:
    """The flat quantization config of a checkpoint (from config.json, else hf_quant_config.json)."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory '{root}' does not exist")
    config_path, hf_path = root / CONFIG_NAME, root / HF_QUANT_CONFIG_NAME
    if config_path.is_file():
        qc = json.loads(config_path.read_text()).get("quantization_config")
        if isinstance(qc, dict) and qc.get("quant_algo"):
            qc = dict(qc)
            qc.setdefault("exclude_modules", qc.get("ignore", []))
            return qc
    if hf_path.is_file():
        return dict(json.loads(hf_path.read_text())["quantization"])
    raise CheckpointError(
        f"'{root}' has no NVFP4 quantization config ({CONFIG_NAME} quantization_config or "
        f"{HF_QUANT_CONFIG_NAME}); is it an NVFP4 checkpoint?"
    )


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)}"


def validate_nvfp4_tensors(
    model: nn.Module, tensors: dict[str, torch.Tensor], quantized: set[str], root: Path
) -> None:
    """Check every checkpoint tensor against ``model`` before anything is copied.

    For each NVFP4 layer ``q`` (an ``nn.Linear`` [out, in] of the model): ``q.weight`` uint8
    [out, in/2], ``q.weight_scale`` float8_e4m3fn [out, in/16] and finite, ``q.weight_scale_2`` and
    ``q.input_scale`` one finite positive float32 each, ``q.bias`` [out] if the layer has one.
    Every other tensor: a tensor of the model with the same shape, floating where the model's is,
    finite. Raises :class:`CheckpointError` naming the tensor, what was expected and what was found.
    """
    modules = dict(model.named_modules())
    state = model.state_dict()
    problems: list[str] = []

    def check(key: str, dtype: torch.dtype | None, shape: tuple[int, ...] | None, *, scalar: bool = False):
        t = tensors.get(key)
        want = f"{str(dtype).removeprefix('torch.') if dtype else 'float'} {list(shape) if shape else '[] (one value)'}"
        if t is None:
            problems.append(f"tensor '{key}' is missing (expected {want})")
            return
        bad_dtype = (t.dtype != dtype) if dtype is not None else not t.dtype.is_floating_point
        bad_shape = (t.numel() != 1) if scalar else tuple(t.shape) != shape
        if bad_dtype or bad_shape:
            problems.append(f"tensor '{key}': expected {want}, found {_describe(t)}")
        elif t.dtype.is_floating_point and not bool(torch.isfinite(t.float()).all()):
            problems.append(f"tensor '{key}' holds NaN or Inf values")
        elif scalar and float(t.float().reshape(-1)[0]) <= 0:
            problems.append(f"tensor '{key}' must be positive, found {float(t.float().reshape(-1)[0])}")

    for name in sorted(quantized):
        layer = modules.get(name)
        if not isinstance(layer, nn.Linear):
            continue  # reported by load_nvfp4 as a module the model lacks
        out_f, in_f = layer.out_features, layer.in_features
        check(f"{name}.weight", torch.uint8, (out_f, in_f // 2))
        check(f"{name}.weight_scale", torch.float8_e4m3fn, (out_f, in_f // BLOCK_SIZE))
        check(f"{name}.weight_scale_2", torch.float32, None, scalar=True)
        check(f"{name}.input_scale", torch.float32, None, scalar=True)
        if layer.bias is not None:
            check(f"{name}.bias", None, (out_f,))
    prefixes = tuple(f"{name}." for name in quantized)
    for key, t in tensors.items():
        if key.startswith(prefixes) or key not in state:
            continue  # NVFP4 parts are checked above; unknown names are reported by load_nvfp4
        target = state[key]
        if (
            tuple(t.shape) != tuple(target.shape)
            or t.dtype.is_floating_point != target.dtype.is_floating_point
        ):
            problems.append(f"tensor '{key}': expected {_describe(target)}, found {_describe(t)}")
        elif t.dtype.is_floating_point and not bool(torch.isfinite(t.float()).all()):
            problems.append(f"tensor '{key}' holds NaN or Inf values")
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise CheckpointError(
            f"NVFP4 checkpoint '{root}' does not fit the model: {'; '.join(problems[:3])}{more}"
        )


def load_nvfp4(
    model: nn.Module,
    checkpoint_dir: str | os.PathLike,
    *,
    backend: str | None = None,
) -> nn.Module:
    """Load a ModelOpt NVFP4 checkpoint into ``model`` (built with the same architecture, e.g.
    ``AutoModelForCausalLM.from_config``): its ``nn.Linear`` layers not in ``exclude_modules`` become
    :class:`NVFP4Linear` holding the stored codes and scales bit for bit; other tensors are copied.
    """
    root = Path(checkpoint_dir)
    qc = read_quantization_config(root)
    if qc.get("quant_algo") != QUANT_ALGO or int(qc.get("group_size", BLOCK_SIZE)) != BLOCK_SIZE:
        raise CheckpointError(
            f"'{root}' is quantized as {qc.get('quant_algo')} with group_size {qc.get('group_size')}; "
            f"only {QUANT_ALGO} with group_size {BLOCK_SIZE} is supported"
        )
    weights_path = root / WEIGHTS_NAME
    if not weights_path.is_file():
        raise CheckpointError(f"'{weights_path}' is missing")
    with safe_open(str(weights_path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iterator)

    quantized = {k[: -len(".weight_scale")] for k in tensors if k.endswith(".weight_scale")}
    validate_nvfp4_tensors(model, tensors, quantized, root)  # before the model is touched
    exclude = list(qc.get("exclude_modules") or [])
    quantize_model(
        model,
        include=sorted(quantized),
        exclude=exclude,
        backend="reference",
        share_fused_scales=False,
    )
    layers = dict(nvfp4_layers(model))
    missing = sorted(quantized - set(layers))
    if missing:
        raise CheckpointError(f"checkpoint has NVFP4 weights for modules the model lacks: {missing[:5]}")
    for name, layer in layers.items():
        q = NVFP4Tensor(
            tensors.pop(f"{name}.weight"),
            tensors.pop(f"{name}.weight_scale"),
            tensors.pop(f"{name}.weight_scale_2").float().reshape(()),
            torch.Size((layer.out_features, layer.in_features)),
            layer.dtype,
        )
        layer.set_quantized_weight(q)
        layer.input_scale = tensors.pop(f"{name}.input_scale").float().reshape(()).to(layer.weight.device)
        if layer.bias is not None:
            with torch.no_grad():
                layer.bias.copy_(tensors.pop(f"{name}.bias"))
        target = backend or default_backend(layer.weight.device)
        if target != layer.backend:
            layer.set_backend(target)

    state = model.state_dict()
    unexpected = sorted(k for k in tensors if k not in state)
    if unexpected:
        raise CheckpointError(f"checkpoint tensors that the model does not have: {unexpected[:5]}")
    loaded = {_storage_key(state[k]) for k in tensors}
    layer_prefixes = tuple(f"{name}." for name in layers)
    absent = sorted(
        k
        for k, t in state.items()
        if k not in tensors and not k.startswith(layer_prefixes) and _storage_key(t) not in loaded
    )
    if absent:
        raise CheckpointError(
            f"checkpoint lacks {len(absent)} tensors the model has (e.g. {absent[:3]}); a tied "
            "lm_head is written once, as embed_tokens: build the model with the checkpoint's "
            "config.json (tie_word_embeddings included)"
        )
    with torch.no_grad():
        for key, tensor in tensors.items():
            state[key].copy_(tensor.to(state[key].dtype))
    return model
