"""Device facts: peak rates for MFU and roofline numbers, and what the GPU reports about itself.

The table holds datasheet *dense* numbers (NVIDIA prints the 2:4-sparse figure first, which is twice
the dense one; we always store the dense one). A device not in the table gets ``known=False`` and
``None`` rates, never a guess: an MFU computed against the wrong peak (GB10 against H100's 989
TFLOPS gave "6 % MFU" in nanochat) is worse than none.

Nothing here imports torch at module import time; only :func:`device_peaks` touches CUDA.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from importlib.resources import files
from typing import Literal

#: The GB10's facts (capability, SMs, memory, peaks, the minimum driver): platform/gb10.json, which
#: nix/gb10.nix reads too, so Python and Nix cannot disagree.
GB10 = json.loads((files("slime_gb10.platform") / "gb10.json").read_text(encoding="utf-8"))
GB10_CAPABILITY: tuple[int, int] = tuple(int(x) for x in GB10["capability"].split("."))  # type: ignore[assignment]
GB10_MIN_DRIVER: tuple[int, int] = tuple(int(x) for x in GB10["minDriverVersion"].split("."))  # type: ignore[assignment]

Precision = Literal["fp32", "bf16", "fp16", "fp8", "nvfp4"]

# Hopper's 68-SM line: torch._inductor.utils.is_big_gpu() refuses max-autotune GEMM templates below it.
INDUCTOR_BIG_GPU_MIN_SMS = 68


@dataclass(frozen=True)
class DevicePeaks:
    """Peak rates of one GPU model (TFLOPS dense, GB/s), or ``known=False`` with ``None`` rates."""

    name: str
    known: bool
    sm_count: int | None
    fp32_tflops: float | None
    bf16_tflops: float | None  # dense tensor-core BF16 (= FP16) with FP32 accumulate
    fp8_tflops: float | None  # dense tensor-core FP8
    nvfp4_tflops: float | None  # dense tensor-core NVFP4; None where the hardware has none (Hopper, Ampere)
    mem_bandwidth_gbs: float | None
    unified_memory: bool
    source: str  # where the numbers come from
    capability: tuple[int, int] | None = None


@dataclass(frozen=True)
class _Entry:
    pattern: str  # regex searched (case-insensitively) in the name torch reports
    capability: tuple[int, int]
    peaks: DevicePeaks


def _entry(pattern, name, cap, sm, fp32, bf16, fp8, nvfp4, bw, source, unified=False) -> _Entry:
    """One row of the table: the pattern and capability that select it, then its peaks."""
    peaks = DevicePeaks(name, True, sm, fp32, bf16, fp8, nvfp4, bw, unified, source, cap)
    return _Entry(pattern, cap, peaks)


_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet (sparse figures halved)"
_H200_DS = "NVIDIA H200 Tensor Core GPU datasheet (sparse figures halved)"
_A100_DS = "NVIDIA A100 Tensor Core GPU datasheet (dense)"
_GB200_DS = "NVIDIA GB200 NVL72 datasheet, per GPU (/72), sparse figures halved"
_B200_DS = "NVIDIA HGX B200 datasheet, per GPU (/8), sparse figures halved"
_TFLOPS = GB10["peakTflops"]

# Order matters: the first entry whose capability equals the device's and whose pattern matches wins.
# Columns: pattern, name, capability, SMs, TFLOPS dense FP32 / BF16 / FP8 / NVFP4, GB/s, source.
PEAK_TABLE: tuple[_Entry, ...] = (
    # GB10 (DGX Spark): FP32 31, BF16 ~62 dense, NVFP4 500 dense (the "1 PFLOP" is 2:4 sparse),
    # 273 GB/s LPDDR5x shared by CPU and GPU, 48 SMs. No published dense FP8 figure we trust: None.
    # Source: nanochat GB10 changelog and DGX Spark setup notes (shared/REFERENCE.md).
    _entry(
        r"\bGB10\b",
        GB10["deviceName"],
        GB10_CAPABILITY,
        GB10["smCount"],
        _TFLOPS["fp32"],
        _TFLOPS["bf16"],
        _TFLOPS["fp8"],
        _TFLOPS["nvfp4"],
        float(GB10["memoryBandwidthGBps"]),
        GB10["peakSource"],
        unified=GB10["unifiedMemory"],
    ),
    # H100: SXM5 (torch reports "NVIDIA H100 80GB HBM3"), PCIe, NVL differ in clocks, power and memory.
    # Datasheet (sparse/2): SXM FP32 67, BF16 989, FP8 1979, 3.35 TB/s; PCIe FP32 51, BF16 756,
    # FP8 1513, 2.0 TB/s; NVL FP32 60, BF16 835, FP8 1671, 3.9 TB/s. No FP4 tensor cores on Hopper.
    _entry(r"H100.*\bNVL\b", "NVIDIA H100 NVL", (9, 0), 132, 60.0, 835.0, 1671.0, None, 3900.0, _H100_DS),
    _entry(r"H100.*PCIe", "NVIDIA H100 PCIe", (9, 0), 114, 51.0, 756.0, 1513.0, None, 2000.0, _H100_DS),
    _entry(r"H100.*(HBM3|SXM)", "NVIDIA H100 SXM5", (9, 0), 132, 67.0, 989.0, 1979.0, None, 3350.0, _H100_DS),
    # H200: same compute as H100 SXM (NVL: as H100 NVL), 141 GB HBM3e at 4.8 TB/s.
    _entry(r"H200.*\bNVL\b", "NVIDIA H200 NVL", (9, 0), 132, 60.0, 835.0, 1671.0, None, 4800.0, _H200_DS),
    _entry(r"\bH200\b", "NVIDIA H200 SXM", (9, 0), 132, 67.0, 989.0, 1979.0, None, 4800.0, _H200_DS),
    # GB200 (per GPU = GB200 NVL72 datasheet / 72, sparse halved): FP32 80, BF16 2500, FP8 5000,
    # FP4 10000, 8 TB/s. Must come before the B200 entry ("GB200" contains "B200").
    _entry(r"\bGB200\b", "NVIDIA GB200", (10, 0), None, 80.0, 2500.0, 5000.0, 10000.0, 8000.0, _GB200_DS),
    # B200 (per GPU = HGX B200 datasheet / 8, sparse halved): FP32 75, BF16 2250, FP8 4500,
    # FP4 9000, 8 TB/s HBM3e, 148 SMs.
    _entry(r"\bB200\b", "NVIDIA B200", (10, 0), 148, 75.0, 2250.0, 4500.0, 9000.0, 8000.0, _B200_DS),
    # A100 (no FP8/FP4): FP32 19.5, BF16 312 dense; 80GB SXM4 2039 GB/s, 80GB PCIe 1935, 40GB 1555.
    _entry(
        r"A100.*SXM4.*80GB", "NVIDIA A100-SXM4-80GB", (8, 0), 108, 19.5, 312.0, None, None, 2039.0, _A100_DS
    ),
    _entry(
        r"A100.*80GB.*PCIe", "NVIDIA A100 80GB PCIe", (8, 0), 108, 19.5, 312.0, None, None, 1935.0, _A100_DS
    ),
    _entry(r"A100.*40GB", "NVIDIA A100 40GB", (8, 0), 108, 19.5, 312.0, None, None, 1555.0, _A100_DS),
)


def unknown_peaks(name: str, capability: tuple[int, int] | None = None, why: str = "") -> DevicePeaks:
    """The honest answer for a device not in the table (or no device): no rates at all."""
    return DevicePeaks(
        name=name,
        known=False,
        sm_count=None,
        fp32_tflops=None,
        bf16_tflops=None,
        fp8_tflops=None,
        nvfp4_tflops=None,
        mem_bandwidth_gbs=None,
        unified_memory=False,
        source=why or "unknown device: not in slime_gb10.platform.devices.PEAK_TABLE",
        capability=capability,
    )


def lookup_peaks(name: str, capability: tuple[int, int]) -> DevicePeaks:
    """Peak rates for the device ``torch.cuda.get_device_name()`` calls ``name`` with ``capability``.

    Pure (no CUDA). The capability must match too, so a renamed or mis-reported device never borrows
    another generation's numbers. Unknown devices give ``known=False`` and ``None`` rates.
    """
    capability = (int(capability[0]), int(capability[1]))
    for entry in PEAK_TABLE:
        if entry.capability == capability and re.search(entry.pattern, name, flags=re.IGNORECASE):
            return entry.peaks
    return unknown_peaks(name, capability)


def device_peaks(index: int = 0) -> DevicePeaks:
    """Peak rates of CUDA device ``index`` as it reports itself (initialises CUDA in this process).

    The SM count and the unified-memory flag are taken from the device, the rates from the table.
    Without torch or without a GPU: ``known=False`` with ``None`` rates.
    """
    try:
        import torch
    except ImportError:
        return unknown_peaks("no GPU", why="torch is not installed")
    if not torch.cuda.is_available():
        return unknown_peaks("no GPU", why="no CUDA GPU visible (torch.cuda.is_available() is False)")
    props = torch.cuda.get_device_properties(index)
    capability = (int(props.major), int(props.minor))
    peaks = lookup_peaks(props.name, capability)
    integrated = bool(getattr(props, "is_integrated", False))
    return replace(
        peaks,
        name=props.name,
        sm_count=int(props.multi_processor_count),
        unified_memory=peaks.unified_memory or integrated,
    )


_PRECISION_FIELD = {
    "fp32": "fp32_tflops",
    "bf16": "bf16_tflops",
    "fp16": "bf16_tflops",  # dense FP16 and BF16 tensor-core rates are equal on every GPU in the table
    "fp8": "fp8_tflops",
    "nvfp4": "nvfp4_tflops",
}


def peak_tflops(peaks: DevicePeaks, precision: str = "bf16") -> float | None:
    """The dense peak of ``precision`` in TFLOPS, or ``None`` where unknown / not in the hardware."""
    try:
        field = _PRECISION_FIELD[precision]
    except KeyError:
        raise ValueError(
            f"unknown precision {precision!r}; use one of {', '.join(sorted(_PRECISION_FIELD))}"
        ) from None
    return getattr(peaks, field)


def mfu(achieved_flops_per_s: float, peaks: DevicePeaks, precision: str = "bf16") -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over the device's dense peak for ``precision``.

    ``mfu = achieved_flops_per_s / (peak_tflops * 1e12)`` (PaLM, Chowdhery et al. 2022, App. B).
    Returns ``None`` when the peak is unknown (device not in the table, or e.g. NVFP4 on Hopper).
    """
    if achieved_flops_per_s < 0:
        raise ValueError(f"achieved_flops_per_s must be >= 0, got {achieved_flops_per_s}")
    peak = peak_tflops(peaks, precision)
    if peak is None:
        return None
    return achieved_flops_per_s / (peak * 1e12)


