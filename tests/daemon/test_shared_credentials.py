"""Daemons on a PostgreSQL that refuses them: a wrong password for the state or the result
store, and a result store's database that stops taking connections for a while.

The tests' server trusts every local connection: for the password, one role made for the test
must give its password (``scram-sha-256``), and the daemon is given a wrong one.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import psycopg
import psycopg.conninfo
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from ..engine.helpers import dead_port
from ..postgres import PostgresCluster
from .helpers import DaemonProcess, daemon_once, drop_atomic, read_lines, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="unix sockets")

PASSWORD = "WRONG-PG-CANARY"


@pytest.fixture
def wrong_password_url(postgres_cluster: PostgresCluster, postgres_url: str) -> Iterator[str]:
    """``postgres_url`` as a role that must give its password, with a wrong one."""
    role = f"pw_{os.getpid()}"
    hba = postgres_cluster.data / "pg_hba.conf"
    trusted = hba.read_text()
    hba.write_text(f"local all {role} scram-sha-256\n{trusted}")  # (read before the trust line)
    with psycopg.connect(postgres_cluster.url(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN SUPERUSER PASSWORD 'the-right-one'")
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield postgres_url.replace("postgresql://postgres@", f"postgresql://{role}:{PASSWORD}@")
    finally:
        hba.write_text(trusted)
        with psycopg.connect(postgres_cluster.url(), autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
            conn.execute(f"DROP ROLE {role}")


def test_a_daemon_given_a_wrong_password_stops_at_once_saying_why(
    tmp_path: Path, wrong_password_url: str
) -> None:
    """The daemon's connection pool logged its failed tries for 10 s, then the daemon stopped
    on ``cannot open: pool initialization incomplete after 10.0 sec``: the reason (the
    password refused) was never in its error. It stops at once, exit 1, saying why, with no
    password in its output."""
    proc, took = daemon_once(tmp_path, "--state", wrong_password_url, "--log-format", "json")
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    assert PASSWORD not in err + proc.stdout.decode(), err
    (stopped,) = [line for line in err.splitlines() if "daemon stopped on an error" in line]
    assert "password authentication failed" in stopped, err
    assert took < 8, (took, err)


def test_a_shared_daemon_whose_result_store_refuses_its_password_stops_at_start(
    tmp_path: Path, postgres_url: str, wrong_password_url: str
) -> None:
    """``--reuse postgresql://`` with a wrong password beside a good ``--state``: the shared
    daemon started, leased each manifest dropped, failed to open the store at each attempt and
    after five moved it to ``failed/`` ("manifest cannot be read": the manifest was fine), one
    after another. A daemon with its state in a file stops at start on that (exit 1, the
    reason); the shared one does too now, and the manifest waits in the inbox."""
    (tmp_path / "inbox").mkdir()
    (tmp_path / "inbox" / "m.csv").write_bytes(write_manifest(Path(), ["a", "b"]))
    args = ["--state", postgres_url, "--reuse", wrong_password_url, "--lease", "0.5"]
    daemon = DaemonProcess(tmp_path, f"http://127.0.0.1:{dead_port()}", extra=args)
    daemon.start()
    try:
        assert daemon.proc is not None
        try:
            code = daemon.proc.wait(timeout=8)
        except subprocess.TimeoutExpired:
            code = None
    finally:
        daemon.ensure_dead()
    err = daemon.stderr_path.read_text()
    assert code == 1, daemon.tail(8)
    assert PASSWORD not in err
    (stopped,) = [line for line in err.splitlines() if "daemon stopped on an error" in line]
    assert "password authentication failed" in stopped, err
    assert not list((daemon.inbox / "failed").glob("*")), "a good manifest failed"
    assert (daemon.inbox / "m.csv").exists()  # (the next start takes it)


async def test_an_outage_of_the_result_stores_database_fails_no_manifest(
    tmp_path: Path, postgres_url: str, postgres_cluster: PostgresCluster
) -> None:
    """The result store in a database of its own, which stops taking connections for a while
    (a restart, a failover, maintenance): each attempt at a manifest stopped on the store, and
    after five (two minutes and a half at the default lease) the manifest went to ``failed/``
    ("manifest cannot be read"), every manifest in flight or dropped meanwhile with it; rows
    already sent were billed again when it was dropped again. A store that cannot be reached
    is no attempt of the manifest's: it waits, and is tagged once the store answers again."""
    store = postgres_cluster.create_database("store")
    name = psycopg.conninfo.conninfo_to_dict(store)["dbname"]
    args = ["--state", postgres_url, "--reuse", store, "--lease", "0.5"]
    ids = [f"o{i}" for i in range(50)]
    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=args).start()
        admin = psycopg.connect(postgres_cluster.url(), autocommit=True)
        try:
            await daemon.wait_ready_endpoint()
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
            drop_atomic(daemon.inbox, "m.csv", write_manifest(Path(), ids))
            failed = daemon.inbox / "failed" / "m.csv"
            with anyio.fail_after(20):  # more attempts than a manifest is given
                while len(_stopped(daemon)) < 7 and not failed.exists():
                    daemon.check_alive()
                    await anyio.sleep(0.05)
            assert not failed.exists(), daemon.tail(3)
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            summary = await daemon.wait_summary("m", timeout=30)
            assert await daemon.stop() == 0
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            admin.close()
            daemon.ensure_dead()
    assert summary["status"] == "done", summary
    assert sorted(r["id"] for r in read_lines(daemon.outbox / "m" / "results.jsonl")) == sorted(ids)
    assert (daemon.inbox / "done" / "m.csv").exists()
    assert not list((daemon.inbox / "failed").glob("*"))


