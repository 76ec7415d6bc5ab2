"""Device check of the CUDA W4A16 kernel (development tool; the benchmark of record is
`slime-gb10 bench nvfp4`): correctness of every tiling against float64 (poisoned outputs, bias),
then a timing sweep of all valid tilings against BF16 cuBLAS (CUDA graphs, weight copies rotating
through more than L2), marking the one `plan` picks. Writes the sweep as JSON to argv[1] if given.

    python3 benchmarks/nvfp4/dev/check_cuda_w4a16.py [sweep.json [M,M,...]]   (timed M: 1,4,16 by default)
    ncu ... python3 benchmarks/nvfp4/dev/check_cuda_w4a16.py profile M N K nt cluster rw depth rows loads stages minb window [warps line]

The second form runs one tiling and BF16 cuBLAS four times each on that shape, for ``ncu``."""

import concurrent.futures
import itertools
import json
import sys

import torch

from slime_gb10.bench import nvfp4 as bench
from slime_gb10.nvfp4 import _cuda_w4a16 as cuda
from slime_gb10.nvfp4 import w4a16
from slime_gb10.nvfp4.format import NVFP4Tensor, dequantize_reference
from slime_gb10.nvfp4.ops import quantize


def weight_copies(n: int, k: int):
    """A BF16 weight, its prepared NVFP4 copies and BF16 copies: enough of each to stream from HBM."""
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    q = quantize(w)
    ps = [
        w4a16.prepare_w4a16(
            NVFP4Tensor(q.data.clone(), q.scale.clone(), q.global_scale.clone(), q.shape, q.dtype)
        )
        for _ in range(bench._copies(q.nbytes))
    ]
    return ps, [w.clone() for _ in range(bench._copies(w.numel() * 2))]


torch.manual_seed(0)
if sys.argv[1:2] == ["profile"]:
    M, N, K, *tiling = (int(v) for v in sys.argv[2:])
    ps, ws = weight_copies(N, K)
    x = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    for i in range(4):
        p = ps[i % len(ps)]
        cuda.w4a16_small(x, p.data, p.scale_codes, p.global_scale, None, out, cuda.Plan(*tiling))
        torch.matmul(x, ws[i % len(ws)].T)
    torch.cuda.synchronize()
    sys.exit(0)
sms = torch.cuda.get_device_properties(0).multi_processor_count
ALL = (
    [
        cuda.Plan(nt, c, rw, 2, rows, loads, 0, 1)
        for nt, c, rw, (rows, loads) in itertools.product(
            (1, 2), (1, 2, 4, 8), (4, 2, 1), ((32, 1), (16, 2), (32, 2))
        )
    ]
    + [
        cuda.Plan(nt, c, rw, 1, rows, loads, stages, minb)
        for nt, c, rw, (rows, loads), stages, minb in itertools.product(
            (1, 2), (1, 2, 4, 8), (4, 2, 1), ((32, 1), (16, 2), (32, 2)), (3, 4), (1, 4)
        )
    ]
    + [
        cuda.Plan(nt, c, rw, 1, 32, 1, 3, minb, window)
        for nt, c, rw, minb, window in itertools.product(
            (3, 4), (1, 2, 4, 8), (4, 2, 1), (1, 2), (1, 2, 4, 0)
        )
    ]
    + [  # wide blocks (session 9): 8 or 16 warps, registers capped for 64 or 128 per thread
        cuda.Plan(nt, c, rw, depth, rows, loads, stages, max(1, 65536 // regs // (32 * warps)), 0, warps)
        for nt, warps, c, rw, (rows, loads), (depth, stages), regs in itertools.product(
            (1, 2),
            (4, 8, 16),
            (1, 2, 4),
            (1, 2),
            ((16, 1), (32, 1), (16, 2)),
            ((1, 0), (2, 0), (1, 3)),
            (64, 128),
        )
        if warps > 4 or (rows, loads) == (16, 1)
    ]
    + [  # the cp.async ring fetching whole 128-byte lines into the L2 (session 11, Plan.line)
        cuda.Plan(nt, c, rw, 1, rows, loads, 3, 4, line=True)
        for nt, c, rw, (rows, loads) in itertools.product(
            (1, 2), (1, 2, 4, 8), (4, 2, 1), ((32, 1), (16, 2), (32, 2))
        )
    ]
    + [  # two-tile plans (session 10, M = 9..16): 8 warps in 4 or 8 row sets
        cuda.Plan(2, c, rw, depth, rows, loads, 0, 2, 0, 8)
        for c, rw, (depth, loads), rows in itertools.product((1, 2, 4, 8), (4, 8), ((2, 1), (1, 2)), (16, 32))
    ]
)
TIMED_M = [int(m) for m in sys.argv[2].split(",")] if len(sys.argv) > 2 else [1, 4, 16]
# NVRTC releases the GIL: compile every tiling up front, on all cores
try:
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda pl: (torch.cuda.set_device(0), cuda._kernel(0, pl)), ALL))
except Exception as e:  # compiled one by one below instead
    print("parallel compile failed:", e)
