"""A ``--reuse`` store held open for weeks by a daemon, beside a nightly ``reuse prune`` and a
cleanup of empty files."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.daemon.room import WATCH_INTERVAL
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import DaemonProcess, drop_atomic, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")


def _reuse(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "fashiontag_pipeline", "reuse", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def _rows(stats: subprocess.CompletedProcess[str]) -> int | None:
    found = re.search(r"rows (\d+)", stats.stdout)
    return int(found.group(1)) if stats.returncode == 0 and found else None


async def test_a_cleanup_of_empty_files_after_a_prune_leaves_the_store_whole(
    tmp_path: Path,
) -> None:
    """``reuse prune`` checkpoints the store's WAL down to 0 bytes; a ``find /data -empty
    -delete`` then took the ``-wal`` of the store a daemon held open. The daemon's results went
    on into the removed file: every other process opening the store meanwhile (``reuse
    stats``, a cron ``fashiontag run --reuse``) failed, "disk I/O error", until the daemon
    stopped, and a kill -9 of the daemon lost the results stored since (tagged, and billed,
    again when those images came again)."""
    store = tmp_path / "reuse.db"
    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=["--reuse", str(store)]).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "m1.csv", write_manifest(Path(), ["a", "b", "c"]))
            assert (await daemon.wait_summary("m1"))["status"] == "done"
            pruned = _reuse("prune", str(store), "--older-than", "30d")
            assert pruned.returncode == 0, pruned.stderr
            wal = Path(f"{store}-wal")
            emptied = wal.stat().st_size == 0
            if emptied:  # find /data -empty -delete
                wal.unlink()
            drop_atomic(daemon.inbox, "m2.csv", write_manifest(Path(), ["d", "e"], url_tag="x"))
            assert (await daemon.wait_summary("m2"))["status"] == "done"
            beside = _reuse("stats", str(store))
            await daemon.kill()
        finally:
            daemon.ensure_dead()
    after = _reuse("stats", str(store))
    # Before: the -wal emptied and taken; stats beside the daemon failed ("disk I/O error"),
    # and after the kill -9 the store held m1's 3 results, m2's 2 lost.
    assert (emptied, _rows(beside), _rows(after)) == (False, 5, 5), (
        f"beside the daemon: {beside.stdout}{beside.stderr[-300:]}; after the kill:"
        f" {after.stdout}{after.stderr[-300:]}"
    )


def _old(path: Path) -> bool:
    try:
        return time.time() - path.stat().st_mtime > 30 * 86400
    except FileNotFoundError:
        return False


async def test_an_idle_daemon_keeps_its_store_from_a_cleanup_by_age(tmp_path: Path) -> None:
    """A daemon idle for a month (or storing a few results a day: its WAL is copied into the
    file only every 4 MiB) wrote no file of its ``--reuse`` store: a retention cleanup
    (``find /data -mtime +30 -delete``) took the store, its ``-wal`` and ``-shm`` from under
    it, while the daemon's state beside it was kept. Restarted, the daemon made an empty store:
    every image it had tagged was tagged, and billed, again."""
    store = tmp_path / "reuse.db"
    extra = ["--state", str(tmp_path / "a.db"), "--reuse", str(store)]
    async with running_service(ServiceConfig()) as svc:
        first = DaemonProcess(tmp_path, svc.url, extra=extra).start()
        second = DaemonProcess(tmp_path, svc.url, extra=extra)
        try:
            await first.wait_ready_endpoint()
            drop_atomic(first.inbox, "m1.csv", write_manifest(Path(), ["a", "b", "c"]))
            assert (await first.wait_summary("m1"))["status"] == "done"
            kept = [store, Path(f"{store}-wal"), Path(f"{store}-shm")]
            assert all(path.exists() for path in kept), [p.name for p in kept if not p.exists()]
            month_ago = time.time() - 31 * 86400
            for path in kept:
                os.utime(path, (month_ago, month_ago))
            with anyio.move_on_after(3 * WATCH_INTERVAL + 2):
                while any(_old(path) for path in kept):
                    await anyio.sleep(0.05)
            taken = [path.name for path in kept if _old(path)]
            for path in kept:  # find -mtime +30 -delete
                if _old(path):
                    path.unlink()
            assert await first.stop() == 0
            second.start()
            await second.wait_ready_endpoint()
            drop_atomic(second.inbox, "m2.csv", write_manifest(Path(), ["a", "b", "c", "d"]))
            assert (await second.wait_summary("m2"))["status"] == "done"
            assert await second.stop() == 0
        finally:
            first.ensure_dead()
            second.ensure_dead()
        billed = sum(len(task.ids) for task in svc.store.tasks.values())
    # Before: all three taken, and m2's a, b, c tagged again: 7 rows billed, not 4.
    assert (taken, billed) == ([], 4), f"taken by the cleanup: {taken}"
