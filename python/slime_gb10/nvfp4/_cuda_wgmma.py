"""W4A16 GEMM on Hopper's warpgroup MMA (``wgmma``, sm_90a) for tens to a thousand tokens.

The ``mma.sync`` GEMM kernel (:mod:`~slime_gb10.nvfp4._cuda_gemm`) tops out at ~270 TFLOP/s on the
H100, issue-bound on its MMAs and decode (NOTES.md v13). Here the tensor cores run asynchronously
and the decode of the next step overlaps the MMA of this one, in the manner of Machete (Wilkinson
et al., 2024), again with ModelOpt's bytes as they are:

* A block of ``WG`` warpgroups computes ``64 WG`` weight rows x ``BM`` tokens of
  ``out = x @ W^T`` over its K range, in steps of 128 K that arrive through a ``STAGES``-deep
  cp.async pipeline: activations ``[2][BM tokens][128 B]`` in the 128-byte swizzle ``wgmma`` reads
  (16-byte chunk c of token t at ``c ^ (t % 8)``), codes ``[64 WG rows][64 B]``, scale codes
  ``[64 WG][8 B]``. One barrier per step.
* Every k16 is one ``wgmma.mma_async.m64n{BM}k16`` per warpgroup: the weights are the A operand
  from registers (warp w of a warpgroup holds its rows 16 w .. 16 w + 15 in the ``mma.m16n8k16``
  A layout, so lane (g, i) decodes byte i of each 4-byte word of rows g and g + 8 with the byte
  decoder of :data:`~slime_gb10.nvfp4._cuda_gemm.GEMM_HELPERS`), the activations the B operand
  from shared memory (a descriptor: K-major, 128-byte swizzle, 1024 bytes per 8 tokens).
* ``DEPTH`` sets of A registers (4 in :func:`plan`): after issuing step s, ``wgmma.wait_group
  DEPTH - 1`` retires step s + 1 - DEPTH and the lane decodes step s + 1 into the registers that
  step used, while up to ``DEPTH - 1`` MMAs run.
* A stage is refilled one stage after it was read: at the barrier that ends stage k + 1 every
  warpgroup has passed the ``wait_group`` that retired its last MMA on stage k (DEPTH <= 8).
* Split-K over a thread-block cluster (``CLUSTER`` blocks), reduced in a fixed order through DSMEM
  (pushed into the summing block's shared memory from blocks of up to 128 tokens, pulled by it from
  larger ones: ``PUSH``, NOTES.md v17); block ``rank`` writes its share of the tokens as BF16
  (+ bias), two rows per 4-byte store.

Tokens beyond M are zero-filled by cp.async. Requires N % (64 WG) == 0, K % 128 == 0, at least
one 128-wide step per block of a cluster and an sm_90 device (``wgmma`` exists only on sm_90a:
not on Blackwell or GB10, which have their own MMA instructions). Measured: NOTES.md, BENCHMARKS.md.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from slime_gb10.nvfp4._cuda_gemm import GEMM_HELPERS
from slime_gb10.nvfp4._cuda_w4a16 import DEVICE_HELPERS, compile_kernel, cuda_index, launch_w4a16

SMEM_ALIGN = 1024  # the 128-byte swizzle repeats every 8 rows of 128 bytes: stages start 1024-aligned
HOPPER_SMEM = 227 * 1024  # dynamic shared memory a block may opt in to on sm_90


class WgmmaPlan(NamedTuple):
    """A tiling: ``wg`` warpgroups of 64 weight rows each, ``bm`` tokens per block (the ``wgmma``
    N: a multiple of 16 up to 256), ``stages`` of the cp.async pipeline (>= 3: the stage read at
    step k is refilled at step k + 1's barrier, so two more are in flight), ``cluster`` blocks
    splitting K, ``depth`` sets of A registers (1, 2, 4 or 8: a divisor of a stage's 8 k16 steps,
    so that step s of every stage uses set s % depth)."""

    wg: int
    bm: int
    stages: int = 4
    cluster: int = 1
    depth: int = 2

    @property
    def rows(self) -> int:
        return 64 * self.wg

    @property
    def threads(self) -> int:
        return 128 * self.wg


def _wgmma_asm(bm: int) -> str:
    """``wgmma_step(acc, a, desc)``: ``acc[0 .. bm/2)`` += A (registers) x B (descriptor), m64n{bm}k16."""
    n = bm // 2
    acc = ",".join(f"%{r}" for r in range(n))
    operands = ", ".join(f'"+f"(d[{r}])' for r in range(n))
    return (
        "__device__ __forceinline__ void wgmma_step(float* d, const u32* a, unsigned long long desc) {\n"
        '    asm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n"\n'
        f'                 "wgmma.mma_async.sync.aligned.m64n{bm}k16.f32.bf16.bf16 {{{acc}}}, '
        f'{{%{n},%{n + 1},%{n + 2},%{n + 3}}}, %{n + 4}, p, 1, 1, 0;\\n}}\\n"\n'
        f"                 : {operands}\n"
        '                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));\n'
        "}\n"
    )


def _source(p: WgmmaPlan) -> str:
    cluster_attr = f"__cluster_dims__(1, {p.cluster}, 1)" if p.cluster > 1 else ""
    return (
        f"#define WG {p.wg}\n#define BM {p.bm}\n#define STAGES {p.stages}\n#define CLUSTER {p.cluster}\n"
        f"#define DEPTH {p.depth}\n#define CLUSTER_ATTR {cluster_attr}\n"
        + DEVICE_HELPERS
        + GEMM_HELPERS
        + _wgmma_asm(p.bm)
        + r"""
#define THREADS (128 * WG)
#define BN (64 * WG)  /* weight rows per block */
#define CODE_OFFSET (BM * 256)
#define SCALE_OFFSET (CODE_OFFSET + BN * 64)
#define STAGE_BYTES ((SCALE_OFFSET + BN * 8 + 1023) / 1024 * 1024)
#define RED_STRIDE (BN + 4)  /* floats per token of the partials (+4: the lanes' stores hit 32 banks) */
/* split-K partials pushed to the summing block (DSMEM stores) from blocks of up to 128 tokens,
   pulled by it (DSMEM loads) from 256-token blocks, where the stores were 1-2% slower (H100,
   NOTES.md v17) */
#define PUSH (CLUSTER > 1 && BM <= 128)

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory"); }
// cp.async writes through the generic proxy, wgmma reads shared memory through the async proxy
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// keeps the compiler from moving accesses to the accumulators across the asynchronous MMAs
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r) :: "memory"); }

