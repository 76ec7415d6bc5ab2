"""The torch engine decoding from NVFP4 codes (rollout.weights=nvfp4, issue #39): what a sync
delivers, where the codes are multiplied, and (GPU) that the W4A16 kernel is inside the CUDA graph."""

from __future__ import annotations

import pytest
import torch

from slime_gb10.grpo.backends.torch_backend import TorchPolicyBackend
from slime_gb10.grpo.config import TrainConfig
from slime_gb10.grpo.engines.torch.engine import TorchRolloutEngine
from slime_gb10.grpo.engines.torch.static_decoder import DECODE_WEIGHT
from slime_gb10.grpo.interfaces import SamplingParams
from slime_gb10.grpo.models import load_causal_lm, write_random_model
from slime_gb10.grpo.weight_sync import WeightSyncError
from slime_gb10.nvfp4.format import dequantize_reference, quantize_reference
from slime_gb10.nvfp4.w4a16 import w4a16_scale_codes

FP4_MAX, E4M3_MAX = 6.0, 448.0  # NVFP4's global scale: amax / (6 * 448) (NVIDIA's format)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tokenizer):
    # K = 128 and N a multiple of 64 wherever it can be: shapes every W4A16 kernel tiles on a GPU
    return write_random_model(
        tmp_path_factory.mktemp("e") / "model",
        tokenizer,
        seed=0,
        initializer_range=0.3,
        hidden_size=128,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=256,
    )


def nvfp4_engine(tiny_dir, tokenizer, device, dtype, **kwargs):
    model = load_causal_lm(tiny_dir, dtype=dtype).to(device)
    decode = "static" if device == "cpu" else "cuda_graph"
    return TorchRolloutEngine(
        model, tokenizer, device, eos_token_ids=[], decode=decode, weights="nvfp4", **kwargs
    )


def test_the_engine_receives_the_trainers_codes_exactly(tiny_dir, tokenizer, nvfp4_trainer):
    backend, trained = nvfp4_trainer(tiny_dir, tokenizer, "cpu", torch.float32)
    engine = nvfp4_engine(tiny_dir, tokenizer, "cpu", torch.float32)
    engine.update_weights(backend.export_weights(1 << 16, nvfp4_codes=True))  # several buckets
    attn = "model.layers.1.self_attn"
    qkv = [trained[f"{attn}.{p}_proj.weight"] for p in "qkv"]
    shared = torch.stack([w.abs().amax() for w in qkv]).max() / (FP4_MAX * E4M3_MAX)  # by hand
    for p, w in zip("qkv", qkv, strict=True):
        expected = quantize_reference(w, shared)
        got = engine.codes.weights[f"{attn}.{p}_proj.weight"]
        assert torch.equal(got.data, expected.data)
        assert torch.equal(got.scale.view(torch.uint8), expected.scale.view(torch.uint8))
        assert float(got.global_scale) == float(shared)
        assert torch.equal(got.scale_codes, w4a16_scale_codes(expected.scale))
        # the BF16 (here FP32) parameter the prefill multiplies by: the same codes' values
        param = engine._params[f"{attn}.{p}_proj.weight"]
        assert torch.equal(param, dequantize_reference(expected, torch.float32))
    # the decode step's fused q/k/v buffer is the three, stacked (its rows are what the siblings view)
    whole = getattr(engine.model.model.layers[1].self_attn, DECODE_WEIGHT)
    expected_rows = torch.cat([quantize_reference(w, shared).data for w in qkv])
    assert torch.equal(whole.data, expected_rows)
    down = trained["model.layers.0.mlp.down_proj.weight"]  # alone: its own amax
    got = getattr(engine.model.model.layers[0].mlp.down_proj, DECODE_WEIGHT)
    assert torch.equal(got.data, quantize_reference(down).data)
    # embeddings, norms and the (tied) head travel as they are
    assert torch.equal(engine._params["model.norm.weight"], trained["model.norm.weight"])


def test_a_dense_stream_is_refused_by_an_engine_that_decodes_codes(tiny_dir, tokenizer, nvfp4_trainer):
    backend, _ = nvfp4_trainer(tiny_dir, tokenizer, "cpu", torch.float32)
    engine = nvfp4_engine(tiny_dir, tokenizer, "cpu", torch.float32)
    before = {n: p.clone() for n, p in engine._params.items()}
    codes_before = {n: w.data.clone() for n, w in engine.codes.weights.items()}
    with pytest.raises(WeightSyncError, match=r"refused before writing anything.*nvfp4_codes=True"):
        engine.update_weights(backend.export_weights(1 << 20, nvfp4_codes=False))
    assert all(torch.equal(before[n], p) for n, p in engine._params.items())
    assert all(torch.equal(codes_before[n], w.data) for n, w in engine.codes.weights.items())
    assert engine.broken_sync is None  # refused before writing: the engine still generates
    dense = TorchRolloutEngine(
        load_causal_lm(tiny_dir, dtype=torch.float32), tokenizer, "cpu", eos_token_ids=[]
    )
    with pytest.raises(WeightSyncError, match=r"refused before writing anything.*weights=.nvfp4."):
        dense.update_weights(backend.export_weights(1 << 20, nvfp4_codes=True))


