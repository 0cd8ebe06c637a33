"""The inbox beside other daemons (a PostgreSQL ledger; a part of :class:`~.inbox.Inbox`):
a claim is the move into ``.work`` (one daemon wins it), recorded after it; what a daemon
that died between the two left is repaired by the others (:meth:`SharedInbox.repair_shared`).
A file no daemon may move is left in the inbox, each daemon saying so once
(:meth:`SharedInbox._leave`, which the one-daemon claim uses too).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import cast

from ._files import fsync_dir, write_atomic
from .claims import Claim, as_moved, same_file
from .ledger import ClaimRecord, SharedLedger
from .names import READY_SUFFIX, STATE_MARK, hash_file
from .settled import InboxSettling, remove_marker

__all__ = ["SharedInbox"]

logger = logging.getLogger("fashiontag_pipeline.daemon")


def _left_as(st: os.stat_result, marked: int) -> tuple[int, ...]:
    """What a file left in the inbox unclaimed is known by, but its ctime: the inode, size,
    mtime, owner and mode, and its marker's mtime (``marked``; -1: none)."""
    return (
        st.st_ino,
        st.st_dev,
        st.st_size,
        st.st_mtime_ns,
        st.st_uid,
        st.st_gid,
        st.st_mode,
        marked,
    )


