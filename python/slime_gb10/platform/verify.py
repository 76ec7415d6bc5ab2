"""``slime-gb10 verify`` (``nix run .#verify``): the one command a GB10 owner runs once.

It turns every claim that only a GB10 can settle into one Markdown report to paste into an issue:
machine facts, ``slime-gb10 doctor --json``, an ahead-of-time Triton compile for sm_121a, each
group of GPU tests (TransformerEngine NVFP4 against the reference, an sgl-kernel op, SGLang start /
logprobs / weight update, Megatron with the TE layer spec, the rest), one GRPO step with SGLang +
Megatron and one with the PyTorch pair, and the NVFP4 and GRPO benchmarks; then a pass/fail line
for each of the 15 GB10 blockers, decided by the steps and doctor checks that observe it.

Every step is a child process with a time limit (:func:`slime_gb10.platform.subproc.run`: the
whole process group is killed at the limit), so nothing hangs; a step that cannot apply here (no
GPU, a package not installed) is ``skip``, never ``pass``. The exit status is 1 if any step or
blocker failed. Steps that need the repository (its tests and benchmarks) take it from ``--repo``
(the flake passes its own source).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from slime_gb10.platform import subproc

Status = str  # "pass" | "fail" | "skip" | "timeout"


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    cmd: tuple[str, ...]
    timeout_s: float
    kind: str = "command"  # "command" | "pytest" | "doctor"
    needs_gpu: bool = False
    cwd: Path | None = None


@dataclass
class StepResult:
    name: str
    title: str
    status: Status
    seconds: float
    detail: str
    output: str = ""
    data: dict = field(default_factory=dict)


# The 15 blockers of slime's GB10 port (REFERENCE.md) and what observes each one here:
# ("step", name) is one of the steps below, ("doctor", name) one check of `slime-gb10 doctor`.
BLOCKERS: dict[int, tuple[str, tuple[tuple[str, str], ...]]] = {
    1: (
        "ptxas has no sm_121a",
        (("step", "triton-aot"), ("doctor", "triton_ptxas"), ("doctor", "triton_jit")),
    ),
    2: ("libnvrtc.so.12 (cu12 sgl-kernel)", (("doctor", "sgl_kernel"), ("step", "gpu-sgl-kernel"))),
    3: ("sgl-kernel built against another libtorch", (("doctor", "sgl_kernel"), ("step", "gpu-sgl-kernel"))),
    4: ("sgl-kernel without sm_12x code", (("doctor", "sgl_kernel"), ("step", "gpu-sgl-kernel"))),
    5: ("cicc OOM building sgl-kernel", (("doctor", "sgl_kernel"),)),
    6: ("cuDNN precompiled engines missing", (("doctor", "cudnn"), ("doctor", "transformer_engine"))),
    7: ("nvtx3 headers missing (TE)", (("doctor", "transformer_engine"),)),
    8: ("TE wants smXXXf family targets", (("doctor", "te_nvfp4"), ("step", "gpu-te-nvfp4"))),
    9: ("CMake < 4 rejects 120f", (("doctor", "transformer_engine"),)),
    10: ("cuda_profiler_api.h missing", (("doctor", "cuda_headers"), ("doctor", "transformer_engine"))),
    11: ("--help crash", (("step", "cli-help"),)),
    12: ("sglang-router x86_64 only", (("doctor", "sglang_router"),)),
    13: ("omegaconf vs antlr4 4.13", (("doctor", "antlr4_omegaconf"), ("step", "boxed-math"))),
    14: ("megatron.training not importable", (("doctor", "megatron_training"),)),
    15: ("tilelang libz3.so missing", (("doctor", "tilelang_z3"),)),
}

# math-verify is packaged by the flake (no nixpkgs has it) on nixpkgs' antlr4 runtime: one LaTeX
# answer right and one wrong through the reward itself (the parser pairing fails at import or parse).
_BOXED_MATH_CHECK = (
    "from slime_gb10.grpo.rewards import boxed_math_reward as reward; "
    r"assert reward(r'so \boxed{\frac{1}{2}}', '0.5') == 1.0; "
    r"assert reward(r'so \boxed{3}', '0.5') == 0.0; print('boxed_math: ok')"
)

# NVFP4 rollouts (issue #39) on the GB10: the run of step grpo-nvfp4 under NeMo-RL's mismatch gates.
_NVFP4_MISMATCH_CHECK = (
    "import sys; from slime_gb10.grpo.quantized import mismatch_verdict; "
    "passed, line = mismatch_verdict(sys.argv[1]); print(line); sys.exit(0 if passed else 1)"
)

_DOCTOR_STATUS = {"ok": "pass", "warn": "pass", "skip": "skip", "fail": "fail"}


def plan(repo: Path | None, work: Path, python: str = sys.executable, scale: float = 1.0) -> list[Step]:
    """Every step, in order. ``scale`` multiplies each time limit (a slow first JIT, a cold cache)."""
    py = (python,)
    cli = (*py, "-m", "slime_gb10.cli")

    def grpo_run(steps: int, prompts: int, group: int, new_tokens: int) -> tuple[str, ...]:
        """`slime-gb10 train` arguments of a short run: no evals, no final model, no progress bar."""
        return (
            "--steps", str(steps), "--prompts-per-step", str(prompts), "--group-size", str(group),
            "--max-new-tokens", str(new_tokens), "--no-progress",
            "--set", "eval.every=0", "--set", "output.save_final_model=false",
        )  # fmt: skip

    grpo = grpo_run(1, 2, 2, 16)
    steps = [
        Step("cli-help", "`slime-gb10 --help` and `train --help`", (*cli, "train", "--help"), 60),
        Step("doctor", "`slime-gb10 doctor --json`", (*cli, "doctor", "--json"), 600, kind="doctor"),
        Step(
            "triton-aot",
            "Triton compiles a kernel for sm_121a (no GPU needed)",
            (*py, "-m", "slime_gb10.platform.aot", "triton", "--arch", "121"),
            300,
        ),
        Step(
            "boxed-math",
            "the boxed_math reward: HF math-verify and its ANTLR parser in this environment",
            (*py, "-c", _BOXED_MATH_CHECK),
            120,
        ),
    ]
    if repo is not None:
        tests = {
            "gpu-te-nvfp4": (
                "TransformerEngine NVFP4 against the reference",
                "tests/nvfp4/test_te_backend.py",
            ),
            "gpu-sgl-kernel": ("an sgl-kernel op", "tests/platform/test_sgl_kernel_gpu.py"),
            "gpu-sglang": ("SGLang start, logprobs, weight update", "tests/grpo/test_sglang_gpu.py"),
            "gpu-megatron": ("Megatron-core (local and TE layer specs)", "tests/grpo/test_megatron_gpu.py"),
            "gpu-rest": ("the other GPU tests (Triton JIT, NVFP4 kernels, torch engine)", "tests"),
        }
        for name, (title, path) in tests.items():
            deselect = []
            if name == "gpu-rest":  # everything but the groups above
                deselect = [arg for _, p in tests.values() if p != "tests" for arg in ("--deselect", p)]
            steps.append(
                Step(
                    name,
                    title,
                    (*py, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", path, *deselect),
                    1800,
                    kind="pytest",
                    needs_gpu=True,
                    cwd=repo,
                )
            )
    steps += [
        Step(
            "grpo-sglang-megatron",
            "one GRPO step: SGLang rollouts + Megatron-core training",
            (
                *cli,
                "train",
                *grpo,
                "--rollout",
                "sglang",
                "--trainer",
                "megatron",
                "--output",
                str(work / "grpo-sglang-megatron"),
            ),
            1200,
            needs_gpu=True,
        ),
        Step(
            "grpo-torch-torch",
            "one GRPO step: PyTorch rollouts + PyTorch training",
            (
                *cli,
                "train",
                *grpo,
                "--rollout",
                "torch",
                "--trainer",
                "torch",
                "--output",
                str(work / "grpo-torch-torch"),
            ),
            900,
            needs_gpu=True,
        ),
        Step(
            "grpo-nvfp4",
            "30 GRPO steps with NVFP4 rollouts and NVFP4 QAT (PyTorch pair, the embedded model)",
            (
                *cli,
                "train",
                *grpo_run(30, 8, 8, 64),
                "--rollout",
                "torch",
                "--trainer",
                "torch",
                "--set",
                "rollout.weights=nvfp4",
                "--output",
                str(work / "grpo-nvfp4"),
            ),
            1800,
            needs_gpu=True,
        ),
        Step(
            "nvfp4-mismatch",
            "that run's rollout and trainer are one policy: KL < 0.003, median exp|dlogp| < 1.1",
            (*py, "-c", _NVFP4_MISMATCH_CHECK, str(work / "grpo-nvfp4")),
            120,
            needs_gpu=True,
        ),
        Step(
            "bench-decode",
            "the engine's decode from BF16 weights vs NVFP4 codes (`slime-gb10 bench decode`): where the "
            "codes pay on this device",
            (*cli, "bench", "decode", "--json", str(work / "bench-decode.json")),
            3600,
            needs_gpu=True,
        ),
        Step(
            "bench-nvfp4",
            "NVFP4 benchmark (`slime-gb10 bench nvfp4`)",
            (*cli, "bench", "nvfp4", "--json", str(work / "bench-nvfp4.json")),
            1800,
            needs_gpu=True,
        ),
    ]
    if repo is not None and (repo / "benchmarks" / "grpo" / "bench_grpo.py").is_file():
        steps.append(
            Step(
                "bench-grpo",
                "GRPO benchmark (benchmarks/grpo/bench_grpo.py, our trainer only)",
                (
                    *py,
                    str(repo / "benchmarks" / "grpo" / "bench_grpo.py"),
                    "--out",
                    str(work / "bench-grpo"),
                    "--steps",
                    "5",
                    "--skip-trl",
                ),
                1800,
                needs_gpu=True,
            )
        )
    return [Step(s.name, s.title, s.cmd, s.timeout_s * scale, s.kind, s.needs_gpu, s.cwd) for s in steps]


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _pytest_counts(output: str) -> dict[str, int]:
    last = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", line)]
    return (
        {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", last[-1])} if last else {}
    )


def run_step(step: Step, env: dict[str, str], have_gpu: bool) -> StepResult:
    """Run one step in a child process group with its time limit; never raises."""
    if step.needs_gpu and not have_gpu:
        return StepResult(step.name, step.title, "skip", 0.0, "no CUDA GPU visible")
    start = time.monotonic()
    try:
        done = subproc.run(list(step.cmd), step.timeout_s, env=env, cwd=step.cwd)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or "") + (exc.stderr or "")
        return StepResult(
            step.name,
            step.title,
            "timeout",
            time.monotonic() - start,
            f"ran past its {step.timeout_s:.0f} s limit and was killed",
            _tail(out),
        )
    except OSError as exc:
        return StepResult(step.name, step.title, "fail", time.monotonic() - start, f"cannot start: {exc}")
    seconds = time.monotonic() - start
    output = done.stdout + done.stderr
    if step.kind == "pytest":
        counts = _pytest_counts(output)
        ran = (
            counts.get("passed", 0)
            + counts.get("failed", 0)
            + counts.get("error", 0)
            + counts.get("errors", 0)
        )
        summary = ", ".join(f"{n} {k}" for k, n in counts.items()) or f"exit {done.returncode}"
        if done.returncode == 5 or (done.returncode == 0 and ran == 0):
            status = "skip"  # nothing could run here (no Blackwell, a package missing): not a pass
        else:
            status = "pass" if done.returncode == 0 else "fail"
        return StepResult(step.name, step.title, status, seconds, summary, _tail(output))
    if step.kind == "doctor":
        try:
            data = json.loads(done.stdout)
        except json.JSONDecodeError:
            return StepResult(
                step.name,
                step.title,
                "fail",
                seconds,
                f"no JSON report (exit {done.returncode})",
                _tail(output),
            )
        fails = [c["name"] for c in data.get("checks", []) if c.get("status") == "fail"]
        status = "fail" if fails else "pass"
        counts: dict[str, int] = {}
        for check in data.get("checks", []):
            counts[check.get("status", "?")] = counts.get(check.get("status", "?"), 0) + 1
        detail = ", ".join(f"{n} {k}" for k, n in counts.items()) + (
            f"; failing: {', '.join(fails)}" if fails else ""
        )
        return StepResult(step.name, step.title, status, seconds, detail, "", data)
    status = "pass" if done.returncode == 0 else "fail"
    lines = [x for x in output.splitlines() if x.strip()]
    detail = f"exit {done.returncode}" + (
        f": {lines[-1].strip()[:200]}" if lines and status == "fail" else ""
    )
    return StepResult(step.name, step.title, status, seconds, detail, _tail(output))


def blocker_verdicts(results: list[StepResult]) -> dict[int, tuple[Status, str]]:
    """Each blocker's status from the steps and doctor checks that observe it (fail wins; then pass;
    all skipped: skip) and which of them said so."""
    steps = {r.name: r for r in results}
    doctor = {c["name"]: c for c in (steps["doctor"].data.get("checks", []) if "doctor" in steps else [])}
    verdicts = {}
    for number, (_, sources) in BLOCKERS.items():
        seen = []
        for kind, name in sources:
            if kind == "step" and name in steps:
                status = {"timeout": "fail"}.get(steps[name].status, steps[name].status)
                seen.append((status, f"step {name}: {steps[name].status}"))
            elif kind == "doctor" and name in doctor:
                seen.append(
                    (
                        _DOCTOR_STATUS.get(doctor[name]["status"], "fail"),
                        f"doctor {name}: {doctor[name]['status']}",
                    )
                )
        statuses = {s for s, _ in seen}
        verdict = "fail" if "fail" in statuses else "pass" if "pass" in statuses else "skip"
        verdicts[number] = (verdict, "; ".join(w for _, w in seen) or "not observed")
    return verdicts


def machine_facts(env: dict[str, str], python: str) -> dict[str, str]:
    """What the report's reader needs first; each probe has a short time limit."""

    def out(cmd: list[str], limit: float = 20) -> str:
        if shutil.which(cmd[0]) is None:
            return f"({cmd[0]} not found)"
        try:
            done = subproc.run(cmd, limit, env=env)
        except (subprocess.TimeoutExpired, OSError) as exc:
            return f"({type(exc).__name__})"
        return (
            (done.stdout or done.stderr).strip().splitlines()[0]
            if (done.stdout or done.stderr).strip()
            else ""
        )

    os_release = ""
    if Path("/etc/os-release").is_file():
        match = re.search(r'^PRETTY_NAME="?([^"\n]*)', Path("/etc/os-release").read_text(), re.M)
        os_release = match.group(1) if match else ""
    features = out(["nix", "config", "show", "system-features"])
    if features.startswith("(") or "error" in features.lower():
        features = out(["nix", "show-config"])  # Nix < 2.19 has no `nix config show`
        features = next((x for x in features.splitlines() if x.startswith("system-features")), features)
    versions = out(
        [
            python,
            "-c",
            (
                "import importlib.metadata as m\n"
                "def v(n):\n    try:\n        return m.version(n)\n    except m.PackageNotFoundError:\n        return '-'\n"
                "print(', '.join(f'{n} {v(n)}' for n in ('slime-gb10', 'torch', 'triton', 'transformers', 'sglang',"
                " 'sgl-kernel', 'sglang-kernel', 'megatron-core', 'transformer-engine')))"
            ),
        ]
    )
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "system": f"{platform.machine()} {platform.system()} {platform.release()}",
        "os": os_release,
        "nix": out(["nix", "--version"]),
        "nix system-features": features,
        "GPU, driver, capability": out(
            ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"]
        ),
        "python packages": versions,
    }


