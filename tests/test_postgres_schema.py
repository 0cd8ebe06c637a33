"""The PostgreSQL state's schema on a real server: created on first open, migrated by version
from the previous one with its rows kept, created once by daemons starting together, refused
when newer than the code; a URL's password never shows."""

from __future__ import annotations

import threading
import time

import psycopg
import psycopg.conninfo
import pytest

from fashiontag_pipeline import StateError
from fashiontag_pipeline._postgres import (
    MIGRATION_LOCK,
    MIGRATIONS,
    SCHEMA_VERSION,
    is_postgres_url,
    migrate,
    redact_url,
    schema_version,
)
from fashiontag_pipeline.daemon.leases import PostgresClaimLedger
from fashiontag_pipeline.daemon.ledger import ClaimRecord
from fashiontag_pipeline.engine.state.pgstore import PostgresStateDB

from .postgres import PostgresCluster

ALL = [m.version for m in MIGRATIONS]


def versions(url: str) -> list[int]:
    with psycopg.connect(url) as conn:
        return [row[0] for row in conn.execute("SELECT version FROM schema_version ORDER BY 1")]


def test_first_open_creates_every_version(postgres_url: str) -> None:
    PostgresClaimLedger(postgres_url).close()
    assert versions(postgres_url) == [m.version for m in MIGRATIONS]
    assert SCHEMA_VERSION == MIGRATIONS[-1].version == 4
    PostgresClaimLedger(postgres_url).close()  # opening again changes nothing
    assert versions(postgres_url) == ALL


def test_migrates_from_the_first_version_keeping_its_rows(postgres_url: str) -> None:
    with psycopg.connect(postgres_url) as conn:
        assert migrate(conn, target=1) == 0
        conn.execute(  # a claim recorded by the previous version (no lease columns)
            "INSERT INTO claims (name, sha256, size, claimed_at, status) "
            "VALUES ('old.csv', %s, 10, 1.5, 'claimed')",
            ("a" * 64,),
        )
        conn.commit()
        assert schema_version(conn) == 1
        with pytest.raises(psycopg.errors.UndefinedColumn):
            conn.execute("SELECT epoch FROM claims")
    ledger = PostgresClaimLedger(postgres_url, owner="a")
    try:
        assert versions(postgres_url) == ALL
        assert ledger.in_flight() == [
            ClaimRecord(name="old.csv", sha256="a" * 64, size=10, claimed_at=1.5)
        ]
        [lease] = ledger.acquire(5)  # the old claim is leasable: no owner, epoch 0 -> 1
        assert (lease.name, lease.owner, lease.epoch) == ("old.csv", "a", 1)
    finally:
        ledger.close()


def test_daemons_starting_together_create_the_schema_once(postgres_url: str) -> None:
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def start() -> None:
        barrier.wait()
        try:
            PostgresClaimLedger(postgres_url).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert versions(postgres_url) == ALL


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
def test_daemons_starting_together_on_a_database_of_stricter_isolation_create_it_once(
    postgres_cluster: PostgresCluster, isolation: str
) -> None:
    """A database whose DBA set ``default_transaction_isolation`` to repeatable read or
    serializable: of two daemons (or a daemon and a run) starting together on it while new,
    the one that waited for the other's migration read the schema's version from a snapshot
    taken before it waited, found none, created the tables again and stopped, exit 1
    (``cannot open: relation "claims" already exists``). It reads the version after its
    wait, finds the schema made, and opens."""
    url = postgres_cluster.create_database("strict")
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(postgres_cluster.url(), autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = '{isolation}'")
    errors: list[BaseException] = []

    def start() -> None:
        try:
            PostgresClaimLedger(url).close()
        except BaseException as exc:
            errors.append(exc)

    with psycopg.connect(url) as first:  # (the daemon that migrates first)
        first.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        other = threading.Thread(target=start)
        other.start()
        deadline = time.monotonic() + 30
        while not first.execute(  # (until the other waits for the lock)
            "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ).fetchone():
            assert time.monotonic() < deadline and other.is_alive(), errors
            time.sleep(0.02)
        migrate(first)
        first.commit()
    other.join(timeout=60)
    assert errors == []
    assert versions(url) == ALL


def test_a_newer_schema_is_refused(postgres_url: str) -> None:
    PostgresClaimLedger(postgres_url).close()
    with psycopg.connect(postgres_url) as conn:
        conn.execute("INSERT INTO schema_version (version, description) VALUES (99, 'future')")
    with pytest.raises(StateError, match="schema version 99"):
        PostgresClaimLedger(postgres_url)


def test_urls_and_their_passwords() -> None:
    assert is_postgres_url("postgresql://db/x") and is_postgres_url("postgres://db/x")
    assert not is_postgres_url("state.sqlite")
    assert redact_url("postgresql://u:SECRET@db:5432/x?sslmode=require") == (
        "postgresql://u:***@db:5432/x?sslmode=require"
    )
    assert "SECRET" not in redact_url("postgresql://db/x?user=u&password=SECRET")
    assert redact_url("postgresql://u@db/x") == "postgresql://u@db/x"
    # A password with characters a URL parser would end the authority at, unencoded.
    for password in ("se#cr/et?x", "a@b:c"):
        shown = redact_url(f"postgresql://u:{password}@db/x#nightly")
        assert (
            password not in shown
            and "se#cr" not in shown
            and shown.startswith("postgresql://u:***@")
        )


def test_a_malformed_url_is_a_state_error_without_the_password(tmp_path: object) -> None:
    """libpq's parse errors quote the token they could not read: it is masked."""
    from fashiontag_pipeline.engine.state.pgstore import PostgresStateDB

    for url in ("postgresql://u:s%zzecret@/x", "postgresql:///x?password=SECRET-PW&sslmode=bogus"):
        with pytest.raises(StateError) as caught:
            PostgresStateDB(url, connect_timeout=1)
        assert "zzecret" not in str(caught.value) and "SECRET-PW" not in str(caught.value)
        assert caught.value.__cause__ is None


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:hunter@2024@localhost:1/x",
        "postgresql://u:hunter@2024@db.invalid/x#nightly",
        "postgres://u:Qz7@Rk9:Xv2@localhost/x?sslmode=disable",
    ],
)
def test_a_password_with_an_unencoded_at_sign_is_refused_without_showing_it(url: str) -> None:
    """libpq ends the user's part at the first ``@``: the rest of the password became the
    host, and the error quoted it (``failed to resolve host '2024@localhost'``), on stderr and
    in the daemon's log, and said nothing of the real fault. The URL is refused before any
    connection, saying to write ``@`` as ``%40``, with no piece of the password."""
    from fashiontag_pipeline.engine.reuse.pgstore import PostgresResultStore

    secret = url.partition("://u:")[2].rpartition("@")[0]
    pieces = [p for p in secret.replace(":", "@").split("@") if p]
    for opener in (
        lambda: PostgresStateDB(url, connect_timeout=1),
        lambda: PostgresClaimLedger(url.partition("#")[0], connect_timeout=1),
        lambda: PostgresResultStore.open(url.partition("#")[0], connect_timeout=1),
    ):
        with pytest.raises(Exception) as caught:
            opener()
        message = str(caught.value)
        assert "%40" in message, message
        assert not [p for p in pieces if p in message.partition("://")[2].replace("u:***@", "")]


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@localhost:1/x?password=Qz7&Rk9Xv2",
        "postgresql://u@localhost:1/x?sslmode=disable&password=Qz7&Rk9Xv2&connect_timeout=1",
        "postgresql://u@localhost:1/x?password=Qz7#Rk9Xv2",
    ],
)
def test_a_password_parameter_cut_by_an_unencoded_ampersand_or_hash_never_shows(
    url: str,
) -> None:
    """``?password=`` holding an unencoded ``&`` or ``#``: libpq refused the part after the
    ``&`` and its error quoted it (``missing key/value separator "=" in URI query parameter:
    "Rk9Xv2"``); the part after ``#`` was taken for the state's name and the error quoted it
    (``the state name 'Rk9Xv2' (after #) must be ...``). Neither shows now."""
    for opener in (
        lambda: PostgresStateDB(url, connect_timeout=1),
        lambda: PostgresClaimLedger(url, connect_timeout=1),
    ):
        with pytest.raises(StateError) as caught:
            opener()
        message = str(caught.value)
        assert "Rk9Xv2" not in message and "Qz7" not in message, message


