"""TaggerClient unit tests with aioresponses: where a real server cannot misbehave on cue."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import traceback
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import msgspec
import pytest
from aioresponses import aioresponses

from fashiontag_pipeline import (
    AmbiguousWriteError,
    AuthenticationError,
    BulkContext,
    ConnectError,
    Image,
    ImageType,
    PermissionDeniedError,
    RateLimitedError,
    ResultsExpiredError,
    ResultsNotReadyError,
    RetryPolicy,
    ServerError,
    TaggerClient,
    TaggingRequest,
    TaskExpiredError,
    TaskNotFoundError,
    Timeout,
    TransportError,
    UnsupportedLanguageError,
    ValidationError,
)

BASE = "http://tagger.test"
KEY = "single-SECRET-0123456789"
BULK_KEY = "bulk-SECRET-9876543210"
BULK = re.compile(r"^http://tagger\.test/tagger/v2\.12/bulk$")
TASK = re.compile(r"^http://tagger\.test/tagger/v2\.12/bulk/t-1$")
RESULTS = re.compile(r"^http://tagger\.test/tagger/v2\.12/bulk/t-1\?.*$")
STATUS = re.compile(r"^http://tagger\.test/tagger/v2\.12/bulk/t-1/status$")
SINGLE = re.compile(r"^http://tagger\.test/tagger/v2/tags$")

CREATED = {
    "taskId": "t-1",
    "albumName": "a",
    "taskExpiredAt": "2026-11-22T04:00:00.000Z",
    "validation": {"accept": 1, "failure": 0},
    "failureList": [],
}


def requests(n: int = 1) -> list[TaggingRequest]:
    return [
        TaggingRequest(
            image=Image(type=ImageType.URL, content=f"https://cdn.test/{i}.jpg"),
            context=BulkContext(id=f"sku-{i}"),
        )
        for i in range(n)
    ]


def body(obj: Any) -> bytes:
    return msgspec.json.encode(obj)


class Sleeps:
    """An injected sleep that records delays instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


@pytest.fixture
def mocked() -> Any:
    with aioresponses() as m:
        yield m


@pytest.fixture
async def make_client() -> AsyncIterator[Callable[..., TaggerClient]]:
    made: list[TaggerClient] = []

    def factory(**kwargs: Any) -> TaggerClient:
        kwargs.setdefault("api_key", KEY)
        kwargs.setdefault("bulk_api_key", BULK_KEY)
        kwargs.setdefault("sleep", Sleeps())
        client = TaggerClient(BASE, **kwargs)
        made.append(client)
        return client

    yield factory
    for client in made:
        await client.aclose()


def sent_headers(mocked: Any, method: str) -> list[dict[str, str]]:
    return [
        dict(call.kwargs.get("headers") or {})
        for (m, _url), calls in mocked.requests.items()
        if m == method
        for call in calls
    ]


async def test_bulk_paths_send_the_bulk_key_and_single_path_the_single_key(
    mocked: Any, make_client: Callable[..., TaggerClient]
) -> None:
    mocked.post(BULK, status=202, body=body(CREATED))
    mocked.post(SINGLE, status=200, body=body({"status": "success", "data": {"objects": []}}))
    client = make_client()
    created = await client.create_task(requests(), description="token")
    assert created.task_id == "t-1" and created.expires_at is not None
    tagged = await client.tag(Image(type=ImageType.URL, content="https://cdn.test/x.jpg"))
    assert tagged.ok
    posts = sent_headers(mocked, "POST")
    assert [h["x-api-key"] for h in posts] == [BULK_KEY, KEY]
    assert all(h["Content-Type"] == "application/json" for h in posts)


async def test_single_key_is_used_on_bulk_paths_when_no_bulk_key(
    mocked: Any, make_client: Callable[..., TaggerClient]
) -> None:
    mocked.get(BULK, status=200, body=body({"status": "success", "data": {"tasks": []}}))
    client = make_client(bulk_api_key=None)
    assert await client.list_tasks() == []
    assert sent_headers(mocked, "GET")[0]["x-api-key"] == KEY


