"""Unit tests of the pure functions in nix/gb10.nix (arch flags, build limits, env, config).

Expected values are written out by hand from NVIDIA's naming rules: compute capability X.Y is
sm_XY, its arch-specific variant sm_XYa, its family target XYf (nvcc -arch=sm_121f); GB10 is 12.1.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

G = "(import ./nix/gb10.nix)"


@pytest.mark.parametrize(
    ("fn", "capability", "expected"),
    [
        ("smArch", "12.1", "sm_121"),
        ("archSpecific", "12.1", "sm_121a"),
        ("archSpecific", "12.0", "sm_120a"),
        ("archSpecific", "9.0", "sm_90a"),
        ("familyTarget", "12.1", "121f"),
        ("familyTarget", "10.0", "100f"),
        ("gencode", "12.1", "-gencode=arch=compute_121a,code=sm_121a"),
    ],
)
def test_single_capability_flags(nix_eval, fn, capability, expected):
    assert nix_eval(f'{G}.{fn} "{capability}"') == expected


def test_gb10_family_flag_lists(nix_eval):
    got = nix_eval(
        f"let g = {G}; caps = g.profiles.gb10.familyCapabilities; in {{"
        " inherit caps;"
        " torch = g.torchCudaArchList caps;"
        " torchSpecific = g.torchCudaArchListSpecific caps;"
        " nvte = g.nvteCudaArchs caps;"
        " cmake = g.cmakeCudaArchitectures caps;"
        " sgl = g.sglKernelGencodes caps; }"
    )
    assert got == {
        "caps": ["12.1"],  # the GB10's own: sm_120a cubins never run on it, 121f is one family target
        "torch": "12.1",
        "torchSpecific": "12.1a",
        "nvte": "121f",  # blocker 8: TE's ptx.cuh wants family targets
        "cmake": "121a",
        "sgl": [
            "-gencode=arch=compute_121a,code=sm_121a"
        ],  # blocker 5: SGL_KERNEL_GB10_ONLY keeps these only
    }
    two = nix_eval(
        f'let g = {G}; in {{ nvte = g.nvteCudaArchs [ "12.0" "12.1" ]; cmake = g.cmakeCudaArchitectures [ "12.0" "12.1" ]; }}'
    )
    assert two == {"nvte": "120f;121f", "cmake": "120a;121a"}  # what a user gets by adding "12.0"


def test_the_patch_builds_the_gencodes_gb10_nix_names(nix_eval):
    """patches/sgl-kernel-gb10-only.patch turns SGL_KERNEL_GB10_ARCHS (default 121a, what
    nix/gb10.nix passes on GB10) into -gencode flags of the form nix/gb10.nix's gencode gives."""
    archs = nix_eval(f"let g = {G}; in g.cmakeCudaArchitectures g.profiles.gb10.familyCapabilities")
    gencodes = nix_eval(f"let g = {G}; in g.sglKernelGencodes g.profiles.gb10.familyCapabilities")
    patch = Path(__file__).resolve().parents[2] / "patches" / "sgl-kernel-gb10-only.patch"
    added = [line[1:].strip() for line in patch.read_text().splitlines() if line.startswith("+")]
    assert (
        f'set(SGL_KERNEL_GB10_ARCHS "{archs}" CACHE STRING "sm_12x archs built under SGL_KERNEL_GB10_ONLY")'
        in added
    )
    template = 'list(APPEND SGL_KERNEL_CUDA_FLAGS "-gencode=arch=compute_${SGL_KERNEL_GB10_ARCH},code=sm_${SGL_KERNEL_GB10_ARCH}")'
    assert template in added
    assert [
        template.split('"')[1].replace("${SGL_KERNEL_GB10_ARCH}", a) for a in archs.split(";")
    ] == gencodes


@pytest.mark.parametrize(
    ("memory", "per_job", "reserve", "expected"),
    [
        (128, 24, 16, 4),  # (128-16)/24 = 4.67 -> 4
        (128, 8, 16, 14),  # 112/8
        (16, 24, 16, 1),  # nothing left: still one job
        (8, 24, 16, 1),  # negative headroom: one job, never 0 or negative
        (256, 12, 4, 21),
    ],
)
def test_max_parallel_jobs(nix_eval, memory, per_job, reserve, expected):
    got = nix_eval(
        f"{G}.maxParallelJobs {{ memoryGiB = {memory}; perJobGiB = {per_job}; reserveGiB = {reserve}; }}"
    )
    assert got == expected


def test_gb10_profile_fits_in_unified_memory(nix_eval):
    p = nix_eval(
        f"let g = {G}; in g.profiles.gb10 // {{ mem = g.hardware.memoryGiB; cap = g.hardware.capability; }}"
    )
    assert p["cap"] in p["cudaCapabilities"]
    assert p["sglKernelGb10Only"] is True
    # Worst case: every job runs `threads` cicc processes at ~12 GB each (slime PR #1835 numbers).
    peak = p["sglKernelJobs"] * p["sglKernelNvccThreads"] * 12
    assert 0 < peak <= p["mem"] - 16, peak


def test_server_profile_is_not_gb10_only(nix_eval):
    p = nix_eval(f'({G}.profileFor "x86_64-linux")')
    assert p["sglKernelGb10Only"] is False
    assert "9.0" in p["cudaCapabilities"] and "12.1" not in p["cudaCapabilities"]
    assert nix_eval(f'({G}.profileFor "aarch64-linux").sglKernelGb10Only') is True


