"""W4A16 GEMM on Hopper's warpgroup MMA (``wgmma``, sm_90a) for tens to a thousand tokens.

The ``mma.sync`` GEMM kernel (:mod:`~slime_gb10.nvfp4._cuda_gemm`) tops out at ~270 TFLOP/s on the
H100, issue-bound on its MMAs and decode (NOTES.md v13). Here the tensor cores run asynchronously
and the decode of the next step overlaps the MMA of this one, in the manner of Machete (Wilkinson
et al., 2024), again with ModelOpt's bytes as they are:

* A block of ``WG`` warpgroups computes ``64 WG`` weight rows x ``BM`` tokens of
  ``out = x @ W^T`` over its K range, in steps of 128 K that arrive in a ``STAGES``-deep ring of
  shared-memory stages: activations ``[2][BM tokens][128 B]`` in the 128-byte swizzle ``wgmma``
  reads (16-byte chunk c of token t at ``c ^ (t % 8)``), codes ``[64 WG rows][64 B]``, scale codes
  ``[64 WG][8 B]``.
* One more warp, the producer, fills the ring: the Tensor Memory Accelerator copies the activations
  (two boxes of 64 K x ``BM`` tokens through a tensor map with the 128-byte swizzle; tokens beyond
  M arrive as zeros) and the codes (a box of 64 B x ``64 WG`` rows), its 32 lanes copy the scale
  codes with cp.async. A stage's "full" mbarrier completes when all of those bytes have landed, its
  "empty" mbarrier when every consumer warp has retired the MMAs that read it; the producer waits
  on "empty" before refilling. The consumers issue no copies and meet at no block-wide barrier.
* Every k16 is one ``wgmma.mma_async.m64n{BM}k16`` per warpgroup: the weights are the A operand
  from registers (warp w of a warpgroup holds its rows 16 w .. 16 w + 15 in the ``mma.m16n8k16``
  A layout, so lane (g, i) decodes byte i of each 4-byte word of rows g and g + 8 with the byte
  decoder of :data:`~slime_gb10.nvfp4._cuda_gemm.GEMM_HELPERS`), the activations the B operand
  from shared memory (a descriptor: K-major, 128-byte swizzle, 1024 bytes per 8 tokens).
* ``DEPTH`` sets of A registers (2 in :func:`plan`): after issuing step s, ``wgmma.wait_group
  DEPTH - 1`` retires step s + 1 - DEPTH and the lane decodes step s + 1 into the registers that
  step used, while up to ``DEPTH - 1`` MMAs run. At step ``max(DEPTH - 2, 0)`` of stage k the
  last MMA of stage k - 1 has retired, and each warp releases that stage.
* Split-K over a thread-block cluster (``CLUSTER`` blocks), reduced in a fixed order through DSMEM
  (pushed into the summing block's shared memory from blocks of up to 128 tokens whose shares are
  whole 8-token groups, each block's address mapped once, pulled by it from larger ones: ``PUSH``,
  NOTES.md v17, v19); block ``rank`` writes its share of the tokens as BF16
  (+ bias), two rows per 4-byte store.

Requires N % (64 WG) == 0, K % 128 == 0, at least
one 128-wide step per block of a cluster and an sm_90 device (``wgmma`` exists only on sm_90a:
not on Blackwell or GB10, which have their own MMA instructions). Measured: NOTES.md, BENCHMARKS.md.
"""

from __future__ import annotations

import ctypes
import functools
from typing import NamedTuple

import torch

from slime_gb10.nvfp4._cuda_gemm import GEMM_HELPERS
from slime_gb10.nvfp4._cuda_w4a16 import (
    DEVICE_HELPERS,
    aligned_rows,
    check_weights,
    compile_kernel,
    cuda_index,
    opt_in_shared_memory,
)

SMEM_ALIGN = 1024  # the 128-byte swizzle repeats every 8 rows of 128 bytes: stages start 1024-aligned
HOPPER_SMEM = 227 * 1024  # dynamic shared memory a block may opt in to on sm_90