@pytest.mark.parametrize(
    ("status", "payload", "error", "method"),
    [
        (401, {"status": "failure", "error": "API key required"}, AuthenticationError, "GET"),
        (403, {"status": "failure", "error": "not a bulk key"}, PermissionDeniedError, "GET"),
        (404, {"status": "failure", "error": "unknown task"}, TaskNotFoundError, "GET"),
        (409, {"status": "failure", "error": "TASK_PROCESSING"}, ResultsNotReadyError, "GET"),
        (410, {"status": "failure", "error": "results expired"}, ResultsExpiredError, "GET"),
        (400, {"status": "failure", "error": "size must be 1..100"}, ValidationError, "GET"),
        (410, {"status": "failure", "error": "task expired"}, TaskExpiredError, "PUT"),
        (
            400,
            {"status": "failure", "error": {"code": 826, "message": "lang"}},
            UnsupportedLanguageError,
            "GET",
        ),
    ],
)
async def test_error_statuses_map_to_the_exception_tree_without_retry(
    mocked: Any,
    make_client: Callable[..., TaggerClient],
    status: int,
    payload: Any,
    error: type[Exception],
    method: str,
) -> None:
    client = make_client()
    if method == "PUT":
        mocked.put(TASK, status=status, body=body(payload))
        with pytest.raises(error) as info:
            await client.append_to_task("t-1", requests())
    else:
        mocked.get(RESULTS, status=status, body=body(payload))
        with pytest.raises(error) as info:
            await client.task_results("t-1", offset=0, size=100)
    err: Any = info.value
    assert err.status == status
    assert err.task_id == "t-1"
    assert client.stats.requests == 1 and client.stats.retries == 0
    expected_message = payload["error"] if isinstance(payload["error"], str) else "lang"
    assert expected_message in str(err)


async def test_strict_validation_failure_carries_the_failure_list(
    mocked: Any, make_client: Callable[..., TaggerClient]
) -> None:
    failure = {
        "request": {"image": {"type": "url", "content": "nope"}, "context": {"id": "sku-0"}},
        "errorMessage": "image.content must be an http(s) URL",
    }
    mocked.post(
        BULK,
        status=400,
        body=body({"status": "failure", "error": "STRICT", "failureList": [failure]}),
    )
    client = make_client()
    with pytest.raises(ValidationError) as info:
        await client.create_task(requests(), strict=True)
    assert info.value.failure_list[0].context_id == "sku-0"
    assert info.value.failure_list[0].error_message.startswith("image.content")


async def test_reads_honour_retry_after_then_succeed(
    mocked: Any, make_client: Callable[..., TaggerClient]
) -> None:
    mocked.get(
        STATUS,
        status=429,
        headers={"Retry-After": "1.5"},
        body=body({"status": "failure", "error": "slow down"}),
    )
    mocked.get(STATUS, status=503, body=b"upstream unavailable")
    mocked.get(
        STATUS,
        status=200,
        body=body({"status": "success", "data": {"taskId": "t-1", "taskStatus": "TASK_DONE"}}),
    )
    sleeps = Sleeps()
    client = make_client(sleep=sleeps)
    task = await client.task_status("t-1")
    assert task.done
    assert sleeps.delays[0] == 1.5
    # The 503 is the second attempt: full jitter under a ceiling of base * 2.
    assert 0 <= sleeps.delays[1] <= RetryPolicy().backoff(2, 1.0)
    assert client.stats.retries == 2 and client.stats.rate_limited == 1


async def test_retry_after_is_capped_by_policy(
    mocked: Any, make_client: Callable[..., TaggerClient]
) -> None:
    mocked.get(BULK, status=429, headers={"Retry-After": "3600"}, body=b"{}")
    mocked.get(BULK, status=200, body=body({"status": "success", "data": {"tasks": []}}))
    sleeps = Sleeps()
    client = make_client(sleep=sleeps, retry=RetryPolicy(max_retry_after=5.0))
    await client.list_tasks()
    assert sleeps.delays == [5.0]


