"""The open task held for a burst's next manifest must not wait for rows that cannot come."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import DaemonProcess, drop_atomic, read_lines, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")


async def test_a_manifest_read_under_the_pending_rows_bound_does_not_linger(
    tmp_path: Path,
) -> None:
    """A manifest larger than ``--max-pending-rows`` is read a bound at a time: its reader
    waits for the rows taken in to get their results, and says IDLE so that the open task
    is sealed. Before, the open task was held for that same manifest's next rows (claimed,
    not read to the end) until ``--linger`` after the last rows, which could not come
    before that task's results: every bound's worth of rows waited ``--linger`` more."""
    ids = [f"g{i}" for i in range(20000)]
    # (Tasks of 50,000 rows: a daemon's tasks grow with the images it sent, to 50,000.)
    linger = 20  # (a bound's wait that lingers takes this long at least: the test's margin)
    extra = ["--max-pending-rows", "1000", "--linger", str(linger), "--rotate-seconds", "60"]
    extra += ["--rotate-min-images", "50000", "--rotate-images", "50000"]
    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=extra).start()
        try:
            await daemon.wait_ready_endpoint()
            started = time.monotonic()
            drop_atomic(daemon.inbox, "big.csv", write_manifest(Path(), ids))
            summary = await daemon.wait_summary("big", timeout=60)
            took = time.monotonic() - started
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    assert summary["status"] == "done" and summary["tagged"] == len(ids)
    assert len(read_lines(daemon.outbox / "big" / "results.jsonl")) == len(ids)
    # (11.4-11.7 s at --linger 8, one of the bounds' waits lingering; 3.4-3.7 s now, 10.9 s
    # under a CI run's load: less than one linger either way.)
    assert took < linger, f"{took:.1f} s for {len(ids)} rows (--linger {linger})"
