"""Durable file operations shared by the inbox and the outbox."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

__all__ = ["fsync_dir", "write_atomic"]


def fsync_dir(path: Path) -> None:
    """Make a rename or creation in ``path`` durable (where the filesystem allows it)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems (and platforms) cannot fsync a directory
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` so that it is either absent or whole: a hidden temp file beside it,
    fsync, rename, fsync the folder (a crash never leaves half a file under the real name)."""
    tmp = path.with_name(f".{path.name}.tmp")
    if len(tmp.name.encode()) > 255:  # a name near NAME_MAX: a short temp name of its own
        tmp = path.with_name(f".{hashlib.sha256(path.name.encode()).hexdigest()[:16]}.tmp")
    try:
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(tmp, path)
    except OSError as err:
        # A full disk: no half-written temp file left, and the error names the file (a write's
        # OSError names none: "[Errno 28] No space left on device" alone says not where).
        with contextlib.suppress(OSError):
            tmp.unlink()
        if err.filename is None:
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise
    fsync_dir(path.parent)
