#!/usr/bin/env bash
# The pieces of issue #40's GPU table (sourced by run_h100.sh and by a partial schedule): the work
# directory, the random-init models of the shapes (SHAPES, default "C 7b"), the fixed work of each, the
# trainer flags of each mode, and job(), one torchrun launch appending its exit status to jobs.tsv.
set -u
W=/tmp/sharded
mkdir -p $W/logs $W/runs $W/models
touch $W/jobs.tsv
PY=python3

$PY - <<PYEOF || exit 1
from pathlib import Path
from slime_gb10.bench.decode import DECODE_SHAPES
from slime_gb10.bench.grpo import write_shape_model
for name in "${SHAPES:-C 7b}".split():  # the random-init models, written once
    target = Path("$W/models") / name
    if not target.exists():
        write_shape_model(DECODE_SHAPES[name], target, "$TOKENIZER", seed=0)
        print("wrote", target, flush=True)
PYEOF

# the fixed work of each shape: the global batch is the same on every GPU count (strong scaling)
shape_args() {
  case $1 in
    C) echo "--prompts-per-step 16 --group-size 8 --max-new-tokens 256 --set train.micro_batch_size=16" ;;
    # 7B: micro-batches of 4 with activation checkpointing, so that 2 GPUs hold it (the memory plan)
    7b) echo "--prompts-per-step 8 --group-size 8 --max-new-tokens 256 --set train.micro_batch_size=4 \
--set model.gradient_checkpointing=true --set output.save_final_model=false" ;;
  esac
}

# the trainer flags of a mode: none (data parallel), fsdp (train.sharding=fsdp), megatron (Megatron-core's
# DDP), megatron-zero1 (its distributed optimizer too) and megatron-tpN (its tensor parallelism over N
# consecutive GPUs, data parallel over the groups); all roll out with the PyTorch engine
mode_args() {
  case $1 in
    none|fsdp) echo "--trainer torch --set train.sharding=$1" ;;
    megatron) echo "--trainer megatron --set megatron.use_distributed_optimizer=false" ;;
    megatron-zero1) echo "--trainer megatron --set megatron.use_distributed_optimizer=true" ;;
    megatron-tp*) echo "--trainer megatron --set megatron.tensor_parallel_size=${1#megatron-tp}" ;;
  esac
}

# job NAME GPUS SHAPE MODE [extra args]: one torchrun launch, its exit status in jobs.tsv
job() {
  local name=$1 gpus=$2 shape=$3 sharding=$4; shift 4
  local n; n=$(($(tr -cd , <<<"$gpus" | wc -c) + 1))
  local limit=300; [ "$shape" = 7b ] && limit=540
  echo "$(date -u +%H:%M:%S) start $name on GPUs $gpus" >> $W/progress
  # shellcheck disable=SC2046
  CUDA_VISIBLE_DEVICES=$gpus timeout $limit torchrun --standalone --nproc-per-node "$n" -m slime_gb10 train \
    --model $W/models/$shape --rollout torch --steps 4 --lr 1e-6 --output $W/runs/$name \
    $(shape_args "$shape") $(mode_args "$sharding") --set algo.skip_zero_variance_groups=false \
    --set algo.mask_truncated=false --set eval.every=0 --set eval.at_end=false --set output.samples_per_step=0 \
    --no-progress ${JOB_EXTRA:-} "$@" > $W/logs/$name.log 2>&1
  local rc=$?
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$gpus" "$shape" "$sharding" "$n" "$rc" >> $W/jobs.tsv
  echo "$(date -u +%H:%M:%S) done $name rc $rc" >> $W/progress
}

