"""``slime-gb10 doctor``: verdicts from real subprocesses (fake tools and packages written to tmp_path).

Where a check needs a GPU's facts, the test hands the check a :class:`Probe` holding what torch
would report on that GPU (the doctor's input), not a mock of the doctor's own functions.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from slime_gb10.doctor import doctor_command, registered_checks
from slime_gb10.platform.checks import (
    CHECKS,
    Check,
    CheckResult,
    ChildResult,
    DoctorContext,
    register_check,
    run_registered,
    summarize,
)
from slime_gb10.platform.checks_packages import PACKAGES, check_package
from slime_gb10.platform.checks_system import check_ptxas_for
from slime_gb10.platform.probe import Probe

GPU_CHECKS = [c.name for c in registered_checks() if c.gpu]
ALL_CHECKS = [c.name for c in registered_checks()]
SGL_KERNEL = next(p for p in PACKAGES if p.check == "sgl_kernel")


def gpu_probe(
    name="NVIDIA GB10", capability=(12, 1), sm=48, cuda="13.0", integrated=True, arch_list=None
) -> Probe:
    """What the torch/CUDA probe child reports on such a machine."""
    return Probe(
        data={
            "torch_importable": True,
            "torch_version": "2.11.0+cu130",
            "torch_cuda": cuda,
            "cudnn_version": 91300,
            "cuda_available": True,
            "device_count": 1,
            "device": {
                "index": 0,
                "name": name,
                "capability": list(capability),
                "sm_count": sm,
                "total_memory": 128 * 2**30,
                "is_integrated": integrated,
            },
            "arch_list": arch_list
            if arch_list is not None
            else ["sm_80", "sm_90", "sm_100", "sm_120", "compute_120"],
            "driver_api_version": 13000,
        }
    )


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run the real CLI as a user would, with no GPU visible (deterministic on GPU machines too)."""
    child_env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "slime_gb10.cli", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env,
    )


# --- the CLI end to end, no GPU ------------------------------------------------------------------


def test_cli_without_gpu_skips_gpu_checks_and_exits_0(tmp_path):
    out_file = tmp_path / "reports" / "doctor.json"
    start = time.monotonic()
    proc = cli("--json", "--json-out", str(out_file))
    assert time.monotonic() - start < 120
    report = json.loads(proc.stdout)
    # Exit 1 exactly when a check fails. On a clean machine none does; an optional package
    # installed without its dependencies (the test set-up's sglang) is a warning, not a fail.
    assert proc.returncode == (1 if report["summary"]["fail"] else 0), proc.stderr
    assert json.loads(out_file.read_text()) == report
    assert [c["name"] for c in report["checks"]] == ALL_CHECKS
    by_name = {c["name"]: c for c in report["checks"]}
    for name in GPU_CHECKS:
        assert by_name[name]["status"] == "skip", by_name[name]
        assert "skipped" in by_name[name]["reason"]
    assert by_name["gpu"]["status"] == "skip" and report["gpu"] is None and report["no_gpu_reason"]
    for check in report["checks"]:
        assert check["status"] in ("ok", "warn", "fail", "skip") and check["reason"]
        if check["status"] in ("warn", "fail"):
            assert check["fix"], check
    assert report["ok"] == (report["summary"]["fail"] == 0)
    assert report["summary"] == {
        s: sum(c["status"] == s for c in report["checks"]) for s in ("ok", "warn", "fail", "skip")
    }


def test_cli_text_output_one_aligned_line_per_check():
    proc = cli()
    lines = proc.stdout.splitlines()
    assert proc.returncode == (1 if any(line.startswith("fail") for line in lines) else 0), proc.stderr
    check_lines = [line for line in lines if line[:4].strip() in ("ok", "warn", "fail", "skip")]
    assert [line.split()[1] for line in check_lines] == ALL_CHECKS
    name_column = {line.index(line.split()[1]) for line in check_lines}
    assert name_column == {6}
    assert lines[-1].startswith(("summary: OK: ", "summary: FAIL: ")) and "GPU checks skipped" in lines[-1]
    for i, line in enumerate(lines):
        if line.startswith(("warn", "fail")):
            assert lines[i + 1].strip().startswith("fix: ")