@pytest.mark.parametrize("device", DEVICES)
def test_decode_steps_multiply_the_codes_and_the_prefill_the_bf16_values(
    tiny_dir, tokenizer, device, nvfp4_trainer
):
    """Zeroing one layer's codes after a sync leaves the first token (from the prefill, which
    multiplies the BF16 values) as it was and moves every later token's logprob (the one-token
    steps multiply the codes). On a GPU the second call replays the CUDA graphs the first captured,
    so the W4A16 kernel reads the codes buffers inside the graph."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    backend, _ = nvfp4_trainer(tiny_dir, tokenizer, device, dtype)
    engine = nvfp4_engine(tiny_dir, tokenizer, device, dtype)
    engine.update_weights(backend.export_weights(1 << 20, nvfp4_codes=True))
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8, 9, 10]]
    forced = SamplingParams(max_new_tokens=6, temperature=0.0)
    before = engine.generate(prompts, forced)
    if device == "cuda":
        assert engine.decode == "cuda_graph" and engine.graph_fallback is None
        assert engine._graphs, "no decode step was captured"
        # compiled with the op inside (a traced kernel choice once loaded NVRTC under dynamo, and
        # the engine fell back to the uncompiled step: half the speed on shape B)
        assert engine.compile_decode
    getattr(engine.model.model.layers[0].mlp.down_proj, DECODE_WEIGHT).data.zero_()
    after = engine.generate(prompts, forced)
    for b, a in zip(before, after, strict=True):
        assert a.completion_ids[0] == b.completion_ids[0]
        assert a.completion_logprobs[0] == pytest.approx(b.completion_logprobs[0], abs=1e-6)
        moved = [
            abs(x - y) for x, y in zip(a.completion_logprobs[1:], b.completion_logprobs[1:], strict=False)
        ]
        assert a.completion_ids != b.completion_ids or max(moved) > 1e-3, (moved, a.completion_ids)


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
@pytest.mark.parametrize("mixed", [False, True])
def test_decoding_from_codes_is_the_nvfp4_policy(
    tiny_dir, tokenizer, tmp_path, model_type, mixed, monkeypatch, nvfp4_trainer
):
    """The engine's sampled logprobs against a plain HF forward (FP32) of the model holding the
    round-tripped weights, within 1e-4: Llama, and Qwen2 with its q/k/v biases (the trained model's
    are non-zero); ``mixed``: only the o and down projections on codes, the rest BF16 in the same
    step, as at M = 17..64 on a GPU (decode_pays monkeypatched: on a CPU every layer takes codes)."""
    from slime_gb10.grpo.engines.torch import static_decoder
    from slime_gb10.grpo.quantized import rollout_weights

    model_dir = tiny_dir
    if model_type == "qwen2":
        model_dir = write_random_model(tmp_path / "qwen2", tokenizer, seed=1, initializer_range=0.3,
                                       model_type="qwen2", hidden_size=128, intermediate_size=256)  # fmt: skip
    if mixed:
        hidden = load_causal_lm(model_dir).config.hidden_size
        monkeypatch.setattr(
            static_decoder, "decode_pays", lambda w, rows, dtype, device: w.shape[0] == hidden
        )
    backend, trained = nvfp4_trainer(model_dir, tokenizer, "cpu", torch.float32)
    engine = nvfp4_engine(model_dir, tokenizer, "cpu", torch.float32)
    decoder_codes = [
        c
        for layer in engine.model.model.layers
        for c in static_decoder.layer_codes(layer, 2, torch.float32, "cpu")
    ]
    assert sum(c is None for c in decoder_codes) == (len(decoder_codes) // 2 if mixed else 0)
    engine.update_weights(backend.export_weights(1 << 20, nvfp4_codes=True))
    if model_type == "qwen2":
        assert trained["model.layers.0.self_attn.q_proj.bias"].abs().max() > 0
    reference = load_causal_lm(model_dir, dtype=torch.float32)
    reference.load_state_dict(trained, strict=False)  # the global scales come from the model's weights
    reference.load_state_dict(dict(rollout_weights(reference, trained.items(), torch.float32)), strict=False)
    for g in engine.generate([[1, 2, 3, 4], [5, 6, 7, 8, 9, 10]], SamplingParams(max_new_tokens=10, seed=5)):
        ids = torch.tensor([g.prompt_ids + g.completion_ids])
        with torch.no_grad():
            logits = reference(ids).logits[0, len(g.prompt_ids) - 1 : -1]
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(g.completion_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(g.completion_logprobs), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("fault", ["a NaN block scale", "siblings with two global scales"])
def test_a_sync_whose_codes_are_wrong_is_refused_and_the_engine_stops_generating(
    tiny_dir, tokenizer, fault, nvfp4_trainer
):
    """The values the metadata cannot show are checked once the stream is in (one host sync): a
    non-finite block scale, or fused siblings (q/k/v) sent with different weight_scale_2. Those
    tensors are already written then, so the engine refuses to generate until a good sync."""
    from slime_gb10.grpo.weight_sync import WeightStream

    backend, _ = nvfp4_trainer(tiny_dir, tokenizer, "cpu", torch.float32)
    engine = nvfp4_engine(tiny_dir, tokenizer, "cpu", torch.float32)
    good = backend.export_weights(1 << 20, nvfp4_codes=True)
    tensors = {name: t.clone() for bucket in good for name, t in _unpacked(bucket)}
    if fault == "a NaN block scale":
        tensors["model.layers.0.mlp.down_proj.weight_scale"].view(torch.uint8)[0, 0] = 0x7F  # E4M3 NaN
    else:
        tensors["model.layers.1.self_attn.k_proj.weight_scale_2"] *= 2
    bad = WeightStream(lambda: tensors.items(), bucket_bytes=1 << 20, transfer_dtype=None)
    with pytest.raises(WeightSyncError, match="block scale is negative or not finite, or the siblings"):
        engine.update_weights(bad)
    with pytest.raises(RuntimeError, match="sync again before generating"):
        engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2))
    engine.update_weights(backend.export_weights(1 << 20, nvfp4_codes=True))  # a good sync mends it
    assert len(engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2))[0].completion_ids) == 2


def _unpacked(bucket):
    from slime_gb10.grpo.weight_sync import unpack_bucket

    return unpack_bucket(bucket)


def test_the_w4a16_op_traces_and_its_fake_agrees():
    """The custom op as torch.compile sees it: opcheck (fake tensor, AOT dispatch) and a
    fullgraph compile (aot_eager, no C++ toolchain needed) that equals the eager call."""
    from slime_gb10.nvfp4.decode_weights import DecodeWeight, _w4a16_linear, decode_linear
    from slime_gb10.nvfp4.ops import quantize

    torch.manual_seed(0)
    weight = DecodeWeight((48, 64), torch.device("cpu"))
    q = quantize(torch.randn(48, 64))
    (
        weight.data.copy_(q.data),
        weight.scale.copy_(q.scale),
        weight.global_scale.copy_(q.global_scale.reshape(1)),
    )
    weight.refresh()
    x, bias = torch.randn(3, 1, 64), torch.randn(48)
    args = (x, weight.data, weight.scale, weight.scale_codes, weight.global_scale, bias)
    # test_schema is left out: it perturbs every input, and torch has no CPU multiply for float8
    torch.library.opcheck(_w4a16_linear, args, test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))
    compiled = torch.compile(decode_linear, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, weight, bias), decode_linear(x, weight, bias), atol=0, rtol=0)
    expected = x @ dequantize_reference(q, torch.float32).T + bias
    torch.testing.assert_close(decode_linear(x, weight, bias), expected, atol=1e-5, rtol=1e-5)


def test_a_model_with_nothing_to_quantize_syncs_dense_and_a_bf16_backend_refuses_codes(
    tmp_path, tokenizer, nvfp4_trainer
):
    """Widths that are not multiples of 16 (24 here): no layer is quantized, so the engine takes the
    dense stream the trainer sends; and a backend built for BF16 rollouts is never asked for codes
    silently (the engine and it would disagree on rollout.weights)."""
    model_dir = write_random_model(tmp_path / "m", tokenizer, hidden_size=24, num_heads=2, num_kv_heads=1,
                                   intermediate_size=40)  # fmt: skip
    backend, _ = nvfp4_trainer(model_dir, tokenizer, "cpu", torch.float32)
    engine = nvfp4_engine(model_dir, tokenizer, "cpu", torch.float32)
    assert engine.codes is None and not engine.receives_nvfp4_codes
    engine.update_weights(backend.export_weights(1 << 20, nvfp4_codes=engine.receives_nvfp4_codes))
    bf16 = TorchPolicyBackend(
        load_causal_lm(model_dir, dtype=torch.float32), tokenizer, "cpu", train=TrainConfig()
    )
    with pytest.raises(ValueError, match=r"disagree on rollout\.weights"):
        bf16.export_weights(1 << 20, nvfp4_codes=True)
