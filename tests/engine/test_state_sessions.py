"""A PostgreSQL state whose idle session the server ends (``idle_session_timeout``, a killer
of idle sessions, ``pg_terminate_backend``): nothing is in flight between transactions, so the
state goes on in a new session, its lock taken again."""

from __future__ import annotations

from pathlib import Path

import anyio
import psycopg
import psycopg.conninfo
import pytest

from fashiontag_pipeline import StateConflictError, StateError
from fashiontag_pipeline.engine.state.pgstore import PostgresStateDB
from fashiontag_pipeline.service import ServiceConfig, running_service

from ..postgres import PostgresCluster
from .helpers import ENV, assert_exactly_once, run_args, write_csv


def _end_lock_holders(url: str) -> int:
    """End the sessions holding an advisory lock (a state's) on the database of ``url``."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchall()
    return len(rows)


async def test_a_run_whose_idle_session_the_server_ends_goes_on(
    tmp_path: Path, postgres_cluster: PostgresCluster
) -> None:
    """A database with ``idle_session_timeout`` (a DBA's setting; a pooler or a firewall
    that drops idle connections does the same): the run's state sat idle while the service
    tagged, the server ended its session, and the run stopped with exit 1 at its next read
    ("terminating connection due to idle-session timeout"), every night the same. It goes on
    in a new session: exit 0, each id once, none sent twice."""
    url = postgres_cluster.create_database("idle")
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(postgres_cluster.url(), autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE \"{name}\" SET idle_session_timeout = '300ms'")
    manifest = write_csv(tmp_path / "m.csv", 300)
    out = tmp_path / "results.jsonl"
    async with running_service(ServiceConfig(rate=100.0)) as svc:  # 3 s of tagging
        args = [*run_args(svc.url, out, str(manifest)), "--state", f"{url}#nightly"]
        result = await anyio.run_process(args, check=False, env=ENV)
        sent = [i for record in svc.store.tasks.values() for i in record.ids]
    assert result.returncode == 0, result.stderr.decode()[-800:]
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(300)})
    assert len(sent) == len(set(sent)) == 300


def test_a_state_whose_session_was_ended_keeps_its_lock(postgres_url: str) -> None:
    """In its new session the state is held alone again: a second run is still refused."""
    db = PostgresStateDB(f"{postgres_url}#held")
    try:
        db.open_engine()
        db.set_meta("probe", 7)
        assert _end_lock_holders(postgres_url) >= 1
        assert db.meta("probe") == "7"  # (a read: made again on a new session)
        with pytest.raises(StateConflictError, match="in use by another run"):
            PostgresStateDB(f"{postgres_url}#held")
        db.set_meta("probe", 8)
        assert db.meta("probe") == "8"
    finally:
        db.close()
    PostgresStateDB(f"{postgres_url}#held").close()  # (unlocked at its close)


@pytest.mark.parametrize("restart", [False, True])
def test_a_state_another_run_held_while_the_session_was_ended_is_not_written(
    postgres_url: str, restart: bool
) -> None:
    """The lock went with the ended session: another run (the same command started by hand, a
    cron line overlapping) took the state, resumed or restarted it, and ended before this run
    touched its state again. Taking the lock again, this run went on from what it held in
    memory over what the other had written (its outputs cut back, pages written again, its
    checkpoints): it stops instead, nothing written, and the same command resumes."""
    db = PostgresStateDB(f"{postgres_url}#held")
    try:
        db.open_engine()
        db.set_meta("probe", 7)
        assert _end_lock_holders(postgres_url) >= 1
        other = PostgresStateDB(f"{postgres_url}#held")  # (free: the lock went with it)
        if restart:
            other._wipe()
        other.set_meta("probe", 9)
        other.close()
        with pytest.raises(StateError, match="another run"):
            db.meta("probe")
        with pytest.raises(StateError):
            db.begin()
    finally:
        db.close()
    again = PostgresStateDB(f"{postgres_url}#held")
    assert again.meta("probe") == "9"
    again.close()


def test_a_session_ended_inside_a_transaction_stops_the_state(postgres_url: str) -> None:
    """Ended inside a transaction, the session took that transaction's writes with it: the
    state does not go on in a new session (it would go on from a checkpoint the database
    never kept); it stops with a StateError naming the PostgreSQL state, and a new opening
    finds what was committed before."""
    db = PostgresStateDB(f"{postgres_url}#mid")
    try:
        db.open_engine()
        db.set_meta("probe", 1)
        db.begin()
        db.set_meta("probe", 2)
        assert _end_lock_holders(postgres_url) >= 1
        with pytest.raises(StateError, match="PostgreSQL state"):
            db.set_meta("probe", 3)
            db.commit()
    finally:
        db.close()
    again = PostgresStateDB(f"{postgres_url}#mid")
    assert again.meta("probe") == "1"
    again.close()
