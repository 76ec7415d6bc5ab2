extern "C" __global__ void stream_read(const uint4* __restrict__ a, long long na, const uint4* __restrict__ b,
                                       long long nb, unsigned int* sink) {
    unsigned int acc = 0;
    const long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x, stride = (long long)gridDim.x * blockDim.x;
    for (long long i = tid; i < na; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = i + u * stride < na ? __ldg(a + i + u * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (long long i = tid; i < nb; i += stride) {
        const uint4 v = __ldg(b + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9E3779B9u) sink[0] = acc;  // never in practice; keeps the loads
}
