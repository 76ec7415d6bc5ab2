"""Device check of the CUDA W4A16 kernel: correctness against float64 (poisoned outputs, several
M/N/K/splits, bias), then timings against BF16 cuBLAS and the Triton kernel (CUDA graphs, weight
copies rotating through more than L2). Development tool; the benchmark of record is `slime-gb10 bench nvfp4`."""

import torch

from slime_gb10.nvfp4 import _cuda_w4a16, bench, kernels
from slime_gb10.nvfp4.format import NVFP4Tensor, dequantize_reference, quantize

torch.manual_seed(0)
sms = torch.cuda.get_device_properties(0).multi_processor_count
worst = 0.0
for M, N, K, bias in [
    (1, 128, 128, False),
    (3, 256, 256, True),
    (16, 384, 1024, False),
    (8, 4096, 4096, True),
    (16, 896, 4864, True),
    (5, 14336, 4096, False),
    (1, 4096, 14336, True),
]:
    w = torch.randn(N, K, device="cuda") * 0.05
    q = quantize(w)
    p = kernels.prepare_w4a16(q)
    x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    b = torch.randn(N, device="cuda").to(torch.bfloat16) if bias else None
    ref = x.double() @ dequantize_reference(q, torch.float64).T + (b.double() if bias else 0)
    smallest = next(d for d in range(1, K // 128 + 1) if (K // 128) % d == 0 and K // d <= 1024)
    for split in sorted({smallest, _cuda_w4a16.plan_split(N, K, sms)}):
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        counters = kernels._split_counters(x.device, N // 128)
        _cuda_w4a16.w4a16_m16(x, p.data, p.scale_codes, p.global_scale, b, out, counters, split)
        torch.cuda.synchronize()
        err = float((out.double() - ref).norm() / ref.norm())
        worst = max(worst, err if torch.isfinite(out).all() else float("inf"))
        print(
            f"M={M} N={N} K={K} bias={bias} split={split}: rel err {err:.2e} finite={bool(torch.isfinite(out).all())}"
        )
print("worst rel err", worst)
for n, k in [(4096, 4096), (14336, 4096), (4096, 14336), (896, 4864)]:
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    q = quantize(w)
    copies = bench._copies(q.nbytes)
    ps = [
        kernels.prepare_w4a16(
            NVFP4Tensor(q.data.clone(), q.scale.clone(), q.global_scale.clone(), q.shape, q.dtype)
        )
        for _ in range(copies)
    ]
    ws = [w.clone() for _ in range(bench._copies(w.numel() * 2))]
    segs = k // 128
    splits = sorted({d for d in range(1, segs + 1) if segs % d == 0 and k // d <= 1024 and d <= 64})[:6]
    for m in (1, 16):
        xs = [torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
        t_bf16 = bench.graph_time(
            [lambda i=i, xs=xs, ws=ws: torch.matmul(xs[i % 2], ws[i].T) for i in range(len(ws))], 2 * len(ws)
        )
        counters = kernels._split_counters(torch.device("cuda"), n // 128)
        row = []
        for sp in splits:
            outs = [torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
            t = bench.graph_time(
                [
                    lambda i=i, sp=sp, xs=xs, ps=ps, outs=outs, counters=counters: _cuda_w4a16.w4a16_m16(
                        xs[i % 2],
                        ps[i].data,
                        ps[i].scale_codes,
                        ps[i].global_scale,
                        None,
                        outs[i % 2],
                        counters,
                        sp,
                    )
                    for i in range(copies)
                ],
                2 * copies,
            )
            row.append(f"split {sp}: {1e3 * t:6.1f} us ({t_bf16 / t:4.2f}x)")
        print(f"M={m:2d} {n:6d}x{k:<6d} bf16 {1e3 * t_bf16:6.1f} us | " + " | ".join(row))
