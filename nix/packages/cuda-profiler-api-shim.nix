# patches/cuda_profiler_api.h installed as an include directory (blocker 10 fallback).
# cudaProfilerStart/Stop themselves are exported by libcudart; this only provides the header.
{
  lib,
  runCommand,
  header,
}:
runCommand "cuda-profiler-api-shim"
  {
    meta = {
      description = "cuda_profiler_api.h declarations for CUDA layouts that do not ship the header";
      license = lib.licenses.asl20;
      platforms = lib.platforms.linux;
    };
  }
  ''
    install -Dm444 ${header} $out/include/cuda_profiler_api.h
  ''
