"""Bulk routes: create, append, list, status, results (spec section 4.2-4.6)."""

from __future__ import annotations

import functools
import secrets

import anyio
import anyio.lowlevel
import msgspec
from aiohttp import web

from .._models import MAX_PAGE_SIZE
from .analyzer import CLOTHING_MASK, Analysis, failure_response
from .bulk_validation import accept, parse_bulk, validate, write_response
from .config import DEFAULT_LIST_SIZE, MAX_LIST_SIZE
from .context import STATE, ServiceState
from .errors import CODE_BAD_JSON, CODE_BAD_ROUTE, CODE_QUOTA, FAILURE_MESSAGES, Reject
from .parsing import language, query_int, read_json
from .store import OUTCOME_DONE, TaskRecord, iso

__all__ = ["handle_append", "handle_create", "handle_list", "handle_results", "handle_status"]

_encoder = msgspec.json.Encoder()
#: Seconds a create refused for too many live tasks is told to wait.
LIVE_TASKS_RETRY_AFTER = 30.0
_LIST_SLICE = 256


def _task_body(task: TaskRecord) -> bytes:
    """The task's JSON body (list and status), rebuilt only when a count or expiry changed:
    a list of 1,000 unchanged tasks is a join of cached bytes."""
    key = (task.total, task.processed, task.failures, task.expire_at, task.result_expire_at)
    cached = task.body_cache
    if cached is not None and cached[0] == key:
        return cached[1]
    total, done, processing, failure = task.counts()
    body = _encoder.encode(
        {
            "taskId": task.task_id,
            "count": {"total": total, "done": done, "processing": processing, "failure": failure},
            "description": task.description,
            "taskStatus": task.status.value,
            "taskExpireAt": iso(task.expire_at),
            "resultExpiredAt": iso(task.result_expire_at),
            "createDate": iso(task.created),
            "albumName": task.album_name,
        }
    )
    task.body_cache = (key, body)
    return body


async def handle_create(request: web.Request) -> web.Response:
    """POST /tagger/v2.12/bulk: create a task."""
    state = request.app[STATE]
    owner = state.keys.identify(request, bulk=True)
    parsed = parse_bulk(await read_json(request))
    cap = state.config.max_live_tasks
    if state.store.live_count(owner) >= cap:
        raise Reject(
            429,
            CODE_QUOTA,
            f"this key has {cap} live tasks (processing or open for appends), the limit: "
            "append to one of them, or create after some are done and past taskExpireAt",
            headers={"Retry-After": f"{LIVE_TASKS_RETRY_AFTER:g}"},
        )
    accepted = validate(state, None, parsed, CLOTHING_MASK)
    if parsed.strict and accepted.failures:
        raise Reject(
            400,
            CODE_BAD_JSON,
            f"STRICT: {len(accepted.failures)} tagging request(s) failed validation",
            failure_list=accepted.failures,
        )
    task_id = secrets.token_hex(12)
    task = state.store.create_task(
        task_id=task_id,
        owner=owner,
        album_name=parsed.album_name or f"album-{task_id[:12]}",
        description=parsed.description,
        default_detection=parsed.default_detection or CLOTHING_MASK,
    )
    accept(state, task, accepted, extend=False)
    return write_response(task, accepted)


def _lookup(request: web.Request, state: ServiceState, owner: bytes) -> TaskRecord:
    task_id = request.match_info["task_id"]
    task = state.store.get(task_id, owner)
    if task is None:
        raise Reject(404, CODE_BAD_ROUTE, f"task {task_id} not found")
    return task


def _check_appendable(state: ServiceState, task: TaskRecord) -> None:
    """410 for a task past its expiry, or whose results expired (possible while it still
    takes writes when ``--result-ttl`` is shorter than the write window): images appended then
    could never be read, and the task no longer knows its ids to refuse a duplicate."""
    now = state.clock()
    if now >= task.expire_at:
        raise Reject(410, CODE_BAD_ROUTE, f"task {task.task_id} expired at {iso(task.expire_at)}")
    if task.purged or (task.result_expire_at is not None and now >= task.result_expire_at):
        raise Reject(
            410,
            CODE_BAD_ROUTE,
            f"results of task {task.task_id} expired at {iso(task.result_expire_at)}: it takes"
            " no more images",
        )


async def handle_append(request: web.Request) -> web.Response:
    """PUT /tagger/v2.12/bulk/{task}: append images to a live task."""
    state = request.app[STATE]
    owner = state.keys.identify(request, bulk=True)
    task = _lookup(request, state, owner)
    _check_appendable(state, task)
    parsed = parse_bulk(await read_json(request))
    accepted = validate(state, task, parsed, task.default_detection)
    if parsed.strict and accepted.failures:
        raise Reject(
            400,
            CODE_BAD_JSON,
            f"STRICT: {len(accepted.failures)} tagging request(s) failed validation",
            failure_list=accepted.failures,
        )
    # Time may have passed while the body was read and checked.
    _check_appendable(state, task)
    accept(state, task, accepted, extend=True)
    return write_response(task, accepted)


