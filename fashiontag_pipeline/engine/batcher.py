"""Batcher and task writer: validated rows -> chunks of <= 1,000 -> POST (first) / PUT (rest).

The pure decisions (when a chunk is due, whether a task may still be written, when to seal)
live in :class:`WritePolicy`, driven by a clock passed in, so property tests check them with a
fake clock. :class:`TaskWriter` applies them:

* every chunk is written ahead to the state store (rows, positions) before its request;
* a write is never started later than ``taskExpiredAt - expiry_margin`` (expiry read from every
  response); a partial chunk is flushed before that moment, and a task near expiry with no
  input is sealed;
* a task is sealed once full or ``rotate_seconds`` old, so results flow early: full is
  :meth:`WritePolicy.task_limit` images (``rotate_min_images`` for the first tasks, then
  ``rotate_fraction`` of the images sent before the task, capped by ``rotate_images``) and a
  full task is sealed at once, as is the open task when the input ends;
* idempotency: a create carries the run token in its description; after an ambiguous create
  the writer lists tasks and adopts the one with the token, then re-sends the chunk to it as a
  PUT, where ``duplicate context.id`` failures for ids of the chunk count as accepted. An
  ambiguous PUT is retried on the same task the same way. A PUT refused with 410 goes to a new
  task; a chunk of unknown fate whose task has expired becomes an *orphan*, settled once the
  task's results are read (ids missing from them are sent again).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskGroup

from .. import _exceptions as exc
from .._client import TaggerClient
from .._models import BulkTaskResponse, TaggingRequest, Task
from .config import EngineConfig
from .flow import AIMDLimiter, FatalRunError, RetryBudget, refused
from .sinks import Reject
from .state import Journal, split_position
from .validate import Item

__all__ = [
    "BODY_SQL",
    "Chunk",
    "OpenTask",
    "TaskWriter",
    "WritePolicy",
    "decode_body",
    "drop_bodies_ops",
    "encode_body",
]

STAGE_SERVER = "server-validation"
DUPLICATE_PREFIX = "duplicate context.id"

_body_encoder = msgspec.json.Encoder()
_body_decoder = msgspec.json.Decoder(list[tuple[int, TaggingRequest]])


def encode_body(positions: Sequence[int], requests: Sequence[TaggingRequest]) -> bytes:
    """A chunk as stored ahead of its write: [[position, request], ...]."""
    return _body_encoder.encode(list(zip(positions, requests, strict=True)))


def decode_body(body: bytes) -> list[tuple[int, TaggingRequest]]:
    return _body_decoder.decode(body)


#: A chunk's body in a ``SELECT ... FROM chunks``: its ``chunk_bodies`` row (``chunks.body`` in
#: state files written before bodies had their own table).
BODY_SQL = (
    "COALESCE((SELECT b.body FROM chunk_bodies b WHERE b.chunk_id = chunks.chunk_id), chunks.body)"
)


def drop_bodies_ops(task_id: str) -> list[tuple[str, tuple[Any, ...]]]:
    """Ops that drop the bodies of a task's accepted chunks (the task is drained or expired)."""
    return [
        (
            "DELETE FROM chunk_bodies WHERE chunk_id IN"
            " (SELECT chunk_id FROM chunks WHERE task_id=? AND state='accepted')",
            (task_id,),
        ),
        (
            "UPDATE chunks SET body=NULL WHERE task_id=? AND state='accepted' AND body IS NOT NULL",
            (task_id,),
        ),
    ]


@dataclass(eq=False)
class OpenTask:
    """A task the writer may still write to (or is sealing)."""

    seq: int
    token: str
    opened: float
    expires: float
    task_id: str | None = None
    images: int = 0
    inflight: int = 0
    closing: bool = False
    sealed: bool = False
    failed: bool = False
    #: Images after which the task is full (None: ``rotate_images``).
    limit: int | None = None
    created: anyio.Event = field(default_factory=anyio.Event)


