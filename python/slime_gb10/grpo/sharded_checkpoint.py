"""Sharded checkpoints of a ``train.sharding=fsdp`` run, through ``torch.distributed.checkpoint``.

Layout: ``<run>/checkpoints/step-000010/`` holds ``policy/`` (DCP's directory: ``.metadata`` and one
``__<rank>_0.distcp`` per rank, each rank's shards of the FP32 weights and AdamW's moments, plus the
schedule), ``trainer.pt`` and ``meta.json`` as an unsharded checkpoint does. No rank ever holds
more than its own shards: rank 0 no longer gathers 16 bytes a parameter to write ``policy.pt``.

Whole or absent: every rank writes into one temporary directory that rank 0 made (its name
gathered to all), DCP reports any rank's failure to every rank, and rank 0 renames the finished
directory into place; a crash leaves a ``.step-N.*.tmp`` that opening the run removes. Every rank
must see that directory: on two Sparks, ``--output`` on a filesystem both mount (NFS); a node that
cannot see it is refused in one line before anything loads (the trainer asks at setup).

Any world size can read it back: DCP plans each rank's reads from the chunks it needs, so a run
resumed on fewer or more ranks, sharded or not, loads the same weights and moments (resharding).

Data, never code: DCP writes its ``.metadata`` as a pickle that its own reader unpickles without
restriction, and reads its non-tensor items (the optimizer's settings, the schedule) with torch's
unrestricted unpickler; either would run whatever a tampered checkpoint holds.
:func:`read_metadata_as_data` unpickles the metadata admitting only DCP's own metadata classes,
``torch.Size``, dtypes, layouts and paths, lets the pickle call and set the state of nothing else,
and refuses a shard file named outside the checkpoint; :class:`DataOnlyLoadPlanner` reads the items
with ``weights_only=True``. Resuming reads the metadata so before any model loads.

Resuming agrees across ranks (``checkpoint.agreed_resume``): rank 0 picks the checkpoint and every
rank reads that one. A checkpoint of step 0 holds no optimizer state (there is none yet).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import pickle
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch.distributed.checkpoint.api import CheckpointException

from slime_gb10.utils.errors import UserError, first_line

POLICY_DIR = "policy"
_METADATA = ".metadata"

# The globals a DCP ``.metadata`` pickle names (torch 2.11-2.13: read with pickletools from real
# checkpoints of FSDP2 models, AdamW and a LambdaLR schedule): its dataclasses, and how torch pickles
# sizes, layouts and dtypes; the writer's path (StorageMeta.checkpoint_id) is a pathlib path.
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
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "pathlib._local": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},  # Python 3.13
}
# Of those, what a pickle may call (REDUCE, NEWOBJ: build a size, a layout by name, an enum member,
# a path, a dataclass) and whose instances it may set the state of (BUILD): never a class itself or
# a function, whose attributes BUILD would otherwise rewrite for the whole process.
_CALLABLE = {"Size", "_get_layout", "_MEM_FORMAT_ENCODING", "OrderedDict", "PosixPath", "PurePosixPath",
             "WindowsPath", "PureWindowsPath", "Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
             "ChunkStorageMetadata", "TensorProperties", "MetadataIndex", "StorageMeta", "_StorageInfo"}  # fmt: skip
_BUILDABLE = {"Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
              "TensorProperties", "MetadataIndex", "StorageMeta", "_StorageInfo"}  # fmt: skip


class UnsafeCheckpoint(UserError, ValueError):
    """A checkpoint's metadata is not DCP metadata made of data."""


