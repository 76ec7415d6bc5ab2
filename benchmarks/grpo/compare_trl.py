"""Per-step time of our trainer (``slime-gb10 bench grpo --json``) against TRL (``trl_grpo.py --out``)
on the same shapes, models, prompts, batch and lengths, measured in the same device call.

    python benchmarks/grpo/compare_trl.py OURS.json A=trl-A.json B=trl-B.json

Ours: the median over the steps after the first (graph capture, allocator warm-up). TRL: the median
``trl_grpo.py`` reports (its steps after the first two).
"""

import json
import sys
from pathlib import Path


def main() -> None:
    ours = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    by_name = {s["shape"]["name"]: s for s in ours["shapes"]}
    print(
        "| shape | batch | new tokens | ours s/step (rollout + train + sync) | TRL s/step | TRL / ours | peak GiB ours / TRL |"
    )
    print("|---|---|---|---|---|---|---|")
    for arg in sys.argv[2:]:
        name, path = arg.split("=", 1)
        try:
            trl = json.loads(Path(path).read_text(encoding="utf-8").strip().splitlines()[-1])
        except (OSError, ValueError, IndexError) as exc:
            print(f"| {name} | - | - | - | TRL result missing ({exc}) | - | - |")
            continue
        shape, s = by_name[name]["shape"], by_name[name]["summary"]
        trl_step = trl["step_time_median_s"]
        print(
            f"| {name} | {shape['prompts']}×{shape['group']} | {shape['max_new_tokens']} "
            f"| {s['step_s']:.3f} ({s['rollout_s']:.3f} + {s['train_s']:.3f} + {s['sync_s']:.3f}) "
            f"| {trl_step:.3f} | **{trl_step / s['step_s']:.1f}×** "
            f"| {s['peak_gib'] or 0:.1f} / {trl['peak_memory_gib'] or 0:.1f} |"
        )


if __name__ == "__main__":
    main()
