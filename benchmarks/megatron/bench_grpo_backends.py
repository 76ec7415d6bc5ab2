"""GRPO steps through the Megatron-core backend next to the PyTorch backend, same run, same GPU.

Both runs use the real trainer (``slime_gb10.grpo.trainer.GRPOTrainer``) with the PyTorch
rollout engine; only ``backends.trainer`` differs. Two parts:

1. learning: a random-init 2-layer Llama with SmolLM2's tokenizer (the trainer's CPU end-to-end
   setup) rewarded for a first token containing "e" (about half of the vocabulary). A random
   model cannot do arithmetic; this reward is learnable in ~10 steps if the gradient, the
   advantages and the weight sync are right. Reported: mean reward of the first and last 3 steps.
2. speed: SmolLM2-135M's architecture (30 layers, hidden 576, 9/3 heads, vocab 49,152; random
   init: its weights do not fit the 64 MiB the device accepts) on the arithmetic prompts, rewarded
   for an "e" in the first 4 characters (~50/50 on random text, so every step trains),
   16 prompts x 8 samples x up to 64 new tokens per step. Reported: mean over the steps after the
   first (warm-up) of step time, train time, train tokens/s and the achieved train TFLOP/s
   (6 N per trained token) over the BF16 GEMM rate measured in the same run.

Usage (device): python benchmarks/megatron/bench_grpo_backends.py --tokenizer DIR --out $OUT
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import torch


def measure_ceilings() -> dict[str, float]:
    """BF16 GEMM rate (8192^3) and device-to-device copy bandwidth (1 GiB, read + write)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    src = torch.randn(2**28, device="cuda")  # 1 GiB of fp32
    dst = torch.empty_like(src)

    def timed(fn, reps):
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(reps):
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)

    gemm_s = timed(lambda: a @ b, 10)
    copy_s = timed(lambda: dst.copy_(src), 10)
    return {"bf16_gemm_tflops": 2 * 8192**3 / gemm_s / 1e12, "copy_gbps": 2 * src.numel() * 4 / copy_s / 1e9}


def contains_e(completion: str, ground_truth: str) -> float:
    return float("e" in completion)


def e_in_first_4_chars(completion: str, ground_truth: str) -> float:
    # Random-init weights score 0 on arithmetic, so every group would have zero variance and
    # nothing would train; this reward is ~50/50 on random text, so every step trains.
    return float("e" in completion[:4])


