"""A lock file held for weeks (the daemon's), kept: touched when old, made again when removed,
left alone when the file at its path may be its own (inode numbers not stable)."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import pytest

from fashiontag_pipeline._exceptions import StateInUseError
from fashiontag_pipeline.engine.outfiles import LOCK_NOTE, TOUCH_AFTER, keep_lock_file, lock_file
from fashiontag_pipeline.engine.state import StateDB


def _lock(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise StateInUseError("held") from None


def test_an_old_lock_is_touched_and_a_fresh_one_left(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    fd = lock_file(path, _lock)
    try:
        fresh = path.stat().st_mtime_ns
        assert keep_lock_file(fd, path, _lock) == fd
        assert path.stat().st_mtime_ns == fresh  # (no write of its inode at each look)
        old = time.time() - 31 * 86400
        os.utime(path, (old, old))
        assert keep_lock_file(fd, path, _lock) == fd
        assert time.time() - path.stat().st_mtime < TOUCH_AFTER
    finally:
        os.close(fd)


def test_a_removed_lock_is_made_again_and_locked(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    fd = lock_file(path, _lock)
    path.unlink()
    kept = keep_lock_file(fd, path, _lock)
    try:
        assert os.fstat(kept).st_ino == path.stat().st_ino
        assert path.read_bytes() == LOCK_NOTE
        with pytest.raises(StateInUseError):
            os.close(lock_file(path, _lock))  # (held: another would be refused)
    finally:
        os.close(kept)


def test_a_lock_made_again_by_another_is_refused_and_the_old_one_kept(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    fd = lock_file(path, _lock)
    path.unlink()
    theirs = lock_file(path, _lock)  # (another open file: flock refuses it as another process)
    try:
        with pytest.raises(StateInUseError):
            keep_lock_file(fd, path, _lock)
        os.fstat(fd)  # (still open: closed with the daemon)
    finally:
        os.close(theirs)
        os.close(fd)


def test_a_lock_renamed_aside_is_left_alone(tmp_path: Path) -> None:
    """Another file at the path while ours keeps a name: on a file system whose inode numbers
    are not stable it is ours, which a second lock would release (fcntl-emulated flock)."""
    path = tmp_path / "x.lock"
    fd = lock_file(path, _lock)
    try:
        os.rename(path, tmp_path / "aside.lock")
        path.write_bytes(b"")
        assert keep_lock_file(fd, path, _lock) == fd
    finally:
        os.close(fd)


def test_a_state_named_through_a_symlink_keeps_the_lock_of_the_file_it_opened(
    tmp_path: Path,
) -> None:
    """``current.state`` re-pointed to the next dated file while the daemon holds the first:
    the kept lock stays beside the file open (one beside the new file left the first
    unlocked, and a run on it was let in)."""
    first, link = tmp_path / "2026-10.state", tmp_path / "current.state"
    link.symlink_to(first.name)
    db = StateDB(link)
    try:
        link.unlink()
        link.symlink_to("2026-11.state")
        db.keep_lock()
        with pytest.raises(StateInUseError):
            StateDB(first).close()
        assert not (tmp_path / "2026-11.state.lock").exists()
    finally:
        db.close()
