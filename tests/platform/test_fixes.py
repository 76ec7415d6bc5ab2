"""The runtime fixes: set / respected when user-set / disabled / logged once / never on import.

Process-wide behaviour (import side effects, "once per process", environment variables read by
the fixes) is tested in fresh child interpreters; the ptxas fix is tested in-process with real
fake-ptxas executables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from slime_gb10.platform.fixes import (
    FIX_NAMES,
    apply_runtime_fixes,
    fix_alloc_expandable,
    fix_triton_ptxas,
    resolve_fix_names,
)
from slime_gb10.platform.probe import DeviceFacts
from slime_gb10.platform.ptxas import TritonPtxas, probe_ptxas, triton_dir, triton_ptxas

GB10 = DeviceFacts("NVIDIA GB10", (12, 1), sm_count=48, unified_memory=True)
H100 = DeviceFacts("NVIDIA H100 80GB HBM3", (9, 0), sm_count=132, unified_memory=False)

FIX_ENV = (
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
    "SLIME_GB10_DISABLE_FIXES",
    "SLIME_GB10_NO_FIXES",
    "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM",
)


def run_in_child(body: str, **env: str) -> dict:
    """Run ``body`` in a fresh python (clean of the fixes' variables plus ``env``); it prints one JSON line."""
    child_env = {k: v for k, v in os.environ.items() if k not in FIX_ENV}
    child_env.update(env)
    code = textwrap.dedent(
        """
        import json, logging, os, sys
        from slime_gb10.platform import DeviceFacts, apply_runtime_fixes
        GB10 = DeviceFacts("NVIDIA GB10", (12, 1), sm_count=48, unified_memory=True)
        H100 = DeviceFacts("NVIDIA H100 80GB HBM3", (9, 0), sm_count=132, unified_memory=False)
        """
    ) + textwrap.dedent(body)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_the_package_changes_nothing():
    out = run_in_child(
        """
        before = dict(os.environ)
        import slime_gb10, slime_gb10.platform, slime_gb10.doctor, slime_gb10.platform.fixes
        slime_gb10.doctor.registered_checks()
        print(json.dumps({"same": dict(os.environ) == before, "torch": "torch" in sys.modules}))
        """
    )
    assert out == {"same": True, "torch": False}


ALLOC_ONLY = """
fixes = apply_runtime_fixes(device={device}, disable={disable})
alloc = [f for f in fixes if f.name == "alloc_expandable"][0]
print(json.dumps({{"env": os.environ.get("PYTORCH_ALLOC_CONF"), "applied": alloc.applied, "reason": alloc.reason}}))
"""


def test_alloc_is_set_on_unified_memory():
    out = run_in_child(ALLOC_ONLY.format(device="GB10", disable=["ptxas", "inductor"]))
    assert out == {"env": "expandable_segments:True", "applied": True, "reason": "unified memory"}


def test_alloc_not_set_on_discrete_memory():
    out = run_in_child(ALLOC_ONLY.format(device="H100", disable=["ptxas", "inductor"]))
    assert out["env"] is None and not out["applied"]


@pytest.mark.parametrize("var", ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"])
def test_alloc_respects_a_user_setting(var):
    out = run_in_child(
        ALLOC_ONLY.format(device="GB10", disable=["ptxas", "inductor"]),
        **{var: "backend:cudaMallocAsync"},
    )
    assert not out["applied"] and f"respecting the user's {var}" in out["reason"]
    assert out["env"] == ("backend:cudaMallocAsync" if var == "PYTORCH_ALLOC_CONF" else None)


@pytest.mark.parametrize(
    ("disable", "env"),
    [
        (["alloc"], {}),
        (["alloc_expandable"], {}),
        ([], {"SLIME_GB10_DISABLE_FIXES": "inductor, alloc"}),
        ([], {"SLIME_GB10_NO_FIXES": "1"}),
    ],
)
def test_alloc_can_be_disabled_by_argument_and_by_env(disable, env):
    out = run_in_child(ALLOC_ONLY.format(device="GB10", disable=[*disable, "ptxas", "inductor"]), **env)
    assert out == {"env": None, "applied": False, "reason": "disabled"}


def test_each_fix_is_logged_once_and_applying_again_changes_nothing():
    out = run_in_child(
        """
        records = []
        class Keep(logging.Handler):
            def emit(self, record):
                records.append(record.getMessage())
        log = logging.getLogger("test-fixes"); log.setLevel(logging.DEBUG); log.addHandler(Keep())
        first = apply_runtime_fixes(device=GB10, disable=["ptxas", "inductor"], logger=log)
        os.environ["PYTORCH_ALLOC_CONF"] = "changed-by-user-later"
        second = apply_runtime_fixes(device=GB10, disable=["ptxas", "inductor"], logger=log)
        print(json.dumps({"records": records, "same": first == second, "env": os.environ["PYTORCH_ALLOC_CONF"]}))
        """
    )
    alloc_lines = [r for r in out["records"] if "alloc_expandable" in r]
    assert len(alloc_lines) == 1 and "applied (unified memory)" in alloc_lines[0]
    assert out["same"] and out["env"] == "changed-by-user-later"


def test_unknown_fix_names_are_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown runtime fix 'alocc'.*triton_ptxas, alloc_expandable"):
        apply_runtime_fixes(disable=["alocc"], device=None)
    assert resolve_fix_names(["ptxas", "Inductor", "all"]) == set(FIX_NAMES)


def test_a_typo_in_the_disable_env_var_is_warned_about_not_fatal():
    out = run_in_child(
        """
        records = []
        class Keep(logging.Handler):
            def emit(self, record):
                records.append((record.levelname, record.getMessage()))
        log = logging.getLogger("t"); log.addHandler(Keep())
        fixes = apply_runtime_fixes(device=GB10, logger=log, disable=["inductor"])
        print(json.dumps({"records": records, "alloc": os.environ.get("PYTORCH_ALLOC_CONF")}))
        """,
        SLIME_GB10_DISABLE_FIXES="ptxas,alocc",
    )
    assert [
        out["records"][0][0],
        out["records"][0][1].split("triton_ptxas")[0],
    ] == ["WARNING", "unknown runtime fix 'alocc' in SLIME_GB10_DISABLE_FIXES; known: "]
    assert out["alloc"] == "expandable_segments:True"


INDUCTOR = """
import torch
import torch._inductor.config as cfg
import torch._inductor.utils as iu
original_flag = cfg.max_autotune_gemm
fixes = apply_runtime_fixes(device={device}, disable=["ptxas", "alloc"])
fix = [f for f in fixes if f.name == "inductor_max_autotune"][0]
print(json.dumps({{
    "applied": fix.applied, "reason": fix.reason, "patched": getattr(iu.is_big_gpu, "_slime_gb10", False),
    "big": iu.is_big_gpu(torch.device("cuda", 0)) if getattr(iu.is_big_gpu, "_slime_gb10", False) else None,
    "flag": cfg.max_autotune_gemm, "flag_before": original_flag,
}}))
"""


@pytest.mark.slow
def test_inductor_autotune_is_forced_below_68_sms():
    out = run_in_child(INDUCTOR.format(device="GB10"))
    assert out["applied"] and out["patched"] and out["big"] is True
    assert out["flag"] is True and out["flag_before"] is False
    assert "48 SMs < 68" in out["reason"]


@pytest.mark.slow
def test_inductor_untouched_on_a_big_gpu_and_user_flag_respected():
    big = run_in_child(INDUCTOR.format(device="H100"))
    assert not big["applied"] and not big["patched"] and big["flag"] is False
    user = run_in_child(INDUCTOR.format(device="GB10"), TORCHINDUCTOR_MAX_AUTOTUNE_GEMM="0")
    assert user["applied"] and user["patched"] and user["flag"] is False
    assert "respecting TORCHINDUCTOR_MAX_AUTOTUNE_GEMM=0" in user["reason"]


# --- triton_ptxas, in-process with real fake executables -----------------------------------------


def _triton_with(bundled: str) -> TritonPtxas:
    return TritonPtxas(True, "3.6.0", "TRITON_PTXAS_BLACKWELL_PATH", bundled, False, bundled)


def test_ptxas_fix_points_triton_at_a_working_ptxas(make_ptxas, restore_environ, triton_env_clean):
    good = str(make_ptxas("accept"))
    fix = fix_triton_ptxas(
        GB10, triton=_triton_with(str(make_ptxas("reject"))), candidates=[str(make_ptxas("garbage")), good]
    )
    assert fix.applied and "rejects sm_121a" in fix.reason and "ptxas 13.0" in fix.reason
    assert os.environ["TRITON_PTXAS_BLACKWELL_PATH"] == good == os.environ["TRITON_PTXAS_PATH"]
    assert fix.env == {"TRITON_PTXAS_BLACKWELL_PATH": good, "TRITON_PTXAS_PATH": good}


def test_ptxas_fix_without_a_working_candidate_says_so(make_ptxas, restore_environ, triton_env_clean):
    fix = fix_triton_ptxas(
        GB10,
        triton=_triton_with(str(make_ptxas("reject"))),
        candidates=[str(make_ptxas("hang"))],
        timeout_s=1,
    )
    assert not fix.applied and "no CUDA 13 ptxas was found" in fix.reason
    assert "TRITON_PTXAS_PATH" not in os.environ


def test_ptxas_fix_not_needed_when_tritons_ptxas_works(make_ptxas, restore_environ, triton_env_clean):
    fix = fix_triton_ptxas(GB10, triton=_triton_with(str(make_ptxas("accept"))), candidates=[])
    assert not fix.applied and "already assembles sm_121a" in fix.reason
    assert not fix_triton_ptxas(H100).applied and not fix_triton_ptxas(None).applied


def test_ptxas_fix_respects_a_user_set_variable(make_ptxas, restore_environ, triton_env_clean, monkeypatch):
    user = str(make_ptxas("reject"))
    monkeypatch.setenv("TRITON_PTXAS_BLACKWELL_PATH", user)  # the variable Triton 3.6 reads for sm_121a
    fix = fix_triton_ptxas(
        GB10, triton=_triton_with(str(make_ptxas("reject"))), candidates=[str(make_ptxas("accept"))]
    )
    assert not fix.applied and "respecting the user's TRITON_PTXAS_BLACKWELL_PATH" in fix.reason
    assert os.environ["TRITON_PTXAS_BLACKWELL_PATH"] == user and "TRITON_PTXAS_PATH" not in os.environ


def test_triton_ptxas_path_alone_reaches_blackwell(
    make_ptxas, restore_environ, triton_env_clean, monkeypatch
):
    """Triton >= 3.5 ignores TRITON_PTXAS_PATH for sm_100+: a working one set alone (as the flake's
    environment did) is copied to TRITON_PTXAS_BLACKWELL_PATH; a broken one is left as the user set
    it while the Blackwell variable gets a working ptxas."""
    good = str(make_ptxas("accept"))
    monkeypatch.setenv("TRITON_PTXAS_PATH", good)
    fix = fix_triton_ptxas(GB10, triton=_triton_with(str(make_ptxas("reject"))), candidates=[])
    assert fix.applied and "reads TRITON_PTXAS_BLACKWELL_PATH for sm_121a" in fix.reason
    assert os.environ["TRITON_PTXAS_BLACKWELL_PATH"] == good
    del os.environ["TRITON_PTXAS_BLACKWELL_PATH"]
    bad = str(make_ptxas("reject"))
    monkeypatch.setenv("TRITON_PTXAS_PATH", bad)
    fix = fix_triton_ptxas(GB10, triton=_triton_with(str(make_ptxas("reject"))), candidates=[good])
    assert fix.applied and os.environ["TRITON_PTXAS_BLACKWELL_PATH"] == good
    assert os.environ["TRITON_PTXAS_PATH"] == bad


@pytest.mark.skipif(triton_dir() is None, reason="Triton not installed")
def test_after_the_fix_tritons_ptxas_assembles_sm_121a_when_this_machine_has_one(
    restore_environ, triton_env_clean
):
    """On the real installed Triton: if any ptxas here knows sm_121a, Triton ends up using one."""
    fix = fix_triton_ptxas(GB10)
    used = probe_ptxas(triton_ptxas((12, 1)).path, "sm_121a")
    if fix.applied or "already assembles" in fix.reason:
        assert used.ok
    else:
        assert "no CUDA 13 ptxas was found" in fix.reason


def test_alloc_fix_direct(restore_environ, monkeypatch):
    for var in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(var, raising=False)
    assert fix_alloc_expandable(None).reason == "no GPU"
    assert fix_alloc_expandable(GB10).env == {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}
