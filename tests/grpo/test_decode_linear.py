"""The decode step's projection kernels (``engines/decode_linear.py``) against their twins in float64
on random shapes: ragged token, feature and reduction sizes (none a multiple of a tile), a bias or
none, the reduction split among 1-4 programs (the partial sums added by the caller), the SwiGLU
epilogue; then the static decoder's one-token step with the kernels against the same step through
``F.linear``.

On the CPU the kernels run under ``TRITON_INTERPRET=1`` in FP16 and FP32 (the interpreter's BF16
``tl.dot`` is broken in Triton 3.9, see ``test_decode_attention.py``); BF16 is checked on the GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

triton = pytest.importorskip("triton")

CASES = textwrap.dedent(
    """
    import json
    import torch
    from slime_gb10.grpo.engines.decode_linear import launch, reference_linear, reference_swiglu

    def compare(device, shapes, dtype):
        gen = torch.Generator().manual_seed(5)
        report = []
        for tokens, features, depth, splits, bias, swiglu in shapes:
            x = torch.randn(tokens, depth, generator=gen).to(dtype)
            w = (torch.randn((2 if swiglu else 1) * features, depth, generator=gen) / depth ** 0.5).to(dtype)
            b = torch.randn(features, generator=gen).to(dtype) if bias else None
            if swiglu:
                want = reference_swiglu(x.double(), w.double())
            else:
                want = reference_linear(x.double(), w.double(), None if b is None else b.double())
            on = lambda t: None if t is None else t.to(device)
            got = launch(on(x), on(w), on(b), splits=splits, swiglu=swiglu)
            got = (got.sum(0) if splits > 1 else got).cpu().double()
            scale = float(want.abs().max())
            report.append({"shape": [tokens, features, depth, splits, bias, swiglu],
                           "error": float((got - want).abs().max()) / scale,
                           "finite": bool(torch.isfinite(got).all())})
        return report
    """
)

SHAPES = [
    (5, 70, 200, 1, True, False),  # less than one tile of tokens and of features
    (37, 96, 300, 2, True, False),  # the bias in the first split only
    (33, 64, 512, 4, False, False),
    (3, 130, 129, 3, True, False),  # a split with a ragged end
    (9, 80, 150, 1, False, True),  # SwiGLU: the up rows 80 below the gate rows
]


def _check(report, limit):
    for case in report:
        assert case["finite"] and case["error"] < limit, case


@pytest.mark.slow
def test_the_projection_kernels_are_their_twins_under_the_interpreter():
    script = CASES + (
        f"\nprint(json.dumps(compare('cpu', {SHAPES!r}, torch.float16) + compare('cpu', {SHAPES!r}, torch.float32)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check(json.loads(proc.stdout.strip().splitlines()[-1]), 2e-3)  # FP16 output rounding: 2^-11 relative


def test_the_reduction_is_split_to_fill_the_gpu_twice(monkeypatch):
    """Shape B on 132 SMs (tiles of 64 features x 32 tokens): the down projection (896 features,
    4864 deep) has 14 x 5 = 70 tiles, so ceil(264 / 70) = 4 splits; q/k/v (1152 features) 90 tiles,
    3 wanted, 2 (a power of two); o (896 x 896) 4 wanted but 896 / 256 = 3 two-step shares, so 2;
    gate/up's 152 x 5 tiles fill the GPU alone."""
    from slime_gb10.grpo.engines import decode_linear

    monkeypatch.setattr(decode_linear, "_multiprocessors", lambda device: 132)
    monkeypatch.setattr(decode_linear, "BLOCK_N", 64)
    monkeypatch.setattr(decode_linear, "BLOCK_T", 32)
    monkeypatch.setattr(decode_linear, "BLOCK_K", 128)
    cpu = torch.device("cpu")
    assert decode_linear.splits_for(160, 896, 4864, cpu) == 4
    assert decode_linear.splits_for(160, 1152, 896, cpu) == 2
    assert decode_linear.splits_for(160, 896, 896, cpu) == 2
    assert decode_linear.splits_for(160, 9728, 896, cpu) == 1
    assert decode_linear.splits_for(1, 64, 100_000, cpu) == 16  # at most 16


