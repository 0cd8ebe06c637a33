"""The reference service against the spec, where a review found it departing (each test
failed before its fix): results that expired while the task still took writes (unreadable
images accepted with a 202, a duplicate id accepted, a task stuck processing for ever), a
task list that gave only the newest 100 to a client that asks with no parameters, as the spec
does, failure echoes cut at 256 characters, single-mode context fields of any type, and a
405 without the ``Allow`` header HTTP requires.
"""

from __future__ import annotations

from typing import Any

from fashiontag_pipeline.service import RunningService

from .conftest import BULK_KEY, FakeClock, StartService
from .test_bulk import BULK, raw


def _elements(n: int, prefix: str = "sku", **image: Any) -> list[dict[str, Any]]:
    return [
        {
            "image": {"type": "url", "content": f"https://cdn.test/{prefix}/{i}.jpg", **image},
            "context": {"id": f"{prefix}-{i}"},
        }
        for i in range(n)
    ]


async def test_results_of_an_accepted_append_stay_readable_while_task_is_open(
    start_service: StartService, clock: FakeClock
) -> None:
    """Spec 4.3: a PUT before taskExpireAt is allowed and its images join the task; spec 3/4.6:
    results are readable once TASK_DONE, until resultExpiredAt. The service (default
    no-fetch, --rate 0) keeps resultExpiredAt from the task's *first* completion, so images
    appended later (202, TASK_DONE) are already past resultExpiredAt: 410."""
    service = await start_service(clock=clock, task_ttl=600.0, result_ttl=600.0)
    status, created, _ = await raw(service, "POST", BULK, {"taggingRequest": _elements(1)})
    assert status == 202
    task_id = created["taskId"]
    clock.advance(590)
    status, put, _ = await raw(
        service, "PUT", f"{BULK}/{task_id}", {"taggingRequest": _elements(1, prefix="late")}
    )
    assert status == 202 and put["validation"]["accept"] == 1
    clock.advance(20)  # 610 s after creation, 20 s after the append; task open until 1200 s
    status, st, _ = await raw(service, "GET", f"{BULK}/{task_id}/status")
    assert st["data"]["taskStatus"] == "TASK_DONE"
    status, page, _ = await raw(service, "GET", f"{BULK}/{task_id}?offset=0&size=100")
    assert status == 200, (status, page, st["data"])
    assert [r["id"] for r in page["data"]["results"]] == ["sku-0", "late-0"]


async def test_put_is_refused_once_results_expired(
    start_service: StartService, clock: FakeClock
) -> None:
    """Same root cause, the other side: a PUT is accepted (202, counts grow) into a task whose
    results already expired, so those images can never be read."""
    service = await start_service(clock=clock, task_ttl=600.0, result_ttl=600.0)
    _, created, _ = await raw(service, "POST", BULK, {"taggingRequest": _elements(1)})
    task_id = created["taskId"]
    clock.advance(590)
    await raw(service, "PUT", f"{BULK}/{task_id}", {"taggingRequest": _elements(1, prefix="a")})
    clock.advance(20)
    status, page, _ = await raw(service, "GET", f"{BULK}/{task_id}?offset=0&size=100")
    status_put, put, _ = await raw(
        service, "PUT", f"{BULK}/{task_id}", {"taggingRequest": _elements(1, prefix="b")}
    )
    # Either the results are readable, or the task no longer takes images: not both 410/202.
    assert not (status == 410 and status_put == 202), (status, page, status_put, put)


async def test_list_without_paging_returns_every_task(service: RunningService) -> None:
    """Spec 4.4: GET /tagger/v2.12/bulk takes no query and answers data.tasks[] (the tasks).
    The service pages it silently (100 newest by default)."""
    for i in range(101):
        status, _, _ = await raw(
            service, "POST", BULK, {"taggingRequest": _elements(1, prefix=f"t{i}")}
        )
        assert status == 202
    status, listing, _ = await raw(service, "GET", BULK)
    assert status == 200
    assert len(listing["data"]["tasks"]) == 101


async def test_failure_list_echoes_the_sent_request(service: RunningService) -> None:
    """Spec 4.2: failureList[].request echoes the sent image (type and content) and context.
    The service cuts strings over 256 characters (adding an ellipsis)."""
    url = "https://cdn.test/" + "a" * 300 + ".jpg"
    element = {
        "image": {"type": "url", "content": url},
        "context": {"id": "x1", "detection": ["NOPE"], "keywords": "k" * 300},
    }
    status, body, _ = await raw(service, "POST", BULK, {"taggingRequest": [element]})
    assert status == 202
    echo = body["failureList"][0]["request"]
    assert echo["image"]["content"] == url
    assert echo["context"]["keywords"] == "k" * 300


