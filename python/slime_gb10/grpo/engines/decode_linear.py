"""The decode step's projections (a few hundred token rows times a weight matrix) as Triton kernels.

Their pure-torch twins are :func:`reference_linear` (``F.linear``) and :func:`reference_swiglu`
(``silu(gate) * up`` of the fused gate/up projection). A decode step of shape B multiplies 160 rows
by weights of 2-17 MB: as many FLOPs per weight byte as the H100 does per byte of bandwidth, so the
time is reading each weight once at full bandwidth. cuBLAS tiles the output for large matrices: the
down projection's 896 outputs give it 12 tiles on 132 SMs (10.0 us per call, 0.9 TB/s; the q/k/v
projection 5.1 us, BENCHMARKS.md, issue #27). Here the weight rows are the MMA's long side (a tile of
``block_n`` output features), the tokens its short side, and when that leaves too few programs the
reduction dimension is split among several (split-K): each writes an FP32 partial sum and the caller
adds them (``partials.sum(0)``), which inductor fuses into the residual add that follows, so the
result is deterministic and costs no extra kernel. The fused gate/up projection computes
``silu(gate) * up`` in its epilogue: the ``[tokens, 2 * intermediate]`` product never goes to memory.

Rounding follows the plain path: each projection's output is rounded to the weight dtype before the
SiLU (as ``F.linear`` then ``silu`` would), then ``silu(gate) * up`` is computed in FP32 and rounded once.
"""

from __future__ import annotations

import functools

import torch

from slime_gb10.grpo.engines import triton_importable

#: launch choices (block of output features, of tokens, of the reduction; warps; pipeline stages)
#: picked by ``benchmarks/grpo/dev/decode_linear_sweep.py`` on an H100 for shapes A, B and C
BLOCK_N, BLOCK_T, BLOCK_K, NUM_WARPS, NUM_STAGES = 64, 32, 128, 4, 4


#: the decode step's projections the kernels serve: those where they beat cuBLAS on an H100 (q/k/v,
#: o and down: a few MB each, which cuBLAS spreads over too few tiles); cuBLAS keeps gate/up and the
#: LM head (``decode_linear_sweep.py`` and ``rollout_variants.py``, BENCHMARKS.md, issue #27)
PROJECTIONS = frozenset({"qkv", "o", "down"})


def reference_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight, bias)


