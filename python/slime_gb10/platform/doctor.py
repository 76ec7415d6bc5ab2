"""``slime-gb10 doctor``: check this machine's GPU stack, one line per check, with the exact fix.

Checks are a registry (:data:`CHECKS`, an ordered list; add one with :func:`register_check`). Each
returns a :class:`CheckResult` with status ``ok`` / ``warn`` / ``fail`` / ``skip``. Anything that may
hang or crash (CUDA init, Triton JIT, ptxas, cuobjdump, importing sglang or TransformerEngine) runs
in a child process with a time limit, and every check runs in its own thread with a deadline, so a
segfault or a hang becomes a ``fail`` line, never a hung doctor. Exit status 1 only if a check fails.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import click

from slime_gb10 import __version__
from slime_gb10.platform import binaries, subproc
from slime_gb10.platform.devices import GB10, GB10_MIN_DRIVER, is_gb10, is_sm12x, lookup_peaks, sm_arch
from slime_gb10.platform.fixes import AppliedFix, apply_runtime_fixes
from slime_gb10.platform.probe import Probe, run_probe
from slime_gb10.platform.ptxas import FIX_POINT_TRITON, cuda_home, probe_ptxas, triton_ptxas

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


CHECKS: list[Check] = []


def register_check(name: str, *, gpu: bool = False, help: str = "", before: str | None = None):
    """Decorator: add ``fn(ctx) -> CheckResult`` to the registry (at the end, or before ``before``)."""

    def decorate(fn: CheckFn) -> CheckFn:
        if any(check.name == name for check in CHECKS):
            raise ValueError(f"a doctor check named {name!r} is already registered")
        check = Check(name, fn, gpu, help or (fn.__doc__ or "").strip().splitlines()[0])
        names = [c.name for c in CHECKS]
        CHECKS.insert(names.index(before) if before in names else len(CHECKS), check)
        return fn

    return decorate


def _ok(name, reason, **details) -> CheckResult:
    return CheckResult(name, "ok", reason, None, details)


def _skip(name, reason, **details) -> CheckResult:
    return CheckResult(name, "skip", reason, None, details)


def _warn(name, reason, fix, **details) -> CheckResult:
    return CheckResult(name, "warn", reason, fix, details)


def _fail(name, reason, fix, **details) -> CheckResult:
    return CheckResult(name, "fail", reason, fix, details)


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


def run_child_python(code: str, timeout_s: float, env: dict[str, str] | None = None) -> ChildResult:
    """Run ``code`` as a script file (Triton's JIT needs real source) in a fresh interpreter."""
    with tempfile.TemporaryDirectory(prefix="slime-gb10-doctor-") as tmp:
        script = Path(tmp, "check.py")
        script.write_text(textwrap.dedent(code))
        try:
            proc = subproc.run(
                [sys.executable, str(script)],
                timeout_s,
                env=env if env is not None else os.environ.copy(),
                cwd=tmp,
            )
        except subprocess.TimeoutExpired as exc:
            return ChildResult(None, exc.stdout or "", exc.stderr or "", None)
    data = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                data = json.loads(line)
            break
    return ChildResult(proc.returncode, proc.stdout, proc.stderr, data)


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _installed(module: str) -> bool:
    """Whether ``module`` can be found, WITHOUT importing anything in the doctor's process.

    ``importlib.util.find_spec("megatron.core")`` imports ``megatron`` first, and an optional
    package whose import crashes (a segfaulting extension) would take the doctor down with it. So
    only the top-level name goes through ``find_spec`` (which imports nothing for a top-level
    name) and each submodule is looked up on its parent's search path; every real import of an
    optional package happens in a child (``run_child_python``).
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


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


# --- checks: the machine -------------------------------------------------------------------------


@register_check("platform")
def check_platform(ctx: DoctorContext) -> CheckResult:
    """CPU architecture and OS (DGX Spark is aarch64 Linux)."""
    machine, system = platform.machine(), platform.system()
    details = {"machine": machine, "system": system, "release": platform.release()}
    if system != "Linux":
        return _warn(
            "platform", f"{system} {machine}: only Linux is supported", "run on Linux (DGX OS)", **details
        )
    if machine == "aarch64":
        return _ok("platform", "Linux aarch64 (as on DGX Spark)", **details)
    if machine == "x86_64":
        return _ok("platform", "Linux x86_64 (fine for development; DGX Spark is aarch64)", **details)
    return _warn("platform", f"Linux {machine}: untested", "use aarch64 (DGX Spark) or x86_64", **details)


@register_check("python")
def check_python(ctx: DoctorContext) -> CheckResult:
    """Python version (3.11+)."""
    version = platform.python_version()
    if sys.version_info[:2] < MIN_PYTHON:
        return _fail(
            "python", f"Python {version} is too old", "use Python 3.11 or newer", executable=sys.executable
        )
    return _ok("python", f"Python {version} ({sys.executable})", version=version)


@register_check("torch")
def check_torch(ctx: DoctorContext) -> CheckResult:
    """torch version and the CUDA it was built with."""
    data = ctx.probe.data
    if ctx.probe.error:
        return _fail(
            "torch", ctx.probe.error, f"check that `{sys.executable} -c 'import torch'` works; {TORCH_CU130}"
        )
    if not data.get("torch_importable"):
        return _fail("torch", f"torch is not importable: {data.get('torch_error')}", TORCH_CU130)
    version, cuda = data["torch_version"], data.get("torch_cuda")
    details = {"version": version, "cuda": cuda, "hip": data.get("torch_hip")}
    if cuda is None:
        return _warn(
            "torch", f"torch {version} is a CPU-only build: no GPU work possible", TORCH_CU130, **details
        )
    if _version_tuple(version) < (2, 9):
        return _warn("torch", f"torch {version} (CUDA {cuda}) is older than 2.9", TORCH_CU130, **details)
    return _ok("torch", f"torch {version}, built with CUDA {cuda}", **details)


@register_check("gpu")
def check_gpu(ctx: DoctorContext) -> CheckResult:
    """A CUDA GPU is visible (otherwise the GPU checks are skipped)."""
    if ctx.gpu:
        dev = ctx.device
        return _ok(
            "gpu",
            f"{dev['name']} ({sm_arch(ctx.capability)}, {dev['sm_count']} SMs, "
            f"{dev['total_memory'] / 2**30:.1f} GiB), {ctx.probe.data.get('device_count', 1)} device(s)",
            device=dev,
        )
    reason = ctx.no_gpu_reason()
    warnings = " ".join(ctx.probe.data.get("cuda_warnings") or [])
    if re.search(r"driver .*too old", warnings, flags=re.I):
        return _fail(
            "gpu",
            reason,
            f"install an NVIDIA driver that supports torch's CUDA version (GB10: {GB10['minDriverVersion']} or newer)",
        )
    return _skip("gpu", f"{reason}: the GPU checks are skipped")


def _nvidia_smi(ctx: DoctorContext) -> tuple[str | None, str]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, "nvidia-smi not on PATH"
    try:
        proc = subproc.run(
            [
                smi,
                "--query-gpu=driver_version",
                "--format=csv,noheader",
                f"--id={ctx.device.get('index', 0)}",
            ],
            min(ctx.timeout_s, 30),
        )
    except subprocess.TimeoutExpired:
        return None, "nvidia-smi ran past its time limit"
    except OSError as exc:
        return None, f"cannot run nvidia-smi: {exc}"
    line = proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else ""
    if proc.returncode != 0 or not re.match(r"^\d+\.\d+", line):
        return None, f"nvidia-smi exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:200]}"
    return line, "nvidia-smi"


def _cuda_api(version: int | None) -> str | None:
    return None if not version else f"{version // 1000}.{(version % 1000) // 10}"


@register_check("driver", gpu=True)
def check_driver(ctx: DoctorContext) -> CheckResult:
    """NVIDIA driver version (GB10 needs platform/gb10.json's minDriverVersion) and the CUDA version it supports."""
    driver, source = _nvidia_smi(ctx)
    api = _cuda_api(ctx.probe.data.get("driver_api_version"))
    details = {"driver": driver, "driver_cuda": api, "source": source}
    torch_cuda = ctx.probe.data.get("torch_cuda")
    update = "update the NVIDIA driver (DGX OS: `sudo apt update && sudo apt full-upgrade`, then reboot)"
    if api and torch_cuda and _version_tuple(api)[:1] < _version_tuple(torch_cuda)[:1]:
        return _fail(
            "driver", f"driver supports CUDA {api} but torch needs CUDA {torch_cuda}", update, **details
        )
    if driver is None:
        return _warn(
            "driver",
            f"driver version unknown ({source}); it supports CUDA {api or '?'}",
            "put nvidia-smi on PATH (it ships with the driver) to check the driver version",
            **details,
        )
    if ctx.gb10 and _version_tuple(driver)[:2] < GB10_MIN_DRIVER:
        return _fail(
            "driver",
            f"driver {driver} is older than {GB10['minDriverVersion']}, the first for GB10",
            update,
            **details,
        )
    return _ok("driver", f"driver {driver} (supports CUDA {api or '?'})", **details)


@register_check("cuda_runtime", gpu=True)
def check_cuda_runtime(ctx: DoctorContext) -> CheckResult:
    """torch's CUDA runtime version (GB10/sm_12x needs CUDA 13: blockers #1/#2)."""
    cuda = ctx.probe.data.get("torch_cuda")
    details = {"torch_cuda": cuda, "driver_cuda": _cuda_api(ctx.probe.data.get("driver_api_version"))}
    if ctx.sm12x and not ctx.cuda13:
        return _fail(
            "cuda_runtime",
            f"torch uses CUDA {cuda} on {sm_arch(ctx.capability)}: CUDA 12 has no sm_121a ptxas and "
            "cu12 wheels fail there (blockers #1/#2)",
            TORCH_CU130,
            **details,
        )
    return _ok("cuda_runtime", f"CUDA runtime {cuda}", **details)


@register_check("compute_capability", gpu=True)
def check_compute_capability(ctx: DoctorContext) -> CheckResult:
    """The device's compute capability (BF16 tensor cores need 8.0+)."""
    major, minor = ctx.capability
    label = f"{major}.{minor} ({sm_arch(ctx.capability)}{', GB10' if ctx.gb10 else ''})"
    if major < 8:
        return _warn(
            "compute_capability",
            f"{label}: no BF16 tensor cores",
            "use a GPU of compute capability 8.0+ (GB10 is 12.1)",
            capability=[major, minor],
        )
    return _ok("compute_capability", label, capability=[major, minor])


@register_check("torch_arch_list", gpu=True)
def check_torch_arch_list(ctx: DoctorContext) -> CheckResult:
    """torch's compiled arch list covers the device (sm_120 SASS and compute_120 PTX run on sm_121)."""
    archs = list(ctx.probe.data.get("arch_list") or [])
    usable = binaries.compatible(
        [a for a in archs if re.fullmatch(r"(sm|compute)_\d+[af]?", a)], ctx.capability
    )
    if usable:
        return _ok(
            "torch_arch_list", f"{', '.join(usable)} runs on {sm_arch(ctx.capability)}", arch_list=archs
        )
    return _fail(
        "torch_arch_list",
        f"torch was built for {', '.join(archs) or 'no GPU arch'}: nothing runs on {sm_arch(ctx.capability)}",
        TORCH_CU130 + " (cu130 wheels carry sm_120 and compute_120, which run on GB10)",
        arch_list=archs,
    )


# --- checks: Triton and cuBLAS -------------------------------------------------------------------


def check_ptxas_for(
    gpu_name: str,
    timeout_s: float,
    capability: tuple[int, int] | None = None,
    fix_env: dict[str, str] | None = None,
) -> CheckResult:
    """Does the ptxas Triton will use assemble ``gpu_name`` (e.g. ``sm_121a``)? Runs it for real."""
    name = "triton_ptxas"
    if capability is None:
        m = re.fullmatch(r"sm_(\d+)(\d)[af]?", gpu_name)
        if not m:
            raise ValueError(f"not an sm arch: {gpu_name!r}")
        capability = (int(m.group(1)), int(m.group(2)))
    triton = triton_ptxas(capability)
    var = triton.env_var
    if not triton.installed and not triton.from_env:
        return _warn(
            name, "Triton is not installed: torch.compile and Triton kernels cannot run", "pip install triton"
        )
    probe = probe_ptxas(triton.path, gpu_name, timeout_s=timeout_s)
    chosen_by_fix = triton.from_env and (fix_env or {}).get(var) == triton.path
    source = (
        f"${var} (set by the triton_ptxas fix)"
        if chosen_by_fix
        else f"${var}"
        if triton.from_env
        else "Triton's bundled ptxas"
    )
    details = {
        "path": triton.path,
        "env_var": var,
        "from_env": triton.from_env,
        "verdict": probe.verdict,
        "version": probe.version,
        "triton": triton.triton_version,
    }
    fix = (
        f"point ${var} at a CUDA 13 ptxas (`export {var}=/usr/local/cuda/bin/ptxas`) or unset it"
        if triton.from_env
        else FIX_POINT_TRITON.format(var=var)
    )
    if probe.ok:
        return _ok(name, f"{source} ({probe.path}, CUDA {probe.version}) assembles {gpu_name}", **details)
    if probe.verdict == "rejects":
        return _fail(
            name,
            f"{source} {probe.path} (CUDA {probe.version}) cannot assemble {gpu_name}: {probe.message} (blocker #1)",
            fix,
            **details,
        )
    fallback = (
        f"; Triton falls back to its bundled {triton.bundled} when ${var} does not answer --version"
        if triton.from_env and probe.verdict in ("missing", "garbage", "crashed", "timeout")
        else ""
    )
    return _fail(name, f"{source} {probe.path}: {probe.message} ({probe.verdict}){fallback}", fix, **details)


@register_check("triton_ptxas")
def check_triton_ptxas(ctx: DoctorContext) -> CheckResult:
    """The ptxas Triton will use assembles the device's arch (runs it on a minimal PTX module)."""
    limit = min(ctx.timeout_s, 30)
    fix_env = next((f.env for f in ctx.fixes if f.name == "triton_ptxas" and f.applied), None)
    if ctx.ptxas_arch:
        return check_ptxas_for(ctx.ptxas_arch, timeout_s=limit, fix_env=fix_env)
    if not ctx.gpu:
        return _skip(
            "triton_ptxas",
            f"{ctx.no_gpu_reason()}: GPU check skipped (`slime-gb10 doctor --arch sm_121a` checks it for GB10)",
        )
    return check_ptxas_for(
        sm_arch(ctx.capability), timeout_s=limit, capability=ctx.capability, fix_env=fix_env
    )


_TRITON_ADD = """
import json, torch, triton, triton.language as tl

@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

n = 3000
g = torch.Generator().manual_seed(0)
x, y = torch.randn(n, generator=g), torch.randn(n, generator=g)
out = torch.empty(n, device="cuda")
add_kernel[(triton.cdiv(n, 1024),)](x.cuda(), y.cuda(), out, n, BLOCK=1024)
torch.cuda.synchronize()
err = (out.cpu().double() - (x.double() + y.double())).abs().max().item()
print(json.dumps({"max_abs_err": err, "triton": triton.__version__}))
"""


@register_check("triton_jit", gpu=True)
def check_triton_jit(ctx: DoctorContext) -> CheckResult:
    """A tiny Triton add kernel JIT-compiles, runs, and gives the right answer."""
    if not _installed("triton"):
        return _warn("triton_jit", "Triton is not installed", "pip install triton")
    child = run_child_python(_TRITON_ADD, ctx.timeout_s)
    if child.data is None:
        text = child.stderr
        if re.search(r"sm_\d+a?' is not defined|does not support \.target", text):
            return _fail(
                "triton_jit",
                f"ptxas rejects the arch: {child.error_line()} (blocker #1)",
                FIX_POINT_TRITON.format(var=triton_ptxas(ctx.capability).env_var),
            )
        return _fail(
            "triton_jit",
            f"the Triton add kernel {child.how_it_ended()}",
            "run `slime-gb10 doctor` again with a longer --timeout; if it still fails, check the triton_ptxas "
            "line and that triton matches torch (`pip install --force-reinstall torch triton`)",
        )
    err = child.data["max_abs_err"]
    # fp32 addition of fp32 inputs rounds once: |error| <= 2^-24 * |x + y| << 1e-5 here.
    if err > 1e-5:
        return _fail(
            "triton_jit",
            f"Triton add kernel is wrong: max |error| {err:.3g}",
            "reinstall a triton that matches torch (`pip install --force-reinstall torch triton`)",
            **child.data,
        )
    return _ok(
        "triton_jit",
        f"Triton {child.data['triton']} add kernel correct (max |error| {err:.1g})",
        **child.data,
    )


_CUBLAS_BF16 = """
import json, torch
g = torch.Generator().manual_seed(0)
a = torch.randn(256, 512, generator=g).bfloat16()
b = torch.randn(512, 384, generator=g).bfloat16()
c = (a.cuda() @ b.cuda()).double().cpu()
ref = a.double() @ b.double()
rel = ((c - ref).norm() / ref.norm()).item()
print(json.dumps({"rel_err": rel, "shape": [256, 512, 384]}))
"""


@register_check("cublas_bf16", gpu=True)
def check_cublas_bf16(ctx: DoctorContext) -> CheckResult:
    """A cuBLAS BF16 GEMM agrees with a float64 reference (relative Frobenius error < 1e-2)."""
    child = run_child_python(_CUBLAS_BF16, ctx.timeout_s)
    if child.data is None:
        return _fail(
            "cublas_bf16",
            f"the BF16 GEMM {child.how_it_ended()}",
            f"check the driver and torch lines; reinstall a CUDA 13 torch: {TORCH_CU130}",
        )
    rel = child.data["rel_err"]
    # Inputs are exact in both; the only error is FP32 accumulation + one BF16 rounding of the output
    # (unit roundoff 2^-9 ~ 2e-3), so a correct GEMM is far below 1e-2.
    if not rel < 1e-2:
        return _fail(
            "cublas_bf16",
            f"BF16 GEMM is wrong: relative error {rel:.3g} vs float64",
            f"reinstall torch with its own cuBLAS: {TORCH_CU130}",
            **child.data,
        )
    return _ok("cublas_bf16", f"BF16 GEMM 256x512x384 matches float64 (rel. error {rel:.1e})", **child.data)


# --- checks: the optional packages ---------------------------------------------------------------

_IMPORT_PROBE = """
import json, sys, importlib
module = importlib.import_module({module!r})
print(json.dumps({{"version": getattr(module, "__version__", None), "file": getattr(module, "__file__", None)}}))
"""

_CU12_RE = re.compile(r"lib(cudart|nvrtc|cublas|cublasLt|cusparse|cusolver|cufft|curand|nvJitLink)\.so\.12")


@dataclass(frozen=True)
class PackageSpec:
    check: str
    module: str
    dists: tuple[str, ...]
    extra: str
    compiled: bool  # scan .so files for SASS archs and NEEDED cu12 libraries
    rebuild: str  # how to get a build for this torch / CUDA 13 / sm_121


PACKAGES = (
    PackageSpec(
        "sglang",
        "sglang",
        ("sglang",),
        "pip install 'slime-gb10[sglang]'",
        False,
        "reinstall sglang for this torch (`pip install --force-reinstall 'slime-gb10[sglang]'`)",
    ),
    PackageSpec(
        "sgl_kernel",
        "sgl_kernel",
        ("sgl-kernel", "sglang-kernel"),
        "pip install sgl-kernel (on GB10: the flake's build)",
        True,
        "build sgl-kernel from source against this torch and CUDA 13 for sm_120a/sm_121a "
        "(`nix build .#sglang-kernel`, or `SGL_KERNEL_GB10_ONLY=1 pip install --no-build-isolation .` in sgl-kernel/)",
    ),
    PackageSpec(
        "megatron_core",
        "megatron.core",
        ("megatron-core", "megatron_core"),
        "pip install 'slime-gb10[megatron]'",
        False,
        "reinstall megatron-core (`pip install --force-reinstall 'slime-gb10[megatron]'`)",
    ),
    PackageSpec(
        "transformer_engine",
        "transformer_engine",
        ("transformer-engine", "transformer_engine", "transformer-engine-cu13"),
        "pip install 'slime-gb10[te]'",
        True,
        "build TransformerEngine against this torch and CUDA 13 with NVTE_CUDA_ARCHS='120f;121f' "
        "(`nix build .#transformer-engine`), or `pip install transformer-engine-cu13[pytorch]`",
    ),
)


def _package_files(module: str, limit: int = 40) -> list[Path]:
    spec = importlib.util.find_spec(module.split(".")[0])
    roots = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    if spec and spec.origin and not roots:
        roots = [Path(spec.origin).parent]
    files: list[Path] = []
    for root in roots:
        files.extend(p for p in root.rglob("*.so*") if p.is_file() and not p.is_symlink())
        # sibling extension modules outside the package dir (TE's transformer_engine_torch.*.so)
        files.extend(p for p in root.parent.glob(f"{root.name}_*.so") if p.is_file())
    return sorted(set(files), key=lambda p: -p.stat().st_size)[:limit]


def check_package(ctx: DoctorContext, spec: PackageSpec) -> CheckResult:
    """Import ``spec.module`` in a child; classify failures (blockers #2/#3); scan its .so files (#2/#4)."""
    name = spec.check
    if not _installed(spec.module.split(".")[0]) or not _installed(spec.module):
        return _skip(name, f"not installed (optional: {spec.extra})")
    dist_version = _dist_version(*spec.dists)
    child = run_child_python(_IMPORT_PROBE.format(module=spec.module), ctx.timeout_s)
    details: dict[str, Any] = {"dist_version": dist_version}
    if child.data is None:
        error = child.error_line() if not child.timed_out else ""
        details["error"] = error
        if "undefined symbol" in child.stderr:
            return _fail(
                name,
                f"import fails: {error} — built against another torch (blocker #3)",
                spec.rebuild,
                **details,
            )
        if m := _CU12_RE.search(child.stderr):
            return _fail(
                name,
                f"import fails: needs {m.group(0)}, a CUDA 12 library — this is a cu12 build (blocker #2)",
                spec.rebuild,
                **details,
            )
        if not child.timed_out and (m := re.search(r"No module named '([\w.]+)'", error)):
            missing = m.group(1).split(".")[0]
            return _fail(
                name,
                f"import fails: a dependency is missing: {error}",
                f"pip install {missing} (or reinstall with dependencies: {spec.extra})",
                **details,
            )
        return _fail(name, f"import {child.how_it_ended()}", spec.rebuild, **details)
    version = child.data.get("version") or dist_version or "?"
    details.update(child.data)
    notes: list[str] = []
    if not spec.compiled:
        return _ok(name, f"{spec.module} {version} imports", **details)

    files = _package_files(spec.module)
    cu12: dict[str, list[str]] = {}
    for so in files:
        try:
            libs = binaries.cuda12_libs(binaries.elf_needed(so))
        except (OSError, ValueError, IndexError, struct.error):  # a truncated or odd ELF file: no verdict
            continue
        if libs:
            cu12[so.name] = libs
    details["cu12_needed"] = cu12
    if cu12 and ctx.cuda13:
        first = next(iter(cu12.items()))
        return _fail(
            name,
            f"{first[0]} needs {', '.join(first[1])} but torch uses CUDA {ctx.probe.data.get('torch_cuda')} (blocker #2)",
            spec.rebuild,
            **details,
        )
    cuobjdump = binaries.find_cuobjdump()
    if cuobjdump is None:
        notes.append("cuobjdump not found: SASS archs not listed")
        return _ok(name, f"{spec.module} {version} imports; " + "; ".join(notes), **details)
    scan = binaries.cuobjdump_archs(
        files, cuobjdump, timeout_s=min(ctx.timeout_s, 20), budget_s=ctx.timeout_s
    )
    details.update(
        sass=sorted(scan.sass), ptx=sorted(scan.ptx), so_files=scan.files_scanned, scan_errors=scan.errors
    )
    archs = ", ".join(sorted(scan.sass | scan.ptx)) or "none"
    if not scan.sass and not scan.ptx:
        return _ok(
            name,
            f"{spec.module} {version} imports; no GPU code found in {scan.files_scanned} .so files",
            **details,
        )
    if not ctx.gpu:
        return _ok(name, f"{spec.module} {version} imports; carries {archs}", **details)
    usable = binaries.compatible(scan.sass | scan.ptx, ctx.capability)
    if not usable:
        blocker = " (blocker #4)" if ctx.sm12x else ""
        return _fail(
            name,
            f"{spec.module} {version} carries {archs}: none runs on {sm_arch(ctx.capability)}{blocker}",
            spec.rebuild,
            **details,
        )
    return _ok(
        name,
        f"{spec.module} {version} imports; {', '.join(usable)} runs on {sm_arch(ctx.capability)}",
        **details,
    )


def _make_package_check(spec: PackageSpec) -> CheckFn:
    def check(ctx: DoctorContext) -> CheckResult:
        return check_package(ctx, spec)

    check.__doc__ = f"{spec.module} imports (child process), its version, and the GPU archs it carries."
    return check


for _spec in PACKAGES:
    register_check(_spec.check)(_make_package_check(_spec))


_TE_NVFP4 = """
import json, dataclasses
import transformer_engine.pytorch as te
from transformer_engine.common import recipe
fn = getattr(te, "is_nvfp4_available", None)
if fn is not None:
    ok, reason = fn(return_reason=True)
else:
    from transformer_engine.pytorch import fp8
    ok, reason = fp8.check_nvfp4_support()
cls = getattr(recipe, "NVFP4BlockScaling", None)
fields = [f.name for f in dataclasses.fields(cls)] if cls is not None and dataclasses.is_dataclass(cls) else []
print(json.dumps({"available": bool(ok), "reason": reason, "has_recipe": cls is not None,
                  "has_disable_rht": "disable_rht" in fields}))
"""


@register_check("te_nvfp4", gpu=True)
def check_te_nvfp4(ctx: DoctorContext) -> CheckResult:
    """TransformerEngine's NVFP4 recipe is available (sm_12x needs NVFP4BlockScaling(disable_rht=True))."""
    if not _installed("transformer_engine"):
        return _skip("te_nvfp4", "TransformerEngine not installed (optional: pip install 'slime-gb10[te]')")
    if ctx.capability[0] < 10:
        return _skip("te_nvfp4", f"NVFP4 tensor cores need Blackwell; this GPU is {sm_arch(ctx.capability)}")
    child = run_child_python(_TE_NVFP4, ctx.timeout_s)
    if child.data is None:
        return _fail("te_nvfp4", f"the TE NVFP4 probe {child.how_it_ended()}", PACKAGES[3].rebuild)
    data = child.data
    if not data["has_recipe"]:
        return _fail(
            "te_nvfp4",
            "this TransformerEngine has no NVFP4BlockScaling recipe",
            "install TransformerEngine >= 2.8",
            **data,
        )
    if not data["available"]:
        return _fail(
            "te_nvfp4", f"TE says NVFP4 is unavailable: {data['reason']}", PACKAGES[3].rebuild, **data
        )
    if ctx.sm12x:
        return _warn(
            "te_nvfp4",
            "NVFP4 available; on sm_12x the Random Hadamard Transform kernel fails for M > 32 (TE issue #2372)",
            "use NVFP4BlockScaling(disable_rht=True) (slime-gb10's NVFP4 recipe does)",
            **data,
        )
    return _ok("te_nvfp4", "NVFP4 available", **data)


_W4A16 = """
import json, torch
from slime_gb10.nvfp4 import _cuda_w4a16, dequantize_reference, kernels, quantize_reference
g = torch.Generator().manual_seed(0)
w = torch.randn(256, 512, generator=g) * 0.05
x = torch.randn(48, 512, generator=g).bfloat16()
q = quantize_reference(w)
ref = x.double() @ dequantize_reference(q, torch.float64).T
p = kernels.prepare_w4a16(q.to("cuda"))
res = {"cuda_available": _cuda_w4a16.available()}
for engine in ("cuda", "triton", "wide") if res["cuda_available"] else ("triton", "wide"):
    try:  # one token and 24 (the CUDA kernel's tilings for M <= 8 and M = 17..32); the wide kernel at 24 and 48
        errs = []
        for m in (24, 48) if engine == "wide" else (1, 24):
            out = kernels.w4a16_matmul(x[:m].cuda(), p, engine=engine).cpu().double()
            errs.append(float((out - ref[:m]).norm() / ref[:m].norm()))
        res[engine] = max(errs)
    except Exception as exc:
        res[engine] = f"{type(exc).__name__}: {str(exc)[:300]}"
print(json.dumps(res))
"""


@register_check("w4a16_kernels", gpu=True)
def check_w4a16_kernels(ctx: DoctorContext) -> CheckResult:
    """NVFP4Linear's w4a16 kernels run and are right: the CUDA one (NVRTC, M <= 32) and the two Triton
    ones (the wide kernel takes M > 16 on large weights: on GB10, mma.sync instead of Hopper's wgmma)."""
    if not _installed("triton"):
        return _skip("w4a16_kernels", "Triton is not installed: w4a16 dequantizes and calls cuBLAS")
    child = run_child_python(_W4A16, ctx.timeout_s)
    if child.data is None:
        return _fail(
            "w4a16_kernels",
            f"the W4A16 probe {child.how_it_ended()}",
            "run `slime-gb10 doctor` again with a longer --timeout; check the triton_jit line",
        )
    data = child.data
    triton_err, wide_err = data.get("triton"), data.get("wide")
    for name, err in (("Triton W4A16 kernel", triton_err), ("wide Triton W4A16 kernel (M > 16)", wide_err)):
        if not isinstance(err, float) or not err < 1e-2:
            return _fail(
                "w4a16_kernels",
                f"the {name} is wrong or fails: {err}",
                "reinstall a triton that matches torch (`pip install --force-reinstall torch triton`)",
                **data,
            )
    if not data["cuda_available"]:
        return _warn(
            "w4a16_kernels",
            f"Triton kernels correct (rel. error {triton_err:.1g}, {wide_err:.1g}); the CUDA kernel for M <= 32 is "
            "unavailable "
            "(NVRTC not found, torch without torch.cuda._compile_kernel, or a pre-Hopper GPU): M <= 32 runs "
            "slower, on the Triton kernel",
            "put a CUDA 13 toolkit with lib/libnvrtc.so under CUDA_HOME (the flake's shell does), or "
            "pip install nvidia-cuda-nvrtc",
            **data,
        )
    cuda_err = data.get("cuda")
    if not isinstance(cuda_err, float) or not cuda_err < 1e-2:
        return _fail(
            "w4a16_kernels",
            f"the CUDA W4A16 kernel (NVRTC) is wrong or fails: {cuda_err}",
            "SLIME_GB10_W4A16_ENGINE=triton turns it off; report the line above",
            **data,
        )
    return _ok(
        "w4a16_kernels",
        f"CUDA (NVRTC, M <= 32), Triton and wide Triton kernels correct (rel. error {cuda_err:.1g}, "
        f"{triton_err:.1g}, {wide_err:.1g})",
        **data,
    )


# --- checks: memory, cuDNN and the run-time blockers ---------------------------------------------


@register_check("unified_memory", gpu=True)
def check_unified_memory(ctx: DoctorContext) -> CheckResult:
    """Unified memory (GB10) and the caching allocator setting (expandable segments)."""
    dev = ctx.device
    unified = (
        bool(dev.get("is_integrated")) or lookup_peaks(dev.get("name", ""), ctx.capability).unified_memory
    )
    conf = os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    details = {"unified": unified, "alloc_conf": conf}
    if not unified:
        return _ok("unified_memory", f"discrete GPU memory; allocator: {conf or 'default'}", **details)
    if conf and "expandable_segments:true" in conf.replace(" ", "").lower():
        return _ok("unified_memory", f"unified memory; allocator: {conf}", **details)
    return _warn(
        "unified_memory",
        f"unified memory but allocator is {conf or 'default'}: fragmentation wastes shared memory",
        "export PYTORCH_ALLOC_CONF=expandable_segments:True (slime-gb10 sets it unless you set one)",
        **details,
    )


def _find_library_file(stem: str) -> str | None:
    """``lib<stem>.so*`` via ldconfig, LD_LIBRARY_PATH, CUDNN_PATH and the nvidia-* pip wheels."""
    found = ctypes.util.find_library(stem)
    if found:
        return found
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    if os.environ.get("CUDNN_PATH"):
        dirs.append(os.path.join(os.environ["CUDNN_PATH"], "lib"))
    spec = importlib.util.find_spec("nvidia")
    for location in (spec.submodule_search_locations or []) if spec else []:
        dirs.extend(str(p) for p in Path(location).glob("*/lib"))
    for directory in dirs:
        hits = sorted(Path(directory).glob(f"lib{stem}.so*"))
        if hits:
            return str(hits[0])
    return None


@register_check("cudnn")
def check_cudnn(ctx: DoctorContext) -> CheckResult:
    """cuDNN present (torch's) and, with TransformerEngine, libcudnn_engines_precompiled (blocker #6)."""
    version = ctx.probe.data.get("cudnn_version")
    if not ctx.probe.data.get("torch_cuda"):
        return _skip("cudnn", "torch has no CUDA build: cuDNN not used")
    if version is None:
        return _warn("cudnn", "torch reports no cuDNN", "pip install nvidia-cudnn-cu13")
    text = (
        f"cuDNN {version // 10000}.{(version % 10000) // 100}.{version % 100}"
        if version > 10000
        else f"cuDNN {version}"
    )
    if not _installed("transformer_engine"):
        return _ok(
            "cudnn",
            f"{text} (TransformerEngine not installed: engines_precompiled not needed)",
            version=version,
        )
    engines = _find_library_file("cudnn_engines_precompiled")
    if engines is None:
        return _fail(
            "cudnn",
            f"{text}, but libcudnn_engines_precompiled is not findable: TE needs the full cuDNN (blocker #6)",
            "pip install nvidia-cudnn-cu13 (ships libcudnn_engines_precompiled.so.9), or install the full cuDNN "
            "package and add its lib/ to LD_LIBRARY_PATH",
            version=version,
        )
    return _ok(
        "cudnn", f"{text}; libcudnn_engines_precompiled at {engines}", version=version, engines=engines
    )


_OMEGACONF_PARSE = """
import json
from omegaconf import OmegaConf
value = OmegaConf.create({"a": "${b}", "b": 7}).a  # an interpolation runs the ANTLR grammar
print(json.dumps({"value": value}))
"""


@register_check("antlr4_omegaconf")
def check_antlr4(ctx: DoctorContext) -> CheckResult:
    """With omegaconf installed: its ANTLR grammar loads (antlr4 runtime 4.13 breaks it: blocker #13)."""
    if not _installed("omegaconf"):
        return _skip("antlr4_omegaconf", "omegaconf not installed (only Megatron/Hydra configs use it)")
    antlr = _dist_version("antlr4-python3-runtime")
    fix = "pip install antlr4-python3-runtime==4.9.3"
    child = run_child_python(_OMEGACONF_PARSE, ctx.timeout_s)
    if child.data is None or child.data.get("value") != 7:
        detail = "deserialize ATN" if "deserialize ATN" in child.stderr else child.how_it_ended()
        return _fail(
            "antlr4_omegaconf",
            f"omegaconf interpolation fails with antlr4 runtime {antlr}: {detail} (blocker #13)",
            fix,
            antlr4=antlr,
        )
    return _ok("antlr4_omegaconf", f"omegaconf parses interpolations (antlr4 runtime {antlr})", antlr4=antlr)


@register_check("megatron_training")
def check_megatron_training(ctx: DoctorContext) -> CheckResult:
    """Information only: megatron.training (blocker #14) is not needed by slime-gb10."""
    if not _installed("megatron"):
        return _skip(
            "megatron_training", "megatron-core not installed; slime-gb10 does not need megatron.training"
        )
    if _installed("megatron.training"):
        return _ok("megatron_training", "megatron.training is importable (not needed by slime-gb10)")
    return _ok(
        "megatron_training",
        "megatron.training not importable: fine, slime-gb10 uses only megatron.core (blocker #14 does not apply)",
    )


@register_check("tilelang_z3")
def check_tilelang_z3(ctx: DoctorContext) -> CheckResult:
    """With tilelang installed: libz3 is findable (blocker #15)."""
    if not _installed("tilelang"):
        return _skip("tilelang_z3", "tilelang not installed")
    lib = _find_library_file("z3")
    if lib is None and (spec := importlib.util.find_spec("z3")) is not None:
        hits = sorted(Path(next(iter(spec.submodule_search_locations or [])), "lib").glob("libz3.so*"))
        lib = str(hits[0]) if hits else None
    if lib is None:
        return _fail(
            "tilelang_z3",
            "tilelang is installed but libz3.so is not findable (blocker #15)",
            "sudo apt-get install libz3-4 (or pip install z3-solver and add its z3/lib to LD_LIBRARY_PATH)",
        )
    return _ok("tilelang_z3", f"libz3 at {lib}", path=lib)


@register_check("sglang_router")
def check_sglang_router(ctx: DoctorContext) -> CheckResult:
    """With sglang installed: sglang_router, if present, imports (the fork's wheel was x86_64 only: blocker #12).

    slime-gb10 runs SGLang in-process, colocated on one GPU, so the router is optional: a missing
    one is fine; a broken one is worth a warning (it is what breaks multi-engine setups).
    """
    if not _installed("sglang"):
        return _skip("sglang_router", "sglang not installed")
    if not _installed("sglang_router"):
        return _skip(
            "sglang_router",
            "not installed: not needed for one-GPU colocated runs (multi-engine routing: "
            "pip install sglang-router, which has aarch64 wheels)",
        )
    fix = "pip install --force-reinstall sglang-router (upstream publishes aarch64 wheels)"
    child = run_child_python(_IMPORT_PROBE.format(module="sglang_router"), ctx.timeout_s)
    if child.data is None:
        return _warn("sglang_router", f"import sglang_router {child.how_it_ended()} (blocker #12)", fix)
    return _ok(
        "sglang_router",
        f"sglang_router {child.data.get('version') or _dist_version('sglang-router')} imports",
    )


@register_check("cuda_headers")
def check_cuda_headers(ctx: DoctorContext) -> CheckResult:
    """Build-time only: cuda_profiler_api.h and nvtx3 headers under CUDA_HOME (blockers #7/#10)."""
    home = cuda_home()
    if home is None:
        return _skip("cuda_headers", "no CUDA_HOME (only needed to build TE / sgl-kernel from source)")
    wanted = {"cuda_profiler_api.h": "#10", "nvtx3/nvToolsExt.h": "#7"}
    include_dirs = [home / "include", *sorted(home.glob("targets/*/include"))]
    missing = [h for h in wanted if not any((d / h).is_file() for d in include_dirs)]
    if missing:
        blockers = ", ".join(f"{h} (blocker {wanted[h]})" for h in missing)
        return _warn(
            "cuda_headers",
            f"{home}: missing {blockers}; matters only when building TE / sgl-kernel",
            "pip install nvidia-cuda-profiler-api nvidia-nvtx and add their nvidia/cu13/include to CPATH, "
            "or build inside the flake (`nix develop`)",
            cuda_home=str(home),
            missing=missing,
        )
    return _ok("cuda_headers", f"{home}: cuda_profiler_api.h and nvtx3 present", cuda_home=str(home))


_BACKENDS_PROBE = """
import importlib, json
out = {}
for name, module in (("sglang", "slime_gb10.grpo.engines.sglang_engine"),
                     ("megatron", "slime_gb10.grpo.backends.megatron_backend")):
    try:
        out[name] = list(importlib.import_module(module).availability())
    except Exception as exc:
        out[name] = [False, f"{exc.__class__.__name__}: {exc}"]
print(json.dumps(out))
"""


def grpo_backend_pair(sglang_ok: bool, megatron_ok: bool) -> str:
    """The rollout+trainer pair ``slime-gb10 train`` resolves ``auto`` to (the trainer's own rule)."""
    from slime_gb10.grpo.registry import auto_pair

    return "+".join(auto_pair(sglang_ok, megatron_ok))


@register_check("grpo_backends")
def check_grpo_backends(ctx: DoctorContext) -> CheckResult:
    """Which rollout engine + policy backend pair this machine can run (SGLang / Megatron-core, else PyTorch)."""
    if not ctx.gpu:
        return _ok("grpo_backends", f"auto = torch+torch (the portable PyTorch path; {ctx.no_gpu_reason()})")
    child = run_child_python(_BACKENDS_PROBE, ctx.timeout_s)
    if child.data is None:
        return _warn(
            "grpo_backends",
            f"probing the SGLang / Megatron backends {child.how_it_ended()}; training falls back to torch+torch",
            "run: python -c 'import slime_gb10.grpo.engines.sglang_engine' to see the error",
        )
    (sglang_ok, sglang_why), (megatron_ok, megatron_why) = child.data["sglang"], child.data["megatron"]
    pair = grpo_backend_pair(sglang_ok, megatron_ok)
    reason = f"auto = {pair} (sglang: {sglang_why}; megatron: {megatron_why})"
    details = {"pair": pair, "sglang": child.data["sglang"], "megatron": child.data["megatron"]}
    if ctx.gb10 and pair != "sglang+megatron":
        return _warn(
            "grpo_backends",
            f"{reason}: GB10 runs best on sglang+megatron",
            "enter the flake's environment (`nix develop`), which builds both for sm_121a, "
            "or pip install 'slime-gb10[sglang,megatron,te]'",
            **details,
        )
    return _ok("grpo_backends", reason, **details)


@register_check("runtime_fixes")
def check_runtime_fixes(ctx: DoctorContext) -> CheckResult:
    """Which GB10 runtime fixes this process applied (the CLI applies them before the checks)."""
    if ctx.fixes_disabled:
        return _skip("runtime_fixes", "runtime fixes not applied (--no-fixes)")
    applied = [f.name for f in ctx.fixes if f.applied]
    not_applied = [f"{f.name} ({f.reason})" for f in ctx.fixes if not f.applied]
    reason = f"applied: {', '.join(applied) or 'none'}; not applied: {'; '.join(not_applied) or 'none'}"
    return _ok("runtime_fixes", reason, fixes=[asdict(f) for f in ctx.fixes])


# --- running -------------------------------------------------------------------------------------


def _run_one(check: Check, ctx: DoctorContext) -> CheckResult:
    if check.gpu and not ctx.gpu:
        return _skip(check.name, f"{ctx.no_gpu_reason()}: GPU check skipped")
    start = time.monotonic()
    try:
        result = check.fn(ctx)
    except Exception as exc:  # a bug in a check must not hide the others
        return _fail(
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
                _fail(
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


def _validate_arch(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    m = re.fullmatch(r"sm_(\d{2,3})[af]?", value or "")
    if value is not None and (m is None or int(m.group(1)) < 50):
        raise click.BadParameter(f"{value!r} is not an arch like sm_121a, sm_120, sm_90a")
    return value


@click.command(
    "doctor",
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Check this machine's GPU stack (driver, CUDA, torch, Triton's ptxas, cuBLAS, sglang, TE, ...): "
    "one line per check, ok / warn / fail / skip, with the exact fix for anything not ok. "
    "Exit status 1 only if a check fails.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document instead of text.")
@click.option(
    "--json-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the JSON report to this file (atomically).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1.0, max=3600.0),
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    help="Time limit in seconds for each check's child processes.",
)
@click.option("--no-fixes", is_flag=True, help="Do not apply the GB10 runtime fixes before checking.")
@click.option(
    "--arch",
    "ptxas_arch",
    default=None,
    metavar="SM_ARCH",
    callback=_validate_arch,
    help="Check that Triton's ptxas assembles this arch (e.g. sm_121a for GB10), GPU or not.",
)
def doctor_command(
    as_json: bool, json_out: Path | None, timeout_s: float, no_fixes: bool, ptxas_arch: str | None
) -> None:
    from slime_gb10.utils.atomic import OutputPathError, atomic_write_text, ensure_writable_dir

    if json_out is not None:  # bad output path: say so before spending a minute on checks
        if json_out.is_dir():
            raise click.BadParameter(
                f"'{json_out}' is a directory; give a file name", param_hint="--json-out"
            )
        try:
            ensure_writable_dir(json_out.parent if str(json_out.parent) else Path("."))
        except OutputPathError as exc:
            raise click.BadParameter(str(exc), param_hint="--json-out") from None
    try:
        ctx = doctor_context(timeout_s, apply_fixes=not no_fixes)
        ctx.ptxas_arch = ptxas_arch
    except ValueError as exc:  # e.g. a malformed SLIME_GB10_DISABLE_FIXES
        raise click.ClickException(str(exc)) from None
    results = run_registered(ctx, CHECKS)
    document = report_json(results, ctx)
    if json_out is not None:
        try:
            atomic_write_text(json_out, json.dumps(document, indent=2, default=str) + "\n")
        except (OutputPathError, OSError) as exc:
            raise click.ClickException(f"cannot write --json-out '{json_out}': {exc}") from None
    if as_json:
        click.echo(json.dumps(document, indent=2, default=str))
    else:
        click.echo(format_text(results, ctx))
    if not document["ok"]:
        sys.exit(1)
