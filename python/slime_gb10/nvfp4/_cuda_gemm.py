"""W4A16 GEMM for tens to hundreds of tokens in CUDA C, compiled at run time with NVRTC.

:mod:`~slime_gb10.nvfp4._cuda_w4a16` streams the weights for M <= 32: it decodes every weight once
per 8-32 tokens and stages the activations next to the codes, which stops paying above 32 tokens
(docs/nvfp4-notes.md). This kernel is GEMM-shaped, in the manner of Marlin (Frantar et al., 2024), with
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
  of the block that sums them, on clusters of 8 the summing block pulls them (``PUSH``; docs/nvfp4-notes.md
  v17); each block writes its share of the rows as BF16 (+ bias).

Tokens beyond M are zero-filled by cp.async (never read from ``x``). Requires whole blocks of rows
(N % 64 for the tilings :func:`plan` picks), K % 128 == 0 and at least one 128-wide step per block of
a cluster (:func:`valid`). Measured on the H100 against the other kernels: docs/nvfp4-notes.md, BENCHMARKS.md.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from slime_gb10.nvfp4._cuda_w4a16 import (
    compile_kernel,
    cuda_index,
    launch_w4a16,
    max_shared_bytes,
    render_source,
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


def _source(p: GemmPlan) -> str:
    cluster_attr = f"__cluster_dims__(1, {p.cluster}, 1)" if p.cluster > 1 else ""
    defines = (
        f"#define WR {p.wr}\n#define WT {p.wt}\n#define MT {p.mt}\n#define NT {p.nt}\n#define STAGES {p.stages}\n"
        f"#define CLUSTER {p.cluster}\n#define MINB {p.minb}\n#define CLUSTER_ATTR {cluster_attr}\n"
    )
    return render_source("w4a16_gemm.cu", defines)


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
    """Launch the tiled GEMM (all tensors on one CUDA device; x2 BF16 [M, K] with unit stride)."""
    M, N, K = x2.shape[0], data.shape[0], x2.shape[1]
    if not valid(p, M, N, K):
        raise ValueError(
            f"CUDA W4A16 GEMM: the tiling {p} does not fit M={M}, N={N}, K={K} (needs N % {p.rows} == 0, "
            f"K % 128 == 0 with at least {p.cluster} steps of 128, and {shared_bytes(p)} <= {max_shared_bytes()} "
            "bytes of shared memory; see plan)"
        )
    grid, operands = (
        (N // p.rows, p.cluster, -(-M // p.tokens)),
        (x2, data, scale_codes, global_scale, bias, out),
    )
    launch_w4a16(
        _kernel(cuda_index(x2), p), grid, p.threads, shared_bytes(p), operands, name="CUDA W4A16 GEMM"
    )


def plan(M: int, N: int, K: int, sm_count: int) -> GemmPlan | None:
    """The tiling for ``[M, K] x [N, K]^T``, or None where the kernel does not tile it (N % 64,
    K % 128).

    Fitted to sweeps of 92 tilings on the H100 (docs/nvfp4-notes.md; GB10's 48 SMs are not measured): blocks of
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
