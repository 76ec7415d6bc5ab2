"""Sharded checkpoints of a ``train.sharding=fsdp`` run, through ``torch.distributed.checkpoint``.

Layout: ``<run>/checkpoints/step-000010/`` holds ``policy/`` (DCP's directory: ``.metadata`` and one
``__<rank>_0.distcp`` per rank, each rank's shards of the FP32 weights and AdamW's moments, plus the
schedule), ``trainer.pt`` and ``meta.json`` as an unsharded checkpoint does. No rank ever holds
more than its own shards: rank 0 no longer gathers 16 bytes a parameter to write ``policy.pt``.

Whole or absent: every rank writes into one temporary directory that rank 0 made (its name
gathered to all), DCP reports any rank's failure to every rank, and rank 0 renames the finished
directory into place; a crash leaves a ``.step-N.*.tmp`` that opening the run removes. Every rank
must see that directory: on two Sparks, ``--output`` on a filesystem both mount (NFS); a node that
cannot see it is refused in one line before anything is written.

Any world size can read it back: DCP plans each rank's reads from the chunks it needs, so a run
resumed on fewer or more ranks, sharded or not, loads the same weights and moments (resharding).

Data, never code: DCP writes its ``.metadata`` with ``pickle`` and reads it back with a plain
``pickle.load``, and loads its non-tensor items (the optimizer's settings, the schedule) with
``torch.load(weights_only=False)``; either would run whatever a tampered checkpoint holds.
:class:`DataOnlyReader` unpickles the metadata admitting only DCP's own metadata classes,
``torch.Size``, dtypes and layouts (Python's documented "restricting globals"), and
:class:`DataOnlyLoadPlanner` reads the items with ``weights_only=True``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException

from slime_gb10.utils.errors import UserError

POLICY_DIR = "policy"
_METADATA = ".metadata"

# The globals a DCP ``.metadata`` pickle names (torch 2.11-2.13: read with pickletools from real
# checkpoints of FSDP2 models and AdamW): its dataclasses, and how torch pickles sizes, layouts.
_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "collections": {"OrderedDict"},
    # StorageMeta.checkpoint_id: the writer's path (a path object is a name, it touches nothing)
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "pathlib._local": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},  # Python 3.13
}


class UnsafeCheckpoint(UserError, ValueError):
    """A checkpoint's metadata names something other than data."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpoint(f"it names {module}.{name}, which is not checkpoint metadata")


def read_metadata_as_data(path: str | os.PathLike) -> Any:
    """A DCP ``.metadata`` file unpickled with only metadata classes admitted; anything else, or a
    broken file, is an :class:`UnsafeCheckpoint` naming the file."""
    try:
        with open(path, "rb") as f:
            return _MetadataUnpickler(f).load()
    except UnsafeCheckpoint as exc:
        raise UnsafeCheckpoint(f"'{path}' is not data: {exc}") from None
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError, IndexError) as exc:
        raise UnsafeCheckpoint(f"'{path}' is not DCP metadata ({type(exc).__name__}: {exc})") from None


def _reader_classes():
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import StorageMeta

    class DataOnlyReader(FileSystemReader):
        """``FileSystemReader`` whose metadata is read by :func:`read_metadata_as_data`."""

        def read_metadata(self, *args: Any, **kwargs: Any):
            rank = kwargs.get("rank")
            name = _METADATA if rank is None else f"__{rank}{_METADATA}"
            metadata = read_metadata_as_data(Path(self.path) / name)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class DataOnlyLoadPlanner(DefaultLoadPlanner):
        """``DefaultLoadPlanner`` reading the non-tensor items as data (``weights_only=True``)."""

        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            from torch.distributed.checkpoint._traverse import set_element  # DefaultLoadPlanner's own

            obj = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return DataOnlyReader, DataOnlyLoadPlanner


