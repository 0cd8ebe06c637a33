"""What every output file shares: one writer at a time, and knowing when it is gone.

* :func:`lock_output`: an exclusive ``flock`` for as long as the output is open, so two runs
  given the same ``--out`` (each with its own ``--state``) cannot cut back and append over
  each other's lines; the second is refused.
* :func:`lock_file`: an exclusive ``flock`` on a lock file of its own (a state's, an inbox's),
  which holds a line so that a cleanup of empty files leaves it while it is held;
  :func:`keep_lock_file` keeps one a process holds for weeks (the daemon), and
  :func:`keep_fresh` the files it keeps open or reads for weeks (its state file).
* :func:`removed_from`: whether the file open as a descriptor is no longer at its path
  (removed, renamed, replaced, cut short, its folder removed), so lines written before are not
  lost in silence (see :meth:`~.jobs.Job.check_outputs`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

from .._exceptions import StateInUseError

__all__ = [
    "LOCK_NOTE",
    "TOUCH_AFTER",
    "drop_sidecars",
    "first_gone",
    "identities",
    "keep_fresh",
    "keep_held",
    "keep_lock_file",
    "lock_exclusively",
    "lock_file",
    "lock_output",
    "removed_from",
    "sqlite_files",
]

#: What a lock file holds: a line, so that a cleanup of empty files (``find DIR -empty
#: -delete``, as a nightly job tidies a data folder) leaves it while a process holds it.
LOCK_NOTE = b"fashiontag: locked while a run or daemon is at work; keep this file\n"
#: Opens of a lock file before one is found still at its path once locked.
_LOCK_TRIES = 5
#: Seconds a held lock file's time may age before :func:`keep_lock_file` touches it (a cleanup
#: by age counts days; a touch at each look would write its inode every few seconds).
TOUCH_AFTER = 3600.0


def lock_exclusively(fd: int, refusal: str) -> None:
    """An exclusive ``flock`` on ``fd``, held until it is closed (or the process dies: no
    stale lock); :class:`StateInUseError` with ``refusal`` when another process holds it.
    A file system without locks (some network ones) is used unlocked."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise StateInUseError(refusal) from None
    except OSError:
        pass


def lock_file(path: Path, lock: Callable[[int], None]) -> int:
    """A descriptor of the lock file ``path`` (made when missing) locked by ``lock`` (which
    raises when another process holds it), held until it is closed.

    A lock file left empty was removed by a nightly ``find DIR -empty -delete`` while a run
    held it: the cron line fired again locked a new file at that path and worked on the same
    state beside the first (6,000 of 10,000 rows sent twice); so did ``find DIR -mtime +30
    -delete`` with one a run made last month (left in place, unchanged since). It is given
    :data:`LOCK_NOTE` when locked empty, touched, and checked once locked to be the file at its
    path (one removed between the open and the lock, and perhaps made again by another
    process, is opened again; after a few tries, the lock held is kept: a file system whose
    inode numbers are not stable must not refuse every run)."""
    for tries_left in range(_LOCK_TRIES - 1, -1, -1):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            lock(fd)
            held = os.fstat(fd)
            try:
                here = os.stat(path)
            except FileNotFoundError:
                here = None
            if tries_left == 0 or (
                here is not None and (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino)
            ):
                with contextlib.suppress(OSError):  # (a full disk: locked all the same)
                    if held.st_size == 0:
                        os.pwrite(fd, LOCK_NOTE, 0)
                    os.utime(fd)  # (a cleanup by age takes no lock of a run at work)
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise AssertionError("unreachable")  # (the last try returns)


def keep_lock_file(fd: int, path: Path, lock: Callable[[int], None]) -> int:
    """The descriptor to hold from now on for ``fd``, a lock file locked at ``path`` by
    :func:`lock_file` in a process that holds it for weeks (the daemon).

    Touched when locked, a daemon's lock files were left unchanged for its whole uptime: after
    a month a retention cleanup (``find /data -mtime +30 -delete``) took them, as did a cleanup
    that removes them outright, and a second daemon on the same inbox or state started beside
    it (rows billed twice). So ``fd`` is touched once its time is :data:`TOUCH_AFTER` old (and
    given its line again if it was emptied), and when its file is no longer at ``path``
    (removed: no name left, or none there), a new one is made there and locked (``fd`` closed;
    :class:`StateInUseError` from ``lock``, ``fd`` still held, when another process holds it).
    A file at ``path`` that is not ``fd``'s while ``fd``'s keeps a name is left alone: on a
    file system whose inode numbers are not stable it is the same file, which a second lock
    from this process would release (``flock`` emulated by ``fcntl`` locks, as on NFS)."""
    held = os.fstat(fd)
    try:
        os.stat(path)
    except FileNotFoundError:
        gone = True
    else:
        gone = held.st_nlink == 0
    if gone:
        kept = lock_file(path, lock)
        os.close(fd)
        return kept
    with contextlib.suppress(OSError):  # (a full disk, a read-only mount: looked at again)
        if held.st_size == 0:
            os.pwrite(fd, LOCK_NOTE, 0)
        if time.time() - held.st_mtime > TOUCH_AFTER:
            os.utime(fd)
    return fd


