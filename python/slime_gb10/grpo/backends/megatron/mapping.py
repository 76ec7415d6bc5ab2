"""Hugging Face ↔ Megatron-core names and layouts for Llama-family decoders (pure torch).

Covers the Llama / Qwen2 / SmolLM2 family: RMSNorm, RoPE (rotate-half), SwiGLU, grouped-query
attention, optional QKV bias (Qwen2), tied or untied embeddings. Nothing here imports
``megatron``: the mapping is plain tensor reshaping, testable on any CPU.

Layouts (Megatron-core ``SelfAttention.get_query_key_value_tensors`` and ``MLP`` with
``gated_linear_unit=True``):

* ``linear_qkv.weight`` is ``[ng * (nq/ng + 2) * hd, H]``: viewed as ``[ng, (nq/ng + 2) * hd, H]``,
  query group ``g`` holds its ``nq/ng`` query heads, then its key head, then its value head.
  Hugging Face keeps ``q_proj [nq*hd, H]``, ``k_proj [ng*hd, H]``, ``v_proj [ng*hd, H]``, and
  query head ``j`` attends with key/value head ``j // (nq/ng)`` (``repeat_kv``), which is
  exactly Megatron's grouping. Biases follow the same layout without the ``H`` axis.
* ``linear_fc1.weight`` is ``[gate; up]`` (``2 * F, H``): Megatron's SwiGLU computes
  ``silu(x1) * x2`` on ``torch.chunk(fc1(x), 2, dim=-1)``.
* Norm weights live inside the fused TE linears with the TransformerEngine layer spec
  (``linear_qkv.layer_norm_weight``, ``linear_fc1.layer_norm_weight``) and as separate modules
  with the local spec (``input_layernorm.weight``, ``pre_mlp_layernorm.weight``).

The mapping is a pure permutation of bytes, so HF → Megatron → HF is bit-exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from slime_gb10.utils.errors import UserError

LayerSpecFlavor = Literal["te", "local"]
LAYER_SPEC_FLAVORS: tuple[LayerSpecFlavor, ...] = ("te", "local")

# Hugging Face ``model_type`` values whose decoder this mapping covers.
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")


class MappingError(UserError, ValueError):
    """A checkpoint or config does not fit the HF ↔ Megatron mapping (names the problem and the fix)."""


@dataclass(frozen=True)
class DecoderArch:
    """The architecture numbers of a Llama-family decoder, read from a Hugging Face config."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise MappingError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}; grouped-query attention needs it"
            )

    @property
    def heads_per_group(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def qkv_rows(self) -> int:
        """Rows of the fused ``linear_qkv`` weight: ``ng * (nq/ng + 2) * hd``."""
        return self.num_key_value_heads * (self.heads_per_group + 2) * self.head_dim

    @classmethod
    def from_hf_config(cls, config: Any) -> DecoderArch:
        """Read a ``transformers`` ``LlamaConfig`` / ``Qwen2Config`` (or anything with the same fields)."""
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise MappingError(
                f"model_type={model_type!r} is not supported by the Megatron backend "
                f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)}); use the PyTorch backend for it"
            )
        hidden_act = getattr(config, "hidden_act", "silu")
        if hidden_act != "silu":
            raise MappingError(f"hidden_act={hidden_act!r}: the Megatron backend maps SwiGLU (silu) only")
        if getattr(config, "mlp_bias", False):
            raise MappingError("mlp_bias=True is not supported (Megatron runs add_bias_linear=False)")
        rope_scaling = getattr(config, "rope_scaling", None)
        rope_type = (rope_scaling or {}).get("rope_type", (rope_scaling or {}).get("type", "default"))
        if rope_type not in (None, "default"):
            raise MappingError(
                f"rope_scaling type {rope_type!r} is not mapped to Megatron; use the PyTorch backend"
            )
        if model_type == "qwen2":
            qkv_bias = True  # Qwen2 always has q/k/v biases and no o_proj bias
        else:
            if getattr(config, "attention_bias", False):
                raise MappingError(
                    "attention_bias=True on a Llama config also puts a bias on o_proj, which "
                    "Megatron's add_qkv_bias does not cover; use the PyTorch backend"
                )
            qkv_bias = False
        if model_type == "mistral" and getattr(config, "sliding_window", None):
            raise MappingError("sliding-window attention is not mapped to Megatron")
        nq = int(config.num_attention_heads)
        nkv = int(getattr(config, "num_key_value_heads", None) or nq)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // nq
        rope_theta = getattr(config, "rope_theta", None)
        if rope_theta is None:  # transformers >= 5 keeps it in rope_parameters
            rope_theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        return cls(
            num_layers=int(config.num_hidden_layers),
            hidden_size=int(config.hidden_size),
            num_attention_heads=nq,
            num_key_value_heads=nkv,
            head_dim=int(head_dim),
            intermediate_size=int(config.intermediate_size),
            vocab_size=int(config.vocab_size),
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            rms_norm_eps=float(config.rms_norm_eps),
            rope_theta=float(rope_theta),
            max_position_embeddings=int(getattr(config, "max_position_embeddings", 4096)),
        )


