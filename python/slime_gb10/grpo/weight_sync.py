"""Weight sync from the trainer to the rollout engine: ONE chunk plan for metadata and payload.

The lesson of SkyRL PR #1816 (NovaSky-AI/SkyRL, Nemotron-3-Ultra GRPO): when the metadata that
tells the receiver how to slice the byte stream (names, dtypes, shapes) and the packing of that
stream are built by two pieces of code, they drift (a dtype regrouping added to one and not the
other), and the receiver loads correct bytes under wrong names -- coherent-looking garbage,
reward 0, no crash -- or a collective deadlocks. Here:

- :func:`plan_chunks` is the ONE generator that decides everything: bucket order, which tensors
  share a bucket, each tensor's transfer dtype, its byte offset. Both the metadata and the
  payload come from it.
- :class:`WeightStream` runs the plan once for the metadata (tensors dropped as they go: nothing
  is held twice) and again for the payload, asserting that the second run yields exactly the
  metadata's bucket before packing it, so a drift between the two runs is a loud
  :class:`WeightSyncError`.
- :func:`receive` checks every bucket's metadata against the announced metadata in order and,
  after the last bucket, that the streamed names equal the metadata names (length and first
  mismatch).
- Tensors matching a keep-FP32 pattern (default ``*e_score_correction_bias``, the MoE router
  bias whose per-expert offsets of ~1e-3 vanish under BF16 rounding at magnitudes ~25-57) travel
  in float32, as does an NVFP4 weight's ``weight_scale_2`` (its global scale, FP32 in ModelOpt's
  format); other floating tensors in ``transfer_dtype``; 8-bit floats (NVFP4 block scales) and
  integer/bool buffers keep their dtype.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

DEFAULT_KEEP_FP32: tuple[str, ...] = ("*e_score_correction_bias", "*.weight_scale_2")
#: Floating dtypes that are a format's bits, not numbers to round: they travel as they are
EXACT_DTYPES = frozenset({torch.float8_e4m3fn, torch.float8_e5m2})


class WeightSyncError(RuntimeError):
    """The streamed weights do not match the announced metadata (a sender/receiver desync)."""


@dataclass(frozen=True)
class TensorMeta:
    """Where one tensor lives in its bucket's payload and how to view it."""

    name: str
    dtype: str  # torch dtype name without "torch.", e.g. "bfloat16", "float32", "int64"
    shape: tuple[int, ...]
    offset: int  # byte offset in the bucket payload (multiple of the plan's alignment)
    nbytes: int


@dataclass(frozen=True)
class BucketMeta:
    """One bucket: its position in the stream, payload size in bytes and tensors in order."""

    index: int
    nbytes: int
    tensors: tuple[TensorMeta, ...]

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]


@dataclass
class WeightBucket:
    """A bucket's metadata and its payload: a flat ``uint8`` tensor on the source device."""

    meta: BucketMeta
    payload: torch.Tensor


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``; ``WeightSyncError`` for an unknown name."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise WeightSyncError(f"unknown dtype {name!r} in weight-sync metadata")
    return dtype


def transfer_dtype_for(
    name: str, dtype: torch.dtype, transfer_dtype: torch.dtype | None, keep_fp32: Sequence[str]
) -> torch.dtype:
    """The dtype a tensor travels in.

    float32 for names matching a ``keep_fp32`` pattern (fnmatch, case-sensitive), ``transfer_dtype``
    for other floating tensors (``None``: their own dtype), the tensor's own dtype otherwise
    (integer and bool buffers, 8-bit floats: :data:`EXACT_DTYPES`).
    """
    if not dtype.is_floating_point or dtype in EXACT_DTYPES:
        return dtype
    if any(fnmatch.fnmatchcase(name, pattern) for pattern in keep_fp32):
        return torch.float32
    return dtype if transfer_dtype is None else transfer_dtype


def _align(offset: int, alignment: int) -> int:
    return (offset + alignment - 1) // alignment * alignment


