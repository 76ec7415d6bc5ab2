"""W4A16 GEMM for tens to hundreds of tokens in CUDA C, compiled at run time with NVRTC.

:mod:`~slime_gb10.nvfp4._cuda_w4a16` streams the weights for M <= 32: it decodes every weight once
per 8-32 tokens and stages the activations next to the codes, which stops paying above 32 tokens
(NOTES.md). This kernel is GEMM-shaped, in the manner of Marlin (Frantar et al., 2024), with
ModelOpt's bytes as they are (no re-laid-out copy of the weights):

* A block computes ``BN`` weight rows x ``BM`` tokens of ``out = x @ W^T`` over its K range, in
  steps of 128 K. Each step's codes (``BN x 64`` bytes), scale codes (``BN x 8``) and activations
  (``BM x 256`` bytes, natural order, 16-byte chunks XOR-swizzled by token so ``ldmatrix`` is
  conflict-free) arrive through a ``STAGES``-deep cp.async pipeline, one barrier per step.
* Warps tile the block ``WR`` (rows) x ``WT`` (tokens); a warp owns ``16 MT`` rows x ``8 NT``
  tokens. The weights are the MMA's A operand (``mma.m16n8k16``), so every decoded register feeds
  ``NT`` MMAs. The two codes of a byte are k and k + 1: exactly the pair an A register holds, so lane
  ``(g, i)`` decodes byte ``i`` of each 4-byte word (8 k) of rows g and g + 8, and the activations'
  B registers come from ``ldmatrix`` in natural k order (no permutation of K anywhere).
* Decode of byte b (codes k, k + 1) into BF16x2 ``e2m1 * 2**-126``: ``b * (2**18 + 2**6)`` puts the
  magnitudes at bits 6-8 and 22-24, ``b * (2**24 + 2**12)`` the signs at 15 and 31; two masks and one
  ``mul.rn.bf16x2`` by the scale ``s * 2**119`` give ``e2m1 * s * 2**-7`` exactly (as the pair decoder
  of the other kernels); the FP32 result is multiplied by ``global_scale * 2**7``.
* Split-K over a thread-block cluster (``CLUSTER`` blocks, sm_90+), reduced through DSMEM in a fixed
  order (deterministic): on clusters of 2-4 every block pushes its partials into the shared memory
  of the block that sums them, on clusters of 8 the summing block pulls them (``PUSH``; NOTES.md
  v17); each block writes its share of the rows as BF16 (+ bias).

Tokens beyond M are zero-filled by cp.async (never read from ``x``). Requires whole blocks of rows
(N % 64 for the tilings :func:`plan` picks), K % 128 == 0 and at least one 128-wide step per block of
a cluster (:func:`valid`). Measured on the H100 against the other kernels: NOTES.md, BENCHMARKS.md.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from slime_gb10.nvfp4._cuda_w4a16 import (
    DEVICE_HELPERS,
    compile_kernel,
    cuda_index,
    launch_w4a16,
    max_shared_bytes,
)


class GemmPlan(NamedTuple):
    """A tiling: ``wr`` x ``wt`` warps (rows x tokens), each ``16 * mt`` weight rows x ``8 * nt``
    tokens (``nt`` even); ``stages`` of the cp.async pipeline; ``cluster`` blocks splitting K;
    ``minb`` blocks per SM the registers are capped for."""

    wr: int
    wt: int
    mt: int
    nt: int
    stages: int = 3
    cluster: int = 1
    minb: int = 1

    @property
    def rows(self) -> int:
        return 16 * self.wr * self.mt

    @property
    def tokens(self) -> int:
        return 8 * self.wt * self.nt

    @property
    def threads(self) -> int:
        return 32 * self.wr * self.wt


#: Device code shared with :mod:`~slime_gb10.nvfp4._cuda_wgmma`: zero-filling and 8-byte cp.async,
#: ``ldmatrix``, the byte decoder and the scale pair (after :data:`~._cuda_w4a16.DEVICE_HELPERS`).
GEMM_HELPERS = r"""
__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, bool live) {  // zeros if !live
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(smem_addr(dst)), "l"(src), "r"(live ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" :: "r"(smem_addr(dst)), "l"(src) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}

// Codes k, k+1 (byte `sel` of w: 0x4440 + i picks byte i, zero above) -> BF16x2 e2m1 * s * 2**-7.
__device__ __forceinline__ u32 decode_byte(u32 w, u32 sel, u32 scale2) {
    const u32 b = __byte_perm(w, 0u, sel);
    const u32 bits = ((b * 262208u) & 0x01C001C0u) | ((b * 16781312u) & 0x80008000u);
    u32 r;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(bits), "r"(scale2));
    return r;
}

// Scale code byte j (a constant after unrolling) of w -> BF16 s * 2**119 in both halves (the code is
// (bits - (237 << 7)) >> 4: one shift-and-add per half, both halves at once).
__device__ __forceinline__ u32 scale_pair(u32 w, int j) {
    return __byte_perm(w, 0u, 0x4040u | (j << 8) | j) * 16u + ((237u << 7) | (237u << 23));
}
"""


def _source(p: GemmPlan) -> str:
    cluster_attr = f"__cluster_dims__(1, {p.cluster}, 1)" if p.cluster > 1 else ""
    return (
        f"#define WR {p.wr}\n#define WT {p.wt}\n#define MT {p.mt}\n#define NT {p.nt}\n#define STAGES {p.stages}\n"
        f"#define CLUSTER {p.cluster}\n#define MINB {p.minb}\n#define CLUSTER_ATTR {cluster_attr}\n"
        + DEVICE_HELPERS
        + GEMM_HELPERS
        + r"""
#define THREADS (32 * WR * WT)
#define BN (16 * MT * WR)  /* weight rows per block */
#define BM (8 * NT * WT)   /* tokens per block */
#define CODE_BYTES (BN * 64)
#define X_OFFSET (CODE_BYTES + BN * 8)
#define STAGE_BYTES (X_OFFSET + BM * 256)
#define RED_STRIDE (BM + 1)  /* floats per row of the partials (+1: fewer bank conflicts) */
/* split-K partials pushed to the summing block (DSMEM stores) on clusters of 2-4, pulled by it
   (DSMEM loads) on clusters of 8, whose 8-row shares made the stores slower (H100, NOTES.md v17) */
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
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < NT; ++h)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[mt][h][c] = 0.f;

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
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < NT; ++h)
#pragma unroll
            for (int c = 0; c < 4; ++c)
                red[(row0 + 16 * mt + g + 8 * (c >> 1)) * RED_STRIDE + wt * 8 * NT + 8 * h + 2 * i + (c & 1)] =
                    acc[mt][h][c];