// B descriptor of a shared-memory address: K-major, 128-byte swizzle (layout 1 at bits 62-63),
// 1024 bytes from one 8-token group to the next (SBO, bits 32-45, in 16-byte units); the leading
// offset (bits 16-29) is unused by swizzled K-major layouts and set to 1.
__device__ __forceinline__ unsigned long long b_descriptor(u32 addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

__device__ __forceinline__ void cp_async16_to(u32 dst, const void* src, u32 bytes) {  // zero-fills 16 - bytes
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void cp_async8_to(u32 dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" :: "r"(dst), "l"(src) : "memory");
}

// The copies of one thread. Thread tid copies code chunk tid + j THREADS (row (tid + j THREADS) / 4,
// 16 of its 64 bytes), scale row tid + j THREADS, and activation chunk tid + j THREADS: token
// t = tid / 16 + j THREADS / 16, chunk q = tid % 16 (K half q / 8 goes to that half's swizzled
// [BM][128 B] tile, chunk q % 8 to position (q % 8) ^ (t % 8); t % 8 does not depend on j because
// THREADS / 16 is a multiple of 8). Sources advance by one step (128 K) per call; tokens >= M copy
// zero bytes (zero-filled; their address is not read).
struct Loader {
    const unsigned char* code;
    const unsigned char* scale;
    const unsigned char* x;
    u32 code_stride, scale_stride, x_stride;  // bytes from one j to the next
    u32 code_dst, scale_dst, x_dst;           // offsets in a stage
    u32 live;                                 // bit j: token tid / 16 + j THREADS / 16 is < M
};

__device__ __forceinline__ void load_step(u32 stage, Loader& L) {
#pragma unroll
    for (int j = 0; j < BN * 4 / THREADS; ++j)
        cp_async16_to(stage + L.code_dst + 16 * THREADS * j, L.code + j * L.code_stride, 16);
#pragma unroll
    for (int j = 0; j < (BN + THREADS - 1) / THREADS; ++j)
        if (BN % THREADS == 0 || L.scale_dst + 8 * THREADS * j < SCALE_OFFSET + 8 * BN)
            cp_async8_to(stage + L.scale_dst + 8 * THREADS * j, L.scale + j * L.scale_stride);
#pragma unroll
    for (int j = 0; j < BM * 16 / THREADS; ++j)
        cp_async16_to(stage + L.x_dst + 128 * (THREADS / 16) * j, L.x + j * L.x_stride, (L.live >> j) & 1 ? 16 : 0);
    L.code += 64;
    L.scale += 8;
    L.x += 256;
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
    const u16* __restrict__ x, const unsigned char* __restrict__ codes, const unsigned char* __restrict__ scodes,
    const float* __restrict__ gs, const u16* __restrict__ bias, u16* __restrict__ out,
    int M, int N, int K, int stride_xm, int has_bias)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, i = lane & 3;
    const int row = 16 * warp + g;  // the lane's rows in the block: row, row + 8 (warpgroup w: 64 w ..)
    const int S = K >> 7, rank = blockIdx.y;  // grid.y == CLUSTER: the block's rank in its cluster
    const int ks = rank * S / CLUSTER, nk = (rank + 1) * S / CLUSTER - ks;
    const size_t n0 = (size_t)blockIdx.x * BN;
    const int m0 = blockIdx.z * BM;
    Loader L;
    L.code = codes + (n0 + (tid >> 2)) * (size_t)(K >> 1) + (size_t)ks * 64 + 16 * (tid & 3);
    L.scale = scodes + (n0 + tid) * (size_t)(K >> 4) + (size_t)ks * 8;
    L.x = (const unsigned char*)(x + (size_t)(m0 + (tid >> 4)) * stride_xm + (size_t)ks * 128 + 8 * (tid & 15));
    L.code_stride = (THREADS >> 2) * (u32)(K >> 1);
    L.scale_stride = THREADS * (u32)(K >> 4);
    L.x_stride = (THREADS >> 4) * (u32)stride_xm * 2;
    L.code_dst = CODE_OFFSET + 16 * tid;
    L.scale_dst = SCALE_OFFSET + 8 * tid;
    L.x_dst = ((tid & 15) >> 3) * (BM * 128) + 128 * (tid >> 4) + 16 * ((tid & 7) ^ ((tid >> 4) & 7));
    L.live = 0;
#pragma unroll
    for (int j = 0; j < BM * 16 / THREADS; ++j)
        if (m0 + (tid >> 4) + j * (THREADS >> 4) < M) L.live |= 1u << j;
    const u32 sel = 0x4440u + i;
    const u32 smem0 = smem_addr(smem);

    float acc[BM / 2];
#pragma unroll
    for (int r = 0; r < BM / 2; ++r) acc[r] = 0.f;

#pragma unroll
    for (int r = 0; r < STAGES - 1; ++r) {
        if (r < nk) load_step(smem0 + r * STAGE_BYTES, L);
        cp_async_commit();
    }
    cp_async_wait<STAGES - 2>();
    fence_proxy_async();
    __syncthreads();

    u32 a[DEPTH][4];  // A registers of DEPTH steps: DEPTH - 1 MMAs stay in flight while one is decoded
    uint4 q0, q1;
    uint2 s0, s1;
    {
        const unsigned char* st = smem;
        s0 = *(const uint2*)(st + SCALE_OFFSET + 8 * row);
        s1 = *(const uint2*)(st + SCALE_OFFSET + 8 * (row + 8));
        q0 = *(const uint4*)(st + CODE_OFFSET + 64 * row);
        q1 = *(const uint4*)(st + CODE_OFFSET + 64 * (row + 8));
        decode_step(a[0], q0, q1, s0, s1, 0, sel);
    }
#pragma unroll
    for (int r = 0; r < BM / 2; ++r) fence_operand(acc[r]);
    int slot = 0, fill = STAGES - 1;  // the stage computed now, the stage loaded next
    for (int kt = 0; kt < nk; ++kt) {
        const unsigned long long desc = b_descriptor(smem0 + slot * STAGE_BYTES);
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            wgmma_fence();  // a[s % DEPTH] was written by the decode
            wgmma_step(acc, a[s % DEPTH], desc + ((((s >> 2) * BM * 128) + (s & 3) * 32) >> 4));
            wgmma_commit();
            if (s == 7) {
                // every warpgroup has retired its MMAs on stage kt - 1 (wait_group 1 at its s = 0)
                cp_async_wait<STAGES - 3>();  // step kt + 1 has landed (this thread's copies) ...
                fence_proxy_async();
                __syncthreads();  // ... everyone's
                if (kt + STAGES - 1 < nk) load_step(smem0 + fill * STAGE_BYTES, L);
                cp_async_commit();
                slot = slot == STAGES - 1 ? 0 : slot + 1;
                fill = fill == STAGES - 1 ? 0 : fill + 1;
                if (kt + 1 < nk) {
                    const unsigned char* st = smem + slot * STAGE_BYTES;
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
            if (s < 7 || kt + 1 < nk) decode_step(a[(s + 1) % DEPTH], q0, q1, s0, s1, (s + 1) & 7, sel);
        }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int r = 0; r < BM / 2; ++r) fence_operand(acc[r]);
    cp_async_wait<0>();

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
#pragma unroll
    for (int r = 0; r < BM / 2; ++r) {  // acc[4 h + c]: row + 8 (c / 2), token 8 h + 2 i + c % 2
        const int t = 8 * (r >> 2) + 2 * i + (r & 1);
        if (m0 + t < M)
            st_cluster(red + (rank * share + t % share) * RED_STRIDE + row + 8 * ((r >> 1) & 1), t / share, acc[r]);
    }
    cluster_sync();
#else
    // in the block's own shared memory; with a cluster, the summing block pulls them (DSMEM loads)
    // and a second barrier keeps every block's shared memory alive until then
    __syncthreads();
#pragma unroll
    for (int r = 0; r < BM / 2; ++r)
        red[(8 * (r >> 2) + 2 * i + (r & 1)) * RED_STRIDE + row + 8 * ((r >> 1) & 1)] = acc[r];
#if CLUSTER > 1
    cluster_sync();
#else
    __syncthreads();
#endif
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
#if CLUSTER > 1
            v0 += ld_cluster(p, src);
            v1 += ld_cluster(p + 1, src);
#else
            v0 += p[0];
            v1 += p[1];
#endif
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
"""
    )


@functools.cache
def _kernel(device_index: int, p: WgmmaPlan):
    return compile_kernel(device_index, _source(p), "w4a16_wgmma", arch="90a")


def shared_bytes(p: WgmmaPlan) -> int:
    """Dynamic shared memory of a block: the pipeline's stages or, after the K loop, the FP32
    partials, plus the slack that aligns them to :data:`SMEM_ALIGN`."""
    stage = -(-(p.bm * 256 + p.rows * 72) // SMEM_ALIGN) * SMEM_ALIGN
    return max(p.stages * stage, p.bm * (p.rows + 4) * 4) + SMEM_ALIGN


@functools.cache
def max_shared_bytes(device_index: int | None = None) -> int:
    """Dynamic shared memory a block may opt in to (227 KB on the H100)."""
    if device_index is None or not torch.cuda.is_available():
        return HOPPER_SMEM
    props = torch.cuda.get_device_properties(device_index)
    return int(getattr(props, "shared_memory_per_block_optin", HOPPER_SMEM))


def valid(p: WgmmaPlan, M: int, N: int, K: int, smem_limit: int = HOPPER_SMEM) -> bool:
    """Whether ``p`` tiles this problem: whole blocks of rows, ``bm`` a multiple of 16 up to 256
    (``wgmma``'s N; whole activation chunks per thread), every block of the cluster at least one
    128-wide K step, >= 3 stages, a depth that divides 8, shared memory within ``smem_limit``."""
    return (
        M > 0
        and p.wg in (1, 2)
        and p.bm % 16 == 0
        and 16 <= p.bm <= 256
        and p.stages >= 3
        and p.depth in (1, 2, 4, 8)
        and N % p.rows == 0
        and K % 128 == 0
        and p.cluster <= K // 128
        and p.cluster in (1, 2, 4, 8)
        and shared_bytes(p) <= smem_limit
    )


def supported(device: torch.device) -> bool:
    """``wgmma`` runs on sm_90 (Hopper) only."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


def w4a16_wgmma(x2, data, scale_codes, global_scale, bias, out, p: WgmmaPlan) -> None:
    """Launch (all tensors on one sm_90 device; x2 BF16 [M, K] with unit stride)."""
    M, K = x2.shape
    N = data.shape[0]
    index = cuda_index(x2)
    if not valid(p, M, N, K, max_shared_bytes(index)):
        raise ValueError(
            f"CUDA W4A16 wgmma GEMM: the tiling {p} does not fit M={M}, N={N}, K={K} (needs N % {p.rows} == 0, "
            f"K % 128 == 0 with at least {p.cluster} steps of 128, and {shared_bytes(p)} <= "
            f"{max_shared_bytes(index)} bytes of shared memory; see plan)"
        )
    launch_w4a16(
        _kernel(index, p),
        (N // p.rows, p.cluster, -(-M // p.bm)),
        p.threads,
        shared_bytes(p),
        x2,
        data,
        scale_codes,
        global_scale,
        bias,
        out,
        name="CUDA W4A16 wgmma GEMM",
    )


#: Block shapes (warpgroups, tokens) from the most work per block to the least: the largest that
#: fills the SMs is taken (fewer activation re-reads and decodes per FLOP).
TILES = ((2, 256), (2, 192), (2, 128), (1, 128), (1, 64))
MAX_STAGES = 5  # more stages did not pay in the sweep (NOTES.md)
MIN_TOKEN_USE = 0.8  # blocks of more than 128 tokens must use this share of their tokens


def plan(M: int, N: int, K: int, sm_count: int, smem_limit: int = HOPPER_SMEM) -> WgmmaPlan | None:
    """The tiling for ``[M, K] x [N, K]^T``, or None where the kernel does not tile it (N % 64,
    K % 128, M <= 0).

    Fitted to sweeps on the H100 (NOTES.md v14): the first block shape of :data:`TILES` with at most
    ``M`` rounded up to 64 tokens (and, above 128 tokens, at least :data:`MIN_TOKEN_USE` of them
    real: M = 384 takes 2 x 192, not 2 x 256) whose blocks, split over a cluster of up to 2 (then, on
    a second pass, 4) blocks, fill three quarters of the SMs within one wave; where none does, the
    smallest shape with the largest cluster that fits one wave. As many stages as fit (up to
    :data:`MAX_STAGES`), four A register sets.
    """
    if M <= 0 or N % 64 or K % 128:
        return None

    def token_use(bm: int) -> float:
        return M / (-(-M // bm) * bm)

    tiles = [
        (wg, bm)
        for wg, bm in TILES
        if N % (64 * wg) == 0 and bm <= -(-M // 64) * 64 and (bm <= 128 or token_use(bm) >= MIN_TOKEN_USE)
    ]

    def blocks(wg: int, bm: int) -> int:
        return N // (64 * wg) * -(-M // bm)

    def cluster_for(wg: int, bm: int, most: int) -> int:
        fits = [c for c in (1, 2, 4) if c <= most and c <= K // 128 and blocks(wg, bm) * c <= sm_count]
        return fits[-1] if fits else 1

    choice = None
    for most in (2, 4):
        for wg, bm in tiles:
            c = cluster_for(wg, bm, most)
            if blocks(wg, bm) * c >= 0.75 * sm_count:
                choice = (wg, bm, c)
                break
        if choice:
            break
    if choice is None:
        wg, bm = tiles[-1]
        choice = (wg, bm, cluster_for(wg, bm, 4))
    wg, bm, c = choice
    for stages in range(MAX_STAGES, 2, -1):
        p = WgmmaPlan(wg, bm, stages, c, depth=4)
        if valid(p, M, N, K, smem_limit):
            return p
    return None
