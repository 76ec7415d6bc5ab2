"""NVFP4 in the GRPO loop (issue #39) on a CPU: the sync quantizes exactly what the reference
quantizer gives (fused siblings sharing one scale, everything else untouched), QAT's forward is
dequantize(quantize(W)) with a straight-through gradient, and with both the rollout and the
trainer hold one policy, which the per-step mismatch metrics show against the run without QAT."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import yaml

from slime_gb10.grpo import rewards
from slime_gb10.grpo.config import build_config
from slime_gb10.grpo.models import load_causal_lm, write_random_model
from slime_gb10.grpo.quantized import apply_qat, rollout_weights
from slime_gb10.grpo.trainer import GRPOTrainer
from slime_gb10.nvfp4.format import dequantize_reference, quantize_reference

FP4_MAX, E4M3_MAX = 6.0, 448.0  # NVFP4's global scale: amax / (6 * 448) (NVIDIA's format)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tokenizer):
    return write_random_model(
        tmp_path_factory.mktemp("q") / "model", tokenizer, seed=0, initializer_range=0.3
    )


def test_the_sync_quantizes_the_decoder_layers_exactly_and_nothing_else(tiny_dir):
    model = load_causal_lm(tiny_dir, dtype=torch.float32)
    params = dict(model.named_parameters())
    got = dict(rollout_weights(model, ((n, p.detach()) for n, p in params.items()), torch.float32))
    attn = "model.layers.0.self_attn"
    qkv = [params[f"{attn}.{p}_proj.weight"] for p in "qkv"]
    shared = torch.stack([w.abs().amax() for w in qkv]).max() / (FP4_MAX * E4M3_MAX)
    for p, w in zip("qkv", qkv, strict=True):  # one scale for the fused siblings, by hand
        expected = dequantize_reference(quantize_reference(w.detach(), shared), torch.float32)
        assert torch.equal(got[f"{attn}.{p}_proj.weight"], expected)
    o = params[f"{attn}.o_proj.weight"].detach()  # alone: its own amax
    assert torch.equal(
        got[f"{attn}.o_proj.weight"], dequantize_reference(quantize_reference(o), torch.float32)
    )
    changed = {n for n in params if not torch.equal(got[n], params[n])}
    assert changed == {n for n in params if n.endswith("proj.weight")}  # embeddings, norms, head kept
    assert len(changed) == 2 * 7  # q k v o gate up down, two layers


def test_qat_forward_is_the_nvfp4_round_trip_and_its_gradient_goes_straight_through(tiny_dir):
    model = load_causal_lm(tiny_dir, dtype=torch.float32)
    names = apply_qat(model)
    assert len(names) == 14 and "lm_head" not in names
    layer = model.get_submodule("model.layers.1.mlp.down_proj")  # no fused sibling: its own scale
    x = torch.randn(3, layer.in_features, generator=torch.Generator().manual_seed(0))
    wq = dequantize_reference(quantize_reference(layer.weight.detach()), torch.float32).requires_grad_(True)
    y = layer(x)
    expected = F.linear(x, wq)
    assert torch.equal(y, expected)
    y.square().sum().backward()
    expected.square().sum().backward()
    assert torch.equal(layer.weight.grad, wq.grad)  # d/dW = d/dWq: straight through
    # the sync hands the engine the weights this forward uses (the fused scale included)
    params = ((n, p.detach()) for n, p in model.named_parameters())
    synced = dict(rollout_weights(model, params, torch.float32))
    q = model.get_submodule("model.layers.0.self_attn.q_proj")
    wq_fused = dequantize_reference(
        quantize_reference(q.weight.detach(), q.fused_global_scale()), torch.float32
    )
    assert torch.equal(synced["model.layers.0.self_attn.q_proj.weight"], wq_fused)


def _mismatch(tiny_dir, out, **settings) -> tuple[float, list[dict]]:
    overrides = {
        "model.name_or_path": str(tiny_dir),
        "output.dir": str(out),
        "data.reward": "contains_e",
        "data.eval_size": 0,
        "rollout.prompts_per_step": 4,
        "rollout.group_size": 4,
        "rollout.max_new_tokens": 4,
        "train.lr": 1e-3,
        "train.steps": 2,
        "train.deterministic": True,
        "eval.every": 0,
        "output.progress": False,
        "output.save_final_model": False,
        "backends.device": "cpu",
        "algo.skip_zero_variance_groups": False,
        **settings,
    }  # fmt: skip  (every group trains, so every step measures the mismatch)
    trainer = GRPOTrainer(build_config(overrides=overrides))
    try:
        trainer.setup()
        history = trainer.train()
    finally:
        trainer.close()
    return max(row["mismatch_k3"] for row in history), history


def test_nvfp4_rollouts_differ_from_a_bf16_trainer_and_not_from_a_qat_one(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(rewards.REWARDS, "contains_e", lambda completion, truth: float("e" in completion))
    plain, _ = _mismatch(tiny_dir, tmp_path / "a")
    nvfp4, history = _mismatch(
        tiny_dir, tmp_path / "b", **{"rollout.weights": "nvfp4", "train.quantization": "none"}
    )
    same, _ = _mismatch(
        tiny_dir, tmp_path / "c", **{"rollout.weights": "nvfp4", "train.quantization": "nvfp4-qat"}
    )
    assert nvfp4 > 1e-4  # the quantization shows: the engine samples from another policy
    assert same < 1e-3 * nvfp4 and plain < 1e-3 * nvfp4, (plain, nvfp4, same)
    assert {"mismatch_k1", "mismatch_exp_abs", "mismatch_exp_abs_median", "mis_masked_frac"} <= set(
        history[-1]
    )
    # every step's sync is compared with the previous one; step 1's groups all scored alike (zero
    # advantages: the weights did not move), step 2 moved some codes
    shares = [row["train/nvfp4_codes_changed"] for row in history]
    assert all(0 <= x < 1 for x in shares) and shares[-1] > 0, shares


@pytest.mark.gpu
def test_on_a_gpu_the_sync_quantizes_exactly_and_never_waits_for_the_gpu(tiny_dir):
    """The NVFP4 sync on CUDA (Triton) gives the reference quantizer's weights bit for bit (CPU),
    and neither it nor the change count syncs with the host (torch's sync debug mode raises on any
    synchronizing call): before, each weight's scale check waited for the GPU."""
    from slime_gb10.grpo.quantized import CodeChanges

    cpu = load_causal_lm(tiny_dir, dtype=torch.float32)
    expected = dict(
        rollout_weights(cpu, ((n, p.detach()) for n, p in cpu.named_parameters()), torch.bfloat16)
    )
    model = load_causal_lm(tiny_dir, dtype=torch.float32).cuda()
    params = [(n, p.detach()) for n, p in model.named_parameters()]
    dict(rollout_weights(model, params, torch.bfloat16))  # compiles the Triton kernels (that may sync)
    changes = CodeChanges()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = dict(rollout_weights(model, params, torch.bfloat16, changes))
        dict(rollout_weights(model, params, torch.bfloat16, changes))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert got.keys() == expected.keys()
    for name, tensor in got.items():
        assert torch.equal(tensor.cpu(), expected[name]), name
    assert changes.take() == {"nvfp4_codes_changed": 0.0, "nvfp4_scales_changed": 0.0}