@pytest.mark.parametrize("header", ["0", "-5", "nan"])
async def test_a_retry_after_of_zero_waits_the_backoff_and_a_negative_one_is_ignored(
    mocked: Any, make_client: Callable[..., TaggerClient], header: str
) -> None:
    """A key limited to a few requests a second answered 429 with ``Retry-After: 0`` (or a
    negative value, which the client read as 0): every retry went out at once, 12-14 answers
    429 per useful request where no header at all cost ~3.7. A retry now waits at least the
    backoff, and a value that is not a number of seconds from now is ignored like garbage."""
    for _ in range(2):
        mocked.get(BULK, status=429, headers={"Retry-After": header}, body=b"{}")
    mocked.get(BULK, status=200, body=body({"status": "success", "data": {"tasks": []}}))
    sleeps = Sleeps()
    client = make_client(sleep=sleeps, retry=RetryPolicy(backoff_base=1.0, backoff_max=8.0))
    client._http._random.random = lambda: 0.5  # type: ignore[method-assign]
    await client.list_tasks()
    assert sleeps.delays == [0.5, 1.0]


async def test_retries_stop_at_max_attempts_with_the_last_error(
    mocked: Any, make_client: Callable[..., TaggerClient]
) -> None:
    for _ in range(3):
        mocked.get(BULK, status=500, body=body({"status": "failure", "error": "boom"}))
    sleeps = Sleeps()
    client = make_client(
        sleep=sleeps, retry=RetryPolicy(max_attempts=3, backoff_base=1.0, backoff_max=1.5)
    )
    with pytest.raises(ServerError, match="boom") as info:
        await client.list_tasks()
    assert info.value.status == 500
    assert client.stats.requests == 3 and len(sleeps.delays) == 2
    assert all(0 <= d <= 1.5 for d in sleeps.delays)


@pytest.mark.parametrize("read", ["status", "list"])
async def test_a_read_answered_200_with_a_failure_body_is_a_transient_server_error(
    mocked: Any, make_client: Callable[..., TaggerClient], read: str
) -> None:
    """The spec's failure body with HTTP 200 on a read (a service that says so while it is
    busy): a ServerError the engine retries, never a RequestError that stops a run."""
    failure = body({"status": "failure", "error": "temporarily unavailable"})
    client = make_client()
    with pytest.raises(ServerError, match="HTTP 200 with status='failure'") as info:
        if read == "status":
            mocked.get(STATUS, status=200, body=failure)
            await client.task_status("t-1")
        else:
            mocked.get(BULK, status=200, body=failure)
            await client.list_tasks()
    assert info.value.status == 200
    assert info.value.service_message == "temporarily unavailable"


async def test_rate_limited_error_after_budget_carries_retry_after(
    mocked: Any, make_client: Callable[..., TaggerClient]
) -> None:
    for _ in range(2):
        mocked.get(BULK, status=429, headers={"Retry-After": "2"}, body=b"{}")
    client = make_client(retry=RetryPolicy(max_attempts=2))
    with pytest.raises(RateLimitedError) as info:
        await client.list_tasks()
    assert info.value.retry_after == 2.0


async def test_reads_retry_transport_errors(
    mocked: Any, make_client: Callable[..., TaggerClient]
) -> None:
    mocked.get(BULK, exception=aiohttp.ServerDisconnectedError())
    mocked.get(BULK, exception=TimeoutError())
    mocked.get(BULK, status=200, body=body({"status": "success", "data": {"tasks": []}}))
    client = make_client()
    assert await client.list_tasks() == []
    assert client.stats.retries == 2 and client.stats.transport_errors == 2


