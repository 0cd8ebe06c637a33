"""Which state store the manifests in ``INBOX/.work`` are in flight in.

A daemon with a SQLite state writes its state file's path to ``INBOX/.fashiontag-daemon.state``
at each start. A daemon restarted with another ``--state`` (a SQLite file elsewhere, or a
PostgreSQL URL) knows no claim of the files in ``.work``: it took them for the claims of a lost
ledger and tagged every row again, although the rows had been sent (and billed) from the first
state, whose tasks the service was still tagging. Such a start is refused (exit 2) while that
first state still holds one of them in flight, naming it; started with it, the daemon finishes
them, and ``--state`` can be changed once nothing is in flight. A daemon with a PostgreSQL state
notes that (:data:`_POSTGRES`), and which state it is (never its URL, which may hold a
password: a digest kept by a failover or another spelling of the URL, and the database's and
schema's names): a SQLite daemon, or one of another PostgreSQL state, started after it while
``.work`` holds files its own state does not hold in flight, is refused the same way.

The note itself stays as builds before 2026-11-28 read it (``postgresql`` alone): a package
rolled back to one of them reads it whole, and a note with more lines was taken for the path of
a state file that is not there, nothing in flight, every row sent (and billed) again. The
digest and names are in :data:`PG_MARK` beside it, read only while the note is this build's
(``postgresql`` and a newline; an older build writes it without one).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import urllib.parse
from collections.abc import Callable, Collection
from pathlib import Path

from .._exceptions import StateConflictError
from .._postgres import is_postgres_url
from ..engine.outfiles import lock_exclusively, lock_file
from ._files import write_atomic
from .lockkeep import HeldLock
from .names import STATE_MARK

__all__ = [
    "PG_MARK",
    "STATE_MARK",
    "check_state_moved",
    "held_inbox",
    "lock_watched",
    "watched_shared",
]

#: Which PostgreSQL state the note's ``postgresql`` is: its digest and names to show, a line each.
PG_MARK = ".fashiontag-daemon.pgstate"
_WORK = ".work"
_INBOX_LOCK = ".fashiontag-daemon.lock"
#: The note of a PostgreSQL state (not its URL, which may hold a password); this build ends it
#: with a newline (older ones wrote it alone; one build of 2026-11-28, the digest and names too).
_POSTGRES = "postgresql"


def _postgres_note(inbox: Path, before: str) -> tuple[str, str] | None:
    """A PostgreSQL state's note read (``before``: the note as written): (digest, names shown),
    empty when an older build wrote it; None for a SQLite state's."""
    lines = before.splitlines()
    if not lines or lines[0].strip() != _POSTGRES:
        return None
    if len(lines) >= 3:
        return lines[1], lines[2]
    if before != f"{_POSTGRES}\n":
        return "", ""
    try:
        beside = (inbox / PG_MARK).read_text(errors="replace").splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return "", ""
    return (beside[0], beside[1]) if len(beside) >= 2 else ("", "")


def _in_flight_in(state: Path, work: Path) -> list[str]:
    """The files in ``work`` the SQLite state ``state`` holds in flight (same name and size);
    none when it cannot be read (gone, not a state): nothing to protect then."""
    uri = f"file:{urllib.parse.quote(os.fspath(state))}?mode=ro"
    try:
        db = sqlite3.connect(uri, uri=True)
    except sqlite3.Error:
        return []
    try:
        rows = db.execute("SELECT name, size FROM claims WHERE status = 'claimed'").fetchall()
    except sqlite3.Error:
        return []
    finally:
        db.close()
    names = []
    for name, size in rows:
        try:
            if (work / name).stat().st_size == size:
                names.append(str(name))
        except (OSError, ValueError):
            continue
    return sorted(set(names))


def _same_file(state: str | Path, before: str) -> bool:
    """Whether ``state`` is the state file noted as ``before``: the same path, or the same
    file through a symlink or another mount of its folder."""
    if os.path.abspath(state) == os.path.abspath(before):
        return True
    try:
        return os.path.samefile(state, before)
    except (OSError, ValueError):  # (either not there: another file, or none yet)
        return False


def check_state_moved(inbox: Path, state: str | Path) -> None:
    """Refuse a start on ``state`` while the state the inbox was last watched with holds one
    of the files in ``.work`` in flight (see the module docstring)."""
    try:
        before = os.fsdecode((inbox / STATE_MARK).read_bytes()).strip()
    except (FileNotFoundError, NotADirectoryError):
        return
    if not before or (not is_postgres_url(str(state)) and _same_file(state, before)):
        return
    if _postgres_note(inbox, before) is not None:
        if not is_postgres_url(str(state)):
            _refuse_after_postgres(inbox, Path(state))
        return
    names = _in_flight_in(Path(before), inbox / _WORK)
    if not names:
        return
    shown = _shown(names)
    raise StateConflictError(
        f"{inbox / _WORK} holds manifests in flight in the state file {before} ({shown}):"
        f" their rows were sent from it, and another --state would send (and bill) them"
        f" again; start the daemon with --state {before} to finish them, then change --state"
        " (only if their tasks are gone for good, move them back into the inbox: every row is"
        " tagged again)"
    )


