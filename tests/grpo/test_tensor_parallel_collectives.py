"""What the Megatron backend's tensor parallelism computes over its groups itself, under real
``torchrun`` + gloo on 2 ranks (Megatron-core's own layers need CUDA: test_megatron_tp_gpu.py).

The chunked logprobs with a vocabulary-parallel LM head (``vocab_parallel_group``: Megatron-core
tensor parallelism splits the head by vocabulary rows).
Each rank holds half the rows of a float64 head; the logprobs and entropy every rank returns, the
gradient of the (replicated) hidden states and each rank's gradient of its own rows are compared
with a float64 reference computed here from the whole ``[N, V]`` logits by ``torch.log_softmax``
(an independent implementation), at a temperature, with vocabulary chunks that do not divide a
rank's rows, and targets on both ranks.
"""

from __future__ import annotations

import json

import pytest
import torch

SCRIPT = r"""
import json, sys
import pytest
import torch
import torch.distributed as dist
from slime_gb10.grpo.logprobs import chunked_logprobs_entropy

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
spec = json.loads(open(sys.argv[1]).read())
hidden = torch.tensor(spec["hidden"], dtype=torch.float64, requires_grad=True)
head = torch.tensor(spec["head"], dtype=torch.float64)
rows = head.shape[0] // world
mine = head[rank * rows:(rank + 1) * rows].clone().requires_grad_(True)
targets = torch.tensor(spec["targets"])
logprobs, entropy = chunked_logprobs_entropy(hidden, mine, targets, temperature=spec["temperature"],
    chunk_size=3, token_chunk_size=4, with_entropy=True, vocab_parallel_group=dist.group.WORLD)
weights = torch.tensor(spec["weights"], dtype=torch.float64)
(logprobs @ weights[0] + entropy @ weights[1]).backward()
with open(f"{sys.argv[2]}/rank{rank}.json", "w") as f:
    json.dump({"logprobs": logprobs.tolist(), "entropy": entropy.tolist(), "grad_hidden": hidden.grad.tolist(),
               "grad_rows": mine.grad.tolist()}, f)
dist.destroy_process_group()
"""


