"""Daemons on one PostgreSQL upgraded one at a time: the first daemon of a newer fashiontag
migrates the database; a daemon of this version still running beside it must not take the
manifests it can no longer tag.

Before: each manifest it leased (its state opened on the migrated database) stopped on
"schema version 5; this fashiontag knows up to 4: upgrade fashiontag", was leased again, and
after 6 attempts was moved to failed/ ("manifest cannot be read"), while the daemon went on
doing the same to every manifest it won from the upgraded daemons.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from fashiontag_pipeline._postgres import SCHEMA_VERSION
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import DaemonProcess, drop_atomic, read_lines, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals and unix sockets")


def _daemon(root: Path, service: str, url: str) -> DaemonProcess:
    return DaemonProcess(root, service, extra=["--state", url, "--lease", "2"])


def _migrated_by_a_newer_fashiontag(url: str) -> None:
    """What a newer build's first start leaves: one more step in ``schema_version``."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO schema_version (version, description) VALUES (%s, 'a newer step')",
            (SCHEMA_VERSION + 1,),
        )


def _upgraded_back(url: str) -> None:
    """(This build stands in for the newer one that finishes the work.)"""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM schema_version WHERE version > %s", (SCHEMA_VERSION,))


async def test_a_daemon_of_an_older_version_stops_and_fails_no_manifest(
    tmp_path: Path, postgres_url: str
) -> None:
    ids = [f"u{i}" for i in range(300)]
    async with running_service(ServiceConfig()) as svc:
        old = _daemon(tmp_path, svc.url, postgres_url).start()
        try:
            await old.wait_ready_endpoint()
            _migrated_by_a_newer_fashiontag(postgres_url)
            drop_atomic(old.inbox, "m.csv", write_manifest(Path(), ids))
            code = await old.wait_exit(timeout=15)
        finally:
            old.ensure_dead()
        log = old.tail(8)
        assert code == 1, log
        assert f"schema version {SCHEMA_VERSION + 1}" in log and "upgrade" in log, log
        stopped = [line for line in old.logs() if line.get("event") == "manifest cannot be read"]
        assert not stopped, log
        assert not (old.inbox / "failed" / "m.csv").exists()
        assert (old.inbox / ".work" / "m.csv").exists()  # still claimed, for another daemon

        _upgraded_back(postgres_url)
        new = _daemon(tmp_path, svc.url, postgres_url).start()
        try:
            summary = await new.wait_summary("m", timeout=30)
            assert await new.stop() == 0
        finally:
            new.ensure_dead()
    assert summary["status"] == "done", summary
    got = [r["id"] for r in read_lines(tmp_path / "outbox" / "m" / "results.jsonl")]
    assert sorted(got) == sorted(ids)
    assert (tmp_path / "inbox" / "done" / "m.csv").exists()
