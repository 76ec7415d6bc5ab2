"""``slime-gb10 bench grpo``: the cost model by hand and against transformers, the plumbing on CPU.

The timings themselves need a GPU (the command refuses without one); here a tiny shape runs the
same instrumented trainer on CPU with given ceilings, and every formula is checked on numbers
worked out by hand.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import transformers
from click.testing import CliRunner

from slime_gb10.bench.grpo import (
    SHAPES,
    ModelCosts,
    Shape,
    bench_grpo_command,
    decode_roofline_bytes,
    format_table,
    model_costs,
    rollout_roofline_s,
    run_shape,
    summarize,
    train_flops,
)
from slime_gb10.grpo.models import random_model_config


@pytest.mark.parametrize("name", list(SHAPES))
def test_model_costs_count_the_parameters_transformers_builds(name):
    shape = SHAPES[name]
    config = random_model_config(vocab_size=shape.vocab, **shape.model_sizes())  # what bench grpo writes
    with torch.device("meta"):  # shapes only: no memory for the 1.5B model
        model = transformers.AutoModelForCausalLM.from_config(config)
    costs = model_costs(shape)
    assert costs.params == sum(p.numel() for p in model.parameters())
    assert costs.kv_bytes_per_token == 2 * shape.layers * shape.kv_heads * shape.head_dim * 2
    # NVFP4 rollouts: the decoder's linear weights (transformers' *_proj matrices) at 9/16 byte
    linear = sum(
        p.numel()
        for n, p in model.named_parameters()
        if n.startswith("model.layers.") and n.endswith("_proj.weight")
    )
    assert costs.nvfp4_weight_bytes == costs.weight_bytes - 2 * linear + linear * 9 // 16


def test_model_costs_of_shape_b_match_the_issue():
    """Issue #27: shape B has 402M parameters and 12 KB of KV cache per token (BF16)."""
    costs = model_costs(SHAPES["B"])
    assert round(costs.params / 1e6) == 402
    assert costs.kv_bytes_per_token == 12 * 1024
    assert costs.weight_bytes == 2 * costs.params  # tied: the embedding is read as the LM head


def test_untied_embedding_is_neither_read_nor_multiplied_per_token():
    tied = model_costs(replace(SHAPES["A"], tied=True))
    untied = model_costs(replace(SHAPES["A"], tied=False))
    head = SHAPES["A"].vocab * SHAPES["A"].hidden
    assert untied.params == tied.params + head
    assert untied.matmul_params == tied.matmul_params  # lookup free, head multiplied: same work
    assert untied.weight_bytes == tied.weight_bytes  # the lookup table is not streamed


COSTS = ModelCosts(params=0, matmul_params=10, weight_bytes=100, kv_bytes_per_token=10, layers=1, attn_dim=2)


def test_decode_roofline_bytes_by_hand():
    # prompts 2 and 3 tokens, completions 3 and 1: the prefill gives both first tokens; step 1 reads
    # the weights + seq 0's 2+1 tokens (seq 1 is done), step 2 the weights + seq 0's 2+2 tokens
    assert decode_roofline_bytes([2, 3], [3, 1], COSTS) == (100 + 3 * 10) + (100 + 4 * 10)
    assert decode_roofline_bytes([5], [1], COSTS) == 0  # one token: the prefill alone
    assert decode_roofline_bytes([], [], COSTS) == 0


def test_rollout_roofline_adds_the_prefill_at_the_slower_of_its_two_limits():
    # 270 decode bytes at 1 GB/s = 270 ns; prefill: 2*10*5 = 100 FLOP at 1 TFLOP/s = 0.1 ns, but the
    # weights (100 bytes) must be read once: 100 ns
    assert rollout_roofline_s([2, 3], [3, 1], COSTS, gbps=1.0, tflops=1.0) == pytest.approx(370e-9)
    # a long prompt at a slow GEMM rate is compute bound: 2*10*5e6 FLOP at 1e-6 TFLOP/s = 100 s
    assert rollout_roofline_s([5_000_000], [1], COSTS, gbps=1.0, tflops=1e-6) == pytest.approx(100.0)


def test_train_flops_by_hand():
    # one 4-token sequence: 6 * 10 * 4 = 240 matmul FLOPs; causal attention 3 * 2*L*d*T^2 = 3 * 2*1*2*16 = 192
    assert train_flops([4], COSTS) == 240 + 192
    # one extra forward (old-policy recompute): 8 * 10 * 4 + 4 * 64
    assert train_flops([4], COSTS, extra_forwards=1) == 320 + 256
    assert train_flops([1, 2], COSTS) == 6 * 10 * 3 + 3 * (4 * 1 + 4 * 4)


