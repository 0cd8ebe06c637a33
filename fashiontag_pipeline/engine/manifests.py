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
from collections.abc import Callable, Iterable, Sequence

import msgspec

from .._exceptions import ManifestError
from .foreign_heads import folder_files

__all__ = [
    "STDIN",
    "ManifestPrint",
    "check_readable_twice",
    "describe",
    "fingerprint",
    "fingerprint_open",
    "job_prints",
    "manifest_names",
    "same_manifests",
]

STDIN = "-"


def manifest_names(manifests: object) -> list[str]:
    """The names of the manifests a caller gives (``run_pipeline``, ``JobSpec``): a sequence
    of paths (``str`` or ``Path``), or one path. Anything else (``None``, an int, bytes) is a
    :class:`TypeError` that says which, before anything is opened: its ``str()`` would be read
    as a file name ("cannot read manifest 99" for ``b"c..."``, a file named ``None``)."""
    if isinstance(manifests, str | os.PathLike):
        manifests = [manifests]
    if isinstance(manifests, bytes | bytearray) or not isinstance(manifests, Iterable):
        raise TypeError(f"manifests: a list of paths (str or Path), not {manifests!r}")
    names: list[str] = []
    for i, name in enumerate(manifests):
        path = os.fspath(name) if isinstance(name, os.PathLike) else name
        if not isinstance(path, str):
            raise TypeError(f"manifest {i}: a path (str or Path), not {name!r}")
        names.append(path)
    return names


_READ = 1 << 20


class ManifestPrint(msgspec.Struct, frozen=True, kw_only=True):
    """A manifest's name, byte size and SHA-256 (both None for stdin)."""

    name: str
    size: int | None = None
    sha256: str | None = None

    @property
    def stdin(self) -> bool:
        return self.size is None


def check_readable_twice(path: str) -> None:
    """ManifestError for a manifest that is a pipe or a device (stdin is fine): a run reads it
    twice (its fingerprint, then its rows) so that it can resume. Only a stat: call it before
    opening the file, which would block on a FIFO with no writer."""
    if path == STDIN:
        return
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # left to the reader, which names the problem
    if stat.S_ISDIR(mode):
        raise ManifestError(
            f"manifest {path} is a folder, not a file: give the manifests in it"
            f" (fashiontag run {folder_files(path)} ...)"
        )
    if not stat.S_ISREG(mode):
        # A pipe (``<(cat m.csv)``, a FIFO) would be read to its end here and found empty by
        # the reader (or, a FIFO with no writer yet, block for ever).
        raise ManifestError(
            f"manifest {path} is not a regular file (a pipe or a device): a run reads it twice"
            " (its fingerprint, then its rows) so that it can resume; pass it on stdin"
            " (... | fashiontag run -) or save it to a file first"
        )


def _hash_fd(name: str, fd: int, stop: Callable[[], bool] | None = None) -> ManifestPrint:
    """Size and SHA-256 of the file open as ``fd``, read with ``pread`` from its start (the
    descriptor's position, which its reader uses, is left as it is). ``stop``: looked at
    between two blocks, and once it is true, InterruptedError (a stop while the run starts:
    the hash of a manifest of tens of GB held Ctrl-C or SIGTERM for as long)."""
    digest = hashlib.sha256()
    size = 0
    buf = bytearray(_READ)
    view = memoryview(buf)
    try:
        while (stop is None or not stop()) and (n := os.preadv(fd, [buf], size)):
            digest.update(view[:n])
            size += n
    except OSError:
        return ManifestPrint(name=name, size=-1, sha256="")
    if stop is not None and stop():
        raise InterruptedError(f"manifest {name}: its fingerprint given up (the run stops)")
    return ManifestPrint(name=name, size=size, sha256=digest.hexdigest())


def fingerprint(path: str) -> ManifestPrint:
    """Size and SHA-256 of a manifest file (blocking: call in a thread); stdin has none.

    Hashing streams the file once (~1-2 GB/s); a file that cannot be read is left to the
    reader, which reports it with its own message. A run hashes the file its reader has open
    (:func:`fingerprint_open`): a path names whatever was renamed over it last."""
    if path == STDIN:
        return ManifestPrint(name=STDIN)
    check_readable_twice(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return ManifestPrint(name=os.fspath(path), size=-1, sha256="")
    try:
        return _hash_fd(os.fspath(path), fd)
    finally:
        os.close(fd)


def fingerprint_open(
    name: str, fd: int | None, stop: Callable[[], bool] | None = None
) -> ManifestPrint:
    """The fingerprint of the manifest ``name`` as open in its reader (``fd``; None, or
    ``name`` ``-``, for stdin or a pipe: no fingerprint). The bytes hashed are the very bytes
    the reader reads, even when the exporter renames tonight's dump over the path, or rewrites
    it, while the run starts (the reader's end-of-input check catches a change after this)."""
    if name == STDIN or fd is None:
        return ManifestPrint(name=name)
    return _hash_fd(name, fd, stop)


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
