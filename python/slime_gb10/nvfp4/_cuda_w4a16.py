"""W4A16 GEMM for M <= 32 in CUDA C, compiled at run time with NVRTC (``torch.cuda._compile_kernel``).

The automatic choice (``w4a16.w4a16_matmul``) takes this weight-streaming kernel up to M = 16
(M = 9..16 only where N >= K or N >= 4096); above, and on the smaller K > N layers from M = 9, the
GEMM-shaped kernel of :mod:`~slime_gb10.nvfp4._cuda_gemm` is faster (docs/nvfp4-notes.md, sessions 7 and 10).
Both are reachable with ``engine=``.

Why not Triton here: the Triton kernel (``_triton_kernels.w4a16_kernel``) decodes as few instructions
per weight as this one, but the K loop Triton generates around ``tl.dot`` stays latency bound (staged
codes read back from shared memory with bank conflicts, barriers, few warps): 1.1-1.3x of BF16 at
best on an H100 (docs/nvfp4-notes.md). This kernel controls the layout and the memory pipeline itself:

* The weights are the MMA's A operand (``mma.m16n8k16``: 16 weight rows x 8 tokens), so M <= 8 pads
  to 8 tokens, not 16; larger M takes up to 4 token tiles, each decoded weight register feeding one
  MMA per tile. A warp owns 32 weight rows; lane ``(g, i)`` = ``(lane // 4, lane % 4)`` loads 16
  bytes of codes (32 codes) of rows g, g+8, g+16 and g+24 per 128-wide K segment.
* The code loads of ``DEPTH`` segments are in flight per warp (a ring of registers, fully unrolled),
  or of ``STAGES - 1`` through a cp.async ring in shared memory, whose copies fetch whole 128-byte
  L2 lines where a warp streams many segments (``Plan.line``, docs/nvfp4-notes.md v17); the first ones are
  issued before the activations are staged, so the two latencies overlap.
* Each 32-bit word of codes becomes four BF16x2 registers with the inline-PTX pair decoder of the
  Triton kernel (codes ``j`` and ``j + 4`` share a register). K is permuted consistently: word ``j``
  of lane ``i`` holds real k ``32 i + 8 j + 0..7``, and the activations are written to shared memory
  once per block in the matching B-fragment order, so one conflict-free 16-byte load gives the B
  registers of two MMAs. Where a block's activations do not fit (M > 16 on long K ranges), they are
  restaged every ``window`` segments (``WINDOWED``; a barrier each time).
* The group scales are the prepared scale codes (one shift-and-add to BF16 ``s * 2**119``); the FP32
  result is multiplied by ``global_scale * 2**7``.
* A block has 4, 8 or 16 warps (``WARPS``). For M <= 8 the plan prefers 8-16 warps on 16-64 rows
  (more loads in flight per SM from the first moment, fewer blocks staging the same activations):
  1.2-1.4x faster than 4-warp blocks at M = 1 on 4096 x 4096 and smaller layers (docs/nvfp4-notes.md v15).
  For M = 9..16, 8 warps on 32-256 rows: the 16 staged tokens are shared by more weight rows
  (docs/nvfp4-notes.md v16).
* Split-K has two levels, both reduced in shared memory in a fixed order (deterministic, no global
  partials, no counters): ``WARPS / RW`` warps of a block share rows and split the block's K range, and
  ``CLUSTER`` blocks of a thread-block cluster (sm_90+) split K further; each block sums its share of
  the rows and writes BF16 (+ bias). Blocks of 8-16 warps, or of one K-warp per row set, push their
  partials into the summing block's shared memory (DSMEM stores, then one cluster barrier); 4-warp
  blocks whose K-warps share rows keep theirs and the summing block pulls them (DSMEM loads between
  two cluster barriers). Each was the faster on those tilings (docs/nvfp4-notes.md v17).

Rows of ``x`` beyond M are zeros in shared memory (never loaded from ``x``). Requires N % 32 == 0 and
K % 128 == 0; :func:`plan` picks the tiling. Measured on the H100: BENCHMARKS.md.
"""

from __future__ import annotations

import functools
import math
import re
from typing import NamedTuple

import torch

