// @include device_helpers.cuh
// @include gemm_helpers.cuh

#define THREADS (32 * WR * WT)
#define BN (16 * MT * WR)  /* weight rows per block */
#define BM (8 * NT * WT)   /* tokens per block */
#define CODE_BYTES (BN * 64)
#define X_OFFSET (CODE_BYTES + BN * 8)
#define STAGE_BYTES (X_OFFSET + BM * 256)
#define RED_STRIDE (BM + 1)  /* floats per row of the partials (+1: fewer bank conflicts) */
/* split-K partials pushed to the summing block (DSMEM stores) on clusters of 2-4, pulled by it
   (DSMEM loads) on clusters of 8, whose 8-row shares made the stores slower (H100, docs/nvfp4-notes.md v17) */
#define PUSH (CLUSTER > 1 && CLUSTER <= 4)

// One step of 128 K into a stage: codes [BN rows][64 B], scale codes [BN][8 B], activations
// [BM tokens][16 chunks of 16 B] with chunk c of token t at position c ^ (t & 7). Thread tid copies
// code chunk tid + j THREADS (row tid / 4 + j THREADS / 4), scale row tid + j THREADS and
// activation chunk tid + j THREADS (token tid / 16 + j THREADS / 16, chunk tid % 16); its source
// pointers at the block's first step are `Sources` (a step adds 64, 8 and 128 elements).
struct Sources {
    const unsigned char* code;
    const unsigned char* scale;
    const u16* x;
    size_t code_stride, scale_stride, x_stride;  // from one j to the next
};

__device__ __forceinline__ void load_step(unsigned char* st, const Sources& src, const u16* __restrict__ x, int m0,
                                          int M, int kt, int tid) {
#pragma unroll
    for (int j = 0; j < (BN * 4 + THREADS - 1) / THREADS; ++j)
        if ((BN * 4) % THREADS == 0 || tid + j * THREADS < BN * 4)
            cp_async16(st + 16 * (tid + j * THREADS), src.code + j * src.code_stride + kt * 64);
#pragma unroll
    for (int j = 0; j < (BN + THREADS - 1) / THREADS; ++j)
        if (BN % THREADS == 0 || tid + j * THREADS < BN)
            cp_async8(st + CODE_BYTES + 8 * (tid + j * THREADS), src.scale + j * src.scale_stride + kt * 8);
#pragma unroll
    for (int j = 0; j < (BM * 16 + THREADS - 1) / THREADS; ++j) {
        const int t = (tid >> 4) + j * (THREADS >> 4), q = tid & 15;
        if ((BM * 16) % THREADS == 0 || t < BM) {
            const bool live = m0 + t < M;
            cp_async16_zfill(st + X_OFFSET + 256 * t + 16 * (q ^ (t & 7)),
                             live ? src.x + j * src.x_stride + kt * 128 : x, live);
        }
    }
}

// acc[mt][h] += the warp's rows 16 mt + (g, g+8) x tokens 8 h + (2i, 2i+1) over one stage.
__device__ __forceinline__ void compute_step(float (*acc)[NT][4], const unsigned char* st, int row0, u32 xlane,
                                             int swz, int half, u32 sel, int g) {
    u32 sw[MT][2][2];  // scale codes: [mt][row g / g+8][bytes 0-3 / 4-7]
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint2 v = *(const uint2*)(st + CODE_BYTES + 8 * (row0 + 16 * mt + 8 * r + g));
            sw[mt][r][0] = v.x;
            sw[mt][r][1] = v.y;
        }
#pragma unroll
    for (int s2 = 0; s2 < 4; ++s2) {  // pairs of k16 steps: one 16-byte load of codes per row
        uint4 q[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int r = 0; r < 2; ++r) q[mt][r] = *(const uint4*)(st + 64 * (row0 + 16 * mt + 8 * r + g) + 16 * s2);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int s = 2 * s2 + e;  // k16 step: chunks 2s, 2s+1, scale group s
            u32 a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const u32 sg = scale_pair(sw[mt][0][s >> 2], s & 3), sh = scale_pair(sw[mt][1][s >> 2], s & 3);
                a[mt][0] = decode_byte(e ? q[mt][0].z : q[mt][0].x, sel, sg);  // row g, k 2i, 2i+1
                a[mt][1] = decode_byte(e ? q[mt][1].z : q[mt][1].x, sel, sh);  // row g+8
                a[mt][2] = decode_byte(e ? q[mt][0].w : q[mt][0].y, sel, sg);  // row g, k 2i+8, 2i+9
                a[mt][3] = decode_byte(e ? q[mt][1].w : q[mt][1].y, sel, sh);  // row g+8
            }
