"""Checkpoints: atomic, newest complete one wins, pruning keeps the newest, RNG states round-trip."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from slime_gb10.grpo.checkpoint import (
    CheckpointError,
    clean_stale,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_for_resume,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


def test_save_load_prune(tmp_path):
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, {"w": torch.full((2,), float(step))}, {"step": step}, keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3]
    policy, trainer = load_checkpoint(latest_checkpoint(tmp_path))
    assert trainer["step"] == 3 and policy["w"].tolist() == [3.0, 3.0]


def test_pruning_never_removes_the_checkpoint_just_written(tmp_path):
    """A newer step left behind (a resume whose discard failed) must not make the new checkpoint the
    "oldest beyond keep": the others are pruned, the one just written stays."""
    save_checkpoint(tmp_path, 20, {"w": torch.zeros(1)}, {"step": 20})
    path = save_checkpoint(tmp_path, 11, {"w": torch.ones(1)}, {"step": 11}, keep=1)
    assert path.is_dir() and [s for s, _ in list_checkpoints(tmp_path)] == [11]
    save_checkpoint(tmp_path, 12, {"w": torch.ones(1)}, {"step": 12}, keep=2)
    save_checkpoint(tmp_path, 13, {"w": torch.ones(1)}, {"step": 13}, keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [12, 13]


def test_incomplete_checkpoint_is_ignored(tmp_path):
    save_checkpoint(tmp_path, 1, {"w": torch.zeros(1)}, {"step": 1})
    broken = tmp_path / "checkpoints" / "step-000005"
    broken.mkdir()
    (broken / "policy.pt").write_bytes(b"half")  # a crash before meta.json
    assert latest_checkpoint(tmp_path).name == "step-000001"
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        load_checkpoint(broken)
    assert latest_checkpoint(tmp_path / "nothing") is None


def test_failed_save_leaves_the_previous_checkpoint(tmp_path):
    save_checkpoint(tmp_path, 1, {"w": torch.zeros(1)}, {"step": 1})

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        save_checkpoint(tmp_path, 2, {"w": Unpicklable()}, {"step": 2})
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1]
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]  # no temp left


def test_rng_state_round_trip():
    state = rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(state)
    b = (random.random(), np.random.rand(), torch.rand(1).item())
    assert a == b


# ---------------------------------------------------------------- a checkpoint is data, never code
class _RunsCode:
    """Unpickling this runs a shell command (what a tampered checkpoint would carry)."""

    def __init__(self, sentinel):
        self.sentinel = str(sentinel)

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.sentinel}",))


@pytest.mark.parametrize("which", ["trainer.pt", "policy.pt"])
def test_a_pickle_that_runs_code_is_refused_and_nothing_runs(tmp_path, which):
    path = save_checkpoint(tmp_path, 1, {"w": torch.zeros(2)}, {"step": 1, "rng": rng_state()})
    sentinel = tmp_path / "pwned"
    payload = {"step": 1, "evil": _RunsCode(sentinel)}
    torch.save(payload, path / which)
    with pytest.raises(CheckpointError, match=f"cannot read checkpoint file .*{which}.* as data"):
        load_checkpoint(path)
    assert not sentinel.exists()
    # the same payload through weights_only=False really would have run it (the test can fail)
    torch.load(path / which, weights_only=False)
    assert sentinel.exists()


@pytest.mark.parametrize("content", [b"", b"\x00" * 10, bytes(range(256)) * 40, b"PK\x03\x04broken zip"])
def test_random_bytes_are_a_one_line_error(tmp_path, content):
    path = save_checkpoint(tmp_path, 1, {"w": torch.zeros(2)}, {"step": 1})
    (path / "policy.pt").write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert "\n" not in str(info.value) and "policy.pt" in str(info.value)
    # read memory-mapped when it is a zip archive; a damaged file is not told how to save one
    assert "mmap" not in str(info.value) and "_use_new_zipfile_serialization" not in str(info.value)


def test_rng_state_is_loadable_with_weights_only(tmp_path):
    path = save_checkpoint(tmp_path, 3, {"w": torch.ones(1)}, {"step": 3, "rng": rng_state()})
    _, trainer = load_checkpoint(path)  # weights_only=True inside
    a = (random.random(), np.random.rand(), np.random.randn(), torch.rand(1).item())
    set_rng_state(trainer["rng"])
    b = (random.random(), np.random.rand(), np.random.randn(), torch.rand(1).item())
    assert a == b


# ---------------------------------------------------------------- crash and fault windows
def test_stale_temp_directories_are_cleaned_and_an_orphaned_old_is_restored(tmp_path):
    save_checkpoint(tmp_path, 1, {"w": torch.zeros(1)}, {"step": 1})
    root = tmp_path / "checkpoints"
    stale = root / ".step-000002.abc123.tmp"  # SIGKILL mid-save: a full-size temp directory
    stale.mkdir()
    (stale / "policy.pt").write_bytes(b"x" * 1000)
    # SIGKILL between the two renames of a replacement: only ".step-000001.old" would remain
    (root / "step-000001").rename(root / ".step-000001.old")
    touched = clean_stale(tmp_path)
    assert {p.name for p in touched} == {".step-000002.abc123.tmp", ".step-000001.old"}
    assert sorted(p.name for p in root.iterdir()) == ["step-000001"]
    assert load_checkpoint(root / "step-000001")[1]["step"] == 1


def test_saving_the_same_step_twice_keeps_the_first_and_never_renames(tmp_path, monkeypatch):
    first = save_checkpoint(tmp_path, 4, {"w": torch.ones(1)}, {"step": 4}, reason="periodic")
    import os

    renames = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (renames.append((a, b)), real(a, b)))
    again = save_checkpoint(tmp_path, 4, {"w": torch.ones(1)}, {"step": 4}, reason="interrupt")
    assert again == first and renames == []  # no window in which step 4 is missing
    assert load_checkpoint(first)[1]["step"] == 4


def test_full_disk_is_one_line_naming_path_and_last_good(tmp_path, monkeypatch):
    good = save_checkpoint(tmp_path, 1, {"w": torch.zeros(4)}, {"step": 1})

    def full(*args, **kwargs):  # what torch.save raises on ENOSPC (the zip writer's enforce)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    import shutil

    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10, 10, 0))
    with pytest.raises(CheckpointError) as info:
        save_checkpoint(tmp_path, 2, {"w": torch.zeros(1024)}, {"step": 2})
    message = str(info.value)
    assert "\n" not in message and "step-000002" in message
    assert "no space left" in message and str(good) in message
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1]


def _small_tmpfs(path):
    import subprocess

    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.decode().strip()}")
    return lambda: subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_really_full_file_system(tmp_path):
    disk = tmp_path / "disk"
    unmount = _small_tmpfs(disk)
    try:
        good = save_checkpoint(disk, 1, {"w": torch.zeros(8)}, {"step": 1})
        with pytest.raises(CheckpointError, match="no space left on device") as info:
            save_checkpoint(disk, 2, {"w": torch.zeros(2**20)}, {"step": 2})  # 4 MiB > 1 MiB
        assert str(good) in str(info.value)
        assert [p.name for p in (disk / "checkpoints").iterdir()] == ["step-000001"]
    finally:
        unmount()


def test_resume_falls_back_past_a_corrupt_latest(tmp_path, caplog):
    for step in (1, 2):
        save_checkpoint(tmp_path, step, {"w": torch.full((1,), float(step))}, {"step": step})
    (tmp_path / "checkpoints" / "step-000002" / "policy.pt").write_bytes(b"truncated")
    with caplog.at_level("WARNING"):
        path, policy, trainer = load_for_resume(tmp_path)
    assert path.name == "step-000001" and trainer["step"] == 1 and policy["w"].item() == 1.0
    assert "step-000002" in caplog.text and "older checkpoint" in caplog.text
    # a checkpoint directory names exactly that checkpoint
    assert load_for_resume(tmp_path / "checkpoints" / "step-000001")[2]["step"] == 1
    with pytest.raises(CheckpointError, match="step-000002"):
        load_for_resume(tmp_path / "checkpoints" / "step-000002")
    (tmp_path / "checkpoints" / "step-000001" / "trainer.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="no readable checkpoint"):
        load_for_resume(tmp_path)


def _streaming_run(run_dir, step: int, fail: OSError | None = None):
    """A one-rank run whose backend writes its state as it gathers it (Megatron's tensor parallelism,
    which needs CUDA to train: its writer is tested on CPUs in test_tensor_parallel_collectives.py).
    What it writes is made here by hand, from the index format tp_checkpoint documents."""
    import json
    import types

    from safetensors.torch import save_file

    from slime_gb10.grpo.distributed import DistContext

    calls = []

    def write_state(directory):  # returns what failed, once its part of the gathers is done
        calls.append(directory)
        if fail is not None or directory is None:
            return fail
        directory.mkdir()
        save_file(
            {"model/w": torch.full((2, 3), float(step)), "main/w": torch.ones(2, 3)}, str(directory / "a")
        )
        save_file({"state/w/exp_avg": torch.zeros(2, 3)}, str(directory / "b"))
        index = {"format": "megatron-whole", "tensor_parallel_size": 2, "flavor": "local", "steps_done": step,
                 "param_groups": [{"lr": 0.25, "betas": [0.9, 0.99]}],
                 "tensors": {"model/w": "a", "main/w": "a", "state/w/exp_avg": "b"},
                 "scalars": {"state/w/step": {"value": 3.0, "dtype": "float32", "device": "cpu"}}}  # fmt: skip
        (directory / "index.json").write_text(json.dumps(index))
        return None

    backend = types.SimpleNamespace(
        sharded=False, streams_state=True, write_state=write_state, num_parameters=6
    )
    run = types.SimpleNamespace(
        run_dir=run_dir, step=step, _boundary={"step": step, "rng": rng_state()}, backend=backend,
        dist=DistContext(rank=0, world_size=1, local_rank=0), _last_checkpoint=None,
        config=types.SimpleNamespace(output=types.SimpleNamespace(keep_checkpoints=2)),
    )  # fmt: skip
    return run, calls


def test_a_state_written_as_it_is_gathered_is_a_checkpoint_read_a_tensor_at_a_time(tmp_path):
    """Megatron's tensor parallelism checkpoints through the backend's writer (rank 0's host memory
    never holds the whole state): into the same atomic directory, skipped when the step is written,
    pruned alike; read back as data, its tensors when looked up; a write that fails leaves the last
    good checkpoint and says so in one line; a tampered index is refused."""
    from slime_gb10.grpo.checkpoint import save

    for step in (1, 2, 3):
        run, calls = _streaming_run(tmp_path, step)
        path = save(run)
        assert calls == [calls[0]] and calls[0].name == "policy_whole" and path == run._last_checkpoint
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3]
    run, calls = _streaming_run(tmp_path, 3)
    assert save(run) == path and calls == []  # written already: not again
    policy, trainer = load_checkpoint(path)
    assert trainer["step"] == 3 and policy["steps_done"] == 3 and policy["tensor_parallel_size"] == 2
    assert torch.equal(policy["model"]["w"], torch.full((2, 3), 3.0)) and list(policy["model"]) == ["w"]
    optimizer = policy["optimizer"]
    assert optimizer["param_groups"] == [{"lr": 0.25, "betas": (0.9, 0.99)}]  # a tuple again, as Adam's
    assert torch.equal(optimizer["main"]["w"], torch.ones(2, 3))
    assert torch.equal(optimizer["state"]["w"]["exp_avg"], torch.zeros(2, 3))
    assert optimizer["state"]["w"]["step"]["scalar"].dtype == torch.float32
    import errno

    run, _ = _streaming_run(tmp_path, 4, fail=OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(
        CheckpointError, match=r"no space left on device.*last good checkpoint is .*step-000003"
    ):
        save(run)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3]


@pytest.mark.parametrize(
    "tamper",
    [
        lambda d: (d / "index.json").write_text((d / "index.json").read_text().replace('"float32"', '"object"')),
        lambda d: (d / "b").unlink(),  # a part lost: refused when read, before any weight is touched
        lambda d: (d / "b").write_bytes((d / "b").read_bytes()[:40]),  # a part cut short
        lambda d: (d / "index.json").write_text((d / "index.json").read_text().replace('"steps_done": 3', '"steps_done": 1e400')),
        lambda d: (d / "index.json").write_text((d / "index.json").read_text().replace('"b"', '"../b"')),
        lambda d: (d / "index.json").write_text((d / "index.json").read_text().replace('"lr": 0.25', '"lr": {"x": 1}')),
        lambda d: (d / "index.json").write_text("[" * 100000 + "]" * 100000),
    ],
    ids=["dtype", "missing-part", "truncated-part", "huge-step", "path", "setting", "nesting"],
)  # fmt: skip
def test_a_tampered_state_written_as_it_was_gathered_is_a_one_line_refusal(tmp_path, tamper):
    from slime_gb10.grpo.checkpoint import save

    run, _ = _streaming_run(tmp_path, 3)
    path = save(run)
    tamper(path / "policy_whole")
    with pytest.raises(
        CheckpointError, match=r"^cannot read checkpoint '.*policy_whole' as data: .+"
    ) as info:
        load_checkpoint(path)
    assert "\n" not in str(info.value)


STREAMED_SAVE_ON_TWO_RANKS = r"""
import sys, types, torch, torch.distributed as dist
from pathlib import Path
from slime_gb10.grpo.checkpoint import CheckpointError, rng_state, save
from slime_gb10.grpo.distributed import DistContext

