"""``/status`` ``queued`` and ``fashiontag_manifests_queued`` show the manifests that wait for
one of the ``--max-active`` slots, as DESIGN section 6 has them (a real daemon, a slow service).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import DaemonProcess, drop_atomic, metric_samples, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")

QUEUED = ("fashiontag_manifests_queued", ())


async def _status(daemon: DaemonProcess) -> dict[str, Any]:
    code, body = await daemon.get("/status")
    assert code == 200, body
    return dict(json.loads(body))


async def _until(daemon: DaemonProcess, want: set[str], queued: int) -> dict[str, Any]:
    """The status once ``want`` are the queued manifests and the gauge says ``queued``."""
    status: dict[str, Any] = {}
    samples: dict[Any, float] = {}
    with anyio.move_on_after(5):
        while True:
            daemon.check_alive()
            status = await _status(daemon)
            samples = metric_samples((await daemon.get("/metrics"))[1])
            if {q["manifest"] for q in status["queued"]} == want and samples[QUEUED] == queued:
                return status
            await anyio.sleep(0.1)
    raise AssertionError(f"queued {status.get('queued')}, gauge {samples.get(QUEUED)}")


async def test_manifests_waiting_for_a_slot_are_queued(tmp_path: Path) -> None:
    """Before, ``queued`` listed only a copy waiting for equal content in flight: with
    ``--max-active 1`` a manifest ready behind an active one, and claims resumed at start-up
    beyond the slots, were in neither ``/status`` nor the gauge (``queued: []``, 0), so a
    backlog was invisible to monitoring."""
    ids = {n: [f"{n}{i}" for i in range(200)] for n in "abc"}
    async with running_service(ServiceConfig(rate=20.0)) as svc:
        # Both claimed and in flight (max-active 2), then stopped: they resume at the next start.
        extra = ["--max-active", "2", "--drain-timeout", "1"]
        first = DaemonProcess(tmp_path, svc.url, extra=extra).start()
        try:
            await first.wait_ready_endpoint()
            for n in "ab":
                drop_atomic(first.inbox, f"{n}.csv", write_manifest(Path(), ids[n]))
            with anyio.fail_after(10):
                while len((await _status(first))["active"]) < 2:
                    await anyio.sleep(0.05)
            assert await first.stop() == 0
        finally:
            first.ensure_dead()
        drop_atomic(first.inbox, "c.csv", write_manifest(Path(), ids["c"]))
        # One slot: one resumed claim is tagged; the other one and c.csv wait for the slot.
        daemon = DaemonProcess(tmp_path, svc.url, extra=["--max-active", "1"]).start()
        try:
            await daemon.wait_ready_endpoint()
            with anyio.fail_after(10):
                while not (await _status(daemon))["active"]:
                    await anyio.sleep(0.05)
            active = (await _status(daemon))["active"][0]["manifest"]
            status = await _until(daemon, {"a.csv", "b.csv", "c.csv"} - {active}, 2)
            by_name = {q["manifest"]: q for q in status["queued"]}
            resumed = ({"a.csv", "b.csv"} - {active}).pop()
            assert len(by_name[resumed]["sha256"]) == 64  # claimed before the stop
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
