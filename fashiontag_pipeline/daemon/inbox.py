"""The inbox: which dropped files are manifests, when they are ready, and how they are claimed.

Layout (one daemon owns an inbox; several daemons sharing one are the lease-based mode of a
later issue)::

    INBOX/NAME            dropped by a producer (NAME.ready beside it says "complete now")
    INBOX/.work/NAME      claimed: in flight (resumes after a restart)
    INBOX/done/NAME       complete (its summary.json exists in the outbox)
    INBOX/failed/NAME     unreadable, beside NAME.error.json ({"reason": "..."})

Readiness is decided by polling only (``os.scandir`` + ``stat``), so it works on network
filesystems where inotify sees nothing. A file is ready when ``NAME.ready`` exists, or when
its size and mtime have not changed for ``settle`` seconds *of our clock*: the file's mtime is
compared only with itself, never with our clock, so a file server whose clock is off cannot
make a half-written file look old.

A claim is crash-safe by its order:

1. hash the content (sha256, streamed, in a worker thread), and check that the inode, size
   and mtime did not change while hashing (a producer still writing, or another file renamed
   over the name: not claimed this time);
2. record the claim in the :class:`ClaimLedger` (the state store), durably;
3. delete ``NAME.ready`` (a crash here leaves the file in the inbox, which settles and is
   claimed again: a marker is never left behind to make a *later* file of that name look
   ready before it is complete);
4. rename ``INBOX/NAME`` to ``INBOX/.work/NAME`` (atomic on one filesystem). A file that
   cannot be moved (or whose marker cannot be deleted) is left where it is and its claim
   recorded abandoned, said once (see :meth:`Inbox._move_in`).

A crash after 2 leaves a recorded claim whose file is still in the inbox: it is claimed again
(recording is idempotent by name). A crash after 4 leaves ``.work/NAME``, which
:meth:`Inbox.recover` reports, first, as a resumed claim. Settling is recorded before the move
to ``done/`` or ``failed/``, so a crash between the two is finished by :meth:`Inbox.recover`.
A name is not claimed while ``.work/NAME`` holds an earlier file of that name in flight (it
waits for it): a rename would otherwise replace a manifest in flight. One left there settled
(its move failed) is moved first, where its record says.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread

from ..engine.source import RESOURCE_ERRNOS
from ._files import fsync_dir
from .claims import Claim, as_moved, same_file
from .config import DEFAULT_SCAN_INTERVAL, DEFAULT_SETTLE
from .inbox_shared import SharedInbox
from .ledger import ClaimLedger, ClaimRecord
from .names import (
    DONE_DIR,
    FAILED_DIR,
    READY_SUFFIX,
    WORK_DIR,
    hash_file,
    is_ignored_name,
    is_manifest_name,
)
from .settled import remove_marker

__all__ = ["Claim", "Inbox"]

logger = logging.getLogger("fashiontag_pipeline.daemon")


@dataclass(slots=True)
class _Seen:
    size: int
    mtime_ns: int
    since: float


class Inbox(SharedInbox):
    """Scans ``root`` for ready manifests and claims them (see the module docstring).

    ``clock`` (monotonic seconds) decides settling and is injectable for tests; ``wall_clock``
    stamps ``claimed_at``. The filesystem calls are blocking: the async methods run them in a
    worker thread so a slow network filesystem never stalls the event loop.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        ledger: ClaimLedger,
        settle: float = DEFAULT_SETTLE,
        scan_interval: float = DEFAULT_SCAN_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        shared_after: float | None = None,
    ) -> None:
        self.root = Path(root)
        #: Several daemons on this inbox (a PostgreSQL ledger): a claim is the rename into
        #: ``.work`` (one daemon wins it), recorded after it, only if no claim of that name is
        #: in flight; start-up leaves the claims in flight to the leases, and repairs only what
        #: has been left alone for ``shared_after`` seconds (a daemon that died between its
        #: rename and its record, or between its record and its move).
        self.shared_after = shared_after
        self.work = self.root / WORK_DIR
        self.done = self.root / DONE_DIR
        self.failed = self.root / FAILED_DIR
        self.ledger = ledger
        self.settle = settle
        self.scan_interval = scan_interval
        self._clock = clock
        self._wall_clock = wall_clock
        self._seen: dict[str, _Seen] = {}
        #: Files that could not be claimed nor moved to failed/ (see _refuse).
        self._stuck: set[str] = set()
        #: Names claimed by this process and not yet settled: a file of that name in the
        #: inbox (one moved back out of .work by hand) waits for the claim to end.
        self._claimed: set[str] = set()
        #: Files ready besides those claimed, and files seen still settling (a burst): more
        #: manifests to come, soon (the engine holds its open task for their rows).
        self.ready_left = self.settling = 0
        #: Files whose claim could not move them (see _leave): left alone while they stay
        #: as they were then.
        self._immovable: dict[str, tuple[tuple[int, ...], int | None]] = {}
        self._held: set[str] = set()
        self._unmoved: set[str] = set()
        #: Files whose name is no manifest's (``catalogue.tsv``), said once while they stay.
        self._foreign: set[str] = set()
        #: Empty files (no manifest yet) said to be waiting for their content, once each.
        self._empty: set[str] = set()
        #: Claims in flight at start-up that :meth:`claims` has not handed out yet (queued).
        self.resumed: collections.deque[Claim] = collections.deque()

    def prepare(self) -> None:
        """Create the inbox's folders (the inbox itself must exist)."""
        if not self.root.is_dir():
            raise FileNotFoundError(f"inbox {self.root} is not a folder")
        for folder in (self.work, self.done, self.failed):
            folder.mkdir(exist_ok=True)

    # -- start-up ------------------------------------------------------------------------

    def recover(self) -> list[Claim]:
        """Claims in flight at start-up, oldest first; finishes interrupted moves.

        * ``.work/NAME`` recorded in flight: resumed. Not recorded at all (a claim from a
          ledger that was lost): hashed and recorded now. Recorded as settled (a crash between
          recording and moving): moved where the record says.
        * A claim in flight whose file is in neither ``.work`` nor the inbox: abandoned, said
          in a warning (a retention cleanup took a file dropped with its export's old time).
        """
        self.prepare()
        if self.shared_after is not None:
            self.repair_shared()
            return []
        self._remove_stale_temps(0.0)
        claims: list[Claim] = []
        with os.scandir(self.work) as entries:
            work_names = sorted(
                e.name for e in entries if e.is_file() and not e.name.startswith(".")
            )
        for name in work_names:
            record = self.ledger.lookup(name)
            if record is not None and record.status in ("done", "failed", "duplicate"):
                # Settled, but the crash came before the move (or its end): finish it (under
                # a free name if the recorded one was taken since by another file).
                self._finish_settled(name, record)
                continue
            if record is None or record.status != "claimed":
                sha256, size = hash_file(self.work / name)
                record = ClaimRecord(
                    name=name, sha256=sha256, size=size, claimed_at=self._wall_clock()
                )
                self.ledger.record_claim(record)
            elif (self.work / name).stat().st_size != record.size:
                # A crash after a file renamed over the name was moved, before its own hash
                # replaced the other's in the record: recorded again under its own.
                sha256, size = hash_file(self.work / name)
                record = ClaimRecord(
                    name=name, sha256=sha256, size=size, claimed_at=record.claimed_at
                )
                self.ledger.record_claim(record)
            claims.append(
                Claim(
                    name=name,
                    path=str(self.work / name),
                    sha256=record.sha256,
                    size=record.size,
                    claimed_at=record.claimed_at,
                    resumed=True,
                )
            )
        in_work = set(work_names)
        for record in self.ledger.in_flight():
            if record.name not in in_work and not (self.root / record.name).is_file():
                self.ledger.record_abandoned(record.name)
                # (dropped with an old time, then taken by a retention cleanup: said, not silent)
                logger.warning(
                    "claimed manifest %s is no longer in .work (removed: a cleanup job?):"
                    " abandoned, without a summary; any of its rows already sent were billed;"
                    " drop it again to tag it",
                    record.name,
                )
        claims.sort(key=lambda c: (c.claimed_at, c.name))
        self._claimed.update(c.name for c in claims)
        return claims

    # -- scanning ------------------------------------------------------------------------

    def scan(self) -> list[Path]:
        """One poll: the manifests ready now, in the order they became ready (then by name).

        A file is ready when ``NAME.ready`` exists, or its (size, mtime) has been the same on
        every scan for ``settle`` seconds. Files whose name is in flight in ``.work`` wait.
        """
        now = self._clock()
        names: dict[str, os.stat_result] = {}
        markers: dict[str, int] = {}  # name -> the marker's mtime
        odd: list[str] = []
        foreign: set[str] = set()
        with os.scandir(self.root) as entries:
            for entry in entries:
                if entry.name.endswith(READY_SUFFIX) and not entry.name.startswith("."):
                    with contextlib.suppress(FileNotFoundError):
                        mtime = entry.stat(follow_symlinks=False).st_mtime_ns
                        markers[entry.name[: -len(READY_SUFFIX)]] = mtime
                    continue
                if not is_manifest_name(entry.name):
                    if not is_ignored_name(entry.name) and entry.is_file(follow_symlinks=False):
                        foreign.add(entry.name)
                    continue
                try:
                    if not entry.is_file(follow_symlinks=False):
                        if not entry.is_dir(follow_symlinks=False):
                            odd.append(entry.name)  # a symlink, a FIFO, a socket
                        else:  # a Spark or Hadoop export: a folder of part files
                            foreign.add(entry.name)
                        continue
                    names[entry.name] = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
        for name in sorted(foreign - self._foreign):  # never tagged: never in silence either
            logger.warning(
                "folder %s in the inbox is not a manifest: left where it is, never tagged;"
                " drop the files in it themselves (each a manifest of its own, with its header)"
                if is_manifest_name(name)
                else "file %s in the inbox is not a manifest (a manifest's name ends in .csv,"
                " .jsonl or .ndjson, optionally .gz): left where it is, never tagged; save it"
                " as CSV UTF-8 or JSONL under such a name",
                os.fsencode(name).decode("utf-8", "backslashreplace"),
            )
        self._foreign = foreign
        for name in odd:  # never tagged, so never left in silence
            if name in self._stuck:
                continue
            self._refuse(
                self.root / name, "is not a regular file (a symlink, a FIFO): drop the file itself"
            )
        for gone in self._seen.keys() - names.keys():
            del self._seen[gone]
        self._stuck &= names.keys() | set(odd)
        self._empty = {n for n in self._empty if n in names and names[n].st_size == 0}
        for gone in self._immovable.keys() - names.keys():
            del self._immovable[gone]
        ready: list[tuple[float, str]] = []
        settling = 0
        for name, st in names.items():
            if name in self._stuck:
                continue
            if self._left_alone(name, st, markers.get(name, -1)):
                continue  # as it was when its claim could not move it
            seen = self._seen.get(name)
            if seen is None or seen.size != st.st_size or seen.mtime_ns != st.st_mtime_ns:
                seen = _Seen(st.st_size, st.st_mtime_ns, now)
                self._seen[name] = seen
            # A marker counts when written after the file (both mtimes are the file
            # server's): one left from an earlier drop never makes a file written in place
            # later look complete; it waits to settle instead.
            marked = markers.get(name, -1) >= st.st_mtime_ns
            if not marked and st.st_size == 0 and now - seen.since >= self.settle:
                # Opened by an export that has not written yet (a slow query): claimed, its
                # rows would go to the file in .work. No manifest is empty (no header).
                if name not in self._empty:
                    self._empty.add(name)
                    logger.warning(
                        "manifest %s is empty: waiting for its content (a %s%s beside it"
                        " claims it as it is)",
                        shown := os.fsencode(name).decode("utf-8", "backslashreplace"),
                        shown,
                        READY_SUFFIX,
                    )
                continue
            if not marked and now - seen.since < self.settle:
                settling += 1
                continue
            if name in self._claimed or (
                (self.work / name).exists()
                and (self.shared_after is not None or not self._clear_leftover(name))
            ):
                continue  # an earlier file of this name is in flight
            ready.append((seen.since, name))
        self.settling = settling
        ready.sort()
        return [self.root / name for _, name in ready]

    # -- claiming ------------------------------------------------------------------------

    def claim(self, path: Path, stop: anyio.Event | None = None) -> Claim | None:
        """Claim one ready manifest (blocking: see :meth:`aclaim`). None when it changed while
        being hashed, vanished, or its name is in flight: it is looked at again next scan;
        or when ``stop`` was set while it was hashed (a drain: it stays in the inbox)."""
        name = path.name
        try:
            name.encode()
        except UnicodeEncodeError:
            self._refuse_name(path)
            return None
        try:
            before = path.stat()
            sha256, size = hash_file(path, None if stop is None else stop.is_set)
            after = path.stat()
        except (FileNotFoundError, InterruptedError):
            self._seen.pop(name, None)
            return None
        except OSError as err:  # unreadable (another account's file, an I/O error)
            if err.errno in RESOURCE_ERRNOS:
                # The daemon is short of descriptors or memory, not the file unreadable: it
                # is looked at again next scan (failed/ would keep it from being tagged).
                logger.warning(
                    "manifest %s cannot be hashed now (%s): trying again", name, err.strerror
                )
                return None
            self._refuse(path, f"cannot be read: {err.strerror or err}")
            return None
        if not same_file(before, after) or size != after.st_size:
            # Still being written, or another file renamed over the name (same size and mtime:
            # ``cp -p``): settle again, never claimed under the other's hash.
            self._seen.pop(name, None)
            return None
        target = self.work / name
        if target.exists():
            return None
        record = ClaimRecord(name=name, sha256=sha256, size=size, claimed_at=self._wall_clock())
        if self.shared_after is not None:
            return self._claim_shared(path, record, after)
        self.ledger.record_claim(record)
        if not self._move_in(path, target, after):
            return None
        fsync_dir(self.root)
        fsync_dir(self.work)
        self._seen.pop(name, None)
        self._claimed.add(name)
        record = as_moved(target, after, record)
        if record.sha256 != sha256:
            self.ledger.record_claim(record)
        sha256, size = record.sha256, record.size
        return Claim(
            name=name,
            path=str(target),
            sha256=sha256,
            size=size,
            claimed_at=record.claimed_at,
        )

    def _move_in(self, path: Path, target: Path, hashed: os.stat_result) -> bool:
        """Steps 3 and 4 of a claim (recorded): the marker deleted, the file moved into
        ``.work``. A file the daemon may not move (a sticky drop folder and another account's
        file, an immutable file, a read-only mount), or whose marker it may not delete, is
        left in the inbox, its claim abandoned, said once: it is tried again when it or its
        marker changes (a chown, ``chattr -i``, a new drop), or at the next start. Raised,
        it stopped the daemon, and again at every start."""
        name = path.name
        marker = self.root / f"{name}{READY_SUFFIX}"
        step = f"its marker {marker.name} cannot be deleted"
        try:
            remove_marker(marker)
            step = "it cannot be moved into .work"
            self._remake(self.work)  # removed by hand while the daemon runs
            os.rename(path, target)
        except FileNotFoundError:
            # Taken back by its producer (``rm``) since its hash: nothing to claim. (Or .work
            # removed again in that instant: the next scan tries again.)
            self.ledger.record_abandoned(name)
            self._seen.pop(name, None)
            if not os.path.lexists(path):
                logger.warning("manifest %s was removed before it was claimed", name)
            return False
        except OSError as err:
            self.ledger.record_abandoned(name)
            self._leave(path, step, err, hashed, touched=False)
            return False
        return True

    async def ascan(self) -> list[Path]:
        """:meth:`scan` in a worker thread."""
        return await anyio.to_thread.run_sync(self.scan)

    async def aclaim(self, path: Path, stop: anyio.Event | None = None) -> Claim | None:
        """:meth:`claim` in a worker thread (hashing a large manifest takes seconds)."""
        return await anyio.to_thread.run_sync(self.claim, path, stop)

    async def claims(self, stopping: anyio.Event | None = None) -> AsyncIterator[Claim]:
        """Every claim, forever: those in flight at start-up first, then each ready manifest
        as scans find it (one scan every ``scan_interval`` seconds). The consumer applies
        back-pressure (``max_active``) simply by not asking for the next one. Once
        ``stopping`` is set (the daemon drains), nothing more is claimed: a file ready then
        stays in the inbox for the next start."""
        self.resumed.extend(await anyio.to_thread.run_sync(self.recover))
        while self.resumed:
            yield self.resumed.popleft()
        while True:
            # One claim per scan: the consumer may take hours to ask for the next one, and a
            # file rewritten meanwhile must settle again, so each claim is decided on a scan
            # made just before it, never on an older one.
            if stopping is not None and stopping.is_set():
                await anyio.sleep(self.scan_interval)
                continue
            ready = await self.ascan()
            self.ready_left = len(ready)
            claimed = await self.aclaim(ready[0], stopping) if ready else None
            self.ready_left = len(ready) - 1 if claimed is not None else 0
            if claimed is not None:
                yield claimed
            else:
                await anyio.sleep(self.scan_interval)
