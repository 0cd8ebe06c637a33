"""Keys (401/403, dev keys, never logged) and expiry (410) with an injected clock."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fashiontag_pipeline import TaggerClient
from fashiontag_pipeline._config import DEV_API_KEY, DEV_BULK_API_KEY
from fashiontag_pipeline._exceptions import (
    AuthenticationError,
    PermissionDeniedError,
    ResultsExpiredError,
    TaskExpiredError,
)
from fashiontag_pipeline._models import Image, ImageType, parse_time
from fashiontag_pipeline.service import RunningService, ServiceConfig, running_service

from .conftest import BULK_KEY, KEY, StartService, requests
from .test_bulk import BULK, raw
from .test_spec_conformance import _elements


async def test_missing_and_unknown_keys(service: RunningService) -> None:
    for path, method in ((BULK, "GET"), ("/tagger/v2/tags", "POST")):
        status, payload, _ = await raw(service, method, path, {}, key="")
        assert status == 401, path
        status, payload, _ = await raw(service, method, path, {}, key="nope")
        assert status == 401, path
    status, payload, _ = await raw(service, "GET", BULK, key="")
    assert payload == {"status": "failure", "error": "API key required (header x-api-key)"}
    status, payload, _ = await raw(service, "POST", "/tagger/v2/tags", {}, key="nope")
    assert payload["error"]["code"] == 609


async def test_single_key_refused_on_bulk_paths(
    service: RunningService, client_for: Callable[..., TaggerClient]
) -> None:
    client = client_for(service.url, bulk_api_key=KEY)
    with pytest.raises(PermissionDeniedError):
        await client.list_tasks()
    with pytest.raises(PermissionDeniedError):
        await client.create_task(requests(1))
    with pytest.raises(AuthenticationError):
        await client_for(service.url, bulk_api_key="wrong").list_tasks()
    # The single path takes the single key (and bulk keys too).
    assert (await client.tag(Image(type=ImageType.URL, content="https://x.test/a.jpg"))).ok
    bulk_only = client_for(service.url, api_key=BULK_KEY)
    assert (await bulk_only.tag(Image(type=ImageType.URL, content="https://x.test/a.jpg"))).ok


async def test_dev_keys_when_none_configured(
    start_service: StartService, client_for: Callable[..., TaggerClient]
) -> None:
    service = await start_service(api_keys=(), bulk_api_keys=())
    client = client_for(service.url, api_key=DEV_API_KEY, bulk_api_key=DEV_BULK_API_KEY)
    assert await client.list_tasks() == []
    with pytest.raises(PermissionDeniedError):
        await client_for(service.url, api_key=DEV_API_KEY, bulk_api_key=DEV_API_KEY).list_tasks()


async def test_keys_never_logged_nor_in_repr(
    client: TaggerClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="fashiontag_pipeline.service")
    created = await client.create_task(requests(2))
    await client.task_results(created.task_id)
    lines = [r.getMessage() for r in caplog.records if r.name == "fashiontag_pipeline.service"]
    assert any("POST /tagger/v2.12/bulk -> 202" in line for line in lines)
    assert all(KEY not in line and BULK_KEY not in line for line in lines)
    config = ServiceConfig(api_keys=(KEY,), bulk_api_keys=(BULK_KEY,))
    assert KEY not in repr(config) and BULK_KEY not in repr(config)


async def test_put_after_expiry_is_410(
    start_service: StartService, client_for: Callable[..., TaggerClient], clock: Any
) -> None:
    service = await start_service(clock=clock, task_ttl=60.0)
    client = client_for(service.url)
    created = await client.create_task(requests(1))
    clock.advance(59.9)
    await client.append_to_task(created.task_id, requests(1, start=1))  # extends to 120 s
    clock.advance(60.0)
    await client.append_to_task(created.task_id, requests(1, start=2))  # 119.9 < 180
    clock.advance(60.2)
    with pytest.raises(TaskExpiredError) as info:
        await client.append_to_task(created.task_id, requests(1, start=3))
    assert info.value.status == 410
    task = await client.task_status(created.task_id)
    assert task.count.total == 3
    # Results stay readable after the task (append) expiry.
    assert len((await client.task_results(created.task_id)).results) == 3


async def test_results_expire_after_result_ttl(
    start_service: StartService, client_for: Callable[..., TaggerClient], clock: Any
) -> None:
    service = await start_service(clock=clock, result_ttl=3600.0)
    client = client_for(service.url)
    created = await client.create_task(requests(3))
    task = await client.task_status(created.task_id)
    done_at = parse_time(task.result_expired_at)
    created_at = parse_time(task.create_date)
    assert done_at is not None and created_at is not None
    assert (done_at - created_at).total_seconds() == pytest.approx(3600.0)
    clock.advance(3599)
    await client.task_results(created.task_id)
    clock.advance(2)
    with pytest.raises(ResultsExpiredError):
        await client.task_results(created.task_id)
    # The sweep frees the images but the task still answers 410, and is still listed.
    service.store.sweep()
    assert service.store.tasks[created.task_id].purged
    with pytest.raises(ResultsExpiredError):
        await client.task_results(created.task_id)
    assert [t.task_id for t in await client.list_tasks()] == [created.task_id]


async def test_sweep_drops_duplicate_sets_of_closed_tasks(
    start_service: StartService, client_for: Callable[..., TaggerClient], clock: Any
) -> None:
    service = await start_service(clock=clock, task_ttl=10.0)
    client = client_for(service.url)
    created = await client.create_task(requests(3))
    record = service.store.tasks[created.task_id]
    assert record.id_set is not None
    clock.advance(11)
    service.store.sweep()
    assert record.id_set is None
    assert len((await client.task_results(created.task_id)).results) == 3


async def test_a_long_lived_service_forgets_tasks_long_past_their_results(
    tmp_path: Path, clock: Any
) -> None:
    """A service left running (the benchmarks' target, a daemon's service for weeks) kept every
    task a client ever created after its results expired, in memory and in its ``--state``
    file: the key's list grew with every task it ever made (an engine resolving a lost create
    pages through all of it), and the sweep walked all of them every second. A task is now
    forgotten one result TTL after its results expired (and once closed to writes): 410 until
    then, 404 after, gone from the list, and not brought back by a restart."""
    config = ServiceConfig(
        state_path=tmp_path / "state.sqlite",
        clock=clock,
        task_ttl=60.0,
        result_ttl=60.0,
        api_keys=(KEY,),
        bulk_api_keys=(BULK_KEY,),
    )
    async with running_service(config) as svc:
        task_ids = []
        for n in range(50):
            _, created, _ = await raw(svc, "POST", BULK, {"taggingRequest": _elements(2, f"t{n}")})
            task_ids.append(created["taskId"])
        clock.advance(61)
        svc.store.sweep()
        status, body, _ = await raw(svc, "GET", f"{BULK}/{task_ids[0]}")
        assert status == 410, body
        _, listed, _ = await raw(svc, "GET", BULK)
        assert listed["data"]["taskInfo"]["totalCount"] == 50
        clock.advance(60)
        svc.store.sweep()
        status, body, _ = await raw(svc, "GET", f"{BULK}/{task_ids[0]}/status")
        assert status == 404, body
        _, listed, _ = await raw(svc, "GET", BULK)
        assert listed["data"]["taskInfo"]["totalCount"] == 0, listed["data"]["taskInfo"]
        assert not svc.store.tasks and not any(svc.store.by_owner.values())
    async with running_service(config) as svc:
        assert not svc.store.tasks
