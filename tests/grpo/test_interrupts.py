"""One interrupt path for Ctrl-C (SIGINT), SIGTERM and SIGHUP over the whole `train` run (issue #41).

Each signal is sent at a defined state, from inside a patched trainer method (a rollout, the metrics
row of a step, the step-0 eval, the final model write), never after a sleep. Tests run the real
trainer on a random-init tiny model (SmolLM2's tokenizer, CPU), in-process or through the CLI.

SIGTERM and SIGHUP would kill the test process where nothing handles them, so :func:`guarded`
installs handlers that raise :class:`SignalNotHandled` instead: code that lets them through fails
the test rather than ending pytest.
"""

from __future__ import annotations

import errno
import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from slime_gb10.cli import main
from slime_gb10.grpo import rewards
from slime_gb10.grpo import trainer as trainer_module
from slime_gb10.grpo.checkpoint import list_checkpoints, load_checkpoint
from slime_gb10.grpo.config import build_config
from slime_gb10.grpo.interrupts import (
    SignalInterrupt,
    TrainingInterrupted,
    finish_step_before_interrupt,
    stop_on_signals,
)
from slime_gb10.grpo.models import write_random_model
from slime_gb10.grpo.trainer import GRPOTrainer


class SignalNotHandled(Exception):
    """SIGTERM or SIGHUP reached the test's own handler: the code under test did not handle it."""


def _not_handled(signum, frame):
    raise SignalNotHandled(signal.Signals(signum).name)


@pytest.fixture(autouse=True)
def guarded():
    previous = {s: signal.signal(s, _not_handled) for s in (signal.SIGTERM, signal.SIGHUP)}
    yield
    restored = {s: signal.getsignal(s) for s in previous}
    for s, handler in previous.items():
        signal.signal(s, handler)
    # whatever the code under test installed, it put the previous handlers back
    assert all(h is _not_handled for h in restored.values()), restored
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.fixture(autouse=True)
def register_reward(monkeypatch):
    monkeypatch.setitem(rewards.REWARDS, "contains_e", lambda completion, truth: float("e" in completion))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tokenizer):
    return write_random_model(
        tmp_path_factory.mktemp("tiny") / "model", tokenizer, seed=0, initializer_range=0.3
    )


def kill_self(signum):
    os.kill(os.getpid(), signum)


def interrupted(trainer) -> TrainingInterrupted:
    """``trainer.train()``'s TrainingInterrupted; anything else (a plain KeyboardInterrupt too)
    fails the test instead of stopping pytest."""
    try:
        trainer.train()
    except BaseException as exc:
        assert isinstance(exc, TrainingInterrupted), f"{type(exc).__name__}: {exc}"
        return exc
    raise AssertionError("train() was not interrupted")


def make_config(model_dir, out, **extra):
    overrides = {
        "model.name_or_path": str(model_dir),
        "output.dir": str(out),
        "data.reward": "contains_e",
        "data.eval_size": 0,
        "rollout.prompts_per_step": 4,
        "rollout.group_size": 4,
        "rollout.max_new_tokens": 1,
        "train.lr": 1e-2,
        "train.steps": 3,
        "train.deterministic": True,
        "eval.every": 0,
        "output.checkpoint_every": 0,  # the default: no checkpoint along the way
        "output.progress": False,
        "output.save_final_model": False,
        "backends.device": "cpu",
    }
    return build_config(overrides={**overrides, **extra})


def run(config, resume=False):
    trainer = GRPOTrainer(config)
    try:
        trainer.setup(resume=resume)
        history = trainer.train()
        return history, {k: v.clone() for k, v in trainer.backend.model.state_dict().items()}
    finally:
        trainer.close()


def without_timing(rows):
    def canonical(v):
        return None if isinstance(v, float) and math.isnan(v) else v

    return [{k: canonical(v) for k, v in row.items() if not k.endswith("_s")} for row in rows]


