"""TaggerClient: the async client of the tagging service's six operations.

The operations live here; the HTTP exchange under them (one aiohttp session, the retry rules,
and the one place where answers and aiohttp errors become the exception tree) is
:class:`~fashiontag_pipeline._http.HttpExchange`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import quote

import msgspec

from . import _exceptions as exc
from ._bodies import Refusal, bulk_body, tagging_result
from ._clock import ServerClock
from ._config import (
    ClientConfig,
    Limits,
    RetryPolicy,
    Secret,
    Timeout,
    base_url_problem,
    clean_base_url,
    key_hint,
    key_mac,
    shown_url,
    with_default_keys,
)
from ._http import BULK_PATH, SINGLE_PATH, ClientStats, HttpExchange, Response
from ._models import (
    LANGUAGES,
    MAX_PAGE_SIZE,
    BulkTaskResponse,
    Context,
    Detection,
    EncodedRequests,
    Image,
    SingleTagRequest,
    TaggingRequest,
    TaggingResponse,
    Task,
    TaskListData,
    TaskListResponse,
    TaskResultsData,
    TaskResultsResponse,
    TaskStatus,
    TaskStatusResponse,
)
from ._responses import front_end_answer, no_tagging_result
from ._times import answer_age
from ._write_answer import read_write_answer

__all__ = ["LIST_PAGE_SIZE", "ClientStats", "TaggerClient"]

logger = logging.getLogger("fashiontag_pipeline.client")

T = TypeVar("T")

_encoder = msgspec.json.Encoder()
#: Tasks asked for per list page (the reference service's maximum).
LIST_PAGE_SIZE = 1000

# Counts are read as integers whether written ``1000``, ``"1000"`` or ``1000.0``: see
# ``_write_answer``.
_list_decoder = msgspec.json.Decoder(TaskListResponse, strict=False)
_status_decoder = msgspec.json.Decoder(TaskStatusResponse, strict=False)

# Built on first use: a run reads no single answer, and its results pages raw (the decoders of
# these answers' nested types cost ~1 ms of every start-up).
_tagging_decoder = functools.cache(lambda: msgspec.json.Decoder(TaggingResponse))
_results_decoder = functools.cache(lambda: msgspec.json.Decoder(TaskResultsResponse, strict=False))


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
        url = clean_base_url(base_url or cfg.base_url)
        problem = base_url_problem(url)
        if problem is not None:
            raise exc.ConfigError(f"base_url {problem}")
        self.base_url = url.rstrip("/")
        self._api_key = _as_secret(api_key) if api_key is not None else cfg.api_key
        bulk = _as_secret(bulk_api_key) if bulk_api_key is not None else cfg.bulk_api_key
        self._bulk_api_key = bulk if bulk is not None else self._api_key
        self.language = language or cfg.language
        if self.language not in LANGUAGES:
            raise exc.ConfigError(f"language must be one of {', '.join(LANGUAGES)}")
        self.timeout = timeout or cfg.timeout
        self.retry = retry or cfg.retry
        self.limits = limits or cfg.limits
        self._http = HttpExchange(
            self.base_url,
            language=self.language,
            timeout=self.timeout,
            retry=self.retry,
            limits=self.limits,
            key_hint=self._key_hint,
            sleep=sleep,
            secrets=[k.reveal() for k in (self._api_key, self._bulk_api_key) if k is not None],
        )

    #: Set once the service refuses the list's paging parameters (see :meth:`_task_page`).
    _list_unpaged = False
    #: How old the oldest page of the last task list was (``Age``: a cache's copy), seconds.
    list_age = 0.0

    def set_observer(self, observer: Callable[[str, str, int, float], None] | None) -> None:
        """Call ``observer(method, path, HTTP status or 0 when no answer came, seconds)`` after
        every exchange (the daemon's request metrics and readiness)."""
        self._http.observer = observer

    @property
    def stats(self) -> ClientStats:
        """Counters of what the client did (requests, retries, ...)."""
        return self._http.stats

    @property
    def server_clock(self) -> ServerClock:
        """The service's clock offset, from responses' ``Date`` (write deadlines use it)."""
        return self._http.server_clock

    def masked(self, text: str) -> str:
        """``text`` (an answer's words, for a message) with the keys this client sends masked."""
        return self._http.masked(text)

    def bulk_key_mac(self, salt: bytes) -> str:
        """16 hex digits of HMAC-SHA256 under ``salt`` of the key sent on bulk paths: tells one
        key from another (a resume under another account's) without keeping it."""
        return key_mac(self._bulk_api_key, salt)

    def at(self, base_url: str, *, retry: RetryPolicy | None = None) -> TaggerClient:
        """A client of the same keys and settings for the service at ``base_url``."""
        return TaggerClient(
            base_url,
            api_key=self._api_key,
            bulk_api_key=self._bulk_api_key,
            language=self.language,
            timeout=self.timeout,
            retry=retry or self.retry,
            limits=self.limits,
        )

    def _key_hint(self, path: str) -> str:
        bulk = path != SINGLE_PATH
        return key_hint(self._bulk_api_key if bulk else self._api_key, bulk=bulk)

    @classmethod
    def from_config(cls, config: ClientConfig, **overrides: Any) -> TaggerClient:
        """A client built from a :class:`ClientConfig` (keyword overrides win)."""
        return cls(config=config, **overrides)

    def __repr__(self) -> str:
        return f"<TaggerClient base_url={shown_url(self.base_url)!r} language={self.language!r}>"

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Self:
        self._http.ensure_session()
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
        await self._http.aclose()

    async def probe(self) -> int:
        """One ``GET`` of the base URL itself, without a key and without retries: the HTTP
        status of whatever answers (any status: the service is reachable), 0 when nothing
        did. The observer sees it like any exchange (the daemon's readiness while it has
        nothing to send); no operation's path, so no request metric counts it."""
        try:
            response = await self._http.send("GET", "", None, None, "", None, True)
        except exc.TransportError:
            return 0
        return response.status

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
        # Error statuses are mapped to the exception tree inside decode.
        response = await self._tag(image, context, language)
        return self._http.decode(_tagging_decoder(), response, "POST", SINGLE_PATH)

    async def tag_raw(
        self, image: Image, context: Context | None = None, *, language: str | None = None
    ) -> bytes:
        """:meth:`tag`'s answer as the service sent it, on one line, for callers that write it
        on unchanged (the engine's single route, as bulk results are): any tagging result of
        the shape bulk results are taken in (see :func:`~._bodies.tagging_result`)."""
        response = await self._tag(image, context, language)
        if response.status >= 300:
            self._http.raise_for_status(response, "POST", SINGLE_PATH, None)
        try:
            return tagging_result(response.body)
        except Refusal as refusal:  # (the bulk paths' error body: its words, unmasked, unchained)
            refused = refusal
        except ValueError as err:
            raise no_tagging_result(response, SINGLE_PATH, err) from None
        self._http.check_bulk_status(  # (a service fault: ServerError; a refusing code: its error)
            refused.status, refused.error, response, "POST", SINGLE_PATH, None, refused.code
        )
        raise refused  # (not reached: the status is no success)

    async def _tag(self, image: Image, context: Context | None, language: str | None) -> Response:
        body = _encoder.encode(SingleTagRequest(image=image, context=context))
        return await self._http.call(
            "POST", SINGLE_PATH, body=body, key=self._api_key, language=language, retry_all=True
        )

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
        body = bulk_body(requests, description, album_name, default_detection, strict)
        return await self._write("POST", BULK_PATH, body, task_id=None)

    async def append_to_task(
        self,
        task_id: str,
        requests: Sequence[TaggingRequest] | EncodedRequests,
        *,
        default_detection: Sequence[Detection] | None = None,
        strict: bool = False,
    ) -> BulkTaskResponse:
        """Append up to 1,000 requests to a task (``PUT /tagger/v2.12/bulk/{task}``); raises
        :class:`TaskExpiredError` when the task is past its expiry."""
        body = bulk_body(requests, None, None, default_detection, strict)
        return await self._write("PUT", self._task_path(task_id), body, task_id=task_id)

    async def list_tasks(self, *, offset: int | None = None, size: int | None = None) -> list[Task]:
        """One page of the bulk key's tasks (``GET /tagger/v2.12/bulk``); without ``offset``
        and ``size``, the service's default answer (the spec's: every task, as the reference
        service gives it). See :meth:`all_tasks`."""
        return (await self._task_page(offset, size)).tasks

    async def all_tasks(
        self, *, page_size: int = LIST_PAGE_SIZE, looked_for: Collection[str] = ()
    ) -> list[Task]:
        """Every task of the bulk key, newest first where the service pages its list: pages
        until its ``totalCount`` is reached (no count: every task was in the first answer),
        or every id ``looked_for`` was seen (100,000 tasks: 1,000 pages). A page shorter than
        asked is no end (a service may cap its pages below ``page_size``: a lost create's task
        past the first was missed, its rows billed again); an empty page, or one with no task
        not seen before, is."""
        seen: dict[str, Task] = {}
        offset = 0
        while True:
            page = await self._task_page(offset, page_size)
            fresh = [t for t in page.tasks if t.task_id not in seen]
            for task in fresh:
                seen[task.task_id] = task
            info = page.task_info
            offset += len(page.tasks)
            ended = info is None or info.total_count is None or offset >= info.total_count
            if ended or not fresh or (looked_for and all(t in seen for t in looked_for)):
                break
        return list(seen.values())

    async def _task_page(self, offset: int | None, size: int | None) -> TaskListData:
        """One list answer. A service that refuses the paging parameters (400) is asked
        without them from then on: its default answer is taken as the whole list."""
        query = ""
        if (offset is not None or size is not None) and not self._list_unpaged:
            query = f"?offset={int(offset or 0)}&size={int(size or LIST_PAGE_SIZE)}"
        try:
            response = await self._http.call(
                "GET", BULK_PATH, key=self._bulk_api_key, query=query, retry_all=True
            )
            if query and response.status == 400:
                self._http.raise_for_status(response, "GET", BULK_PATH, None)
        except exc.ValidationError:
            if not query:
                raise
            self._list_unpaged = True
            return await self._task_page(None, None)
        decoded = self._http.decode(_list_decoder, response, "GET", BULK_PATH)
        self._http.check_bulk_status(
            decoded.status, decoded.error, response, "GET", BULK_PATH, None
        )
        data = decoded.data if decoded.data is not None else TaskListData()
        self.list_age = max(self.list_age if offset else 0.0, answer_age(response.headers))
        self._mask_statuses(data.tasks)
        return data

    def _mask_statuses(self, tasks: list[Task]) -> None:
        """A status the spec does not name is the service's words: the keys sent masked."""
        for task in tasks:
            if not isinstance(task.task_status, TaskStatus):
                task.task_status = self._http.masked(task.task_status)

    async def task_status(self, task_id: str) -> Task:
        """One task's status and counts (``GET /tagger/v2.12/bulk/{task}/status``)."""
        path = self._task_path(task_id) + "/status"
        response = await self._http.call(
            "GET", path, key=self._bulk_api_key, retry_all=True, task_id=task_id
        )
        decoded = self._http.decode(_status_decoder, response, "GET", path)
        self._http.check_bulk_status(decoded.status, decoded.error, response, "GET", path, task_id)
        if decoded.data is None:
            raise exc.DecodeError(f"status of task {task_id} has no data", method="GET", path=path)
        self._mask_statuses([decoded.data])
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
            decoded = _results_decoder().decode(body)
        except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as err:
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
        """The raw JSON body of a results page answered HTTP 2xx, for callers that decode it
        straight into their own shape (the engine's pagers, whose decode also checks the
        body's ``status``: a 200 with ``"status":"failure"`` is no page). Any success status
        is a page's, as for every other read (a 203 of a transforming proxy, a 202 of a
        service that answers its bulk family so: refused, every row was billed and none read)."""
        if offset < 0:
            raise ValueError("offset must be >= 0")
        if not 1 <= size <= MAX_PAGE_SIZE:
            raise ValueError(f"size must be between 1 and {MAX_PAGE_SIZE}")
        path = self._task_path(task_id)
        response = await self._http.call(
            "GET",
            path,
            key=self._bulk_api_key,
            query=f"?offset={int(offset)}&size={int(size)}",
            language=language,
            retry_all=True,
            task_id=task_id,
        )
        if not 200 <= response.status < 300:
            self._http.raise_for_status(response, "GET", path, task_id)
        if (front_end := front_end_answer(response, "GET", path, task_id)) is not None:
            raise front_end
        return response.body

    # ------------------------------------------------------------------ internals

    @staticmethod
    @functools.lru_cache(maxsize=1024)  # (a task's pages and polls: quote() is ~1.5 us each)
    def _task_path(task_id: str) -> str:
        if not task_id:
            raise ValueError("task_id must not be empty")
        return f"{BULK_PATH}/{quote(task_id, safe='')}"

    async def _write(
        self, method: str, path: str, body: bytes, *, task_id: str | None
    ) -> BulkTaskResponse:
        response = await self._http.call(
            method, path, body=body, key=self._bulk_api_key, retry_all=False, task_id=task_id
        )
        if not 200 <= response.status < 300:
            self._http.raise_for_status(response, method, path, task_id)
        return read_write_answer(self._http, response, method, path, task_id)


def _as_secret(value: str | Secret) -> Secret:
    return value if isinstance(value, Secret) else Secret(value, source="the caller")