@dataclass(eq=False)
class Chunk:
    """Up to ``chunk_size`` requests, written ahead under ``chunk_id``."""

    chunk_id: int
    ids: list[str]
    positions: list[int]
    requests: list[TaggingRequest]
    fate_unknown: bool = False
    task_id: str | None = None


class WritePolicy:
    """The writer's decisions, pure functions of the config and a time ``now``."""

    def __init__(self, config: EngineConfig) -> None:
        self.chunk_size = config.chunk_size
        self.rotate_images = config.rotate_images
        self.rotate_min_images = min(config.rotate_min_images, config.rotate_images)
        self.rotate_fraction = config.rotate_fraction
        self.rotate_seconds = config.rotate_seconds
        self.margin = config.expiry_margin
        self.linger = config.linger_seconds

    def write_deadline(self, task: OpenTask) -> float:
        """The last moment a write to ``task`` may start."""
        return task.expires - self.margin

    def writable(self, task: OpenTask, now: float) -> bool:
        """True while a write to the task may still start (before expiry - margin)."""
        return not task.failed and now < self.write_deadline(task)

    def task_limit(self, sent_before: int) -> int:
        """Images a new task may hold when ``sent_before`` images went to earlier tasks of the
        run: ``rotate_fraction`` of them, at least ``rotate_min_images``, at most
        ``rotate_images`` (see :class:`~.config.EngineConfig`)."""
        grown = int(sent_before * self.rotate_fraction)
        return max(self.rotate_min_images, min(grown, self.rotate_images))

    def limit_of(self, task: OpenTask) -> int:
        return self.rotate_images if task.limit is None else task.limit

    def full(self, task: OpenTask) -> bool:
        """True when no further chunk may go to the task (seal it now, not at the next chunk)."""
        return task.images >= self.limit_of(task)

    def usable(self, task: OpenTask, now: float, n: int) -> bool:
        """True when a new chunk of ``n`` rows may go to ``task`` (not rotated, not expiring)."""
        if task.closing or not self.writable(task, now):
            return False
        if now - task.opened >= self.rotate_seconds:
            return False
        return task.images == 0 or task.images + n <= self.limit_of(task)

    def flush_at(self, buffered: int, since: float, task: OpenTask | None) -> float:
        """When the buffered rows (oldest arrived at ``since``) must be sent."""
        if buffered >= self.chunk_size:
            return since
        if buffered == 0:
            return float("inf")
        due = since + self.linger
        if task is not None and not task.closing and task.task_id is not None:
            # Flush while the open task still takes writes, so a slow producer never meets
            # an expired task (the write itself extends the expiry).
            guard = max(min(self.linger, self.margin) / 2, 0.01)
            due = min(due, self.write_deadline(task) - guard)
        return due

    def close_at(self, task: OpenTask | None, buffered: int) -> float:
        """When the open task should be sealed: rotation age, or expiry with nothing to write."""
        if task is None or task.closing or task.task_id is None:
            return float("inf")
        age = task.opened + self.rotate_seconds
        if buffered == 0:
            return min(age, self.write_deadline(task))
        return age

    def split(self, buffered: int) -> list[int]:
        """Sizes of the full chunks to cut from ``buffered`` rows."""
        return [self.chunk_size] * (buffered // self.chunk_size)


class TaskWriter:
    """Turns validated items into task writes. See the module docstring."""

    def __init__(
        self,
        *,
        client: TaggerClient,
        journal: Journal,
        config: EngineConfig,
        run_token: str,
        task_seq: int,
        sources: Sequence[str],
        budget: RetryBudget,
        on_sealed: Callable[[str], Awaitable[None]],
        on_orphan: Callable[[str, int], None],
        clock: Callable[[], float] = time.monotonic,
        default_ttl: float = 600.0,
    ) -> None:
        self.client = client
        self.journal = journal
        self.config = config
        self.policy = WritePolicy(config)
        self.run_token = run_token
        self.sources = list(sources)
        self.budget = budget
        self.on_sealed = on_sealed
        self.on_orphan = on_orphan
        self.clock = clock
        self.default_ttl = default_ttl
        self.slots = AIMDLimiter(config.max_write_concurrency)
        self.tasks: dict[str, OpenTask] = {}
        self.current: OpenTask | None = None
        self.intake_done = False
        self.active = 0
        self.idle = anyio.Event()
        self._seq = task_seq
        self._tg: TaskGroup | None = None
        #: Images assigned to tasks by this writer (sizes the next task).
        self.assigned = 0
        self.sent_requests = 0
        #: PUTs the service refused as expired (410) or unknown (404): 0 in a healthy run.
        self.refused_writes = 0

    # ------------------------------------------------------------------ helpers

    def description(self, token: str) -> str:
        return f"fashiontag run {token}"

    def _expiry(self, response_expiry: datetime | None) -> float:
        # The service's expiry is in the service's clock (see ServerClock).
        return self.clock() + self.client.server_clock.remaining(response_expiry, self.default_ttl)

    def _new_token(self) -> tuple[int, str]:
        self._seq += 1
        return self._seq, f"{self.run_token}-t{self._seq}"

    def _reject_rows(self, chunk: Chunk, ids: dict[str, str], stage: str) -> list[Reject]:
        out: list[Reject] = []
        for ident, pos in zip(chunk.ids, chunk.positions, strict=True):
            reason = ids.get(ident)
            if reason is not None:
                src, line = split_position(pos)
                out.append(Reject(ident, reason, stage, line, self.sources[src]))
        return out

    # ------------------------------------------------------------------ intake loop

    async def run(self, items: anyio.abc.ObjectReceiveStream[list[Item]]) -> None:
        """Consume validated batches until the stream ends; then seal what is open."""
        # Sends run in the run's task group (``_tg``), not one of the intake's own: rows sent
        # again (a forgotten task, rows a task did not return) may come after the intake ends.
        assert self._tg is not None, "the run's task group is not attached"
        async with items:
            self.active += 1
            try:
                await self._intake(items)
            finally:
                self.active -= 1
                self.intake_done = True
                if self.current is not None:
                    await self._close(self.current)
                self._check_idle()

    async def _intake(self, items: anyio.abc.ObjectReceiveStream[list[Item]]) -> None:
        buffer: list[Item] = []
        since = 0.0
        eof = False
        while not eof:
            now = self.clock()
            due = min(
                self.policy.flush_at(len(buffer), since, self.current),
                self.policy.close_at(self.current, len(buffer)),
            )
            timeout = max(0.0, due - now) if due != float("inf") else None
            batch: list[Item] | None = None
            with anyio.move_on_after(timeout):
                try:
                    batch = await items.receive()
                except anyio.EndOfStream:
                    eof = True
            if batch:
                if not buffer:
                    since = self.clock()
                buffer.extend(batch)
            while len(buffer) >= self.policy.chunk_size:
                head, buffer = buffer[: self.policy.chunk_size], buffer[self.policy.chunk_size :]
                await self.dispatch(head)
                since = self.clock()
            now = self.clock()
            if buffer and (eof or now >= self.policy.flush_at(len(buffer), since, self.current)):
                await self.dispatch(buffer)
                buffer = []
            cur = self.current
            if cur is not None and now >= self.policy.close_at(cur, len(buffer)):
                await self._close(cur)

    async def dispatch(
        self, items: list[Item], *, chunk_id: int | None = None, resent: bool = False
    ) -> None:
        """Write a chunk ahead (new rows move the chunked watermark) and start sending it.
        ``resent``: rows sent again (in place of chunk ``chunk_id`` when given)."""
        ids = [i for i, _, _ in items]
        positions = [p for _, p, _ in items]
        requests = [r for _, _, r in items]
        body = encode_body(positions, requests)
        last = max(positions) if not resent else -1
        cid = await self.journal.run(
            self._insert_chunk, len(items), last, body, chunk_id, len(items) if resent else 0
        )
        await self.start(Chunk(cid, ids, positions, requests))

    def _insert_chunk(
        self, n: int, last_pos: int, body: bytes, replaces: int | None, resent: int
    ) -> int:
        # One transaction: the new chunk, and either the chunked watermark (new rows) or the
        # chunk whose unsettled rows it carries (so they can never be sent twice).
        db = self.journal.db.db
        db.execute("BEGIN IMMEDIATE")
        # The body goes to its own table: the chunk's row is updated several times (token,
        # task, state) and SQLite rewrites a whole row, overflow pages included, on update.
        cur = db.execute(
            "INSERT INTO chunks (state, n, last_pos) VALUES ('pending', ?, ?)", (n, last_pos)
        )
        assert cur.lastrowid is not None
        db.execute("INSERT INTO chunk_bodies VALUES (?, ?)", (cur.lastrowid, body))
        if replaces is not None:
            db.execute(
                "UPDATE chunks SET state='resolved', body=NULL WHERE chunk_id=?", (replaces,)
            )
            db.execute("DELETE FROM chunk_bodies WHERE chunk_id=?", (replaces,))
        if resent:
            db.execute(
                "UPDATE meta SET value = CAST(value AS INTEGER) + ? WHERE key = 'n_resent'",
                (resent,),
            )
            self.journal.counters["resent"] = self.journal.counters.get("resent", 0) + resent
        else:
            db.execute(
                "UPDATE meta SET value=? WHERE key='chunked' AND CAST(value AS INTEGER) < ?",
                (str(last_pos), last_pos),
            )
        db.execute("COMMIT")
        assert cur.lastrowid is not None
        return cur.lastrowid

    async def start(self, chunk: Chunk) -> None:
        """Send a chunk in the background once a write slot is free."""
        assert self._tg is not None, "TaskWriter.run is not running"
        await self.slots.acquire()
        self.active += 1
        if chunk.fate_unknown and chunk.task_id is not None:
            self._tg.start_soon(self._send, chunk, None, False)
            return
        try:
            task, create = await self._target(len(chunk.ids))
        except BaseException:
            self.active -= 1
            self.slots.release()
            raise
        self._tg.start_soon(self._send, chunk, task, create)

    # ------------------------------------------------------------------ targeting

    async def _target(self, n: int) -> tuple[OpenTask, bool]:
        """The task a chunk of ``n`` rows goes to; True when the chunk must create it."""
        while True:
            cur = self.current
            if cur is not None and cur.task_id is None and not cur.failed:
                await cur.created.wait()
                continue
            now = self.clock()
            if cur is not None and not cur.failed and self.policy.usable(cur, now, n):
                cur.images += n
                cur.inflight += 1
                self.assigned += n
                if self.policy.full(cur):
                    await self._close(cur)
                return cur, False
            if cur is not None:
                await self._close(cur)
                if self.current is not cur:
                    continue
            seq, token = self._new_token()
            task = OpenTask(seq=seq, token=token, opened=now, expires=now + self.default_ttl)
            task.limit = self.policy.task_limit(self.assigned)
            task.images = n
            task.inflight = 1
            self.assigned += n
            self.current = task
            if self.policy.full(task):
                task.closing = True
                self.current = None
            return task, True

    async def _close(self, task: OpenTask) -> None:
        task.closing = True
        if self.current is task:
            self.current = None
        await self._maybe_seal(task)

    async def _maybe_seal(self, task: OpenTask) -> None:
        if task.closing and task.inflight == 0 and not task.sealed and task.task_id is not None:
            task.sealed = True
            await self.journal.commit(
                ops=[("UPDATE tasks SET state='sealed' WHERE task_id=?", (task.task_id,))]
            )
            await self.on_sealed(task.task_id)

    def _check_idle(self) -> None:
        if self.intake_done and self.active == 0:
            self.idle.set()

    # ------------------------------------------------------------------ sending

    async def _send(self, chunk: Chunk, task: OpenTask | None, create: bool) -> None:
        try:
            while True:
                if task is None:
                    if chunk.fate_unknown and chunk.task_id is not None:
                        task = self.tasks.get(chunk.task_id)
                        if task is None:
                            await self._orphan(chunk)
                            return
                        task.inflight += 1
                        create = False
                    else:
                        task, create = await self._target(len(chunk.ids))
                try:
                    if create:
                        done = await self._create(task, chunk)
                    else:
                        done = await self._append(task, chunk)
                finally:
                    task.inflight -= 1
                    if self.intake_done and self.current is task and task.inflight == 0:
                        task.closing = True
                        self.current = None
                    await self._maybe_seal(task)
                if done:
                    return
                task = None
        finally:
            self.active -= 1
            self.slots.release()
            self._check_idle()

    async def _accept(
        self,
        task: OpenTask,
        chunk: Chunk,
        response: BulkTaskResponse,
        opened: list[tuple[str, tuple[Any, ...]]] | None = None,
    ) -> None:
        """Record an accepted write (and, with ``opened``, the task it created: one
        transaction)."""
        mine = set(chunk.ids)
        reasons: dict[str, str] = {}
        for failure in response.failure_list:
            ident = failure.context_id
            if ident is None or ident not in mine:
                continue
            if failure.error_message.startswith(DUPLICATE_PREFIX):
                continue  # a retried write: this id is already in the task
            reasons[ident] = failure.error_message or "refused by the service"
        rejects = self._reject_rows(chunk, reasons, STAGE_SERVER)
        accepted = len(chunk.ids) - len(rejects)
        expiry = response.expires_at
        if expiry is not None:
            task.expires = self._expiry(expiry)
        self.sent_requests += 1
        counters = {"submitted": accepted, "settled": len(rejects)}
        if opened:
            counters["tasks"] = 1
        await self.journal.commit(
            rejects=rejects,
            ops=[
                *(opened or ()),
                (
                    "UPDATE chunks SET state='accepted', task_id=?, n_ok=? WHERE chunk_id=?",
                    (task.task_id, accepted, chunk.chunk_id),
                ),
                (
                    "UPDATE tasks SET expires_at=? WHERE task_id=?",
                    (expiry.timestamp() if expiry else None, task.task_id),
                ),
            ],
            counters=counters,
        )

    async def _reject_chunk(self, chunk: Chunk, message: str) -> None:
        reasons = dict.fromkeys(chunk.ids, message)
        rejects = self._reject_rows(chunk, reasons, STAGE_SERVER)
        await self.journal.commit(
            rejects=rejects,
            ops=[("UPDATE chunks SET state='resolved' WHERE chunk_id=?", (chunk.chunk_id,))],
            counters={"settled": len(rejects)},
        )

    async def _orphan(self, chunk: Chunk) -> None:
        assert chunk.task_id is not None
        await self.journal.commit(
            ops=[("UPDATE chunks SET state='orphan' WHERE chunk_id=?", (chunk.chunk_id,))]
        )
        self.on_orphan(chunk.task_id, chunk.chunk_id)

    def _fatal(self, err: exc.FashiontagError) -> FatalRunError:
        return refused(err)

    async def _create(self, task: OpenTask, chunk: Chunk) -> bool:
        """POST the chunk as a new task. True when the chunk is settled."""
        await self.journal.commit(
            ops=[
                (
                    "UPDATE chunks SET task_id=NULL, token=? WHERE chunk_id=?",
                    (task.token, chunk.chunk_id),
                )
            ]
        )
        while True:
            try:
                response = await self.client.create_task(
                    chunk.requests,
                    description=self.description(task.token),
                    default_detection=self.config.default_detection,
                )
            except exc.AmbiguousWriteError as err:
                await self.budget.failed(err, "create task")
                adopted = await self.find_task(task.token)
                if adopted is None:
                    continue
                await self._opened(task, adopted.task_id, adopted.expires_at)
                chunk.fate_unknown = True
                chunk.task_id = adopted.task_id
                return False
            except (exc.TransportError, exc.RateLimitedError, exc.ServerError) as err:
                if isinstance(err, exc.RateLimitedError):
                    self.slots.throttled()
                await self.budget.failed(err, "create task")
                continue
            except (exc.AuthenticationError, exc.PermissionDeniedError) as err:
                raise self._fatal(err) from err
            except exc.RequestError as err:
                task.failed = True
                task.created.set()
                if self.current is task:
                    self.current = None
                await self._reject_chunk(chunk, err.service_message or str(err))
                return True
            self.budget.ok()
            self.slots.success()
            opened = self._opened_ops(task, response.task_id, response.expires_at)
            await self._accept(task, chunk, response, opened)
            task.created.set()
            return True

    def _opened_ops(
        self, task: OpenTask, task_id: str, expiry: datetime | None
    ) -> list[tuple[str, tuple[Any, ...]]]:
        """Attach a created task; the rows recording it (committed before any other write
        goes to the task: :attr:`OpenTask.created` is set after)."""
        task.task_id = task_id
        task.expires = self._expiry(expiry)
        self.tasks[task_id] = task
        return [
            (
                "INSERT OR IGNORE INTO tasks (task_id, seq, token, state, expires_at)"
                " VALUES (?, ?, ?, 'open', ?)",
                (task_id, task.seq, task.token, expiry.timestamp() if expiry else None),
            ),
            ("INSERT OR REPLACE INTO meta VALUES ('task_seq', ?)", (str(self._seq),)),
        ]

    async def _opened(self, task: OpenTask, task_id: str, expiry: datetime | None) -> None:
        await self.journal.commit(
            ops=self._opened_ops(task, task_id, expiry), counters={"tasks": 1}
        )
        task.created.set()

    async def find_task(self, token: str) -> Task | None:
        """The task whose description carries ``token`` (after an ambiguous create)."""
        wanted = self.description(token)
        tasks = await self.budget.call("list tasks", self.client.list_tasks)
        for task in tasks:
            if task.description == wanted:
                return task
        return None

    async def _append(self, task: OpenTask, chunk: Chunk) -> bool:
        """PUT the chunk to ``task``. True when settled; False to re-target it."""
        assert task.task_id is not None
        while True:
            if not self.policy.writable(task, self.clock()):
                task.closing = True
                if chunk.fate_unknown and chunk.task_id == task.task_id:
                    await self._orphan(chunk)
                    return True
                return False
            if chunk.task_id != task.task_id:
                chunk.task_id = task.task_id
                chunk.fate_unknown = False
                await self.journal.commit(
                    ops=[
                        (
                            "UPDATE chunks SET task_id=? WHERE chunk_id=?",
                            (task.task_id, chunk.chunk_id),
                        )
                    ]
                )
            try:
                response = await self.client.append_to_task(
                    task.task_id, chunk.requests, default_detection=self.config.default_detection
                )
            except exc.AmbiguousWriteError as err:
                chunk.fate_unknown = True
                await self.budget.failed(err, f"append to task {task.task_id}")
                continue
            except (exc.TaskExpiredError, exc.TaskNotFoundError):
                self.refused_writes += 1
                task.closing = True
                if self.current is task:
                    self.current = None
                if chunk.fate_unknown:
                    await self._orphan(chunk)
                    return True
                chunk.task_id = None
                return False
            except (exc.TransportError, exc.RateLimitedError, exc.ServerError) as err:
                if isinstance(err, exc.RateLimitedError):
                    self.slots.throttled()
                await self.budget.failed(err, f"append to task {task.task_id}")
                continue
            except (exc.AuthenticationError, exc.PermissionDeniedError) as err:
                raise self._fatal(err) from err
            except exc.RequestError as err:
                await self._reject_chunk(chunk, err.service_message or str(err))
                return True
            self.budget.ok()
            self.slots.success()
            await self._accept(task, chunk, response)
            return True
