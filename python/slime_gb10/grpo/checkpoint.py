"""Checkpoints of a GRPO run: ``<run>/checkpoints/step-000010/`` written atomically.

Each checkpoint directory holds ``policy.pt`` (model + optimizer + scheduler, from
``PolicyBackend.state_dict``; FSDP writes ``policy/`` through DCP, Megatron's tensor parallelism
``policy_whole/``), ``trainer.pt`` (step, data position, RNG states of python /
numpy / torch) and ``meta.json``. The directory is built under a temporary name and renamed into
place (:func:`slime_gb10.utils.atomic.atomic_directory`), so a crash never leaves a half-written
checkpoint, and the newest complete one is what ``--resume`` finds.

A checkpoint is data, never code: both ``.pt`` files are read with ``torch.load(weights_only=True)``
(tensors, numbers, strings, lists, tuples and dicts only), so a tampered file is an error, not a
program. That is why the RNG states are stored as tensors and plain numbers (:func:`rng_state`).
"""

from __future__ import annotations

import errno
import json
import logging
import random
import re
import shutil
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slime_gb10.utils.atomic import atomic_directory, clean_stale_siblings
from slime_gb10.utils.errors import UserError, first_line

log = logging.getLogger(__name__)

#: Where a backend that writes its state as it gathers it (Megatron's tensor parallelism:
#: ``tp_checkpoint.write_whole_state``) puts it in a checkpoint.
WHOLE_STATE_DIR = "policy_whole"

