"""The three-arm NVFP4 rollout experiment (issue #39): per-100-step table, curves PNG and a per-step CSV.

    python benchmarks/nvfp4/arms_report.py RESULTS_DIR OUT_STEM

RESULTS_DIR holds ``arm-{A,B,C}.metrics.jsonl`` (the runs' ``metrics.jsonl``); writes ``OUT_STEM.csv``
(step, arm and the curves below) and ``OUT_STEM.png``, and prints the Markdown table of BENCHMARKS.md.
A lab script: it reads our metrics files and nothing else.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

ARMS = {"A": "A: BF16 rollouts", "B": "B: NVFP4 rollouts + TIS + MIS", "C": "C: NVFP4 rollouts + NVFP4 QAT"}
KEYS = (
    "reward_mean",
    "mismatch_k3",
    "mismatch_k1",
    "mismatch_exp_abs_median",
    "mis_masked_frac",
    "step_time_s",
)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def window(part: list[dict], key: str) -> float:
    values = [r[key] for r in part if r.get(key) is not None]
    if not values:
        return float("nan")
    return statistics.median(values) if key == "step_time_s" else statistics.fmean(values)


def main(results: Path, stem: Path) -> None:
    runs = {
        a: rows(results / f"arm-{a}.metrics.jsonl")
        for a in ARMS
        if (results / f"arm-{a}.metrics.jsonl").is_file()
    }
    with open(stem.with_suffix(".csv"), "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["arm", "step", *KEYS, "eval_pass@1"])
        for arm, run in runs.items():
            for r in run:
                out.writerow([arm, r["step"], *(r.get(k) for k in KEYS), r.get("eval/pass@1")])
    print(
        "| arm | held-out pass@1 by step | k3, steps 1-100 / ... / 401-500 | median exp\\|Δlogp\\|, 1-100 / 401-500 | MIS-masked share | s/step (median, 101-500) |"
    )
    print("|---|---|---|---|---|---|")
    for arm, run in runs.items():
        steps = [r for r in run if r.get("step", 0) > 0 and "reward_mean" in r]
        parts = [steps[i : i + 100] for i in range(0, len(steps), 100)]
        evals = " / ".join(f"{r['eval/pass@1']:.3f}" for r in run if r.get("eval/pass@1") is not None)
        k3 = " / ".join(f"{window(p, 'mismatch_k3'):.5f}" for p in parts)
        eam = f"{window(parts[0], 'mismatch_exp_abs_median'):.4f} / {window(parts[-1], 'mismatch_exp_abs_median'):.4f}"
        mis = f"{window(steps, 'mis_masked_frac'):.3f}"
        print(f"| {ARMS[arm]} | {evals} | {k3} | {eam} | {mis} | {window(steps[100:], 'step_time_s'):.3f} |")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for arm, run in runs.items():
        ev = [(r["step"], r["eval/pass@1"]) for r in run if r.get("eval/pass@1") is not None]
        axes[0].plot(*zip(*ev), marker="o", label=ARMS[arm])
        for ax, key in ((axes[1], "mismatch_k3"), (axes[2], "mismatch_exp_abs_median")):
            pts = [(r["step"], r[key]) for r in run if r.get(key) is not None]
            if pts:
                xs, ys = zip(*pts)
                smooth = [statistics.fmean(ys[max(0, i - 9) : i + 1]) for i in range(len(ys))]
                ax.plot(xs, smooth, label=ARMS[arm])
    axes[0].set(title="held-out pass@1 (500 questions, greedy)", xlabel="step")
    axes[1].set(title="KL(rollout || trainer), k3, per token (10-step mean)", xlabel="step", yscale="log")
    axes[1].axhline(0.003, color="grey", linestyle="--", linewidth=1, label="NeMo-RL gate 0.003")
    axes[2].set(title="median exp|Δlogp| (10-step mean)", xlabel="step")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=110)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
