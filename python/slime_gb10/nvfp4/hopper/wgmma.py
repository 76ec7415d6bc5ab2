"""W4A16 GEMM on Hopper's warpgroup MMA (``wgmma``, sm_90a) for tens to a thousand tokens.

The ``mma.sync`` GEMM kernel (:mod:`~slime_gb10.nvfp4._cuda_gemm`) tops out at ~270 TFLOP/s on the
H100, issue-bound on its MMAs and decode (docs/nvfp4-notes.md v13). Here the tensor cores run asynchronously
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
  decoder of ``cuda/gemm_helpers.cuh``), the activations the B operand
  from shared memory (a descriptor: K-major, 128-byte swizzle, 1024 bytes per 8 tokens).
* ``DEPTH`` sets of A registers (2 in :func:`plan`): after issuing step s, ``wgmma.wait_group
  DEPTH - 1`` retires step s + 1 - DEPTH and the lane decodes step s + 1 into the registers that
  step used, while up to ``DEPTH - 1`` MMAs run. At step ``max(DEPTH - 2, 0)`` of stage k the
  last MMA of stage k - 1 has retired, and each warp releases that stage.
* Split-K over a thread-block cluster (``CLUSTER`` blocks), reduced in a fixed order through DSMEM
  (pushed into the summing block's shared memory from blocks of up to 128 tokens whose shares are
  whole 8-token groups, each block's address mapped once, pulled by it from larger ones: ``PUSH``,
  docs/nvfp4-notes.md v17, v19); block ``rank`` writes its share of the tokens as BF16
  (+ bias), two rows per 4-byte store.

Requires N % (64 WG) == 0, K % 128 == 0, at least
one 128-wide step per block of a cluster and an sm_90 device (``wgmma`` exists only on sm_90a:
not on Blackwell or GB10, which have their own MMA instructions). Measured: docs/nvfp4-notes.md, BENCHMARKS.md.
"""

from __future__ import annotations

import ctypes
import functools
from typing import NamedTuple

import torch