@pytest.mark.parametrize(
    "failure",
    [aiohttp.ServerDisconnectedError(), TimeoutError(), aiohttp.ClientPayloadError("cut")],
)
async def test_write_with_unknown_outcome_is_ambiguous_and_not_retried(
    mocked: Any, make_client: Callable[..., TaggerClient], failure: Exception
) -> None:
    mocked.post(BULK, exception=failure)
    client = make_client()
    with pytest.raises(AmbiguousWriteError) as info:
        await client.create_task(requests(), description="tok")
    assert info.value.method == "POST"
    assert client.stats.requests == 1 and client.stats.ambiguous_writes == 1


async def test_write_answered_with_5xx_is_ambiguous(
    mocked: Any, make_client: Callable[..., TaggerClient]
) -> None:
    mocked.put(TASK, status=502, body=b"bad gateway")
    client = make_client()
    with pytest.raises(AmbiguousWriteError) as info:
        await client.append_to_task("t-1", requests())
    assert info.value.status == 502
    assert client.stats.requests == 1


async def test_write_rate_limited_is_retried_because_it_was_not_applied(
    mocked: Any, make_client: Callable[..., TaggerClient]
) -> None:
    mocked.post(BULK, status=429, headers={"Retry-After": "0.25"}, body=b"{}")
    mocked.post(BULK, status=202, body=body(CREATED))
    sleeps = Sleeps()
    client = make_client(sleep=sleeps)
    created = await client.create_task(requests())
    assert created.task_id == "t-1" and sleeps.delays == [0.25]


async def test_a_write_refused_after_writes_stopped_counts_no_retry(
    mocked: Any, make_client: Callable[..., TaggerClient]
) -> None:
    """A create answered 429 once the caller has stopped writing (a drain) is not sent again,
    yet it was counted as a retry (an interrupted run's summary said "retries 1")."""
    import anyio

    from fashiontag_pipeline._callctx import WRITES_STOPPED

    mocked.post(BULK, status=429, headers={"Retry-After": "0.25"}, body=b"{}")
    stopped = anyio.Event()
    stopped.set()
    client = make_client()
    token = WRITES_STOPPED.set(stopped)
    try:
        with pytest.raises(RateLimitedError):
            await client.create_task(requests())
    finally:
        WRITES_STOPPED.reset(token)
    assert client.stats.requests == 1
    assert client.stats.retries == 0 and client.stats.rate_limited == 1


async def test_write_that_cannot_connect_is_retried_then_raises_connect_error() -> None:
    # Port 9 on loopback: nothing listens, the connection is refused, nothing was sent.
    sleeps = Sleeps()
    async with TaggerClient(
        "http://127.0.0.1:9", api_key=KEY, sleep=sleeps, retry=RetryPolicy(max_attempts=3)
    ) as client:
        with pytest.raises(ConnectError) as info:
            await client.create_task(requests())
    assert isinstance(info.value, TransportError)
    assert not isinstance(info.value, AmbiguousWriteError)
    assert client.stats.requests == 3 and len(sleeps.delays) == 2


async def test_garbage_body_is_a_decode_error(
    mocked: Any, make_client: Callable[..., TaggerClient]
) -> None:
    mocked.get(BULK, status=200, body=b"<html>oops</html>")
    client = make_client()
    with pytest.raises(TransportError, match="not the expected JSON"):
        await client.list_tasks()


#: A JSON value of arrays nested deeper than msgspec reads (its recursion limit).
DEEP = b"[" * 100_000 + b"]" * 100_000