# ---------------------------------------------------------------- fused layouts


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arch: DecoderArch) -> torch.Tensor:
    """HF ``q_proj``/``k_proj``/``v_proj`` (weights ``[*, H]`` or biases ``[*]``) → Megatron ``linear_qkv``.

    Per query group ``g``: its ``nq/ng`` query heads, then key head ``g``, then value head ``g``.
    """
    ng, hd = arch.num_key_value_heads, arch.head_dim
    rest = q.shape[1:]
    _check_shape("q_proj", q, (arch.num_attention_heads * hd, *rest))
    _check_shape("k_proj", k, (ng * hd, *rest))
    _check_shape("v_proj", v, (ng * hd, *rest))
    grouped = torch.cat(
        [q.reshape(ng, arch.heads_per_group * hd, *rest), k.reshape(ng, hd, *rest), v.reshape(ng, hd, *rest)],
        dim=1,
    )
    return grouped.reshape(arch.qkv_rows, *rest)


def split_qkv(qkv: torch.Tensor, arch: DecoderArch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`fuse_qkv`: Megatron ``linear_qkv`` → HF ``(q_proj, k_proj, v_proj)``."""
    ng, hd = arch.num_key_value_heads, arch.head_dim
    rest = qkv.shape[1:]
    _check_shape("linear_qkv", qkv, (arch.qkv_rows, *rest))
    grouped = qkv.reshape(ng, (arch.heads_per_group + 2) * hd, *rest)
    q, k, v = torch.split(grouped, [arch.heads_per_group * hd, hd, hd], dim=1)
    return (
        q.reshape(arch.num_attention_heads * hd, *rest),
        k.reshape(ng * hd, *rest),
        v.reshape(ng * hd, *rest),
    )


def fuse_gate_up(gate: torch.Tensor, up: torch.Tensor, arch: DecoderArch) -> torch.Tensor:
    """HF ``gate_proj``, ``up_proj`` ``[F, H]`` → Megatron ``linear_fc1`` ``[gate; up]`` ``[2F, H]``."""
    shape = (arch.intermediate_size, arch.hidden_size)
    _check_shape("gate_proj", gate, shape)
    _check_shape("up_proj", up, shape)
    return torch.cat([gate, up], dim=0)


def split_gate_up(fc1: torch.Tensor, arch: DecoderArch) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`fuse_gate_up`."""
    _check_shape("linear_fc1", fc1, (2 * arch.intermediate_size, arch.hidden_size))
    gate, up = torch.chunk(fc1, 2, dim=0)
    return gate, up


def _check_shape(what: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != tuple(shape):
        raise MappingError(
            f"{what} has shape {tuple(tensor.shape)}, expected {tuple(shape)} for this config "
            "(does the checkpoint belong to this model config?)"
        )


# ---------------------------------------------------------------- names


def megatron_layer_names(i: int, arch: DecoderArch, flavor: LayerSpecFlavor) -> dict[str, str]:
    """Megatron parameter names of decoder layer ``i``, keyed by role."""
    p = f"decoder.layers.{i}."
    if flavor == "te":
        input_norm, mlp_norm = (
            "self_attention.linear_qkv.layer_norm_weight",
            "mlp.linear_fc1.layer_norm_weight",
        )
    elif flavor == "local":
        input_norm, mlp_norm = "input_layernorm.weight", "pre_mlp_layernorm.weight"
    else:
        raise MappingError(f"layer spec flavor {flavor!r} is not one of {LAYER_SPEC_FLAVORS}")
    # In the order iter_hf_to_megatron yields them.
    names = {"input_norm": p + input_norm, "qkv": p + "self_attention.linear_qkv.weight"}
    if arch.qkv_bias:
        names["qkv_bias"] = p + "self_attention.linear_qkv.bias"
    names |= {
        "proj": p + "self_attention.linear_proj.weight",
        "mlp_norm": p + mlp_norm,
        "fc1": p + "mlp.linear_fc1.weight",
        "fc2": p + "mlp.linear_fc2.weight",
    }
    return names


def hf_layer_names(i: int, arch: DecoderArch) -> dict[str, str]:
    """Hugging Face parameter names of decoder layer ``i``, keyed by role."""
    p = f"model.layers.{i}."
    names = {
        "q": p + "self_attn.q_proj.weight",
        "k": p + "self_attn.k_proj.weight",
        "v": p + "self_attn.v_proj.weight",
        "o": p + "self_attn.o_proj.weight",
        "gate": p + "mlp.gate_proj.weight",
        "up": p + "mlp.up_proj.weight",
        "down": p + "mlp.down_proj.weight",
        "input_norm": p + "input_layernorm.weight",
        "mlp_norm": p + "post_attention_layernorm.weight",
    }
    if arch.qkv_bias:
        names |= {
            "q_bias": p + "self_attn.q_proj.bias",
            "k_bias": p + "self_attn.k_proj.bias",
            "v_bias": p + "self_attn.v_proj.bias",
        }
    return names


MEGATRON_EMBEDDING = "embedding.word_embeddings.weight"
MEGATRON_FINAL_NORM = "decoder.final_layernorm.weight"
MEGATRON_OUTPUT = "output_layer.weight"
HF_EMBEDDING = "model.embed_tokens.weight"
HF_FINAL_NORM = "model.norm.weight"
HF_LM_HEAD = "lm_head.weight"


def megatron_names(arch: DecoderArch, flavor: LayerSpecFlavor) -> list[str]:
    """Every Megatron parameter name of the model, in module order."""
    names = [MEGATRON_EMBEDDING]
    for i in range(arch.num_layers):
        names += list(megatron_layer_names(i, arch, flavor).values())
    names.append(MEGATRON_FINAL_NORM)
    if not arch.tie_word_embeddings:
        names.append(MEGATRON_OUTPUT)
    return names


def hf_names(arch: DecoderArch) -> list[str]:
    """Every Hugging Face parameter name (as ``named_parameters()`` lists them: no tied ``lm_head``)."""
    names = [HF_EMBEDDING]
    for i in range(arch.num_layers):
        names += list(hf_layer_names(i, arch).values())
    names.append(HF_FINAL_NORM)
    if not arch.tie_word_embeddings:
        names.append(HF_LM_HEAD)
    return names


# ---------------------------------------------------------------- conversions


def _check_keys(state: Mapping[str, torch.Tensor], expected: list[str], side: str, ignore=()) -> None:
    present = {k for k in state if not k.endswith("._extra_state") and k not in ignore}
    missing = [k for k in expected if k not in present]
    unexpected = sorted(present - set(expected))
    if missing or unexpected:
        raise MappingError(
            f"{side} state does not match the config: {len(missing)} missing "
            f"(first: {missing[:3]}), {len(unexpected)} unexpected (first: {unexpected[:3]}); "
            "check the model config (layers, tie_word_embeddings, qkv bias) and the layer spec flavor"
        )


def iter_hf_to_megatron(
    hf_state: Mapping[str, torch.Tensor], arch: DecoderArch, flavor: LayerSpecFlavor
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(megatron_name, tensor)`` from a Hugging Face state dict, layer by layer.

    A tied checkpoint may carry ``lm_head.weight`` (equal to the embedding); it is ignored.
    """
    ignore = (HF_LM_HEAD,) if arch.tie_word_embeddings else ()
    _check_keys(hf_state, hf_names(arch), "Hugging Face", ignore=ignore)
    yield MEGATRON_EMBEDDING, hf_state[HF_EMBEDDING]
    for i in range(arch.num_layers):
        h, m = hf_layer_names(i, arch), megatron_layer_names(i, arch, flavor)
        yield m["input_norm"], hf_state[h["input_norm"]]
        yield m["qkv"], fuse_qkv(hf_state[h["q"]], hf_state[h["k"]], hf_state[h["v"]], arch)
        if arch.qkv_bias:
            yield (
                m["qkv_bias"],
                fuse_qkv(hf_state[h["q_bias"]], hf_state[h["k_bias"]], hf_state[h["v_bias"]], arch),
            )
        yield m["proj"], hf_state[h["o"]]
        yield m["mlp_norm"], hf_state[h["mlp_norm"]]
        yield m["fc1"], fuse_gate_up(hf_state[h["gate"]], hf_state[h["up"]], arch)
        yield m["fc2"], hf_state[h["down"]]
    yield MEGATRON_FINAL_NORM, hf_state[HF_FINAL_NORM]
    if not arch.tie_word_embeddings:
        yield MEGATRON_OUTPUT, hf_state[HF_LM_HEAD]


def iter_megatron_to_hf(
    mcore_state: Mapping[str, torch.Tensor], arch: DecoderArch, flavor: LayerSpecFlavor
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, tensor)`` from a Megatron state dict, layer by layer (un-fusing QKV and fc1).

    Lazy: only one layer's split views exist at a time, so a weight stream built on it keeps
    peak extra memory at one bucket. Names come out in :func:`hf_names` order.
    """
    _check_keys(mcore_state, megatron_names(arch, flavor), "Megatron")
    yield HF_EMBEDDING, mcore_state[MEGATRON_EMBEDDING]
    for i in range(arch.num_layers):
        h, m = hf_layer_names(i, arch), megatron_layer_names(i, arch, flavor)
        q, k, v = split_qkv(mcore_state[m["qkv"]], arch)
        yield h["q"], q
        yield h["k"], k
        yield h["v"], v
        yield h["o"], mcore_state[m["proj"]]
        gate, up = split_gate_up(mcore_state[m["fc1"]], arch)
        yield h["gate"], gate
        yield h["up"], up
        yield h["down"], mcore_state[m["fc2"]]
        yield h["input_norm"], mcore_state[m["input_norm"]]
        yield h["mlp_norm"], mcore_state[m["mlp_norm"]]
        if arch.qkv_bias:
            qb, kb, vb = split_qkv(mcore_state[m["qkv_bias"]], arch)
            yield h["q_bias"], qb
            yield h["k_bias"], kb
            yield h["v_bias"], vb
    yield HF_FINAL_NORM, mcore_state[MEGATRON_FINAL_NORM]
    if not arch.tie_word_embeddings:
        yield HF_LM_HEAD, mcore_state[MEGATRON_OUTPUT]


def hf_to_megatron(
    hf_state: Mapping[str, torch.Tensor], arch: DecoderArch, flavor: LayerSpecFlavor
) -> dict[str, torch.Tensor]:
    """Eager version of :func:`iter_hf_to_megatron`."""
    return dict(iter_hf_to_megatron(hf_state, arch, flavor))


def megatron_to_hf(
    mcore_state: Mapping[str, torch.Tensor], arch: DecoderArch, flavor: LayerSpecFlavor
) -> dict[str, torch.Tensor]:
    """Eager version of :func:`iter_megatron_to_hf` (tensors made contiguous)."""
    return {name: t.contiguous() for name, t in iter_megatron_to_hf(mcore_state, arch, flavor)}


def hf_named_tensors_fn(
    mcore_state_fn: Callable[[], Mapping[str, torch.Tensor]], arch: DecoderArch, flavor: LayerSpecFlavor
) -> Callable[[], Iterator[tuple[str, torch.Tensor]]]:
    """A re-callable HF-named tensor generator, the form ``weight_sync.WeightStream`` takes."""

    def named_tensors() -> Iterator[tuple[str, torch.Tensor]]:
        return iter_megatron_to_hf(mcore_state_fn(), arch, flavor)

    return named_tensors
