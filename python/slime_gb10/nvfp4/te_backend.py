"""The ``te`` backend of :class:`~slime_gb10.nvfp4.linear.NVFP4Linear`: TransformerEngine's NVFP4 recipe.

Blackwell only (sm_100+, sm_120+). On sm_12x (GB10 is sm_121) three workarounds from the GB10 ports
(nanochat's GB10 changelog; TransformerEngine issues #2372 and #3062) are applied, by
:func:`nvfp4_recipe_kwargs`, which the Megatron backend's recipe uses too:

* ``disable_rht=True``: the Random Hadamard Transform kernel (``hadamard_transform_cast_fusion.cu``)
  fails with ``invalid argument`` for M > 32 there;
* ``disable_stochastic_rounding=True`` (TE releases that have the field): the default recipe's
  stochastic-rounding cast needs more shared memory than sm_12x's 101,376 bytes per block
  (TransformerEngine issue #3062, open); the GB10 ports run with it off;
* the weight-gradient GEMM stays in BF16. TE releases that have the per-GEMM field
  ``override_linear_precision`` (fprop, dgrad, wgrad) get ``(False, False, True)``, as nanochat
  does; newer ones (``transformer_engine/common/recipe/__init__.py``: ``backward_override`` in
  ``{None, "high_precision", "dequantized"}``) get ``backward_override="high_precision"``, which keeps
  the high-precision operands for the whole backward (dgrad too: slower, never less accurate).

UNVERIFIED here: TE's NVFP4 needs a Blackwell GPU, which neither the development machine nor the
H100 used for the Triton kernels is. ``tests/nvfp4/test_te_backend.py`` runs it on a GB10 (the
flake's GPU checks) and skips elsewhere.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch


def is_sm12x(device: torch.device | None = None) -> bool:
    from slime_gb10.platform import devices

    return torch.cuda.is_available() and devices.is_sm12x(torch.cuda.get_device_capability(device))


def recipe_field_names(recipe_cls) -> set[str]:
    """Constructor fields of a TE recipe class (TE recipes are (pydantic) dataclasses)."""
    if dataclasses.is_dataclass(recipe_cls):
        return {f.name for f in dataclasses.fields(recipe_cls)}
    return set(getattr(recipe_cls, "__annotations__", {}))


def nvfp4_recipe_kwargs(field_names: set[str], sm12x: bool, *, one_d_weights: bool = True) -> dict:
    """Keyword arguments for ``NVFP4BlockScaling`` on this GPU, given the fields TE's version has.

    ``one_d_weights``: quantize weights in 1x16 blocks (``NVFP4Linear``: the layout the exported
    checkpoint has) instead of TE's default 16x16 tiles (kept for Megatron training).
    """
    kwargs: dict = {}
    if one_d_weights and "disable_2d_quantization" in field_names:
        # TE quantizes weights in 16x16 tiles by default; the exported checkpoint (ModelOpt, SGLang)
        # uses 1x16 blocks. Train on the weights that will be served.
        kwargs["disable_2d_quantization"] = True
    if not sm12x:
        return kwargs
    kwargs["disable_rht"] = True  # TE #2372: the RHT cast fusion fails for M > 32 on sm_120/sm_121
    if "disable_stochastic_rounding" in field_names:
        kwargs["disable_stochastic_rounding"] = True  # TE #3062: its cast exceeds sm_12x's shared memory
    if "override_linear_precision" in field_names:
        kwargs["override_linear_precision"] = (False, False, True)  # (fprop, dgrad, wgrad) in BF16
    elif "backward_override" in field_names:
        kwargs["backward_override"] = "high_precision"
    else:
        warnings.warn(
            "this TransformerEngine has no way to keep the weight-gradient GEMM in BF16 "
            "(neither override_linear_precision nor backward_override); NVFP4 wgrad on sm_12x may fail",
            stacklevel=3,
        )
    return kwargs


def make_recipe(device: torch.device | None = None):
    from transformer_engine.common.recipe import NVFP4BlockScaling

    return NVFP4BlockScaling(**nvfp4_recipe_kwargs(recipe_field_names(NVFP4BlockScaling), is_sm12x(device)))


def _autocast(recipe):
    import transformer_engine.pytorch as te

    if hasattr(te, "autocast"):  # TE >= 2.8
        return te.autocast(enabled=True, recipe=recipe)
    return te.fp8_autocast(enabled=True, fp8_recipe=recipe)


def _te_linear(layer):
    """The ``te.Linear`` sharing ``layer``'s weight and bias Parameters (built once, kept unregistered
    so the state dict stays ``weight``/``bias``)."""
    cached = layer.__dict__.get("_te_module")
    if cached is not None:
        return cached
    import transformer_engine.pytorch as te

    module = te.Linear(
        layer.in_features,
        layer.out_features,
        bias=layer.bias is not None,
        params_dtype=layer.weight.dtype,
        device=layer.weight.device,
    )
    module.weight = layer.weight
    if layer.bias is not None:
        module.bias = layer.bias
    layer.__dict__["_te_module"] = module
    layer.__dict__["_te_recipe"] = make_recipe(layer.weight.device)
    return module


def forward(layer, x: torch.Tensor) -> torch.Tensor:
    if not x.is_cuda:
        raise ValueError("the 'te' NVFP4 backend runs on a CUDA (Blackwell) GPU; use backend='qat' elsewhere")
    module = _te_linear(layer)
    with _autocast(layer.__dict__["_te_recipe"]):
        return module(x)
