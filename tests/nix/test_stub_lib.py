"""tests/nix/stub-lib.nix gives the same results as nixpkgs' lib for every function the flake uses.

Needs a nixpkgs `lib` directory (not available in CI): SLIME_GB10_NIXPKGS_LIB=/path/to/nixpkgs/lib.
With it set, the whole tests/nix suite also runs against the real lib instead of the stub.
"""

from __future__ import annotations

import os

import pytest

CASES = """
let
  drv = {
    type = "derivation"; name = "x-1.0"; pname = "x"; outputs = [ "out" "bin" "lib" "include" ];
    out = { outPath = "/o"; }; bin = { outPath = "/b"; }; lib = { outPath = "/l"; };
    include = { outPath = "/i"; }; outPath = "/o"; meta.mainProgram = "x";
  };
  strip = v: builtins.removeAttrs v [ "override" "overrideDerivation" ];
in
l: {
  a = l.cmakeBool "A" true; b = l.cmakeBool "A" false; c = l.cmakeFeature "B" "2";
  d = l.optionals true [ 1 ]; e = l.optional false 1; f = l.optionalString true "s";
  g = l.boolToString false; h = l.getExe' drv "ptxas"; i = l.getExe drv;
  j = (l.getLib drv).outPath; k = (l.getInclude drv).outPath; m = (l.getOutput "bin" drv).outPath;
  n = l.getName drv; o = l.versionAtLeast "4.1.2" "4.0"; p = l.versionAtLeast "3.31" "4.0";
  q = l.genAttrs [ "a" "b" ] (x: x + "!"); r = l.concatMap (x: [ x x ]) [ 1 2 ];
  s = l.functionArgs ({ a, b ? 1 }: a); t = l.intersectAttrs { a = 1; } { a = 2; b = 3; };
  u = l.functionArgs (l.makeOverridable ({ a, b ? 1 }: { inherit a b; }) { a = 1; }).override;
  v = strip ((l.makeOverridable ({ a, b ? 1 }: { inherit a b; }) { a = 1; }).override { b = 5; });
  w = l.mapAttrsToList (n: v: n + v) { x = "1"; y = "2"; };
  x = l.subtractLists [ "b" ] [ "a" "b" "c" ]; y = l.versions.majorMinor "2.11.0";
  z = l.warnIf false "never" 3; aa = l.replaceStrings [ "." ] [ "" ] "3.13";
}
"""


def test_stub_lib_matches_nixpkgs_lib(nix_eval):
    real = os.environ.get("SLIME_GB10_NIXPKGS_LIB", "")
    if not real:
        pytest.skip("set SLIME_GB10_NIXPKGS_LIB=/path/to/nixpkgs/lib to compare the stub with the real lib")
    got = nix_eval(
        f"let cases = {CASES}; in {{ stub = cases (import ./tests/nix/stub-lib.nix); real = cases (import {real}); }}"
    )
    assert got["stub"] == got["real"]
    assert got["stub"]["a"] == "-DA:BOOL=TRUE" and got["stub"]["c"] == "-DB:STRING=2"