def plan_chunks(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    bucket_bytes: int,
    transfer_dtype: torch.dtype | None = torch.bfloat16,
    keep_fp32: Sequence[str] = DEFAULT_KEEP_FP32,
    alignment: int = 256,
) -> Iterator[tuple[BucketMeta, list[torch.Tensor]]]:
    """THE chunk plan: yields ``(BucketMeta, source tensors of that bucket)`` in stream order.

    Tensors are taken in the order given. Each tensor's transfer dtype comes from
    :func:`transfer_dtype_for`; its offset is the bucket's running size rounded up to
    ``alignment`` bytes (so every view is aligned for any dtype). A tensor that would push the
    bucket past ``bucket_bytes`` closes the bucket first; a tensor larger than ``bucket_bytes``
    gets a bucket of its own. The yielded tensors are the originals (not cast): packing casts
    them one at a time, so the plan holds at most one bucket of source tensors. Duplicate names
    raise :class:`WeightSyncError`.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a power of two, got {alignment}")
    keep = tuple(keep_fp32)
    seen: set[str] = set()
    index = 0
    metas: list[TensorMeta] = []
    tensors: list[torch.Tensor] = []
    size = 0

    def close() -> tuple[BucketMeta, list[torch.Tensor]]:
        return BucketMeta(index=index, nbytes=size, tensors=tuple(metas)), tensors

    for name, tensor in named_tensors:
        if name in seen:
            raise WeightSyncError(f"tensor name {name!r} appears twice in the weights to sync")
        seen.add(name)
        out_dtype = transfer_dtype_for(name, tensor.dtype, transfer_dtype, keep)
        nbytes = tensor.numel() * out_dtype.itemsize
        offset = _align(size, alignment)
        if metas and offset + nbytes > bucket_bytes:
            yield close()
            index += 1
            metas, tensors, size, offset = [], [], 0, 0
        metas.append(TensorMeta(name, dtype_name(out_dtype), tuple(tensor.shape), offset, nbytes))
        tensors.append(tensor)
        size = offset + nbytes
    if metas:
        yield close()


def stream_names(metadata: Sequence[BucketMeta]) -> list[str]:
    """All tensor names of a stream, in order."""
    return [t.name for bucket in metadata for t in bucket.tensors]


def check_metadata(
    metadata: Sequence[BucketMeta],
    expected: Mapping[str, tuple[tuple[int, ...], torch.dtype | None]],
    *,
    receiver: str,
    optional: Sequence[str] = (),
    exact: Collection[str] = (),
) -> None:
    """Validate a whole stream's metadata against the receiver's tensors BEFORE anything is written.

    ``expected`` maps each receiving tensor's name to ``(shape, dtype)`` (dtype None: any floating
    type). Every streamed name must exist there with the same shape and a compatible dtype
    (floating into floating but for :data:`EXACT_DTYPES` and the names in ``exact``, else the same), and every expected name except ``optional`` ones must
    be streamed. All problems are collected into one :class:`WeightSyncError` naming
    ``receiver``, so a mismatch never leaves a model half overwritten.
    """
    problems: list[str] = []
    streamed: set[str] = set()
    for bucket in metadata:
        for t in bucket.tensors:
            if t.name in streamed:
                problems.append(f"'{t.name}' is streamed twice")
                continue
            streamed.add(t.name)
            if t.name not in expected:
                problems.append(f"'{t.name}' has no tensor in the {receiver}")
                continue
            shape, dtype = expected[t.name]
            if tuple(t.shape) != tuple(shape):
                problems.append(
                    f"'{t.name}': shape {tuple(t.shape)} streamed, {tuple(shape)} in the {receiver}"
                )
            sent = dtype_from_name(t.dtype)
            if dtype is not None and sent != dtype and (t.name in exact or not _castable(sent, dtype)):
                problems.append(
                    f"'{t.name}': dtype {t.dtype} streamed, {dtype_name(dtype)} in the {receiver}"
                )
    missing = sorted(set(expected) - streamed - set(optional))
    if missing:
        problems.append(f"{len(missing)} tensor(s) of the {receiver} are not streamed, e.g. {missing[:3]}")
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise WeightSyncError(f"weight sync refused before writing anything: {shown}")


def _castable(sent: torch.dtype, dtype: torch.dtype) -> bool:
    """Whether a tensor sent as ``sent`` may be copied into one of ``dtype`` (a rounding cast)."""
    numbers = sent.is_floating_point and dtype.is_floating_point
    return numbers and sent not in EXACT_DTYPES and dtype not in EXACT_DTYPES


def _first_mismatch(streamed: Sequence[str], expected: Sequence[str]) -> str | None:
    """A description of the first difference between two name lists, or None if equal."""
    if list(streamed) == list(expected):
        return None
    for pos, (a, b) in enumerate(zip(streamed, expected)):
        if a != b:
            return (
                f"streamed {len(streamed)} tensors, metadata lists {len(expected)}; "
                f"first mismatch at position {pos}: streamed {a!r}, metadata {b!r}"
            )
    pos = min(len(streamed), len(expected))
    extra = (
        f"streamed {streamed[pos]!r} beyond the metadata"
        if len(streamed) > len(expected)
        else f"metadata {expected[pos]!r} never streamed"
    )
    return f"streamed {len(streamed)} tensors, metadata lists {len(expected)}; first mismatch at position {pos}: {extra}"


def _bucket_mismatch(got: BucketMeta, expected: BucketMeta, names_before: int) -> str:
    """Describe how a bucket differs from its announced metadata (names first, then layout)."""
    diff = _first_mismatch(got.names, expected.names)
    if diff is not None:
        # report positions in the whole stream
        for i, (a, b) in enumerate(zip(got.names, expected.names)):
            if a != b:
                return (
                    f"bucket {expected.index} ({len(got.tensors)} tensors, metadata {len(expected.tensors)}): "
                    f"first mismatch at stream position {names_before + i}: got {a!r}, metadata {b!r}"
                )
        return f"bucket {expected.index}: {diff}"
    if got.index != expected.index:
        return f"bucket index {got.index} arrived where metadata expects bucket {expected.index}"
    for a, b in zip(got.tensors, expected.tensors):
        if a != b:
            return f"bucket {expected.index}: tensor {a.name!r} is {a} but the metadata says {b}"
    return f"bucket {expected.index}: payload size {got.nbytes} but the metadata says {expected.nbytes}"


def pack_bucket(meta: BucketMeta, tensors: Sequence[torch.Tensor]) -> WeightBucket:
    """Copy (and cast) ``tensors`` into one flat ``uint8`` payload laid out by ``meta``.

    The payload lives on the first tensor's device; padding bytes are zero.
    """
    device = tensors[0].device if tensors else torch.device("cpu")
    payload = torch.zeros(meta.nbytes, dtype=torch.uint8, device=device)
    for tmeta, tensor in zip(meta.tensors, tensors, strict=True):
        if tmeta.nbytes == 0:
            continue
        view = payload[tmeta.offset : tmeta.offset + tmeta.nbytes].view(dtype_from_name(tmeta.dtype))
        view.view(tmeta.shape).copy_(tensor.detach())
    return WeightBucket(meta=meta, payload=payload)


class WeightStream:
    """Metadata up front, payload buckets on iteration, both from :func:`plan_chunks`.

    ``named_tensors_fn`` must yield the same tensors each time it is called (e.g.
    ``lambda: model.named_parameters()`` or a Megatron export that gathers to HF names). Each
    iteration re-runs the plan and raises :class:`WeightSyncError` on the first bucket that differs
    from :attr:`metadata`, before packing it.
    """

    def __init__(
        self,
        named_tensors_fn: Callable[[], Iterable[tuple[str, torch.Tensor]]],
        *,
        bucket_bytes: int,
        transfer_dtype: torch.dtype | None = torch.bfloat16,
        keep_fp32: Sequence[str] = DEFAULT_KEEP_FP32,
        alignment: int = 256,
        metadata_fn: Callable[[], Iterable[tuple[str, torch.Tensor]]] | None = None,
    ) -> None:
        self._named_tensors_fn = named_tensors_fn
        self._plan_kwargs = {
            "bucket_bytes": bucket_bytes,
            "transfer_dtype": transfer_dtype,
            "keep_fp32": tuple(keep_fp32),
            "alignment": alignment,
        }
        # First run: keep only the metadata; each bucket's tensors are dropped as we go.
        # ``metadata_fn``: the same names, shapes and dtypes without computing the values (tensors
        # derived at sync time, e.g. NVFP4 round trips, may be ``meta`` tensors there); the payload
        # pass is checked against it bucket by bucket all the same.
        self.metadata: list[BucketMeta] = [
            meta for meta, _ in plan_chunks((metadata_fn or named_tensors_fn)(), **self._plan_kwargs)
        ]

    @property
    def names(self) -> list[str]:
        return stream_names(self.metadata)

    @property
    def total_bytes(self) -> int:
        return sum(b.nbytes for b in self.metadata)

    def __len__(self) -> int:
        return len(self.metadata)

    def __iter__(self) -> Iterator[WeightBucket]:
        names_before = 0
        count = 0
        for meta, tensors in plan_chunks(self._named_tensors_fn(), **self._plan_kwargs):
            if count >= len(self.metadata):
                raise WeightSyncError(
                    f"the weights changed between the metadata pass and the payload pass: bucket {meta.index} "
                    f"({meta.names[:3]}...) is beyond the {len(self.metadata)} announced buckets"
                )
            expected = self.metadata[count]
            if meta != expected:
                raise WeightSyncError(
                    "the weights changed between the metadata pass and the payload pass: "
                    + _bucket_mismatch(meta, expected, names_before)
                )
            yield pack_bucket(meta, tensors)
            names_before += len(meta.tensors)
            count += 1
        if count != len(self.metadata):
            raise WeightSyncError(
                f"the weights changed between the metadata pass and the payload pass: {count} buckets "
                f"streamed, {len(self.metadata)} announced; first missing: bucket {count} "
                f"starting with {self.metadata[count].names[:1]}"
            )


def unpack_bucket(
    bucket: WeightBucket, device: torch.device | str | None = None
) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` views into the bucket's payload (moved to ``device`` first if given).

    The tensors share the payload's memory (no copy on the payload's device); copy them into the
    model's parameters (``param.copy_(tensor)``) or clone them to keep them.
    """
    payload = bucket.payload
    if payload.dtype != torch.uint8 or payload.dim() != 1:
        raise WeightSyncError(
            f"bucket {bucket.meta.index}: payload must be a flat uint8 tensor, got {payload.dtype}"
        )
    if payload.numel() < bucket.meta.nbytes:
        raise WeightSyncError(
            f"bucket {bucket.meta.index}: payload has {payload.numel()} bytes, metadata needs {bucket.meta.nbytes}"
        )
    if device is not None:
        payload = payload.to(device)
    out = []
    for t in bucket.meta.tensors:
        dtype = dtype_from_name(t.dtype)
        if t.offset % dtype.itemsize or t.offset + t.nbytes > payload.numel():
            raise WeightSyncError(f"bucket {bucket.meta.index}: tensor {t.name!r} has an invalid slice {t}")
        raw = payload[t.offset : t.offset + t.nbytes]
        out.append((t.name, raw.view(dtype).view(t.shape)))
    return out


