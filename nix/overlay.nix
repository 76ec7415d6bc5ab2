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
    sglang = final.slime-gb10-sglang;
    python3 = final.slime-gb10-python;
    variant = "full";
  };
  # Where SGLang comes from at this pin and what does not fit: nixpkgs' packages (PR #525141), or
  # upstream's wheels where the pin lacks them (nix/python-overlay.nix), whose
  # passthru.gb10Fallback names what this pin cannot give them.
  slime-gb10-sglang =
    let
      ps = final.slime-gb10-python.pkgs;
      fallbacks = lib.filter (p: p ? gb10Fallback) [
        ps.sglang
        ps.sglang-kernel
      ];
      missing = lib.concatMap (p: p.gb10Fallback.missing) fallbacks;
    in
    {
      source = if fallbacks == [ ] then "nixpkgs" else "PyPI wheels (this nixpkgs lacks sglang)";
      # nixpkgs' source build, which our GB10 patch applies to (checks.cpu-sgl-kernel-patch)
      kernelFromSource = !(ps.sglang-kernel ? gb10Fallback);
      fatal = lib.concatMap (p: p.gb10Fallback.fatal) fallbacks;
      inherit missing;
      problems =
        final.slime-gb10-sglang.fatal
        ++ lib.optional (missing != [ ]) (
          "this nixpkgs has no python3Packages." + lib.concatStringsSep ", " missing + " (sglang needs them)"
        );
    };
  # THE environment (packages.default, the apps, the devShell, the checks): the full one where SGLang
  # fits this pin (from nixpkgs, or the wheels with everything they need), else the core one, with a
  # warning at evaluation, so that `nix flake check`, `nix develop` and `nix build` work on either.
  slime-gb10-has-sglang = final.slime-gb10-sglang.problems == [ ];
  slime-gb10-env =
    if final.slime-gb10-has-sglang then
      final.slime-gb10-full
    else
      lib.warn (
        "slime-gb10: SGLang does not fit this nixpkgs revision ("
        + lib.concatStringsSep "; " final.slime-gb10-sglang.problems
        + "); the environment is slime-gb10-core (PyTorch rollouts, PyTorch and Megatron-core "
        + "training, no SGLang, no TransformerEngine)"
      ) final.slime-gb10-core;
}
