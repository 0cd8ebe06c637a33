"""A real ``fashiontag daemon`` whose service answers 429 to every request for a while (a rate
limit storm, through the engine tests' misbehaving proxy): ``/status`` says since when it is
rate limited, ``/readyz`` answers 503 with that reason once the storm has lasted
``unreachable_after``, the log says so once when it starts and once when it ends (not a line
per refused request), and the manifest completes once the storm is over."""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from ..engine.proxy import MisbehavingProxy, Misbehaviour
from .helpers import DaemonProcess, drop_atomic, until_results, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")


async def test_a_429_storm_is_said_by_status_readyz_and_a_few_log_lines(tmp_path: Path) -> None:
    config = tmp_path / "daemon.toml"
    config.write_text("[daemon]\nunreachable_after = 1.5\n")
    ids = [f"p{i}" for i in range(6000)]
    proxy = MisbehavingProxy("", Misbehaviour())
    async with running_service(ServiceConfig(rate=2000.0)) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            daemon = DaemonProcess(tmp_path, proxy.url, extra=["--config", str(config)]).start()
            try:
                await daemon.wait_ready_endpoint()
                drop_atomic(daemon.inbox, "m.csv", write_manifest(Path(), ids))
                await until_results(daemon, "m", 1, timeout=30)
                before = len(daemon.logs())
                proxy.rules.storm = 429
                statuses: list[dict[str, object]] = []
                not_ready: list[str] = []
                with anyio.move_on_after(3.0):
                    while True:
                        await anyio.sleep(0.25)
                        statuses.append(json.loads((await daemon.get("/status"))[1]))
                        code, text = await daemon.get("/readyz")
                        if code == 503:
                            not_ready.append(json.loads(text)["reason"])
                storm = daemon.logs()[before:]
                limited = proxy.storm_answers
                proxy.rules.storm = None
                summary = await daemon.wait_summary("m", timeout=40)
                await anyio.sleep(1.0)  # the storm ends 0.5 s (limit_quiet) after its last 429
                after = json.loads((await daemon.get("/status"))[1])
                ready = await daemon.get("/readyz")
                assert await daemon.stop() == 0, daemon.tail()
            finally:
                daemon.ensure_dead()
    assert summary["status"] == "done" and summary["tagged"] == len(ids)
    assert limited >= 5  # the storm was met (each retry waits at least its backoff)
    since = [s["rate_limited_since"] for s in statuses if s.get("rate_limited_since")]
    assert since and len(set(since)) == 1, statuses[-1]
    assert not_ready and all("rate limiting" in r for r in not_ready), not_ready
    events = [line["event"] for line in storm]
    assert len(events) <= 10, "\n".join(events)
    said = [line for line in storm if line["logger"] == "fashiontag_pipeline.daemon"]
    assert [line["event"] for line in said] == [
        "the service is rate limiting this key (HTTP 429): requests wait and go on"
    ], said
    assert said[0]["since"] == since[0]
    ends = [e for e in daemon.logs() if "no longer rate limits" in e["event"]]
    assert len(ends) == 1, daemon.tail()
    assert after["rate_limited_since"] is None and ready[0] == 200, (after, ready)
