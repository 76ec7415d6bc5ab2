"""Where a Megatron tensor-parallel training step spends its time (BENCHMARKS.md, "Megatron-core
tensor parallelism at 7B, the TP step on GPUs, a profile"): the shape C body (Qwen2.5-1.5B, SmolLM2's
vocabulary, random init), 128 GRPO samples of 46 + 256 tokens, micro-batch 16; ``update_policy``
three times, then once under ``torch.profiler``; rank 0 prints its step times, the GPU time of its
kernels (GEMMs, NCCL) and the profiler's table. From the repository root, on a CUDA host with
megatron-core::

    torchrun --standalone --nproc-per-node 1 benchmarks/sharded/profile_tp_step.py 1
    torchrun --standalone --nproc-per-node 2 benchmarks/sharded/profile_tp_step.py 2

The run in BENCHMARKS.md printed a summary line that added operators' and kernels' GPU time together
(twice the truth); its numbers are from the table's footer and rows, which this version's summary
(kernels only) repeats.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

from slime_gb10.grpo.backends.megatron.backend import MegatronPolicyBackend
from slime_gb10.grpo.batching import Sample, update_policy
from slime_gb10.grpo.config import build_config
from slime_gb10.grpo.distributed import DistContext


def samples(count: int = 128, prompt: int = 46, completion: int = 256) -> list[Sample]:
    gen = torch.Generator().manual_seed(1)
    rows = []
    for _ in range(count):
        answer = torch.randint(10, 49000, (completion,), generator=gen).tolist()
        question = torch.randint(10, 49000, (prompt,), generator=gen).tolist()
        advantage = float(torch.randn(1, generator=gen))
        rows.append(Sample(question, answer, [-10.0] * completion, advantage, 1.0, False))
    return rows


def main() -> None:
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    ctx = DistContext(rank=rank, world_size=world, local_rank=local, timeout_s=300)
    tp = int(sys.argv[1])
    cfg = build_config(
        overrides={"train.micro_batch_size": 16, "megatron.tensor_parallel_size": tp,
                   "megatron.transformer_impl": "local", "train.compile": False}
    )  # fmt: skip
    hf_config = LlamaConfig(
        hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        intermediate_size=8960, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=4096,
        initializer_range=0.02,
    )  # fmt: skip
    torch.manual_seed(0)
    policy = MegatronPolicyBackend(
        LlamaForCausalLM(hf_config), None, "cuda", train=cfg.train, megatron=cfg.megatron
    )
    mine = samples()[rank::world]  # each rank's rollouts; a TP group trains on all of its ranks'

    def step() -> float:
        torch.cuda.synchronize()
        start = time.time()
        update_policy(policy, mine, cfg, ctx, pad_token_id=0)
        torch.cuda.synchronize()
        return time.time() - start

    times = [step() for _ in range(3)]
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        wall = step()
    if rank == 0:
        table = prof.key_averages()
        kernels = [e for e in table if e.device_type == torch.autograd.DeviceType.CUDA]
        total = sum(e.self_device_time_total for e in kernels) / 1e6
        nccl = sum(e.self_device_time_total for e in kernels if e.key.startswith("nccl")) / 1e6
        print(f"TP {tp} on {world} GPU(s): steps {[round(t, 3) for t in times]} s; profiled step {wall:.3f} s; "
              f"GPU kernel time {total:.3f} s, of it NCCL {nccl:.3f} s", flush=True)  # fmt: skip
        print(table.table(sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=60), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
