"""``fashiontag daemon`` restarted with another ``--state`` (a unit file edited to keep the
state on another disk, or to leave the inbox's default file) while a manifest was in flight.

Found by a hunt: the new state knew no claim, so the file in ``INBOX/.work`` was hashed and
claimed again as if its ledger had been lost, and every row, already sent (and billed) from
the first state, whose tasks the service was still tagging, was sent and billed again, the
log saying only ``manifest resumed``. The daemon now exits 2 at start-up naming the state the
manifest is in flight in; started with it, it finishes the manifest.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline._exceptions import StateConflictError
from fashiontag_pipeline.daemon.config import DEFAULT_STATE_NAME
from fashiontag_pipeline.daemon.ledger import ClaimRecord, SQLiteClaimLedger
from fashiontag_pipeline.daemon.statemark import STATE_MARK, lock_watched, watched_shared
from fashiontag_pipeline.service import ServiceConfig, running_service

from ..postgres import PostgresCluster
from .helpers import DaemonProcess, drop_atomic, read_lines, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")

N = 600


@pytest.mark.parametrize("moved_to", ["a SQLite file elsewhere", "PostgreSQL"])
async def test_a_restart_with_another_state_bills_no_row_of_a_manifest_in_flight_again(
    tmp_path: Path, request: pytest.FixtureRequest, moved_to: str
) -> None:
    ids = [f"p{i}" for i in range(N)]
    async with running_service(ServiceConfig(rate=300.0)) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=["--drain-timeout", "2"]).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "m.csv", write_manifest(Path(), ids))
            with anyio.fail_after(30):
                while svc.store.image_count < N:
                    daemon.check_alive()
                    await anyio.sleep(0.02)
            assert await daemon.stop() == 0
            assert (daemon.inbox / ".work" / "m.csv").exists()  # in flight
            if moved_to == "PostgreSQL":
                moved = ["--state", request.getfixturevalue("postgres_url"), "--lease", "2"]
            else:
                moved = ["--state", str(tmp_path / "elsewhere.sqlite")]
            daemon = DaemonProcess(tmp_path, svc.url, extra=moved).start()
            code = await daemon.wait_exit(timeout=30)
            log = daemon.tail()
            assert code == 2, log
            assert str(daemon.inbox / DEFAULT_STATE_NAME) in log and "m.csv" in log, log
            assert svc.store.image_count == N  # nothing sent again
            daemon = DaemonProcess(tmp_path, svc.url).start()
            summary = await daemon.wait_summary("m", timeout=60)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
        assert summary["status"] == "done" and summary["tagged"] == N, summary
        assert svc.store.image_count == N
    lines = read_lines(daemon.outbox / "m" / "results.jsonl")
    assert sorted(line["id"] for line in lines) == sorted(ids)


async def test_a_new_state_after_every_manifest_ended_starts(tmp_path: Path) -> None:
    """Nothing in flight: another ``--state`` is the operator's to choose (a fresh ledger)."""
    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "a.csv", write_manifest(Path(), ["1", "2"]))
            await daemon.wait_summary("a", timeout=30)
            assert await daemon.stop() == 0
            moved = ["--state", str(tmp_path / "elsewhere.sqlite")]
            daemon = DaemonProcess(tmp_path, svc.url, extra=moved).start()
            drop_atomic(daemon.inbox, "b.csv", write_manifest(Path(), ["3"]))
            summary = await daemon.wait_summary("b", timeout=30)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    assert summary["status"] == "done" and summary["tagged"] == 1


def test_manifests_moved_back_into_the_inbox_are_a_new_states_to_claim(tmp_path: Path) -> None:
    """Their tasks gone for good, the operator moves the files in flight back into the inbox
    (as the refusal says) and starts on the new state, which claims them again: a later start
    on that state is not refused for the old state's claims of those names (with PostgreSQL,
    which notes no state of its own, the old note goes)."""
    inbox, old = tmp_path / "in", tmp_path / "old.sqlite"
    (inbox / ".work").mkdir(parents=True)
    (inbox / ".work" / "m.csv").write_bytes(b"id,url\n1,https://img.example/1.jpg\n")
    ledger = SQLiteClaimLedger(old)
    ledger.record_claim(ClaimRecord(name="m.csv", sha256="0" * 64, size=35, claimed_at=1.0))
    ledger.close()
    os.close(lock_watched(inbox, old))
    for state in (str(tmp_path / "new.sqlite"), "postgresql://db.example/fleet"):
        with pytest.raises(StateConflictError, match=f"--state {old} to finish them"):
            (watched_shared if state.startswith("postgresql") else lock_watched)(inbox, state)
    os.rename(inbox / ".work" / "m.csv", inbox / "m.csv")  # moved back
    watched_shared(inbox, "postgresql://u:hunter2@db.example/fleet")
    assert "hunter2" not in (inbox / STATE_MARK).read_text()  # (no URL)
    os.rename(inbox / "m.csv", inbox / ".work" / "m.csv")  # claimed again by the fleet
    watched_shared(inbox, "postgresql://db.example/fleet")
    with pytest.raises(StateConflictError, match="in the PostgreSQL state") as refused:
        lock_watched(inbox, tmp_path / "new.sqlite")  # (the fleet's claim, not old.sqlite's)
    assert str(old) not in str(refused.value)
    os.rename(inbox / ".work" / "m.csv", inbox / "m.csv")  # settled by the fleet
    os.close(lock_watched(inbox, tmp_path / "new.sqlite"))


