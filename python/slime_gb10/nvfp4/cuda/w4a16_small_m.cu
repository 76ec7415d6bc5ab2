
#define KW (WARPS / RW)
/* split-K across the cluster: partials pushed to the summing block (DSMEM stores) or pulled by it
   (DSMEM loads); pushing measured faster with 8-16 warps or one K-warp a row set, pulling with 4-warp
   blocks whose K-warps share rows (H100, session 11, docs/nvfp4-notes.md v17) */
#define PUSH (CLUSTER > 1 && (WARPS >= 8 || KW == 1))
#define THREADS (32 * WARPS)
#define MT (ROWS / 16)  /* m16 tiles per warp */
#define RG (ROWS / 8)   /* row groups of 8 per warp */
#define RED_STRIDE (8 * NT + 1)  /* floats per row of the split-K partials (+1: no bank conflicts) */
// @include device_helpers.cuh

__device__ __forceinline__ void decode(u32 q, u32 s2, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm(" @PAIR_DECODER_PTX@ " : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(q), "r"(s2));
}

__device__ __forceinline__ u32 scale_pair(u32 code) {  // BF16 s * 2**119 in both halves
    u32 v = (code << 4) + (237u << 7);
    return v | (v << 16);
}

struct Segment {  // one segment: row groups g + 8 rg, LOADS 16-byte loads of codes + 2 scale codes each
    uint4 q[RG][LOADS];
    u32 sc[RG][LOADS];
};

__device__ __forceinline__ void load_segment(Segment& seg, const unsigned char* crow, const unsigned char* srow,
                                             size_t crow_step, size_t srow_step, int s) {
#pragma unroll
    for (int rg = 0; rg < RG; ++rg)
#pragma unroll
        for (int t = 0; t < LOADS; ++t) {
            seg.q[rg][t] = __ldg((const uint4*)(crow + rg * crow_step + (s * LOADS + t) * 64));
            seg.sc[rg][t] = __ldg((const u16*)(srow + rg * srow_step + (s * LOADS + t) * 8));
        }
}

#if STAGES > 0
// A ring slot of one warp: codes [(rg, t)][lane] 16 bytes, then scale codes [(rg, t)][lane] 4 bytes
// (the aligned 4 bytes that hold the lane's two codes). Every lane copies and reads only its own bytes.
#define SLOT_BYTES (RG * LOADS * 32 * 20)

// RING_L2 is ".L2::128B" where the plan asks for whole lines (Plan.line): a segment is 64 bytes of
// codes and 8 of scale codes per row, so the rest of the line is the row's next segments.
__device__ __forceinline__ void cp_async16_ring(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global" RING_L2 " [%0], [%1], 16;" :: "r"(smem_addr(dst)), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async4_ring(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global" RING_L2 " [%0], [%1], 4;" :: "r"(smem_addr(dst)), "l"(src) : "memory");
}

__device__ __forceinline__ void issue_segment(unsigned char* slot, const unsigned char* crow, const unsigned char* srow,
                                              size_t crow_step, size_t srow_step, int s, int lane, int i) {
#pragma unroll
    for (int rg = 0; rg < RG; ++rg)
#pragma unroll
        for (int t = 0; t < LOADS; ++t) {
            const int q = (rg * LOADS + t) * 32 + lane;
            cp_async16_ring(slot + 16 * q, crow + rg * crow_step + (s * LOADS + t) * 64);
            cp_async4_ring(slot + RG * LOADS * 32 * 16 + 4 * q, srow - 2 * i + rg * srow_step + (s * LOADS + t) * 8 + 4 * (i >> 1));
        }
}

__device__ __forceinline__ void read_segment(Segment& seg, const unsigned char* slot, int lane, int i) {
#pragma unroll
    for (int rg = 0; rg < RG; ++rg)
#pragma unroll
        for (int t = 0; t < LOADS; ++t) {
            const int q = (rg * LOADS + t) * 32 + lane;
            seg.q[rg][t] = *(const uint4*)(slot + 16 * q);
            seg.sc[rg][t] = *(const u32*)(slot + RG * LOADS * 32 * 16 + 4 * q) >> (16 * (i & 1));
        }
}
#endif

