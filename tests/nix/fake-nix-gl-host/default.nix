# Stand-in for numtide/nix-gl-host's default.nix: `{ pkgs, lib ? pkgs.lib }` -> a package whose
# meta.mainProgram is "nixglhost" (the real one: src/nixglhost.py installed as bin/nixglhost).
{
  pkgs,
  lib ? pkgs.lib,
}:
pkgs.writeShellScriptBin "nixglhost" "exit 0"
