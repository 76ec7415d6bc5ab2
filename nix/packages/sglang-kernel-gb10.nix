# nixpkgs' python3Packages.sglang-kernel (`drv`), built for this machine (blockers 2-5): from source
# against this closure's CUDA 13 and torch (nixpkgs takes `torch` from the same Python set), with
# bounded memory use, and on GB10 for sm_121a only.
#
# Our patch (patches/sgl-kernel-gb10-only.patch) was written against one source: sgl-kernel/
# CMakeLists.txt at sglang 156d1af23a4fa80809ab423bc1042d732ef6f95f, what nixpkgs' sglang-kernel
# 0.4.3 builds (pkgs/development/python-modules/sglang-kernel/default.nix @ e59c7c7 and @ b84c6bb;
# tests/nix/nixpkgs-facts.json). On any other version it is not applied: a patch that applies with
# fuzz to another CMakeLists.txt may silently mean something else. The build then keeps upstream's
# gencodes (no SGL_KERNEL_GB10_ONLY), with the job cap and nvcc threads below, and says so.
{
  lib,
  gb10,
  profile,
  drv,
}:
let
  patchedFor = {
    version = "0.4.3";
    rev = "156d1af23a4fa80809ab423bc1042d732ef6f95f";
  };
  # nixpkgs' src is fetchFromGitHub (rev) or applyPatches over it (src.src.rev)
  srcRev = drv.src.rev or drv.src.src.rev or null;
  patchFits = drv.version == patchedFor.version && (srcRev == null || srcRev == patchedFor.rev);
  gb10Only = profile.sglKernelGb10Only && patchFits;

  override = old: {
    patches =
      (old.patches or [ ])
      ++ lib.optionals patchFits [
        # Adds option SGL_KERNEL_GB10_ONLY (header of the file: what, why, upstream status).
        ../../patches/sgl-kernel-gb10-only.patch
      ];

    cmakeFlags =
      (old.cmakeFlags or [ ])
      ++ lib.optionals patchFits [
        # Blocker 5: only the machine's sm_12x archs, no FA3 / FlashMLA / SM90 variant (GB10 only).
        (lib.cmakeBool "SGL_KERNEL_GB10_ONLY" profile.sglKernelGb10Only)
      ]
      ++ lib.optionals gb10Only [
        # "121a" on GB10 (nix/gb10.nix familyCapabilities)
        (lib.cmakeFeature "SGL_KERNEL_GB10_ARCHS" (gb10.cmakeCudaArchitectures profile.familyCapabilities))
      ]
      ++ [
        # nvcc --threads per translation unit (upstream's option, default 32).
        (lib.cmakeFeature "SGL_KERNEL_COMPILE_THREADS" (toString profile.sglKernelNvccThreads))
      ];

    # Cap parallel compile jobs so cicc does not run a 128 GB Spark out of memory: nixpkgs sets
    # CMAKE_BUILD_PARALLEL_LEVEL to all cores; we keep min(cores, profile.sglKernelJobs).
    preBuild = (old.preBuild or "") + ''
      jobs=''${NIX_BUILD_CORES:-1}
      if [ "$jobs" -gt ${toString profile.sglKernelJobs} ] || [ "$jobs" -lt 1 ]; then
        jobs=${toString profile.sglKernelJobs}
      fi
      export CMAKE_BUILD_PARALLEL_LEVEL=$jobs MAX_JOBS=$jobs
      echo "sglang-kernel: $jobs parallel jobs x ${toString profile.sglKernelNvccThreads} nvcc threads" \
        "(GB10-only gencodes: ${lib.boolToString gb10Only})"
    '';

    passthru = (old.passthru or { }) // {
      gb10 = {
        gencodes = lib.optionals gb10Only (gb10.sglKernelGencodes profile.familyCapabilities);
        sglKernelGb10Only = gb10Only;
        inherit patchFits patchedFor;
        inherit (profile) sglKernelJobs sglKernelNvccThreads;
      };
    };
  };
in
lib.warnIf (profile.sglKernelGb10Only && !patchFits)
  (
    "slime-gb10: nixpkgs' sglang-kernel is ${drv.version} (source ${toString srcRev}); "
    + "patches/sgl-kernel-gb10-only.patch was checked against ${patchedFor.version} "
    + "(${patchedFor.rev}) only, so it is not applied: sgl-kernel builds upstream's gencodes "
    + "(more cicc memory, more build time; the job cap still holds)"
  )
  (drv.overridePythonAttrs override)
