"""What every output file shares: one writer at a time, and knowing when it is gone.

* :func:`lock_output`: an exclusive ``flock`` for as long as the output is open, so two runs
  given the same ``--out`` (each with its own ``--state``) cannot cut back and append over
  each other's lines; the second is refused.
* :func:`removed_from`: whether the file open as a descriptor is no longer at its path
  (removed, renamed, replaced, cut short, its folder removed), so lines written before are not
  lost in silence (see :meth:`~.jobs.Job.check_outputs`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

from .._exceptions import StateInUseError

__all__ = ["lock_exclusively", "lock_output", "removed_from"]


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
