"""Megatron-core tensor parallelism's weight layout: a full Megatron tensor (:mod:`.mapping`'s names
and fused layouts) ↔ the shard each of ``tp`` ranks holds, and the layouts that cannot be split.

What each rank holds (megatron-core 0.16, ``tensor_parallel/layers.py`` and the GPT layer specs):

* column-parallel linears split their output rows into ``tp`` contiguous blocks: ``linear_qkv``
  (weight and bias), ``output_layer``, and ``linear_fc1``, whose rows are ``[gate; up]`` *per
  rank*: rank ``r`` holds ``[gate_r; up_r]`` (its SwiGLU chunks its own output in two), so the
  full tensor is not the concatenation of the shards. The fused ``linear_qkv`` keeps whole query
  groups together (``[ng, (nq/ng + 2) hd, H]``), so a contiguous block of its rows is rank ``r``'s
  ``ng/tp`` groups with their query, key and value heads. This module asks for whole groups on
  every rank (``ng`` divisible by ``tp``); megatron-core also runs a ``tp`` that is a multiple of
  ``ng`` (each rank all-gathers the QKV output and takes its group): not supported here;
* row-parallel linears split their input columns: ``linear_proj`` (the attention heads of the
  rank's groups, in head order) and ``linear_fc2`` (the rank's ``F/tp`` MLP channels);
* the vocabulary-parallel embedding (and a tied output layer with it) splits the vocabulary into
  contiguous blocks: ``V`` must divide by ``tp``, since this backend keeps the exact vocabulary
  (no padding) so that logprobs compare one to one with the checkpoint's;
* norms are whole on every rank.

Pure tensor reshaping, no ``megatron`` import: tested on a CPU against the unsharded computation.
The backend loads its shards with :func:`iter_hf_to_megatron_shard` and reads the whole tensors
back through :class:`GatheredState` (weight sync, the final model, checkpoints).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from slime_gb10.grpo.backends.megatron.mapping import (
    MEGATRON_EMBEDDING,
    MEGATRON_OUTPUT,
    DecoderArch,
    LayerSpecFlavor,
    MappingError,
    iter_hf_to_megatron,
)

COLUMN, ROW, GLU, VOCAB, WHOLE = "column", "row", "glu", "vocab", "whole"


def check_tensor_parallel(arch: DecoderArch, tp: int, world_size: int | None = None) -> None:
    """Refuse a tensor-parallel size this model cannot be split by, in one line naming the numbers
    and the sizes that would work."""
    if tp < 1:
        raise MappingError(f"tensor parallel size {tp} must be at least 1")
    if world_size is not None and world_size % tp:
        raise MappingError(
            f"{world_size} ranks do not divide into tensor-parallel groups of {tp}; "
            "use a tensor parallel size that divides the number of ranks"
        )
    parts = {
        "num_key_value_heads": arch.num_key_value_heads,  # whole query groups per rank
        "intermediate_size": arch.intermediate_size,
        "vocab_size": arch.vocab_size,
    }
    bad = [f"{name}={value}" for name, value in parts.items() if value % tp]
    if bad:
        fits = [n for n in range(1, 65) if all(v % n == 0 for v in parts.values())]
        fits = [n for n in fits if world_size is None or world_size % n == 0]
        raise MappingError(
            f"tensor parallel size {tp} does not divide {', '.join(bad)} (here each rank holds whole "
            f"key/value head groups, an equal share of the MLP channels and of the vocabulary); this "
            f"model splits over {', '.join(map(str, fits))}"
        )


def split_kind(name: str) -> str:
    """How the Megatron parameter ``name`` is split over tensor-parallel ranks."""
    if name in (MEGATRON_EMBEDDING, MEGATRON_OUTPUT):
        return VOCAB
    if name.endswith(("linear_qkv.weight", "linear_qkv.bias")):
        return COLUMN
    if name.endswith("linear_fc1.weight"):
        return GLU
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return ROW
    return WHOLE  # norms (local spec modules, or TE's layer_norm_weight inside a fused linear)


def shard(name: str, tensor: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s part of the full Megatron tensor ``name`` (a view where one exists)."""
    kind = split_kind(name)
    if kind == WHOLE or tp == 1:
        return tensor
    if kind in (COLUMN, VOCAB):
        return torch.chunk(tensor, tp, dim=0)[rank]
    if kind == ROW:
        return torch.chunk(tensor, tp, dim=1)[rank]
    gate, up = torch.chunk(tensor, 2, dim=0)  # GLU: the full tensor is [gate; up]
    return torch.cat([torch.chunk(gate, tp, dim=0)[rank], torch.chunk(up, tp, dim=0)[rank]], dim=0)


def merge(name: str, shards: Sequence[torch.Tensor]) -> torch.Tensor:
    """The full Megatron tensor ``name`` from every rank's shard, in rank order (inverse of :func:`shard`)."""
    kind = split_kind(name)
    if kind == WHOLE or len(shards) == 1:
        return shards[0]
    if kind in (COLUMN, VOCAB):
        return torch.cat(list(shards), dim=0)
    if kind == ROW:
        return torch.cat(list(shards), dim=1)
    halves = [torch.chunk(s, 2, dim=0) for s in shards]  # GLU: each rank's [gate_r; up_r]
    return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)


def iter_hf_to_megatron_shard(
    hf_state: Mapping[str, torch.Tensor], arch: DecoderArch, flavor: LayerSpecFlavor, tp: int, rank: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(megatron_name, rank's shard)`` of a Hugging Face state dict, layer by layer: what rank
    ``rank`` of a tensor-parallel group of ``tp`` loads."""
    check_tensor_parallel(arch, tp)
    if not 0 <= rank < tp:
        raise MappingError(f"tensor-parallel rank {rank} is not in 0..{tp - 1}")
    for name, tensor in iter_hf_to_megatron(hf_state, arch, flavor):
        yield name, shard(name, tensor, tp, rank)


class GatheredState(Mapping):
    """The whole tensors of a tensor-parallel group's shards (``{megatron_name: shard}``, this rank's),
    each all-gathered over ``group`` and merged when it is read, one at a time: a weight stream or an
    export reading it holds one whole tensor beyond its own shards. Reading is a collective: every
    rank of the group reads the same names in the same order (the HF mapping's order is fixed)."""

    def __init__(self, shards: Mapping[str, torch.Tensor], group: Any):
        self.shards, self.group = shards, group

    def __getitem__(self, name: str) -> torch.Tensor:
        local = self.shards[name]
        if split_kind(name) == WHOLE:
            return local
        parts = [torch.empty_like(local) for _ in range(torch.distributed.get_world_size(self.group))]
        torch.distributed.all_gather(parts, local.contiguous(), group=self.group)
        return merge(name, parts)

    def __iter__(self) -> Iterator[str]:
        return iter(self.shards)

    def __len__(self) -> int:
        return len(self.shards)
