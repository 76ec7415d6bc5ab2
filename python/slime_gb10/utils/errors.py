"""The one kind of error a user is meant to read: ``UserError``.

An exception class that derives from ``UserError`` promises a message that is the whole story: the
problem and the fix, on one line. ``slime-gb10``'s one handler (``slime_gb10.cli``) prints it as
``Error: <message>`` and exits 1, with no traceback (``-v`` adds it). Anything else that escapes a
command is a bug and keeps its traceback.

Each module keeps its own error class (``ConfigError``, ``DatasetError`` …) next to the code that
raises it, and keeps its older base (``ValueError``, ``RuntimeError``) for callers that catch those.
"""

from __future__ import annotations

import errno

# The click ``ctx.meta`` key under which a subcommand's -v/--verbose reaches the one handler
# (``meta`` is shared by the whole context chain).
VERBOSE = "slime_gb10.verbose"


class UserError(Exception):
    """An error whose message names the problem and the fix (printed on one line, exit 1)."""


# OSErrors that are the machine's state, not a bug: the message says what to change. Another errno
# (or an OSError without one) is left alone: it is a bug until shown otherwise.
_OS_ADVICE = {
    errno.ENOSPC: "the disk is full: free space or write somewhere else",
    errno.EDQUOT: "the disk quota is used up: free space or write somewhere else",
    errno.EACCES: "permission denied: choose a path you can write, or fix its permissions",
    errno.EROFS: "the file system is read-only: write somewhere else",
}


def os_error_message(exc: OSError) -> str | None:
    """One line for an OSError that is the machine's state (full disk, permissions), else None."""
    advice = _OS_ADVICE.get(getattr(exc, "errno", None))
    if advice is None:
        return None
    where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    return f"{exc.strerror or exc}{where}: {advice}"


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, else its type's name (an exception with no message)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
