"""Atomic writes: the old file survives a failed write; unwritable paths give a clear error."""

from __future__ import annotations

import os

import pytest

from slime_gb10.utils.atomic import (
    OutputPathError,
    atomic_directory,
    atomic_open,
    atomic_write_text,
    ensure_writable_dir,
)


def test_write_then_replace(tmp_path):
    target = tmp_path / "out.json"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temporary left behind


def test_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "metrics.txt"
    atomic_write_text(target, "good")
    with pytest.raises(RuntimeError), atomic_open(target) as fh:
        fh.write("half")
        raise RuntimeError("crash mid-write")
    assert target.read_text() == "good"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.txt"]


def test_atomic_directory_replaces_only_when_complete(tmp_path):
    ckpt = tmp_path / "checkpoint"
    with atomic_directory(ckpt) as d:
        (d / "a").write_text("1")
    with pytest.raises(KeyboardInterrupt), atomic_directory(ckpt) as d:
        (d / "a").write_text("2")
        raise KeyboardInterrupt
    assert (ckpt / "a").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere; permission bits do not stop it")
def test_unwritable_directory_is_a_clear_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    with pytest.raises(OutputPathError, match="not writable"):
        ensure_writable_dir(ro)


def test_path_that_is_a_file_is_a_clear_error(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(OutputPathError, match=r"cannot create output directory|not a directory"):
        ensure_writable_dir(f / "sub")
