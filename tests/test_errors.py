"""The one kind of user-facing error (``slime_gb10.utils.errors.UserError``): every exception class
of the package either is one (its message is printed on one line by the CLI's one handler) or is
named here as internal, with the reason; and the OSErrors that are the machine's state read as one
line with the fix."""

from __future__ import annotations

import errno
import importlib
import inspect
import pkgutil

import pytest

import slime_gb10
from slime_gb10.utils.errors import UserError, os_error_message

# Exceptions that are not a message for the user, and why.
INTERNAL = {
    # a signal, not an error: the train command prints what was saved and exits 128 + signal
    "slime_gb10.grpo.interrupts.TrainingInterrupted",
    # SIGTERM/SIGHUP raised as a KeyboardInterrupt, so that they stop a run as Ctrl-C does
    "slime_gb10.grpo.interrupts.SignalInterrupt",
    # raised inside the reward loop and scored as an error count of the step (never reaches the CLI)
    "slime_gb10.grpo.rewards.RewardValueError",
    # a broken contract between our own engine and trainer: a bug, keeps its traceback
    "slime_gb10.grpo.weight_sync.WeightSyncError",
    # mostly a protocol violation of the SGLang server (a bug here or there), which wants the traceback
    "slime_gb10.grpo.engines.sglang_engine.SGLangEngineError",
}


def _package_exception_classes():
    found = {}
    for info in pkgutil.walk_packages(slime_gb10.__path__, "slime_gb10."):
        if info.name.endswith("__main__"):  # runs the CLI when imported
            continue
        try:
            module = importlib.import_module(info.name)
        except Exception:  # an optional dependency (sglang, megatron, TE) is missing here
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == info.name:
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


def test_every_exception_class_is_a_user_error_or_named_internal():
    classes = _package_exception_classes()
    assert "slime_gb10.grpo.config_files.ConfigError" in classes  # the walk found the package
    undecided = sorted(n for n, c in classes.items() if not issubclass(c, UserError) and n not in INTERNAL)
    assert not undecided, f"derive these from UserError or name them in INTERNAL with a reason: {undecided}"
    stale = sorted(n for n in INTERNAL if n not in classes)
    assert not stale, stale


@pytest.mark.parametrize(
    "code,advice",
    [
        (errno.ENOSPC, "the disk is full: free space or write somewhere else"),
        (errno.EACCES, "permission denied: choose a path you can write, or fix its permissions"),
        (errno.EROFS, "the file system is read-only: write somewhere else"),
    ],
)
def test_the_machines_state_reads_as_one_line_with_the_fix(code, advice):
    exc = OSError(code, "strerror text", "/runs/x/metrics.jsonl")
    assert os_error_message(exc) == f"strerror text (/runs/x/metrics.jsonl): {advice}"


def test_other_os_errors_are_left_to_their_traceback():
    assert os_error_message(OSError(errno.ENOENT, "No such file or directory", "x")) is None
    assert os_error_message(OSError("no errno at all")) is None
