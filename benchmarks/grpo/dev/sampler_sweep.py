"""The sampler kernel (``engines/torch/sampling_kernel.py``) over its launch choices: tokens per block and
warps, on shape B's logits (160 rows x 49,152, BF16), µs per call (CUDA graph of 50 calls), and
whether each choice picks the same tokens as the default.

    python benchmarks/grpo/dev/sampler_sweep.py --rows 160 --vocab 49152
"""

from __future__ import annotations

import argparse

import torch

from slime_gb10.grpo.engines.torch import sampling_kernel
from slime_gb10.grpo.engines.torch.sampling import row_uniforms


def run(logits, uniforms, block: int, warps: int):
    rows, vocab = logits.shape
    tokens = torch.empty(rows, dtype=torch.long, device=logits.device)
    logprobs = torch.empty(rows, dtype=torch.float32, device=logits.device)
    chunks = max(2, 1 << (-(-vocab // block) - 1).bit_length())
    sampling_kernel._kernel()[(rows,)](
        logits,
        logits.stride(0),
        uniforms,
        tokens,
        logprobs,
        vocab,
        1.0,
        BLOCK=block,
        CHUNKS=chunks,
        num_warps=warps,
    )
    return tokens, logprobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=160)
    parser.add_argument("--vocab", type=int, default=49152)
    args = parser.parse_args()
    torch.manual_seed(0)
    logits = (torch.randn(args.rows, args.vocab, device="cuda") * 2).to(torch.bfloat16)
    uniforms = row_uniforms(torch.arange(args.rows, device="cuda"), 3)
    reference = run(logits, uniforms, sampling_kernel.BLOCK, 8)[0]
    print(f"{torch.cuda.get_device_name()}, {args.rows} x {args.vocab} BF16 logits")
    print("| tokens per block | warps | µs per call | same tokens as the default |")
    print("|---|---|---|---|")
    for block in (2048, 4096, 8192, 16384):
        for warps in (4, 8, 16):
            tokens = run(logits, uniforms, block, warps)[0]
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(50):
                    run(logits, uniforms, block, warps)
            graph.replay()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            us = start.elapsed_time(end) * 1e3 / 250
            print(f"| {block} | {warps} | {us:.1f} | {bool(torch.equal(tokens, reference))} |")


if __name__ == "__main__":
    main()
