"""HF ↔ Megatron-core name/layout mapping: bit-exact round trips and an independent numerical check.

The numerical check does not use the module's own split functions: it runs a float64 decoder
forward written from Megatron-core's conventions (``SelfAttention.get_query_key_value_tensors``
views ``linear_qkv`` output as ``[.., ng, (nq/ng + 2) * hd]`` and splits it ``[nq/ng*hd, hd, hd]``;
``MLP`` with ``gated_linear_unit`` computes ``silu(x1) * x2`` on ``torch.chunk(fc1(x), 2, -1)``)
on the converted weights, and compares its logits with ``transformers``' own model.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from slime_gb10.grpo.backends.megatron.mapping import (
    DecoderArch,
    MappingError,
    hf_names,
    hf_to_megatron,
    iter_megatron_to_hf,
    megatron_names,
    megatron_to_hf,
)


def _llama_gqa_tied() -> LlamaConfig:
    # nq=6, nkv=2 (3 query heads per group), tied embeddings, like SmolLM2 (9 heads / 3 kv heads).
    return LlamaConfig(
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=97,
        tie_word_embeddings=True,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=64,
    )


def _llama_explicit_head_dim() -> LlamaConfig:
    # head_dim (12) != hidden/nq (8): kv_channels must come from head_dim.
    return LlamaConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=12,
        intermediate_size=40,
        vocab_size=53,
        tie_word_embeddings=False,
        max_position_embeddings=64,
    )


def _qwen2_bias_untied() -> Qwen2Config:
    return Qwen2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        vocab_size=61,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
    )


CONFIGS = {
    "llama_gqa_tied": (_llama_gqa_tied, LlamaForCausalLM),
    "llama_head_dim": (_llama_explicit_head_dim, LlamaForCausalLM),
    "qwen2_bias_untied": (_qwen2_bias_untied, Qwen2ForCausalLM),
}


def _random_model(name: str, dtype=torch.float64, seed: int = 0):
    make_config, model_cls = CONFIGS[name]
    config = make_config()
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(config).to(dtype).eval()
    with torch.no_grad():  # every parameter random and non-zero (norms and biases included)
        for p in model.parameters():
            p.copy_(
                torch.randn_like(p) * 0.2 + (1.0 if p.ndim == 1 and "norm" in _param_name(model, p) else 0.0)
            )
    return config, model


def _param_name(model, param) -> str:
    return next(n for n, p in model.named_parameters() if p is param)


def _hf_state(model) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters())


@pytest.mark.parametrize("flavor", ["te", "local"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_hf_megatron_hf_round_trip_is_bit_exact(name, flavor):
    config, model = _random_model(name, dtype=torch.bfloat16)
    arch = DecoderArch.from_hf_config(config)
    hf = {k: v.detach() for k, v in _hf_state(model).items()}
    mcore = hf_to_megatron(hf, arch, flavor)
    assert list(mcore) == megatron_names(arch, flavor)
    back = megatron_to_hf(mcore, arch, flavor)
    assert sorted(back) == sorted(hf)
    for k in hf:
        assert back[k].dtype == hf[k].dtype and back[k].shape == hf[k].shape, k
        assert torch.equal(back[k].view(torch.int16), hf[k].view(torch.int16)), k  # bitwise


@pytest.mark.parametrize("flavor", ["te", "local"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_megatron_hf_megatron_round_trip_is_bit_exact(name, flavor):
    config = CONFIGS[name][0]()
    arch = DecoderArch.from_hf_config(config)
    torch.manual_seed(1)
    shapes = {k: v.shape for k, v in hf_to_megatron(_hf_state(_random_model(name)[1]), arch, flavor).items()}
    mcore = {k: torch.randn(s, dtype=torch.float32) for k, s in shapes.items()}
    again = hf_to_megatron(megatron_to_hf(mcore, arch, flavor), arch, flavor)
    assert list(again) == list(mcore)
    for k in mcore:
        assert torch.equal(again[k].view(torch.int32), mcore[k].view(torch.int32)), k


def test_export_names_come_in_hf_names_order_lazily():
    config, model = _random_model("qwen2_bias_untied")
    arch = DecoderArch.from_hf_config(config)
    mcore = hf_to_megatron(_hf_state(model), arch, "te")
    stream = iter_megatron_to_hf(mcore, arch, "te")
    first = next(stream)  # a generator: nothing beyond the first tensor was built
    assert first[0] == "model.embed_tokens.weight"
    names = [first[0]] + [n for n, _ in stream]
    assert sorted(names) == sorted(hf_names(arch)) and len(names) == len(set(names))


def _rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _megatron_reference_logits(mcore, arch: DecoderArch, flavor: str, ids: torch.Tensor) -> torch.Tensor:
    """Float64 decoder forward on Megatron-layout weights, following Megatron-core's conventions."""
    ng, hpg, hd, nq = arch.num_key_value_heads, arch.heads_per_group, arch.head_dim, arch.num_attention_heads
    seq = ids.shape[0]
    inv_freq = 1.0 / (arch.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = torch.arange(seq, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)  # rotary_interleaved=False
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
    x = mcore["embedding.word_embeddings.weight"][ids]
    for i in range(arch.num_layers):
        p = f"decoder.layers.{i}."
        if flavor == "te":
            w_in, w_mlp = (
                p + "self_attention.linear_qkv.layer_norm_weight",
                p + "mlp.linear_fc1.layer_norm_weight",
            )
        else:
            w_in, w_mlp = p + "input_layernorm.weight", p + "pre_mlp_layernorm.weight"
        h = _rms_norm(x, mcore[w_in], arch.rms_norm_eps)
        mixed = h @ mcore[p + "self_attention.linear_qkv.weight"].T
        if arch.qkv_bias:
            mixed = mixed + mcore[p + "self_attention.linear_qkv.bias"]
        mixed = mixed.view(seq, ng, (hpg + 2) * hd)
        q, k, v = torch.split(mixed, [hpg * hd, hd, hd], dim=-1)
        q = q.reshape(seq, nq, hd)  # query head j = g * hpg + r belongs to group g
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        ctx = torch.empty(seq, nq, hd, dtype=x.dtype)
        for j in range(nq):
            g = j // hpg
            scores = (q[:, j] @ k[:, g].T) / hd**0.5
            probs = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
            ctx[:, j] = probs @ v[:, g]
        x = x + ctx.reshape(seq, nq * hd) @ mcore[p + "self_attention.linear_proj.weight"].T
        h = _rms_norm(x, mcore[w_mlp], arch.rms_norm_eps)
        a1, a2 = torch.chunk(h @ mcore[p + "mlp.linear_fc1.weight"].T, 2, dim=-1)
        x = x + (torch.nn.functional.silu(a1) * a2) @ mcore[p + "mlp.linear_fc2.weight"].T
    x = _rms_norm(x, mcore["decoder.final_layernorm.weight"], arch.rms_norm_eps)
    out = (
        mcore["embedding.word_embeddings.weight"]
        if arch.tie_word_embeddings
        else mcore["output_layer.weight"]
    )
    return x @ out.T


@pytest.mark.parametrize("flavor", ["te", "local"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_fused_layout_computes_the_hf_model(name, flavor):
    config, model = _random_model(name, dtype=torch.float64, seed=3)
    arch = DecoderArch.from_hf_config(config)
    mcore = hf_to_megatron({k: v.detach() for k, v in _hf_state(model).items()}, arch, flavor)
    ids = torch.randint(0, arch.vocab_size, (11,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = model(ids[None]).logits[0]
        got = _megatron_reference_logits(mcore, arch, flavor, ids)
    # transformers builds the RoPE cos/sin tables in float32 (our reference in float64): ~1e-6.
    # A wrong head grouping gives O(1) errors (next test).
    assert torch.allclose(got, expected, rtol=0, atol=2e-5), (got - expected).abs().max()


def test_a_wrong_grouping_is_caught_by_the_numerical_check():
    # Guard that the check can fail: packing q/k/v as [all q; all k; all v] (not grouped) must differ.
    config, model = _random_model("llama_gqa_tied", dtype=torch.float64, seed=4)
    arch = DecoderArch.from_hf_config(config)
    hf = {k: v.detach() for k, v in _hf_state(model).items()}
    mcore = hf_to_megatron(hf, arch, "te")
    for i in range(arch.num_layers):
        p = f"model.layers.{i}.self_attn."
        mcore[f"decoder.layers.{i}.self_attention.linear_qkv.weight"] = torch.cat(
            [hf[p + "q_proj.weight"], hf[p + "k_proj.weight"], hf[p + "v_proj.weight"]]
        )
    ids = torch.arange(9)
    with torch.no_grad():
        assert not torch.allclose(
            _megatron_reference_logits(mcore, arch, "te", ids), model(ids[None]).logits[0], atol=1e-3
        )


def test_names_match_megatron_core_0_16_local_spec():
    # Written out from megatron-core 0.16.1's GPTModel(get_gpt_layer_local_spec()) named_parameters()
    # for a one-layer model with add_qkv_bias=True and untied output layer.
    arch = DecoderArch.from_hf_config(
        Qwen2Config(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=48,
        )
    )
    assert set(megatron_names(arch, "local")) == {
        "embedding.word_embeddings.weight",
        "decoder.layers.0.input_layernorm.weight",
        "decoder.layers.0.self_attention.linear_proj.weight",
        "decoder.layers.0.self_attention.linear_qkv.weight",
        "decoder.layers.0.self_attention.linear_qkv.bias",
        "decoder.layers.0.pre_mlp_layernorm.weight",
        "decoder.layers.0.mlp.linear_fc1.weight",
        "decoder.layers.0.mlp.linear_fc2.weight",
        "decoder.final_layernorm.weight",
        "output_layer.weight",
    }


def test_tied_hf_checkpoint_may_carry_lm_head():
    config, model = _random_model("llama_gqa_tied")
    arch = DecoderArch.from_hf_config(config)
    state = {k: v.detach() for k, v in model.state_dict().items()}  # state_dict() includes the tied lm_head
    assert "lm_head.weight" in state
    assert "output_layer.weight" not in hf_to_megatron(state, arch, "te")


def test_missing_and_misshaped_tensors_raise_clear_errors():
    config, model = _random_model("qwen2_bias_untied")
    arch = DecoderArch.from_hf_config(config)
    hf = {k: v.detach() for k, v in _hf_state(model).items()}
    broken = dict(hf)
    del broken["model.layers.1.self_attn.k_proj.bias"]
    with pytest.raises(MappingError, match=r"1 missing .*k_proj\.bias"):
        hf_to_megatron(broken, arch, "te")
    broken = dict(hf)
    broken["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(3, 32)
    with pytest.raises(MappingError, match=r"k_proj has shape \(3, 32\)"):
        hf_to_megatron(broken, arch, "local")
    with pytest.raises(MappingError, match="flavor"):
        megatron_names(arch, "apex")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (LlamaConfig(hidden_act="gelu"), "silu"),
        (LlamaConfig(attention_bias=True), "o_proj"),
        (LlamaConfig(mlp_bias=True), "mlp_bias"),
        (LlamaConfig(rope_scaling={"rope_type": "linear", "factor": 2.0}), "rope_scaling"),
    ],
)
def test_unsupported_configs_are_refused(config, message):
    with pytest.raises(MappingError, match=message):
        DecoderArch.from_hf_config(config)


def test_smollm2_arch_numbers(smollm2_135m_config):
    # SmolLM2-135M: the config the GGUF metadata carries (hidden 576, 30 layers, 9 heads, 3 kv heads).
    arch = DecoderArch.from_hf_config(smollm2_135m_config())
    assert (arch.head_dim, arch.heads_per_group, arch.qkv_rows) == (64, 3, 3 * (3 + 2) * 64)
    assert arch.rope_theta == 100000.0 and arch.tie_word_embeddings and not arch.qkv_bias


_REAL_MEGATRON_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, warnings
    warnings.filterwarnings("ignore")
    import torch, torch.distributed as dist
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = sys.argv[1]
    dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state
    parallel_state.initialize_model_parallel(1, 1)
    from transformers import Qwen2Config
    from slime_gb10.grpo.backends.megatron.model import build_gpt_model
    config = Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=48, vocab_size=61, tie_word_embeddings=False)
    model, arch, flavor = build_gpt_model(config, flavor="local", params_dtype=torch.float32, device="cpu")
    print(json.dumps({n: list(p.shape) for n, p in model.named_parameters()}))
    """
)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None,
    reason="megatron-core is not installed (optional here: pip install --no-deps megatron-core==0.16.1)",
)
def test_names_and_shapes_match_a_real_megatron_gpt_model(tmp_path):
    # Real megatron-core GPTModel built on the CPU (construction needs no GPU), in a subprocess
    # because it initialises torch.distributed.
    import json
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run(
        [sys.executable, "-c", _REAL_MEGATRON_SCRIPT, str(port)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    real = json.loads(proc.stdout.strip().splitlines()[-1])
    arch = DecoderArch.from_hf_config(_qwen2_bias_untied())
    _, model = _random_model("qwen2_bias_untied")
    ours = {k: list(v.shape) for k, v in hf_to_megatron(_hf_state(model), arch, "local").items()}
    assert ours == real


def _fake_te_recipe_module(nvfp4_wgrad_field: str):
    """Stand-in for ``transformer_engine.common.recipe`` (TE needs CUDA libraries to import; its
    wheel is ~275 MB). Field names as in TransformerEngine's recipe/__init__.py: newer releases
    have ``backward_override`` on NVFP4BlockScaling, the GB10 nanochat port used a release with
    ``override_linear_precision``."""
    import dataclasses
    import enum
    import types

    class Format(enum.Enum):
        E2M1 = "E2M1"
        E4M3 = "E4M3"
        HYBRID = "HYBRID"

    @dataclasses.dataclass
    class Float8CurrentScaling:
        fp8_format: Format = Format.HYBRID

    @dataclasses.dataclass
    class DelayedScaling:
        fp8_format: Format = Format.HYBRID

    extra = {"override_linear_precision": tuple, "backward_override": object}[nvfp4_wgrad_field]
    NVFP4BlockScaling = dataclasses.make_dataclass(
        "NVFP4BlockScaling",
        [
            ("disable_rht", bool, dataclasses.field(default=False)),
            ("disable_stochastic_rounding", bool, dataclasses.field(default=False)),
            ("disable_2d_quantization", bool, dataclasses.field(default=False)),
            (nvfp4_wgrad_field, extra, dataclasses.field(default=None)),
        ],
    )
    module = types.ModuleType("transformer_engine.common.recipe")
    module.Format, module.Float8CurrentScaling, module.DelayedScaling = (
        Format,
        Float8CurrentScaling,
        DelayedScaling,
    )
    module.NVFP4BlockScaling = NVFP4BlockScaling
    return module


@pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None,
    reason="megatron-core is not installed (optional here: pip install --no-deps megatron-core==0.16.1)",
)
@pytest.mark.parametrize("wgrad_field", ["override_linear_precision", "backward_override"])
def test_te_recipes_disable_rht_and_keep_wgrad_bf16_on_sm12x_only(monkeypatch, wgrad_field):
    import types

    from slime_gb10.grpo.backends.megatron.model import te_recipe

    recipe_module = _fake_te_recipe_module(wgrad_field)
    common = types.ModuleType("transformer_engine.common")
    common.recipe = recipe_module
    te = types.ModuleType("transformer_engine")
    te.common = common
    monkeypatch.setitem(sys.modules, "transformer_engine", te)
    monkeypatch.setitem(sys.modules, "transformer_engine.common", common)
    monkeypatch.setitem(sys.modules, "transformer_engine.common.recipe", recipe_module)

    assert te_recipe("bf16", (12, 1)) is None
    fp8 = te_recipe("fp8", (12, 1))
    assert type(fp8).__name__ == "Float8CurrentScaling" and fp8.fp8_format.name == "HYBRID"
    gb10 = te_recipe("nvfp4", (12, 1))
    assert gb10.disable_rht is True  # TE issue #2372: the RHT kernel fails on sm_120/sm_121
    assert gb10.disable_stochastic_rounding is True  # TE #3062: shared memory on sm_12x
    assert gb10.disable_2d_quantization is False  # training keeps TE's 16x16 weight tiles
    expected = (False, False, True) if wgrad_field == "override_linear_precision" else "high_precision"
    assert getattr(gb10, wgrad_field) == expected
    blackwell_dc = te_recipe("nvfp4", (10, 0))  # B200: TE's defaults (RHT on)
    assert blackwell_dc.disable_rht is False and getattr(blackwell_dc, wgrad_field) is None
    assert blackwell_dc.disable_stochastic_rounding is False
    with pytest.raises(ValueError, match="bf16, fp8 or nvfp4"):
        te_recipe("int8", (12, 1))
