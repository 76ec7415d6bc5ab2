"""``slime-gb10 doctor``: check this machine's GPU stack, one line per check, with the exact fix.

The doctor sits above everything it checks: the framework and the machine's checks live in
:mod:`slime_gb10.platform` (:mod:`~slime_gb10.platform.checks`: the registry :data:`CHECKS`,
:func:`register_check`; :mod:`~slime_gb10.platform.checks_system`, the optional packages in
:mod:`~slime_gb10.platform.checks_packages`, torchrun in :mod:`~slime_gb10.platform.checks_distributed`),
the self-checks beside the code they check (:mod:`slime_gb10.nvfp4.selfcheck`,
:mod:`slime_gb10.grpo.selfcheck`). Importing them registers their checks; the report's order is the
registry's (each check that belongs between others says so with ``register_check(before=...)``).
Each returns a :class:`CheckResult` with status ``ok`` / ``warn`` / ``fail`` / ``skip``. Anything that
may hang or crash (CUDA init, Triton JIT, ptxas, cuobjdump, importing sglang or TransformerEngine)
runs in a child process with a time limit, and every check runs in its own thread with a deadline,
so a segfault or a hang becomes a ``fail`` line, never a hung doctor. Exit status 1 only if a check
fails.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from pathlib import Path

import click

from slime_gb10.platform.checks import (
    CHECKS,
    DEFAULT_TIMEOUT_S,
    doctor_context,
    format_text,
    in_report_order,
    report_json,
    run_registered,
)

# The modules whose checks the doctor runs, the machine's first: importing one registers its checks,
# and the report lists them in this order (a check that belongs among another module's says where
# with register_check(before=...)).
CHECK_MODULES = [
    "slime_gb10.platform.checks_system",
    "slime_gb10.platform.checks_packages",
    "slime_gb10.nvfp4.selfcheck",
    "slime_gb10.platform.checks_distributed",
    "slime_gb10.grpo.selfcheck",
]


def registered_checks() -> list:
    """Every doctor check, imported and in the report's order."""
    for module in CHECK_MODULES:
        importlib.import_module(module)
    return in_report_order(CHECKS, CHECK_MODULES)


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
    results = run_registered(ctx, registered_checks())
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
