"""Several daemons, one PostgreSQL: the claim ledger there, and manifest leases.

:class:`PostgresClaimLedger` implements the :class:`~.ledger.ClaimLedger` protocol for several
daemons sharing one PostgreSQL, and adds manifest leases (DESIGN section 8): each claim in
flight is worked on by the daemon holding its :class:`Lease` (owner, expiry in database time,
epoch). A daemon takes leases with ``SELECT ... FOR UPDATE SKIP LOCKED`` (never the same
manifest as another), renews them at a third of their length (:class:`~.keeper.LeaseKeeper`),
and writes a manifest's state only inside a transaction that first passes :func:`fence`: once
the lease has ended or another daemon has taken it over (epoch + 1), the write is refused with
:class:`~fashiontag_pipeline.LeaseLostError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import socket
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from .._exceptions import LeaseLostError
from .lease_sql import ACQUIRE_SQL, FENCE_SQL, FREE, RELEASE_SQL, RENEW_SQL
from .ledger import ClaimRecord, ClaimStatus, SettledStatus

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "DEFAULT_LEASE",
    "Lease",
    "PostgresClaimLedger",
    "afence",
    "default_owner",
    "fence",
]

#: How long a manifest's lease lasts unless renewed (``--lease``), in seconds.
DEFAULT_LEASE = 30.0
#: How long a call waits for a connection to the database before it fails (a server down).
DEFAULT_CONNECT_TIMEOUT = 10.0


class Lease(msgspec.Struct, frozen=True, kw_only=True):
    """One daemon's right to work on one claimed manifest, until ``expires_at``.

    ``claim_id`` names the claim (a later file of the same name is another claim); ``epoch``
    grows by one each time the lease changes hands, so a write that checks it (:func:`fence`)
    is refused once another daemon has taken the manifest over. ``expires_at`` is the
    database's time (Unix seconds), shown for information: only the database decides expiry.
    """

    claim_id: int
    name: str
    sha256: str
    owner: str
    epoch: int
    expires_at: float


def _lease_params(lease: Lease) -> dict[str, object]:
    return {"id": lease.claim_id, "owner": lease.owner, "epoch": lease.epoch}


def _lease_lost(lease: Lease) -> LeaseLostError:
    return LeaseLostError(
        f"lost the lease of {lease.name!r} (epoch {lease.epoch}): it ended or another daemon "
        "took the manifest over; nothing was written",
        manifest=lease.name,
        epoch=lease.epoch,
    )


def fence(conn: psycopg.Connection[Any], lease: Lease) -> None:
    """Check, inside the caller's transaction, that ``lease`` still holds; raise
    :class:`LeaseLostError` if it does not (the caller's transaction must then roll back).

    Call it first in every transaction that writes a manifest's state: it locks the manifest's
    row (``FOR KEY SHARE``) until the transaction ends, so a takeover cannot slip in between
    the check and the commit; the taker sees this transaction's writes, or this one is refused.
    Renewals of the lease are not held up by it.
    """
    if conn.execute(FENCE_SQL, _lease_params(lease)).fetchone() is None:
        raise _lease_lost(lease)


async def afence(conn: psycopg.AsyncConnection[Any], lease: Lease) -> None:
    """:func:`fence` for a transaction on an async connection."""
    cursor = await conn.execute(FENCE_SQL, _lease_params(lease))
    if await cursor.fetchone() is None:
        raise _lease_lost(lease)


def default_owner() -> str:
    """A name for this process among the daemons sharing a database: host, pid and a random
    part (a restarted daemon on the same host and pid is a new owner)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class PostgresClaimLedger:
    """A :class:`ClaimLedger` in PostgreSQL, shared by several daemons, with manifest leases.

    The schema is created or migrated on opening (:func:`~fashiontag_pipeline._postgres.migrate`).
    Claims are recorded without an owner; a daemon takes work with :meth:`acquire` (a lease
    per manifest, ``SELECT ... FOR UPDATE SKIP LOCKED``: two daemons never get the same one),
    keeps it with :meth:`renew` (:class:`LeaseKeeper` does so in the background), and writes
    under :meth:`fenced` (or :func:`fence` in its own transaction). An expired lease is taken
    over by the next :meth:`acquire`, by any daemon, with the epoch one higher.

    Calls are synchronous (worker threads, like the SQLite ledger) and thread-safe (a pool of
    connections). A connection broken by a server restart is replaced on its next use; a call
    that meets a server that is down raises :class:`StateError` after ``connect_timeout``.
    """

    def __init__(
        self,
        url: str,
        *,
        owner: str | None = None,
        lease: float = DEFAULT_LEASE,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        max_connections: int = 4,
    ) -> None:
        import psycopg.conninfo
        import psycopg_pool

        from .. import _postgres

        if lease <= 0:
            raise ValueError("the lease must last more than 0 seconds")
        _postgres.check_url(url)
        with _postgres.state_errors(url, "cannot open"):
            # A URL libpq cannot read is refused here, its message scrubbed: the pool would log
            # that message (which may quote the password) at each try, then time out.
            psycopg.conninfo.conninfo_to_dict(url)
        self._url = url
        self.owner = owner or default_owner()
        self.lease = lease
        timeout = max(1, round(connect_timeout))
        self._pool = psycopg_pool.ConnectionPool(
            url,
            min_size=1,
            max_size=max_connections,
            open=False,
            timeout=connect_timeout,
            # A connection the pool failed to make is tried again after 1, 2, 4... s, up to
            # this long, and then given up: the next call makes a new one at once. Left at
            # its 5 minutes, an outage of N s (a failover) was followed by up to N s more
            # with the database back and no attempt made: nothing leased.
            reconnect_timeout=connect_timeout,
            check=psycopg_pool.ConnectionPool.check_connection,
            configure=self._configure,
            kwargs={"connect_timeout": timeout, "autocommit": False},
            name="fashiontag-state",
        )
        try:
            with _postgres.state_errors(url, "cannot open"):
                # The first connection is made here, not by the pool: a pool that cannot
                # connect retries until its timeout and then says only that, the reason
                # (a password refused, no server) left in its log lines.
                with psycopg.connect(url, connect_timeout=timeout) as conn:
                    _postgres.migrate(conn)
                self._pool.open(wait=True, timeout=connect_timeout)
        except BaseException:
            self._pool.close()
            raise

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        """Each new connection: a transaction left idle for a whole lease is ended by the
        server. A fenced transaction locks its manifest's row; without this, a daemon paused
        in the middle of one (SIGSTOP, a partition) would keep the row locked and its
        manifest could never be taken over. Its commit then fails: nothing of it is kept."""
        conn.execute(
            "SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
            (f"{max(1, round(self.lease * 1000))}ms",),
        )
        conn.commit()

    def __repr__(self) -> str:
        from .._postgres import redact_url

        return f"PostgresClaimLedger({redact_url(self._url)!r}, owner={self.owner!r})"

    def close(self) -> None:
        """Close every connection (idempotent)."""
        self._pool.close()

    @contextlib.contextmanager
    def _transaction(
        self, doing: str, connected: Callable[[], object] | None = None
    ) -> Iterator[psycopg.Connection[Any]]:
        """A transaction on a connection of the pool. The tables gone (the database dropped
        and made again under the daemon) are made again before the error, which the caller
        retries: every call of a daemon failed on them until it was restarted. ``connected``
        is called once the pool has given the connection, before any statement."""
        import psycopg

        from .._postgres import migrate, state_errors

        with state_errors(self._url, doing):
            try:
                with self._pool.connection() as conn:
                    if connected is not None:
                        connected()
                    with conn.transaction():
                        yield conn
            except psycopg.errors.UndefinedTable:
                with self._pool.connection() as conn:
                    migrate(conn)
                raise

    @contextlib.contextmanager
    def fenced(self, lease: Lease) -> Iterator[psycopg.Connection[Any]]:
        """A transaction that commits only while ``lease`` holds: it starts with :func:`fence`
        (raising :class:`LeaseLostError`) and commits when the block ends without error."""
        with self._transaction(f"write {lease.name!r}") as conn:
            fence(conn, lease)
            yield conn

    # -- the ClaimLedger protocol -----------------------------------------------------------

    _COLUMNS = "name, sha256, size, claimed_at, status, settled_as"

    @staticmethod
    def _record(row: tuple[Any, ...] | None) -> ClaimRecord | None:
        if row is None:
            return None
        name, sha256, size, claimed_at, status, settled_as = row
        return ClaimRecord(
            name=name,
            sha256=sha256,
            size=size,
            claimed_at=claimed_at,
            status=status,
            settled_as=settled_as,
        )

    def record_claim(self, record: ClaimRecord) -> None:
        """Record a claim in flight, without an owner (any daemon may :meth:`acquire` it). A
        claim of that name in flight is replaced: whoever leased it is fenced out."""
        with self._transaction(f"record the claim of {record.name!r}") as conn:
            conn.execute(
                "DELETE FROM claims WHERE name = %s AND status = 'claimed'", (record.name,)
            )
            conn.execute(
                "INSERT INTO claims (name, sha256, size, claimed_at, status) "
                "VALUES (%s, %s, %s, %s, 'claimed')",
                (record.name, record.sha256, record.size, record.claimed_at),
            )

    def record_claim_if_absent(self, record: ClaimRecord) -> bool:
        """Record a claim in flight unless one of that name is in flight already (several
        daemons on one inbox: the claim that exists stands, whoever leased it keeps it).
        Returns whether this one was recorded."""
        with self._transaction(f"record the claim of {record.name!r}") as conn:
            cursor = conn.execute(
                "INSERT INTO claims (name, sha256, size, claimed_at, status) "
                "VALUES (%s, %s, %s, %s, 'claimed') "
                "ON CONFLICT (name) WHERE status = 'claimed' DO NOTHING",
                (record.name, record.sha256, record.size, record.claimed_at),
            )
            return cursor.rowcount == 1

    def settled_claim_states(self) -> list[int]:
        """Claims whose engine state is still in the database although they are no longer in
        flight (a daemon died between settling a manifest and dropping its state)."""
        with self._transaction("list the engine states") as conn:
            rows = conn.execute(
                "SELECT c.id FROM states s JOIN claims c"
                " ON s.name LIKE '%%claim\\_' || c.id::text"
                " WHERE c.status <> 'claimed'"
            ).fetchall()
        return [int(row[0]) for row in rows]

    def claim_of(self, lease: Lease) -> ClaimRecord | None:
        """The claim a lease is on (None once it is settled or replaced)."""
        with self._transaction(f"look up {lease.name!r}") as conn:
            row = conn.execute(
                f"SELECT {self._COLUMNS} FROM claims WHERE id = %s AND status = 'claimed'",
                (lease.claim_id,),
            ).fetchone()
        return self._record(row)

    def _finish(self, name: str, status: ClaimStatus, settled_as: str, lease: Lease | None) -> None:
        with self._transaction(f"settle {name!r}") as conn:
            if lease is not None:
                fence(conn, lease)
            cursor = conn.execute(
                "UPDATE claims SET status = %s, settled_as = %s, owner = NULL, "
                "lease_expires_at = NULL WHERE name = %s AND status = 'claimed'",
                (status, settled_as, name),
            )
            if cursor.rowcount != 1:
                raise KeyError(f"no claim in flight for {name!r}")

    def record_settled(
        self, name: str, status: SettledStatus, settled_as: str, *, lease: Lease | None = None
    ) -> None:
        """Mark the claim of ``name`` final. With ``lease``, only while it holds (fenced)."""
        self._finish(name, status, settled_as, lease)

    def record_abandoned(self, name: str, *, lease: Lease | None = None) -> None:
        self._finish(name, "abandoned", "", lease)

    def lookup(self, name: str) -> ClaimRecord | None:
        with self._transaction(f"look up {name!r}") as conn:
            row = conn.execute(
                f"SELECT {self._COLUMNS} FROM claims WHERE name = %s ORDER BY id DESC LIMIT 1",
                (name,),
            ).fetchone()
        return self._record(row)

    def in_flight(self) -> list[ClaimRecord]:
        with self._transaction("list the claims in flight") as conn:
            rows = conn.execute(
                f"SELECT {self._COLUMNS} FROM claims WHERE status = 'claimed' ORDER BY id"
            ).fetchall()
        return [r for r in map(self._record, rows) if r is not None]

    def identity(self) -> tuple[str, str]:
        """Which state this is, kept by a failover, a dump and restore or another spelling of
        the URL: a digest of the database's and schema's names and the moment the schema was
        first made (``schema_version``'s first row), and those names to show (no host, no
        password). Another database, or a schema made again, is another state. The moment is
        written in UTC by a fixed pattern: as ``::text`` it followed the session's time zone and
        date style, and a daemon of one state under another ``PGTZ`` was refused as another."""
        with self._transaction("read which state this is") as conn:
            row = conn.execute(
                "SELECT current_database(), current_schema(),"
                " (SELECT to_char(applied_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US')"
                " FROM schema_version ORDER BY version LIMIT 1)"
            ).fetchone()
        database, schema, made = (str(v) for v in row) if row is not None else ("", "", "")
        digest = hashlib.sha256(f"{database}\0{schema}\0{made}".encode()).hexdigest()[:24]
        return digest, f"database {database}, schema {schema}"

    def unleased(self, limit: int = 100) -> list[ClaimRecord]:
        """Claims in flight that no daemon holds (the cluster's queue, oldest first, the ones
        :meth:`acquire` would take): what ``/status`` shows as queued."""
        with self._transaction("list the queued claims") as conn:
            rows = conn.execute(
                f"SELECT {self._COLUMNS} FROM claims WHERE {FREE} ORDER BY id LIMIT %s",
                (limit,),
            ).fetchall()
        return [r for r in map(self._record, rows) if r is not None]

    def find_completed(self, sha256: str) -> ClaimRecord | None:
        with self._transaction("look up a completed manifest") as conn:
            row = conn.execute(
                f"SELECT {self._COLUMNS} FROM claims WHERE sha256 = %s AND status = 'done' "
                "ORDER BY id LIMIT 1",
                (sha256,),
            ).fetchone()
        return self._record(row)

    # -- leases -----------------------------------------------------------------------------

    @staticmethod
    def _lease(row: tuple[Any, ...]) -> Lease:
        claim_id, name, sha256, owner, epoch, expires_at = row
        return Lease(
            claim_id=claim_id,
            name=name,
            sha256=sha256,
            owner=owner,
            epoch=epoch,
            expires_at=expires_at,
        )

    def acquire(
        self,
        limit: int = 1,
        *,
        lease: float | None = None,
        skip: Collection[int] = (),
        connected: Callable[[], object] | None = None,
    ) -> list[Lease]:
        """Lease up to ``limit`` claims in flight that nobody holds (never leased, released,
        or expired), oldest first, none of ``skip`` (claim ids). Rows another daemon is leasing
        at this moment are skipped, not waited for, so concurrent callers get disjoint sets.
        Each lease's epoch is one more than the claim's last. ``connected``: called once the
        pool gave the statement its connection, before the database starts the leases."""
        params = {
            "limit": limit,
            "owner": self.owner,
            "lease": lease or self.lease,
            "skip": sorted(skip),
        }
        with self._transaction("acquire leases", connected) as conn:
            rows = conn.execute(ACQUIRE_SQL, params).fetchall()
        return sorted(map(self._lease, rows), key=lambda held: held.claim_id)

    def renew(
        self, leases: Sequence[Lease], *, connected: Callable[[], object] | None = None
    ) -> dict[int, Lease]:
        """Extend every lease that still holds by :attr:`lease` seconds from now (database
        time), in one statement. Returns the renewed ones by claim id: a lease missing from the
        answer is lost (it expired, or another daemon took it over). ``connected``: see acquire."""
        if not leases:
            return {}
        params = {
            "lease": self.lease,
            "owner": self.owner,
            "ids": [held.claim_id for held in leases],
            "epochs": [held.epoch for held in leases],
        }
        with self._transaction("renew leases", connected) as conn:
            rows = conn.execute(RENEW_SQL, params).fetchall()
        return {renewed.claim_id: renewed for renewed in map(self._lease, rows)}

    def release(self, lease: Lease) -> bool:
        """Give the lease up (a daemon draining): another daemon may acquire the manifest at
        once. False if it was already lost."""
        with self._transaction(f"release {lease.name!r}") as conn:
            return conn.execute(RELEASE_SQL, _lease_params(lease)).rowcount == 1
