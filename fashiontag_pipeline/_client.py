"""TaggerClient: the async client of the tagging service's six operations.

One aiohttp ClientSession per client, with a sized connector; every foreign error is mapped to
the tree in :mod:`fashiontag_pipeline._exceptions` in one place (:meth:`TaggerClient._send`).

Retry rules
-----------
* Reads (list, status, results) and single-mode tagging are retried under the
  :class:`~fashiontag_pipeline.RetryPolicy` on 429 (honouring Retry-After), 5xx, timeouts and
  transport errors.
* Writes (create, append) are retried only when they were certainly not applied: on 429 and on
  a connection that could not be made. A write whose outcome is unknown (timeout or dropped
  connection after it was sent, 5xx) raises :class:`AmbiguousWriteError`; the engine resolves it
  with its idempotency rules.
* 4xx answers are never retried; service code 826 (unsupported language) neither.

Cost
----
A request is the hot path of a run (one per 100 results read), so it does no per-request work
that does not depend on the request: URLs are built as text from a base URL parsed once and
handed to aiohttp pre-encoded (no yarl parsing and quoting of a query per page), and a
request has one deadline (:attr:`Timeout.total`, else ``connect + read``) rather than a
per-read socket timer that aiohttp re-arms for every chunk it receives.
"""

from __future__ import annotations

import contextlib
import email.utils
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar, cast
from urllib.parse import quote

import aiohttp
import anyio
import msgspec
from yarl import URL

from . import _exceptions as exc
from ._clock import ServerClock
from ._config import (
    ClientConfig,
    Limits,
    RetryPolicy,
    Secret,
    Timeout,
    key_hint,
    with_default_keys,
)
from ._models import (
    LANGUAGES,
    MAX_DESCRIPTION_LENGTH,
    MAX_PAGE_SIZE,
    MAX_REQUESTS_PER_WRITE,
    STATUS_SUCCESS,
    BulkTaskRequest,
    BulkTaskResponse,
    Context,
    Detection,
    EncodedRequests,
    FailureItem,
    Image,
    SingleTagRequest,
    TaggingRequest,
    TaggingResponse,
    Task,
    TaskListData,
    TaskListResponse,
    TaskResultsData,
    TaskResultsResponse,
    TaskStatusResponse,
)

__all__ = ["LIST_PAGE_SIZE", "ClientStats", "TaggerClient"]

logger = logging.getLogger("fashiontag_pipeline.client")

SINGLE_PATH = "/tagger/v2/tags"
BULK_PATH = "/tagger/v2.12/bulk"
USER_AGENT = "fashiontag_pipeline/0.1"
CODE_UNSUPPORTED_LANGUAGE = 826
#: Set (``True``) on the log record of the first failed attempt after a success.
FIRST_FAILURE = "fashiontag_first_failure"
#: At most one first-failure warning per this many seconds (the others are logged at info).
WARN_EVERY = 30.0

T = TypeVar("T")

_encoder = msgspec.json.Encoder()
_error_body_decoder = msgspec.json.Decoder(dict[str, Any])
#: Tasks asked for per list page (the reference service's maximum).
LIST_PAGE_SIZE = 1000

_failure_list_decoder = msgspec.json.Decoder(list[FailureItem])
_bulk_response_decoder = msgspec.json.Decoder(BulkTaskResponse)
_tagging_decoder = msgspec.json.Decoder(TaggingResponse)
_list_decoder = msgspec.json.Decoder(TaskListResponse)
_status_decoder = msgspec.json.Decoder(TaskStatusResponse)
_results_decoder = msgspec.json.Decoder(TaskResultsResponse)


@dataclass(slots=True)
class ClientStats:
    """Counters of what the client did; the engine reports them in its run summary."""

    requests: int = 0
    retries: int = 0
    rate_limited: int = 0
    server_errors: int = 0
    transport_errors: int = 0
    ambiguous_writes: int = 0


@dataclass(slots=True, frozen=True)
class _Response:
    status: int
    body: bytes
    headers: Any


