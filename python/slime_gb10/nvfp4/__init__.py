"""NVFP4 exact to NVIDIA's format: reference and Triton kernels, ``NVFP4Linear``, ModelOpt checkpoints."""

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

__all__ = [
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
