"""The fused NVFP4 W4A16 GEMM and the choice among its kernels (:func:`w4a16_linear`).

W4A16 GEMM ``y = x @ dequantize(W)^T``: the ModelOpt bytes stream as they are, with one scale code
byte per 16 weights (:func:`prepare_w4a16`, once per weight); an inline-PTX decoder turns two codes
into a BF16x2 register in five instructions, exactly (``e2m1 * s * 2**-7``), and feeds BF16 tensor-core
MMAs (Hopper has no FP4 MMA); the global scale multiplies the FP32 result. Two kernels share the
decoder: a CUDA one compiled at run time with NVRTC (:mod:`~slime_gb10.nvfp4._cuda_w4a16`, M <= 32,
taken up to M = 8, and at M = 9..16 where N >= K or N >= 4096: weights as the MMA's A operand, a
register or cp.async ring, split-K reduced in a thread-block cluster) and a Triton one (``tl.dot``,
any M; split-K fills the GPU when M is small). Three more decode in natural k order (a byte's two
codes are one BF16x2 register): the CUDA GEMM kernel (:mod:`~slime_gb10.nvfp4._cuda_gemm`,
``mma.sync``, taken at M = 17..64 (17..32 on large K > N layers; on sm_90 up to 32) and at
M = 9..16 on K > N layers with N < 4096: activations by ``ldmatrix`` through a cp.async pipeline,
split-K in a cluster), the wgmma kernel (:mod:`~slime_gb10.nvfp4.hopper.wgmma`, sm_90 only, taken at
M = 33..2048: decoded weights as the register A operand of Hopper's asynchronous warpgroup MMA,
activations in its 128-byte swizzle, copied by the TMA unit from a producer warp, the decode of the
next step overlapping the MMA in flight)
and the "wide" Triton kernel, which keeps the weights in registers as the MMA's A operand (``wgmma``
on sm_90; taken where the CUDA kernels do not run); above the wgmma kernel's range :func:`w4a16_linear`
dequantizes and calls cuBLAS instead. Their speeds: BENCHMARKS.md (how they got there: docs/nvfp4-notes.md).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from slime_gb10.nvfp4 import _cuda_gemm, _cuda_w4a16
from slime_gb10.nvfp4.format import NVFP4Tensor
from slime_gb10.nvfp4.kernels import (
    _check_device,
    _kernels,
    dequantize_triton,
    interpreting,
    triton_available,
)

try:  # the Hopper-only kernel is an optional module: the rest runs without it (a GB10 never takes it)
    from slime_gb10.nvfp4.hopper import wgmma as _cuda_wgmma
except ImportError:  # pragma: no cover - tested in a child with the module hidden
    _cuda_wgmma = None


def wgmma_is_faster(M: int, N: int, K: int) -> bool:
    """Whether the Hopper wgmma kernel beats the others at this shape (False where it is absent)."""
    return _cuda_wgmma is not None and _cuda_wgmma.wgmma_is_faster(M, N, K)


#: Largest M for which :func:`w4a16_linear` uses a fused kernel on every weight; above it, dequantize
#: + cuBLAS, except where :func:`fused_is_faster` says otherwise (the CUDA kernel up to M = 32, the
#: wide kernel up to 128 on large weights). Measured by ``slime-gb10 bench nvfp4`` (see
#: BENCHMARKS.md); overridable per call.
FUSED_MAX_M = 16


@functools.cache
def _capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


@functools.cache
def _sm_count_of(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def asm_supported(device: torch.device) -> bool:
    """The inline-PTX decoder needs ``mul.rn.bf16x2`` (sm_90+) and a real GPU (not the interpreter)."""
    if interpreting() or device.type != "cuda":
        return False
    return _capability(device.index if device.index is not None else torch.cuda.current_device())[0] >= 9


@functools.cache
def _cuda_engine_available(device_index: int) -> bool:
    if not _cuda_w4a16.available():
        return False
    try:
        _cuda_w4a16._kernel(device_index, _cuda_w4a16.Plan(1, 1, 1, 1, stages=3, minb=4))  # NVRTC compiles
        _cuda_gemm._kernel(device_index, _cuda_gemm.GemmPlan(4, 1, 1, 4, stages=4))
    except Exception as exc:  # no NVRTC library, an unsupported arch: the Triton kernel instead
        import warnings

        warnings.warn(f"the CUDA W4A16 kernel is unavailable ({exc}); using the Triton kernel", stacklevel=3)
        return False
    return True


def _cuda_engine_ok(device: torch.device) -> bool:
    if interpreting() or device.type != "cuda" or os.environ.get("SLIME_GB10_W4A16_ENGINE") == "triton":
        return False
    return _cuda_engine_available(device.index if device.index is not None else torch.cuda.current_device())


def _wgmma_engine_ok(device: torch.device) -> bool:
    """The wgmma kernel runs here: an sm_90 device where the CUDA kernels run."""
    return (
        _cuda_wgmma is not None
        and _cuda_engine_ok(device)
        and _cuda_wgmma.engine_available(
            device.index if device.index is not None else torch.cuda.current_device()
        )
    )


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 8
    return _sm_count_of(device.index if device.index is not None else torch.cuda.current_device())


#: Scale code of a zero block scale: BF16 bits 0x8000 (-0.0) under ``scale_code_to_bf16``, so a
#: zero-scale block decodes to zeros whatever its codes (codes 0..143 are the E4M3 values).
ZERO_SCALE_CODE = 152


def w4a16_scale_codes(scale: torch.Tensor, *, check: bool = True) -> torch.Tensor:
    """E4M3 block scales -> the fused kernel's scale bytes (same size, exact, lossless).

    ``s * 2**119`` is a BF16 number for every E4M3 value s > 0 (exponent field 237..254, 3 mantissa
    bits); the code is ``(bits - (237 << 7)) >> 4``, which the kernel turns back into BF16 with one
    shift-and-add (the E4M3 subnormals would need a branch there; here they are just numbers).
    ``check=False`` skips the check of the scales (a host sync) for a caller that checks them itself.
    """
    s = scale.view(torch.float8_e4m3fn).to(torch.float32)
    if check and not bool(((s >= 0) & torch.isfinite(s)).all()):
        raise ValueError(
            "NVFP4 block scales must be finite and >= 0 (E4M3 bytes 0x00-0x7E); this weight has "
            "negative or NaN scales: re-quantize it"
        )
    bits = (s * 2.0**119).to(torch.bfloat16).view(torch.int16).to(torch.int32)
    codes = (bits - (237 << 7)) >> 4
    return torch.where(s > 0, codes, ZERO_SCALE_CODE).to(torch.uint8)


@dataclass(frozen=True)
class W4A16Weight:
    """An NVFP4 weight prepared for the fused kernel (:func:`prepare_w4a16`): the packed codes as
    they are (ModelOpt layout, not copied), one scale code byte per 16 weights, the global scale."""

    data: torch.Tensor
    scale_codes: torch.Tensor
    global_scale: torch.Tensor
    shape: torch.Size

    @property
    def nbytes(self) -> int:
        return self.data.numel() + self.scale_codes.numel() + 4


def prepare_w4a16(w: NVFP4Tensor) -> W4A16Weight:
    """Prepare ``w`` (``[N, K]``) for :func:`w4a16_matmul`: one pass over its scales (1/32 of its
    bytes) and a host sync; keep the result (``NVFP4Linear`` does) rather than preparing per call."""
    if len(w.shape) != 2:
        raise ValueError(f"the fused W4A16 kernel takes a 2-D weight [N, K], got shape {tuple(w.shape)}")
    return W4A16Weight(
        w.data.contiguous(),
        w4a16_scale_codes(w.scale.contiguous()),
        w.global_scale.to(torch.float32).reshape(1).contiguous(),
        w.shape,
    )


def w4a16_config(M: int, N: int, K: int, sm_count: int) -> dict:
    """Tile sizes and split-K for the fused kernel, from the H100 tuning runs (docs/nvfp4-notes.md).

    Small M is a weight stream: BM=16 (one MMA row block), BK=128, split-K for about 4 programs per
    SM, no cp.async staging (``num_stages=1``: the staged codes were read back from shared memory
    with heavy bank conflicts) and a register cap that lets 4 programs share an SM. GB10 has 48 SMs,
    which the split accounts for; its best tiles are not measured (no GB10 here).
    """
    BK = 128 if K % 128 == 0 else 64 if K % 64 == 0 else 32
    k_tiles = -(-K // BK)
    if M <= 16:
        BN = 128 if N >= 8192 else 64
        tiles = -(-N // BN)
        split = max(1, min(k_tiles, (4 * sm_count) // max(tiles, 1), 32))
        cfg = {"BM": 16, "BN": BN, "BK": BK, "split": split, "num_warps": 4, "num_stages": 1}
        if BN == 128:
            cfg["maxnreg"] = 128
        return cfg
    BM = 32 if M <= 64 else 64  # at M=64 two 32-row tiles beat one 64-row tile (register pressure)
    tiles = -(-M // BM) * -(-N // 128)
    split = max(1, min(k_tiles, (2 * sm_count) // max(tiles, 1), 32))
    return {"BM": BM, "BN": 128, "BK": BK, "split": split, "num_warps": 4, "num_stages": 3}


WIDE_MAX_M = 128  # the wide kernel's last M ahead of dequantize + cuBLAS on the bench shapes (H100)
WIDE_MIN_PARAMS = (
    _cuda_w4a16.LARGE_WEIGHT_PARAMS
)  # smaller weights give it too few programs (896 x 4864: 0.4x of BF16)


def wide_config(
    M: int,
    N: int,
    K: int,
    sm_count: int,
    *,
    BN: int = 64,
    BM: int | None = None,
    BK: int | None = None,
    num_stages: int = 3,
) -> dict | None:
    """Tiles and split-K of :func:`~slime_gb10.nvfp4._triton_kernels.w4a16_wide_kernel`, or None
    where it does not tile the shape (N % BN, K % BK).

    Defaults from the H100 sweeps (docs/nvfp4-notes.md): 64 weight rows per program (one warpgroup's MMA rows:
    programs are one warpgroup, 4 warps; two warpgroups gave wrong results now and then, see
    docs/nvfp4-notes.md); 32 tokens up to M = 32, 64 up to M = 64, else 128; K tiles of 256 up to M = 64 where
    K allows, else 128; K split in 2, 4 or 8 while the programs stay within two per SM (more
    programs cost more in split-K partials than idle SMs do). The keywords override the tiles.
    """
    BM = BM or (32 if M <= 32 else 64 if M <= 64 else 128)
    BK = BK or (256 if M <= 64 and K % 256 == 0 else 128)
    if N % BN or K % BK:
        return None
    tiles = (N // BN) * -(-M // BM)
    split = 1
    for s in (2, 4, 8):
        if tiles * s <= 2 * sm_count and K % (BK * s) == 0 and K // s >= 2 * BK:
            split = s
    return {"engine": "wide", "BN": BN, "BM": BM, "BK": BK, "split": split, "num_stages": num_stages}


def wide_is_faster(M: int, N: int, K: int) -> bool:
    """Whether the wide kernel is the fused kernel to take (H100 sweeps): above M = 32 wherever it
    tiles the shape; from M = 17 on weights of >= 2**24 parameters (there it beats the CUDA kernel
    on 4096 x 4096 and 4096 x 14336 by 12-35% and trails it by 4-8% on 14336 x 4096)."""
    if M <= FUSED_MAX_M or wide_config(M, N, K, 1) is None:
        return False
    return M > _cuda_w4a16.MAX_M or N * K >= WIDE_MIN_PARAMS


GEMM_MIN_M = 8  # the CUDA GEMM kernel from M = 9 (below, the weight-streaming CUDA kernel leads)
GEMM_MAX_M = 64  # its last M ahead of the other kernels (H100; docs/nvfp4-notes.md)


def gemm_is_faster(M: int, N: int, K: int) -> bool:
    """Whether the CUDA GEMM kernel (:mod:`~slime_gb10.nvfp4._cuda_gemm`) is the fused kernel to
    take, where the CUDA kernels run, on shapes it tiles (N % 64, K % 128), H100 sweeps (docs/nvfp4-notes.md):

    * M = 9..16 only on layers with N < K and N < 4096 (896 x 4864, 1024 x 4096: 11-17% ahead of
      the weight-streaming kernel's two-tile plan) and where K > 16384 (no two-tile plan). Elsewhere
      the two-tile plan: faster than this kernel on 7 layers with N >= K (about 1.2x on 2048 x 2048,
      4096 x 1024, 5120 x 5120 and 27648 x 5120; 1.04-1.1x on 14336 x 4096, 11008 x 4096 and
      8960 x 1536), level on 4096 x 4096 and 3072 x 3072, 2-7% slower on 8192 x 8192. On the K > N
      layers with N = 4096 it is 8% faster on 4096 x 14336 but 5-10% slower on 4096 x 11008 (no
      rule found that separates them; it is level with the four-warp plan both had before, on
      4096 x 14336, and 1.3-1.4x faster on 4096 x 11008);
    * M = 17..32 everywhere;
    * M = 33..64 except on layers with K > N of >= 2**24 weights (4096 x 14336 at M = 40-64: the
      wide kernel's split-K, 1.01-1.02x of BF16 against 0.82-0.85x).
    """
    if not GEMM_MIN_M < M <= GEMM_MAX_M or N % 64 or K % 128:
        return False
    if M <= 16:
        return (N < K and N < 4096) or K > _cuda_w4a16.TWO_TILE_MAX_K
    return M <= 32 or N >= K or N * K < WIDE_MIN_PARAMS


def fused_is_faster(M: int, N: int, K: int, cuda_kernel: bool = False, wgmma: bool = False) -> bool:
    """Whether :func:`w4a16_linear` takes a fused kernel: measured crossovers on the H100 (any
    weight up to M=16; where the CUDA kernels run (``cuda_kernel``), up to M=32 on shapes one of them
    tiles and up to M=64 where the GEMM kernel tiles the shape; the wide kernel on weights of >= 16 M
    parameters it tiles up to M=128; the Triton kernel on other weights of >= 32 M parameters up to
    M=64; where the wgmma kernel runs (``wgmma``: sm_90), where :func:`wgmma_is_faster`; dequantize
    + cuBLAS above)."""
    if M <= FUSED_MAX_M:
        return True
    if wgmma and wgmma_is_faster(M, N, K):
        return True
    if cuda_kernel and M <= _cuda_w4a16.MAX_M and N % 32 == 0 and K % 128 == 0:
        return True
    if cuda_kernel and gemm_is_faster(M, N, K):
        return True
    if N * K >= WIDE_MIN_PARAMS and wide_config(M, N, K, 1) is not None:
        return M <= WIDE_MAX_M
    return M <= 64 and N * K >= 1 << 25  # shapes the wide kernel does not tile: the Triton kernel


_COUNTERS: dict[tuple, torch.Tensor] = {}


def _split_counters(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 tile counters for the split-K reduction, one buffer per device and stream (the
    kernel resets each counter it uses, so the buffer stays zero between calls)."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf


def _split_k_buffers(out: torch.Tensor, split: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernels' split-K buffers: FP32 partials ``[split, M, N]`` and ``tiles`` counters
    (:func:`_split_counters`); without split-K the kernels never touch them (``out`` stands in)."""
    if split == 1:
        return out, out
    partial = torch.empty((split, *out.shape), dtype=torch.float32, device=out.device)
    return partial, _split_counters(out.device, tiles)


def w4a16_matmul(
    x: torch.Tensor,
    w: NVFP4Tensor | W4A16Weight,
    bias: torch.Tensor | None = None,
    *,
    config: dict | None = None,
    use_asm: bool | None = None,
    out: torch.Tensor | None = None,
    engine: str | None = None,
) -> torch.Tensor:
    """``x @ dequantize(w)^T (+ bias)`` with a fused kernel. x: BF16 ``[..., K]``; w: ``[N, K]``.

    ``w`` is best a :class:`W4A16Weight` (:func:`prepare_w4a16`, once); an :class:`NVFP4Tensor` is
    prepared on every call (a pass over its scales and a host sync). ``config`` overrides
    :func:`w4a16_config` (keys BM, BN, BK, split, num_warps, num_stages, optional maxnreg);
    ``use_asm`` forces the decoder (default: the inline-PTX one on sm_90+); ``out`` is an optional
    contiguous BF16 ``[M, N]`` output buffer. ``engine``: ``"cuda"`` (the NVRTC kernel of
    :mod:`~slime_gb10.nvfp4._cuda_w4a16`: M <= 32, N % 32 == 0, K % 128 == 0, sm_90+), ``"gemm"``
    (the NVRTC GEMM kernel of :mod:`~slime_gb10.nvfp4._cuda_gemm`: any M, N % 64 == 0,
    K % 128 == 0, sm_90+), ``"wgmma"`` (the NVRTC kernel of :mod:`~slime_gb10.nvfp4.hopper.wgmma` on
    Hopper's warpgroup MMA: any M, N % 64 == 0, K % 128 == 0, sm_90 only), ``"triton"``, ``"wide"``
    (the Triton kernel with the weights as the MMA's first operand, for M above 16: N % 64 == 0,
    K % 128 == 0; ``config`` then overrides :func:`wide_config`), or None: the wgmma kernel where
    :func:`wgmma_is_faster` on sm_90, else the GEMM kernel where :func:`gemm_is_faster`, else the wide
    kernel where :func:`wide_is_faster`, else CUDA where it applies, else Triton, unless ``config``
    or ``use_asm`` is given (then Triton, or what ``config["engine"]`` names).
    ``SLIME_GB10_W4A16_ENGINE=triton`` turns the CUDA kernels off. One kernel launch
    (split-K reduces in-kernel: in shared memory for the CUDA kernel; with per-device-and-stream tile
    counters that the kernel resets for the Triton one: do not run two Triton calls on one stream
    concurrently from different threads).
    """
    _check_device(x)
    if isinstance(w, NVFP4Tensor):
        w = prepare_w4a16(w)
    N, K = w.shape
    if x.shape[-1] != K:
        raise ValueError(f"x has {x.shape[-1]} features, the weight expects {K}")
    if x.dtype != torch.bfloat16:
        raise ValueError(f"the fused W4A16 kernel takes BF16 activations, got {x.dtype}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    elif out.shape != (M, N) or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {x.dtype} tensor of shape {(M, N)}")
    if M == 0:
        return out.reshape(*lead, N)
    has_bias = bias is not None
    if engine is None and config is not None:
        engine = config.get("engine", "triton")
    if engine is None:
        cuda_fits = use_asm is None and _cuda_w4a16.plan(M, N, K, _sm_count(x.device)) is not None
        gemm_fits = gemm_is_faster(M, N, K) and _cuda_gemm.plan(M, N, K, _sm_count(x.device)) is not None
        if use_asm is None and wgmma_is_faster(M, N, K) and _wgmma_engine_ok(x.device):
            engine = "wgmma"
        elif use_asm is None and gemm_fits and _cuda_engine_ok(x.device):
            engine = "gemm"
        elif use_asm is None and wide_is_faster(M, N, K):
            engine = "wide"
        else:
            engine = "cuda" if cuda_fits and _cuda_engine_ok(x.device) else "triton"
    if engine == "wgmma":
        if _cuda_wgmma is None or not _cuda_wgmma.supported(x.device):
            raise ValueError(
                "the wgmma W4A16 kernel runs on sm_90 (Hopper) only: use engine='gemm' or 'triton'"
            )
        tiling = _cuda_wgmma.plan(
            M, N, K, _sm_count(x.device), _cuda_wgmma.max_shared_bytes(_cuda_wgmma.cuda_index(x))
        )
        kernel, name = _cuda_wgmma.w4a16_wgmma, "wgmma W4A16 kernel"
    if engine in ("wgmma", "gemm"):
        if engine == "gemm":
            tiling, kernel, name = (
                _cuda_gemm.plan(M, N, K, _sm_count(x.device)),
                _cuda_gemm.w4a16_gemm,
                "CUDA W4A16 GEMM kernel",
            )
        if tiling is None:
            raise ValueError(
                f"the {name} takes N % 64 == 0 and K % 128 == 0; got N={N}, K={K}: use engine='triton'"
            )
        kernel(
            x2, w.data, w.scale_codes, w.global_scale, bias.contiguous() if has_bias else None, out, tiling
        )
        return out.reshape(*lead, N)
    if engine == "wide":
        return _wide_matmul(x2, w, bias, out, config or wide_config(M, N, K, _sm_count(x.device))).reshape(
            *lead, N
        )
    if engine == "cuda":
        tiling = _cuda_w4a16.plan(M, N, K, _sm_count(x.device))
        if tiling is None:
            raise ValueError(
                f"the CUDA W4A16 kernel takes M <= {_cuda_w4a16.MAX_M}, N % 32 == 0 and K % 128 == 0; got M={M}, N={N}, "
                f"K={K}: use engine='triton'"
            )
        _cuda_w4a16.w4a16_small(
            x2,
            w.data,
            w.scale_codes,
            w.global_scale,
            bias.contiguous() if has_bias else None,
            out,
            tiling,
        )
        return out.reshape(*lead, N)
    cfg = config or w4a16_config(M, N, K, _sm_count(x.device))
    asm = asm_supported(x.device) if use_asm is None else use_asm
    k_tiles = -(-K // cfg["BK"])
    split = max(1, min(int(cfg["split"]), k_tiles))
    tiles_per_split = -(-k_tiles // split)
    split = -(-k_tiles // tiles_per_split)
    grid = (-(-M // cfg["BM"]) * -(-N // cfg["BN"]), split)
    bias_arg = bias.contiguous() if has_bias else out
    partial, counters = _split_k_buffers(out, split, grid[0])
    even = N % cfg["BN"] == 0 and K % (cfg["BK"] * tiles_per_split) == 0
    # the register cap was measured on the unmasked inline-PTX path; the others would spill under it
    extra = {"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") and even and asm else {}
    _kernels()["w4a16"][grid](
        x2,
        w.data,
        w.scale_codes,
        w.global_scale,
        out,
        bias_arg,
        partial,
        counters,
        M,
        N,
        K,
        M * N,
        x2.stride(0),
        tiles_per_split,
        BM=cfg["BM"],
        BN=cfg["BN"],
        BK=cfg["BK"],
        SPLIT=split,
        USE_ASM=asm,
        HAS_BIAS=has_bias,
        INTERPRET=interpreting(),
        EVEN=even,
        num_warps=cfg.get("num_warps", 4),
        num_stages=cfg.get("num_stages", 3),
        **extra,
    )
    return out.reshape(*lead, N)


def _wide_matmul(
    x2: torch.Tensor, w: W4A16Weight, bias: torch.Tensor | None, out: torch.Tensor, cfg: dict | None
) -> torch.Tensor:
    """Launch the wide kernel (see :func:`w4a16_matmul`); ``cfg`` as :func:`wide_config` gives it."""
    M, K = x2.shape
    N = w.shape[0]
    split = int(cfg["split"]) if cfg else 1
    if cfg is None or N % cfg["BN"] or K % (cfg["BK"] * split):
        raise ValueError(
            f"the wide W4A16 kernel needs N % BN == 0 and K % (BK * split) == 0 (BN = 64 or 128, BK >= 128); "
            f"got N={N}, K={K}, config {cfg}: use engine='triton'"
        )
    grid = (-(-M // cfg["BM"]) * (N // cfg["BN"]), split)
    partial, counters = _split_k_buffers(out, split, grid[0])
    _kernels()["w4a16_wide"][grid](
        x2,
        w.data,
        w.scale_codes,
        w.global_scale,
        out,
        bias.contiguous() if bias is not None else out,
        partial,
        counters,
        M,
        N,
        K,
        M * N,
        x2.stride(0),
        K // split,
        BN=cfg["BN"],
        BM=cfg["BM"],
        BK=cfg["BK"],
        GROUP=8,
        SPLIT=split,
        HAS_BIAS=bias is not None,
        INTERPRET=interpreting(),
        num_warps=4,  # one warpgroup (see wide_config)
        num_stages=cfg.get("num_stages", 3),
    )
    return out


def fused_pays(M: int, N: int, K: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a fused kernel beats a BF16 GEMM for ``M`` rows of ``dtype`` on ``device`` times an
    ``[N, K]`` weight (:func:`fused_is_faster` with the kernels that run there). Not for code that
    ``torch.compile`` traces: it may load NVRTC, which dynamo refuses to trace."""
    bf16 = dtype == torch.bfloat16
    return fused_is_faster(
        M, N, K, cuda_kernel=bf16 and _cuda_engine_ok(device), wgmma=bf16 and _wgmma_engine_ok(device)
    )


def w4a16_linear(
    x: torch.Tensor,
    w: NVFP4Tensor,
    bias: torch.Tensor | None = None,
    *,
    fused_max_m: int | None = None,
    prepared: W4A16Weight | None = None,
) -> torch.Tensor:
    """``F.linear`` with an NVFP4 weight: fused kernel for small M, dequantize + cuBLAS above.

    The crossover defaults to :func:`fused_is_faster` (measured by the benchmark); ``fused_max_m``
    overrides it.
    ``prepared`` is ``prepare_w4a16(w)`` kept by the caller (else prepared per fused call).
    Non-BF16 activations also take the dequantize + matmul path.
    """
    N, K = w.shape
    M = x.numel() // max(x.shape[-1], 1)
    fused = fused_pays(M, N, K, x.dtype, x.device) if fused_max_m is None else fused_max_m >= M
    if x.dtype == torch.bfloat16 and fused and w.data.is_contiguous() and w.scale.is_contiguous():
        return w4a16_matmul(x, prepared if prepared is not None else w, bias)
    weight = dequantize_triton(w, x.dtype) if triton_available() and x.is_cuda else None
    if weight is None:
        from slime_gb10.nvfp4.format import dequantize_reference

        weight = dequantize_reference(w, x.dtype)
    return torch.nn.functional.linear(x, weight, bias)