def sm_arch(capability: tuple[int, int]) -> str:
    """The ``--gpu-name`` Triton passes to ptxas: arch-specific ``sm_XYa`` from Hopper (9.0) on.

    Same rule as ``triton.backends.nvidia.compiler.sm_arch_from_capability``: GB10 (12, 1) -> ``sm_121a``,
    H100 (9, 0) -> ``sm_90a``, A100 (8, 0) -> ``sm_80``.
    """
    major, minor = int(capability[0]), int(capability[1])
    value = major * 10 + minor
    return f"sm_{value}{'a' if value >= 90 else ''}"


# --- what kind of GPU this is: the one answer every module asks ----------------------------------


def is_gb10(name: str, capability: tuple[int, int]) -> bool:
    """A GB10: its capability (12.1) and its name."""
    return (
        tuple(capability) == GB10_CAPABILITY and re.search(r"\bGB10\b", name, flags=re.IGNORECASE) is not None
    )


def is_sm12x(capability: tuple[int, int] | None) -> bool:
    """Consumer/desktop Blackwell (sm_120, GB10's sm_121): 99 KB of shared memory a block, no
    FlashAttention 3, no TE stochastic rounding or RHT kernels."""
    return capability is not None and int(capability[0]) == 12


def has_fp4_tensor_cores(capability: tuple[int, int] | None) -> bool:
    """Blackwell (sm_100 and up, GB10 included): what TE's NVFP4 recipe needs."""
    return capability is not None and int(capability[0]) >= 10


def is_unified_memory(capability: tuple[int, int] | None, is_integrated: bool = False) -> bool:
    """The GPU shares the CPU's memory: an integrated GPU, or a GB10 (128 GB LPDDR5x for both)."""
    return bool(is_integrated) or (capability is not None and tuple(capability) == GB10_CAPABILITY)
