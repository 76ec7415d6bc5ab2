"""Where a training step's time goes: torch.profiler over one ``TorchPolicyBackend.train_step`` of a
``bench grpo`` shape's random-init model (written by ``slime-gb10 bench grpo --work-dir``) on a
fixed batch (``--sequences`` rows of a ``--prompt-tokens`` prompt and ``--new-tokens`` completion),
with the plain and/or the compiled decoder layers (and with compiled layers, the chunked LM head's
arithmetic compiled and/or eager): step time, MFU against 6·N·tokens, top kernels.

    python benchmarks/grpo/profile_train.py WORK_DIR/model-B --sequences 160 --micro-batch 64 --compile both
"""

from __future__ import annotations

import argparse
import time

import torch
from profile_rollout import gpu_busy_s  # the sibling script (benchmarks/grpo/ is sys.path[0])
from torch.profiler import ProfilerActivity, profile

from slime_gb10.grpo import algo
from slime_gb10.grpo.backends import torch_backend
from slime_gb10.grpo.backends.torch_backend import TorchPolicyBackend
from slime_gb10.grpo.batching import Sample, collate, split_microbatches
from slime_gb10.grpo.config import AlgoConfig, TrainConfig
from slime_gb10.grpo.models import load_causal_lm, load_tokenizer


def microbatches(tokenizer, args) -> list:
    gen = torch.Generator().manual_seed(0)
    samples = []
    for i in range(args.sequences):
        prompt_len = args.prompt_tokens + i % 17  # a little ragged, like real prompts
        ids = torch.randint(100, 40000, (prompt_len + args.new_tokens,), generator=gen).tolist()
        samples.append(
            Sample(
                ids[:prompt_len],
                ids[prompt_len:],
                [-1.0] * args.new_tokens,
                advantage=float(i % 3) - 1.0,
                reward=0.0,
                truncated=False,
            )
        )
    count = float(sum(len(s.completion_ids) for s in samples))
    out = []
    for part in split_microbatches(samples, args.micro_batch):
        batch, extras = collate(part, tokenizer.pad_token_id)
        extras["global_count"] = count
        out.append((batch, extras))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--sequences", type=int, default=160)
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--compile", choices=["off", "on", "both"], default="both")
    parser.add_argument("--rows", type=int, default=14, help="kernels shown per profile")
    parser.add_argument(
        "--head",
        choices=["compiled", "eager", "both"],
        default="compiled",
        help="the chunked LM head's arithmetic with compiled layers: compiled (the default), eager, or each",
    )
    parser.add_argument(
        "--head-chunks",
        default=None,
        help="comma-separated vocabulary chunks of the compiled head to compare",
    )
    parser.add_argument("--sort", choices=["gpu", "cpu"], default="gpu", help="the kernel table's order")
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.model)
    micro = microbatches(tokenizer, args)
    tokens = sum(int(b.attention_mask.sum()) for b, _ in micro)
    loss_fn = algo.GRPOLoss.from_config(AlgoConfig(), args.new_tokens)
    peak = torch.cuda.get_device_properties(0)
    layers = {"off": [None], "on": ["inductor"], "both": [None, "inductor"]}[args.compile]
    heads = {"compiled": [True], "eager": [False], "both": [False, True]}[args.head]
    chunks = [int(c) for c in args.head_chunks.split(",")] if args.head_chunks else [None]
    variants = [
        (name, head, chunk)
        for name in layers
        for head in (heads if name else [False])
        for chunk in (chunks if name and head else [None])
    ]
    summary = []
    for backend_name, head_compiled, chunk in variants:
        if chunk is not None:
            torch_backend.COMPILED_HEAD_CHUNK = chunk
        torch._dynamo.reset()
        model = load_causal_lm(args.model, dtype=torch.float32)
        backend = TorchPolicyBackend(
            model, tokenizer, "cuda", train=TrainConfig(lr=1e-6), autocast_dtype=torch.bfloat16,
            compile_backend=backend_name,
        )  # fmt: skip
        if not head_compiled:
            backend._head_backend = lambda: None
        start = time.perf_counter()
        backend.train_step(micro, loss_fn)  # compile + autotune + allocator warm-up
        torch.cuda.synchronize()
        first = time.perf_counter() - start
        times = []
        for _ in range(3):
            start = time.perf_counter()
            backend.train_step(micro, loss_fn)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            backend.train_step(micro, loss_fn)
            torch.cuda.synchronize()
        events = prof.key_averages()
        busy = gpu_busy_s(prof)
        step = sorted(times)[1]
        tflops = 6 * backend.num_parameters * tokens / step / 1e12
        label = f"compiled ({backend_name})" if backend.compiled else "plain"
        label += (
            f", LM head compiled ({torch_backend.COMPILED_HEAD_CHUNK})"
            if head_compiled and backend.compiled
            else ", LM head eager"
        )
        print(f"== {label}: first step {first:.1f} s, median {step:.3f} s, GPU busy {busy:.3f} s, "
              f"6N {tflops:.0f} TFLOP/s, peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")  # fmt: skip
        sort = "self_device_time_total" if args.sort == "gpu" else "self_cpu_time_total"
        print(events.table(sort_by=sort, row_limit=args.rows, max_name_column_width=70))
        summary.append((label, step, tflops, first))
        del backend, model
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    print(f"{peak.name}, {tokens} tokens in {len(micro)} microbatches")
    print("| layers | s/step | 6N TFLOP/s | first step s |")
    print("|---|---|---|---|")
    for label, step, tflops, first in summary:
        print(f"| {label} | {step:.3f} | {tflops:.0f} | {first:.1f} |")


if __name__ == "__main__":
    main()
