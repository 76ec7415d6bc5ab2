#!/usr/bin/env bash
# GRPO on one GPU: our trainer on SmolLM2-135M-Instruct (arithmetic task), then TRL's GRPOTrainer
# on the same model/task/batch/lengths; prints a per-step table and the per-step time ratio.
#
# On the device machine (no network): the wheels (pydantic, trl, datasets, dill, multiprocess, gguf)
# must already be installed into /tmp/site and the GGUF reassembled at $GGUF (the 98 MB file does
# not fit the 64 MiB carry limit, so it travels in two parts over two calls; see BENCHMARKS.md).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/python:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export SLIME_GB10_CACHE=/tmp/slime-cache HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
GGUF="${GGUF:-/tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf}"
OUT="${OUT:-/tmp/grpo-bench}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 benchmarks/grpo/bench_grpo.py --gguf "$GGUF" --out "$OUT" \
  --steps "${STEPS:-30}" --trl-steps "${TRL_STEPS:-8}" --prompts 16 --group 8 --max-new-tokens 128 \
  --lr "${LR:-2e-5}" --micro-batch-size 64 "$@" 2>&1 | tee "$OUT/bench.log"