worst, checked = 0.0, 0
for M, N, K, bias in [
    (1, 128, 512, False),
    (3, 256, 1024, True),
    (16, 384, 1024, False),
    (8, 896, 4864, True),
    (13, 4096, 4096, True),
    (5, 14336, 4096, False),
    (1, 4096, 14336, True),
    (20, 256, 1024, True),
    (27, 896, 4864, False),
    (32, 4096, 4096, True),
    (25, 4096, 14336, False),
]:
    w = torch.randn(N, K, device="cuda") * 0.05
    q = quantize(w)
    p = w4a16.prepare_w4a16(q)
    x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    b = torch.randn(N, device="cuda").to(torch.bfloat16) if bias else None
    ref = x.double() @ dequantize_reference(q, torch.float64).T + (b.double() if bias else 0)
    for pl in ALL:
        if not cuda.valid(pl, M, N, K) or (pl.nt > 2 and pl.nt != -(-M // 8)):
            continue
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        cuda.w4a16_small(x, p.data, p.scale_codes, p.global_scale, b, out, pl)
        torch.cuda.synchronize()
        err = float((out.double() - ref).norm() / ref.norm())
        err = err if torch.isfinite(out).all() else float("inf")
        checked += 1
        if err > worst:
            worst = err
        if not err < 1e-2:
            print(f"BAD M={M} N={N} K={K} {pl}: {err}")
print("set_shared_memory_config:", hasattr(torch.cuda._utils._CudaKernel, "set_shared_memory_config"))
print(f"checked {checked} (shape, tiling) pairs; worst rel err {worst:.2e}", flush=True)

rows = []
for n, k in [(4096, 4096), (14336, 4096), (4096, 14336), (896, 4864)]:
    ps, ws = weight_copies(n, k)
    copies = len(ps)
    for m in TIMED_M:
        xs = [torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
        t_bf16 = bench.graph_time(
            [lambda i=i, xs=xs, ws=ws: torch.matmul(xs[i % 2], ws[i].T) for i in range(len(ws))], 2 * len(ws)
        )
        outs = [torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
        chosen = cuda.plan(m, n, k, sms)
        res = []
        for pl in ALL:
            if not cuda.valid(pl, m, n, k) or pl.nt != -(-m // 8):
                continue
            t = bench.graph_time(
                [
                    lambda i=i, pl=pl, xs=xs, ps=ps, outs=outs: cuda.w4a16_small(
                        xs[i % 2], ps[i].data, ps[i].scale_codes, ps[i].global_scale, None, outs[i % 2], pl
                    )
                    for i in range(copies)
                ],
                2 * copies,
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
                    "chosen": pl == chosen,
                }
            )
        res.sort()
        tc = next((t for t, pl in res if pl == chosen), float("nan"))
        best = " ".join(f"{tuple(pl)}:{1e3 * t:.1f}" for t, pl in res[:4])
        print(
            f"M={m:2d} {n:6d}x{k:<6d} bf16 {1e3 * t_bf16:6.1f} us | plan {tuple(chosen)} {1e3 * tc:6.1f} us "
            f"{t_bf16 / tc:4.2f}x | best {t_bf16 / res[0][0]:4.2f}x: {best}",
            flush=True,
        )
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f)
