"""Data-parallel GRPO over ``torch.distributed`` (``torchrun --nproc-per-node N [--nnodes 2 ...]``).

Each rank generates its contiguous share of the step's prompts (all ranks draw the same global
batch from the same seeded sampler), scores and normalises its own groups (a group never spans
ranks), and trains on its samples; gradients are summed over ranks before clipping, so every rank
takes the same optimizer step and keeps the same weights. The loss of each rank is already divided
by the token (or sequence) count of the whole global batch, so the sum over ranks is exactly the
gradient of the 1-rank run; together with the per-row sampling keys of the engines (row i of the
global batch samples with ``seed + i`` wherever it runs) N ranks reproduce the 1-rank step up to
floating-point order.

Why a coalesced all-reduce after the local backward passes instead of wrapping the model in
``DistributedDataParallel``: DDP reduces inside every backward and needs every rank to run the
same number of them, but a rank's micro-batch count depends on how many of its groups carry a
signal (zero-variance groups are skipped) and can be zero. One ``all_reduce`` per optimizer step is
what DDP does without the overlap; with a few hundred MB of gradients it costs milliseconds.

Rank 0 alone writes the run directory (metrics, evaluations, checkpoints, the final model; under
``train.sharding=fsdp`` every rank writes its shards of a checkpoint). A checkpoint holds every
rank's RNG state and the world size; it resumes exactly at the same world size, and at another one
(resharded where sharded) it continues the same run up to floating-point order, since nothing a
step draws depends on the world size.
Collectives time out after ``train.dist_timeout_s``, so a rank that dies or hangs ends the job
instead of hanging it; a collective that fails so (a timeout, a lost connection) is a
:class:`DistributedError`, one line naming the setting and, where knowable, the rank.

Ranks agree or refuse: at setup every rank gathers every other rank's resolved settings (right
after the process group forms, before anything loads) and a digest of its data (right after the
data loads, before the model does); any difference is a :class:`LaunchError` on every rank naming
it, instead of ranks that train apart or time out.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from slime_gb10.utils.errors import UserError, first_line

log = logging.getLogger(__name__)


class LaunchError(UserError, ValueError):
    """A distributed launch that cannot work (world size vs batch, unsupported backend, ranks that
    disagree on their settings or data)."""


class DistributedError(LaunchError):
    """A collective that failed: another rank died, hung or could not be reached (one line)."""


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    timeout_s: int | None = None  # train.dist_timeout_s, for the message of a failed collective

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, items: list) -> list:
        """This rank's contiguous share of ``items`` (``len(items)`` divisible by the world size)."""
        per_rank = len(items) // self.world_size
        return items[self.rank * per_rank : (self.rank + 1) * per_rank]

    # -------------------------------------------------------------- collectives (no-ops on 1 rank)
    def sum(self, values: list[float]) -> list[float]:
        if not self.enabled:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=_comm_device())
        with self._collective("a sum over the ranks"):
            torch.distributed.all_reduce(tensor)
        return tensor.tolist()

    def max(self, values: list[float]) -> list[float]:
        if not self.enabled:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=_comm_device())
        with self._collective("a maximum over the ranks"):
            torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return tensor.tolist()

    def gather(self, obj) -> list:
        """Every rank's ``obj`` (small Python objects: metrics, RNG states), in rank order."""
        if not self.enabled:
            return [obj]
        out: list = [None] * self.world_size
        with self._collective("a gather over the ranks"):
            torch.distributed.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.enabled:
            with self._collective("a barrier"):
                torch.distributed.barrier()

    def all_reduce_gradients(self, parameters) -> None:
        """Sum the gradients of ``parameters`` over ranks in one coalesced all-reduce.

        A parameter without a gradient on every rank keeps none (as on one rank); one that has a
        gradient somewhere gets zeros where it has none, so all ranks hold the same gradients.
        """
        if not self.enabled:
            return
        params = [p for p in parameters if p.requires_grad]
        if not params:
            return
        device = params[0].device
        has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=device)
        with self._collective("the gradient all-reduce"):
            torch.distributed.all_reduce(has)
        for p, flag in zip(params, has.tolist(), strict=True):
            if flag and p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        with self._collective("the gradient all-reduce"):
            torch.distributed.all_reduce(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    # ------------------------------------------------------------------------- ranks agree or refuse
    def agree_on_settings(self, config) -> None:
        """Every rank's resolved settings are rank 0's, or every rank raises :class:`LaunchError`."""
        if self.enabled:
            _refuse(settings_disagreement(self.gather(settings_of(config))))

    def agreed_data(self, data_config, splits: tuple[Any, list]) -> tuple[Any, list]:
        """``splits`` (the training source and held-out examples of ``prompts.load_splits``) once
        every rank holds the same; else every rank raises :class:`LaunchError` naming the data."""
        if self.enabled:
            _refuse(data_disagreement(self.gather(data_report(data_config, *splits))))
        return splits

    def agree_on_weights(self, backend, config, choice: Any = None) -> None:
        """Every rank starts from rank 0's weights (after a resume too), or every rank raises
        :class:`LaunchError`: ranks do not broadcast weights, each loads its own copy. The engine and
        backend each rank resolved (``choice``: ``auto`` resolves per machine) are compared first."""
        if self.enabled:  # a sharded backend's own load (a resume takes rank 0's checkpoint: fsdp.py)
            digest = getattr(backend, "loaded_digest", None) or weights_digest(
                backend.export_weights(config.rollout.weight_bucket_mb * 2**20)
            )
            chose = f"{choice.rollout}+{choice.trainer}" if choice is not None else None
            report = {"model": config.model.name_or_path, "digest": digest, "choice": chose}
            _refuse(weights_disagreement(self.gather(report)))

    # ------------------------------------------------------------------------- failed collectives
    @contextlib.contextmanager
    def _collective(self, what: str):
        """A collective that times out or loses a rank becomes a :class:`DistributedError`; any other
        error (a programming error, a tensor of the wrong type) propagates unchanged."""
        try:
            yield
        except RuntimeError as exc:
            kind = collective_failure(exc)
            if kind is None:
                raise
            log.debug("%s failed on rank %d", what, self.rank, exc_info=True)  # gloo's words, with -v
            said = first_line(exc)[:200]
            raise DistributedError(
                failure_message(
                    kind, what, rank=self.rank, world_size=self.world_size, timeout_s=self.timeout_s
                )
                + f" [{said}]"
            ) from exc


# what gloo says when a peer times out or goes away (NCCL's watchdog usually ends the process itself
# first); anything else, NCCL's local errors included, is not a collective failure
_TIMEOUT = re.compile(r"timed out|timeout", re.IGNORECASE)
_LOST = re.compile(
    r"closed by peer|reset by peer|connection (?:closed|reset|refused)|broken pipe|pair closure|"
    r"remote (?:worker|process)|socket",
    re.IGNORECASE,
)


def collective_failure(exc: BaseException) -> str | None:
    """``"timeout"``, ``"lost"`` (a peer's connection closed: it died or was stopped) or None (not a
    failure of the collective itself)."""
    if not isinstance(exc, RuntimeError):
        return None
    text = str(exc)
    if _TIMEOUT.search(text):
        return "timeout"
    if _LOST.search(text):  # by the words alone: a DistBackendError may be a local CUDA error
        return "lost"
    return None


def failure_message(kind: str, what: str, *, rank: int, world_size: int, timeout_s: int | None) -> str:
    """One line: which rank failed (knowable with two ranks: the other one; gloo names only a peer's
    address), how, and the setting: ``train.dist_timeout_s``."""
    who = f"rank {1 - rank}" if world_size == 2 else f"another of the {world_size} ranks"
    setting = f"train.dist_timeout_s={timeout_s} s" if timeout_s is not None else "train.dist_timeout_s"
    if kind == "timeout":
        return (
            f"{who} did not answer within {setting} ({what}): it died or hung, see its log; raise "
            "train.dist_timeout_s if a step (or rank 0's evaluation) legitimately takes longer"
        )
    return (
        f"{who} did not answer ({what}): its connection closed, it died or was stopped, see its log "
        f"(a rank that hangs instead ends the job after {setting})"
    )


# Settings that may differ between ranks, and why; every other one shapes the step that all ranks
# must take alike, a collective that all ranks must call alike (checkpoints, the final model), or
# what rank 0 writes on behalf of all, so it must be the same everywhere.
RANK_LOCAL_SETTINGS = frozenset(
    {
        # display only: rank 0 alone shows a progress bar (a launcher may turn it off elsewhere)
        "output.progress",
        # compared by content instead (DistContext.agreed_data, agree_on_weights): the same file
        # or checkpoint may live under another path on another node
        "data.path",
        "data.eval_path",
        "model.name_or_path",
        # each rank's memory plan checks its own host's memory (two nodes may leave different room)
        "train.memory_budget_gib",
    }
)


def settings_of(config) -> dict[str, Any]:
    """The whole resolved config as ``{"section.key": value}`` (JSON values: a dict-valued setting
    such as data.arithmetic stays one value), less RANK_LOCAL_SETTINGS."""
    return {
        f"{section}.{key}": value
        for section, values in config.model_dump(mode="json").items()
        for key, value in values.items()
        if f"{section}.{key}" not in RANK_LOCAL_SETTINGS
    }


def _show(value: Any) -> str:
    """A setting's value as one writes it: 1e-05, true, null, 'text', [1, 2]."""
    return repr(value) if isinstance(value, str) else json.dumps(value)


_UNSET = "<unset>"  # a key one rank's config has and another's (another version of the code) lacks


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
    return f"rank {shown}" if len(ranks) == 1 else f"ranks {shown}"


def settings_disagreement(gathered: list[dict[str, Any]], *, most: int = 6) -> str | None:
    """None when every rank's settings (``settings_of``, in rank order) are rank 0's; else one line
    naming each differing key with rank 0's value and the other ranks' values."""
    first = gathered[0]
    keys = sorted(set().union(*gathered))
    parts = []
    for key in keys:
        ours = _show(first[key]) if key in first else _UNSET
        others: dict[str, list[int]] = {}
        for rank, settings in enumerate(gathered[1:], start=1):
            theirs = _show(settings[key]) if key in settings else _UNSET
            if theirs != ours:
                others.setdefault(theirs, []).append(rank)
        if others:
            where = ", ".join(f"{value} on {_ranks(ranks)}" for value, ranks in others.items())
            parts.append(f"{key} is {ours} on rank 0 and {where}")
    if not parts:
        return None
    more = f"; and {len(parts) - most} more setting(s)" if len(parts) > most else ""
    return (
        f"ranks disagree on their settings: {'; '.join(parts[:most])}{more}; "
        "launch every rank with the same command"
    )


def _examples_digest(source: Any) -> dict[str, Any]:
    """Count and SHA-256 of a list of examples (prompt, ground truth, difficulty: what the steps and
    the order of easy_first see). A generated stream (the arithmetic task) follows from its settings,
    which ``settings_of`` compares: only its kind is reported."""
    if not isinstance(source, list):
        return {"source": type(source).__name__}
    digest = hashlib.sha256()
    for example in source:
        row = [example.prompt, str(example.ground_truth), getattr(example, "difficulty", None)]
        digest.update(json.dumps(row, ensure_ascii=False).encode() + b"\n")
    return {"count": len(source), "sha256": digest.hexdigest()}


def data_report(data_config, train_source: Any, eval_examples: list) -> dict[str, Any]:
    """What the ranks compare of their data: where it came from and a digest of each split."""
    return {
        "path": data_config.path,
        "eval_path": data_config.eval_path,
        "train": _examples_digest(train_source),
        "eval": _examples_digest(eval_examples),
    }


def _where(report: dict[str, Any], split: str) -> str:
    source = report[split]
    if "count" in source:
        count = f"{source['count']} example" + ("" if source["count"] == 1 else "s")
    else:
        count = f"the {source['source']} stream"
    if split == "eval" and report.get("eval_path"):
        return f"data.eval_path={report['eval_path']!r}, {count}"
    if report.get("path"):
        return f"data.path={report['path']!r}, {count}"
    return count


def data_disagreement(gathered: list[dict[str, Any]]) -> str | None:
    """None when every rank's ``data_report`` (in rank order) is rank 0's; else one line naming the
    split that differs and the data of rank 0 and of the first rank that differs."""
    first = gathered[0]
    for split, name in (("train", "training"), ("eval", "held-out")):
        ranks = [r for r, report in enumerate(gathered) if report[split] != first[split]]
        if ranks:
            also = f" (also on {_ranks(ranks[1:])})" if len(ranks) > 1 else ""
            return (
                f"ranks disagree on their data: the {name} examples differ between rank 0 "
                f"({_where(first, split)}) and rank {ranks[0]} ({_where(gathered[ranks[0]], split)}){also}; "
                "give every rank the same data"
            )
    return None


def weights_digest(stream: Iterable) -> str:
    """A digest of a weight stream (``backend.export_weights``): every bucket's metadata and 4,096
    evenly spaced bytes of its payload. Cheap at any model size, and two different checkpoints
    differ in nearly every byte; equal weights give equal digests on any device."""
    digest = hashlib.sha256()
    for bucket in stream:
        digest.update(repr(bucket.meta).encode())
        payload = bucket.payload
        digest.update(payload[:: max(1, payload.numel() // 4096)].cpu().numpy().tobytes())
    return digest.hexdigest()


def weights_disagreement(gathered: list[dict[str, Any]]) -> str | None:
    """None when every rank's weights digest is rank 0's; else one line naming the ranks' models
    (or, first, the engine and backend choices when ranks resolved them apart)."""
    choices = [r for r, report in enumerate(gathered) if report.get("choice") != gathered[0].get("choice")]
    if choices:
        return (
            f"ranks chose different engines or backends: {gathered[0].get('choice')} on rank 0, "
            f"{gathered[choices[0]].get('choice')} on rank {choices[0]}; set backends.rollout and "
            "backends.trainer explicitly"
        )
    ranks = [r for r, report in enumerate(gathered) if report["digest"] != gathered[0]["digest"]]
    if not ranks:
        return None
    also = f" (also on {_ranks(ranks[1:])})" if len(ranks) > 1 else ""

    def model(report: dict[str, Any]) -> str:
        return f"model.name_or_path={report['model']!r}" if report["model"] else "the embedded model"

    return (
        f"ranks disagree on their model: the weights of rank {ranks[0]} ({model(gathered[ranks[0]])}) "
        f"differ from rank 0's ({model(gathered[0])}){also}; give every rank the same checkpoint"
    )


def _refuse(problem: str | None) -> None:
    """Every rank computes the same ``problem`` from the same gathered reports, so all raise."""
    if problem is not None:
        raise LaunchError(problem)


def _comm_device() -> torch.device:
    """Where small tensors for collectives live: the GPU for NCCL, the CPU for gloo."""
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def env_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def check_launch(config, world_size: int) -> None:
    """Refuse, before any model loads, a launch that cannot work; one message naming the fix."""
    tp = config.megatron.tensor_parallel_size
    if tp > 1 and config.backends.trainer != "megatron":
        raise LaunchError(
            f"megatron.tensor_parallel_size={tp} is Megatron-core's tensor parallelism: add --trainer megatron"
        )
    if world_size % tp:
        raise LaunchError(
            f"{world_size} rank(s) do not divide into tensor-parallel groups of megatron.tensor_parallel_size={tp}: "
            f"launch torchrun --nproc-per-node {tp} (or a multiple of it) -m slime_gb10 train ..."
        )
    if tp > 1 and config.megatron.use_distributed_optimizer:
        raise LaunchError(  # its checkpoints would hold each tensor-parallel rank's shards apart
            "megatron.use_distributed_optimizer does not yet combine with megatron.tensor_parallel_size > 1; "
            "set one of them"
        )
    if world_size <= 1:
        return
    prompts = config.rollout.prompts_per_step
    if prompts % world_size:
        raise LaunchError(
            f"rollout.prompts_per_step={prompts} does not divide over {world_size} ranks; use a multiple of "
            f"{world_size} (each rank generates and scores whole groups of its share of the prompts)"
        )
    if config.backends.rollout == "sglang":
        raise LaunchError(
            f"{world_size} ranks: each rank rolls out with its own PyTorch engine (SGLang under torchrun, "
            "and its tensor parallelism, are not wired in yet); use --rollout torch"
        )
    if config.backends.trainer == "megatron" and config.train.sharding != "none":
        raise LaunchError(
            "train.sharding=fsdp shards the PyTorch backend; Megatron-core shards its optimizer state over "
            "the ranks with --set megatron.use_distributed_optimizer=true (and train.sharding=none)"
        )


def init(config) -> DistContext:
    """The process group from torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``/``MASTER_PORT``): NCCL when the ranks have GPUs, gloo otherwise."""
    world_size = env_world_size()
    check_launch(config, world_size)
    if world_size <= 1:
        return DistContext()
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = config.backends.device
    use_cuda = device != "cpu" and torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(local_rank)
    timeout_s = config.train.dist_timeout_s
    ctx = DistContext(rank=rank, world_size=world_size, local_rank=local_rank, timeout_s=timeout_s)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(
            backend="nccl" if use_cuda else "gloo",
            timeout=datetime.timedelta(seconds=timeout_s),
            # bind the process group to this rank's GPU (else NCCL guesses it at the first barrier)
            device_id=torch.device("cuda", local_rank) if use_cuda else None,
        )
    try:  # before anything loads: the same settings everywhere (data: DistContext.agreed_data)
        ctx.agree_on_settings(config)
    except LaunchError:
        torch.distributed.destroy_process_group()  # the trainer never sees this context to close it
        raise
    log.info(
        "rank %d of %d (local rank %d), backend %s",
        rank,
        world_size,
        local_rank,
        torch.distributed.get_backend(),
    )
    return ctx