def test_an_unreachable_database_is_a_state_error_without_the_password(tmp_path: object) -> None:
    url = f"postgresql://u:SECRET-PW@/x?host={tmp_path}/nowhere"
    with pytest.raises(StateError) as caught:
        PostgresClaimLedger(url, connect_timeout=1)
    assert "SECRET-PW" not in str(caught.value)
    assert "cannot open" in str(caught.value)


def test_the_previous_version_is_migrated_for_engine_states_keeping_its_claims(
    postgres_url: str,
) -> None:
    with psycopg.connect(postgres_url) as conn:
        assert migrate(conn, target=2) == 0
        conn.execute(  # a claim leased by a daemon of the previous version
            "INSERT INTO claims (name, sha256, size, claimed_at, status, owner, epoch) "
            "VALUES ('old.csv', %s, 10, 1.5, 'claimed', 'old-daemon', 3)",
            ("b" * 64,),
        )
        conn.commit()
    db = PostgresStateDB(postgres_url + "#nightly")
    try:
        assert db.open_engine().opened == "new"
        db.set_meta("probe", 7)
        assert db.meta("probe") == "7"
    finally:
        db.close()
    assert versions(postgres_url) == ALL
    with psycopg.connect(postgres_url) as conn:
        claim = conn.execute("SELECT name, owner, epoch FROM claims").fetchone()
        states = conn.execute("SELECT name, version FROM states").fetchall()
    assert claim == ("old.csv", "old-daemon", 3)
    assert [(name.endswith("_ft_nightly"), version) for name, version in states] == [(True, 1)]
    again = PostgresStateDB(postgres_url + "#nightly")  # found again, not created twice
    try:
        assert again.open_engine().opened == "resumed"
    finally:
        again.close()


def test_engine_tables_newer_than_this_code_are_refused(postgres_url: str) -> None:
    PostgresStateDB(postgres_url + "#future").close()
    with psycopg.connect(postgres_url) as conn:
        conn.execute("UPDATE states SET version = 99")
    with pytest.raises(StateError, match=r"tables of version 99.*upgrade fashiontag"):
        PostgresStateDB(postgres_url + "#future")


def test_a_state_name_that_is_not_a_name_is_a_clear_error(postgres_url: str) -> None:
    with pytest.raises(StateError, match="state name 'Nightly; DROP'"):
        PostgresStateDB(postgres_url + "#Nightly; DROP")


def test_a_run_cannot_name_its_state_after_a_daemons_manifest(postgres_url: str) -> None:
    from fashiontag_pipeline.engine.state.pgstore import PostgresStateDB

    with pytest.raises(StateError, match="claim_\\* belong to the daemons"):
        PostgresStateDB(postgres_url + "#claim_7")