def receive_buckets(
    stream: WeightStream | tuple[Sequence[BucketMeta], Iterable[WeightBucket]],
    device: torch.device | str | None = None,
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Yield each bucket's ``(name, tensor)`` list, checking the stream against its metadata.

    Each bucket's :class:`BucketMeta` must equal the next announced one (else
    :class:`WeightSyncError` before any of its tensors is yielded); after the last bucket the
    streamed names must equal the metadata names, or :class:`WeightSyncError` gives both lengths
    and the first mismatching position with both names. Engines that load a bucket at a time
    (SGLang's ``update_weights_from_tensor``) take these lists as they come.
    """
    if isinstance(stream, WeightStream):
        metadata, buckets = stream.metadata, iter(stream)
    else:
        metadata, buckets = stream
    metadata = list(metadata)
    expected_names = stream_names(metadata)
    streamed: list[str] = []
    for position, bucket in enumerate(buckets):
        if position >= len(metadata):
            streamed.extend(bucket.meta.names)
            raise WeightSyncError(
                f"weight stream desync: bucket {position} arrived but the metadata announces {len(metadata)} buckets; "
                + (_first_mismatch(streamed, expected_names) or "")
            )
        if bucket.meta != metadata[position]:
            raise WeightSyncError(
                "weight stream desync: " + _bucket_mismatch(bucket.meta, metadata[position], len(streamed))
            )
        tensors = unpack_bucket(bucket, device)
        streamed.extend(name for name, _ in tensors)
        yield tensors
    mismatch = _first_mismatch(streamed, expected_names)
    if mismatch is not None:
        raise WeightSyncError(f"weight stream desync: {mismatch}")


def receive(
    stream: WeightStream | tuple[Sequence[BucketMeta], Iterable[WeightBucket]],
    device: torch.device | str | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """:func:`receive_buckets`, one ``(name, tensor)`` at a time (engines that copy into parameters)."""
    for bucket in receive_buckets(stream, device):
        yield from bucket
