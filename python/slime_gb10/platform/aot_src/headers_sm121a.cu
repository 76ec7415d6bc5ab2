// Compiled ahead of time for sm_121a by `python -m slime_gb10.platform.aot cuda` (the flake's CPU
// check, the CPU test and `verify`): it needs the headers that code compiled at run time on a GB10
// includes - CCCL (cub), the CUDA runtime, cuBLAS and cuRAND (FlashInfer's JIT: SGLang's FP4 and
// sampling kernels), FP16/BF16 - from one CUDA_HOME. Nothing here runs.
#include <cub/cub.cuh>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <curand_kernel.h>

__global__ void noisy_warp_sum(const __nv_bfloat16* x, float* out, unsigned long long seed) {
  using WarpReduce = cub::WarpReduce<float>;
  __shared__ typename WarpReduce::TempStorage storage;
  curandStatePhilox4_32_10_t state;
  curand_init(seed, threadIdx.x, 0, &state);
  float v = __bfloat162float(x[threadIdx.x]) + 1e-3f * curand_normal(&state);
  float sum = WarpReduce(storage).Sum(v);
  if (threadIdx.x == 0) out[blockIdx.x] = sum + static_cast<float>(CUBLAS_OP_N);
}