#pragma unroll
            for (int hp = 0; hp < NT / 2; ++hp) {  // B registers of token tiles 2hp, 2hp+1: one ldmatrix.x4
                u32 b[4];
                ldmatrix_x4(xlane + 16 * 256 * hp + 16 * ((2 * s + half) ^ swz), b[0], b[1], b[2], b[3]);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma(acc[mt][2 * hp], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[0], b[1]);
                    mma(acc[mt][2 * hp + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[2], b[3]);
                }
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, MINB) CLUSTER_ATTR w4a16_gemm(
    const u16* __restrict__ x, const unsigned char* __restrict__ codes, const unsigned char* __restrict__ scodes,
    const float* __restrict__ gs, const u16* __restrict__ bias, u16* __restrict__ out,
    int M, int N, int K, int stride_xm, int has_bias)
{
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, i = lane & 3;
    const int wr = warp % WR, wt = warp / WR;
    const int S = K >> 7, rank = blockIdx.y;  // grid.y == CLUSTER: the block's rank in its cluster
    const int ks = rank * S / CLUSTER, nk = (rank + 1) * S / CLUSTER - ks;
    const size_t n0 = (size_t)blockIdx.x * BN;
    const int m0 = blockIdx.z * BM;
    Sources src;
    src.code = codes + (n0 + (tid >> 2)) * (size_t)(K >> 1) + (size_t)ks * 64 + 16 * (tid & 3);
    src.scale = scodes + (n0 + tid) * (size_t)(K >> 4) + (size_t)ks * 8;
    src.x = x + (size_t)(m0 + (tid >> 4)) * stride_xm + (size_t)ks * 128 + 8 * (tid & 15);
    src.code_stride = (size_t)(THREADS >> 2) * (K >> 1);
    src.scale_stride = (size_t)THREADS * (K >> 4);
    src.x_stride = (size_t)(THREADS >> 4) * stride_xm;

    // ldmatrix.x4: lanes 8j..8j+7 address rows (tokens) of matrix j = (token tile 2hp + j / 2, chunk 2s + j % 2)
    const int tok = wt * 8 * NT + 8 * (lane >> 4) + (lane & 7);
    const u32 xlane0 = smem_addr(smem + X_OFFSET + 256 * tok);
    const int swz = lane & 7, half = (lane >> 3) & 1;
    const u32 sel = 0x4440u + i;
    const int row0 = wr * 16 * MT;

    float acc[MT][NT][4];
    zero_accumulators(acc);

#pragma unroll
    for (int r = 0; r < STAGES - 1; ++r) {
        if (r < nk) load_step(smem + r * STAGE_BYTES, src, x, m0, M, r, tid);
        cp_async_commit();
    }
    int slot = 0, fill = STAGES - 1;  // the stage computed next, the stage loaded next
    for (int kt = 0; kt < nk; ++kt) {
        cp_async_wait<STAGES - 2>();  // step kt has landed (this thread's copies) ...
        __syncthreads();              // ... everyone's; and everyone is done with step kt - 1's stage
        if (kt + STAGES - 1 < nk)
            load_step(smem + fill * STAGE_BYTES, src, x, m0, M, kt + STAGES - 1, tid);
        cp_async_commit();
        compute_step(acc, smem + slot * STAGE_BYTES, row0, xlane0 + slot * STAGE_BYTES, swz, half, sel, g);
        slot = slot == STAGES - 1 ? 0 : slot + 1;
        fill = fill == STAGES - 1 ? 0 : fill + 1;
    }
    cp_async_wait<0>();

    // split-K: block `rank` sums rows [r0, r0 + share) over the cluster's blocks, in rank order, from
    // partials in shared memory (over the stages)
    float* red = (float*)smem;
    const int share = BN / CLUSTER;  // rows summed per block (BN is a multiple of 16, CLUSTER of at most 8)
    const int r0 = rank * share, mloc = min(BM, M - m0);
    const float out_scale = gs[0] * 128.f;
#if PUSH
    // pushed into the summing block's shared memory at [source block][row - r0][token] (DSMEM
    // stores, as the weight-streaming kernel does): one barrier keeps them off stages still being
    // read, the next makes them visible; then no block reads another's shared memory
    cluster_sync();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {  // the lane's rows g and g + 8 of the tile
            // the row's partials in the summing block, mapped once for all of its tokens
            const int row = row0 + 16 * mt + g + 8 * hr;
            const u32 dst = cluster_address(smem_addr(red + (rank * share + row % share) * RED_STRIDE), row / share);
#pragma unroll
            for (int h = 0; h < NT; ++h)
#pragma unroll
                for (int c = 0; c < 2; ++c) {  // acc[.][.][2 hr + c]: token 8 h + 2 i + c of the warp's
                    const int t = wt * 8 * NT + 8 * h + 2 * i + c;
                    if (t < mloc) st_remote(dst + 4 * t, acc[mt][h][2 * hr + c]);
                }
        }
    cluster_sync();
#else
    // [row][token] in the block's own shared memory; with a cluster, the summing block pulls them
    // (DSMEM loads) and a second barrier keeps every block's shared memory alive until then
    __syncthreads();
    store_accumulators(red, RED_STRIDE, row0, wt * 8 * NT, g, i, acc);
    partials_sync();
#endif
    for (int e = tid; e < share * mloc; e += THREADS) {
        const int row = e % share, t = e / share;
        float v = 0.f;
#if PUSH
        const float* p = red + row * RED_STRIDE + t;
#pragma unroll
        for (int src = 0; src < CLUSTER; ++src) v += p[src * share * RED_STRIDE];
#else
        const float* p = red + (r0 + row) * RED_STRIDE + t;
#pragma unroll
        for (int src = 0; src < CLUSTER; ++src) {
            v += ld_partial(p, src);
        }
#endif
        v *= out_scale;
        const size_t n = n0 + r0 + row;
        if (has_bias) v += __uint_as_float((u32)bias[n] << 16);
        out[(size_t)(m0 + t) * N + n] = to_bf16(v);
    }
#if CLUSTER > 1 && !PUSH
    cluster_sync();  // no block leaves while another still reads its shared memory
#endif
}
