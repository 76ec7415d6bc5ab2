"""The default run as a newcomer meets it: `slime-gb10 train` with no arguments, timed whole.

It runs the real CLI in a child process with a fresh model cache (so the one-time GGUF conversion
is counted, as on a first run) and a fresh run directory, then reports

* wall time of the whole command, and of the same command again with the cache warm;
* bytes written: the run directory and the model cache, file by file summed (not `du` blocks);
* peak resident memory of the child (``getrusage(RUSAGE_CHILDREN)``);
* held-out greedy pass@1 before and after (the run's own ``metrics.jsonl``), with Wilson 95%
  intervals, so "learning is visible" is a number;
* this machine's ceilings, measured in the same run: the FP32 copy bandwidth and FP32 GEMM rate a
  2-core run is bound by (the CPU decode is memory-bound on the FP32 weights).

Targets (issue "Trust and the first run"): <= 5 minutes on 2 cores, <= 1 GB written.

    python benchmarks/default_run/bench_default_run.py --out /tmp/default-run   # prints a Markdown table
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (Wilson 1927)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def ceilings() -> dict[str, float]:
    """FP32 copy bandwidth (GB/s, read + write) and FP32 GEMM rate (GFLOP/s) of this CPU."""
    src = torch.randn(64 * 2**20 // 4)  # 64 MiB: far beyond the caches
    dst = torch.empty_like(src)
    dst.copy_(src)
    reps, start = 10, time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    copy_gbs = 2 * src.numel() * 4 * reps / (time.perf_counter() - start) / 1e9
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b
    reps, start = 10, time.perf_counter()
    for _ in range(reps):
        a @ b
    gemm = 2 * 1024**3 * reps / (time.perf_counter() - start) / 1e9
    return {"copy_GBps": copy_gbs, "gemm_GFLOPs": gemm}


def run_default(out: Path, cache: Path, extra: list[str]) -> tuple[float, int]:
    """Wall seconds and exit status of `slime-gb10 train` (defaults) into ``out`` with ``cache``."""
    env = {**os.environ, "SLIME_GB10_CACHE": str(cache)}
    cmd = [sys.executable, "-m", "slime_gb10.cli", "train", "--output", str(out), "--no-progress", *extra]
    start = time.perf_counter()
    with open(out.parent / f"{out.name}.log", "w") as log:
        rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    return time.perf_counter() - start, rc


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="a new directory for the runs and logs")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args()
    if args.out.exists():
        sys.exit(f"--out {args.out} exists; pass a new directory")
    args.out.mkdir(parents=True)
    cache = args.out / "cache"
    limits = ceilings()

    first_s, rc1 = run_default(args.out / "first", cache, [])
    cache_bytes = tree_bytes(cache)
    run_bytes = tree_bytes(args.out / "first")
    again_s, rc2 = run_default(args.out / "again", cache, [])
    peak_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    if rc1 or rc2:
        sys.exit(f"a run failed (exit {rc1}, {rc2}); see {args.out}/*.log")

    rows = [json.loads(x) for x in (args.out / "first" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/pass@1" in r]
    before, after = evals[0], evals[-1]
    n = int(after["eval/num_prompts"])
    lo_b, hi_b = wilson(round(before["eval/pass@1"] * n), n)
    lo_a, hi_a = wilson(round(after["eval/pass@1"] * n), n)
    result = {
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        **limits,
        "first_run_s": first_s,
        "warm_cache_run_s": again_s,
        "run_dir_MB": run_bytes / 1e6,
        "model_cache_MB": cache_bytes / 1e6,
        "written_first_run_MB": (run_bytes + cache_bytes) / 1e6,
        "peak_rss_GiB": peak_gib,
        "steps": len([r for r in rows if "reward_mean" in r]),
        "pass1_before": before["eval/pass@1"],
        "pass1_after": after["eval/pass@1"],
        "eval_prompts": n,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"| machine | {os.cpu_count()} cores ({torch.get_num_threads()} torch threads); "
        f"FP32 copy {limits['copy_GBps']:.1f} GB/s, FP32 GEMM {limits['gemm_GFLOPs']:.0f} GFLOP/s |"
    )
    print("|---|---|")
    print(
        f"| first run (converts the model once) | {first_s:.0f} s ({first_s / 60:.2f} min; target <= 5 min) |"
    )
    print(f"| second run (model cache warm) | {again_s:.0f} s ({again_s / 60:.2f} min) |")
    print(
        f"| written by the first run | {(run_bytes + cache_bytes) / 1e6:.0f} MB (run directory {run_bytes / 1e6:.0f} MB + "
        f"model cache {cache_bytes / 1e6:.0f} MB; target <= 1000 MB) |"
    )
    print(f"| peak resident memory | {peak_gib:.1f} GiB |")
    print(
        f"| held-out greedy pass@1 ({n} prompts) | step {before['step']}: {before['eval/pass@1']:.3f} "
        f"[{lo_b:.2f}, {hi_b:.2f}] -> step {after['step']}: {after['eval/pass@1']:.3f} [{lo_a:.2f}, {hi_a:.2f}] (Wilson 95%) |"
    )
    shutil.rmtree(cache, ignore_errors=True)  # 517 MB: the numbers are taken


if __name__ == "__main__":
    main()
