"""What a result store file that cannot be opened, read or written says (:mod:`.store`).

Two kinds, told apart because the advice is opposite:

* *cannot be used now*: the store is whole but cannot be written at the moment (a full disk,
  an I/O error, a read-only file, a lock held past the busy timeout, or its folder on a
  read-only file system or not writable by this user): once that is fixed, the same command
  resumes. Moving such a store away would tag, and bill, every row again.
* *cannot be used*: the file is no store this version can read (damaged, garbage, a folder):
  it is left untouched, and moving it away starts an empty store.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ... import _exceptions as exc

__all__ = ["NOT_WRITTEN", "store_error"]

#: Errors of a whole store that cannot be written now (full disk, I/O, read-only, locked).
NOT_WRITTEN = ("SQLITE_FULL", "SQLITE_IOERR", "SQLITE_READONLY", "SQLITE_BUSY")
#: An operating system's refusal to write the store's folder (its file system read-only, or
#: permissions): SQLite says only ``unable to open database file``.
_REFUSED = (errno.EROFS, errno.EACCES, errno.EPERM)


def folder_not_writable(path: Path) -> str | None:
    """Why the folder of ``path`` cannot be written (None when it can, or cannot be told):
    a store in WAL mode needs its folder for the ``-wal`` and ``-shm`` files, and a new
    store for the file itself."""
    folder = path.parent
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return f"its folder {folder} is on a read-only file system"
    except OSError:
        return None  # (not there: said by the error itself)
    if folder.is_dir() and not os.access(folder, os.W_OK):
        return f"its folder {folder} cannot be written by this user"
    return None


def store_error(path: Path, err: BaseException) -> exc.ResultStoreError:
    """The :class:`~fashiontag_pipeline.ResultStoreError` of ``err`` met using the store at
    ``path``, with the advice its kind calls for (see the module docstring)."""
    reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
    name = getattr(err, "sqlite_errorname", "")
    now = name.startswith(NOT_WRITTEN)
    if not now and (name.startswith("SQLITE_CANTOPEN") or isinstance(err, OSError)):
        if isinstance(err, OSError) and err.errno in _REFUSED:
            now = True  # (making its folder on a read-only file system, say)
        elif (why := folder_not_writable(path)) is not None:
            reason, now = f"{why} ({reason})", True
    if now:
        # (Not "move it away": that would tag, and bill, every row again.)
        return exc.ResultStoreError(
            f"result store {path} cannot be used now: {reason} (what was committed is kept,"
            " in the store and the state: once that is fixed, the same command resumes"
            " without tagging a row twice)"
        )
    return exc.ResultStoreError(
        f"result store {path} cannot be used: {reason} (it is left untouched; move it away "
        "to start an empty store, and every row will be tagged again)"
    )
