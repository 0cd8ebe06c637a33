"""The metrics of a daemon whose state is a shared PostgreSQL (a real daemon, a real
PostgreSQL, a reference service with faults)."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import metric_samples
from .test_shared_daemons import _daemon, _drop, _ids

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals and unix sockets")


async def test_a_shared_daemon_counts_its_retries(tmp_path: Path, postgres_url: str) -> None:
    """``fashiontag_retries_total`` is exported by every daemon; a daemon whose state is a
    shared PostgreSQL (its engines one per leased manifest) never counted one: a service
    answering 500 to one request in five read 0 retries, as if it were healthy, beside
    ``fashiontag_requests_total{code="500"}`` counting them."""
    from fashiontag_pipeline.service.faults import FaultSpec

    faults = FaultSpec.parse("500=0.2,seed=7")
    async with running_service(ServiceConfig(faults=faults)) as svc:
        daemon = _daemon(tmp_path, svc.url, postgres_url).start()
        try:
            await daemon.wait_ready_endpoint()
            _drop(daemon.inbox, "m.csv", _ids("r", 300))
            summary = await daemon.wait_summary("m")
            await anyio.sleep(1.5)  # (counted once a second)
            samples = metric_samples((await daemon.get("/metrics"))[1])
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    assert summary["status"] == "done"
    refused = sum(v for (name, labels), v in samples.items() if name == "fashiontag_requests_total"
                  and ("code", "500") in labels)  # fmt: skip
    assert refused > 0, samples
    # (The client's retries: a write an engine of a leased manifest sends again is not seen.)
    assert samples[("fashiontag_retries_total", ())] > 0
