"""``NVFP4Linear``: a drop-in ``nn.Linear`` with NVFP4 weights and four backends.

* ``te``: TransformerEngine's NVFP4 recipe (Blackwell, sm_100+/sm_120+, TE installed); on sm_12x
  the Random Hadamard Transform is disabled and the weight-gradient GEMM stays BF16 (TE #2372).
* ``w4a16``: packed NVFP4 weights (4.5 bits/param), forward through a fused dequantize+GEMM
  kernel on any CUDA GPU (CUDA kernels compiled with NVRTC on sm_90+, Triton elsewhere:
  :func:`~slime_gb10.nvfp4.w4a16.w4a16_linear`); for large M (where the fused kernels lose) it
  dequantizes and calls cuBLAS by itself. Inference only (no weight gradient).
* ``qat``: high-precision master weights, fake-quantized in the forward (optionally the input
  too) with a straight-through estimator; trains on any device.
* ``reference``: packed weights, dequantize then ``torch.matmul``: CPU, and the tests' oracle.

Packed backends keep ModelOpt's tensor names (``weight`` uint8, ``weight_scale`` E4M3,
``weight_scale_2`` FP32, ``input_scale`` FP32), so a state dict is a ModelOpt NVFP4 checkpoint.
"""

from __future__ import annotations

import contextlib
import fnmatch
import warnings
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from slime_gb10.nvfp4.format import (
    BLOCK_SIZE,
    GLOBAL_SCALE_DIVISOR,
    NVFP4Tensor,
    global_scale_from_amax,
)
from slime_gb10.nvfp4.ops import dequantize, quantize, quantize_without_sync

BACKENDS = ("te", "w4a16", "qat", "reference")
PACKED_BACKENDS = ("w4a16", "reference")
MASTER_WEIGHT_BACKENDS = ("te", "qat")

#: Modules ``quantize_model`` leaves alone unless ``exclude`` is given: the output head
#: (often tied to the embeddings, and the most quantization-sensitive layer), embeddings, and the
#: linear layers of ModelOpt 0.47's ``default_disabled_quantizers`` (MoE routers and shared-expert
#: gates, which SGLang builds unquantized; multi-token-prediction heads; vision towers and
#: projectors; gated-delta-net ``in_proj_a/b``). A model quantized with these defaults has the
#: NVFP4 layers ModelOpt's ``NVFP4_DEFAULT_CFG`` gives it (test_modelopt_parity.py).
#: ModelOpt's top-level ``output.*`` is left out: as a bare leaf name here it would match any
#: module called ``output``.
DEFAULT_EXCLUDE = (
    "lm_head",
    "*lm_head",
    "*embed*",
    "*wte",
    "*wpe",
    "*output_layer*",
    "*router*",
    "*mlp.gate",
    "*mlp.shared_expert_gate",
    "*block_sparse_moe.gate*",
    "*linear_attn.in_proj_a*",
    "*linear_attn.in_proj_b*",
    "*proj_out",
    "mtp.*",
    "*vision_tower*",
    "*visual*",
    "*vision_model*",
    "*embed_vision*",
    "*multi_modal_projector*",
)


# ---------------------------------------------------------------------------------------------
# fake quantization with a straight-through estimator


# One operator to torch.compile (a custom op): Dynamo neither traces into the quantizer (its Triton
# launch and host-side checks made the compiled QAT layers fall back to eager on an H100: Dynamo's
# "'SymNodeVariable' object has no attribute 'value'") nor breaks the graph around it; Inductor calls
# it as it is, and its gradient is declared below.
@torch.library.custom_op(
    "slime_gb10::nvfp4_round_trip", mutates_args=(), schema="(Tensor x, Tensor? global_scale) -> Tensor"
)
def _round_trip(x: torch.Tensor, global_scale: torch.Tensor | None) -> torch.Tensor:
    # no host sync on a GPU (there was one per layer and forward)
    return dequantize(quantize_without_sync(x, global_scale), dtype=x.dtype)


