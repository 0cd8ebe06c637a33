"""Fault injection as the client sees it: 5xx, 429 with Retry-After, drops, ambiguous writes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fashiontag_pipeline import RetryPolicy, TaggerClient
from fashiontag_pipeline._exceptions import (
    AmbiguousWriteError,
    RateLimitedError,
    ServerError,
    TransportError,
)
from fashiontag_pipeline._models import Image, ImageType
from fashiontag_pipeline.service import FaultSpec
from fashiontag_pipeline.service.faults import Fault, parse_duration

from .conftest import StartService, requests
from .test_bulk import BULK, raw


def test_parse_spec() -> None:
    spec = FaultSpec.parse("500=0.05,429=0.02,drop=0.01,ambiguous=0.02,latency=0.05:2s")
    assert spec.server_errors == ((500, 0.05),)
    assert spec.rate_limited == 0.02 and spec.retry_after == 0.1
    assert spec.drop == 0.01 and spec.ambiguous == 0.02
    assert spec.latency == 0.05 and spec.latency_seconds == 2.0
    spec = FaultSpec.parse("503=0.1,429=0.2:250ms,seed=7")
    assert spec.server_errors == ((503, 0.1),) and spec.retry_after == 0.25 and spec.seed == 7
    assert FaultSpec.parse("seed=1", seed=9).seed == 9
    assert parse_duration("1.5") == 1.5
    for bad in ("500=2", "404=0.1", "boom=0.1", "latency=0.1", "500", "500=0.6,429=0.6", "seed=x"):
        with pytest.raises(ValueError):
            FaultSpec.parse(bad)


@pytest.mark.parametrize("item", ["503=0.1:2s", "drop=0.1:1s", "ambiguous=0.1:5s"])
def test_a_duration_where_the_fault_takes_none_is_refused(item: str) -> None:
    """``503=0.1:2s`` (a Retry-After for the 503s, as ``429=P:D`` gives one) was taken as
    ``503=0.1``, the ``:2s`` dropped in silence: the tester believed the 503s carried a wait.
    Only 429 and latency take a duration; any other is refused, saying which take one."""
    with pytest.raises(ValueError, match="takes no duration"):
        FaultSpec.parse(item)


def test_dice_are_reproducible() -> None:
    spec = FaultSpec.parse("500=0.2,429=0.2,drop=0.2,ambiguous=0.2", seed=42)
    rolls = [spec.dice().roll(is_write=True) for _ in range(3)]
    assert rolls[0] == rolls[1] == rolls[2]
    dice = spec.dice()
    seen = {dice.roll(is_write=True)[0] for _ in range(200)}
    assert seen == set(Fault)
    reads = {spec.dice().roll(is_write=False)[0] for _ in range(50)}
    assert Fault.AMBIGUOUS not in reads


async def test_injected_500_and_429(
    start_service: StartService, client_for: Callable[..., TaggerClient]
) -> None:
    service = await start_service(faults=FaultSpec.parse("500=1.0"))
    with pytest.raises(ServerError):
        await client_for(service.url).list_tasks()
    with pytest.raises(AmbiguousWriteError):
        await client_for(service.url).create_task(requests(1))
    status, payload, _ = await raw(service, "GET", BULK)
    assert status == 500 and payload["status"] == "failure"
    # Non-API paths are never faulted.
    status, _, _ = await raw(service, "GET", "/openapi.json")
    assert status == 200

    service = await start_service(faults=FaultSpec.parse("429=1.0:0.05s"))
    with pytest.raises(RateLimitedError) as info:
        await client_for(service.url).list_tasks()
    assert info.value.retry_after == pytest.approx(0.05)
    status, _, headers = await raw(service, "POST", "/tagger/v2/tags", {})
    assert status == 429 and headers["Retry-After"] == "0.05"


async def test_client_retries_through_seeded_faults(
    start_service: StartService, client_for: Callable[..., TaggerClient]
) -> None:
    service = await start_service(faults=FaultSpec.parse("500=0.3,429=0.2:0.01s,drop=0.1", seed=3))
    client = client_for(
        service.url, retry=RetryPolicy(max_attempts=30, backoff_base=0.001, backoff_max=0.01)
    )
    for _ in range(20):
        assert await client.list_tasks() == []
    assert client.stats.retries > 0 and client.stats.rate_limited > 0


async def test_drop_is_a_transport_error_and_not_applied(
    start_service: StartService, client_for: Callable[..., TaggerClient]
) -> None:
    service = await start_service(faults=FaultSpec.parse("drop=1.0"))
    with pytest.raises(TransportError):
        await client_for(service.url).list_tasks()
    with pytest.raises(AmbiguousWriteError):
        await client_for(service.url).create_task(requests(1))
    assert service.store.tasks == {}


async def test_ambiguous_write_is_applied(
    start_service: StartService, client_for: Callable[..., TaggerClient]
) -> None:
    service = await start_service(faults=FaultSpec.parse("ambiguous=1.0"))
    client = client_for(service.url)
    with pytest.raises(AmbiguousWriteError):
        await client.create_task(requests(3), description="token-xyz")
    # Reads are not affected by the ambiguous fault; the write was applied.
    tasks = await client.list_tasks()
    assert [t.description for t in tasks] == ["token-xyz"]
    assert tasks[0].count.total == 3
    with pytest.raises(AmbiguousWriteError):
        await client.append_to_task(tasks[0].task_id, requests(2, start=3))
    assert (await client.task_status(tasks[0].task_id)).count.total == 5
    # Single-mode tagging is a POST too: its answer is lost the same way.
    with pytest.raises(TransportError):
        await client.tag(Image(type=ImageType.URL, content="https://x.test/1.jpg"))


async def test_latency(
    start_service: StartService, client_for: Callable[..., TaggerClient]
) -> None:
    import time

    service = await start_service(faults=FaultSpec.parse("latency=1.0:0.2s"))
    started = time.perf_counter()
    await client_for(service.url).list_tasks()
    assert time.perf_counter() - started >= 0.2
