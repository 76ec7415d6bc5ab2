"""The CUDA kernels are source files (nvfp4/cuda/*.cu, *.cuh) rendered for NVRTC; every piece resolves
and every file ships with the package."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import pytest

from slime_gb10.nvfp4 import _cuda_gemm, _cuda_w4a16
from slime_gb10.nvfp4.hopper import wgmma as _cuda_wgmma

ROOT = Path(__file__).resolve().parents[2]
CUDA = ROOT / "python" / "slime_gb10" / "nvfp4" / "cuda"


@pytest.mark.parametrize(
    ("source", "plan", "kernel"),
    [
        (
            _cuda_w4a16._source,
            _cuda_w4a16.Plan(2, 2, 2, 2, stages=3, window=2, warps=8, line=True),
            "w4a16_small",
        ),
        (_cuda_gemm._source, _cuda_gemm.GemmPlan(2, 2, 2, 4, stages=3, cluster=2), "w4a16_gemm"),
        (_cuda_wgmma._source, _cuda_wgmma.WgmmaPlan(2, 128, stages=4, cluster=2, depth=2), "w4a16_wgmma"),
    ],
)
def test_a_rendered_kernel_has_every_piece(source, plan, kernel):
    text = source(plan)
    assert "@include" not in text and "@PAIR_DECODER_PTX@" not in text and "@WGMMA_ASM@" not in text
    assert text.startswith("#define ")
    assert (CUDA / "device_helpers.cuh").read_text() in text  # spliced where the include line was
    assert f"CLUSTER_ATTR {kernel}(" in text
    if kernel != "w4a16_small":
        assert (CUDA / "gemm_helpers.cuh").read_text() in text
    if kernel == "w4a16_wgmma":
        assert "wgmma.mma_async" in text  # the shapes made in Python for this BM


def test_every_kernel_file_is_package_data():
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "slime_gb10"
    ]
    files = sorted(CUDA.iterdir())
    assert {f.suffix for f in files} == {".cu", ".cuh"}
    for f in files:
        relative = f.relative_to(ROOT / "python" / "slime_gb10").as_posix()
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), relative
    nix = (ROOT / "nix" / "packages" / "slime-gb10.nix").read_text()
    assert 'hasExt "cu"' in nix and 'hasExt "cuh"' in nix