@_round_trip.register_fake
def _round_trip_shape(x: torch.Tensor, global_scale: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape)  # contiguous, as dequantize returns it (empty_like keeps x's strides)


def _straight_through(ctx, grad_output: torch.Tensor):
    """Backward of the round trip: the identity (straight-through estimator, Bengio et al. 2013; as
    in NVIDIA's NVFP4 QAT). Amax-based scales never saturate, so no gradient clipping is needed for
    weights."""
    return grad_output, None


_round_trip.register_autograd(_straight_through)


def shared_global_scale(weights: Iterable[torch.Tensor], dtype: torch.dtype | None = None) -> torch.Tensor:
    """The one ``weight_scale_2`` of weights an engine fuses into one layer (q/k/v, gate/up): from
    the largest ``|w|`` among them (each cast to ``dtype`` first, when given)."""
    with torch.no_grad():
        amax = torch.stack([_amax(w.detach(), dtype or w.dtype) for w in weights]).max()
    return global_scale_from_amax(amax)


def _amax(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``|weight|``'s largest value in FP32. A weight sharded by FSDP (a DTensor): the largest of
    every rank's shard, a max over the ranks that every rank runs (the weight sync does, on all of
    them); a rank whose shard is empty (fewer rows than ranks) adds 0."""
    if not hasattr(weight, "to_local"):
        return weight.to(dtype).abs().amax().float()
    local = weight.to_local().to(dtype)
    amax = local.abs().amax().float() if local.numel() else torch.zeros((), device=local.device)
    torch.distributed.all_reduce(
        amax, op=torch.distributed.ReduceOp.MAX, group=weight.device_mesh.get_group()
    )
    return amax


def fake_quantize(x: torch.Tensor, global_scale: torch.Tensor | None = None) -> torch.Tensor:
    """NVFP4 round trip of ``x``, ``dequantize(quantize(x))``, whose gradient is the identity (STE)."""
    return _round_trip(x, global_scale)


# ---------------------------------------------------------------------------------------------
# backend selection


def is_blackwell(device: torch.device | None = None) -> bool:
    """sm_100+ (data-center Blackwell) or sm_120+ (GB10 is sm_121): TE's NVFP4 needs one."""
    from slime_gb10.platform.devices import has_fp4_tensor_cores

    return torch.cuda.is_available() and has_fp4_tensor_cores(torch.cuda.get_device_capability(device))


def te_available() -> bool:
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:
        return False
    return True


def default_backend(device: torch.device | str | None = None) -> str:
    """``te`` on Blackwell with TE, else ``w4a16`` on CUDA with Triton, else ``reference``."""
    device = torch.device(device) if device is not None else torch.get_default_device()
    on_cuda = torch.cuda.is_available() and device.type == "cuda"
    if on_cuda and is_blackwell(device) and te_available():
        return "te"
    if on_cuda:
        from slime_gb10.nvfp4 import kernels

        if kernels.triton_available():
            return "w4a16"
    return "reference"


def _check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown NVFP4Linear backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return backend


# ---------------------------------------------------------------------------------------------
# the module


