"""Data-parallel GRPO on CPUs: ``torchrun --nproc-per-node 2 -m slime_gb10 train`` over gloo.

Real parts throughout: torchrun (torch.distributed.run) launching the real CLI twice, gloo
collectives, SmolLM2's tokenizer, a random-init Llama, the arithmetic prompts, the engine,
backend, weight sync and checkpoints. Expected values come from a second implementation: the same
command on one process with the same global batch.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch

from slime_gb10.grpo.checkpoint import latest_checkpoint, load_checkpoint
from slime_gb10.grpo.config import build_config
from slime_gb10.grpo.distributed import DistContext, LaunchError, check_launch
from slime_gb10.grpo.metrics import read_jsonl

pytestmark = pytest.mark.slow

ARGS = [
    "--set", "data.eval_size=0",
    "--set", "rollout.prompts_per_step=4",
    "--set", "rollout.group_size=4",
    "--set", "rollout.max_new_tokens=6",
    # A random model spreads its probability over the whole vocabulary (entropy ~7.9 nats), so the
    # inverse-CDF boundaries of a draw lie ~1/2700 apart and the float noise of another batch shape
    # (16 rows on one rank, 8 on each of two) can move a sampled token. Seen in a fresh environment:
    # weights equal to 1e-7 after step 1, step-2 losses (entropy only) 5e-4 apart, so other samples,
    # not another gradient; among the 4 most likely tokens the boundaries are far apart, and both
    # steps agree again (the tests of this file passed with it, in that environment).
    "--set", "rollout.top_k=4",
    "--set", "train.lr=1e-2",
    # Adam divides each gradient element by its own magnitude: elements whose gradient is float noise
    # (cancelling sums, different order on 1 and 2 ranks) would move by +-lr either way. An eps far
    # above those magnitudes keeps the update linear in the gradient, so the comparison tests the
    # data-parallel gradient, not Adam's amplification of rounding (measured: with eps 1e-8 step 2
    # samples diverge after 1 step; with 1e-3 three steps agree to 1e-8 in the loss).
    "--set", "train.adam_eps=1e-3",
    "--set", "output.checkpoint_every=1",
    "--set", "output.save_final_model=false",
    "--set", "output.samples_per_step=0",
    "--set", "backends.device=cpu",
    "--set", "train.dist_timeout_s=120",
    "--set", "algo.entropy_coef=0.01",  # a gradient without rewards: a random model earns none
    "--no-progress",
]  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    from slime_gb10.grpo.models import write_random_model

    return write_random_model(
        tmp_path_factory.mktemp("dp") / "model", tokenizer, seed=0, initializer_range=0.3
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(model_dir, out, *extra, ranks: int = 1) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("WORLD_SIZE", None)
    cmd = [sys.executable]
    if ranks > 1:
        cmd += ["-m", "torch.distributed.run", f"--nproc-per-node={ranks}", "--master-addr=127.0.0.1",
                f"--master-port={_free_port()}"]  # fmt: skip
    cmd += ["-m", "slime_gb10", "train", "--model", str(model_dir), "--output", str(out), *ARGS, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def policy(run_dir, step: int | None = None) -> dict[str, torch.Tensor]:
    """A checkpoint's weights, whole (a sharded one read through DCP in this process)."""
    from slime_gb10.grpo.checkpoint import checkpoint_path
    from slime_gb10.grpo.sharded_checkpoint import is_sharded_checkpoint, whole_state

    path = latest_checkpoint(run_dir) if step is None else checkpoint_path(run_dir, step)
    return whole_state(path) if is_sharded_checkpoint(path) else load_checkpoint(path)[0]["model"]


