"""Where a rollout's time goes: torch.profiler over one generate() of a ``bench grpo`` shape's
random-init model (written by ``slime-gb10 bench grpo --work-dir``), top CUDA kernels and the
share of the wall time the GPU was busy.

    python benchmarks/grpo/profile_rollout.py WORK_DIR/model-B --prompts 160 --new-tokens 512
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from slime_gb10.grpo.engines.torch.engine import TorchRolloutEngine
from slime_gb10.grpo.interfaces import SamplingParams
from slime_gb10.grpo.models import eos_token_ids, load_causal_lm, load_tokenizer


def gpu_busy_s(prof) -> float:
    """Seconds of GPU kernel time in a profile: the device-side events only (the ``aten::`` rows of
    ``key_averages`` carry their kernels' time too, so summing those counts it twice)."""
    return sum(e.device_time_total for e in prof.events() if e.device_type == DeviceType.CUDA) / 1e6


def rollout_setup(description: str):
    """The command line of the rollout scripts (a model directory, prompts x prompt tokens, new
    tokens): ``(args, tokenizer, prompts, params)``, the prompts random token ids (seed 0)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("model")
    parser.add_argument("--prompts", type=int, default=160)
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--new-tokens", type=int, default=512)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(100, 40000, (args.prompts, args.prompt_tokens), generator=g).tolist()
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=0)
    return args, load_tokenizer(args.model), prompts, params


def new_engine(model_dir: str, tokenizer) -> TorchRolloutEngine:
    model = load_causal_lm(model_dir, dtype=torch.bfloat16).cuda()
    return TorchRolloutEngine(model, tokenizer, "cuda", eos_token_ids=eos_token_ids(tokenizer, model))


def timed_generate(engine: TorchRolloutEngine, prompts, params) -> tuple[list, float]:
    """The generations and wall seconds of a rollout after a first one (compile, capture, warm-up)."""
    engine.generate(prompts, params)
    torch.cuda.synchronize()
    start = time.perf_counter()
    gens = engine.generate(prompts, params)
    torch.cuda.synchronize()
    return gens, time.perf_counter() - start


def phase_times(engine: TorchRolloutEngine, prompts, params) -> dict[str, float]:
    """Wall seconds of one generate() by phase: before the decode loop (padding, prefill launches),
    the loop until the GPU is done, and ``_finish`` (lengths, lists, detokenising)."""
    marks: dict[str, float] = {}
    loop, finish = engine._decode_loop, engine._finish

    def timed_loop(*args, **kwargs):
        marks["loop"] = time.perf_counter()
        out = loop(*args, **kwargs)
        torch.cuda.synchronize()
        marks["loop_end"] = time.perf_counter()
        return out

    def timed_finish(*args, **kwargs):
        marks["finish"] = time.perf_counter()
        out = finish(*args, **kwargs)
        marks["finish_end"] = time.perf_counter()
        return out

    engine._decode_loop, engine._finish = timed_loop, timed_finish
    try:
        torch.cuda.synchronize()
        start = time.perf_counter()
        engine.generate(prompts, params)
        end = time.perf_counter()
    finally:
        del engine._decode_loop, engine._finish
    return {
        "before loop": marks["loop"] - start,
        "loop": marks["loop_end"] - marks["loop"],
        "finish": marks["finish_end"] - marks["finish"],
        "total": end - start,
    }


def main() -> None:
    args, tokenizer, prompts, params = rollout_setup(__doc__.splitlines()[0])
    engine = new_engine(args.model, tokenizer)
    _, wall = timed_generate(engine, prompts, params)
    phases = phase_times(engine, prompts, params)
    print("phases (s): " + ", ".join(f"{k} {v:.4f}" for k, v in phases.items()))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.generate(prompts, params)
        torch.cuda.synchronize()
    events = prof.key_averages()
    cuda_total = gpu_busy_s(prof)
    print(
        f"decode={engine.decode}; wall {wall:.3f} s unprofiled; GPU busy {cuda_total:.3f} s in the profiled run"
    )
    print(events.table(sort_by="self_device_time_total", row_limit=30, max_name_column_width=60))


if __name__ == "__main__":
    main()