class NVFP4Linear(nn.Module):
    """``y = x @ W^T + b`` with ``W`` in NVFP4. See the module docstring for the backends.

    Construct it from a trained layer with :meth:`from_linear`; :meth:`to_linear` goes back.
    ``input_amax`` records the largest ``|x|`` seen while :func:`calibration` is active; the
    checkpoint's ``input_scale`` is ``input_amax / (6 * 448)``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        backend: str | None = None,
        quantize_activations: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        super().__init__()
        if in_features % BLOCK_SIZE != 0:
            raise ValueError(
                f"NVFP4Linear needs in_features to be a multiple of {BLOCK_SIZE}, got {in_features}; "
                "leave this layer in BF16 (quantize_model skips it by itself)"
            )
        self.in_features = in_features
        self.out_features = out_features
        self.dtype = dtype
        self.quantize_activations = quantize_activations
        self.backend = _check_backend(backend or default_backend(device))
        self.calibrating = False
        # layers an inference engine fuses with this one (set by quantize_model); a plain tuple,
        # not submodules, so state dicts and module traversal are unchanged
        self._fused_group: tuple[NVFP4Linear, ...] = ()
        self.register_buffer("input_amax", torch.zeros((), dtype=torch.float32, device=device))
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)
        if self.backend in PACKED_BACKENDS:
            self._init_packed(device)
        else:
            weight = torch.empty(out_features, in_features, dtype=dtype, device=device)
            nn.init.kaiming_uniform_(weight, a=5**0.5)
            self.weight = nn.Parameter(weight)
            self._te_module = None

    # -- state layouts ------------------------------------------------------------------------

    def _init_packed(self, device) -> None:
        n, k = self.out_features, self.in_features
        self.register_buffer("weight", torch.zeros(n, k // 2, dtype=torch.uint8, device=device))
        self.register_buffer(
            "weight_scale", torch.zeros(n, k // BLOCK_SIZE, dtype=torch.float8_e4m3fn, device=device)
        )
        self.register_buffer("weight_scale_2", torch.ones((), dtype=torch.float32, device=device))
        # 0 = not calibrated yet (export refuses to invent one; see checkpoint.export_nvfp4)
        self.register_buffer("input_scale", torch.zeros((), dtype=torch.float32, device=device))
        self._te_module = None

    @property
    def packed(self) -> bool:
        return self.backend in PACKED_BACKENDS

    def quantized_weight(self) -> NVFP4Tensor:
        """The weight as an :class:`NVFP4Tensor` (quantizing the master weight if there is one)."""
        if self.packed:
            shape = torch.Size((self.out_features, self.in_features))
            return NVFP4Tensor(self.weight, self.weight_scale, self.weight_scale_2, shape, self.dtype)
        return quantize(self.weight.detach())

    def set_quantized_weight(self, q: NVFP4Tensor) -> None:
        """Store ``q`` as this layer's weight (packed backends only)."""
        if not self.packed:
            raise ValueError(f"set_quantized_weight needs a packed backend, this layer uses {self.backend!r}")
        if tuple(q.shape) != (self.out_features, self.in_features):
            raise ValueError(
                f"weight of shape {tuple(q.shape)} does not fit a {self.in_features}->{self.out_features} layer"
            )
        self.weight = q.data.to(self.weight.device)
        self.weight_scale = q.scale.to(self.weight.device)
        self.weight_scale_2 = q.global_scale.to(torch.float32).reshape(()).to(self.weight.device)

    def dequantized_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """What the layer multiplies by: the NVFP4 weight rounded to ``dtype``."""
        return dequantize(self.quantized_weight(), dtype=dtype or self.dtype)

    def set_backend(self, backend: str) -> NVFP4Linear:
        """Switch backend, converting the state (packed <-> master weight) when needed."""
        backend = _check_backend(backend)
        if (backend in PACKED_BACKENDS) != self.packed:
            if self.packed:  # packed -> master weight: start from the dequantized NVFP4 values
                weight = self.dequantized_weight()
                with torch.no_grad():  # keep a loaded/calibrated activation scale as an amax
                    loaded_amax = self.input_scale.float() * GLOBAL_SCALE_DIVISOR
                    self.input_amax.copy_(torch.maximum(self.input_amax, loaded_amax))
                for name in ("weight", "weight_scale", "weight_scale_2", "input_scale"):
                    delattr(self, name)
                self.weight = nn.Parameter(weight)
            else:  # master weight -> packed
                q = quantize(self.weight.detach())
                device = self.weight.device
                del self.weight
                self._init_packed(device)
                self.backend = backend
                self.set_quantized_weight(q)
        self.backend = backend
        self._te_module = None
        return self

    # -- conversions ----------------------------------------------------------------------------

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        *,
        backend: str | None = None,
        global_scale: float | torch.Tensor | None = None,
        quantize_activations: bool = False,
    ) -> NVFP4Linear:
        """Quantize an ``nn.Linear`` (weight amax -> ``weight_scale_2`` unless ``global_scale`` is given)."""
        weight = linear.weight.detach()
        layer = cls(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            backend=backend or default_backend(weight.device),
            quantize_activations=quantize_activations,
            device=weight.device,
            dtype=weight.dtype
            if weight.dtype in (torch.bfloat16, torch.float16, torch.float32)
            else torch.bfloat16,
        )
        with torch.no_grad():
            if layer.packed:
                layer.set_quantized_weight(quantize(weight, global_scale))
            else:
                layer.weight.copy_(weight.to(layer.dtype))
            if linear.bias is not None:
                layer.bias.copy_(linear.bias.detach().to(layer.dtype))
        return layer

    def to_linear(self) -> nn.Linear:
        """An ``nn.Linear`` holding the dequantized weight (the master weight for ``qat``/``te``)."""
        device = self.bias.device if self.bias is not None else self.input_amax.device
        linear = nn.Linear(
            self.in_features, self.out_features, bias=self.bias is not None, device=device, dtype=self.dtype
        )
        with torch.no_grad():
            weight = self.dequantized_weight() if self.packed else self.weight.detach()
            linear.weight.copy_(weight)
            if self.bias is not None:
                linear.bias.copy_(self.bias.detach())
        return linear

    # -- forward --------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"NVFP4Linear expects input [..., {self.in_features}], got {tuple(x.shape)}")
        if self.calibrating:
            with torch.no_grad():
                self.input_amax.copy_(torch.maximum(self.input_amax, x.detach().abs().amax().float()))
        if self.backend == "reference":
            return self._forward_reference(x)
        if self.backend == "w4a16":
            return self._forward_w4a16(x)
        if self.backend == "qat":
            return self._forward_qat(x)
        return self._forward_te(x)

    def _bias(self, dtype: torch.dtype) -> torch.Tensor | None:
        return None if self.bias is None else self.bias.to(dtype)

    def _maybe_quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        if not self.quantize_activations:
            return x
        return fake_quantize(x, self.activation_global_scale())

    def activation_global_scale(self) -> torch.Tensor | None:
        """The static activation scale serving uses, once known; None: each batch's own amax.

        After :func:`calibration` it is ``input_amax / (6 * 448)``, the ``input_scale`` the
        checkpoint stores and SGLang quantizes activations with; a packed layer loaded from a
        checkpoint uses that ``input_scale``. Fake-quantizing with it (rather than per batch) trains
        for the activations the served model will see, clipping included. (One host sync per call,
        only when activations are quantized.)
        """
        if not self.calibrating and bool(self.input_amax > 0):
            return global_scale_from_amax(self.input_amax)
        if self.packed and bool(self.input_scale > 0):
            return self.input_scale.float().reshape(())
        return None

    def _forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        x = self._maybe_quantize_input(x)
        return F.linear(x, self.dequantized_weight(x.dtype), self._bias(x.dtype))

    def _forward_w4a16(self, x: torch.Tensor) -> torch.Tensor:
        from slime_gb10.nvfp4 import kernels, w4a16

        if not (x.is_cuda and kernels.triton_available()):
            return self._forward_reference(x)
        x = self._maybe_quantize_input(x)
        q = self.quantized_weight()
        return w4a16.w4a16_linear(x, q, self._bias(x.dtype), prepared=self._w4a16_prepared(q))

    def _w4a16_prepared(self, q: NVFP4Tensor):
        """``w4a16.prepare_w4a16(q)``, kept while the packed buffers are the same tensors, unmodified
        (keyed on their storage and version counters: ``load_state_dict``, ``set_quantized_weight``,
        ``.to()`` and in-place edits all invalidate it). Costs 1 byte per 16 weights."""
        from slime_gb10.nvfp4 import w4a16

        key = tuple((t.data_ptr(), t._version) for t in (self.weight, self.weight_scale, self.weight_scale_2))
        cached = getattr(self, "_w4a16_cache", None)
        if cached is None or cached[0] != key:
            cached = (key, w4a16.prepare_w4a16(q))
            self._w4a16_cache = cached
        return cached[1]

    def _forward_qat(self, x: torch.Tensor) -> torch.Tensor:
        # The master weight is quantized in its own precision, then cast to the input's: the weights
        # a run exports and hands an NVFP4 rollout (grpo/quantized.py) are these, whatever dtype each
        # layer's input has under autocast (FP32 after a norm, BF16 after attention or the MLP's gate).
        x = self._maybe_quantize_input(x)
        weight = fake_quantize(self.weight, self.fused_global_scale(self.weight.dtype))
        return F.linear(x, weight.to(x.dtype), self._bias(x.dtype))

    def fused_global_scale(self, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        """The ``weight_scale_2`` shared with the siblings an engine fuses this layer with (q/k/v,
        gate/up), from their master weights; None outside such a group (the layer's own amax).

        Training with it (``qat``) makes the exported checkpoint, which must share one scale per
        fused layer, hold exactly the weights that were trained.
        """
        group = self._fused_group
        if not group or self.packed:
            return None
        return shared_global_scale([layer.weight for layer in group], dtype)

    def _forward_te(self, x: torch.Tensor) -> torch.Tensor:
        from slime_gb10.nvfp4 import te_backend

        return te_backend.forward(self, x)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, backend={self.backend}, "
            f"quantize_activations={self.quantize_activations}"
        )


