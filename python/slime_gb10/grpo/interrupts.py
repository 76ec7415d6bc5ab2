"""How a run stops: on Ctrl-C (SIGINT), SIGTERM or SIGHUP alike, and never in the middle of a step.

- :func:`stop_on_signals` (around ``GRPOTrainer.train``, and around setup in the CLI) turns SIGTERM
  and SIGHUP into the KeyboardInterrupt that Ctrl-C raises (:class:`SignalInterrupt`, which carries
  the signal), so ``timeout``, a scheduler, ``docker stop``, torchrun's agent or a closed terminal
  stop a run the way Ctrl-C does. A signal that was ignored (``nohup``) stays ignored.
- :func:`finish_step_before_interrupt` holds those signals from a step's first optimizer update
  until its metrics row is logged, so a checkpoint written on an interrupt is always a step boundary.
- :func:`checkpoint_on_interrupt` turns an interrupt anywhere in ``train()`` (the step-0 eval, the
  loop, the final eval, the final write) into :class:`TrainingInterrupted`, after writing a
  checkpoint when the weights in memory are a step boundary that has none yet; the CLI prints the
  resume command and exits 128 + the signal's number (130 SIGINT, 143 SIGTERM, 129 SIGHUP).
- :func:`write_final_model` writes ``final_model/`` only once a checkpoint of the final step
  exists, so a failed final write (a full disk) loses none of the training.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import shutil
import signal
import threading
from pathlib import Path

from slime_gb10.utils.errors import first_line

log = logging.getLogger("slime_gb10.grpo.trainer")

# the signals that stop a run cleanly (SIGHUP does not exist on Windows)
STOP_SIGNALS: tuple[int, ...] = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


def signal_name(signum: int) -> str:
    """'Ctrl-C (SIGINT)', 'SIGTERM', 'SIGHUP': how messages name a signal."""
    name = signal.Signals(signum).name
    return f"Ctrl-C ({name})" if signum == signal.SIGINT else name


class SignalInterrupt(KeyboardInterrupt):
    """A stop signal (SIGINT, SIGTERM, SIGHUP) raised as the KeyboardInterrupt Ctrl-C raises."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


def signal_of(exc: BaseException) -> int:
    """The signal behind an interrupt: its ``signum``, else SIGINT (a plain KeyboardInterrupt)."""
    return int(getattr(exc, "signum", signal.SIGINT))


class TrainingInterrupted(KeyboardInterrupt):
    """The run stopped cleanly on a signal; ``checkpoint`` is where ``--resume`` continues from.

    ``written`` is False when this interrupt wrote nothing: it came in the middle of a policy update
    (a second signal, see :func:`finish_step_before_interrupt`; the weights in memory were then not
    a step boundary), the run has several ranks, or the checkpoint of ``step`` already existed.
    ``checkpoint`` is then the last one written before (None: none). ``exit_code`` is 128 + signal.
    """

    def __init__(
        self, checkpoint: Path | None, step: int, *, written: bool = True, signum: int = signal.SIGINT
    ):
        super().__init__(f"interrupted by {signal.Signals(signum).name} after step {step}")
        self.checkpoint = checkpoint
        self.step = step
        self.written = written
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def explain(self, run_dir: str | Path) -> str:
        """What ``slime-gb10 train`` prints: the signal, what was written, how to go on."""
        way_on = f"Continue with: slime-gb10 train --resume {run_dir}"
        if self.written and self.checkpoint:
            where = f"checkpoint written to {self.checkpoint}"
        elif self.at_step:
            where = f"its checkpoint {self.checkpoint} was already written"
        elif self.checkpoint:
            where = (
                "nothing new written (stopped mid-update, or several ranks); "
                f"the last checkpoint is {self.checkpoint}"
            )
        else:
            where = "no checkpoint written"
            way_on = f"Start over with --overwrite --output {run_dir}"
        return f"\ninterrupted by {signal_name(self.signum)} after step {self.step}: {where}. {way_on}"

    @property
    def at_step(self) -> bool:
        """``checkpoint`` holds ``step`` itself (a resume loses nothing)."""
        from slime_gb10.grpo.checkpoint import checkpoint_path

        return (
            self.checkpoint is not None and Path(self.checkpoint).name == checkpoint_path("", self.step).name
        )


@contextlib.contextmanager
def _handling(handler):
    """Install ``handler`` for each stop signal that is not ignored; the previous ones on exit.

    Only the main thread can install signal handlers; elsewhere the block runs unguarded.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    try:
        for signum in STOP_SIGNALS:
            old = signal.getsignal(signum)
            if old is signal.SIG_IGN:  # nohup, a background job: ignored stays ignored
                continue
            previous[signum] = signal.SIG_DFL if old is None else old  # None: set outside Python
            signal.signal(signum, handler)
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _interrupt(signum, frame):
    raise SignalInterrupt(signum)


@contextlib.contextmanager
def stop_on_signals():
    """SIGINT, SIGTERM and SIGHUP raise :class:`SignalInterrupt` inside the block (no silent death)."""
    with _handling(_interrupt):
        yield


@contextlib.contextmanager
def finish_step_before_interrupt():
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends, then raise the first as an interrupt.

    Wraps a step from its first optimizer update until its metrics are logged, so a checkpoint
    written on an interrupt is always a step boundary (never a half-applied update, never a step
    whose metrics row is missing). A second signal inside the block interrupts at once.
    """
    held: list[int] = []

    def hold(signum, frame):
        if held:
            raise SignalInterrupt(held[0])
        held.append(signum)
        again = "press Ctrl-C again" if signum == signal.SIGINT else f"send {signal_name(signum)} again"
        log.warning(
            "%s: finishing this step, then writing a checkpoint (%s to stop at once, without a new checkpoint)",
            signal_name(signum),
            again,
        )

    with _handling(hold):
        yield
    if held:
        raise SignalInterrupt(held[0])


