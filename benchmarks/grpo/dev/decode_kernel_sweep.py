"""The grouped-query decode kernel (``engines/torch/decode_attention.py``) alone, over its launch choices,
against SDPA as torch picks it, on shape B's decode attention: 160 rows, 14 query / 2 KV heads of 64,
a bucket of 384 slots (~48 of them left padding). ``--l2 cold`` (the default) times with
``triton.testing.do_bench``, which overwrites the L2 cache before every call, as a decode step's other
layers do; ``--l2 warm`` with ``do_bench_cudagraph``, which re-reads a cache that fits the H100's 50 MB
L2 (session 20's sweep: 10.0 us in-L2 for a launch that takes 15.1 us inside the decode step).

    python benchmarks/grpo/dev/decode_kernel_sweep.py [--rows 160] [--slots 384] [--l2 cold|warm]
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton.testing

from slime_gb10.grpo.engines.torch.decode_attention import launch, reference, splits_for


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=160)
    parser.add_argument("--slots", type=int, default=384)
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--l2", choices=("cold", "warm"), default="cold")
    args = parser.parse_args()
    bench = triton.testing.do_bench if args.l2 == "cold" else triton.testing.do_bench_cudagraph
    rows, slots, d = args.rows, args.slots, 64
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(rows, args.heads, 1, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    cache = torch.randn(
        2, rows, args.kv_heads, slots + 192, d, device="cuda", dtype=torch.bfloat16, generator=gen
    )
    k, v = cache[0, :, :, :slots], cache[1, :, :, :slots]
    mask = torch.ones(rows, slots + 193, dtype=torch.bool, device="cuda")
    mask[:, :48] = False
    valid = mask[:, :slots]
    want = reference(q.float(), k.float(), v.float(), valid, d**-0.5)
    kv_bytes = 2 * rows * args.kv_heads * slots * d * 2
    results = []
    sdpa_ms = bench(lambda: reference(q, k, v, valid, d**-0.5))
    results.append(("SDPA (torch's choice)", sdpa_ms, 0.0))
    for splits, block, warps, stages in itertools.product((1, 2, 4), (32, 64, 128), (2, 4, 8), (1, 2, 3)):
        try:
            config = (splits, block, warps, stages)
            out = launch(q, k, v, valid, d**-0.5, *config)
            ms = bench(lambda c=config: launch(q, k, v, valid, d**-0.5, *c))
        except Exception as exc:  # a configuration this GPU cannot run (shared memory) is skipped
            print(f"splits {splits} block {block} warps {warps} stages {stages}: {type(exc).__name__}")
            continue
        err = float((out.float() - want).abs().max())
        results.append((f"splits {splits} block {block} warps {warps} stages {stages}", ms, err))
    results.sort(key=lambda r: r[1])
    print(
        f"{torch.cuda.get_device_name()}: {rows} rows x {slots} slots, KV {kv_bytes / 1e6:.1f} MB; "
        f"auto splits {splits_for(rows, args.kv_heads, slots, q.device)}"
    )
    print("| launch | us | KV GB/s | max abs error |")
    for name, ms, err in results[:12] + [r for r in results if r[0].startswith("SDPA")]:
        print(f"| {name} | {ms * 1e3:.1f} | {kv_bytes / (ms * 1e-3) / 1e9:.0f} | {err:.4f} |")


if __name__ == "__main__":
    main()
