"""A note of the summary being published, kept in ``INBOX/.work`` until the manifest settles.

``summary.json`` is the consumer's hand-off: once it exists the folder may be taken (moved,
archived, removed). A daemon killed after writing it, before the manifest was recorded
settled, found the folder gone at its restart, took that for outputs removed under the
manifest, made the folder again with a second summary, ``failed``, and moved the manifest to
``failed/``: two answers for one manifest, and every row billed again when it was dropped
anew, as the failed summary said. The summary is noted here first (with the folder it goes
to, by device and inode), then written; a restart that finds the note and the folder gone or
made again knows it was published and taken: it settles the manifest as noted and makes no
folder (one the restart's engine made again, holding nothing but empty outputs and the mark,
is removed).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import msgspec

from ._files import write_atomic
from .inbox import Claim
from .names import summary_note
from .outbox import CLAIM_FILE, ManifestOutputs, ManifestSummary, rfc3339

__all__ = ["forget", "noted_or", "publish"]


class _Note(msgspec.Struct, frozen=True, kw_only=True):
    summary: ManifestSummary
    dev: int
    ino: int


_decoder = msgspec.json.Decoder(_Note)


def _path(work: Path, claim: Claim) -> Path:
    return summary_note(work, claim.name)


def _read(work: Path, claim: Claim) -> _Note | None:
    """This very claim's note (a name claimed again later is another claim)."""
    try:
        note = _decoder.decode(_path(work, claim).read_bytes())
    except (OSError, msgspec.DecodeError):
        return None
    s = note.summary
    same = (s.manifest, s.sha256, s.claimed_at) == (
        claim.name,
        claim.sha256,
        rfc3339(claim.claimed_at),
    )
    return note if same else None


def noted_or(work: Path, outputs: ManifestOutputs, summary: ManifestSummary) -> ManifestSummary:
    """The summary noted before a kill (it may have been published, and its folder taken
    since), else the one in its folder written before a kill, else ``summary``."""
    note = _read(work, outputs.claim)
    return note.summary if note is not None else outputs.earlier_or(summary)


def _taken(outputs: ManifestOutputs, note: _Note) -> bool:
    """Whether the folder the noted summary went to is gone (taken by the consumer); one made
    again since, holding only the mark and empty outputs, is removed."""
    try:
        st = outputs.folder.stat()
    except FileNotFoundError:
        return True
    if (st.st_dev, st.st_ino) == (note.dev, note.ino):
        return False
    try:
        with os.scandir(outputs.folder) as entries:
            names = {e.name: e for e in entries}
        if set(names) <= {CLAIM_FILE, outputs.results.name, outputs.rejects.name} and all(
            e.name == CLAIM_FILE or e.stat().st_size == 0 for e in names.values()
        ):
            for name in names:
                (outputs.folder / name).unlink()
            outputs.folder.rmdir()
    except OSError:
        pass  # (left as it is: no summary is written into it)
    return True


def publish(work: Path, outputs: ManifestOutputs, summary: ManifestSummary) -> None:
    """Note ``summary``, then write ``summary.json`` (not into a folder made again after the
    noted one was published and taken)."""
    note = _read(work, outputs.claim)
    if note is not None and note.summary == summary and _taken(outputs, note):
        return
    if note is None or note.summary != summary:
        outputs.folder.mkdir(parents=True, exist_ok=True)
        st = outputs.folder.stat()
        data = msgspec.json.encode(_Note(summary=summary, dev=st.st_dev, ino=st.st_ino))
        with contextlib.suppress(FileNotFoundError):  # (.work removed: no note, as before)
            write_atomic(_path(work, outputs.claim), data)
    outputs.write_summary(summary)


def forget(work: Path, claim: Claim) -> None:
    """The manifest settled: its note goes."""
    _path(work, claim).unlink(missing_ok=True)
