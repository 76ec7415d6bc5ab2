"""How a run stops on Ctrl-C: never in the middle of a step.

- :func:`finish_step_before_interrupt` holds SIGINT from a step's first optimizer update until its
  metrics row is logged, so a checkpoint written on Ctrl-C is always a step boundary.
- :class:`TrainingInterrupted` is what the trainer raises after writing that checkpoint; the CLI
  prints the resume command and exits 130.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from pathlib import Path

log = logging.getLogger("slime_gb10.grpo.trainer")


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C: the run stopped cleanly; ``checkpoint`` is where ``--resume`` continues from.

    ``written`` is False when the interrupt came in the middle of a policy update (a second
    Ctrl-C, see :func:`finish_step_before_interrupt`): the weights in memory were then not a step
    boundary, so nothing was written and ``checkpoint`` is the last one written before.
    """

    def __init__(self, checkpoint: Path | None, step: int, *, written: bool = True):
        super().__init__(f"interrupted after step {step}")
        self.checkpoint = checkpoint
        self.step = step
        self.written = written


@contextlib.contextmanager
def finish_step_before_interrupt():
    """Hold Ctrl-C (SIGINT) until the block ends, then raise it.

    Wraps a step from its first optimizer update until its metrics are logged, so a checkpoint
    written on Ctrl-C is always a step boundary (never a half-applied update, never a step whose
    metrics row is missing). A second Ctrl-C inside the block interrupts at once. Only the main
    thread can install signal handlers; elsewhere the block runs unguarded.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum, frame):
        if held:
            raise KeyboardInterrupt
        held.append(signum)
        log.warning(
            "Ctrl-C: finishing this step, then writing a checkpoint "
            "(press Ctrl-C again to stop at once, without a new checkpoint)"
        )

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        raise KeyboardInterrupt