@pytest.mark.gpu
def test_on_a_gpu_a_qat_layer_trains_without_waiting_for_the_gpu():
    """QAT's forward and backward on CUDA never sync with the host (it did once per layer and
    forward: the quantizer's NaN/Inf check of the global scale)."""
    from torch import nn

    from slime_gb10.nvfp4.linear import NVFP4Linear

    layer = NVFP4Linear.from_linear(nn.Linear(64, 32), backend="qat").cuda()
    x = torch.randn(8, 64, device="cuda")
    layer(x).square().sum().backward()  # compiles the Triton kernels (that may sync)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        layer(x).square().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert layer.weight.grad is not None


def test_a_sync_counts_the_codes_it_changed_once(tiny_dir, tokenizer):
    """Through the backend's weight stream (its planning pass computes nothing): one layer's weight
    changed between two syncs; the share of changed codes is that layer's changed codes, counted
    with the reference quantizer by hand, over all the quantized weights' codes."""
    from slime_gb10.grpo.backends.torch_backend import TorchPolicyBackend
    from slime_gb10.grpo.config import TrainConfig

    model = load_causal_lm(tiny_dir, dtype=torch.float32)
    backend = TorchPolicyBackend(model, tokenizer, "cpu", train=TrainConfig(), rollout_weights="nvfp4")
    list(backend.export_weights(1 << 20))  # the first sync: nothing to compare with
    assert "nvfp4_codes_changed" not in backend.stats()
    # under torchrun the ranks' weight digest streams the weights once more before the setup sync:
    # neither may dilute the next step's count
    list(backend.export_weights(1 << 20))
    list(backend.export_weights(1 << 20))
    params = dict(model.named_parameters())
    name = "model.layers.0.self_attn.o_proj.weight"  # in no fused group: its own global scale
    before = quantize_reference(params[name].detach().clone()).data
    with torch.no_grad():
        params[name][:3].mul_(-1.7)
    after = quantize_reference(params[name].detach()).data
    flipped = before ^ after
    changed = int((flipped & 0x0F).ne(0).sum() + (flipped >> 4).ne(0).sum())
    total = sum(
        p.numel() for n, p in params.items() if n.startswith("model.layers.") and n.endswith("_proj.weight")
    )
    list(backend.export_weights(1 << 20))
    stats = backend.stats()
    assert changed > 0 and stats["nvfp4_codes_changed"] == changed / total, (stats, changed, total)
    assert backend.stats().keys() == {"compiled"}  # read once: the counts start over


