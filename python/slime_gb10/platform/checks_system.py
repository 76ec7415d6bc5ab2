"""Doctor checks of the machine: platform, Python, torch, GPU, driver, CUDA, Triton and cuBLAS, memory,
cuDNN, the run-time blockers and the runtime fixes."""

from __future__ import annotations

import ctypes.util
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from slime_gb10.platform import binaries, subproc
from slime_gb10.platform.checks import (
    MIN_PYTHON,
    TORCH_CU130,
    CheckResult,
    DoctorContext,
    dist_version,
    installed,
    register_check,
    run_child_module,
    version_tuple,
)
from slime_gb10.platform.devices import GB10, GB10_MIN_DRIVER, lookup_peaks, sm_arch
from slime_gb10.platform.ptxas import FIX_POINT_TRITON, cuda_home, probe_ptxas, triton_ptxas

# --- checks: the machine -------------------------------------------------------------------------


@register_check("platform")
def check_platform(ctx: DoctorContext) -> CheckResult:
    """CPU architecture and OS (DGX Spark is aarch64 Linux)."""
    machine, system = platform.machine(), platform.system()
    details = {"machine": machine, "system": system, "release": platform.release()}
    if system != "Linux":
        return CheckResult.warn(
            "platform", f"{system} {machine}: only Linux is supported", "run on Linux (DGX OS)", **details
        )
    if machine == "aarch64":
        return CheckResult.ok("platform", "Linux aarch64 (as on DGX Spark)", **details)
    if machine == "x86_64":
        return CheckResult.ok(
            "platform", "Linux x86_64 (fine for development; DGX Spark is aarch64)", **details
        )
    return CheckResult.warn(
        "platform", f"Linux {machine}: untested", "use aarch64 (DGX Spark) or x86_64", **details
    )


@register_check("python")
def check_python(ctx: DoctorContext) -> CheckResult:
    """Python version (3.11+)."""
    version = platform.python_version()
    if sys.version_info[:2] < MIN_PYTHON:
        return CheckResult.fail(
            "python", f"Python {version} is too old", "use Python 3.11 or newer", executable=sys.executable
        )
    return CheckResult.ok("python", f"Python {version} ({sys.executable})", version=version)


@register_check("torch")
def check_torch(ctx: DoctorContext) -> CheckResult:
    """torch version and the CUDA it was built with."""
    data = ctx.probe.data
    if ctx.probe.error:
        return CheckResult.fail(
            "torch", ctx.probe.error, f"check that `{sys.executable} -c 'import torch'` works; {TORCH_CU130}"
        )
    if not data.get("torch_importable"):
        return CheckResult.fail("torch", f"torch is not importable: {data.get('torch_error')}", TORCH_CU130)
    version, cuda = data["torch_version"], data.get("torch_cuda")
    details = {"version": version, "cuda": cuda, "hip": data.get("torch_hip")}
    if cuda is None:
        return CheckResult.warn(
            "torch", f"torch {version} is a CPU-only build: no GPU work possible", TORCH_CU130, **details
        )
    if version_tuple(version) < (2, 9):
        return CheckResult.warn(
            "torch", f"torch {version} (CUDA {cuda}) is older than 2.9", TORCH_CU130, **details
        )
    return CheckResult.ok("torch", f"torch {version}, built with CUDA {cuda}", **details)


@register_check("gpu")
def check_gpu(ctx: DoctorContext) -> CheckResult:
    """A CUDA GPU is visible (otherwise the GPU checks are skipped)."""
    if ctx.gpu:
        dev = ctx.device
        return CheckResult.ok(
            "gpu",
            f"{dev['name']} ({sm_arch(ctx.capability)}, {dev['sm_count']} SMs, "
            f"{dev['total_memory'] / 2**30:.1f} GiB), {ctx.probe.data.get('device_count', 1)} device(s)",
            device=dev,
        )
    reason = ctx.no_gpu_reason()
    warnings = " ".join(ctx.probe.data.get("cuda_warnings") or [])
    if re.search(r"driver .*too old", warnings, flags=re.I):
        return CheckResult.fail(
            "gpu",
            reason,
            f"install an NVIDIA driver that supports torch's CUDA version (GB10: {GB10['minDriverVersion']} or newer)",
        )
    return CheckResult.skip("gpu", f"{reason}: the GPU checks are skipped")


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
    if api and torch_cuda and version_tuple(api)[:1] < version_tuple(torch_cuda)[:1]:
        return CheckResult.fail(
            "driver", f"driver supports CUDA {api} but torch needs CUDA {torch_cuda}", update, **details
        )
    if driver is None:
        return CheckResult.warn(
            "driver",
            f"driver version unknown ({source}); it supports CUDA {api or '?'}",
            "put nvidia-smi on PATH (it ships with the driver) to check the driver version",
            **details,
        )
    if ctx.gb10 and version_tuple(driver)[:2] < GB10_MIN_DRIVER:
        return CheckResult.fail(
            "driver",
            f"driver {driver} is older than {GB10['minDriverVersion']}, the first for GB10",
            update,
            **details,
        )
    return CheckResult.ok("driver", f"driver {driver} (supports CUDA {api or '?'})", **details)


