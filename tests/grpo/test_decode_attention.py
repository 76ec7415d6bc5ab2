"""The grouped-query decode attention kernel (``engines/decode_attention.py``) against its twin, SDPA
in float64, on random shapes: query groups of 7 (shape B), 3 and 1, head dims 32/64/128, left-padded
rows (whole tiles of padding included), cache slices narrower than the buffer (the decode loop's
buckets), one program per (row, KV head) and slots split among 2-16 programs.

On the CPU the kernel runs under ``TRITON_INTERPRET=1`` in FP16 and FP32: the interpreter's BF16
``tl.dot`` returns garbage in Triton 3.9 (a 16x16 BF16 product off by 1e10 there), so BF16 is checked
on the GPU. FP32 (exact FP32 dots) is what the engine's FP32 GPU tests decode with.
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
    from slime_gb10.grpo.engines.decode_attention import launch, reference

    def compare(device, shapes, dtype):
        gen = torch.Generator().manual_seed(11)
        report = []
        for rows, heads, kv_heads, d, buffer, slots, splits in shapes:
            q = torch.randn(rows, heads, 1, d, generator=gen).to(dtype)
            cache_k = torch.randn(rows, kv_heads, buffer, d, generator=gen).to(dtype)
            cache_v = torch.randn(rows, kv_heads, buffer, d, generator=gen).to(dtype)
            mask = torch.zeros(rows, 1, 1, buffer + 1, dtype=torch.bool)
            for r in range(rows):  # left padding of 0 .. 70 slots, then every slot up to `slots`
                mask[r, 0, 0, min((r * 37) % 71, slots - 1) : slots] = True
            valid, k, v = mask[:, 0, 0, :slots], cache_k[:, :, :slots], cache_v[:, :, :slots]
            scale = d ** -0.5
            want = reference(q.double(), k.double(), v.double(), valid, scale)
            on = lambda t: t.to(device)
            got = launch(on(q), on(k), on(v), on(valid), scale, splits).cpu().double()
            report.append({"shape": [rows, heads, kv_heads, d, buffer, slots, splits],
                           "error": float((got - want).abs().max()), "finite": bool(torch.isfinite(got).all())})
        return report
    """
)


def _check(report, limit):
    for case in report:
        assert case["finite"] and case["error"] < limit, case


@pytest.mark.slow
def test_the_decode_kernel_is_sdpa_under_the_interpreter():
    shapes = [
        (3, 14, 2, 64, 200, 130, 1),  # shape B's groups of 7, one program per (row, KV head)
        (2, 9, 3, 32, 100, 37, 4),  # groups of 3, a split with no slots at all
        (2, 4, 4, 32, 80, 64, 2),  # no grouping
        (2, 8, 2, 128, 160, 150, 16),
    ]
    script = CASES + (
        f"\nprint(json.dumps(compare('cpu', {shapes!r}, torch.float16)"
        f" + compare('cpu', {shapes[:2]!r}, torch.float32)))\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check(json.loads(proc.stdout.strip().splitlines()[-1]), 2e-3)  # FP16 output rounding: 2^-11 x |out| <= 1


@pytest.mark.gpu
def test_the_decode_kernel_is_sdpa_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    namespace: dict = {}
    exec(CASES, namespace)
    shapes = [
        (160, 14, 2, 64, 577, 320, 1),  # shape B's decode batch
        (4, 14, 2, 64, 577, 512, 16),
        (8, 9, 3, 64, 200, 130, 4),
        (3, 32, 8, 128, 300, 257, 2),
    ]
    _check(namespace["compare"]("cuda", shapes, torch.bfloat16), 1.6e-2)  # BF16 rounding: 2^-8 x |out| <= 4
    _check(namespace["compare"]("cuda", shapes[:2], torch.float32), 1e-5)


@pytest.mark.gpu
def test_the_decode_kernel_compiles_and_captures_with_a_dynamic_span():
    """The custom op inside ``torch.compile`` (the span a dynamic dimension, as the engine's step
    marks it) and replayed from a CUDA graph gives what it gives eagerly."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from slime_gb10.grpo.engines.decode_attention import decode_attention, splits_for

    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(32, 14, 1, 64, device="cuda", generator=gen, dtype=torch.bfloat16)
    cache = torch.randn(2, 32, 2, 400, 64, device="cuda", generator=gen, dtype=torch.bfloat16)
    mask = torch.ones(32, 1, 1, 401, dtype=torch.bool, device="cuda")

    def step(q, mask):
        span = mask.shape[-1]
        return decode_attention(
            q * 1.0, cache[0, :, :, :span], cache[1, :, :, :span], mask[:, 0, 0, :], 0.125
        )

    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    assert splits_for(32, 2, 320, q.device) == 2  # 64 pairs, 2 tiles of slots: 2 programs per pair
    for span in (64, 128, 320):
        view = mask[..., :span]
        torch._dynamo.maybe_mark_dynamic(view, 3)
        eager = step(q, view)
        torch.testing.assert_close(compiled(q, view), eager, atol=0, rtol=0)
        graph = torch.cuda.CUDAGraph()
        compiled(q, view)
        with torch.cuda.graph(graph):
            out = compiled(q, view)
        graph.replay()
        torch.testing.assert_close(out, eager, atol=0, rtol=0)
