// @include device_helpers.cuh
// @include gemm_helpers.cuh
// @include wgmma_step.cuh

#define CONSUMERS (128 * WG)  /* the warpgroups that decode and multiply */
#define THREADS (CONSUMERS + 32)  /* + one producer warp that fills the stages */
#define BN (64 * WG)  /* weight rows per block */
#define CODE_OFFSET (BM * 256)
#define SCALE_OFFSET (CODE_OFFSET + BN * 64)
#define STAGE_BYTES ((SCALE_OFFSET + BN * 8 + 1023) / 1024 * 1024)
#define TMA_BYTES (BM * 256 + BN * 64)  /* a stage's activations and codes, copied by the TMA unit */
#define RELEASE (DEPTH > 1 ? DEPTH - 2 : 0)  /* the step of stage k whose wait_group retires stage k - 1 */
#define RED_STRIDE (BN + 4)  /* floats per token of the partials (+4: the lanes' stores hit 32 banks) */
/* split-K partials pushed to the summing block (DSMEM stores) from blocks of up to 128 tokens,
   pulled by it (DSMEM loads) from 256-token blocks, where the stores were 1-2% slower (H100,
   docs/nvfp4-notes.md v17); a pushed share is whole 8-token groups (the store's block is known at compile time) */
#define PUSH (CLUSTER > 1 && BM <= 128 && (BM / CLUSTER) % 8 == 0)

struct __align__(64) TensorMap {  // a CUtensorMap, encoded on the host (cuTensorMapEncodeTiled)
    unsigned long long opaque[16];
};

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory"); }
// keeps the compiler from moving accesses to the accumulators across the asynchronous MMAs
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r) :: "memory"); }

