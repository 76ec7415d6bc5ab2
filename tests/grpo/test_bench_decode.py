"""``slime-gb10 bench decode``: its shapes, batches, table and refusals (CPU); one tiny run (GPU)."""

from __future__ import annotations

import click
import pytest
import torch
from click.testing import CliRunner

from slime_gb10.bench import decode
from slime_gb10.bench.grpo import Shape, model_costs


def test_batches_and_the_grpo_batch():
    b = decode.DECODE_SHAPES["B"]
    assert decode.parse_batches("64,1,8,grpo,8", b) == [1, 8, 64, b.prompts * b.group] == [1, 8, 64, 160]
    with pytest.raises(click.UsageError, match="'0' is neither"):
        decode.parse_batches("1,0", b)


def test_the_7b_shape_is_qwen2_5_7b_s_body():
    """Counted on the real transformers model (meta tensors: no memory) and by model_costs' hand
    formula: Qwen2.5-7B has 7.07 B parameters with its 152,064-token vocabulary; with SmolLM2's
    49,152 (untied head) 6.33 B."""
    import transformers

    from slime_gb10.grpo.models import random_model_config

    shape = decode.DECODE_SHAPES["7b"]
    config = random_model_config(vocab_size=shape.vocab, **shape.model_sizes())
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    real = sum(p.numel() for p in model.parameters())
    assert real == model_costs(shape).params
    with_qwen_vocab = real + 2 * (152_064 - 49_152) * 3584
    assert round(with_qwen_vocab / 1e9, 2) == 7.62  # Qwen2.5-7B's 7.61 B: its config rounds the same
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (3584, 28, 18944)
    assert (config.num_attention_heads, config.num_key_value_heads) == (28, 4)


def test_the_table_compares_each_row_with_bf16_at_the_same_batch():
    row = {
        "shape": "B", "batch": 8, "step_ms": 2.0, "step_tokens_per_s": 4000.0, "step_bytes": 1e9,
        "roofline_ms": 0.5, "roofline_frac": 0.25, "rollout_tokens_per_s": 1000.0, "gb10_bound_tokens_per_s": 2184.0,
    }  # fmt: skip
    result = {
        "ceilings": {"device": "X", "copy_gbps": 2000.0, "bf16_tflops": 600.0},
        "rows": [{**row, "weights": "bf16"}, {**row, "weights": "nvfp4", "step_ms": 1.0, "rollout_tokens_per_s": 1500.0}],
    }  # fmt: skip
    lines = decode.format_table(result).splitlines()
    assert lines[3].split("|")[6].strip() == "1.00" and lines[4].split("|")[6].strip() == "2.00"
    assert lines[4].split("|")[11].strip() == "1.50"


def test_without_a_gpu_the_command_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = CliRunner().invoke(decode.bench_decode_command, ["--shapes", "B"])
    assert out.exit_code == 2 and "needs a CUDA GPU" in out.output


@pytest.mark.gpu
def test_a_tiny_decode_bench_reads_fewer_bytes_from_codes(tokenizer):
    """On a GPU: both engines capture their steps, and at batch 1 the NVFP4 engine's step reads the
    codes (9/32 of the BF16 bytes of its linear layers, plus the scale codes)."""
    tiny = Shape("t", "tiny", "llama", 256, 2, 4, 2, 512, 49152, 2, 2, 16)
    ceilings = {"copy_gbps": 2000.0}
    rows = {
        w: decode.measure(tiny, w, [1, 4], ceilings, tokenizer, prompt_tokens=8, new_tokens=8)
        for w in ("bf16", "nvfp4")
    }
    for kind in rows.values():
        assert [r["batch"] for r in kind] == [1, 4] and all(
            r["cuda_graph"] and r["step_ms"] > 0 for r in kind
        )
    weights = 2 * (256 * 256 * 2 + 2 * 256 * 128 + 3 * 256 * 512)  # two layers' q, o, k, v, gate, up, down
    codes = weights // 2 + weights // 16 + 2 * 4 * 4  # codes, scale codes, a layer's 4 global scales
    saved = rows["bf16"][0]["weight_bytes"] - rows["nvfp4"][0]["weight_bytes"]
    assert saved == 2 * weights - codes
