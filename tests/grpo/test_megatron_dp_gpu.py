"""Megatron-core under torchrun (issue #40): data parallelism through Megatron's own
``DistributedDataParallel`` (the gradient reduction is the engine's, not our loop), with and
without its distributed optimizer (ZeRO-1), on two GPUs against one.

Megatron-core places its RoPE table, its attention buffers and its DDP gradient buffers on CUDA
(``torch.cuda.current_device()``), so none of this runs on a CPU under gloo: these tests need two
CUDA GPUs (the device's H100s, a two-GPU runner of the flake's GPU checks). The CPU side of the
same launch (what is refused, the memory plan) is in test_distributed.py and test_memory_plan.py.
"""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
import torch

from slime_gb10.grpo.metrics import read_jsonl

HAVE_MEGATRON = importlib.util.find_spec("megatron") is not None and bool(
    importlib.util.find_spec("megatron.core")
)
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAVE_MEGATRON, reason="megatron-core is not installed (slime-gb10[megatron])"),
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"
    ),
]

# One rank per GPU. The same global batch of GRPO samples each step (uneven over the ranks: 3 and 1
# on step 1, 0 and 4 on step 2: a rank with no micro-batch still joins the reduction), through the
# trainer's own minibatching and loss (batching.update_policy: each loss divided by the global token
# count). After step 1 the state is saved the way a checkpoint is (every rank calls state_dict, rank
# 0 writes it with torch.save) and read back as data (weights_only) into a fresh backend on every
# rank, which then takes step 2 again: an exact resume.
SCRIPT = r"""
import json, os, sys, torch, torch.distributed as dist
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM
from slime_gb10.grpo.backends.megatron.backend import MegatronPolicyBackend
from slime_gb10.grpo.batching import Sample, update_policy
from slime_gb10.grpo.config import build_config
from slime_gb10.grpo.distributed import DistContext

out, zero1 = Path(sys.argv[1]), sys.argv[2] == "1"
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
rank, world = dist.get_rank(), dist.get_world_size()
ctx = DistContext(rank=rank, world_size=world, local_rank=local, timeout_s=120)
# adam_eps far above the gradients' float noise: the update stays linear in the gradient, so a
# gradient that is averaged instead of summed over the ranks shows (test_distributed.py says why)
cfg = build_config(overrides={"train.micro_batch_size": 1, "train.lr": 1e-2, "train.adam_eps": 1e-3,
                              "algo.entropy_coef": 0.01, "megatron.use_distributed_optimizer": zero1,
                              "megatron.transformer_impl": "local"})
hf_config = LlamaConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=256, vocab_size=512, tie_word_embeddings=False,
                        max_position_embeddings=128, initializer_range=0.3)

def backend():
    torch.manual_seed(0)  # the same weights on every rank and in every run
    hf = LlamaForCausalLM(hf_config)
    return MegatronPolicyBackend(hf, None, "cuda", train=cfg.train, megatron=cfg.megatron)

def samples(step):
    gen = torch.Generator().manual_seed(step)
    rows = []
    for i in range(4):
        n = 2 + (i + step) % 4
        completion = torch.randint(0, 512, (n,), generator=gen).tolist()
        rows.append(Sample([1, 2 + i], completion, [-6.0] * n, float(torch.randn(1, generator=gen)), 1.0,
                           truncated=False))
    if world == 1:
        return rows
    return {1: [rows[:3], rows[3:]], 2: [[], rows]}[step][rank]

def step(policy, n):
    metrics, tokens, grad_norm, loss = update_policy(policy, samples(n), cfg, ctx, pad_token_id=0)
    return {"loss": ctx.sum([loss])[0], "grad_norm": grad_norm}  # each rank's loss is its share

a = backend()
rows = [step(a, 1)]
state = a.state_dict()  # a collective under the distributed optimizer
path = out / "state.pt"
if rank == 0:
    torch.save(state, path)
dist.barrier()
rows.append(step(a, 2))
b = backend()
b.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
step(b, 2)
final_a, final_b = a.hf_state_dict(), b.hf_state_dict()
exact = all(torch.equal(final_a[k], final_b[k]) for k in final_a)
if rank == 0:
    torch.save({k: v.float().cpu() for k, v in final_a.items()}, out / "weights.pt")
    keys = sorted(state)
    (out / "result.json").write_text(json.dumps({"rows": rows, "resume_exact": exact, "state_keys": keys,
                                                  "dp": a.data_parallel_size}))
dist.destroy_process_group()
"""