// B descriptor of a shared-memory address: K-major, 128-byte swizzle (layout 1 at bits 62-63),
// 1024 bytes from one 8-token group to the next (SBO, bits 32-45, in 16-byte units); the leading
// offset (bits 16-29) is unused by swizzled K-major layouts and set to 1.
__device__ __forceinline__ unsigned long long b_descriptor(u32 addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.b32 %0, 1, 0, p;\n}"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
// the barrier counts one arrival when this thread's earlier cp.async copies have landed
__device__ __forceinline__ void cp_async_mbar_arrive(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void cp_async8_to(u32 dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" :: "r"(dst), "l"(src) : "memory");
}
// box (c0, c1) of a 2-D tensor map into shared memory; counts its bytes on barrier `bar`. Elements
// outside the tensor (tokens >= M) arrive as zeros.
__device__ __forceinline__ void tma_load(u32 dst, const TensorMap* map, int c0, int c1, u32 bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 :: "r"(dst), "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}

// A registers of k16 step s (0..7) of a stage: rows g (q0, scale word s0) and g + 8 (q1, s1); q holds
// the 16 bytes (32 k) of step pair s / 2.
__device__ __forceinline__ void decode_step(u32* a, const uint4& q0, const uint4& q1, const uint2& s0, const uint2& s1,
                                            int s, u32 sel) {
    const u32 sg = scale_pair(s >> 2 ? s0.y : s0.x, s & 3), sh = scale_pair(s >> 2 ? s1.y : s1.x, s & 3);
    a[0] = decode_byte(s & 1 ? q0.z : q0.x, sel, sg);  // row g, k 2i, 2i+1
    a[1] = decode_byte(s & 1 ? q1.z : q1.x, sel, sh);  // row g+8
    a[2] = decode_byte(s & 1 ? q0.w : q0.y, sel, sg);  // row g, k 2i+8, 2i+9
    a[3] = decode_byte(s & 1 ? q1.w : q1.y, sel, sh);  // row g+8
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) CLUSTER_ATTR w4a16_wgmma(
    const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap cmap,
    const unsigned char* __restrict__ scodes, const float* __restrict__ gs, const u16* __restrict__ bias,
    u16* __restrict__ out, int M, int N, int K, int has_bias)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ __align__(8) unsigned long long bars[2 * STAGES];  // full[STAGES], then empty[STAGES]
    unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, i = lane & 3;
    const int row = 16 * warp + g;  // the lane's rows in the block: row, row + 8 (warpgroup w: 64 w ..)
    const int S = K >> 7, rank = blockIdx.y;  // grid.y == CLUSTER: the block's rank in its cluster
    const int ks = rank * S / CLUSTER, nk = (rank + 1) * S / CLUSTER - ks;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.z * BM;
    const u32 smem0 = smem_addr(smem), full0 = smem_addr(bars), empty0 = full0 + 8 * STAGES;
    if (tid == 0) {
        for (int r = 0; r < STAGES; ++r) {
            mbar_init(full0 + 8 * r, 33);              // the producer's expect_tx + its 32 lanes' cp.async
            mbar_init(empty0 + 8 * r, CONSUMERS / 32);  // one arrival per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    float acc[BM / 2];
#pragma unroll
    for (int r = 0; r < BM / 2; ++r) acc[r] = 0.f;

    if (warp == CONSUMERS / 32) {
        // the producer: stage kt % STAGES takes step kt once the consumers released it (the MMAs of
        // its previous step retired): activations as two swizzled [BM][128 B] halves and codes
        // [BN][64 B] by the TMA unit, scale codes [BN][8 B] by cp.async from the 32 lanes
        if (lane == 0) {
            asm volatile("prefetch.tensormap [%0];" :: "l"((unsigned long long)&xmap) : "memory");
            asm volatile("prefetch.tensormap [%0];" :: "l"((unsigned long long)&cmap) : "memory");
        }
        const unsigned char* sc = scodes + (size_t)(n0 + lane) * (K >> 4) + (size_t)ks * 8;
        int slot = 0;
        u32 phase = 0;
        for (int kt = 0; kt < nk; ++kt) {
            if (kt >= STAGES) mbar_wait(empty0 + 8 * slot, phase ^ 1);
            const u32 st = smem0 + slot * STAGE_BYTES, full = full0 + 8 * slot;
            if (lane == 0) {
                const int k = (ks + kt) * 128;
                mbar_arrive_expect_tx(full, TMA_BYTES);
                tma_load(st, &xmap, k, m0, full);
                tma_load(st + BM * 128, &xmap, k + 64, m0, full);
                tma_load(st + CODE_OFFSET, &cmap, k >> 1, n0, full);
            }
#pragma unroll
            for (int j = 0; j < BN / 32; ++j)
                cp_async8_to(st + SCALE_OFFSET + 8 * (lane + 32 * j), sc + (size_t)(32 * j) * (K >> 4) + 8 * kt);
            cp_async_mbar_arrive(full);
            if (++slot == STAGES) {
                slot = 0;
                phase ^= 1;
            }
        }
    } else {
        const u32 sel = 0x4440u + i;
        u32 a[DEPTH][4];  // A registers of DEPTH steps: DEPTH - 1 MMAs stay in flight while one is decoded
        uint4 q0, q1;
        uint2 s0, s1;
        mbar_wait(full0, 0);
        s0 = *(const uint2*)(smem + SCALE_OFFSET + 8 * row);
        s1 = *(const uint2*)(smem + SCALE_OFFSET + 8 * (row + 8));
        q0 = *(const uint4*)(smem + CODE_OFFSET + 64 * row);
        q1 = *(const uint4*)(smem + CODE_OFFSET + 64 * (row + 8));
        decode_step(a[0], q0, q1, s0, s1, 0, sel);
#pragma unroll
        for (int r = 0; r < BM / 2; ++r) fence_operand(acc[r]);
        int slot = 0, prev = STAGES - 1;  // the stage computed now, the one before it
        u32 phase = 0;                    // parity of the full barrier's phase for the next stage
        for (int kt = 0; kt < nk; ++kt) {
            const unsigned long long desc = b_descriptor(smem0 + slot * STAGE_BYTES);
            const int next = slot == STAGES - 1 ? 0 : slot + 1;
            if (next == 0) phase ^= 1;
#pragma unroll
            for (int s = 0; s < 8; ++s) {
                wgmma_fence();  // a[s % DEPTH] was written by the decode
                wgmma_step(acc, a[s % DEPTH], desc + ((((s >> 2) * BM * 128) + (s & 3) * 32) >> 4));
                wgmma_commit();
                if (s == 7) {
                    if (kt + 1 < nk) {  // the next stage's first codes, once it has landed
                        mbar_wait(full0 + 8 * next, phase);
                        const unsigned char* st = smem + next * STAGE_BYTES;
                        s0 = *(const uint2*)(st + SCALE_OFFSET + 8 * row);
                        s1 = *(const uint2*)(st + SCALE_OFFSET + 8 * (row + 8));
                        q0 = *(const uint4*)(st + CODE_OFFSET + 64 * row);
                        q1 = *(const uint4*)(st + CODE_OFFSET + 64 * (row + 8));
                    }
                } else if (s & 1) {  // the next step pair's codes
                    const unsigned char* st = smem + slot * STAGE_BYTES + CODE_OFFSET + 16 * ((s + 1) >> 1);
                    q0 = *(const uint4*)(st + 64 * row);
                    q1 = *(const uint4*)(st + 64 * (row + 8));
                }
                wgmma_wait<DEPTH - 1>();  // step s + 1 - DEPTH is done with a[(s + 1) % DEPTH]
                // at step RELEASE every MMA of the previous stage has retired, and its codes were read
                if (s == RELEASE && kt > 0 && lane == 0) mbar_arrive(empty0 + 8 * prev);
                if (s < 7 || kt + 1 < nk) decode_step(a[(s + 1) % DEPTH], q0, q1, s0, s1, (s + 1) & 7, sel);
            }
            prev = slot;
            slot = next;
        }
        wgmma_wait<0>();
#pragma unroll
        for (int r = 0; r < BM / 2; ++r) fence_operand(acc[r]);
    }

    // split-K: block `rank` sums tokens [t0, t1) over the cluster's blocks, in rank order, from
    // partials [token][row] in shared memory (over the stages)
    float* red = (float*)smem;
    const int share = BM / CLUSTER, t0 = rank * share, t1 = min(t0 + share, M - m0);
    const float out_scale = gs[0] * 128.f;
#if PUSH
    // pushed into the summing block's shared memory at [source block][token - t0][row] (DSMEM stores,
    // as the weight-streaming kernel does): one barrier keeps them off stages still being read, the
    // next makes them visible; then no block reads another's shared memory
    cluster_sync();
    if (warp < CONSUMERS / 32) {
        // each block's address once (one `mapa` per store instead: 1.1x the kernel's time at M = 64-128)
        u32 dst[CLUSTER];
#pragma unroll
        for (int d = 0; d < CLUSTER; ++d) dst[d] = cluster_address(smem_addr(red), d);
#pragma unroll
        for (int r = 0; r < BM / 2; ++r) {  // acc[4 h + c]: row + 8 (c / 2), token 8 h + 2 i + c % 2
            const int t = 8 * (r >> 2) + 2 * i + (r & 1);
            const int d = 8 * (r >> 2) / share, tl = 8 * (r >> 2) % share + 2 * i + (r & 1);  // t / share, t % share
            if (m0 + t < M) st_remote(dst[d] + 4 * ((rank * share + tl) * RED_STRIDE + row + 8 * ((r >> 1) & 1)), acc[r]);
        }
    }
    cluster_sync();
#else
    // in the block's own shared memory; with a cluster, the summing block pulls them (DSMEM loads)
    // and a second barrier keeps every block's shared memory alive until then
    __syncthreads();
#pragma unroll
    for (int r = 0; r < BM / 2; ++r)
        if (warp < CONSUMERS / 32)
            red[(8 * (r >> 2) + 2 * i + (r & 1)) * RED_STRIDE + row + 8 * ((r >> 1) & 1)] = acc[r];
    partials_sync();
#endif
    // two rows per thread
    for (int e = tid; e < (t1 - t0) * (BN / 2); e += THREADS) {
        const int r2 = 2 * (e % (BN / 2)), t = e / (BN / 2);
        float v0 = 0.f, v1 = 0.f;
#if PUSH
        const float* p = red + t * RED_STRIDE + r2;
#pragma unroll
        for (int src = 0; src < CLUSTER; ++src) {
            v0 += p[src * share * RED_STRIDE];
            v1 += p[src * share * RED_STRIDE + 1];
        }
#else
        const float* p = red + (t0 + t) * RED_STRIDE + r2;
#pragma unroll
        for (int src = 0; src < CLUSTER; ++src) {
            v0 += ld_partial(p, src);
            v1 += ld_partial(p + 1, src);
        }
#endif
        v0 *= out_scale;
        v1 *= out_scale;
        const size_t n = n0 + r2;
        if (has_bias) {
            v0 += __uint_as_float((u32)bias[n] << 16);
            v1 += __uint_as_float((u32)bias[n + 1] << 16);
        }
        *(u32*)(out + (size_t)(m0 + t0 + t) * N + n) = (u32)to_bf16(v0) | ((u32)to_bf16(v1) << 16);
    }
#if CLUSTER > 1 && !PUSH
    cluster_sync();  // no block leaves while another still reads its shared memory
#endif
}
