"""``fashiontag_oldest_pending_seconds`` against what the daemon really holds: a manifest whose
rows flow through a slow service a few at a time (a real daemon, a real service)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import DaemonProcess, drop_atomic, metric_samples, read_lines, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")

OLDEST = ("fashiontag_oldest_pending_seconds", ())


async def test_oldest_pending_is_the_age_of_a_row_not_of_its_manifest(tmp_path: Path) -> None:
    """The gauge is documented as the age of the oldest row taken in without an outcome (an
    alert on rows stuck at the service). It was the time since the manifest became active:
    a manifest whose rows flowed (a task's results every second or two) showed it growing
    without end, 8 s after 8 s, 3 hours for a 3-hour catalogue, so that the alert fired on
    every big manifest, or was set too high to catch a task the service holds. It is now
    the age of the oldest rows taken in that have no outcome (counted each second)."""
    config = tmp_path / "small-batches.toml"
    config.write_text("[engine]\nread_batch_rows = 10\n")
    extra = ["--config", str(config), "--max-pending-rows", "30"]
    extra += ["--rotate-min-images", "10", "--rotate-images", "30", "--rotate-seconds", "0.5"]
    ids = [f"k{i}" for i in range(1500)]
    async with running_service(ServiceConfig(rate=100.0)) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=extra).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "m.csv", write_manifest(Path(), ids))
            results = daemon.outbox / "m" / "results.jsonl"
            with anyio.fail_after(30):
                while not read_lines(results):
                    daemon.check_alive()
                    await anyio.sleep(0.05)
            first = time.monotonic()
            seen: list[tuple[float, float, int]] = []
            with anyio.fail_after(60):
                while time.monotonic() - first < 8.0:
                    oldest = metric_samples((await daemon.get("/metrics"))[1])[OLDEST]
                    seen.append((time.monotonic() - first, oldest, len(read_lines(results))))
                    await anyio.sleep(0.5)
            assert len(read_lines(results)) < len(ids), "the manifest ended before 8 s"
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    # Rows came out all along, a task's at a time: after each burst, the rows without an
    # outcome are ones taken in since the burst before (by then the manifest was seconds old).
    grew = [seen[i] for i in range(1, len(seen)) if seen[i][2] > seen[i - 1][2]]
    assert len(grew) >= 2, seen
    young = [(round(t, 1), round(age, 1)) for t, age, _ in seen if t >= 2.0 and age < t - 1.0]
    assert young, f"the gauge grew with the manifest's age: {seen}"
