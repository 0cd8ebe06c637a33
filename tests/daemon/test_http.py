"""The HTTP endpoints over real loopback HTTP (port 0): /metrics parsed by prometheus-client,
/livez, /readyz from the health facts (injected clock for the 30 s rule), /status."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fashiontag_pipeline.daemon.http import (
    DaemonStatus,
    Health,
    ManifestProgress,
    MonitoringServer,
)
from fashiontag_pipeline.daemon.metrics import DaemonMetrics


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class FixedStatus:
    def __init__(self) -> None:
        self.current = DaemonStatus()

    def status(self) -> DaemonStatus:
        return self.current


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def get_json(session: aiohttp.ClientSession, url: str) -> tuple[int, object]:
    async with session.get(url) as response:
        return response.status, await response.json()


async def test_metrics_livez_and_status(session: aiohttp.ClientSession) -> None:
    metrics = DaemonMetrics()
    metrics.count_rows("tagged", 7)
    provider = FixedStatus()
    provider.current = DaemonStatus(
        active=[
            ManifestProgress(
                manifest="cat.csv",
                sha256="a" * 64,
                claimed_at="2026-11-23T02:00:00.000Z",
                rows_read=10,
                tagged=7,
                pending=3,
            )
        ]
    )
    async with MonitoringServer(
        "127.0.0.1:0", metrics=metrics, health=Health(), status=provider
    ) as server:
        assert server.url is not None and server.url.startswith("http://127.0.0.1:")
        async with session.get(f"{server.url}/metrics") as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            text = await response.text()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert "fashiontag_rows" in families  # the parser drops _total from the family name
        tagged = [
            s for s in families["fashiontag_rows"].samples if s.labels == {"outcome": "tagged"}
        ]
        assert tagged[0].value == 7
        assert "fashiontag_task_expiry_headroom_seconds" in families

        assert await get_json(session, f"{server.url}/livez") == (200, {"live": True})

        status, body = await get_json(session, f"{server.url}/status")
        assert status == 200
        assert isinstance(body, dict)
        assert body["queued"] == [] and body["recent"] == [] and body["draining"] is False
        assert body["active"][0]["manifest"] == "cat.csv"
        assert body["active"][0]["pending"] == 3


async def test_readyz_follows_the_health_facts(session: aiohttp.ClientSession) -> None:
    clock = FakeClock()
    health = Health(clock=clock)
    async with MonitoringServer(
        "127.0.0.1:0", metrics=DaemonMetrics(), health=health, status=FixedStatus()
    ) as server:
        url = f"{server.url}/readyz"
        status, body = await get_json(session, url)
        assert (status, body) == (503, {"ready": False, "reason": "service has not answered yet"})

        health.mark_service_answered()
        assert await get_json(session, url) == (200, {"ready": True})

        health.mark_service_unreachable()
        clock.now += 29.9
        health.mark_service_unreachable()  # a streak keeps its start
        assert (await get_json(session, url))[0] == 200
        clock.now += 0.1
        status, body = await get_json(session, url)
        assert status == 503
        assert isinstance(body, dict) and body["reason"] == "service unreachable for 30 s"

        health.mark_service_answered()
        assert (await get_json(session, url))[0] == 200

        health.mark_store_unwritable("disk I/O error")
        status, body = await get_json(session, url)
        assert status == 503
        assert isinstance(body, dict) and "state store not writable" in body["reason"]
        health.mark_store_writable()
        assert (await get_json(session, url))[0] == 200

        health.mark_draining()
        assert await get_json(session, url) == (503, {"ready": False, "reason": "draining"})
        status, body = await get_json(session, f"{server.url}/status")
        assert isinstance(body, dict) and body["draining"] is True
        # Alive while draining.
        assert (await get_json(session, f"{server.url}/livez"))[0] == 200


async def test_readyz_and_status_say_a_rate_limit(session: aiohttp.ClientSession) -> None:
    """Answers 429 (any status: the service is reachable) make ``/status`` say since when the
    service rate limits the daemon, and ``/readyz`` 503 once every answer of the API has been
    a 429 (or a 5xx) for ``unreachable_after``; the probe's answer (not the API) changes
    neither. The limit ends once another answer came and no 429 for ``limit_quiet`` s, also
    while the daemon then sends nothing."""
    clock = FakeClock()
    health = Health(clock=clock, unreachable_after=30.0)
    assert health.limit_quiet == 5.0
    async with MonitoringServer(
        "127.0.0.1:0", metrics=DaemonMetrics(), health=health, status=FixedStatus()
    ) as server:
        ready, status = f"{server.url}/readyz", f"{server.url}/status"
        health.mark_service_answered(202)
        _, body = await get_json(session, status)
        assert isinstance(body, dict) and body["rate_limited_since"] is None
        health.mark_service_answered(429)
        _, body = await get_json(session, status)
        assert isinstance(body, dict) and body["rate_limited_since"].endswith("Z")
        assert body["rate_limited_answers"] == 1
        clock.now += 29.9
        health.mark_service_answered(200, api=False)  # the probe: still limited
        health.mark_service_answered(429)
        assert (await get_json(session, ready))[0] == 200
        clock.now += 0.1
        assert await get_json(session, ready) == (
            503,
            {"ready": False, "reason": "service rate limiting this key (HTTP 429) for 30 s"},
        )
        health.mark_service_answered(200)  # an answer: ready, the limit not over yet
        assert (await get_json(session, ready))[0] == 200
        _, body = await get_json(session, status)
        assert isinstance(body, dict) and body["rate_limited_answers"] == 2
        clock.now += 5.0
        health.settle_limit()  # nothing sent since: over all the same
        _, body = await get_json(session, status)
        assert isinstance(body, dict) and body["rate_limited_since"] is None

        health.mark_service_answered(503)
        clock.now += 30.0
        assert await get_json(session, ready) == (
            503,
            {"ready": False, "reason": "service answering HTTP 503 for 30 s"},
        )
        _, body = await get_json(session, status)
        assert isinstance(body, dict) and body["rate_limited_since"] is None


async def test_empty_listen_starts_nothing_and_close_is_idempotent(
    session: aiohttp.ClientSession,
) -> None:
    async with MonitoringServer(
        "", metrics=DaemonMetrics(), health=Health(), status=FixedStatus()
    ) as server:
        assert server.url is None
    server = MonitoringServer(
        "127.0.0.1:0", metrics=DaemonMetrics(), health=Health(), status=FixedStatus()
    )
    await server.start()
    url = server.url
    await server.aclose()
    await server.aclose()
    with pytest.raises(aiohttp.ClientConnectionError):
        async with session.get(f"{url}/livez"):
            pass


def test_bad_listen_is_refused() -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        MonitoringServer("9464", metrics=DaemonMetrics(), health=Health(), status=FixedStatus())
