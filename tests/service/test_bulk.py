"""Bulk mode over real loopback HTTP: create, append, list, status, results, validation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from fashiontag_pipeline import TaggerClient
from fashiontag_pipeline._exceptions import (
    PayloadTooLargeError,
    ResultsNotReadyError,
    TaskNotFoundError,
    ValidationError,
)
from fashiontag_pipeline._models import (
    BulkContext,
    Detection,
    Image,
    ImageType,
    TaggingRequest,
    TaskStatus,
    parse_time,
)
from fashiontag_pipeline.service import RunningService

from .conftest import BULK_KEY, OTHER_BULK_KEY, StartService, requests

BULK = "/tagger/v2.12/bulk"


async def raw(
    service: RunningService,
    method: str,
    path: str,
    body: Any = None,
    *,
    key: str = BULK_KEY,
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, Any]:
    all_headers = {"x-api-key": key, **(headers or {})}
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, service.url + path, json=body, data=data, headers=all_headers
        ) as resp,
    ):
        payload = await resp.json(content_type=None)
        return resp.status, payload, resp.headers


async def test_create_status_results_in_acceptance_order(client: TaggerClient) -> None:
    created = await client.create_task(requests(250), description="run-token-1 verbatim ✓")
    assert created.validation.accept == 250 and created.validation.failure == 0
    assert created.failure_list == []
    assert created.task_expired_at is not None and created.album_name
    task = await client.task_status(created.task_id)
    assert task.task_status is TaskStatus.DONE
    assert (task.count.total, task.count.done, task.count.processing, task.count.failure) == (
        250,
        250,
        0,
        0,
    )
    assert task.description == "run-token-1 verbatim ✓"
    assert task.result_expired_at is not None and task.create_date is not None
    assert task.task_expire_at == created.task_expired_at
    ids: list[str] = []
    for offset in range(0, 300, 100):
        page = await client.task_results(created.task_id, offset=offset, size=100)
        assert page.task_info.total_count == 250 and page.task_info.offset == offset
        ids += [r.id for r in page.results]
        assert all(r.tagging_result.ok for r in page.results)
    assert ids == [f"sku-{i}" for i in range(250)]
    past = await client.task_results(created.task_id, offset=250, size=10)
    assert past.results == []
    far = await client.task_results(created.task_id, offset=10_000, size=100)
    assert far.results == [] and far.task_info.total_count == 250


async def test_append_keeps_order_and_extends_expiry(
    start_service: StartService, client_for: Callable[..., TaggerClient], clock: Any
) -> None:
    service = await start_service(clock=clock, task_ttl=600.0)
    client = client_for(service.url)
    created = await client.create_task(requests(3))
    first_expiry = parse_time(created.task_expired_at)
    clock.advance(100)
    appended = await client.append_to_task(created.task_id, requests(2, start=3))
    assert appended.task_id == created.task_id and appended.validation.accept == 2
    second_expiry = parse_time(appended.task_expired_at)
    assert first_expiry is not None and second_expiry is not None
    assert (second_expiry - first_expiry).total_seconds() == pytest.approx(600.0)
    page = await client.task_results(created.task_id, size=10)
    assert [r.id for r in page.results] == [f"sku-{i}" for i in range(5)]
    # A PUT that accepts nothing does not extend the expiry.
    failed = await client.append_to_task(created.task_id, requests(1, start=0))
    assert failed.validation.accept == 0
    assert parse_time(failed.task_expired_at) == second_expiry


async def test_description_and_album_not_changed_by_append(service: RunningService) -> None:
    body = {"taggingRequest": [_element("a")], "description": "orig", "albumName": "alb"}
    status, created, _ = await raw(service, "POST", BULK, body)
    assert status == 202 and created["albumName"] == "alb"
    body = {"taggingRequest": [_element("b")], "description": "changed", "albumName": "other"}
    status, appended, _ = await raw(service, "PUT", f"{BULK}/{created['taskId']}", body)
    assert status == 202 and appended["albumName"] == "alb"
    status, st, _ = await raw(service, "GET", f"{BULK}/{created['taskId']}/status")
    assert st["status"] == "success" and st["data"]["description"] == "orig"
    assert st["data"]["count"]["total"] == 2


def _element(image_id: Any, url: Any = "https://cdn.test/x.jpg", **context: Any) -> dict[str, Any]:
    return {"image": {"type": "url", "content": url}, "context": {"id": image_id, **context}}


async def test_per_element_validation_and_failure_list(service: RunningService) -> None:
    elements = [
        _element("ok-1", gender="female", age=["20s"], brand="b"),
        _element("ok-1"),  # duplicate within the request
        _element("", url="https://cdn.test/y.jpg"),
        _element("bad-url", url="ftp://cdn.test/z.jpg"),
        {
            "image": {"type": "base64", "content": "data:image/png;base64,AAAA"},
            "context": {"id": "b64"},
        },
        _element("bad-det", detection=["TOP", "SOCKS"]),
        _element("bad-age", age="20s"),
        {"image": {"type": "url", "content": "https://cdn.test/n.jpg"}},
        "not an object",
        _element("ok-2", detection=["SHOES"]),
    ]
    status, body, _ = await raw(service, "POST", BULK, {"taggingRequest": elements})
    assert status == 202
    assert body["validation"] == {"accept": 2, "failure": 8}
    failures = body["failureList"]
    assert len(failures) == 8
    assert failures[0]["request"] == elements[1]
    assert failures[0]["errorMessage"].startswith("duplicate context.id")
    messages = [f["errorMessage"] for f in failures]
    assert "context.id" in messages[1]
    assert "http" in messages[2]
    assert "url" in messages[3]
    assert "SOCKS" in messages[4]
    assert "age" in messages[5]
    assert "context" in messages[6]
    assert failures[7]["request"] == {}
    status, st, _ = await raw(service, "GET", f"{BULK}/{body['taskId']}/status")
    assert st["data"]["count"]["total"] == 2


async def test_duplicate_across_appends(client: TaggerClient) -> None:
    created = await client.create_task(requests(2))
    appended = await client.append_to_task(created.task_id, requests(3))
    assert appended.validation.accept == 1 and appended.validation.failure == 2
    assert all(f.error_message.startswith("duplicate context.id") for f in appended.failure_list)
    assert {f.context_id for f in appended.failure_list} == {"sku-0", "sku-1"}


async def test_strict_fails_whole_request(service: RunningService, client: TaggerClient) -> None:
    reqs = [*requests(2), requests(1)[0]]
    with pytest.raises(ValidationError) as info:
        await client.create_task(reqs, strict=True)
    assert info.value.status == 400
    assert info.value.failure_list[0].error_message.startswith("duplicate context.id")
    assert await client.list_tasks() == []
    created = await client.create_task(requests(2))
    with pytest.raises(ValidationError):
        await client.append_to_task(created.task_id, requests(1, start=1), strict=True)
    task = await client.task_status(created.task_id)
    assert task.count.total == 2


async def test_all_failed_create_is_an_empty_done_task(service: RunningService) -> None:
    status, body, _ = await raw(service, "POST", BULK, {"taggingRequest": [_element(None)]})
    assert status == 202 and body["validation"] == {"accept": 0, "failure": 1}
    status, st, _ = await raw(service, "GET", f"{BULK}/{body['taskId']}/status")
    assert st["data"]["taskStatus"] == "TASK_DONE" and st["data"]["count"]["total"] == 0
    status, page, _ = await raw(service, "GET", f"{BULK}/{body['taskId']}?offset=0&size=5")
    assert status == 200 and page["data"]["results"] == []


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"taggingRequest": []}, "1 to 1000"),
        ({"taggingRequest": [_element(f"i{i}") for i in range(1001)]}, "1 to 1000"),
        ({"taggingRequest": [_element("a")], "description": "x" * 1025}, "1024"),
        ({"taggingRequest": [_element("a")], "option": ["FAST"]}, "STRICT"),
        ({"taggingRequest": [_element("a")], "albumName": "a" * 257}, "256"),
        ({"taggingRequest": [_element("a")], "defaultDetection": ["HATS"]}, "HATS"),
        ({"noRequests": 1}, "taggingRequest"),
        ([1, 2], "object"),
    ],
)
async def test_whole_request_limits_are_400(
    service: RunningService, body: Any, needle: str
) -> None:
    status, payload, _ = await raw(service, "POST", BULK, body)
    assert status == 400
    assert payload["status"] == "failure" and needle in payload["error"]


async def test_description_at_limit_is_accepted(client: TaggerClient) -> None:
    created = await client.create_task(requests(1), description="d" * 1024)
    assert (await client.task_status(created.task_id)).description == "d" * 1024


async def test_malformed_json_and_body_limit(start_service: StartService) -> None:
    service = await start_service(max_body_bytes=4096)
    status, payload, _ = await raw(service, "POST", BULK, data=b'{"taggingRequest": [')
    assert status == 400 and payload["status"] == "failure"
    status, payload, _ = await raw(service, "POST", BULK, data=b"")
    assert status == 400
    big = {"taggingRequest": [_element(f"id-{i}") for i in range(200)]}
    status, payload, _ = await raw(service, "POST", BULK, big)
    assert status == 413 and payload["status"] == "failure"
    # The service is still fine afterwards.
    status, payload, _ = await raw(service, "POST", BULK, {"taggingRequest": [_element("a")]})
    assert status == 202


async def test_payload_too_large_maps_to_client_error(
    start_service: StartService, client_for: Callable[..., TaggerClient]
) -> None:
    service = await start_service(max_body_bytes=4096)
    with pytest.raises(PayloadTooLargeError):
        await client_for(service.url).create_task(requests(200))


async def test_default_detection_applies_to_elements_without_detection(
    client: TaggerClient,
) -> None:
    reqs = [*requests(1, prefix="d"), *requests(1, prefix="e", detection=[Detection.BAG])]
    created = await client.create_task(reqs, default_detection=[Detection.SHOES])
    page = await client.task_results(created.task_id)
    first, second = (r.tagging_result.data for r in page.results)
    assert first is not None and second is not None
    assert {o.type for o in first.objects} <= {"SHOES", "no detected product"}
    assert {o.type for o in second.objects} <= {"BAGS", "no detected product"}
    assert first.notmatchedobjects == [] and second.notmatchedobjects == []


async def test_list_visibility_and_other_keys(
    service: RunningService, client_for: Callable[..., TaggerClient]
) -> None:
    mine = client_for(service.url)
    other = client_for(service.url, bulk_api_key=OTHER_BULK_KEY)
    a = await mine.create_task(requests(1), description="a")
    b = await mine.create_task(requests(1), description="b")
    c = await other.create_task(requests(1), description="c")
    # Newest first.
    assert [t.task_id for t in await mine.list_tasks()] == [b.task_id, a.task_id]
    assert [t.description for t in await other.list_tasks()] == ["c"]
    with pytest.raises(TaskNotFoundError):
        await mine.task_status(c.task_id)
    with pytest.raises(TaskNotFoundError):
        await mine.task_results(c.task_id)
    with pytest.raises(TaskNotFoundError):
        await mine.append_to_task(c.task_id, requests(1, start=5))
    with pytest.raises(TaskNotFoundError):
        await mine.task_status("no-such-task")


async def test_results_page_parameters(service: RunningService, client: TaggerClient) -> None:
    created = await client.create_task(requests(5))
    path = f"{BULK}/{created.task_id}"
    for query in ("size=0", "size=101", "offset=-1", "size=abc", "offset=1.5"):
        status, payload, _ = await raw(service, "GET", f"{path}?{query}")
        assert status == 400, query
        assert payload["status"] == "failure"
    status, payload, _ = await raw(service, "GET", path)
    assert status == 200 and len(payload["data"]["results"]) == 5
    assert payload["data"]["taskInfo"] == {"totalCount": 5, "offset": 0, "size": 100}


async def test_rate_limited_processing_409_then_done(
    start_service: StartService, client_for: Callable[..., TaggerClient]
) -> None:
    service = await start_service(rate=200.0)
    client = client_for(service.url)
    created = await client.create_task(requests(40))
    task = await client.task_status(created.task_id)
    assert task.task_status is TaskStatus.PROCESSING and task.count.processing > 0
    assert task.result_expired_at is None
    with pytest.raises(ResultsNotReadyError):
        await client.task_results(created.task_id)
    import anyio

    with anyio.fail_after(5):
        while not (task := await client.task_status(created.task_id)).done:
            assert task.count.done + task.count.processing == 40
            await anyio.sleep(0.02)
    assert task.count.done == 40 and task.result_expired_at is not None
    page = await client.task_results(created.task_id)
    assert [r.id for r in page.results] == [f"sku-{i}" for i in range(40)]


async def test_unknown_route_and_method(service: RunningService) -> None:
    status, payload, _ = await raw(service, "GET", "/tagger/v9/nothing")
    assert status == 404 and payload["error"]["code"] == 623
    status, payload, _ = await raw(service, "DELETE", BULK)
    assert status == 405 and payload["status"] == "failure"


async def test_bulk_element_with_all_context_fields(client: TaggerClient) -> None:
    req = TaggingRequest(
        image=Image(type=ImageType.URL, content="https://cdn.test/full.jpg"),
        context=BulkContext(
            id="full",
            detection=[Detection.TOP],
            gender="female",
            brand="b",
            currency="KRW",
            price="1000",
            age=["20s", "30s"],
            keywords="k",
            product_content_name="n",
            season="SS",
        ),
    )
    created = await client.create_task([req])
    assert created.validation.accept == 1


async def test_all_tasks_pages_through_the_list(
    service: RunningService, client_for: Callable[..., TaggerClient]
) -> None:
    """Without paging parameters the list has every task (the spec's list takes none); with
    them it is paged, and all_tasks() reads every page, so adopting a task after an ambiguous
    create or `tasks list` never misses an older one."""
    client = client_for(service.url)
    created = [
        (await client.create_task(requests(1), description=f"t{i}")).task_id for i in range(130)
    ]
    assert len(await client.list_tasks()) == 130
    assert len(await client.list_tasks(offset=0, size=100)) == 100
    everything = await client.all_tasks(page_size=40)
    assert [t.task_id for t in everything] == created[::-1]
