/*
 * cuda_profiler_api.h: minimal stand-in for the CUDA runtime's profiler-control header.
 *
 * What: declares cudaProfilerStart() and cudaProfilerStop() with the CUDA runtime's signatures
 *       (cudaError_t f(void), host-only, C linkage). The definitions are not here: both functions
 *       are exported by libcudart (every CUDA 12/13 release), so code that includes this header
 *       links against cudart exactly as with NVIDIA's header.
 * Why:  TransformerEngine includes <cuda_profiler_api.h>; some CUDA 13 layouts (e.g. the NGC image
 *       used by the slime GB10 port, blocker 10 in REFERENCE.md) do not ship it. The flake uses
 *       nixpkgs' cudaPackages.cuda_profiler_api component when the pinned CUDA set has it (13.2
 *       does, for linux-x86_64 and linux-sbsa) and falls back to this file only when it does not
 *       (nix/overlay.nix: profilerApiFor).
 * Upstream status: not an upstream file; written for slime-gb10 (Apache-2.0). No NVIDIA header
 *       text is copied: only the two public function signatures.
 */
#ifndef SLIME_GB10_CUDA_PROFILER_API_SHIM_H
#define SLIME_GB10_CUDA_PROFILER_API_SHIM_H

#include <cuda_runtime_api.h> /* cudaError_t, CUDARTAPI, __host__ */

#ifdef __cplusplus
extern "C" {
#endif

/* Enable profile collection by the active profiling tool for the current context. */
extern __host__ cudaError_t CUDARTAPI cudaProfilerStart(void);

/* Disable profile collection by the active profiling tool for the current context. */
extern __host__ cudaError_t CUDARTAPI cudaProfilerStop(void);

#ifdef __cplusplus
}
#endif

#endif /* SLIME_GB10_CUDA_PROFILER_API_SHIM_H */
