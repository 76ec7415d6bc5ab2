"""The grouped-query decode attention kernel (``engines/torch/decode_attention.py``) against its twin, SDPA
in float64, on random shapes: query groups of 7 (shape B), 3 and 1, head dims 32/64/128, left-padded
rows (whole tiles of padding included), cache slices narrower than the buffer (the decode loop's
buckets), one program per (row, KV head) and slots split among 2-16 programs.

On the CPU the kernel runs under ``TRITON_INTERPRET=1`` in FP16 and FP32: the interpreter's BF16
``tl.dot`` returns garbage in Triton 3.9 (a 16x16 BF16 product off by 1e10 there), so BF16 is checked
on the GPU. FP32 (exact FP32 dots) is what the engine's FP32 GPU tests decode with.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

triton = pytest.importorskip("triton")

CASES = textwrap.dedent(
    """
    import json
    import torch
    from slime_gb10.grpo.engines.torch.decode_attention import launch, reference

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
def test_the_decode_kernel_is_sdpa_under_the_interpreter(triton_interpreter):
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
    _check(triton_interpreter(script), 2e-3)  # FP16 output rounding: 2^-11 x |out| <= 1


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
    from slime_gb10.grpo.engines.torch.decode_attention import decode_attention, splits_for

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


STEP_CASES = textwrap.dedent(
    """
    import json
    import torch
    from slime_gb10.grpo.engines.torch import decode_attention as da

    def rotary(rows, d, gen, dtype):
        positions = torch.randint(0, 500, (rows,), generator=gen).double()
        angles = positions[:, None] / 10000 ** (torch.arange(0, d, 2).double() / d)[None]
        emb = torch.cat([angles, angles], -1)
        return emb.cos().to(dtype)[:, None, None, :], emb.sin().to(dtype)[:, None, None, :]

    def compare_step(device, shapes, dtype, compile_backend=None, parts=0):
        # parts: the projection as that many FP32 partial products and a bias (0: as stored)
        gen = torch.Generator().manual_seed(12)
        report = []
        for rows, heads, kv_heads, d, buffer, span, slot, splits in shapes:
            width = (heads + 2 * kv_heads) * d
            qkv = torch.randn(*([parts] if parts else []), rows, width, generator=gen)
            qkv = qkv / max(parts, 1) if parts else qkv.to(dtype)
            bias = (torch.randn(width, generator=gen) / 4).to(dtype) if parts else None
            cos, sin = rotary(rows, d, gen, dtype)
            keys = torch.randn(rows, kv_heads, buffer, d, generator=gen).to(dtype)
            values = torch.randn(rows, kv_heads, buffer, d, generator=gen).to(dtype)
            valid = torch.ones(rows, span, dtype=torch.bool)
            for r in range(rows):
                valid[r, : (r * 37) % 71 % slot] = False  # left padding, never the new slot
            on = lambda t: t.to(device)
            k_want, v_want = keys.clone(), values.clone()
            want = da.reference_step(qkv, cos, sin, k_want, v_want, valid, torch.tensor([slot]), heads, d ** -0.5,
                                     bias)
            k_got, v_got = on(keys), on(values)
            args = (on(qkv), on(cos), on(sin), k_got, v_got, on(valid), on(torch.tensor([slot])))
            bias = None if bias is None else on(bias)
            if compile_backend:  # the custom op inside torch.compile: its cache writes must reach the buffers
                step = torch.compile(da.decode_step, backend=compile_backend, fullgraph=True)
                got = step(*args, heads, d ** -0.5, bias)
            else:
                got = da.launch(*args[:1], k_got, v_got, args[5], d ** -0.5, splits,
                                rope=(heads, args[1], args[2], args[6]), qkv_bias=bias)
            report.append({"shape": [rows, heads, kv_heads, d, buffer, span, slot, splits],
                           "error": float((got.cpu().double() - want.double()).abs().max()),
                           "cache_error": max(float((k_got.cpu().double() - k_want.double()).abs().max()),
                                              float((v_got.cpu().double() - v_want.double()).abs().max())),
                           "finite": bool(torch.isfinite(got).all())})
        return report
    """
)

STEP_SHAPES = [
    (3, 14, 2, 64, 200, 130, 100, 1),  # shape B's groups of 7; slots 101-129 valid but not read
    (2, 9, 3, 32, 100, 64, 40, 4),  # the new slot in the second of four splits
    (2, 8, 2, 128, 160, 150, 149, 2),  # the new slot the last one read
]


def _check_step(report, limit, cache_limit=0.0):
    """``cache_limit``: 0 (bit for bit) in 16 bits, where the rotated key is rounded once either way;
    in FP32 the GPU's fused multiply-adds may move the last bit against torch's separate ops."""
    for case in report:
        assert case["finite"] and case["cache_error"] <= cache_limit and case["error"] < limit, case


