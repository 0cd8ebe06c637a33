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

from fashiontag_pipeline.daemon.config import DEFAULT_STATE_NAME
from fashiontag_pipeline.service import ServiceConfig, running_service

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
