"""Triton NVFP4 kernels on a CUDA GPU: bit-identical quantize, exact dequantize, W4A16 GEMM, QAT training."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from slime_gb10.nvfp4 import NVFP4Linear, dequantize_reference, quantize_model, quantize_reference, w4a16

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def kernels():
    from slime_gb10.nvfp4 import kernels

    if not kernels.triton_available():
        pytest.skip("triton is not installed")
    return kernels


def _same_quantization(a, b) -> bool:
    return (
        torch.equal(a.data.cpu(), b.data.cpu())
        and torch.equal(a.scale.view(torch.uint8).cpu(), b.scale.view(torch.uint8).cpu())
        and torch.equal(a.global_scale.float().cpu(), b.global_scale.float().cpu())
    )


def boundary_probes(seed: int, rows: int = 64) -> tuple[torch.Tensor, float]:
    """Rows whose elements sit on, and 1-2 FP32 ulps around, every E2M1 decision point d * t
    (d = the block's s * global_scale, with a full 24-bit global scale): the cases where a
    division that is off by one ulp would change a code."""
    g = torch.Generator().manual_seed(seed)
    gs = float(
        torch.tensor(float(torch.rand(1, generator=g)) * 0.5 + 0.5)
        * 2.0 ** int(torch.randint(-20, 5, (1,), generator=g))
    )
    thresholds = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.0])
    out = torch.zeros(rows, 16)
    for r in range(rows):
        anchor = torch.tensor(
            6.0
            * float(2.0 ** torch.randint(-8, 8, (1,), generator=g))
            * (1 + float(torch.rand(1, generator=g)))
            * gs
        )
        block = torch.zeros(16)
        block[0] = anchor
        s = quantize_reference(block, gs).scale.float()[0]
        d = (s * torch.tensor(gs, dtype=torch.float32)).float()
        for k in range(1, 16):
            t = thresholds[int(torch.randint(0, 8, (1,), generator=g))]
            v = (
                (d * t).float()
                if t > 0
                else torch.tensor(2.0**-149) * int(torch.randint(1, 4, (1,), generator=g))
            )
            for _ in range(int(torch.randint(-2, 3, (1,), generator=g))):
                v = torch.nextafter(v, torch.tensor(float("inf")))
            for _ in range(int(torch.randint(-2, 3, (1,), generator=g).clamp(max=0).neg())):
                v = torch.nextafter(v, torch.tensor(0.0))
            block[k] = -v if torch.rand(1, generator=g) < 0.5 else v
        out[r] = block
    return out, gs


@pytest.mark.parametrize("divide", [False, True])
def test_triton_quantize_on_decision_boundaries(kernels, divide):
    for seed in range(8):
        x, gs = boundary_probes(seed)
        got = kernels.quantize_triton(x.cuda(), gs, divide=divide)
        assert _same_quantization(got, quantize_reference(x, gs)), seed
        got = kernels.quantize_triton(x.cuda(), divide=divide)
        assert _same_quantization(got, quantize_reference(x)), seed


SHAPES = [(16,), (1, 32), (3, 48), (7, 5, 64), (128, 4096), (257, 80), (1000, 1008), (4, 8192, 16)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_triton_quantize_is_bit_identical_to_the_reference(kernels, shape, dtype):
    g = torch.Generator().manual_seed(hash((shape, str(dtype))) % 2**31)
    for spread in (0.0, 3.0):
        x = torch.randn(shape, generator=g) * torch.exp(spread * torch.randn(shape, generator=g))
        x = x.clamp(-6e4, 6e4).to(dtype)
        expected = quantize_reference(x)  # on the CPU: an independent device and code path
        got = kernels.quantize_triton(x.cuda())
        assert _same_quantization(got, expected)
        assert _same_quantization(kernels.quantize_triton(x.cuda(), divide=False), expected)
        # a given global scale (values beyond it saturate)
        gs = float(expected.global_scale) * 0.37
        assert _same_quantization(kernels.quantize_triton(x.cuda(), gs), quantize_reference(x, gs))
        # and the torch reference on the GPU agrees too
        assert _same_quantization(quantize_reference(x.cuda()), expected)


def test_triton_quantize_special_vectors(kernels):
    rows = [
        [6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.2, 0.3, 5.1, -0.25, -0.75, -2.5, -5.0, -6],
        [-0.0, -0.01, 0.01, 6.0] + [0.0] * 12,
        [0.0] * 16,
        [3 * 6 * 2.0**-9] + [0.0] * 15,
        [2.5 * 6 * 2.0**-9, -1e-3] + [0.0] * 14,
        [0.5 * 6 * 2.0**-9] + [0.0] * 15,
        [12 * 448.0, 6 * 448.0, -3 * 448.0] + [0.0] * 13,
    ]
    x = torch.tensor(rows)
    assert _same_quantization(kernels.quantize_triton(x.cuda(), 1.0), quantize_reference(x, 1.0))
    assert _same_quantization(kernels.quantize_triton(x.cuda()), quantize_reference(x))
    zeros = torch.zeros(5, 64, dtype=torch.bfloat16)
    assert _same_quantization(kernels.quantize_triton(zeros.cuda()), quantize_reference(zeros))
    huge = torch.linspace(-1e38, 1e38, 64).reshape(2, 32)
    huge[1] *= 1e-32
    assert _same_quantization(kernels.quantize_triton(huge.cuda()), quantize_reference(huge))


@pytest.mark.parametrize("gs", [2.0**-95, 2.0**-89, 2.0**99, 2.0**105])
def test_triton_quantize_with_extreme_global_scales(kernels, gs):
    """Global scales outside [2**-90, 2**100] take the div_rn path (Markstein's conditions could
    fail there); both sides of each edge must match the reference, tiny and huge blocks alike."""
    g = torch.Generator().manual_seed(int(abs(torch.log2(torch.tensor(gs)))))
    x = torch.randn(64, 128, generator=g) * torch.exp(8 * torch.randn(64, 128, generator=g)) * gs * 100
    x = torch.where(torch.rand(64, 128, generator=g) < 0.1, x * 1e-30, x)
    x = x.clamp(-3e38, 3e38)
    assert _same_quantization(kernels.quantize_triton(x.cuda(), gs), quantize_reference(x, gs))
    assert _same_quantization(kernels.quantize_triton(x.cuda()), quantize_reference(x))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("given_scale", [False, True])
def test_triton_quantize_rejects_non_finite(kernels, bad, given_scale):
    x = torch.randn(4, 64, device="cuda")
    x[2, 17] = bad
    with pytest.raises(ValueError, match=r"NaN|Inf"):
        kernels.quantize_triton(x, 1.0 if given_scale else None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_triton_dequantize_is_bit_identical(kernels, dtype):
    x = torch.randn(33, 320) * torch.exp(2 * torch.randn(33, 320))
    q = quantize_reference(x)
    got = kernels.dequantize_triton(q.to("cuda"), dtype).cpu()
    assert torch.equal(got, dequantize_reference(q, dtype))


@pytest.mark.parametrize("use_asm", [True, False])
@pytest.mark.parametrize(
    ("M", "N", "K"),
    [
        (1, 64, 64),
        (3, 96, 48),
        (16, 4096, 4096),
        (5, 896, 4864),
        (64, 640, 1024),
        (200, 384, 512),
        (33, 130, 272),
    ],
)
def test_w4a16_gemm_matches_reference_with_poisoned_output(kernels, use_asm, M, N, K):
    bias = (M + N) % 2 == 1
    if use_asm and not w4a16.asm_supported(torch.device("cuda")):
        pytest.skip("the inline-PTX decoder needs sm_90+")
    g = torch.Generator(device="cuda").manual_seed(M * 1000 + N + K)
    w = torch.randn(N, K, device="cuda", generator=g) * 0.05
    x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(N, device="cuda", generator=g).to(torch.bfloat16) if bias else None
    q = quantize_reference(w)
    w_deq = dequantize_reference(q, torch.float64)
    expected = x.double() @ w_deq.T + (b.double() if bias else 0)
    for split in (1, 3):
        cfg = w4a16.w4a16_config(M, N, K, torch.cuda.get_device_properties(0).multi_processor_count)
        cfg["split"] = split if split == 1 else max(cfg["split"], split)
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        w4a16.w4a16_matmul(x, q, b, config=cfg, use_asm=use_asm, out=out)
        assert torch.isfinite(out).all(), "an output element was not written"
        err = (out.double() - expected).norm() / expected.norm()
        assert err < 1e-2, float(err)


@pytest.mark.parametrize("use_asm", [True, False])
def test_w4a16_gemm_with_large_weights_takes_the_exact_decoder(kernels, use_asm):
    """|w| up to ~1e3: the asm decoder's BF16 scale * 2**126 would overflow, so its programs switch
    to the pure-Triton decoder by themselves; the result must still match."""
    g = torch.Generator(device="cuda").manual_seed(7)
    w = torch.randn(384, 512, device="cuda", generator=g) * 300
    x = torch.randn(8, 512, device="cuda", generator=g).to(torch.bfloat16)
    q = quantize_reference(w)
    assert float(q.global_scale) * 448 > 2  # the switch is exercised
    expected = x.double() @ dequantize_reference(q, torch.float64).T
    out = torch.full((8, 384), float("nan"), dtype=torch.bfloat16, device="cuda")
    w4a16.w4a16_matmul(x, q, use_asm=use_asm, out=out)
    assert torch.isfinite(out).all()
    assert float((out.double() - expected).norm() / expected.norm()) < 1e-2


@pytest.mark.parametrize(
    ("M", "N", "K", "bias", "spread"),
    [
        (33, 64, 256, False, 0.05),
        (20, 4096, 4096, False, 0.05),
        (64, 4096, 4096, True, 0.05),
        (100, 1024, 2048, True, 0.05),
        (128, 896, 4864, False, 0.05),
        (257, 640, 1024, True, 0.05),
        (48, 384, 512, True, 300.0),
    ],
)
def test_wide_w4a16_matches_reference_with_poisoned_output(kernels, M, N, K, bias, spread):
    """The wide kernel (weights as the MMA's first operand) against float64: its default tiles and
    the benchmark's alternatives, each with split-K off and with the largest split that divides K;
    a partial last token tile (M = 20, 33, 100, 257); weights up to ~1e3 (spread 300: large block and
    global scales). Outputs start as NaN, so a missed element fails."""
    g = torch.Generator(device="cuda").manual_seed(M * 31 + N + K)
    w = torch.randn(N, K, device="cuda", generator=g) * spread
    x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(N, device="cuda", generator=g).to(torch.bfloat16) if bias else None
    q = quantize_reference(w)
    expected = x.double() @ dequantize_reference(q, torch.float64).T + (b.double() if bias else 0)
    p = w4a16.prepare_w4a16(q)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    overrides = [
        {},
        {"BM": 64, "BK": 256},
        {"BM": 128, "BK": 128},
        {"BN": 128, "BM": 64, "BK": 128},
        {"BM": 32},
    ]
    tried = set()
    for extra in overrides:
        cfg = w4a16.wide_config(M, N, K, sms, **extra)
        if cfg is None:
            continue
        most = max(s for s in (1, 2, 4, 8) if K % (cfg["BK"] * s) == 0)
        for split in sorted({1, cfg["split"], most}):
            cfg = {**cfg, "split": split}
            out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
            w4a16.w4a16_matmul(x, p, b, config=cfg, out=out)
            assert torch.isfinite(out).all(), f"an output element was not written ({cfg})"
            err = float((out.double() - expected).norm() / expected.norm())
            assert err < 1e-2, (cfg, err)
            tried.add((cfg["BN"], cfg["BM"], cfg["BK"], split))
    assert len(tried) >= 3
    got = w4a16.w4a16_matmul(x, p, b)  # M > 32 on a shape it tiles: the wide kernel by itself
    assert float((got.double() - expected).norm() / expected.norm()) < 1e-2


@pytest.mark.parametrize("M", [96, 256])
def test_wide_w4a16_gives_the_same_bits_on_every_call(kernels, M):
    """The kernel is deterministic (split-K partials added in a fixed order), so 100 calls must give
    identical bits. Programs of two warpgroups (8 warps) failed this way now and then on the H100
    (wrong rows of a token tile, Triton 3.6); the launcher uses one warpgroup."""
    g = torch.Generator(device="cuda").manual_seed(M)
    q = quantize_reference(torch.randn(4096, 4096, device="cuda", generator=g) * 0.05)
    x = torch.randn(M, 4096, device="cuda", generator=g).to(torch.bfloat16)
    p = w4a16.prepare_w4a16(q)
    cfg = w4a16.wide_config(M, 4096, 4096, torch.cuda.get_device_properties(0).multi_processor_count)
    assert cfg["split"] > 1  # the split-K partials and their counter are exercised
    first = w4a16.w4a16_matmul(x, p, config=cfg)
    expected = x.double() @ dequantize_reference(q, torch.float64).T
    assert float((first.double() - expected).norm() / expected.norm()) < 1e-2
    outs = [w4a16.w4a16_matmul(x, p, config=cfg) for _ in range(100)]
    assert all(torch.equal(out, first) for out in outs)


def test_wide_w4a16_refuses_shapes_it_cannot_tile(kernels):
    q = quantize_reference(torch.randn(96, 256, device="cuda"))
    x = torch.randn(40, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="N % BN"):
        w4a16.w4a16_matmul(x, q, engine="wide")
    out = w4a16.w4a16_matmul(x, q)  # the automatic choice takes the Triton kernel instead
    expected = x.double() @ dequantize_reference(q, torch.float64).T
    assert float((out.double() - expected).norm() / expected.norm()) < 1e-2


def test_w4a16_linear_falls_back_for_large_m(kernels):
    w = torch.randn(256, 512, device="cuda") * 0.05
    q = quantize_reference(w)
    x = torch.randn(2048, 512, device="cuda", dtype=torch.bfloat16)
    out = w4a16.w4a16_linear(x, q)
    expected = x.float() @ dequantize_reference(q, torch.bfloat16).float().T
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)


def test_nvfp4_linear_w4a16_matches_reference_backend(kernels):
    torch.manual_seed(0)
    linear = nn.Linear(1024, 768, dtype=torch.bfloat16, device="cuda")
    fast = NVFP4Linear.from_linear(linear, backend="w4a16")
    slow = NVFP4Linear.from_linear(linear, backend="reference")
    assert torch.equal(fast.weight, slow.weight)
    for m in (1, 7, 16, 24, 100, 3000):  # CUDA kernel (M <= 32 here), dequantize + cuBLAS (small weight)
        x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
        torch.testing.assert_close(fast(x).float(), slow(x).float(), rtol=2e-2, atol=2e-2)


def test_nvfp4_linear_w4a16_takes_a_fused_kernel_for_rollout_batches(kernels):
    """A 4096 x 4096 layer (16.8 M parameters) at M = 48 and 128 (a GRPO rollout batch): the module
    takes a fused kernel by itself (``fused_is_faster``: on Hopper the wgmma kernel at both; elsewhere
    the CUDA GEMM kernel at 48, the wide one at 128) and matches the reference backend."""
    torch.manual_seed(1)
    linear = nn.Linear(4096, 4096, dtype=torch.bfloat16, device="cuda")
    fast = NVFP4Linear.from_linear(linear, backend="w4a16")
    slow = NVFP4Linear.from_linear(linear, backend="reference")
    hopper = w4a16._wgmma_engine_ok(torch.device("cuda"))
    for m in (48, 128):
        assert w4a16.fused_is_faster(m, 4096, 4096, cuda_kernel=True, wgmma=hopper)
        x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        torch.testing.assert_close(fast(x).float(), slow(x).float(), rtol=2e-2, atol=2e-2)


def test_qat_trains_a_small_mlp_to_the_bf16_loss_band():
    def train(qat: bool) -> tuple[float, float]:
        torch.manual_seed(0)
        teacher = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 32)).cuda()
        x = torch.randn(4096, 64, device="cuda")
        y = teacher(x).detach()
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 32)).cuda()
        if qat:
            quantize_model(model, backend="qat", exclude=())
            assert all(isinstance(model[i], NVFP4Linear) for i in (0, 2))
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        losses = []
        for _ in range(400):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = nn.functional.mse_loss(model(x).float(), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        return losses[0], losses[-1]

    (start, bf16), (_, qat) = train(False), train(True)
    assert bf16 < 0.1 * start
    assert qat < max(3 * bf16, 0.05 * start), (start, bf16, qat)


def _w4a16_problem(kernels, M: int, N: int, K: int, bias: bool):
    """Activations, bias, prepared weight and the float64 result of one W4A16 problem (seeded by its shape)."""
    g = torch.Generator(device="cuda").manual_seed(M * 7 + N + K)
    w = torch.randn(N, K, device="cuda", generator=g) * 0.05
    x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(N, device="cuda", generator=g).to(torch.bfloat16) if bias else None
    q = quantize_reference(w)
    expected = x.double() @ dequantize_reference(q, torch.float64).T + (b.double() if bias else 0)
    return x, b, w4a16.prepare_w4a16(q), expected


def _check_tilings(launch, fits, candidates, x, b, p, expected, same_bits: bool) -> int:
    """Run ``launch(x, codes, scale codes, global scale, bias, out, tiling)`` for every candidate that
    ``fits``, into outputs that start as NaN (a missed element fails), against float64; with
    ``same_bits``, a second call must give the same bits. Returns how many tilings ran."""
    M, N = x.shape[0], p.data.shape[0]
    tried = 0
    for tiling in candidates:
        if not fits(tiling):
            continue
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        launch(x, p.data, p.scale_codes, p.global_scale, b, out, tiling)
        assert torch.isfinite(out).all(), f"an output element was not written ({tiling})"
        err = float((out.double() - expected).norm() / expected.norm())
        assert err < 1e-2, (tiling, err)
        if same_bits:
            again = torch.full_like(out, float("nan"))
            launch(x, p.data, p.scale_codes, p.global_scale, b, again, tiling)
            assert torch.equal(again, out), tiling
        tried += 1
    return tried


def _cuda_engine():
    from slime_gb10.nvfp4 import _cuda_w4a16

    if not _cuda_w4a16.available():
        pytest.skip("the CUDA W4A16 kernel needs sm_90+ and torch.cuda._compile_kernel (NVRTC)")
    return _cuda_w4a16


@pytest.mark.parametrize(
    ("M", "N", "K", "bias"),
    [
        (1, 128, 512, False),
        (3, 256, 1024, True),
        (16, 384, 1024, False),
        (8, 896, 4864, True),
        (13, 4096, 4096, True),
        (1, 4096, 14336, True),
        (20, 256, 1024, True),
        (27, 896, 4864, False),
        (32, 4096, 4096, True),
        (25, 4096, 14336, False),
    ],
)
def test_cuda_w4a16_matches_reference_with_poisoned_output(kernels, M, N, K, bias):
    """Every pipeline and split of the CUDA kernel against float64: the plan's choice (for 132 and
    48 SMs), blocks of 8 and 16 warps (up to 8 row sets of 16 or 32 rows), and tilings
    with clusters of 1, 2, 4 and 8, 1, 2 and 4 row-warps per block (so partials both pushed to and
    pulled by the summing block of a cluster), 16-row warps with 256-wide segments, and
    both the cp.async ring (with and without whole L2 lines) and the register ring (M <= 16), or
    activations staged in windows of 1 and 2 segments and all at once (M = 17..32); outputs start as
    NaN, so a missed element fails."""
    cuda = _cuda_engine()
    x, b, p, expected = _w4a16_problem(kernels, M, N, K, bias)
    nt = -(-M // 8)
    if nt <= 2:
        variants = [(2, 32, 1, 0, 1, 0), (2, 16, 2, 0, 1, 0), (1, 32, 1, 3, 4, 0), (1, 16, 2, 4, 1, 0)]
    else:
        variants = [(1, 32, 1, 3, 1, window) for window in (1, 2, 0)]
    wide_blocks = [  # 8-16 warps per block (M <= 16 plans), at every M: a K-split by 1-16 warps
        cuda.Plan(nt, 1, 2, 1, rows=16, minb=1, warps=16),
        cuda.Plan(nt, 2, 1, 2, rows=16, minb=2, warps=8),
        cuda.Plan(nt, 1, 2, 1, rows=32, minb=2, warps=16),
        cuda.Plan(nt, 1, 1, 1, rows=16, stages=3, minb=2, warps=8),
        cuda.Plan(nt, 2, 1, 1, stages=3, window=1, warps=8),
        # M = 9..16 plans: 8 row sets of 16 rows (one K-warp each, 256-wide segments) or of 32 rows
        cuda.Plan(nt, 2, 8, 1, rows=16, loads=2, minb=2, warps=8),
        cuda.Plan(nt, 4, 8, 2, rows=32, minb=2, warps=8),
        # the cp.async ring fetching whole 128-byte lines into the L2 (Plan.line), staged once or in windows
        cuda.Plan(nt, 1, 4, 1, stages=3, minb=4, line=True),
        cuda.Plan(nt, 2, 1, 1, stages=3, window=1, warps=8, line=True),
    ]
    candidates = (
        [cuda.plan(M, N, K, 132), cuda.plan(M, N, K, 48)]
        + wide_blocks
        + [
            cuda.Plan(nt, cluster, rw, *variant)
            for cluster, rw in ((1, 4), (8, 1), (2, 2), (4, 4))
            for variant in variants
        ]
    )
    fits = lambda tiling: tiling is not None and cuda.valid(tiling, M, N, K)  # noqa: E731
    assert _check_tilings(cuda.w4a16_small, fits, candidates, x, b, p, expected, same_bits=False) >= 4
    # through the public entry point (M <= 32 picks this kernel by itself)
    got = w4a16.w4a16_matmul(x, p, b)
    assert float((got.double() - expected).norm() / expected.norm()) < 1e-2


def test_cuda_w4a16_refuses_shapes_it_cannot_tile(kernels):
    _cuda_engine()
    q = quantize_reference(torch.randn(200, 256, device="cuda"))
    x = torch.randn(1, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="N % 32"):
        w4a16.w4a16_matmul(x, q, engine="cuda")
    out = w4a16.w4a16_matmul(x, q)  # the automatic choice takes the Triton kernel instead
    expected = x.double() @ dequantize_reference(q, torch.float64).T
    assert float((out.double() - expected).norm() / expected.norm()) < 1e-2


def _cuda_gemm_engine():
    from slime_gb10.nvfp4 import _cuda_gemm, _cuda_w4a16

    if not _cuda_w4a16.available():
        pytest.skip("the CUDA W4A16 GEMM kernel needs sm_90+ and torch.cuda._compile_kernel (NVRTC)")
    return _cuda_gemm


@pytest.mark.parametrize(
    ("M", "N", "K", "bias"),
    [
        (1, 128, 512, False),
        (9, 896, 4864, True),
        (37, 4096, 4096, False),
        (64, 14336, 4096, True),
        (130, 512, 1152, True),
        (200, 1024, 2048, False),
    ],
)
def test_cuda_gemm_matches_reference_with_poisoned_output(kernels, M, N, K, bias):
    """The GEMM kernel's tilings against float64: the plan's choice and others with 4 or 8 warps,
    16 or 32 rows and 32-128 tokens per warp, warps split over tokens, 2-4 stages and clusters of 1-8
    blocks (K = 1152 is 9 steps of 128: uneven K splits); M not a multiple of the token tile (the
    zero-filled tokens must not be written). Outputs start as NaN, so a missed element fails; a second
    call gives the same bits (the cluster reduction has a fixed order)."""
    gemm = _cuda_gemm_engine()
    x, b, p, expected = _w4a16_problem(kernels, M, N, K, bias)
    candidates = [gemm.plan(M, N, K, 132)] + [
        gemm.GemmPlan(*t)
        for t in [
            (4, 1, 1, 4, 2, 1),
            (4, 1, 2, 8, 3, 2),
            (8, 1, 1, 8, 2, 4),
            (2, 2, 2, 8, 2, 8),
            (4, 1, 1, 16, 2, 1),
            (8, 1, 1, 4, 3, 1),
            (4, 1, 2, 4, 4, 8),
        ]
    ]
    fits = lambda tiling: gemm.valid(tiling, M, N, K)  # noqa: E731
    assert _check_tilings(gemm.w4a16_gemm, fits, candidates, x, b, p, expected, same_bits=True) >= 6
    got = w4a16.w4a16_matmul(x, p, b, engine="gemm")
    assert float((got.double() - expected).norm() / expected.norm()) < 1e-2


def test_w4a16_matmul_takes_the_gemm_kernel_from_9_to_64_tokens(kernels, monkeypatch):
    """The automatic choice (``gemm_is_faster``): the GEMM kernel at M = 17, 24 and 64 (on Hopper
    the wgmma kernel takes 64) on a 4096 x 4096 weight, at M = 12 on layers with N < K and N < 4096
    and at M = 24 on a K > N layer of 2**24 weights; not at M = 8, 9 and 16 on 4096 x 4096 nor at
    M = 12 on 4096 x 8192 (the weight-streaming CUDA kernel), nor at M = 40 on the K > N layer (the
    wide or, on Hopper, the wgmma kernel); the results match float64 either way."""
    gemm = _cuda_gemm_engine()
    launches = []
    real = gemm.w4a16_gemm

    def spy(*args):
        launches.append(args[0].shape[0])
        return real(*args)

    monkeypatch.setattr(gemm, "w4a16_gemm", spy)
    hopper = w4a16._wgmma_engine_ok(torch.device("cuda"))  # M = 33..64 goes to the wgmma kernel there
    for M, N, K, gemm_expected in [
        (8, 4096, 4096, False),
        (9, 4096, 4096, False),
        (16, 4096, 4096, False),
        (17, 4096, 4096, True),
        (24, 4096, 4096, True),
        (64, 4096, 4096, not hopper),
        (12, 1024, 4096, True),
        (12, 2048, 8192, True),
        (12, 4096, 8192, False),
        (24, 2048, 8192, True),
        (40, 2048, 8192, False),
    ]:
        q = quantize_reference(torch.randn(N, K, device="cuda") * 0.05)
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        launches.clear()
        out = w4a16.w4a16_matmul(x, w4a16.prepare_w4a16(q))
        assert launches == ([M] if gemm_expected else []), (M, N, K)
        expected = x.double() @ dequantize_reference(q, torch.float64).T
        assert float((out.double() - expected).norm() / expected.norm()) < 1e-2


def test_cuda_gemm_refuses_shapes_it_cannot_tile(kernels):
    _cuda_gemm_engine()
    q = quantize_reference(torch.randn(224, 256, device="cuda"))
    x = torch.randn(24, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="N % 64"):
        w4a16.w4a16_matmul(x, q, engine="gemm")
    out = w4a16.w4a16_matmul(x, q)  # automatic: not the CUDA kernel either (2 K steps for 4 K-warps): Triton
    expected = x.double() @ dequantize_reference(q, torch.float64).T
    assert float((out.double() - expected).norm() / expected.norm()) < 1e-2


def _wgmma_engine(kernels):
    from slime_gb10.nvfp4.hopper import wgmma as _cuda_wgmma

    if not w4a16._wgmma_engine_ok(torch.device("cuda")):
        pytest.skip("the wgmma W4A16 kernel needs an sm_90 GPU (Hopper) and NVRTC")
    return _cuda_wgmma


@pytest.mark.parametrize(
    ("M", "N", "K", "bias"),
    [
        (5, 256, 1024, True),
        (37, 896, 4864, False),
        (130, 4096, 4096, True),
        (200, 512, 1152, True),
        (300, 384, 640, True),
        (1000, 1024, 2048, False),
    ],
)
def test_wgmma_matches_reference_with_poisoned_output(kernels, M, N, K, bias):
    """The wgmma kernel's tilings against float64: the plan's choice and others with 1 or 2
    warpgroups, 16-256 tokens per block (the MMA's N), 2-5 stages (2: the producer waits for every
    refill), clusters of 1-8 blocks (K = 1152 and 640 are 9 and 5 steps of 128: uneven K splits) and
    1, 2, 4 or 8 A register sets (each releases a stage at another step); M not a multiple of the
    token tile (the TMA unit's zero-filled tokens must not be written). Outputs start as NaN, so a
    missed element fails; a second call gives the same bits (the cluster reduction has a fixed
    order)."""
    wgmma = _wgmma_engine(kernels)
    x, b, p, expected = _w4a16_problem(kernels, M, N, K, bias)
    limit = wgmma.max_shared_bytes(torch.cuda.current_device())
    candidates = [wgmma.plan(M, N, K, 132, limit)] + [
        wgmma.WgmmaPlan(*t)
        for t in [
            (1, 64, 3, 1, 2),
            (1, 128, 4, 2, 4),
            (2, 128, 5, 4, 4),
            (2, 256, 3, 1, 4),
            (2, 192, 3, 2, 2),
            (1, 16, 3, 8, 4),
            (2, 64, 4, 1, 2),
            (1, 64, 2, 1, 1),
            (2, 128, 3, 2, 8),
        ]
    ]
    fits = lambda tiling: wgmma.valid(tiling, M, N, K, limit)  # noqa: E731
    assert _check_tilings(wgmma.w4a16_wgmma, fits, candidates, x, b, p, expected, same_bits=True) >= 5
    got = w4a16.w4a16_matmul(x, p, b, engine="wgmma")
    assert float((got.double() - expected).norm() / expected.norm()) < 1e-2


@pytest.mark.parametrize(("engine", "M"), [("cuda", 8), ("gemm", 40), ("wgmma", 100)])
def test_nvrtc_kernels_read_strided_and_unaligned_activations(kernels, engine, M):
    """The NVRTC kernels read x's rows in 16-byte chunks (the wgmma kernel through a tensor map that
    takes x's row stride as it is): a view of every other 2176-element row, 16-byte aligned, is
    read in place; an x that starts 2 bytes off a 16-byte boundary (contiguous, so ``contiguous()``
    would return it as it is) is copied first. Both match float64 like a contiguous x."""
    if engine == "wgmma":
        _wgmma_engine(kernels)
    else:
        _cuda_engine()
    N, K = 256, 1024
    x, b, p, expected = _w4a16_problem(kernels, M, N, K, bias=True)
    wide = torch.zeros(M, 2 * K + 128, dtype=torch.bfloat16, device="cuda")
    wide[:, 64 : 64 + K] = x
    strided = wide[:, 64 : 64 + K]  # row stride 2176 elements, starts 128 bytes in
    flat = torch.zeros(M * K + 1, dtype=torch.bfloat16, device="cuda")
    unaligned = flat[1:].view(M, K)  # starts 2 bytes past an aligned address
    unaligned.copy_(x)
    assert strided.stride(0) == 2 * K + 128 and unaligned.data_ptr() % 16 == 2 and unaligned.is_contiguous()
    for xv in (strided, unaligned):
        got = w4a16.w4a16_matmul(xv, p, b, engine=engine)
        assert float((got.double() - expected).norm() / expected.norm()) < 1e-2, engine


def test_w4a16_linear_takes_the_wgmma_kernel_from_33_to_2048_tokens(kernels, monkeypatch):
    """On Hopper the automatic choice (``wgmma_is_faster``) takes the wgmma kernel at M = 33..2048 on
    weights of 2**24 parameters (square, and N > K) and on smaller ones up to 256 where N <= K and up
    to 128 where N > K, through ``w4a16_linear`` (so the dequantize + cuBLAS fallback is not taken
    there either); not at M = 32 or 2049, nor past those on the small weights. The results match
    float64 either way."""
    wgmma = _wgmma_engine(kernels)
    launches = []
    real = wgmma.w4a16_wgmma

    def spy(*args):
        launches.append(args[0].shape[0])
        return real(*args)

    monkeypatch.setattr(wgmma, "w4a16_wgmma", spy)
    weights = {}
    for M, N, K, expected_wgmma in [
        (32, 4096, 4096, False),
        (33, 4096, 4096, True),
        (256, 4096, 4096, True),
        (384, 4096, 4096, True),
        (1024, 4096, 4096, True),
        (2048, 4096, 4096, True),
        (2049, 4096, 4096, False),
        (513, 8192, 2048, True),
        (2048, 8192, 2048, True),
        (256, 896, 4864, True),
        (257, 896, 4864, False),
        (128, 4864, 896, True),
        (129, 4864, 896, False),
    ]:
        if (N, K) not in weights:
            weights[N, K] = quantize_reference(torch.randn(N, K, device="cuda") * 0.05)
        q = weights[N, K]
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        launches.clear()
        out = w4a16.w4a16_linear(x, q, prepared=w4a16.prepare_w4a16(q))
        assert launches == ([M] if expected_wgmma else []), (M, N, K)
        expected = x.double() @ dequantize_reference(q, torch.float64).T
        assert float((out.double() - expected).norm() / expected.norm()) < 1e-2


def test_wgmma_plan_counts_only_the_waves_the_device_holds(kernels):
    """``plan`` counts a wave of (1, 64) blocks as ``BLOCKS_PER_SM`` of them per SM, and one of
    clusters of 4 blocks that take an SM each as ``CLUSTER4_SM_SHARE`` of the SMs (the H100 SXM: 30
    clusters, docs/nvfp4-notes.md v19-v20). The driver's occupancy query on this device must find at least that
    much room at once, or the plan would count on waves that do not fit; and no more than one such
    (1, 128) block per SM, or the share would undercount."""
    import ctypes

    from slime_gb10.nvfp4._cuda_w4a16 import opt_in_shared_memory

    wgmma = _wgmma_engine(kernels)
    index = torch.cuda.current_device()
    sms = torch.cuda.get_device_properties(index).multi_processor_count

    class LaunchConfig(ctypes.Structure):  # CUlaunchConfig (cuda.h)
        _fields_ = [
            *((name, ctypes.c_uint) for name in ("gx", "gy", "gz", "bx", "by", "bz", "smem")),
            ("stream", ctypes.c_void_p),
            ("attrs", ctypes.c_void_p),
            ("nattrs", ctypes.c_uint),
        ]

    def clusters_at_once(p) -> int:
        kernel = wgmma._kernel(index, p)
        smem = wgmma.shared_bytes(p)
        opt_in_shared_memory(kernel, smem)
        # a grid of 4 blocks per SM: the answer is the device's room, not the grid's size
        config = LaunchConfig(4 * sms // p.cluster, p.cluster, 1, p.threads, 1, 1, smem, None, None, 0)
        count = ctypes.c_int(-1)
        rc = wgmma._driver().cuOccupancyMaxActiveClusters(
            ctypes.byref(count), kernel.func, ctypes.byref(config)
        )
        assert rc == 0, f"cuOccupancyMaxActiveClusters failed with CUresult {rc} for {p}"
        return count.value

    small = wgmma.WgmmaPlan(1, 64, 5, 2)
    room = 2 * clusters_at_once(small)
    assert room >= wgmma.BLOCKS_PER_SM[(1, 64)] * sms, f"{room} (1, 64) blocks at once on {sms} SMs"
    large = wgmma.WgmmaPlan(1, 128, 5, 4)
    assert wgmma.shared_bytes(large) > wgmma.max_shared_bytes(index) // 2  # one block per SM
    room = 4 * clusters_at_once(large)
    assert room >= int(sms * wgmma.CLUSTER4_SM_SHARE), f"{room} blocks in clusters of 4 on {sms} SMs"


def test_wgmma_refuses_shapes_it_cannot_tile(kernels):
    _wgmma_engine(kernels)
    q = quantize_reference(torch.randn(224, 256, device="cuda"))
    x = torch.randn(48, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="N % 64"):
        w4a16.w4a16_matmul(x, q, engine="wgmma")