def test_unknown_option_is_exit_2_without_traceback():
    proc = cli("--no-such-option")
    assert proc.returncode == 2
    assert "No such option" in proc.stderr and "--no-such-option" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_unwritable_json_out_is_a_clear_error_before_any_check(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    proc = cli("--json-out", str(blocker / "report.json"))
    assert proc.returncode == 2
    assert "--json-out" in proc.stderr and "cannot create output directory" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout and proc.stdout == ""
    assert blocker.read_text() == "not a directory"


def test_a_package_installed_without_its_dependencies_is_a_warning_that_says_so(tmp_path, monkeypatch):
    """`scripts/quickstart.sh test` installs sglang with --no-deps (the contract tests read its
    sources): its import fails on a missing dependency, which its own metadata declares. The doctor
    says so (a warning, with how to install it for use), instead of failing the README's first command.
    A package whose declared requirements are all there but still misses a module stays a failure.
    Real distributions on sys.path (METADATA written here) and a real child interpreter."""
    from slime_gb10.platform.checks import DoctorContext
    from slime_gb10.platform.checks_packages import PackageSpec, check_package

    for dist, requires in (("halfpkg", "Requires-Dist: not-installed-dep-xyz\nRequires-Dist: other-dep-xyz; "
                            "sys_platform == 'never'\n"), ("brokenpkg", "")):  # fmt: skip
        (tmp_path / dist).mkdir()
        (tmp_path / dist / "__init__.py").write_text("import not_installed_dep_xyz\n")
        info = tmp_path / f"{dist}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n{requires}")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    importlib.invalidate_caches()
    ctx = DoctorContext(timeout_s=60)
    half = check_package(ctx, PackageSpec("half", "halfpkg", ("halfpkg",), "pip install halfpkg", False, ""))
    assert half.status == "warn" and "installed without its dependencies" in half.reason
    assert "not-installed-dep-xyz" in half.reason and "other-dep-xyz" not in half.reason  # marker: not here
    assert half.fix == "to use it: pip install halfpkg"
    broken = check_package(
        ctx, PackageSpec("broken", "brokenpkg", ("brokenpkg",), "pip install brokenpkg", False, "")
    )
    assert broken.status == "fail" and "a dependency is missing" in broken.reason


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--json-out", "."], "is a directory"),
        (["--timeout", "0"], "--timeout"),
        (["--arch", "sm_12"], "is not an arch like sm_121a"),
        (["--arch", "gb10"], "is not an arch like sm_121a"),
    ],
)
def test_bad_option_values_exit_2(args, message):
    result = CliRunner().invoke(doctor_command, args)
    assert result.exit_code == 2 and message in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_cli_arch_with_a_ptxas_that_rejects_sm_121a_fails_with_the_fix(make_ptxas):
    bad = str(make_ptxas("reject"))
    proc = cli("--arch", "sm_121a", env={"TRITON_PTXAS_PATH": bad, "TRITON_PTXAS_BLACKWELL_PATH": bad})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    (i,) = [n for n, line in enumerate(lines) if line.startswith("fail  triton_ptxas")]
    assert "Value 'sm_121a' is not defined for option 'gpu-name'" in lines[i] and "blocker #1" in lines[i]
    assert "fix: point $TRITON_PTXAS" in lines[i + 1] and "/usr/local/cuda/bin/ptxas" in lines[i + 1]
    assert lines[-1].startswith("summary: FAIL: ")


def test_cli_with_a_hanging_ptxas_finishes(make_ptxas):
    hang = str(make_ptxas("hang"))
    start = time.monotonic()
    proc = cli(
        "--arch",
        "sm_121a",
        "--timeout",
        "5",
        env={"TRITON_PTXAS_PATH": hang, "TRITON_PTXAS_BLACKWELL_PATH": hang},
    )
    assert time.monotonic() - start < 90
    assert proc.returncode == 1
    line = next(line for line in proc.stdout.splitlines() if line.startswith("fail  triton_ptxas"))
    assert "ran past 5 s" in line


