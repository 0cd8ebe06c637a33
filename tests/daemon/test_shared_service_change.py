"""Daemons sharing a PostgreSQL state, one of them given another ``--base-url`` (a unit file
edited on one machine only, a canary pointed at staging) or another account's key.

A manifest whose tasks are on the first service, taken over by a daemon given a second one:
the taker took every such task as forgotten (the second answers 404) and sent its rows, and
billed them, to the second service, while the first still tagged them. The SQLite daemon and
``fashiontag run`` have refused such a resume since the ninth session. A shared daemon now
asks, as they do, when it resumes a manifest begun elsewhere: one that meets tasks its
service does not know hands the manifest back untouched (for a daemon given the service it
was begun on), logging an error naming that service, and goes on with the other manifests.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import psycopg
import pytest
from psycopg import sql

from fashiontag_pipeline.daemon.keeper import ForeignClaims
from fashiontag_pipeline.service import ServiceConfig, running_service

from ..engine.proxy import Misbehaviour, misbehaving
from .helpers import DaemonProcess, drop_atomic, read_lines, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")

N = 600


def _claims_with_tasks(url: str) -> int:
    """How many claim states of the database hold a task (a create's answer committed)."""
    with psycopg.connect(url.partition("#")[0], autocommit=True) as conn:
        schemas = [
            row[0]
            for row in conn.execute(
                "SELECT table_schema FROM information_schema.tables"
                " WHERE table_name = 'tasks' AND table_schema LIKE %s",
                ("%claim\\_%",),
            )
        ]
        return sum(
            1
            for schema in schemas
            if conn.execute(
                sql.SQL("SELECT count(*) FROM {}.tasks").format(sql.Identifier(schema))
            ).fetchone()
            != (0,)
        )


def _common(url: str) -> list[str]:
    return ["--state", url, "--lease", "2"]


@pytest.mark.parametrize(
    "elsewhere", ["another service", "another language", "the same one by another name"]
)
async def test_a_manifest_taken_over_by_a_daemon_on_another_service_bills_no_row_there(
    tmp_path: Path, postgres_url: str, elsewhere: str
) -> None:
    ids = [f"s{i}" for i in range(N)]
    async with (
        running_service(ServiceConfig(rate=300.0)) as first,
        running_service(ServiceConfig()) as other,
        misbehaving(first.url, Misbehaviour()) as proxy,
    ):
        daemon = DaemonProcess(tmp_path, first.url, extra=_common(postgres_url)).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "m.csv", write_manifest(Path(), ids))
            with anyio.fail_after(30):
                while first.store.image_count < N or not _claims_with_tasks(postgres_url):
                    daemon.check_alive()
                    await anyio.sleep(0.05)
            await daemon.kill()
            url = other.url if elsewhere == "another service" else proxy.url
            extra = ["--language", "ko"] if elsewhere == "another language" else []
            daemon = DaemonProcess(
                tmp_path, url, port=daemon.port, extra=[*_common(postgres_url), *extra]
            ).start()
            if elsewhere != "the same one by another name":
                said = (
                    f"--base-url {first.url}" if elsewhere == "another service" else "--language en"
                )
                with anyio.fail_after(60):
                    while "handed back" not in daemon.tail(200):
                        daemon.check_alive()  # (it goes on: other manifests are its to tag)
                        await anyio.sleep(0.1)
                assert said in daemon.tail(200)
                await anyio.sleep(3)  # a lease and a half: it does not take the manifest again
                assert daemon.tail(200).count("handed back") == 1
                assert other.store.image_count == 0  # nothing sent (billed) there
                assert not (daemon.outbox / "m" / "summary.json").exists()
                # A daemon given what the manifest was begun with finishes it, beside it.
                right = DaemonProcess(tmp_path, first.url, extra=_common(postgres_url)).start()
                try:
                    summary = await right.wait_summary("m", timeout=90)
                    assert await right.stop() == 0
                finally:
                    right.ensure_dead()
                daemon.check_alive()
            else:
                summary = await daemon.wait_summary("m", timeout=90)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
        assert summary["status"] == "done" and summary["tagged"] == N, summary
        assert first.store.image_count == N and other.store.image_count == 0
    got = [line["id"] for line in read_lines(daemon.outbox / "m" / "results.jsonl")]
    assert len(got) == len(set(got)) and sorted(got) == sorted(ids)


def test_a_manifest_left_to_other_daemons_is_asked_about_again_later() -> None:
    """Found in review: a manifest handed back was never leased again by that daemon, even
    once its first service was shut down (the question would then let it resume there), and
    the set of such manifests grew for the daemon's whole life. Each is left alone for
    FOREIGN_RETRY seconds, then asked about again."""
    now = [0.0]
    foreign = ForeignClaims(retry=600.0, clock=lambda: now[0])
    foreign.add(7)
    now[0] = 300.0
    foreign.add(3)
    assert foreign.current() == [3, 7]
    now[0] = 650.0
    assert foreign.current() == [3]  # 7's time is up: leased, and asked, again
    now[0] = 1000.0
    assert foreign.current() == []
