"""Which manifests a state file belongs to: a content fingerprint of each one.

A cron job runs the same command every night on the same path with new content. The state
file records, for each manifest of its run, the size and SHA-256 of its bytes as stored (gzip
included), and the run compares them before it touches anything:

* same manifests, run unfinished: resume it;
* same manifests, run complete: nothing to do (say so);
* other manifests, run complete: a new run (the old state is discarded, outputs rewritten);
* other manifests, run unfinished: refuse (``StateConflictError``), unless ``--restart``.

Standard input cannot be fingerprinted before it is read, and reading it is what a run does.
A run that read stdin is therefore resumed only when the caller says the same rows come again
(``--resume``), and is otherwise refused while unfinished; a completed one is simply followed
by a new run.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Sequence

import msgspec

from .._exceptions import ManifestError

__all__ = [
    "STDIN",
    "ManifestPrint",
    "describe",
    "fingerprint",
    "job_prints",
    "same_manifests",
]

STDIN = "-"
_READ = 1 << 20


class ManifestPrint(msgspec.Struct, frozen=True, kw_only=True):
    """A manifest's name, byte size and SHA-256 (both None for stdin)."""

    name: str
    size: int | None = None
    sha256: str | None = None

    @property
    def stdin(self) -> bool:
        return self.size is None


def fingerprint(path: str) -> ManifestPrint:
    """Size and SHA-256 of a manifest file (blocking: call in a thread); stdin has none.

    Hashing streams the file once (~1-2 GB/s); a file that cannot be read is left to the
    reader, which reports it with its own message."""
    if path == STDIN:
        return ManifestPrint(name=STDIN)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = stat.S_IFREG  # left to the reader, which names the problem
    if not stat.S_ISREG(mode):
        # A pipe (``<(cat m.csv)``, a FIFO) would be read to its end here and found empty by
        # the reader (or, a FIFO with no writer yet, block for ever).
        raise ManifestError(
            f"manifest {path} is not a regular file (a pipe or a device): a run reads it twice"
            " (its fingerprint, then its rows) so that it can resume; pass it on stdin"
            " (... | fashiontag run -) or save it to a file first"
        )
    digest = hashlib.sha256()
    size = 0
    try:
        with open(path, "rb", buffering=0) as fh:
            buf = bytearray(_READ)
            view = memoryview(buf)
            while n := fh.readinto(buf):
                digest.update(view[:n])
                size += n
    except OSError:
        return ManifestPrint(name=os.fspath(path), size=-1, sha256="")
    return ManifestPrint(name=os.fspath(path), size=size, sha256=digest.hexdigest())


def job_prints(paths: Sequence[str]) -> list[ManifestPrint]:
    """The fingerprints of a job's manifests (blocking): a pipe or device, which cannot be
    read twice, has none (its content is not compared), as stdin."""
    prints = []
    for path in paths:
        try:
            prints.append(fingerprint(path))
        except ManifestError:
            prints.append(ManifestPrint(name=os.fspath(path)))
    return prints


def same_manifests(old: list[ManifestPrint], new: list[ManifestPrint]) -> bool:
    """True when ``new`` holds the same content as ``old``, in order (names may differ; stdin
    matches stdin)."""
    if len(old) != len(new):
        return False
    return all((a.size, a.sha256) == (b.size, b.sha256) for a, b in zip(old, new, strict=True))


def describe(prints: list[ManifestPrint]) -> str:
    """``name (size bytes, sha256 abcdef123456)`` for each manifest, for messages."""
    parts = []
    for p in prints:
        if p.stdin:
            parts.append("stdin")
        else:
            parts.append(f"{p.name} ({p.size:,} bytes, sha256 {(p.sha256 or '')[:12]})")
    return ", ".join(parts)
