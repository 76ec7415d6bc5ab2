"""The table of the GSM8K run on the device: before/after on the whole test split, McNemar, the
training run's throughput, and the recipe-shape throughput."""

import json
import sys
from pathlib import Path

from slime_gb10.grpo.stats import compare_evaluations

out = Path(sys.argv[1])


def load(path):
    return json.loads(Path(path).read_text()) if Path(path).is_file() else None


def rows(path):
    p = Path(path)
    return [json.loads(x) for x in p.read_text().splitlines()] if p.is_file() else []


before, after = load(out / "before.json"), load(out / "after.json")
if before and after:
    print("| model | questions | greedy pass@1 | 95% CI | format | mean len (tokens) | truncated |")
    print("|---|---|---|---|---|---|---|")
    for name, d in (("SmolLM2-135M-Instruct", before), ("+ GRPO (run/final_model)", after)):
        m = d["metrics"]
        print(
            f"| {name} | {int(m['num_prompts'])} | {100 * m['pass@1']:.2f}% | [{100 * m['pass@1_ci_low']:.2f}, "
            f"{100 * m['pass@1_ci_high']:.2f}] | {100 * m['format_rate']:.1f}% | {m['response_len_mean']:.1f} | "
            f"{100 * m['truncated_rate']:.1f}% |"
        )
    c = compare_evaluations(before, after)
    print(
        f"\npaired on {c['questions']}: {c['pass@1_first']:.4f} -> {c['pass@1_second']:.4f} "
        f"({100 * c['difference']:+.2f} pp); only before {c['only_first_right']}, only after "
        f"{c['only_second_right']}; McNemar exact p = {c['mcnemar_p']:.3g}"
    )
for label, run in (
    ("GSM8K run (SmolLM2-135M)", out / "run"),
    ("recipe shape (Qwen2.5-0.5B arch, random)", out / "shape"),
):
    steps = [r for r in rows(run / "metrics.jsonl") if "step_time_s" in r]
    if not steps:
        continue
    tail = steps[1:] or steps  # the first step compiles and captures graphs

    def mean(key, tail=tail):  # over the steps that have it (nothing trained: train tok/s is None)
        values = [r[key] for r in tail if r.get(key) is not None]
        return sum(values) / len(values) if values else float("nan")

    print(
        f"\n{label}: {len(steps)} steps; mean over steps 2..: {mean('step_time_s'):.2f} s/step, rollout "
        f"{mean('rollout_time_s'):.2f} s, train {mean('train_time_s'):.2f} s, rollout tok/s "
        f"{mean('rollout_tokens_per_s'):.0f}, train tok/s {mean('train_tokens_per_s'):.0f}, peak "
        f"{max(r.get('peak_memory_gib', 0) for r in steps):.1f} GiB; reward first 5 "
        f"{sum(r['reward_mean'] for r in steps[:5]) / min(5, len(steps)):.3f} -> last 5 "
        f"{sum(r['reward_mean'] for r in steps[-5:]) / min(5, len(steps)):.3f}"
    )
