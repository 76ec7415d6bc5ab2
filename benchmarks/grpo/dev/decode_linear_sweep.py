"""The decode-projection kernels (``engines/decode_linear.py``) over their launch choices against
cuBLAS (``F.linear``) on the projections of a decode step of shapes A, B and C: q/k/v (with Qwen2's
bias), o, gate/up with the SwiGLU epilogue, down, the LM head, at the shape's decode batch.

Timed with ``triton.testing.do_bench``, which overwrites the L2 cache before every call: in a decode
step each layer's weights come from memory. The split kernels' time is the kernel's alone (in the
engine inductor adds the partial sums inside the residual add that follows). cuBLAS's gate/up is the
GEMM alone (the engine adds a fused SiLU-and-mul kernel after it). Picks the one launch choice with
the least time per decode step of shape B (24 layers of the four projections plus the LM head) and
writes it to ``--json`` (``rollout_variants.py --linear-config`` takes it).

    python benchmarks/grpo/dev/decode_linear_sweep.py [--json best.json]
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import triton.testing

from slime_gb10.grpo.bench import SHAPES
from slime_gb10.grpo.engines import decode_linear

CHOICES = list(
    itertools.product((64, 128), (16, 32, 64), (64, 128, 256), (3, 4))
)  # block_n, block_t, block_k, stages


def projections(shape) -> dict[str, tuple[int, int, bool, bool]]:
    """name -> (features, depth, bias, swiglu) of one decode step's projections."""
    qkv = (shape.heads + 2 * shape.kv_heads) * shape.head_dim
    return {
        "qkv": (qkv, shape.hidden, shape.model_type == "qwen2", False),
        "o": (shape.hidden, shape.hidden, False, False),
        "gate_up+silu": (shape.mlp, shape.hidden, False, True),
        "down": (shape.hidden, shape.mlp, False, False),
        "lm_head": (shape.vocab, shape.hidden, False, False),
    }


def per_step(times: dict[str, float], layers: int) -> float:
    return layers * sum(t for name, t in times.items() if name != "lm_head") + times["lm_head"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="A,B,C")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    bench = lambda fn: triton.testing.do_bench(fn, warmup=10, rep=30)  # noqa: E731
    gen = torch.Generator(device="cuda").manual_seed(0)
    results = {}  # shape -> name -> {"cublas": us, choice: us}
    for shape_name in args.shapes.split(","):
        shape = SHAPES[shape_name]
        tokens = shape.prompts * shape.group
        results[shape_name] = {}
        for name, (features, depth, bias, swiglu) in projections(shape).items():
            rows = (2 if swiglu else 1) * features
            x = torch.randn(tokens, depth, device="cuda", dtype=torch.bfloat16, generator=gen)
            w = torch.randn(rows, depth, device="cuda", dtype=torch.bfloat16, generator=gen) / depth**0.5
            b = torch.randn(features, device="cuda", dtype=torch.bfloat16, generator=gen) if bias else None
            want = decode_linear.reference_swiglu(x, w) if swiglu else decode_linear.reference_linear(x, w, b)
            row = {
                "bytes": w.numel() * 2,
                "cublas": 1e3 * bench(lambda x=x, w=w, b=b: torch.nn.functional.linear(x, w, b)),
            }
            for choice in CHOICES:
                block_n, block_t, block_k, stages = choice
                decode_linear.BLOCK_N, decode_linear.BLOCK_T, decode_linear.BLOCK_K = (
                    block_n,
                    block_t,
                    block_k,
                )
                decode_linear.NUM_STAGES = stages
                auto = 1 if swiglu else decode_linear.splits_for(tokens, features, depth, x.device)
                for factor in (1, 2) if not swiglu else (1,):
                    splits = auto * factor
                    try:

                        def run(x=x, w=w, b=b, s=splits, g=swiglu):
                            return decode_linear.launch(x, w, b, splits=s, swiglu=g)

                        out = run()
                        got = out.sum(0).to(want.dtype) if splits > 1 else out
                        error = float((got.float() - want.float()).norm() / want.float().norm())
                        if not error < 1e-2:
                            raise RuntimeError(f"relative error {error:.3g}")
                        row[f"{choice}x{factor}"] = 1e3 * bench(run)
                    except Exception as exc:  # shared memory etc.: skipped
                        print(
                            f"{shape_name} {name} {choice} splits {splits}: {type(exc).__name__} {str(exc)[:60]}"
                        )
            results[shape_name][name] = row
    best_choice, best_step = None, float("inf")
    for choice in CHOICES:
        key = f"{choice}x1"
        shape_b = results.get("B", next(iter(results.values())))
        layers = SHAPES["B" if "B" in results else next(iter(results))].layers
        if all(key in row for row in shape_b.values()):
            step = per_step({n: row[key] for n, row in shape_b.items()}, layers)
            if step < best_step:
                best_choice, best_step = choice, step
    best_key = f"{best_choice}x1"
    print(f"{torch.cuda.get_device_name()}; chosen (block_n, block_t, block_k, stages) = {best_choice}")
    print(
        "| shape | projection | MB | cuBLAS us (TB/s) | chosen us (TB/s) | best us (TB/s), choice x split factor |"
    )
    print("|---|---|---|---|---|---|")
    for shape_name, rows in results.items():
        for name, row in rows.items():
            mb = row["bytes"] / 1e6
            timed = {k: v for k, v in row.items() if k not in ("bytes", "cublas")}
            best = min(timed, key=timed.get)
            rate = lambda us, mb=mb: f"{us:.1f} ({mb / us:.2f})"  # noqa: E731  MB/us = TB/s
            chosen = rate(row[best_key]) if best_key in row else "-"
            print(
                f"| {shape_name} | {name} | {mb:.1f} | {rate(row['cublas'])} | {chosen} | {rate(timed[best])}, {best} |"
            )
        layers = SHAPES[shape_name].layers
        cublas = per_step({n: r["cublas"] for n, r in rows.items()}, layers)
        chosen = per_step({n: r.get(best_key, float("nan")) for n, r in rows.items()}, layers)
        print(f"| {shape_name} | per decode step | | {cublas:.0f} | {chosen:.0f} | |")
    if args.json:
        block_n, block_t, block_k, stages = best_choice
        with open(args.json, "w") as f:
            json.dump({"BLOCK_N": block_n, "BLOCK_T": block_t, "BLOCK_K": block_k, "NUM_STAGES": stages}, f)


if __name__ == "__main__":
    main()