async def test_single_mode_context_types_are_validated(service: RunningService) -> None:
    """Spec 2.2: in single mode context.id and the other fields are strings, age a string.
    Bulk mode refuses wrong types per element; single mode accepts anything (200 success)."""
    for context in (
        {"age": ["20s"]},
        {"id": 123},
        {"gender": 7},
        {"brand": {"x": 1}},
    ):
        status, body, _ = await raw(
            service,
            "POST",
            "/tagger/v2/tags",
            {"image": {"type": "url", "content": "https://cdn.test/a.jpg"}, "context": context},
            key="single-SECRET-key-0001",
        )
        assert status == 400 or body["status"] != "success", (context, status)


async def test_context_id_stays_unique_after_results_expire(
    start_service: StartService, clock: FakeClock
) -> None:
    """Spec 2.2/2.4/7: context.id is unique within a task. Once a task's results expire the
    service drops its ids (sweep) but still takes PUTs until taskExpireAt; an id already in
    the task is then accepted a second time."""
    service = await start_service(clock=clock, task_ttl=600.0, result_ttl=600.0)
    _, created, _ = await raw(service, "POST", BULK, {"taggingRequest": _elements(1)})
    task_id = created["taskId"]
    clock.advance(590)
    await raw(service, "PUT", f"{BULK}/{task_id}", {"taggingRequest": _elements(1, prefix="a")})
    clock.advance(20)
    service.store.sweep()  # what the worker does every SWEEP_INTERVAL
    status, put, _ = await raw(
        service,
        "PUT",
        f"{BULK}/{task_id}",
        {"taggingRequest": _elements(1)},  # sku-0 again
    )
    assert not (status == 202 and put["validation"]["accept"] == 1), put


async def test_append_after_results_expired_never_stalls_in_processing(
    start_service: StartService, clock: FakeClock
) -> None:
    """Rate-limited service: results expire (600 s after done) while the write window
    (extended per PUT) is still open. A PUT is then accepted (202), but the worker skips
    purged tasks, so the task reports TASK_PROCESSING forever: a client polling per spec 4.7
    step 3 never sees TASK_DONE."""
    import anyio

    service = await start_service(clock=clock, task_ttl=600.0, result_ttl=600.0, rate=1000.0)

    async def wait_done(task_id: str) -> dict[str, Any]:
        for _ in range(100):
            _, st, _ = await raw(service, "GET", f"{BULK}/{task_id}/status")
            if st["data"]["taskStatus"] == "TASK_DONE":
                return st["data"]
            await anyio.sleep(0.02)
        return st["data"]

    _, created, _ = await raw(service, "POST", BULK, {"taggingRequest": _elements(1)})
    task_id = created["taskId"]
    await wait_done(task_id)
    clock.advance(100)
    for n in range(3):  # three quick appends: write window now ends 2,400 s after creation
        await raw(service, "PUT", f"{BULK}/{task_id}", {"taggingRequest": _elements(1, f"a{n}")})
    await wait_done(task_id)  # done at 100 s; results readable until 700 s
    clock.advance(700)  # 800 s: results expired, the task still takes PUTs until 2,400 s
    service.store.sweep()
    status, put, _ = await raw(
        service, "PUT", f"{BULK}/{task_id}", {"taggingRequest": _elements(1, prefix="late")}
    )
    # Refused: its image could never be read, nor the task end.
    assert status == 410 and "results of task" in put["error"], put
    data = await wait_done(task_id)
    assert data["taskStatus"] == "TASK_DONE", data


async def test_a_405_names_the_methods_the_path_takes(service: RunningService) -> None:
    """HTTP (RFC 9110 15.5.6): a 405 must carry ``Allow``, the methods the resource takes. The
    service's JSON 405 (error 623) left it out, so a client could not tell which method was
    meant (``GET /tagger/v2/tags`` said only "invalid URI or method")."""
    single_key = "single-SECRET-key-0001"
    cases = [
        ("DELETE", BULK, {"GET", "POST"}, BULK_KEY),
        ("GET", "/tagger/v2/tags", {"POST"}, single_key),
        ("POST", f"{BULK}/some-task", {"GET", "PUT"}, BULK_KEY),
        ("PUT", f"{BULK}/some-task/status", {"GET"}, BULK_KEY),
    ]
    for method, path, allowed, key in cases:
        status, body, headers = await raw(service, method, path, key=key)
        assert status == 405 and body["status"] == "failure", (method, path, body)
        given = {m.strip() for m in headers.get("Allow", "").split(",") if m.strip()}
        assert allowed <= given, (method, path, headers.get("Allow"))
