"""A real ``fashiontag daemon`` behind a results store that lags the task status (the daemon's
side of ``tests/engine/test_lagging_results.py``): a task's pages hold only its first half for
5 s after it is shown done, and every image is billed once."""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from ..engine.helpers import BilledProxy
from ..engine.proxy import Misbehaviour
from .helpers import DaemonProcess, drop_atomic, read_lines, until_results, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")

TASKS_OF_1000 = ["--rotate-images", "1000", "--rotate-min-images", "1000"]


async def test_a_daemon_behind_a_results_store_5_s_behind_its_status(tmp_path: Path) -> None:
    """With its defaults the daemon reads the second half of each task when it comes: 2,000
    rows, 2,000 billed, none rejected. Before, pages were read again for 3 s only: the second
    half of each task was sent (and billed) again to a new task whose pages lagged as well,
    and some rows ended ``unreturned`` after five sends."""
    ids = [f"p{i}" for i in range(2000)]
    proxy = BilledProxy(Misbehaviour(lagging_results=5.0))
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            daemon = DaemonProcess(tmp_path, proxy.url, extra=TASKS_OF_1000).start()
            try:
                await daemon.wait_ready_endpoint()
                drop_atomic(daemon.inbox, "m.csv", write_manifest(Path(), ids))
                summary = await daemon.wait_summary("m", timeout=60)
                assert await daemon.stop() == 0, daemon.tail()
            finally:
                daemon.ensure_dead()
            billed = svc.store.image_count
    results = read_lines(daemon.outbox / "m" / "results.jsonl")
    rejects = read_lines(daemon.outbox / "m" / "rejects.jsonl")
    assert len(results) == 2000 and len({r["id"] for r in results}) == 2000, summary
    assert not rejects, rejects[:3]
    twice = sum(1 for n in proxy.written.values() if n > 1)
    assert (billed, len(proxy.written), twice) == (2000, 2000, 0), "rows billed again"


async def test_sigterm_while_lagging_rows_are_awaited_drains_at_once_and_resumes(
    tmp_path: Path,
) -> None:
    """A SIGTERM while the daemon waits for a task's lagging rows (its first half written, the
    store 6 s behind) exits 0 at once, not after the window (30 s); the next start, once the
    lag is over, reads the task's pages again and bills no row twice."""
    ids = [f"p{i}" for i in range(1000)]
    proxy = BilledProxy(Misbehaviour(lagging_results=6.0))
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            daemon = DaemonProcess(tmp_path, proxy.url, extra=TASKS_OF_1000).start()
            try:
                await daemon.wait_ready_endpoint()
                drop_atomic(daemon.inbox, "m.csv", write_manifest(Path(), ids))
                await until_results(daemon, "m", 500, timeout=30)
                began = time.monotonic()
                assert await daemon.stop() == 0, daemon.tail()
                took = time.monotonic() - began
                (done_at,) = proxy.done_seen.values()
                await anyio.sleep(max(0.0, done_at + 6.5 - time.monotonic()))
                daemon.start()
                summary = await daemon.wait_summary("m", timeout=60)
                assert await daemon.stop() == 0, daemon.tail()
            finally:
                daemon.ensure_dead()
            billed = svc.store.image_count
    assert took < 5, f"the drain took {took:.1f} s"
    results = read_lines(daemon.outbox / "m" / "results.jsonl")
    assert len(results) == 1000 and len({r["id"] for r in results}) == 1000, summary
    twice = sum(1 for n in proxy.written.values() if n > 1)
    assert (billed, len(proxy.written), twice) == (1000, 1000, 0), "rows billed again"
