# overridePythonAttrs function for nixpkgs' python3Packages.transformer-engine.
#
# Blocker 6: cuDNN is nixpkgs' full redistributable (not the runtime-only libs of the NGC image);
#            preBuild fails loudly if libcudnn_engines_precompiled is missing.
# Blocker 7: NVTX3 headers: cudaPackages.cuda_nvtx is already a buildInput in nixpkgs; its include
#            dir is also put on CPATH so nvcc's host preprocessing sees nvtx3/nvToolsExt.h whatever
#            TE's CMake does with the split CUDA layout.
# Blocker 8: NVTE_CUDA_ARCHS with the family targets ("121f" on GB10: one target, the machine's).
#            nixpkgs' own value drops "12.1" from the capabilities (its "120" becomes 120 + 120f in
#            TE's CMake, which covers 12.1: transformer-engine/default.nix @ 17647f4), which leaves
#            nothing for a configuration of 12.1 alone.
# Blocker 9: CMake >= 4 parses the `f` suffix (checked at evaluation time: broken, with a warning, without it);
#            CMAKE_POLICY_VERSION_MINIMUM=3.5 for the vendored sub-projects.
# Blocker 10: cuda_profiler_api.h from cudaPackages.cuda_profiler_api, else the shim
#            (`profilerApi`, chosen in toolchain.nix; its include dir is also on CPATH here).
{
  lib,
  gb10,
  profile,
  cudaPackages,
  cmake,
  profilerApi,
}:
let
  archs =
    if profile.sglKernelGb10Only then
      gb10.nvteCudaArchs profile.familyCapabilities # "121f"
    else
      lib.concatStringsSep ";" ([ "90" ] ++ map gb10.familyTarget profile.familyCapabilities);

  cudnnLib = lib.getLib cudaPackages.cudnn;
  cmakeFits = lib.versionAtLeast cmake.version "4.0";
  why = "transformer-engine for GB10 needs CMake >= 4.0 for the '${archs}' family targets; this nixpkgs has ${cmake.version} and no cmake_4: pin a newer nixpkgs";
in
old:
# Without CMake >= 4 the package is marked broken (meta.available false), not an evaluation error:
# the environment then falls back to the core one and names transformer-engine (nix/overlay.nix),
# and this warning says why.
lib.warnIf (!cmakeFits) "slime-gb10: ${why}" {
  meta = (old.meta or { }) // lib.optionalAttrs (!cmakeFits) { broken = true; };

  # the CMake checked above (cmakeFits), first on PATH (nixpkgs' own cmake input may be 3.x)
  nativeBuildInputs = [ cmake ] ++ (old.nativeBuildInputs or [ ]);

  env = (old.env or { }) // {
    NVTE_CUDA_ARCHS = archs;
    CMAKE_POLICY_VERSION_MINIMUM = "3.5";
    CPATH = lib.concatStringsSep ":" [
      "${lib.getInclude cudaPackages.cuda_nvtx}/include"
      "${lib.getInclude profilerApi}/include"
    ];
  };

  preBuild = (old.preBuild or "") + ''
    if ! ls ${cudnnLib}/lib/libcudnn_engines_precompiled.so* >/dev/null 2>&1; then
      echo "transformer-engine: ${cudnnLib}/lib has no libcudnn_engines_precompiled (blocker 6)" >&2
      exit 1
    fi
    if [ "''${NVTE_BUILD_MAX_JOBS:-$NIX_BUILD_CORES}" -gt ${toString profile.transformerEngineJobs} ]; then
      export NVTE_BUILD_MAX_JOBS=${toString profile.transformerEngineJobs}
    fi
    echo "transformer-engine: NVTE_CUDA_ARCHS=$NVTE_CUDA_ARCHS, jobs ''${NVTE_BUILD_MAX_JOBS:-$NIX_BUILD_CORES}"
  '';

  passthru = (old.passthru or { }) // {
    gb10 = {
      nvteCudaArchs = archs;
      inherit profilerApi;
    };
  };
}
