"""The doctor's framework: a check's result and context, the registry, a time-limited child
runner, running every check with a deadline, and the text and JSON reports."""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from slime_gb10 import __version__
from slime_gb10.platform import subproc
from slime_gb10.platform.devices import is_gb10, is_sm12x
from slime_gb10.platform.fixes import AppliedFix, apply_runtime_fixes
from slime_gb10.platform.probe import Probe, run_probe

Status = Literal["ok", "warn", "fail", "skip"]
STATUSES: tuple[Status, ...] = ("ok", "warn", "fail", "skip")
DEFAULT_TIMEOUT_S = 60.0

TORCH_CU130 = "pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu130"
MIN_PYTHON = (3, 11)


@dataclass
class CheckResult:
    name: str
    status: Status
    reason: str
    fix: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    # One constructor per status: what every check returns.
    @classmethod
    def ok(cls, name: str, reason: str, **details) -> CheckResult:
        return cls(name, "ok", reason, None, details)

    @classmethod
    def skip(cls, name: str, reason: str, **details) -> CheckResult:
        return cls(name, "skip", reason, None, details)

    @classmethod
    def warn(cls, name: str, reason: str, fix: str, **details) -> CheckResult:
        return cls(name, "warn", reason, fix, details)

    @classmethod
    def fail(cls, name: str, reason: str, fix: str, **details) -> CheckResult:
        return cls(name, "fail", reason, fix, details)

    @classmethod
    def ok_unless(cls, name: str, reason: str, caveat: str | None, fix: str, **details) -> CheckResult:
        """``ok`` with ``reason``; where there is a ``caveat``, a warning ``reason: caveat`` with ``fix``
        (a check that passed, but not as well as it could here)."""
        if caveat:
            return cls.warn(name, f"{reason}: {caveat}", fix, **details)
        return cls.ok(name, reason, **details)