# Weights of at least this many parameters give the wide kernels enough programs to fill the GPU
# (the split the wide Triton and the Hopper wgmma kernels' thresholds use).
LARGE_WEIGHT_PARAMS = 1 << 24

MAX_SMEM = 96 * 1024  # dynamic shared memory per block (above 48 KB by opting in; GB10 allows 99 KB)


def max_shared_bytes() -> int:
    """:data:`MAX_SMEM` where torch's NVRTC kernels can opt in above 48 KB
    (``_CudaKernel.set_shared_memory_config``, private), else the 48 KB every kernel gets."""
    from torch.cuda import _utils

    kernel_class = getattr(_utils, "_CudaKernel", None)
    return MAX_SMEM if hasattr(kernel_class, "set_shared_memory_config") else 48 * 1024


class Plan(NamedTuple):
    """A tiling of the kernel.

    ``nt``: token tiles of 8 (M <= 8 nt); ``cluster``: blocks of a cluster splitting K; ``rw``: warps
    per block with their own rows (the other ``4 // rw`` warps split the block's K range); ``depth``:
    segments of codes in flight per warp; ``rows``: weight rows per warp (16 or 32); ``loads``:
    16-byte loads per row and segment (a segment is ``128 * loads`` wide in K); ``stages``: slots of
    the cp.async ring (0: a register ring of ``depth``); ``minb``: blocks per SM the registers are
    capped for; ``window``: segments per K-warp whose activations are staged at a time (0: all of
    them, once; the cp.async ring restages every ``window`` segments); ``warps``: warps per block
    (4, 8 or 16; ``warps // rw`` of them split the K range of each row set); ``line``: the cp.async
    ring's copies fetch whole 128-byte lines into the L2 (``.L2::128B``, see :func:`four_warp_plan`).
    """

    nt: int
    cluster: int
    rw: int
    depth: int
    rows: int = 32
    loads: int = 1
    stages: int = 0
    minb: int = 1
    window: int = 0
    warps: int = 4
    line: bool = False


def render_source(name: str, defines: str, **substitutions: str) -> str:
    """The CUDA C of kernel file ``cuda/<name>`` (package data) as NVRTC compiles it: ``defines``
    (the plan's ``#define`` lines) first, each ``// @include <file>`` line replaced by that file of
    ``cuda/``, each ``@KEY@`` by ``substitutions[KEY]`` (text made in Python: the PTX decoder
    shared with Triton, the wgmma shapes)."""
    from importlib.resources import files

    folder = files("slime_gb10.nvfp4") / "cuda"
    text = (folder / name).read_text(encoding="utf-8")
    text = re.sub(
        r"^// @include (\S+)\n", lambda m: (folder / m.group(1)).read_text(encoding="utf-8"), text, flags=re.M
    )
    for key, value in substitutions.items():
        text = text.replace(f"@{key}@", value)
    return defines + text


def _source(p: Plan) -> str:
    from slime_gb10.nvfp4._triton_kernels import _PAIR_DECODER_PTX

    decoder = str(_PAIR_DECODER_PTX.value).replace("$", "%").replace("\n", " ")
    cluster_attr = f"__cluster_dims__(1, {p.cluster}, 1)" if p.cluster > 1 else ""
    defines = (
        f"#define NT {p.nt}\n#define CLUSTER {p.cluster}\n#define RW {p.rw}\n#define DEPTH {p.depth}\n"
        f"#define ROWS {p.rows}\n#define LOADS {p.loads}\n#define STAGES {p.stages}\n#define MINB {p.minb}\n"
        f"#define CLUSTER_ATTR {cluster_attr}\n#define WINDOWED {int(p.window > 0)}\n#define WARPS {p.warps}\n"
        f'#define RING_L2 "{".L2::128B" if p.line else ""}"\n'
    )
    return render_source("w4a16_small_m.cu", defines, PAIR_DECODER_PTX=decoder)


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
    library, and a CUDA device with clusters and ``mul.rn.bf16x2`` (sm_90+)."""
    if not (torch.cuda.is_available() and hasattr(torch.cuda, "_compile_kernel")):
        return False
    if torch.cuda.get_device_capability()[0] < 9:
        return False
    try:
        _ensure_nvrtc()
    except OSError:
        return False
    return True


def compile_kernel(device_index: int, source: str, name: str, arch: str | None = None):
    """NVRTC-compile ``name`` from ``source`` for ``arch`` (e.g. ``"90a"`` for ``wgmma``), by default
    the device's architecture (all NVRTC kernels)."""
    major, minor = torch.cuda.get_device_capability(device_index)
    with torch.cuda.device(device_index):
        return torch.cuda._compile_kernel(source, name, compute_capability=arch or f"{major}{minor}")


