"""The PyTorch backend's weights sharded over the ranks with FSDP2 (``train.sharding: fsdp``, issue #40).

Each decoder layer, then the whole model, goes through ``torch.distributed.fsdp.fully_shard``: every
rank keeps 1/world of the FP32 master weights, their gradients and AdamW's moments; a layer's full
weights exist only while its forward or backward runs (all-gathered, then freed), and the
gradients are reduce-scattered by FSDP itself, not by our all-reduce
(:meth:`~slime_gb10.grpo.distributed.DistContext.all_reduce_gradients`). Reductions are sums, as the
all-reduce's are (the loss is already divided by the global token count), and in FP32.

Under BF16 autocast (a GPU) the layers gather their weights as BF16 (``MixedPrecisionPolicy``, the
FP32 shards cast before the all-gather): half the bytes on the wire, and no FP32 copy of a layer
for autocast to cast again and keep for the backward (a 7B model's 12 GiB of BF16 casts per rank);
gradients arrive in BF16 and are reduced in FP32 into the FP32 shards. Under NVFP4 QAT the layers
gather FP32: the fake quantization must see the master weights the sync quantizes. A reference
model (``algo.beta > 0``) is sharded the same way, so it computes as the policy does.

What FSDP asks of the loop: every rank runs the same number of forwards and backwards (each one
all-gathers), so :func:`pad_microbatches` evens out the micro-batch counts that zero-variance
filtering leaves unequal, with micro-batches of no tokens; the gradient norm, the weight sync
(:func:`full_tensors`, one weight at a time), the final model (:func:`full_model_state_dict`) and
the sharded checkpoints (``grpo/sharded_checkpoint.py``) are collectives that every rank calls in
the same order.

On unified memory (GB10) there is no separate host memory to offload optimizer state to: CPU
offload would move it between two views of the same LPDDR5x, so it is not offered.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard_model(
    model: nn.Module, forward_name: str, forward: Callable, param_dtype: torch.dtype | None = None
) -> int:
    """``fully_shard`` each decoder layer, then the model (embeddings, final norm, LM head: a tied
    head is the embedding, one parameter); gradient reductions summed (divide factor 1), in FP32.
    ``param_dtype``: the dtype the weights are gathered in for compute (None: their own). Call
    before the optimizer sees the parameters (they become DTensors). Returns the number of layers.

    The trainer never calls the model's own forward: it runs the decoder, then its chunked LM head
    on the head's weight (``torch_backend.forward_logprobs``). ``forward(model, ...)`` becomes the
    model's method ``forward_name``, registered as an FSDP forward, so the model's weights are
    gathered around it as around a forward, and its backward reduces their gradients."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    layers = list(model.model.layers)
    for layer in layers:
        fully_shard(
            layer, mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        )
    # the root's inputs stay as they are (ids, positions, masks; its own weights are cast)
    fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32,
                                                      cast_forward_inputs=False))  # fmt: skip
    setattr(model, forward_name, functools.partial(forward, model))
    register_fsdp_forward_method(model, forward_name)
    for module in (*layers, model):
        # sums in plain SUM collectives: a factor of 1 would otherwise take NCCL's PREMUL_SUM, which
        # gloo (CPU ranks) does not have
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)
    return len(layers)


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor shard (an all-gather: every rank calls it), else the tensor."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def full_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """``named`` with each shard gathered, one at a time (never the whole model at once)."""
    for name, tensor in named:
        yield name, full_tensor(tensor.detach())


def meta_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """``named`` as meta tensors of their global shapes: the weight stream's planning pass without
    gathering anything."""
    for name, tensor in named:
        yield name, torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")


def full_model_state_dict(model: nn.Module) -> dict:
    """The model's state, gathered to rank 0's CPU memory (the other ranks get an empty dict): the
    final model, written whole as a Hugging Face model. Checkpoints stay sharded
    (``sharded_checkpoint.py``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def pad_microbatches(prepared: list[list], dist, empty) -> None:
    """Give every rank as many micro-batches per minibatch as the rank with the most (in place):
    FSDP's collectives run in each forward and backward, so a rank that stopped early would leave
    the others waiting. ``empty()`` makes a micro-batch whose loss and metrics weigh nothing."""
    local = [float(len(micro)) for micro in prepared]
    for micro, most in zip(prepared, dist.max(local), strict=True):
        micro.extend(empty() for _ in range(int(most) - len(micro)))
