// The part of headers_sm121a.cu a bare CUDA toolkit (nvcc + runtime + CCCL) can compile: what the
// CPU test builds where cuBLAS and cuRAND headers are not installed. Nothing here runs.
#include <cub/cub.cuh>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

__global__ void warp_sum(const __nv_bfloat16* x, float* out) {
  using WarpReduce = cub::WarpReduce<float>;
  __shared__ typename WarpReduce::TempStorage storage;
  float sum = WarpReduce(storage).Sum(__bfloat162float(x[threadIdx.x]));
  if (threadIdx.x == 0) out[blockIdx.x] = sum;
}
