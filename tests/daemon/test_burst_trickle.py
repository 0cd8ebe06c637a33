"""A steady trickle of small manifests, each dropped closer to the last than ``--linger``: the
open task is held for the next of them (a burst shares tasks), but not for as long as the
trickle lasts, or the first manifest's results wait ``--rotate-seconds``."""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service
from fashiontag_pipeline.service.context import STATE

from .helpers import DaemonProcess, drop_atomic, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")


async def test_a_trickle_of_manifests_does_not_hold_the_first_ones_results(
    tmp_path: Path,
) -> None:
    """Before, the open task was held while a manifest was claimed and not read to the end or
    files were ready or settling, until no rows came for ``--linger``: files dropped every
    ``--linger``/2 kept it open until ``--rotate-seconds`` (8 s here, 30 by default), and the
    first manifest's results waited as long. Now a task is held for more of a burst at most
    3 ``--linger`` past its first rows: the first results come after ~2 s, and the trickle
    still shares tasks (a few, not one per manifest)."""
    linger, every, lasting = 0.5, 0.25, 9.0
    async with running_service(ServiceConfig(task_ttl=120.0)) as svc:
        extra = ["--linger", str(linger), "--rotate-seconds", "8", "--max-active", "64"]
        # (Files settle 0.6 s, longer than the drops' interval: one is always settling.)
        daemon = DaemonProcess(tmp_path, svc.url, extra=extra, settle=0.6).start()
        try:
            await daemon.wait_ready_endpoint()
            started = time.monotonic()
            first_after: float | None = None
            n = 0
            while time.monotonic() - started < lasting:
                daemon.check_alive()
                data = write_manifest(Path(), [f"r{i}" for i in range(1 + n % 5)], url_tag=f"{n}-")
                drop_atomic(daemon.inbox, f"t{n}.csv", data)
                n += 1
                await anyio.sleep(every)
                if first_after is None and (daemon.outbox / "t0" / "summary.json").exists():
                    first_after = time.monotonic() - started
            for k in range(n):
                summary = await daemon.wait_summary(f"t{k}", timeout=30)
                assert summary["status"] == "done" and summary["tagged"] == 1 + k % 5, k
            tasks = len(svc.app[STATE].store.tasks)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    # (0.6 s to settle, held 1.5 s at most past the first rows, then its results are read.)
    assert first_after is not None and first_after < 5.0, (
        f"the first manifest's results after {first_after} s of a {lasting:g} s trickle"
    )
    assert tasks <= n // 3, f"{tasks} tasks for {n} manifests"