def close_to(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Weights of two runs that differ only in the order of float sums (the tolerance of the
    2-rank vs 1-rank step above)."""
    assert set(a) == set(b)
    for name, value in a.items():
        torch.testing.assert_close(b[name], value, rtol=1e-4, atol=1e-6, msg=name)


def test_two_ranks_take_the_one_rank_step(model_dir, tmp_path):
    """2 ranks x 2 prompts = 1 rank x 4 prompts: same samples (per-row sampling keys), same loss and
    gradient norm, same weights after the update, up to the order of the float sums."""
    one = train(model_dir, tmp_path / "one", "--steps", "2")
    assert one.returncode == 0, one.stderr[-3000:]
    two = train(model_dir, tmp_path / "two", "--steps", "2", ranks=2)
    assert two.returncode == 0, two.stderr[:6000]
    rows_one, rows_two = (
        read_jsonl(tmp_path / "one/metrics.jsonl"),
        read_jsonl(tmp_path / "two/metrics.jsonl"),
    )
    assert [r["step"] for r in rows_two] == [1, 2]  # rank 0 alone writes the run
    for a, b in zip(rows_one, rows_two, strict=True):
        assert a["reward_mean"] == b["reward_mean"] and a["response_len_mean"] == b["response_len_mean"]
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-7)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    weights_one, weights_two = policy(tmp_path / "one"), policy(tmp_path / "two")
    for name, value in weights_one.items():
        torch.testing.assert_close(weights_two[name], value, rtol=1e-4, atol=1e-6, msg=name)
    state = load_checkpoint(latest_checkpoint(tmp_path / "two"))[1]
    assert state["world_size"] == 2 and len(state["rank_rng"]) == 2


def test_fsdp_on_two_ranks_takes_the_one_rank_step_and_resumes_exactly(model_dir, tmp_path):
    """train.sharding=fsdp (FSDP2 over gloo): each rank holds half of every layer's weights, gradients
    and Adam moments, and the step is still the one-rank step: loss and gradient norm to 1e-4
    (measured: 1e-8 and 1e-5), weights to 1e-6 (measured 1.2e-7). Each rank writes its shards of a
    checkpoint (torch.distributed.checkpoint); a resumed sharded run continues exactly, the same
    checkpoint resumed on one rank continues the run (resharding 2 -> 1), and the final model is
    the checkpoint's weights in BF16."""
    from transformers import AutoModelForCausalLM

    fsdp = ("--set", "train.sharding=fsdp")
    one = train(model_dir, tmp_path / "one", "--steps", "2")
    assert one.returncode == 0, one.stderr[-3000:]
    full = train(model_dir, tmp_path / "full", "--steps", "2", *fsdp, "--set", "output.save_final_model=true",
                 ranks=2)  # fmt: skip
    assert full.returncode == 0, full.stderr[-6000:]
    for a, b in zip(
        read_jsonl(tmp_path / "one/metrics.jsonl"), read_jsonl(tmp_path / "full/metrics.jsonl"), strict=True
    ):
        assert a["reward_mean"] == b["reward_mean"] and a["response_len_mean"] == b["response_len_mean"]
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-7)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    sharded, whole = policy(tmp_path / "full"), policy(tmp_path / "one")
    assert set(sharded) == set(whole)
    for name, value in whole.items():
        torch.testing.assert_close(sharded[name], value, rtol=1e-4, atol=1e-6, msg=name)
    final = AutoModelForCausalLM.from_pretrained(
        tmp_path / "full/final_model", dtype=torch.float32
    ).state_dict()
    for name, value in sharded.items():
        assert torch.equal(final[name], value.to(torch.bfloat16).float()), name

    first = train(model_dir, tmp_path / "split", "--steps", "1", *fsdp, ranks=2)
    assert first.returncode == 0, first.stderr[-3000:]
    step1 = tmp_path / "split/checkpoints/step-000001"
    assert sorted(p.name for p in (step1 / "policy").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    assert not (step1 / "policy.pt").exists()  # each rank wrote its shards; nothing was gathered
    shutil.copytree(tmp_path / "split", tmp_path / "reshard")
    resumed = train(model_dir, tmp_path / "split", "--steps", "2", "--resume", str(tmp_path / "split"), *fsdp,
                    ranks=2)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    split = policy(tmp_path / "split")
    assert all(torch.equal(sharded[name], split[name]) for name in sharded)

    # resharding 2 -> 1: the sharded checkpoint of step 1 resumed on one rank (unsharded) takes the
    # step the uninterrupted runs took (the same samples: rollouts are keyed by seed, step and row)
    alone = train(
        model_dir, tmp_path / "reshard", "--steps", "2", "--resume", str(tmp_path / "reshard"), *fsdp
    )
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert "resuming a checkpoint of 2 rank(s) on 1" in alone.stderr
    close_to(whole, policy(tmp_path / "reshard"))
    last = read_jsonl(tmp_path / "reshard/metrics.jsonl")[-1]
    reference = read_jsonl(tmp_path / "one/metrics.jsonl")[-1]
    assert last["step"] == 2 and last["reward_mean"] == reference["reward_mean"]
    assert last["loss"] == pytest.approx(reference["loss"], rel=1e-4, abs=1e-7)

    # a tampered index (DCP's .metadata is a pickle) is refused as data, in one line, before any load
    step2 = tmp_path / "split/checkpoints/step-000002"  # written by 2 sharded ranks
    command = f"touch {tmp_path / 'pwned'}".encode()
    (step2 / "policy/.metadata").write_bytes(b"cos\nsystem\n(V" + command + b"\ntR.")
    tampered = train(model_dir, tmp_path / "split", "--steps", "3", "--resume", str(step2), *fsdp)
    assert tampered.returncode == 1 and "Traceback" not in tampered.stderr, tampered.stderr[-3000:]
    assert "is not data: it names os.system" in tampered.stderr and not (tmp_path / "pwned").exists()


def test_fsdp_with_nvfp4_rollouts_and_qat_takes_the_one_rank_step(model_dir, tmp_path):
    """train.sharding=fsdp with the 4-bit policy (rollout.weights=nvfp4, train.quantization=nvfp4-qat):
    the sync quantizes each gathered weight with the global scale of its fused group (an amax over
    every rank's shards), so the engines decode the 1-rank run's codes and 2 sharded ranks take the
    1-rank step (the tolerances of the BF16 test above; weights measured within 1.2e-7), with the
    same share of codes changed at each sync."""
    nvfp4 = ("--set", "rollout.weights=nvfp4", "--set", "train.quantization=nvfp4-qat")
    one = train(model_dir, tmp_path / "one", "--steps", "2", *nvfp4)
    assert one.returncode == 0, one.stderr[-3000:]
    two = train(model_dir, tmp_path / "two", "--steps", "2", *nvfp4, "--set", "train.sharding=fsdp", ranks=2)
    assert two.returncode == 0, two.stderr[-6000:]
    rows = [read_jsonl(tmp_path / run / "metrics.jsonl") for run in ("one", "two")]
    for a, b in zip(*rows, strict=True):
        assert a["reward_mean"] == b["reward_mean"] and a["response_len_mean"] == b["response_len_mean"]
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-7)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
        assert b["train/nvfp4_codes_changed"] == pytest.approx(a["train/nvfp4_codes_changed"], abs=1e-6)
    close_to(policy(tmp_path / "one"), policy(tmp_path / "two"))


