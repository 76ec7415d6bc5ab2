"""``subprocess.run`` with a time limit that really holds.

``subprocess.run(..., timeout=)`` kills the child but then waits for its output pipes to close; a
grandchild that inherited them (a shell script's ``sleep``, a compiler driver's worker) keeps them
open and the wait never ends. Here the child starts its own process group and the whole group is
killed when the time is up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence


def run(
    cmd: Sequence[str],
    timeout_s: float,
    *,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
) -> subprocess.CompletedProcess:
    """Run ``cmd`` capturing text output; on timeout kill its process group and raise TimeoutExpired."""
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        _kill_group(proc)
        try:
            stdout, stderr = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            stdout, stderr = "", ""
        exc.stdout, exc.stderr = stdout, stderr
        raise
    except BaseException:
        _kill_group(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group while the child is still ours (not yet reaped)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
