"""Megatron-core tensor parallelism's weight layout (``backends/megatron/tensor_parallel.py``) on a CPU.

TP=2 against TP=1: each rank's shard is used the way megatron-core 0.16 computes with it (a
column-parallel ``linear_qkv`` viewed as the rank's ``ng/tp`` query groups; a per-rank SwiGLU that
chunks the rank's own ``linear_fc1`` output in two; row-parallel ``linear_proj`` and ``linear_fc2``
whose partial outputs are summed, as their all-reduce does; a vocabulary-parallel embedding whose
ranks look up their own rows and are summed; a column-parallel LM head whose logits are
concatenated), in float64, and the result is compared with ``transformers``' own modules on the
unsharded weights. Plus: shard → merge is bit-exact, and layouts that cannot be split are refused.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from slime_gb10.grpo.backends.megatron import tensor_parallel as tp_map
from slime_gb10.grpo.backends.megatron.mapping import DecoderArch, MappingError, hf_to_megatron


def llama() -> LlamaConfig:  # 8 query heads in 4 groups, tied embeddings
    return LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                       intermediate_size=96, vocab_size=120, tie_word_embeddings=True, max_position_embeddings=64,
                       attn_implementation="eager")  # fmt: skip


def qwen2() -> Qwen2Config:  # QKV biases, an untied head
    return Qwen2Config(hidden_size=48, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=80, vocab_size=96, tie_word_embeddings=False, max_position_embeddings=64,
                       attn_implementation="eager")  # fmt: skip


def model_of(config):
    torch.manual_seed(0)
    cls = Qwen2ForCausalLM if config.model_type == "qwen2" else LlamaForCausalLM
    model = cls(config).double().eval()
    with torch.no_grad():  # non-trivial norms and biases
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.1 * torch.randn_like(p))
    return model


def hf_state(model) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if "rotary_emb" not in k}


@pytest.mark.parametrize(
    ("config", "tp"), [(llama, 1), (llama, 2), (llama, 4), (qwen2, 1), (qwen2, 2)]
)  # every split of each: 4 and 2 key/value groups
def test_every_ranks_shards_merge_back_to_the_full_tensors_bit_for_bit(config, tp):
    model = model_of(config())
    arch = DecoderArch.from_hf_config(model.config)
    full = hf_to_megatron(hf_state(model), arch, "local")
    ranks = [dict(tp_map.iter_hf_to_megatron_shard(hf_state(model), arch, "local", tp, r)) for r in range(tp)]
    for name, tensor in full.items():
        shards = [rank[name] for rank in ranks]
        assert torch.equal(tp_map.merge(name, shards), tensor), name
        if tp_map.split_kind(name) != tp_map.WHOLE:
            assert (
                sum(s.numel() for s in shards) == tensor.numel() and shards[0].numel() == tensor.numel() // tp
            )


@pytest.mark.parametrize("config", [llama, qwen2], ids=["llama", "qwen2"])
def test_two_ranks_compute_the_unsharded_layer_and_logits(config):
    """One decoder layer's attention and MLP and the model's embedding and LM head, computed by two
    tensor-parallel ranks from their shards, equal transformers' modules on the whole weights."""
    tp = 2
    model = model_of(config())
    arch = DecoderArch.from_hf_config(model.config)
    ranks = [dict(tp_map.iter_hf_to_megatron_shard(hf_state(model), arch, "local", tp, r)) for r in range(tp)]
    layer, prefix = model.model.layers[0], "decoder.layers.0."
    torch.manual_seed(1)
    T, H, hd, ng = 7, arch.hidden_size, arch.head_dim, arch.num_key_value_heads
    x = torch.randn(1, T, H, dtype=torch.float64)
    cos, sin = model.model.rotary_emb(x, torch.arange(T)[None])

    # attention: each rank its query groups (heads, then key, then value per group), RoPE, softmax
    # over all positions (transformers' eager attention without a mask), its slice of linear_proj
    partial = []
    for shards in ranks:
        out = x @ shards[prefix + "self_attention.linear_qkv.weight"].T
        if arch.qkv_bias:
            out = out + shards[prefix + "self_attention.linear_qkv.bias"]
        groups = out.view(1, T, ng // tp, (arch.heads_per_group + 2) * hd)
        q, k, v = torch.split(groups, [arch.heads_per_group * hd, hd, hd], dim=-1)
        q = q.reshape(1, T, -1, hd).transpose(1, 2)  # [1, heads of the rank, T, hd]
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # [1, groups of the rank, T, hd]
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = (t.repeat_interleave(arch.heads_per_group, dim=1) for t in (k, v))
        attn = torch.softmax(q @ k.transpose(-1, -2) / hd**0.5, dim=-1) @ v
        heads = attn.transpose(1, 2).reshape(1, T, -1)
        partial.append(heads @ shards[prefix + "self_attention.linear_proj.weight"].T)
    expected, _ = layer.self_attn(x, position_embeddings=(cos, sin), attention_mask=None)
    # transformers' eager attention takes its softmax in float32 (the rest here is float64): measured
    # 2e-6 relative; a head or group in the wrong place differs by the size of the output itself
    torch.testing.assert_close(sum(partial), expected, rtol=1e-5, atol=1e-7)

    # the MLP: each rank's SwiGLU on its own [gate_r; up_r], its slice of linear_fc2, summed
    mlp = []
    for shards in ranks:
        x1, x2 = torch.chunk(x @ shards[prefix + "mlp.linear_fc1.weight"].T, 2, dim=-1)
        mlp.append((torch.nn.functional.silu(x1) * x2) @ shards[prefix + "mlp.linear_fc2.weight"].T)
    torch.testing.assert_close(sum(mlp), layer.mlp(x), rtol=1e-10, atol=1e-12)

    # the embedding: each rank its vocabulary rows, zero elsewhere, summed; the head: logits concatenated
    ids = torch.tensor([[0, 5, arch.vocab_size // 2, arch.vocab_size - 1, 17]])
    looked_up, per_rank = [], arch.vocab_size // tp
    for r, shards in enumerate(ranks):
        local = ids - r * per_rank
        mine = (local >= 0) & (local < per_rank)
        rows = shards["embedding.word_embeddings.weight"][local.clamp(0, per_rank - 1)]
        looked_up.append(rows * mine[..., None])
    torch.testing.assert_close(sum(looked_up), model.model.embed_tokens(ids), rtol=0, atol=0)
    head = "embedding.word_embeddings.weight" if arch.tie_word_embeddings else "output_layer.weight"
    logits = torch.cat([x @ shards[head].T for shards in ranks], dim=-1)
    torch.testing.assert_close(logits, model.lm_head(x), rtol=1e-10, atol=1e-12)


def test_layouts_that_cannot_be_split_are_refused_with_the_sizes_that_can():
    smollm2 = DecoderArch.from_hf_config(
        LlamaConfig(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True)
    )  # fmt: skip
    tp_map.check_tensor_parallel(smollm2, 3, world_size=6)
    with pytest.raises(MappingError, match=r"does not divide num_key_value_heads=3 .* splits over 1, 3$"):
        tp_map.check_tensor_parallel(smollm2, 2)
    odd_vocab = DecoderArch.from_hf_config(
        LlamaConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=4,
                    intermediate_size=96, vocab_size=121)
    )  # fmt: skip
    with pytest.raises(MappingError, match=r"vocab_size=121"):
        tp_map.check_tensor_parallel(odd_vocab, 2)
    with pytest.raises(MappingError, match="4 ranks do not divide into tensor-parallel groups of 3"):
        tp_map.check_tensor_parallel(smollm2, 3, world_size=4)
    with pytest.raises(MappingError, match=r"rank 3 is not in 0\.\.2"):
        next(tp_map.iter_hf_to_megatron_shard({}, smollm2, "local", 3, 3))


@pytest.mark.parametrize("config", [llama, qwen2], ids=["llama", "qwen2"])
def test_the_shards_are_what_megatron_cores_own_split_gives_each_rank(config):
    """megatron-core 0.16 builds each rank's part of a parallel layer on a CPU by splitting the whole
    weight (``tensor_parallel.layers._initialize_affine_weight_cpu``, private, as its layers call it:
    output rows for column-parallel layers and the vocabulary, input columns for row-parallel ones,
    ``stride=2`` for the SwiGLU ``linear_fc1``, mlp.py): our shard of every weight is that part."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (slime-gb10[megatron])")
    from megatron.core.tensor_parallel.layers import _initialize_affine_weight_cpu

    model = model_of(config())
    arch = DecoderArch.from_hf_config(model.config)
    full = hf_to_megatron(hf_state(model), arch, "local")
    tp, checked = 2, set()
    for name, tensor in full.items():
        kind = tp_map.split_kind(name)
        if kind == tp_map.WHOLE or tensor.ndim != 2:  # norms; QKV's bias is checked by the layer test
            continue
        dim = 1 if kind == tp_map.ROW else 0
        for rank in range(tp):
            ours = tp_map.shard(name, tensor, tp, rank)
            theirs = torch.empty_like(ours)
            _initialize_affine_weight_cpu(
                theirs, tensor.shape[0], tensor.shape[1], ours.shape[dim], dim,
                lambda w, t=tensor: w.copy_(t), stride=2 if kind == tp_map.GLU else 1,
                params_dtype=tensor.dtype, rank=rank, world_size=tp, skip_set_tensor_parallel_attributes=True,
            )  # fmt: skip
            assert torch.equal(ours, theirs), (name, rank)
        checked.add(kind)
    assert checked == {tp_map.COLUMN, tp_map.GLU, tp_map.ROW, tp_map.VOCAB}


# ------------------------------------------------------------------ the loop under tensor parallelism
class TensorParallelPeer:
    """The loop's view of a Megatron backend on rank ``rank`` of a tensor-parallel pair: its
    ``tensor_parallel_samples`` appends the other rank's samples (what the all-gather over the group
    returns, in rank order; the real exchange runs in test_megatron_parallel_gpu.py), and it records the
    micro-batches it is given."""

    tensor_parallel_size = 2

    def __init__(self, rank: int, theirs: list):
        self.tensor_parallel_rank, self.theirs, self.steps = rank, theirs, []

    def tensor_parallel_samples(self, samples):
        return samples + self.theirs if self.tensor_parallel_rank == 0 else self.theirs + samples

    def train_step(self, micro, loss_fn):
        from slime_gb10.grpo.interfaces import TrainStepResult

        self.steps.append(micro)
        return TrainStepResult(loss=0.25, grad_norm=2.0, metrics={"kl": 1.0})


class PairDist:
    """Two ranks, one tensor-parallel group: a sum over the ranks doubles each rank's (equal) count."""

    enabled = True

    def sum(self, values):
        return [2 * v for v in values]


def test_a_tensor_parallel_group_trains_on_all_its_samples_and_its_first_rank_reports_them():
    """Both ranks of the pair train on the same micro-batches (their own and the other's samples,
    in rank order), each loss divided by the group's token count (counted once, not once per rank),
    and only rank 0 reports the loss, tokens and metrics that the step's row sums over ranks."""
    from slime_gb10.grpo.batching import Sample, update_policy
    from slime_gb10.grpo.config import build_config

    def sample(tokens: int) -> Sample:
        return Sample([1, 2], list(range(3, 3 + tokens)), [-0.5] * tokens, 1.0, 1.0, truncated=False)

    cfg = build_config(overrides={"train.micro_batch_size": 2})
    mine, theirs = [sample(2), sample(3)], [sample(4)]
    first, second = TensorParallelPeer(0, theirs), TensorParallelPeer(1, mine)
    reports = [
        update_policy(first, mine, cfg, PairDist(), 0),
        update_policy(second, theirs, cfg, PairDist(), 0),
    ]
    (a,), (b,) = first.steps, second.steps
    assert [batch.input_ids.tolist() for batch, _ in a] == [batch.input_ids.tolist() for batch, _ in b]
    assert sum(float(batch.completion_mask.sum()) for batch, _ in a) == 9  # 2 + 3 + 4 completion tokens
    assert all(extras["global_count"] == 9.0 for _, extras in a + b)
    metrics, tokens, grad_norm, loss = reports[0]
    assert metrics == {"kl": 1.0} and tokens == 4 + 5 + 6 and grad_norm == 2.0 and loss == 0.25
    assert reports[1] == ({}, 0, 2.0, 0.0)