def test_the_share_of_changed_codes_is_counted_per_nibble_and_per_scale():
    """Two codes per byte (low and high nibble), each counted once; block scales compared as bytes.
    Hand-made syncs: 3 of 8 codes and 1 of 2 scales differ the second time, none the third."""
    from slime_gb10.grpo.quantized import CodeChanges

    e4m3 = torch.float8_e4m3fn
    first = torch.tensor([0x00, 0x21, 0xFF, 0x10], dtype=torch.uint8)
    second = torch.tensor([0x01, 0x21, 0xF0, 0x00], dtype=torch.uint8)  # low; none; low; high
    changes = CodeChanges()
    changes.observe("w", first, torch.tensor([1.0, 2.0]).to(e4m3))
    assert changes.take() == {}  # nothing to compare with yet
    changes.observe("w", second, torch.tensor([1.0, 4.0]).to(e4m3))
    assert changes.take() == {"nvfp4_codes_changed": 3 / 8, "nvfp4_scales_changed": 1 / 2}
    changes.observe("w", second.clone(), torch.tensor([1.0, 4.0]).to(e4m3))
    assert changes.take() == {"nvfp4_codes_changed": 0.0, "nvfp4_scales_changed": 0.0}


def test_nvfp4_rollouts_train_through_qat_unless_told_otherwise():
    """The shipped default (issue #39's three arms): NVFP4 rollouts bring NVFP4 QAT; an explicit
    train.quantization is kept, and the choice survives config.yaml (what --resume reads)."""
    from slime_gb10.grpo.config import GRPOConfig

    chosen = build_config(sets=["rollout.weights=nvfp4"])
    assert chosen.train.quantization == "nvfp4-qat"
    assert (
        build_config(sets=["rollout.weights=nvfp4", "train.quantization=none"]).train.quantization == "none"
    )
    assert build_config().train.quantization == "none"  # BF16 rollouts: nothing changes
    again = GRPOConfig.model_validate(yaml.safe_load(chosen.to_yaml()))
    assert again.train.quantization == "nvfp4-qat"
    from slime_gb10.grpo.config import RolloutConfig, TrainConfig

    mine = TrainConfig()  # a caller's own section object is not changed behind its back
    built = GRPOConfig(rollout=RolloutConfig(weights="nvfp4"), train=mine)
    assert built.train.quantization == "nvfp4-qat" and mine.quantization == "none"


def test_the_megatron_backend_refuses_the_nvfp4_settings():
    from slime_gb10.grpo.backends.megatron.backend import build_backend
    from slime_gb10.grpo.config import ConfigError

    with pytest.raises(ConfigError, match="PyTorch backend only"):
        build_backend(build_config(sets=["rollout.weights=nvfp4"]), None, "cpu")