def test_the_same_state_through_another_path_is_not_another_state(tmp_path: Path) -> None:
    """The state given through a symlink (or another mount of its folder) after a start with
    its own path, a manifest in flight: the same file, whose claims the daemon finishes; it
    was refused as another state (exit 2, "start the daemon with --state" the very file)."""
    inbox, real = tmp_path / "in", tmp_path / "disk" / "state.sqlite"
    (inbox / ".work").mkdir(parents=True)
    real.parent.mkdir()
    (inbox / ".work" / "m.csv").write_bytes(b"id,url\n1,https://img.example/1.jpg\n")
    ledger = SQLiteClaimLedger(real)
    ledger.record_claim(ClaimRecord(name="m.csv", sha256="0" * 64, size=35, claimed_at=1.0))
    ledger.close()
    os.close(lock_watched(inbox, real))
    (tmp_path / "link").symlink_to(real.parent, target_is_directory=True)
    os.close(lock_watched(inbox, tmp_path / "link" / "state.sqlite"))  # the same file
    os.close(lock_watched(inbox, real))  # ... and back
    with pytest.raises(StateConflictError):  # another file still refused
        lock_watched(inbox, tmp_path / "other.sqlite")


async def test_a_restart_on_sqlite_after_postgresql_bills_no_row_in_flight_again(
    tmp_path: Path, postgres_url: str
) -> None:
    """The other way round: a daemon of a PostgreSQL state stopped with a manifest in flight,
    started again on a SQLite state (the default file, ``--state`` left out of the unit).
    The PostgreSQL daemon dropped the note, so the SQLite one took the file in ``.work`` for
    the claim of a lost ledger and sent (and billed) every row again. Refused now (exit 2,
    no URL, which may hold a password, written or shown); on the same state, finished once."""
    ids = [f"p{i}" for i in range(N)]
    on_postgres = ["--state", postgres_url, "--lease", "2", "--drain-timeout", "2"]
    async with running_service(ServiceConfig(rate=300.0)) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=on_postgres).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "m.csv", write_manifest(Path(), ids))
            with anyio.move_on_after(30):
                while svc.store.image_count < N:
                    daemon.check_alive()
                    await anyio.sleep(0.02)
            assert svc.store.image_count == N, (svc.store.image_count, daemon.tail()[-4000:])
            assert await daemon.stop() == 0
            assert (daemon.inbox / ".work" / "m.csv").exists()  # in flight
            daemon = DaemonProcess(tmp_path, svc.url).start()
            code = await daemon.wait_exit(timeout=30)
            log = daemon.tail()
            assert code == 2, log
            assert "PostgreSQL" in log and "m.csv" in log, log
            assert svc.store.image_count == N  # nothing sent again
            mark = (daemon.inbox / STATE_MARK).read_text()
            assert "postgresql" in mark and postgres_url not in mark
            daemon = DaemonProcess(tmp_path, svc.url, extra=on_postgres).start()
            summary = await daemon.wait_summary("m", timeout=60)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
        assert summary["status"] == "done" and summary["tagged"] == N, summary
        assert svc.store.image_count == N


