"""A ``--reuse`` store held open for weeks by a daemon, beside a nightly ``reuse prune`` and a
cleanup of empty files."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
