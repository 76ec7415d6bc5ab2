"""Megatron-core backend on a CUDA GPU: GPTModel from HF configs, bit-exact import/export,
logprobs against ``transformers`` on the same weights, and optimizer steps through Megatron's
DDP + mixed-precision optimizer.

Runs where megatron-core imports and a GPU is present (the device, the flake's GPU checks); the
TransformerEngine layer spec is used when TE imports, else Megatron's local spec.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

HAVE_MEGATRON = (
    importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None
)
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not HAVE_MEGATRON, reason="megatron-core is not installed (pip install 'slime-gb10[megatron]')"
    ),
]

if HAVE_MEGATRON:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from slime_gb10.grpo.backends.megatron import backend as mbb
    from slime_gb10.grpo.backends.megatron import model as mb
    from slime_gb10.grpo.backends.megatron.mapping import hf_to_megatron, megatron_to_hf
    from slime_gb10.grpo.interfaces import TokenBatch


def tiny_llama_config():
    return LlamaConfig(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=512,
        vocab_size=1000,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        max_position_embeddings=512,
        initializer_range=0.1,  # peaked distributions: logprob errors are measurable
    )


def tiny_qwen2_config():
    return Qwen2Config(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=256,
        vocab_size=777,
        tie_word_embeddings=False,
        max_position_embeddings=512,
        initializer_range=0.1,
    )


CONFIGS = {
    "tiny_llama": tiny_llama_config,
    "tiny_qwen2": tiny_qwen2_config,
    "smollm2_135m": None,  # the smollm2_135m_config fixture (tests/grpo/conftest.py)
}


@pytest.fixture
def hf_model(smollm2_135m_config):
    """A builder: ``hf_model(name, dtype, seed)`` -> (config, model on the GPU) for a CONFIGS name."""

    def build(name: str, dtype=torch.bfloat16, seed: int = 0):
        return _hf_model((CONFIGS[name] or smollm2_135m_config)(), dtype, seed)

    return build


def _hf_model(config, dtype, seed):
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    cls = Qwen2ForCausalLM if config.model_type == "qwen2" else LlamaForCausalLM
    model = cls(config).to("cuda", dtype).eval()
    with torch.no_grad():  # non-trivial norms and biases
        for n, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in n else 0.1 * torch.randn_like(p))
    return config, model


@pytest.fixture(scope="module", autouse=True)
def _parallel_state():
    mb.init_parallel(seed=0)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_gpt_model_from_hf_config_has_the_mapped_names_and_shapes(hf_model, name):
    config, hf = hf_model(name)
    model, arch, flavor = mb.build_gpt_model(config, flavor="auto", device="cuda")
    expected = {
        k: tuple(v.shape) for k, v in hf_to_megatron(dict(hf.named_parameters()), arch, flavor).items()
    }
    got = {k: tuple(p.shape) for k, p in model.named_parameters()}
    assert got == expected
    assert all(p.dtype == torch.bfloat16 and p.is_cuda for p in model.parameters())


@pytest.mark.parametrize("name", list(CONFIGS))
def test_import_export_round_trip_is_bit_exact(hf_model, name):
    config, hf = hf_model(name)
    model, arch, flavor = mb.build_gpt_model(config, device="cuda")
    hf_state = {k: v.detach() for k, v in hf.named_parameters()}
    mb.load_hf_weights(model, hf_state, arch, flavor)
    back = megatron_to_hf(mb.megatron_state(model), arch, flavor)
    assert sorted(back) == sorted(hf_state)
    for k, v in hf_state.items():
        assert torch.equal(back[k].view(torch.int16), v.view(torch.int16)), k


def _random_batch(vocab: int, batch: int = 4, seq: int = 48, seed: int = 1) -> TokenBatch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    lengths = torch.tensor([seq, seq - 7, seq - 20, seq - 3])[:batch]
    attention = (torch.arange(seq)[None, :] < lengths[:, None]).long()  # right padding
    completion = attention.float().clone()
    completion[:, :10] = 0  # a 10-token "prompt"
    return TokenBatch(ids.cuda(), attention.cuda(), completion.cuda())


def _hf_logprobs(model, batch: TokenBatch) -> torch.Tensor:
    logits = model(batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    lp = torch.log_softmax(logits, dim=-1)[:, :-1].gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1) * batch.completion_mask


def logprob_errors(hf_model, name: str, seed: int = 0) -> dict[str, float]:
    """Max/mean |logprob error| vs an FP32 HF reference, for Megatron-BF16 and for HF-BF16 itself."""
    config, hf16 = hf_model(name, torch.bfloat16, seed)
    hf32 = hf_model(name, torch.float32, seed)[1]
    hf32.load_state_dict({k: v.float() for k, v in hf16.state_dict().items()})  # same (bf16-exact) weights
    model, arch, flavor = mb.build_gpt_model(config, device="cuda")
    mb.load_hf_weights(model, {k: v.detach() for k, v in hf16.named_parameters()}, arch, flavor)
    model.eval()
    batch = _random_batch(config.vocab_size)
    with torch.no_grad():
        ref = _hf_logprobs(hf32, batch)
        hf = _hf_logprobs(hf16, batch)
        mg, _ = mb.token_logprobs(model, batch, temperature=1.0, with_entropy=False)
    mask = batch.completion_mask[:, 1:] > 0
    d_mg = (mg - ref)[:, 1:][mask].abs()
    d_hf = (hf - ref)[:, 1:][mask].abs()
    return {
        "megatron_max": d_mg.max().item(),
        "megatron_mean": d_mg.mean().item(),
        "hf_bf16_max": d_hf.max().item(),
        "hf_bf16_mean": d_hf.mean().item(),
        "ref_mean_logprob": ref[:, 1:][mask].mean().item(),
        "tokens": int(mask.sum()),
        "flavor": flavor,
    }


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_qwen2", "smollm2_135m"])
def test_logprobs_match_hf_within_bf16_tolerance(hf_model, name):
    # Tolerance: Megatron in BF16 may differ from the FP32 reference by no more than 2x what
    # transformers' own BF16 forward differs from it (plus 0.02 absolute for the max).
    e = logprob_errors(hf_model, name)
    print(name, e)
    assert e["megatron_mean"] <= 2 * e["hf_bf16_mean"] + 1e-3, e
    assert e["megatron_max"] <= 2 * e["hf_bf16_max"] + 0.02, e


def test_optimizer_steps_reduce_a_supervised_loss_and_export_streams_hf_weights(hf_model):
    from slime_gb10.grpo.weight_sync import receive

    config, hf = hf_model("tiny_llama", torch.float32)
    from slime_gb10.grpo.config import TrainConfig

    backend = mbb.MegatronPolicyBackend(
        hf, tokenizer=None, device="cuda", train=TrainConfig(lr=3e-3, max_grad_norm=1.0)
    )
    batch = _random_batch(config.vocab_size, seed=3)

    def nll(logprobs, entropy, batch, extras):
        mask = batch.completion_mask
        loss = -(logprobs * mask).sum() / mask.sum()
        return loss, {"entropy": (entropy * mask).sum() / mask.sum()}

    losses = [backend.train_step([(batch, {})], nll).loss for _ in range(8)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.7 * losses[0], losses  # 8 Adam steps memorise a fixed batch
    exported = dict(receive(backend.export_weights(bucket_bytes=1 << 20)))
    current = backend.hf_state_dict()
    assert sorted(exported) == sorted(current)
    for k, v in current.items():
        assert torch.equal(exported[k].to(v.device), v), k  # BF16 params travel as BF16: bit-exact
    moved = {
        k: (current[k].float() - hf.state_dict()[k].to(current[k].device)).abs().max().item() for k in current
    }
    assert max(moved.values()) > 0  # the steps changed the weights that are exported


def test_weight_decay_skips_norms_and_biases_and_resumed_settings_come_from_the_config(hf_model):
    """Zero gradients (the loss is 0 x logprobs), lr 0.1, weight decay 0.5: Adam's update is 0, so a
    step only applies the decoupled decay, p <- p (1 - 0.1 x 0.5) = 0.95 p, to the weights Megatron
    decays (its ``wd_mult`` 1) and leaves the norm weights (``wd_mult`` 0) as they were. Then a
    backend built with other betas and eps loads the first one's state: after a step its groups
    hold its own config's settings, not the checkpoint's."""
    from slime_gb10.grpo.config import TrainConfig

    config, hf = hf_model("tiny_llama", torch.float32)
    train = TrainConfig(lr=0.1, weight_decay=0.5, max_grad_norm=1.0)
    backend = mbb.MegatronPolicyBackend(hf, tokenizer=None, device="cuda", train=train)
    batch = _random_batch(config.vocab_size, seed=5)

    def zero(logprobs, entropy, batch, extras):
        return (logprobs * 0.0).sum(), {}

    before = {k: v.float().clone() for k, v in backend.hf_state_dict().items()}
    backend.train_step([(batch, {})], zero)
    after = {k: v.float() for k, v in backend.hf_state_dict().items()}
    norms = [k for k in before if k.endswith("norm.weight")]
    decayed = [k for k in before if k.endswith("proj.weight")]
    assert norms and decayed
    for k in norms:
        assert torch.equal(after[k], before[k]), k
    for k in decayed:  # BF16 weights: 0.95 p within the rounding of one BF16 value
        torch.testing.assert_close(after[k], 0.95 * before[k], atol=1e-6, rtol=2**-7, msg=k)
    assert {g["weight_decay"] for g in backend.optimizer.param_groups} == {0.0, 0.5}

    other = TrainConfig(lr=0.1, weight_decay=0.0, adam_betas=(0.8, 0.95), adam_eps=1e-6)
    resumed = mbb.MegatronPolicyBackend(hf, tokenizer=None, device="cuda", train=other)
    resumed.load_state_dict(backend.state_dict())
    resumed.train_step([(batch, {})], zero)
    for group in resumed.optimizer.param_groups:
        assert tuple(group["betas"]) == (0.8, 0.95) and group["eps"] == 1e-6 and group["weight_decay"] == 0.0
