"""`slime-gb10 verify`: every step is time-limited, nothing that could not run counts as a pass, each
blocker is decided by what observes it, and the report is one Markdown file (run for real on this
CPU machine: the GPU steps skip, saying why)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from slime_gb10.platform import subproc, verify

ROOT = Path(__file__).resolve().parents[2]


def test_a_hanging_step_is_killed_at_its_limit_with_its_children():
    step = verify.Step("hang", "a tool that hangs", ("sh", "-c", "sleep 100 & echo $!; sleep 100"), 1.0)
    start = time.monotonic()
    result = verify.run_step(step, dict(os.environ), have_gpu=False)
    assert result.status == "timeout" and time.monotonic() - start < 10
    child = int(result.output.split()[0])
    assert (
        not Path(f"/proc/{child}").exists()
        or "Z" in Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1][:3]
    )


def test_the_step_returns_only_once_its_process_group_has_stopped(monkeypatch):
    """SIGKILL is delivered asynchronously (under load, a killed member can still run for a while
    after kill() returns: issue #41 saw the test above fail on two busy cores). Simulated here by a
    kill that reaches the group's other members 0.3 s after the leader: run_step must not return
    while a member of the group still runs."""
    real_killpg = os.killpg

    def late_killpg(pgid, sig):
        if sig == signal.SIGKILL:  # the leader at once, the rest of its group 0.3 s later
            os.kill(pgid, sig)
            threading.Timer(0.3, real_killpg, (pgid, sig)).start()
        else:
            real_killpg(pgid, sig)

    monkeypatch.setattr(subproc.os, "killpg", late_killpg)
    # once the PID is printed no member holds the output pipes, so draining them waits for nothing
    cmd = ("sh", "-c", "sleep 100 >/dev/null 2>&1 & echo $!; exec sleep 100 >/dev/null 2>&1")
    result = verify.run_step(
        verify.Step("hang", "a tool that hangs", cmd, 0.5), dict(os.environ), have_gpu=False
    )
    assert result.status == "timeout"
    child = int(result.output.split()[0])
    assert (
        not Path(f"/proc/{child}").exists()
        or "Z" in Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1][:3]
    )


def test_pytest_steps_that_ran_nothing_are_skips_not_passes(tmp_path):
    (tmp_path / "test_x.py").write_text(
        "import pytest\n@pytest.mark.skip(reason='no Blackwell')\ndef test_a():\n    pass\n"
        "def test_b():\n    assert False\n"
    )
    base = (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_x.py"))
    skipped = verify.run_step(
        verify.Step("s", "s", (*base, "-k", "test_a"), 120, kind="pytest"), dict(os.environ), True
    )
    assert skipped.status == "skip" and "1 skipped" in skipped.detail
    failed = verify.run_step(
        verify.Step("f", "f", (*base, "-k", "test_b"), 120, kind="pytest"), dict(os.environ), True
    )
    assert failed.status == "fail" and "1 failed" in failed.detail
    gpu = verify.Step("g", "g", base, 120, kind="pytest", needs_gpu=True)
    assert verify.run_step(gpu, dict(os.environ), have_gpu=False).status == "skip"


def test_blockers_follow_the_steps_and_doctor_checks_that_observe_them():
    doctor = verify.StepResult("doctor", "doctor", "fail", 1.0, "", data={"checks": [
        {"name": "triton_ptxas", "status": "ok"}, {"name": "triton_jit", "status": "skip"},
        {"name": "sgl_kernel", "status": "fail"}, {"name": "antlr4_omegaconf", "status": "warn"},
    ]})  # fmt: skip
    results = [
        doctor,
        verify.StepResult("triton-aot", "t", "pass", 1.0, ""),
        verify.StepResult("gpu-sgl-kernel", "s", "skip", 0.0, ""),
        verify.StepResult("cli-help", "c", "timeout", 60.0, ""),
    ]
    verdicts = verify.blocker_verdicts(results)
    assert set(verdicts) == set(range(1, 16))
    assert verdicts[1][0] == "pass"  # aot pass + doctor ok; the skipped JIT check does not fail it
    assert verdicts[2][0] == verdicts[3][0] == verdicts[4][0] == verdicts[5][0] == "fail"  # doctor sgl_kernel
    assert verdicts[11][0] == "fail"  # a timed-out --help is a failure
    assert verdicts[13][0] == "pass" and verdicts[15] == ("skip", "not observed")


def test_the_report_of_a_run_on_this_cpu_machine(tmp_path, capsys):
    out = tmp_path / "report.md"
    rc = verify.main(["--repo", str(ROOT), "--out", str(out), "--only", "cli-help", "--only", "doctor",
                      "--only", "gpu-te-nvfp4", "--only", "grpo-torch-torch", "--only", "boxed-math"])  # fmt: skip
    text = out.read_text()
    doctor_row = next(line for line in text.splitlines() if line.startswith("| `doctor` |"))
    doctor_failed = "**fail**" in doctor_row  # e.g. sglang installed without its dependencies (CI)
    assert rc == (1 if doctor_failed else 0), text
    assert " ok" in doctor_row and " skip" in doctor_row  # the doctor's own counts, from its JSON
    assert "| `cli-help` |" in text and "**pass**" in text
    boxed = next(line for line in text.splitlines() if line.startswith("| `boxed-math` |"))
    assert "**pass**" in boxed  # math-verify and its ANTLR parser, through the reward itself
    assert "| `gpu-te-nvfp4` |" in text and "no CUDA GPU visible" in text
    rows = [
        line for line in text.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()
    ]
    assert len(rows) == 15
    assert "| 11 | --help crash | **pass** |" in text
    for fact in (
        "date",
        "system",
        "nix",
        "nix system-features",
        "GPU, driver, capability",
        "python packages",
    ):
        assert f"- **{fact}**:" in text
    assert text.rstrip().splitlines()[-1].startswith("**FAIL**" if doctor_failed else "**PASS**")
    assert "report written to" in capsys.readouterr().err


def test_an_unknown_step_is_a_usage_error(tmp_path):
    import pytest

    with pytest.raises(SystemExit) as info:
        verify.main(["--only", "nosuch", "--out", str(tmp_path / "r.md")])
    assert info.value.code == 2


def test_the_nvfp4_steps_run_a_short_nvfp4_training_and_gate_its_mismatch(tmp_path):
    """grpo-nvfp4 trains with NVFP4 rollouts into a folder; nvfp4-mismatch reads that folder's
    metrics and exits 1 outside NeMo-RL's gates (here on hand-written metrics, as on a GB10)."""
    import json
    import subprocess
    import sys

    steps = {s.name: s for s in verify.plan(None, tmp_path)}
    run, check = steps["grpo-nvfp4"], steps["nvfp4-mismatch"]
    assert run.needs_gpu and check.needs_gpu
    assert "rollout.weights=nvfp4" in run.cmd and str(tmp_path / "grpo-nvfp4") in run.cmd
    assert check.cmd[-1] == str(tmp_path / "grpo-nvfp4")
    names = list(steps)
    assert names.index("grpo-nvfp4") + 1 == names.index("nvfp4-mismatch")

    def gate(k3: float) -> subprocess.CompletedProcess:
        folder = tmp_path / "grpo-nvfp4"
        folder.mkdir(exist_ok=True)
        rows = [{"step": i, "mismatch_k3": k3, "mismatch_exp_abs_median": 1.0} for i in range(1, 5)]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return subprocess.run([sys.executable, *check.cmd[1:]], capture_output=True, text=True, timeout=60)

    good, bad = gate(0.001), gate(0.01)
    assert good.returncode == 0 and good.stdout.rstrip().endswith("pass"), good
    assert bad.returncode == 1 and bad.stdout.rstrip().endswith("FAIL"), bad
