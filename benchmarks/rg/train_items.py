"""Write N TRAINING items of a reasoning-gym spec as a generic-layout JSONL (prompt, ground_truth), for
choosing tasks by the base model's pass@k on training items, never on the held-out set:
    python benchmarks/rg/train_items.py rg:gcd 64 --seed 0 > gcd-train.jsonl
The items are those a run with the same seed trains on first (rg_tasks.load_splits)."""

from __future__ import annotations

import argparse
import json
import sys

from slime_gb10.grpo import rg_tasks

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("spec")
parser.add_argument("n", type=int)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--eval-size", type=int, default=500)
args = parser.parse_args()
# A task with a small question space loses many generated items to the held-out pool (round 3's
# selection had 22-59 items of 64 for six tasks): generate more until N are kept. reasoning-gym
# draws item i from the seed and i alone, so a larger size extends the same sequence.
size = max(args.n, 1)
while True:
    train, _ = rg_tasks.load_splits(args.spec, eval_size=args.eval_size, seed=args.seed, train_size=size)
    if len(train) >= args.n or size >= rg_tasks.DEFAULT_TRAIN_SIZE:
        break
    size = min(size * 4, rg_tasks.DEFAULT_TRAIN_SIZE)
for example in train[: args.n]:
    sys.stdout.write(json.dumps({"prompt": example.prompt, "ground_truth": example.ground_truth}) + "\n")
