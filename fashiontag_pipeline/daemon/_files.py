"""Durable file operations shared by the inbox and the outbox."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # (not POSIX: no lock, so no temp file of a dead writer is told apart)
    fcntl = None  # type: ignore[assignment]

__all__ = ["fsync_dir", "move_file", "remove_stale_temps", "write_atomic"]


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


def _temp_beside(path: Path) -> Path:
    """A hidden temp name beside ``path`` that no other writer uses (several daemons of a
    shared state may move the same settled file, or write the same summary, at once: with one
    temp name, the first rename took the other's file away): ``.NAME.<pid>-<random>.tmp``."""
    unique = f"{os.getpid()}-{secrets.token_hex(4)}"
    tmp = path.with_name(f".{path.name}.{unique}.tmp")
    if len(tmp.name.encode()) > 255:
        short = hashlib.sha256(path.name.encode()).hexdigest()[:16]
        tmp = path.with_name(f".{short}.{unique}.tmp")
    return tmp


def remove_stale_temps(folder: Path, older_than: float) -> None:
    """Remove the hidden temp files (``.*.tmp``) in ``folder`` not modified for
    ``older_than`` seconds: those of a copy or a write killed midway (kill -9, a power cut).
    0 with no other daemon about (at start-up: nothing of ours is being written)."""
    now = time.time()
    try:
        with os.scandir(folder) as entries:
            temps = [e for e in entries if e.name.startswith(".") and e.name.endswith(".tmp")]
        for entry in temps:
            with contextlib.suppress(OSError):
                if now - entry.stat(follow_symlinks=False).st_mtime >= older_than:
                    os.unlink(entry.path)
    except OSError:
        return  # a folder gone or unreadable: its move says so


def move_file(path: Path, target: Path) -> None:
    """Rename ``path`` to ``target``, durably. Across file systems (EXDEV: the target's folder
    is a mount of another), a copy under a hidden temp name of its own beside ``target``,
    fsync, rename, and only then the original removed: a crash leaves the file in one place
    or in both (see :func:`remove_stale_temps`), never in neither, nor half of it under the
    real name."""
    try:
        os.rename(path, target)
    except OSError as err:
        if err.errno != errno.EXDEV:
            raise
    else:
        fsync_dir(target.parent)
        return
    tmp = _temp_beside(target)
    try:
        with path.open("rb") as src, tmp.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
            dst.flush()
            os.fsync(dst.fileno())
        shutil.copystat(path, tmp)
        os.rename(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(target.parent)
    os.unlink(path)
    fsync_dir(path.parent)


def _lock(fd: int) -> bool:
    """Take the lock a writer holds on its temp file until the rename (released by the kernel
    when the writer dies, kill -9 too); False when another process holds it."""
    if fcntl is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _remove_dead_temps(path: Path) -> None:
    """The temp files of earlier writes of ``path`` whose writer died between its temp file
    and the rename (a kill -9, a power cut): each temp name is a write's own, so no later
    write takes it again. One whose lock is held is another live writer's, and stays."""
    if fcntl is None:
        return
    short = f".{hashlib.sha256(path.name.encode()).hexdigest()[:16]}."
    stems = (f".{path.name}.", short)
    try:
        with os.scandir(path.parent) as entries:
            names = [
                e.name for e in entries if e.name.endswith(".tmp") and e.name.startswith(stems)
            ]
    except OSError:
        return
    for name in names:
        temp = path.parent / name
        try:
            fd = os.open(temp, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            here, there = os.fstat(fd), os.stat(temp, follow_symlinks=False)
            if _lock(fd) and (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino):
                os.unlink(temp)
        except OSError:
            pass
        finally:
            os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` so that it is either absent or whole: a hidden temp file of this write's
    own beside it (locked until the rename), fsync, rename, fsync the folder (a crash never
    leaves half a file under the real name; two daemons writing one file at once each rename a
    whole one). The temp files earlier writers of ``path`` left when they died go first."""
    _remove_dead_temps(path)
    for attempt in range(3):
        tmp = _temp_beside(path)
        try:
            with tmp.open("wb") as fh:
                _lock(fh.fileno())
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
                try:
                    os.rename(tmp, path)
                except FileNotFoundError:
                    # Taken away between its creation and its lock by another writer's
                    # clean-up (it looked dead): a temp file of its own again.
                    if os.fstat(fh.fileno()).st_nlink == 0 and attempt < 2:
                        continue
                    raise
            break
        except OSError as err:
            # A full disk: no half-written temp file left, and the error names the file (a
            # write's OSError names none: "[Errno 28] No space left on device" alone says
            # not where).
            with contextlib.suppress(OSError):
                tmp.unlink()
            if err.filename is None:
                raise OSError(err.errno, err.strerror, str(path)) from err
            raise
    fsync_dir(path.parent)
