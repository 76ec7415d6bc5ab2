"""The torch engine's NVFP4 weights (``rollout.weights: nvfp4``): received as codes, decoded from.

The trainer sends each quantized layer as a ModelOpt checkpoint stores it (``<layer>.weight``
codes, ``.weight_scale``, ``.weight_scale_2``: :func:`slime_gb10.grpo.quantized.rollout_weights`
with ``codes=True``). :class:`EngineCodes` copies them into the buffers a decode step's W4A16
kernel reads (:func:`~slime_gb10.grpo.engines.torch.static_decoder.attach_decode_weights`) and
writes ``dequantize(codes)`` into the model's BF16 parameters, which the prefill (of prompts longer
than one token) and the decode steps where a BF16 GEMM is faster (large batches) multiply by: every
path computes with the one NVFP4 policy. The BF16 copy costs the engine 2 bytes a weight beside the codes' 0.625 (on
a GB10's shared memory a few GB for a 7B model); a decode step reads only the codes.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from slime_gb10.grpo.engines.torch.static_decoder import attach_decode_weights
from slime_gb10.grpo.quantized import code_names, rollout_weights
from slime_gb10.grpo.weight_sync import WeightSyncError
from slime_gb10.nvfp4.decode_weights import scales_valid
from slime_gb10.nvfp4.format import BLOCK_SIZE
from slime_gb10.nvfp4.linear import select_linear


def check_stream_form(names: Iterable[str], expects_codes: bool) -> None:
    """Refuse, before anything is written, a stream in the other form than the engine takes: dense
    weights for an engine that decodes NVFP4 codes, or codes for one that does not (check_metadata
    would list every mismatched tensor; this says what to change)."""
    carries_codes = any(name.endswith(".weight_scale_2") for name in names)
    if carries_codes == expects_codes:
        return
    if expects_codes:
        raise WeightSyncError(
            "weight sync refused before writing anything: this engine decodes from NVFP4 codes "
            "(rollout.weights=nvfp4) and the stream carries dense weights: export them with "
            "nvfp4_codes=True (the trainer does so for an engine whose receives_nvfp4_codes is set)"
        )
    raise WeightSyncError(
        "weight sync refused before writing anything: the stream carries NVFP4 codes and this engine "
        "takes dense weights: export them with nvfp4_codes=False, or build the engine with weights='nvfp4'"
    )


class EngineCodes:
    """The NVFP4 side of a torch engine's weights: which stream names are codes, and where they go."""

    def __init__(self, model, params: dict[str, torch.nn.Parameter]):
        self.model = model
        self.params = params
        self.weights = attach_decode_weights(model, select_linear(model))
        self._parts: dict[str, tuple[str, str]] = {}  # stream name -> (weight name, part)
        for name in self.weights:
            for part, stream_name in zip(("data", "scale", "global_scale"), code_names(name), strict=True):
                self._parts[stream_name] = (name, part)
        device = next(iter(params.values())).device
        # each weight's global scale as streamed, to check that fused siblings sent one (finish)
        self._global_scales = torch.ones(len(self.weights), dtype=torch.float32, device=device)
        self._slot = {name: i for i, name in enumerate(self.weights)}

    @classmethod
    def for_model(cls, model, params: dict[str, torch.nn.Parameter]) -> EngineCodes | None:
        """The engine's codes, or None where no layer is quantized (``in_features`` not a multiple
        of 16: the trainer then streams every weight as it is, and so does the engine take them)."""
        return cls(model, params) if select_linear(model) else None

    def expected(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """The stream's codes tensors, by name: ``(shape, dtype)`` for ``check_metadata``."""
        out = {}
        for name, weight in self.weights.items():
            n, k = weight.shape
            codes, scale, global_scale = code_names(name)
            out[codes] = ((n, k // 2), torch.uint8)
            out[scale] = ((n, k // BLOCK_SIZE), torch.float8_e4m3fn)
            out[global_scale] = ((), torch.float32)
        return out

    def owns(self, name: str) -> bool:
        return name in self._parts

    @torch.no_grad()
    def receive(self, name: str, tensor: torch.Tensor) -> None:
        """Copy one streamed codes tensor into its buffer (shapes and dtypes checked before the
        stream started: ``check_metadata`` against :meth:`expected`)."""
        weight_name, part = self._parts[name]
        weight = self.weights[weight_name]
        if part == "global_scale":
            self._global_scales[self._slot[weight_name]] = tensor.reshape(())
            weight.global_scale.copy_(tensor.reshape(1))
        else:
            getattr(weight, part).copy_(tensor)

    @torch.no_grad()
    def finish(self) -> None:
        """After a whole stream: the fused kernel's scale codes and the BF16 parameters from the
        codes; then one host sync checks every block scale (finite, >= 0) and that fused siblings
        sent one global scale (their codes share one; the trainer's quantization gives them one)."""
        for name, weight in self.weights.items():
            weight.refresh()
            self.params[name].copy_(weight.dequantize(torch.float32))
        shared = torch.stack([self.weights[name].global_scale[0] for name in self.weights])
        ok = scales_valid(self.weights.values()) & (shared == self._global_scales).all()
        if not bool(ok):
            raise WeightSyncError(
                "NVFP4 weight sync: a block scale is negative or not finite, or the siblings of a fused "
                "layer (q/k/v, gate/up) sent different weight_scale_2; the engine's weights are now "
                "unusable: quantize fused siblings with one global scale (nvfp4.linear.shared_global_scale)"
            )

    def load(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in named_tensors:
            self.receive(name, tensor)
        self.finish()

    def quantize_own_weights(self) -> None:
        """Quantize the engine's current weights (as the trainer's first sync would from the same
        checkpoint), so that the engine decodes the NVFP4 policy even before a sync."""
        named = ((name, param.detach()) for name, param in self.params.items())
        self.load(
            (name, tensor)
            for name, tensor in rollout_weights(self.model, named, torch.float32, codes=True)
            if self.owns(name)
        )
