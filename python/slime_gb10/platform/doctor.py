"""``slime-gb10 doctor``: check this machine's GPU stack, one line per check, with the exact fix.

Checks are a registry (:data:`CHECKS`, an ordered list; add one with :func:`register_check`), the
framework in :mod:`~slime_gb10.platform.checks`; the checks by subject: the machine
(:mod:`~slime_gb10.platform.checks_system`), the optional packages
(:mod:`~slime_gb10.platform.checks_packages`), and the self-checks beside the code they check
(:mod:`slime_gb10.nvfp4.selfcheck`, :mod:`slime_gb10.grpo.selfcheck`). Each
returns a :class:`CheckResult` with status ``ok`` / ``warn`` / ``fail`` / ``skip``. Anything that may
hang or crash (CUDA init, Triton JIT, ptxas, cuobjdump, importing sglang or TransformerEngine) runs
in a child process with a time limit, and every check runs in its own thread with a deadline, so a
segfault or a hang becomes a ``fail`` line, never a hung doctor. Exit status 1 only if a check fails.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import click

from slime_gb10.grpo import selfcheck as _grpo_selfcheck  # noqa: F401 - registers its check
from slime_gb10.grpo.selfcheck import grpo_backend_pair  # noqa: F401
from slime_gb10.nvfp4 import selfcheck as _nvfp4_selfcheck  # noqa: F401 - registers its checks
from slime_gb10.platform import (  # noqa: F401 - register their checks
    checks_distributed,
    checks_packages,
    checks_system,
)
from slime_gb10.platform.checks import (  # noqa: F401 - the doctor's public names, re-exported
    CHECKS,
    DEFAULT_TIMEOUT_S,
    Check,
    CheckResult,
    ChildResult,
    DoctorContext,
    doctor_context,
    format_text,
    register_check,
    report_json,
    run_checks,
    run_registered,
    summarize,
)
from slime_gb10.platform.checks_packages import PACKAGES, PackageSpec, check_package  # noqa: F401
from slime_gb10.platform.checks_system import check_ptxas_for  # noqa: F401

# The report's order: the machine, Triton and cuBLAS, the packages and their self-checks, memory and
# the run-time blockers, the GRPO pair, the fixes. A check registered elsewhere comes last.
ORDER = (
    "platform",
    "python",
    "torch",
    "gpu",
    "driver",
    "cuda_runtime",
    "compute_capability",
    "torch_arch_list",
    "triton_ptxas",
    "triton_jit",
    "cublas_bf16",
    "sglang",
    "sgl_kernel",
    "megatron_core",
    "transformer_engine",
    "te_nvfp4",
    "w4a16_kernels",
    "unified_memory",
    "cudnn",
    "antlr4_omegaconf",
    "megatron_training",
    "tilelang_z3",
    "sglang_router",
    "cuda_headers",
    "grpo_backends",
    "distributed",
    "runtime_fixes",
)
CHECKS.sort(key=lambda check: ORDER.index(check.name) if check.name in ORDER else len(ORDER))


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
    # Under torchrun rank 0 writes and prints the report and gives the verdict: the other ranks take
    # part in the collectives and exit 0 (a failing exit would make torchrun kill rank 0 mid-report).
    if int(os.environ.get("RANK", "0")) != 0:
        return
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