@pytest.mark.parametrize(
    ("name", "allowed"),
    [
        ("cuda_nvcc", True),
        ("cuda_cudart", True),
        ("cudnn", True),
        ("libcublas", True),
        ("libcusparse_lt", True),
        ("nccl", True),
        ("cuda-bindings", True),
        ("nvidia-cutlass-dsl", True),
        ("torch", False),
        ("vscode", False),
        ("steam", False),
        ("discord", False),
    ],
)
def test_unfree_allowed_only_for_cuda_and_nvidia(nix_eval, name, allowed):
    assert nix_eval(f'{G}.isAllowedUnfree "{name}"') is allowed


def test_nixpkgs_config(nix_eval):
    got = nix_eval(
        f'let c = {G}.nixpkgsConfigFor {{ system = "aarch64-linux"; getName = p: p.pname; }}; in'
        " { inherit (c) cudaSupport cudaCapabilities cudaForwardCompat;"
        '   nvcc = c.allowUnfreePredicate { pname = "cuda_nvcc"; };'
        '   other = c.allowUnfreePredicate { pname = "unrar"; }; }'
    )
    assert got == {
        "cudaSupport": True,
        "cudaCapabilities": ["12.1"],
        "cudaForwardCompat": True,
        "nvcc": True,
        "other": False,
    }


def test_runtime_env(nix_eval):
    env = nix_eval(f'{G}.runtimeEnv {{ ptxas = "/p/bin/ptxas"; cudaHome = "/cuda"; }}')
    assert env == {
        "TRITON_PTXAS_PATH": "/p/bin/ptxas",
        # Triton >= 3.5 reads this one for sm_100+ (GB10) and ignores TRITON_PTXAS_PATH there
        "TRITON_PTXAS_BLACKWELL_PATH": "/p/bin/ptxas",
        "CUDA_HOME": "/cuda",
        "CUDA_PATH": "/cuda",
        "TORCH_CUDA_ARCH_LIST": "12.1a",
        "PYTORCH_ALLOC_CONF": "expandable_segments:True",
    }
    server = nix_eval(f'{G}.runtimeEnv {{ ptxas = "p"; cudaHome = "c"; system = "x86_64-linux"; }}')
    assert server["TORCH_CUDA_ARCH_LIST"] == "9.0;10.0;12.0"


def test_shell_exports_keep_user_values(nix_eval, tmp_path):
    """Run the generated lines in bash: defaults apply, a value the user already set wins."""
    lines = nix_eval(f'{G}.shellExports {{ A = "1"; B = "/x y"; }}')
    script = lines + 'printf "%s|%s" "$A" "$B"'
    fresh = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env={"PATH": os.environ["PATH"]}
    )
    assert fresh.stdout == "1|/x y"
    user = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env={"PATH": os.environ["PATH"], "A": "mine"}
    )
    assert user.stdout == "mine|/x y"


def test_nixpkgs_config_accepts_what_the_cuda_predicate_or_the_names_accept(nix_eval):
    """nixpkgs' _cuda.lib.allowUnfreeCudaPredicate (where the pin has it) accepts CUDA licences; the
    name prefixes accept NVIDIA's other packages (nvidia-cutlass-dsl is unfreeRedistributable): a
    package passes if either does (issue #37 item 2), anything else stays refused."""
    got = nix_eval(
        f'let c = pred: ({G}.nixpkgsConfigFor {{ system = "aarch64-linux"; getName = p: p.pname;'
        "   cudaPredicate = pred; }).allowUnfreePredicate;"
        '  byLicence = p: (p.license or "") == "nvidia";'
        "  in {"
        '    licensed = c byLicence { pname = "unrar"; license = "nvidia"; };'
        '    named = c byLicence { pname = "nvidia-cutlass-dsl"; license = "other"; };'
        '    neither = c byLicence { pname = "unrar"; license = "other"; };'
        '    fallback = c null { pname = "cuda_nvcc"; license = "other"; };'
        '    fallbackOther = c null { pname = "unrar"; license = "nvidia"; }; }'
    )
    assert got == {
        "licensed": True,
        "named": True,
        "neither": False,
        "fallback": True,
        "fallbackOther": False,
    }


def test_python_and_nix_read_one_set_of_gb10_facts(nix_eval):
    """platform/gb10.json is the only place the GB10's facts are written: nix/gb10.nix reads it, and
    so do devices.py (peaks, the GB10 test) and the doctor (minimum driver)."""
    import json
    from pathlib import Path

    from slime_gb10.platform import devices

    facts = json.loads(
        (Path(__file__).resolve().parents[2] / "python/slime_gb10/platform/gb10.json").read_text()
    )
    nix = nix_eval("(import ./nix/gb10.nix).hardware")
    assert {k: nix[k] for k in facts} == facts
    assert tuple(int(x) for x in nix["minDriverVersion"].split(".")) == devices.GB10_MIN_DRIVER
    assert tuple(int(x) for x in nix["capability"].split(".")) == devices.GB10_CAPABILITY
    peaks = devices.lookup_peaks("NVIDIA GB10", devices.GB10_CAPABILITY)
    assert (peaks.sm_count, peaks.bf16_tflops, peaks.mem_bandwidth_gbs) == (
        nix["smCount"],
        nix["peakTflops"]["bf16"],
        nix["memoryBandwidthGBps"],
    )
    assert peaks.unified_memory and devices.is_unified_memory(devices.GB10_CAPABILITY)
    assert devices.is_sm12x((12, 0)) and not devices.is_sm12x((9, 0)) and not devices.is_sm12x(None)
    assert devices.has_fp4_tensor_cores((10, 0)) and not devices.has_fp4_tensor_cores((9, 0))
    assert devices.is_unified_memory((9, 0), is_integrated=True) and not devices.is_unified_memory((9, 0))