CHECKPOINT_DIR = "checkpoints"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint cannot be found, read or written; the message names the path and the way on."""


def rng_state() -> dict[str, Any]:
    """Every RNG state a step depends on, as tensors and plain numbers (loadable with weights_only)."""
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),  # (version, tuple of 625 ints, gauss or None)
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": n["bit_generator"],
            "state": {"key": n["key"].numpy().astype(np.uint32), "pos": int(n["pos"])},
            "has_gauss": int(n["has_gauss"]),
            "gauss": float(n["gauss"]),
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / f"step-{step:06d}"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints (those with meta.json), oldest first."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / "meta.json").is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def is_checkpoint_dir(path: str | Path) -> bool:
    """``path`` is one checkpoint (``.../checkpoints/step-N``), not a run directory."""
    p = Path(path)
    return bool(_STEP_DIR.match(p.name)) and p.parent.name == CHECKPOINT_DIR


def run_dir_of(path: str | Path) -> Path:
    """The run directory of ``path``: itself, or the run a checkpoint directory belongs to."""
    p = Path(path)
    return p.parent.parent if is_checkpoint_dir(p) else p


def clean_stale(run_dir: str | Path) -> list[Path]:
    """Remove what a killed save left in ``<run>/checkpoints`` (``.step-N.*.tmp`` directories).

    Called when a run directory is opened (under its lock, so no save is in flight). A
    ``.step-N.old`` left by a kill between the two renames of a replacement is moved back when
    ``step-N`` is missing, so a checkpoint is never lost to that window.
    """
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    return clean_stale_siblings(root)


def _tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _write_failure(target: Path, exc: BaseException, needed: int, run_dir: Path) -> CheckpointError:
    """One line for a failed save: the path, the cause (a full disk named as such), the last good one."""
    try:
        free = shutil.disk_usage(target.parent).free
    except OSError:
        free = None
    full = (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)) or (
        free is not None and free < needed
    )
    if full:
        have = f"{free / 2**20:.0f} MiB free" if free is not None else "the device is full"
        cause = f"no space left on device ({have}, a checkpoint needs about {needed / 2**20:.0f} MiB)"
    else:
        cause = first_line(exc)
    done = list_checkpoints(run_dir)
    last = f"the last good checkpoint is {done[-1][1]}" if done else "no checkpoint was written before"
    return CheckpointError(f"cannot write checkpoint '{target}': {cause}; {last}")


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    policy_state: dict,
    trainer_state: dict,
    *,
    keep: int = 2,
    reason: str = "periodic",
) -> Path:
    """Write checkpoint ``step`` atomically, then delete the oldest beyond ``keep``.

    A step that already has a complete checkpoint is not written again (Ctrl-C right after a
    periodic save): both are the same step boundary, and replacing a directory takes two renames,
    between which a kill would leave no loadable checkpoint. A failed write (a full disk)
    raises :class:`CheckpointError` naming the path and the last good checkpoint; nothing of the
    failed one is left behind.
    """
    run_dir = Path(run_dir)
    target = checkpoint_path(run_dir, step)
    if _already_written(target, step):
        return target
    others = _others(run_dir, target)
    try:
        with atomic_directory(target) as tmp:
            torch.save(policy_state, tmp / "policy.pt")
            torch.save(trainer_state, tmp / "trainer.pt")
            (tmp / "meta.json").write_text(
                json.dumps({"step": step, "reason": reason, "time": time.time()}, indent=1), encoding="utf-8"
            )
    except (OSError, RuntimeError) as exc:
        raise _write_failure(target, exc, _tensor_bytes(policy_state), run_dir) from exc
    _prune(others, keep)
    return target


def _already_written(target: Path, step: int) -> bool:
    if (target / "meta.json").is_file():
        log.info("checkpoint of step %d already written: %s", step, target)
        return True
    return False


def _others(run_dir: Path, target: Path) -> list[Path]:
    """The other checkpoints, oldest first, listed before a write: pruning never removes the new one."""
    return [path for _, path in list_checkpoints(run_dir) if path != target]


def _prune(others: list[Path], keep: int) -> None:
    """Delete the oldest of ``others`` so that ``keep - 1`` stay beside the new checkpoint."""
    for old in others[: max(0, len(others) + 1 - keep)]:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(path: str | Path) -> tuple[dict, dict]:
    """(policy_state, trainer_state) of one checkpoint directory, read as data (``weights_only=True``)."""
    p = Path(path)
    if not (p / "meta.json").is_file():
        raise CheckpointError(f"'{p}' is not a complete checkpoint (no meta.json)")
    from slime_gb10.grpo.sharded_checkpoint import UnsafeCheckpoint, check_metadata, is_sharded_checkpoint

    sharded = is_sharded_checkpoint(p)  # read by the backend, through DCP, at its world size
    if sharded:
        try:
            check_metadata(p)  # its index as data, now: before any model loads
        except UnsafeCheckpoint as exc:
            raise CheckpointError(f"cannot read checkpoint {exc}") from exc
    states = [{"sharded_checkpoint": str(p)}] if sharded else []
    whole = p / WHOLE_STATE_DIR
    if whole.is_dir():
        from slime_gb10.grpo.backends.megatron.tp_checkpoint import read_whole_state

        try:
            states = [read_whole_state(whole)]
        except Exception as exc:  # JSON's, safetensors' and the format's own: all one line
            raise CheckpointError(
                f"cannot read checkpoint '{whole}' as data: {first_line(exc)[:300]}"
            ) from exc
    for name in ("trainer.pt",) if states else ("policy.pt", "trainer.pt"):
        try:
            # mmap: a rank reads only the pages it uses (every rank loads the checkpoint; under
            # Megatron's distributed optimizer only rank 0 reads the gathered optimizer shards). A
            # file that is no zip archive (damaged) loads without it, to fail with torch's own words
            # about the file, not mmap's advice on how to save one
            mmap = zipfile.is_zipfile(p / name)
            states.append(torch.load(p / name, map_location="cpu", weights_only=True, mmap=mmap))
        except Exception as exc:  # UnpicklingError, a broken zip, a truncated file, a missing file...
            first = first_line(exc)
            raise CheckpointError(
                f"cannot read checkpoint file '{p / name}' as data: {first[:300]}. It is corrupt, was "
                "tampered with, or was written by slime-gb10 < 0.2 (only tensors and plain values load)"
            ) from exc
    policy, trainer = states
    if not isinstance(policy, dict) or not isinstance(trainer, dict) or "step" not in trainer:
        raise CheckpointError(f"checkpoint '{p}' does not hold a policy and trainer state")
    return policy, trainer


def load_for_resume(target: str | Path) -> tuple[Path, dict, dict]:
    """(checkpoint path, policy_state, trainer_state) to resume from.

    ``target`` is a checkpoint directory (that one is loaded, or it is an error) or a run
    directory: its newest checkpoint, else, when that one cannot be read, the newest readable one
    (each skipped checkpoint is logged with the reason).
    """
    target = Path(target)
    if is_checkpoint_dir(target):
        return (target, *load_checkpoint(target))
    found = list_checkpoints(target)
    if not found:
        raise CheckpointError(
            f"--resume: no checkpoint under '{target / CHECKPOINT_DIR}' (a run writes one every "
            "output.checkpoint_every steps, at the end and on Ctrl-C, SIGTERM or SIGHUP); check the path, "
            f"or start a run there with `slime-gb10 train --output {target}`"
        )
    errors = []
    for _, path in reversed(found):
        try:
            policy, trainer = load_checkpoint(path)
        except CheckpointError as exc:
            errors.append(str(exc))
            log.warning("skipping checkpoint %s: %s", path, exc)
            continue
        if errors:
            log.warning(
                "resuming from the older checkpoint %s (%d newer one(s) unreadable)", path, len(errors)
            )
        return path, policy, trainer
    raise CheckpointError(f"--resume: no readable checkpoint under '{target / CHECKPOINT_DIR}': {errors[0]}")


def agreed_resume(target: str | Path, dist) -> tuple[Path, dict, dict]:
    """:func:`load_for_resume` for every rank of a run at once: rank 0 picks the checkpoint (the
    newest it can read), every other rank reads that one, and a failure on any rank is the same
    one-line error on all (a rank that fell back to an older checkpoint alone, or stopped alone
    while the others went on to load, would train apart or leave them waiting)."""
    if not dist.enabled:
        return load_for_resume(target)
    resumed, problem = None, None
    if dist.is_main:
        try:
            resumed = load_for_resume(target)
        except (CheckpointError, OSError) as exc:  # OSError: a stale NFS handle, a permission
            problem = _unreadable(target, exc)
    chosen, problem = dist.gather((None if resumed is None else str(resumed[0]), problem))[0]
    if problem is None and not dist.is_main:
        try:
            resumed = (Path(chosen), *load_checkpoint(chosen))
        except (CheckpointError, OSError) as exc:
            problem = f"rank {dist.rank}: {_unreadable(chosen, exc)}"
    problems = [p for p in dist.gather(problem) if p]
    if problems:
        raise CheckpointError(problems[0])
    return resumed


def _unreadable(where: str | Path, exc: BaseException) -> str:
    if isinstance(exc, CheckpointError):
        return str(exc)
    return f"--resume: cannot read '{where}': {getattr(exc, 'strerror', None) or exc}"


def save(run, reason: str = "periodic", prune: bool = True) -> Path:
    """Checkpoint a training run (``GRPOTrainer``) at its last step boundary; rank 0 writes, every
    rank calls (a collective: each rank's RNG state is gathered). ``prune``: keep only
    ``output.keep_checkpoints``. Returns the checkpoint's path (on every rank)."""
    boundary = run._boundary
    assert boundary is not None and boundary["step"] == run.step
    state = {**boundary, "world_size": run.dist.world_size}
    if run.dist.enabled:
        state["rank_rng"] = run.dist.gather(boundary["rng"])
    if getattr(run.backend, "sharded", False):  # train.sharding=fsdp: every rank writes its shards
        path = _save_sharded(run, state, reason=reason, prune=prune)
    elif getattr(run.backend, "streams_state", False):  # Megatron TP: rank 0 writes as the ranks gather
        path = _save_streamed(run, state, reason=reason, prune=prune)
    else:
        path = checkpoint_path(run.run_dir, run.step)  # where rank 0 writes it
        # Megatron's distributed optimizer gathers its shards onto rank 0: every rank takes part
        if run.dist.is_main or getattr(run.backend, "collective_state", False):
            policy = run.backend.state_dict()
        if run.dist.is_main:
            path = save_checkpoint(
                run.run_dir,
                run.step,
                policy,
                state,
                keep=run.config.output.keep_checkpoints if prune else 1 << 30,
                reason=reason,
            )
        run.dist.barrier()
    run._last_checkpoint = path
    return path


def _save_sharded(run, state: dict, *, reason: str, prune: bool) -> Path:
    """:func:`save` of a sharded backend: :func:`~slime_gb10.grpo.sharded_checkpoint.save_sharded`
    with the same skip, failure message and pruning as :func:`save_checkpoint`, decided by rank 0."""
    from slime_gb10.grpo.sharded_checkpoint import save_sharded

    target = checkpoint_path(run.run_dir, run.step)
    if run.dist.gather(_already_written(target, run.step))[0]:  # rank 0 decides for all
        return target
    others = _others(Path(run.run_dir), target)
    policy = run.backend.sharded_state()
    try:
        save_sharded(target, policy, state, run.dist, reason=reason)
    except (OSError, RuntimeError) as exc:
        raise _write_failure(target, exc, _tensor_bytes(policy), Path(run.run_dir)) from exc
    if run.dist.is_main:
        _prune(others, run.config.output.keep_checkpoints if prune else 1 << 30)
    run.dist.barrier()
    return target


def _save_streamed(run, state: dict, *, reason: str, prune: bool) -> Path:
    """:func:`save` of a backend that writes its state as it gathers it (``write_state``: Megatron's
    tensor parallelism, ``policy_whole/``), with :func:`save_checkpoint`'s skip, atomic directory,
    failure message and pruning. Every rank takes part in the gathers whatever happens on rank 0,
    which writes, then tells the others how it went: a failure is a CheckpointError on every rank."""
    target = checkpoint_path(run.run_dir, run.step)
    if run.dist.gather(_already_written(target, run.step))[0]:  # rank 0 decides for all
        return target
    failure = None
    if run.dist.is_main:
        others, gathered = _others(Path(run.run_dir), target), False
        try:
            with atomic_directory(target) as tmp:
                gathered = True
                written = run.backend.write_state(tmp / WHOLE_STATE_DIR)
                if written is not None:
                    raise written
                torch.save(state, tmp / "trainer.pt")
                (tmp / "meta.json").write_text(
                    json.dumps({"step": run.step, "reason": reason, "time": time.time()}, indent=1),
                    encoding="utf-8",
                )
        except Exception as exc:  # OSError, safetensors' errors: one line on every rank
            if not gathered:  # the directory could not be made: still this rank's part of the gathers
                run.backend.write_state(None)
            needed = 14 * run.backend.num_parameters  # about: whole BF16 and FP32 weights, two moments
            failure = str(_write_failure(target, exc, needed, Path(run.run_dir)))
        else:
            _prune(others, run.config.output.keep_checkpoints if prune else 1 << 30)
    else:
        run.backend.write_state(None)
    failure = run.dist.gather(failure)[0]
    if failure is not None:
        raise CheckpointError(failure)
    return target


def restore(run, resumed: tuple[Path, dict, dict]) -> None:
    """Put a training run (``GRPOTrainer``, set up up to its sampler) back at a checkpoint
    (``load_for_resume``'s ``(path, policy_state, trainer_state)``): weights and optimizer, the
    sampler's position, this rank's RNG and the step (what came after it: :func:`discard_after`)."""
    path, policy_state, trainer_state = resumed
    saved_world = int(trainer_state.get("world_size", 1))
    if saved_world != run.dist.world_size:
        # What a step draws does not depend on the world size: the sampler's global batch, and
        # rollouts keyed by seed, step and global row (distributed.py), so a run resumed on another
        # number of ranks continues as the saved one would have, up to floating-point order. The
        # RNG states are each rank's own; a rank the checkpoint did not have takes rank 0's.
        log.warning(
            "resuming a checkpoint of %d rank(s) on %d: weights, optimizer, schedule and data position "
            "are the checkpoint's (resharded where the run is sharded)",
            saved_world,
            run.dist.world_size,
        )
    try:
        run.backend.load_state_dict(policy_state)
        run.sampler.load_state_dict(trainer_state["sampler"])
        ranks = trainer_state.get("rank_rng") or [trainer_state["rng"]]
        set_rng_state(ranks[run.dist.rank] if run.dist.rank < len(ranks) else ranks[0])
    except (KeyError, ValueError, RuntimeError, TypeError, IndexError) as exc:
        raise CheckpointError(f"checkpoint '{path}' does not fit this run: {first_line(exc)}") from exc
    run.step = int(trainer_state["step"])
    run._last_checkpoint = path
    log.info("resumed from %s (step %d)", path, run.step)


def discard_after(run) -> None:
    """Resuming at step N discards what came after it: metrics, samples and any newer checkpoint (a
    save of step N + k must never find the discarded one in its place). Rank 0 alone (another rank's
    atomic rewrite could replace the file rank 0 appends to), once every rank has agreed to go on."""
    from slime_gb10.grpo.metrics import METRICS_FILE, SAMPLES_FILE, truncate_after

    if run.dist.is_main:
        for later_step, later in list_checkpoints(run.run_dir):
            if later_step > run.step:
                log.warning("removing checkpoint %s: the run resumes from step %d", later, run.step)
                shutil.rmtree(later)
        truncate_after(run.run_dir / METRICS_FILE, run.step)
        truncate_after(run.run_dir / SAMPLES_FILE, run.step)
