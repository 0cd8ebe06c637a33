"""The inbox beside other daemons (a PostgreSQL ledger; a part of :class:`~.inbox.Inbox`):
a claim is the move into ``.work`` (one daemon wins it), recorded after it; what a daemon
that died between the two left is repaired by the others (:meth:`SharedInbox.repair_shared`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import cast

from ._files import fsync_dir
from .claims import Claim, as_moved, same_file
from .ledger import ClaimRecord, SharedLedger
from .names import READY_SUFFIX, free_name, hash_file
from .settled import InboxSettling, remove_marker

__all__ = ["SharedInbox"]


class SharedInbox(InboxSettling):
    """The several-daemons half of :class:`~.inbox.Inbox` (same folders, same ledger)."""

    work: Path
    shared_after: float | None
    _wall_clock: Callable[[], float]

    def repair_shared(self) -> None:
        """Beside other daemons (at start-up, then every ``shared_after`` seconds): a file in
        ``.work`` left alone (its ctime, which a rename sets) for ``shared_after`` seconds and
        not recorded in flight is recorded now (a daemon died, or lost the database, between
        its rename and its record), or, when it is the very content a settled record names,
        moved where that record says; a claim in flight whose file is gone is abandoned."""
        assert self.shared_after is not None
        ledger = cast("SharedLedger", self.ledger)
        now = self._wall_clock()
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
                folder = self.failed if record.status == "failed" else self.done
                target = folder / free_name(folder, entry.name, record.sha256)
                self._move_settled(self.work / entry.name, target, gone_ok=True)  # by another
                continue
            ledger.record_claim_if_absent(
                ClaimRecord(name=entry.name, sha256=sha256, size=size, claimed_at=now)
            )
        in_work = {e.name for e in files}
        for record in self.ledger.in_flight():
            if record.name not in in_work and not (self.work / record.name).is_file():
                self.ledger.record_abandoned(record.name)

    def _claim_shared(
        self, path: Path, record: ClaimRecord, hashed: os.stat_result
    ) -> Claim | None:
        """The move first: of several daemons, the one whose move succeeds owns the file;
        then its record (if the name is not in flight already). The move is a hard link that
        fails when ``.work`` has the name (a rename would replace a file another daemon moved
        there a moment before), then the inbox's name is removed."""
        name = path.name
        self._seen.pop(name, None)
        try:
            os.link(path, self.work / name)
        except (FileNotFoundError, FileExistsError):
            return None  # another daemon claimed it, or one of that name is in flight
        record = as_moved(self.work / name, hashed, record)
        with contextlib.suppress(FileNotFoundError):
            # Only the file linked: one renamed over NAME since is left for the next scan.
            if same_file(path.stat(), (self.work / name).stat()):
                os.unlink(path)
        remove_marker(self.root / f"{name}{READY_SUFFIX}")
        fsync_dir(self.root)
        fsync_dir(self.work)
        cast("SharedLedger", self.ledger).record_claim_if_absent(record)
        return Claim(
            name=name,
            path=str(self.work / name),
            sha256=record.sha256,
            size=record.size,
            claimed_at=record.claimed_at,
        )
