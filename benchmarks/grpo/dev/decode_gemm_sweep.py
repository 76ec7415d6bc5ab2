"""The decode step's projections (M = batch rows) through cuBLAS as one GEMM or split over K.

A decode step of shape B multiplies 160 rows by each layer's weights; cuBLAS's tiles leave most
SMs idle where the output is narrow (the o and down projections: 896 columns) and each of them walks
the whole K. Split-K by hand: ``torch.bmm`` over ``s`` slices of K with FP32 outputs, summed after
(inside the compiled step the sum would join the residual add). Every variant runs on 24 copies of
the weights (one per layer, so they come from DRAM as in a real step, not from L2), captured in
one CUDA graph of 24 calls; µs per call, and GB/s of weight bytes. "swapped": one GEMM with the
weight as cuBLAS's long side, ``(w @ x^T)^T``.

    python benchmarks/grpo/dev/decode_gemm_sweep.py --rows 160
"""

from __future__ import annotations

import argparse

import torch

SHAPES_B = {  # name: (K, N, bias) of shape B (Qwen2.5-0.5B body)
    "qkv": (896, 1152, True),
    "o": (896, 896, False),
    "gate/up": (896, 9728, False),
    "down": (4864, 896, False),
    "lm_head": (896, 49152, False),
}


def linear(x, w, b, splits):
    if splits == 1:
        return torch.nn.functional.linear(x, w, b)
    rows, k = x.shape
    n = w.shape[0]
    parts = torch.bmm(
        x.view(rows, splits, k // splits).transpose(0, 1),
        w.t().view(splits, k // splits, n),
        out_dtype=torch.float32,
    )
    out = parts.sum(0)
    return (out if b is None else out + b).to(x.dtype)


def swapped(x, w, b, splits):
    """The same product with the weight as cuBLAS's M side: ``(w @ x^T)^T`` (other tiles)."""
    out = torch.mm(w, x.t()).t()
    return out if b is None else out + b


def bmm_only(x, w, b, splits):
    rows, k = x.shape
    return torch.bmm(
        x.view(rows, splits, k // splits).transpose(0, 1),
        w.t().view(splits, k // splits, w.shape[0]),
        out_dtype=torch.float32,
    )


def time_graph(fn, weights, x, biases, splits, replays=20) -> float:
    """µs per call: the 24 calls captured in one graph, replayed ``replays`` times."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for w, b in zip(weights, biases):
            fn(x, w, b, splits)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w, b in zip(weights, biases):
            fn(x, w, b, splits)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * len(weights))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=160)
    parser.add_argument("--layers", type=int, default=24)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, {args.rows} rows, {args.layers} weight copies per GEMM")
    print("| GEMM | K x N | splits | µs per call | GB/s | bmm alone µs | max abs diff vs FP32 |")
    print("|---|---|---|---|---|---|---|")
    for name, (k, n, has_bias) in SHAPES_B.items():
        weights = [
            torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(args.layers)
        ]
        biases = [torch.randn(n, device="cuda", dtype=torch.bfloat16) if has_bias else None for _ in weights]
        x = torch.randn(args.rows, k, device="cuda", dtype=torch.bfloat16)
        exact = torch.nn.functional.linear(
            x.double(), weights[0].double(), None if biases[0] is None else biases[0].double()
        )
        for splits in (1, 2, 4, 8) if name != "lm_head" else (1,):
            if k % splits:
                continue
            us = time_graph(linear, weights, x, biases, splits)
            alone = time_graph(bmm_only, weights, x, biases, splits) if splits > 1 else float("nan")
            diff = float((linear(x, weights[0], biases[0], splits).double() - exact).abs().max())
            print(
                f"| {name} | {k} x {n} | {splits} | {us:.2f} | {2 * k * n / us / 1e3:.0f} | {alone:.2f} | {diff:.3g} |"
            )
        if not has_bias:
            us = time_graph(swapped, weights, x, biases, 1)
            print(f"| {name} | {k} x {n} | swapped | {us:.2f} | {2 * k * n / us / 1e3:.0f} | - | - |")
        del weights


if __name__ == "__main__":
    main()
