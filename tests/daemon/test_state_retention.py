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


def _empty_files_deleted(root: Path) -> list[str]:
    """``find ROOT -type f -empty -delete``: the names it took."""
    taken = []
    for path in sorted(root.rglob("*")):
        if path.name.startswith("daemon-"):  # (the test's logs of the daemons)
            continue
        if path.is_file() and not path.is_symlink() and path.stat().st_size == 0:
            path.unlink()
            taken.append(path.name)
    return taken


async def test_a_cleanup_of_empty_files_leaves_an_idle_daemons_state_whole(
    tmp_path: Path,
) -> None:
    """Restarted, a daemon that commits nothing (idle) holds its state with an empty ``-wal``
    (SQLite makes it at the first read): a nightly ``find /data -empty -delete`` took it, the
    daemon's commits went on into the removed file, and a kill -9 (a crash, an OOM kill) lost
    them all: restarted, the manifest done meanwhile was forgotten, its content dropped again
    tagged (and billed) again."""
    state = tmp_path / "a.db"
    async with running_service(ServiceConfig()) as svc:
        store = svc.app[STATE].store
        daemons = [DaemonProcess(tmp_path, svc.url, extra=["--state", str(state)]) for _ in "abc"]
        try:
            await daemons[0].start().wait_ready_endpoint()  # (the state made, then idle)
            assert await daemons[0].stop() == 0
            second = daemons[1].start()
            await second.wait_ready_endpoint()
            taken = _empty_files_deleted(tmp_path)
            drop_atomic(second.inbox, "m1.csv", write_manifest(Path(), ["a", "b", "c"]))
            assert (await second.wait_summary("m1"))["status"] == "done"
            await second.kill()
            third = daemons[2].start()
            await third.wait_ready_endpoint()
            drop_atomic(third.inbox, "again.csv", write_manifest(Path(), ["a", "b", "c"]))
            summary = await third.wait_summary("again")
            assert await third.stop() == 0
        finally:
            for daemon in daemons:
                daemon.ensure_dead()
        billed = sum(len(task.ids) for task in store.tasks.values())
    # Before: a.db-wal taken, "again" done (not a duplicate), 6 rows billed.
    assert (summary["status"], summary["duplicate_of"], billed) == ("duplicate", "m1.csv", 3), (
        f"taken by the cleanup: {taken}; {summary}"
    )


async def test_a_restart_says_so_of_a_manifest_a_cleanup_took_from_work(tmp_path: Path) -> None:
    """A manifest dropped with the time of its export weeks ago (``mv``, ``rsync -a``, ``cp
    -p`` keep it) keeps it in ``.work``: a retention cleanup took it there while in flight,
    and the daemon restarted meanwhile (an upgrade) dropped the claim without a word: its rows
    sent (and billed), no summary, nothing in the log to say why."""
    state = tmp_path / "a.db"
    async with running_service(ServiceConfig(rate=10.0)) as svc:  # (4 s a task of 40)
        first = DaemonProcess(tmp_path, svc.url, extra=["--state", str(state)]).start()
        second = DaemonProcess(tmp_path, svc.url, extra=["--state", str(state)])
        try:
            await first.wait_ready_endpoint()
            part = first.inbox / ".m.part"
            part.write_bytes(write_manifest(Path(), [f"r{i}" for i in range(40)]))
            os.utime(part, (time.time() - _MONTH, time.time() - _MONTH))
            os.rename(part, first.inbox / "m.csv")
            claimed = first.inbox / ".work" / "m.csv"
            await _until(lambda: bool(svc.store.tasks), 20)
            assert _old(claimed)
            claimed.unlink()  # find /data -mtime +30 -delete
            assert await first.stop() == 0
            second.start()
            await second.wait_ready_endpoint()
            await _until(lambda: any("m.csv" in str(line) for line in second.logs()), 3)
            said = [line for line in second.logs() if "m.csv" in str(line)]
            assert await second.stop() == 0
        finally:
            first.ensure_dead()
            second.ensure_dead()
    # Before: nothing said of m.csv at the restart.
    assert [line["level"] for line in said] == ["warning"], said
    assert "no longer in .work" in said[0]["event"] and "billed" in said[0]["event"], said
