"""ModelOpt NVFP4 Hugging Face checkpoints: layout SGLang's ModelOpt NVFP4 loader expects, bit-exact round trip."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from safetensors import safe_open
from torch import nn

from slime_gb10.nvfp4 import (
    CheckpointError,
    NVFP4Linear,
    calibration,
    export_nvfp4,
    load_nvfp4,
    quantize_model,
)
from slime_gb10.nvfp4.linear import nvfp4_layers


@pytest.fixture(scope="session")
def llama(tiny_llama):
    """The checkpoint tests' model: tied embeddings, BF16 (config and weights)."""
    return functools.partial(tiny_llama, tie_word_embeddings=True, dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, llama):
    model = llama()
    quantize_model(model)
    ids = torch.randint(0, 256, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), calibration(model):
        logits = model(ids).logits
    out = tmp_path_factory.mktemp("ckpt") / "tiny-nvfp4"
    export_nvfp4(model, out)
    return model, out, ids, logits


def _tensors(path):
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118


def test_layout_matches_the_modelopt_nvfp4_linear_method(exported):
    model, out, _, _ = exported
    tensors = _tensors(out)
    name = "model.layers.0.mlp.down_proj"  # in 128 -> out 64
    assert tensors[f"{name}.weight"].dtype == torch.uint8 and tensors[f"{name}.weight"].shape == (64, 64)
    assert tensors[f"{name}.weight_scale"].dtype == torch.float8_e4m3fn
    assert tensors[f"{name}.weight_scale"].shape == (64, 128 // 16)
    for key in ("weight_scale_2", "input_scale"):
        assert tensors[f"{name}.{key}"].dtype == torch.float32 and tensors[f"{name}.{key}"].shape == ()
    # calibrated input scale = input amax / (6 * 448)
    layer = model.get_submodule(name)
    assert float(tensors[f"{name}.input_scale"]) == pytest.approx(float(layer.input_amax) / 2688, rel=1e-6)
    # unquantized modules in BF16
    assert tensors["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert tensors["model.embed_tokens.weight"].shape == (256, 64)
    # the lm_head is tied to the embeddings: written once, as transformers and ModelOpt do
    assert "lm_head.weight" not in tensors
    assert tensors["model.norm.weight"].dtype == torch.bfloat16
    n_quantized = sum(k.endswith(".weight_scale") for k in tensors)
    assert n_quantized == 14


def test_fused_siblings_share_weight_scale_2_and_input_scale(exported):
    _, out, _, _ = exported
    tensors = _tensors(out)
    for layer in range(2):
        for group in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
            sub = "self_attn" if group[0] == "q_proj" else "mlp"
            for key in ("weight_scale_2", "input_scale"):
                values = {float(tensors[f"model.layers.{layer}.{sub}.{p}.{key}"]) for p in group}
                assert len(values) == 1, (layer, group, key, values)


def test_quantization_configs(exported):
    _, out, _, _ = exported
    config = json.loads((out / "config.json").read_text())
    qc = config["quantization_config"]
    # what SGLang's ModelOptFp4Config.from_config reads from the flat (config.json) form
    assert qc["quant_method"] == "modelopt" and qc["quant_algo"] == "NVFP4" and qc["group_size"] == 16
    assert qc["ignore"] == ["lm_head"] and qc["exclude_modules"] == ["lm_head"]
    # ModelOpt 0.47's form of the same (llm-compressor's schema), where group_size also lives
    group = qc["config_groups"]["group_0"]
    assert group["targets"] == ["Linear"]
    for operand in ("weights", "input_activations"):
        assert group[operand] == {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
    assert config["model_type"] == "llama" and config["hidden_size"] == 64
    legacy = json.loads((out / "hf_quant_config.json").read_text())
    assert legacy["quantization"]["quant_algo"] == "NVFP4" and legacy["quantization"]["group_size"] == 16
    assert legacy["quantization"]["exclude_modules"] == ["lm_head"]


def test_round_trip_is_bit_exact(exported, llama):
    model, out, ids, logits = exported
    fresh = llama(seed=123)
    load_nvfp4(fresh, out)
    layers = dict(nvfp4_layers(fresh))
    assert set(layers) == {name for name, _ in nvfp4_layers(model)}
    original = model.state_dict()
    for key, tensor in fresh.state_dict().items():
        if key.endswith("input_amax"):
            continue
        ref = original[key]
        if tensor.dtype == torch.float8_e4m3fn:
            tensor, ref = tensor.view(torch.uint8), ref.view(torch.uint8)
        if key.endswith("input_scale"):  # calibrated at export (fused siblings share the max)
            assert float(tensor) >= float(original[key.replace("input_scale", "input_amax")]) / 2688 * (
                1 - 1e-6
            )
            continue
        assert torch.equal(tensor, ref), key
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, logits)
    # re-export of the loaded model gives the same bytes
    again = out.parent / "again"
    export_nvfp4(fresh, again)
    first, second = _tensors(out), _tensors(again)
    assert first.keys() == second.keys()
    for key in first:
        a, b = first[key], second[key]
        if a.dtype == torch.float8_e4m3fn:
            a, b = a.view(torch.uint8), b.view(torch.uint8)
        assert torch.equal(a, b), key


def test_untied_lm_head_is_written_and_a_missing_tensor_is_refused_on_load(tmp_path, tiny_llama):
    model = tiny_llama(tie_word_embeddings=False, dtype=torch.bfloat16)
    quantize_model(model, forward_loop=lambda m: m(torch.randint(0, 256, (2, 8))))
    export_nvfp4(model, tmp_path / "untied")
    tensors = _tensors(tmp_path / "untied")
    assert torch.equal(tensors["lm_head.weight"], model.lm_head.weight)
    assert not torch.equal(tensors["lm_head.weight"], tensors["model.embed_tokens.weight"])
    # a checkpoint of a tied model lacks lm_head.weight: an untied model must not keep a random head
    tied = tiny_llama(tie_word_embeddings=True, dtype=torch.bfloat16)
    quantize_model(tied, forward_loop=lambda m: m(torch.randint(0, 256, (2, 8))))
    export_nvfp4(tied, tmp_path / "tied")
    with pytest.raises(CheckpointError, match=r"lacks 1 tensors.*lm_head\.weight.*tie_word_embeddings"):
        load_nvfp4(tiny_llama(tie_word_embeddings=False, dtype=torch.bfloat16), tmp_path / "tied")


def test_export_refuses_fused_moe_experts_it_cannot_write(tmp_path, tiny_causal_lm):
    """transformers keeps MoE experts as 3-D parameters (not nn.Linear): left in BF16 under their
    fused names they would not load in SGLang. The export says so and writes nothing."""
    model = tiny_causal_lm("Qwen2Moe")
    assert "model.layers.0.mlp.shared_expert_gate" not in quantize_model(model)  # a router-like gate
    with pytest.raises(CheckpointError, match=r"fused MoE expert weights.*experts\.gate_up_proj.*ModelOpt"):
        export_nvfp4(model, tmp_path / "moe", allow_uncalibrated=True)
    assert not (tmp_path / "moe").exists()


def test_export_needs_nvfp4_layers(tmp_path):
    with pytest.raises(CheckpointError, match="quantize_model"):
        export_nvfp4(nn.Sequential(nn.Linear(16, 16)), tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_load_rejects_a_directory_without_quantization_config(tmp_path, llama):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="quantization config"):
        load_nvfp4(llama(), tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_nvfp4(llama(), tmp_path / "missing")


def test_failed_export_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = nn.Sequential(nn.Linear(32, 32))
    quantize_model(model, exclude=())
    target = tmp_path / "ckpt"
    export_nvfp4(model, target, allow_uncalibrated=True)
    before = (target / "model.safetensors").read_bytes()

    import slime_gb10.nvfp4.checkpoint as checkpoint

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        export_nvfp4(model, target, allow_uncalibrated=True)
    assert (target / "model.safetensors").read_bytes() == before


def test_unfused_export_of_a_plain_module(tmp_path):
    # BF16 (the checkpoint stores biases and unquantized tensors in BF16)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 16, bias=False)).to(torch.bfloat16)
    quantize_model(model, exclude=())
    assert all(isinstance(m, NVFP4Linear) for m in (model[0], model[2]))
    export_nvfp4(model, tmp_path / "mlp", allow_uncalibrated=True)
    fresh = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 16, bias=False)).to(torch.bfloat16)
    load_nvfp4(fresh, tmp_path / "mlp")
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    assert torch.equal(fresh(x), model(x))


# --- found in review: the exported checkpoint must be what was trained / calibrated -----------------


def test_export_refuses_to_invent_an_activation_scale(tmp_path, llama):
    """SGLang quantizes activations with input_scale; an uncalibrated 1.0 would clip/flush them."""
    model = llama()
    quantize_model(model)
    with pytest.raises(CheckpointError, match="calibration"):
        export_nvfp4(model, tmp_path / "uncalibrated")
    assert not (tmp_path / "uncalibrated").exists()
    export_nvfp4(model, tmp_path / "knowingly", allow_uncalibrated=True)
    tensors = _tensors(tmp_path / "knowingly")
    assert float(tensors["model.layers.0.mlp.down_proj.input_scale"]) == 1.0


def test_export_config_says_bfloat16_even_for_an_fp32_model(tmp_path, llama):
    model = llama().to(torch.float32)
    model.config.torch_dtype = torch.float32
    quantize_model(model)
    with torch.no_grad(), calibration(model):
        model(torch.randint(0, 256, (1, 8)))
    export_nvfp4(model, tmp_path / "fp32")
    config = json.loads((tmp_path / "fp32" / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16" and config["dtype"] == "bfloat16"
    assert _tensors(tmp_path / "fp32")["model.norm.weight"].dtype == torch.bfloat16


def test_loading_into_a_master_weight_backend_keeps_the_activation_scale(exported, tmp_path, llama):
    _, out, _, _ = exported
    written = float(_tensors(out)["model.layers.0.mlp.down_proj.input_scale"])
    fresh = llama(seed=1)
    load_nvfp4(fresh, out, backend="qat")
    export_nvfp4(fresh, tmp_path / "again")
    assert float(_tensors(tmp_path / "again")["model.layers.0.mlp.down_proj.input_scale"]) == written


def test_qat_trains_with_the_scale_the_fused_checkpoint_stores(tmp_path, llama):
    """q/k/v share one weight_scale_2 in the checkpoint: QAT must fake-quantize k with it too."""
    model = llama()
    attn = model.model.layers[0].self_attn
    with torch.no_grad():
        attn.q_proj.weight.mul_(4.0)  # q's amax 4x k's: a per-layer scale would differ from the shared one
    quantize_model(model, backend="qat")
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    with torch.no_grad(), calibration(model):
        model(torch.randint(0, 256, (1, 8)))
    export_nvfp4(model, tmp_path / "qat")
    fresh = llama(seed=2)
    load_nvfp4(fresh, tmp_path / "qat", backend="reference")
    k_trained, k_served = attn.k_proj, fresh.model.layers[0].self_attn.k_proj
    with torch.no_grad():
        assert torch.equal(k_trained(x), k_served(x))


def test_excluding_one_fused_projection_excludes_its_group(llama):
    model = llama()
    with pytest.warns(UserWarning, match="fused siblings"):
        quantize_model(model, exclude=("lm_head", "*embed*", "*.layers.0.self_attn.k_proj"))
    attn = model.model.layers[0].self_attn
    assert all(type(getattr(attn, n)) is nn.Linear for n in ("q_proj", "k_proj", "v_proj"))
    assert isinstance(model.model.layers[1].self_attn.k_proj, NVFP4Linear)


def _corrupt_copy(src, dst, edit):
    """Copy the checkpoint ``src`` to ``dst`` with ``edit(tensors)`` applied to its tensors."""
    import shutil

    from safetensors.torch import save_file

    shutil.copytree(src, dst)
    tensors = _tensors(src)
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


_LAYER = "model.layers.0.mlp.down_proj"


def _set(key, value):
    return lambda t: t.__setitem__(key, value(t[key]))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            _set("model.embed_tokens.weight", lambda t: t[:1].clone()),
            "'model.embed_tokens.weight': expected bfloat16 [256, 64], found bfloat16 [1, 64]",
        ),
        (
            _set(f"{_LAYER}.weight_scale_2", lambda t: torch.full_like(t, float("nan"))),
            f"'{_LAYER}.weight_scale_2' holds NaN",
        ),
        (_set(f"{_LAYER}.weight", lambda t: t.to(torch.int16)), f"'{_LAYER}.weight': expected uint8"),
        (
            _set(f"{_LAYER}.weight", lambda t: t[:, : t.shape[1] // 2].clone()),
            f"'{_LAYER}.weight': expected uint8 [64, 64], found uint8 [64, 32]",
        ),
        (
            _set(f"{_LAYER}.weight_scale", lambda t: t[:, :-1].clone()),
            f"'{_LAYER}.weight_scale': expected float8_e4m3fn",
        ),
        (lambda t: t.pop(f"{_LAYER}.input_scale"), f"tensor '{_LAYER}.input_scale' is missing"),
        (_set(f"{_LAYER}.input_scale", lambda t: -t), f"'{_LAYER}.input_scale' must be positive"),
        (
            _set("model.norm.weight", lambda t: torch.full_like(t, float("inf"))),
            "'model.norm.weight' holds NaN or Inf",
        ),
    ],
)
def test_load_refuses_a_corrupt_checkpoint_before_touching_the_model(
    exported, llama, tmp_path, edit, message
):
    _, out, _, _ = exported
    bad = _corrupt_copy(out, tmp_path / "bad", edit)
    model = llama(seed=5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError) as info:
        load_nvfp4(model, bad)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert not list(nvfp4_layers(model))  # no layer was replaced
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