def run_script(torchrun, tmp_path, ranks: int, zero1: bool) -> tuple[dict, dict]:
    out = tmp_path / f"{ranks}-{int(zero1)}"
    out.mkdir()
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    run = torchrun(str(script), str(out), "1" if zero1 else "0", ranks=ranks, timeout=400)
    assert run.returncode == 0, run.stderr[-5000:]
    result = json.loads((out / "result.json").read_text())
    return result, torch.load(out / "weights.pt", weights_only=True)


@pytest.mark.parametrize("zero1", [False, True], ids=["ddp", "distributed-optimizer"])
def test_two_ranks_take_the_one_rank_step_and_resume_exactly(torchrun, tmp_path, zero1):
    """DP=2 equals DP=1: the same loss and gradient norm (summed, not averaged, over the ranks) to
    float order, the same BF16 weights after two steps up to one BF16 rounding (the FP32 master
    weights differ in the order of the float sums; a weight whose master value sits at a rounding
    boundary may round the other way); a resumed backend repeats step 2 bit for bit."""
    one, w_one = run_script(torchrun, tmp_path, 1, zero1)
    two, w_two = run_script(torchrun, tmp_path, 2, zero1)
    assert (one["dp"], two["dp"]) == (1, 2)
    for a, b in zip(one["rows"], two["rows"], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-3, abs=1e-5), (one["rows"], two["rows"])
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3), (one["rows"], two["rows"])
    assert set(w_one) == set(w_two)
    for name, value in w_one.items():
        torch.testing.assert_close(w_two[name], value, rtol=2**-7, atol=1e-5, msg=name)
    assert (one["resume_exact"], two["resume_exact"]) == (True, True)  # (1 rank, 2 ranks)
    assert ("optimizer_parameter_state" in two["state_keys"]) == zero1


ARGS = ["--rollout", "torch", "--trainer", "megatron", "--prompts-per-step", "4", "--group-size", "4",
        "--max-new-tokens", "8", "--set", "train.lr=1e-3", "--set", "algo.entropy_coef=0.01",
        "--set", "algo.skip_zero_variance_groups=false", "--set", "eval.every=0", "--set", "eval.at_end=false",
        "--set", "output.samples_per_step=0", "--set", "output.checkpoint_every=1",
        "--set", "megatron.transformer_impl=local", "--set", "megatron.use_distributed_optimizer=true",
        "--set", "train.dist_timeout_s=120", "--no-progress"]  # fmt: skip


def test_a_megatron_run_on_two_gpus_checkpoints_and_resumes(torchrun, tmp_path, tokenizer):
    """The whole loop under torchrun with Megatron's distributed optimizer: two steps with a
    checkpoint each (rank 0 writes the gathered optimizer shards), then the run resumed from step 1
    to step 3; the final model is a Hugging Face directory; the checkpoint of step 1 resumed on one
    GPU (resharding 2 -> 1)."""
    from slime_gb10.grpo.checkpoint import load_checkpoint
    from slime_gb10.grpo.models import write_random_model

    model = write_random_model(tmp_path / "model", tokenizer, seed=0)
    out = tmp_path / "run"
    first = torchrun("-m", "slime_gb10", "train", "--model", str(model), "--output", str(out), "--steps", "2",
                     *ARGS, ranks=2, timeout=500)  # fmt: skip
    assert first.returncode == 0, first.stderr[-5000:]
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2]
    policy, state = load_checkpoint(out / "checkpoints/step-000002")
    assert state["world_size"] == 2 and "optimizer_parameter_state" in policy
    shutil.copytree(out, tmp_path / "alone")
    resumed = torchrun("-m", "slime_gb10", "train", "--resume", str(out / "checkpoints/step-000001"),
                       "--set", "train.steps=3", "--no-progress", ranks=2, timeout=500)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-5000:]
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]
    assert (out / "final_model/config.json").is_file()
    # the 2-rank checkpoint of step 1 on one GPU: Megatron's "dp_zero" layout scatters over any count
    alone = torchrun("-m", "slime_gb10", "train", "--resume", str(tmp_path / "alone/checkpoints/step-000001"),
                     "--no-progress", ranks=1, timeout=500)  # fmt: skip
    assert alone.returncode == 0, alone.stderr[-5000:]
    assert "resuming a checkpoint of 2 rank(s) on 1" in alone.stderr
    assert [r["step"] for r in read_jsonl(tmp_path / "alone/metrics.jsonl")] == [1, 2]
