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


def trained_backend(tiny_dir, tokenizer, device, dtype):
    """A trainer whose weights moved away from the checkpoint (so the engine's own start, which is
    the checkpoint quantized, would not pass for a sync), and its FP32 weights."""
    trainer = load_causal_lm(tiny_dir, dtype=torch.float32)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(11)
        for param in trainer.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    trained = {name: p.detach().clone() for name, p in trainer.named_parameters()}
    backend = TorchPolicyBackend(
        trainer, tokenizer, device, train=TrainConfig(), rollout_weights="nvfp4", transfer_dtype=dtype
    )
    return backend, trained


def nvfp4_engine(tiny_dir, tokenizer, device, dtype, **kwargs):
    model = load_causal_lm(tiny_dir, dtype=dtype).to(device)
    decode = "static" if device == "cpu" else "cuda_graph"
    return TorchRolloutEngine(
        model, tokenizer, device, eos_token_ids=[], decode=decode, weights="nvfp4", **kwargs
    )


def test_the_engine_receives_the_trainers_codes_exactly(tiny_dir, tokenizer):
    backend, trained = trained_backend(tiny_dir, tokenizer, "cpu", torch.float32)
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


def test_a_dense_stream_is_refused_by_an_engine_that_decodes_codes(tiny_dir, tokenizer):
    backend, _ = trained_backend(tiny_dir, tokenizer, "cpu", torch.float32)
    engine = nvfp4_engine(tiny_dir, tokenizer, "cpu", torch.float32)
    before = {n: p.clone() for n, p in engine._params.items()}
    with pytest.raises(WeightSyncError, match=r"refused before writing anything.*nvfp4_codes=True"):
        engine.update_weights(backend.export_weights(1 << 20, nvfp4_codes=False))
    assert all(torch.equal(before[n], p) for n, p in engine._params.items())
    dense = TorchRolloutEngine(
        load_causal_lm(tiny_dir, dtype=torch.float32), tokenizer, "cpu", eos_token_ids=[]
    )
    with pytest.raises(WeightSyncError, match=r"refused before writing anything.*weights=.nvfp4."):
        dense.update_weights(backend.export_weights(1 << 20, nvfp4_codes=True))


@pytest.mark.parametrize("device", DEVICES)
def test_decode_steps_multiply_the_codes_and_the_prefill_the_bf16_values(tiny_dir, tokenizer, device):
    """Zeroing one layer's codes after a sync leaves the first token (from the prefill, which
    multiplies the BF16 values) as it was and moves every later token's logprob (the one-token
    steps multiply the codes). On a GPU the second call replays the CUDA graphs the first captured,
    so the W4A16 kernel reads the codes buffers inside the graph."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    backend, _ = trained_backend(tiny_dir, tokenizer, device, dtype)
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