# ---------------------------------------------------------------------------------------------
# whole models


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) or name.split(".")[-1] == p for p in patterns)


#: Sibling projections that SGLang/vLLM fuse into one GEMM (qkv, gate_up): they must share one
#: ``weight_scale_2`` because the fused layer uses a single one (SGLang takes the max).
FUSED_SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("w1", "w3"))


def fused_groups(names: Iterable[str]) -> list[list[str]]:
    """Group module names that SGLang/vLLM fuse (``...q_proj``/``k_proj``/``v_proj`` of one parent)."""
    names = list(names)
    groups: list[list[str]] = []
    for siblings in FUSED_SIBLINGS:
        parents: dict[str, list[str]] = {}
        for name in names:
            parent, _, leaf = name.rpartition(".")
            if leaf in siblings:
                parents.setdefault(parent, []).append(name)
        groups.extend(sorted(g) for g in parents.values() if len(g) > 1)
    return groups


def select_linear(
    model: nn.Module, *, include: Iterable[str] | None = None, exclude: Iterable[str] | None = None
) -> dict[str, nn.Linear]:
    """The ``nn.Linear`` layers :func:`quantize_model` quantizes, by qualified name: matching
    ``include`` (all when None), not ``exclude`` (:data:`DEFAULT_EXCLUDE` when None), ``in_features``
    a multiple of 16, and whole fused groups only."""
    exclude = tuple(DEFAULT_EXCLUDE if exclude is None else exclude)
    include = tuple(include) if include is not None else None
    chosen: dict[str, nn.Linear] = {}
    for name, module in model.named_modules():
        if type(module) is not nn.Linear:
            continue
        if include is not None and not _matches(name, include):
            continue
        if _matches(name, exclude) or module.in_features % BLOCK_SIZE != 0:
            continue
        chosen[name] = module

    # An engine fuses q/k/v (gate/up) into one layer that is quantized as a whole or not at all:
    # excluding one member excludes its group (a partly quantized fused layer does not load).
    all_linear = [name for name, m in model.named_modules() if type(m) is nn.Linear]
    for group in fused_groups(all_linear):
        left_out = [n for n in group if n not in chosen]
        if left_out and len(left_out) < len(group):
            warnings.warn(
                f"{left_out} are excluded, so their fused siblings {sorted(set(group) - set(left_out))} "
                "stay unquantized too (an inference engine fuses them into one layer)",
                stacklevel=2,
            )
            for n in group:
                chosen.pop(n, None)
    return chosen


