# The toolchain this flake builds with (flake output `overlays.gb10-toolchain`, applied to the
# flake's own package set below `overlays.default`; never part of `overlays.default`, because a
# consumer's CUDA set is theirs to choose: a Jetson is aarch64-linux too, and not a GB10).
#
#   * CUDA 13.2 for the whole closure (blockers 1-3): torch, triton's ptxas, sgl-kernel and
#     TransformerEngine all see the same `cudaPackages`;
#   * the aarch64 SBSA fix for that CUDA set (cuda_compat off, as graham33/nixos-dgx-spark does);
#   * nixpkgs build fixes for CUDA 13 at this pin (nix/fixes.nix);
#   * sgl-kernel and TransformerEngine built for the machine's archs (nix/gb10.nix profiles):
#     nix/packages/sglang-kernel-gb10.nix, nix/packages/transformer-engine-gb10.nix.
{ gb10 }:
final: prev:
let
  inherit (prev) lib;
  system = prev.stdenv.hostPlatform.system;
  profile = gb10.profileFor system;
  fixes = import ./fixes.nix { inherit final prev; };

  # Keep only the arguments a package's function really takes, so the overrides work across the
  # nixpkgs versions of a package (transformer-engine 2.10 has no withJax, 2.18 does;
  # withNcclEp only where the file has it: tests/nix/nixpkgs-facts.json).
  overrideKnown = drv: args: drv.override (lib.intersectAttrs (lib.functionArgs drv.override) args);
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
    (
      pyFinal: pyPrev:
      # sglang-kernel: nixpkgs' source build (where the pin has one) for the machine's archs, with
      # our patch only on the source it was written for (nix/packages/sglang-kernel-gb10.nix).
      lib.optionalAttrs (pyPrev ? sglang-kernel) {
        sglang-kernel = import ./packages/sglang-kernel-gb10.nix {
          inherit lib gb10 profile;
          drv = pyPrev.sglang-kernel;
        };
      }
      // lib.optionalAttrs (pyPrev ? transformer-engine) {
        transformer-engine =
          (overrideKnown pyPrev.transformer-engine {
            cudaPackages = final.cudaPackages // {
              cuda_profiler_api = final.cuda-profiler-api-for-te;
            };
            withJax = false; # we only need the PyTorch extension
            withPytorch = true;
            # a vendored NCCL-EP (expert-parallel all-to-all across GPUs): nothing a one-GPU GB10
            # or our data-parallel runs use, and a large extra compile
            withNcclEp = false;
          }).overridePythonAttrs
            (
              import ./packages/transformer-engine-gb10.nix {
                inherit lib gb10 profile;
                inherit (final) cudaPackages;
                # CMake >= 4 for the family targets (blocker 9): nixpkgs' cmake, or its cmake_4
                # where the default is still 3.x at the pin.
                cmake =
                  if lib.versionAtLeast final.cmake.version "4.0" then final.cmake else final.cmake_4 or final.cmake;
                profilerApi = final.cuda-profiler-api-for-te;
              }
            );
      }
    )
  ];
}
