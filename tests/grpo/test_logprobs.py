"""Chunked logprobs/entropy against the naive float64 reference: values, gradients, memory bound."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from slime_gb10.grpo.logprobs import chunked_logprobs_entropy, sequence_logprobs_entropy


def naive_logprobs_entropy(hidden, lm_head_weight, targets, *, temperature=1.0, lm_head_bias=None):
    """The reference: full ``[N, V]`` logits, ``log_softmax``, gather, ``-sum p log p`` (O(N*V) memory),
    after the matmul in float32 (float64 for float64 input), as the chunked kernel promises."""
    acc = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    logits = F.linear(hidden, lm_head_weight, lm_head_bias).to(acc) / temperature
    logp = torch.log_softmax(logits, dim=-1)
    token_logp = logp.gather(1, targets.long()[:, None]).squeeze(1)
    return token_logp, -(logp.exp() * logp).sum(dim=-1)


def make_inputs(n, h, v, dtype=torch.float64, seed=0, scale=1.0, bias=False):
    g = torch.Generator().manual_seed(seed)
    hidden = (scale * torch.randn(n, h, generator=g, dtype=torch.float64)).to(dtype).requires_grad_()
    weight = torch.randn(v, h, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    b = torch.randn(v, generator=g, dtype=torch.float64).to(dtype).requires_grad_() if bias else None
    targets = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, b, targets


# --- values and gradients in float64 ---------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "h", "v", "chunk", "token_chunk", "temperature", "bias"),
    [
        (37, 16, 1000, 128, 16, 1.0, False),  # V not a multiple of the chunk, N not of the token chunk
        (5, 8, 301, 64, 4096, 0.7, True),
        (64, 4, 97, 4096, 7, 1.3, False),  # one vocab chunk, many token blocks
        (3, 6, 50, 1, 1, 1.0, True),  # degenerate chunks of one
    ],
)
def test_matches_naive_float64(n, h, v, chunk, token_chunk, temperature, bias):
    hidden, weight, b, targets = make_inputs(n, h, v, bias=bias, seed=n)
    lp, ent = chunked_logprobs_entropy(
        hidden,
        weight,
        targets,
        temperature=temperature,
        chunk_size=chunk,
        token_chunk_size=token_chunk,
        lm_head_bias=b,
    )
    ref_lp, ref_ent = naive_logprobs_entropy(hidden, weight, targets, temperature=temperature, lm_head_bias=b)
    assert lp.dtype == torch.float64 and ent.dtype == torch.float64
    torch.testing.assert_close(lp, ref_lp, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-10, atol=1e-10)

    _assert_same_gradients((lp, ent), (ref_lp, ref_ent), [hidden, weight, b], seed=1)


def _assert_same_gradients(ours, reference, inputs, *, seed, outputs="both"):
    """The gradients w.r.t. ``inputs`` (None skipped) of a random combination of the logprobs and/or
    entropy (``outputs``) equal the reference's to float64 precision."""
    n = ours[0].shape[0]
    g = torch.Generator().manual_seed(seed)
    weights = (
        torch.randn(n, generator=g, dtype=torch.float64),
        torch.randn(n, generator=g, dtype=torch.float64),
    )
    used = {"both": (0, 1), "logprobs": (0,), "entropy": (1,)}[outputs]
    inputs = [t for t in inputs if t is not None]

    def combined(values):
        return sum((weights[i] * values[i]).sum() for i in used)

    got = torch.autograd.grad(combined(ours), inputs)
    want = torch.autograd.grad(combined(reference), inputs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize(
    ("n", "h", "v", "chunk", "token_chunk", "temperature", "bias", "outputs"),
    [
        (37, 16, 1000, 128, 16, 1.0, False, "both"),
        (5, 8, 301, 64, 4096, 0.7, True, "both"),
        (21, 8, 301, 64, 8, 1.0, True, "logprobs"),  # no entropy gradient
        (21, 8, 301, 64, 8, 1.3, False, "entropy"),  # no logprob gradient
    ],
)
def test_compiled_blocks_match_naive_float64(n, h, v, chunk, token_chunk, temperature, bias, outputs):
    """Each block's arithmetic through ``torch.compile`` (``aot_eager``: Dynamo's and AOTAutograd's
    tracing without code generation, which needs no C++ toolchain here; inductor is the GPU test's)
    gives the float64 reference's values and gradients, ragged last blocks and all."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    hidden, weight, b, targets = make_inputs(n, h, v, bias=bias, seed=n + 1)
    options = dict(temperature=temperature, chunk_size=chunk, token_chunk_size=token_chunk, lm_head_bias=b)
    lp, ent = chunked_logprobs_entropy(hidden, weight, targets, compile_backend="aot_eager", **options)
    ref_lp, ref_ent = naive_logprobs_entropy(hidden, weight, targets, temperature=temperature, lm_head_bias=b)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-10, atol=1e-10)
    _assert_same_gradients((lp, ent), (ref_lp, ref_ent), [hidden, weight, b], seed=2, outputs=outputs)
    assert counters["stats"]["unique_graphs"] >= 2  # the statistics and the gradient were traced
    torch._dynamo.reset()


def test_gradcheck_float64():
    hidden, weight, b, targets = make_inputs(6, 4, 11, bias=True, seed=3)

    def fn(hid, w, bias):
        return chunked_logprobs_entropy(
            hid, w, targets, temperature=0.8, chunk_size=4, token_chunk_size=4, lm_head_bias=bias
        )

    assert torch.autograd.gradcheck(fn, (hidden, weight, b), eps=1e-6, atol=1e-8)


def test_gradcheck_logprobs_only():
    hidden, weight, _, targets = make_inputs(4, 3, 9, seed=4)
    fn = lambda hid, w: chunked_logprobs_entropy(hid, w, targets, chunk_size=2, with_entropy=False)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (hidden, weight), eps=1e-6, atol=1e-8)
    _, ent = chunked_logprobs_entropy(hidden, weight, targets, with_entropy=False)
    assert ent is None


def test_large_logits_are_stable():
    # logits ~ +-1e3: exp would overflow without the running max
    hidden, weight, _, targets = make_inputs(16, 8, 500, scale=300.0, seed=5)
    lp, ent = chunked_logprobs_entropy(hidden, weight, targets, chunk_size=64)
    ref_lp, ref_ent = naive_logprobs_entropy(hidden, weight, targets)
    assert torch.isfinite(lp).all() and torch.isfinite(ent).all()
    torch.testing.assert_close(lp, ref_lp, rtol=1e-9, atol=1e-7)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-6, atol=1e-7)
    assert (ent >= -1e-9).all()


def test_uniform_distribution_entropy_is_log_v():
    # zero weights: every logit 0, p uniform: log p = -log V, H = log V (hand-derived)
    v = 1000
    hidden = torch.randn(3, 4, dtype=torch.float64)
    lp, ent = chunked_logprobs_entropy(
        hidden, torch.zeros(v, 4, dtype=torch.float64), torch.tensor([0, 5, 999]), chunk_size=128
    )
    log_v = torch.log(torch.tensor(float(v), dtype=torch.float64))
    torch.testing.assert_close(lp, -log_v.expand(3))
    torch.testing.assert_close(ent, log_v.expand(3))


# --- lower precision -------------------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_low_precision_close_to_naive_same_dtype(dtype, tol):
    hidden, weight, _, targets = make_inputs(40, 32, 777, dtype=dtype, seed=6)
    lp, ent = chunked_logprobs_entropy(hidden, weight, targets, chunk_size=100, token_chunk_size=16)
    ref_lp, ref_ent = naive_logprobs_entropy(hidden, weight, targets)
    assert lp.dtype == torch.float32 and ent.dtype == torch.float32
    torch.testing.assert_close(lp, ref_lp, rtol=tol, atol=tol)
    torch.testing.assert_close(ent, ref_ent, rtol=tol, atol=tol)
    (lp.sum() + ent.sum()).backward()
    gh, gw = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    (ref_lp.sum() + ref_ent.sum()).backward()
    assert gh.dtype == dtype and gw.dtype == dtype
    torch.testing.assert_close(gh.float(), hidden.grad.float(), rtol=5 * tol, atol=5 * tol)
    torch.testing.assert_close(gw.float(), weight.grad.float(), rtol=5 * tol, atol=5 * tol)


def test_mixed_dtypes_promote_bf16_activations_fp32_weights():
    # bf16 activations with fp32 master weights, no autocast: the matmul runs in fp32 (promotion),
    # each gradient comes back in its input's dtype
    hidden, weight, _, targets = make_inputs(24, 16, 300, dtype=torch.float32, seed=9)
    h_bf16 = hidden.detach().bfloat16().requires_grad_()
    lp, ent = chunked_logprobs_entropy(h_bf16, weight, targets, chunk_size=64, token_chunk_size=10)
    h_ref = h_bf16.detach().float().requires_grad_()
    ref_lp, ref_ent = naive_logprobs_entropy(h_ref, weight, targets)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)
    (lp.sum() + ent.sum()).backward()
    gw = weight.grad.clone()
    weight.grad = None
    (ref_lp.sum() + ref_ent.sum()).backward()
    assert h_bf16.grad.dtype == torch.bfloat16 and gw.dtype == torch.float32
    torch.testing.assert_close(h_bf16.grad, h_ref.grad.bfloat16())
    torch.testing.assert_close(gw, weight.grad, rtol=1e-5, atol=1e-5)


def test_inside_autocast_matches_autocast_linear():
    # fp32 model under torch.autocast(bf16), as the torch backend runs it: the logits matmul runs
    # in bf16 like an autocast nn.Linear LM head; backward (outside autocast) still works
    hidden, weight, _, targets = make_inputs(24, 16, 300, dtype=torch.float32, seed=10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, ent = chunked_logprobs_entropy(hidden, weight, targets, chunk_size=64)
        ref_lp, ref_ent = naive_logprobs_entropy(hidden, weight, targets)
    assert lp.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        exact_lp, _ = naive_logprobs_entropy(hidden, weight, targets)
    torch.testing.assert_close(lp, ref_lp, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(ent, ref_ent, rtol=2e-2, atol=2e-2)
    assert not torch.allclose(lp, exact_lp, rtol=1e-6, atol=1e-6)  # really computed in bf16
    (lp.sum() + ent.sum()).backward()
    gh, gw = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    (ref_lp.sum() + ref_ent.sum()).backward()
    assert gh.dtype == torch.float32 and gw.dtype == torch.float32
    torch.testing.assert_close(gh, hidden.grad, rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(gw, weight.grad, rtol=5e-2, atol=5e-2)


# --- memory bound ----------------------------------------------------------------------------


class LargestOutput(TorchDispatchMode):
    """Records the element count of every tensor produced by any ATen op run under it."""

    def __init__(self):
        super().__init__()
        self.largest = 0
        self.op = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.numel() > self.largest:
                self.largest, self.op = t.numel(), str(func)
        return out


def test_no_tokens_by_vocab_tensor_is_allocated():
    n, h, v, chunk, token_chunk = 64, 16, 1000, 128, 32
    hidden, weight, _, targets = make_inputs(n, h, v, dtype=torch.float32, seed=7)
    # Unavoidable outputs: grad of the weight [V, H] and of hidden [N, H]; the chunk temporaries
    # are [token_chunk, chunk]. All far below N * V = 64,000.
    bound = max(v * h, n * h, token_chunk * chunk)
    assert bound < n * v

    with LargestOutput() as fwd_bwd:
        lp, ent = chunked_logprobs_entropy(
            hidden, weight, targets, chunk_size=chunk, token_chunk_size=token_chunk
        )
        (lp.sum() + ent.sum()).backward()
    assert fwd_bwd.largest <= bound, (fwd_bwd.largest, fwd_bwd.op)

    # The instrument can fail: the naive path materialises [N, V] in the forward ...
    with LargestOutput() as naive_fwd:
        ref_lp, ref_ent = naive_logprobs_entropy(hidden, weight, targets)
    assert naive_fwd.largest >= n * v
    # ... and in the backward (so ops inside backward are seen too)
    with LargestOutput() as naive_bwd:
        (ref_lp.sum() + ref_ent.sum()).backward()
    assert naive_bwd.largest >= n * v


# --- sequences -------------------------------------------------------------------------------


def test_sequence_logprobs_shift_and_mask():
    torch.manual_seed(8)
    b, t, h, v = 3, 7, 8, 50
    hidden = torch.randn(b, t, h, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(v, h, dtype=torch.float64)
    input_ids = torch.randint(0, v, (b, t))
    mask = torch.zeros(b, t)
    mask[0, 3:] = 1
    mask[1, 2:5] = 1
    mask[2, 6] = 1
    lp, ent = sequence_logprobs_entropy(hidden, weight, input_ids, mask, chunk_size=16, temperature=0.9)
    assert lp.shape == (b, t) and ent.shape == (b, t)
    full_logp = torch.log_softmax(hidden @ weight.T / 0.9, dim=-1)
    for i in range(b):
        for j in range(t):
            if j >= 1 and mask[i, j]:
                torch.testing.assert_close(lp[i, j], full_logp[i, j - 1, input_ids[i, j]])
                p = full_logp[i, j - 1].exp()
                torch.testing.assert_close(ent[i, j], -(p * full_logp[i, j - 1]).sum())
            else:
                assert lp[i, j] == 0 and ent[i, j] == 0
    lp.sum().backward()
    used = torch.zeros(b, t, dtype=torch.bool)
    used[:, :-1] = mask[:, 1:].bool()
    assert (hidden.grad[~used] == 0).all()
    assert (hidden.grad[used].abs().sum(-1) > 0).all()


def test_real_tiny_llama_matches_model_logits():
    """A real transformers Llama (tiny config, tied embeddings): logprobs from its last hidden
    state and LM head equal log_softmax of the model's own logits."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).double()
    input_ids = torch.randint(0, 300, (2, 9))
    out = model(input_ids, output_hidden_states=True)
    mask = torch.ones(2, 9)
    mask[:, :4] = 0
    lp, _ = sequence_logprobs_entropy(
        out.hidden_states[-1], model.lm_head.weight, input_ids, mask, chunk_size=64, with_entropy=False
    )
    ref = torch.log_softmax(out.logits[:, :-1], dim=-1).gather(2, input_ids[:, 1:, None]).squeeze(2)
    torch.testing.assert_close(lp[:, 4:], ref[:, 3:])
    lp.sum().backward()
    assert model.model.embed_tokens.weight.grad is not None  # tied LM head gets its gradient


# --- errors ----------------------------------------------------------------------------------


def test_errors():
    hidden, weight, _, targets = make_inputs(4, 3, 9)
    with pytest.raises(ValueError, match=r"token ids in \[0, 9\)"):
        chunked_logprobs_entropy(hidden, weight, torch.tensor([0, 1, 2, 9]))
    with pytest.raises(ValueError, match="temperature"):
        chunked_logprobs_entropy(hidden, weight, targets, temperature=0.0)
    with pytest.raises(ValueError, match=r"must be \[N, H\]"):
        chunked_logprobs_entropy(hidden, weight[:, :2], targets)
    with pytest.raises(ValueError, match="targets"):
        chunked_logprobs_entropy(hidden, weight, targets[:2])
    empty_lp, empty_ent = chunked_logprobs_entropy(hidden[:0], weight, targets[:0])
    assert empty_lp.shape == (0,) and empty_ent.shape == (0,)


# --- properties ------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 20),
    st.integers(1, 6),
    st.integers(2, 90),
    st.integers(1, 40),
    st.integers(1, 25),
    st.floats(0.3, 2.0),
    st.integers(0, 2**16),
)
def test_random_shapes_match_naive(n, h, v, chunk, token_chunk, temperature, seed):
    hidden, weight, b, targets = make_inputs(n, h, v, seed=seed, bias=seed % 2 == 0)
    lp, ent = chunked_logprobs_entropy(
        hidden,
        weight,
        targets,
        temperature=temperature,
        chunk_size=chunk,
        token_chunk_size=token_chunk,
        lm_head_bias=b,
    )
    ref_lp, ref_ent = naive_logprobs_entropy(hidden, weight, targets, temperature=temperature, lm_head_bias=b)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-10, atol=1e-10)
    inputs = [hidden, weight] + ([b] if b is not None else [])
    ours = torch.autograd.grad(lp.sum() - 0.5 * ent.sum(), inputs)
    ref = torch.autograd.grad(ref_lp.sum() - 0.5 * ref_ent.sum(), inputs)
    for got, want in zip(ours, ref):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)


