"""One run, one directory, one writer.

A fresh ``slime-gb10 train`` into a directory that already holds a run would mix the two (two
``metrics.jsonl`` histories, the new checkpoints pruned as "older" than the old ones, a later
``--resume`` continuing the old run with the new config). So a run directory is opened with
:func:`open_run_dir`, which

* refuses a fresh run into a directory that holds a run's outputs, naming ``--resume`` and
  ``--overwrite`` (which deletes those outputs, and only those); a run with no checkpoint (one that
  died before its first) has nothing to resume, so then both a fresh run and ``--resume`` name
  ``--overwrite`` alone;
* takes an exclusive ``flock`` on ``<run>/.lock`` for the life of the run, so a second process
  cannot write the same run (the kernel drops the lock when the process dies: no stale locks);
* tidies what a killed save left behind (``checkpoint.clean_stale``);
* on failure before the run starts, removes the directory again if it created it and nothing
  else was written (:meth:`RunDirectory.abandon`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from pathlib import Path

from slime_gb10.utils.atomic import OutputPathError, clean_stale_siblings, ensure_writable_dir

LOCK_FILE = ".lock"
# What a run writes into its directory (trainer, metrics.RunLogger, plot): what --overwrite deletes.
RUN_OUTPUTS = (
    "config.yaml",
    "metrics.jsonl",
    "samples.jsonl",
    "checkpoints",
    "final_model",
    "curves.png",
    "eval.json",
    "tensorboard",
    "wandb",
)


class RunDirectoryError(OutputPathError):
    """The run directory cannot be used as asked; the message names the way on."""


def run_outputs(path: Path) -> list[str]:
    """The names of a run's outputs present in ``path`` (empty: not a run directory)."""
    return [name for name in RUN_OUTPUTS if (path / name).exists()]


def no_checkpoint_message(path: Path, found: list[str], resume: bool) -> str:
    """Why a run directory without a checkpoint (a run that died before its first) can be neither
    continued nor silently reused; a fresh run into it and ``--resume`` of it get the same advice."""
    if resume:
        return (
            f"--resume: '{path}' holds a run with no checkpoint ({', '.join(found)}), so it cannot be "
            f"continued; start it over with `slime-gb10 train --overwrite --output {path}` (deletes those "
            "outputs), or choose another --output"
        )
    return (
        f"'{path}' already holds a run with no checkpoint ({', '.join(found)}), so it cannot be continued; "
        f"start it over by adding --overwrite to this command (`--overwrite --output {path}` deletes those "
        "outputs), or choose another --output"
    )


class RunDirectory:
    """An opened run directory: holds the lock until :meth:`close`."""

    def __init__(self, path: Path, fd: int, created: bool):
        self.path = path
        self._fd: int | None = fd
        self._created = created

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None

    def abandon(self) -> None:
        """Release the lock; remove the directory if this run created it and wrote nothing else."""
        self.close()
        if not self._created:
            return
        with contextlib.suppress(OSError):
            (self.path / LOCK_FILE).unlink()
            self.path.rmdir()  # only succeeds when empty


def open_run_dir(path: str | Path, *, resume: bool = False, overwrite: bool = False) -> RunDirectory:
    """Create/open ``path`` for one run and lock it (see the module docstring)."""
    p = Path(path)
    if resume and overwrite:
        raise RunDirectoryError("--resume continues a run and --overwrite deletes it: pass one of them")
    created = not p.exists()
    ensure_writable_dir(p)
    fd = os.open(p / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RunDirectoryError(
            f"run directory '{p}' is in use by another slime-gb10 process (pid {holder}); "
            "wait for it to finish or choose another --output"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    run = RunDirectory(p, fd, created)
    try:
        from slime_gb10.grpo.checkpoint import clean_stale, list_checkpoints

        found = run_outputs(p)
        clean_stale(p)  # first: a checkpoint a killed save left as .step-N.old is one to resume from
        if found and not overwrite and not list_checkpoints(p):
            # (a run that died before its first checkpoint): no weights to resume, whichever was asked
            raise RunDirectoryError(no_checkpoint_message(p, found, resume))
        if found and not resume:
            if not overwrite:
                raise RunDirectoryError(
                    f"'{p}' already holds a run ({', '.join(found)}). Continue it with "
                    f"`slime-gb10 train --resume {p}`, start over with --overwrite (deletes those outputs), "
                    "or choose another --output"
                )
            for name in found:
                target = p / name
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                else:
                    target.unlink()
        clean_stale_siblings(p)  # .config.yaml.*.tmp, .final_model.*.tmp ...
    except BaseException:
        run.close()
        raise
    return run
