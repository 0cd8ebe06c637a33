"""The state in PostgreSQL (``--state postgresql://...``): one schema of the database per state.

:class:`PostgresStateDB` runs the queries of :class:`~.store.StateStore` on one connection of
its own (the journal's thread), with the tables of :mod:`.schema` in a schema named after the
state: ``fashiontag_<name>`` beside ``public``, or ``<schema>_ft_<name>`` beside another
schema the URL's ``search_path`` names first. ``fashiontag run`` uses the state ``run`` (a URL
fragment names another: ``postgresql://host/db#nightly``); the daemon one state per manifest
(``claim_<id>``). The database's ``states`` table lists them with the version of their tables,
so a later version of this package migrates them on open.

Two ways to hold a state, as the SQLite file's lock does:

* **alone** (``fashiontag run``): a session advisory lock, released by the server when the
  process dies (kill -9 leaves no stale lock), and unlocked before a close. The server frees a
  closed session's lock when its backend has ended, a moment later (more on a loaded
  machine): a lock held is tried again for :data:`LOCK_GRACE` seconds before the state is
  called in use;
* **fenced** (the daemons: ``fence``): every write transaction starts with the caller's fence
  (the manifest's lease: owner, epoch, expiry in database time, its row locked until the
  commit), so a daemon that lost its lease writes nothing more, sink bytes included: the
  journal begins the transaction before it writes them. A transaction left idle for a lease
  length (a paused process) is ended by the server, which releases the lease's row.

Driver errors become :class:`~fashiontag_pipeline.StateError` naming the redacted URL; a
connection lost (a server restart) fails the engine like a crash does, and the state is
consistent at its last commit: the next open resumes from there.
"""

from __future__ import annotations

import contextlib
import functools
import re
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ... import _exceptions as exc
from ..._postgres import check_url, migrate, redact_url, state_errors
from .pgtables import TABLES_DDL
from .store import StateStore

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "STATE_VERSION",
    "PostgresStateDB",
    "drop_state",
    "split_state_url",
    "state_schema",
]

#: The newest version of a state schema's tables (``states.version``) this build reads: 2 is
#: 1 holding the reject of an id too long to key (see ``schema.STATE_FILE_VERSION``).
STATE_VERSION = 2
_STATE_BASE = 1

_NAME = re.compile(r"[a-z0-9_]{1,40}")
#: Seconds a state's lock held by another session is tried again before the state is called in
#: use (the session of a run that has just ended, or been killed, whose backend is ending).
LOCK_GRACE = 2.0
#: Seconds after which a write transaction reads the database's clock again (:meth:`wall`): a
#: machine without NTP has a monotonic clock that drifts too (0.1 s an hour at 30 ppm).
WALL_READ_AGAIN = 60.0
#: A constant: the advisory lock (with the state's schema) that serializes creating a state.
_CREATE_LOCK = 0x66747374  # "ftst"
#: The meta key of the run holding the state alone (a token of its own, written as it opens):
#: a session the server ended took the lock with it, and another run may have held the state
#: meanwhile; the lock taken again, a token not its own says so.
_HOLDER = "holder"


def split_state_url(url: str) -> tuple[str, str]:
    """(the URL to connect to, the state's name): ``#name`` names the state (``run`` without)."""
    base, _, fragment = url.partition("#")
    check_url(base)
    name = fragment or "run"
    if not _NAME.fullmatch(name):
        plain = "@" not in name and ":" not in name and "password=" not in base
        shown = name if len(name) <= 40 and plain else "..."  # (not a password's tail)
        raise exc.StateError(
            f"PostgreSQL state {redact_url(base)}: the state name {shown!r} (after #) must be 1 "
            "to 40 lowercase letters, digits or underscores"
        )
    return base, name


def state_schema(base: str, name: str) -> str:
    """The schema that holds the state ``name`` beside the schema ``base`` (refused when
    longer than PostgreSQL's 63-byte names: it would be cut, and two states could meet)."""
    schema = f"fashiontag_{name}" if base == "public" else f"{base}_ft_{name}"
    if len(schema.encode()) > 63:
        raise exc.StateError(
            f"the state {name!r} beside schema {base!r} needs a schema name longer than "
            "PostgreSQL's 63 bytes: give a shorter state name (#name)"
        )
    return schema


