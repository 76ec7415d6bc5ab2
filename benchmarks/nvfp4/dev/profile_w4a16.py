"""Time a grid of fused W4A16 kernel configurations for a few (M, N, K), and run each config once
more for ``ncu`` (--profile). Development tool: the benchmark of record is ``slime-gb10 bench nvfp4``.

    python3 benchmarks/nvfp4/dev/profile_w4a16.py grid
    ncu --kernel-name w4a16_kernel --launch-skip 0 --launch-count 4 ... python3 benchmarks/nvfp4/dev/profile_w4a16.py profile
"""

import itertools
import json
import os
import sys

import torch

from slime_gb10.bench import nvfp4 as bench
from slime_gb10.nvfp4 import w4a16
from slime_gb10.nvfp4.format import NVFP4Tensor
from slime_gb10.nvfp4.ops import quantize

SHAPES = [(1, 14336, 4096), (1, 4096, 4096)]


def configs(m, n, k, sms):
    grid = itertools.product((32, 64), (128, 256), (1, 2), (1, 2), (8, 16), (None,))
    for bn, bk, warps, stages, per_sm, maxnreg in grid:
        if bn * bk // (32 * warps) < 16 or bn < 16 * warps:
            continue
        tiles = -(-n // bn)
        k_tiles = k // bk
        split = max(1, min(k_tiles, (per_sm * sms) // tiles, 32))
        yield {
            "BM": 16,
            "BN": bn,
            "BK": bk,
            "num_warps": warps,
            "num_stages": stages,
            "split": split,
            "maxnreg": maxnreg,
        }


def main():
    mode = sys.argv[1]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    for m, n, k in SHAPES:
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
        q = quantize(w)
        copies = bench._copies(q.nbytes)
        qs = [q] + [
            NVFP4Tensor(q.data.clone(), q.scale.clone(), q.global_scale.clone(), q.shape, q.dtype)
            for _ in range(copies - 1)
        ]
        xs = [torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
        ps = [w4a16.prepare_w4a16(one) for one in qs]
        if mode == "profile":
            for cfg in json.loads(os.environ["PROFILE_CONFIGS"]):
                for i in range(2):
                    w4a16.w4a16_matmul(xs[0], w4a16.prepare_w4a16(qs[i]), config=cfg)
            torch.cuda.synchronize()
            continue
        ws = [w] + [w.clone() for _ in range(bench._copies(w.numel() * 2) - 1)]
        t_bf16 = bench.graph_time(
            [lambda i=i, xs=xs, ws=ws: torch.matmul(xs[i % 2], ws[i].T) for i in range(len(ws))], 2 * len(ws)
        )
        for cfg in configs(m, n, k, sms):
            try:
                t = bench.graph_time(
                    [
                        lambda i=i, cfg=cfg, xs=xs, ps=ps: w4a16.w4a16_matmul(xs[i % 2], ps[i], config=cfg)
                        for i in range(copies)
                    ],
                    2 * copies,
                )
            except Exception as exc:
                results.append({"M": m, "N": n, "K": k, "cfg": cfg, "error": str(exc)[:200]})
                continue
            results.append(
                {
                    "M": m,
                    "N": n,
                    "K": k,
                    "cfg": cfg,
                    "us": 1e3 * t,
                    "x_bf16": t_bf16 / t,
                    "us_bf16": 1e3 * t_bf16,
                }
            )
        torch.cuda.empty_cache()
    if mode == "grid":
        with open(os.path.join(os.environ.get("OUT", "."), "grid.json"), "w") as f:
            json.dump(results, f, indent=1)
        for shape in SHAPES:
            rows = sorted(
                (r for r in results if (r["M"], r["N"], r["K"]) == shape and "us" in r), key=lambda r: r["us"]
            )
            print(shape, "bf16 us", rows[0]["us_bf16"] if rows else None)
            for r in rows[:6]:
                print(f"   {r['us']:7.1f} us  {r['x_bf16']:.2f}x  {r['cfg']}")


if __name__ == "__main__":
    main()
