"""``subprocess.run`` with a time limit that really holds, and no process left behind.

``subprocess.run(..., timeout=)`` kills the child but then waits for its output pipes to close; a
grandchild that inherited them (a shell script's ``sleep``, a compiler driver's worker) keeps them
open and the wait never ends. Here the child starts its own process group; its output is read by
two threads; the wait is for the child itself, not for its pipes. When the child exits, whatever
is still running in its group (a grandchild holding the pipes) is killed after a short grace, so
a tool that finished is reported by its own exit status, never as a timeout; when the time is up
the whole group is killed and ``TimeoutExpired`` raised.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

# After the child exits: how long its leftover group members may keep writing before they are killed.
GRACE_S = 0.5


def _drain(pipe: IO[str], sink: list[str]) -> None:
    with contextlib.suppress(ValueError, OSError):
        sink.append(pipe.read())


def run(
    cmd: Sequence[str],
    timeout_s: float,
    *,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
) -> subprocess.CompletedProcess:
    """Run ``cmd`` capturing text output; on timeout kill its process group and raise TimeoutExpired.

    In every case the child's process group is killed before this returns, so nothing it started
    outlives the call.
    """
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
    out: list[str] = []
    err: list[str] = []
    readers = [
        threading.Thread(target=_drain, args=(proc.stdout, out), daemon=True),
        threading.Thread(target=_drain, args=(proc.stderr, err), daemon=True),
    ]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + timeout_s
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        _kill_group(proc.pid)
        proc.wait()
        _join(readers, proc, 5.0)
        exc.stdout, exc.stderr = "".join(out), "".join(err)
        raise
    except BaseException:
        _kill_group(proc.pid)
        proc.wait()
        raise
    # The child is done; grandchildren may still hold its pipes: a short grace, then the group goes.
    _join(readers, proc, max(0.0, min(GRACE_S, deadline - time.monotonic())))
    _kill_group(proc.pid)
    _join(readers, proc, 5.0)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(out), "".join(err))


def _join(readers: list[threading.Thread], proc: subprocess.Popen, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    for reader in readers:
        reader.join(max(0.0, end - time.monotonic()))
    if not any(reader.is_alive() for reader in readers):
        for pipe in (proc.stdout, proc.stderr):
            with contextlib.suppress(OSError):
                pipe.close()


def _kill_group(pgid: int, wait_s: float = 5.0) -> None:
    """SIGKILL every process left in the group ``pgid`` (the child's own pid: it is the leader), and
    wait (at most ``wait_s``) until none of them is running any more: SIGKILL is delivered
    asynchronously, and a caller that checks right after (or starts the next step) must not find a
    member still alive. A killed member that is only waiting to be reaped (a zombie: its parent, the
    shell we already waited for, is gone) runs nothing and counts as gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    end = time.monotonic() + wait_s
    while _group_running(pgid) and time.monotonic() < end:
        time.sleep(0.005)


def _group_running(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still running (not a zombie). Reads /proc on Linux;
    elsewhere a signal 0 to the group answers (zombies then count as running)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        # after the command's closing parenthesis: state, ppid, pgrp
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False