class TaggerClient:
    """Async client of the tagging service.

    Use as an async context manager (or call :meth:`aclose`)::

        async with TaggerClient("http://127.0.0.1:8080", api_key="k", bulk_api_key="b") as c:
            created = await c.create_task(requests, description="run-1")
            task = await c.task_status(created.task_id)

    The single-mode key is sent on ``/tagger/v2/tags``, the bulk key on bulk paths (the single
    key when no bulk key is given). Keys are held as :class:`Secret` and never shown.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | Secret | None = None,
        bulk_api_key: str | Secret | None = None,
        language: str | None = None,
        timeout: Timeout | None = None,
        retry: RetryPolicy | None = None,
        limits: Limits | None = None,
        config: ClientConfig | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        cfg = config or ClientConfig()
        if api_key is None and bulk_api_key is None:
            # No key anywhere: the development keys, as the CLI sends them.
            cfg = with_default_keys(cfg)
        self.base_url = (base_url or cfg.base_url).rstrip("/")
        if not self.base_url.startswith(("http://", "https://")):
            raise exc.ConfigError(
                f"base_url must start with http:// or https://: {self.base_url!r}"
            )
        self._api_key = _as_secret(api_key) if api_key is not None else cfg.api_key
        bulk = _as_secret(bulk_api_key) if bulk_api_key is not None else cfg.bulk_api_key
        self._bulk_api_key = bulk if bulk is not None else self._api_key
        self.language = language or cfg.language
        if self.language not in LANGUAGES:
            raise exc.ConfigError(f"language must be one of {', '.join(LANGUAGES)}")
        self.timeout = timeout or cfg.timeout
        self.retry = retry or cfg.retry
        self.limits = limits or cfg.limits
        self.stats = ClientStats()
        #: The service's clock offset, from responses' ``Date`` (write deadlines use it).
        self.server_clock = ServerClock()
        self._sleep = sleep or anyio.sleep
        self._random = random.Random()
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        # True from a failed attempt until the next answer that is not a failure: the first
        # failure of a streak is a warning (an operator sees it at once), the rest are info.
        self._failing = False
        self._warned_at = -WARN_EVERY
        # The base URL in its encoded form: request URLs are this text plus an encoded path.
        self._base_encoded = str(URL(self.base_url))

    @classmethod
    def from_config(cls, config: ClientConfig, **overrides: Any) -> TaggerClient:
        """A client built from a :class:`ClientConfig` (keyword overrides win)."""
        return cls(config=config, **overrides)

    def __repr__(self) -> str:
        return f"<TaggerClient base_url={self.base_url!r} language={self.language!r}>"

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Self:
        self._ensure_session()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool. Idempotent."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            with anyio.CancelScope(shield=True):
                await session.close()

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("TaggerClient is closed")
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self.limits.max_connections,
                limit_per_host=self.limits.max_connections,
                keepalive_timeout=self.limits.keepalive_expiry,
                ttl_dns_cache=300,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(
                    total=_deadline(self.timeout), sock_connect=self.timeout.connect
                ),
                headers={"User-Agent": USER_AGENT},
                skip_auto_headers=("Content-Type",),
                raise_for_status=False,
            )
        return self._session

    # ------------------------------------------------------------------ operations

    async def tag(
        self,
        image: Image,
        context: Context | None = None,
        *,
        language: str | None = None,
    ) -> TaggingResponse:
        """Tag one image synchronously (``POST /tagger/v2/tags``).

        Returns the tagging response even when ``status`` is a failure for this image (bad
        image, fetch failed): the caller decides; :attr:`TaggingResponse.ok` tells which.
        """
        body = _encoder.encode(SingleTagRequest(image=image, context=context))
        response = await self._call(
            "POST", SINGLE_PATH, body=body, key=self._api_key, language=language, retry_all=True
        )
        # Error statuses are mapped to the exception tree inside _decode.
        return self._decode(_tagging_decoder, response, "POST", SINGLE_PATH)

    async def create_task(
        self,
        requests: Sequence[TaggingRequest] | EncodedRequests,
        *,
        description: str | None = None,
        album_name: str | None = None,
        default_detection: Sequence[Detection] | None = None,
        strict: bool = False,
    ) -> BulkTaskResponse:
        """Create a bulk task with up to 1,000 requests (``POST /tagger/v2.12/bulk``)."""
        body = self._bulk_body(requests, description, album_name, default_detection, strict)
        return await self._write("POST", BULK_PATH, body, task_id=None)

    async def append_to_task(
        self,
        task_id: str,
        requests: Sequence[TaggingRequest] | EncodedRequests,
        *,
        default_detection: Sequence[Detection] | None = None,
        strict: bool = False,
    ) -> BulkTaskResponse:
        """Append up to 1,000 requests to a task (``PUT /tagger/v2.12/bulk/{task}``).

        Raises :class:`TaskExpiredError` when the task is past its expiry.
        """
        body = self._bulk_body(requests, None, None, default_detection, strict)
        return await self._write("PUT", self._task_path(task_id), body, task_id=task_id)

    async def list_tasks(self, *, offset: int | None = None, size: int | None = None) -> list[Task]:
        """One page of the bulk key's tasks (``GET /tagger/v2.12/bulk``); without ``offset``
        and ``size``, the service's default page (the reference service: the 100 newest; a
        service that does not page: every task). See :meth:`all_tasks`."""
        return (await self._task_page(offset, size)).tasks

    async def all_tasks(self, *, page_size: int = LIST_PAGE_SIZE) -> list[Task]:
        """Every task of the bulk key, newest first where the service pages its list: pages of
        ``page_size`` until the service's ``totalCount`` is reached (a service that gives no
        count is taken to have answered with every task at once)."""
        seen: dict[str, Task] = {}
        offset = 0
        while True:
            page = await self._task_page(offset, page_size)
            fresh = [t for t in page.tasks if t.task_id not in seen]
            for task in fresh:
                seen[task.task_id] = task
            info = page.task_info
            offset += len(page.tasks)
            if info is None or info.total_count is None or not fresh:
                break
            if offset >= info.total_count or len(page.tasks) < page_size:
                break
        return list(seen.values())

    async def _task_page(self, offset: int | None, size: int | None) -> TaskListData:
        query = ""
        if offset is not None or size is not None:
            query = f"?offset={int(offset or 0)}&size={int(size or LIST_PAGE_SIZE)}"
        response = await self._call(
            "GET", BULK_PATH, key=self._bulk_api_key, query=query, retry_all=True
        )
        decoded = self._decode(_list_decoder, response, "GET", BULK_PATH)
        self._check_bulk_status(decoded.status, decoded.error, response, "GET", BULK_PATH, None)
        return decoded.data if decoded.data is not None else TaskListData()

    async def task_status(self, task_id: str) -> Task:
        """One task's status and counts (``GET /tagger/v2.12/bulk/{task}/status``)."""
        path = self._task_path(task_id) + "/status"
        response = await self._call(
            "GET", path, key=self._bulk_api_key, retry_all=True, task_id=task_id
        )
        decoded = self._decode(_status_decoder, response, "GET", path)
        self._check_bulk_status(decoded.status, decoded.error, response, "GET", path, task_id)
        if decoded.data is None:
            raise exc.DecodeError(f"status of task {task_id} has no data", method="GET", path=path)
        return decoded.data

    async def task_results(
        self,
        task_id: str,
        *,
        offset: int = 0,
        size: int = MAX_PAGE_SIZE,
        language: str | None = None,
    ) -> TaskResultsData:
        """One page of results (``GET /tagger/v2.12/bulk/{task}?offset=&size=``), size <= 100."""
        body = await self.task_results_raw(task_id, offset=offset, size=size, language=language)
        path = self._task_path(task_id)
        try:
            decoded = _results_decoder.decode(body)
        except msgspec.DecodeError as err:
            raise exc.DecodeError(
                f"GET {path}: response is not a results page: {err}", method="GET", path=path
            ) from err
        if decoded.data is None:
            raise exc.DecodeError(f"results page of task {task_id} has no data", path=path)
        return decoded.data

    async def task_results_raw(
        self,
        task_id: str,
        *,
        offset: int = 0,
        size: int = MAX_PAGE_SIZE,
        language: str | None = None,
    ) -> bytes:
        """The raw JSON body of a results page, checked for success, for callers that decode
        it straight into their own shape (the engine's pagers)."""
        if offset < 0:
            raise ValueError("offset must be >= 0")
        if not 1 <= size <= MAX_PAGE_SIZE:
            raise ValueError(f"size must be between 1 and {MAX_PAGE_SIZE}")
        path = self._task_path(task_id)
        response = await self._call(
            "GET",
            path,
            key=self._bulk_api_key,
            query=f"?offset={int(offset)}&size={int(size)}",
            language=language,
            retry_all=True,
            task_id=task_id,
        )
        if response.status != 200:
            self._raise_for_status(response, "GET", path, task_id)
        return response.body

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _task_path(task_id: str) -> str:
        if not task_id:
            raise ValueError("task_id must not be empty")
        return f"{BULK_PATH}/{quote(task_id, safe='')}"

    @staticmethod
    def _bulk_body(
        requests: Sequence[TaggingRequest] | EncodedRequests,
        description: str | None,
        album_name: str | None,
        default_detection: Sequence[Detection] | None,
        strict: bool,
    ) -> bytes:
        count = requests.size if isinstance(requests, EncodedRequests) else len(requests)
        if not count:
            raise ValueError("a bulk write needs at least one tagging request")
        if count > MAX_REQUESTS_PER_WRITE:
            raise ValueError(
                f"a bulk write takes at most {MAX_REQUESTS_PER_WRITE} requests, got {count}"
            )
        if description is not None and len(description) > MAX_DESCRIPTION_LENGTH:
            raise ValueError(f"description is longer than {MAX_DESCRIPTION_LENGTH} characters")
        return _encoder.encode(
            BulkTaskRequest(
                # Encoded requests are spliced in as they are (msgspec writes a Raw verbatim).
                tagging_request=cast(
                    list[TaggingRequest],
                    requests.raw if isinstance(requests, EncodedRequests) else list(requests),
                ),
                album_name=album_name,
                option=["STRICT"] if strict else None,
                default_detection=list(default_detection) if default_detection else None,
                description=description,
            )
        )

    async def _write(
        self, method: str, path: str, body: bytes, *, task_id: str | None
    ) -> BulkTaskResponse:
        response = await self._call(
            method, path, body=body, key=self._bulk_api_key, retry_all=False, task_id=task_id
        )
        if response.status not in (200, 201, 202):
            self._raise_for_status(response, method, path, task_id)
        try:
            return self._decode(_bulk_response_decoder, response, method, path)
        except exc.DecodeError as err:
            # The write was accepted (2xx) but its answer is unreadable: its outcome (which task,
            # which rows) is unknown, exactly like a lost answer. Never retried blindly.
            self.stats.ambiguous_writes += 1
            raise exc.AmbiguousWriteError(
                f"{method} {path}: HTTP {response.status} answer could not be read ({err}); "
                "the write may have been applied",
                method=method,
                path=path,
            ) from err

    async def _call(
        self,
        method: str,
        path: str,
        *,
        key: Secret | None,
        body: bytes | None = None,
        query: str = "",
        language: str | None = None,
        retry_all: bool,
        task_id: str | None = None,
    ) -> _Response:
        """Send with retries; returns the final response (error statuses included only when
        they are not retryable), or raises the mapped error."""
        attempt = 0
        while True:
            attempt += 1
            last_attempt = attempt >= self.retry.max_attempts
            try:
                response = await self._send(method, path, key, body, query, language, retry_all)
            except exc.TransportError as err:
                if isinstance(err, exc.AmbiguousWriteError):
                    raise
                retryable = retry_all or isinstance(err, exc.ConnectError)
                if not retryable or last_attempt:
                    self._note_failure(str(err), None, attempt)
                    raise
                self.stats.retries += 1
                delay = self.retry.backoff(attempt, self._random.random())
                self._note_failure(str(err), delay, attempt)
                await self._sleep(delay)
                continue

            status = response.status
            if status == 429:
                self.stats.rate_limited += 1
                if last_attempt:
                    self._raise_for_status(response, method, path, task_id)
                retry_after = _retry_after(response.headers)
                delay = (
                    min(retry_after, self.retry.max_retry_after)
                    if retry_after is not None
                    else self.retry.backoff(attempt, self._random.random())
                )
                self.stats.retries += 1
                self._note_failure(
                    f"{method} {path}: rate limited (HTTP 429"
                    + (f", Retry-After {retry_after:g} s)" if retry_after is not None else ")"),
                    delay,
                    attempt,
                )
                await self._sleep(delay)
                continue
            if status >= 500:
                self.stats.server_errors += 1
                if not retry_all:
                    self.stats.ambiguous_writes += 1
                    raise exc.AmbiguousWriteError(
                        f"{method} {path}: service answered HTTP {status}; the write may or may "
                        "not have been applied",
                        method=method,
                        path=path,
                        status=status,
                    )
                if last_attempt:
                    self._note_failure(f"{method} {path}: HTTP {status}", None, attempt)
                    self._raise_for_status(response, method, path, task_id)
                self.stats.retries += 1
                delay = self.retry.backoff(attempt, self._random.random())
                self._note_failure(f"{method} {path}: HTTP {status}", delay, attempt)
                await self._sleep(delay)
                continue
            if self._failing:
                self._failing = False
                logger.info("the service at %s answers again", self.base_url)
            return response

    def _note_failure(self, what: str, delay: float | None, attempt: int) -> None:
        """Log a failed attempt: the first of a streak as a warning, the rest at info (-v)."""
        if delay is None:
            plan = f"giving up on this request after {attempt} attempt(s)"
        else:
            plan = f"retry {attempt} of {self.retry.max_attempts - 1} in {delay:.1f} s"
        if self.base_url not in what:
            what = f"{self.base_url} {what}"
        now = time.monotonic()
        if not self._failing and now - self._warned_at >= WARN_EVERY:
            # The first failure after a success is a warning (at most one per WARN_EVERY s, so
            # a flaky service does not flood a log; -v shows every one). Marked so that a
            # caller (the run command) can add how long it will keep trying.
            self._warned_at = now
            logger.warning("%s; %s", what, plan, extra={FIRST_FAILURE: True})
        else:
            logger.info("%s; %s", what, plan)
        self._failing = True

    async def _send(
        self,
        method: str,
        path: str,
        key: Secret | None,
        body: bytes | None,
        query: str,
        language: str | None,
        is_read: bool,
    ) -> _Response:
        """One HTTP exchange. The only place aiohttp errors are seen and converted.

        ``path`` is already percent-encoded (:meth:`_task_path`) and ``query`` is ``""`` or
        an encoded ``?k=v&...``: the URL goes to aiohttp as encoded text."""
        session = self._ensure_session()
        headers = {"accept-language": language or self.language}
        if key is not None:
            headers["x-api-key"] = key.reveal()
        if body is not None:
            headers["Content-Type"] = "application/json"
        self.stats.requests += 1
        started = time.perf_counter()
        sent_at = time.time()
        sent = False
        try:
            url = URL(self._base_encoded + path + query, encoded=True)
            async with session.request(method, url, data=body, headers=headers) as resp:
                sent = True
                payload = await resp.read()
                result = _Response(resp.status, payload, resp.headers)
                self.server_clock.observe(resp.headers.get("Date"), sent_at, time.time())
        except aiohttp.ClientConnectorError as err:
            self.stats.transport_errors += 1
            reason = err.os_error.strerror or str(err)
            raise exc.ConnectError(
                f"{method} {path}: cannot connect to {self.base_url}: {reason}",
                method=method,
                path=path,
            ) from err
        except (TimeoutError, aiohttp.ClientError) as err:
            self.stats.transport_errors += 1
            what = "timed out" if isinstance(err, TimeoutError) else f"failed: {type(err).__name__}"
            if not is_read:
                self.stats.ambiguous_writes += 1
                raise exc.AmbiguousWriteError(
                    f"{method} {path} {what}; the write may or may not have been applied",
                    method=method,
                    path=path,
                ) from err
            cls = exc.TimeoutError_ if isinstance(err, TimeoutError) else exc.TransportError
            raise cls(f"{method} {path} {what}", method=method, path=path) from err
        finally:
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "%s %s%s -> %s in %.1f ms",
                    method,
                    path,
                    query,
                    "sent" if sent else "no response",
                    (time.perf_counter() - started) * 1000,
                )
        return result

    def _decode(
        self, decoder: msgspec.json.Decoder[T], response: _Response, method: str, path: str
    ) -> T:
        if response.status >= 300:
            # Error statuses are mapped before their body is taken as a success shape.
            self._raise_for_status(response, method, path, None)
        try:
            return decoder.decode(response.body)
        except msgspec.DecodeError as err:
            raise exc.DecodeError(
                f"{method} {path}: HTTP {response.status} body is not the expected JSON: {err}",
                method=method,
                path=path,
            ) from err

    def _check_bulk_status(
        self,
        status: str,
        error: str | None,
        response: _Response,
        method: str,
        path: str,
        task_id: str | None,
    ) -> None:
        if status != STATUS_SUCCESS:
            raise exc.RequestError(
                f"{method} {path}: service said status={status!r}: {error or 'no reason given'}",
                status=response.status,
                service_message=error or "",
                method=method,
                path=path,
                task_id=task_id,
            )

    def _raise_for_status(
        self, response: _Response, method: str, path: str, task_id: str | None
    ) -> None:
        """Map an error response to the exception tree. Never returns."""
        status = response.status
        code, message, failures = _parse_error_body(response.body)
        where = f"{method} {path}"
        text = f"{where}: HTTP {status}" + (f" (code {code})" if code is not None else "")
        if message:
            text += f": {message}"
        common: dict[str, Any] = {
            "status": status,
            "code": code,
            "service_message": message,
            "method": method,
            "path": path,
            "task_id": task_id,
        }
        if code == CODE_UNSUPPORTED_LANGUAGE:
            raise exc.UnsupportedLanguageError(text, **common)
        if status == 429:
            raise exc.RateLimitedError(text, retry_after=_retry_after(response.headers), **common)
        if status >= 500:
            raise exc.ServerError(text, **common)
        if status in (401, 403):
            bulk = path != SINGLE_PATH
            text += f" ({key_hint(self._bulk_api_key if bulk else self._api_key, bulk=bulk)})"
            if status == 401:
                raise exc.AuthenticationError(text, **common)
            raise exc.PermissionDeniedError(text, **common)
        if status == 404:
            raise exc.TaskNotFoundError(text, **common)
        if status == 409:
            raise exc.ResultsNotReadyError(text, **common)
        if status == 410:
            if method == "PUT":
                raise exc.TaskExpiredError(text, **common)
            raise exc.ResultsExpiredError(text, **common)
        if status == 413:
            raise exc.PayloadTooLargeError(text, **common)
        if status == 400 or status == 422:
            raise exc.ValidationError(text, failure_list=failures, **common)
        raise exc.RequestError(text, **common)


