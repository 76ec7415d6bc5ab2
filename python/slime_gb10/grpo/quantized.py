"""NVFP4 in the GRPO loop (issue #39): the rollout's weights quantized at each sync
(``rollout.weights: nvfp4``) and quantization-aware training (``train.quantization: nvfp4-qat``),
so that the trainer's policy can be the rollout's.

Both quantize the layers :func:`slime_gb10.nvfp4.linear.select_linear` picks (the decoder's linear
layers; embeddings, norms and the LM head stay as they are), fused siblings (q/k/v, gate/up) with
one shared global scale, as a checkpoint an engine loads must have them. The rollout receives
``dequantize(quantize(W))`` in the transfer dtype: the very values the W4A16 kernel multiplies by
(it decodes the same codes exactly), so the engine decodes the NVFP4 policy whichever kernel runs
it; the bytes saved by decoding from the 4-bit codes are the W4A16 engine's (not yet wired into the
engine's CUDA graph: the speed half of the issue). Under QAT the trainer's forward computes the
same weights (NVFP4Linear's ``qat`` backend: master weights in full precision, fake quantization
with a straight-through gradient), so the two policies are one; without it they differ by the
quantization, which the ``mismatch_*`` metrics of every step measure (algo.rollout_mismatch).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn

_KEEP = object()  # a parameter the rollout receives as it is


def apply_qat(model: nn.Module) -> list[str]:
    """Train ``model`` through NVFP4 fake quantization: its selected linear layers become
    ``NVFP4Linear(backend="qat")`` in place (parameter names and master weights unchanged). Call it
    before the optimizer sees the parameters. Returns the quantized layers' names."""
    from slime_gb10.nvfp4.linear import quantize_model

    return quantize_model(model, backend="qat")


def is_qat(model: nn.Module) -> bool:
    from slime_gb10.nvfp4.linear import nvfp4_layers

    return any(layer.backend == "qat" for _, layer in nvfp4_layers(model))


def _global_scales(model: nn.Module) -> dict[str, torch.Tensor | None]:
    """Parameter name of each weight to quantize -> its global scale (None: the weight's own amax),
    from the master weights, as a QAT forward computes them."""
    from slime_gb10.nvfp4.linear import fused_groups, nvfp4_layers, select_linear, shared_global_scale

    if is_qat(model):  # exactly what each layer's forward computes
        return {
            f"{name}.weight": layer.fused_global_scale(layer.weight.dtype)
            for name, layer in nvfp4_layers(model)
        }
    chosen = select_linear(model)
    scales: dict[str, torch.Tensor | None] = {f"{name}.weight": None for name in chosen}
    for group in fused_groups(chosen):
        scale = shared_global_scale([chosen[name].weight for name in group])
        scales.update({f"{name}.weight": scale for name in group})
    return scales


def rollout_weights(
    model: nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """``named_tensors`` (the model's parameters by name) with each selected layer's weight replaced
    by its NVFP4 round trip, cast to ``dtype``; every other tensor as it is.

    The round trip is taken in the master weights' own precision, as the QAT forward takes it (under
    BF16 autocast a layer's input, and so its weight's fake quantization, stays FP32: the autocast
    casts the dequantized weight to BF16 for the matmul). Quantizing the BF16-cast weight instead
    picks other block scales for some blocks: measured on an H100, a QAT run's KL(rollout ||
    trainer) was 0.013 that way, against 0.0009 for plain BF16 rollouts."""
    from slime_gb10.nvfp4.ops import dequantize, quantize

    scales = _global_scales(model)
    with torch.no_grad():
        for name, tensor in named_tensors:
            scale = scales.get(name, _KEEP)
            if scale is _KEEP:
                yield name, tensor
            else:
                yield name, dequantize(quantize(tensor, scale), dtype=tensor.dtype).to(dtype)


def plain_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict as its plain ``nn.Linear`` layers would have it (a QAT model's layers
    carry an ``input_amax`` buffer a Hugging Face checkpoint has no place for)."""
    from slime_gb10.nvfp4.linear import nvfp4_layers

    extra = {f"{name}.input_amax" for name, _ in nvfp4_layers(model)}
    return {k: v for k, v in model.state_dict().items() if k not in extra}
