"""A shared daemon whose database changes under it: it takes no more connections for a while
(``max_connections`` reached by other clients, the role's or the database's ``CONNECTION
LIMIT``: the daemon's pool keeps the connections it has; each manifest's state needs a new
one), or it is dropped and made again, empty."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import anyio
import psycopg
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from ..postgres import PostgresCluster
from .helpers import DaemonProcess, drop_atomic, read_lines, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="unix sockets")

STOPPED = "the manifest stopped on an error; it resumes when it is leased again"


async def test_a_database_at_its_connection_limit_fails_no_manifest(
    tmp_path: Path, postgres_cluster: PostgresCluster
) -> None:
    """The role at its connection limit ("too many connections for role", as "too many
    clients already" once the server's max_connections is reached): each attempt at a manifest
    stopped on opening its state, and after six lease lengths the manifest went to
    ``failed/`` with that reason, a good manifest failed by a passing shortage. A state that
    cannot be connected to is no attempt of the manifest's: it waits, and is tagged once the
    database takes connections again."""
    role = f"lim_{os.getpid()}"
    admin = psycopg.connect(postgres_cluster.url(), autocommit=True)
    admin.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER")
    name = f"limited_{os.getpid()}"
    admin.execute(f'CREATE DATABASE "{name}" OWNER {role} STRATEGY FILE_COPY')
    url = postgres_cluster.url(name).replace("postgresql://postgres@", f"postgresql://{role}@")
    ids = [f"c{i}" for i in range(40)]
    try:
        async with running_service(ServiceConfig()) as svc:
            daemon = DaemonProcess(tmp_path, svc.url, extra=["--state", url, "--lease", "0.5"])
            daemon.start()
            try:
                await daemon.wait_ready_endpoint()
                (held,) = admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (role,)
                ).fetchone() or (0,)
                admin.execute(f"ALTER ROLE {role} CONNECTION LIMIT {held}")
                drop_atomic(daemon.inbox, "m.csv", write_manifest(Path(), ids))
                failed = daemon.inbox / "failed" / "m.csv"
                with anyio.fail_after(20):  # more attempts than a manifest is given
                    while len(_stopped(daemon)) < 8 and not failed.exists():
                        daemon.check_alive()
                        await anyio.sleep(0.05)
                assert not failed.exists(), daemon.tail(3)
                admin.execute(f"ALTER ROLE {role} CONNECTION LIMIT -1")
                summary = await daemon.wait_summary("m", timeout=30)
                assert await daemon.stop() == 0
            finally:
                daemon.ensure_dead()
    finally:
        admin.execute(f"ALTER ROLE {role} CONNECTION LIMIT -1")
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
        )
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f"DROP ROLE {role}")
        admin.close()
    assert summary["status"] == "done", summary
    assert sorted(r["id"] for r in read_lines(daemon.outbox / "m" / "results.jsonl")) == sorted(ids)
    assert (daemon.inbox / "done" / "m.csv").exists()


def _stopped(daemon: DaemonProcess) -> list[object]:
    return [line for line in daemon.logs() if line.get("event") == STOPPED]


async def test_a_database_dropped_and_made_again_under_an_idle_daemon_takes_manifests(
    tmp_path: Path, postgres_cluster: PostgresCluster
) -> None:
    """The state's database dropped and made again, empty, while a shared daemon sat idle (a
    staging database reset, a restore into a new database of the same name): every call
    failed on ``relation "claims" does not exist``, logged ten times a second, and the
    manifest sat in ``.work/`` until the daemon was restarted. The tables are made again at
    the first call that misses them, and the manifest is tagged."""
    name = f"remade_{os.getpid()}"
    admin = psycopg.connect(postgres_cluster.url(), autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}" STRATEGY FILE_COPY')
    url = postgres_cluster.url(name)
    ids = [f"r{i}" for i in range(30)]
    try:
        async with running_service(ServiceConfig()) as svc:
            daemon = DaemonProcess(tmp_path, svc.url, extra=["--state", url, "--lease", "0.5"])
            daemon.start()
            try:
                await daemon.wait_ready_endpoint()
                admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
                admin.execute(f'CREATE DATABASE "{name}" STRATEGY FILE_COPY')
                drop_atomic(daemon.inbox, "m.csv", write_manifest(Path(), ids))
                summary = await daemon.wait_summary("m", timeout=20)
                assert await daemon.stop() == 0
            finally:
                daemon.ensure_dead()
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()
    assert summary["status"] == "done", summary
    assert sorted(r["id"] for r in read_lines(daemon.outbox / "m" / "results.jsonl")) == sorted(ids)


async def test_a_state_whose_connections_the_server_ends_fails_no_manifest(
    tmp_path: Path, postgres_url: str
) -> None:
    """The server ended a manifest's state connection at each attempt (a failover or restart
    after another, a DBA's `pg_terminate_backend`, a pooler restarted): each stop was counted
    as the manifest's failure, and the fifth in a row moved a good manifest to ``failed/``
    ("terminating connection due to administrator command (5 attempts)"), its rows billed
    again when dropped again. A connection lost is no fault of the manifest's, as for the
    result store: not counted; the manifest is tagged once its connections hold."""
    ids = [f"t{i}" for i in range(40)]
    stop = threading.Event()

    def end_sessions() -> None:  # every statement of the daemon's, at work or in a transaction
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            while not stop.wait(0.02):
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    " AND backend_type = 'client backend' AND state <> 'idle'"
                )

    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=["--state", postgres_url, "--lease", "0.5"])
        daemon.start()
        ender = threading.Thread(target=end_sessions)
        try:
            await daemon.wait_ready_endpoint()
            ender.start()
            drop_atomic(daemon.inbox, "m.csv", write_manifest(Path(), ids))
            failed = daemon.inbox / "failed" / "m.csv"
            deadline = time.monotonic() + 60  # (more attempts than a manifest is given)
            while len(_stopped(daemon)) < 8 and not failed.exists():
                daemon.check_alive()
                # (Said with the daemon's last lines: one fresh-clone CI run saw fewer than 8
                # stops in 60 s, with no log to tell why; 7-11 s alone and under load here.)
                assert time.monotonic() < deadline, (
                    f"{len(_stopped(daemon))} stops in 60 s: {daemon.tail(30)}"
                )
                await anyio.sleep(0.05)
            stop.set()
            ender.join()
            assert not failed.exists(), daemon.tail(3)
            summary = await daemon.wait_summary("m", timeout=30)
            assert await daemon.stop() == 0
        finally:
            stop.set()
            if ender.is_alive():
                ender.join()
            daemon.ensure_dead()
    assert summary["status"] == "done", summary
    assert sorted(r["id"] for r in read_lines(daemon.outbox / "m" / "results.jsonl")) == sorted(ids)
