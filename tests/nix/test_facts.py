"""The stub nixpkgs cannot lie: every attribute it provides is a record of nixpkgs-facts.json
(a nixpkgs file read at a stored commit, or an index id / public issue where no commit could be had),
what nixpkgs lacks is absent from it, and the flake evaluates against every stored variant of a
fact that differs between commits.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .test_flake_eval import FORCE, SYSTEMS

FACTS_PATH = Path(__file__).resolve().parent / "nixpkgs-facts.json"
FACTS = json.loads(FACTS_PATH.read_text())
ATTRS = FACTS["attributes"]
FAKE = "import ./tests/nix/fake-nixpkgs"
FAKE_FILE = Path(__file__).resolve().parent / "fake-nixpkgs" / "default.nix"


def test_every_fact_names_its_nixpkgs_file_and_where_it_was_read():
    for name, fact in ATTRS.items():
        assert fact["file"].startswith(("pkgs/", "lib/")), name
        commit = fact.get("commit")
        assert (
            (commit and re.fullmatch(r"[0-9a-f]{40}", commit))
            or fact.get("source")
            or fact.get("indexId")
            or (fact.get("notes"))
        ), name
        assert fact["kind"] in {"package", "function", "interpreter", "set"}, name
        for variant in fact.get("variants", []):
            assert variant.get("commit") is None or re.fullmatch(r"[0-9a-f]{40}", variant["commit"]), name
    assert set(ATTRS).isdisjoint(FACTS["absent"])


def test_the_stub_provides_exactly_the_python_packages_the_facts_record(nix_eval):
    got = nix_eval(
        f'let ps = ({FAKE} {{ system = "x86_64-linux"; }}).python3Packages; in builtins.attrNames ps'
    )
    expected = {n.removeprefix("python3Packages.") for n in ATTRS if n.startswith("python3Packages.")}
    assert set(got) == expected
    for absent in FACTS["absent"]:
        assert absent.removeprefix("python3Packages.") not in got, absent
    assert "math-verify" not in got and "latex2sympy2-extended" not in got  # issue #37 item 1


def test_the_stub_top_level_is_backed_by_facts(nix_eval):
    got = nix_eval(f'builtins.attrNames ({FAKE} {{ system = "x86_64-linux"; }})')
    top = {n.split(".")[0] for n in ATTRS}
    internal = {"config", "_cuda"}  # the config passed in; _cuda: see _cuda.* facts
    assert set(got) - internal <= top, set(got) - internal - top
    cuda = nix_eval(f'builtins.attrNames ({FAKE} {{ system = "x86_64-linux"; }}).cudaPackages_13_2')
    facts_cuda = {n.split(".", 1)[1] for n in ATTRS if n.startswith("cudaPackages_13_2.")}
    assert set(cuda) - {"cudaMajorMinorVersion"} == facts_cuda


@pytest.mark.parametrize("system", SYSTEMS)
def test_the_stub_packages_carry_the_facts_version_licence_and_platforms(nix_eval, system):
    names = sorted(
        n.removeprefix("python3Packages.")
        for n, f in ATTRS.items()
        if n.startswith("python3Packages.") and f["kind"] == "package"
    )
    got = nix_eval(
        f'let ps = ({FAKE} {{ system = "{system}"; }}).python3Packages; in builtins.listToAttrs (map (n: {{'
        "  name = n; value = { v = ps.${n}.version; l = map (l: l.shortName) ps.${n}.meta.license;"
        "    bad = ps.${n}.meta.badPlatforms or null; }; }) (builtins.fromJSON ''"
        + json.dumps(names)
        + "''))"
    )
    for name in names:
        fact = ATTRS[f"python3Packages.{name}"]
        assert got[name]["v"] == (fact["version"] or "0"), name
        assert len(got[name]["l"]) == len(fact["license"]), name
        assert got[name]["bad"] == fact["badPlatforms"], name


def test_cuda_components_have_the_outputs_the_facts_record(nix_eval):
    got = nix_eval(
        f'builtins.mapAttrs (n: c: c.outputs or null) ({FAKE} {{ system = "aarch64-linux"; }}).cudaPackages_13_2'
    )
    for name, fact in ATTRS.items():
        if name.startswith("cudaPackages_13_2.") and fact.get("outputs"):
            assert got[name.split(".", 1)[1]] == fact["outputs"], name


VARIANTS = [(name, i) for name, fact in ATTRS.items() for i in range(len(fact.get("variants", [])))]
RELEVANT = {  # the variants whose difference reaches the flake's outputs (the others: versions of leaves)
    n
    for n in ATTRS
    if n
    in {
        "cmake",
        "python3Packages.torch",
        "python3Packages.transformer-engine",
        "python3Packages.sglang-kernel",
        "python3Packages.torchao",
        "python3Packages.xgrammar",
        "python3Packages.nvidia-ml-py",
        "python3Packages.tokenspeed-mla",
    }
}


@pytest.mark.parametrize("system", SYSTEMS)
@pytest.mark.parametrize(("name", "index"), [v for v in VARIANTS if v[0] in RELEVANT])
def test_every_output_evaluates_against_each_stored_variant(nix_eval, tmp_path, system, name, index):
    fake = tmp_path / "nixpkgs.nix"
    fake.write_text(f'args: import {FAKE_FILE} (args // {{ pick = {{ "{name}" = {index}; }}; }})\n')
    flake = f"(import ./tests/nix/eval-flake.nix {{ nixpkgsFile = {fake}; }})"
    names = nix_eval(f'builtins.attrNames ({flake}).packages."{system}"')
    assert {"default", "slime-gb10", "slime-gb10-core", "python", "gpu-checks"} <= set(names)
    assert nix_eval(f'({FORCE}) ({flake}).packages."{system}".default') is True


def test_nixpkgs_is_instantiated_once_per_system(nix_eval, tmp_path):
    """Issue #37 item 6: every output takes its packages from one pkgsBySystem (also
    legacyPackages); the fake traces each `import nixpkgs`."""
    fake = tmp_path / "nixpkgs.nix"
    fake.write_text(
        f'args: builtins.trace "fake-nixpkgs: imported for ${{args.system}}" (import {FAKE_FILE} args)\n'
    )
    done = nix_eval.run(
        ["--readonly-mode", "--eval", "--strict", "--json", "-E",
         f"let o = import ./tests/nix/eval-flake.nix {{ nixpkgsFile = {fake}; }}; s = builtins.attrNames;"
         " f = sys: [ (s o.packages.${sys}) (s o.apps.${sys}) (s o.checks.${sys}) o.devShells.${sys}.default.name"
         " o.packages.${sys}.default.name o.apps.${sys}.verify.program o.legacyPackages.${sys}.slime-gb10-env.name ];"
         ' in [ (f "aarch64-linux") (f "x86_64-linux") ]'],
    )  # fmt: skip
    imports = [line for line in done.stderr.splitlines() if "fake-nixpkgs: imported for" in line]
    assert sorted(imports) == sorted(f"trace: fake-nixpkgs: imported for {s}" for s in SYSTEMS), done.stderr
