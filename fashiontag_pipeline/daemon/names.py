"""Names and content of the files in an inbox: which are manifests, their stems, a free name.

A manifest is a ``.csv``, ``.jsonl`` or ``.ndjson`` file, gzipped or not, that is neither hidden
nor a marker or temporary file (``.ready``, ``.part``, ``.tmp``). Settled manifests move into
``done/`` and ``failed/`` under their own name when it is free, else under a name that carries
the first 12 hex digits of their sha256: nothing is ever overwritten.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = [
    "DONE_DIR",
    "ERROR_SUFFIX",
    "FAILED_DIR",
    "GZIP_SUFFIX",
    "IGNORED_SUFFIXES",
    "MANIFEST_SUFFIXES",
    "READY_SUFFIX",
    "WORK_DIR",
    "free_name",
    "hash_file",
    "is_manifest_name",
    "manifest_stem",
    "suffix_of",
]

MANIFEST_SUFFIXES = (".csv", ".jsonl", ".ndjson")
GZIP_SUFFIX = ".gz"
READY_SUFFIX = ".ready"
IGNORED_SUFFIXES = (".part", ".tmp", READY_SUFFIX)
WORK_DIR = ".work"
DONE_DIR = "done"
FAILED_DIR = "failed"
ERROR_SUFFIX = ".error.json"
HASH_BLOCK = 1 << 20


def is_manifest_name(name: str) -> bool:
    """Whether a file of this name in the inbox is a manifest (not a marker, temp or hidden)."""
    if not name or name.startswith(".") or name.endswith(IGNORED_SUFFIXES):
        return False
    base = name[: -len(GZIP_SUFFIX)] if name.endswith(GZIP_SUFFIX) else name
    return any(base.endswith(s) and len(base) > len(s) for s in MANIFEST_SUFFIXES)


def manifest_stem(name: str) -> str:
    """The name without ``.gz`` and then ``.csv``/``.jsonl``/``.ndjson``: ``a.csv.gz`` -> ``a``."""
    base = name[: -len(GZIP_SUFFIX)] if name.endswith(GZIP_SUFFIX) else name
    for suffix in MANIFEST_SUFFIXES:
        if base.endswith(suffix) and len(base) > len(suffix):
            return base[: -len(suffix)]
    return base


def suffix_of(name: str) -> str:
    return name[len(manifest_stem(name)) :]


def hash_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as fh:
        while block := fh.read(HASH_BLOCK):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


def free_name(folder: Path, name: str, sha256: str, *, companion: str = "") -> str:
    """A name in ``folder`` that neither this nor its ``companion`` suffix uses: ``name``, then
    ``STEM.<sha12>SUFFIX``, then ``STEM.<sha12>.2SUFFIX``, ... (never overwrites a file)."""
    stem, suffix = manifest_stem(name), suffix_of(name)
    candidates = [name, f"{stem}.{sha256[:12]}{suffix}"]
    n = 2
    while True:
        for candidate in candidates:
            if not (folder / candidate).exists() and not (
                companion and (folder / f"{candidate}{companion}").exists()
            ):
                return candidate
        candidates = [f"{stem}.{sha256[:12]}.{n}{suffix}"]
        n += 1