TINY = Shape("tiny", "2-layer Llama", "llama", 64, 2, 4, 2, 128, 49152, 2, 2, 6)


def test_run_shape_reports_every_step_on_cpu(tmp_path, tokenizer):
    """The instrumented trainer on a tiny shape (CPU, given ceilings): one row per step, the rollout
    fraction computed from the lengths the engine really produced."""
    tok_dir = tmp_path / "tok"
    tokenizer.save_pretrained(tok_dir)
    ceilings = {"copy_gbps": 10.0, "bf16_tflops": 1.0, "datasheet_gbps": 20.0, "datasheet_bf16_tflops": 2.0}
    result = run_shape(
        TINY, ceilings, work_dir=tmp_path, tokenizer_dir=str(tok_dir), steps=2, micro_batch_size=4
    )
    steps = result["steps"]
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert 0 < s["rollout_tokens"] <= TINY.prompts * TINY.group * TINY.max_new_tokens
        assert s["rollout_roofline_s"] == pytest.approx(s["rollout_roofline_frac"] * s["rollout_s"])
        # twice the datasheet bandwidth and GEMM rate: exactly half the roofline time
        assert s["rollout_roofline_frac_datasheet"] == pytest.approx(s["rollout_roofline_frac"] / 2)
        assert s["mfu_datasheet"] == pytest.approx(s["mfu"] / 2)
        assert s["train_tokens"] > s["rollout_tokens"]  # prompt + completion
    summary = summarize(result)
    assert summary["step_s"] == steps[1]["step_s"]  # the first step is the warm-up
    result.update(summary=summary)
    table = format_table({"ceilings": {**ceilings, "device": "cpu"}, "shapes": [result]})
    assert "| tiny (2-layer Llama) |" in table and "2×2" in table


def test_nvfp4_rollouts_add_the_roofline_from_the_codes_as_a_projection(tmp_path, tokenizer, monkeypatch):
    """--rollout-weights nvfp4 sets rollout.weights; each step gets the decode roofline with 9/16-byte
    linear weights (below the BF16 one), and the table says it is a projection."""
    tok_dir = tmp_path / "tok"
    tokenizer.save_pretrained(tok_dir)
    ceilings = {"copy_gbps": 10.0, "bf16_tflops": 1.0}
    result = run_shape(
        TINY, ceilings, work_dir=tmp_path, tokenizer_dir=str(tok_dir), steps=2, micro_batch_size=4,
        settings={"rollout.weights": "nvfp4"},
    )  # fmt: skip
    for s in result["steps"]:
        assert 0 < s["rollout_roofline_nvfp4_s"] < s["rollout_roofline_s"]
        assert s["nvfp4_codes_changed"] is None or 0 <= s["nvfp4_codes_changed"] < 1
    result.update(summary=summarize(result))
    table = format_table({"ceilings": {**ceilings, "device": "cpu"}, "shapes": [result]})
    assert "a projection from bytes, not a measurement" in table
    seen = {}
    monkeypatch.setattr(
        "slime_gb10.bench.grpo.run_benchmark",
        lambda names, **kw: seen.update(kw) or {"ceilings": {}, "shapes": []},
    )
    monkeypatch.setattr("slime_gb10.bench.grpo.format_table", lambda result: "")
    out = CliRunner().invoke(
        bench_grpo_command, ["--shapes", "A", "--tokenizer", "t", "--rollout-weights", "nvfp4"]
    )
    assert out.exit_code == 0, out.output
    assert seen["settings"] == {"rollout.weights": "nvfp4"}


def test_command_refuses_unknown_shapes_and_a_machine_without_gpu():
    runner = CliRunner()
    bad = runner.invoke(bench_grpo_command, ["--shapes", "A,Z"])
    assert bad.exit_code == 2 and "unknown shape(s) Z" in bad.output
    no_value = runner.invoke(bench_grpo_command, ["--set", "rollout.compile_decode"])
    assert no_value.exit_code == 2 and "expected section.key=value" in no_value.output
    if not torch.cuda.is_available():
        no_gpu = runner.invoke(bench_grpo_command, ["--shapes", "A", "--tokenizer", "unused"])
        assert no_gpu.exit_code == 1 and "needs a CUDA GPU" in no_gpu.output
