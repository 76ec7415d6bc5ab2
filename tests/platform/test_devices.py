"""The peak-rate table: lookups keyed on what torch reports, honest unknowns, hand-computed MFU."""

from __future__ import annotations

import pytest

from slime_gb10.platform.devices import (
    PEAK_TABLE,
    device_peaks,
    is_gb10,
    lookup_peaks,
    mfu,
    peak_tflops,
    sm_arch,
)


def test_h100_sxm_pcie_nvl_are_told_apart_by_the_name_torch_reports():
    sxm = lookup_peaks("NVIDIA H100 80GB HBM3", (9, 0))
    pcie = lookup_peaks("NVIDIA H100 PCIe", (9, 0))
    nvl = lookup_peaks("NVIDIA H100 NVL", (9, 0))
    assert (sxm.bf16_tflops, sxm.fp8_tflops, sxm.mem_bandwidth_gbs, sxm.sm_count) == (
        989.0,
        1979.0,
        3350.0,
        132,
    )
    assert (pcie.bf16_tflops, pcie.mem_bandwidth_gbs, pcie.sm_count) == (756.0, 2000.0, 114)
    assert (nvl.bf16_tflops, nvl.mem_bandwidth_gbs) == (835.0, 3900.0)
    for peaks in (sxm, pcie, nvl):
        assert peaks.known and peaks.nvfp4_tflops is None  # Hopper has no FP4 tensor cores
        assert not peaks.unified_memory


def test_h200_has_h100_sxm_compute_and_more_bandwidth():
    h200 = lookup_peaks("NVIDIA H200", (9, 0))
    assert h200.known and h200.name == "NVIDIA H200 SXM"
    assert (h200.bf16_tflops, h200.fp8_tflops, h200.mem_bandwidth_gbs) == (989.0, 1979.0, 4800.0)
    assert lookup_peaks("NVIDIA H200 NVL", (9, 0)).bf16_tflops == 835.0


def test_gb10_is_matched_by_capability_12_1_and_name():
    gb10 = lookup_peaks("NVIDIA GB10", (12, 1))
    assert gb10.known and gb10.unified_memory
    assert (gb10.fp32_tflops, gb10.bf16_tflops, gb10.nvfp4_tflops) == (31.0, 62.0, 500.0)
    assert (gb10.mem_bandwidth_gbs, gb10.sm_count) == (273.0, 48)
    assert gb10.fp8_tflops is None  # no trusted dense FP8 figure: not guessed
    # the same name with another capability is not GB10
    assert not lookup_peaks("NVIDIA GB10", (12, 0)).known
    assert is_gb10("NVIDIA GB10", (12, 1)) and not is_gb10("NVIDIA GB100", (12, 1))


def test_gb200_is_not_mistaken_for_b200():
    assert lookup_peaks("NVIDIA GB200", (10, 0)).nvfp4_tflops == 10000.0
    assert lookup_peaks("NVIDIA B200", (10, 0)).nvfp4_tflops == 9000.0


@pytest.mark.parametrize(
    ("name", "capability"),
    [
        ("NVIDIA GeForce RTX 5090", (12, 0)),
        ("NVIDIA H100 80GB HBM3", (8, 0)),
        ("Tesla T4", (7, 5)),
        ("", (0, 0)),
    ],
)
def test_unknown_devices_get_known_false_and_no_rates(name, capability):
    peaks = lookup_peaks(name, capability)
    assert not peaks.known
    rates = (
        peaks.fp32_tflops,
        peaks.bf16_tflops,
        peaks.fp8_tflops,
        peaks.nvfp4_tflops,
        peaks.mem_bandwidth_gbs,
    )
    assert rates == (None,) * 5
    assert mfu(1e12, peaks) is None


def test_table_rates_are_ordered_and_sourced():
    for entry in PEAK_TABLE:
        p = entry.peaks
        rates = [r for r in (p.bf16_tflops, p.fp8_tflops, p.nvfp4_tflops) if r is not None]
        assert rates == sorted(rates), p.name  # lower precision is never slower
        assert p.fp32_tflops < p.bf16_tflops
        assert p.source and p.capability == entry.capability


def test_mfu_hand_computed():
    gb10 = lookup_peaks("NVIDIA GB10", (12, 1))
    assert mfu(31e12, gb10) == pytest.approx(0.5)  # 31 / 62
    assert mfu(125e12, gb10, "nvfp4") == pytest.approx(0.25)  # 125 / 500
    assert mfu(31e12, gb10, "fp32") == pytest.approx(1.0)
    assert mfu(1e12, gb10, "fp8") is None  # unknown peak -> no MFU
    h100 = lookup_peaks("NVIDIA H100 80GB HBM3", (9, 0))
    assert mfu(16.83e12, h100) == pytest.approx(16.83 / 989.0)
    assert mfu(989e12, h100, "fp16") == pytest.approx(1.0)
    assert mfu(1e12, h100, "nvfp4") is None


def test_mfu_rejects_bad_input():
    h100 = lookup_peaks("NVIDIA H100 80GB HBM3", (9, 0))
    with pytest.raises(ValueError, match="unknown precision 'int4'"):
        mfu(1e12, h100, "int4")
    with pytest.raises(ValueError, match=">= 0"):
        mfu(-1.0, h100)
    with pytest.raises(ValueError, match="unknown precision"):
        peak_tflops(h100, "tf32")


def test_sm_arch_matches_tritons_rule():
    assert sm_arch((12, 1)) == "sm_121a"
    assert sm_arch((9, 0)) == "sm_90a"
    assert sm_arch((10, 0)) == "sm_100a"
    assert sm_arch((8, 6)) == "sm_86"


def test_device_peaks_without_a_gpu_is_unknown():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU (the gpu test covers it)")
    peaks = device_peaks()
    assert not peaks.known and peaks.bf16_tflops is None and "no CUDA GPU" in peaks.source


@pytest.mark.gpu
def test_device_peaks_on_a_real_gpu_uses_what_the_device_reports():
    import torch

    props = torch.cuda.get_device_properties(0)
    peaks = device_peaks(0)
    assert peaks.name == props.name
    assert peaks.sm_count == props.multi_processor_count
    assert peaks.known == lookup_peaks(props.name, (props.major, props.minor)).known