#if WINDOWED
// Activations -> shared memory for segments [s0, s0 + window) of every K-warp of the block (K-warp
// kw's at quad (kw * window + local segment) * LOADS * 4 * NT * ts): a thread takes 8 consecutive
// values of a token (one 16-byte load: k = 128 u + 32 ii + 8 j + 0..7 of 128-wide unit u) and writes
// the pairs (k, k+4), (k+1, k+5), (k+2, k+6), (k+3, k+7) as one quad; tokens >= M are zeros.
__device__ __forceinline__ void stage_window(uint4* xs, const u16* __restrict__ x, int M, int stride_xm, int S,
                                             int parts, int rank, int s0, int window, int ts, int gm, int tid) {
    const int per_warp = window * LOADS * 16;  // 16-byte chunks of one K-warp's window
    for (int c = tid; c < KW * per_warp; c += THREADS) {
        const int kw = c / per_warp, cw = c % per_warp, u = cw >> 4, ii = (cw >> 2) & 3, j = cw & 3;
        const int ws = (rank * KW + kw) * S / parts, we = (rank * KW + kw + 1) * S / parts;
        if ((ws + s0) * LOADS + u >= we * LOADS) continue;  // past this K-warp's segments
        const size_t k = (size_t)((ws + s0) * LOADS + u) * 128 + 32 * ii + 8 * j;
        uint4* dst = xs + ((kw * window * LOADS + u) * 4 + j) * NT * ts + ii;
#pragma unroll
        for (int tok = 0; tok < gm * NT; ++tok) {
            uint4 v = make_uint4(0, 0, 0, 0);
            if (tok < M) v = __ldg((const uint4*)(x + (size_t)tok * stride_xm + k));
            dst[(tok >> 3) * ts + (tok & 7) * 4] = make_uint4(
                (v.x & 0xFFFFu) | (v.z << 16), (v.x >> 16) | (v.z & 0xFFFF0000u),
                (v.y & 0xFFFFu) | (v.w << 16), (v.y >> 16) | (v.w & 0xFFFF0000u));
        }
    }
}
#endif

// acc[mt][h]: rows 16 mt + (g, g+8) x tokens 8 h + (2i, 2i+1). xq: this lane's B quads of the segment,
// quad (t, j, h) at xq[((t * 4 + j) * NT + h) * ts] (ts = 4 * tokens stored per tile; lanes of tokens
// not stored (`live` false) take zeros) = {x(k), x(k+4)}, {x(k+1), x(k+5)}, {x(k+2), x(k+6)},
// {x(k+3), x(k+7)} of token 8 h + g with k = 128 t + 32 i + 8 j (from the segment's start).
__device__ __forceinline__ void compute_segment(float (*acc)[NT][4], const Segment& seg, const uint4* xq, int ts,
                                                bool live) {
#pragma unroll
    for (int t = 0; t < LOADS; ++t) {
        u32 sc[RG][2];
#pragma unroll
        for (int rg = 0; rg < RG; ++rg) {
            sc[rg][0] = scale_pair(seg.sc[rg][t] & 0xFFu);
            sc[rg][1] = scale_pair((seg.sc[rg][t] >> 8) & 0xFFu);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            uint4 b[NT];
#pragma unroll
            for (int h = 0; h < NT; ++h) b[h] = live ? xq[((t * 4 + j) * NT + h) * ts] : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const uint4 qg = seg.q[2 * mt][t], qg8 = seg.q[2 * mt + 1][t];
                const u32 wg = j == 0 ? qg.x : j == 1 ? qg.y : j == 2 ? qg.z : qg.w;
                const u32 wg8 = j == 0 ? qg8.x : j == 1 ? qg8.y : j == 2 ? qg8.z : qg8.w;
                u32 a0, a1, a2, a3, c0, c1, c2, c3;  // row g: (k, k+4), (k+1, k+5), (k+2, k+6), (k+3, k+7); c: row g+8
                decode(wg, sc[2 * mt][j >> 1], a0, a1, a2, a3);
                decode(wg8, sc[2 * mt + 1][j >> 1], c0, c1, c2, c3);
#pragma unroll
                for (int h = 0; h < NT; ++h) {
                    mma(acc[mt][h], a0, c0, a1, c1, b[h].x, b[h].y);
                    mma(acc[mt][h], a2, c2, a3, c3, b[h].z, b[h].w);
                }
            }
        }
    }
}

