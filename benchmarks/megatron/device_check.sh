#!/usr/bin/env bash
# Megatron-core backend on a CUDA device (H100 here; TransformerEngine absent -> local layer spec).
#   bash benchmarks/megatron/device_check.sh          # GPU tests (tests/grpo/test_megatron_gpu.py)
#   BENCH=1 bash benchmarks/megatron/device_check.sh  # + GRPO steps, Megatron vs PyTorch backend
# Needs the megatron-core wheel in .whl (carry=[".whl"]) and, for BENCH=1, SmolLM2's tokenizer in
# .megatron_carry/smollm2-tokenizer (carry=[".megatron_carry"]). Logs and JSON go to $OUT.
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/python:/tmp/site PYTHONUNBUFFERED=1 CUDA_DEVICE_MAX_CONNECTIONS=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -W ignore -c "import megatron.core, torch, transformers; print('megatron-core', megatron.core.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
python3 -c "import transformer_engine" 2>/dev/null && echo "TE: present" || echo "TE: absent (local layer spec)"
python3 -m pytest -q -s -p no:cacheprovider -W ignore::UserWarning -W ignore::DeprecationWarning \
  tests/grpo/test_megatron_gpu.py 2>&1 | tee "$OUT/pytest_megatron_gpu.log" | grep -v "^\s*$" | grep -E "passed|failed|error|megatron_max|^FAILED|^E " | head -40
rc=$?
if [ "${BENCH:-0}" = 1 ]; then
  python3 -W ignore benchmarks/megatron/bench_grpo_backends.py --tokenizer .megatron_carry/smollm2-tokenizer \
    --out "$OUT" --learn-steps "${LEARN_STEPS:-10}" --speed-steps "${SPEED_STEPS:-4}" 2>&1 | tee "$OUT/bench.log" \
    | grep -v "Loading weights" | tail -30
fi