STOPPED = "the manifest stopped on an error; it resumes when it is leased again"


def _stopped(daemon: DaemonProcess) -> list[object]:
    return [line for line in daemon.logs() if line.get("event") == STOPPED]


async def _readiness(daemon: DaemonProcess, ready: bool) -> str:
    """Until ``/readyz`` says ``ready`` (or not); its reason."""
    with anyio.fail_after(25):
        while True:
            daemon.check_alive()
            status, body = await daemon.get("/readyz")
            if (status == 200) == ready:
                return str(json.loads(body).get("reason", ""))
            await anyio.sleep(0.1)


async def test_readyz_says_when_the_shared_state_cannot_be_reached(
    tmp_path: Path, postgres_cluster: PostgresCluster
) -> None:
    """``/readyz`` is 200 "when the state store is writable": a shared daemon whose database
    stopped taking connections (for minutes: an outage, a failover) leased nothing and said
    200 all along, so no probe or alert saw it. It says 503 with the reason while the state
    cannot be reached (once a call has waited its 10 s for a connection), and 200 again once it
    answers."""
    state = postgres_cluster.create_database("state")
    name = psycopg.conninfo.conninfo_to_dict(state)["dbname"]
    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=["--state", state, "--lease", "1"])
        daemon.start()
        admin = psycopg.connect(postgres_cluster.url(), autocommit=True)
        try:
            await _readiness(daemon, True)
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
            reason = await _readiness(daemon, False)
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            await _readiness(daemon, True)
            assert await daemon.stop() == 0
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            admin.close()
            daemon.ensure_dead()
    assert reason.startswith("state store not writable: PostgreSQL state postgresql://"), reason


async def test_readyz_says_when_the_shared_state_is_read_only(
    tmp_path: Path, postgres_cluster: PostgresCluster
) -> None:
    """The state's database turned read-only under a shared daemon (a failover that left the
    daemons' host name on a hot standby, ``default_transaction_read_only`` set): every lease
    failed on ``cannot execute UPDATE in a read-only transaction`` and the daemon leased
    nothing, yet ``/readyz`` said 200 all along (the queue's read that follows each failed
    lease marked the state writable again), so no probe or alert saw it. It says 503 with the
    reason while leases cannot be written, 200 again once they can; the manifest waits,
    nothing sent, and is tagged after."""
    state = postgres_cluster.create_database("state")
    name = psycopg.conninfo.conninfo_to_dict(state)["dbname"]
    ids = [f"ro{i}" for i in range(20)]
    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=["--state", state, "--lease", "1"])
        daemon.start()
        admin = psycopg.connect(postgres_cluster.url(), autocommit=True)
        try:
            await _readiness(daemon, True)
            admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
            drop_atomic(daemon.inbox, "m.csv", write_manifest(Path(), ids))
            # (the lease that failed on the read-only state, not one that met the connection
            # the termination ended: under load that came first, and /readyz then named it)
            with anyio.fail_after(20):
                while not any(
                    line.get("event", "").startswith("cannot lease manifests")
                    and "read-only" in str(line)
                    for line in daemon.logs()
                ):
                    daemon.check_alive()
                    await anyio.sleep(0.05)
            said = []
            for _ in range(12):  # (over four turns of the lease loop)
                said.append(await daemon.get("/readyz"))
                await anyio.sleep(0.1)
            sent_meanwhile = sum(len(record.ids) for record in svc.store.tasks.values())
            admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
            summary = await daemon.wait_summary("m", timeout=30)
            await _readiness(daemon, True)
            assert await daemon.stop() == 0
        finally:
            admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
            admin.close()
            daemon.ensure_dead()
    assert [status for status, _ in said] == [503] * len(said), said
    assert all("read-only" in body for _, body in said), said
    assert sent_meanwhile == 0 and summary["status"] == "done", summary
    assert sorted(r["id"] for r in read_lines(daemon.outbox / "m" / "results.jsonl")) == sorted(ids)