class WgmmaPlan(NamedTuple):
    """A tiling: ``wg`` warpgroups of 64 weight rows each, ``bm`` tokens per block (the ``wgmma``
    N: a multiple of 16 up to 256), ``stages`` in the ring (>= 2: one fills while one is read),
    ``cluster`` blocks
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
        """The consumer warpgroups and one producer warp."""
        return 128 * self.wg + 32


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
   NOTES.md v17); a pushed share is whole 8-token groups (the store's block is known at compile time) */
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
    128-wide K step, >= 2 stages, a depth that divides 8, shared memory within ``smem_limit``."""
    return (
        M > 0
        and p.wg in (1, 2)
        and p.bm % 16 == 0
        and 16 <= p.bm <= 256
        and p.stages >= 2
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


# cuTensorMapEncodeTiled's enums (cuda.h)
_TMA_UINT8, _TMA_UINT16 = 0, 1
_TMA_SWIZZLE_NONE, _TMA_SWIZZLE_128B = 0, 3
_TMA_L2_256B = 3


def _driver():
    from torch.cuda._utils import _get_gpu_runtime_library

    return _get_gpu_runtime_library()


class MapSpec(NamedTuple):
    """A 2-D tensor map: ``height`` rows of ``width`` elements of cuda.h data type ``element``,
    ``row_bytes`` apart, copied in boxes of ``box`` (elements, rows) with ``swizzle``."""

    element: int
    width: int
    height: int
    row_bytes: int
    box: tuple
    swizzle: int


def map_specs(p: WgmmaPlan, M: int, N: int, K: int, x_row_bytes: int) -> tuple[MapSpec, MapSpec]:
    """The kernel's two tensor maps: the activations (BF16 moved as 2-byte integers) in boxes of
    64 K x ``bm`` tokens, swizzled to the layout of ``b_descriptor`` (a box row is 128 bytes, the
    swizzle's span); the codes in boxes of 64 bytes (128 K) x ``rows`` rows, as they are."""
    return (
        MapSpec(_TMA_UINT16, K, M, x_row_bytes, (64, p.bm), _TMA_SWIZZLE_128B),
        MapSpec(_TMA_UINT8, K // 2, N, K // 2, (64, p.rows), _TMA_SWIZZLE_NONE),
    )


@functools.lru_cache(maxsize=1024)
def _tensor_map(address: int, spec: MapSpec):
    """The ``CUtensorMap`` of ``spec`` over the tensor at ``address`` (128 bytes, 64-byte aligned;
    boxes reaching beyond the rows read zeros). Returns (buffer, aligned address): the buffer keeps
    the memory alive. A map holds only these numbers, so equal arguments may share one."""
    buf = ctypes.create_string_buffer(128 + 64)
    aligned = (ctypes.addressof(buf) + 63) & ~63
    rc = _driver().cuTensorMapEncodeTiled(
        ctypes.c_void_p(aligned),
        ctypes.c_int(spec.element),
        ctypes.c_uint32(2),
        ctypes.c_void_p(address),
        (ctypes.c_uint64 * 2)(spec.width, spec.height),
        (ctypes.c_uint64 * 1)(spec.row_bytes),
        (ctypes.c_uint32 * 2)(*spec.box),
        (ctypes.c_uint32 * 2)(1, 1),
        ctypes.c_int(0),  # no interleave
        ctypes.c_int(spec.swizzle),
        ctypes.c_int(_TMA_L2_256B),
        ctypes.c_int(0),  # out-of-bounds elements are zeros
    )
    if rc != 0:
        raise RuntimeError(
            f"CUDA W4A16 wgmma GEMM: cuTensorMapEncodeTiled failed with CUresult {rc} for {spec}"
        )
    return buf, aligned


def w4a16_wgmma(x2, data, scale_codes, global_scale, bias, out, p: WgmmaPlan) -> None:
    """Launch on the current stream (all tensors on one sm_90 device; x2 BF16 [M, K] with unit stride,
    copied where its rows are not 16-byte aligned; the codes [N, K / 2] 16-byte and the scale codes
    [N, K / 16] 8-byte aligned, both contiguous)."""
    M, K = x2.shape
    N = data.shape[0]
    index = cuda_index(x2)
    if not valid(p, M, N, K, max_shared_bytes(index)):
        raise ValueError(
            f"CUDA W4A16 wgmma GEMM: the tiling {p} does not fit M={M}, N={N}, K={K} (needs N % {p.rows} == 0, "
            f"K % 128 == 0 with at least {p.cluster} steps of 128, and {shared_bytes(p)} <= "
            f"{max_shared_bytes(index)} bytes of shared memory; see plan)"
        )
    x2 = aligned_rows(x2)  # the TMA unit reads rows at 16-byte aligned addresses
    check_weights("CUDA W4A16 wgmma GEMM", data, scale_codes)
    x_spec, code_spec = map_specs(p, M, N, K, 2 * x2.stride(0))
    xmap, cmap = _tensor_map(x2.data_ptr(), x_spec), _tensor_map(data.data_ptr(), code_spec)
    kernel = _kernel(index, p)
    smem = shared_bytes(p)
    opt_in_shared_memory(kernel, smem)
    pointers = [
        ctypes.c_void_p(t.data_ptr())
        for t in (scale_codes, global_scale, bias if bias is not None else out, out)
    ]
    scalars = [ctypes.c_int(v) for v in (M, N, K, int(bias is not None))]
    params = (ctypes.c_void_p * 10)(
        xmap[1], cmap[1], *(ctypes.addressof(v) for v in pointers), *(ctypes.addressof(v) for v in scalars)
    )
    grid = (N // p.rows, p.cluster, -(-M // p.bm))
    stream = torch.cuda.current_stream(index).cuda_stream
    rc = _driver().cuLaunchKernel(
        kernel.func, *grid, p.threads, 1, 1, smem, ctypes.c_void_p(stream), params, None
    )
    if rc != 0:
        raise RuntimeError(f"CUDA W4A16 wgmma GEMM: cuLaunchKernel failed with CUresult {rc} (tiling {p})")


#: Block shapes (warpgroups, tokens) from the most work per block to the least: the largest that
#: fills the SMs is taken (fewer activation re-reads and decodes per FLOP).
TILES = ((2, 256), (2, 192), (2, 128), (1, 128), (1, 64))
MAX_STAGES = 5  # more stages did not pay in the sweep (NOTES.md)
MIN_TOKEN_USE = 0.8  # blocks of more than 128 tokens must use this share of their tokens
#: A (2, 192) block's rate against a (2, 256) one as the rule below weighs it: fitted to the H100 sweep
#: (NOTES.md v18), where it takes 5120 x 5120 at M = 1024 and 11008 x 4096 at M = 512 to 192 tokens
#: (0.83x of the time) and leaves 11008 x 4096 at M = 1024 on 256 (192 took 1.25x there)
RATE_192 = 0.8
#: Blocks of a shape that run on one SM at once, where more than one: a (1, 64) block takes up to
#: 106 KB of shared memory, so two share an SM (``cuOccupancyMaxActiveClusters``: 62 clusters of 4,
#: NOTES.md v19)
BLOCKS_PER_SM = {(1, 64): 2}
#: The share of the SMs that clusters of 4 blocks of one SM each can hold at once: 30 clusters on the
#: H100's 132 SMs (``cuOccupancyMaxActiveClusters``, NOTES.md v19; a GPC's leftover SMs stay idle)
CLUSTER4_SM_SHARE = 120 / 132
#: K steps of 128 each block of a cluster must keep for a wider split to pay: a wave of two (1, 64)
#: blocks per SM, and (1, 128) blocks with clusters of 4 on the first pass (NOTES.md v20)
MIN_SPLIT_STEPS = 8


def plan(M: int, N: int, K: int, sm_count: int, smem_limit: int = HOPPER_SMEM) -> WgmmaPlan | None:
    """The tiling for ``[M, K] x [N, K]^T``, or None where the kernel does not tile it (N % 64,
    K % 128, M <= 0).

    Fitted to sweeps on the H100 (NOTES.md v14): the first block shape of :data:`TILES` with at most
    ``M`` rounded up to 64 tokens (and, above 128 tokens, at least :data:`MIN_TOKEN_USE` of them
    real: M = 384 takes 2 x 192, not 2 x 256) whose blocks, split over a cluster of up to 2 (then, on
    a second pass, 4; 1 x 128 blocks take 4 on the first pass where each keeps 8 steps of K) blocks,
    fill three quarters of the SMs within one wave; where none does, the
    smallest shape with the largest cluster (up to 8 for 1 x 64 blocks where K > 1024, else 4) that
    fits one wave. A wave is one block per SM, but only :data:`CLUSTER4_SM_SHARE` of the SMs with
    clusters of 4, and two (1, 64) blocks per SM where each keeps :data:`MIN_SPLIT_STEPS` steps
    (NOTES.md v20: 0.82-0.97x of the time on layers with K >= 3072). Where (2, 256) blocks take more than
    one wave, (2, 192) ones instead if their last wave is fuller by more than their lower rate
    (:data:`RATE_192`). As many stages as fit (up to
    :data:`MAX_STAGES`), two A register sets (with the TMA producer, 0.85-0.9x of the time of four at
    M >= 256 on the large layers, NOTES.md v18).
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

    def wave(wg: int, bm: int, c: int) -> int:
        """Blocks that run at once with clusters of ``c``."""
        per_sm = BLOCKS_PER_SM.get((wg, bm), 1)
        if per_sm == 1 and c == 4:
            return int(sm_count * CLUSTER4_SM_SHARE)
        if per_sm > 1 and K // (128 * c) >= MIN_SPLIT_STEPS:  # steps of 128 a block keeps
            return sm_count * per_sm
        return sm_count

    def cluster_for(wg: int, bm: int, most: int) -> int:
        fits = [
            c
            for c in (1, 2, 4, 8)
            if c <= most
            and c <= K // 128
            and (c < 8 or K > 8 * 128)
            and blocks(wg, bm) * c <= wave(wg, bm, c)
        ]
        return fits[-1] if fits else 1

    choice = None
    for most in (2, 4):
        for wg, bm in tiles:
            # (1, 128) blocks take clusters of 4 already on the first pass, before (1, 64) ones with 2,
            # where each block keeps >= 8 steps: 0.88-0.99x of the time on 896 x 4864 and 640 x 5120 at
            # M = 224-384; larger blocks so took 1.06-1.15x (NOTES.md v20)
            early = (wg, bm) == (1, 128) and K // (128 * 4) >= MIN_SPLIT_STEPS
            c = cluster_for(wg, bm, 4 if early else most)
            if blocks(wg, bm) * c >= 0.75 * sm_count:
                choice = (wg, bm, c)
                break
        if choice:
            break
    if choice is None:
        # the smallest blocks take clusters of up to 8 (two of them fit an SM, so such clusters find
        # room) where K has more than 8 steps: 0.74-0.91x of the time with 4 on 896 x 4864, 512 x 4096
        # and 576 x 1536 at M = 33..64; 1.08x on 1024 x 1024, one step a block (NOTES.md v19)
        wg, bm = tiles[-1]
        choice = (wg, bm, cluster_for(wg, bm, 8 if (wg, bm) == TILES[-1] else 4))
    wg, bm, c = choice
    if (wg, bm) == (2, 256) and blocks(2, 256) > sm_count and (2, 192) in tiles:
        # more than one wave: where 192-token blocks leave less of the last wave idle than they lose
        # in rate, they are faster (5120 x 5120 at M = 1024: 99 against 120 us on the H100)
        def wave_use(n: int) -> float:
            return n / (-(-n // sm_count) * sm_count)

        if RATE_192 * wave_use(blocks(2, 192)) > wave_use(blocks(2, 256)):
            wg, bm, c = 2, 192, 1
    for stages in range(MAX_STAGES, 2, -1):
        p = WgmmaPlan(wg, bm, stages, c, depth=2)
        if valid(p, M, N, K, smem_limit):
            return p
    return None