@functools.lru_cache(maxsize=512)
def _dialect(sql: str) -> str:
    """SQLite's ``?`` placeholders as psycopg's ``%s`` (the state's SQL has no literal ``?``
    or ``%``)."""
    return sql.replace("%", "%%").replace("?", "%s")


class _Connection:
    """The part of :class:`sqlite3.Connection` the state's queries use, on a psycopg
    connection in autocommit mode (transactions are explicit ``BEGIN``/``COMMIT``, as in the
    SQLite store). Driver errors become :class:`StateError` naming the redacted URL."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        url: str,
        reopen: Callable[[], psycopg.Connection[Any]] | None = None,
    ) -> None:
        self.conn = conn
        self._url = url
        self._reopen = reopen

    def execute(self, sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        idle = self.conn.info.transaction_status == 0  # (pq.TransactionStatus.IDLE)
        try:
            with state_errors(self._url, "write the state"):
                return self.conn.execute(_dialect(sql), params)
        except exc.StateError:
            # The server ended the session while it sat idle between transactions (an
            # idle_session_timeout, a killer of idle sessions, a restart): each transaction
            # was committed or rolled back by then, and a BEGIN or a read outside one is
            # made again on a new session; anything else stops, as it did.
            harmless = sql == "BEGIN" or sql.lstrip()[:6].upper() == "SELECT"
            if not (idle and harmless and self.conn.broken and self._reopen is not None):
                raise
        self.conn = self._reopen()
        with state_errors(self._url, "write the state"):
            return self.conn.execute(_dialect(sql), params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> psycopg.Cursor[Any]:
        with state_errors(self._url, "write the state"):
            cur = self.conn.cursor()
            cur.executemany(_dialect(sql), rows)
            return cur


class PostgresStateDB(StateStore):
    """A state in a schema of a PostgreSQL database (see the module docstring).

    ``fence``: called with the connection first in every write transaction (the daemon's
    lease check, raising :class:`LeaseLostError`); without it the state is held alone with an
    advisory lock (:class:`StateConflictError` when another process holds it). ``idle_timeout``
    (seconds): the server ends a transaction idle that long (the lease length).
    """

    #: Version 1 tables keep no ids beside a chunk's body: a task's sent ids come from bodies.
    chunk_ids = False
    _VERSION_SET = "UPDATE states SET version = {} WHERE name = current_schema()"
    LONG_IDS_MARK = _VERSION_SET.format(STATE_VERSION)
    LONG_IDS_CLEAR = _VERSION_SET.format(_STATE_BASE)

    def __init__(
        self,
        url: str,
        *,
        fence: Callable[[psycopg.Connection[Any]], None] | None = None,
        idle_timeout: float | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        import psycopg

        conninfo, self.name = split_state_url(url)
        if fence is None and self.name.startswith("claim_"):
            raise exc.StateError(
                f"PostgreSQL state {redact_url(conninfo)}: state names claim_* belong to the "
                "daemons' manifests: give this run another name (#name)"
            )
        self._url = conninfo
        self.location = f"{redact_url(conninfo)}#{self.name}"
        self.where = f"PostgreSQL state {self.location}"
        self._fence = fence
        self._closed = False
        self._alone = False  # (the advisory lock taken: unlocked at close)
        self._idle_timeout = idle_timeout
        self._holder = secrets.token_hex(8)
        with state_errors(conninfo, "cannot open", exc.StateUnavailable):  # (not the state's)
            conn = psycopg.connect(
                conninfo, autocommit=True, connect_timeout=max(1, round(connect_timeout))
            )
        try:
            with state_errors(conninfo, "cannot open"):
                if idle_timeout is not None:
                    conn.execute(
                        "SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                        (f"{max(1, round(idle_timeout * 1000))}ms",),
                    )
                migrate(conn)
                self._wall_at, self._wall_read = _database_time(conn), time.monotonic()
                row = conn.execute("SELECT current_schema()").fetchone()
                if row is None or row[0] is None:
                    raise exc.StateError(
                        f"{self.where}: no schema of the search_path exists to hold the state"
                    )
                self.base = str(row[0])
                self.schema = state_schema(self.base, self.name)
                if fence is None:
                    self._lock_alone(conn)
                self._create(conn)
                if fence is None:
                    self._hold(conn)
        except BaseException:
            conn.close()
            raise
        self.db = _Connection(conn, conninfo, self._reopen)

    def __repr__(self) -> str:
        return f"PostgresStateDB({self.where!r})"

    #: The database's clock: machines sharing the state (a run resumed on another, a daemon's
    #: manifest taken over) have wall clocks seconds to hours apart (a VM without NTP).
    shared_clock = True

    def wall(self) -> float:
        """The database's time now, Unix seconds: read at open, gone on by this process's
        monotonic clock (a step of our wall clock meanwhile does not move it; up to the
        round trip of that read ahead: a create taken for younger, looked for that longer)."""
        return self._wall_at + time.monotonic()

    def _lock_alone(self, conn: psycopg.Connection[Any]) -> None:
        deadline = time.monotonic() + LOCK_GRACE
        pause = 0.05
        while True:
            row = conn.execute(
                "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (self.schema,)
            ).fetchone()
            if row is not None and row[0]:
                self._alone = True
                return
            if time.monotonic() + pause > deadline:
                break
            time.sleep(pause)  # (blocking, at most LOCK_GRACE, once: as a run opens its state)
            pause = min(pause * 2, 0.4)
        raise exc.StateInUseError(
            f"{self.where} is in use by another run (it holds the state's lock); wait for "
            "that run to end, or give this one another state (#name)"
        )

    def _hold(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            "INSERT INTO meta VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = %s",
            (_HOLDER, self._holder, self._holder),
        )

    def _wipe(self) -> None:
        super()._wipe()
        if self._alone:  # (its token went with the meta table's rows)
            with state_errors(self._url, "write the state"):
                self._hold(self.db.conn)

    def _create(self, conn: psycopg.Connection[Any]) -> None:
        """Create the state's schema and tables once (under a lock), or check their version;
        then point the connection at them."""
        from psycopg import sql

        schema = sql.Identifier(self.schema)
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_CREATE_LOCK,))
            row = conn.execute(
                "SELECT version FROM states WHERE name = %s", (self.schema,)
            ).fetchone()
            if row is not None and int(row[0]) > STATE_VERSION:
                raise exc.SchemaTooNewError(
                    f"{self.where} has tables of version {row[0]}; this fashiontag knows up to "
                    f"{STATE_VERSION}: upgrade fashiontag"
                )
            if row is None:
                conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
                conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(schema))
                for ddl in TABLES_DDL:
                    conn.execute(ddl)
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {}.states (name, schema_name, version) VALUES (%s, %s, %s)"
                    ).format(sql.Identifier(self.base)),
                    (self.schema, self.schema, _STATE_BASE),
                )
            else:
                _add_written_at(conn, self.schema)
        conn.execute(sql.SQL("SET search_path TO {}, {}").format(schema, sql.Identifier(self.base)))

    # ------------------------------------------------------------------ transactions

    def begin(self) -> None:
        self.db.execute("BEGIN")
        if time.monotonic() - self._wall_read >= WALL_READ_AGAIN:
            try:
                self._wall_at, self._wall_read = _database_time(self.db), time.monotonic()
            except BaseException:
                self.rollback()
                raise
        if self._fence is not None:
            try:
                with state_errors(self._url, "check the lease"):
                    self._fence(self.db.conn)
            except BaseException:
                self.rollback()
                raise

    def _reopen(self) -> psycopg.Connection[Any]:
        """A new session in place of a broken one, set up as the first was (idle timeout,
        search_path, and the state's lock when held: refused if another run took it)."""
        import psycopg
        from psycopg import sql

        self.db.conn.close()
        with state_errors(self._url, "connect again"):
            conn = psycopg.connect(self._url, autocommit=True, connect_timeout=10)
        try:
            with state_errors(self._url, "connect again"):
                if self._idle_timeout is not None:
                    conn.execute(
                        "SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                        (f"{max(1, round(self._idle_timeout * 1000))}ms",),
                    )
                if self._alone:
                    self._lock_alone(conn)
                conn.execute(
                    sql.SQL("SET search_path TO {}, {}").format(
                        sql.Identifier(self.schema), sql.Identifier(self.base)
                    )
                )
                held = self._alone and conn.execute(
                    "SELECT value FROM meta WHERE key = %s", (_HOLDER,)
                ).fetchone() != (self._holder,)
            if held:  # (what it holds in memory is not the state's any more)
                raise exc.StateError(
                    f"{self.where} was opened by another run while the server had ended this"
                    " run's session (its lock went with it): this run stops, writing nothing"
                    " more; the same command resumes once no other run holds the state"
                )
        except BaseException:
            conn.close()
            raise
        return conn

    def rollback(self) -> None:
        if self.db.conn.closed:
            return  # the transaction went with the connection
        # A connection that broke meanwhile: the server rolled the transaction back.
        with contextlib.suppress(exc.StateError):
            self.db.execute("ROLLBACK")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the connection (idempotent); the advisory lock is unlocked first, so that a
        run that starts as this one ends finds it free (the server frees a closed session's
        lock only once its backend has ended)."""
        if self._closed:
            return
        self._closed = True
        if self._alone:
            with contextlib.suppress(Exception):  # a broken connection: the lock goes with it
                self.db.conn.execute(
                    "SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (self.schema,)
                )
        self.db.conn.close()

    def _insert_new_ids(self, first: dict[str, int]) -> int:
        with state_errors(self._url, "write the state"):
            cur = self.db.conn.execute(
                # Binary arrays (%b): the text form quotes each id in Python, ~1 us more per id.
                "INSERT INTO ids SELECT * FROM unnest(%b::text[], %b::bigint[])"
                " ON CONFLICT DO NOTHING",
                (list(first), list(first.values())),
            )
        return int(cur.rowcount)


def _database_time(conn: psycopg.Connection[Any] | _Connection) -> float:
    """The database's clock less our monotonic clock from before it was read (seconds)."""
    began = time.monotonic()
    row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert row is not None
    return float(row[0]) - began


def _add_written_at(conn: psycopg.Connection[Any], schema: str) -> None:
    """``chunks.written_at`` and ``service_at`` in a state made before them (NULL: unknown).
    Nullable, and left unset by older builds: not a new version of the tables (which they
    would refuse)."""
    from psycopg import sql

    for column in ("written_at", "service_at"):
        if not conn.execute(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = %s"
            " AND table_name = 'chunks' AND column_name = %s",
            (schema, column),
        ).fetchone():
            alter = "ALTER TABLE {}.chunks ADD COLUMN IF NOT EXISTS {} double precision"
            conn.execute(sql.SQL(alter).format(sql.Identifier(schema), sql.Identifier(column)))


def drop_state(url: str, *, idle_timeout: float | None = None) -> None:
    """Delete the state ``url`` names (``#name``) from the database: its schema and its entry
    in ``states``. Nothing happens when it does not exist.

    ``idle_timeout`` (seconds; the daemons give their lease): the server ends the transaction
    when it is left idle that long. Dropping the schema locks every table of the state until
    the commit, and another daemon drops the states of settled manifests too: a daemon paused
    in between (SIGSTOP, a stalled VM) would otherwise hold that one up for as long as it is
    paused."""
    import psycopg
    from psycopg import sql

    conninfo, name = split_state_url(url)
    with (
        state_errors(conninfo, "drop a state"),
        psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn,
    ):
        if idle_timeout is not None:
            conn.execute(
                "SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                (f"{max(1, round(idle_timeout * 1000))}ms",),
            )
        row = conn.execute("SELECT current_schema()").fetchone()
        if row is None or row[0] is None:
            return
        schema = state_schema(str(row[0]), name)
        with conn.transaction():
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
            conn.execute("DELETE FROM states WHERE name = %s", (schema,))
