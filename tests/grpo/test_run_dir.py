"""One run per directory: a fresh run never mixes into an old one, two processes never write one
run, a run that fails on bad input leaves nothing behind, one that died before its first checkpoint
is started over (not "resumed"), outputs follow the umask, and a checkpoint that carries code is
refused through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from slime_gb10.cli import main
from slime_gb10.grpo.models import write_random_model
from slime_gb10.grpo.rundir import RunDirectoryError, open_run_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tokenizer):
    return write_random_model(tmp_path_factory.mktemp("tiny") / "model", tokenizer, seed=0)


def invoke(*args):
    return CliRunner().invoke(main, list(args))


def assert_clean_error(result, *needles):
    """Exit 1 through click (SystemExit), one 'Error:' line naming the problem, no traceback."""
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    for needle in needles:
        assert needle in errors[0], errors[0]


def tiny_run(tiny_dir, out, *extra):
    return invoke(
        "train", "--model", str(tiny_dir), "--output", str(out), "--device", "cpu", "--steps", "2",
        "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "2", "--no-progress",
        "--set", "data.eval_size=0", "--checkpoint-every", "1", *extra,
    )  # fmt: skip


def steps_of(run):
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_fresh_run_into_a_used_directory_is_refused_then_overwritten(tmp_path, tiny_dir):
    run = tmp_path / "run"
    assert tiny_run(tiny_dir, run).exit_code == 0
    before = {p.name: p.stat().st_mtime_ns for p in (run / "checkpoints").iterdir()}
    config_before = (run / "config.yaml").read_text()
    result = tiny_run(tiny_dir, run, "--seed", "7")
    assert_clean_error(result, "already holds a run", f"--resume {run}", "--overwrite")
    # nothing of the old run was touched
    assert steps_of(run) == [1, 2] and (run / "config.yaml").read_text() == config_before
    assert {p.name: p.stat().st_mtime_ns for p in (run / "checkpoints").iterdir()} == before
    result = tiny_run(tiny_dir, run, "--seed", "7", "--overwrite")
    assert result.exit_code == 0, result.output
    assert steps_of(run) == [1, 2] and "seed: 7" in (run / "config.yaml").read_text()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000001", "step-000002"]
    assert_clean_error(invoke("train", "--resume", str(run), "--overwrite"), "--overwrite")


def test_a_run_that_died_before_its_first_checkpoint_is_started_over_not_resumed(
    tmp_path, tiny_dir, monkeypatch
):
    """Issue #41: a fresh run into it said "continue with --resume", and --resume then said "no
    checkpoint". Both now say it holds a run with no checkpoint and name --overwrite --output DIR."""
    from slime_gb10.grpo import rewards

    def broken(completion: str, truth: str) -> float:
        raise KeyError("no such field")

    monkeypatch.setitem(rewards.REWARDS, "broken", broken)
    run = tmp_path / "run"
    died = tiny_run(tiny_dir, run, "--reward", "broken", "--set", "data.max_failed_reward_steps=1")
    assert_clean_error(died, "reward broken failed")  # in step 1, before any checkpoint
    assert (run / "config.yaml").is_file() and not list((run / "checkpoints").glob("step-*"))
    config_before = (run / "config.yaml").read_text()
    fresh = tiny_run(tiny_dir, run)
    assert_clean_error(
        fresh, f"'{run}' already holds a run with no checkpoint", f"--overwrite --output {run}"
    )
    assert "--resume" not in fresh.output
    resumed = invoke("train", "--resume", str(run), "--no-progress")
    assert_clean_error(
        resumed, f"'{run}' holds a run with no checkpoint", f"`slime-gb10 train --overwrite --output {run}`"
    )
    assert (run / "config.yaml").read_text() == config_before  # neither touched the old run
    result = tiny_run(tiny_dir, run, "--overwrite")  # the advice works
    assert result.exit_code == 0, result.output
    assert steps_of(run) == [1, 2]


def test_two_processes_cannot_write_one_run(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from slime_gb10.grpo.rundir import open_run_dir; "
         f"r = open_run_dir({str(run)!r}); print('locked', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(
            RunDirectoryError, match=rf"in use by another slime-gb10 process \(pid {holder.pid}\)"
        ):
            open_run_dir(run)
    finally:
        holder.kill()
        holder.wait()
    open_run_dir(run).close()  # the kernel dropped the dead process's lock: no stale lock


def test_bad_input_leaves_no_output_directory(tmp_path, tiny_dir):
    out = tmp_path / "never"
    result = invoke("train", "--model", str(tiny_dir), "--output", str(out), "--device", "cpu",
                    "--data", str(tmp_path / "missing.jsonl"), "--no-progress")  # fmt: skip
    assert_clean_error(result, "missing.jsonl")
    assert not out.exists()
    result = invoke("train", "--model", str(tiny_dir), "--output", str(out), "--reward", "nosuch")
    assert_clean_error(result, "unknown reward 'nosuch'")
    assert not out.exists()