class _MetadataUnpickler(pickle._Unpickler):
    """Python's pure-Python unpickler with its globals restricted (pickle's documented "restricting
    globals") and, beyond that, its REDUCE, NEWOBJ and BUILD opcodes confined to the metadata's
    classes: torch's own weights-only unpickler would do this, but it reads no pickle protocol
    above 2 and DCP writes protocol 4 (FRAME is an unsupported opcode there)."""

    def __init__(self, file):
        super().__init__(file)
        self._allowed = {}  # id -> the object find_class handed out

    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_CLASSES.get(module, ()):
            found = super().find_class(module, name)
        elif module == "torch" and isinstance(vars(torch).get(name), torch.dtype):  # no lazy import
            found = vars(torch)[name]
        else:
            raise UnsafeCheckpoint(f"it names {module}.{name}, which is not checkpoint metadata")
        self._allowed[id(found)] = name
        return found

    def _callable(self, obj: Any, opcode: str) -> None:
        if self._allowed.get(id(obj)) not in _CALLABLE:
            raise UnsafeCheckpoint(f"its {opcode} calls {obj!r}")

    def load_reduce(self):
        self._callable(self.stack[-2], "REDUCE")
        super().load_reduce()

    def load_newobj(self):
        self._callable(self.stack[-2], "NEWOBJ")
        super().load_newobj()

    def load_newobj_ex(self):
        self._callable(self.stack[-3], "NEWOBJ_EX")
        super().load_newobj_ex()

    def load_build(self):
        state, target = self.stack[-1], self.stack[-2]
        if isinstance(target, type) or self._allowed.get(id(type(target))) not in _BUILDABLE:
            raise UnsafeCheckpoint(f"its BUILD sets the state of {target!r}")
        # its declared fields only, never a method; a class with its own __setstate__
        # (TensorProperties: a tuple) reads the state itself
        if dataclasses.is_dataclass(target) and "__setstate__" not in vars(type(target)):
            fields = {f.name for f in dataclasses.fields(target)}
            parts = state if isinstance(state, tuple) and len(state) == 2 else (state, None)
            if any(
                part is not None and not (isinstance(part, dict) and set(part) <= fields) for part in parts
            ):
                raise UnsafeCheckpoint(
                    f"its BUILD gives a {type(target).__name__} attributes beside its fields"
                )
        super().load_build()

    def _adds_to(self, target: Any, kind: type, opcode: str) -> None:
        """APPEND(S), ADDITEMS and SETITEM(S) add to ``target``: only to a plain container (on any
        other object they would call whatever ``extend``/``append``/``add`` it has)."""
        if type(target) is not kind:
            raise UnsafeCheckpoint(f"its {opcode} adds to a {type(target).__name__}")

    def load_append(self):
        self._adds_to(self.stack[-2], list, "APPEND")
        super().load_append()

    def load_appends(self):  # the items since the mark are self.stack; the target ends the one below
        self._adds_to(self.metastack[-1][-1], list, "APPENDS")
        super().load_appends()

    def load_additems(self):
        self._adds_to(self.metastack[-1][-1], set, "ADDITEMS")
        super().load_additems()

    def load_setitem(self):
        self._adds_to(self.stack[-3], dict, "SETITEM")
        super().load_setitem()

    def load_setitems(self):
        self._adds_to(self.metastack[-1][-1], dict, "SETITEMS")
        super().load_setitems()

    def load_inst(self):  # protocol 0/1: a call of a class named inline
        raise UnsafeCheckpoint("it uses the INST opcode, which DCP never writes")

    def load_obj(self):
        raise UnsafeCheckpoint("it uses the OBJ opcode, which DCP never writes")

    dispatch: ClassVar[dict] = {
        **pickle._Unpickler.dispatch,
        pickle.REDUCE[0]: load_reduce,
        pickle.NEWOBJ[0]: load_newobj,
        pickle.NEWOBJ_EX[0]: load_newobj_ex,
        pickle.BUILD[0]: load_build,
        pickle.APPEND[0]: load_append,
        pickle.APPENDS[0]: load_appends,
        pickle.ADDITEMS[0]: load_additems,
        pickle.SETITEM[0]: load_setitem,
        pickle.SETITEMS[0]: load_setitems,
        pickle.INST[0]: load_inst,
        pickle.OBJ[0]: load_obj,
    }


