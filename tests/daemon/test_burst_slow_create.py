"""A burst of small manifests read while the open task's create waits out a 429 (a live-task
cap still full of an earlier task): the hold's bound (3 ``--linger``) is counted from the
create's answer, not from its send, or the wait eats it and the burst's later manifests ask
for a second task the cap refuses until the first expires."""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, routes_bulk, running_service
from fashiontag_pipeline.service.context import STATE

from .helpers import DaemonProcess, drop_atomic, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")


async def test_a_burst_read_while_its_create_waits_out_a_429_shares_one_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key's one live task is taken (an earlier run's) for the first 3.5 s; manifests come
    every 0.3 s for 4 s at ``--linger 1``. Before, the held task was sealed 3 s after its
    create was sent, still unanswered (refused 429, retried): the manifests read after it
    made a second task, whose create the cap refused (the first task live 2 minutes here, 10
    on the reference service) and their results never came. Now the bound runs from the
    create's answer: the burst shares the one task and is done in seconds."""
    monkeypatch.setattr(routes_bulk, "LIVE_TASKS_RETRY_AFTER", 0.3)
    async with running_service(ServiceConfig(max_live_tasks=1, task_ttl=120.0)) as svc:
        store = svc.app[STATE].store
        live_count, full = store.live_count, [True]
        monkeypatch.setattr(store, "live_count", lambda owner: 1 if full[0] else live_count(owner))
        extra = ["--linger", "1", "--rotate-seconds", "30", "--max-active", "64"]
        daemon = DaemonProcess(tmp_path, svc.url, extra=extra, settle=0.6).start()
        try:
            await daemon.wait_ready_endpoint()
            started, n = time.monotonic(), 0
            while time.monotonic() - started < 4.0:
                daemon.check_alive()
                data = write_manifest(Path(), [f"r{i}" for i in range(1 + n % 4)], url_tag=f"{n}-")
                drop_atomic(daemon.inbox, f"b{n}.csv", data)
                n += 1
                await anyio.sleep(0.25)
                if time.monotonic() - started >= 3.5:
                    full[0] = False
            names = [f"b{k}" for k in range(n)]
            with anyio.move_on_after(15):
                while not all((daemon.outbox / k / "summary.json").exists() for k in names):
                    daemon.check_alive()
                    await anyio.sleep(0.05)
            done = sum((daemon.outbox / k / "summary.json").exists() for k in names)
            tasks = len(store.tasks)
            assert done == n and tasks == 1, (
                f"{done} of {n} manifests done, {tasks} tasks: {daemon.tail(6)}"
            )
            for k in range(n):
                summary = await daemon.wait_summary(f"b{k}")
                assert summary["status"] == "done" and summary["tagged"] == 1 + k % 4, k
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