#if CLUSTER > 1
    cluster_sync();
#else
    __syncthreads();
#endif
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
#if CLUSTER > 1
            v += ld_cluster(p, src);
#else
            v += *p;
#endif
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
"""
    )


@functools.cache
def _kernel(device_index: int, p: GemmPlan):
    return compile_kernel(device_index, _source(p), "w4a16_gemm")


def shared_bytes(p: GemmPlan) -> int:
    """Dynamic shared memory of a block: the pipeline's stages or, after the K loop, the partials."""
    stage = p.rows * 72 + p.tokens * 256
    return max(p.stages * stage, p.rows * (p.tokens + 1) * 4)


def valid(p: GemmPlan, M: int, N: int, K: int) -> bool:
    """Whether ``p`` tiles this problem: whole blocks of rows, every block of the cluster at least one
    128-wide K step, ``nt`` even (``ldmatrix.x4`` loads two token tiles), a pipeline of >= 2 stages,
    shared memory within :func:`~slime_gb10.nvfp4._cuda_w4a16.max_shared_bytes`."""
    return (
        M > 0
        and p.nt % 2 == 0
        and p.stages >= 2
        and N % p.rows == 0
        and K % 128 == 0
        and p.cluster <= K // 128
        and p.cluster in (1, 2, 4, 8)
        and shared_bytes(p) <= max_shared_bytes()
    )


def w4a16_gemm(x2, data, scale_codes, global_scale, bias, out, p: GemmPlan) -> None:
    """Launch (all tensors on one CUDA device; x2 BF16 [M, K] with unit stride)."""
    M, K = x2.shape
    N = data.shape[0]
    if not valid(p, M, N, K):
        raise ValueError(
            f"CUDA W4A16 GEMM: the tiling {p} does not fit M={M}, N={N}, K={K} (needs N % {p.rows} == 0, "
            f"K % 128 == 0 with at least {p.cluster} steps of 128, and {shared_bytes(p)} <= {max_shared_bytes()} "
            "bytes of shared memory; see plan)"
        )
    launch_w4a16(
        _kernel(cuda_index(x2), p),
        (N // p.rows, p.cluster, -(-M // p.tokens)),
        p.threads,
        shared_bytes(p),
        x2,
        data,
        scale_codes,
        global_scale,
        bias,
        out,
        name="CUDA W4A16 GEMM",
    )


def plan(M: int, N: int, K: int, sm_count: int) -> GemmPlan | None:
    """The tiling for ``[M, K] x [N, K]^T``, or None where the kernel does not tile it (N % 64,
    K % 128).

    Fitted to sweeps of 92 tilings on the H100 (NOTES.md; GB10's 48 SMs are not measured): blocks of
    4 warps, 16 weight rows each (64 rows per block), a 4-stage pipeline; 32 tokens per block (one
    warp's 4 token tiles) up to M = 32 and where the blocks of 64 rows x 32 tokens fit in one wave of
    the SMs, else 64 tokens (fewer blocks re-read fewer activations); then the largest cluster (K split) that keeps the
    blocks within one wave. Within 0-11% of the best tiling at M = 32 and 64 on the bench layers.
    Fewer stages where 4 do not fit in :func:`~slime_gb10.nvfp4._cuda_w4a16.max_shared_bytes`.
    """
    if M <= 0 or N % 64 or K % 128:
        return None
    row_blocks = N // 64
    nt = 4 if M <= 32 or row_blocks * -(-M // 32) <= sm_count else 8
    blocks = row_blocks * -(-M // (8 * nt))
    cluster = 1
    for c in (2, 4, 8):
        if blocks * c <= sm_count and c <= K // 128:
            cluster = c
    for stages in (4, 3, 2):  # fewer where shared memory is short (48 KB without the opt-in)
        p = GemmPlan(4, 1, 1, nt, stages=stages, cluster=cluster)
        if valid(p, M, N, K):
            return p
    return None
