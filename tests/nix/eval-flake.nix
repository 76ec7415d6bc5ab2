# Evaluate flake.nix's outputs with the fake nixpkgs and a fake nix-gl-host (tests/nix).
let
  root = ../..;
  flake = import (root + "/flake.nix");
  libPath = builtins.getEnv "SLIME_GB10_NIXPKGS_LIB";
  lib = if libPath == "" then import ./stub-lib.nix else import libPath;
  nixpkgs = {
    outPath = ./fake-nixpkgs;
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
