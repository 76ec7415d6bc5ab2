"""Fixtures for the static Nix tests: run `nix-instantiate` (Debian's nix-bin is enough).

Nothing here needs nixpkgs or a network: files are parsed, pure functions evaluated with builtins,
and the flake is evaluated against tests/nix/fake-nixpkgs (a stub of the nixpkgs interfaces we use).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NIX_DIR = Path(__file__).resolve().parent


def _nix_instantiate() -> str:
    exe = shutil.which("nix-instantiate")
    if exe is None:
        pytest.skip(
            "nix-instantiate not found: install Debian's nix-bin (`apt-get install nix-bin`) to run the "
            "static Nix tests (CI does)"
        )
    return exe


class NixEval:
    """`nix-instantiate --eval --strict --json` of an expression, from the repository root."""

    def __init__(self, exe: str, tmp: Path):
        self.exe = exe
        # A private state dir: nix-instantiate must not need (or touch) a system Nix install.
        self.env = dict(os.environ)
        self.env.setdefault("NIX_STATE_DIR", str(tmp / "nix-state"))
        self.env.setdefault("NIX_LOG_DIR", str(tmp / "nix-log"))
        self.env.setdefault("HOME", str(tmp))

    def run(self, args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [self.exe, *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=120
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"nix-instantiate {' '.join(args)} failed:\n{proc.stderr}")
        return proc

    def __call__(self, expr: str):
        proc = self.run(["--readonly-mode", "--eval", "--strict", "--json", "-E", expr])
        return json.loads(proc.stdout)


@pytest.fixture(scope="session")
def nix_eval(tmp_path_factory) -> NixEval:
    return NixEval(_nix_instantiate(), tmp_path_factory.mktemp("nix"))


@pytest.fixture(scope="session")
def gb10_expr() -> str:
    return "(import ./nix/gb10.nix)"


@pytest.fixture(scope="session")
def flake_expr() -> str:
    """The flake's outputs, evaluated against tests/nix/fake-nixpkgs."""
    return "(import ./tests/nix/eval-flake.nix { })"
