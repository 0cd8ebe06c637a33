"""A claim of the inbox (:class:`Claim`), and how the file moved into ``.work`` is known to be
the file hashed."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import msgspec

from ..engine.manifest_bytes import ReadEnd
from .ledger import ClaimRecord
from .names import hash_file

__all__ = ["Claim", "as_moved", "changed_since_read", "same_file"]


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    """A manifest the daemon now owns: its file is ``path`` (in ``INBOX/.work``).

    ``resumed`` is true for a claim found in flight at start-up (its outputs may be partly
    written: the engine resumes it from the state store)."""

    name: str
    path: str
    sha256: str
    size: int
    claimed_at: float
    resumed: bool = False

    @property
    def job_key(self) -> str:
        """The engine job of the claim (the same claim resumed after a restart finds it again)."""
        return f"{self.name}@{self.sha256}@{self.claimed_at!r}"


def same_file(a: os.stat_result, b: os.stat_result) -> bool:
    """Whether two stats are of one file unchanged: the inode, and its size and modification
    time (a file deleted and written again may get the same inode number)."""
    return (a.st_ino, a.st_dev, a.st_size, a.st_mtime_ns) == (
        b.st_ino,
        b.st_dev,
        b.st_size,
        b.st_mtime_ns,
    )


def as_moved(moved: Path, hashed: os.stat_result, record: ClaimRecord) -> ClaimRecord:
    """The claim's record for the file that was moved: ``record`` when it is the file hashed
    (``hashed``: its stat), else the moved file's own hash. A file renamed over the name
    between the hash and the move is the one moved; claimed under the other's hash, a later
    drop of that other content would be taken for a duplicate of it, and its rows never
    tagged."""
    if same_file(moved.stat(), hashed):
        return record
    sha256, size = hash_file(moved)
    return ClaimRecord(name=record.name, sha256=sha256, size=size, claimed_at=record.claimed_at)


def changed_since_read(ends: Sequence[ReadEnd]) -> str | None:
    """Why a manifest whose rows all have an outcome is not done (None: it is): its file in
    ``.work`` grew, was cut or replaced after the engine had read it to its end. An export
    written in place that pauses longer than ``--settle`` is claimed after a burst, and the
    next lands in the file claimed: said ``done``, its rows would be lost in silence. (A file
    removed from ``.work`` by hand is no change: it was read whole.) Blocking: a stat."""
    changed = [c for end in ends if (c := end.changed()) is not None]
    if not changed:
        return None
    return (
        f"{'; '.join(changed)}. Drop the whole file again once it is complete (write it under"
        " a hidden or .part name and rename it in, or write NAME.ready after it): its rows are"
        " tagged again, unless --reuse answers them from a result store"
    )
