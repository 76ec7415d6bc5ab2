"""Issue #40's table from benchmarks/sharded/run_h100.sh's work directory (argument 1): per launch,
the medians of steps 2-4 (step 1 compiles) of metrics.jsonl, rank 0's peak memory, MFU, and the
scaling efficiency against the fewest GPUs of the same shape that trained it; refused launches with
their one-line message."""

import json
import statistics
import sys
from pathlib import Path

work = Path(sys.argv[1])
jobs = [line.split("\t") for line in (work / "jobs.tsv").read_text().splitlines() if line.strip()]


def steps(name: str) -> list[dict]:
    path = work / "runs" / name / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    return [r for r in rows if r.get("step_time_s") is not None and r["step"] >= 2]


def error_line(name: str) -> str:
    lines = (work / "logs" / f"{name}.log").read_text(errors="replace").splitlines()
    errors = [x for x in lines if x.startswith("Error:") or "Error: " in x]
    return errors[0][:400] if errors else (lines[-1][:400] if lines else "no log")


# benchmarks/sharded/lib.sh's modes, as the table names them on more than one GPU
MODES = {"none": "DP", "fsdp": "FSDP", "megatron": "DP (DDP)", "megatron-zero1": "DP + distributed optimizer"}
results = []
for name, _gpus, shape, sharding, n, rc in jobs:
    rows = steps(name)
    keys = ("step_time_s", "rollout_time_s", "train_time_s", "sync_time_s", "mfu")
    values = {k: [r[k] for r in rows if r.get(k) is not None] for k in keys}
    med = {k: statistics.median(v) if v else None for k, v in values.items()}
    peak = max((r.get("peak_memory_gib", 0.0) for r in rows), default=None)
    results.append({"name": name, "shape": shape, "sharding": sharding, "gpus": int(n), "rc": int(rc),
                    "steps": len(rows), "peak": peak, **med})  # fmt: skip

print(
    "| shape | mode | GPUs | s/step | rollout s | train s | sync s | peak GiB (rank 0) | MFU | scaling efficiency |"
)
print("|---|---|---|---|---|---|---|---|---|---|")
for r in sorted(results, key=lambda r: (r["shape"], r["gpus"], r["sharding"])):
    tp = int(r["sharding"][len("megatron-tp") :]) if r["sharding"].startswith("megatron-tp") else 0
    dp = f" x DP {r['gpus'] // tp}" if tp and r["gpus"] > tp else ""
    mode = (f"TP {tp}{dp}" if tp else MODES[r["sharding"]]) if r["gpus"] > 1 else "1 GPU"
    if r["sharding"].startswith("megatron"):
        mode = "Megatron " + ("1 GPU" if r["gpus"] == 1 else mode)
    if r["rc"] != 0 and r["steps"]:  # stopped part-way: its medians are of the steps it logged
        mode += f" (exit {r['rc']} after step {r['steps'] + 1})"
    if not r["steps"]:
        print(
            f"| {r['shape']} | {mode} | {r['gpus']} | refused or failed (exit {r['rc']}): {error_line(r['name'])} |"
        )
        continue
    family = r["sharding"].startswith("megatron")  # Megatron rows scale against Megatron's own
    trained = [b for b in results if b["shape"] == r["shape"] and b["steps"] and b["rc"] == 0
               and b["sharding"].startswith("megatron") == family] or [r]  # fmt: skip
    base = min(trained, key=lambda b: (b["gpus"], b["sharding"] not in ("none", "megatron")))
    eff = base["gpus"] * base["step_time_s"] / (r["gpus"] * r["step_time_s"])
    eff_train = base["gpus"] * base["train_time_s"] / (r["gpus"] * r["train_time_s"])
    scaling = (
        "-"
        if r is base
        else f"{eff:.1%} (train {eff_train:.1%}) vs {base['gpus']} GPU{'s' * (base['gpus'] > 1)}"
    )
    mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
    print(
        f"| {r['shape']} | {mode} | {r['gpus']} | {r['step_time_s']:.2f} | {r['rollout_time_s']:.2f} | "
        f"{r['train_time_s']:.2f} | {r['sync_time_s']:.2f} | {r['peak']:.1f} | {mfu} | {scaling} |"
    )