def test_under_bf16_autocast_the_sync_matches_what_the_qat_forward_multiplies_by(tiny_dir):
    """On a GPU the trainer runs under BF16 autocast with FP32 masters: a QAT layer's input, hence
    its fake quantization, stays FP32, and the autocast casts the dequantized weight to BF16. The
    sync must hand the engine those BF16 values (quantizing the BF16-cast weight instead picks other
    block scales: found on an H100, KL 0.013 instead of ~0.001)."""
    model = load_causal_lm(tiny_dir, dtype=torch.float32)
    apply_qat(model)
    name = "model.layers.0.mlp.gate_proj"
    layer = model.get_submodule(name)
    synced = dict(
        rollout_weights(model, ((n, p.detach()) for n, p in model.named_parameters()), torch.bfloat16)
    )
    x = torch.randn(5, layer.in_features, generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = layer(x)
        expected = F.linear(x, synced[f"{name}.weight"])  # what an engine holding the synced weight computes
    assert synced[f"{name}.weight"].dtype == torch.bfloat16 and torch.equal(got, expected)
    # the other order (quantize the BF16 cast) gives other weights: this test can tell them apart
    w = layer.weight.detach()
    bf16_first = dequantize_reference(
        quantize_reference(w.to(torch.bfloat16), layer.fused_global_scale(torch.bfloat16)), torch.bfloat16
    )
    assert not torch.equal(bf16_first, synced[f"{name}.weight"])


def test_a_whole_qat_model_under_bf16_autocast_is_the_model_holding_the_synced_weights(tiny_dir):
    """Every layer, whatever its input's dtype under autocast (FP32 after a norm; BF16 into o_proj
    and down_proj, out of autocast GEMMs): the QAT model's logits are those of a plain model loaded
    with the weights the sync hands the engine."""
    qat = load_causal_lm(tiny_dir, dtype=torch.float32)
    apply_qat(qat)
    synced = dict(rollout_weights(qat, ((n, p.detach()) for n, p in qat.named_parameters()), torch.bfloat16))
    plain = load_causal_lm(tiny_dir, dtype=torch.float32)
    with torch.no_grad():
        for name, param in plain.named_parameters():
            param.copy_(synced[name].float())  # BF16 values, exact in FP32
    ids = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(qat(ids).logits, plain(ids).logits)


def test_the_mismatch_verdict_takes_the_medians_of_the_second_half_under_nemo_rls_gates(tmp_path):
    """Of 6 steps the first 3 are ignored; steps 4-6: k3 (0.002, 0.002, 0.009) -> median 0.002 <
    0.003, exp|dlogp| (1.05, 1.05, 1.2) -> 1.05 < 1.1: pass; bad late steps (k3 0.009): fail."""
    import json

    from slime_gb10.grpo.quantized import mismatch_verdict

    def verdict(k3s, exps):
        rows = [{"step": 0, "eval/pass@1": 0.1}] + [
            {"step": i + 1, "mismatch_k3": k, "mismatch_exp_abs_median": e, "train/nvfp4_codes_changed": 1e-4}
            for i, (k, e) in enumerate(zip(k3s, exps, strict=True))
        ]
        (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return mismatch_verdict(tmp_path)

    passed, line = verdict([0.5, 0.5, 0.001, 0.002, 0.002, 0.009], [2.0, 2.0, 1.0, 1.05, 1.05, 1.2])
    assert passed and "k3 median 0.00200" in line and "steps 4-6" in line and "exp|dlogp| 1.0500" in line
    passed, line = verdict([0.5, 0.001, 0.002, 0.009, 0.009, 0.009], [1.0] * 6)
    assert not passed and line.endswith("FAIL") and "0.00900" in line
    passed, line = verdict([0.001] * 4, [None, None, 1.0, 1.0])  # rows without the median are left out
    assert passed and "steps 4-4" in line
    (tmp_path / "metrics.jsonl").write_text("")
    assert mismatch_verdict(tmp_path)[0] is False


def test_nvfp4_rollouts_with_a_bf16_trainer_are_warned_about(tiny_dir, tokenizer, caplog):
    """Set explicitly, or carried by a resumed BF16 run's config.yaml: the backend says what it costs."""
    from slime_gb10.grpo.backends.torch_backend import build_backend

    overrides = {
        "model.name_or_path": str(tiny_dir),
        "rollout.weights": "nvfp4",
        "train.quantization": "none",
    }
    with caplog.at_level("WARNING"):
        build_backend(build_config(overrides=overrides), tokenizer, "cpu")
    assert (
        "NVFP4 rollouts with a BF16 trainer" in caplog.text and "train.quantization=nvfp4-qat" in caplog.text
    )


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("engine_weights", ["bf16", "nvfp4"])
def test_an_nvfp4_rollout_samples_from_the_model_holding_the_dequantized_weights(
    tiny_dir, tokenizer, device, engine_weights, nvfp4_trainer
):
    """The engine after an NVFP4 sync (its own kernels; on a GPU in BF16 with its CUDA-graphed decode)
    against a plain Hugging Face forward of a model holding the round-tripped weights: the sampled
    tokens' logprobs agree within the engine dtype's rounding (1e-4 in FP32 on a CPU; 0.3 in BF16,
    where the engine's fused kernels and the HF forward round differently; a sync that left the
    weights unquantized misses by ~3 on this model), and greedy decoding picks the reference's
    argmax except where its two best logits are within that tolerance (a near-tie). Both engines:
    one that receives the dequantized values (bf16), one that receives the codes and decodes from
    them (nvfp4: the W4A16 kernel on a GPU, the reference dequantization on a CPU)."""
    from slime_gb10.grpo.engines.torch.engine import TorchRolloutEngine
    from slime_gb10.grpo.interfaces import SamplingParams

    # BF16 on a GPU: the engine's kernels and the HF forward round differently, and over 12 tokens
    # of this sharp tiny model (initializer_range 0.3) they drifted up to 0.164 apart on an H100 for
    # both engines (session 28): 0.3 keeps that margin and still fails a sync that skips the
    # quantization (~3)
    dtype, tol = (torch.float32, 1e-4) if device == "cpu" else (torch.bfloat16, 0.3)
    backend, trained = nvfp4_trainer(tiny_dir, tokenizer, device, dtype, seed=7)  # "trained" weights
    engine_model = load_causal_lm(tiny_dir, dtype=dtype).to(device)
    # on a CPU "auto" is the HF forward, which decodes from the BF16 values: the static decoder's
    # one-token steps are where the codes are multiplied
    decode = "static" if device == "cpu" else "auto"
    engine = TorchRolloutEngine(  # no stop token: runs to the cap
        engine_model, tokenizer, device, eos_token_ids=[], decode=decode, weights=engine_weights
    )
    assert engine.receives_nvfp4_codes == (engine_weights == "nvfp4")
    engine.update_weights(backend.export_weights(1 << 20, nvfp4_codes=engine.receives_nvfp4_codes))
    reference = load_causal_lm(tiny_dir, dtype=torch.float32)  # the round trip by the CPU reference
    reference.load_state_dict(trained, strict=False)
    synced = dict(rollout_weights(reference, trained.items(), torch.float32))
    reference.load_state_dict(synced, strict=False)
    reference = reference.to(device=device, dtype=dtype).eval()

    prompts = [[1, 2, 3, 4], [5, 6, 7, 8, 9, 10]]
    for params in (
        SamplingParams(max_new_tokens=12, seed=3),
        SamplingParams(max_new_tokens=12, temperature=0.0),
    ):
        for g in engine.generate(prompts, params):
            ids = torch.tensor([g.prompt_ids + g.completion_ids], device=device)
            with torch.no_grad():
                logits = reference(ids).logits[0, len(g.prompt_ids) - 1 : -1].float()
            chosen = torch.tensor(g.completion_ids, device=device)
            if params.temperature > 0:  # the sampled tokens' logprobs
                expected = torch.log_softmax(logits, -1).gather(-1, chosen[:, None])[:, 0]
                got = torch.tensor(g.completion_logprobs, device=device)
                torch.testing.assert_close(got, expected, atol=tol, rtol=0)
            else:  # greedy: the reference's argmax, but at near-ties
                top2 = logits.topk(2, -1).values
                tie = (top2[:, 0] - top2[:, 1]) < tol
                assert bool(((chosen == logits.argmax(-1)) | tie).all()), (
                    g.completion_ids,
                    logits.argmax(-1),
                )
