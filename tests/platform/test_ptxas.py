"""Running ptxas for a verdict: real fake-ptxas executables, and the real ptxas where there is one."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from slime_gb10.platform.ptxas import (
    _blackwell_threshold,
    find_working_ptxas,
    minimal_ptx,
    probe_ptxas,
    triton_dir,
    triton_ptxas,
)


@pytest.mark.parametrize(
    ("kind", "verdict", "needle"),
    [
        ("accept", "accepts", "assembles sm_121a"),
        ("reject", "rejects", "Value 'sm_121a' is not defined for option 'gpu-name'"),
        ("segfault", "crashed", "signal 11"),
        ("exit139", "crashed", "signal 11"),
        ("garbage", "garbage", "did not answer like ptxas"),
        ("crash_on_assemble", "crashed", "signal 11"),
    ],
)
def test_probe_verdicts(make_ptxas, kind, verdict, needle):
    probe = probe_ptxas(make_ptxas(kind), "sm_121a", timeout_s=10)
    assert probe.verdict == verdict
    assert needle in probe.message
    assert probe.ok == (verdict == "accepts")


def test_a_hanging_ptxas_times_out_quickly(make_ptxas):
    start = time.monotonic()
    probe = probe_ptxas(make_ptxas("hang"), "sm_121a", timeout_s=1)
    assert probe.verdict == "timeout" and "ran past 1 s" in probe.message
    assert time.monotonic() - start < 10  # the sleeping grandchild does not keep us waiting for 100 s


def test_missing_and_not_executable(tmp_path):
    assert probe_ptxas(tmp_path / "nope", "sm_90a").verdict == "missing"
    plain = tmp_path / "ptxas"
    plain.write_text("#!/bin/sh\nexit 0\n")
    plain.chmod(0o644)
    probe = probe_ptxas(plain, "sm_90a")
    assert probe.verdict == "missing" and "not executable" in probe.message
    assert probe_ptxas(None, "sm_90a").verdict == "missing"


def _real_ptxas() -> list[str]:
    found = []
    if (tdir := triton_dir()) is not None:
        found += [str(p) for p in (tdir / "backends" / "nvidia" / "bin").glob("ptxas*")]
    for candidate in (shutil.which("ptxas"), "/usr/local/cuda/bin/ptxas"):
        if candidate and os.path.isfile(candidate):
            found.append(candidate)
    return found


@pytest.mark.skipif(not _real_ptxas(), reason="no real ptxas on this machine (Triton bundles one)")
def test_real_ptxas_assembles_our_minimal_module_and_rejects_a_bogus_arch():
    for path in _real_ptxas():
        for arch in ("sm_80", "sm_90a"):
            probe = probe_ptxas(path, arch, timeout_s=60)
            assert probe.verdict == "accepts", (path, probe)
        bogus = probe_ptxas(path, "sm_999a", timeout_s=60)
        assert bogus.verdict == "rejects" and "is not defined for option 'gpu-name'" in bogus.message


def test_minimal_ptx_names_the_target_and_a_ptx_version_that_knows_it():
    text = minimal_ptx("sm_121a")
    assert ".target sm_121a" in text and ".version 8.8" in text and ".entry" in text
    assert ".version 8.0" in minimal_ptx("sm_90a")
    assert ".version 9.0" in minimal_ptx("sm_130a")  # unknown targets get CUDA 13.0's ISA


def test_find_working_ptxas_skips_broken_candidates(make_ptxas, tmp_path):
    candidates = [
        str(tmp_path / "absent"),
        str(make_ptxas("reject")),
        str(make_ptxas("garbage")),
        str(make_ptxas("accept")),
    ]
    found = find_working_ptxas("sm_121a", candidates, timeout_s=10)
    assert found is not None and found.path == candidates[-1]
    assert find_working_ptxas("sm_121a", candidates[:3], timeout_s=10) is None


def test_blackwell_threshold_parses_both_triton_styles(tmp_path):
    v36 = tmp_path / "v36.py"
    v36.write_text(
        "def get_ptxas(arch: int) -> knobs.NvidiaTool:\n"
        "    return knobs.nvidia.ptxas_blackwell if arch >= 100 else knobs.nvidia.ptxas\n\n\n@functools.lru_cache()\n"
    )
    v39 = tmp_path / "v39.py"
    v39.write_text(
        "def get_ptxas(arch: int) -> knobs.NvidiaTool:\n    if arch < 90:\n        return knobs.nvidia.ptxas\n"
        "    return knobs.nvidia.ptxas_blackwell\n\n\n@functools.lru_cache()\n"
    )
    assert _blackwell_threshold(v36) == 100
    assert _blackwell_threshold(v39) == 90
    assert _blackwell_threshold(tmp_path / "absent.py") == 100


@pytest.mark.skipif(triton_dir() is None, reason="Triton not installed")
def test_triton_ptxas_resolution_honours_the_variable_triton_reads():
    bundled = triton_ptxas((12, 1), env={})
    assert bundled.installed and not bundled.from_env and bundled.path == bundled.bundled
    assert Path(bundled.path).parent.name == "bin"
    user = triton_ptxas((12, 1), env={bundled.env_var: "/opt/cuda-13/bin/ptxas"})
    assert user.from_env and user.path == "/opt/cuda-13/bin/ptxas"
    assert "TRITON_PTXAS_PATH" in user.env_vars and bundled.env_var in user.env_vars
