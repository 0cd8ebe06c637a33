"""Equal content dropped twice under two names on a daemon with a PostgreSQL ``--state``
(found by the daemon's kill fuzz, ``test_daemon_kill_fuzz``, seed 9)."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import DaemonProcess, drop_atomic, read_lines, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")


async def test_a_copy_dropped_while_its_content_is_in_flight_is_a_duplicate(
    tmp_path: Path, postgres_url: str
) -> None:
    """One daemon with a shared PostgreSQL state; ``m.csv`` is being tagged when ``copy.csv``,
    the same bytes, is dropped. The copy was leased beside it and tagged as well: every row
    billed twice, although docs/postgresql.md says that with one daemon the second waits for
    the first (and is its duplicate), as with a SQLite state."""
    ids = [f"d{i}" for i in range(1500)]
    data = write_manifest(Path(), ids)
    async with running_service(ServiceConfig(rate=1500.0)) as svc:
        extra = ["--state", postgres_url, "--lease", "2"]
        daemon = DaemonProcess(tmp_path, svc.url, extra=extra).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "m.csv", data)
            with anyio.fail_after(30):
                while not (daemon.inbox / ".work" / "m.csv").exists():
                    daemon.check_alive()
                    await anyio.sleep(0.02)
            drop_atomic(daemon.inbox, "copy.csv", data)
            first = await daemon.wait_summary("m", timeout=60)
            copy = await daemon.wait_summary("copy", timeout=60)
            with anyio.fail_after(30):
                while not (daemon.inbox / "done" / "copy.csv").exists():
                    daemon.check_alive()
                    await anyio.sleep(0.05)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
        billed = svc.store.image_count
    assert first["status"] == "done"
    assert sorted(r["id"] for r in read_lines(tmp_path / "outbox" / "m" / "results.jsonl")) == (
        sorted(ids)
    )
    assert (copy["status"], copy["duplicate_of"]) == ("duplicate", "m.csv"), copy
    assert billed == len(ids), f"{billed - len(ids)} rows billed twice"


async def test_a_claim_resumed_as_a_duplicate_leaves_no_epoch_files(
    tmp_path: Path, postgres_url: str
) -> None:
    """A daemon with a shared PostgreSQL state is killed while ``m.csv`` is being tagged (its
    rejects written to its lease's hidden ``.rejects.e1.jsonl``); its copy, dropped meanwhile,
    is completed by the next daemon before the lease ends, so ``m.csv``, leased again, is its
    duplicate. The hidden files of the dead lease stayed in ``OUTBOX/m`` for ever beside a
    summary that says ``duplicate`` (a takeover that completes deletes them)."""
    lines = ["id,url,brand"] + [f"d{i},https://img.example/{i}.jpg,acme" for i in range(300)]
    lines += [f"bad{i},ftp://nope/{i}.jpg,acme" for i in range(20)]
    data = ("\n".join(lines) + "\n").encode()
    # The copy must be done before m.csv's lease ends: b's start and 320 rows at 200/s took
    # over 4 s (the lease this had) on a loaded machine now and then, m.csv was taken over
    # first and the copy was its duplicate. (m.csv waits out the lease: 10 s more at most.)
    extra = ["--state", postgres_url, "--lease", "10"]
    async with running_service(ServiceConfig(rate=200.0)) as svc:
        a = DaemonProcess(tmp_path, svc.url, extra=extra).start()
        b: DaemonProcess | None = None
        try:
            await a.wait_ready_endpoint()
            drop_atomic(a.inbox, "m.csv", data)
            hidden = a.outbox / "m" / ".rejects.e1.jsonl"
            with anyio.fail_after(30):
                while not read_lines(hidden):
                    a.check_alive()
                    await anyio.sleep(0.01)
            await a.kill()
            drop_atomic(a.inbox, "copy.csv", data)
            b = DaemonProcess(tmp_path, svc.url, extra=extra).start()
            copy = await b.wait_summary("copy", timeout=60)
            first = await b.wait_summary("m", timeout=60)
            assert await b.stop() == 0
        finally:
            a.ensure_dead()
            if b is not None:
                b.ensure_dead()
    assert copy["status"] == "done"
    assert (first["status"], first["duplicate_of"]) == ("duplicate", "copy.csv"), first
    assert sorted(p.name for p in (tmp_path / "outbox" / "m").glob(".re*")) == []