def launch(kernel, grid: tuple, threads: int, args: list, smem: int) -> None:
    """Launch an NVRTC kernel on the current stream with ``smem`` bytes of dynamic shared memory,
    opting in above 48 KB (both NVRTC kernels)."""
    opt_in_shared_memory(kernel, smem)
    kernel(grid=grid, block=(threads, 1, 1), args=args, shared_mem=smem)


def opt_in_shared_memory(kernel, smem: int) -> None:
    """Let ``kernel`` take ``smem`` bytes of dynamic shared memory (an opt-in above 48 KB)."""
    if smem >= 48 * 1024:
        kernel.set_shared_memory_config(smem)


def check_weights(name: str, data: torch.Tensor, scale_codes: torch.Tensor) -> None:
    """The NVRTC kernels read the codes ``[N, K / 2]`` in 16-byte and the scale codes ``[N, K / 16]``
    in 8-byte pieces, rows back to back (as :func:`~slime_gb10.nvfp4.w4a16.prepare_w4a16` makes them)."""
    if (
        data.data_ptr() % 16
        or scale_codes.data_ptr() % 8
        or not (data.is_contiguous() and scale_codes.is_contiguous())
    ):
        raise ValueError(
            f"{name}: the codes must be 16-byte and the scale codes 8-byte aligned, both contiguous"
        )


def launch_w4a16(
    kernel,
    grid: tuple,
    threads: int,
    smem: int,
    operands: tuple,
    extra: tuple = (),
    name: str = "CUDA W4A16 kernel",
) -> None:
    """Launch one of the NVRTC W4A16 kernels on ``operands`` = (x2, codes, scale codes, global scale,
    bias or None, out). All three kernels take the same leading arguments: x, codes, scale codes,
    global scale, bias or a stand-in, out, M, N, K, x's row stride, has_bias; then ``extra``. x's
    rows are copied in 16-byte chunks (:func:`aligned_rows`); the codes must be 16-byte and the
    scale codes 8-byte aligned."""
    x2, data, scale_codes, global_scale, bias, out = operands
    M, K = x2.shape
    x2 = aligned_rows(x2)
    check_weights(name, data, scale_codes)
    args = [x2, data, scale_codes, global_scale, bias if bias is not None else out, out, M, data.shape[0], K]
    launch(kernel, grid, threads, [*args, x2.stride(0), int(bias is not None), *extra], smem)


def aligned_rows(x2: torch.Tensor) -> torch.Tensor:
    """``x2`` where its rows start at 16-byte aligned addresses with unit stride, else an aligned copy:
    the kernels read rows in 16-byte chunks (a contiguous view that starts off a 16-byte boundary
    is copied too, which ``contiguous()`` would not do)."""
    if x2.stride(-1) == 1 and x2.stride(0) % 8 == 0 and x2.data_ptr() % 16 == 0:
        return x2
    return x2.clone(memory_format=torch.contiguous_format)


def cuda_index(t: torch.Tensor) -> int:
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


@functools.cache
def _kernel(device_index: int, p: Plan):
    return compile_kernel(device_index, _source(p), "w4a16_small")


def stored_tokens(p: Plan, M: int) -> int:
    """Tokens per 8-token tile kept in shared memory: M rounded up to a power of two (8 for more than
    one tile); the lanes of the other tokens feed zeros to the MMA without reading shared memory."""
    return 8 if p.nt > 1 else 1 << max(M - 1, 0).bit_length()


