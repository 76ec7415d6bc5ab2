"""Time-to-accuracy of our trainer and TRL's from the files ``benchmarks/rg/tta.sh`` collects: a
markdown table, and both learning curves (held-out pass@1 and mean reward against training
wall-clock seconds) in one PNG.

    python benchmarks/rg/tta_report.py OUT [--plot OUT/tta.png]

The clock of each trainer is the sum of its step times (rollout, reward, update, weight sync),
without model loading, evaluation or checkpoint writes: ``step_time_s`` of our ``metrics.jsonl``,
TRL's synchronized ``on_step_begin`` -> ``on_step_end`` times (``trl_tta.py``). Our held-out
points are the in-loop evaluations every ``eval.every`` steps; TRL's are ``slime-gb10 eval`` of its
checkpoints (the same evaluator: ``OUT/<arm>-final-eval.json`` scores our final model that way, and
the table shows both readings of it). The threshold is fixed by a rule written before the runs:
halfway from the base model's pass@1 to the final pass@1 of ``ours`` (the like-for-like arm).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ARMS = {
    "ours": "ours (zero-variance groups trained, as TRL)",
    "ours-default": "ours (default: they are skipped)",
}


def our_curve(path: Path) -> dict:
    """Clock after each step, mean reward per step and the held-out (clock, pass@1) points."""
    clock, total, rewards, evals = [], 0.0, [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row.get("step_time_s") is not None:
            total += row["step_time_s"]
            clock.append(total)
            rewards.append(row.get("reward_mean"))
        if row.get("eval/pass@1") is not None:
            evals.append((row["step"], total if row["step"] else 0.0, row["eval/pass@1"]))
    return {"clock": clock, "rewards": rewards, "evals": evals}


def trl_curve(directory: Path) -> dict:
    clock = json.loads((directory / "clock.json").read_text(encoding="utf-8"))
    evals = []
    for row in clock["rows"]:
        result = directory / f"{row['dir']}.eval.json"
        if result.is_file():
            evals.append((row["step"], row["clock_s"], json.loads(result.read_text())["metrics"]["pass@1"]))
    # clock.json before TRL finished holds only the checkpoint rows
    clock_s = clock.get("clock_s") or [row["clock_s"] for row in clock["rows"]]
    rewards = clock.get("rewards") or [None] * len(clock_s)
    return {"clock": clock_s, "rewards": rewards, "evals": evals, "version": clock["trl"]}


def time_to(evals: list[tuple[int, float, float]], threshold: float) -> tuple[int, float] | None:
    """(step, clock) of the first held-out point after training began at or above ``threshold``."""
    for step, clock, value in evals:
        if step > 0 and value >= threshold:
            return step, clock
    return None


def accuracy_at(evals: list[tuple[int, float, float]], seconds: float) -> float | None:
    """The last held-out reading taken by ``seconds`` of training (None: none yet)."""
    seen = [value for _, clock, value in evals if clock <= seconds]
    return seen[-1] if seen else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--plot", type=Path, default=None, help="PNG path (default OUT/tta.png)")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--title", default="", help="the plot's title (the task, the device)")
    args = parser.parse_args()
    curves = {
        arm: our_curve(args.out / f"{arm}.metrics.jsonl")
        for arm in ARMS
        if (args.out / f"{arm}.metrics.jsonl").is_file()
    }
    if "ours" not in curves:
        sys.exit(f"{args.out}/ours.metrics.jsonl is missing: run benchmarks/rg/tta.sh first")
    trl = trl_curve(args.out / "trl")
    base = curves["ours"]["evals"][0][2]
    final = curves["ours"]["evals"][-1][2]
    threshold = base + (final - base) / 2
    print(
        f"base pass@1 {base:.3f}; ours' final {final:.3f}; threshold (halfway, fixed before the runs) {threshold:.3f}"
    )
    if final <= base:
        print("ours did not improve on the base model: no threshold, no time-to-accuracy")
    ours_hit = time_to(curves["ours"]["evals"], threshold) if final > base else None
    print()
    print(
        "| trainer | steps run | training clock (s) | s/step | final held-out pass@1 | best | steps to threshold | seconds to threshold |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rows = [(ARMS[arm], c) for arm, c in curves.items()] + [(f"TRL {trl['version']} GRPOTrainer", trl)]
    rows = [(name, c) for name, c in rows if c["evals"]]  # a trainer with no held-out point has no row
    for name, c in rows:
        hit = time_to(c["evals"], threshold) if final > base else None
        steps = len(c["clock"])
        total = c["clock"][-1] if c["clock"] else 0.0
        print(
            f"| {name} | {steps} | {total:.0f} | {total / max(steps, 1):.2f} | {c['evals'][-1][2]:.3f} "
            f"| {max(v for _, _, v in c['evals']):.3f} | {hit[0] if hit else 'not reached'} "
            f"| {f'{hit[1]:.1f}' if hit else 'not reached'} |"
        )
    print()
    trl_hit = time_to(trl["evals"], threshold) if final > base and trl["evals"] else None
    if ours_hit and trl_hit:
        print(
            f"time to {threshold:.3f}: ours {ours_hit[1]:.1f} s, TRL {trl_hit[1]:.1f} s: TRL / ours = {trl_hit[1] / ours_hit[1]:.1f}x"
        )
    elif ours_hit and trl["clock"]:
        at_equal = accuracy_at(trl["evals"], ours_hit[1])
        at_10x = accuracy_at(trl["evals"], 10 * ours_hit[1])
        print(
            f"time to {threshold:.3f}: ours {ours_hit[1]:.1f} s; TRL did not reach it in {trl['clock'][-1]:.0f} s "
            f"(> {trl['clock'][-1] / ours_hit[1]:.1f}x ours); TRL's pass@1 at ours' {ours_hit[1]:.0f} s: "
            f"{at_equal if at_equal is not None else '-'}, at 10x that: {at_10x if at_10x is not None else 'not run that long'}"
        )
    for arm in curves:
        check = args.out / f"{arm}-final-eval.json"
        if check.is_file():
            value = json.loads(check.read_text())["metrics"]["pass@1"]
            print(
                f"evaluator check, {arm}: in-loop final {curves[arm]['evals'][-1][2]:.3f}, slime-gb10 eval of final_model {value:.3f}"
            )
    if args.no_plot:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, c in rows:
        points = c["evals"] if c["evals"][0][0] == 0 else [(0, 0.0, base), *c["evals"]]  # TRL: base at 0 s
        xs, ys = [clock for _, clock, _ in points], [value for _, _, value in points]
        left.plot(xs, ys, marker="o", markersize=3, label=name)
        pairs = [(x, r) for x, r in zip(c["clock"], c["rewards"]) if r is not None]
        right.plot([x for x, _ in pairs], [r for _, r in pairs], linewidth=1, label=name)
    left.axhline(threshold, color="grey", linestyle="--", linewidth=1, label=f"threshold {threshold:.3f}")
    left.set(xlabel="training wall-clock (s)", ylabel="held-out pass@1 (greedy, 500 questions)")
    right.set(xlabel="training wall-clock (s)", ylabel="mean reward of the step's rollouts")
    left.set_xlim(left=0)
    right.set_xlim(left=0)
    if args.title:
        fig.suptitle(args.title, fontsize=10)
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.tight_layout()
    path = args.plot or args.out / "tta.png"
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
