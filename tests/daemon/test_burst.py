"""A shop's export drops a burst of small manifests (one per category) at once: the daemon
must not open a task per manifest, or a service that caps the live tasks of a key (the
reference service: ``max_live_tasks``, a task live until its ``taskExpireAt``) refuses the
creates of the burst and every manifest waits for tasks to expire."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, faults, running_service
from fashiontag_pipeline.service.context import STATE

from .helpers import DaemonProcess, drop_atomic, read_lines, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")


async def test_a_burst_of_small_manifests_shares_tasks_under_a_live_task_cap(
    tmp_path: Path,
) -> None:
    """Before, each small manifest read while the reader had nothing else sealed its task at
    once: 20 manifests of a few rows made ~20 tasks. The reference service (1,000 live tasks
    a key, each live 10 minutes) stalled a daemon after ~1,300 manifests in 10 minutes; here,
    with a cap of 4, the burst waited 30 s and more (Retry-After) per 4 tasks. Now, while
    more files are ready and a slot is free, the open task waits for their rows (at most
    until ``--linger`` old): the burst takes a few tasks and completes in seconds."""
    sizes = {n: 1 + (n * 7) % 12 for n in range(20)}
    config = ServiceConfig(max_live_tasks=4, task_ttl=120.0)
    async with running_service(config) as svc:
        extra = ["--linger", "1", "--max-active", "32", "--state", str(tmp_path / "state.db")]
        daemon = DaemonProcess(tmp_path, svc.url, extra=extra).start()
        try:
            await daemon.wait_ready_endpoint()
            started = time.monotonic()
            for n, size in sizes.items():
                data = write_manifest(Path(), [f"r{i}" for i in range(size)], url_tag=f"{n}-")
                drop_atomic(daemon.inbox, f"cat{n}.csv", data)
            summaries: dict[int, dict[str, Any]] = {}
            with anyio.move_on_after(20):
                while len(summaries) < len(sizes):
                    daemon.check_alive()
                    for n in sizes:
                        done = (daemon.outbox / f"cat{n}" / "summary.json").exists()
                        if n not in summaries and done:
                            summaries[n] = await daemon.wait_summary(f"cat{n}")
                    await anyio.sleep(0.05)
            took = time.monotonic() - started
            tasks = len(svc.app[STATE].store.tasks)
            assert len(summaries) == len(sizes), (
                f"{len(summaries)} of {len(sizes)} manifests complete after {took:.0f} s, "
                f"{tasks} tasks created: {daemon.tail(8)}"
            )
            assert tasks <= 4, f"{tasks} tasks for a burst of {len(sizes)} small manifests"
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    for n, size in sizes.items():
        assert summaries[n]["status"] == "done" and summaries[n]["tagged"] == size
        ids = [line["id"] for line in read_lines(daemon.outbox / f"cat{n}" / "results.jsonl")]
        assert sorted(ids) == sorted(f"r{i}" for i in range(size)), n


async def test_a_burst_dropped_in_waves_shares_one_task_under_a_cap_of_one(
    tmp_path: Path,
) -> None:
    """Before, the open task was sealed whenever no file was ready at that instant: between
    two waves of one drop (the next files seen, still settling), and after the last claim of
    a wave while that manifest's rows were not read yet (they came a moment later, into a
    task of their own). A burst of 20 took 5 tasks; under a cap of live tasks a create was
    refused (429) and waited out Retry-After (30 s), then the tasks' expiry. Now the open
    task waits while a claimed manifest is not read to the end or more files are ready or
    settling, until ``--linger`` seconds after its last rows: the waves share one task."""
    waves = [range(start, start + 5) for start in (0, 5, 10)]
    config = ServiceConfig(max_live_tasks=1, task_ttl=120.0)
    async with running_service(config) as svc:
        extra = ["--linger", "1", "--rotate-seconds", "30", "--max-active", "32"]
        extra += ["--state", str(tmp_path / "st.db")]
        daemon = DaemonProcess(tmp_path, svc.url, extra=extra).start()
        try:
            await daemon.wait_ready_endpoint()
            for wave in waves:  # (each wave settles 0.25 s after the one before)
                for n in wave:
                    data = write_manifest(
                        Path(), [f"r{i}" for i in range(1 + n % 7)], url_tag=f"{n}-"
                    )
                    drop_atomic(daemon.inbox, f"w{n}.csv", data)
                await anyio.sleep(0.25)
            names = [f"w{n}" for wave in waves for n in wave]
            with anyio.fail_after(15):
                while not all((daemon.outbox / n / "summary.json").exists() for n in names):
                    daemon.check_alive()
                    refused = "HTTP 429" in daemon.stderr_path.read_text()
                    assert not refused, f"a second task was asked for: {daemon.tail(6)}"
                    await anyio.sleep(0.05)
            assert len(svc.app[STATE].store.tasks) == 1
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    for n in (n for wave in waves for n in wave):
        summary = await daemon.wait_summary(f"w{n}")
        assert summary["status"] == "done" and summary["tagged"] == 1 + n % 7, n


async def test_a_burst_read_while_its_task_is_created_shares_it(tmp_path: Path) -> None:
    """Before, rows read while the open task's create was unanswered waited for it with the
    intake's IDLE already noted: the create's answer sealed that task as quiet (no input to
    come) and the rows created another: under a cap of one live task, refused (429) and
    waiting out Retry-After (30 s), then the first task's expiry. Now the IDLE is noted
    once the rows read before it are sent: they go to the task being created."""
    # (Every request 0.3 s slow: the manifests after the first are read during its create.)
    config = ServiceConfig(
        max_live_tasks=1, task_ttl=120.0, faults=faults.FaultSpec.parse("latency=1:0.3s")
    )
    async with running_service(config) as svc:
        extra = ["--linger", "1", "--rotate-seconds", "30", "--max-active", "32"]
        daemon = DaemonProcess(tmp_path, svc.url, extra=extra).start()
        try:
            await daemon.wait_ready_endpoint()
            for n in range(6):
                data = write_manifest(Path(), [f"r{i}" for i in range(1 + n)], url_tag=f"{n}-")
                drop_atomic(daemon.inbox, f"s{n}.csv", data)
            with anyio.fail_after(15):
                while not all(
                    (daemon.outbox / f"s{n}" / "summary.json").exists() for n in range(6)
                ):
                    daemon.check_alive()
                    refused = "HTTP 429" in daemon.stderr_path.read_text()
                    assert not refused, f"a second task was asked for: {daemon.tail(6)}"
                    await anyio.sleep(0.05)
            assert len(svc.app[STATE].store.tasks) == 1
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    for n in range(6):
        summary = await daemon.wait_summary(f"s{n}")
        assert summary["status"] == "done" and summary["tagged"] == 1 + n, n