STEP = textwrap.dedent(
    """
    import json
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from slime_gb10.grpo.engines import decode_linear
    from slime_gb10.grpo.engines.torch_engine import StaticDecoder, fuse_projections

    # every projection the kernels can serve, not only those they serve by default
    decode_linear.PROJECTIONS = frozenset({"qkv", "o", "gate_up", "down", "lm_head"})

    def step_logits(device, dtype, kernels):
        torch.manual_seed(0)
        config = Qwen2Config(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             intermediate_size=600, vocab_size=101, hidden_act="silu", max_position_embeddings=64)
        model = Qwen2ForCausalLM(config).to(device=device, dtype=dtype).eval()
        fuse_projections(model)
        batch, width, cache_len = 3, 5, 16
        decoder = StaticDecoder(model, batch, cache_len)
        decoder.linear_kernel = kernels
        gen = torch.Generator().manual_seed(1)
        ids = torch.randint(0, 101, (batch, width), generator=gen).to(device)
        causal = torch.tril(torch.ones(width, width, dtype=torch.bool))[None, None].expand(batch, 1, width, width)
        positions = torch.arange(width)[None].expand(batch, width).to(device)
        with torch.no_grad():
            decoder.forward(ids, positions, torch.arange(width, device=device), causal.to(device))
            mask = torch.zeros(batch, 1, 1, width + 1, dtype=torch.bool, device=device)
            mask[..., : width + 1] = True
            token = torch.randint(0, 101, (batch, 1), generator=gen).to(device)
            return decoder.forward(token, positions[:, -1:] + 1, torch.tensor([width], device=device), mask)

    def compare(device, dtype):
        plain, fast = step_logits(device, dtype, False), step_logits(device, dtype, True)
        return {"error": float((fast.double() - plain.double()).norm() / plain.double().norm())}
    """
)


@pytest.mark.slow
def test_the_decode_step_with_the_kernels_is_the_plain_step_under_the_interpreter():
    """Qwen2 (q/k/v bias, SiLU, tied LM head): fused q/k/v, the SwiGLU epilogue, the down
    projection split in two (600 deep, 8 nominal SMs off a GPU) and the LM head through the
    kernels, one token per row."""
    script = STEP + "\nprint(json.dumps(compare('cpu', torch.float16)))\n"
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["error"] < 5e-3


@pytest.mark.gpu
def test_the_projection_kernels_are_their_twins_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    namespace: dict = {}
    exec(CASES, namespace)
    shapes = [
        *SHAPES,
        (160, 1152, 896, 2, True, False),  # shape B's q/k/v, o, gate/up, down, LM head
        (160, 896, 896, 2, False, False),
        (160, 4864, 896, 1, False, True),
        (160, 896, 4864, 4, False, False),
        (160, 49152, 896, 1, False, False),
    ]
    _check(namespace["compare"]("cuda", shapes, torch.bfloat16), 1e-2)  # BF16 rounding: 2^-8 relative
    _check(namespace["compare"]("cuda", shapes, torch.float16), 2e-3)


@pytest.mark.gpu
def test_the_decode_step_with_the_kernels_is_the_plain_step_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    namespace: dict = {}
    exec(STEP, namespace)
    assert namespace["compare"]("cuda", torch.bfloat16)["error"] < 2e-2  # GRAPH_REPLAY_TOLERANCE's BF16 limit


@pytest.mark.gpu
def test_the_split_projection_compiles_and_captures():
    """Inside ``torch.compile`` (the partial sums added by inductor) and replayed from a CUDA graph,
    the projection gives what it gives eagerly."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from slime_gb10.grpo.engines.decode_linear import project, splits_for

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(160, 4864, device="cuda", generator=gen, dtype=torch.bfloat16)
    w = torch.randn(896, 4864, device="cuda", generator=gen, dtype=torch.bfloat16) / 70
    residual = torch.randn(160, 896, device="cuda", generator=gen, dtype=torch.bfloat16)
    assert splits_for(160, 896, 4864, x.device) > 1

    def step(x):
        return residual + project(x, w)

    eager = step(x)
    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    torch.testing.assert_close(compiled(x), eager, atol=2e-2, rtol=1e-2)
    graph = torch.cuda.CUDAGraph()
    want = compiled(x)
    with torch.cuda.graph(graph):
        out = compiled(x)
    graph.replay()
    torch.testing.assert_close(out, want, atol=0, rtol=0)