def report(facts: dict[str, str], results: list[StepResult], verdicts: dict[int, tuple[Status, str]]) -> str:
    lines = ["# slime-gb10 verify", ""]
    lines += [f"- **{k}**: {v}" for k, v in facts.items()]
    lines += ["", "## Steps", "", "| step | what | status | time | detail |", "|---|---|---|---|---|"]
    for r in results:
        lines.append(
            f"| `{r.name}` | {r.title} | **{r.status}** | {r.seconds:.0f} s | {r.detail.replace('|', '/')} |"
        )
    lines += [
        "",
        "## The 15 GB10 blockers",
        "",
        "| # | blocker | status | observed by |",
        "|---|---|---|---|",
    ]
    for number, (status, why) in verdicts.items():
        lines.append(f"| {number} | {BLOCKERS[number][0]} | **{status}** | {why} |")
    failed = [r for r in results if r.status in ("fail", "timeout")]
    for r in failed:
        lines += ["", f"### `{r.name}`: {r.status}", "", "```", r.output or r.detail, "```"]
    bad = len(failed) + sum(1 for s, _ in verdicts.values() if s == "fail")
    lines += [
        "",
        f"**{'FAIL' if bad else 'PASS'}**: {sum(r.status == 'pass' for r in results)} steps passed, "
        f"{len(failed)} failed, {sum(r.status == 'skip' for r in results)} skipped; blockers: "
        + ", ".join(f"{s} {sum(v == s for v, _ in verdicts.values())}" for s in ("pass", "fail", "skip")),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="slime-gb10 verify", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--repo",
        type=Path,
        default=None,
        help="the slime-gb10 source tree (its tests/ and benchmarks/); default: the current "
        "directory when it is one",
    )
    parser.add_argument("--out", type=Path, default=Path("slime-gb10-verify.md"), help="the Markdown report")
    parser.add_argument("--only", action="append", default=[], help="run only these steps (repeatable)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="multiply every step's time limit")
    args = parser.parse_args(argv)
    repo = args.repo
    if (
        repo is None
        and (Path.cwd() / "tests" / "grpo").is_dir()
        and (Path.cwd() / "pyproject.toml").is_file()
    ):
        repo = Path.cwd()
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    python = sys.executable
    have_gpu = (
        shutil.which("nvidia-smi") is not None and subproc.run(["nvidia-smi", "-L"], 20).returncode == 0
    )
    with tempfile.TemporaryDirectory(prefix="slime-gb10-verify-") as tmp:
        steps = plan(repo, Path(tmp), python, args.time_scale)
        if args.only:
            unknown = set(args.only) - {s.name for s in steps}
            if unknown:
                parser.error(f"unknown step(s) {sorted(unknown)}; steps: {', '.join(s.name for s in steps)}")
            steps = [s for s in steps if s.name in args.only]
        facts = machine_facts(env, python)
        if repo is None:
            facts["note"] = "no --repo: the GPU test groups and the GRPO benchmark were not run"
        results = []
        for step in steps:
            print(f"[verify] {step.name}: {step.title} ...", file=sys.stderr, flush=True)
            result = run_step(step, env, have_gpu)
            print(
                f"[verify] {step.name}: {result.status} ({result.seconds:.0f} s) {result.detail}",
                file=sys.stderr,
            )
            results.append(result)
    verdicts = blocker_verdicts(results)
    text = report(facts, results, verdicts)
    from slime_gb10.utils.atomic import atomic_write_text

    atomic_write_text(args.out, text)
    print(text)
    print(f"report written to {args.out}", file=sys.stderr)
    failed = any(r.status in ("fail", "timeout") for r in results) or any(
        s == "fail" for s, _ in verdicts.values()
    )
    return 1 if failed else 0


@click.command(
    "verify",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def verify_command(args: tuple[str, ...]) -> None:
    """Check this machine end to end (GB10 blockers, GPU tests, GRPO steps, benchmarks); --help for more."""
    sys.exit(main(list(args)))


if __name__ == "__main__":
    sys.exit(main())