def invoke(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def cli_train(model_dir, out, *extra):
    return invoke(
        "train", "--model", model_dir, "--output", out, "--device", "cpu", "--steps", "2",
        "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "2", "--no-progress",
        "--eval-every", "0", "--set", "data.eval_size=0", *extra,
    )  # fmt: skip


def steps_of(run_dir):
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------ the mechanism (no model)
def test_sigterm_and_sighup_become_interrupts_and_the_handlers_come_back():
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        with pytest.raises(SignalInterrupt) as info, stop_on_signals():
            kill_self(signum)
        assert info.value.signum == signum and isinstance(info.value, KeyboardInterrupt)
    assert TrainingInterrupted(None, 3, signum=signal.SIGTERM).exit_code == 143
    assert TrainingInterrupted(None, 3, signum=signal.SIGHUP).exit_code == 129
    assert TrainingInterrupted(None, 3).exit_code == 130  # SIGINT unless told


def test_an_ignored_signal_stays_ignored():
    """``nohup slime-gb10 train``: a hang-up must not stop the run."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_on_signals():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            kill_self(signal.SIGHUP)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, _not_handled)


def test_a_step_holds_every_stop_signal_until_it_ends_and_a_second_stops_at_once():
    finished = []
    with pytest.raises(SignalInterrupt) as info, finish_step_before_interrupt():
        kill_self(signal.SIGTERM)
        finished.append(sum(range(1000)))  # runs: the signal is held
    assert finished and info.value.signum == signal.SIGTERM
    with pytest.raises(SignalInterrupt) as info, finish_step_before_interrupt():
        kill_self(signal.SIGHUP)
        kill_self(signal.SIGINT)  # the second one: raised here, at once
        finished.append("never")
    assert info.value.signum == signal.SIGHUP and finished[-1] != "never"


# ------------------------------------------------------------------ the trainer, in-process
@pytest.mark.slow
def test_sigterm_mid_loop_writes_a_checkpoint_and_resume_matches_a_straight_run(
    tiny_dir, tmp_path, monkeypatch
):
    config = make_config(tiny_dir, tmp_path / "run")
    trainer = GRPOTrainer(config)
    trainer.setup()
    real_generate = trainer.engine.generate
    calls = {"n": 0}

    def generate(prompts, params):
        calls["n"] += 1
        if calls["n"] == 2:  # step 2's rollout: the weights in memory are step 1's boundary
            kill_self(signal.SIGTERM)
        return real_generate(prompts, params)

    monkeypatch.setattr(trainer.engine, "generate", generate)
    exc = interrupted(trainer)
    trainer.close()
    assert exc.signum == signal.SIGTERM and exc.exit_code == 143
    assert exc.written and exc.step == 1 and exc.checkpoint.name == "step-000001"
    assert load_checkpoint(exc.checkpoint)[1]["step"] == 1

    resumed, resumed_weights = run(config, resume=True)
    full, full_weights = run(make_config(tiny_dir, tmp_path / "straight"))
    assert [row["step"] for row in resumed] == [2, 3]
    assert without_timing(resumed) == without_timing(full[1:])
    assert all(torch.equal(full_weights[k], resumed_weights[k]) for k in full_weights)


@pytest.mark.slow
def test_ctrl_c_during_the_final_model_write_keeps_the_final_step(tiny_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    config = make_config(tiny_dir, out, **{"train.steps": 2, "output.save_final_model": True})
    trainer = GRPOTrainer(config)
    trainer.setup()
    real_save = trainer.backend.save_pretrained

    def save_pretrained(directory, dtype=None):
        kill_self(signal.SIGINT)
        real_save(directory, dtype)

    monkeypatch.setattr(trainer.backend, "save_pretrained", save_pretrained)
    exc = interrupted(trainer)
    trainer.close()
    assert exc.step == 2 and exc.at_step and exc.checkpoint.name == "step-000002"
    assert [step for step, _ in list_checkpoints(out)] == [2]
    assert not (out / "final_model").exists()
    assert not [p.name for p in out.iterdir() if p.name.startswith(".final_model")]  # no temp left
    history, _ = run(config, resume=True)  # nothing left to train: writes final_model/
    assert history == [] and (out / "final_model" / "config.json").is_file()


# ------------------------------------------------------------------ through the CLI
@pytest.mark.slow
def test_sigterm_exits_143_naming_the_checkpoint_and_resume_finishes(tiny_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    real_step = GRPOTrainer.train_step
    calls = {"n": 0}

    def train_step(self):
        calls["n"] += 1
        if calls["n"] == 2:  # as step 2 begins
            kill_self(signal.SIGTERM)
        return real_step(self)

    monkeypatch.setattr(GRPOTrainer, "train_step", train_step)
    # keep_checkpoints=1: the final step's safety net must not prune SIGTERM's checkpoint
    result = cli_train(tiny_dir, out, "--steps", "3", "--set", "output.keep_checkpoints=1")
    assert result.exit_code == 143, result.output
    assert "SIGTERM" in result.output and "step-000001" in result.output
    assert f"--resume {out}" in result.output
    monkeypatch.undo()
    result = invoke("train", "--resume", out, "--device", "cpu", "--no-progress")
    assert result.exit_code == 0, result.output
    assert steps_of(out) == [1, 2, 3] and (out / "final_model").is_dir()
    # the final step's checkpoint, written before final_model/ as its safety net, is gone once
    # final_model/ is written (checkpoint_every is 0: the user asked for none); SIGTERM's stays
    assert not (out / "checkpoints" / "step-000003").exists()
    assert (out / "checkpoints" / "step-000001").is_dir()


@pytest.mark.slow
def test_sighup_during_a_step_lets_it_finish_and_exits_129(tiny_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    real_row = trainer_module.step_row

    def step_row(step, *args, **kwargs):
        if step == 2:  # step 2 is updated, its metrics row not yet logged
            kill_self(signal.SIGHUP)
        return real_row(step, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "step_row", step_row)
    result = cli_train(tiny_dir, out, "--steps", "3")
    assert result.exit_code == 129, result.output
    assert "SIGHUP" in result.output and "step-000002" in result.output
    assert steps_of(out) == [1, 2] and [s for s, _ in list_checkpoints(out)] == [2]


@pytest.mark.slow
def test_ctrl_c_during_the_step_0_eval_is_a_clean_stop_not_aborted(tiny_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    real_eval = trainer_module.eval_run

    def eval_run(run, *args, **kwargs):
        if run.step == 0:
            kill_self(signal.SIGINT)
        return real_eval(run, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "eval_run", eval_run)
    eval_flags = ("--eval-every", "1", "--set", "data.eval_size=2", "--set", "eval.num_prompts=2")
    result = cli_train(tiny_dir, out, "--steps", "1", *eval_flags)
    assert result.exit_code == 130, result.output
    assert "Aborted!" not in result.output and "Ctrl-C (SIGINT)" in result.output
    assert [s for s, _ in list_checkpoints(out)] == [0]  # the starting point, resumable
    monkeypatch.undo()
    result = invoke("train", "--resume", out, "--device", "cpu", "--no-progress")
    assert result.exit_code == 0, result.output
    assert steps_of(out) == [0, 1]


@pytest.mark.slow
def test_a_full_disk_at_the_final_write_is_one_line_and_keeps_the_final_step(tiny_dir, tmp_path, monkeypatch):
    from slime_gb10.grpo.backends.torch_backend import TorchPolicyBackend

    out = tmp_path / "run"

    def full(self, directory, dtype=None):
        (Path(directory) / "model.safetensors").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(TorchPolicyBackend, "save_pretrained", full)
    result = cli_train(tiny_dir, out)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), repr(result.exception)
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    assert "final_model" in errors[0] and "no space left on device" in errors[0]
    assert "step-000002" in errors[0] and f"--resume {out}" in errors[0]
    assert [s for s, _ in list_checkpoints(out)] == [2] and not (out / "final_model").exists()
    monkeypatch.undo()
    result = invoke("train", "--resume", out, "--device", "cpu", "--no-progress")
    assert result.exit_code == 0 and "nothing to do" in result.output, result.output
    assert (out / "final_model" / "config.json").is_file()


@pytest.mark.slow
def test_sft_stops_on_sigterm_like_ctrl_c(tiny_dir, tmp_path, monkeypatch):
    from slime_gb10.grpo import sft

    def run_sft(config, **kwargs):
        kill_self(signal.SIGTERM)
        raise AssertionError("SIGTERM did not interrupt")

    monkeypatch.setattr(sft, "run_sft", run_sft)
    result = invoke("sft", "--model", tiny_dir, "--output", tmp_path / "sft", "--device", "cpu")
    assert result.exit_code == 143, result.output
    assert "SIGTERM" in result.output and "--overwrite" in result.output


@pytest.mark.slow
def test_a_safety_net_the_disk_cannot_hold_still_leaves_the_final_model(tiny_dir, tmp_path, monkeypatch):
    """The checkpoint before final_model/ fails (a disk too full for 12 bytes a parameter): the
    smaller final model is still written, and the run succeeds."""
    from slime_gb10.grpo import checkpoint
    from slime_gb10.grpo.checkpoint import CheckpointError

    real_save = checkpoint.save

    def save(run, reason="periodic", prune=True):
        if reason == "final":
            raise CheckpointError("no space left on device (3 MiB free)")
        return real_save(run, reason, prune)

    monkeypatch.setattr(checkpoint, "save", save)
    out = tmp_path / "run"
    result = cli_train(tiny_dir, out)
    assert result.exit_code == 0, result.output
    assert (out / "final_model" / "config.json").is_file() and not (out / "checkpoints").exists()