def _deadline(timeout: Timeout) -> float | None:
    """The one deadline of a request: ``total``, else ``connect + read`` (None: no limit)."""
    if timeout.total is not None:
        return timeout.total
    if timeout.read is None:
        return None
    return timeout.read + (timeout.connect or 0.0)


def _as_secret(value: str | Secret) -> Secret:
    return value if isinstance(value, Secret) else Secret(value, source="the caller")


def _retry_after(headers: Any, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date (RFC 9110).

    A date is turned into seconds against the response's own ``Date`` header when it has one
    (so a client whose clock differs from the server's still waits the intended time), else
    against the local clock; a date in the past means no wait."""
    value = headers.get("Retry-After") if headers is not None else None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    reference = now if now is not None else time.time()
    server_date = headers.get("Date")
    if server_date:
        with contextlib.suppress(TypeError, ValueError, IndexError, OverflowError):
            reference = email.utils.parsedate_to_datetime(server_date).timestamp()
    return max(0.0, when - reference)


def _parse_error_body(body: bytes) -> tuple[int | None, str, list[FailureItem]]:
    """(code, message, failureList) from either error body shape of DESIGN section 3."""
    try:
        data = _error_body_decoder.decode(body)
    except msgspec.DecodeError:
        snippet = body[:200].decode("utf-8", "replace").strip()
        return None, snippet, []
    code: int | None = None
    message = ""
    error = data.get("error")
    if isinstance(error, dict):
        raw_code = error.get("code")
        if isinstance(raw_code, int):
            code = raw_code
        elif isinstance(raw_code, str) and raw_code.isdigit():
            code = int(raw_code)
        message = str(error.get("message", ""))
    elif isinstance(error, str):
        message = error
    failures: list[FailureItem] = []
    raw_failures = data.get("failureList")
    if isinstance(raw_failures, list):
        try:
            failures = msgspec.convert(raw_failures, list[FailureItem])
        except msgspec.ValidationError:
            failures = []
    return code, message, failures