def quantize_model(
    model: nn.Module,
    *,
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    backend: str | None = None,
    quantize_activations: bool = False,
    share_fused_scales: bool = True,
    forward_loop: Callable[[nn.Module], object] | None = None,
) -> list[str]:
    """Replace the model's ``nn.Linear`` layers by :class:`NVFP4Linear` in place.

    ``include``/``exclude`` are ``fnmatch`` patterns on qualified module names (a bare leaf name
    also matches, e.g. ``"lm_head"``); ``exclude`` defaults to :data:`DEFAULT_EXCLUDE`. Layers whose
    ``in_features`` is not a multiple of 16 stay as they are. With ``share_fused_scales``, sibling
    projections that inference engines fuse (q/k/v, gate/up) get one shared global scale.

    ``forward_loop(model)``, if given, runs the model on calibration batches *before* its weights
    are quantized, and each layer keeps the largest ``|x|`` it saw as ``input_amax`` (the
    checkpoint's ``input_scale`` is ``input_amax / (6 * 448)``). This is what ModelOpt's
    ``mtq.quantize(model, NVFP4_DEFAULT_CFG, forward_loop)`` does, and the exported checkpoint is
    then bit-identical to ModelOpt's ``export_hf_checkpoint`` (tests/nvfp4/test_modelopt_parity.py).
    :func:`calibration` instead records the activations of the quantized model (after QAT, or on a
    loaded checkpoint, where no unquantized weights exist).
    Returns the names of the replaced modules.
    """
    chosen = select_linear(model, include=include, exclude=exclude)
    input_amax = {} if forward_loop is None else unquantized_input_amax(model, chosen, forward_loop)

    global_scales: dict[str, torch.Tensor] = {}
    if share_fused_scales:
        for group in fused_groups(chosen):
            amax = torch.stack([chosen[n].weight.detach().abs().amax().float().cpu() for n in group]).max()
            if amax > 0:
                for n in group:
                    global_scales[n] = amax / GLOBAL_SCALE_DIVISOR

    for name, module in chosen.items():
        layer = NVFP4Linear.from_linear(
            module,
            backend=backend,
            global_scale=global_scales.get(name),
            quantize_activations=quantize_activations,
        )
        if name in input_amax:
            with torch.no_grad():
                layer.input_amax.copy_(input_amax[name])
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, leaf, layer)
    if share_fused_scales:
        for group in fused_groups(chosen):
            layers = tuple(model.get_submodule(n) for n in group)
            for layer in layers:
                layer._fused_group = layers
    return list(chosen)