class SharedInbox(InboxSettling):
    """The several-daemons half of :class:`~.inbox.Inbox` (same folders, same ledger)."""

    work: Path
    shared_after: float | None
    _wall_clock: Callable[[], float]
    #: Files left in the inbox by a claim that could not move them (see _leave): what they
    #: were known by then (:func:`_left_as`), and their ctime (None: not compared).
    _immovable: dict[str, tuple[tuple[int, ...], int | None]]
    _unseen_said = False
    #: The inbox folder (device, inode) and its state note, as last seen with the note in it.
    _noted: tuple[tuple[int, int], bytes] | None = None

    def looks_shared(self) -> bool:
        """Whether this daemon sees the shared inbox: the state note every daemon writes into
        it at start is there. A mount gone (NFS, autofs) shows the empty folder under it: the
        files in flight look gone there, and the daemon abandoned their claims (also those
        other daemons were tagging), which were claimed again once the mount came back, every
        row tagged (and billed) again. Said once while it lasts, and when it ends. A note gone
        from the very folder it was seen in (removed by hand, a sync with ``--delete``) is
        written again: each daemon, taking it for its mount gone, leased nothing more."""
        folder: tuple[int, int] | None = None
        note: bytes | None = None
        with contextlib.suppress(OSError):
            st = os.stat(self.root)
            folder = (st.st_dev, st.st_ino)
            note = (self.root / STATE_MARK).read_bytes()
        if note is not None and folder is not None:
            self._noted = (folder, note)
        elif folder is not None and self._noted is not None and self._noted[0] == folder:
            with contextlib.suppress(OSError):
                write_atomic(self.root / STATE_MARK, self._noted[1])
                logger.warning("the inbox's state note %s was removed: written again", STATE_MARK)
                note = self._noted[1]
        seen = note is not None
        if seen == self._unseen_said:
            self._unseen_said = not seen
            if seen:
                logger.warning(
                    "the inbox %s is back: claims in flight are looked at again", self.root
                )
            else:
                logger.error(
                    "the inbox %s is not the shared inbox now (no %s in it: a mount gone?): no "
                    "claim is taken over or abandoned until it is back",
                    self.root,
                    STATE_MARK,
                )
        return seen

    def _left_alone(self, name: str, st: os.stat_result, marked: int) -> bool:
        """Whether a file in the inbox is as it was when its claim could not move it."""
        left = self._immovable.get(name)
        return (
            left is not None
            and left[0] == _left_as(st, marked)
            and left[1] in (None, st.st_ctime_ns)
        )

    def _leave(
        self, path: Path, step: str, err: OSError, hashed: os.stat_result, *, touched: bool
    ) -> None:
        """A file the claim may not move into ``.work`` (a sticky drop folder and another
        account's file, an immutable file, a read-only mount), or whose marker it may not
        delete: left in the inbox, said once, and left alone while it stays as it was (a
        chown, ``chattr -i``, a new drop or marker: tried again), or until the next start.
        Raised, it stopped the daemon, and again at every start. ``touched``: the try set the
        file's ctime (a hard link, undone), as another daemon's try does, so the ctime is not
        compared (two daemons would try in turn for ever, each saying so each time)."""
        name = path.name
        self._seen.pop(name, None)
        try:
            marked = (self.root / f"{name}{READY_SUFFIX}").lstat().st_mtime_ns
        except OSError:
            marked = -1
        ctime = None if touched else hashed.st_ctime_ns
        self._immovable[name] = (_left_as(hashed, marked), ctime)
        logger.error(
            "manifest %s cannot be claimed: %s (%s); it is left in the inbox, not tagged, "
            "until it changes or the daemon restarts",
            name,
            step,
            err.strerror or err,
        )

    def repair_shared(self) -> None:
        """Beside other daemons (at start-up, then every ``shared_after`` seconds): a file in
        ``.work`` left alone (its ctime, which a rename sets) for ``shared_after`` seconds and
        not recorded in flight is recorded now (a daemon died, or lost the database, between
        its rename and its record), or, when it is the very content a settled record names,
        moved where that record says; a claim in flight whose file is gone is abandoned.
        ``.work`` removed (``rm -rf``) is made again, as by a claim."""
        assert self.shared_after is not None
        ledger = cast("SharedLedger", self.ledger)
        now = self._wall_clock()
        self._remake(self.work)  # removed by a cleanup job: it stopped the daemon (exit 1)
        self._remove_stale_temps(self.shared_after)  # (another daemon's copy may be under way)
        with os.scandir(self.work) as entries:
            files = [e for e in entries if e.is_file() and not e.name.startswith(".")]
        for entry in sorted(files, key=lambda e: e.name):
            try:
                if now - entry.stat().st_ctime < self.shared_after:
                    continue  # another daemon may be between its rename and its record
            except FileNotFoundError:
                continue
            record = self.ledger.lookup(entry.name)
            if record is not None and record.status == "claimed":
                continue
            try:
                sha256, size = hash_file(self.work / entry.name)
            except FileNotFoundError:
                continue
            if (
                record is not None
                and record.status in ("done", "failed", "duplicate")
                and record.sha256 == sha256
            ):
                # This very file was settled, but its move was interrupted: finish it. A file
                # of another content under a settled name is a new claim (below).
                self._finish_settled(entry.name, record, gone_ok=True)  # (or by another)
                continue
            ledger.record_claim_if_absent(
                ClaimRecord(name=entry.name, sha256=sha256, size=size, claimed_at=now)
            )
        in_work = {e.name for e in files}
        if not self.looks_shared():
            return  # (a mount gone: every file in flight looks gone)
        for record in self.ledger.in_flight():
            if record.name not in in_work and not (self.work / record.name).is_file():
                self.ledger.record_abandoned(record.name)

    def _claim_shared(
        self, path: Path, record: ClaimRecord, hashed: os.stat_result
    ) -> Claim | None:
        """The move first: of several daemons, the one whose move succeeds owns the file;
        then its record (if the name is not in flight already). The marker is deleted first
        (as with one daemon: one that cannot be leaves the file as it was). The move is a hard
        link that fails when ``.work`` has the name (a rename would replace a file another
        daemon moved there a moment before), then the inbox's name is removed. A file whose
        marker, link or inbox name the file system refuses to remove (EPERM) is left in the
        inbox as it was, nothing recorded (see :meth:`_leave`)."""
        name = path.name
        self._seen.pop(name, None)
        moved = self.work / name
        marker = self.root / f"{name}{READY_SUFFIX}"
        step = f"its marker {marker.name} cannot be deleted"
        try:
            remove_marker(marker)
            step = "it cannot be moved into .work"
            self._remake(self.work)  # removed by hand while the daemon runs
            os.link(path, moved)
        except (FileNotFoundError, FileExistsError):
            return None  # another daemon claimed it, or one of that name is in flight
        except OSError as err:  # protected_hardlinks, an immutable file, a read-only mount
            self._leave(path, step, err, hashed, touched=False)
            return None
        record = as_moved(moved, hashed, record)
        try:
            with contextlib.suppress(FileNotFoundError):
                # Only the file linked: one renamed over NAME since is left for the next scan.
                if same_file(path.stat(), moved.stat()):
                    os.unlink(path)
        except OSError as err:  # a sticky drop folder: another account's file stays
            with contextlib.suppress(FileNotFoundError):
                os.unlink(moved)  # undone: not claimed (no record yet), nor tagged twice
            self._leave(path, step, err, hashed, touched=True)
            return None
        fsync_dir(self.root)
        fsync_dir(self.work)
        cast("SharedLedger", self.ledger).record_claim_if_absent(record)
        return Claim(
            name=name,
            path=str(moved),
            sha256=record.sha256,
            size=record.size,
            claimed_at=record.claimed_at,
        )
