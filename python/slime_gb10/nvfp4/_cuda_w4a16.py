"""W4A16 GEMM for M <= 16 in CUDA C, compiled at run time with NVRTC (``torch.cuda._compile_kernel``).

Why not Triton here: the Triton kernel (``_triton_kernels.w4a16_kernel``) decodes as few instructions
per weight as this one, but the K loop Triton generates around ``tl.dot`` stays latency bound (staged
codes read back from shared memory with bank conflicts, barriers, few warps): 1.1-1.3x of BF16 at
best on an H100 (NOTES.md). This kernel controls the layout itself:

* a warp owns 32 weight rows (4 groups of 8, the ``n`` of ``mma.m16n8k16``); lane ``(g, i)`` =
  ``(lane // 4, lane % 4)`` loads 16 bytes of row ``g`` per 128-wide K segment (32 codes), with one
  16-byte load per row group and segment, all issued before any is used;
* each 32-bit word of codes becomes four BF16x2 registers with the inline-PTX pair decoder of the
  Triton kernel (codes ``j`` and ``j + 4`` share a register); two registers are one B fragment, so
  a word feeds two MMAs, and K is permuted consistently: word ``j`` of lane ``i`` holds real k
  ``32 i + 8 j + 0..7``, and the activations are written to shared memory once per block in the
  matching order (rows g and g+8 interleaved), so each A fragment is one 16-byte shared-memory
  load straight into the MMA's register quad;
* the group scales are the prepared scale codes (one shift-and-add to BF16 ``s * 2**119``); the
  FP32 result is multiplied by ``global_scale * 2**7``;
* split-K partials go to an FP32 buffer; the last block of each row tile (an atomic counter, reset
  afterwards) adds them in split order and writes BF16 (+ bias): one launch, deterministic.

Rows of ``x`` beyond M are zeros in shared memory (never loaded from ``x``). Requires N % 128 == 0 and
K % (128 * split) == 0. Measured on the H100 (BENCHMARKS.md): 1.1-1.6x of BF16 at M=1 and up to 1.5x at
M=4, ahead of the Triton kernel there, but behind it at M=16 (the split-K partials and the per-block
activation staging grow with M), so :func:`slime_gb10.nvfp4.kernels.w4a16_matmul` picks it by itself
for M <= 4 only.
"""

from __future__ import annotations

import functools

import torch

ROWS_PER_BLOCK = 128  # 4 warps x 4 row groups x 8 rows
MAX_K_RANGE = 1024  # K per block: the permuted activations take 16 * K_range * 2 bytes of shared memory


