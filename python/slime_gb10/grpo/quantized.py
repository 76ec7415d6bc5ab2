"""NVFP4 in the GRPO loop (issue #39): the rollout's weights quantized at each sync
(``rollout.weights: nvfp4``) and quantization-aware training (``train.quantization: nvfp4-qat``),
so that the trainer's policy can be the rollout's.

Both quantize the layers :func:`slime_gb10.nvfp4.linear.select_linear` picks (the decoder's linear
layers; embeddings, norms and the LM head stay as they are), fused siblings (q/k/v, gate/up) with
one shared global scale, as a checkpoint an engine loads must have them. The rollout receives
either ``dequantize(quantize(W))`` in the transfer dtype or the codes themselves (``codes=True``,
for the torch engine, whose decode steps multiply them with the W4A16 kernel:
:mod:`slime_gb10.grpo.engines.torch.nvfp4_weights`): the same numbers, since the kernel decodes the
codes exactly, so the engine decodes the NVFP4 policy whichever kernel runs it. Under QAT the trainer's forward computes the
same weights (NVFP4Linear's ``qat`` backend: master weights in full precision, fake quantization
with a straight-through gradient), so the two policies are one; without it they differ by the
quantization, which the ``mismatch_*`` metrics of every step measure (algo.rollout_mismatch).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Iterator
from pathlib import Path

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


def _global_scales(model: nn.Module, *, names_only: bool = False) -> dict[str, torch.Tensor | None]:
    """Parameter name of each weight to quantize -> its global scale (None: the weight's own amax),
    from the master weights, as a QAT forward computes them (``names_only``: all None)."""
    from slime_gb10.nvfp4.linear import fused_groups, nvfp4_layers, select_linear, shared_global_scale

    if names_only:
        layers = [name for name, _ in nvfp4_layers(model)] if is_qat(model) else list(select_linear(model))
        return dict.fromkeys((f"{name}.weight" for name in layers), None)
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


class CodeChanges:
    """How much of the NVFP4 policy a sync changed: the share of the quantized weights whose 4-bit
    code, and of their blocks whose E4M3 scale, differ from the previous sync's (RL updates are far
    smaller than a quantization step, so most codes may not move at all). Keeps the last sync's codes
    and scales where they were made: 0.5625 bytes per quantized weight. The counts stay on the
    device until :meth:`take` reads them with the step's metrics."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._changed: list[torch.Tensor] = []  # [codes changed, scales changed] of each weight
        self._totals = [0, 0]  # codes, scales compared

    def begin(self) -> None:
        """A sync starts: the counts are this sync's alone (a pass that is not a sync, such as the
        ranks' weight digest at setup, must not add to them); the comparison stays with the last
        weights seen."""
        self._changed, self._totals = [], [0, 0]

    def observe(self, name: str, data: torch.Tensor, scale: torch.Tensor) -> None:
        """One quantized weight of this sync: ``data`` its packed codes (two per byte), ``scale``
        its block scales."""
        scale = scale.view(torch.uint8)
        last = self._last.get(name)
        if last is not None:
            flipped = last[0] ^ data
            codes = (flipped & 0x0F).ne(0).sum() + (flipped >> 4).ne(0).sum()
            scales = last[1].ne(scale).sum()
            self._changed.append(torch.stack([codes, scales]))  # stays on the device
            self._totals[0] += 2 * data.numel()  # counted on the host: no copy, no sync
            self._totals[1] += scale.numel()
        self._last[name] = (data, scale)

    def take(self) -> dict[str, float]:
        """``{"nvfp4_codes_changed", "nvfp4_scales_changed"}`` since the previous sync (shares; one
        host sync), then reset; empty before a second sync."""
        if not self._changed:
            return {}
        codes_changed, scales_changed = torch.stack(self._changed).sum(0).tolist()
        (codes, scales), self._changed, self._totals = self._totals, [], [0, 0]
        return {"nvfp4_codes_changed": codes_changed / codes, "nvfp4_scales_changed": scales_changed / scales}


