"""Every .nix file parses, and the parse check really catches undefined variables.

`nix-instantiate --parse` binds variables statically (Nix 2.8 reports `undefined variable 'x'` at
parse time) except inside `with` scopes, whose names are only known at evaluation. So: parse every
file, prove on a broken temp file that the parse step fails on an undefined name, and forbid
`with` in our Nix code so the parse check stays complete.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def nix_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.nix"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        files = [ROOT / f for f in out]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in ROOT.rglob("*.nix") if ".git" not in p.parts]
    files = sorted(f for f in files if f.exists())
    assert files, "no .nix files found"
    return files


def test_flake_files_exist():
    names = {f.relative_to(ROOT).as_posix() for f in nix_files()}
    for expected in (
        "flake.nix",
        "nix/gb10.nix",
        "nix/overlay.nix",
        "nix/python-overlay.nix",
        "nix/devshell.nix",
        "nix/checks.nix",
        "nix/packages/megatron-core.nix",
        "nix/packages/slime-gb10.nix",
        "nix/packages/slime-gb10-env.nix",
        "nix/packages/sglang-kernel-gb10.nix",
        "nix/packages/transformer-engine-gb10.nix",
    ):
        assert expected in names, f"{expected} missing"


@pytest.mark.parametrize("path", nix_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_parses_without_undefined_variables(nix_eval, path):
    proc = nix_eval.run(["--parse", str(path)], check=False)
    assert proc.returncode == 0, proc.stderr


def test_parse_reports_undefined_variable(nix_eval, tmp_path):
    broken = tmp_path / "broken.nix"
    broken.write_text("{ lib }:\nlet known = 1; in { a = known; b = lib.x; c = fooUndefined; }\n")
    proc = nix_eval.run(["--parse", str(broken)], check=False)
    assert proc.returncode != 0
    assert "undefined variable 'fooUndefined'" in proc.stderr

    fixed = tmp_path / "fixed.nix"
    fixed.write_text("{ lib }:\nlet known = 1; in { a = known; b = lib.x; }\n")
    assert nix_eval.run(["--parse", str(fixed)], check=False).returncode == 0


def test_with_scopes_hide_undefined_variables_so_we_forbid_them(nix_eval, tmp_path):
    # The reason for the rule below: inside `with`, an unknown name is not a parse error.
    hidden = tmp_path / "hidden.nix"
    hidden.write_text("pkgs: with pkgs; [ fooUndefined ]\n")
    assert nix_eval.run(["--parse", str(hidden)], check=False).returncode == 0

    with_expr = re.compile(r"(^|[^\w.'-])with\s+[\w.]+\s*;")
    offenders = []
    for path in nix_files():
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if with_expr.search(code):
                offenders.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert not offenders, "use explicit names instead of `with`:\n" + "\n".join(offenders)
