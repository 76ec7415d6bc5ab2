"""Doctor checks of the optional packages (sglang, sgl-kernel, megatron-core, TransformerEngine): each
imports in a child, its version, the GPU archs its binaries carry, the CUDA libraries they need."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slime_gb10.platform import binaries
from slime_gb10.platform.checks import (
    CheckFn,
    CheckResult,
    DoctorContext,
    dist_version,
    installed,
    register_check,
    run_child_module,
)
from slime_gb10.platform.devices import sm_arch

# --- checks: the optional packages ---------------------------------------------------------------


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


def _missing_requirements(dists: tuple[str, ...]) -> list[str]:
    """The requirements the first installed of ``dists`` declares for this platform (markers
    evaluated, extras left out) that are not installed: what ``pip install --no-deps`` leaves out."""
    from packaging.requirements import InvalidRequirement, Requirement

    for dist in dists:
        try:
            declared = importlib.metadata.requires(dist) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        missing = []
        for line in declared:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                importlib.metadata.version(req.name)
            except importlib.metadata.PackageNotFoundError:
                missing.append(req.name)
        return missing
    return []


def check_package(ctx: DoctorContext, spec: PackageSpec) -> CheckResult:
    """Import ``spec.module`` in a child; classify failures (blockers #2/#3); scan its .so files (#2/#4)."""
    name = spec.check
    if not installed(spec.module.split(".")[0]) or not installed(spec.module):
        return CheckResult.skip(name, f"not installed (optional: {spec.extra})")
    dist = dist_version(*spec.dists)
    child = run_child_module("slime_gb10.platform.probes.import_module", ctx.timeout_s, args=(spec.module,))
    details: dict[str, Any] = {"dist_version": dist}
    if child.data is None:
        error = child.error_line() if not child.timed_out else ""
        details["error"] = error
        if "undefined symbol" in child.stderr:
            return CheckResult.fail(
                name,
                f"import fails: {error} — built against another torch (blocker #3)",
                spec.rebuild,
                **details,
            )
        if m := _CU12_RE.search(child.stderr):
            return CheckResult.fail(
                name,
                f"import fails: needs {m.group(0)}, a CUDA 12 library — this is a cu12 build (blocker #2)",
                spec.rebuild,
                **details,
            )
        if not child.timed_out and (m := re.search(r"No module named '([\w.]+)'", error)):
            missing = m.group(1).split(".")[0]
            undeclared = _missing_requirements(spec.dists)
            if undeclared:
                # installed on purpose without its dependencies (`pip install --no-deps`, as
                # scripts/quickstart.sh test does for the SGLang contract tests, which read its
                # sources): not a broken stack, a package that cannot be used here, said so
                shown = ", ".join(undeclared[:5]) + (", ..." if len(undeclared) > 5 else "")
                return CheckResult.warn(
                    name,
                    f"{spec.module} {dist or ''} is installed without its dependencies ({len(undeclared)} of "
                    f"its requirements are missing: {shown}), so it cannot be imported and is not used here",
                    f"to use it: {spec.extra}",
                    missing_requirements=undeclared,
                    **details,
                )
            return CheckResult.fail(
                name,
                f"import fails: a dependency is missing: {error}",
                f"pip install {missing} (or reinstall with dependencies: {spec.extra})",
                **details,
            )
        return CheckResult.fail(name, f"import {child.how_it_ended()}", spec.rebuild, **details)
    version = child.data.get("version") or dist or "?"
    details.update(child.data)
    notes: list[str] = []
    if not spec.compiled:
        return CheckResult.ok(name, f"{spec.module} {version} imports", **details)

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
        return CheckResult.fail(
            name,
            f"{first[0]} needs {', '.join(first[1])} but torch uses CUDA {ctx.probe.data.get('torch_cuda')} (blocker #2)",
            spec.rebuild,
            **details,
        )
    cuobjdump = binaries.find_cuobjdump()
    if cuobjdump is None:
        notes.append("cuobjdump not found: SASS archs not listed")
        return CheckResult.ok(name, f"{spec.module} {version} imports; " + "; ".join(notes), **details)
    scan = binaries.cuobjdump_archs(
        files, cuobjdump, timeout_s=min(ctx.timeout_s, 20), budget_s=ctx.timeout_s
    )
    details.update(
        sass=sorted(scan.sass), ptx=sorted(scan.ptx), so_files=scan.files_scanned, scan_errors=scan.errors
    )
    archs = ", ".join(sorted(scan.sass | scan.ptx)) or "none"
    if not scan.sass and not scan.ptx:
        return CheckResult.ok(
            name,
            f"{spec.module} {version} imports; no GPU code found in {scan.files_scanned} .so files",
            **details,
        )
    if not ctx.gpu:
        return CheckResult.ok(name, f"{spec.module} {version} imports; carries {archs}", **details)
    usable = binaries.compatible(scan.sass | scan.ptx, ctx.capability)
    if not usable:
        blocker = " (blocker #4)" if ctx.sm12x else ""
        return CheckResult.fail(
            name,
            f"{spec.module} {version} carries {archs}: none runs on {sm_arch(ctx.capability)}{blocker}",
            spec.rebuild,
            **details,
        )
    return CheckResult.ok(
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
    register_check(_spec.check, before="unified_memory")(_make_package_check(_spec))
