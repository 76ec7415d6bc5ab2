"""The Triton kernels under TRITON_INTERPRET=1 on the CPU, against the pure-PyTorch reference.

Runs in a subprocess because Triton reads TRITON_INTERPRET when kernels are defined. Shapes are
tiny (the interpreter is slow). The inline-PTX decoder of the GEMM cannot run here (it is GPU
assembly); its pure-Triton twin does, and ``test_kernels_gpu.py`` checks both on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

triton = pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import json
    import torch
    from slime_gb10.nvfp4 import kernels, w4a16, quantize_reference, dequantize_reference

    def same(a, b):
        return (torch.equal(a.data, b.data)
                and torch.equal(a.scale.view(torch.uint8), b.scale.view(torch.uint8))
                and torch.equal(a.global_scale.float(), b.global_scale.float()))


    def boundary_probes(seed: int, rows: int = 64) -> tuple[torch.Tensor, float]:
        # rows probing every E2M1 decision point d * t and its 1-2 ulp neighbours
        g = torch.Generator().manual_seed(seed)
        gs = float(torch.tensor(float(torch.rand(1, generator=g)) * 0.5 + 0.5) * 2.0 ** int(torch.randint(-20, 5, (1,), generator=g)))
        thresholds = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.0])
        out = torch.zeros(rows, 16)
        for r in range(rows):
            anchor = torch.tensor(6.0 * float(2.0 ** torch.randint(-8, 8, (1,), generator=g)) * (1 + float(torch.rand(1, generator=g))) * gs)
            block = torch.zeros(16)
            block[0] = anchor
            s = quantize_reference(block, gs).scale.float()[0]
            d = (s * torch.tensor(gs, dtype=torch.float32)).float()
            for k in range(1, 16):
                t = thresholds[int(torch.randint(0, 8, (1,), generator=g))]
                v = (d * t).float() if t > 0 else torch.tensor(2.0**-149) * int(torch.randint(1, 4, (1,), generator=g))
                for _ in range(int(torch.randint(-2, 3, (1,), generator=g))):
                    v = torch.nextafter(v, torch.tensor(float("inf")))
                for _ in range(int(torch.randint(-2, 3, (1,), generator=g).clamp(max=0).neg())):
                    v = torch.nextafter(v, torch.tensor(0.0))
                block[k] = -v if torch.rand(1, generator=g) < 0.5 else v
            out[r] = block
        return out, gs

    results = {}
    for seed in range(3):
        x, gs = boundary_probes(seed, rows=16)
        ref = quantize_reference(x, gs)
        results[f"boundaries_{seed}"] = same(kernels.quantize_triton(x, gs), ref)
        results[f"boundaries_divide_{seed}"] = same(kernels.quantize_triton(x, gs, divide=True), ref)
    g = torch.Generator().manual_seed(0)
    cases = [((4, 64), torch.bfloat16, 0.0), ((3, 5, 32), torch.float32, 4.0), ((7, 48), torch.float16, 2.0),
             ((300, 16), torch.bfloat16, 8.0)]
    for i, (shape, dtype, spread) in enumerate(cases):
        x = torch.randn(shape, generator=g) * torch.exp(spread * torch.randn(shape, generator=g))
        x = x.clamp(-6e4, 6e4).to(dtype)
        ref = quantize_reference(x)
        results[f"quantize_{i}"] = same(kernels.quantize_triton(x), ref)
        results[f"quantize_divide_{i}"] = same(kernels.quantize_triton(x, divide=True), ref)
        gs = float(ref.global_scale) * 0.3
        results[f"quantize_given_scale_{i}"] = same(kernels.quantize_triton(x, gs), quantize_reference(x, gs))
        for out in (torch.bfloat16, torch.float32, torch.float16):
            results[f"dequantize_{i}_{out}"] = torch.equal(
                kernels.dequantize_triton(ref, out), dequantize_reference(ref, out))
    special = torch.tensor([[6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.2, 0.3, 5.1, -0.25, -0.75, -2.5, -5.0, -6],
                            [-0.0, -0.01, 0.01, 6.0] + [0.0] * 12, [0.0] * 16,
                            [2.5 * 6 * 2.0**-9, -1e-3] + [0.0] * 14, [12 * 448.0, -3 * 448.0] + [0.0] * 14])
    results["special"] = same(kernels.quantize_triton(special, 1.0), quantize_reference(special, 1.0))
    try:
        kernels.quantize_triton(torch.tensor([float("nan")] + [0.0] * 15))
        results["nan_raises"] = False
    except ValueError:
        results["nan_raises"] = True
    errors = {}
    for M, N, K, split in [(1, 64, 128, 1), (5, 96, 256, 2), (17, 40, 48, 1)]:
        x = torch.randn(M, K, generator=g).bfloat16()
        q = quantize_reference(torch.randn(N, K, generator=g))
        b = torch.randn(N, generator=g).bfloat16()
        ref = x.double() @ dequantize_reference(q, torch.float64).T + b.double()
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
        w4a16.w4a16_matmul(x, q, b, config=dict(BM=16, BN=32, BK=32, split=split), use_asm=False, out=out)
        errors[f"{M}x{N}x{K}/{split}"] = float((out.double() - ref).norm() / ref.norm())
    for M, N, K, split in [(5, 64, 256, 2), (40, 128, 256, 1)]:  # the wide kernel, 16-token tiles
        x = torch.randn(M, K, generator=g).bfloat16()
        q = quantize_reference(torch.randn(N, K, generator=g))
        b = torch.randn(N, generator=g).bfloat16()
        ref = x.double() @ dequantize_reference(q, torch.float64).T + b.double()
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
        cfg = dict(engine="wide", BN=64, BM=16, BK=128, split=split)
        w4a16.w4a16_matmul(x, q, b, config=cfg, out=out)
        errors[f"wide {M}x{N}x{K}/{split}"] = float((out.double() - ref).norm() / ref.norm())
    results["gemm_rel_errors"] = errors
    print(json.dumps(results))
    """
)


@pytest.mark.slow
@pytest.mark.skipif(
    tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 7),
    reason="Triton's interpreter before 3.7 cannot run a loop bounded by program_id arithmetic "
    "(the GPU tests cover those versions; CI installs a current Triton)",
)
def test_triton_kernels_under_the_interpreter_match_the_reference():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    errors = results.pop("gemm_rel_errors")
    assert all(results.values()), {k: v for k, v in results.items() if not v}
    assert all(e < 1e-2 for e in errors.values()), errors