def test_two_ranks_resume_exactly_and_on_one_rank(model_dir, tmp_path):
    full = train(model_dir, tmp_path / "full", "--steps", "2", ranks=2)
    assert full.returncode == 0, full.stderr[-3000:]
    first = train(model_dir, tmp_path / "split", "--steps", "1", ranks=2)
    assert first.returncode == 0, first.stderr[-3000:]
    shutil.copytree(tmp_path / "split", tmp_path / "alone")
    resumed = train(
        model_dir, tmp_path / "split", "--steps", "2", "--resume", str(tmp_path / "split"), ranks=2
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = policy(tmp_path / "full"), policy(tmp_path / "split")
    assert all(torch.equal(a[name], b[name]) for name in a)
    timing = {"rollout_time_s", "train_time_s", "sync_time_s", "step_time_s", "rollout_tokens_per_s",
              "train_tokens_per_s"}  # fmt: skip
    rows = [read_jsonl(tmp_path / run / "metrics.jsonl") for run in ("full", "split")]
    assert [{k: v for k, v in r.items() if k not in timing} for r in rows[0]] == [
        {k: v for k, v in r.items() if k not in timing} for r in rows[1]
    ]

    # the 2-rank checkpoint of step 1 on one rank: the same step 2, up to the order of float sums
    alone = train(model_dir, tmp_path / "alone", "--steps", "2", "--resume", str(tmp_path / "alone"))
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert "resuming a checkpoint of 2 rank(s) on 1" in alone.stderr and "Traceback" not in alone.stderr
    close_to(a, policy(tmp_path / "alone"))
    assert read_jsonl(tmp_path / "alone/metrics.jsonl")[-1]["reward_mean"] == rows[0][-1]["reward_mean"]


def test_a_batch_that_does_not_divide_over_the_ranks_is_refused_before_loading(model_dir, tmp_path):
    bad = train(model_dir, tmp_path / "bad", "--steps", "1", "--set", "rollout.prompts_per_step=3", ranks=2)
    assert bad.returncode != 0
    assert "rollout.prompts_per_step=3 does not divide over 2 ranks" in bad.stderr
    assert "Loading weights" not in bad.stderr and not (tmp_path / "bad").exists()


def test_tensor_parallelism_on_one_process_is_refused_with_the_launch_line(model_dir, tmp_path):
    """``megatron.tensor_parallel_size=2`` without torchrun: one line naming the launch, exit
    non-zero, before any weights load (the check needs no GPU: it runs before the backend)."""
    bad = train(model_dir, tmp_path / "bad", "--steps", "1", "--trainer", "megatron", "--set",
                "megatron.tensor_parallel_size=2")  # fmt: skip
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert (
        "1 rank(s) do not divide into tensor-parallel groups of megatron.tensor_parallel_size=2" in bad.stderr
    )
    assert "torchrun --nproc-per-node 2" in bad.stderr
    assert "Loading weights" not in bad.stderr and not (tmp_path / "bad").exists()


def test_check_launch_and_shard():
    config = build_config(overrides={"rollout.prompts_per_step": 6})
    check_launch(config, 1)
    check_launch(config, 3)
    with pytest.raises(LaunchError, match="does not divide over 4 ranks"):
        check_launch(config, 4)
    sglang = build_config(overrides={"rollout.prompts_per_step": 6, "backends.rollout": "sglang"})
    with pytest.raises(LaunchError, match="use --rollout torch"):
        check_launch(sglang, 2)
    megatron = {"rollout.prompts_per_step": 6, "backends.trainer": "megatron"}
    check_launch(build_config(overrides=megatron), 2)  # Megatron-core's DDP (GPU: test_megatron_parallel_gpu)
    with pytest.raises(LaunchError, match=r"megatron\.use_distributed_optimizer=true"):
        check_launch(build_config(overrides={**megatron, "train.sharding": "fsdp"}), 2)
    # Megatron tensor parallelism: its backend, groups that divide the ranks, not with ZeRO-1 (yet)
    tp2 = {**megatron, "megatron.tensor_parallel_size": 2}
    check_launch(build_config(overrides=tp2), 2)
    check_launch(build_config(overrides={**tp2, "rollout.prompts_per_step": 8}), 4)
    with pytest.raises(LaunchError, match=r"tensor_parallel_size=2 is Megatron-core's.*--trainer megatron"):
        check_launch(build_config(overrides={**tp2, "backends.trainer": "torch"}), 2)
    for ranks in (1, 3):  # one rank too: the launch names the torchrun line
        with pytest.raises(LaunchError, match=rf"{ranks} rank\(s\) do not divide.*--nproc-per-node 2"):
            check_launch(build_config(overrides=tp2), ranks)
    with pytest.raises(LaunchError, match="does not yet combine"):
        check_launch(build_config(overrides={**tp2, "megatron.use_distributed_optimizer": True}), 2)
    check_launch(build_config(overrides={"train.sharding": "fsdp", "rollout.weights": "nvfp4"}), 2)
    check_launch(build_config(overrides={"train.sharding": "fsdp"}), 2)
    items = list(range(6))
    assert [DistContext(rank=r, world_size=3).shard(items) for r in range(3)] == [[0, 1], [2, 3], [4, 5]]
    assert DistContext().shard(items) == items and DistContext().sum([1.5]) == [1.5]
    assert DistContext().max([2.0, 1.0]) == [2.0, 1.0]
    assert DistContext().gather("x") == ["x"]


# ------------------------------------------------------------------------ ranks agree or refuse (#41)
# torchrun launches one command on every rank; this wrapper makes a rank differ through the
# environment (LOCAL_RANK): it appends the rank's own arguments from $PER_RANK, or (``"hang"``) makes
# its steps sleep forever, then runs the real CLI. Each rank's stdout+stderr goes to its own file
# (torchrun's own report of a failed child is a traceback of the launcher: not the ranks' output).
RANK_WRAPPER = """
import json, os, runpy, sys, time
rank = os.environ["LOCAL_RANK"]
mine = json.loads(os.environ["PER_RANK"]).get(rank, {})
logs = os.environ["RANK_LOGS"]
out = open(os.path.join(logs, f"rank{rank}.log"), "w")
os.dup2(out.fileno(), 1)
os.dup2(out.fileno(), 2)
if mine.get("hang"):
    from slime_gb10.grpo.trainer import GRPOTrainer
    GRPOTrainer.train_step = lambda self: time.sleep(3600)
sys.argv = ["slime-gb10", *sys.argv[1:], *mine.get("args", [])]
code = 1
try:
    runpy.run_module("slime_gb10", run_name="__main__")
    code = 0
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    raise
finally:
    with open(os.path.join(logs, f"rank{rank}.exit"), "w") as f:
        f.write(str(code))
"""


def train_per_rank(model_dir, tmp_path, per_rank: dict, *extra) -> tuple[subprocess.CompletedProcess, dict]:
    """Two ranks under torchrun through RANK_WRAPPER; the launcher's result and, per rank, its
    ``{"log": its output, "exit": its exit status}`` (None where it was killed before exiting)."""
    wrapper, logs = tmp_path / "rank_wrapper.py", tmp_path / "rank_logs"
    wrapper.write_text(RANK_WRAPPER)
    logs.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PER_RANK": json.dumps(per_rank), "RANK_LOGS": str(logs)}  # fmt: skip
    env.pop("WORLD_SIZE", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
           f"--master-port={_free_port()}", str(wrapper), "train", "--model", str(model_dir),
           "--output", str(tmp_path / "run"), *ARGS, *extra]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    ranks = {}
    for rank in (0, 1):
        exit_file = logs / f"rank{rank}.exit"
        ranks[rank] = {
            "log": (logs / f"rank{rank}.log").read_text(),
            "exit": int(exit_file.read_text()) if exit_file.exists() else None,
        }
    return proc, ranks


def error_lines(log: str) -> list[str]:
    """The CLI's one-line errors (click prints ``Error: <message>``)."""
    return [line for line in log.splitlines() if line.startswith("Error: ")]


def test_ranks_launched_with_different_settings_all_refuse_naming_the_setting(model_dir, tmp_path):
    """Today's code trains rank 1 with another learning rate (the ranks' weights drift apart) and
    exits 0 on both ranks: no refusal, no message."""
    proc, ranks = train_per_rank(
        model_dir, tmp_path, {"1": {"args": ["--set", "train.lr=2e-2"]}}, "--steps", "1"
    )
    assert proc.returncode != 0
    for rank in (0, 1):
        log = ranks[rank]["log"]
        assert ranks[rank]["exit"] == 1, log[-3000:]
        assert error_lines(log) == [
            "Error: ranks disagree on their settings: train.lr is 0.01 on rank 0 and 0.02 on rank 1; "
            "launch every rank with the same command"
        ], log[-3000:]
        assert "Traceback" not in log and "Loading weights" not in log
    assert not (tmp_path / "run").exists()  # refused before rank 0 opened the run directory


def test_ranks_with_different_data_all_refuse_naming_the_data(model_dir, tmp_path):
    """Today's code trains each rank on its own file's prompts (a different global batch on each
    rank) and exits 0: no refusal."""
    files = {}
    for rank in (0, 1):
        files[rank] = tmp_path / f"prompts_{rank}.jsonl"
        rows = [{"prompt": f"What is {i} + {rank}?", "ground_truth": str(i + rank)} for i in range(4)]
        files[rank].write_text("".join(json.dumps(row) + "\n" for row in rows))
    per_rank = {str(rank): {"args": ["--data", str(path)]} for rank, path in files.items()}
    proc, ranks = train_per_rank(model_dir, tmp_path, per_rank, "--steps", "1")
    assert proc.returncode != 0
    for rank in (0, 1):
        log = ranks[rank]["log"]
        assert ranks[rank]["exit"] == 1, log[-3000:]
        assert error_lines(log) == [
            f"Error: ranks disagree on their data: the training examples differ between rank 0 "
            f"(data.path='{files[0]}', 4 examples) and rank 1 (data.path='{files[1]}', 4 examples); "
            "give every rank the same data"
        ], log[-3000:]
        assert "Traceback" not in log and "Loading weights" not in log


def test_ranks_with_different_models_all_refuse_and_a_copy_under_another_path_trains(
    model_dir, tmp_path, tokenizer
):
    """Ranks load their own copy of the model (no broadcast). Today's code refuses a copy under
    another path (a setting that differs) and would train two different checkpoints if their paths
    matched; now the weights are compared, not the path."""
    import shutil

    from slime_gb10.grpo.models import write_random_model

    other = write_random_model(tmp_path / "other", tokenizer, seed=1, initializer_range=0.3)
    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    (tmp_path / "a").mkdir()
    proc, ranks = train_per_rank(
        model_dir, tmp_path / "a", {"1": {"args": ["--model", str(other)]}}, "--steps", "1"
    )
    assert proc.returncode != 0
    for rank in (0, 1):
        log = ranks[rank]["log"]
        assert ranks[rank]["exit"] == 1, log[-3000:]
        assert error_lines(log) == [
            f"Error: ranks disagree on their model: the weights of rank 1 (model.name_or_path='{other}') "
            f"differ from rank 0's (model.name_or_path='{model_dir}'); give every rank the same checkpoint"
        ], log[-3000:]
    (tmp_path / "b").mkdir()
    proc, ranks = train_per_rank(
        model_dir, tmp_path / "b", {"1": {"args": ["--model", str(copy)]}}, "--steps", "1"
    )
    assert proc.returncode == 0, ranks[1]["log"][-3000:]


def test_a_rank_that_hangs_ends_the_job_with_one_line_naming_the_timeout_and_the_rank(model_dir, tmp_path):
    """Rank 1 sleeps in its first step; rank 0 waits train.dist_timeout_s in the step's first
    collective. Today's code: rank 0 dies of gloo's RuntimeError ("Timed out waiting 10000ms for
    recv operation"), a traceback naming neither the setting nor the rank."""
    proc, ranks = train_per_rank(
        model_dir, tmp_path, {"1": {"hang": True}}, "--steps", "1", "--set", "train.dist_timeout_s=10"
    )
    assert proc.returncode != 0
    log = ranks[0]["log"]
    assert ranks[0]["exit"] == 1, log[-3000:]
    [line] = error_lines(log)
    assert line.startswith("Error: rank 1 did not answer within train.dist_timeout_s=10 s ("), line
    assert "raise train.dist_timeout_s if a step" in line
    assert "Traceback" not in log, log[-3000:]