def _source() -> str:
    from slime_gb10.nvfp4._triton_kernels import _PAIR_DECODER_PTX

    decoder = str(_PAIR_DECODER_PTX.value).replace("$", "%").replace("\n", " ")
    return (
        r"""
typedef unsigned int u32;
typedef unsigned short u16;

__device__ __forceinline__ void decode(u32 q, u32 s2, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm(" """
        + decoder
        + r""" " : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(q), "r"(s2));
}

__device__ __forceinline__ void mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 scale_pair(u32 code) {  // BF16 s * 2**119 in both halves
    u32 v = (code << 4) + (237u << 7);
    return v | (v << 16);
}

__device__ __forceinline__ u16 to_bf16(float f) {  // round to nearest even (finite values)
    u32 b = __float_as_uint(f);
    return (u16)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

struct Segment {  // one 128-wide K segment of 4 row groups: 16 bytes of codes + 2 scale codes each
    uint4 q[4];
    u32 sc[4];
};

__device__ __forceinline__ void load_segment(Segment& seg, const unsigned char* const* crow,
                                             const unsigned char* const* srow, int s) {
    for (int ng = 0; ng < 4; ++ng) {
        seg.q[ng] = __ldg((const uint4*)(crow[ng] + s * 64));
        seg.sc[ng] = __ldg((const u16*)(srow[ng] + s * 8));
    }
}

__device__ __forceinline__ void compute_segment(float (*acc)[4], const Segment& seg, const uint4* xs_seg) {
    // xs_seg: this lane's 8 A-fragment quads of the segment: [word j][t]
    uint4 a[4][2];
    for (int j = 0; j < 4; ++j) { a[j][0] = xs_seg[2 * j]; a[j][1] = xs_seg[2 * j + 1]; }
    for (int ng = 0; ng < 4; ++ng) {
        const u32 s_lo = scale_pair(seg.sc[ng] & 0xFFu), s_hi = scale_pair((seg.sc[ng] >> 8) & 0xFFu);
        const u32 words[4] = {seg.q[ng].x, seg.q[ng].y, seg.q[ng].z, seg.q[ng].w};
        for (int j = 0; j < 4; ++j) {
            u32 r0, r1, r2, r3;
            decode(words[j], j < 2 ? s_lo : s_hi, r0, r1, r2, r3);
            mma(acc[ng], a[j][0].x, a[j][0].y, a[j][0].z, a[j][0].w, r0, r1);
            mma(acc[ng], a[j][1].x, a[j][1].y, a[j][1].z, a[j][1].w, r2, r3);
        }
    }
}

extern "C" __global__ void __launch_bounds__(128) w4a16_m16(
    const u16* __restrict__ x, const unsigned char* __restrict__ codes, const unsigned char* __restrict__ scodes,
    const float* __restrict__ gs, const u16* __restrict__ bias, u16* __restrict__ out,
    float* __restrict__ partial, int* __restrict__ counters,
    int M, int N, int K, int k_range, int split, int stride_xm, int has_bias)
{
    // Permuted activations: one 16-byte A-fragment quad per (row pair g, segment s, lane i, word j,
    // t): {x[g][k], x[g][k+4]}, {x[g+8][k], ..}, {x[g][k+1], x[g][k+5]}, {x[g+8][k+1], ..} with
    // k = k0 + 128 s + 32 i + 8 j + 2 t (rows >= M are zeros). 16 * k_range * 2 bytes.
    extern __shared__ uint4 xs[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, i = lane & 3;
    const int k0 = blockIdx.y * k_range;
    const int segments = k_range >> 7;

    // 1. activations -> shared memory in A-fragment order: a thread takes 8 consecutive values of a
    //    row (one 16-byte load: k = k0 + 128 s + 32 i + 8 j + 0..7, i.e. chunk c = 16 s + 4 i + j)
    //    and writes the four pairs (k, k+4), (k+1, k+5), (k+2, k+6), (k+3, k+7) into the quads of
    //    t = 0 and t = 1; rows >= M are zeros.
    u32* xs32 = (u32*)xs;
    const int chunks = k_range >> 3;
    for (int c = tid; c < chunks; c += 128) {
        const int s = c >> 4, ii = (c >> 2) & 3, j = c & 3;
        for (int row = 0; row < 16; ++row) {
            uint4 v = make_uint4(0, 0, 0, 0);
            if (row < M) v = __ldg((const uint4*)(x + (size_t)row * stride_xm + k0 + 8 * c));
            // v holds k+0..k+7 as (lo, hi) halves of .x .y .z .w
            const u32 p04 = (v.x & 0xFFFFu) | (v.z << 16), p15 = (v.x >> 16) | (v.z & 0xFFFF0000u);
            const u32 p26 = (v.y & 0xFFFFu) | (v.w << 16), p37 = (v.y >> 16) | (v.w & 0xFFFF0000u);
            const int g = row & 7, hi_row = row >> 3;
            u32* quad = xs32 + ((((size_t)g * segments + s) * 4 + ii) * 4 + j) * 8;  // 2 quads: t = 0, 1
            quad[0 + hi_row] = p04;      // t = 0, h = 0
            quad[2 + hi_row] = p15;      // t = 0, h = 1
            quad[4 + hi_row] = p26;      // t = 1, h = 0
            quad[6 + hi_row] = p37;      // t = 1, h = 1
        }
    }
    __syncthreads();

    // 2. the weight stream, double-buffered in registers
    const int n_warp = blockIdx.x * 128 + warp * 32;
    const unsigned char* crow[4];
    const unsigned char* srow[4];
    for (int ng = 0; ng < 4; ++ng) {
        const size_t n = (size_t)(n_warp + ng * 8 + g);
        crow[ng] = codes + n * (size_t)(K >> 1) + (k0 >> 1) + 16 * i;
        srow[ng] = scodes + n * (size_t)(K >> 4) + (k0 >> 4) + 2 * i;
    }
    float acc[4][4];
    for (int ng = 0; ng < 4; ++ng) for (int c = 0; c < 4; ++c) acc[ng][c] = 0.f;
    const uint4* xs_lane = xs + ((size_t)g * segments * 16 + i * 4) * 2;  // + s * 32 per segment
    Segment A, B;
    load_segment(A, crow, srow, 0);
    int s = 0;
    for (; s + 1 < segments; s += 2) {
        load_segment(B, crow, srow, s + 1);
        compute_segment(acc, A, xs_lane + s * 32);
        if (s + 2 < segments) load_segment(A, crow, srow, s + 2);
        compute_segment(acc, B, xs_lane + (s + 1) * 32);
    }
    if (s < segments) compute_segment(acc, A, xs_lane + s * 32);

    // 3. epilogue: c0, c1 = tokens g, rows 2i, 2i+1 of the group; c2, c3 = token g + 8
    const float out_scale = gs[0] * 128.f;
    if (split == 1) {
        for (int ng = 0; ng < 4; ++ng) {
            const int n = n_warp + ng * 8 + 2 * i;
            for (int c = 0; c < 4; ++c) {
                const int m = g + (c >> 1) * 8, nn = n + (c & 1);
                if (m < M) {
                    float v = acc[ng][c] * out_scale;
                    if (has_bias) v += __uint_as_float((u32)bias[nn] << 16);
                    out[(size_t)m * N + nn] = to_bf16(v);
                }
            }
        }
        return;
    }
    const size_t MN = (size_t)M * N;
    for (int ng = 0; ng < 4; ++ng) {
        const int n = n_warp + ng * 8 + 2 * i;
        for (int c = 0; c < 4; ++c) {
            const int m = g + (c >> 1) * 8;
            if (m < M) partial[blockIdx.y * MN + (size_t)m * N + n + (c & 1)] = acc[ng][c] * out_scale;
        }
    }
    __threadfence();
    __shared__ int last;
    __syncthreads();
    if (tid == 0) last = atomicAdd(&counters[blockIdx.x], 1) == split - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int e = tid; e < M * 128; e += 128) {  // this block's 128 rows, all tokens, splits in order
        const int m = e >> 7, nn = blockIdx.x * 128 + (e & 127);
        float v = 0.f;
        for (int sp = 0; sp < split; ++sp) v += __ldcg(&partial[sp * MN + (size_t)m * N + nn]);
        if (has_bias) v += __uint_as_float((u32)bias[nn] << 16);
        out[(size_t)m * N + nn] = to_bf16(v);
    }
    if (tid == 0) counters[blockIdx.x] = 0;  // ready for the next call
}
"""
    )


