#!/usr/bin/env bash
# Megatron-core backend checks on a CUDA device (H100 here): GPTModel from HF configs,
# bit-exact import/export, logprobs vs transformers, optimizer steps. Logs under $OUT.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/python:/tmp/site PYTHONUNBUFFERED=1 CUDA_DEVICE_MAX_CONNECTIONS=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import megatron.core, torch, transformers; print('megatron-core', megatron.core.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" 2>&1 | grep -v Warning
python3 -c "import transformer_engine" 2>/dev/null && echo "TE: present" || echo "TE: absent (local layer spec)"
python3 -m pytest -q -s -p no:cacheprovider -W ignore::UserWarning tests/grpo/test_megatron_gpu.py "$@" 2>&1 | tee "$OUT/pytest_megatron_gpu.log"
