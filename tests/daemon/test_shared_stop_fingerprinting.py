"""A shared daemon (PostgreSQL state) drained by SIGTERM while the engine of a manifest it has
leased fingerprints it (the SHA-256 of a large manifest the run compares on a resume).

Found in review of the nineteenth session's fix for ``fashiontag run`` (the hash gives up
between two blocks on a stop): the daemon's engine is stopped the same way, and the hash's
InterruptedError (an OSError) left the manifest's run as no error the daemon handles."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from ..slow_share import slow_hash
from .helpers import BootedDaemon, DaemonProcess, drop_atomic, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")

#: A slow share: the engine's fingerprint reads 4 KiB blocks, 50 ms each, and says when it has
#: begun (the claim's own hash, in ``daemon.names``, is left as it is).
_SLOW_FINGERPRINT = slow_hash("engine.manifests", "_READ", 0.05)


async def test_sigterm_while_a_leased_manifest_is_fingerprinted_hands_it_back(
    tmp_path: Path, postgres_url: str
) -> None:
    ids = [f"f{i:05d}" for i in range(16000)]  # ~620 KiB: ~150 blocks of 4 KiB, ~8 s
    begun = tmp_path / "hash-begun"
    extra = ("--state", postgres_url, "--lease", "60", "--drain-timeout", "5")
    async with running_service(ServiceConfig()) as svc:
        env = {"FT_SLOW": str(begun)}
        daemon: DaemonProcess = BootedDaemon(
            tmp_path, svc.url, env=env, extra=extra, boot=_SLOW_FINGERPRINT
        ).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "big.csv", write_manifest(Path(), ids))
            with anyio.fail_after(60):
                while not begun.exists():
                    daemon.check_alive()
                    await anyio.sleep(0.01)
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait_exit(timeout=60) == 0, daemon.tail(30)
            assert svc.store.image_count == 0
            daemon = DaemonProcess(tmp_path, svc.url, extra=extra).start()
            summary = await daemon.wait_summary("big", timeout=90)
            assert summary["status"] == "done" and summary["tagged"] == len(ids), summary
            assert svc.store.image_count == len(ids), "rows billed twice"
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