def rollout_weights(
    model: nn.Module,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype,
    changes: CodeChanges | None = None,
    *,
    metadata_only: bool = False,
    codes: bool = False,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``named_tensors`` (the model's parameters by name) with each selected layer's weight replaced
    by its NVFP4 round trip, cast to ``dtype``; every other tensor as it is.

    ``codes``: each selected weight ``<layer>.weight`` travels as a ModelOpt checkpoint stores it
    instead, three tensors: ``<layer>.weight`` (packed E2M1 codes, uint8 ``[N, K/2]``),
    ``<layer>.weight_scale`` (E4M3 ``[N, K/16]``) and ``<layer>.weight_scale_2`` (FP32 scalar), for
    an engine that decodes from the codes (:mod:`slime_gb10.nvfp4.decode_weights`), 9/32 of the
    BF16 bytes.

    The round trip is taken in the master weights' own precision, as the QAT forward takes it (under
    BF16 autocast a layer's input, and so its weight's fake quantization, stays FP32: the autocast
    casts the dequantized weight to BF16 for the matmul). Quantizing the BF16-cast weight instead
    picks other block scales for some blocks: measured on an H100, a QAT run's KL(rollout ||
    trainer) was 0.013 that way, against 0.0009 for plain BF16 rollouts. ``changes`` counts the
    codes and scales that moved since the previous sync. ``metadata_only``: the same names, shapes
    and dtypes with nothing computed (the quantized weights as ``meta`` tensors), for the weight
    stream's first pass, which plans the buckets (quantizing there too cost a second round trip
    of every weight per sync, and counted each sync's codes twice)."""
    from slime_gb10.nvfp4.format import BLOCK_SIZE
    from slime_gb10.nvfp4.ops import dequantize, quantize_without_sync

    if metadata_only:
        quantized = _global_scales(model, names_only=True)
        for name, tensor in named_tensors:
            if name not in quantized:
                yield name, tensor
            elif codes:
                rows, k = tensor.shape
                shapes = ((rows, k // 2), (rows, k // BLOCK_SIZE), ())
                dtypes = (torch.uint8, torch.float8_e4m3fn, torch.float32)
                for part, shape, part_dtype in zip(code_names(name), shapes, dtypes, strict=True):
                    yield part, torch.empty(shape, dtype=part_dtype, device="meta")
            else:
                yield name, torch.empty(tensor.shape, dtype=dtype, device="meta")
        return
    scales = _global_scales(model)
    if changes is not None:
        changes.begin()
    with torch.no_grad():
        for name, tensor in named_tensors:
            scale = scales.get(name, _KEEP)
            if scale is _KEEP:
                yield name, tensor
                continue
            q = quantize_without_sync(tensor, scale)  # no host sync per weight
            if changes is not None:
                changes.observe(name, q.data, q.scale)
            if codes:
                yield from zip(code_names(name), (q.data, q.scale, q.global_scale.reshape(()).float()))
            else:
                yield name, dequantize(q, dtype=tensor.dtype).to(dtype)


def code_names(weight_name: str) -> tuple[str, str, str]:
    """The three stream names of a weight that travels as NVFP4 codes (:func:`rollout_weights`)."""
    return weight_name, f"{weight_name}_scale", f"{weight_name}_scale_2"


def plain_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict as its plain ``nn.Linear`` layers would have it (a QAT model's layers
    carry an ``input_amax`` buffer a Hugging Face checkpoint has no place for)."""
    from slime_gb10.nvfp4.linear import nvfp4_layers

    extra = {f"{name}.input_amax" for name, _ in nvfp4_layers(model)}
    return {k: v for k, v in model.state_dict().items() if k not in extra}


# NeMo-RL's gates for quantization-aware RL (REFERENCE.md, "Low-precision rollouts"): per-token
# KL(rollout || trainer) and the median exp|Δlogp| between the rollout's and the trainer's logprobs.
KL_GATE = 0.003
EXP_ABS_GATE = 1.1


def mismatch_verdict(run_dir: str | Path) -> tuple[bool, str]:
    """Whether a finished NVFP4-rollout run kept its rollout and trainer one policy: the medians of
    ``mismatch_k3`` and ``mismatch_exp_abs_median`` over the second half of its steps under
    NeMo-RL's gates. ``(passed, one line saying so)``; `slime-gb10 verify` runs it on the GB10."""
    from slime_gb10.grpo.metrics import METRICS_FILE, read_jsonl

    rows = [
        r
        for r in read_jsonl(Path(run_dir) / METRICS_FILE)
        if r.get("mismatch_k3") is not None and r.get("mismatch_exp_abs_median") is not None
    ]
    if not rows:
        return False, f"no step in {Path(run_dir) / METRICS_FILE} logged mismatch_k3 (did the run train?)"
    late = rows[len(rows) // 2 :]
    k3 = statistics.median(r["mismatch_k3"] for r in late)
    exp_abs = statistics.median(r["mismatch_exp_abs_median"] for r in late)
    passed = k3 < KL_GATE and exp_abs < EXP_ABS_GATE
    changed = [r["train/nvfp4_codes_changed"] for r in late if r.get("train/nvfp4_codes_changed") is not None]
    codes = f"; {statistics.fmean(changed):.2e} of the NVFP4 codes changed per sync" if changed else ""
    return passed, (
        f"NVFP4 rollouts, steps {late[0]['step']}-{late[-1]['step']}: KL(rollout || trainer) k3 median "
        f"{k3:.5f} (gate {KL_GATE}), median exp|dlogp| {exp_abs:.4f} (gate {EXP_ABS_GATE}){codes}: "
        + ("pass" if passed else "FAIL")
    )
