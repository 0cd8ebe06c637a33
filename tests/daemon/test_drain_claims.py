"""A manifest dropped while the daemon drains (SIGTERM with writes in flight), or being hashed
for its claim when the signal comes, is not claimed: "stop claiming and reading"
(docs/daemon.md). It stays in the inbox, untouched, and the next start claims and tags it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, faults, running_service

from ..slow_share import slow_hash
from .helpers import BootedDaemon, DaemonProcess, drop_atomic, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")


async def test_a_manifest_dropped_while_draining_stays_in_the_inbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the claim loop went on scanning during the drain: a file ready then was claimed
    (moved to .work/, a job of the engine, "manifest claimed" logged after "draining: no more
    claims"), tens of milliseconds after the signal."""
    slow = [1.0]  # every request of the service takes this long (0 after the drain)
    monkeypatch.setattr(faults.FaultDice, "latency", lambda self: slow[0])
    spec = faults.FaultSpec(latency=1.0, latency_seconds=1.0)  # writes in flight: a drain
    async with running_service(ServiceConfig(faults=spec)) as svc:
        daemon = DaemonProcess(tmp_path, svc.url).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "a.csv", write_manifest(Path(), ["p0", "p1"]))
            with anyio.fail_after(20):
                while not any(e["event"] == "manifest claimed" for e in daemon.logs()):
                    daemon.check_alive()
                    await anyio.sleep(0.02)
            daemon.signal(signal.SIGTERM)
            with anyio.fail_after(20):
                while not any(e["event"].startswith("draining") for e in daemon.logs()):
                    daemon.check_alive()
                    await anyio.sleep(0.01)
            drop_atomic(daemon.inbox, "b.csv", write_manifest(Path(), ["q0"], url_tag="b"))
            (daemon.inbox / "b.csv.ready").write_bytes(b"")
            assert await daemon.wait_exit(timeout=30) == 0, daemon.tail()
            claimed = [e["manifest"] for e in daemon.logs() if e["event"] == "manifest claimed"]
            assert claimed == ["a.csv"], daemon.tail()
            assert (daemon.inbox / "b.csv").exists() and not (
                daemon.inbox / ".work" / "b.csv"
            ).exists()
            slow[0] = 0.0
            daemon = DaemonProcess(tmp_path, svc.url).start()
            summary = await daemon.wait_summary("b", timeout=30)
            assert summary["status"] == "done" and summary["tagged"] == 1, summary
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()


#: A slow share under the inbox: the claim's hash reads 4 KiB blocks, 200 ms each (~20 KiB/s),
#: and says when it has begun. ``FT_SLOW`` unset: as it is.
_SLOW_HASH = slow_hash("daemon.names", "HASH_BLOCK", 0.2)


async def test_sigterm_while_a_claim_hashes_a_large_manifest_stops_within_the_drain_timeout(
    tmp_path: Path,
) -> None:
    """Before, the drain waited for the hash to end, however long (the signal came: "draining:
    no more claims"), then claimed the manifest anyway: a 2.2 GB manifest took 7.8 s with
    ``--drain-timeout 1``, and one of tens of GB on a slow share outlasted systemd's
    ``TimeoutStopSec`` (SIGKILL). Here the hash would take ~30 s; the stop may take up to 10
    (a loaded CI machine: 2 cores, load 15)."""
    ids = [f"h{i:05d}" for i in range(16000)]  # ~620 KiB: ~150 blocks of 4 KiB
    begun = tmp_path / "hash-begun"
    async with running_service(ServiceConfig()) as svc:
        env = {"FT_SLOW": str(begun)}
        extra = ("--drain-timeout", "1")
        daemon = BootedDaemon(tmp_path, svc.url, env=env, extra=extra, boot=_SLOW_HASH).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "big.csv", write_manifest(Path(), ids))
            with anyio.fail_after(20):
                while not begun.exists():
                    daemon.check_alive()
                    await anyio.sleep(0.01)
            daemon.signal(signal.SIGTERM)
            signalled = time.monotonic()
            assert await daemon.wait_exit(timeout=60) == 0, daemon.tail()
            took = time.monotonic() - signalled
            assert took < 10.0, f"exited {took:.1f} s after SIGTERM: {daemon.tail(5)}"
            assert not any(e["event"] == "manifest claimed" for e in daemon.logs()), daemon.tail()
            assert (daemon.inbox / "big.csv").exists(), "the manifest left the inbox"
            assert not (daemon.inbox / ".work" / "big.csv").exists()
            daemon = DaemonProcess(tmp_path, svc.url).start()
            summary = await daemon.wait_summary("big", timeout=60)
            assert summary["status"] == "done" and summary["tagged"] == len(ids), summary
            assert svc.store.image_count == len(ids)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
