# overridePythonAttrs function for nixpkgs' python3Packages.sglang-kernel (0.4.3 at the pin:
# sgl-project/sglang 156d1af23a4fa80809ab423bc1042d732ef6f95f, sourceRoot sgl-kernel/).
#
# Blockers 2-5: built from source against this closure's CUDA 13 and torch (nixpkgs takes `torch`
# from the same Python set), for sm_120a + sm_121a only on GB10, with bounded memory use.
{
  lib,
  gb10,
  profile,
}:
old: {
  patches = (old.patches or [ ]) ++ [
    # Adds option SGL_KERNEL_GB10_ONLY (header of the file: what, why, upstream status).
    ../../patches/sgl-kernel-gb10-only.patch
  ];

  cmakeFlags = (old.cmakeFlags or [ ]) ++ [
    # Blocker 5: only sm_120a + sm_121a, no FA3 / FlashMLA / SM90 variant (GB10 profile only).
    (lib.cmakeBool "SGL_KERNEL_GB10_ONLY" profile.sglKernelGb10Only)
    # nvcc --threads per translation unit (upstream default 32).
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
      "(GB10-only gencodes: ${lib.boolToString profile.sglKernelGb10Only})"
  '';

  passthru = (old.passthru or { }) // {
    gb10 = {
      gencodes = gb10.sglKernelGencodes profile.familyCapabilities;
      inherit (profile) sglKernelGb10Only sglKernelJobs sglKernelNvccThreads;
    };
  };
}
