
typedef unsigned int u32;
typedef unsigned short u16;

__device__ __forceinline__ void mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u16 to_bf16(float f) {  // round to nearest even (finite values)
    u32 b = __float_as_uint(f);
    return (u16)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

__device__ __forceinline__ u32 cluster_address(u32 addr, u32 rank) {  // block `rank`'s copy of a shared address
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
    return remote;
}

__device__ __forceinline__ void st_remote(u32 remote, float v) {  // DSMEM: *remote = v in any block of the cluster
    asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(remote), "f"(v) : "memory");
}

__device__ __forceinline__ float ld_cluster(const float* p, u32 rank) {  // DSMEM: block `rank`'s copy of *p
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(cluster_address(smem_addr(p), rank)) : "memory");
    return v;
}

__device__ __forceinline__ void st_cluster(float* p, u32 rank, float v) {  // DSMEM: block `rank`'s *p = v
    st_remote(cluster_address(smem_addr(p), rank), v);
}

__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The split-K kernels' reduction, where CLUSTER (the plan's #define, above the includes) blocks of a
// cluster each hold a partial sum in shared memory (CLUSTER 1: one block holds all of it).
// The barrier before partials are read: the cluster's, else the block's.
__device__ __forceinline__ void partials_sync() {
#if CLUSTER > 1
    cluster_sync();
#else
    __syncthreads();
#endif
}

// Block `src`'s copy of the partial at *p (DSMEM), or this block's own without a cluster (src is 0).
__device__ __forceinline__ float ld_partial(const float* p, u32 src) {
#if CLUSTER > 1
    return ld_cluster(p, src);
#else
    return *p;
#endif
}

// acc[A][B][4] = 0: the m16n8 MMA accumulators of the W4A16 kernels.
template <int A, int B>
__device__ __forceinline__ void zero_accumulators(float (&acc)[A][B][4]) {
#pragma unroll
    for (int a = 0; a < A; ++a)
#pragma unroll
        for (int b = 0; b < B; ++b)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.f;
}

// acc[A][B][4] into red[row][token] (row stride `stride` floats): lane (g, i)'s m16n8 fragment c of
// acc[a][b] is row `row0 + 16 a + g + 8 (c >> 1)`, token `tok0 + 8 b + 2 i + (c & 1)`.
template <int A, int B>
__device__ __forceinline__ void store_accumulators(float* red, int stride, int row0, int tok0, int g, int i,
                                                   const float (&acc)[A][B][4]) {
#pragma unroll
    for (int a = 0; a < A; ++a)
#pragma unroll
        for (int b = 0; b < B; ++b)
#pragma unroll
            for (int c = 0; c < 4; ++c)
                red[(row0 + 16 * a + g + 8 * (c >> 1)) * stride + tok0 + 8 * b + 2 * i + (c & 1)] = acc[a][b][c];
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(smem_addr(dst)), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