def read_metadata_as_data(path: str | os.PathLike) -> Any:
    """A DCP ``.metadata`` file unpickled with only metadata classes admitted and every file it
    points at a plain name inside its directory; anything else, or a broken file, is an
    :class:`UnsafeCheckpoint` naming the file."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except UnsafeCheckpoint as exc:
        raise UnsafeCheckpoint(f"'{path}' is not data: {exc}") from None
    except OSError as exc:
        raise UnsafeCheckpoint(f"cannot read '{path}': {exc.strerror or exc}") from None
    except Exception as exc:  # a truncated or garbled pickle, a bad layout name, a bad enum value...
        raise UnsafeCheckpoint(f"'{path}' is not DCP metadata ({type(exc).__name__}: {exc})") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise UnsafeCheckpoint(f"'{path}' is not DCP metadata (it holds a {type(metadata).__name__})")
    for info in metadata.storage_data.values():  # DCP opens each of these beside the .metadata
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise UnsafeCheckpoint(f"'{path}' points outside its directory ({name!r})")
    return metadata


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
        return f"rank {rank}: {first_line(inner[0] if isinstance(inner, tuple) else inner)}"
    return first_line(exc)


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

    from slime_gb10.utils.atomic import _public_mode, ensure_writable_dir, finish_directory

    made, failure = None, None
    if dist.is_main:  # rank 0 makes the directory; its outcome reaches every rank (no one waits)
        try:
            parent = ensure_writable_dir(target.parent)
            made = tempfile.mkdtemp(dir=parent, prefix=f".{target.name}.", suffix=".tmp")
            _public_mode(made, directory=True)
        except (OSError, UserError) as exc:
            failure = first_line(exc)
    made, failure = dist.gather((made, failure))[0]
    if failure is not None:
        raise RuntimeError(failure)
    tmp = Path(made)
    try:
        problem = unseen_by(tmp, dist)
        if problem:
            raise RuntimeError(problem)
        try:
            dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp / POLICY_DIR, thread_count=1))
        except CheckpointException as exc:  # a BaseException, raised on every rank alike
            raise RuntimeError(_first_failure(exc)) from exc
        if dist.is_main:
            try:
                torch.save(trainer_state, tmp / "trainer.pt")
                meta = {"step": trainer_state["step"], "reason": reason, "time": time.time(),
                        "sharded": {"world_size": dist.world_size, "format": "torch.distributed.checkpoint"}}  # fmt: skip
                (tmp / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
                finish_directory(tmp, target)  # an incomplete step-N left by a crash makes way
            except (OSError, RuntimeError) as exc:
                failure = first_line(exc)
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
    except CheckpointException as exc:  # a BaseException, raised on every rank alike
        raise ValueError(_first_failure(exc)) from exc
    return template


def check_metadata(path: str | os.PathLike) -> Any:
    """The metadata of sharded checkpoint ``path``, read as data (:func:`read_metadata_as_data`):
    what resuming reads before any model loads, so a tampered or broken checkpoint is refused
    (or passed over for an older one) in one line."""
    return read_metadata_as_data(Path(path) / POLICY_DIR / _METADATA)


def has_optimizer_state(path: str | os.PathLike) -> bool:
    """Whether the checkpoint holds Adam's moments (a checkpoint of step 0 has none to hold)."""
    return any(name.startswith("optimizer.state.") for name in check_metadata(path).state_dict_metadata)


def whole_state(path: str | os.PathLike, prefix: str = "model.") -> dict[str, torch.Tensor]:
    """The tensors of a sharded checkpoint whose flattened names start with ``prefix`` (the weights,
    by default), whole, in one process: to inspect or convert a checkpoint without its run."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    flat = {
        name: torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
        for name, meta in check_metadata(path).state_dict_metadata.items()
        if name.startswith(prefix) and isinstance(meta, TensorStorageMetadata)
    }
    load_sharded(Path(path), flat)
    return {name[len(prefix) :]: tensor for name, tensor in flat.items()}
