"""Checkpoints of the Megatron backend under tensor parallelism: whole tensors, whatever the size.

Each rank of a tensor-parallel group holds shards of the BF16 weights, of the FP32 main weights and
of Adam's moments. ``whole_state`` gathers them tensor by tensor over the group of data-parallel
rank 0 (the other groups hold the same replica) and merges them with :mod:`.tensor_parallel`'s
layout, onto rank 0's host memory; ``load_whole_state`` takes each rank's shard of them back. So a
checkpoint does not depend on the tensor-parallel size it was written at: it resumes at any size
the model splits by, one included (resharding); one written without tensor parallelism resumes at
any size too (:func:`from_data_parallel`), unless Megatron's distributed optimizer wrote it.

A training run's checkpoint holds it as ``policy_whole/`` (:func:`write_whole_state`): safetensors
files written while the gathers go on, so rank 0 never holds the whole state (on a GB10 its host
memory is the GPU's: 14 bytes a parameter would be 90 GiB at 7B), and ``index.json``.
:func:`whole_state` returns it in memory, as this dict (:func:`read_whole_state` reads the directory
back as the same dict, its tensors read when looked up)::

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

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from slime_gb10.grpo.backends.megatron.model import megatron_state
from slime_gb10.grpo.backends.megatron.tensor_parallel import GatheredState, shard

FORMAT = "megatron-whole"
#: The index :func:`write_whole_state` writes beside its safetensors files.
INDEX = "index.json"
#: About how many bytes of whole tensors rank 0 holds before it writes them to a file.
CHUNK_BYTES = 1 << 30
_SCALAR_DTYPES = ("float32", "float64", "int64", "int32")
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


def _kind(value) -> type:
    return float if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value)


def _setting(value) -> bool:
    return isinstance(value, _SETTINGS) or (
        isinstance(value, tuple) and all(isinstance(v, _SETTINGS) for v in value)
    )


def _started(backend) -> bool:
    return any(inner.state for *_, inner in _trained(backend))  # Adam's state appears at the first update


def _header(backend) -> dict:
    groups = [g for o in backend._optimizers() for g in o.optimizer.param_groups]
    settings = [{k: v for k, v in g.items() if k != "params" and _setting(v)} for g in groups]
    return {
        "format": FORMAT,
        "tensor_parallel_size": backend.tensor_parallel_size,
        "flavor": backend.flavor,
        "steps_done": backend.steps_done,
        "param_groups": settings if _started(backend) else None,
    }


def _stream(backend) -> Iterator[tuple[tuple[str, ...], Any]]:
    """``(key, value)`` for every tensor of the state, whole, one at a time: ``("model", name)`` the
    BF16 weight, ``("main", name)`` its FP32 main weight, ``("state", name, key)`` Adam's moments
    (or its step, ``{"scalar": tensor, "device": type}``). A collective over the tensor-parallel
    group; the values are CPU copies on global rank 0, None elsewhere."""
    keep = torch.distributed.get_rank() == 0
    group = backend.tp_group

    def whole(name: str, tensor: torch.Tensor) -> torch.Tensor | None:
        gathered = GatheredState({name: tensor}, group)[name]
        return gathered.to("cpu", copy=True) if keep else None

    for name, param in megatron_state(backend.model).items():
        yield ("model", name), whole(name, param)
    if not _started(backend):
        return
    for name, _, master, inner in _trained(backend):
        yield ("main", name), whole(name, master)
        for key, value in inner.state.get(master, {}).items():
            if torch.is_tensor(value) and value.shape == master.shape:
                yield ("state", name, key), whole(name, value)
            else:  # Adam's step count: the same on every rank
                tensor = torch.as_tensor(value)
                yield ("state", name, key), {"scalar": tensor.detach().to("cpu", copy=True),
                                             "device": tensor.device.type}  # fmt: skip


def whole_state(backend) -> dict | None:
    """The backend's state with every tensor whole, on rank 0 (None elsewhere): all of it in host
    memory at once (14 bytes a parameter; :func:`write_whole_state` writes it a part at a time). A
    collective over the tensor-parallel group of data-parallel rank 0; the other groups return at once."""
    if backend.data_parallel_rank != 0:
        return None
    header = _header(backend)
    settings = header.pop("param_groups")
    state = {**header, "model": {}, "optimizer": None}
    if settings is not None:
        state["optimizer"] = {"main": {}, "state": {}, "param_groups": settings}
    for key, value in _stream(backend):
        if key[0] == "model":
            state["model"][key[1]] = value
        elif key[0] == "main":
            state["optimizer"]["main"][key[1]] = value
            state["optimizer"]["state"][key[1]] = {}
        else:
            state["optimizer"]["state"][key[1]][key[2]] = value
    return state if torch.distributed.get_rank() == 0 else None


# ------------------------------------------------------------------ a checkpoint written as it gathers
def write_whole_state(backend, directory: Path | None) -> BaseException | None:
    """:func:`whole_state` into ``directory`` (global rank 0; None on the other ranks, which take
    part in the gathers), without holding it: rank 0 writes the tensors as they arrive, into
    safetensors files of about :data:`CHUNK_BYTES`, and the rest (sizes, Adam's steps, the optimizer's
    settings, which file holds which tensor) into ``index.json``. Rank 0's host memory holds one
    file's tensors and their bytes (on a GB10, memory the GPU shares), not the whole model's 14
    bytes a parameter. :func:`read_whole_state` reads it back.

    A write that fails (a full disk) is returned, not raised, once every gather is done: rank 0 keeps
    taking part in them, so its peers are never left waiting in one (the caller tells them)."""
    if backend.data_parallel_rank != 0:
        return None
    header = _header(backend)
    chunk, size, files, tensors, scalars = {}, 0, [], {}, {}
    failure: BaseException | None = None

    def write(step) -> None:
        nonlocal failure
        if failure is None and directory is not None:
            try:
                step()
            except Exception as exc:  # OSError, safetensors' own errors
                failure = exc

    def flush() -> None:
        nonlocal chunk, size
        if chunk:
            from safetensors.torch import save_file

            files.append(f"part-{len(files):05d}.safetensors")
            write(lambda: save_file(chunk, str(directory / files[-1])))
            chunk, size = {}, 0

    write(directory.mkdir if directory is not None else lambda: None)
    for key, value in _stream(backend):
        if directory is None or failure is not None:
            continue  # this rank's part of the gathers only
        flat = "/".join(key)
        if isinstance(value, dict):
            scalar = value["scalar"]
            scalars[flat] = {"value": scalar.item(), "dtype": str(scalar.dtype).removeprefix("torch."),
                             "device": value["device"]}  # fmt: skip
            continue
        nbytes = value.numel() * value.element_size()
        if size and size + nbytes > CHUNK_BYTES:
            flush()
        chunk[flat] = value.contiguous()
        size += nbytes
        tensors[flat] = len(files)  # the file it goes into: the next one written
    flush()
    if directory is not None and failure is None:
        index = {**header, "tensors": {flat: files[i] for flat, i in tensors.items()}, "scalars": scalars}
        write(lambda: (directory / INDEX).write_text(json.dumps(index, indent=0), encoding="utf-8"))
    return failure


def host_bytes_while_writing(hidden: int, vocab: int, intermediate: int) -> int:
    """Rank 0's memory while :func:`write_whole_state` runs, at most: a file's tensors (about
    :data:`CHUNK_BYTES`, or one larger tensor alone) and their serialised copy, the tensor on its way
    to the host, and (on a GB10, the same memory) its gathered shards and merged copy on the GPU;
    the largest tensor ``L`` is an FP32 embedding or head, or the fused MLP input: 2 max(file, L) + 3 L."""
    largest = 4 * hidden * max(vocab, 2 * intermediate)
    return 2 * max(CHUNK_BYTES, largest) + 3 * largest


class _Lazy(Mapping):
    """Entries of a written state: a ``(file, key)`` is read from its safetensors file when looked
    up (one whole tensor at a time: each rank keeps its shard and drops it), anything else is the value."""

    def __init__(self, directory: Path, entries: dict):
        self.directory, self.entries = directory, entries

    def __getitem__(self, name: str):
        entry = self.entries[name]
        if not isinstance(entry, tuple):
            return entry
        from safetensors import safe_open

        file, key = entry
        try:
            with safe_open(str(self.directory / file), framework="pt") as f:
                return f.get_tensor(key)
        except Exception as exc:  # a missing or damaged file: SafetensorError, OSError
            raise RuntimeError(f"cannot read {key} from {self.directory / file}: {exc}") from exc

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


def read_whole_state(directory: Path) -> dict:
    """What :func:`write_whole_state` wrote, as :func:`whole_state`'s dict whose tensors are read when
    looked up (:func:`load_whole_state` takes them one at a time). Data only: JSON and safetensors.
    ValueError when the index is not one this module writes."""
    index = json.loads((directory / INDEX).read_text(encoding="utf-8"))
    if (
        not isinstance(index, dict)
        or index.get("format") != FORMAT
        or not isinstance(index.get("tensors"), dict)
    ):
        raise ValueError(f"{directory / INDEX} is not the index of a tensor-parallel checkpoint")
    parts: dict[str, dict] = {"model": {}, "main": {}, "state": {}}
    for flat, file in index["tensors"].items():
        kind, _, rest = str(flat).partition("/")
        if kind not in parts or not isinstance(file, str) or Path(file).name != file or file in (".", ".."):
            raise ValueError(f"{directory / INDEX}: unexpected entry {flat!r}: {file!r}")
        parts[kind][rest] = (file, flat)
    from safetensors import safe_open

    for file in sorted(set(index["tensors"].values())):  # every file there and whole: its header, now
        with safe_open(str(directory / file), framework="pt") as f:
            missing = {flat for flat, where in index["tensors"].items() if where == file} - set(f.keys())
        if missing:
            raise ValueError(f"{directory / file} lacks {sorted(missing)[:3]}")
    moments: dict[str, dict] = {name: {} for name in parts["main"]}
    for rest, entry in parts["state"].items():
        name, _, key = rest.rpartition("/")
        moments.setdefault(name, {})[key] = entry
    for flat, scalar in index.get("scalars", {}).items():
        name, _, key = str(flat).removeprefix("state/").rpartition("/")
        if scalar.get("dtype") not in _SCALAR_DTYPES:
            raise ValueError(f"{directory / INDEX}: {flat} has dtype {scalar.get('dtype')!r}")
        value = torch.tensor(scalar["value"], dtype=getattr(torch, scalar["dtype"]))
        moments.setdefault(name, {})[key] = {"scalar": value, "device": str(scalar.get("device", "cpu"))}
    settings = index.get("param_groups")
    optimizer = None
    if settings is not None:  # JSON lists were the settings' tuples (Adam's betas); never "params"
        groups = [
            {k: tuple(v) if isinstance(v, list) else v for k, v in g.items() if k != "params"}
            for g in settings
        ]
        if not all(_setting(v) for g in groups for v in g.values()):
            raise ValueError(f"{directory / INDEX}: an optimizer setting is not a number, string or tuple")
        optimizer = {"main": _Lazy(directory, parts["main"]), "param_groups": groups,
                     "state": {name: _Lazy(directory, entries) for name, entries in moments.items()}}  # fmt: skip
    return {"format": FORMAT, "tensor_parallel_size": index.get("tensor_parallel_size"),
            "flavor": index.get("flavor"), "steps_done": int(index.get("steps_done", 0)),
            "model": _Lazy(directory, parts["model"]), "optimizer": optimizer}  # fmt: skip


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
                # the settings this optimizer has (another torch may name others), each of its kind
                known = {key: value for key, value in saved.items() if key in group and key != "params"}
                for key, value in known.items():
                    if _kind(value) != _kind(group[key]):
                        raise RuntimeError(
                            f"checkpoint's optimizer setting {key}={value!r} does not fit this run"
                        )
                group.update(known)
    backend.steps_done = int(state["steps_done"])
