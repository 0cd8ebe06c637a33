"""What every output file shares: one writer at a time, and knowing when it is gone.

* :func:`lock_output`: an exclusive ``flock`` for as long as the output is open, so two runs
  given the same ``--out`` (each with its own ``--state``) cannot cut back and append over
  each other's lines; the second is refused.
* :func:`removed_from`: whether the file open as a descriptor is no longer at its path
  (removed, renamed, replaced, its folder removed), so lines written before are not lost in
  silence (see :meth:`~.jobs.Job.check_outputs`).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from .._exceptions import StateConflictError

__all__ = ["lock_exclusively", "lock_output", "removed_from"]


def lock_exclusively(fd: int, refusal: str) -> None:
    """An exclusive ``flock`` on ``fd``, held until it is closed (or the process dies: no
    stale lock); :class:`StateConflictError` with ``refusal`` when another process holds it.
    A file system without locks (some network ones) is used unlocked."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise StateConflictError(refusal) from None
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


def removed_from(path: Path, fd: int) -> bool:
    """Whether the file open as ``fd`` is no longer at ``path``: the path is gone (removed,
    renamed, its folder removed) or the file has no name left (another file was renamed over
    it). Inode numbers are not compared: some file systems do not keep them stable. A path
    that cannot be checked (permissions, a network file system's error) is not called
    removed."""
    try:
        if os.fstat(fd).st_nlink == 0:
            return True
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    return False
