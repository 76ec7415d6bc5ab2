#!/usr/bin/env bash
# Issue #27 on one GPU: `slime-gb10 bench grpo` (our trainer on shapes A, B, C against the measured
# copy bandwidth and BF16 GEMM rate), then TRL's GRPOTrainer (trl_grpo.py) on the SAME random-init
# models of shapes A and B with the same prompts, batch, group and lengths, then the ratio table.
#
# Device machine (no network): pydantic, trl and datasets' wheels installed into /tmp/site, a
# tokenizer directory at $TOKENIZER (SmolLM2's; see BENCHMARKS.md for how it travels).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/python:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# TOKENIZERS_PARALLELISM is left as a user has it (unset: the Rust tokenizer decodes a batch on
# every core), for both trainers
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT="${OUT:-/tmp/bench-grpo}" WORK="${WORK:-/tmp/bench-grpo-work}" TOKENIZER="${TOKENIZER:-/tmp/smol}"
SHAPES="${SHAPES:-A,B,C}" TRL_SHAPES="${TRL_SHAPES:-A B}" TRL_STEPS="${TRL_STEPS:-4}"
mkdir -p "$OUT" "$WORK"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -m slime_gb10.bench.grpo --shapes "$SHAPES" --steps "${STEPS:-4}" --tokenizer "$TOKENIZER" \
  --work-dir "$WORK" --json "$OUT/ours.json" 2>&1 | tee "$OUT/ours.log" | grep -v "^\s*$" | tail -12
pairs=()
for name in $TRL_SHAPES; do
  read -r prompts group tokens micro < <(python3 -c "from slime_gb10.bench.grpo import SHAPES; s = SHAPES['$name']; n = s.prompts * s.group; print(s.prompts, s.group, s.max_new_tokens, s.micro_batch if n % s.micro_batch == 0 else 32)")
  timeout "${TRL_TIMEOUT:-240}" python3 benchmarks/grpo/trl_grpo.py --model "$WORK/model-$name" --steps "$TRL_STEPS" \
    --prompts "$prompts" --group "$group" --max-new-tokens "$tokens" --micro-batch "$micro" --lr 1e-6 --out "$OUT/trl-$name.json" \
    > "$OUT/trl-$name.log" 2>&1 || echo "TRL on shape $name failed or timed out (see trl-$name.log)"
  pairs+=("$name=$OUT/trl-$name.json")
done
python3 benchmarks/grpo/compare_trl.py "$OUT/ours.json" "${pairs[@]}" | tee "$OUT/compare.md"
