"""Outputs named as compressed files (``--out results.jsonl.gz``): refused, since a run writes
its outcomes uncompressed; and what a run of an older build, which took such a name, is to
be given to be finished rather than started over. Paths whose name this process cannot read
as text: why, in words that name the real cause."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["COMPRESSED_SUFFIXES", "compressed_name", "finish_older", "undecodable_path"]

#: The names of compressed files (``results.jsonl.gz``): an output so named is refused.
COMPRESSED_SUFFIXES = frozenset(
    (".gz", ".gzip", ".tgz", ".z", ".bz2", ".xz", ".lzma", ".zst", ".zstd", ".lz4", ".zip", ".br")
)


def compressed_name(what: str, path: Path) -> str | None:
    """Why ``path`` cannot be given as ``what`` (None when it can): a name of a compressed file,
    which a program reading the file by its name would take it for."""
    if path.suffix.lower() not in COMPRESSED_SUFFIXES:
        return None
    return (
        f"{what} {path} is named as a compressed file ({path.suffix}), but a run writes its"
        " outcomes uncompressed (it appends to them, and cuts them back to their last"
        " checkpoint to resume): a program reading it by its name would fail; give a name"
        f" without {path.suffix} and compress the file after the run"
    )


def finish_older(outputs: Sequence[tuple[str, Path]], state: Path | str | None) -> str:
    """What to do, after :func:`compressed_name`'s refusal of one of ``outputs`` (flag, path),
    with the run a state file at ``state`` holds: a build before the refusal wrote into such
    a name. The name alone changed, the run found no state beside the new name (``OUT.state``)
    and started over, every row tagged (and billed) again. "" without a state file."""
    if not isinstance(state, Path) or not state.is_file():
        return ""
    moves, flags = [], [f"--state {shlex.quote(str(state))}"]
    for what, path in outputs:
        given = path
        while given.suffix.lower() in COMPRESSED_SUFFIXES:
            given = given.with_suffix("")
        if given != path and os.path.lexists(given):
            return (
                f"; the state {state} holds a run into it: to finish that run, rename {path}"
                f" ({given} is taken) and give the new name with --state {state}"
            )
        if given != path and os.path.lexists(path):
            moves.append(f"mv {shlex.quote(str(path))} {shlex.quote(str(given))}")
        flags.insert(len(flags) - 1, f"{what} {shlex.quote(str(given))}")
    then = f"{' and '.join(moves)}, then " if moves else ""
    return (
        f"; the state {state} holds a run into it (of a build that took the name): to finish"
        f" that run without tagging its rows again, {then}run with {' '.join(flags)}"
    )


def undecodable_path(what: str, text: str) -> str:
    """Why the path ``text`` given as ``what`` (its name's bytes not text here: PEP 383's lone
    surrogates) cannot be used. A name that is UTF-8 read by a process that reads file names
    in another encoding (a C locale with Python's UTF-8 mode off: ``LC_ALL=C PYTHONUTF8=0``,
    where every name that is not ASCII looks so) was said to be "not UTF-8 (a name written in
    another encoding)", shown as Latin-1 (``kat\\xe4log.csv``): the file was fine, the
    process was not. Such a name is now shown as the bytes it is, and the locale is named."""
    raw = os.fsencode(text)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        shown = raw.decode("utf-8", "backslashreplace")
        return (
            f"{what} {shown}: its path is not UTF-8 (a name written in another encoding):"
            " rename the file or folder, or give another path"
        )
    return (
        f"{what} {raw.decode('ascii', 'backslashreplace')}: its path is UTF-8, and this process"
        f" reads file names as {sys.getfilesystemencoding()} (a C locale with Python's UTF-8"
        " mode off, PYTHONUTF8=0): run it with LANG=C.UTF-8 and without PYTHONUTF8=0"
    )
