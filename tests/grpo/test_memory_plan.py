"""The memory plan (issue #41): the parts of the estimate against hand-derived numbers and real
``transformers`` models, the budget's sources (MemAvailable on unified memory, the GPU's free memory
on a discrete GPU), the refusal through the real CLI (one line, nothing left behind) and the logged
plan; on a GPU, the estimate against a short real run's measured peak."""

from __future__ import annotations

import logging
import types

import pytest
import torch
import transformers
from click.testing import CliRunner

from slime_gb10.cli import main
from slime_gb10.grpo import memory_plan as mp
from slime_gb10.grpo.config import ConfigError, build_config
from slime_gb10.grpo.models import write_random_model
from slime_gb10.grpo.prompts import longest_prompt
from slime_gb10.grpo.rundir import run_outputs
from slime_gb10.platform import host_memory

# hidden 64, 2 layers, 4 heads of 16, 2 KV heads, MLP 128 (models.random_model_config's defaults)
H, LAYERS, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB = 64, 2, 4, 2, 16, 128, 1000


def llama(**extra):
    sizes = dict(
        hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        intermediate_size=MLP, vocab_size=VOCAB, tie_word_embeddings=True,
    )  # fmt: skip
    return transformers.LlamaConfig(**{**sizes, **extra})


def real_params(hf_config) -> int:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())  # a tied LM head counted once


def config(**overrides):
    base = {"eval.every": 0, "eval.at_end": False}
    return build_config(overrides={**base, **overrides})


