"""Atomic file output: a reader (or a crash) never sees a half-written file.

Everything the package writes for the user (checkpoints, metrics, exported models,
benchmark JSON) goes through these helpers: write to a temporary file in the same
directory, flush and fsync, then ``os.replace`` onto the final name, which POSIX
guarantees is atomic within one file system.

The final file or directory gets the permissions an ordinary ``open``/``mkdir`` would give it
(``0o666`` / ``0o777`` less the umask), not the private ``0o600`` / ``0o700`` of ``mkstemp`` and
``mkdtemp``: an exported model must be readable by the serving process of another user when the
umask says so.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from slime_gb10.utils.errors import UserError

_umask_lock = threading.Lock()


def current_umask() -> int:
    """The process umask (read by setting and restoring it: POSIX has no read-only call)."""
    with _umask_lock:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def _public_mode(path: str | os.PathLike, directory: bool) -> None:
    os.chmod(path, (0o777 if directory else 0o666) & ~current_umask())


class OutputPathError(UserError, ValueError):
    """An output path cannot be written; the message says why and what to do."""


def ensure_writable_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` (and parents) if needed and check that files can be created in it.

    Raises :class:`OutputPathError` naming the path and the fix instead of failing later,
    half-way through a run.
    """
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(
            f"cannot create output directory '{p}': {exc.strerror or exc}. "
            "Choose a directory you can write to (e.g. --output ./runs/my-run)."
        ) from exc
    if not p.is_dir():
        raise OutputPathError(f"output path '{p}' exists and is not a directory; choose another path.")
    try:
        with tempfile.NamedTemporaryFile(dir=p, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise OutputPathError(
            f"output directory '{p}' is not writable: {exc.strerror or exc}. "
            "Fix its permissions or choose another directory."
        ) from exc
    return p


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary sibling of ``path`` for writing; on success it replaces ``path`` atomically.

    On any exception the temporary file is removed and ``path`` is left as it was.
    """
    if "r" in mode or "a" in mode or "+" in mode:
        raise ValueError(f"atomic_open writes whole files; mode {mode!r} is not supported")
    target = Path(path)
    ensure_writable_dir(target.parent)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        _public_mode(tmp, directory=False)
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w") as fh:
        fh.write(text)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Build a directory under a temporary name; on success it takes ``path``'s place.

    Used for checkpoints and exported models, which are several files that must appear
    together. An existing ``path`` is replaced only after the new one is complete.
    """
    target = Path(path)
    parent = ensure_writable_dir(target.parent)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        _public_mode(tmp, directory=True)
        yield tmp
        finish_directory(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def finish_directory(tmp: Path, target: Path) -> None:
    """Put the complete directory ``tmp`` (a sibling of ``target``) in ``target``'s place: its
    files fsynced and given the umask's modes; an existing ``target`` is moved to ``.NAME.old``
    first and removed after (:func:`clean_stale_siblings` puts it back if killed in between)."""
    _finish_tree(tmp)
    if target.exists():
        old = target.parent / f".{target.name}.old"
        if old.exists():
            shutil.rmtree(old)
        os.replace(target, old)
        os.replace(tmp, target)
        # the new one is in place: an old file that will not go (NFS keeps an open one as .nfsXXXX)
        # is left for clean_stale_siblings, not a failed write
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)


def _finish_tree(root: Path) -> None:
    """fsync every file; give files and folders the umask's modes (some writers, e.g.
    safetensors through ``save_pretrained``, create private ``0o600`` files)."""
    mask = current_umask()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o777 & ~mask)
        for name in filenames:
            path = os.path.join(dirpath, name)
            os.chmod(path, 0o666 & ~mask)
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def clean_stale_siblings(parent: str | os.PathLike) -> list[Path]:
    """Tidy what a killed :func:`atomic_open` / :func:`atomic_directory` left in ``parent``.

    ``.NAME.*.tmp`` (a write that never finished) is removed. ``.NAME.old`` (a replacement killed
    between its two renames) is renamed back to ``NAME`` when ``NAME`` is missing (it is the last
    complete version), else removed. Only call this while no write into ``parent`` is in flight
    (e.g. under the run directory's lock). Returns the paths removed or restored.
    """
    root = Path(parent)
    touched = []
    for child in sorted(root.iterdir()):
        name = child.name
        if not name.startswith("."):
            continue
        if name.endswith(".old"):
            original = root / name[1 : -len(".old")]
            if not original.exists():
                os.replace(child, original)
            elif child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
            touched.append(child)
        elif name.endswith(".tmp") and name.count(".") >= 3:
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
            touched.append(child)
    return touched