@pytest.mark.slow
def test_the_fused_decode_step_is_its_twin_under_the_interpreter(triton_interpreter):
    """Rotary of q and the new key, the cache writes and the attention in one kernel against
    ``reference_step`` (rotary in FP32 rounded once, ``index_copy_``, SDPA): the written cache
    equal (FP16 bit for bit), the attention within rounding; also through ``torch.compile`` (aot_eager),
    where the op's declared mutation must carry the writes into the buffers."""
    script = STEP_CASES + (
        f"\nprint(json.dumps(compare_step('cpu', {STEP_SHAPES!r}, torch.float16)"
        f" + compare_step('cpu', {STEP_SHAPES!r}, torch.float32)"
        f" + compare_step('cpu', {STEP_SHAPES[:1]!r}, torch.float32, 'aot_eager')"
        f" + compare_step('cpu', {STEP_SHAPES!r}, torch.float16, parts=2)"
        f" + compare_step('cpu', {STEP_SHAPES[:1]!r}, torch.float32, 'aot_eager', parts=3)))\n"
    )
    _check_step(triton_interpreter(script), 2e-3, cache_limit=1e-6)


@pytest.mark.gpu
def test_the_fused_decode_step_is_its_twin_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    namespace: dict = {}
    exec(STEP_CASES, namespace)
    shapes = [*STEP_SHAPES, (160, 14, 2, 64, 577, 320, 300, 1)]
    _check_step(namespace["compare_step"]("cuda", shapes, torch.bfloat16), 1.6e-2)
    _check_step(namespace["compare_step"]("cuda", shapes[:2], torch.float32), 1e-5, cache_limit=1e-5)
    _check_step(namespace["compare_step"]("cuda", shapes[-1:], torch.bfloat16, "inductor"), 1.6e-2)
    # the projection as FP32 partial products and a bias, summed in the kernel (static_decoder's QKV_SPLIT_K)
    _check_step(namespace["compare_step"]("cuda", shapes, torch.bfloat16, parts=2), 1.6e-2)
    _check_step(namespace["compare_step"]("cuda", shapes[-1:], torch.bfloat16, "inductor", parts=2), 1.6e-2)


ENGINE_STEP = textwrap.dedent(
    """
    import json
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from slime_gb10.grpo.engines.torch.static_decoder import StaticDecoder, fuse_projections

    def decode(device, dtype, fused_step, qkv_splits=1):
        torch.manual_seed(0)
        config = Qwen2Config(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             intermediate_size=96, vocab_size=101, max_position_embeddings=64)
        model = Qwen2ForCausalLM(config).to(device=device, dtype=dtype).eval()
        fuse_projections(model)
        batch, width, cache_len = 3, 5, 16
        decoder = StaticDecoder(model, batch, cache_len)
        decoder.decode_kernel, decoder.fused_step = True, fused_step  # off a GPU, under the interpreter
        decoder.qkv_splits = qkv_splits  # the kernel sums the q/k/v projection's partial products
        gen = torch.Generator().manual_seed(1)
        ids = torch.randint(0, 101, (batch, width), generator=gen).to(device)
        valid = torch.ones(batch, width, dtype=torch.bool, device=device)
        valid[0, :2] = False  # a left-padded row
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        causal = torch.tril(torch.ones(width, width, dtype=torch.bool, device=device))
        mask = ((causal[None] & valid[:, None, :]) | torch.eye(width, dtype=torch.bool, device=device)[None])[:, None]
        step_logits = []
        with torch.no_grad():
            logits = decoder.forward(ids, positions, torch.arange(width, device=device), mask)
            step_mask = torch.zeros(batch, 1, 1, cache_len, dtype=torch.bool, device=device)
            step_mask[:, 0, 0, :width] = valid
            position = valid.long().sum(-1, keepdim=True)
            for step in range(3):
                slot = width + step
                step_mask[:, 0, 0, slot] = True
                token = logits.argmax(-1, keepdim=True)
                logits = decoder.forward(token, position + step, torch.tensor([slot], device=device),
                                         step_mask[..., : slot + 1])
                step_logits.append(logits.double().cpu())
        return torch.stack(step_logits), torch.stack(decoder.keys).double().cpu(), torch.stack(decoder.values).double().cpu()

    def compare(device, dtype, qkv_splits=1):
        fused, plain = decode(device, dtype, True, qkv_splits), decode(device, dtype, False)
        return {name: float((a - b).abs().max() / b.abs().max()) for name, a, b in zip(("logits", "keys", "values"), fused, plain)}
    """
)


@pytest.mark.slow
def test_the_static_decoders_fused_step_decodes_like_its_separate_ops_under_the_interpreter(
    triton_interpreter,
):
    """Qwen2 (fused q/k/v with bias), FP32, a left-padded row, three one-token steps: logits and
    the whole KV cache after them as with the rotary, cache writes and attention as separate ops."""
    script = (
        ENGINE_STEP + "\nprint(json.dumps([compare('cpu', torch.float32, splits) for splits in (1, 2)]))\n"
    )
    for errors in triton_interpreter(script):
        assert all(error < 1e-5 for error in errors.values()), errors


@pytest.mark.gpu
def test_the_static_decoders_fused_step_decodes_like_its_separate_ops_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    namespace: dict = {}
    exec(ENGINE_STEP, namespace)
    for splits in (1, 2):
        errors = namespace["compare"]("cuda", torch.float32, splits)
        assert all(error < 1e-5 for error in errors.values()), errors
        errors = namespace["compare"]("cuda", torch.bfloat16, splits)
        assert all(error < 2e-2 for error in errors.values()), errors  # GRAPH_REPLAY_TOLERANCE's BF16 limit