# ------------------------------------------------------------------- parameters and the resident parts
def test_tiny_llama_by_hand():
    # embedding V h; per layer q h*h, k and v h*(2*16) each, o h*h, gate/up/down 3*h*MLP, two norms 2h;
    # the final norm h; tied head
    per_layer = H * H + 2 * H * (KV_HEADS * HEAD_DIM) + H * H + 3 * H * MLP + 2 * H
    by_hand = VOCAB * H + LAYERS * per_layer + H
    assert by_hand == real_params(llama()) == 138_048
    plan = mp.estimate(config(), llama(), device="cpu")
    assert plan.params == by_hand
    assert plan.parts["trainer weights"] == 4 * by_hand  # FP32 master weights
    assert plan.parts["AdamW states"] == 8 * by_hand  # two FP32 moments
    assert plan.parts["gradients"] == 4 * by_hand  # FP32
    assert plan.parts["rollout weights"] == 4 * by_hand  # the engine's copy, FP32 on a CPU
    gpu = mp.estimate(config(), llama(), device="cuda")
    assert gpu.parts["rollout weights"] == 2 * by_hand  # BF16 on a GPU
    assert gpu.parts["overhead"] == 2**29  # CUDA context
    assert "overhead" not in plan.parts
    fp32 = mp.estimate(config(**{"model.precision": "float32"}), llama(), device="cuda")
    assert fp32.parts["rollout weights"] == 4 * by_hand and "BF16 weight casts" not in fp32.parts
    # NVFP4 rollouts keep the last sync's codes and scales: 9/16 byte per decoder linear weight
    linear = LAYERS * (H * H + 2 * H * (KV_HEADS * HEAD_DIM) + H * H + 3 * H * MLP)
    nvfp4 = mp.estimate(config(**{"rollout.weights": "nvfp4"}), llama(), device="cuda")
    assert nvfp4.parts["NVFP4 sync codes"] == linear * 9 // 16 and "NVFP4 sync codes" not in gpu.parts
    # ... and the torch engine, decoding from the codes, holds codes, scales and scale codes: 10/16 byte
    assert nvfp4.parts["NVFP4 engine codes"] == linear * 10 // 16 and "NVFP4 engine codes" not in gpu.parts
    # FSDP over 4 ranks: a quarter of the weights, moments and gradients, plus what is whole at once:
    # the root group (embedding = tied head, final norm) and its gradient, and three layers', gathered
    # as BF16 under autocast (no BF16 casts of them then), FP32 under NVFP4 QAT
    fsdp = mp.estimate(config(**{"train.sharding": "fsdp"}), llama(), device="cuda", world_size=4)
    assert (
        fsdp.parts["trainer weights"] == 4 * by_hand // 4 and fsdp.parts["AdamW states"] == 8 * by_hand // 4
    )
    assert fsdp.parts["gradients"] == 4 * by_hand // 4
    outer = VOCAB * H + H
    assert fsdp.parts["FSDP gathered weights"] == 2 * (2 * outer + 3 * (by_hand - outer) // LAYERS)
    assert "BF16 weight casts" not in fsdp.parts and gpu.parts["BF16 weight casts"] > 0
    qat = mp.estimate(config(**{"train.sharding": "fsdp", "rollout.weights": "nvfp4"}), llama(), device="cuda",
                      world_size=4)  # fmt: skip
    assert qat.parts["FSDP gathered weights"] == 4 * (2 * outer + 3 * (by_hand - outer) // LAYERS)
    assert qat.parts["BF16 weight casts"] == gpu.parts["BF16 weight casts"]
    assert "FSDP gathered weights" not in mp.estimate(config(), llama(), device="cuda", world_size=4).parts
    on_cpu = mp.estimate(config(**{"rollout.weights": "nvfp4"}), llama(), device="cpu")
    assert "NVFP4 engine codes" not in on_cpu.parts  # "auto" on a CPU: the HF forward, no codes


@pytest.mark.parametrize(
    "hf_config",
    [
        llama(),
        llama(tie_word_embeddings=False),
        llama(attention_bias=True, mlp_bias=True),
        transformers.Qwen2Config(
            hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
            intermediate_size=MLP, vocab_size=VOCAB, tie_word_embeddings=True,
        ),
        transformers.Qwen3Config(
            hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
            head_dim=32, intermediate_size=MLP, vocab_size=VOCAB, tie_word_embeddings=False,
        ),
    ],
    ids=["llama", "llama-untied", "llama-biases", "qwen2", "qwen3-head-dim-32"],
)  # fmt: skip
def test_parameter_count_is_the_real_models(hf_config):
    n = real_params(hf_config)
    assert mp.parameter_count(mp.Shapes.from_hf(hf_config)) == n
    plan = mp.estimate(config(), hf_config, device="cuda")
    assert plan.parts["trainer weights"] + plan.parts["AdamW states"] + plan.parts["gradients"] == 16 * n


def test_reference_model_and_megatron_bytes():
    n = real_params(llama())
    with_ref = mp.estimate(config(**{"algo.ref_kl_metric": True}), llama(), device="cuda")
    assert with_ref.parts["reference model"] == 4 * n
    assert "reference model" not in mp.estimate(config(), llama(), device="cuda").parts
    megatron = mp.estimate(config(), llama(), device="cuda", trainer="megatron")
    assert megatron.parts["trainer weights"] == 6 * n  # BF16 weights + FP32 main copy
    # its distributed optimizer on 4 ranks: a quarter of the FP32 main copy and of the moments each;
    # the BF16 weights and the FP32 gradient buffer stay whole (ZeRO-1)
    zero1 = config(**{"megatron.use_distributed_optimizer": True})
    four = mp.estimate(zero1, llama(), device="cuda", trainer="megatron", world_size=4)
    assert four.parts["trainer weights"] == 2 * n + 4 * n // 4 and four.parts["AdamW states"] == 8 * n // 4
    assert four.parts["gradients"] == 4 * n
    assert mp.estimate(zero1, llama(), device="cuda", trainer="megatron").parts["trainer weights"] == 6 * n
    # tensor parallelism over 2: half the weights, main weights, moments, gradients and reference each
    tp2 = config(**{"megatron.tensor_parallel_size": 2, "algo.ref_kl_metric": True})
    split = mp.estimate(tp2, llama(), device="cuda", trainer="megatron", world_size=2)
    assert split.parts["trainer weights"] == 6 * n // 2 and split.parts["AdamW states"] == 8 * n // 2
    assert split.parts["gradients"] == 4 * n // 2 and split.parts["reference model"] == 2 * n // 2
    assert split.parts["rollout weights"] == megatron.parts["rollout weights"]  # the engine's whole copy
    # the heads', MLP's and vocabulary's activations are split too, the hidden-wide ones are not
    # (a group trains on both its ranks' rows: the micro-batch of one rank holding all the prompts)
    tp1 = mp.estimate(config(**{"algo.ref_kl_metric": True}), llama(), device="cuda", trainer="megatron")
    assert tp1.parts["activations"] / 2 < split.parts["activations"] < tp1.parts["activations"]


def test_megatrons_fallback_adamw_steps_with_a_temporary_of_each_second_moment(monkeypatch):
    """Without TransformerEngine or Apex, Megatron-core steps torch's foreach AdamW, whose update
    makes a temporary square root of every second moment it steps (4 bytes each) after the
    activations are freed: a phase of its own. Measured at 7B and TP=2 on H200s (BENCHMARKS.md): the
    peak was 6.56 GiB above the training step's plan, which this phase adds back (6.57 GiB)."""
    model = llama(hidden_size=1024, intermediate_size=4096, num_hidden_layers=8)  # 0.1B: the state dominates
    n = mp.parameter_count(mp.Shapes.from_hf(model))
    small = {"train.micro_batch_size": 1, "rollout.prompts_per_step": 4, "rollout.group_size": 2,
             "rollout.max_new_tokens": 8}  # fmt: skip
    kw = {"device": "cuda", "trainer": "megatron", "world_size": 2}
    tp2 = config(**small, **{"megatron.tensor_parallel_size": 2})
    monkeypatch.setattr(mp, "megatron_steps_torch_adamw", lambda: True)
    plan = mp.estimate(tp2, model, **kw)
    assert plan.phase == "optimizer step", plan.describe()
    assert plan.parts["AdamW step temporaries"] == 4 * n // 2 and plan.parts["gradients"] == 4 * n // 2
    resident = 6 * n // 2 + 8 * n // 2 + plan.parts["rollout weights"] + plan.parts["KV cache"] + mp.GIB // 2
    assert plan.total == resident + 4 * n // 2 + 4 * n // 2
    zero1 = config(**small, **{"megatron.use_distributed_optimizer": True})  # each rank steps its shard
    assert mp.estimate(zero1, model, **kw).parts["AdamW step temporaries"] == 4 * n // 2
    assert (
        "AdamW step temporaries" not in mp.estimate(tp2, model, **{**kw, "trainer": "torch"}).parts
    )  # fused
    monkeypatch.setattr(mp, "megatron_steps_torch_adamw", lambda: False)  # TE's or Apex's FusedAdam
    assert mp.estimate(tp2, model, **kw).phase == "training step"


def test_a_distributed_optimizers_checkpoint_gathers_onto_rank_0s_host_memory():
    """Megatron's distributed optimizer saves by gathering its FP32 main weights and moments onto rank
    0's host memory: 12 bytes a parameter whatever the world size, beside the 4-byte gradient buffer.
    On host memory (a GB10) that is the memory planned, a phase of its own; on a discrete GPU it is
    not the GPU's. The refusal points to FSDP, whose ranks each write their shards."""
    model = llama(hidden_size=512, intermediate_size=2048, num_hidden_layers=4)  # 10M: the state dominates
    n = mp.parameter_count(mp.Shapes.from_hf(model))
    zero1 = config(**{"megatron.use_distributed_optimizer": True, "train.micro_batch_size": 1,
                      "rollout.prompts_per_step": 4, "rollout.group_size": 2, "rollout.max_new_tokens": 8})  # fmt: skip
    kw = {"device": "cuda", "trainer": "megatron", "world_size": 4}
    host = mp.estimate(zero1, model, host_memory=True, **kw)
    assert host.phase == "checkpoint save", host.describe()
    assert host.parts["checkpoint gather (rank 0)"] == 12 * n and host.parts["gradients"] == 4 * n
    resident = (2 * n + 4 * n // 4) + 8 * n // 4 + host.parts["rollout weights"]
    assert host.exact == resident + 4 * n + 12 * n
    text = mp.refusal(zero1, host, 2**20, "test", "cuda:0", world_size=4)
    assert "--trainer torch --set train.sharding=fsdp" in text and "checkpoint save" in text
    discrete = mp.estimate(zero1, model, **kw)
    assert discrete.phase != "checkpoint save" and "checkpoint gather (rank 0)" not in discrete.parts
    # tensor parallelism over 4 gathers the whole BF16 weights too (tp_checkpoint.py): 14 bytes
    tp4 = config(**{"megatron.tensor_parallel_size": 4, "train.micro_batch_size": 1, "rollout.prompts_per_step": 4,
                    "rollout.group_size": 2, "rollout.max_new_tokens": 8})  # fmt: skip
    host = mp.estimate(tp4, model, host_memory=True, **kw)
    assert host.phase == "checkpoint save" and host.parts["checkpoint gather (rank 0)"] == 14 * n
    assert host.parts["gradients"] == 4 * n // 4
    assert "checkpoint gather (rank 0)" not in mp.estimate(config(), model, host_memory=True, **kw).parts


def test_a_tensor_parallel_checkpoint_of_a_7b_model_holds_a_file_at_a_time_on_rank_0(monkeypatch):
    """Under tensor parallelism rank 0 gathers whole tensors and writes them a file at a time
    (tp_checkpoint.write_whole_state): its host memory holds a file's tensors (1 GiB, or one larger
    tensor), their serialised copy, the tensor on its way, and on a GB10 its gathered shards and
    merged copy: 2 max(2^30, L) + 3 L, not 14 bytes a parameter (90 GiB at 7B). By hand for the 7B
    shape with SmolLM2's vocabulary (hidden 3584, vocabulary 49,152, MLP 18,944): L, the FP32 head,
    4 x 3584 x 49152 = 704,643,072 bytes; 2 x 2^30 + 3 L = 4,261,412,864. So a 7B model at TP=2 fits
    a GB10's 128 GB while it saves."""
    monkeypatch.setattr(mp, "megatron_steps_torch_adamw", lambda: False)  # a GB10: TE's FusedAdam
    seven = transformers.Qwen2Config(
        hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
        intermediate_size=18944, vocab_size=49152, tie_word_embeddings=False,
    )  # fmt: skip
    tp2 = config(**{"megatron.tensor_parallel_size": 2, "rollout.prompts_per_step": 2, "rollout.group_size": 2,
                    "train.micro_batch_size": 1, "megatron.recompute_granularity": "full"})  # fmt: skip
    plan = mp.estimate(tp2, seven, device="cuda", trainer="megatron", world_size=2, host_memory=True)
    assert plan.phase == "checkpoint save", plan.describe()
    assert plan.parts["checkpoint gather (rank 0)"] == 4_261_412_864
    # Qwen2.5-7B's own vocabulary, 152,064: its FP32 head, 4 x 3584 x 152064 = 2,179,989,504 bytes,
    # is more than a file's gigabyte and goes alone: 5 x 2,179,989,504 = 10,899,947,520
    big = mp.estimate(tp2, transformers.Qwen2Config(**{**seven.to_dict(), "vocab_size": 152064}),
                      device="cuda", trainer="megatron", world_size=2, host_memory=True)  # fmt: skip
    assert big.parts["checkpoint gather (rank 0)"] == 10_899_947_520
    at_once = (
        plan.total
        - plan.parts["checkpoint gather (rank 0)"]
        + 14 * mp.parameter_count(mp.Shapes.from_hf(seven))
    )
    assert plan.total < 0.9 * 128e9 < at_once  # all of it gathered at once would not fit


# ------------------------------------------------------------------- KV cache, decode rows
def test_static_kv_cache_by_hand():
    # P=4 prompts x G=4 = 16 rows; cache of 256 + 32 = 288 slots rounded up to 320 (multiples of 64)
    kv_per_token = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2  # K and V, BF16
    plan = mp.estimate(config(), llama(), device="cuda")
    assert plan.parts["KV cache"] == kv_per_token * 320 * 16
    # the data's longest prompt (40 tokens): 40 + 32 -> 128 slots
    short = mp.estimate(config(), llama(), device="cuda", prompt_tokens=40)
    assert short.parts["KV cache"] == kv_per_token * 128 * 16
    # never more than max_prompt_tokens
    assert (
        mp.estimate(config(), llama(), device="cuda", prompt_tokens=10**6).parts["KV cache"]
        == (plan.parts["KV cache"])
    )


def test_decode_batches_keep_a_cache_each():
    # 16 rows in generation batches of 6: 6, 6, 4 -> caches (6, L) and (4, L), 10 rows in all
    kv_per_token = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2
    plan = mp.estimate(config(**{"rollout.generation_batch_size": 6}), llama(), device="cuda")
    assert plan.parts["KV cache"] == kv_per_token * 320 * 10
    # eval: 32 held-out prompts greedy (+ 2 x 32 sampled), 64 new tokens: 64 + 256 -> 320 slots
    evals = config(**{"eval.every": 5, "eval.num_prompts": 32, "eval.k": 2, "eval.max_new_tokens": 64})
    plan = mp.estimate(evals, llama(), device="cuda")
    assert plan.parts["KV cache"] == kv_per_token * 320 * (16 + 32 + 64)


def test_cpu_decodes_with_a_dynamic_cache_freed_after_the_rollout():
    kv_per_token = 2 * LAYERS * KV_HEADS * HEAD_DIM * 4  # FP32 on a CPU
    plan = mp.estimate(config(), llama(), device="cpu")
    assert "KV cache" not in plan.parts  # not resident
    rollout = plan.other_phase if plan.phase == "training step" else plan.parts
    assert rollout["KV cache (decoding)"] == kv_per_token * (256 + 32) * 16
    # two ranks: each decodes its half of the prompts
    half = mp.estimate(config(), llama(), device="cpu", world_size=2)
    rollout = half.other_phase if half.phase == "training step" else half.parts
    assert rollout["KV cache (decoding)"] == kv_per_token * (256 + 32) * 8


# ------------------------------------------------------------------- activations
def test_activations_scale_with_the_micro_batch_and_checkpointing_shrinks_them():
    big = config(**{"rollout.prompts_per_step": 16, "rollout.group_size": 8, "train.micro_batch_size": 64})
    act = mp.estimate(big, llama(), device="cuda").parts["activations"]
    half = config(**{"rollout.prompts_per_step": 16, "rollout.group_size": 8, "train.micro_batch_size": 32})
    assert mp.estimate(half, llama(), device="cuda").parts["activations"] * 2 == act
    # the micro-batch never holds more than a step's rollouts (16 here, whatever micro_batch_size says)
    assert (
        mp.estimate(config(**{"train.micro_batch_size": 16}), llama(), device="cuda").parts["activations"]
        == mp.estimate(config(**{"train.micro_batch_size": 512}), llama(), device="cuda").parts["activations"]
    )
    ckpt = config(**{"rollout.prompts_per_step": 16, "rollout.group_size": 8, "train.micro_batch_size": 64,
                     "model.gradient_checkpointing": True})  # fmt: skip
    smol = transformers.LlamaConfig(hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                                    num_key_value_heads=3, intermediate_size=1536, vocab_size=49152)  # fmt: skip
    assert mp.estimate(ckpt, smol).parts["activations"] < mp.estimate(big, smol).parts["activations"] / 5


def test_activation_constant_against_saved_tensors():
    """The per-token, per-layer bound holds what a real layer saves for the backward (FP32 on a CPU)."""
    hf = llama(num_hidden_layers=1)
    model = transformers.AutoModelForCausalLM.from_config(hf).model
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    sizes = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            sizes[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    def saved(tokens):
        sizes.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=torch.randint(0, VOCAB, (1, tokens)), use_cache=False)
        return sum(sizes.values())

    per_token = (saved(256) - saved(128)) / 128  # the layer + the final norm, per token
    bound = mp.activation_bytes_per_token(mp.Shapes.from_hf(hf), autocast=False) + 12 * H
    assert 0.7 * bound <= per_token <= bound


# ------------------------------------------------------------------- the budget
def test_host_available_reads_meminfo_and_a_lower_cgroup_limit(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       131072000 kB\nMemAvailable:   100000000 kB\n")
    assert host_memory.host_available(meminfo, tmp_path / "none") == (
        100000000 * 1024,
        "MemAvailable in /proc/meminfo",
    )
    cgroup = tmp_path / "cg"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text("123\n")
    assert host_memory.host_available(meminfo, cgroup)[0] == 100000000 * 1024  # no limit
    (cgroup / "memory.max").write_text(str(8 * 2**30))
    (cgroup / "memory.current").write_text(str(2**30))
    free, source = host_memory.host_available(meminfo, cgroup)
    assert free == 7 * 2**30 and "memory.max" in source
    # page cache the kernel can reclaim (inactive_file) is headroom, not use
    (cgroup / "memory.stat").write_text(f"anon 1000\ninactive_file {2**29}\nactive_file 7\n")
    assert host_memory.host_available(meminfo, cgroup)[0] == 7 * 2**30 + 2**29
    assert host_memory.host_available(tmp_path / "missing", tmp_path / "none") == (None, "no /proc/meminfo")


def fake_cuda(monkeypatch, capability, name):
    props = types.SimpleNamespace(major=capability[0], minor=capability[1], name=name, is_integrated=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(host_memory, "host_available", lambda: (100 * 2**30, "MemAvailable in /proc/meminfo"))


def test_a_gb10_budgets_with_memavailable_not_nvml(monkeypatch):
    fake_cuda(monkeypatch, (12, 1), "NVIDIA GB10")

    def nvml_like(index):
        raise AssertionError("unified memory: the GPU's own free-memory query must not be used")

    monkeypatch.setattr(torch.cuda, "mem_get_info", nvml_like)
    free, source = host_memory.available("cuda")
    assert free == 100 * 2**30 and "MemAvailable" in source and "shares the host's memory" in source


def test_a_discrete_gpu_budgets_with_its_free_memory(monkeypatch):
    fake_cuda(monkeypatch, (9, 0), "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (70 * 2**30, 80 * 2**30))
    free, source = host_memory.available("cuda:0")
    assert free == 70 * 2**30 and "mem_get_info" in source


# ------------------------------------------------------------------- the check
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tokenizer):
    return write_random_model(tmp_path_factory.mktemp("tiny") / "model", tokenizer, seed=0)


def test_check_refuses_fits_or_is_off(tiny_dir, caplog):
    cfg = config(**{"model.name_or_path": str(tiny_dir), "backends.device": "cpu"})
    cfg.train.memory_budget_gib = 0.01
    with pytest.raises(mp.MemoryPlanError) as refused:
        mp.check(cfg)
    assert isinstance(refused.value, ConfigError)  # the CLI prints it as one line
    message = str(refused.value)
    assert "\n" not in message and "train.memory_budget_gib=0.01" in message
    cfg.train.memory_budget_gib = 1000
    with caplog.at_level(logging.INFO, logger=mp.__name__):
        plan = mp.check(cfg, prompt_tokens=30)
    assert plan is not None and plan.total < 1000 * 2**30
    assert any(r.getMessage().startswith("memory plan: about") for r in caplog.records)
    cfg.train.memory_budget_gib = 0
    assert mp.check(cfg) is None
    # two torchrun ranks on one host share its memory: a budget for one run is too small for both
    cfg.train.memory_budget_gib = plan.total * 1.5 / 2**30
    assert mp.check(cfg, prompt_tokens=30) is not None
    with pytest.raises(mp.MemoryPlanError, match=r"\(2 ranks x "):
        mp.check(cfg, prompt_tokens=30, ranks_per_host=2)


def train(tiny_dir, out, *extra):
    result = CliRunner().invoke(main, [
        "train", "--model", str(tiny_dir), "--output", str(out), "--device", "cpu", "--steps", "1",
        "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "2", "--no-progress",
        "--eval-every", "0", "--set", "data.eval_size=4", *extra,
    ])  # fmt: skip
    assert "Traceback" not in result.output, result.output
    return result


def test_the_cli_refuses_a_run_over_budget_in_one_line(tmp_path, tiny_dir):
    run = tmp_path / "run"
    result = train(tiny_dir, run, "--set", "train.memory_budget_gib=0.001")
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("Error: memory plan:"), result.output
    for setting in (
        "train.micro_batch_size",
        "rollout.prompts_per_step x rollout.group_size",
        "rollout.max_new_tokens",
        "model.gradient_checkpointing",
        "train.memory_budget_gib",
        "biggest parts: ",
    ):
        assert setting in errors[0], errors[0]
    assert not run.exists()  # the run directory it created is gone
    run.mkdir()  # one that was there stays, and holds no run: a later run can use it
    assert train(tiny_dir, run, "--set", "train.memory_budget_gib=0.001").exit_code == 1
    assert run.is_dir() and run_outputs(run) == []


def test_the_cli_logs_the_plan_of_a_run_that_fits(tmp_path, tiny_dir, caplog):
    with caplog.at_level(logging.INFO, logger=mp.__name__):
        result = train(tiny_dir, tmp_path / "run", "--set", "train.memory_budget_gib=64")
    assert result.exit_code == 0, result.output
    logged = [r.getMessage() for r in caplog.records if r.name == mp.__name__]
    assert len(logged) == 1 and "train.memory_budget_gib=64" in logged[0], logged
    assert "trainer weights" in logged[0] and "AdamW states" in logged[0]


# ------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, None], ids=["plain-layers", "default-compiled"])
def test_estimate_against_a_real_run_on_cuda(tmp_path, tokenizer, compiled):
    """The estimate is within a factor of what a short real run allocates at its peak (the steps'
    ``torch.cuda.max_memory_allocated``, which leaves out the CUDA context the plan adds)."""
    from slime_gb10.grpo.trainer import GRPOTrainer

    model = write_random_model(
        tmp_path / "model", tokenizer, seed=0, hidden_size=576, num_layers=8, num_heads=9, num_kv_heads=3,
        intermediate_size=1536,
    )  # fmt: skip
    cfg = config(**{
        "model.name_or_path": str(model), "output.dir": str(tmp_path / "run"), "backends.device": "cuda",
        "backends.rollout": "torch", "backends.trainer": "torch", "train.steps": 2, "train.compile": compiled,
        "rollout.prompts_per_step": 8, "rollout.group_size": 8, "rollout.max_new_tokens": 128,
        "rollout.compile_decode": False, "train.micro_batch_size": 64, "algo.mask_truncated": False,
        "algo.skip_zero_variance_groups": False, "output.save_final_model": False, "output.progress": False,
    })  # fmt: skip
    trainer = GRPOTrainer(cfg)
    try:
        trainer.setup()  # runs the check on this GPU's free memory
        prompts = longest_prompt(trainer.prompts, trainer._train_source, trainer.eval_examples)
        plan = mp.estimate(
            cfg, transformers.AutoConfig.from_pretrained(model), device="cuda", prompt_tokens=prompts
        )
        rows = trainer.train()
    finally:
        trainer.close()
    measured = max(r["peak_memory_gib"] for r in rows) * 2**30
    estimated = plan.total - plan.parts["overhead"]
    print(f"memory plan {estimated / 2**30:.2f} GiB, measured {measured / 2**30:.2f} GiB ({plan.describe()})")
    assert 0.9 * measured <= estimated <= 2.5 * measured


def test_a_model_whose_training_state_fills_the_gpu_is_told_to_shard_it():
    """Qwen2.5-7B's shape on one 80 GB GPU: weights, AdamW and gradients (16 bytes a parameter,
    ~114 GiB) dominate, and the refusal names train.sharding=fsdp with the torchrun line; under
    FSDP on 4 ranks each holds a quarter of them (issue #40)."""
    from transformers import Qwen2Config

    qwen7b = Qwen2Config(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                         intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False)  # fmt: skip
    plan = mp.estimate(config(), qwen7b, device="cuda")
    assert 7.6e9 < plan.params < 7.7e9
    message = mp.refusal(config(), plan, 80 * 2**30, "free memory of cuda:0", "cuda:0")
    assert "train.sharding=fsdp" in message and "torchrun --nproc-per-node N" in message
    sharded = mp.estimate(config(**{"train.sharding": "fsdp"}), qwen7b, device="cuda", world_size=4)
    assert sharded.parts["AdamW states"] == plan.parts["AdamW states"] // 4
    assert "train.sharding=fsdp" not in mp.refusal(
        config(**{"train.sharding": "fsdp"}), sharded, 10 * 2**30, "free memory of cuda:0", "cuda:0"
    )


# ------------------------------------------------------------------- a model one GPU cannot train (issue #40)
@pytest.fixture()
def seven_b_dir(tmp_path):
    """The config (no weights) of the Qwen2.5-7B body with SmolLM2's vocabulary: the shape of the
    #40 table (bench/decode.py's "7b")."""
    from slime_gb10.bench.decode import DECODE_SHAPES
    from slime_gb10.grpo.models import random_model_config

    sizes = DECODE_SHAPES["7b"].model_sizes()
    random_model_config(vocab_size=49152, **sizes).save_pretrained(tmp_path)
    return tmp_path


def on_an_h100(monkeypatch, free_gib=79.0):
    """``check`` as on one discrete 80 GB GPU: the device, its free memory (faked: no GPU here)."""
    from slime_gb10.grpo import registry

    monkeypatch.setattr(registry, "resolve_device", lambda spec: torch.device("cuda", 0))
    monkeypatch.setattr(
        mp, "available", lambda device: (int(free_gib * 2**30), "free memory of cuda:0 (H100)")
    )
    monkeypatch.setattr(mp, "uses_host_memory", lambda device: False)


def seven_b_config(path, **overrides):
    return config(**{"model.name_or_path": str(path), "backends.rollout": "torch", "backends.trainer": "torch",
                     "rollout.prompts_per_step": 8, "rollout.group_size": 8, "rollout.max_new_tokens": 256,
                     "train.micro_batch_size": 8, **overrides})  # fmt: skip


def test_a_discrete_gpu_refuses_what_its_training_state_alone_exceeds(monkeypatch, seven_b_dir, caplog):
    on_an_h100(monkeypatch)
    cfg = seven_b_config(seven_b_dir)
    plan = mp.estimate(cfg, mp.read_model_config(cfg), device="cuda")
    n = plan.params
    # by hand: per layer q and o h*h, k and v h*512, their biases 3584 + 2*512, the MLP 3*h*18944, two
    # norms; the embedding and the untied head V*h each; the final norm
    h, kv = 3584, 4 * 128
    layer = 2 * h * h + 2 * h * kv + h + 2 * kv + 3 * h * 18944 + 2 * h
    assert n == 28 * layer + 2 * 49152 * h + h == 6_877_943_296
    # FP32 weights and gradients, two FP32 moments, the engine's BF16 copy: tensors of known size
    assert plan.exact == (4 + 4 + 8 + 2) * n
    # SGLang's memory saver releases its BF16 weights while the trainer runs: they never meet the gradients
    sglang = mp.estimate(cfg, mp.read_model_config(cfg), device="cuda", rollout="sglang")
    assert sglang.exact == (4 + 4 + 8) * n
    with pytest.raises(mp.MemoryPlanError) as refused:
        mp.check(cfg, prompt_tokens=100)
    message = str(refused.value)
    assert "\n" not in message
    assert "weights, gradients and optimizer states alone are" in message
    assert "torchrun --nproc-per-node N" in message and "--set train.sharding=fsdp" in message
    # four ranks of FSDP: a quarter of the state each; the plan is logged, no refusal
    with caplog.at_level(logging.INFO, logger=mp.__name__):
        sharded = mp.check(seven_b_config(seven_b_dir, **{"train.sharding": "fsdp"}), world_size=4,
                           prompt_tokens=100)  # fmt: skip
    assert sharded is not None and sharded.exact == (4 + 4 + 8) * n // 4 + 2 * n
    # sharded over two and still too big for a budget: the advice is more GPUs, not the setting already on
    two = seven_b_config(seven_b_dir, **{"train.sharding": "fsdp"})
    text = mp.refusal(two, mp.estimate(two, mp.read_model_config(two), device="cuda", world_size=2), 2**30,
                      "test", "cuda:0", world_size=2)  # fmt: skip
    assert "over more than 2 GPUs" in text and "--set train.sharding=fsdp" not in text
    # the Megatron backend is not sharded by train.sharding: its own distributed optimizer is the advice
    megatron = mp.estimate(cfg, mp.read_model_config(cfg), device="cuda", trainer="megatron")
    text = mp.refusal(cfg, megatron, 2**30, "test", "cuda:0")
    assert "train.sharding" not in text and "--set megatron.use_distributed_optimizer=true" in text
    assert "--set megatron.tensor_parallel_size=N" in text
    # data parallel on four ranks holds it all on each: refused, with the sharding advice
    with pytest.raises(mp.MemoryPlanError, match=r"train\.sharding=fsdp"):
        mp.check(cfg, world_size=4, prompt_tokens=100)


def test_a_discrete_gpu_warns_when_only_the_estimate_is_over(monkeypatch, tiny_dir, caplog):
    on_an_h100(monkeypatch, free_gib=0.1)
    cfg = config(
        **{"model.name_or_path": str(tiny_dir), "backends.rollout": "torch", "backends.trainer": "torch"}
    )
    plan = mp.estimate(cfg, mp.read_model_config(cfg), device="cuda")
    assert plan.exact < 0.1 * 2**30 < plan.total  # the CUDA overhead alone is 0.5 GiB
    with caplog.at_level(logging.WARNING, logger=mp.__name__):
        assert mp.check(cfg, prompt_tokens=30) is not None
    assert any("[a warning on a discrete GPU]" in r.getMessage() for r in caplog.records)