def reference_swiglu(x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` with ``gate_up`` the gate rows then the up rows (``fuse_projections``)."""
    gate, up = torch.nn.functional.linear(x, gate_up).chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate.float()) * up.float()).to(x.dtype)


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the kernels serve here: a CUDA device, BF16/FP16 (tensor-core dots), Triton importable.

    FP32 engines keep cuBLAS: they exist for tests that need the plain path's tokens."""
    return (
        torch.device(device).type == "cuda"
        and dtype in (torch.bfloat16, torch.float16)
        and triton_importable()
    )


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def project(
        x, w, bias, out,
        tokens, features, depth, per_split, half,
        sx_t, sw_n, so_s, so_t,
        BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
        HAS_BIAS: tl.constexpr, SWIGLU: tl.constexpr, PARTIAL: tl.constexpr, PRECISION: tl.constexpr,
    ):  # fmt: skip
        # out[t, n] = sum_k x[t, k] w[n, k] over this program's share of k, as acc[n, t] = w_tile @ x_tile^T
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        split = tl.program_id(1)
        t = tl.program_id(2) * BLOCK_T + tl.arange(0, BLOCK_T)
        ks = tl.arange(0, BLOCK_K)
        n_in, t_in = n < features, t < tokens
        acc = tl.zeros((BLOCK_N, BLOCK_T), tl.float32)
        acc_up = tl.zeros((BLOCK_N, BLOCK_T), tl.float32)
        first = split * per_split
        last = tl.minimum(first + per_split, depth)
        for k0 in range(first, last, BLOCK_K):
            k = k0 + ks
            k_in = k < last
            xt = tl.load(x + t[None, :] * sx_t + k[:, None], mask=t_in[None, :] & k_in[:, None], other=0.0)
            wt = tl.load(w + n[:, None] * sw_n + k[None, :], mask=n_in[:, None] & k_in[None, :], other=0.0)
            acc = tl.dot(wt, xt, acc, input_precision=PRECISION)
            if SWIGLU:  # the up rows sit `half` rows below the gate rows
                ut = tl.load(
                    w + (n[:, None] + half) * sw_n + k[None, :], mask=n_in[:, None] & k_in[None, :], other=0.0
                )
                acc_up = tl.dot(ut, xt, acc_up, input_precision=PRECISION)
        if HAS_BIAS:  # noqa: SIM102 (a compile-time branch around a run-time one)
            if split == 0:
                acc += tl.load(bias + n, mask=n_in, other=0.0).to(tl.float32)[:, None]
        if SWIGLU:  # round each projection as F.linear would, then silu(gate) * up in FP32
            gate = acc.to(out.dtype.element_ty).to(tl.float32)
            up = acc_up.to(out.dtype.element_ty).to(tl.float32)
            acc = gate / (1.0 + tl.exp(-gate)) * up
        target = out + split * so_s + t[None, :] * so_t + n[:, None]
        keep = n_in[:, None] & t_in[None, :]
        if PARTIAL:
            tl.store(target, acc, mask=keep)
        else:
            tl.store(target, acc.to(out.dtype.element_ty), mask=keep)

    return project


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    """The device's SMs; off a GPU (the interpreter, in tests) a nominal 8."""
    if device.type != "cuda":
        return 8
    return torch.cuda.get_device_properties(device.index or 0).multi_processor_count


def splits_for(tokens: int, features: int, depth: int, device: torch.device) -> int:
    """Programs per output tile along the reduction, a power of two: enough for the tiles to fill the
    GPU twice, but each program at least two ``BLOCK_K`` steps of the reduction."""
    sms = _multiprocessors(torch.device(device))
    tiles = -(-features // BLOCK_N) * -(-tokens // BLOCK_T)
    want = -(-2 * sms // tiles)
    most = max(1, depth // (2 * BLOCK_K))
    splits = 1
    while splits * 2 <= min(want, most, 16):
        splits *= 2
    return splits


def launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    splits: int = 1,
    swiglu: bool = False,
    block_n: int | None = None,
    block_t: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """``x`` ``[T, K]`` times ``weight`` ``[N, K]``: ``[T, N]`` in ``x``'s dtype when ``splits`` is 1,
    else the FP32 partial sums ``[splits, T, N]`` (bias in the first); with ``swiglu`` the weight is
    the gate rows then the up rows and the result ``silu(gate) * up`` ``[T, N / 2]`` (``splits`` 1).
    Launch choices left out are the module's (``BLOCK_N`` ...; the dev sweep sets them)."""
    block_n, block_t, block_k = block_n or BLOCK_N, block_t or BLOCK_T, block_k or BLOCK_K
    num_warps, num_stages = num_warps or NUM_WARPS, num_stages or NUM_STAGES
    if swiglu and (splits != 1 or bias is not None):
        raise ValueError("the SwiGLU epilogue needs the whole reduction in one program and no bias")
    x = x if x.stride(-1) == 1 else x.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    tokens, depth = x.shape
    features = weight.shape[0] // 2 if swiglu else weight.shape[0]
    if splits > 1:
        out = torch.empty((splits, tokens, features), dtype=torch.float32, device=x.device)
    else:
        out = torch.empty((1, tokens, features), dtype=x.dtype, device=x.device)
    share = -(-depth // splits)
    per_split = -(-share // block_k) * block_k  # whole blocks of the reduction per program
    grid = (-(-features // block_n), splits, -(-tokens // block_t))
    _kernel()[grid](
        x, weight, bias if bias is not None else weight, out,
        tokens, features, depth, per_split, features,
        x.stride(0), weight.stride(0), out.stride(0), out.stride(1),
        BLOCK_N=block_n, BLOCK_T=block_t, BLOCK_K=block_k,
        HAS_BIAS=bias is not None, SWIGLU=swiglu, PARTIAL=splits > 1,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out if splits > 1 else out[0]


@torch.library.custom_op("slime_gb10::decode_linear", mutates_args=())
def decode_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, splits: int
) -> torch.Tensor:
    """``[splits, T, N]`` FP32 partial sums of ``x @ weight.T + bias`` (add them over the first
    dimension); ``[T, N]`` in ``x``'s dtype when ``splits`` is 1. A custom op, so that
    ``torch.compile`` keeps it as one call (and fuses the sum into what follows) and CUDA graphs
    capture its launch."""
    return launch(x, weight, bias, splits=splits)


@decode_linear.register_fake
def _(x, weight, bias, splits):
    if splits > 1:
        return x.new_empty((splits, x.shape[0], weight.shape[0]), dtype=torch.float32)
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.custom_op("slime_gb10::decode_swiglu", mutates_args=())
def decode_swiglu(x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(x @ gate.T) * (x @ up.T)`` ``[T, N / 2]`` with ``gate_up`` the gate rows then the up rows."""
    return launch(x, gate_up, swiglu=True)


@decode_swiglu.register_fake
def _(x, gate_up):
    return x.new_empty((x.shape[0], gate_up.shape[0] // 2))


def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for ``x`` ``[..., K]`` through :func:`decode_linear`, the
    reduction split as :func:`splits_for` says and the partial sums added in FP32."""
    rows = x.reshape(-1, x.shape[-1])
    splits = splits_for(rows.shape[0], weight.shape[0], weight.shape[1], x.device)
    out = decode_linear(rows, weight, bias, splits)
    if splits > 1:
        out = out.sum(0).to(x.dtype)
    return out.view(*x.shape[:-1], weight.shape[0])


def swiglu(x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    """:func:`reference_swiglu` for ``x`` ``[..., K]`` through :func:`decode_swiglu`."""
    out = decode_swiglu(x.reshape(-1, x.shape[-1]), gate_up)
    return out.view(*x.shape[:-1], gate_up.shape[0] // 2)