def warp_segments(p: Plan, K: int) -> int:
    """The most K segments a warp has (``ceil(segments / (cluster * K-warps))``)."""
    return -(-(K // (128 * p.loads)) // (p.cluster * (p.warps // p.rw)))


def window(p: Plan, K: int) -> int:
    """Segments per K-warp staged at a time: ``p.window`` (0: all)."""
    most = warp_segments(p, K)
    return min(p.window, most) if p.window else most


def _ring_offset(p: Plan, M: int, K: int) -> int:
    """Bytes before the cp.async rings: the activations (``256 B * loads`` per segment and stored
    token: the block's at most ``ceil(S / cluster)`` segments, or a window of each K-warp's) or the
    split-K partials, whichever is larger."""
    if p.window:
        segments = (p.warps // p.rw) * window(p, K)
    else:
        segments = -(-(K // (128 * p.loads)) // p.cluster)
    return max(segments * p.loads * 256 * stored_tokens(p, M) * p.nt, p.warps * p.rows * (8 * p.nt + 1) * 4)


def shared_bytes(p: Plan, M: int, K: int) -> int:
    """Dynamic shared memory of a block: activations / partials, then each warp's cp.async ring."""
    return _ring_offset(p, M, K) + p.warps * p.stages * (p.rows // 8) * p.loads * 32 * 20


def valid(p: Plan, M: int, N: int, K: int) -> bool:
    """Whether ``p`` tiles this problem: M fits its token tiles (at most 8), whole blocks of rows,
    4, 8 or 16 warps per block that ``rw`` divides (at most 64 per SM for ``minb`` blocks), every
    warp at least one K segment, the register ring's activations staged once, shared memory within
    :func:`max_shared_bytes`."""
    return (
        0 < M <= 8 * p.nt <= MAX_M
        and N % (p.rows * p.rw) == 0
        and K % (128 * p.loads) == 0
        and p.warps in (4, 8, 16)
        and p.warps % p.rw == 0
        and p.warps * p.minb <= 64
        and K // (128 * p.loads) >= p.cluster * (p.warps // p.rw)
        and (p.stages > 0 or p.window == 0)
        and shared_bytes(p, M, K) <= max_shared_bytes()
    )


MAX_M = 32  # above, the activations staged per block outweigh the codes it streams (docs/nvfp4-notes.md)


def plan(M: int, N: int, K: int, sm_count: int) -> Plan | None:
    """The tiling for ``[M, K] x [N, K]^T``, or None where the kernel does not apply (M > 32,
    N % 32, K % 128, or nothing fits in shared memory): for M <= 8 the wide-block tiling
    (:func:`wide_block_plan`), for M = 9..16 the two-tile one (:func:`two_tile_plan`), where it is
    valid and fits in 64 KB of shared memory; else the four-warp one (:func:`four_warp_plan`). All
    are rules fitted to sweeps of every tiling on the H100 (docs/nvfp4-notes.md); GB10's 48 SMs are not
    measured."""
    if not 0 < M <= MAX_M or N % 32 or K % 128:
        return None
    wide = wide_block_plan(M, N, K, sm_count) if M <= 8 else two_tile_plan(M, N, K, sm_count)
    if wide is not None and valid(wide, M, N, K) and shared_bytes(wide, M, K) <= 64 * 1024:
        return wide
    return four_warp_plan(M, N, K, sm_count)


def four_warp_plan(M: int, N: int, K: int, sm_count: int) -> Plan | None:
    """The tiling of 4-warp blocks (sessions 3-6), or None where nothing fits.

    * K is split into ``parts`` = cluster x K-warps per block, the power of two nearest to
      ``8 * SMs`` warps in all; at equal parts, smaller clusters (more K-warps per block) first,
      except that for M = 5..8 (8 tokens staged) tilings over 64 KB of shared memory come last: their
      blocks stage up to 57 KB of activations each: 1.37x of BF16 against 1.8x with cluster 8 and
      4 row warps on 4096 x 14336 (M = 6 and 8, session 6 sweep);
    * M <= 16: the codes stream through a 3-stage cp.async ring in shared memory, unless M > 8 and
      the ring would take the block over 64 KB (the activations of 16 tokens are large: one block
      per SM), or nothing else fits; then through registers, two 256-wide segments deep;
    * M = 17..32: the cp.async ring, and the activations staged in the largest window that fits
      (every window costs the block a barrier and a wait on its loads);
    * ``line``: the ring's copies fetch whole 128-byte lines into the L2 where a warp streams at
      least 8 segments and the activations are staged once: the rest of the line is then the warp's
      own next segment. H100, session 11 (docs/nvfp4-notes.md v17), against the same tilings without it:
      0.87x of the time on 27648 x 5120 at M = 1..4 (40 segments a warp), 0.95x on 4096 x 11008 at
      M = 8 (11), 1.01x on 4096 x 14336 at M = 8 (14); with 3-5 segments a warp it cost 2-7%
      (8960 x 1536, 5120 x 5120, 1536 x 8960 at M = 1..8), with windows 0.98-1.03x.
    """
    if not 0 < M <= MAX_M or N % 32 or K % 128:
        return None
    nt = -(-M // 8)
    target = math.log2(max(8 * sm_count * 32 / N, 1.0))
    best = None
    for cluster in (1, 2, 4, 8):
        for rw in (1, 2, 4):
            if nt > 2:
                p = _widest_window(Plan(nt, cluster, rw, 1, stages=3), M, N, K)
            else:
                p = Plan(nt, cluster, rw, 1, stages=3, minb=4)
                if not valid(p, M, N, K) or (nt == 2 and shared_bytes(p, M, K) > 64 * 1024):
                    p = Plan(nt, cluster, rw, 2, loads=2 if K % 256 == 0 else 1)
            if p is None or not valid(p, M, N, K):
                continue
            crowded = nt == 1 and stored_tokens(p, M) == 8 and shared_bytes(p, M, K) > 64 * 1024
            key = (abs(math.log2(cluster * 4 // rw) - target), crowded, cluster)
            if best is None or key < best[0]:
                best = (key, p)
    if best is None:
        return None
    p = best[1]
    return p._replace(line=p.stages > 0 and not p.window and warp_segments(p, K) >= 8)


def wide_block_plan(M: int, N: int, K: int, sm_count: int) -> Plan | None:
    """The M <= 8 tiling of 8-16 warps per block on 16-64 rows (session 9 sweep, docs/nvfp4-notes.md), or None.

    * Rows per block: 16 per stored token (M rounded up to a power of two), at most 64, halved while
      that leaves fewer than ``SMs / 2`` blocks. Every block stages the activations of its K range,
      so more rows per block amortize them as M grows (at M = 4 on 14336 x 4096, 16-row blocks
      staged 29 MB of activations against 33 MB of codes). A warp owns 16 rows, or 32 in 64-row
      blocks (``rw`` row sets per block).
    * K parts (cluster x K-warps): the power of two nearest to a third of the 128-wide segments,
      8 to 16, so each warp streams about 3 segments; the K-warps of all row sets fill at most 16
      warps per block, a cluster takes the rest.
    * The codes go through a register ring, one segment deep; two where a warp has at most 3
      segments (all of them in flight at once) and the grid fits one wave at the 128 registers a
      thread that needs. Where it does not, None: one segment at a time, each a memory round trip,
      lost to the four-warp tiling's cp.async ring by 10-30% (5120 x 5120 at M = 1..8, 8960 x 1536
      at M = 2..8; two deep over 2.4 waves was 1.3x slower).
    * ``minb`` (blocks per SM the registers are capped for): the grid's blocks per SM, kept between
      128 registers a thread (``16 // warps`` blocks: small grids) and 64 (``32 // warps``: 2048
      threads an SM); a ring two deep keeps 128 (it spills at 64).
    """
    if not 0 < M <= 8 or N % 16 or K % 128:
        return None
    stored = 1 << max(M - 1, 0).bit_length()
    block_rows = min(16 * stored, 64)
    while block_rows > 16 and N // block_rows < sm_count / 2:
        block_rows //= 2
    rows = 16 if block_rows <= 32 else 32
    rw = block_rows // rows
    segments = K // 128
    parts = max(8, min(16, 1 << round(math.log2(max(segments / 3, 1)))))
    warps = min(16, parts * rw)
    cluster = parts // (warps // rw)
    blocks = N // block_rows * cluster
    one_wave = blocks <= sm_count * max(1, 16 // warps)  # at 128 registers a thread
    if -(-segments // parts) > 3:
        depth = 1
    elif one_wave:
        depth = 2
    else:  # a few segments a warp, one at a time: a memory round trip each (the four-warp tiling)
        return None
    most = (16 if depth == 2 else 32) // warps  # 128 or 64 registers a thread
    minb = max(1, min(max(-(-blocks // sm_count), 16 // warps), most))
    return Plan(1, cluster, rw, depth, rows=rows, minb=minb, warps=warps)


TWO_TILE_MAX_K = 16384  # two_tile_plan's largest K: 8 blocks of a cluster, each staging 64 KB


def two_tile_plan(M: int, N: int, K: int, sm_count: int) -> Plan | None:
    """The M = 9..16 tiling (two 8-token tiles) of 8 warps on 32-256 rows per block (session 10
    sweep of 544 tilings on 16 layers, docs/nvfp4-notes.md), or None.

    Every block stages the 16 tokens of its K range in shared memory and streams the codes of its
    rows against them: a block of R rows stages ``32 K`` bytes per ``R K / 2`` bytes of codes, twice
    the codes at 32 rows and half at 128. The four-warp tiling (32 rows) moved more activations
    than weights at M = 16; blocks of many row sets share one staging.

    * Cluster: the fewest blocks (1, 2, 4 or 8) that split K so a block stages at most 64 KB
      (``K / cluster <= 2048``); more blocks than that only add DSMEM reduction work (2048 x 2048:
      1.09x, 4096 x 4096: 1.23x slower with the cluster doubled). None where K > 16384.
    * Rows per block: the most of 256, 128 and 64 that still give a grid of at least 0.7 x SMs
      blocks (1.5 x SMs for 256), each warp at least one 128-wide segment; else 32. Warps own 16
      rows (32 in 256-row blocks): ``rw`` row sets of ``8 // rw`` K-warps, 8 warps a block.
    * The codes stream through registers: two 128-wide segments deep where a warp has at most 8 of
      them, else one 256-wide segment (``loads=2``; two deep if K % 256); registers capped for two
      blocks an SM (128 a thread).
    """
    if not 8 < M <= 16 or N % 32 or K % 128 or K > TWO_TILE_MAX_K:
        return None
    segments = K // 128
    cluster = 1
    while K // cluster > 2048:
        cluster *= 2
    block_rows = 32
    for rows in (256, 128, 64):
        row_sets = rows // (32 if rows > 128 else 16)
        enough = (1.5 if rows == 256 else 0.7) * sm_count
        if N % rows == 0 and segments >= cluster * max(1, 8 // row_sets) and N // rows * cluster >= enough:
            block_rows = rows
            break
    rows = 32 if block_rows > 128 else 16
    rw = block_rows // rows
    warp_segments = -(-segments // (cluster * (8 // rw)))
    depth, loads = (2, 1) if warp_segments <= 8 or K % 256 else (1, 2)
    return Plan(2, cluster, rw, depth, rows=rows, loads=loads, minb=2, warps=8)


def _widest_window(p: Plan, M: int, N: int, K: int) -> Plan | None:
    """``p`` with the largest activation window that fits (all segments if they do), else None."""
    if valid(p._replace(window=0), M, N, K):
        return p._replace(window=0)
    for w in range(warp_segments(p, K) - 1, 0, -1):
        if valid(p._replace(window=w), M, N, K):
            return p._replace(window=w)
    return None


def w4a16_small(x2, data, scale_codes, global_scale, bias, out, p: Plan) -> None:
    """Launch (all tensors on one CUDA device; x2 BF16 [M, K] with unit stride)."""
    M, K = x2.shape
    N = data.shape[0]
    if not valid(p, M, N, K):
        raise ValueError(
            f"CUDA W4A16 kernel: the tiling {p} does not fit M={M}, N={N}, K={K} (needs M <= {8 * p.nt} <= {MAX_M}, "
            f"N % {p.rows * p.rw} == 0, K % {128 * p.loads} == 0, 4, 8 or 16 warps that rw divides, at least "
            f"one K segment per warp and "
            f"{shared_bytes(p, M, K)} <= {max_shared_bytes()} bytes of shared memory; see plan)"
        )
    grid, operands = (N // (p.rows * p.rw), p.cluster, 1), (x2, data, scale_codes, global_scale, bias, out)
    extra = (_ring_offset(p, M, K), stored_tokens(p, M), window(p, K))
    launch_w4a16(_kernel(cuda_index(x2), p), grid, 32 * p.warps, shared_bytes(p, M, K), operands, extra)