def _shown(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _refuse_after_postgres(inbox: Path, state: Path) -> None:
    """Refuse a start on the SQLite ``state`` after a daemon on a PostgreSQL state while
    ``.work`` holds files ``state`` does not hold in flight: that state's, whose rows it sent."""
    work = inbox / _WORK
    names = sorted(_visible(work) - set(_in_flight_in(state, work)))
    if not names:
        return
    raise StateConflictError(
        f"{work} holds manifests in flight in the PostgreSQL state the daemon was last started"
        f" with ({_shown(names)}): their rows were sent from it, and the SQLite state {state}"
        " would send (and bill) them again; start the daemon with that --state to finish them,"
        " then change --state (only if their tasks are gone for good, move them back into the"
        " inbox: every row is tagged again)"
    )


def _visible(work: Path) -> set[str]:
    """The manifests in ``work`` (none when it is not there)."""
    try:
        with os.scandir(work) as entries:
            return {e.name for e in entries if e.is_file() and not e.name.startswith(".")}
    except (FileNotFoundError, NotADirectoryError):
        return set()


def lock_inbox(inbox: Path) -> int:
    """An exclusive lock on ``INBOX/.fashiontag-daemon.lock`` while a daemon with a SQLite
    state watches the inbox: two of them (each given its own ``--state``) would both resume
    the manifests in flight and tag them twice. Several daemons share an inbox only with a
    shared PostgreSQL state."""
    return lock_file(inbox / _INBOX_LOCK, _inbox_locker(inbox))


def _inbox_locker(inbox: Path) -> Callable[[int], None]:
    refusal = (
        f"inbox {inbox} is watched by another daemon (it holds {inbox}/{_INBOX_LOCK}):"
        " several daemons share an inbox only with a PostgreSQL --state"
    )
    return lambda fd: lock_exclusively(fd, refusal)


def held_inbox(inbox: Path, fd: int) -> HeldLock:
    """The inbox's lock ``fd`` (:func:`lock_watched`'s), to keep while the daemon runs (with
    the note of its state, kept from a cleanup by age)."""
    return HeldLock(inbox / _INBOX_LOCK, fd, _inbox_locker(inbox), (inbox / STATE_MARK,))


def lock_watched(inbox: Path, state: str | Path) -> int:
    """:func:`lock_inbox` for a daemon with the SQLite ``state``, refused if the files
    in ``.work`` are in flight in another state; the state is noted for the next start (best
    effort: it only guards that start)."""
    fd = lock_inbox(inbox)
    try:
        check_state_moved(inbox, state)
    except BaseException:
        os.close(fd)
        raise
    with contextlib.suppress(OSError):
        write_atomic(inbox / STATE_MARK, os.fsencode(os.path.abspath(state)))
    return fd


def watched_shared(
    inbox: Path,
    state: str,
    identity: tuple[str, str] | None = None,
    held: Callable[[], Collection[str]] = frozenset,
) -> None:
    """:func:`check_state_moved` for a daemon on the PostgreSQL ``state`` (``identity``: its
    digest and names, :meth:`~.leases.PostgresClaimLedger.identity`; ``held``: the names it
    holds in flight); passed, the note is replaced by this state's (the files this daemon
    claims into ``.work`` are not another state's, even under a name that one once held in
    flight: a daemon started after it on another state must not take them for its own).

    After a daemon of another PostgreSQL state (another database, a schema made again), the
    files in ``.work`` this one does not hold in flight were sent from that one: refused, as
    after a SQLite state. A note without a digest (an older build's) guards nothing here."""
    check_state_moved(inbox, state)
    try:
        before = (inbox / STATE_MARK).read_text(errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        before = ""
    noted = _postgres_note(inbox, before)
    if identity is not None and noted is not None and noted[0] and noted[0] != identity[0]:
        names = sorted(_visible(inbox / _WORK) - set(held()))
        if names:
            raise StateConflictError(
                f"{inbox / _WORK} holds manifests in flight in another PostgreSQL state than"
                f" --state ({noted[1]}; this one: {identity[1]}), the one the daemon was last"
                f" started with ({_shown(names)}): their rows were sent from it, and this state"
                " would send (and bill) them again; start the daemon with that --state to"
                " finish them, then change --state (only if their tasks are gone for good,"
                " move them back into the inbox: every row is tagged again)"
            )
    with contextlib.suppress(OSError):  # (no identity: the note with no digest, as before)
        if identity is not None:
            write_atomic(inbox / PG_MARK, f"{identity[0]}\n{identity[1]}\n".encode())
        write_atomic(inbox / STATE_MARK, _POSTGRES.encode() + b"\n" * (identity is not None))
