"""sgl-kernel ops run on this GPU and compute the right thing (a flake GPU check on GB10).

The doctor only imports sgl-kernel and lists the SASS archs it carries; this runs two of the
kernels SGLang calls in every layer of a Llama/Qwen model (SwiGLU and RMSNorm) on the device and
compares them with float64 references. On a GB10 it proves the flake's sgl-kernel build really has
sm_120a/sm_121a code (blockers #2-#5): a wheel without it fails here with "no kernel image".
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def sgl_kernel():
    return pytest.importorskip("sgl_kernel", reason="sgl-kernel not installed (the flake builds it)")


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("shape", [(7, 2 * 576), (33, 2 * 1536), (128, 2 * 4864)])
def test_silu_and_mul_matches_float64(sgl_kernel, shape):
    torch.manual_seed(shape[0])
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    out = torch.full((shape[0], shape[1] // 2), float("nan"), device="cuda", dtype=torch.bfloat16)
    sgl_kernel.silu_and_mul(x, out)
    torch.cuda.synchronize()
    gate, up = x.double().chunk(2, dim=-1)
    ref = torch.nn.functional.silu(gate) * up
    assert torch.isfinite(out).all(), "some outputs were never written"
    assert _rel_err(out, ref) < 1e-2


@pytest.mark.parametrize("shape", [(5, 576), (64, 896), (257, 4096)])
def test_rmsnorm_matches_float64(sgl_kernel, shape):
    torch.manual_seed(shape[1])
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(shape[1], device="cuda", dtype=torch.bfloat16) + 0.5
    out = sgl_kernel.rmsnorm(x, w, 1e-6)
    torch.cuda.synchronize()
    xd = x.double()
    ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    assert _rel_err(out, ref) < 1e-2