async def test_a_restart_on_another_postgresql_state_bills_no_row_in_flight_again(
    tmp_path: Path, postgres_cluster: PostgresCluster, postgres_url: str
) -> None:
    """A shared daemon's unit file edited to another PostgreSQL database (or schema) while a
    manifest was in flight: the note said only ``postgresql``, so the new state took the file
    in ``.work`` for a claim of its own not yet recorded, and every row, sent (and billed)
    from the first database, was sent and billed again. Refused now (exit 2, naming the
    database and schema, never the URL); the same state through another spelling of its URL
    (a parameter added) is the same state; on it, the manifest is finished once."""
    ids = [f"p{i}" for i in range(N)]
    on_first = ["--state", postgres_url, "--lease", "2", "--drain-timeout", "2"]
    other = postgres_cluster.create_schema("other")
    async with running_service(ServiceConfig(rate=300.0)) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=on_first).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "m.csv", write_manifest(Path(), ids))
            with anyio.move_on_after(30):
                while svc.store.image_count < N:
                    daemon.check_alive()
                    await anyio.sleep(0.02)
            assert svc.store.image_count == N, (svc.store.image_count, daemon.tail()[-4000:])
            assert await daemon.stop() == 0
            assert (daemon.inbox / ".work" / "m.csv").exists()  # in flight
            moved = ["--state", other, "--lease", "2", "--drain-timeout", "2"]
            daemon = DaemonProcess(tmp_path, svc.url, extra=moved).start()
            code = await daemon.wait_exit(timeout=30)
            log = daemon.tail()
            assert code == 2, log
            assert "another PostgreSQL state" in log and "m.csv" in log, log
            schema = postgres_url.rpartition("%3D")[2]
            assert schema in log and postgres_url not in log, log
            assert svc.store.image_count == N  # nothing sent again
            respelled = ["--state", f"{postgres_url}&application_name=ft", *on_first[2:]]
            daemon = DaemonProcess(tmp_path, svc.url, extra=respelled).start()
            summary = await daemon.wait_summary("m", timeout=60)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
        assert summary["status"] == "done" and summary["tagged"] == N, summary
        assert svc.store.image_count == N


def test_one_postgresql_state_read_under_another_time_zone_is_the_same_state(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two daemons of one shared state whose sessions have another time zone or date style
    (``PGTZ`` on one host, a promoted standby's own ``timezone`` in its postgresql.conf, a
    role's ``SET timezone``): the state's digest was made of the first migration's time as
    text, which those settings change, so a start while the other daemon had a manifest
    linked into ``.work`` and not yet recorded (or settled, its move not finished) was
    refused (exit 2) as "another PostgreSQL state" -- the very one."""
    from fashiontag_pipeline.daemon.leases import PostgresClaimLedger

    inbox = tmp_path / "in"
    (inbox / ".work").mkdir(parents=True)
    (inbox / ".work" / "m.csv").write_bytes(b"id,url\n1,https://img.example/1.jpg\n")
    first = PostgresClaimLedger(postgres_url, owner="a")
    try:
        watched_shared(inbox, postgres_url, first.identity(), frozenset)
    finally:
        first.close()
    monkeypatch.setenv("PGTZ", "Pacific/Chatham")
    monkeypatch.setenv("PGDATESTYLE", "SQL, DMY")
    second = PostgresClaimLedger(postgres_url, owner="b")
    try:
        # The file linked into .work by daemon a, not yet recorded: held by neither.
        watched_shared(inbox, postgres_url, second.identity(), frozenset)
    finally:
        second.close()


def test_a_rollback_after_a_shared_daemon_still_refuses_a_sqlite_state(tmp_path: Path) -> None:
    """A shared daemon of this build stopped with a manifest in flight, the package rolled back
    to a build of 2026-11-27 (a bad upgrade), the daemon started on its SQLite state: those
    builds read the note whole, stripped, as ``postgresql`` or else a state file's path. The
    note held the digest and names on two more lines, so the older build took it for the path
    of a state file that is not there, found no claim in it, and sent (and billed) every row
    of the manifest in ``.work`` again. The note older builds read is as they wrote it; the
    digest is kept beside it, and is forgotten once an older build writes the note again."""
    inbox = tmp_path / "in"
    (inbox / ".work").mkdir(parents=True)
    (inbox / ".work" / "m.csv").write_bytes(b"id,url\n1,https://img.example/1.jpg\n")
    fleet = ("a" * 24, "database fleet, schema public")
    watched_shared(inbox, "postgresql://db.example/fleet", fleet)
    # (fashiontag_pipeline 87de1c4 and before: check_state_moved, its reading of the note)
    assert os.fsdecode((inbox / STATE_MARK).read_bytes()).strip() == "postgresql"
    with pytest.raises(StateConflictError, match="in the PostgreSQL state"):
        lock_watched(inbox, tmp_path / "new.sqlite")
    other = ("b" * 24, "database other, schema public")
    with pytest.raises(StateConflictError, match="database fleet, schema public"):
        watched_shared(inbox, "postgresql://db.example/other", other)
    (inbox / STATE_MARK).write_bytes(b"postgresql")  # an older build's daemon (which state?)
    watched_shared(inbox, "postgresql://db.example/other", other)  # (not fleet's, surely)
    with pytest.raises(StateConflictError, match="database other, schema public"):
        watched_shared(inbox, "postgresql://db.example/fleet", fleet)