def _ensure_nvrtc() -> None:
    """Make ``libnvrtc`` loadable by soname, as torch looks for it. Where the loader does not find it
    (a Nix environment: no global library path), load it from ``$CUDA_HOME/lib`` first; glibc then
    resolves the soname to the library already loaded. Raises OSError if there is none."""
    from torch.cuda._utils import _get_nvrtc_library

    try:
        _get_nvrtc_library()
        return
    except OSError:
        pass
    import ctypes
    import glob
    import os

    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    for path in sorted(glob.glob(os.path.join(home, "lib*", "libnvrtc.so*"))):
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            break
        except OSError:
            continue
    _get_nvrtc_library()


def available() -> bool:
    """NVRTC through torch (``torch.cuda._compile_kernel``, private but present since torch 2.8), its
    library, and a CUDA device with ``mma.sync`` BF16 (sm_80+) and ``mul.rn.bf16x2`` (sm_90+)."""
    if not (torch.cuda.is_available() and hasattr(torch.cuda, "_compile_kernel")):
        return False
    if torch.cuda.get_device_capability()[0] < 9:
        return False
    try:
        _ensure_nvrtc()
    except OSError:
        return False
    return True


@functools.cache
def _kernel(device_index: int):
    major, minor = torch.cuda.get_device_capability(device_index)
    with torch.cuda.device(device_index):
        return torch.cuda._compile_kernel(_source(), "w4a16_m16", compute_capability=f"{major}{minor}")


def plan_split(N: int, K: int, sm_count: int) -> int | None:
    """Split-K for this kernel, or None when it does not apply (N % 128, K % 128).

    About one wave of resident blocks (4 per SM at ~104 registers and <= 32 KB of shared memory):
    the split that divides K into 128-multiples of at most 1024 closest to ``4 * SMs / row tiles``.
    On the H100 this picked the fastest of all valid splits at M=1 for the four bench shapes
    (NOTES.md); GB10 (48 SMs) is not measured.
    """
    if N % ROWS_PER_BLOCK or K % 128:
        return None
    segments = K // 128
    valid = [d for d in range(1, segments + 1) if segments % d == 0 and K // d <= MAX_K_RANGE]
    target = 4 * sm_count / (N // ROWS_PER_BLOCK)
    return min(valid, key=lambda d: (abs(d - target), d))


def w4a16_m16(x2, data, scale_codes, global_scale, bias, out, counters, split: int) -> None:
    """Launch (all tensors on one CUDA device; x2 BF16 [M, K] with unit stride, M <= 16)."""
    M, K = x2.shape
    N = data.shape[0]
    k_range = K // split
    if M > 16 or N % ROWS_PER_BLOCK or K % split or k_range % 128 or k_range > MAX_K_RANGE:
        raise ValueError(
            f"CUDA W4A16 kernel: needs M <= 16, N % {ROWS_PER_BLOCK} == 0 and K / split a multiple of 128 "
            f"up to {MAX_K_RANGE}; got M={M}, N={N}, K={K}, split={split} (see plan_split)"
        )
    if x2.stride(0) % 8 or x2.data_ptr() % 16:  # rows are read with 16-byte loads
        x2 = x2.contiguous()
    partial = torch.empty((split, M, N), dtype=torch.float32, device=x2.device) if split > 1 else out
    kernel = _kernel(x2.device.index if x2.device.index is not None else torch.cuda.current_device())
    kernel(
        grid=(N // ROWS_PER_BLOCK, split, 1),
        block=(128, 1, 1),
        args=[
            x2,
            data,
            scale_codes,
            global_scale,
            bias if bias is not None else out,
            out,
            partial,
            counters,
            M,
            N,
            K,
            k_range,
            split,
            x2.stride(0),
            int(bias is not None),
        ],
        shared_mem=16 * k_range * 2,
    )
