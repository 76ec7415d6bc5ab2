"""The flake and pyproject.toml agree: name, version, dependencies, extras' version floors.

nix/packages/slime-gb10.nix reads name and version from pyproject.toml, so they agree by
construction; this test checks the evaluated package and the hand-kept dependency mapping.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# PyPI distribution name -> nixpkgs python3Packages attribute (where they differ).
NIX_NAME = {"megatron-core": "megatron-core", "transformer-engine": "transformer-engine", "pyyaml": "pyyaml"}


def nix_list(path: Path, attr: str) -> list[str]:
    """The identifiers in `attr = [ ... ];` of a Nix file (our files list plain identifiers)."""
    text = path.read_text()
    m = re.search(rf"^\s*{re.escape(attr)} = \[(.*?)\];", text, re.S | re.M)
    assert m, f"{attr} not found in {path}"
    body = re.sub(r"#[^\n]*", "", m.group(1))
    return body.split()


def test_package_name_and_version_come_from_pyproject(nix_eval, flake_expr):
    got = nix_eval(
        f"let p = {flake_expr}.packages.aarch64-linux.slime-gb10.slime-gb10; in {{ inherit (p) pname version; }}"
    )
    assert got == {"pname": PYPROJECT["project"]["name"], "version": PYPROJECT["project"]["version"]}
    env_name = nix_eval(f"{flake_expr}.packages.x86_64-linux.slime-gb10.name")
    assert env_name == f"slime-gb10-{PYPROJECT['project']['version']}"


def test_cli_entry_point_matches_main_program(nix_eval, flake_expr):
    scripts = PYPROJECT["project"]["scripts"]
    main = nix_eval(f"{flake_expr}.packages.aarch64-linux.slime-gb10.slime-gb10.meta.mainProgram")
    assert main in scripts


def test_runtime_dependencies_match_pyproject():
    wanted = sorted(Requirement(r).name.lower() for r in PYPROJECT["project"]["dependencies"])
    nix_deps = sorted(nix_list(ROOT / "nix/packages/slime-gb10.nix", "dependencies"))
    assert nix_deps == sorted(NIX_NAME.get(n, n) for n in wanted)


def test_optional_dependency_groups_are_provided():
    extras = PYPROJECT["project"]["optional-dependencies"]
    text = (ROOT / "nix/packages/slime-gb10.nix").read_text()
    for group in ("sglang", "megatron", "te", "triton", "gguf"):
        assert group in extras, f"pyproject lost extra {group!r}"
        assert re.search(rf"^\s*{group} = ", text, re.M), f"extra {group!r} missing in slime-gb10.nix"


def test_megatron_core_version_satisfies_the_extra(nix_eval, flake_expr):
    version = nix_eval(f"{flake_expr}.packages.aarch64-linux.megatron-core.version")
    (req,) = [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["megatron"]]
    assert req.name == "megatron-core"
    assert Version(version) in req.specifier, (version, str(req.specifier))
    # 0.17+ needs Python >= 3.12: the derivation must say so too
    text = (ROOT / "nix/packages/megatron-core.nix").read_text()
    assert 'disabled = pythonOlder "3.12";' in text


def test_nvidia_modelopt_is_the_version_the_test_extra_pins(nix_eval, flake_expr):
    version = nix_eval(
        '(builtins.head (builtins.filter (p: (p.pname or null) == "nvidia-modelopt") '
        f"{flake_expr}.packages.aarch64-linux.slime-gb10.python.packages)).version"
    )
    (req,) = [
        Requirement(r)
        for r in PYPROJECT["project"]["optional-dependencies"]["test"]
        if Requirement(r).name == "nvidia-modelopt"
    ]
    assert str(req.specifier) == f"=={version}"  # the parity tests compare bytes with one version


def test_sri_hashes_are_well_formed():
    import base64

    found = 0
    for path in (ROOT / "nix").rglob("*.nix"):
        for m in re.finditer(r'hash = "([^"]*)"', path.read_text()):
            found += 1
            value = m.group(1)
            assert re.fullmatch(r"sha256-[A-Za-z0-9+/]{43}=", value), f"{path.relative_to(ROOT)}: {value}"
            assert len(base64.b64decode(value.removeprefix("sha256-"))) == 32
    assert found >= 1


def test_lock_pins_the_documented_nixpkgs():
    import json

    lock = json.loads((ROOT / "flake.lock").read_text())
    assert lock["version"] == 7
    nixpkgs = lock["nodes"]["nixpkgs"]["locked"]
    assert nixpkgs == {
        "lastModified": 1786839866,
        "narHash": "sha256-+wJMIlgW+BB/G7Ed5qpB/oDv3Zp3oM80ZFaZOos1qKg=",
        "owner": "NixOS",
        "repo": "nixpkgs",
        "rev": "efa487181cc01970ebb09ed193fa71dfe94784b1",
        "type": "github",
    }
    readme = (ROOT / "nix/README.md").read_text()
    assert nixpkgs["rev"] in readme and nixpkgs["narHash"] in readme
    # every input of flake.nix is locked, and nothing else
    flake = (ROOT / "flake.nix").read_text()
    inputs = set(re.findall(r"^\s{4}([\w-]+)(?:\.url| = \{)", flake, re.M))
    assert inputs == set(lock["nodes"]["root"]["inputs"]) == {"nixpkgs", "nix-gl-host"}
    assert lock["nodes"]["nix-gl-host"]["inputs"] == {"nixpkgs": ["nixpkgs"]}  # follows


def test_readme_blocker_table_cites_code_that_exists():
    """Every `file` → `fragment` in nix/README.md's blocker table names a file that holds that code."""
    readme = (ROOT / "nix/README.md").read_text()
    table = readme.split("## The 15 blockers", 1)[1].split("\n## ", 1)[0]
    refs = 0
    for row in table.splitlines():
        for m in re.finditer(r"`((?:nix|patches)/[\w./-]+)` → `([^`]+)`", row):
            path, fragment = m.groups()
            assert fragment in (ROOT / path).read_text(), f"{path} has no {fragment!r}"
            refs += 1
    assert refs >= 20


def test_environment_has_the_test_extra(nix_eval, flake_expr):
    """The flake's Python environment can run the test suite: pyproject's `test` extra is in it."""
    names = nix_eval(
        f"map (p: p.pname or p.name) {flake_expr}.packages.aarch64-linux.slime-gb10.python.packages"
    )
    names += nix_eval(
        f"map (p: p.pname or p.name) {flake_expr}.packages.aarch64-linux.slime-gb10.slime-gb10"
        ".optional-dependencies.gguf"
    )
    for req in PYPROJECT["project"]["optional-dependencies"]["test"]:
        name = Requirement(req).name.lower()
        if name == "ruff":
            continue  # a binary: nix/devshell.nix and nix/checks.nix put pkgs.ruff on PATH
        assert name in names, f"{name} (pyproject test extra) missing from the environment"
