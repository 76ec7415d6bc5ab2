"""Checkpoints of the Megatron backend under tensor parallelism: whole tensors, whatever the size.

Each rank of a tensor-parallel group holds shards of the BF16 weights, of the FP32 main weights and
of Adam's moments. ``whole_state`` gathers them tensor by tensor over the group of data-parallel
rank 0 (the other groups hold the same replica) and merges them with :mod:`.tensor_parallel`'s
layout, onto rank 0's host memory; ``load_whole_state`` takes each rank's shard of them back. So a
checkpoint does not depend on the tensor-parallel size it was written at: it resumes at any size
the model splits by, one included (resharding); one written without tensor parallelism resumes at
any size too (:func:`from_data_parallel`), unless Megatron's distributed optimizer wrote it. Its dict (``policy.pt``, read back with
``weights_only=True``)::

    {"format": "megatron-whole", "tensor_parallel_size": written at, "flavor": ..., "steps_done": int,
     "model": {megatron_name: whole BF16 weight},
     "optimizer": None (before the first update: Adam has no state yet) or
                  {"main": {name: whole FP32 main weight},
                   "state": {name: {key: whole tensor, or {"scalar": tensor, "device": type}}},
                   "param_groups": [each group's settings, without its parameters]}}

Parameters only: no buffers (the RoPE table is recomputed) and no TransformerEngine extra state
(an FP8 recipe's scaling history: ``megatron.precision: fp8`` uses current scaling, which has none).
Under Megatron's distributed optimizer each rank's shard of the main weights is flat over its
buffers, which this format does not read: the launch refuses the two together (``distributed.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from slime_gb10.grpo.backends.megatron.model import megatron_state
from slime_gb10.grpo.backends.megatron.tensor_parallel import GatheredState, shard

FORMAT = "megatron-whole"
_SETTINGS = (bool, int, float, str, type(None))


def is_whole_state(state) -> bool:
    return isinstance(state, dict) and state.get("format") == FORMAT


def _trained(backend) -> Iterator[tuple[str, torch.Tensor, torch.Tensor, torch.optim.Optimizer]]:
    """``(name, BF16 parameter, its FP32 main parameter, the torch optimizer holding its state)``,
    in the optimizers' fixed order (the same on every rank)."""
    names = {id(p): name for name, p in backend.model.named_parameters()}
    for optimizer in backend._optimizers():
        if any(optimizer.fp32_from_fp32_groups):  # build_gpt_model makes every parameter BF16
            raise RuntimeError(
                "the Megatron backend's tensor-parallel checkpoint expects BF16 parameters only"
            )
        for params, mains in zip(optimizer.float16_groups, optimizer.fp32_from_float16_groups, strict=True):
            for param, main in zip(params, mains, strict=True):
                yield names[id(param)], param, main, optimizer.optimizer


def _setting(value) -> bool:
    return isinstance(value, _SETTINGS) or (
        isinstance(value, tuple) and all(isinstance(v, _SETTINGS) for v in value)
    )


def whole_state(backend) -> dict | None:
    """The backend's state with every tensor whole, on rank 0 (None elsewhere). A collective over
    the tensor-parallel group of data-parallel rank 0; the other groups return at once."""
    if backend.data_parallel_rank != 0:
        return None
    keep = torch.distributed.get_rank() == 0
    group = backend.tp_group

    def whole(name: str, tensor: torch.Tensor) -> torch.Tensor | None:
        gathered = GatheredState({name: tensor}, group)[name]
        return gathered.to("cpu", copy=True) if keep else None

    model = {name: whole(name, p) for name, p in megatron_state(backend.model).items()}
    optimizer = None
    if any(inner.state for *_, inner in _trained(backend)):  # Adam's state appears at the first update
        main, moments = {}, {}
        for name, _, master, inner in _trained(backend):
            main[name] = whole(name, master)
            entry = {}
            for key, value in inner.state.get(master, {}).items():
                if torch.is_tensor(value) and value.shape == master.shape:
                    entry[key] = whole(name, value)
                else:  # Adam's step count: the same on every rank
                    tensor = torch.as_tensor(value)
                    entry[key] = {
                        "scalar": tensor.detach().to("cpu", copy=True),
                        "device": tensor.device.type,
                    }
            moments[name] = entry
        groups = [g for o in backend._optimizers() for g in o.optimizer.param_groups]
        settings = [{k: v for k, v in g.items() if k != "params" and _setting(v)} for g in groups]
        optimizer = {"main": main, "state": moments, "param_groups": settings}
    if not keep:
        return None
    return {
        "format": FORMAT,
        "tensor_parallel_size": backend.tensor_parallel_size,
        "flavor": backend.flavor,
        "steps_done": backend.steps_done,
        "model": model,
        "optimizer": optimizer,
    }


