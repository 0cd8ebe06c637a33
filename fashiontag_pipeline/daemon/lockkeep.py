"""The lock files a daemon with a SQLite state holds for weeks, kept at each look of its health
loop (:func:`~.room.watch_state_file`).

Touched only when it started, a daemon's locks (``INBOX/.fashiontag-daemon.lock``, its
``STATE.lock``) were taken after a month of uptime by a retention cleanup (``find /data -mtime
+30 -delete``), or removed outright by another cleanup, and a second daemon on the same inbox
or state (a cron ``@reboot`` line, a unit started twice, a start by hand) started beside it:
rows billed twice. Each look now touches them when old and makes again (and locks) one that
was removed (:func:`~..engine.outfiles.keep_lock_file`): the second daemon is refused. An idle
daemon's state file (its ``-wal``, ``-shm``) and the inbox's ``.fashiontag-daemon.state`` aged
the same way (the daemon went on on the removed state, and began an empty one at its next
start, done manifests forgotten): each look touches them too once they are old.

A lock made again that another process holds (it came between the removal and the next look,
or only looks, as ``fashiontag run`` does at a state it is told to leave) is looked at again;
held through :data:`TAKEN_LOOKS` looks in a row, another daemon is at work on this inbox or
state: the daemon says so as an error and drains (no more claims; writes in flight finish),
leaving the inbox to the other rather than sending rows beside it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from .._exceptions import ResultStoreError, StateError, StateInUseError
from .._postgres import is_postgres_url
from ..engine.outfiles import identities, keep_fresh, keep_held, keep_lock_file, sqlite_files

__all__ = ["TAKEN_LOOKS", "HeldLock", "KeptLocks", "kept_store"]

logger = logging.getLogger("fashiontag_pipeline.daemon")

#: Looks in a row a lock made again must be held by another process before the daemon drains.
TAKEN_LOOKS = 3


class Kept(Protocol):
    def keep_lock(self) -> None: ...


class HeldLock:
    """A lock file held at ``path`` as ``fd`` (locked by ``lock``), kept by :meth:`keep_lock`
    with the files ``beside`` it the daemon reads at its next start (kept from a cleanup by
    age: :func:`~..engine.outfiles.keep_fresh`); :meth:`close` releases the descriptor."""

    def __init__(
        self, path: Path, fd: int, lock: Callable[[int], None], beside: tuple[Path, ...] = ()
    ) -> None:
        self.path, self.fd, self._lock, self.beside = path, fd, lock, beside

    def keep_lock(self) -> None:
        self.fd = keep_lock_file(self.fd, self.path, self._lock)
        keep_fresh(*self.beside)

    def close(self) -> None:
        os.close(self.fd)


class KeptFresh:
    """A SQLite file a daemon holds for weeks with no lock of its own (its ``--reuse`` store),
    its ``-wal`` and ``-shm`` beside the file it leads to: touched at each look once old
    (:func:`~..engine.outfiles.keep_fresh`). An idle daemon, or one storing a few results a
    day (the WAL is copied into the file every 4 MiB), wrote none of them for weeks: a
    retention cleanup took the store, and the next start made an empty one (every image
    tagged, and billed, again)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.files = sqlite_files(Path(os.path.realpath(path)))
        self._held = identities(*self.files)  # (as opened: one removed stops the daemon)

    def keep_lock(self) -> None:
        gone = keep_held(self._held, self.files)
        if gone is not None:
            raise ResultStoreError(
                f"result store {self.path}: {gone} was removed (or replaced) while the store"
                " was open; stopping before more results are stored into the removed file"
            )


def kept_store(location: str | Path | None) -> list[Kept]:
    """What keeps the ``--reuse`` store at ``location`` from a cleanup by age (a file's)."""
    if location is None or is_postgres_url(str(location)):
        return []
    return [KeptFresh(Path(location))]


class KeptLocks:
    """The locks of one daemon (``stop``: its drain), kept by :meth:`keep` in a worker thread
    at each look; :meth:`react` (on the event loop) drains when one is another's."""

    def __init__(self, stop: Callable[[], None], *held: Kept) -> None:
        self.stop = stop
        self.held = list(held)
        self._taken_looks = 0
        self._said: str | None = None
        self._drained = False
        #: Why the daemon drains: a lock made again held by another process for a few looks.
        self.taken: str | None = None
        #: Why the daemon stops (exit 1): its state file or result store removed under it.
        self.gone: StateError | ResultStoreError | None = None

    def keep(self) -> None:
        taken = trouble = None
        for held in self.held:
            try:
                held.keep_lock()
            except StateInUseError as err:
                taken = str(err)
            except (StateError, ResultStoreError) as err:  # (a file removed under it)
                self.gone = self.gone or err
            except OSError as err:  # (the folder removed, a read-only mount: said once)
                trouble = f"{getattr(held, 'path', 'the state')}: {err.strerror or err}"
        if trouble is not None and trouble != self._said:
            logger.warning("cannot keep the daemon's lock file (tried again): %s", trouble)
        self._said = trouble
        self._taken_looks = self._taken_looks + 1 if taken is not None else 0
        if self._taken_looks >= TAKEN_LOOKS:
            self.taken = taken

    def react(self) -> None:
        if self.taken is not None and not self._drained:
            self._drained = True
            logger.error(
                "the daemon's lock file was removed and another process now holds the one at"
                " its path (%s): another daemon is at work beside this one; draining (no more"
                " claims), leaving the work to it",
                self.taken,
            )
            self.stop()
