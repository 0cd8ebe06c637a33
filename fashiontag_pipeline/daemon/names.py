"""Names and content of the files in an inbox: which are manifests, their stems, a free name.

A manifest is a ``.csv``, ``.jsonl`` or ``.ndjson`` file, gzipped or not, that is neither hidden
nor a marker or temporary file (``.ready``, ``.part``, ``.tmp``); suffixes in any case
(``CATALOGUE.CSV``: the readers tell the format from the content, never from the name).
Settled manifests move into ``done/`` and ``failed/`` under their own name when it is free,
else under a name that carries the first 12 hex digits of their sha256: nothing is ever
overwritten.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = [
    "DONE_DIR",
    "ERROR_SUFFIX",
    "FAILED_DIR",
    "GZIP_SUFFIX",
    "IGNORED_SUFFIXES",
    "MANIFEST_SUFFIXES",
    "NAME_MAX",
    "READY_SUFFIX",
    "STATE_MARK",
    "WORK_DIR",
    "candidate_names",
    "fit",
    "free_name",
    "hash_file",
    "is_ignored_name",
    "is_manifest_name",
    "manifest_stem",
    "suffix_of",
]

MANIFEST_SUFFIXES = (".csv", ".jsonl", ".ndjson")
GZIP_SUFFIX = ".gz"
READY_SUFFIX = ".ready"
#: The inbox's note of the state its claims are in, written by every daemon at start
#: (:mod:`.statemark`).
STATE_MARK = ".fashiontag-daemon.state"
IGNORED_SUFFIXES = (".part", ".tmp", READY_SUFFIX)
WORK_DIR = ".work"
DONE_DIR = "done"
FAILED_DIR = "failed"
ERROR_SUFFIX = ".error.json"
HASH_BLOCK = 1 << 20
SUMMARY_NOTE_PREFIX = ".summary-"


def summary_note(work: Path, name: str) -> Path:
    """The note of the summary of the claim of ``name`` in ``work`` (``.work``): hidden (the
    scans of ``.work`` skip it), not ``.tmp`` (no temp clean-up takes it), any length."""
    return work / f"{SUMMARY_NOTE_PREFIX}{hashlib.sha256(name.encode()).hexdigest()[:20]}.json"


def is_ignored_name(name: str) -> bool:
    """Whether the inbox leaves a file of this name alone without a word (hidden, a marker, a
    temporary file): any other file that is no manifest is said to be one."""
    return not name or name.startswith(".") or name.lower().endswith(IGNORED_SUFFIXES)


def is_manifest_name(name: str) -> bool:
    """Whether a file of this name in the inbox is a manifest (not a marker, temp or hidden)."""
    lowered = name.lower()
    if not name or name.startswith(".") or lowered.endswith(IGNORED_SUFFIXES):
        return False
    base = lowered[: -len(GZIP_SUFFIX)] if lowered.endswith(GZIP_SUFFIX) else lowered
    return any(base.endswith(s) and len(base) > len(s) for s in MANIFEST_SUFFIXES)


def manifest_stem(name: str) -> str:
    """The name without ``.gz`` and then ``.csv``/``.jsonl``/``.ndjson`` (in any case):
    ``a.csv.gz`` -> ``a``, ``A.CSV`` -> ``A``."""
    base = name[: -len(GZIP_SUFFIX)] if name.lower().endswith(GZIP_SUFFIX) else name
    for suffix in MANIFEST_SUFFIXES:
        if base.lower().endswith(suffix) and len(base) > len(suffix):
            return base[: -len(suffix)]
    return base


def suffix_of(name: str) -> str:
    return name[len(manifest_stem(name)) :]


def hash_file(path: Path, stop: Callable[[], bool] | None = None) -> tuple[str, int]:
    """The file's SHA-256 (hex) and size. ``stop``: looked at between two blocks, and once it
    is true, InterruptedError (a claim's hash when the daemon drains: the hash of a manifest
    of tens of GB, or on a slow share, held the stop past ``--drain-timeout``)."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as fh:
        while block := fh.read(HASH_BLOCK):
            if stop is not None and stop():
                raise InterruptedError(f"{path}: hash given up (the daemon stops)")
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


#: The longest file name most file systems take, in bytes (NAME_MAX).
NAME_MAX = 255


def fit(stem: str, tail: str, limit: int = NAME_MAX) -> str:
    """``stem + tail``, the stem cut (at a character boundary) so that the name, in UTF-8, is
    at most ``limit`` bytes: a legal manifest name leaves too little room for what is added
    to it (``.<sha12>``, ``.error.json``)."""
    room = limit - len(tail.encode())
    cut = stem.encode()[: max(room, 1)].decode("utf-8", "ignore")
    return cut + tail


def candidate_names(name: str, sha256: str, limit: int = NAME_MAX) -> Iterator[str]:
    """The names a settled manifest may take, in order: ``name``, then ``STEM.<sha12>SUFFIX``,
    then ``STEM.<sha12>.2SUFFIX``, ... (without end), each at most ``limit`` bytes (``name``
    is passed over when it is longer)."""
    stem, suffix = manifest_stem(name), suffix_of(name)
    if len(name.encode()) <= limit:
        yield name
    yield fit(stem, f".{sha256[:12]}{suffix}", limit)
    for n in itertools.count(2):
        yield fit(stem, f".{sha256[:12]}.{n}{suffix}", limit)


def free_name(folder: Path, name: str, sha256: str, *, companion: str = "") -> str:
    """A name in ``folder`` that neither this nor its ``companion`` suffix uses, the first of
    :func:`candidate_names` (never overwrites a file). Each fits NAME_MAX with its
    companion."""
    for candidate in candidate_names(name, sha256, NAME_MAX - len(companion.encode())):
        if not (folder / candidate).exists() and not (
            companion and (folder / f"{candidate}{companion}").exists()
        ):
            return candidate
    raise AssertionError("unreachable: candidate_names never ends")