@contextlib.contextmanager
def checkpoint_on_interrupt(trainer):
    """An interrupt in the block ends in :class:`TrainingInterrupted` with a resumable checkpoint.

    The checkpoint (``checkpoint.save(trainer, "interrupt")``) is written when the weights in
    memory are a step boundary (not ``trainer._mid_step``) of which no checkpoint exists yet. Under several ranks
    nothing is written: a checkpoint needs all of them, and some may already be gone. A second
    signal while the checkpoint is written stops at once, without it.
    """
    from slime_gb10.grpo import checkpoint
    from slime_gb10.grpo.checkpoint import checkpoint_path

    try:
        yield
    except TrainingInterrupted:
        raise
    except KeyboardInterrupt as exc:
        step, last, signum = trainer.step, trainer._last_checkpoint, signal_of(exc)
        done = last is not None and Path(last) == checkpoint_path(trainer.run_dir, step)
        if done or trainer._mid_step or trainer.dist.enabled or trainer._boundary is None:
            raise TrainingInterrupted(last, step, written=False, signum=signum) from None
        try:
            path = checkpoint.save(trainer, "interrupt")
        except KeyboardInterrupt:  # a second signal: stop now; the temporary directory is removed
            raise TrainingInterrupted(last, step, written=False, signum=signum) from None
        raise TrainingInterrupted(path, step, signum=signum) from None


def _write_errors() -> tuple[type[BaseException], ...]:
    """What a failed write of ``final_model/`` raises (safetensors has its own I/O error)."""
    from slime_gb10.utils.atomic import OutputPathError

    errors: list[type[BaseException]] = [OSError, OutputPathError]
    with contextlib.suppress(ImportError):
        from safetensors import SafetensorError

        errors.append(SafetensorError)
    return tuple(errors)


def write_final_model(trainer) -> None:
    """``final_model/`` (rank 0), after making sure a checkpoint of the final step exists.

    The checkpoint is written BEFORE the final model, not in the handler of a failed final write:
    that write fails mostly on a full disk, where a checkpoint (about 12 bytes per parameter, six
    times a BF16 final model) written after it would fail too and the training would be lost. A
    failed final write is then the one-line :class:`~slime_gb10.grpo.checkpoint.CheckpointError` a
    full disk at a checkpoint is, naming the checkpoint to resume from. This safety net prunes no
    older checkpoint, and when ``output.checkpoint_every`` is 0 (the user asked for none; the
    default, which keeps a first run's disk small) it is deleted once ``final_model/`` is written.
    If the net itself cannot be written (a disk too full for it), the smaller final model is still
    tried, on one rank (several ranks would wait in the failed save's barrier).
    """
    import torch

    from slime_gb10.grpo import checkpoint
    from slime_gb10.grpo.checkpoint import CheckpointError, checkpoint_path
    from slime_gb10.utils.atomic import atomic_directory

    cfg = trainer.config.output
    if not cfg.save_final_model:
        return
    final = checkpoint_path(trainer.run_dir, trainer.step)
    last = trainer._last_checkpoint
    safety_net = last is None or Path(last) != final
    if safety_net:  # every rank: save() is a collective
        try:
            final = checkpoint.save(trainer, "final", prune=False)
        except CheckpointError as exc:
            if trainer.dist.enabled:
                raise
            log.warning("no checkpoint of the last step before final_model/: %s", exc)
            safety_net, final = False, last
    # sharded weights (train.sharding=fsdp) are gathered by every rank; rank 0 writes them
    full = trainer.backend.full_model_state() if hasattr(trainer.backend, "full_model_state") else None
    if not trainer.dist.is_main:
        return
    target = trainer.run_dir / "final_model"
    gathered = {"state": full} if full is not None else {}
    try:
        with atomic_directory(target) as tmp:
            trainer.backend.save_pretrained(str(tmp), dtype=getattr(torch, cfg.final_model_dtype), **gathered)
    except _write_errors() as exc:
        raise CheckpointError(_final_write_failure(target, exc, final, trainer)) from exc
    if safety_net and not cfg.checkpoint_every:
        trainer._last_checkpoint = last  # first: a signal during the deletion must not name it
        doomed = final.with_name(f".{final.name}.net.tmp")  # what clean_stale removes, if killed here
        final.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)


def _final_write_failure(target: Path, exc: BaseException, checkpoint: Path | None, trainer) -> str:
    from slime_gb10.grpo.checkpoint import checkpoint_path

    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        try:
            cause = f"no space left on device ({shutil.disk_usage(target.parent).free / 2**20:.0f} MiB free)"
        except OSError:
            cause = "no space left on device"
    else:
        cause = first_line(exc)
    if checkpoint is None:
        return (
            f"cannot write the final model '{target}': {cause}; no checkpoint could be written either, "
            "so the training is lost: free space (or point --output elsewhere) and run it again"
        )
    if Path(checkpoint) != checkpoint_path(trainer.run_dir, trainer.step):
        return (
            f"cannot write the final model '{target}': {cause}; the newest checkpoint is {checkpoint} "
            f"(not the last step's): fix that, then `slime-gb10 train --resume {trainer.run_dir}`"
        )
    return (
        f"cannot write the final model '{target}': {cause}; the training is kept in the checkpoint of "
        f"its last step, {checkpoint}: fix that, then `slime-gb10 train --resume {trainer.run_dir}` "
        "writes final_model/ without training again"
    )
