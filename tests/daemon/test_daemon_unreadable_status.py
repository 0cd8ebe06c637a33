"""A real ``fashiontag daemon`` behind a service that no longer gives one task's status (the
daemon's side of ``tests/engine/test_unreadable_status.py``): the manifest's other rows are
written, the log names the task, the daemon keeps serving, and a SIGTERM drains it (exit 0)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from ..engine.proxy import MisbehavingProxy, Misbehaviour
from .helpers import DaemonProcess, drop_atomic, read_lines, until_results, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")

TASKS_OF_1000 = ["--rotate-images", "1000", "--rotate-min-images", "1000"]


@pytest.mark.parametrize("answer", [200, 409], ids=["200-failure", "409"])
async def test_a_task_whose_status_is_never_given_holds_only_its_rows(
    tmp_path: Path, answer: int
) -> None:
    ids = [f"p{i}" for i in range(3000)]
    proxy = MisbehavingProxy("", Misbehaviour(unreadable_status={1}, poll_answer=answer))
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            daemon = DaemonProcess(
                tmp_path, proxy.url, extra=[*TASKS_OF_1000, "--drain-timeout", "5"]
            ).start()
            try:
                await daemon.wait_ready_endpoint()
                drop_atomic(daemon.inbox, "m.csv", write_manifest(Path(), ids))
                await until_results(daemon, "m", 2000, timeout=30)
                with anyio.fail_after(10):  # the stuck task is polled again, and named
                    while proxy.unreadable_polls < 3:
                        daemon.check_alive()
                        await anyio.sleep(0.05)
                stuck = [
                    line for line in daemon.logs() if "does not give its status" in json.dumps(line)
                ]
                assert len(stuck) == 1, daemon.tail()
                _, text = await daemon.get("/status")
                (active,) = json.loads(text)["active"]
                assert active["manifest"] == "m.csv", active
                daemon.check_alive()
                daemon.signal(signal.SIGTERM)
                assert await daemon.wait_exit(timeout=9) == 0, daemon.tail()
            finally:
                daemon.ensure_dead()
    results = read_lines(daemon.outbox / "m" / "results.jsonl")
    assert len(results) == 2000 and len({r["id"] for r in results}) == 2000
    assert not (daemon.outbox / "m" / "summary.json").exists()  # held, not finished
    assert (daemon.inbox / ".work" / "m.csv").exists()  # the next start goes on with it
