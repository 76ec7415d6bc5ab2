#!/usr/bin/env bash
# Issue #40's table on one 4 x H100 host: data-parallel vs FSDP GRPO steps on 1, 2 and 4 GPUs for
# shape C (Qwen2.5-1.5B body) and the 7B shape (Qwen2.5-7B body), both random-init with SmolLM2's
# vocabulary (slime_gb10.bench); the 7B shape refused on one GPU and under data parallelism.
# From the repository root, with PYTHONPATH holding the package; TOKENIZER: SmolLM2's tokenizer
# directory; GPU0_BUSY=1: GPU 0 is taken (the GPU test suite runs there) until /tmp/res/suite.rc
# exists; JOB_EXTRA: more flags for every launch (e.g. --set train.compile=false). Writes /tmp/sharded/{jobs.tsv,logs/,runs/}; then: python benchmarks/sharded/table.py /tmp/sharded
set -u
. "$(dirname "$0")/lib.sh"
rm -rf "${W:?}"/runs/* "${W:?}"/logs/* $W/progress  # a second run starts clean (the models stay)
: > $W/jobs.tsv

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
