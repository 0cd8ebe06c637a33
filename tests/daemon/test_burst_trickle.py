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


async def test_a_burst_read_longer_than_the_bound_still_shares_one_task(tmp_path: Path) -> None:
    """150 manifests of 5 rows dropped at once under a cap of one live task, at ``--linger
    0.5``: reading them takes longer than the trickle's bound (1.5 s). Before, the task was
    sealed at the bound though the burst's files were ready and claimed (rows in hand): the
    rest of the burst asked for a second task, refused (429) until the first expired (2
    minutes here, 10 on the reference service): ~50 of 150 done after 20 s. Now the bound
    holds only while files are merely settling (a trickle): the burst shares one task."""
    async with running_service(ServiceConfig(max_live_tasks=1, task_ttl=120.0)) as svc:
        extra = ["--linger", "0.5", "--rotate-seconds", "30", "--max-active", "200"]
        daemon = DaemonProcess(tmp_path, svc.url, extra=extra).start()
        try:
            await daemon.wait_ready_endpoint()
            names = [f"p{n}" for n in range(150)]
            for n, name in enumerate(names):
                data = write_manifest(Path(), [f"r{i}" for i in range(5)], url_tag=f"{n}-")
                drop_atomic(daemon.inbox, f"{name}.csv", data)
            with anyio.move_on_after(20):
                while not all((daemon.outbox / k / "summary.json").exists() for k in names):
                    daemon.check_alive()
                    await anyio.sleep(0.1)
            done = sum((daemon.outbox / k / "summary.json").exists() for k in names)
            tasks = len(svc.app[STATE].store.tasks)
            assert done == len(names), f"{done} of {len(names)} done, {tasks} tasks"
            assert tasks == 1
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    for name in names:
        summary = await daemon.wait_summary(name)
        assert summary["status"] == "done" and summary["tagged"] == 5, name