async def test_an_answer_nested_too_deep_is_a_mapped_error_not_a_recursion_error(
    mocked: Any, make_client: Callable[..., TaggerClient]
) -> None:
    """A task list, a results page (``tasks results``) or an error body nested past the JSON
    reader's depth: the error of an unreadable answer, never a foreign RecursionError."""
    mocked.get(BULK, status=200, body=b'{"status":"success","data":' + DEEP + b"}")
    mocked.get(RESULTS, status=200, body=b'{"status":"success","data":' + DEEP + b"}")
    mocked.get(STATUS, status=404, body=b'{"error":' + DEEP + b"}")
    client = make_client()
    with pytest.raises(TransportError, match="not the expected JSON"):
        await client.list_tasks()
    with pytest.raises(TransportError):
        await client.task_results("t-1", offset=0, size=100)
    with pytest.raises(ServerError, match="not the service's answer"):
        await client.task_status("t-1")  # a 404 whose body is no JSON: a front end's


async def test_status_other_than_success_on_a_200_is_an_error(
    mocked: Any, make_client: Callable[..., TaggerClient]
) -> None:
    mocked.get(BULK, status=200, body=body({"status": "fail", "error": "db down"}))
    client = make_client()
    with pytest.raises(Exception, match="db down"):
        await client.list_tasks()


async def test_local_argument_checks_refuse_limits_before_sending(
    make_client: Callable[..., TaggerClient],
) -> None:
    client = make_client()
    with pytest.raises(ValueError, match="at most 1000"):
        await client.create_task(requests(1001))
    with pytest.raises(ValueError, match="at least one"):
        await client.create_task([])
    with pytest.raises(ValueError, match="1024"):
        await client.create_task(requests(), description="x" * 1025)
    with pytest.raises(ValueError, match="size"):
        await client.task_results("t-1", size=101)
    with pytest.raises(ValueError, match="offset"):
        await client.task_results("t-1", offset=-1)
    assert client.stats.requests == 0


