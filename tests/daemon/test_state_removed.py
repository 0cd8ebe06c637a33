"""A daemon's SQLite state (or its ``-wal``, or its ``--reuse`` store) removed outright under it
(``rm state.db``, a cleanup by name): the daemon went on committing into the removed file,
saying nothing, and its next start began an empty state (the manifests done forgotten: the
same content dropped again was tagged, and billed, again)."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.cli.common import EXIT_ERROR
from fashiontag_pipeline.daemon.room import WATCH_INTERVAL
from fashiontag_pipeline.service import ServiceConfig, running_service
from fashiontag_pipeline.service.app import STATE

from .helpers import DaemonProcess, drop_atomic, read_lines, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")


@pytest.mark.parametrize("removed", ["a.db", "a.db-wal", "a.db-shm", "store.db"])
async def test_a_daemon_stops_when_its_state_file_is_removed(tmp_path: Path, removed: str) -> None:
    """Stopped (exit 1, an error naming the file), the state written back from the open one
    when its file was removed: restarted, the same content is a duplicate, not billed again."""
    state = tmp_path / "a.db"
    extra = ["--state", str(state), "--reuse", str(tmp_path / "store.db")]
    async with running_service(ServiceConfig()) as svc:
        first = DaemonProcess(tmp_path, svc.url, extra=extra).start()
        second = DaemonProcess(tmp_path, svc.url, extra=extra)
        try:
            await first.wait_ready_endpoint()
            drop_atomic(first.inbox, "m1.csv", write_manifest(Path(), ["a", "b", "c"]))
            assert (await first.wait_summary("m1"))["status"] == "done"
            (tmp_path / removed).unlink()
            with anyio.move_on_after(3 * WATCH_INTERVAL + 5):
                while first.proc is not None and first.proc.poll() is None:
                    await anyio.sleep(0.05)
            code = first.proc.poll() if first.proc is not None else None
            # Before: the daemon went on (code None, nothing said).
            assert code == EXIT_ERROR, first.tail(5)
            said = [line for line in first.logs() if line.get("level") == "error"]
            assert said and str(tmp_path / removed) in str(said), first.tail(5)
            second.start()
            await second.wait_ready_endpoint()
            drop_atomic(second.inbox, "again.csv", write_manifest(Path(), ["a", "b", "c"]))
            summary = await second.wait_summary("again")
            assert await second.stop() == 0
        finally:
            first.ensure_dead()
            second.ensure_dead()
        billed = sum(len(task.ids) for task in svc.app[STATE].store.tasks.values())
    assert (summary["status"], billed) == ("duplicate", 3), (summary, second.tail(5))
    assert sorted(p.name for p in tmp_path.glob("*.back*")) == []


async def test_a_manifest_in_flight_when_the_state_is_removed_is_finished_once(
    tmp_path: Path,
) -> None:
    """The state file removed while a manifest is in flight: the daemon stops (exit 1), the
    state written back; the restart resumes the manifest, is killed (-9) half way, and the
    next finishes it: every row written once, and billed once."""
    state = tmp_path / "a.db"
    extra = ["--state", str(state), "--max-pending-rows", "3000"]
    ids = [f"p{i}" for i in range(8000)]
    results = tmp_path / "outbox" / "big" / "results.jsonl"

    async def until_written(daemon: DaemonProcess, rows: int) -> None:
        with anyio.fail_after(60):
            while len(read_lines(results)) < rows:
                daemon.check_alive()
                await anyio.sleep(0.05)

    async with running_service(ServiceConfig(rate=2000.0)) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=extra).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "big.csv", write_manifest(Path(), ids))
            await until_written(daemon, 1500)
            state.unlink()
            assert await daemon.wait_exit(3 * WATCH_INTERVAL + 5) == EXIT_ERROR
            daemon = DaemonProcess(tmp_path, svc.url, extra=extra).start()
            await until_written(daemon, 4500)
            await daemon.kill()
            daemon = DaemonProcess(tmp_path, svc.url, extra=extra).start()
            summary = await daemon.wait_summary("big", timeout=90)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
        billed = sum(len(task.ids) for task in svc.app[STATE].store.tasks.values())
    written = [row["id"] for row in read_lines(results)]
    written += [row["id"] for row in read_lines(results.with_name("rejects.jsonl"))]
    assert (summary["status"], billed, len(written), set(written)) == ("done", 8000, 8000, set(ids))
