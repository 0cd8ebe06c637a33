"""A daemon's SQLite state kept from a retention cleanup (``find /data -mtime +30 -delete``)
while it runs idle for weeks: an idle daemon commits nothing, so its state file and the files
beside it aged with its uptime."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.daemon.room import WATCH_INTERVAL
from fashiontag_pipeline.service import ServiceConfig, running_service
from fashiontag_pipeline.service.app import STATE

from .helpers import DaemonProcess, drop_atomic, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")

#: A cleanup's age: a month and a day.
_MONTH = 31 * 86400


async def _until(done: Callable[[], bool], timeout: float) -> None:
    with anyio.move_on_after(timeout):
        while not done():
            await anyio.sleep(0.05)


def _old(path: Path) -> bool:
    try:
        return time.time() - path.stat().st_mtime > 30 * 86400
    except FileNotFoundError:
        return False


async def test_an_idle_daemon_keeps_its_state_from_a_cleanup_by_age(tmp_path: Path) -> None:
    """A month idle, then ``find /data -mtime +30 -delete``: the state file, its ``-wal`` and
    ``-shm`` and the inbox's ``.fashiontag-daemon.state`` went under the daemon, which went on
    on the removed file, saying nothing; restarted, it began an empty state: the manifests it
    had done were forgotten (the same content dropped again was tagged, and billed, again)."""
    state = tmp_path / "a.db"
    async with running_service(ServiceConfig()) as svc:
        store = svc.app[STATE].store
        first = DaemonProcess(tmp_path, svc.url, extra=["--state", str(state)]).start()
        second = DaemonProcess(tmp_path, svc.url, extra=["--state", str(state)])
        try:
            await first.wait_ready_endpoint()
            drop_atomic(first.inbox, "m1.csv", write_manifest(Path(), ["a", "b", "c"]))
            assert (await first.wait_summary("m1"))["status"] == "done"
            kept = [
                state,
                tmp_path / "a.db-wal",
                tmp_path / "a.db-shm",
                first.inbox / ".fashiontag-daemon.state",
            ]
            assert all(path.exists() for path in kept), [p.name for p in kept if not p.exists()]
            month_ago = time.time() - _MONTH
            for path in kept:
                os.utime(path, (month_ago, month_ago))
            await _until(lambda: not any(_old(path) for path in kept), 3 * WATCH_INTERVAL + 2)
            taken = [path.name for path in kept if _old(path)]
            for path in kept:  # find -mtime +30 -delete
                if _old(path):
                    path.unlink()
            first.check_alive()
            assert await first.stop() == 0
            second.start()
            await second.wait_ready_endpoint()
            drop_atomic(second.inbox, "again.csv", write_manifest(Path(), ["a", "b", "c"]))
            summary = await second.wait_summary("again")
            assert await second.stop() == 0
        finally:
            first.ensure_dead()
            second.ensure_dead()
        billed = sum(len(task.ids) for task in store.tasks.values())
    # Before: all four taken, the daemon silent, "again" done (not a duplicate), 6 billed.
    assert (taken, summary["status"], summary["duplicate_of"], billed) == (
        [],
        "duplicate",
        "m1.csv",
        3,
    ), f"taken by the cleanup: {taken}; {summary}"