# --- the ptxas check -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "status", "needle"),
    [
        ("accept", "ok", "assembles sm_121a"),
        ("reject", "fail", "blocker #1"),
        ("hang", "fail", "ran past 1 s"),
        ("segfault", "fail", "killed by signal 11"),
        ("exit139", "fail", "killed by signal 11"),
        ("garbage", "fail", "Triton falls back to its bundled"),
    ],
)
def test_ptxas_check_verdicts(make_ptxas, monkeypatch, kind, status, needle):
    fake = str(make_ptxas(kind))
    monkeypatch.setenv("TRITON_PTXAS_PATH", fake)
    monkeypatch.setenv("TRITON_PTXAS_BLACKWELL_PATH", fake)
    result = check_ptxas_for("sm_121a", timeout_s=1 if kind == "hang" else 10)
    assert result.status == status and needle in result.reason, result
    assert result.details["path"] == fake
    if status == "fail":
        assert "TRITON_PTXAS" in result.fix and "ptxas" in result.fix


def test_ptxas_check_reads_path_too(make_ptxas, monkeypatch):
    """PATH matters to the fix: a CUDA 13 ptxas first on PATH is what apply_runtime_fixes would pick."""
    from slime_gb10.platform.ptxas import ptxas_candidates

    good = make_ptxas("accept")
    monkeypatch.setenv("PATH", f"{good.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert str(good) in ptxas_candidates()


# --- the package checks, with fake packages on PYTHONPATH ----------------------------------------


@pytest.fixture
def fake_packages(tmp_path, monkeypatch):
    """Write packages into tmp_path/site, visible here (find_spec) and in the doctor's children."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")

    def write(name: str, init: str, files: dict[str, bytes] | None = None) -> Path:
        pkg = site / name
        pkg.mkdir()
        (pkg / "__init__.py").write_text(textwrap.dedent(init))
        for rel, data in (files or {}).items():
            (pkg / rel).write_bytes(data)
        return pkg

    return write


@pytest.mark.parametrize(
    ("init", "needle"),
    [
        (
            "raise ImportError('/x/sgl_kernel/common_ops.so: undefined symbol: _ZN3c1017RegisterOperatorsD1Ev')",
            "blocker #3",
        ),
        (
            "raise ImportError('libnvrtc.so.12: cannot open shared object file: No such file or directory')",
            "blocker #2",
        ),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", "killed by signal 11"),
        ("import time\ntime.sleep(100)", "ran past its time limit"),
    ],
)
def test_package_import_failures_are_classified(fake_packages, init, needle):
    fake_packages("sgl_kernel", init)
    ctx = DoctorContext(timeout_s=3, probe=gpu_probe())
    result = check_package(ctx, SGL_KERNEL)
    assert result.status == "fail" and needle in result.reason, result
    assert "build sgl-kernel from source against this torch" in result.fix


def test_cli_reports_a_package_built_against_another_torch(fake_packages):
    fake_packages(
        "sgl_kernel",
        "raise ImportError('/x/common_ops.so: undefined symbol: _ZN3c104impl3cow11cow_deleterEPv')",
    )
    proc = cli()
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    (i,) = [n for n, line in enumerate(lines) if line.startswith("fail  sgl_kernel")]
    assert "undefined symbol" in lines[i] and "blocker #3" in lines[i]
    assert lines[i + 1].strip().startswith("fix: build sgl-kernel from source")


COMPILED_OK = "__version__ = '0.3.99'\n"


@pytest.mark.parametrize(
    ("probe", "status", "needle"),
    [
        (gpu_probe(), "ok", "compute_120, sm_120 runs on sm_121a"),
        (gpu_probe("NVIDIA H100 80GB HBM3", (9, 0), 132, integrated=False), "ok", "sm_90a runs on sm_90a"),
        (gpu_probe("NVIDIA A100-SXM4-80GB", (8, 0), 108, integrated=False), "fail", "none runs on sm_80"),
    ],
)
def test_compiled_package_archs_come_from_cuobjdump(fake_packages, cuobjdump_on_path, probe, status, needle):
    pkg = fake_packages("sgl_kernel", COMPILED_OK, {"common_ops.so": b"not really ELF"})
    (pkg.parent / "sgl_kernel_torch.so").write_bytes(b"an extension module next to the package")
    result = check_package(DoctorContext(timeout_s=10, probe=probe), SGL_KERNEL)
    assert result.status == status and needle in result.reason, result
    assert result.details["so_files"] == 2
    assert result.details["sass"] == ["sm_100a", "sm_120", "sm_90a"] and result.details["ptx"] == [
        "compute_120"
    ]


def test_no_sm12x_code_on_gb10_is_blocker_4(fake_packages, tmp_path, monkeypatch):
    script = tmp_path / "bin" / "cuobjdump"
    script.parent.mkdir()
    script.write_text(
        '#!/bin/sh\n[ "$1" = --list-elf ] && echo "ELF file    1: common_ops.1.sm_100a.cubin"\nexit 0\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    fake_packages("sgl_kernel", COMPILED_OK, {"common_ops.so": b"x"})
    result = check_package(DoctorContext(timeout_s=10, probe=gpu_probe()), SGL_KERNEL)
    assert result.status == "fail" and "carries sm_100a: none runs on sm_121a (blocker #4)" in result.reason


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build a real shared object")
def test_cuda12_library_in_needed_entries_is_blocker_2(fake_packages, tmp_path):
    build = tmp_path / "build"
    build.mkdir()
    (build / "stub.c").write_text("int cudaStub(void) { return 0; }\n")
    (build / "ops.c").write_text("int cudaStub(void);\nint ops(void) { return cudaStub(); }\n")
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-Wl,-soname,libcudart.so.12",
            "-o",
            str(build / "libcudart.so.12"),
            str(build / "stub.c"),
        ],
        check=True,
    )
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-o",
            str(build / "common_ops.so"),
            str(build / "ops.c"),
            str(build / "libcudart.so.12"),
        ],
        check=True,
    )
    fake_packages("sgl_kernel", COMPILED_OK, {"common_ops.so": (build / "common_ops.so").read_bytes()})
    result = check_package(DoctorContext(timeout_s=10, probe=gpu_probe(cuda="13.0")), SGL_KERNEL)
    assert (
        result.status == "fail" and "needs libcudart.so.12" in result.reason and "blocker #2" in result.reason
    )
    # on a CUDA 12 system the same library is fine (no verdict from NEEDED entries)
    same = check_package(DoctorContext(timeout_s=10, probe=gpu_probe(cuda="12.8")), SGL_KERNEL)
    assert "blocker #2" not in same.reason


def test_elf_needed_agrees_with_readelf():
    from slime_gb10.platform.binaries import elf_needed

    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf (binutils) not installed")
    lib = Path(sys.executable).resolve()
    out = subprocess.run([readelf, "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    expected = [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]
    assert elf_needed(lib) == expected and expected


# --- verdicts from the GPU's facts ---------------------------------------------------------------


def _run(name: str, probe: Probe, **ctx_kwargs) -> CheckResult:
    check = next(c for c in CHECKS if c.name == name)
    return run_registered(DoctorContext(timeout_s=10, probe=probe, **ctx_kwargs), [check])[0]


def test_gpu_check_reports_the_device():
    result = _run("gpu", gpu_probe())
    assert result.status == "ok" and result.reason.startswith("NVIDIA GB10 (sm_121a, 48 SMs, 128.0 GiB)")
    assert result.details["device"]["capability"] == [12, 1]


def test_driver_too_old_for_torchs_cuda_fails(tmp_path, monkeypatch):
    probe = gpu_probe(cuda="13.0")
    probe.data["driver_api_version"] = 12080  # what cuDriverGetVersion returns for a CUDA 12.8 driver
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi: the driver API version alone decides
    result = _run("driver", probe)
    assert result.status == "fail" and "driver supports CUDA 12.8 but torch needs CUDA 13.0" in result.reason


def test_cuda12_torch_on_sm121_fails():
    result = _run("cuda_runtime", gpu_probe(cuda="12.8"))
    assert result.status == "fail" and "blockers #1/#2" in result.reason and "cu130" in result.fix
    assert _run("cuda_runtime", gpu_probe(cuda="13.0")).status == "ok"


def test_arch_list_sm120_binaries_cover_sm121():
    ok = _run("torch_arch_list", gpu_probe(arch_list=["sm_80", "sm_90", "sm_120"]))
    assert ok.status == "ok" and "sm_120 runs on sm_121a" in ok.reason
    bad = _run("torch_arch_list", gpu_probe(arch_list=["sm_80", "sm_90", "sm_100", "compute_100a"]))
    assert bad.status == "fail" and bad.fix


def test_unified_memory_allocator_setting(monkeypatch):
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    warn = _run("unified_memory", gpu_probe())
    assert warn.status == "warn" and "PYTORCH_ALLOC_CONF=expandable_segments:True" in warn.fix
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    assert _run("unified_memory", gpu_probe()).status == "ok"
    discrete = _run("unified_memory", gpu_probe("NVIDIA H100 80GB HBM3", (9, 0), 132, integrated=False))
    assert discrete.status == "ok" and "discrete" in discrete.reason


@pytest.mark.parametrize(
    ("driver", "status"), [("580.82.07", "fail"), ("580.95.05", "ok"), ("590.48.01", "ok")]
)
def test_gb10_driver_version_from_nvidia_smi(tmp_path, monkeypatch, driver, status):
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(f"#!/bin/sh\necho '{driver}'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    result = _run("driver", gpu_probe())
    assert result.status == status and driver in result.reason
    if status == "fail":
        assert "580.95" in result.reason and result.fix


def test_gpu_checks_skip_with_the_reason_when_no_gpu():
    probe = Probe(
        data={
            "torch_importable": True,
            "torch_version": "2.13.0",
            "torch_cuda": "13.0",
            "cuda_available": False,
        }
    )
    result = _run("cublas_bf16", probe)
    assert result.status == "skip" and "no CUDA GPU visible" in result.reason


def test_omegaconf_broken_by_antlr_is_blocker_13(fake_packages):
    fake_packages(
        "omegaconf",
        """
        class OmegaConf:
            @staticmethod
            def create(cfg):
                raise Exception("Could not deserialize ATN with version 3 (expected 4).")
        """,
    )
    result = _run("antlr4_omegaconf", Probe(data={}))
    assert result.status == "fail" and "blocker #13" in result.reason
    assert result.fix == "pip install antlr4-python3-runtime==4.9.3"


# --- the registry ----------------------------------------------------------------------------------


def test_a_crashing_or_hanging_check_becomes_a_fail_line():
    def crashes(ctx):
        raise RuntimeError("boom")

    def hangs(ctx):
        time.sleep(30)
        return CheckResult("hangs", "ok", "never")

    ctx = DoctorContext(timeout_s=0.5, probe=Probe(data={}), grace_s=0.5)
    start = time.monotonic()
    crashed, hung = run_registered(
        ctx, [Check("crashes", crashes, False, ""), Check("hangs", hangs, False, "")]
    )
    assert time.monotonic() - start < 5
    assert crashed.status == "fail" and "RuntimeError: boom" in crashed.reason and crashed.fix
    assert hung.status == "fail" and "did not finish within 1 s" in hung.reason


def test_register_check_adds_in_order_and_refuses_duplicates():
    @register_check("example_extra", before="runtime_fixes")
    def extra(ctx):
        """An extra check another module could add."""
        return CheckResult("example_extra", "ok", "fine")

    try:
        names = [c.name for c in CHECKS]
        assert names.index("example_extra") == names.index("runtime_fixes") - 1
        with pytest.raises(ValueError, match="already registered"):
            register_check("example_extra")(extra)
    finally:
        CHECKS[:] = [c for c in CHECKS if c.name != "example_extra"]


def test_check_result_rejects_unknown_status():
    with pytest.raises(ValueError, match="status must be one of"):
        CheckResult("x", "fine", "y")  # type: ignore[arg-type]


# --- on a real GPU ---------------------------------------------------------------------------------


@pytest.mark.gpu
def test_doctor_on_a_real_gpu_has_no_fail():
    proc = subprocess.run(
        [sys.executable, "-m", "slime_gb10.cli", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(proc.stdout)
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert not failed and proc.returncode == 0, failed
    by_name = {c["name"]: c for c in report["checks"]}
    assert report["gpu"] is not None
    for name in (
        "gpu",
        "driver",
        "compute_capability",
        "torch_arch_list",
        "triton_ptxas",
        "triton_jit",
        "cublas_bf16",
    ):
        assert by_name[name]["status"] == "ok", by_name[name]
    assert summarize([CheckResult(**c) for c in report["checks"]])["fail"] == 0


def test_grpo_backend_pair_names():
    from slime_gb10.grpo.selfcheck import grpo_backend_pair

    assert grpo_backend_pair(True, True) == "sglang+megatron"
    # auto never mixes: the production pair only when both run (explicit --rollout/--trainer may mix)
    assert grpo_backend_pair(False, True) == "torch+torch"
    assert grpo_backend_pair(True, False) == "torch+torch"
    assert grpo_backend_pair(False, False) == "torch+torch"


def test_grpo_backends_without_gpu_is_the_pytorch_path():
    from slime_gb10.grpo.selfcheck import check_grpo_backends
    from slime_gb10.platform.checks import DoctorContext

    ctx = DoctorContext()
    if ctx.gpu:
        pytest.skip("this machine has a GPU: the child probe decides")
    result = check_grpo_backends(ctx)
    assert result.status == "ok" and result.reason.startswith("auto = torch+torch")


@pytest.mark.parametrize(
    ("sglang", "megatron", "probe", "status"),
    [
        (False, True, gpu_probe(), "warn"),  # GB10 without SGLang: the PyTorch pair, said so
        (True, True, gpu_probe(), "ok"),
        (False, False, gpu_probe(capability=(9, 0), name="NVIDIA H100 80GB HBM3", integrated=False), "ok"),
    ],
)
def test_grpo_backends_verdicts(monkeypatch, sglang, megatron, probe, status):
    """The pair ``auto`` picks from what the probe child prints: a warning on a GB10 without the
    production pair (the same reason, its caveat after a colon, and the fix), else ok."""
    from slime_gb10.grpo import selfcheck

    child = {"sglang": [sglang, "sglang why"], "megatron": [megatron, "megatron why"]}
    monkeypatch.setattr(
        selfcheck, "run_child_module", lambda module, timeout, *a, **k: ChildResult(0, "", "", child)
    )
    result = selfcheck.check_grpo_backends(DoctorContext(timeout_s=10, probe=probe))
    pair = "sglang+megatron" if sglang and megatron else "torch+torch"
    reason = f"auto = {pair} (sglang: sglang why; megatron: megatron why)"
    assert result.status == status and result.details["pair"] == pair
    if status == "warn":
        assert result.reason == f"{reason}: GB10 runs best on sglang+megatron" and "nix develop" in result.fix
    else:
        assert result.reason == reason and result.fix is None


def test_sglang_router_is_optional_but_a_broken_one_warns(tmp_path, monkeypatch):
    """One-GPU colocated runs never use the router: missing is a skip; an install whose import
    fails (blocker #12: the x86_64-only fork wheel) is a warning with the fix. Real packages on
    sys.path and a real child interpreter, nothing of the doctor mocked."""
    from slime_gb10.platform.checks import DoctorContext
    from slime_gb10.platform.checks_system import check_sglang_router

    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    ctx = DoctorContext(timeout_s=30)
    if importlib.util.find_spec("sglang_router") is None:
        result = check_sglang_router(ctx)
        assert result.status == "skip" and "not needed" in result.reason
    (tmp_path / "sglang_router").mkdir()
    (tmp_path / "sglang_router" / "__init__.py").write_text(
        "raise ImportError('sglang_router_rs.so: cannot open shared object file (wrong architecture)')\n"
    )
    importlib.invalidate_caches()
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    result = check_sglang_router(ctx)
    assert result.status == "warn" and "blocker #12" in result.reason
    assert "pip install --force-reinstall sglang-router" in result.fix


@pytest.mark.parametrize(
    ("child", "status", "phrase"),
    [
        (
            {"cuda_available": True, "cuda": 1.7e-3, "triton": 1.6e-3, "wide": 1.5e-3},
            "ok",
            "CUDA (NVRTC, M <= 32), Triton and wide Triton",
        ),
        (
            {"cuda_available": False, "triton": 1.6e-3, "wide": 1.5e-3},
            "warn",
            "CUDA kernel for M <= 32 is unavailable",
        ),
        (
            {"cuda_available": True, "cuda": 0.4, "triton": 1.6e-3, "wide": 1.5e-3},
            "fail",
            "CUDA W4A16 kernel (NVRTC) is wrong",
        ),
        (
            {"cuda_available": True, "cuda": "OSError: no NVRTC", "triton": 1.6e-3, "wide": 1.5e-3},
            "fail",
            "OSError: no NVRTC",
        ),
        (
            {"cuda_available": False, "triton": "RuntimeError: ptxas", "wide": 1.5e-3},
            "fail",
            "Triton W4A16 kernel is wrong",
        ),
        (
            {"cuda_available": True, "cuda": 1.7e-3, "triton": 1.6e-3, "wide": 0.3},
            "fail",
            "wide Triton W4A16 kernel (M > 16) is wrong",
        ),
    ],
)
def test_w4a16_kernels_verdicts(monkeypatch, child, status, phrase):
    """The verdicts from what the probe child prints (the child itself runs on the GPU: test_doctor_on_a_real_gpu)."""
    from slime_gb10.nvfp4 import selfcheck  # where the check lives (and looks these two up)

    monkeypatch.setattr(selfcheck, "installed", lambda name: True)
    monkeypatch.setattr(
        selfcheck, "run_child_module", lambda module, timeout, *a, **k: ChildResult(0, "", "", child)
    )
    result = _run(
        "w4a16_kernels", gpu_probe(capability=(9, 0), name="NVIDIA H100 80GB HBM3", integrated=False)
    )
    assert result.status == status and phrase in result.reason
    if status != "ok":
        assert result.fix


def test_a_package_whose_import_crashes_is_a_fail_line_not_a_dead_doctor(fake_packages, tmp_path):
    """``megatron`` segfaults on import: the doctor must not import it itself (``find_spec`` on a
    dotted name imports the parent), so it reports the crash and prints its whole report."""
    pkg = fake_packages("megatron", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    (pkg / "core").mkdir()
    (pkg / "core" / "__init__.py").write_text("")
    # looking it up imports nothing (in a fresh interpreter: this one may hold the real megatron)
    probe = subprocess.run(
        [sys.executable, "-c",
         "import sys; from slime_gb10.platform.checks import installed;"
         "print(installed('megatron.core'), installed('megatron.nosuch'), 'megatron' in sys.modules)"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert probe.returncode == 0 and probe.stdout.split() == ["True", "False", "False"], probe
    proc = cli("--timeout", "20")
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    line = next(x for x in proc.stdout.splitlines() if x.startswith("fail  megatron_core"))
    assert "killed by signal 11" in line
    assert proc.stdout.splitlines()[-1].startswith("summary:")


def test_the_runtime_fix_step_keeps_to_one_time_budget(make_ptxas):
    """Triton's ptxas and two CUDA 13 candidates all hang: the fix gives up within its budget
    (before: each probe had the full limit, three hangs took three limits)."""
    from slime_gb10.platform.fixes import fix_triton_ptxas
    from slime_gb10.platform.ptxas import TritonPtxas

    hang = str(make_ptxas("hang"))
    triton = TritonPtxas(True, "3.6.0", "TRITON_PTXAS_BLACKWELL_PATH", hang, False, hang)
    gb10 = gpu_probe().facts()
    start = time.monotonic()
    fix = fix_triton_ptxas(gb10, triton=triton, candidates=[hang, hang], timeout_s=2)
    elapsed = time.monotonic() - start
    assert not fix.applied and elapsed < 4.0, elapsed  # one budget (2 s) + the kill, not 3 x 2 s


def test_a_tool_that_exits_but_leaves_a_grandchild_holding_stdout(tmp_path):
    """It exited 0: report that (not a timeout), and kill the grandchild, which would run on."""
    from slime_gb10.platform import subproc

    script = tmp_path / "tool"
    script.write_text('#!/bin/sh\n(sleep 100; echo late) &\necho "child $!"\nexit 0\n')
    script.chmod(0o755)
    start = time.monotonic()
    done = subproc.run([str(script)], timeout_s=20)
    assert done.returncode == 0 and time.monotonic() - start < 5
    pid = int(done.stdout.split("child ")[1].split()[0])
    for _ in range(50):  # the kill is immediate; give the kernel a moment to reap it
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"grandchild {pid} still running")


def test_the_report_order_comes_from_the_registry_whatever_was_imported_first():
    """Checks registered by modules above the platform layer sit where their ``before`` says, even
    when those modules were imported before the platform's own (a fresh interpreter each)."""
    expected = [
        "platform", "python", "torch", "gpu", "driver", "cuda_runtime", "compute_capability", "torch_arch_list",
        "triton_ptxas", "triton_jit", "cublas_bf16", "sglang", "sgl_kernel", "megatron_core",
        "transformer_engine", "te_nvfp4", "w4a16_kernels", "unified_memory", "cudnn", "antlr4_omegaconf",
        "megatron_training", "tilelang_z3", "sglang_router", "cuda_headers", "grpo_backends", "distributed",
        "runtime_fixes",
    ]  # fmt: skip
    for first in (
        "slime_gb10.grpo.selfcheck",
        "slime_gb10.nvfp4.selfcheck",
        "slime_gb10.platform.checks_system",
    ):
        code = (
            f"import json, {first}, slime_gb10.doctor as d; "
            "print(json.dumps([c.name for c in d.registered_checks()]))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
        )
        assert json.loads(out.stdout) == expected, first


def test_a_probe_child_that_printed_nothing_is_the_checks_failure_naming_how_it_ended(monkeypatch):
    """``ChildResult.failed``, which the probing checks share: None when the child printed its JSON
    line; else one line, "<what> <how it ended><then>", as a failure or a warning, with the fix.
    Through a real check too: cublas_bf16 whose child was killed by the time limit."""
    from slime_gb10.platform import checks_system
    from slime_gb10.platform.checks import ChildResult, DoctorContext

    assert ChildResult(0, "{}", "", {}).failed("x", "the probe", "fix it") is None
    crashed = ChildResult(1, "", "Traceback (most recent call last):\n  ...\nValueError: boom\n", None)
    result = crashed.failed("x", "the probe", "fix it", warn=True, then=" (blocker #12)", extra=1)
    assert (result.status, result.reason, result.fix) == (
        "warn",
        "the probe exited 1: ValueError: boom (blocker #12)",
        "fix it",
    )
    assert result.details == {"extra": 1}
    killed = ChildResult(-9, "", "", None).failed("x", "the probe", "fix it")
    assert (killed.status, killed.reason) == ("fail", "the probe was killed by signal 9")

    monkeypatch.setattr(checks_system, "run_child_module", lambda *a, **k: ChildResult(None, "", "", None))
    check = checks_system.check_cublas_bf16(DoctorContext())
    assert check.status == "fail" and check.reason == "the BF16 GEMM ran past its time limit and was killed"
    assert "reinstall a CUDA 13 torch" in check.fix
