"""A misbehaving server for the engine tests: a loopback proxy in front of the reference service.

It forwards every request unchanged and then, on cue, behaves as real services have been seen
to: it forgets a task (drops it from the list, answers 404 for its status, results and PUTs)
once the service says the task is done or after some of its result pages; it answers a page
with one row replaced by a copy of another (a duplicate id in place of a row), or under an id
it was never given, or without a row it never returns, or with rows whose tagging result is
``null`` or missing, or with its results in an object instead of a list, or from offset 0
whatever was asked; it holds a task processing for ever, claims more results for a task than
it holds, and refuses a page (or those past a task's real end) with 400; and it reports its
clock some seconds ahead of the engine's in the ``Date`` header; it rate limits (429) or sheds
load (503) with a Retry-After of its choosing. Bodies it rewrites are re-encoded with other
spacing, as a server that is not ours would write them.
clock some seconds ahead of the engine's in the ``Date`` header; it answers with a body of
hundreds of MiB, one that never ends, or a gzip bomb. Bodies it rewrites are
re-encoded with other spacing, as a server that is not ours would write them.

Tasks are named by their creation order (1 = the first task created through the proxy).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import formatdate
from typing import Any

import aiohttp
import anyio
from aiohttp import web

BULK = "/tagger/v2.12/bulk"
SINGLE = "/tagger/v2/tags"
#: Results per page the engine asks for.
MAX_PAGE = 100


@dataclass
class Misbehaviour:
    #: Task ordinals forgotten as soon as the service reports them done (before the engine
    #: has seen them done).
    forget_when_done: set[int] = field(default_factory=set)
    #: Task ordinal -> result pages served before the task is forgotten.
    forget_after_pages: dict[int, int] = field(default_factory=dict)
    #: Task ordinals whose first result page carries its first row twice (in place of its
    #: last row).
    duplicate_in_first_page: set[int] = field(default_factory=set)
    #: Task ordinals whose second result page carries the first page's first row in place of
    #: its own last row (an id repeated across pages).
    duplicate_across_pages: set[int] = field(default_factory=set)
    #: Task ordinals shown (list and status) with another description, as if the service had
    #: forgotten ours and given its id to someone else's task.
    foreign_description: set[int] = field(default_factory=set)
    #: Task ordinals whose first result page gives its last row under an id the engine never
    #: sent (``ID~elsewhere``: no change a service makes to an id it echoes; those are
    #: undone, see ``test_foreign_ids``).
    foreign_id_in_first_page: set[int] = field(default_factory=set)
    #: Ids whose result every page leaves out (the page comes short), in every task: rows the
    #: service takes and never returns.
    never_returned: set[str] = field(default_factory=set)
    #: Task ordinals whose result pages all come from offset 0, whatever the offset asked (a
    #: service whose paging is broken).
    ignore_offset: set[int] = field(default_factory=set)
    #: Task ordinals whose first result page gives its last row with ``null`` for a tagging
    #: result and its last but one with none at all (a server that answers a row it could
    #: not tag with no result object).
    malformed_in_first_page: set[int] = field(default_factory=set)
    #: Task ordinals whose first result page gives its results as a JSON object (position ->
    #: result), not a list, every time it is asked for (a page no client can take as the
    #: spec's shape; an id that is no text is taken, see ``test_foreign_answers``).
    results_object_in_first_page: set[int] = field(default_factory=set)
    #: Task ordinal -> results its ``count.total`` claims beyond those it holds (list and status).
    inflate_total: dict[int, int] = field(default_factory=dict)
    #: Answer a results page past a task's real end with 400 (as a service that checks the
    #: offset would), instead of the reference service's empty page.
    refuse_past_end: bool = False
    #: Task ordinals shown (list and status) as processing with nothing processed, for ever
    #: (a service that holds a task and never tags it).
    hold_processing: set[int] = field(default_factory=set)
    #: Task ordinal -> the offset of a results page always refused with 400.
    refuse_page: dict[int, int] = field(default_factory=dict)
    #: Every results page of every task refused with 400 (a service whose paging API changed).
    refuse_all_pages: bool = False
    #: For this many seconds after a task's first results page is served, every other page of
    #: it is refused with 400 and the spec's failure body (a store readable part by part, a
    #: task back to processing for a moment: the spec shows no status code for "not ready").
    refuse_after_first_page: float = 0.0
    #: Task ordinals forgotten at their first PUT (answered 404, like every later request).
    forget_at_first_put: set[int] = field(default_factory=set)
    #: Seconds the proxy's ``Date`` header runs ahead of real time.
    clock_ahead: float = 0.0
    #: The first create (POST) and/or append (PUT) through the proxy is applied by the service,
    #: then its connection is closed with no answer: the client cannot know it was applied.
    lose_first_create_answer: bool = False
    lose_first_put_answer: bool = False
    #: Write failures the service words ``duplicate context.id ...`` are worded this way
    #: instead (the spec leaves message texts open), followed by the id.
    duplicate_wording: str | None = None
    #: A create or append whose every element failed is refused whole with 400 (its
    #: ``failureList`` kept), as a service that fails a request with nothing to accept would.
    refuse_all_failed_with_400: bool = False
    #: Ids (as in the manifest) the create or append answer lists in its ``failureList`` with a
    #: reason of its own although the service took them: they come back in the results.
    refused_but_taken: set[str] = field(default_factory=set)
    #: Ids (as in the manifest) every create or append refuses (``failureList``, not taken):
    #: rows the service finds invalid although the client does not.
    always_refused: set[str] = field(default_factory=set)
    #: Ids (as in the manifest) left out of the first results page that carries them, once.
    left_out_once: set[str] = field(default_factory=set)
    #: The first read of each results page is answered 200 with a failure body
    #: (``{"status":"failure","error":...}``): the spec's shape, not a page.
    failure_status_first_read: bool = False
    #: The first N polls (list or status) are answered 200 with a failure body.
    failure_status_polls: int = 0
    #: Results pages hold at most this many rows whatever the size asked (a server whose
    #: pages are smaller than the spec's 100).
    page_cap: int | None = None
    #: The first N polls (list or status) are answered 408 with an HTML page (a front end
    #: that gave up waiting).
    polls_timed_out: int = 0
    #: Every status poll of these task ordinals (``GET .../status``) is answered with
    #: ``poll_answer`` and the spec's failure body, not forwarded; the task list leaves them
    #: out (a task whose status the service can no longer read).
    unreadable_status: set[int] = field(default_factory=set)
    #: The HTTP status of those answers: 200 (a failure body under a success status), 409,
    #: 500 ...
    poll_answer: int = 200
    #: Every task list (``GET`` of the bulk path) answered with ``poll_answer`` and the spec's
    #: failure body, not forwarded (a service whose list endpoint broke; status still works).
    unreadable_list: bool = False
    #: Method -> status: the first write of that method is answered with that status and an
    #: HTML page (a front proxy's 408, a 400 or 409 on a PUT), not forwarded: nothing applied.
    refuse_first_write: dict[str, int] = field(default_factory=dict)
    #: Writes whose body is longer than this are answered 413 with an HTML page, not forwarded
    #: (a front proxy's body limit).
    max_body_bytes: int | None = None
    #: A write whose body carries one of these ids (as in the manifest) is refused whole with
    #: 400 and no ``failureList``, not forwarded (a service that fails a request for one bad
    #: element without naming it).
    refuse_whole_with: set[str] = field(default_factory=set)
    #: Seconds a created task stays out of the task list (an eventually consistent index):
    #: status and results know it at once.
    list_lag: float = 0.0
    #: Seconds a created task's status is answered 404 (an eventually consistent store that
    #: does not know a task for a moment after its create was answered, then knows it).
    status_lag: float = 0.0
    #: Creates (in arrival order, 1 = the first POST) the service applies as an append to the
    #: first task created and answers with that task's id: a create answered with the id of a
    #: task the client already holds (a server that hands out an id twice, or merges creates).
    merge_creates: set[int] = field(default_factory=set)
    #: Tasks are shown (list and status) with no ``total`` in their ``count`` (a service that
    #: leaves the field out).
    drop_count_total: bool = False
    #: A done task's ``count.total`` shown this much short of the rows it holds (a service
    #: that counts only some of its results there).
    short_total: int = 0
    #: Every create (POST) answered with this status and an HTML page, not forwarded: nothing
    #: applied (a front end in front of a create endpoint that is down).
    refuse_every_create: int | None = None
    #: Every JSON answer starts with a UTF-8 byte order mark (which JSON parsers may ignore).
    bom: bool = False
    #: Every JSON answer starts with a newline and spaces (a pretty-printer's; JSON allows it).
    leading_space: bool = False
    #: The first create is applied by the service and its answer held back for ever (the
    #: client is killed while it waits: the task exists, the client never learnt its id).
    hold_first_create: bool = False
    #: Called with (method, path) of every request as it arrives, before anything else (a
    #: test that acts at a given moment of the run: freezes the client, say).
    on_request: Callable[[str, str], None] | None = None
    #: Times (``taskExpireAt``, ``taskExpiredAt``, ``resultExpiredAt``) written as HTTP dates
    #: (``Thu, 26 Nov 2026 05:00:00 GMT``), not RFC 3339.
    http_date_times: bool = False
    #: Id (as in the manifest) -> the tagging result a results page gives for it in place of
    #: the service's (a shape the spec leaves open, e.g. a failure whose code is a word).
    results_given: dict[str, Any] = field(default_factory=dict)
    #: Every request to the single endpoint answered with this status and an HTML page, not
    #: forwarded (a gateway that does not route ``/tagger/v2/tags``).
    refuse_single: int | None = None
    #: Requests to the single endpoint whose body holds this text answered HTTP 500 (a JSON
    #: failure), not forwarded: an image the service fails on every time (a poison image).
    fail_single_holding: bytes | None = None
    #: Those requests have their connection closed with no answer instead (a worker that
    #: crashes on the image).
    drop_single: bool = False
    #: Every request to the single endpoint answered HTTP 200 with this JSON, not forwarded (a
    #: shape the spec leaves open: a failure whose code is a word, a field the model lacks).
    single_given: Any = None
    #: Methods (``POST``, ``PUT``) whose writes are applied by the service and answered
    #: ``204 No Content`` with no body (a server that says "done" with no content).
    no_content_writes: set[str] = field(default_factory=set)
    #: Every request is answered ``307 Temporary Redirect`` to this origin (same path and
    #: query), not forwarded: a front end that moved the service to another host.
    redirect_to: str | None = None
    #: Results offsets counted from 1: the page at ``offset`` starts with the service's row
    #: ``offset - 1`` (offset 0 is taken as 1).
    one_based_offsets: bool = False
    #: Every result id of every page passed through this (a service that normalises the ids
    #: it echoes: ``str.upper``, ``str.strip``, a number for a numeric-looking id, ...).
    echo_id: Callable[[str], Any] | None = None
    #: Task ordinal -> the ``taskStatus`` shown (list and status) in place of ``TASK_DONE``
    #: (``task_done``, ``TASK_FAILED``, ``CANCELLED``: states the spec does not name).
    status_when_done: dict[int, str] = field(default_factory=dict)
    #: The task list shows one more task, someone else's, in this state.
    stranger_status: str | None = None
    #: Task ordinal -> rows the service lost at the task's end: its ``count.total`` short by
    #: that many, its pages without them, and pages from its count on refused with 400.
    lose_rows: dict[int, int] = field(default_factory=dict)
    #: For this many seconds after a task is first shown done, its pages hold only its first
    #: half's rows (a results store that lags the status).
    lagging_results: float = 0.0
    #: With ``lagging_results``: the store catches up row by row over that time, its pages
    #: holding a share of the task's second half that grows with the time since "done".
    catching_up: bool = False
    #: Each results page past the first is answered, the first time it is asked for, with the
    #: page before it (a cache that serves a stale page).
    repeat_previous_page_once: bool = False
    #: Each results page is answered, the first time it is asked for, with the page after it
    #: (a stale cache keyed one page off): the first page's rows come on no first read, and
    #: the page that comes short is the last one.
    next_page_once: bool = False
    #: Id (as in the manifest) -> (an id, a tagging result) given in place of its row, on the
    #: first page that carries it (once): another row's result, under that row's id (or what
    #: the service made of it), in the wrong task.
    stray_in_place_of: dict[str, tuple[str, Any]] = field(default_factory=dict)
    #: While set, every request of the API (``/tagger/...``) of the ``storm_ops`` kinds is
    #: answered with this status (429: a rate limit; 503: load shedding) and the spec's failure
    #: body, not forwarded; a test sets and clears it (``proxy.rules.storm = 429``) mid-run.
    storm: int | None = None
    #: The ``Retry-After`` of those answers (None: no header).
    storm_retry_after: str | None = "0"
    #: The kinds of request a storm answers (``create``, ``append``, ``list``, ``status``,
    #: ``results``, ``single``); None: every one.
    storm_ops: set[str] | None = None
    #: Seconds since the proxy started during which a storm set holds (None: while set).
    storm_window: tuple[float, float] | None = None
    #: The kinds of request (as ``storm_ops``) whose answers are huge: their JSON followed by
    #: whitespace (JSON still), streamed in 1 MiB writes (a service or gateway whose answer is
    #: far bigger than any page).
    huge_ops: set[str] = field(default_factory=set)
    #: How many answers are made huge (None: every one).
    huge_count: int | None = 1
    #: Bytes of whitespace after the JSON; None: the body never ends.
    huge_bytes: int | None = 256 << 20
    #: Characters of tags added to every result's ``taggingResult`` (a ``"pad"`` field): a
    #: service that answers many tags an image, whose pages of 100 grow past max_answer_bytes.
    fat_results: int = 0
    #: The huge answers gzip-compressed (``Content-Encoding: gzip``): a few hundred KiB on the
    #: wire, inflated by the client (a decompression bomb).
    huge_gzip: bool = False
    #: The kinds of request (as ``storm_ops``) whose first 2xx answer is cut: its head and half
    #: its body sent, then the connection dropped (a gateway restarting mid-answer).
    cut_ops: set[str] = field(default_factory=set)
    #: The kinds of request (as ``storm_ops``) whose answers carry one more field, of arrays
    #: nested 100,000 deep (a 200 KB document deeper than a JSON reader's recursion limit).
    deep_ops: set[str] = field(default_factory=set)
    #: How many answers are made deep (None: every one).
    deep_count: int | None = 1
    #: Answers carry a ``Content-Security-Policy`` header this many bytes long (a gateway's or
    #: a CDN's; browsers take such headers up to hundreds of KiB).
    header_bytes: int = 0
    #: How many answers carry it (None: every one).
    header_count: int | None = None
    #: The kinds of request (as ``storm_ops``) whose JSON answers are written in ISO-8859-1,
    #: not UTF-8 (``é`` as the byte E9: a Java servlet that never set its answer's charset).
    latin1_ops: set[str] = field(default_factory=set)


def request_kind(method: str, path: str) -> str:
    """What a request of the API is: ``create``, ``append``, ``list``, ``status``,
    ``results`` or ``single``."""
    if path == SINGLE:
        return "single"
    if method == "POST":
        return "create"
    if method == "PUT":
        return "append"
    if path.endswith("/status"):
        return "status"
    return "list" if path.rstrip("/") == BULK else "results"


class MisbehavingProxy:
    def __init__(self, upstream: str, rules: Misbehaviour) -> None:
        self.upstream = upstream
        self.rules = rules
        self.created: list[str] = []
        self.created_at: dict[str, float] = {}
        self.forgotten: set[str] = set()
        #: Status polls answered 404 under ``status_lag``.
        self.status_lagged = 0
        self.pages_served: dict[str, int] = {}
        #: When each task's first results page was served (monotonic seconds).
        self.first_page_at: dict[str, float] = {}
        self.puts_refused = 0
        self.left_out = 0
        self.real_totals: dict[str, int] = {}
        self.refused_pages = 0
        self.first_rows: dict[str, Any] = {}
        self.lost_answers: list[str] = []
        self.refused_with_400 = 0
        self.failure_pages = 0
        self.failure_polls = 0
        self._pages_read: set[tuple[str, str]] = set()
        #: Statuses of the writes refused by refuse_first_write, max_body_bytes and
        #: refuse_whole_with, in order.
        self.writes_refused: list[int] = []
        self._first_refused: set[str] = set()
        self.polls_timed_out = 0
        #: Polls answered for ``unreadable_status`` and ``unreadable_list``.
        self.unreadable_polls = 0
        self.single_failed = 0
        #: Requests answered by ``single_given``.
        self.single_given_sent = 0
        #: Requests answered by ``storm``.
        self.storm_answers = 0
        self._left_out: set[str] = set()
        self.url = ""
        self._session: aiohttp.ClientSession | None = None
        self.creates_seen = 0
        self._released = anyio.Event()
        #: The task ids answered to the creates merged by ``merge_creates``.
        self.merged: list[str] = []
        self._first_created = anyio.Event()
        #: Appends (PUT to a task) received, whatever their answer.
        self.puts = 0
        #: When each task was first shown done (monotonic seconds), and its count then.
        self.done_seen: dict[str, float] = {}
        self.done_totals: dict[str, int] = {}
        #: Results pages answered (task, offset) -> their results, for repeat_previous_page_once.
        self._pages_given: dict[tuple[str, int], Any] = {}
        self.pages_repeated = 0
        #: Results pages answered with the page after them (next_page_once).
        self._shifted: set[tuple[str, str]] = set()
        self.pages_shifted = 0
        #: Ids whose row stray_in_place_of replaced.
        self._strayed: set[str] = set()
        #: Writes (creates and appends) received, whatever their answer.
        self.writes = 0
        self._started = time.monotonic()
        #: Answers cut (cut_ops).
        self.cut_answers = 0
        #: Answers made huge (huge_ops).
        self.huge_answers = 0
        #: Answers made deep (deep_ops).
        self.deep_answers = 0
        #: Answers given the long header (header_bytes).
        self.long_headers = 0

    def ordinal(self, task_id: str) -> int | None:
        try:
            return self.created.index(task_id) + 1
        except ValueError:
            return None

    def _not_found(self) -> web.Response:
        return web.json_response({"status": "failure", "error": "task not found"}, status=404)

    def _headers(self) -> dict[str, str]:
        return {"Date": formatdate(time.time() + self.rules.clock_ahead, usegmt=True)}

    async def _stormed(self, request: web.Request) -> web.Response | None:
        """The answer of :attr:`Misbehaviour.storm` to this request (None: not stormed)."""
        method, path, rules = request.method, request.path, self.rules
        if method in ("POST", "PUT") and path.startswith(BULK):
            self.writes += 1
        storm, window = rules.storm, rules.storm_window
        if storm is None or not path.startswith("/tagger/"):
            return None
        if rules.storm_ops is not None and request_kind(method, path) not in rules.storm_ops:
            return None
        if window is not None and not window[0] <= time.monotonic() - self._started < window[1]:
            return None
        await request.read()
        self.storm_answers += 1
        headers = self._headers()
        if rules.storm_retry_after is not None:
            headers["Retry-After"] = rules.storm_retry_after
        return web.json_response(
            {"status": "failure", "error": "Too many requests" if storm == 429 else "busy"},
            status=storm,
            headers=headers,
        )

    async def upstream_rows(self, task_id: str, key: str) -> list[Any]:
        """Every result of ``task_id`` as the upstream service holds them, read page by page
        with ``key`` (for a subclass that answers a page of its own making)."""
        assert self._session is not None
        rows: list[Any] = []
        while True:
            async with self._session.get(
                f"{self.upstream}{BULK}/{task_id}",
                params={"offset": str(len(rows)), "size": "100"},
                headers={"x-api-key": key},
            ) as up:
                page = json.loads(await up.read())["data"]["results"]
            if not page:
                return rows
            rows += page

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        path = request.path
        if self.rules.on_request is not None:
            self.rules.on_request(request.method, path)
        stormed = await self._stormed(request)
        if stormed is not None:
            return stormed
        if request.method == "POST" and path == BULK and self.rules.merge_creates:
            self.creates_seen += 1
            if self.creates_seen in self.rules.merge_creates:
                # Creates run concurrently: one to merge may come before the first create's
                # answer has given a task to merge it into.
                await self._first_created.wait()
                return await self._merged_create(request, self.created[0])
        task_id = None
        if path.startswith(BULK + "/"):
            task_id = path[len(BULK) + 1 :].split("/")[0]
            if request.method == "PUT":
                self.puts += 1
            if request.method == "PUT" and self.ordinal(task_id) in self.rules.forget_at_first_put:
                self.forgotten.add(task_id)
            if (
                request.method == "GET"
                and path.endswith("/status")
                and self.created_at.get(task_id, -math.inf)
                > time.monotonic() - self.rules.status_lag
            ):
                self.status_lagged += 1
                return self._not_found()
            if task_id in self.forgotten:
                if request.method == "PUT":
                    self.puts_refused += 1
                return self._not_found()
        body = await request.read()
        if self.rules.redirect_to is not None:
            return web.Response(
                status=307, headers={"Location": self.rules.redirect_to + request.path_qs}
            )
        if path == SINGLE and self.rules.refuse_single is not None:
            return web.Response(
                status=self.rules.refuse_single,
                body=b"<html><body><h1>Not Found</h1></body></html>",
                headers={"Content-Type": "text/html", **self._headers()},
            )
        if path == SINGLE and self.rules.single_given is not None:
            self.single_given_sent += 1
            return web.json_response(self.rules.single_given, headers=self._headers())
        poison = self.rules.fail_single_holding
        if path == SINGLE and poison is not None and poison in body:
            self.single_failed += 1
            if self.rules.drop_single and request.transport is not None:
                request.transport.abort()
                raise ConnectionResetError("dropped on cue")
            return web.json_response(
                {"status": "failure", "error": "internal error"},
                status=500,
                headers=self._headers(),
            )
        if request.method in ("POST", "PUT"):
            refusal = self._refuse_write(request.method, body)
            if refusal is not None:
                self.writes_refused.append(refusal)
                return web.Response(
                    status=refusal,
                    body=b"<html><body><h1>refused</h1></body></html>",
                    headers={"Content-Type": "text/html", **self._headers()},
                )
        refused_now: list[Any] = []
        if self.rules.always_refused and request.method in ("POST", "PUT") and body:
            body, refused_now = self._strip_refused(body)
        headers = {
            k: v for k, v in request.headers.items() if k.lower() in ("x-api-key", "content-type")
        }
        if "accept-language" in request.headers:
            headers["accept-language"] = request.headers["accept-language"]
        params = dict(request.query)
        real = self.real_totals.get(task_id or "")
        refused = self.rules.refuse_page.get(self.ordinal(task_id or "") or 0)
        offset = int(params.get("offset", -1))
        lost_rows = self.rules.lose_rows.get(self.ordinal(task_id or "") or 0)
        held = self.done_totals.get(task_id or "")
        if request.method == "GET" and (
            (
                lost_rows is not None
                and held is not None
                and offset >= held - lost_rows
                and not path.endswith("/status")
            )
            or (self.rules.refuse_past_end and real is not None and offset >= real)
            or (refused is not None and offset == refused and not path.endswith("/status"))
            or (self.rules.refuse_all_pages and task_id and not path.endswith("/status"))
            or (
                task_id in self.first_page_at
                and not path.endswith("/status")
                and time.monotonic() - self.first_page_at[task_id or ""]
                < self.rules.refuse_after_first_page
            )
        ):
            self.refused_pages += 1
            return web.json_response(
                {"status": "failure", "error": "offset is past the task's results"}, status=400
            )
        if (
            self.rules.failure_status_first_read
            and request.method == "GET"
            and task_id
            and not path.endswith("/status")
            and (task_id, params.get("offset", "0")) not in self._pages_read
        ):
            self._pages_read.add((task_id, params.get("offset", "0")))
            self.failure_pages += 1
            return web.json_response({"status": "failure", "error": "temporarily unavailable"})
        if (
            self.failure_polls < self.rules.failure_status_polls
            and request.method == "GET"
            and (path == BULK or path.endswith("/status"))
        ):
            self.failure_polls += 1
            return web.json_response({"status": "failure", "error": "temporarily unavailable"})
        if (
            request.method == "GET"
            and path.endswith("/status")
            and self.ordinal(task_id or "") in self.rules.unreadable_status
        ) or (request.method == "GET" and path == BULK and self.rules.unreadable_list):
            self.unreadable_polls += 1
            return web.json_response(
                {"status": "failure", "error": "unavailable"},
                status=self.rules.poll_answer,
                headers=self._headers(),
            )
        if (
            self.polls_timed_out < self.rules.polls_timed_out
            and request.method == "GET"
            and (path == BULK or path.endswith("/status"))
        ):
            self.polls_timed_out += 1
            return web.Response(
                status=408, body=b"<html>timeout</html>", headers={"Content-Type": "text/html"}
            )
        if self.rules.page_cap is not None and "size" in params:
            params["size"] = str(min(int(params["size"]), self.rules.page_cap))
        if request.method == "GET" and self.ordinal(task_id or "") in self.rules.ignore_offset:
            params.pop("offset", None)
        if (
            self.rules.next_page_once
            and request.method == "GET"
            and task_id
            and not path.endswith("/status")
            and (task_id, params.get("offset", "0")) not in self._shifted
        ):
            self._shifted.add((task_id, params.get("offset", "0")))
            params["offset"] = str(int(params.get("offset", "0")) + MAX_PAGE)
            self.pages_shifted += 1
        if self.rules.one_based_offsets and request.method == "GET" and "offset" in params:
            params["offset"] = str(max(0, int(params["offset"]) - 1))
        async with self._session.request(
            request.method,
            self.upstream + path,
            params=params,
            data=body or None,
            headers=headers,
        ) as upstream:
            status = upstream.status
            payload = await upstream.read()
            ctype = upstream.headers.get("Content-Type", "application/json")
        out = self._rewrite(request.method, path, task_id, status, payload)
        if request.method in ("POST", "PUT") and status < 300:
            kind = "create" if request.method == "POST" else "append"
            rules = self.rules
            lose = (
                rules.lose_first_create_answer if kind == "create" else rules.lose_first_put_answer
            )
            if kind == "create" and rules.hold_first_create and "held" not in self.lost_answers:
                self.lost_answers.append("held")
                await self._released.wait()  # the proxy's end: the client is gone by then
                raise ConnectionResetError("answer held back on purpose")
            if lose and kind not in self.lost_answers:
                self.lost_answers.append(kind)
                assert request.transport is not None
                request.transport.abort()  # applied upstream; the client gets no answer
                raise ConnectionResetError("answer lost on purpose")
            if refused_now:
                data = json.loads(out)
                data.setdefault("failureList", []).extend(
                    {"request": r, "errorMessage": "image URL could not be fetched"}
                    for r in refused_now
                )
                out = json.dumps(data).encode()
            status, out = self._reword_failures(body, status, out)
        if request.method in self.rules.no_content_writes and 200 <= status < 300:
            return web.Response(status=204, headers=self._headers())
        if self.rules.http_date_times and status < 300:
            out = self._http_dates(out)
        if self.rules.bom:
            out = b"\xef\xbb\xbf" + out
        if self.rules.leading_space and out[:1] in (b"{", b"["):
            out = b"\n  " + out
        if request_kind(request.method, path) in self.rules.latin1_ops and status < 300:
            text = json.dumps(json.loads(out), ensure_ascii=False)
            out = text.encode("latin-1", "replace")
        if request_kind(request.method, path) in self.rules.deep_ops and out.endswith(b"}"):
            count = self.rules.deep_count
            if count is None or self.deep_answers < count:
                self.deep_answers += 1
                out = out[:-1] + b',"deep":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        cut = request_kind(request.method, path) in self.rules.cut_ops and status < 300
        if cut and not self.cut_answers and request.transport is not None:
            self.cut_answers += 1
            resp = web.StreamResponse(
                status=status,
                headers={"Content-Type": ctype, "Content-Length": str(len(out))},
            )
            await resp.prepare(request)
            await resp.write(out[: len(out) // 2])
            request.transport.abort()
            return resp
        if request_kind(request.method, path) in self.rules.huge_ops and status < 300:
            count = self.rules.huge_count
            if count is None or self.huge_answers < count:
                self.huge_answers += 1
                return await self._huge(request, status, out, ctype)
        return web.Response(
            status=status, body=out, headers={"Content-Type": ctype, **self._headers()}
        )

    def create_later(
        self, request: web.Request, body: bytes, delay: float, applied: anyio.Event
    ) -> asyncio.Task[None]:
        """The create ``body`` (read from ``request``) sent upstream ``delay`` seconds from
        now, as a service that applies a create late would; ``applied`` is set once it was."""
        headers = {"x-api-key": request.headers["x-api-key"], "Content-Type": "application/json"}

        async def late() -> None:
            await anyio.sleep(delay)
            assert self._session is not None
            async with self._session.post(self.upstream + BULK, data=body, headers=headers) as up:
                await up.read()
            applied.set()

        return asyncio.get_running_loop().create_task(late())

    async def _merged_create(self, request: web.Request, target: str) -> web.Response:
        """A create applied to ``target`` (as a PUT) and answered with its id."""
        assert self._session is not None
        sent = json.loads(await request.read())
        sent.pop("description", None)
        async with self._session.put(
            f"{self.upstream}{BULK}/{target}",
            json=sent,
            headers={"x-api-key": request.headers.get("x-api-key", "")},
        ) as upstream:
            status, payload = upstream.status, await upstream.read()
        self.merged.append(target)
        return web.Response(
            status=status,
            body=payload,
            headers={"Content-Type": "application/json", **self._headers()},
        )

    async def _huge(
        self, request: web.Request, status: int, out: bytes, ctype: str
    ) -> web.StreamResponse:
        """``out`` followed by :attr:`Misbehaviour.huge_bytes` of whitespace, streamed until the
        client stops reading."""
        rules = self.rules
        headers = {"Content-Type": ctype, **self._headers()}
        gz = zlib.compressobj(1, wbits=31) if rules.huge_gzip else None
        if gz is not None:
            headers["Content-Encoding"] = "gzip"
        resp = web.StreamResponse(status=status, headers=headers)
        resp.enable_chunked_encoding()
        block = b" " * (1 << 20)
        left = rules.huge_bytes
        try:
            await resp.prepare(request)
            await resp.write(gz.compress(out) if gz is not None else out)
            while left is None or left > 0:
                data = block if left is None or left >= len(block) else block[:left]
                if left is not None:
                    left -= len(data)
                await resp.write(gz.compress(data) if gz is not None else data)
            if gz is not None:
                await resp.write(gz.flush())
            await resp.write_eof()
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            pass  # the client stopped reading
        return resp

    @staticmethod
    def _http_dates(out: bytes) -> bytes:
        """Every expiry time of an answer rewritten as an HTTP date."""
        keys = ("taskExpireAt", "taskExpiredAt", "resultExpiredAt")

        def rewrite(node: Any) -> None:
            if isinstance(node, dict):
                for key, value in node.items():
                    if key in keys and isinstance(value, str) and value:
                        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
                        node[key] = formatdate(moment.timestamp(), usegmt=True)
                    else:
                        rewrite(value)
            elif isinstance(node, list):
                for item in node:
                    rewrite(item)

        try:
            data = json.loads(out)
        except ValueError:
            return out
        rewrite(data)
        return json.dumps(data).encode()

    def _refuse_write(self, method: str, body: bytes) -> int | None:
        rules = self.rules
        if method == "POST" and rules.refuse_every_create is not None:
            return rules.refuse_every_create
        status = rules.refuse_first_write.get(method)
        if status is not None and method not in self._first_refused:
            self._first_refused.add(method)
            return status
        if rules.max_body_bytes is not None and len(body) > rules.max_body_bytes:
            return 413
        if rules.refuse_whole_with and any(
            b'"id":"' + i.encode() + b'"' in body.replace(b" ", b"")
            or b"/" + i.encode() + b'"' in body
            for i in rules.refuse_whole_with
        ):
            return 400
        return None

    def _rewrite(
        self, method: str, path: str, task_id: str | None, status: int, payload: bytes
    ) -> bytes:
        rules = self.rules
        if status >= 300:
            return payload
        if method == "POST" and path == BULK:
            task_id = json.loads(payload)["taskId"]
            self.created.append(task_id)
            self.created_at[task_id] = time.monotonic()
            self._first_created.set()
            return payload
        if method == "GET" and path == BULK:
            data = json.loads(payload)
            kept = []
            listed_before = time.monotonic() - rules.list_lag
            for task in data["data"]["tasks"]:
                tid = task["taskId"]
                if self.created_at.get(tid, 0.0) > listed_before:
                    continue  # not in the index yet
                if self._forget_if_done(tid, task):
                    continue
                if self.ordinal(tid) in rules.unreadable_status:
                    continue
                if tid not in self.forgotten:
                    self._disguise(tid, task)
                    kept.append(task)
            if rules.stranger_status is not None:
                kept.append(
                    {
                        "taskId": "someone-else",
                        "count": {"total": 5, "done": 0, "processing": 0, "failure": 5},
                        "description": "another team's catalogue",
                        "taskStatus": rules.stranger_status,
                        "createDate": "2026-01-01T00:00:00.000Z",
                    }
                )
            data["data"]["tasks"] = kept
            return json.dumps(data).encode()
        if method == "GET" and task_id is not None and path.endswith("/status"):
            data = json.loads(payload)
            if self._forget_if_done(task_id, data["data"]):
                return json.dumps({"status": "failure", "error": "task not found"}).encode()
            if self._disguise(task_id, data["data"]):
                return json.dumps(data).encode()
            return payload
        if method == "GET" and task_id is not None:
            n = self.ordinal(task_id)
            served = self.pages_served.get(task_id, 0) + 1
            self.pages_served[task_id] = served
            self.first_page_at.setdefault(task_id, time.monotonic())
            limit = rules.forget_after_pages.get(n or 0)
            if limit is not None and served >= limit:
                self.forgotten.add(task_id)
            data = json.loads(payload)
            offset = data["data"]["taskInfo"]["offset"]
            results = data["data"]["results"]
            if offset == 0 and results:
                self.first_rows[task_id] = results[0]
            if rules.fat_results:
                for r in results:
                    if isinstance(r.get("taggingResult"), dict):
                        r["taggingResult"]["pad"] = "t" * rules.fat_results
                return json.dumps(data).encode()
            if self._reshape_page(task_id, offset, data):
                return json.dumps(data).encode()
            if rules.stray_in_place_of and self._stray(results):
                return json.dumps(data).encode()
            if rules.results_given and any(
                r["id"].rsplit("/", 1)[-1] in rules.results_given for r in results
            ):
                for r in results:
                    given = rules.results_given.get(r["id"].rsplit("/", 1)[-1])
                    if given is not None:
                        r["taggingResult"] = given
                return json.dumps(data).encode()
            if n in rules.duplicate_in_first_page and offset == 0 and len(results) >= 2:
                results[-1] = results[0]
                return json.dumps(data).encode()
            if n in rules.foreign_id_in_first_page and offset == 0 and results:
                results[-1] = {**results[-1], "id": results[-1]["id"] + "~elsewhere"}
                return json.dumps(data).encode()
            if n in rules.results_object_in_first_page and offset == 0 and results:
                data["data"]["results"] = {str(i): r for i, r in enumerate(results)}
                return json.dumps(data).encode()
            if n in rules.malformed_in_first_page and offset == 0 and len(results) >= 2:
                results[-1] = {**results[-1], "taggingResult": None}
                results[-2] = {"id": results[-2]["id"]}
                return json.dumps(data).encode()
            if rules.left_out_once:
                gone = rules.left_out_once - self._left_out
                kept = [r for r in results if r["id"].rsplit("/", 1)[-1] not in gone]
                if len(kept) < len(results):
                    self._left_out |= {r["id"].rsplit("/", 1)[-1] for r in results} & gone
                    data["data"]["results"] = kept
                    return json.dumps(data).encode()
            if rules.never_returned:
                gone = rules.never_returned
                kept = [r for r in results if r["id"].rsplit("/", 1)[-1] not in gone]
                if len(kept) < len(results):
                    self.left_out += len(results) - len(kept)
                    data["data"]["results"] = kept
                    return json.dumps(data).encode()
            if n in rules.duplicate_across_pages and offset == 100 and task_id in self.first_rows:
                results[-1] = self.first_rows[task_id]
                return json.dumps(data).encode()
            return payload
        return payload

    def _stray(self, results: list[Any]) -> bool:
        """Rows of ``stray_in_place_of`` replaced, once each (True when one was)."""
        changed = False
        for i, r in enumerate(results):
            ident = r["id"].rsplit("/", 1)[-1]
            stray = self.rules.stray_in_place_of.get(ident)
            if stray is not None and ident not in self._strayed:
                self._strayed.add(ident)
                results[i] = {"id": stray[0], "taggingResult": stray[1]}
                changed = True
        return changed

    def _strip_refused(self, body: bytes) -> tuple[bytes, list[Any]]:
        """The write's body without the rows of :attr:`Misbehaviour.always_refused`, and
        those rows."""
        data = json.loads(body)
        requests = data["taggingRequest"]
        gone = self.rules.always_refused
        refused = [r for r in requests if r["context"]["id"].rsplit("/", 1)[-1] in gone]
        if not refused:
            return body, []
        data["taggingRequest"] = [r for r in requests if r not in refused]
        return json.dumps(data).encode(), refused

    def _reword_failures(self, sent: bytes, status: int, payload: bytes) -> tuple[int, bytes]:
        """A create or append answer as :attr:`Misbehaviour.duplicate_wording`,
        :attr:`~Misbehaviour.refused_but_taken` and
        :attr:`~Misbehaviour.refuse_all_failed_with_400` make it."""
        rules = self.rules
        if not (
            rules.duplicate_wording or rules.refused_but_taken or rules.refuse_all_failed_with_400
        ):
            return status, payload
        data = json.loads(payload)
        failures = data.setdefault("failureList", [])
        if rules.duplicate_wording:
            for f in failures:
                if f.get("errorMessage", "").startswith("duplicate context.id"):
                    f["errorMessage"] = f"{rules.duplicate_wording} {f['request']['context']['id']}"
        listed = {f["request"]["context"]["id"] for f in failures}
        for request in json.loads(sent)["taggingRequest"]:
            ident = request["context"]["id"]
            if ident.rsplit("/", 1)[-1] in rules.refused_but_taken and ident not in listed:
                failures.append(
                    {"request": request, "errorMessage": "image URL could not be fetched"}
                )
        if (
            rules.refuse_all_failed_with_400
            and failures
            and data.get("validation", {}).get("accept") == 0
        ):
            self.refused_with_400 += 1
            body = {
                "status": "failure",
                "error": "no valid tagging request",
                "failureList": failures,
            }
            return 400, json.dumps(body).encode()
        return status, json.dumps(data).encode()

    def _reshape_page(self, task_id: str, offset: int, data: dict[str, Any]) -> bool:
        """A results page as lose_rows, lagging_results, repeat_previous_page_once and
        echo_id make it (True when changed)."""
        rules = self.rules
        results: list[Any] = data["data"]["results"]
        changed = False
        lost = rules.lose_rows.get(self.ordinal(task_id) or 0)
        real = self.done_totals.get(task_id)
        if lost is not None and real is not None:
            results[:] = results[: max(0, real - lost - offset)]
            changed = True
        seen = self.done_seen.get(task_id)
        if rules.lagging_results and (
            seen is None or time.monotonic() - seen < rules.lagging_results
        ):
            half = (real or 0) // 2
            if rules.catching_up and seen is not None:
                elapsed = (time.monotonic() - seen) / rules.lagging_results
                half += int(((real or 0) - half) * elapsed)
            results[:] = results[: max(0, half - offset)]
            changed = True
        if rules.repeat_previous_page_once:
            before = self._pages_given.get((task_id, offset - MAX_PAGE))
            if (task_id, offset) not in self._pages_given and before is not None:
                self._pages_given[(task_id, offset)] = results
                results = data["data"]["results"] = json.loads(json.dumps(before))
                self.pages_repeated += 1
                changed = True
            else:
                self._pages_given[(task_id, offset)] = results
        if rules.echo_id is not None:
            for r in results:
                r["id"] = rules.echo_id(r["id"])
            changed = True
        return changed

    def _disguise(self, task_id: str, task: dict[str, Any]) -> bool:
        if task.get("taskStatus") == "TASK_DONE":
            self.done_seen.setdefault(task_id, time.monotonic())
            self.done_totals.setdefault(task_id, task["count"]["total"])
            word = self.rules.status_when_done.get(self.ordinal(task_id) or 0)
            lost = self.rules.lose_rows.get(self.ordinal(task_id) or 0)
            if word is not None:
                task["taskStatus"] = word
                return True
            if lost is not None:
                task["count"]["total"] -= lost
                task["count"]["done"] -= lost
                return True
        if self.rules.drop_count_total:
            task["count"].pop("total", None)
            return True
        if self.rules.short_total and task.get("taskStatus") == "TASK_DONE":
            task["count"]["total"] = max(0, task["count"]["total"] - self.rules.short_total)
            return True
        if self.ordinal(task_id) in self.rules.hold_processing:
            count = task["count"]
            count.update(done=0, failure=0, processing=count["total"])
            task["taskStatus"] = "TASK_PROCESSING"
            return True
        extra = self.rules.inflate_total.get(self.ordinal(task_id) or 0)
        if extra and task.get("taskStatus") == "TASK_DONE":
            self.real_totals[task_id] = task["count"]["total"]
            task["count"]["total"] += extra
            return True
        if self.ordinal(task_id) in self.rules.foreign_description:
            task["description"] = "somebody else's catalogue"
            return True
        return False

    def _forget_if_done(self, task_id: str, task: dict[str, Any]) -> bool:
        n = self.ordinal(task_id)
        if n in self.rules.forget_when_done and task.get("taskStatus") == "TASK_DONE":
            self.forgotten.add(task_id)
        return task_id in self.forgotten

    async def _long_header(self, request: web.Request, response: web.StreamResponse) -> None:
        rules = self.rules
        if rules.header_bytes and (
            rules.header_count is None or self.long_headers < rules.header_count
        ):
            self.long_headers += 1
            policy = "default-src 'self'; script-src 'self' "
            response.headers["Content-Security-Policy"] = policy.ljust(rules.header_bytes, "x")

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[MisbehavingProxy]:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_response_prepare.append(self._long_header)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        self._started = time.monotonic()
        self._session = aiohttp.ClientSession()
        try:
            yield self
        finally:
            self._released.set()
            await self._session.close()
            await runner.cleanup()


@contextlib.asynccontextmanager
async def misbehaving(upstream: str, rules: Misbehaviour) -> AsyncIterator[MisbehavingProxy]:
    async with MisbehavingProxy(upstream, rules).running() as proxy:
        yield proxy
