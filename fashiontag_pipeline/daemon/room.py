"""Whether a daemon's SQLite state file can be written now, for ``/readyz``.

An idle daemon commits nothing to its state, so a full or read-only file system under the
state file went unseen until the next manifest was dropped: its claim could not be recorded
and the daemon stopped (exit 1), while ``/readyz`` had said 200 all along (DESIGN 6: 200 when
the state store is writable). :func:`watch_state_file` looks every few seconds, without
writing (a write would cost a commit and an fsync each time): the state file and its folder
writable by this process, and room on their file system for a few commits.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import anyio

from .http import Health
from .lockkeep import KeptLocks

__all__ = ["MIN_FREE_BYTES", "WATCH_INTERVAL", "state_file_problem", "watch_state_file"]

#: Below this many free bytes beside the state file, it is taken as full (a claim's commit
#: writes a few pages to the WAL, and SQLite needs a few more to check it).
MIN_FREE_BYTES = 64 * 1024
#: Seconds between two looks.
WATCH_INTERVAL = 2.0


def state_file_problem(path: Path) -> str | None:
    """Why the state file ``path`` cannot be written now (None: it can, as far as can be told
    without writing)."""
    folder = path.parent
    for at in (path, folder):
        if at.exists() and not os.access(at, os.W_OK):
            return f"state file {path}: {at} cannot be written (a read-only file system?)"
    if not hasattr(os, "statvfs"):  # (not POSIX: writable is all that can be told)
        return None
    try:
        st = os.statvfs(folder)
    except OSError as err:
        return f"state file {path}: {os.strerror(err.errno or errno.EIO)}"
    # Root may write the blocks a file system keeps back from others (ext4's 5%).
    blocks = st.f_bfree if getattr(os, "geteuid", lambda: -1)() == 0 else st.f_bavail
    free = blocks * st.f_frsize
    if free < MIN_FREE_BYTES:
        return f"state file {path}: no space left on its file system ({free} bytes free)"
    return None


async def watch_state_file(health: Health, path: Path, locks: KeptLocks | None = None) -> None:
    """Tell ``health`` whether the state file can be written, every :data:`WATCH_INTERVAL`;
    the daemon's lock files are kept at each look (``locks``, see :mod:`.lockkeep`), and its
    state file or result store found removed under it stops it (raised)."""

    def look() -> str | None:
        if locks is not None:
            locks.keep()
        return state_file_problem(path)

    while True:
        problem = await anyio.to_thread.run_sync(look)
        if problem is None:
            health.mark_store_writable()
        else:
            health.mark_store_unwritable(problem)
        if locks is not None and locks.gone is not None:
            # (/readyz first; the error stops the daemon: exit 1, the supervisor restarts it)
            health.mark_store_unwritable(str(locks.gone))
            raise locks.gone
        if locks is not None:
            locks.react()
        await anyio.sleep(WATCH_INTERVAL)