def run_trainer(overrides: dict) -> tuple[list[dict], dict]:
    from slime_gb10.grpo.config import build_config
    from slime_gb10.grpo.trainer import GRPOTrainer

    trainer = GRPOTrainer(build_config(overrides=overrides))
    try:
        t0 = time.perf_counter()
        trainer.setup()
        setup_s = time.perf_counter() - t0
        history = trainer.train()
        info = {
            "setup_s": setup_s,
            "backend": type(trainer.backend).__name__,
            "num_parameters": getattr(trainer.backend, "num_parameters", None),
            "layer_spec": getattr(trainer.backend, "flavor", "-"),
        }
        return history, info
    finally:
        trainer.close()
        del trainer
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def summarize(history: list[dict], n_params: int, ceilings: dict) -> dict:
    warm = history[1:] if len(history) > 1 else history
    mean = lambda key: statistics.fmean(r[key] for r in warm)  # noqa: E731
    rewards = [r["reward_mean"] for r in history]
    k = min(3, len(rewards))
    out = {
        "steps": len(history),
        "reward_first": statistics.fmean(rewards[:k]),
        "reward_last": statistics.fmean(rewards[-k:]),
        "rewards": [round(r, 3) for r in rewards],
        "step_time_s": mean("step_time_s"),
        "rollout_time_s": mean("rollout_time_s"),
        "train_time_s": mean("train_time_s"),
        "sync_time_s": mean("sync_time_s"),
        "train_tokens_per_s": mean("train_tokens_per_s"),
        "rollout_tokens_per_s": mean("rollout_tokens_per_s"),
        "peak_memory_gib": max(r.get("peak_memory_gib", float("nan")) for r in history),
    }
    out["train_tflops"] = 6 * n_params * out["train_tokens_per_s"] / 1e12
    out["train_vs_gemm"] = out["train_tflops"] / ceilings["bf16_gemm_tflops"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", required=True, help="directory with SmolLM2's tokenizer files")
    parser.add_argument("--out", required=True)
    parser.add_argument("--learn-steps", type=int, default=12)
    parser.add_argument("--speed-steps", type=int, default=4)
    parser.add_argument("--backends", default="torch,megatron")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script (torch backend only)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from slime_gb10.grpo import rewards
    from slime_gb10.grpo.models import load_tokenizer, write_random_model

    rewards.REWARDS["contains_e"] = contains_e
    rewards.REWARDS["e_in_first_4_chars"] = e_in_first_4_chars
    tokenizer = load_tokenizer(args.tokenizer)
    work = Path("/tmp/bench_megatron")
    tiny = write_random_model(work / "tiny", tokenizer, seed=0, initializer_range=0.3)
    smollm2_arch = write_random_model(
        work / "smollm2-arch",
        tokenizer,
        hidden_size=576,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        intermediate_size=1536,
        initializer_range=0.02,
        seed=0,
    )
    cuda = args.device == "cuda"
    ceilings = measure_ceilings() if cuda else {"bf16_gemm_tflops": float("nan"), "copy_gbps": float("nan")}
    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"device {device_name}: {ceilings}", flush=True)
    common = {
        "backends.rollout": "torch",
        "backends.device": args.device,
        "eval.every": 0,
        "output.checkpoint_every": 0,
        "output.progress": False,
        "output.save_final_model": False,
    }
    results = {"ceilings": ceilings, "runs": {}}
    for trainer_name in args.backends.split(","):
        for part, model_dir, extra in (
            (
                "learn",
                tiny,
                {
                    "data.reward": "contains_e",
                    "data.eval_size": 0,
                    "rollout.prompts_per_step": 8,
                    "rollout.group_size": 8,
                    "rollout.max_new_tokens": 1,
                    "train.lr": 1e-2,
                    "train.steps": args.learn_steps,
                },
            ),
            (
                "speed",
                smollm2_arch,
                {
                    "data.reward": "e_in_first_4_chars",
                    "data.eval_size": 0,
                    "rollout.prompts_per_step": 16,
                    "rollout.group_size": 8,
                    "rollout.max_new_tokens": 64,
                    "train.lr": 1e-5,
                    "train.steps": args.speed_steps,
                },
            ),
        ):
            key = f"{part}/{trainer_name}"
            overrides = {
                **common,
                **extra,
                "model.name_or_path": str(model_dir),
                "backends.trainer": trainer_name,
                "output.dir": str(work / "runs" / part / trainer_name),
            }
            t0 = time.perf_counter()
            try:
                history, info = run_trainer(overrides)
            except Exception as exc:  # keep going: one failing backend must not hide the other's numbers
                import traceback

                traceback.print_exc()
                results["runs"][key] = {"error": f"{exc.__class__.__name__}: {exc}"}
                continue
            summary = summarize(history, info["num_parameters"] or 0, ceilings) | info
            summary["wall_s"] = time.perf_counter() - t0
            results["runs"][key] = summary
            (out / f"history_{part}_{trainer_name}.json").write_text(json.dumps(history, indent=1))
            print(key, json.dumps({k: v for k, v in summary.items() if k != "rewards"}), flush=True)
            print(key, "rewards", summary["rewards"], flush=True)
    (out / "bench_grpo_backends.json").write_text(json.dumps(results, indent=1))

    print(
        f"\n{device_name}: BF16 GEMM {ceilings['bf16_gemm_tflops']:.0f} TFLOP/s, "
        f"copy {ceilings['copy_gbps']:.0f} GB/s"
    )
    print(
        "| part | trainer | spec | steps | reward first3 -> last3 | step s | train s | sync s | "
        "train tok/s | train TFLOP/s (vs GEMM) | peak GiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for key, r in results["runs"].items():
        part, name = key.split("/")
        if "error" in r:
            print(f"| {part} | {name} | - | - | ERROR: {r['error'][:80]} | | | | | | |")
            continue
        print(
            f"| {part} | {name} | {r['layer_spec']} | {r['steps']} | {r['reward_first']:.3f} -> {r['reward_last']:.3f} | "
            f"{r['step_time_s']:.2f} | {r['train_time_s']:.2f} | {r['sync_time_s']:.3f} | "
            f"{r['train_tokens_per_s']:,.0f} | {r['train_tflops']:.1f} ({100 * r['train_vs_gemm']:.1f}%) | "
            f"{r['peak_memory_gib']:.1f} |"
        )
    return 0 if all("error" not in r for r in results["runs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
