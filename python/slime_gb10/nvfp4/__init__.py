"""NVFP4 exact to NVIDIA's format: reference and Triton kernels, ``NVFP4Linear``, ModelOpt checkpoints.

The names below are imported on first use (PEP 562), so ``import slime_gb10.nvfp4.selfcheck`` (the
doctor's, which must not import torch in its own process) does not load torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the module of this package that defines it
_EXPORTS = {
    "CheckpointError": "checkpoint",
    "export_nvfp4": "checkpoint",
    "load_nvfp4": "checkpoint",
    "nvfp4_state_dict": "checkpoint",
    "BLOCK_SIZE": "format",
    "E2M1_VALUES": "format",
    "NVFP4Tensor": "format",
    "dequantize_reference": "format",
    "quantize_reference": "format",
    "relative_error": "format",
    "BACKENDS": "linear",
    "NVFP4Linear": "linear",
    "calibration": "linear",
    "default_backend": "linear",
    "fake_quantize": "linear",
    "quantize_model": "linear",
    "dequantize": "ops",
    "quantize": "ops",
}

__all__ = [  # = the keys of _EXPORTS (tests/nvfp4 checks)
    "BACKENDS",
    "BLOCK_SIZE",
    "E2M1_VALUES",
    "CheckpointError",
    "NVFP4Linear",
    "NVFP4Tensor",
    "calibration",
    "default_backend",
    "dequantize",
    "dequantize_reference",
    "export_nvfp4",
    "fake_quantize",
    "load_nvfp4",
    "nvfp4_state_dict",
    "quantize",
    "quantize_model",
    "quantize_reference",
    "relative_error",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from slime_gb10.nvfp4.checkpoint import CheckpointError, export_nvfp4, load_nvfp4, nvfp4_state_dict
    from slime_gb10.nvfp4.format import (
        BLOCK_SIZE,
        E2M1_VALUES,
        NVFP4Tensor,
        dequantize_reference,
        quantize_reference,
        relative_error,
    )
    from slime_gb10.nvfp4.linear import (
        BACKENDS,
        NVFP4Linear,
        calibration,
        default_backend,
        fake_quantize,
        quantize_model,
    )
    from slime_gb10.nvfp4.ops import dequantize, quantize
