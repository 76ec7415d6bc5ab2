"""Device check of the wgmma W4A16 GEMM kernel (development tool, sm_90; the benchmark of record is
`slime-gb10 bench nvfp4`): correctness of every tiling against float64 (poisoned outputs, bias, M
not a multiple of the token tile, uneven K splits), then a timing sweep of the tilings against BF16
cuBLAS, the mma.sync GEMM kernel's plan and what `w4a16_linear` does today (CUDA graphs, weight
copies rotating through more than L2). Writes the sweep as JSON to argv[1] if given.

    python3 benchmarks/nvfp4/dev/check_cuda_wgmma.py [sweep.json [M,M,...] [NxK,NxK,...]]
    (timed M: 64,128,256,1024 and the benchmark's four layers by default)
"""

import concurrent.futures
import itertools
import json
import sys

import torch

from slime_gb10.bench import nvfp4 as bench
from slime_gb10.nvfp4 import _cuda_gemm as gemm
from slime_gb10.nvfp4 import kernels, w4a16
from slime_gb10.nvfp4.format import NVFP4Tensor, dequantize_reference
from slime_gb10.nvfp4.hopper import wgmma
from slime_gb10.nvfp4.ops import quantize


def weight_copies(n: int, k: int):
    """Prepared NVFP4 copies of a BF16 weight and BF16 copies: enough of each to stream from HBM."""
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    q = quantize(w)
    qs = [
        NVFP4Tensor(q.data.clone(), q.scale.clone(), q.global_scale.clone(), q.shape, q.dtype)
        for _ in range(bench._copies(q.nbytes))
    ]
    return (
        qs,
        [w4a16.prepare_w4a16(one) for one in qs],
        [w.clone() for _ in range(bench._copies(w.numel() * 2))],
    )


torch.manual_seed(0)
sms = torch.cuda.get_device_properties(0).multi_processor_count
limit = wgmma.max_shared_bytes(0)
ALL = [
    wgmma.WgmmaPlan(wg, bm, stages, cluster)
    for wg, bm, stages, cluster in itertools.product((1, 2), (64, 128, 192, 256), (3, 4, 5), (1, 2, 4))
    if wgmma.shared_bytes(wgmma.WgmmaPlan(wg, bm, stages, cluster)) <= limit
]
TIMED_M = [int(m) for m in sys.argv[2].split(",")] if len(sys.argv) > 2 else [64, 128, 256, 1024]
TIMED_SHAPES = (
    [tuple(int(v) for v in shape.split("x")) for shape in sys.argv[3].split(",")]
    if len(sys.argv) > 3
    else [(4096, 4096), (14336, 4096), (4096, 14336), (896, 4864)]
)
print(f"{len(ALL)} tilings, shared memory limit {limit}", flush=True)
try:  # NVRTC releases the GIL: compile every tiling up front, on all cores
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda pl: (torch.cuda.set_device(0), wgmma._kernel(0, pl)), ALL))
except Exception as e:  # compiled one by one below instead
    print("parallel compile failed:", e)

worst, checked, bad = 0.0, 0, 0
for M, N, K, bias in [
    (5, 256, 1024, True),
    (37, 896, 4864, False),
    (130, 4096, 4096, True),
    (200, 512, 1152, True),
    (64, 1024, 2048, False),
    (300, 384, 640, True),
]:
    w = torch.randn(N, K, device="cuda") * 0.05
    q = quantize(w)
    p = w4a16.prepare_w4a16(q)
    x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    b = torch.randn(N, device="cuda").to(torch.bfloat16) if bias else None
    ref = x.double() @ dequantize_reference(q, torch.float64).T + (b.double() if bias else 0)
    for pl in ALL:
        if not wgmma.valid(pl, M, N, K, limit):
            continue
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        wgmma.w4a16_wgmma(x, p.data, p.scale_codes, p.global_scale, b, out, pl)
        torch.cuda.synchronize()
        err = float((out.double() - ref).norm() / ref.norm())
        err = err if torch.isfinite(out).all() else float("inf")
        checked += 1
        worst = max(worst, err)
        if not err < 1e-2:
            bad += 1
            if bad < 20:
                print(f"BAD M={M} N={N} K={K} {tuple(pl)}: {err}", flush=True)
print(f"checked {checked} (shape, tiling) pairs; {bad} bad; worst rel err {worst:.2e}", flush=True)
if bad:
    sys.exit(1)

rows = []
for n, k in TIMED_SHAPES:
    qs, ps, ws = weight_copies(n, k)
    copies = len(ps)
    for m in TIMED_M:
        xs = [torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
        reps = 2 * max(copies, len(ws))
        t_bf16 = bench.graph_time(
            [lambda i=i, xs=xs, ws=ws: torch.matmul(xs[i % 2], ws[i].T) for i in range(len(ws))], reps
        )
        t_auto = bench.graph_time(
            [
                lambda i=i, xs=xs, qs=qs, ps=ps: w4a16.w4a16_linear(xs[i % 2], qs[i], prepared=ps[i])
                for i in range(copies)
            ],
            reps,
        )
        t_dequant = bench.graph_time(
            [
                lambda i=i, xs=xs, qs=qs: torch.nn.functional.linear(
                    xs[i % 2], kernels.dequantize_triton(qs[i], torch.bfloat16)
                )
                for i in range(copies)
            ],
            reps,
        )
        outs = [torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
        gp = gemm.plan(m, n, k, sms) if m <= 256 else None  # timed up to 256; "auto" takes it up to 64
        t_gemm = (
            float("nan")
            if gp is None
            else bench.graph_time(
                [
                    lambda i=i, xs=xs, ps=ps, outs=outs, gp=gp: gemm.w4a16_gemm(
                        xs[i % 2], ps[i].data, ps[i].scale_codes, ps[i].global_scale, None, outs[i % 2], gp
                    )
                    for i in range(copies)
                ],
                reps,
            )
        )
        res = []
        for pl in ALL:
            if not wgmma.valid(pl, m, n, k, limit):
                continue
            blocks = (n // pl.rows) * -(-m // pl.bm) * pl.cluster
            if not sms // 4 <= blocks <= 16 * sms:
                continue
            t = bench.graph_time(
                [
                    lambda i=i, pl=pl, xs=xs, ps=ps, outs=outs: wgmma.w4a16_wgmma(
                        xs[i % 2], ps[i].data, ps[i].scale_codes, ps[i].global_scale, None, outs[i % 2], pl
                    )
                    for i in range(copies)
                ],
                reps,
                replays=5,
            )
            res.append((t, pl))
            rows.append(
                {
                    "M": m,
                    "N": n,
                    "K": k,
                    "plan": list(pl),
                    "us": 1e3 * t,
                    "bf16_us": 1e3 * t_bf16,
                    "auto_us": 1e3 * t_auto,
                    "dequant_us": 1e3 * t_dequant,
                    "gemm_us": 1e3 * t_gemm,
                }
            )
        res.sort()
        best = " ".join(f"{tuple(pl)}:{1e3 * t:.1f}" for t, pl in res[:4])
        print(
            f"M={m:4d} {n:6d}x{k:<6d} bf16 {1e3 * t_bf16:7.1f} us auto {t_bf16 / t_auto:4.2f}x dequantize {t_bf16 / t_dequant:4.2f}x gemm {t_bf16 / t_gemm:4.2f}x"
            f" | wgmma best {t_bf16 / res[0][0]:4.2f}x: {best}",
            flush=True,
        )
    if len(sys.argv) > 1:  # after every layer: a run cut short keeps what it measured
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f)