# --- CUDA (runs on GPU machines only; skipped here) ------------------------------------------


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12)).item()


@pytest.mark.gpu
@pytest.mark.parametrize("compile_backend", [None, "inductor"])
def test_cuda_qwen_vocab_matches_naive_with_bounded_peak_memory(compile_backend):
    """Qwen2.5-0.5B's LM head shape (V = 151,936, H = 896) in bf16 on 2,048 tokens: the chunked
    path (eager, and each block compiled by inductor as the torch backend runs it on a GPU) agrees
    with the naive one, and its peak extra memory (beyond the unavoidable [V, H] weight gradient)
    is far below one fp32 [N, V] logits tensor, which the naive path needs several of."""
    dev = torch.device("cuda")
    torch.manual_seed(0)
    n, h, v = 2048, 896, 151936
    hidden = (0.5 * torch.randn(n, h, device=dev)).bfloat16().requires_grad_()
    weight = (0.02 * torch.randn(v, h, device=dev)).bfloat16().requires_grad_()
    targets = torch.randint(0, v, (n,), device=dev)
    logits_fp32_bytes = n * v * 4
    weight_grad_bytes = v * h * 2

    def peak(fn):
        hidden.grad = weight.grad = None
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        out = fn()
        torch.cuda.synchronize(dev)
        return out, torch.cuda.max_memory_allocated(dev) - base

    def run(impl):
        lp, ent = impl()
        (lp.sum() + ent.sum()).backward()
        return lp.detach(), ent.detach(), hidden.grad.clone(), weight.grad.clone()

    ours, ours_peak = peak(
        lambda: run(
            lambda: chunked_logprobs_entropy(
                hidden,
                weight,
                targets,
                chunk_size=4096,
                token_chunk_size=1024,
                compile_backend=compile_backend,
            )
        )
    )
    ref, ref_peak = peak(lambda: run(lambda: naive_logprobs_entropy(hidden, weight, targets)))
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(ours[1], ref[1], rtol=1e-2, atol=1e-2)
    assert _rel_err(ours[2], ref[2]) < 2e-2
    assert _rel_err(ours[3], ref[3]) < 2e-2
    # the [V, H] weight gradient (counted twice in case autograd copies it instead of stealing it)
    # plus chunk temporaries; naive holds several fp32 [N, V] tensors at once
    assert ours_peak < 2 * weight_grad_bytes + 0.25 * logits_fp32_bytes, (ours_peak, ref_peak)
    assert ref_peak > 2 * logits_fp32_bytes, ref_peak
    assert ours_peak < ref_peak / 2, (ours_peak, ref_peak)


def test_lm_heads_that_are_not_a_plain_matmul_are_named():
    """Granite scales, Gemma 2 soft-caps, Cohere multiplies its logits: the chunked path would differ."""
    from transformers import Gemma2Config, GraniteConfig, LlamaConfig

    from slime_gb10.grpo.logprobs import unsupported_lm_head_features

    assert unsupported_lm_head_features(LlamaConfig()) == []
    assert unsupported_lm_head_features(GraniteConfig(logits_scaling=8.0)) == ["logits_scaling=8.0"]
    assert unsupported_lm_head_features(GraniteConfig(logits_scaling=1.0)) == []
    assert unsupported_lm_head_features(Gemma2Config(final_logit_softcapping=30.0)) == [
        "final_logit_softcapping=30.0"
    ]
