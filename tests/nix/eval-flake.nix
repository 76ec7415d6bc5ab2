# Evaluate flake.nix's outputs with the fake nixpkgs and a fake nix-gl-host (tests/nix).
# `withSglang = false`: a nixpkgs revision without python3Packages.sglang / sglang-kernel;
# `withCudaPredicate = false`: one without _cuda.lib.allowUnfreeCudaPredicate (one switch at a time);
# `variant`: any file of fake-nixpkgs/ by name (e.g. "sglang-from-wheels").
{
  withSglang ? true,
  withCudaPredicate ? true,
  # a file to import as nixpkgs instead of fake-nixpkgs/<variant>.nix (tests/nix/test_facts.py
  # writes ones that pick a fact's stored variant, or trace each import)
  nixpkgsFile ? null,
  variant ?
    if !withSglang then
      "without-sglang"
    else if !withCudaPredicate then
      "without-cuda-predicate"
    else
      "default",
}:
let
  root = ../..;
  flake = import (root + "/flake.nix");
  libPath = builtins.getEnv "SLIME_GB10_NIXPKGS_LIB";
  lib = if libPath == "" then import ./stub-lib.nix else import libPath;
  # `import nixpkgs { ... }` in flake.nix imports outPath: the fake, or a variant of it.
  nixpkgs = {
    outPath = if nixpkgsFile != null then nixpkgsFile else ./fake-nixpkgs + "/${variant}.nix";
    inherit lib;
  };
  nix-gl-host = {
    outPath = ./fake-nix-gl-host;
  };
  self = outputs // {
    outPath = root;
  };
  outputs = flake.outputs { inherit self nixpkgs nix-gl-host; };
in
outputs
