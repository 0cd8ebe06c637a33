"""Settling the inbox's manifests: the moves to ``done/`` and ``failed/`` (a part of
:class:`~.inbox.Inbox`).

A manifest's outcome is recorded in the ledger before its file moves, so a crash between the
two is finished at start-up (:meth:`~.inbox.Inbox.recover`). The move is bookkeeping, never a
reason to stop: a file removed from ``.work`` by hand, or a ``done/`` the daemon cannot
write, is logged, and the file stays where it is. A file that cannot even be claimed (not
readable, a name that is not UTF-8) goes straight to ``failed/`` beside its reason.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import anyio
import anyio.to_thread
import msgspec

from ._files import fsync_dir, move_file, remove_stale_temps, write_atomic
from .ledger import ClaimLedger, ClaimRecord, SettledStatus, SharedLedger
from .names import (
    DONE_DIR,
    ERROR_SUFFIX,
    FAILED_DIR,
    NAME_MAX,
    READY_SUFFIX,
    SUMMARY_NOTE_PREFIX,
    candidate_names,
    free_name,
    hash_file,
    summary_note,
)

if TYPE_CHECKING:
    from .claims import Claim

__all__ = ["InboxSettling", "remove_marker"]

logger = logging.getLogger("fashiontag_pipeline.daemon")

_error_decoder = msgspec.json.Decoder(dict[str, object])


def remove_marker(marker: Path) -> None:
    """Remove a ``NAME.ready`` marker if there is one. A name too long for the marker's
    suffix (ENAMETOOLONG) has none: it cannot exist."""
    try:
        marker.unlink(missing_ok=True)
    except OSError as err:
        if err.errno != errno.ENAMETOOLONG:
            raise


class InboxSettling:
    """The settling half of :class:`~.inbox.Inbox` (same folders, same ledger)."""

    root: Path
    work: Path
    done: Path
    failed: Path
    ledger: ClaimLedger
    _seen: dict[str, Any]
    _stuck: set[str]
    _claimed: set[str]
    #: Names a settled file left in .work holds back, said once (see _clear_leftover).
    _held: set[str]
    #: Settled files a repair beside other daemons cannot move out of .work, said once (see
    #: _move_settled).
    _unmoved: set[str]

    def claimed_names(self) -> frozenset[str]:
        """The names this process claimed and has not settled yet (in flight)."""
        return frozenset(self._claimed)

    def _refuse_name(self, path: Path) -> None:
        """A manifest whose name is not UTF-8 (:meth:`_refuse`), unless it is and this process
        reads names in another encoding (a C locale with Python's UTF-8 mode off:
        ``PYTHONUTF8=0``), where every name that is not ASCII looks so: the file is fine,
        the process is not (its reason's name, written in ASCII, stopped it at every start).
        Such a file is left in the inbox, said once, for a start in a UTF-8 locale."""
        try:
            shown = os.fsencode(path.name).decode("utf-8")
        except UnicodeDecodeError:
            self._refuse(path, "its name is not UTF-8: rename it and drop it again")
            return
        self._stuck.add(path.name)  # (until it leaves the inbox, or the next start)
        logger.error(
            "manifest %s is left in the inbox: its name is UTF-8, and this daemon reads file"
            " names as %s (a C locale with Python's UTF-8 mode off, PYTHONUTF8=0): start it"
            " with LANG=C.UTF-8 and without PYTHONUTF8=0 to tag it",
            shown,
            sys.getfilesystemencoding(),
        )

    def _refuse(self, path: Path, reason: str) -> None:
        """A file that cannot even be claimed goes to ``failed/`` beside its reason (no claim
        is recorded): never an error out of the scan, which would stop the daemon at every
        start. If it cannot be moved either, it is left alone (said once)."""
        shown = os.fsencode(path.name).decode("utf-8", "backslashreplace")
        error_file: Path | None = None
        moved = False
        try:
            # A name that is not UTF-8 goes to failed/ under its bytes written out (\\xe9).
            self._remake(self.failed)
            name = free_name(self.failed, shown, "", companion=ERROR_SUFFIX)
            error = msgspec.json.encode({"reason": f"{shown} {reason}", "sha256": ""})
            error_file = self.failed / f"{name}{ERROR_SUFFIX}"
            write_atomic(error_file, error + b"\n")
            if stat.S_ISREG(os.lstat(path).st_mode):
                move_file(path, self.failed / name)  # failed/ on another file system: a copy
            else:
                os.rename(path, self.failed / name)  # a link or a FIFO: never opened
            moved = True
            fsync_dir(self.failed)
            remove_marker(path.with_name(f"{path.name}{READY_SUFFIX}"))
        except OSError as err:
            if moved:
                logger.error("manifest %s %s: moved to failed/ (%s)", shown, reason, err)
                return
            if error_file is not None:
                error_file.unlink(missing_ok=True)  # no reason left without its manifest
            logger.error("manifest %s %s, and cannot be moved to failed/: %s", shown, reason, err)
            self._stuck.add(path.name)  # left alone: never ready again while it is there
            return
        self._seen.pop(path.name, None)
        logger.error("manifest %s %s: moved to failed/", shown, reason)

    def finish(self, claim: Claim, status: Literal["done", "duplicate"], lease: Any = None) -> Path:
        """Move a complete manifest (its summary written) to ``done/``; returns where. With a
        ``lease`` (several daemons), only while it holds."""
        name = free_name(self.done, claim.name, claim.sha256)
        self._settle(claim.name, status, f"{DONE_DIR}/{name}", lease)
        target = self.done / name
        self._move_settled(Path(claim.path), target)
        self._claimed.discard(claim.name)  # after the move: a scan never moves it meanwhile
        return target

    def _remake(self, folder: Path) -> None:
        """Make one of the inbox's folders again if it is gone (a cleanup job's ``rm -rf``
        while the daemon runs): the move into it follows. One that cannot be made is left to
        that move to fail and say why."""
        try:
            folder.mkdir()
        except OSError:
            return
        logger.warning("the inbox's folder %s was gone: made again", folder.name)

    def _settled_target(self, record: ClaimRecord) -> Path:
        """Where a settled file still in ``.work`` goes: where its record says, or a free
        name in that folder when that one was taken since."""
        target = self.root / record.settled_as
        folder = self.failed if record.status == "failed" else self.done
        if not record.settled_as or target.exists() or target.parent != folder:
            target = folder / free_name(folder, record.name, record.sha256)
        return target

    def _finish_settled(self, name: str, record: ClaimRecord, *, gone_ok: bool = False) -> None:
        """Finish the move of ``.work/NAME``, settled (a crash, a failed move): where its
        record says, unless it is there already. ``gone_ok`` (a repair beside other daemons,
        every lease): a move that keeps failing is said once, and once more when it is done."""
        if self._moved_already(self.work / name, record):
            moved = True
        else:
            target = self._settled_target(record)
            try:
                self._write_reason(target, record)
            except OSError as err:
                moved = False
                if self._first_failure(name, gone_ok):
                    logger.error(
                        "cannot move %s to %s (it stays in .work): its error file: %s",
                        name,
                        target,
                        err.strerror or err,
                    )
            else:
                moved = self._move_settled(self.work / name, target, gone_ok=gone_ok, once=gone_ok)
        if moved:  # (settled: its summary's note, if a crash left it, is of no more use)
            summary_note(self.work, name).unlink(missing_ok=True)
        if moved and name in self._unmoved:
            self._unmoved.discard(name)
            logger.info("manifest %s (settled) has left .work at last", name)

    def _write_reason(self, target: Path, record: ClaimRecord) -> None:
        """Before a failed manifest moves to ``target`` in ``failed/``: its error file, unless
        it is there (one that could not be written when it failed, its folder full or not
        writable, names its summary, which holds the reason): never found in ``failed/``
        without one. OSError when it cannot be written (the manifest stays in ``.work``)."""
        error = target.with_name(f"{target.name}{ERROR_SUFFIX}")
        if record.status != "failed" or error.exists():
            return
        reason = (
            "its error file could not be written when it failed (failed/ full or not"
            " writable): the reason is in its summary.json in the outbox"
        )
        self._remake(target.parent)
        write_atomic(
            error, msgspec.json.encode({"reason": reason, "sha256": record.sha256}) + b"\n"
        )

    def _moved_already(self, source: Path, record: ClaimRecord) -> bool:
        """Whether ``source`` is in place already, where its record says, but for its own
        removal (a copy across file systems killed after its rename into place): the file
        there holds the same bytes. ``source`` is removed then (a copy of it under another
        name made two in ``done/``)."""
        target = self.root / record.settled_as
        if not record.settled_as or target.parent not in (self.done, self.failed):
            return False
        try:
            there, here = target.stat(), source.stat()
            if there.st_size != here.st_size:
                return False
            same_file = (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino)
            if not same_file and hash_file(target)[0] != hash_file(source)[0]:
                return False
            os.unlink(source)
        except OSError:
            return False
        fsync_dir(source.parent)
        logger.info("manifest %s was in %s already: removed from .work", source.name, target)
        return True

    def _remove_stale_temps(self, older_than: float) -> None:
        """The hidden temp files a copy or write killed midway left in ``done/`` and
        ``failed/`` (none is being written by this process at start-up), and the summary
        notes in ``.work`` a kill after the settling left (their manifest gone from
        ``.work``; a note is written once its manifest is there, and removed once it left)."""
        for folder in (self.done, self.failed):
            remove_stale_temps(folder, older_than)
        # A note of any age: it is written while its manifest is in .work (and read only
        # then), so one whose manifest left is no daemon's to use; waiting ``older_than``
        # (a lease) left a note a kill orphaned just before a restart until the next repair.
        try:
            with os.scandir(self.work) as entries:
                notes = [e for e in entries if e.name.startswith(SUMMARY_NOTE_PREFIX)]
            with os.scandir(self.work) as entries:  # (after the notes: a claim since keeps its)
                kept = {summary_note(self.work, e.name).name for e in entries}
            for note in notes:
                if note.name not in kept:
                    os.unlink(note.path)
        except OSError:
            return  # (.work gone: made again by a claim; a note's clean-up is no reason to stop)

    def _clear_leftover(self, name: str) -> bool:
        """Whether ``.work/NAME`` is out of the way of a new file of that name: it is not in
        flight (its claim is settled: a move to ``done/`` or ``failed/`` that failed, a
        folder removed or on another file system) and is moved where its record says now. A
        leftover that still cannot be moved holds the name back, said once."""
        record = self.ledger.lookup(name)
        if record is None or record.status not in ("done", "failed", "duplicate"):
            return False  # in flight (or unknown: the next start resumes it)
        if self._moved_already(self.work / name, record):
            self._held.discard(name)
            return True
        target = self._settled_target(record)
        try:
            self._write_reason(target, record)
            self._remake(target.parent)
            move_file(self.work / name, target)
        except OSError as err:
            if not (self.work / name).exists():
                return True  # removed by hand meanwhile
            if name not in self._held:
                self._held.add(name)
                logger.error(
                    "a new %s waits: the settled one in .work cannot be moved to %s (%s)",
                    name,
                    target.parent.name,
                    err.strerror or err,
                )
            return False
        self._held.discard(name)
        return not (self.work / name).exists()

    def _move_settled(
        self, path: Path, target: Path, *, gone_ok: bool = False, once: bool = False
    ) -> bool:
        """Move a settled manifest (its outcome recorded) to ``done/`` or ``failed/``, made
        again if it is gone; across file systems, a copy. The move is bookkeeping, never a
        reason to stop: a file removed from ``.work`` by hand is noted, and a folder the
        daemon cannot write leaves the file in ``.work`` (said each time; a new file of its
        name, or a start-up, tries again), where it would have stopped the daemon at every
        start. ``once``: a file that stays in ``.work`` is said once (a repair tries again
        every lease). Whether the file left ``.work`` (moved, or gone)."""
        try:
            self._remake(target.parent)
            move_file(path, target)
        except FileNotFoundError:
            if path.exists():
                if self._first_failure(path.name, once):
                    logger.error(
                        "cannot move %s to %s: its folder is gone", path.name, target.parent
                    )
                return False
            if not gone_ok:
                logger.warning("manifest %s was removed from .work before its move", path.name)
        except OSError as err:
            if self._first_failure(path.name, once):
                logger.error("cannot move %s to %s (it stays in .work): %s", path.name, target, err)
            return False
        return True

    def _first_failure(self, name: str, once: bool) -> bool:
        """Whether a failed move of ``name`` is to be said (every one, or the first when
        ``once``)."""
        if not once:
            return True
        if name in self._unmoved:
            return False
        self._unmoved.add(name)
        return True

    def _settle(self, name: str, status: SettledStatus, settled_as: str, lease: Any) -> None:
        if lease is None:
            self.ledger.record_settled(name, status, settled_as)
        else:
            cast("SharedLedger", self.ledger).record_settled(name, status, settled_as, lease=lease)

    def fail(self, claim: Claim, reason: str, lease: Any = None) -> Path:
        """Move an unreadable manifest to ``failed/`` beside ``NAME.error.json``; returns
        where. The error file is written first (atomically), so a failed manifest is never
        found without its reason; ``failed/`` is made again if it is gone."""
        self._remake(self.failed)
        name = self._interrupted_failure(claim) or free_name(
            self.failed, claim.name, claim.sha256, companion=ERROR_SUFFIX
        )
        error = {"reason": reason, "sha256": claim.sha256}
        target = self.failed / name
        try:
            write_atomic(self.failed / f"{name}{ERROR_SUFFIX}", msgspec.json.encode(error) + b"\n")
        except OSError as err:
            # failed/ full or not writable: never a reason to stop (raised, it stopped the
            # daemon, which took this manifest up again at every start and stopped again).
            # Settled all the same (its summary says why); it stays in .work until a start
            # can move it, beside an error file then (see _write_reason).
            self._settle(claim.name, "failed", f"{FAILED_DIR}/{name}", lease)
            self._claimed.discard(claim.name)
            logger.error(
                "cannot write %s%s in failed/ (%s): %s stays in .work (its summary says why)"
                " and moves to failed/ at a start once it can",
                name,
                ERROR_SUFFIX,
                err.strerror or err,
                claim.name,
            )
            return Path(claim.path)
        self._settle(claim.name, "failed", f"{FAILED_DIR}/{name}", lease)
        self._move_settled(Path(claim.path), target)
        self._claimed.discard(claim.name)
        return target

    def _interrupted_failure(self, claim: Claim) -> str | None:
        """The name an earlier attempt to fail this claim chose (its error file, written first,
        names the claim's sha256, and no manifest stands beside it): reused, so a crash between
        the two leaves no error file without its manifest."""
        limit = NAME_MAX - len(ERROR_SUFFIX.encode())  # the names fail's free_name gives
        for name in itertools.islice(candidate_names(claim.name, claim.sha256, limit), 10):
            error = self.failed / f"{name}{ERROR_SUFFIX}"
            if (self.failed / name).exists() or not error.exists():
                continue
            try:
                if _error_decoder.decode(error.read_bytes()).get("sha256") == claim.sha256:
                    return name
            except (OSError, msgspec.DecodeError):
                continue
        return None

    async def afinish(
        self, claim: Claim, status: Literal["done", "duplicate"], lease: Any = None
    ) -> Path:
        """:meth:`finish` in a worker thread."""
        return await anyio.to_thread.run_sync(self.finish, claim, status, lease)

    async def afail(self, claim: Claim, reason: str, lease: Any = None) -> Path:
        """:meth:`fail` in a worker thread."""
        return await anyio.to_thread.run_sync(self.fail, claim, reason, lease)
