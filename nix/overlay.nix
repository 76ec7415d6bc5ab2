# The slime-gb10 overlay (nixpkgs style: final/prev, callPackage, overridePythonAttrs).
#
#   * CUDA 13 for the whole closure (blockers 1-3): torch, triton's ptxas, sgl-kernel and
#     TransformerEngine all see the same `cudaPackages`;
#   * the aarch64 SBSA fix for that CUDA set (cuda_compat off, as graham33/nixos-dgx-spark does);
#   * nixpkgs build fixes for CUDA 13 at this pin (nix/fixes.nix);
#   * the GB10 builds of sglang-kernel and transformer-engine, megatron-core, slime-gb10
#     (nix/python-overlay.nix);
#   * the user-facing environment `slime-gb10-env` (nix/packages/slime-gb10-env.nix).
#
# Arguments: `gb10` (nix/gb10.nix), `src` (the repository root, for our own package) and
# `nix-gl-host` (the flake input's source tree; null disables the non-NixOS driver helper).
{
  gb10,
  src,
  nix-gl-host ? null,
}:
final: prev:
let
  inherit (prev) lib;
  system = prev.stdenv.hostPlatform.system;
  profile = gb10.profileFor system;
  fixes = import ./fixes.nix { inherit final prev; };
in
fixes.topLevel
// {
  # Blockers 1 + 2: one CUDA 13 package set for everything (CUDA 12.x ptxas has no sm_121a,
  # cu12 wheels need libnvrtc.so.12 / libcudart.so.12). graham33/nixos-dgx-spark's
  # overlays/fixes.nix selects the same attribute at this nixpkgs pin.
  cudaPackages = prev.${gb10.cuda.packageSet};

  # aarch64 (linux-sbsa): drop cuda_compat from the CUDA package set. graham33/nixos-dgx-spark
  # (overlays/fixes.nix at the same nixpkgs pin) does this because cuda_compat has no usable
  # linux-sbsa source there; GB10 runs the host driver's own libcuda, never the compat one.
  _cuda = prev._cuda.extend (
    _: prevAttrs: {
      extensions =
        prevAttrs.extensions
        ++ lib.optionals (system == "aarch64-linux") [ (_: _: { cuda_compat = null; }) ];
    }
  );

  # Blocker 10 fallback: the shim header, used only when the CUDA set has no cuda_profiler_api.
  cuda-profiler-api-shim = final.callPackage ./packages/cuda-profiler-api-shim.nix {
    header = ../patches/cuda_profiler_api.h;
  };

  # What TransformerEngine gets as cudaPackages.cuda_profiler_api: the CUDA component when the
  # pinned set has it (13.2 does, x86_64 and sbsa), else the shim.
  cuda-profiler-api-for-te =
    if final.cudaPackages ? cuda_profiler_api && final.cudaPackages.cuda_profiler_api != null then
      final.cudaPackages.cuda_profiler_api
    else
      final.cuda-profiler-api-shim;

  pythonPackagesExtensions = prev.pythonPackagesExtensions ++ [
    fixes.python
    (import ./python-overlay.nix {
      inherit gb10 profile src;
      pkgs = final;
    })
  ];

  # The non-NixOS driver helper (numtide/nix-gl-host, pinned in flake.lock). The flake's own
  # package (built from the same nixpkgs, as graham33/nixos-dgx-spark's CI does) when the input
  # provides one for this system, else its default.nix called with our package set.
  nixglhost =
    if nix-gl-host == null then
      null
    else
      nix-gl-host.packages.${system}.default or (import (nix-gl-host + "/default.nix") { pkgs = final; });

  # The interpreter every environment uses (nix/gb10.nix says why it is pinned); its package set
  # carries our pythonPackagesExtensions like every other.
  slime-gb10-python = prev.${gb10.python.attr};

  # The environments: "core" never refers to sglang (it evaluates on a nixpkgs revision that has
  # no python3Packages.sglang); "full" is the design's (SGLang + sgl-kernel + TransformerEngine).
  slime-gb10-core = final.callPackage ./packages/slime-gb10-env.nix {
    inherit gb10;
    python3 = final.slime-gb10-python;
    variant = "core";
  };
  slime-gb10-full = final.callPackage ./packages/slime-gb10-env.nix {
    inherit gb10;
    python3 = final.slime-gb10-python;
    variant = "full";
  };
  # THE environment (packages.default, the apps, the devShell, the checks): the full one where the
  # pinned nixpkgs has sglang and sglang-kernel (PR #525141), else the core one, with a warning at
  # evaluation, so that `nix flake check`, `nix develop` and `nix build` work on either revision.
  slime-gb10-has-sglang =
    final.slime-gb10-python.pkgs ? sglang && final.slime-gb10-python.pkgs ? sglang-kernel;
  slime-gb10-env =
    if final.slime-gb10-has-sglang then
      final.slime-gb10-full
    else
      lib.warn (
        "slime-gb10: this nixpkgs revision has no python3Packages.sglang / sglang-kernel; "
        + "the environment is slime-gb10-core (PyTorch rollouts, PyTorch and Megatron-core "
        + "training, no SGLang, no TransformerEngine)"
      ) final.slime-gb10-core;
}
