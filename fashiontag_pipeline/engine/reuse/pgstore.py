"""The result store of ``--reuse`` in PostgreSQL (``--reuse postgresql://...``).

The same store as :class:`~.store.ResultStore` (the SQLite file), in two tables of the URL's
schema, created by the package's migrations (:mod:`fashiontag_pipeline._postgres`, version 4)::

    reuse_results(fp bytea PRIMARY KEY, task_id, stored_at, result bytea)
    reuse_runs(run_id, started_at, finished_at, looked_up, reused, stored)

Several daemons (or runs on several machines) share it: a result stored by one answers the
others' rows. A lookup is one ``= ANY(array)`` query per batch, a page's results one
``unnest`` insert (the last result of a fingerprint wins, as in the file). Two connections,
as the file has: lookups never wait on a commit. Errors become
:class:`~fashiontag_pipeline.ResultStoreError` naming the URL without its password.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from ... import _exceptions as exc
from ..._postgres import SCHEMA_VERSION, migrate, redact_url, schema_version, scrub, url_problem
from .store import LOOKUP_BATCH, StoreConnections, StoredResult, StoreStats, last_run_of

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresResultStore"]

_PRUNE_BATCH = 10_000
#: Seconds to connect again once the server closed a connection (:func:`_again`).
_CONNECT_TIMEOUT = 10

_P = ParamSpec("_P")
_T = TypeVar("_T")


def _again(
    method: Callable[Concatenate[PostgresResultStore, _P], _T],
) -> Callable[Concatenate[PostgresResultStore, _P], _T]:
    """A call that met a connection the server had closed is made once more on a connection
    opened again: every call is idempotent (lookups and figures read; a put replaces; a prune
    deletes what is old) or harmless twice (``record_run``: one more line of history). Only
    the failure's path pays for it."""

    def call(store: PostgresResultStore, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return method(store, *args, **kwargs)
        except exc.ResultStoreError:
            if not store._reopen_broken():
                raise
        return method(store, *args, **kwargs)

    functools.update_wrapper(call, method)
    return call


#: Times a write aborted by a deadlock with another writer is tried again.
_DEADLOCK_RETRIES = 3


class PostgresResultStore(StoreConnections):
    """A result store in PostgreSQL; see the module docstring. Use :meth:`open`."""

    _reader: psycopg.Connection[Any]
    _writer: psycopg.Connection[Any]

    def __init__(
        self,
        url: str,
        reader: psycopg.Connection[Any],
        writer: psycopg.Connection[Any],
        *,
        created: bool,
    ) -> None:
        #: Where the store is, as messages show it (the URL without its password).
        self.path = redact_url(url)
        self._url = url
        self._reader = reader
        self._writer = writer
        #: True when no run had used the store before (it holds nothing).
        self.created = created
        self._closed = False

    def __repr__(self) -> str:
        return f"PostgresResultStore({self.path!r})"

    @classmethod
    def open(
        cls, url: str, *, create: bool = True, connect_timeout: float = 10.0
    ) -> PostgresResultStore:
        """Open the store in the database ``url`` names (its tables are created or migrated).

        ``created`` says when it holds nothing yet (no result, no run); with ``create=False``
        that is an error (``reuse stats`` of a database no run has used)."""
        import psycopg

        conninfo = url.partition("#")[0]
        where = redact_url(conninfo)
        problem = url_problem(conninfo)
        if problem is not None:
            raise exc.ResultStoreError(f"result store {where} cannot be used: {problem}")
        opened: list[psycopg.Connection[Any]] = []
        try:
            for _ in range(2):
                opened.append(
                    psycopg.connect(
                        conninfo, autocommit=True, connect_timeout=max(1, round(connect_timeout))
                    )
                )
            writer, reader = opened
            # Without ``create`` (``reuse stats|prune``) a database no run has used is told so
            # before anything is written: reading figures must not create the schema.
            row = writer.execute("SELECT to_regclass('reuse_results') IS NULL").fetchone()
            created = bool(row and row[0])
            # Reading a store whose schema is current needs no migration: a role that may only
            # read (a monitoring job's ``reuse stats``) was refused the migration's DDL.
            if create or (not created and schema_version(writer) != SCHEMA_VERSION):
                migrate(writer)
                row = writer.execute(
                    "SELECT NOT EXISTS (SELECT 1 FROM reuse_results)"
                    " AND NOT EXISTS (SELECT 1 FROM reuse_runs)"
                ).fetchone()
                created = bool(row and row[0])
            # A database that only reads (a hot standby after a failover, a role or database
            # with default_transaction_read_only): told now, before a row is sent, not at the
            # first page's results.
            row = writer.execute("SELECT current_setting('transaction_read_only')").fetchone()
            read_only = create and row == ("on",)
        except psycopg.Error as err:
            for conn in opened:
                conn.close()
            raise _error(where, err, conninfo) from None
        except BaseException:
            for conn in opened:
                conn.close()
            raise
        if read_only:
            for conn in opened:
                conn.close()
            raise exc.ResultStoreError(
                f"result store {where} cannot be used: its database is read-only (a hot standby,"
                " or default_transaction_read_only = on): give --reuse the primary's URL"
            )
        if created and not create:
            for conn in opened:
                conn.close()
            raise exc.ResultStoreError(
                f"result store {where} holds nothing yet: no run has used it (--reuse)"
            )
        return cls(conninfo, reader, writer, created=created)

    def _reopen_broken(self) -> bool:
        """Open again the connections the server closed (a restart, a failover, a killer of
        idle sessions); whether there was one. A long-lived engine (one daemon, its state in a
        file) keeps the store for its whole life: without this, one restart of the database
        stopped the daemon at its next lookup."""
        import psycopg

        broken = [c for c in (self._reader, self._writer) if c.broken]
        if not broken or self._closed:
            return False
        with self._errors():
            for conn in broken:
                fresh = psycopg.connect(
                    self._url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT
                )
                if conn is self._reader:
                    self._reader = fresh
                else:
                    self._writer = fresh
        return True

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        import psycopg

        try:
            yield
        except psycopg.Error as err:
            raise _error(self.path, err, self._url) from None

    # -------------------------------------------------------------- the engine's calls

    @_again
    def lookup(self, fps: Sequence[bytes], *, newer_than: float) -> dict[bytes, StoredResult]:
        """The stored results of ``fps`` stored at or after ``newer_than`` (epoch seconds)."""
        found: dict[bytes, StoredResult] = {}
        unique = list(dict.fromkeys(fps))
        with self._errors():
            for start in range(0, len(unique), LOOKUP_BATCH):
                part = unique[start : start + LOOKUP_BATCH]
                for fp, task_id, result in self._reader.execute(
                    "SELECT fp, task_id, result FROM reuse_results"
                    " WHERE fp = ANY(%s::bytea[]) AND stored_at >= %s",
                    (part, newer_than),
                ):
                    found[bytes(fp)] = StoredResult(task_id, bytes(result))
        return found

    @_again
    def put(self, rows: Iterable[tuple[bytes, str, bytes]], *, stored_at: float) -> int:
        """Store ``(fp, task_id, raw result)`` rows, replacing older results of the same
        fingerprints (within the batch, the last one); one statement. Returns the rows.

        The rows are written in fingerprint order, so that two runs storing results of the
        same fingerprints at once (two catalogues listing the same products in another order)
        lock them in the same order: in their own orders each could hold a row the other
        waits for, and PostgreSQL would abort one of them (``deadlock detected``), stopping
        its run. A deadlock with another writer all the same (``reuse prune`` deletes in
        ``stored_at`` order) is retried: the statement is idempotent."""
        latest: dict[bytes, tuple[str, bytes]] = {}
        for fp, task_id, result in rows:
            latest[fp] = (task_id, bytes(result))
        if not latest:
            return 0
        fps = sorted(latest)
        params = (
            stored_at,
            fps,
            [latest[fp][0] for fp in fps],
            [latest[fp][1] for fp in fps],
        )
        with self._errors():
            self._deadlock_retried(
                "INSERT INTO reuse_results (fp, task_id, stored_at, result)"
                " SELECT fp, task_id, %s, result FROM unnest(%s::bytea[], %s::text[],"
                " %s::bytea[]) WITH ORDINALITY AS r(fp, task_id, result, n) ORDER BY n"
                " ON CONFLICT (fp) DO UPDATE SET task_id = excluded.task_id,"
                " stored_at = excluded.stored_at, result = excluded.result",
                params,
            )
        return len(latest)

    def _deadlock_retried(self, sql: str, params: Sequence[Any]) -> psycopg.Cursor[Any]:
        """``sql`` run on the writer (autocommit: one transaction), run again when PostgreSQL
        aborts it on a deadlock with another writer, up to :data:`_DEADLOCK_RETRIES` times
        (each statement so run is idempotent: :meth:`put`'s upsert, a batch of :meth:`prune`)."""
        import psycopg

        retries = 0
        while True:
            try:
                return self._writer.execute(sql, params)
            except psycopg.errors.DeadlockDetected:
                retries += 1
                if retries > _DEADLOCK_RETRIES:
                    raise

    @_again
    def record_run(
        self, *, started_at: float, finished_at: float, looked_up: int, reused: int, stored: int
    ) -> None:
        """Record what a run did with the store (``reuse stats`` shows the last one)."""
        with self._errors():
            self._writer.execute(
                "INSERT INTO reuse_runs (started_at, finished_at, looked_up, reused, stored)"
                " VALUES (%s, %s, %s, %s, %s)",
                (started_at, finished_at, looked_up, reused, stored),
            )

    # -------------------------------------------------------------- operators' calls

    @_again
    def stats(self) -> StoreStats:
        """Rows, size on disk (the table, its index and TOAST), oldest/newest, the last run."""
        db = self._writer
        with self._errors():
            row = db.execute(
                "SELECT count(*), min(stored_at), max(stored_at),"
                " pg_total_relation_size('reuse_results') FROM reuse_results"
            ).fetchone()
            last = db.execute(
                "SELECT started_at, finished_at, looked_up, reused, stored FROM reuse_runs"
                " ORDER BY run_id DESC LIMIT 1"
            ).fetchone()
        assert row is not None
        rows, oldest, newest, size = row
        return StoreStats(
            path=self.path,
            rows=int(rows),
            size_bytes=int(size),
            oldest=oldest,
            newest=newest,
            last_run=last_run_of(last),
        )

    @_again
    def prune(self, older_than: float, *, now: Any = None) -> int:
        """Delete results stored more than ``older_than`` seconds ago, in bounded
        transactions; returns how many.

        ``stored_at`` is tested again on the row deleted, not only in the batch's choice: a
        run storing that fingerprint's result again meanwhile (its old result was past the
        run's ``--reuse-max-age``, so it re-tagged the row) holds the row until it commits,
        and the delete then reads the row as committed. Chosen by its old age alone, the
        result paid for that night was deleted and the row billed again the next. A batch
        aborted by a deadlock with such a run (it locks rows in fingerprint order, the prune
        in ``stored_at`` order) is tried again, as the run's :meth:`put` is: a cron job's
        prune no longer fails on it."""
        import time

        cutoff = (now or time.time)() - older_than
        deleted = 0
        with self._errors():
            while True:
                cur = self._deadlock_retried(  # (retries counted per batch)
                    "DELETE FROM reuse_results WHERE fp IN (SELECT fp FROM reuse_results"
                    " WHERE stored_at < %s ORDER BY stored_at LIMIT %s) AND stored_at < %s",
                    (cutoff, _PRUNE_BATCH, cutoff),
                )
                deleted += cur.rowcount
                if cur.rowcount == 0:  # (a batch may delete fewer: rows stored again)
                    break
        return deleted


def _error(where: str, err: BaseException, url: str) -> exc.ResultStoreError:
    import psycopg

    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    # The database not reached, or the connection lost: an outage, not the store's fault.
    kind = exc.ResultStoreUnavailable if isinstance(err, psycopg.OperationalError) else None
    return (kind or exc.ResultStoreError)(
        f"result store {where} cannot be used: {scrub(reason, url)}"
    )