@contextlib.contextmanager
def _one_process_is_intended():
    """Silence DCP's warning that, without a process group, it reads in one process: a run on one
    rank resuming a sharded checkpoint means exactly that."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="torch.distributed is disabled, unavailable or uninitialized"
        )
        yield


def is_sharded_checkpoint(path: str | os.PathLike) -> bool:
    return (Path(path) / POLICY_DIR / _METADATA).is_file()


def _first_failure(exc: BaseException) -> str:
    """One line of what failed: DCP's ``CheckpointException`` lists each rank's exception."""
    failures = getattr(exc, "_failures", None)
    if isinstance(failures, dict) and failures:
        rank, inner = sorted(failures.items())[0]
        inner = inner[0] if isinstance(inner, tuple) else inner
        text = str(inner).strip().splitlines()
        return f"rank {rank}: {text[0] if text else type(inner).__name__}"
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def unseen_by(directory: Path, dist) -> str | None:
    """Every rank looks for rank 0's ``directory`` (a collective): None when all see it, else the
    one-line problem. A sharded checkpoint is written by every rank into one directory, so on two
    Sparks ``--output`` must be on a filesystem both mount."""
    unseen = [rank for rank, seen in enumerate(dist.gather(Path(directory).is_dir())) if not seen]
    if not unseen:
        return None
    return (
        f"rank(s) {', '.join(map(str, unseen))} cannot see rank 0's directory '{directory}': with "
        "train.sharding=fsdp every rank writes its shards of each checkpoint there, so --output must be "
        "on a filesystem every node mounts (NFS between two Sparks)"
    )


def save_sharded(target: Path, state: dict, trainer_state: dict, dist, *, reason: str) -> None:
    """Write checkpoint directory ``target`` from every rank (a collective): ``state`` is this rank's
    sharded policy state (``TorchPolicyBackend.sharded_state``). Raises ``OSError``/``RuntimeError``
    on every rank alike when any rank failed; nothing is left behind then."""
    import torch.distributed.checkpoint as dcp

    from slime_gb10.utils.atomic import _finish_tree, _public_mode, ensure_writable_dir

    made = None
    if dist.is_main:
        parent = ensure_writable_dir(target.parent)
        made = tempfile.mkdtemp(dir=parent, prefix=f".{target.name}.", suffix=".tmp")
        _public_mode(made, directory=True)
    tmp = Path(dist.gather(made)[0])
    try:
        problem = unseen_by(tmp, dist)
        if problem:
            raise RuntimeError(problem)
        try:
            dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp / POLICY_DIR, thread_count=1))
        except CheckpointException as exc:  # a BaseException, raised on every rank alike
            raise RuntimeError(_first_failure(exc)) from exc
        failure = None
        if dist.is_main:
            try:
                torch.save(trainer_state, tmp / "trainer.pt")
                meta = {"step": trainer_state["step"], "reason": reason, "time": time.time(),
                        "sharded": {"world_size": dist.world_size, "format": "torch.distributed.checkpoint"}}  # fmt: skip
                (tmp / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
                _finish_tree(tmp)
                os.replace(tmp, target)
            except (OSError, RuntimeError) as exc:
                failure = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        failure = dist.gather(failure)[0]  # rank 0's outcome, for every rank
        if failure is not None:
            raise RuntimeError(failure)
    finally:
        if dist.is_main and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def load_sharded(path: Path, template: dict) -> dict:
    """``template`` (this rank's state dict as :func:`save_sharded` took it, of this run's world
    size and sharding) filled in place from checkpoint ``path`` and returned; every rank calls it.
    Raises ``ValueError`` naming the first problem (metadata that is not data, a missing key, a
    shape that does not fit)."""
    import torch.distributed.checkpoint as dcp

    reader_cls, planner_cls = _reader_classes()
    try:
        with _one_process_is_intended():
            dcp.load(template, storage_reader=reader_cls(path / POLICY_DIR), planner=planner_cls())
    except UnsafeCheckpoint as exc:
        raise ValueError(str(exc)) from exc
    except CheckpointException as exc:  # a BaseException, raised on every rank alike
        raise ValueError(_first_failure(exc)) from exc
    return template


def whole_state(path: str | os.PathLike, prefix: str = "model.") -> dict[str, torch.Tensor]:
    """The tensors of a sharded checkpoint whose flattened names start with ``prefix`` (the weights,
    by default), whole, in one process: to inspect or convert a checkpoint without its run."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader_cls, planner_cls = _reader_classes()
    metadata = read_metadata_as_data(Path(path) / POLICY_DIR / _METADATA)
    flat = {
        name: torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
        for name, meta in metadata.state_dict_metadata.items()
        if name.startswith(prefix) and isinstance(meta, TensorStorageMetadata)
    }
    with _one_process_is_intended():
        dcp.load(flat, storage_reader=reader_cls(Path(path) / POLICY_DIR), planner=planner_cls())
    return {name[len(prefix) :]: tensor for name, tensor in flat.items()}