from slime_gb10.nvfp4._cuda_w4a16 import (
    LARGE_WEIGHT_PARAMS,
    aligned_rows,
    check_weights,
    compile_kernel,
    cuda_index,
    opt_in_shared_memory,
    render_source,
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


def _wgmma_substitutions(bm: int) -> dict[str, str]:
    """What ``cuda/wgmma_step.cuh`` (``wgmma_step(acc, a, desc)``: ``acc[0 .. bm/2)`` += A (registers)
    x B (descriptor), m64n{bm}k16) needs for this BM: the accumulator operand lists."""
    n = bm // 2
    subs = {"BM": str(bm), "ACC": ",".join(f"%{r}" for r in range(n))}
    subs["OPERANDS"] = ", ".join(f'"+f"(d[{r}])' for r in range(n))
    subs.update({f"N{i}": str(n + i) for i in range(5)})
    return subs


def wgmma_step_source(bm: int) -> str:
    """``cuda/wgmma_step.cuh`` as rendered for ``bm`` (what the kernel source includes)."""
    return render_source("wgmma_step.cuh", "", **_wgmma_substitutions(bm))


def _source(p: WgmmaPlan) -> str:
    cluster_attr = f"__cluster_dims__(1, {p.cluster}, 1)" if p.cluster > 1 else ""
    defines = (
        f"#define WG {p.wg}\n#define BM {p.bm}\n#define STAGES {p.stages}\n#define CLUSTER {p.cluster}\n"
        f"#define DEPTH {p.depth}\n#define CLUSTER_ATTR {cluster_attr}\n"
    )
    return render_source("w4a16_wgmma.cu", defines, **_wgmma_substitutions(p.bm))


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
MAX_STAGES = 5  # more stages did not pay in the sweep (docs/nvfp4-notes.md)
MIN_TOKEN_USE = 0.8  # blocks of more than 128 tokens must use this share of their tokens
#: A (2, 192) block's rate against a (2, 256) one as the rule below weighs it: fitted to the H100 sweep
#: (docs/nvfp4-notes.md v18), where it takes 5120 x 5120 at M = 1024 and 11008 x 4096 at M = 512 to 192 tokens
#: (0.83x of the time) and leaves 11008 x 4096 at M = 1024 on 256 (192 took 1.25x there)
RATE_192 = 0.8
#: Blocks of a shape that run on one SM at once, where more than one: a (1, 64) block takes up to
#: 106 KB of shared memory, so two share an SM (``cuOccupancyMaxActiveClusters``: 62 clusters of 4,
#: docs/nvfp4-notes.md v19)
BLOCKS_PER_SM = {(1, 64): 2}
#: The share of the SMs that clusters of 4 blocks of one SM each can hold at once: 30 clusters on the
#: H100's 132 SMs (``cuOccupancyMaxActiveClusters``, docs/nvfp4-notes.md v19; a GPC's leftover SMs stay idle)
CLUSTER4_SM_SHARE = 120 / 132
#: K steps of 128 each block of a cluster must keep for a wider split to pay: a wave of two (1, 64)
#: blocks per SM, and (1, 128) blocks with clusters of 4 on the first pass (docs/nvfp4-notes.md v20)
MIN_SPLIT_STEPS = 8


def plan(M: int, N: int, K: int, sm_count: int, smem_limit: int = HOPPER_SMEM) -> WgmmaPlan | None:
    """The tiling for ``[M, K] x [N, K]^T``, or None where the kernel does not tile it (N % 64,
    K % 128, M <= 0).

    Fitted to sweeps on the H100 (docs/nvfp4-notes.md v14): the first block shape of :data:`TILES` with at most
    ``M`` rounded up to 64 tokens (and, above 128 tokens, at least :data:`MIN_TOKEN_USE` of them
    real: M = 384 takes 2 x 192, not 2 x 256) whose blocks, split over a cluster of up to 2 (then, on
    a second pass, 4; 1 x 128 blocks take 4 on the first pass where each keeps 8 steps of K) blocks,
    fill three quarters of the SMs within one wave; where none does, the
    smallest shape with the largest cluster (up to 8 for 1 x 64 blocks where K > 1024, else 4) that
    fits one wave. A wave is one block per SM, but only :data:`CLUSTER4_SM_SHARE` of the SMs with
    clusters of 4, and two (1, 64) blocks per SM where each keeps :data:`MIN_SPLIT_STEPS` steps
    (docs/nvfp4-notes.md v20: 0.82-0.97x of the time on layers with K >= 3072). Where (2, 256) blocks take more than
    one wave, (2, 192) ones instead if their last wave is fuller by more than their lower rate
    (:data:`RATE_192`). As many stages as fit (up to
    :data:`MAX_STAGES`), two A register sets (with the TMA producer, 0.85-0.9x of the time of four at
    M >= 256 on the large layers, docs/nvfp4-notes.md v18).
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
            # M = 224-384; larger blocks so took 1.06-1.15x (docs/nvfp4-notes.md v20)
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
        # and 576 x 1536 at M = 33..64; 1.08x on 1024 x 1024, one step a block (docs/nvfp4-notes.md v19)
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


@functools.cache
def engine_available(device_index: int) -> bool:
    """This device is an sm_90 one and NVRTC compiles the kernel for it (a warning says why not)."""
    if torch.cuda.get_device_capability(device_index) != (9, 0):  # wgmma is sm_90a only
        return False
    try:
        _kernel(device_index, WgmmaPlan(1, 64, stages=3, depth=2))  # NVRTC compiles
    except Exception as exc:  # an NVRTC without sm_90a: the other kernels instead
        import warnings

        warnings.warn(f"the wgmma W4A16 kernel is unavailable ({exc})", stacklevel=3)
        return False
    return True


# --- when to take it (measured on the H100) ---------------------------------------------------------

WGMMA_MIN_M = 32  # the wgmma kernel from M = 33 (below, the CUDA GEMM and weight-streaming kernels lead)
WGMMA_MAX_M = 2048  # its last M ahead of dequantize + cuBLAS on weights of >= 2**24 parameters (H100) ...
WGMMA_SMALL_MAX_M = 256  # ... on smaller ones with N <= K (896 x 4864 at 256: 0.94x of its time) ...
WGMMA_SMALL_WIDE_MAX_M = 128  # ... and with N > K (4864 x 896 at M = 192: 1.18x; docs/nvfp4-notes.md v20)


def wgmma_is_faster(M: int, N: int, K: int) -> bool:
    """Whether the wgmma kernel (this module, sm_90 only) is the kernel to
    take where it runs, on shapes it tiles (N % 64, K % 128): from M = 33 up to 2048 on weights of
    >= 2**24 parameters; on smaller weights up to 256 where N <= K and up to 128 where N > K.
    Measured on the H100 against the other kernels and dequantize + cuBLAS (docs/nvfp4-notes.md v14, v18,
    v20): at M = 1024 and 2048 ahead on 4096 x 4096, 4096 x 14336, 8192 x 8192, 11008 x 4096 and
    14336 x 4096 (0.78-0.98x of the time), behind on 5120 x 5120 (1.05x); at 4096 behind on
    14336 x 4096 and 2048 x 2048 (1.13x), within 2% or ahead on the rest. On 10 smaller weights at
    M = 192-256: ahead or level where N <= K (0.65-1.01x; 3072 x 3072 at 256 1.07x), behind on the
    three with N > K (1.02-1.18x)."""
    if N % 64 or K % 128:
        return False
    if N * K >= LARGE_WEIGHT_PARAMS:
        last_m = WGMMA_MAX_M
    else:
        last_m = WGMMA_SMALL_MAX_M if N <= K else WGMMA_SMALL_WIDE_MAX_M
    return WGMMA_MIN_M < M <= last_m