@register_check("cuda_runtime", gpu=True)
def check_cuda_runtime(ctx: DoctorContext) -> CheckResult:
    """torch's CUDA runtime version (GB10/sm_12x needs CUDA 13: blockers #1/#2)."""
    cuda = ctx.probe.data.get("torch_cuda")
    details = {"torch_cuda": cuda, "driver_cuda": _cuda_api(ctx.probe.data.get("driver_api_version"))}
    if ctx.sm12x and not ctx.cuda13:
        return CheckResult.fail(
            "cuda_runtime",
            f"torch uses CUDA {cuda} on {sm_arch(ctx.capability)}: CUDA 12 has no sm_121a ptxas and "
            "cu12 wheels fail there (blockers #1/#2)",
            TORCH_CU130,
            **details,
        )
    return CheckResult.ok("cuda_runtime", f"CUDA runtime {cuda}", **details)


@register_check("compute_capability", gpu=True)
def check_compute_capability(ctx: DoctorContext) -> CheckResult:
    """The device's compute capability (BF16 tensor cores need 8.0+)."""
    major, minor = ctx.capability
    label = f"{major}.{minor} ({sm_arch(ctx.capability)}{', GB10' if ctx.gb10 else ''})"
    if major < 8:
        return CheckResult.warn(
            "compute_capability",
            f"{label}: no BF16 tensor cores",
            "use a GPU of compute capability 8.0+ (GB10 is 12.1)",
            capability=[major, minor],
        )
    return CheckResult.ok("compute_capability", label, capability=[major, minor])