def test_a_vocabulary_parallel_head_gives_the_whole_heads_logprobs_entropy_and_gradients(tmp_path, torchrun):
    gen = torch.Generator().manual_seed(0)
    n, h, v, temperature = 9, 6, 10, 0.7  # 5 rows a rank, chunks of 3; 9 tokens in blocks of 4
    hidden = torch.randn(n, h, generator=gen, dtype=torch.float64)
    head = torch.randn(v, h, generator=gen, dtype=torch.float64)
    targets = torch.tensor([0, 4, 5, 9, 2, 7, 5, 1, 8])  # both halves, both edges of the split
    weights = torch.randn(2, n, generator=gen, dtype=torch.float64)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"hidden": hidden.tolist(), "head": head.tolist(), "targets": targets.tolist(),
                                "weights": weights.tolist(), "temperature": temperature}))  # fmt: skip
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    run = torchrun(str(script), str(spec), str(tmp_path), timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    # the reference: whole logits, log_softmax, autograd, all float64
    ref_hidden = hidden.clone().requires_grad_(True)
    ref_head = head.clone().requires_grad_(True)
    logp = torch.log_softmax(ref_hidden @ ref_head.T / temperature, dim=-1)
    ref_logprobs = logp.gather(1, targets[:, None]).squeeze(1)
    ref_entropy = -(logp.exp() * logp).sum(-1)
    (ref_logprobs @ weights[0] + ref_entropy @ weights[1]).backward()

    def close(got, want):
        torch.testing.assert_close(
            torch.tensor(got, dtype=torch.float64), want.detach(), rtol=1e-10, atol=1e-12
        )

    for rank, out in enumerate(ranks):
        close(out["logprobs"], ref_logprobs)
        close(out["entropy"], ref_entropy)
        close(out["grad_hidden"], ref_hidden.grad)  # the sum of both ranks' parts, on each
        close(out["grad_rows"], ref_head.grad[rank * 5 : (rank + 1) * 5])


GATHER = r"""
import json, sys
import pytest
import torch
import torch.distributed as dist
from slime_gb10.grpo.backends.megatron.tensor_parallel import GatheredState, shard

dist.init_process_group("gloo")
rank = dist.get_rank()
whole = {name: torch.tensor(value, dtype=torch.float64) for name, value in json.loads(open(sys.argv[1]).read()).items()}
mine = {name: shard(name, tensor, 2, rank).clone() for name, tensor in whole.items()}
read = GatheredState(mine, dist.group.WORLD)
with open(f"{sys.argv[2]}/gathered{rank}.json", "w") as f:
    json.dump({"order": list(read), "tensors": {name: read[name].tolist() for name in read}}, f)
dist.destroy_process_group()
"""


def test_gathered_state_reads_every_split_kind_whole_on_every_rank(tmp_path, torchrun):
    """Column (QKV), row (the attention output), the GLU's per-rank [gate; up], vocabulary rows and
    a whole norm: each rank holds its shard (``tensor_parallel.shard``); reading the gathered state
    gives the whole tensor on both ranks, in the shards' order (weight sync and the final model
    read it so)."""
    gen = torch.Generator().manual_seed(1)
    names = {
        "embedding.word_embeddings.weight": (8, 3),
        "decoder.layers.0.self_attention.linear_qkv.weight": (12, 3),
        "decoder.layers.0.self_attention.linear_proj.weight": (3, 4),
        "decoder.layers.0.mlp.linear_fc1.weight": (8, 3),
        "decoder.layers.0.mlp.linear_fc2.weight": (3, 4),
        "decoder.final_layernorm.weight": (3,),
    }
    whole = {name: torch.randn(*shape, generator=gen, dtype=torch.float64) for name, shape in names.items()}
    spec = tmp_path / "whole.json"
    spec.write_text(json.dumps({name: t.tolist() for name, t in whole.items()}))
    script = tmp_path / "gather.py"
    script.write_text(GATHER)
    run = torchrun(str(script), str(spec), str(tmp_path), timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    for rank in range(2):
        out = json.loads((tmp_path / f"gathered{rank}.json").read_text())
        assert out["order"] == list(names)
        for name, tensor in whole.items():
            assert torch.equal(torch.tensor(out["tensors"][name], dtype=torch.float64), tensor), (rank, name)


MARKS = r"""
import json, sys
import pytest
import torch
import torch.distributed as dist
from transformers import LlamaConfig
from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
from slime_gb10.grpo.backends.megatron.model import build_gpt_model, init_parallel

dist.init_process_group("gloo")
assert init_parallel(0, 120, tensor_parallel_size=2) == 1
config = LlamaConfig(**json.loads(open(sys.argv[1]).read()))
model, _, _ = build_gpt_model(config, flavor="local", device="cpu", tensor_parallel_size=2)
rows = {name: {"shape": list(p.shape), "parallel": getattr(p, "tensor_model_parallel", None),
               "dim": getattr(p, "partition_dim", None), "counted": param_is_not_tensor_parallel_duplicate(p)}
        for name, p in model.named_parameters()}
with open(f"{sys.argv[2]}/marks{dist.get_rank()}.json", "w") as f:
    json.dump(rows, f)
dist.destroy_process_group()
"""


def test_megatron_layers_at_tp_2_hold_the_shards_of_our_layout_and_are_marked_split(tmp_path, torchrun):
    """Megatron-core's own GPT model at tensor-parallel size 2 (its local layers, built on a CPU
    under gloo: construction needs no CUDA): every parameter has the shape of the shard our layout
    (``tensor_parallel.shard``) gives its rank, and every split parameter carries Megatron's marks
    (split, along rows or columns), so that its optimizer counts each rank's shard in the gradient
    norm and a whole one (a norm) once. Megatron sets the marks only while it initialises weights,
    which this backend skips: unmarked, the gradient norm of a TP=2 run left out rank 1's shards."""
    pytest.importorskip("megatron.core")
    from transformers import LlamaConfig, LlamaForCausalLM

    from slime_gb10.grpo.backends.megatron.mapping import DecoderArch, hf_to_megatron
    from slime_gb10.grpo.backends.megatron.tensor_parallel import ROW, WHOLE, shard, split_kind

    sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=48, vocab_size=64, tie_word_embeddings=False, max_position_embeddings=64)  # fmt: skip
    spec = tmp_path / "config.json"
    spec.write_text(json.dumps(sizes))
    script = tmp_path / "marks.py"
    script.write_text(MARKS)
    run = torchrun(str(script), str(spec), str(tmp_path), timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    config = LlamaConfig(**sizes)
    whole = hf_to_megatron(LlamaForCausalLM(config).state_dict(), DecoderArch.from_hf_config(config), "local")
    for rank in range(2):
        rows = json.loads((tmp_path / f"marks{rank}.json").read_text())
        assert set(rows) == set(whole)
        for name, row in rows.items():
            kind = split_kind(name)
            assert row["shape"] == list(shard(name, whole[name], 2, rank).shape), name
            if kind == WHOLE:
                assert not row["parallel"] and row["counted"] == (rank == 0), (rank, name, row)
            else:
                assert row["parallel"] and row["dim"] == (1 if kind == ROW else 0) and row["counted"], (
                    rank,
                    name,
                )