#if STAGES > 0
// One step of the cp.async ring: wait for segment s, read it, refill its slot with segment
// s + STAGES - 1, compute segment s against the activations at xq.
__device__ __forceinline__ void ring_step(float (*acc)[NT][4], unsigned char* ring, int s, int nseg,
                                          const unsigned char* crow, const unsigned char* srow, size_t crow_step,
                                          size_t srow_step, int lane, int i, const uint4* xq, int ts, bool live) {
    cp_async_wait<STAGES - 2>();  // segment s has landed (this lane's bytes only: no barrier)
    Segment seg;
    read_segment(seg, ring + (s % STAGES) * SLOT_BYTES, lane, i);
    if (s + STAGES - 1 < nseg)  // into the slot read one iteration ago (its values already used)
        issue_segment(ring + ((s + STAGES - 1) % STAGES) * SLOT_BYTES, crow, srow, crow_step, srow_step,
                      s + STAGES - 1, lane, i);
    cp_async_commit();
    compute_segment(acc, seg, xq, ts, live);
}
#endif

extern "C" __global__ void __launch_bounds__(THREADS, MINB) CLUSTER_ATTR w4a16_small(
    const u16* __restrict__ x, const unsigned char* __restrict__ codes, const unsigned char* __restrict__ scodes,
    const float* __restrict__ gs, const u16* __restrict__ bias, u16* __restrict__ out,
    int M, int N, int K, int stride_xm, int has_bias, int ring_offset, int gm, int window)
{
    const int ts = 4 * gm;  // quads per token tile in shared memory: gm tokens stored (M rounded up)
    extern __shared__ uint4 xs[];  // B quads [segment][j][h][g][i]; after the K loop: the partials
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, i = lane & 3;
    const int rw = warp / KW, kw = warp % KW;
    const int S = K / (128 * LOADS), parts = CLUSTER * KW, rank = blockIdx.y;  // grid.y == CLUSTER: rank in the cluster
    const int ws = (rank * KW + kw) * S / parts, nseg = (rank * KW + kw + 1) * S / parts - ws;  // the warp's segments

    // 1. the first DEPTH segments of codes, in flight while the activations are staged
    const size_t n0 = (size_t)blockIdx.x * (ROWS * RW) + rw * ROWS + g;
    const unsigned char* crow = codes + n0 * (size_t)(K >> 1) + (size_t)ws * LOADS * 64 + 16 * i;
    const unsigned char* srow = scodes + n0 * (size_t)(K >> 4) + (size_t)ws * LOADS * 8 + 2 * i;
    const size_t crow_step = (size_t)8 * (K >> 1), srow_step = (size_t)8 * (K >> 4);
#if STAGES > 0
    unsigned char* ring = (unsigned char*)xs + ring_offset + warp * STAGES * SLOT_BYTES;
#pragma unroll
    for (int r = 0; r < STAGES - 1; ++r) {
        if (r < nseg) issue_segment(ring + r * SLOT_BYTES, crow, srow, crow_step, srow_step, r, lane, i);
        cp_async_commit();
    }
#else
    Segment ring[DEPTH];
#pragma unroll
    for (int r = 0; r < DEPTH; ++r)
        if (r < nseg) load_segment(ring[r], crow, srow, crow_step, srow_step, r);
#endif

    float acc[MT][NT][4];
    zero_accumulators(acc);
#if WINDOWED
    // 2+3. the K loop, restaging the activations of each K-warp's next `window` segments every
    //      `window` segments (the block's loop count is uniform: nmax; warps past their segments idle)
    const int nmax = (S + parts - 1) / parts;
    const uint4* xq = xs + kw * window * LOADS * 4 * NT * ts + g * 4 + i;
    for (int s = 0; s < nmax; ++s) {
        if (s % window == 0) {
            if (s) __syncthreads();  // every warp is done with the last window
            stage_window(xs, x, M, stride_xm, S, parts, rank, s, window, ts, gm, tid);
            __syncthreads();
        }
        if (s < nseg) {
            ring_step(acc, ring, s, nseg, crow, srow, crow_step, srow_step, lane, i,
                      xq + (s % window) * LOADS * 4 * NT * ts, ts, g < gm);
        }
    }
#else
    // 2. activations -> shared memory, all of the block's K range at once: a thread takes 8
    //    consecutive values of a token (one 16-byte load: k = 128 s + 32 i + 8 j + 0..7, chunk
    //    c = 16 s + 4 i + j) and writes the pairs (k, k+4), (k+1, k+5), (k+2, k+6), (k+3, k+7) as one
    //    quad; tokens >= M are zeros.
    const int sb = rank * KW * S / parts, se = (rank + 1) * KW * S / parts;  // the block's segments
    const int chunks = (se - sb) * LOADS * 16;
    for (int c = tid; c < chunks; c += THREADS) {
        const int s = c >> 4, ii = (c >> 2) & 3, j = c & 3;
#pragma unroll
        for (int tok = 0; tok < gm * NT; ++tok) {
            uint4 v = make_uint4(0, 0, 0, 0);
            if (tok < M) v = __ldg((const uint4*)(x + (size_t)tok * stride_xm + (size_t)sb * LOADS * 128 + 8 * c));
            xs[((s * 4 + j) * NT + (tok >> 3)) * ts + (tok & 7) * 4 + ii] = make_uint4(
                (v.x & 0xFFFFu) | (v.z << 16), (v.x >> 16) | (v.z & 0xFFFF0000u),
                (v.y & 0xFFFFu) | (v.w << 16), (v.y >> 16) | (v.w & 0xFFFF0000u));
        }
    }
    __syncthreads();

    // 3. the K loop: compute segment s while segments s+1 .. s+DEPTH-1 are in flight
    const uint4* xq = xs + (ws - sb) * LOADS * 4 * NT * ts + g * 4 + i;
#if STAGES > 0
    for (int s = 0; s < nseg; ++s) {
        ring_step(acc, ring, s, nseg, crow, srow, crow_step, srow_step, lane, i, xq + s * LOADS * 4 * NT * ts, ts,
                  g < gm);
    }
#else
    for (int s0 = 0; s0 < nseg; s0 += DEPTH) {
#pragma unroll
        for (int r = 0; r < DEPTH; ++r) {
            const int s = s0 + r;
            if (s < nseg) {
                compute_segment(acc, ring[r], xq + s * LOADS * 4 * NT * ts, ts, g < gm);
                if (s + DEPTH < nseg) load_segment(ring[r], crow, srow, crow_step, srow_step, s + DEPTH);
            }
        }
    }
#endif
#endif

    // 4. split-K: block `rank` sums rows [r0, r1) of the block's ROWS * RW over (cluster block,
    //    K-warp), in that order, from partials in shared memory (over the activations)
    const int rows = ROWS * RW, r0 = rank * rows / CLUSTER, r1 = (rank + 1) * rows / CLUSTER;
    const float out_scale = gs[0] * 128.f;
    float* red = (float*)xs;
#if PUSH
    // Each warp stores its partials straight into the shared memory of the block that sums them
    // (DSMEM stores), at [source block][K-warp][row - r0][token]. The first barrier keeps those
    // stores off activations still being read; after the second, every block sums from its own
    // shared memory, and no block waits for the others' sums before it leaves.
    const int share = rows / CLUSTER;
    cluster_sync();  // every block of the cluster is done with its activations
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < NT; ++h)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int row = rw * ROWS + 16 * mt + g + 8 * (c >> 1), tok = 8 * h + 2 * i + (c & 1);
                if (tok < M)
                    st_cluster(red + ((rank * KW + kw) * share + row % share) * RED_STRIDE + tok, row / share,
                               acc[mt][h][c]);
            }
    cluster_sync();  // every partial has landed where it is summed
    for (int e = tid; e < share * M; e += THREADS) {
        const int row = e % share, tok = e / share;
        const float* p = red + row * RED_STRIDE + tok;
        float v = 0.f;
#pragma unroll
        for (int src = 0; src < CLUSTER * KW; ++src) v += p[src * share * RED_STRIDE];
#else
    // Partials [warp][row][token] in the block's own shared memory; with a cluster, each block then
    // reads its rows' partials from all blocks (DSMEM loads), and a second cluster barrier keeps every
    // block's shared memory alive until the others are done reading it.
    __syncthreads();  // every warp is done with the activations
    store_accumulators(red, RED_STRIDE, warp * ROWS, 0, g, i, acc);
    partials_sync();  // every block's partials are written and visible (to the cluster)
    for (int e = tid; e < (r1 - r0) * M; e += THREADS) {
        const int row = e % (r1 - r0), tok = e / (r1 - r0);
        const float* p = red + (((r0 + row) / ROWS) * KW * ROWS + (r0 + row) % ROWS) * RED_STRIDE + tok;
        float v = 0.f;
#pragma unroll
        for (int src = 0; src < CLUSTER; ++src)
#pragma unroll
            for (int k = 0; k < KW; ++k) {
                v += ld_partial(p + k * ROWS * RED_STRIDE, src);
            }
#endif
        v *= out_scale;
        const int n = blockIdx.x * rows + r0 + row;
        if (has_bias) v += __uint_as_float((u32)bias[n] << 16);
        out[(size_t)tok * N + n] = to_bf16(v);
    }
#if CLUSTER > 1 && !PUSH
    cluster_sync();  // no block leaves while another still reads its shared memory
#endif
}