def unquantized_input_amax(
    model: nn.Module, layers: dict[str, nn.Linear], forward_loop: Callable[[nn.Module], object]
) -> dict[str, torch.Tensor]:
    """The largest ``|x|`` each of ``layers`` sees while ``forward_loop(model)`` runs (no gradients).

    A layer the loop never reaches is left out (export then refuses it as uncalibrated).
    """
    seen: dict[str, torch.Tensor] = {}

    def recorder(name: str):
        def record(module: nn.Module, args: tuple, kwargs: dict) -> None:
            x = args[0] if args else kwargs["input"]
            amax = x.detach().abs().amax().float()
            seen[name] = amax if name not in seen else torch.maximum(seen[name], amax)

        return record

    hooks = [
        layer.register_forward_pre_hook(recorder(name), with_kwargs=True) for name, layer in layers.items()
    ]
    try:
        with torch.no_grad():
            forward_loop(model)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def nvfp4_layers(model: nn.Module) -> Iterator[tuple[str, NVFP4Linear]]:
    for name, module in model.named_modules():
        if isinstance(module, NVFP4Linear):
            yield name, module


@contextlib.contextmanager
def calibration(model: nn.Module) -> Iterator[nn.Module]:
    """Record each :class:`NVFP4Linear`'s input amax while active (for the checkpoint's ``input_scale``).

    The activations are the quantized model's. To calibrate on the unquantized model, as ModelOpt
    does, pass ``forward_loop`` to :func:`quantize_model` instead.

    >>> with calibration(model):
    ...     model(batch)
    """
    layers = [layer for _, layer in nvfp4_layers(model)]
    for layer in layers:
        layer.calibrating = True
    try:
        yield model
    finally:
        for layer in layers:
            layer.calibrating = False
