"""The runtime fixes GB10 needs, applied by one explicit call (the CLI makes it), never on import.

=====================  ==================================================================  =========
fix                    what it does                                                        when
=====================  ==================================================================  =========
triton_ptxas           point Triton at a CUDA 13 ``ptxas`` that assembles the device's      Blackwell
                       arch (``TRITON_PTXAS_PATH`` / ``TRITON_PTXAS_BLACKWELL_PATH``)      (sm_10x+)
                       when the one Triton would use rejects it (blocker #1)
alloc_expandable       ``PYTORCH_ALLOC_CONF=expandable_segments:True``                     unified
                                                                                           memory
inductor_max_autotune  let inductor autotune GEMMs although the GPU has < 68 SMs           < 68 SMs
                       (``torch._inductor.utils.is_big_gpu``; GB10 has 48)
=====================  ==================================================================  =========

Whatever the user set wins: a set ``TRITON_PTXAS_PATH``, ``PYTORCH_ALLOC_CONF`` (or the legacy
``PYTORCH_CUDA_ALLOC_CONF``) or ``TORCHINDUCTOR_MAX_AUTOTUNE_GEMM`` is never overwritten. Turn fixes
off with ``apply_runtime_fixes(disable=["alloc"])``, ``SLIME_GB10_DISABLE_FIXES=ptxas,alloc`` or
``SLIME_GB10_NO_FIXES=1`` (all). Each outcome is logged once per process.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from slime_gb10.platform.devices import INDUCTOR_BIG_GPU_MIN_SMS, sm_arch
from slime_gb10.platform.probe import DeviceFacts, current_device_facts
from slime_gb10.platform.ptxas import TritonPtxas, find_working_ptxas, probe_ptxas, triton_ptxas

LOG = logging.getLogger("slime_gb10.platform")

FIX_NAMES = ("triton_ptxas", "alloc_expandable", "inductor_max_autotune")
ALIASES = {
    "ptxas": "triton_ptxas",
    "triton": "triton_ptxas",
    "alloc": "alloc_expandable",
    "expandable_segments": "alloc_expandable",
    "inductor": "inductor_max_autotune",
    "autotune": "inductor_max_autotune",
    "max_autotune": "inductor_max_autotune",
}
DISABLE_ENV = "SLIME_GB10_DISABLE_FIXES"
NO_FIXES_ENV = "SLIME_GB10_NO_FIXES"
ALLOC_VALUE = "expandable_segments:True"


@dataclass(frozen=True)
class AppliedFix:
    """The outcome of one fix: ``applied`` says whether it changed anything, ``reason`` says why (not)."""

    name: str
    applied: bool
    reason: str
    env: dict[str, str] = field(default_factory=dict)  # variables this fix set

    def line(self) -> str:
        return f"{self.name}: {'applied' if self.applied else 'not applied'} ({self.reason})"


def resolve_fix_names(names: Iterable[str], *, source: str = "disable") -> set[str]:
    """Canonical fix names for user input (aliases allowed); unknown names raise ValueError."""
    out: set[str] = set()
    for raw in names:
        name = raw.strip().lower().replace("-", "_")
        if not name:
            continue
        if name in ("all", "*"):
            out.update(FIX_NAMES)
        elif name in FIX_NAMES:
            out.add(name)
        elif name in ALIASES:
            out.add(ALIASES[name])
        else:
            raise ValueError(
                f"unknown runtime fix {raw!r} in {source}; known: {', '.join(FIX_NAMES)} "
                f"(aliases: {', '.join(sorted(ALIASES))})"
            )
    return out


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on", "all")


def disabled_by_env(logger: logging.Logger = LOG) -> set[str]:
    """Fixes turned off by ``SLIME_GB10_NO_FIXES`` / ``SLIME_GB10_DISABLE_FIXES`` (typos are warned about)."""
    if _truthy(os.environ.get(NO_FIXES_ENV)):
        return set(FIX_NAMES)
    names = [part for part in os.environ.get(DISABLE_ENV, "").split(",") if part.strip()]
    out: set[str] = set()
    for name in names:
        try:
            out |= resolve_fix_names([name], source=DISABLE_ENV)
        except ValueError as exc:
            logger.warning("%s; ignoring it", exc)
    return out


# --- the fixes -----------------------------------------------------------------------------------


def fix_triton_ptxas(
    device: DeviceFacts | None,
    *,
    triton: TritonPtxas | None = None,
    candidates: Iterable[str] | None = None,
    timeout_s: float = 20.0,
) -> AppliedFix:
    """Point Triton at a ptxas that assembles the device's arch, if the one it would use does not.

    ``triton`` and ``candidates`` default to the installed Triton and the usual CUDA 13 locations;
    tests pass their own (real executables written to a temporary directory).
    """
    name = "triton_ptxas"
    if device is None:
        return AppliedFix(name, False, "no GPU")
    if device.capability[0] < 10:
        return AppliedFix(
            name, False, f"not needed before Blackwell (device is {sm_arch(device.capability)})"
        )
    gpu_name = sm_arch(device.capability)
    triton = triton or triton_ptxas(device.capability)
    if not triton.installed:
        return AppliedFix(name, False, "Triton is not installed")
    # Only the variable Triton reads for THIS arch is a choice to respect: Triton >= 3.5 takes
    # ptxas for sm_100+ from TRITON_PTXAS_BLACKWELL_PATH and ignores TRITON_PTXAS_PATH there.
    if os.environ.get(triton.env_var):
        return AppliedFix(name, False, f"respecting the user's {triton.env_var}={os.environ[triton.env_var]}")
    # ``timeout_s`` bounds the whole fix (Triton's ptxas and every candidate), not each probe.
    deadline = time.monotonic() + timeout_s
    other = next((v for v in triton.env_vars if v != triton.env_var and os.environ.get(v)), None)
    if other is not None:  # e.g. TRITON_PTXAS_PATH set for a Triton that reads the Blackwell variable
        chosen = probe_ptxas(os.environ[other], gpu_name, timeout_s)
        if chosen.ok:
            os.environ[triton.env_var] = os.environ[other]
            return AppliedFix(
                name,
                True,
                f"{other} is set, but Triton {triton.triton_version or ''} reads {triton.env_var} for {gpu_name}: "
                f"set it to the same ptxas ({chosen.version})",
                {triton.env_var: os.environ[other]},
            )
    current = probe_ptxas(triton.path, gpu_name, max(0.1, deadline - time.monotonic()))
    if current.ok:
        return AppliedFix(name, False, f"Triton's ptxas {current.version} already assembles {gpu_name}")
    better = find_working_ptxas(gpu_name, candidates, timeout_s, deadline=deadline)
    if better is None:
        return AppliedFix(
            name,
            False,
            f"Triton's ptxas cannot assemble {gpu_name} ({current.message}) and no CUDA 13 ptxas was found "
            "(looked in $CUDA_HOME/bin, /usr/local/cuda*/bin, PATH, the nvidia-cuda-nvcc wheel); "
            "install a CUDA 13 toolkit",
        )
    env = {var: str(better.path) for var in triton.env_vars if not os.environ.get(var)}
    os.environ.update(env)
    return AppliedFix(
        name, True, f"Triton's ptxas rejects {gpu_name}; using ptxas {better.version} at {better.path}", env
    )


def fix_alloc_expandable(device: DeviceFacts | None, logger: logging.Logger = LOG) -> AppliedFix:
    """``PYTORCH_ALLOC_CONF=expandable_segments:True`` on unified memory, unless the user set one."""
    name = "alloc_expandable"
    if device is None:
        return AppliedFix(name, False, "no GPU")
    if not device.unified_memory:
        return AppliedFix(name, False, "discrete GPU memory")
    for var in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        if os.environ.get(var):
            return AppliedFix(name, False, f"respecting the user's {var}={os.environ[var]}")
    os.environ["PYTORCH_ALLOC_CONF"] = ALLOC_VALUE
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        logger.warning(
            "PYTORCH_ALLOC_CONF was set after CUDA was initialised: it takes effect only in processes "
            "started from now on. Call slime_gb10.platform.apply_runtime_fixes() before any CUDA work."
        )
        return AppliedFix(
            name,
            True,
            "unified memory; set after CUDA init, so only child processes use it",
            {"PYTORCH_ALLOC_CONF": ALLOC_VALUE},
        )
    return AppliedFix(name, True, "unified memory", {"PYTORCH_ALLOC_CONF": ALLOC_VALUE})


def fix_inductor_max_autotune(device: DeviceFacts | None) -> AppliedFix:
    """Let inductor's max-autotune GEMM templates run on GPUs with fewer than 68 SMs.

    ``torch._inductor.utils.is_big_gpu`` (torch 2.9-2.13) returns False below 68 SMs and
    ``_use_template_for_gpu`` then drops every Triton GEMM template ("Not enough SMs to use
    max_autotune_gemm mode"). We replace it for CUDA devices and turn ``max_autotune_gemm`` on
    unless ``TORCHINDUCTOR_MAX_AUTOTUNE_GEMM`` was set by the user.
    """
    name = "inductor_max_autotune"
    if device is None:
        return AppliedFix(name, False, "no GPU")
    if device.sm_count is None:
        return AppliedFix(name, False, "SM count unknown")
    if device.sm_count >= INDUCTOR_BIG_GPU_MIN_SMS:
        return AppliedFix(
            name, False, f"{device.sm_count} SMs >= {INDUCTOR_BIG_GPU_MIN_SMS}: inductor autotunes already"
        )
    try:
        import torch._inductor.config as inductor_config
        import torch._inductor.utils as inductor_utils
    except ImportError as exc:
        return AppliedFix(name, False, f"torch inductor not importable: {exc}")
    original = inductor_utils.is_big_gpu
    if not getattr(original, "_slime_gb10", False):

        def is_big_gpu(index_or_device=0):
            device_obj = index_or_device
            if hasattr(device_obj, "type") and device_obj.type != "cuda":
                return original(index_or_device)
            return True

        is_big_gpu._slime_gb10 = True  # type: ignore[attr-defined]
        is_big_gpu.__wrapped__ = original  # type: ignore[attr-defined]
        inductor_utils.is_big_gpu = is_big_gpu
    what = [f"is_big_gpu -> True ({device.sm_count} SMs < {INDUCTOR_BIG_GPU_MIN_SMS})"]
    if os.environ.get("TORCHINDUCTOR_MAX_AUTOTUNE_GEMM") is None:
        inductor_config.max_autotune_gemm = True
        what.append("max_autotune_gemm=True")
    else:
        what.append(
            f"respecting TORCHINDUCTOR_MAX_AUTOTUNE_GEMM={os.environ['TORCHINDUCTOR_MAX_AUTOTUNE_GEMM']}"
        )
    return AppliedFix(name, True, "; ".join(what))


# --- the one entry point -------------------------------------------------------------------------

_lock = threading.Lock()
_outcomes: dict[str, AppliedFix] = {}  # decided outcomes, so each is computed and logged once


def apply_runtime_fixes(
    *,
    disable: Iterable[str] = (),
    logger: logging.Logger | None = None,
    device: DeviceFacts | Literal["auto"] | None = "auto",
    probe_timeout_s: float = 60.0,
    timeout_s: float = 20.0,
) -> list[AppliedFix]:
    """Apply the GB10 runtime fixes to this process (idempotent); one :class:`AppliedFix` per fix.

    ``disable``: fix names or aliases (``ptxas``, ``alloc``, ``inductor``, ``all``) to skip, added
    to those in ``SLIME_GB10_DISABLE_FIXES`` / ``SLIME_GB10_NO_FIXES``. ``device``: the GPU's facts
    (``None``: no GPU); by default (``"auto"``) they are read in a child process, so CUDA is not
    initialised here. ``timeout_s`` bounds the ptxas fix as a whole (its probes of Triton's
    ptxas and of every CUDA 13 candidate). Call it before any
    CUDA work: the allocator setting only applies to a CUDA context created afterwards.
    """
    logger = logger or LOG
    off = resolve_fix_names(disable) | disabled_by_env(logger)
    results: list[AppliedFix] = []
    with _lock:
        pending = [name for name in FIX_NAMES if name not in _outcomes and name not in off]
        if device == "auto":
            device = current_device_facts(timeout_s=probe_timeout_s) if pending else None
        for name in FIX_NAMES:
            if name in _outcomes:
                results.append(_outcomes[name])
                continue
            if name in off:
                results.append(AppliedFix(name, False, "disabled"))
                continue
            if name == "triton_ptxas":
                outcome = fix_triton_ptxas(device, timeout_s=timeout_s)
            elif name == "alloc_expandable":
                outcome = fix_alloc_expandable(device, logger)
            else:
                outcome = fix_inductor_max_autotune(device)
            _outcomes[name] = outcome
            (logger.info if outcome.applied else logger.debug)("runtime fix %s", outcome.line())
            results.append(outcome)
    return results