@register_check("torch_arch_list", gpu=True)
def check_torch_arch_list(ctx: DoctorContext) -> CheckResult:
    """torch's compiled arch list covers the device (sm_120 SASS and compute_120 PTX run on sm_121)."""
    archs = list(ctx.probe.data.get("arch_list") or [])
    usable = binaries.compatible(
        [a for a in archs if re.fullmatch(r"(sm|compute)_\d+[af]?", a)], ctx.capability
    )
    if usable:
        return CheckResult.ok(
            "torch_arch_list", f"{', '.join(usable)} runs on {sm_arch(ctx.capability)}", arch_list=archs
        )
    return CheckResult.fail(
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
        return CheckResult.warn(
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
        return CheckResult.ok(
            name, f"{source} ({probe.path}, CUDA {probe.version}) assembles {gpu_name}", **details
        )
    if probe.verdict == "rejects":
        return CheckResult.fail(
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
    return CheckResult.fail(
        name, f"{source} {probe.path}: {probe.message} ({probe.verdict}){fallback}", fix, **details
    )


@register_check("triton_ptxas")
def check_triton_ptxas(ctx: DoctorContext) -> CheckResult:
    """The ptxas Triton will use assembles the device's arch (runs it on a minimal PTX module)."""
    limit = min(ctx.timeout_s, 30)
    fix_env = next((f.env for f in ctx.fixes if f.name == "triton_ptxas" and f.applied), None)
    if ctx.ptxas_arch:
        return check_ptxas_for(ctx.ptxas_arch, timeout_s=limit, fix_env=fix_env)
    if not ctx.gpu:
        return CheckResult.skip(
            "triton_ptxas",
            f"{ctx.no_gpu_reason()}: GPU check skipped (`slime-gb10 doctor --arch sm_121a` checks it for GB10)",
        )
    return check_ptxas_for(
        sm_arch(ctx.capability), timeout_s=limit, capability=ctx.capability, fix_env=fix_env
    )


@register_check("triton_jit", gpu=True)
def check_triton_jit(ctx: DoctorContext) -> CheckResult:
    """A tiny Triton add kernel JIT-compiles, runs, and gives the right answer."""
    if not installed("triton"):
        return CheckResult.warn("triton_jit", "Triton is not installed", "pip install triton")
    child = run_child_module("slime_gb10.platform.probes.triton_add", ctx.timeout_s)
    if child.data is None:
        text = child.stderr
        if re.search(r"sm_\d+a?' is not defined|does not support \.target", text):
            return CheckResult.fail(
                "triton_jit",
                f"ptxas rejects the arch: {child.error_line()} (blocker #1)",
                FIX_POINT_TRITON.format(var=triton_ptxas(ctx.capability).env_var),
            )
        return CheckResult.fail(
            "triton_jit",
            f"the Triton add kernel {child.how_it_ended()}",
            "run `slime-gb10 doctor` again with a longer --timeout; if it still fails, check the triton_ptxas "
            "line and that triton matches torch (`pip install --force-reinstall torch triton`)",
        )
    err = child.data["max_abs_err"]
    # fp32 addition of fp32 inputs rounds once: |error| <= 2^-24 * |x + y| << 1e-5 here.
    if err > 1e-5:
        return CheckResult.fail(
            "triton_jit",
            f"Triton add kernel is wrong: max |error| {err:.3g}",
            "reinstall a triton that matches torch (`pip install --force-reinstall torch triton`)",
            **child.data,
        )
    return CheckResult.ok(
        "triton_jit",
        f"Triton {child.data['triton']} add kernel correct (max |error| {err:.1g})",
        **child.data,
    )


@register_check("cublas_bf16", gpu=True)
def check_cublas_bf16(ctx: DoctorContext) -> CheckResult:
    """A cuBLAS BF16 GEMM agrees with a float64 reference (relative Frobenius error < 1e-2)."""
    child = run_child_module("slime_gb10.platform.probes.cublas_bf16", ctx.timeout_s)
    fix = f"check the driver and torch lines; reinstall a CUDA 13 torch: {TORCH_CU130}"
    if failed := child.failed("cublas_bf16", "the BF16 GEMM", fix):
        return failed
    rel = child.data["rel_err"]
    # Inputs are exact in both; the only error is FP32 accumulation + one BF16 rounding of the output
    # (unit roundoff 2^-9 ~ 2e-3), so a correct GEMM is far below 1e-2.
    if not rel < 1e-2:
        return CheckResult.fail(
            "cublas_bf16",
            f"BF16 GEMM is wrong: relative error {rel:.3g} vs float64",
            f"reinstall torch with its own cuBLAS: {TORCH_CU130}",
            **child.data,
        )
    return CheckResult.ok(
        "cublas_bf16", f"BF16 GEMM 256x512x384 matches float64 (rel. error {rel:.1e})", **child.data
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
        return CheckResult.ok(
            "unified_memory", f"discrete GPU memory; allocator: {conf or 'default'}", **details
        )
    if conf and "expandable_segments:true" in conf.replace(" ", "").lower():
        return CheckResult.ok("unified_memory", f"unified memory; allocator: {conf}", **details)
    return CheckResult.warn(
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
        return CheckResult.skip("cudnn", "torch has no CUDA build: cuDNN not used")
    if version is None:
        return CheckResult.warn("cudnn", "torch reports no cuDNN", "pip install nvidia-cudnn-cu13")
    text = (
        f"cuDNN {version // 10000}.{(version % 10000) // 100}.{version % 100}"
        if version > 10000
        else f"cuDNN {version}"
    )
    if not installed("transformer_engine"):
        return CheckResult.ok(
            "cudnn",
            f"{text} (TransformerEngine not installed: engines_precompiled not needed)",
            version=version,
        )
    engines = _find_library_file("cudnn_engines_precompiled")
    if engines is None:
        return CheckResult.fail(
            "cudnn",
            f"{text}, but libcudnn_engines_precompiled is not findable: TE needs the full cuDNN (blocker #6)",
            "pip install nvidia-cudnn-cu13 (ships libcudnn_engines_precompiled.so.9), or install the full cuDNN "
            "package and add its lib/ to LD_LIBRARY_PATH",
            version=version,
        )
    return CheckResult.ok(
        "cudnn", f"{text}; libcudnn_engines_precompiled at {engines}", version=version, engines=engines
    )


@register_check("antlr4_omegaconf")
def check_antlr4(ctx: DoctorContext) -> CheckResult:
    """With omegaconf installed: its ANTLR grammar loads (antlr4 runtime 4.13 breaks it: blocker #13)."""
    if not installed("omegaconf"):
        return CheckResult.skip(
            "antlr4_omegaconf", "omegaconf not installed (only Megatron/Hydra configs use it)"
        )
    antlr = dist_version("antlr4-python3-runtime")
    fix = "pip install antlr4-python3-runtime==4.9.3"
    child = run_child_module("slime_gb10.platform.probes.omegaconf_parse", ctx.timeout_s)
    if child.data is None or child.data.get("value") != 7:
        detail = "deserialize ATN" if "deserialize ATN" in child.stderr else child.how_it_ended()
        return CheckResult.fail(
            "antlr4_omegaconf",
            f"omegaconf interpolation fails with antlr4 runtime {antlr}: {detail} (blocker #13)",
            fix,
            antlr4=antlr,
        )
    return CheckResult.ok(
        "antlr4_omegaconf", f"omegaconf parses interpolations (antlr4 runtime {antlr})", antlr4=antlr
    )


@register_check("megatron_training")
def check_megatron_training(ctx: DoctorContext) -> CheckResult:
    """Information only: megatron.training (blocker #14) is not needed by slime-gb10."""
    if not installed("megatron"):
        return CheckResult.skip(
            "megatron_training", "megatron-core not installed; slime-gb10 does not need megatron.training"
        )
    if installed("megatron.training"):
        return CheckResult.ok(
            "megatron_training", "megatron.training is importable (not needed by slime-gb10)"
        )
    return CheckResult.ok(
        "megatron_training",
        "megatron.training not importable: fine, slime-gb10 uses only megatron.core (blocker #14 does not apply)",
    )


@register_check("tilelang_z3")
def check_tilelang_z3(ctx: DoctorContext) -> CheckResult:
    """With tilelang installed: libz3 is findable (blocker #15)."""
    if not installed("tilelang"):
        return CheckResult.skip("tilelang_z3", "tilelang not installed")
    lib = _find_library_file("z3")
    if lib is None and (spec := importlib.util.find_spec("z3")) is not None:
        hits = sorted(Path(next(iter(spec.submodule_search_locations or [])), "lib").glob("libz3.so*"))
        lib = str(hits[0]) if hits else None
    if lib is None:
        return CheckResult.fail(
            "tilelang_z3",
            "tilelang is installed but libz3.so is not findable (blocker #15)",
            "sudo apt-get install libz3-4 (or pip install z3-solver and add its z3/lib to LD_LIBRARY_PATH)",
        )
    return CheckResult.ok("tilelang_z3", f"libz3 at {lib}", path=lib)


@register_check("sglang_router")
def check_sglang_router(ctx: DoctorContext) -> CheckResult:
    """With sglang installed: sglang_router, if present, imports (the fork's wheel was x86_64 only: blocker #12).

    slime-gb10 runs SGLang in-process, colocated on one GPU, so the router is optional: a missing
    one is fine; a broken one is worth a warning (it is what breaks multi-engine setups).
    """
    if not installed("sglang"):
        return CheckResult.skip("sglang_router", "sglang not installed")
    if not installed("sglang_router"):
        return CheckResult.skip(
            "sglang_router",
            "not installed: not needed for one-GPU colocated runs (multi-engine routing: "
            "pip install sglang-router, which has aarch64 wheels)",
        )
    fix = "pip install --force-reinstall sglang-router (upstream publishes aarch64 wheels)"
    child = run_child_module(
        "slime_gb10.platform.probes.import_module", ctx.timeout_s, args=("sglang_router",)
    )
    if failed := child.failed("sglang_router", "import sglang_router", fix, warn=True, then=" (blocker #12)"):
        return failed
    return CheckResult.ok(
        "sglang_router",
        f"sglang_router {child.data.get('version') or dist_version('sglang-router')} imports",
    )


@register_check("cuda_headers")
def check_cuda_headers(ctx: DoctorContext) -> CheckResult:
    """Build-time only: cuda_profiler_api.h and nvtx3 headers under CUDA_HOME (blockers #7/#10)."""
    home = cuda_home()
    if home is None:
        return CheckResult.skip(
            "cuda_headers", "no CUDA_HOME (only needed to build TE / sgl-kernel from source)"
        )
    wanted = {"cuda_profiler_api.h": "#10", "nvtx3/nvToolsExt.h": "#7"}
    include_dirs = [home / "include", *sorted(home.glob("targets/*/include"))]
    missing = [h for h in wanted if not any((d / h).is_file() for d in include_dirs)]
    if missing:
        blockers = ", ".join(f"{h} (blocker {wanted[h]})" for h in missing)
        return CheckResult.warn(
            "cuda_headers",
            f"{home}: missing {blockers}; matters only when building TE / sgl-kernel",
            "pip install nvidia-cuda-profiler-api nvidia-nvtx and add their nvidia/cu13/include to CPATH, "
            "or build inside the flake (`nix develop`)",
            cuda_home=str(home),
            missing=missing,
        )
    return CheckResult.ok(
        "cuda_headers", f"{home}: cuda_profiler_api.h and nvtx3 present", cuda_home=str(home)
    )


@register_check("runtime_fixes")
def check_runtime_fixes(ctx: DoctorContext) -> CheckResult:
    """Which GB10 runtime fixes this process applied (the CLI applies them before the checks)."""
    if ctx.fixes_disabled:
        return CheckResult.skip("runtime_fixes", "runtime fixes not applied (--no-fixes)")
    applied = [f.name for f in ctx.fixes if f.applied]
    not_applied = [f"{f.name} ({f.reason})" for f in ctx.fixes if not f.applied]
    reason = f"applied: {', '.join(applied) or 'none'}; not applied: {'; '.join(not_applied) or 'none'}"
    return CheckResult.ok("runtime_fixes", reason, fixes=[asdict(f) for f in ctx.fixes])