dist.init_process_group("gloo")
rank = dist.get_rank()
out, mode = Path(sys.argv[1]), sys.argv[2]

def write_state(directory):  # the gathers every rank takes part in, then rank 0's write
    for _ in range(5):
        dist.all_reduce(torch.ones(1))
    if directory is None:
        return None
    if mode == "full":
        return OSError(28, "No space left on device")
    directory.mkdir()
    (directory / "index.json").write_text("{}")
    return None

run_dir = out / mode
if mode == "unwritable" and rank == 0:  # the checkpoint directory cannot be made
    run_dir.mkdir(parents=True)
    (run_dir / "checkpoints").write_text("a file where the checkpoints go")
dist.barrier()
run = types.SimpleNamespace(
    run_dir=run_dir, step=1, _boundary={"step": 1, "rng": rng_state()}, _last_checkpoint=None,
    backend=types.SimpleNamespace(sharded=False, streams_state=True, write_state=write_state, num_parameters=10),
    dist=DistContext(rank=rank, world_size=2, local_rank=rank, timeout_s=60),
    config=types.SimpleNamespace(output=types.SimpleNamespace(keep_checkpoints=2)))
try:
    save(run)
    result = "saved"
except CheckpointError as exc:
    result = str(exc)
(out / f"{mode}-{rank}.txt").write_text(result)
dist.barrier()
dist.destroy_process_group()
import os
os._exit(0)  # no interpreter finalization: test_tensor_parallel_collectives.py says why
"""


def test_a_failed_streamed_save_is_an_error_on_every_rank_not_a_hang(tmp_path, torchrun):
    """Rank 0 writes while every rank gathers: when its write fails (a full disk, a directory it
    cannot make) it still takes its part in every gather, then tells the others, and every rank
    raises the same one-line CheckpointError; nothing is left behind. Under gloo, on two ranks."""
    script = tmp_path / "streamed.py"
    script.write_text(STREAMED_SAVE_ON_TWO_RANKS)
    for mode in ("ok", "full", "unwritable"):
        run = torchrun(str(script), str(tmp_path), mode, ranks=2, timeout=120)
        assert run.returncode == 0, run.stderr[-3000:]
    assert [(tmp_path / f"ok-{r}.txt").read_text() for r in range(2)] == ["saved", "saved"]
    assert (tmp_path / "ok/checkpoints/step-000001/policy_whole/index.json").is_file()
    for mode, cause in (("full", "no space left on device"), ("unwritable", "cannot write checkpoint")):
        errors = [(tmp_path / f"{mode}-{r}.txt").read_text() for r in range(2)]
        assert errors[0] == errors[1] and cause in errors[0] and "\n" not in errors[0], errors
    assert list_checkpoints(tmp_path / "full") == []