async def handle_list(request: web.Request) -> web.Response:
    """GET /tagger/v2.12/bulk[?offset=&size=]: the key's tasks, newest first.

    Without paging parameters, every task (the spec's list has none). ``offset`` counts from
    the newest task (0 = newest), ``size`` is 1 to :data:`MAX_LIST_SIZE` (default
    :data:`DEFAULT_LIST_SIZE` when only ``offset`` is given). ``data.taskInfo`` says
    ``totalCount`` (all the key's tasks), ``offset`` and ``size``, as the results pages do.
    """
    state = request.app[STATE]
    owner = state.keys.identify(request, bulk=True)
    tasks = state.store.tasks_of(owner)
    total = len(tasks)
    paged = "offset" in request.query or "size" in request.query
    offset = query_int(request, "offset", 0)
    size = query_int(request, "size", DEFAULT_LIST_SIZE) if paged else max(total, 1)
    if offset < 0:
        raise Reject(400, CODE_BAD_JSON, "offset must be >= 0")
    if paged and not 1 <= size <= MAX_LIST_SIZE:
        raise Reject(400, CODE_BAD_JSON, f"size must be between 1 and {MAX_LIST_SIZE}")
    first = total - 1 - offset  # newest first
    last = max(first - size, -1)
    parts = [
        b'{"status":"success","data":{"taskInfo":{"totalCount":%d,"offset":%d,"size":%d},'
        b'"tasks":[' % (total, offset, size)
    ]
    bodies: list[bytes] = []
    for n, index in enumerate(range(first, last, -1), 1):
        bodies.append(_task_body(tasks[index]))
        if n % _LIST_SLICE == 0:
            # Tasks whose body changed are re-encoded: let other requests in between slices.
            await anyio.lowlevel.checkpoint()
    parts.append(b",".join(bodies))
    parts.append(b"]}}")
    return web.Response(body=b"".join(parts), content_type="application/json")


async def handle_status(request: web.Request) -> web.Response:
    """GET /tagger/v2.12/bulk/{task}/status."""
    state = request.app[STATE]
    owner = state.keys.identify(request, bulk=True)
    task = _lookup(request, state, owner)
    return web.Response(
        body=b'{"status":"success","data":%s}' % _task_body(task),
        content_type="application/json",
    )


async def handle_results(request: web.Request) -> web.Response:
    """GET /tagger/v2.12/bulk/{task}?offset=&size=: one page of a done task's results."""
    state = request.app[STATE]
    owner = state.keys.identify(request, bulk=True)
    task = _lookup(request, state, owner)
    offset = query_int(request, "offset", 0)
    size = query_int(request, "size", MAX_PAGE_SIZE)
    if offset < 0:
        raise Reject(400, CODE_BAD_JSON, "offset must be >= 0")
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise Reject(400, CODE_BAD_JSON, f"size must be between 1 and {MAX_PAGE_SIZE}")
    if task.purged or (
        task.result_expire_at is not None and state.clock() >= task.result_expire_at
    ):
        raise Reject(
            410,
            CODE_BAD_ROUTE,
            f"results of task {task.task_id} expired at {iso(task.result_expire_at)}",
        )
    if task.processed < task.total:
        raise Reject(
            409,
            CODE_BAD_ROUTE,
            f"task {task.task_id} is still TASK_PROCESSING; results are readable once TASK_DONE",
        )
    lang = language(request)
    end = min(offset + size, task.total)
    render = state.render_json
    encode_id = _encoder.encode
    ids, masks = task.ids, task.masks
    hashes, outcomes, measured = task.hashes, task.outcomes, task.measured
    parts = [
        b'{"status":"success","data":{"taskInfo":{"totalCount":%d,"offset":%d,"size":%d},'
        b'"results":[' % (task.total, offset, size)
    ]
    append = parts.append
    sep = b'{"id":'
    for index in range(offset, end):
        append(sep)
        append(encode_id(ids[index]))
        append(b',"taggingResult":')
        outcome = outcomes[index] if outcomes is not None else OUTCOME_DONE
        if outcome == OUTCOME_DONE:
            analysis = Analysis(hashes[index], measured[index] if measured is not None else None)
            append(render(analysis, masks[index], lang))
        else:
            append(_failure_json(outcome))
        sep = b'},{"id":'
    append(b"}]}}" if end > offset else b"]}}")
    return web.Response(body=b"".join(parts), content_type="application/json")


@functools.lru_cache(maxsize=64)
def _failure_json(outcome: int) -> bytes:
    return _encoder.encode(
        failure_response(outcome, FAILURE_MESSAGES.get(outcome, "tagging failed"))
    )