@dataclass
class DoctorContext:
    """What checks share: the time limit, the torch/CUDA probe (run once), the fixes applied."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    probe: Probe = field(default_factory=Probe)
    fixes: list[AppliedFix] = field(default_factory=list)
    fixes_disabled: bool = False
    ptxas_arch: str | None = None  # --arch: check Triton's ptxas for this arch even without a GPU
    grace_s: float = 15.0  # a check's thread gets timeout_s + grace_s before it is reported as hung
    cache: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def gpu(self) -> bool:
        return self.probe.gpu

    @property
    def device(self) -> dict[str, Any]:
        return self.probe.data.get("device", {})

    @property
    def capability(self) -> tuple[int, int]:
        cap = self.device.get("capability", (0, 0))
        return int(cap[0]), int(cap[1])

    @property
    def gb10(self) -> bool:
        return self.gpu and is_gb10(self.device.get("name", ""), self.capability)

    @property
    def sm12x(self) -> bool:
        return self.gpu and is_sm12x(self.capability)

    @property
    def cuda13(self) -> bool:
        return str(self.probe.data.get("torch_cuda") or "").startswith("13")

    def no_gpu_reason(self) -> str:
        if self.probe.error:
            return f"no GPU information: {self.probe.error}"
        data = self.probe.data
        if not data.get("torch_importable"):
            return "torch is not importable"
        if data.get("torch_cuda") is None:
            return f"torch {data.get('torch_version')} is a CPU-only build"
        why = (
            data.get("cuda_error")
            or "; ".join(data.get("cuda_warnings") or [])
            or ("torch.cuda.is_available() is False")
        )
        return f"no CUDA GPU visible ({why})"


CheckFn = Callable[[DoctorContext], CheckResult]


@dataclass(frozen=True)
class Check:
    name: str
    fn: CheckFn
    gpu: bool  # skipped automatically when no GPU is visible
    help: str
    before: str | None = None  # the check this one is reported just before (see in_report_order)


CHECKS: list[Check] = []


def register_check(name: str, *, gpu: bool = False, help: str = "", before: str | None = None):
    """Decorator: add ``fn(ctx) -> CheckResult`` to the registry (at the end, or before ``before``)."""

    def decorate(fn: CheckFn) -> CheckFn:
        if any(check.name == name for check in CHECKS):
            raise ValueError(f"a doctor check named {name!r} is already registered")
        check = Check(name, fn, gpu, help or (fn.__doc__ or "").strip().splitlines()[0], before)
        names = [c.name for c in CHECKS]
        CHECKS.insert(names.index(before) if before in names else len(CHECKS), check)
        return fn

    return decorate


def in_report_order(checks: list[Check], modules: list[str]) -> list[Check]:
    """``checks`` as the report lists them, whatever order their modules were imported in: those of
    ``modules[0]`` in registration order, then each later module's, each placed just before the
    check it names in ``before`` (at the end when it names none or one not there); checks of any
    other module come last."""

    def of(module: str) -> list[Check]:
        return [c for c in checks if c.fn.__module__ == module]

    ordered = of(modules[0])
    for module in modules[1:]:
        for check in of(module):
            names = [c.name for c in ordered]
            ordered.insert(names.index(check.before) if check.before in names else len(ordered), check)
    return ordered + [c for c in checks if c not in ordered]


# --- running code in a child with a time limit ---------------------------------------------------


@dataclass
class ChildResult:
    returncode: int | None  # None: timed out
    stdout: str
    stderr: str
    data: dict[str, Any] | None  # the last JSON line on stdout

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def error_line(self) -> str:
        lines = [line.strip() for line in self.stderr.splitlines() if line.strip()]
        for line in reversed(lines):
            if re.match(r"^[\w.]+(Error|Exception|Exit)\b|^[\w.]+: ", line) and not line.startswith("  "):
                return line[:400]
        return (lines[-1] if lines else "(no output)")[:400]

    def how_it_ended(self) -> str:
        if self.timed_out:
            return "ran past its time limit and was killed"
        if self.returncode < 0:
            return f"was killed by signal {-self.returncode}"
        return f"exited {self.returncode}: {self.error_line()}"

    def failed(
        self, check: str, what: str, fix: str, *, warn: bool = False, then: str = "", **details
    ) -> CheckResult | None:
        """None when the probe printed its JSON line; else the check's failure (a warning with
        ``warn``): "``what`` <how the child ended>``then``", with ``fix``."""
        if self.data is not None:
            return None
        make = CheckResult.warn if warn else CheckResult.fail
        return make(check, f"{what} {self.how_it_ended()}{then}", fix, **details)


def run_child_module(
    module: str, timeout_s: float, env: dict[str, str] | None = None, args: tuple[str, ...] = ()
) -> ChildResult:
    """Run ``python -m module *args`` in a fresh interpreter (a probe that is a real module: see
    :mod:`slime_gb10.platform.probes`)."""
    return _run_child([sys.executable, "-m", module, *args], timeout_s, env)


def _run_child(
    argv: list[str], timeout_s: float, env: dict[str, str] | None, cwd: str | None = None
) -> ChildResult:
    try:
        proc = subproc.run(argv, timeout_s, env=env if env is not None else os.environ.copy(), cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        return ChildResult(None, exc.stdout or "", exc.stderr or "", None)
    data = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                data = json.loads(line)
            break
    return ChildResult(proc.returncode, proc.stdout, proc.stderr, data)


def dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def installed(module: str) -> bool:
    """Whether ``module`` can be found, WITHOUT importing anything in the doctor's process.

    ``importlib.util.find_spec("megatron.core")`` imports ``megatron`` first, and an optional
    package whose import crashes (a segfaulting extension) would take the doctor down with it. So
    only the top-level name goes through ``find_spec`` (which imports nothing for a top-level
    name) and each submodule is looked up on its parent's search path; every real import of an
    optional package happens in a child (``run_child_module``).
    """
    import importlib.machinery

    parts = module.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
        for part in parts[1:]:
            if spec is None or spec.submodule_search_locations is None:
                return False
            spec = importlib.machinery.PathFinder.find_spec(
                f"{spec.name}.{part}", list(spec.submodule_search_locations)
            )
        return spec is not None
    except (ImportError, ValueError):
        return False


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


# --- running -------------------------------------------------------------------------------------


def _run_one(check: Check, ctx: DoctorContext) -> CheckResult:
    if check.gpu and not ctx.gpu:
        return CheckResult.skip(check.name, f"{ctx.no_gpu_reason()}: GPU check skipped")
    start = time.monotonic()
    try:
        result = check.fn(ctx)
    except Exception as exc:  # a bug in a check must not hide the others
        return CheckResult.fail(
            check.name,
            f"the check itself crashed: {type(exc).__name__}: {exc}",
            "report this as a slime-gb10 bug with the output of `slime-gb10 doctor --json`",
        )
    result.name = check.name
    result.details.setdefault("seconds", round(time.monotonic() - start, 2))
    return result


def run_checks(
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    apply_fixes: bool = True,
    disable_fixes: tuple[str, ...] = (),
    checks: list[Check] | None = None,
    probe: Probe | None = None,
) -> list[CheckResult]:
    """Run every registered check (in parallel threads) and return the results in registry order.

    Each check gets ``timeout_s`` for its child processes; a check still running after
    ``timeout_s + 15`` seconds is reported as ``fail`` and abandoned (its thread is a daemon).
    """
    ctx = doctor_context(timeout_s, apply_fixes=apply_fixes, disable_fixes=disable_fixes, probe=probe)
    return run_registered(ctx, checks if checks is not None else CHECKS)


def doctor_context(
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    apply_fixes: bool = True,
    disable_fixes: tuple[str, ...] = (),
    probe: Probe | None = None,
) -> DoctorContext:
    ctx = DoctorContext(timeout_s=timeout_s, fixes_disabled=not apply_fixes)
    ctx.probe = probe if probe is not None else run_probe(timeout_s=timeout_s)
    if apply_fixes:
        ctx.fixes = apply_runtime_fixes(
            disable=disable_fixes, device=ctx.probe.facts(), timeout_s=min(timeout_s, 30)
        )
    return ctx


def run_registered(ctx: DoctorContext, checks: list[Check]) -> list[CheckResult]:
    results: dict[str, CheckResult] = {}
    threads: list[tuple[Check, threading.Thread]] = []
    for check in checks:

        def target(check: Check = check) -> None:
            results[check.name] = _run_one(check, ctx)

        thread = threading.Thread(target=target, name=f"doctor-{check.name}", daemon=True)
        thread.start()
        threads.append((check, thread))
    limit = ctx.timeout_s + ctx.grace_s
    deadline = time.monotonic() + limit
    out = []
    for check, thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if check.name in results:
            out.append(results[check.name])
        else:
            out.append(
                CheckResult.fail(
                    check.name,
                    f"did not finish within {limit:g} s",
                    "run `slime-gb10 doctor --timeout 300` once to tell a slow machine from a hang",
                )
            )
    return out


def summarize(results: list[CheckResult]) -> dict[str, int]:
    return {status: sum(r.status == status for r in results) for status in STATUSES}


def format_text(results: list[CheckResult], ctx: DoctorContext) -> str:
    width = max((len(r.name) for r in results), default=10)
    lines = [
        f"slime-gb10 {__version__} doctor — Python {platform.python_version()} on {platform.machine()}",
    ]
    for r in results:
        lines.append(f"{r.status:<4}  {r.name:<{width}}  {r.reason}")
        if r.status != "ok" and r.fix:
            lines.append(f"{'':<4}  {'':<{width}}  fix: {r.fix}")
    counts = summarize(results)
    verdict = "FAIL" if counts["fail"] else "OK"
    tail = "" if ctx.gpu else f" — no GPU: {ctx.no_gpu_reason()}; GPU checks skipped"
    lines.append(
        f"summary: {verdict}: {counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail, "
        f"{counts['skip']} skip{tail}"
    )
    return "\n".join(lines)


def report_json(results: list[CheckResult], ctx: DoctorContext) -> dict[str, Any]:
    counts = summarize(results)
    return {
        "slime_gb10_version": __version__,
        "ok": counts["fail"] == 0,
        "summary": counts,
        "gpu": ctx.device if ctx.gpu else None,
        "no_gpu_reason": None if ctx.gpu else ctx.no_gpu_reason(),
        "fixes": [asdict(f) for f in ctx.fixes],
        "checks": [asdict(r) for r in results],
    }