async def test_keys_never_appear_in_reprs_errors_tracebacks_or_logs(
    mocked: Any, make_client: Callable[..., TaggerClient], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    mocked.get(BULK, status=401, body=body({"status": "failure", "error": "authentication failed"}))
    mocked.post(BULK, exception=aiohttp.ServerDisconnectedError())
    client = make_client()
    texts = [repr(client), str(client)]
    for call in (client.list_tasks(), client.create_task(requests())):
        with pytest.raises(Exception) as info:
            await call
        texts += [str(info.value), repr(info.value)]
        texts += traceback.format_exception(info.value)
    texts.append(caplog.text)
    joined = "\n".join(texts)
    assert "GET /tagger/v2.12/bulk" in caplog.text  # the debug lines exist...
    assert KEY not in joined and BULK_KEY not in joined  # ...and hold no key.


async def test_retry_after_as_an_http_date_is_honoured(
    mocked: Any, make_client: Callable[..., TaggerClient]
) -> None:
    # RFC 9110 allows an HTTP date; it is read against the response's own Date header.
    mocked.get(
        STATUS,
        status=429,
        headers={
            "Retry-After": "Wed, 21 Oct 2026 07:28:12 GMT",
            "Date": "Wed, 21 Oct 2026 07:28:00 GMT",
        },
        body=body({"status": "failure", "error": "slow down"}),
    )
    mocked.get(
        STATUS,
        status=200,
        body=body({"status": "success", "data": {"taskId": "t-1", "taskStatus": "TASK_DONE"}}),
    )
    sleeps = Sleeps()
    client = make_client(sleep=sleeps)
    assert (await client.task_status("t-1")).done
    assert sleeps.delays == [12.0]


@pytest.mark.parametrize(
    ("zone", "retry_after", "date"),
    [
        ("America/New_York", "Wed, 21 Oct 2026 07:28:12 -0000", "Wed, 21 Oct 2026 07:28:00 GMT"),
        ("Asia/Seoul", "Wed, 21 Oct 2026 07:28:12 GMT", "Wed, 21 Oct 2026 07:28:00 -0000"),
    ],
)
async def test_retry_after_and_date_with_the_zone_minus_0000_are_read_as_gmt(
    mocked: Any,
    make_client: Callable[..., TaggerClient],
    monkeypatch: pytest.MonkeyPatch,
    zone: str,
    retry_after: str,
    date: str,
) -> None:
    """A Retry-After or a Date written with ``-0000`` (RFC 2822's "zone unknown", as Python's
    ``email.utils.formatdate()`` writes it; an HTTP date is GMT) was read in the host's local
    time: asked to wait 12 s, the client waited the longest Retry-After it takes (4 h off,
    capped), or, past the give-up point, the run stopped. It is read as GMT, as the clock's
    Date is."""
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        mocked.get(
            STATUS,
            status=429,
            headers={"Retry-After": retry_after, "Date": date},
            body=body({"status": "failure", "error": "slow down"}),
        )
        mocked.get(
            STATUS,
            status=200,
            body=body({"status": "success", "data": {"taskId": "t-1", "taskStatus": "TASK_DONE"}}),
        )
        sleeps = Sleeps()
        client = make_client(sleep=sleeps)
        assert (await client.task_status("t-1")).done
        assert sleeps.delays == [12.0]
    finally:
        monkeypatch.undo()
        time.tzset()


async def test_first_failure_of_a_streak_is_a_warning_and_each_retry_is_logged(
    mocked: Any, make_client: Callable[..., TaggerClient], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "fashiontag_pipeline")
    for _ in range(3):
        mocked.get(STATUS, status=503, body=b"upstream unavailable")
    ok = body({"status": "success", "data": {"taskId": "t-1", "taskStatus": "TASK_DONE"}})
    mocked.get(STATUS, status=200, body=ok)
    mocked.get(STATUS, status=503, body=b"again")
    mocked.get(STATUS, status=200, body=ok)
    client = make_client()
    await client.task_status("t-1")
    await client.task_status("t-1")
    records = [(r.levelname, r.getMessage()) for r in caplog.records]
    warnings = [m for level, m in records if level == "WARNING"]
    # One warning for the first streak, not one per retry; the second streak, within
    # WARN_EVERY seconds of the first warning, is logged at info (a flaky service must not
    # flood a log).
    assert len(warnings) == 1
    assert "HTTP 503" in warnings[0] and "retry 1 of 5" in warnings[0] and BASE in warnings[0]
    assert any(level == "INFO" and "retry 3 of 5" in m for level, m in records)
    assert [m for level, m in records if "again" in m and level == "INFO"][-1].endswith("again")
    assert any("answers again" in m for _, m in records)
    assert all(KEY not in m and BULK_KEY not in m for _, m in records)


async def test_a_refused_key_error_names_its_source_never_the_key(
    mocked: Any, make_client: Callable[..., TaggerClient]
) -> None:
    mocked.get(BULK, status=401, body=body({"status": "failure", "error": "authentication failed"}))
    client = make_client()
    with pytest.raises(AuthenticationError) as info:
        await client.list_tasks()
    text = str(info.value)
    assert "the bulk key from the caller was refused" in text
    assert "FASHIONTAG_BULK_API_KEY" in text and BULK_KEY not in text


async def test_a_write_answered_after_a_freeze_went_unanswered_its_deadline_at_most(
    mocked: Any, make_client: Callable[..., TaggerClient]
) -> None:
    """A create answered 502 by a gateway, the answer seen long after the request's deadline
    (this process frozen meanwhile: a suspended laptop, a SIGSTOP): it went unanswered for
    the freeze, and its task was looked for as long again (an hour's suspend: the writer held
    an hour). An answer cannot take longer than the deadline: that is the most, as for a
    timeout."""
    from aioresponses import CallbackResult

    async def frozen(url: Any, **kwargs: Any) -> CallbackResult:
        await asyncio.sleep(0.5)
        return CallbackResult(status=502, body=b"<html>502 Bad Gateway</html>")

    mocked.post(BULK, callback=frozen)
    client = make_client(timeout=Timeout(total=0.1))
    with pytest.raises(AmbiguousWriteError) as info:
        await client.create_task(requests())
    assert 0 < info.value.unanswered_for <= 0.1
