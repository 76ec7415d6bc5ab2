#!/usr/bin/env bash
# Issue #40's table on one 4 x H100 host: data-parallel vs FSDP GRPO steps on 1, 2 and 4 GPUs for
# shape C (Qwen2.5-1.5B body) and the 7B shape (Qwen2.5-7B body), both random-init with SmolLM2's
# vocabulary (slime_gb10.bench); the 7B shape refused on one GPU and under data parallelism.
# From the repository root, with PYTHONPATH holding the package; TOKENIZER: SmolLM2's tokenizer
# directory; GPU0_BUSY=1: GPU 0 is taken (the GPU test suite runs there) until /tmp/res/suite.rc
# exists; JOB_EXTRA: more flags for every launch (e.g. --set train.compile=false). Writes /tmp/sharded/{jobs.tsv,logs/,runs/}; then: python benchmarks/sharded/table.py /tmp/sharded
set -u
W=/tmp/sharded
mkdir -p $W/logs $W/runs $W/models
rm -rf "${W:?}"/runs/* "${W:?}"/logs/* $W/progress  # a second run starts clean (the models stay)
: > $W/jobs.tsv
PY=python3

$PY - <<PYEOF || exit 1
from pathlib import Path
from slime_gb10.bench.decode import DECODE_SHAPES
from slime_gb10.bench.grpo import write_shape_model
for name in ("C", "7b"):
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

# job NAME GPUS SHAPE SHARDING [extra args]: one torchrun launch, its exit status in jobs.tsv
job() {
  local name=$1 gpus=$2 shape=$3 sharding=$4; shift 4
  local n; n=$(($(tr -cd , <<<"$gpus" | wc -c) + 1))
  local limit=300; [ "$shape" = 7b ] && limit=540
  echo "$(date -u +%H:%M:%S) start $name on GPUs $gpus" >> $W/progress
  # shellcheck disable=SC2046
  CUDA_VISIBLE_DEVICES=$gpus timeout $limit torchrun --standalone --nproc-per-node "$n" -m slime_gb10 train \
    --model $W/models/$shape --rollout torch --trainer torch --steps 4 --lr 1e-6 --output $W/runs/$name \
    $(shape_args "$shape") --set train.sharding="$sharding" --set algo.skip_zero_variance_groups=false \
    --set algo.mask_truncated=false --set eval.every=0 --set eval.at_end=false --set output.samples_per_step=0 \
    --no-progress ${JOB_EXTRA:-} "$@" > $W/logs/$name.log 2>&1
  local rc=$?
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$gpus" "$shape" "$sharding" "$n" "$rc" >> $W/jobs.tsv
  echo "$(date -u +%H:%M:%S) done $name rc $rc" >> $W/progress
}

# the ceilings MFU is read against: this GPU's BF16 GEMM rate and copy bandwidth, measured now
CUDA_VISIBLE_DEVICES=1 $PY -c "import json; from slime_gb10.bench.grpo import measure_ceilings; \
print(json.dumps(measure_ceilings()))" > $W/ceilings.json 2> $W/logs/ceilings.log

if [ "${GPU0_BUSY:-0}" = 1 ]; then  # GPUs 1-3 while GPU 0 runs the test suite, then all four
  job C-1 1 C none &
  job C-fsdp-2 2,3 C fsdp --set output.checkpoint_every=2 &
  wait
  job 7b-1 1 7b fsdp &   # refused: one GPU holds neither the 7B's training state nor its plan
  job C-dp-2 2,3 C none &
  wait
  job 7b-fsdp-2 2,3 7b fsdp
  while [ ! -f /tmp/res/suite.rc ]; do sleep 5; done
else  # all four GPUs from the start
  job C-1 0 C none &
  job C-dp-2 1,2 C none &
  job 7b-1 3 7b fsdp &
  wait
  job C-fsdp-2 0,1 C fsdp --set output.checkpoint_every=2 &
  job 7b-fsdp-2 2,3 7b fsdp &
  wait
fi
job 7b-dp-4 0,1,2,3 7b none  # refused: data parallelism holds the whole training state on each GPU
job 7b-fsdp-4 0,1,2,3 7b fsdp
job C-fsdp-4 0,1,2,3 C fsdp
job C-dp-4 0,1,2,3 C none
# the 2-GPU sharded checkpoint of step 2, resumed on 4 GPUs (resharding under NCCL) for 1 more step
cp -r $W/runs/C-fsdp-2 $W/runs/C-reshard-2to4 && \
  CUDA_VISIBLE_DEVICES=0,1,2,3 timeout 300 torchrun --standalone --nproc-per-node 4 -m slime_gb10 train \
    --resume $W/runs/C-reshard-2to4/checkpoints/step-000002 --set train.steps=3 --no-progress ${JOB_EXTRA:-} \
    > $W/logs/C-reshard-2to4.log 2>&1
echo "$(date -u +%H:%M:%S) done C-reshard-2to4 rc $?" >> $W/progress
# the doctor's distributed check on the 4 GPUs: NCCL's bus bandwidth and what a sharded step needs
CUDA_VISIBLE_DEVICES=0,1,2,3 timeout 90 torchrun --standalone --nproc-per-node 4 -m slime_gb10 doctor \
  > $W/logs/doctor-4.log 2>&1
echo "$(date -u +%H:%M:%S) all done" >> $W/progress