def from_data_parallel(backend, state: dict) -> dict:
    """A checkpoint written without tensor parallelism (``MegatronPolicyBackend.state_dict``: the
    GPTModel's ``state_dict`` and Megatron's ``Float16OptimizerWithFloat16Params.state_dict``, i.e.
    the torch optimizer's state by parameter index and ``fp32_from_fp16_params`` by group; whole
    tensors already) in :func:`whole_state`'s format, so a run grows into tensor parallelism. The
    parameters are matched by position: Megatron numbers them group by group in the order of its
    ``float16_groups``, which the same model builds the same way at any tensor-parallel size."""
    if "optimizer_parameter_state" in state:
        raise RuntimeError(
            "checkpoint was written with megatron.use_distributed_optimizer=true (its shards are flat over the "
            "data-parallel ranks); resume it with megatron.tensor_parallel_size=1"
        )
    params = dict(backend.model.named_parameters())
    model = {name: tensor for name, tensor in state["model"].items() if name in params}  # no TE _extra_state
    optimizer = state["optimizer"]
    if optimizer is not None:
        torch_state, mains = (
            optimizer["optimizer"],
            [m for group in optimizer["fp32_from_fp16_params"] for m in group],
        )
        order = [index for group in torch_state["param_groups"] for index in group["params"]]
        names = [name for name, *_ in _trained(backend)]
        if not len(order) == len(mains) == len(names):
            raise RuntimeError(
                f"checkpoint's optimizer holds {len(mains)} parameters, this model trains {len(names)}"
            )
        moments = {}
        for name, index, main in zip(names, order, mains, strict=True):
            if name not in model:
                raise RuntimeError(f"checkpoint and model disagree: the checkpoint has no {name}")
            if main.shape != model[name].shape:
                raise RuntimeError(
                    f"{name}: checkpoint {tuple(main.shape)} vs model {tuple(model[name].shape)}"
                )
            moments[name] = {  # Adam's step: a CPU scalar (torch's AdamW, neither fused nor capturable)
                key: value if value.shape == main.shape else {"scalar": value, "device": "cpu"}
                for key, value in (
                    (k, torch.as_tensor(v)) for k, v in torch_state["state"].get(index, {}).items()
                )
            }
        settings = [
            {k: v for k, v in g.items() if k != "params" and _setting(v)} for g in torch_state["param_groups"]
        ]
        optimizer = {"main": dict(zip(names, mains, strict=True)), "state": moments, "param_groups": settings}
    return {"format": FORMAT, "tensor_parallel_size": 1, "flavor": state.get("flavor"),
            "steps_done": state.get("steps_done", 0), "model": model, "optimizer": optimizer}  # fmt: skip


def load_whole_state(backend, state: dict) -> None:
    """Each rank's shards of a :func:`whole_state` checkpoint (or of one written without tensor
    parallelism: :func:`from_data_parallel`) into the backend; every rank reads the whole file and
    keeps its part."""
    if not is_whole_state(state):
        state = from_data_parallel(backend, state)
    if backend.use_distributed_optimizer:
        raise RuntimeError(
            f"checkpoint was written with megatron.tensor_parallel_size={state['tensor_parallel_size']} and "
            "whole optimizer state; resume it with megatron.use_distributed_optimizer=false"
        )
    tp, rank = backend.tensor_parallel_size, backend.tensor_parallel_rank

    def mine(name: str, tensor: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        part = shard(name, tensor, tp, rank)
        if part.shape != like.shape:
            raise RuntimeError(f"{name}: checkpoint shard {tuple(part.shape)} vs model {tuple(like.shape)}")
        return part.to(device=like.device, dtype=like.dtype).clone(memory_format=torch.contiguous_format)

    params = dict(backend.model.named_parameters())
    if set(params) != set(state["model"]):
        extra, missing = sorted(set(state["model"]) - set(params)), sorted(set(params) - set(state["model"]))
        raise RuntimeError(f"checkpoint and model disagree: missing {missing[:3]}, unexpected {extra[:3]}")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(mine(name, state["model"][name], param))
        optimizer = state["optimizer"]
        if optimizer is None:  # saved before the first update: a fresh optimizer is that state, its
            for o in backend._optimizers():  # FP32 main weights copied from the loaded ones
                o.reload_model_params()
        else:
            for name, _, master, inner in _trained(backend):
                master.copy_(mine(name, optimizer["main"][name], master))
                inner.state[master] = {
                    key: (
                        value["scalar"].to("cpu" if value["device"] == "cpu" else master.device, copy=True)
                        if isinstance(value, dict)
                        else mine(name, value, master)
                    )
                    for key, value in optimizer["state"][name].items()
                }
            groups = [g for o in backend._optimizers() for g in o.optimizer.param_groups]
            for group, saved in zip(groups, optimizer["param_groups"], strict=True):
                group.update(saved)
    backend.steps_done = int(state["steps_done"])