def keep_fresh(*paths: Path) -> None:
    """Touch each of ``paths`` (the files a daemon keeps open for weeks without writing them:
    an idle daemon's SQLite state, its ``-wal`` and ``-shm``) once its time is
    :data:`TOUCH_AFTER` old. Left alone after weeks of uptime, a retention cleanup (``find
    /data -mtime +30 -delete``) took them under the daemon, which went on on the removed file
    and began an empty state at its next start. One not there, or not the daemon's to touch,
    is left as it is (looked at again)."""
    now = time.time()
    for path in paths:
        with contextlib.suppress(OSError):
            if now - os.stat(path).st_mtime > TOUCH_AFTER:
                os.utime(path)


def identities(*paths: Path) -> dict[Path, tuple[int, int]]:
    """Which file each of ``paths`` there now is (``st_dev``, ``st_ino``; one not there is
    left out): the files a process holds open for weeks, looked at by :func:`first_gone`."""
    found = {}
    for path in paths:
        with contextlib.suppress(OSError):
            st = os.stat(path)
            found[path] = (st.st_dev, st.st_ino)
    return found


def first_gone(held: dict[Path, tuple[int, int]]) -> Path | None:
    """The first of the files ``held`` (:func:`identities` of the files open) no longer at its
    path: removed (``rm state.db``, a cleanup by name), or another file there (moved over
    it). A daemon went on committing into its removed state file, saying nothing, and its next
    start began an empty state. A path that cannot be looked at (permissions, an I/O error)
    is not called gone."""
    for path, ids in held.items():
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return path
        except OSError:
            continue
        if (st.st_dev, st.st_ino) != ids:
            return path
    return None


def keep_held(held: dict[Path, tuple[int, int]], files: tuple[Path, ...]) -> Path | None:
    """One look of a health loop at the SQLite ``files`` a process holds (``held``,
    :func:`identities` as opened): kept from a cleanup by age (:func:`keep_fresh`), the first
    removed or replaced (:func:`first_gone`: the caller stops on it), else those made since
    (a ``-shm`` missing at open) added to ``held``."""
    keep_fresh(*files)
    gone = first_gone(held)
    if gone is None:
        held.update(identities(*(at for at in files if at not in held)))
    return gone


def drop_sidecars(held: dict[Path, tuple[int, int]], db: Path) -> None:
    """Once a process closed its SQLite file ``db`` (its files ``held`` as opened,
    :func:`identities`): when another file is at ``db``'s path, or none, the ``-wal`` and
    ``-shm`` beside it that are still the process's are removed. SQLite keeps the ``-wal`` of
    a database moved under it, and the next open read the file put there (a backup restored
    by ``mv``, or a copy written back) through it: the removed file's content, not the one
    put there. One put there with the file is not the process's, and is left."""
    if first_gone({db: held[db]} if db in held else {}) is None:
        return
    there = identities(*sqlite_files(db)[1:])
    for at, ids in there.items():
        if held.get(at) == ids:
            with contextlib.suppress(OSError):
                os.unlink(at)


def sqlite_files(path: Path) -> tuple[Path, Path, Path]:
    """The SQLite file at ``path`` and the ``-wal`` and ``-shm`` beside it (what
    :func:`keep_fresh` keeps of a state or a result store a daemon holds)."""
    return (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm"))


def lock_output(fd: int, path: Path) -> None:
    """An exclusive lock on an output for as long as it is open: two runs writing one file
    (two cron jobs given the same --out and their own --state) would cut back and append
    over each other's lines."""
    lock_exclusively(
        fd,
        f"{path} is being written by another run (it holds a lock on the file): wait for that"
        " run to end, or give this one other outputs",
    )


#: Seconds before a size that says "cut short" is looked at again (see :func:`removed_from`).
SIZE_RECHECK = 0.5


def removed_from(path: Path, fd: int, written: int) -> bool:
    """Whether the file open as ``fd`` (``written`` bytes long as far as its writer knows) no
    longer holds those bytes at ``path``:

    * the path is gone (removed, renamed, its folder removed), or the file has no name left
      (another file was renamed over it);
    * the file is shorter than what was written to it (cut short under the writer:
      logrotate's ``copytruncate``, ``> results.jsonl``);
    * the path names another file that is shorter than that (renamed aside and a new one
      made in its place: logrotate's default). Inode numbers alone do not decide: some file
      systems do not keep them stable, so a file at the path as long as ours is taken as it.

    Sizes are believed only when they say so again after an fsync and ``SIZE_RECHECK``
    seconds (a network or FUSE file system may answer from attributes it cached before the
    last writes). A path that cannot be checked (permissions, a network file system's error)
    is not called removed."""
    found = _lost(path, fd, written)
    if found != "short":
        return found == "gone"
    with contextlib.suppress(OSError):
        os.fsync(fd)
    time.sleep(SIZE_RECHECK)
    return _lost(path, fd, written) is not None


def _lost(path: Path, fd: int, written: int) -> str | None:
    """ "gone" (no name, no path), "short" (sizes below ``written``) or None (see
    :func:`removed_from`)."""
    try:
        own = os.fstat(fd)
        if own.st_nlink == 0:
            return "gone"
        if own.st_size < written:
            return "short"
        there = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return "gone"
    except OSError:
        return None
    if (there.st_dev, there.st_ino) != (own.st_dev, own.st_ino) and there.st_size < written:
        return "short"
    return None
