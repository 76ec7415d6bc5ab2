"""The Triton sampler (``engines/torch/sampling_kernel.py``) against its torch twin (``sample_next_token``
on a CPU tensor, where the twin runs), token for token and logprob within FP32 rounding.

Random shapes: ragged vocabularies (a partial last block, fewer blocks than a power of two, one
block), rows whose tail or every other token has probability 0, uniforms at 0 and at 1 - 2^-53,
BF16 and FP32 logits, temperatures other than 1, a row stride wider than the vocabulary. On the CPU
the kernel runs under ``TRITON_INTERPRET=1`` (a subprocess: Triton reads it when kernels are
defined); the GPU test runs it compiled, on shape B's vocabulary too.
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
    from slime_gb10.grpo.engines.torch.sampling import row_uniforms, sample_next_token
    from slime_gb10.grpo.engines.torch.sampling_kernel import sample_rows
    from slime_gb10.grpo.interfaces import SamplingParams

    def compare(device, shapes):
        gen = torch.Generator().manual_seed(7)
        report = []
        for vocab, rows, temperature, dtype in shapes:
            wide = torch.randn(rows, vocab + 5, generator=gen) * 4
            wide[: rows // 4, vocab // 3 :] = float("-inf")  # the tail of the vocabulary impossible
            wide[rows // 4 : rows // 2, ::2] = float("-inf")  # every other token impossible
            logits = wide[:, :vocab].to(dtype)  # row stride vocab + 5
            u = row_uniforms(torch.arange(rows) + 1000 * vocab, 5)
            u[:3] = torch.tensor([0.0, 1 - 2.0**-53, 0.5], dtype=torch.float64)
            params = SamplingParams(temperature=temperature)
            want_tokens, want_logprobs = sample_next_token(logits, params, uniforms=u)
            got_tokens, got_logprobs = sample_rows(logits.to(device), u, temperature)
            got_tokens, got_logprobs = got_tokens.cpu(), got_logprobs.cpu()
            possible = torch.isfinite(logits.float().gather(1, got_tokens[:, None])).all()
            report.append({
                "shape": [vocab, rows, temperature, str(dtype)],
                "same_tokens": int((got_tokens == want_tokens).sum()), "rows": rows,
                "possible": bool(possible),
                "logprob_error": float((got_logprobs - want_logprobs).abs().max()),
            })
        return report
    """
)


def _check(report: list[dict]) -> None:
    for case in report:
        assert case["possible"], case  # never a token of probability 0
        assert case["same_tokens"] == case["rows"], case
        assert case["logprob_error"] < 1e-4, case


@pytest.mark.slow
def test_the_triton_sampler_is_the_torch_sampler_under_the_interpreter(triton_interpreter):
    shapes = [
        (50, 9, 1.0, "torch.float32"),
        (4096, 8, 0.7, "torch.bfloat16"),  # exactly one block
        (9000, 8, 1.3, "torch.bfloat16"),  # three blocks (four in registers), a partial last one
        (20000, 4, 1.0, "torch.float32"),
    ]
    script = CASES + textwrap.dedent(
        f"""
        shapes = [(v, r, t, eval(d)) for v, r, t, d in {shapes!r}]
        print(json.dumps(compare("cpu", shapes)))
        """
    )
    _check(triton_interpreter(script))


@pytest.mark.gpu
def test_the_triton_sampler_is_the_torch_sampler_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    namespace: dict = {}
    exec(CASES, namespace)  # the same comparison, the kernel compiled for this GPU
    shapes = [
        (49152, 160, 1.0, torch.bfloat16),  # shape B's decode batch and vocabulary
        (151936, 16, 0.8, torch.bfloat16),  # Qwen's vocabulary: 38 blocks, 64 in registers
        (50, 9, 1.0, torch.float32),
        (9000, 64, 1.3, torch.float32),
    ]
    _check(namespace["compare"]("cuda", shapes))


@pytest.mark.gpu
def test_the_engine_samples_with_the_kernel_on_gpu():
    """``sample_next_token`` on CUDA logits takes the kernel and keeps the distribution."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from slime_gb10.grpo.engines.torch import sampling_kernel
    from slime_gb10.grpo.engines.torch.sampling import sample_next_token
    from slime_gb10.grpo.interfaces import SamplingParams

    probs = torch.tensor([0.1, 0.2, 0.7])
    logits = probs.log().expand(40000, 3).contiguous().cuda()
    params = SamplingParams(temperature=1.0)
    assert sampling_kernel.applies(logits, params)
    assert not sampling_kernel.applies(logits, SamplingParams(temperature=1.0, top_k=2))
    tokens, logprobs = sample_next_token(logits, params, torch.arange(40000, device="cuda") + 123)
    freq = torch.bincount(tokens.cpu(), minlength=3).double() / tokens.numel()
    torch.testing.assert_close(freq, probs.double(), atol=0.01, rtol=0)  # 4 sigma < 0.01
    torch.testing.assert_close(logprobs.cpu(), probs.log()[tokens.cpu()], atol=1e-6, rtol=0)
