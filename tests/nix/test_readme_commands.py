"""Every Nix command README.md and nix/README.md give resolves against the flake's outputs.

Each `nix build|run|eval|develop|flake …` with a `.#installable` (in code blocks or inline code) is
resolved the way Nix resolves it: `nix run .#X` → apps.<system>.X, else packages.<system>.X;
`nix build` / `nix eval .#X.y` → packages.<system>.X (then .y), or a full output path
(`.#devShells.<system>.default…`); `nix develop` → devShells.<system>.default. `<system>` stands
for both systems. An attribute that does not exist fails here, so a README cannot point at a
command that no longer exists.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .test_flake_eval import SYSTEMS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "nix/README.md")
OUTPUTS = ("packages", "apps", "checks", "devShells", "legacyPackages")
COMMAND = re.compile(r"\bnix (build|run|eval|develop|flake check|flake show)\b([^`\n|]*)")


def commands():
    found = []
    for doc in DOCS:
        for m in COMMAND.finditer((ROOT / doc).read_text()):
            verb, rest = m.group(1), m.group(2)
            for installable in re.findall(r"\.#([\w.<>-]+)", rest):
                found.append((doc, verb, installable.rstrip(".")))
            if verb == "develop" and ".#" not in rest:
                found.append((doc, verb, "devShells.<system>.default"))
    return found


COMMANDS = commands()


def test_the_docs_give_nix_commands():
    verbs = {verb for _, verb, _ in COMMANDS}
    assert {"build", "run", "develop"} <= verbs and len(COMMANDS) >= 8


def candidates(verb: str, installable: str, system: str) -> list[str]:
    path = installable.replace("<system>", system)
    if path.split(".")[0] in OUTPUTS:
        return [path]
    head, _, tail = path.partition(".")
    tail = f".{tail}" if tail else ""
    if verb == "run":
        return [f"apps.{system}.{head}{tail}", f"packages.{system}.{head}{tail}"]
    return [f"packages.{system}.{head}{tail}"]


@pytest.mark.parametrize("system", SYSTEMS)
@pytest.mark.parametrize(("doc", "verb", "installable"), COMMANDS)
def test_each_command_resolves(nix_eval, flake_expr, system, doc, verb, installable):
    options = candidates(verb, installable, system)
    # where sglang cannot be built (aarch64 at the facts' nixpkgs) .#slime-gb10-full and
    # .#sglang-kernel are absent on purpose: the docs name them "where SGLang fits the pin"
    if system == "aarch64-linux" and installable in ("slime-gb10-full", "sglang-kernel"):
        pytest.skip("absent on aarch64 where nixpkgs refuses sglang's dependencies (documented)")
    exprs = " || ".join(f"(o ? {'.'.join(repr_attr(p) for p in opt.split('.'))})" for opt in options)
    assert nix_eval(f"let o = {flake_expr}; in {exprs}") is True, (doc, verb, installable, options)


def repr_attr(name: str) -> str:
    return f'"{name}"'