def test_outputs_follow_the_umask(tmp_path, tiny_dir):
    old = os.umask(0o022)
    try:
        run = tmp_path / "run"
        assert tiny_run(tiny_dir, run).exit_code == 0
    finally:
        os.umask(old)
    mode = lambda p: p.stat().st_mode & 0o777  # noqa: E731
    assert mode(run / "config.yaml") == 0o644
    assert mode(run / "checkpoints" / "step-000002") == 0o755
    assert mode(run / "final_model") == 0o755
    assert mode(run / "final_model" / "model.safetensors") == 0o644


def test_eval_flags_out_of_range_are_clean_errors(tiny_dir):
    for flag, value, key in [
        ("--k", "0", "eval.k"),
        ("--num-prompts", "0", "eval.num_prompts"),
        ("--max-new-tokens", "0", "eval.max_new_tokens"),
        ("--temperature", "-1", "eval.temperature"),
    ]:
        result = invoke("eval", "--model", str(tiny_dir), "--device", "cpu", flag, value)
        assert result.exit_code == 1 and isinstance(result.exception, SystemExit), (flag, result.output)
        assert key in result.output and "Traceback" not in result.output


def test_resume_problems_are_clean_errors(tmp_path, tiny_dir, monkeypatch):
    from slime_gb10.grpo import rewards

    # a reward a random-init model's samples differ on (arithmetic would score them all 0: no update)
    monkeypatch.setitem(rewards.REWARDS, "parity", lambda completion, truth: float(len(completion) % 2))
    run = tmp_path / "run"
    assert tiny_run(tiny_dir, run, "--reward", "parity").exit_code == 0
    # a different seed does not fit the data position saved in the checkpoint
    result = invoke("train", "--resume", str(run), "--steps", "3", "--seed", "5", "--no-progress")
    assert_clean_error(result, "does not fit this run", "seed")
    # a checkpoint directory is a valid --resume target; what came after it is discarded and
    # written anew (here with another sampling temperature: a different step 2)
    before = (run / "checkpoints" / "step-000002" / "policy.pt").read_bytes()
    result = invoke("train", "--resume", str(run / "checkpoints" / "step-000001"), "--steps", "2",
                    "--temperature", "0.3", "--no-progress")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert steps_of(run) == [1, 2]
    assert (run / "checkpoints" / "step-000002" / "policy.pt").read_bytes() != before


class _RunsCode:
    def __init__(self, sentinel):
        self.sentinel = str(sentinel)

    def __reduce__(self):
        return (os.system, (f"touch {self.sentinel}",))


def test_resume_from_a_checkpoint_that_carries_code_runs_nothing(tmp_path, tiny_dir):
    run = tmp_path / "run"
    assert tiny_run(tiny_dir, run, "--steps", "1").exit_code == 0
    sentinel = tmp_path / "pwned"
    checkpoint = run / "checkpoints" / "step-000001"
    state = torch.load(checkpoint / "trainer.pt", weights_only=True)
    torch.save({**state, "extra": _RunsCode(sentinel)}, checkpoint / "trainer.pt")
    result = invoke("train", "--resume", str(run), "--steps", "2", "--no-progress")
    assert_clean_error(result, "no readable checkpoint", "trainer.pt")
    assert not sentinel.exists()


def test_a_reward_failing_on_every_sample_stops_the_run(tmp_path, tiny_dir, monkeypatch):
    from slime_gb10.grpo import rewards

    def broken(completion: str, truth: str) -> float:
        raise KeyError("no such field")

    def exploding(completion: str, truth: str) -> float:
        return 1e39

    monkeypatch.setitem(rewards.REWARDS, "broken", broken)
    monkeypatch.setitem(rewards.REWARDS, "exploding", exploding)
    result = tiny_run(tiny_dir, tmp_path / "a", "--reward", "broken", "--steps", "10")
    assert_clean_error(result, "reward broken failed on every sample for 3 steps in a row")
    assert steps_of(tmp_path / "a") == [1, 2]  # the third all-failed step stops before its update
    result = tiny_run(tiny_dir, tmp_path / "b", "--reward", "exploding")
    assert_clean_error(result, "reward exploding returned 1e+39")


def test_a_missing_column_names_the_flags_that_exist(tmp_path, tiny_dir):
    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "What is 1 + 1?", "label": "2"}\n')
    result = invoke("train", "--model", str(tiny_dir), "--output", str(tmp_path / "r"), "--data", str(path))
    assert_clean_error(result, "--set data.prompt_key=COLUMN")
    assert "--prompt-key" not in result.output


def test_each_eval_is_logged_as_it_comes(tmp_path, tiny_dir, caplog):
    with caplog.at_level("INFO", logger="slime_gb10.grpo.trainer"):
        result = tiny_run(tiny_dir, tmp_path / "r", "--eval-every", "1", "--set", "data.eval_size=2",
                          "--set", "eval.num_prompts=2")  # fmt: skip
    assert result.exit_code == 0, result.output
    logged = [r.getMessage() for r in caplog.records if " eval: " in r.getMessage()]
    assert [m.split(" eval:")[0] for m in logged] == ["step 0", "step 1", "step 2"]
    assert "pass@1" in logged[-1] and "held-out pass@1 (greedy, 2 prompts): step 0" in result.output
