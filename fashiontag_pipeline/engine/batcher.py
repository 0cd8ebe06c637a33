"""Batcher and task writer: validated rows -> chunks of <= 1,000 -> POST (first) / PUT (rest).

The pure decisions (when a chunk is due, whether a task may still be written, when to seal)
live in :class:`~.policy.WritePolicy`, driven by a clock passed in, so property tests check
them with a fake clock. :class:`TaskWriter` applies them:

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
from collections.abc import Callable
from datetime import datetime

import anyio
from anyio.abc import TaskGroup

from .. import _exceptions as exc
from .._client import TaggerClient
from .._models import BulkTaskResponse, Task
from .config import EngineConfig
from .flow import AIMDLimiter, FatalRunError, RetryBudget, refused
from .jobs import Jobs
from .policy import Chunk, OpenTask, WritePolicy, encode_body
from .state import JobReject, Journal, changes
from .tracker import TaskBook
from .validate import Item

__all__ = ["STAGE_SERVER", "TaskWriter"]

STAGE_SERVER = "server-validation"
DUPLICATE_PREFIX = "duplicate context.id"


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
        jobs: Jobs,
        book: TaskBook,
        budget: RetryBudget,
        clock: Callable[[], float] = time.monotonic,
        default_ttl: float = 600.0,
    ) -> None:
        self.client = client
        self.journal = journal
        self.config = config
        self.policy = WritePolicy(config)
        self.run_token = run_token
        self.jobs = jobs
        self.book = book
        self.budget = budget
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

    def _reject_rows(self, chunk: Chunk, ids: dict[str, str], stage: str) -> list[JobReject]:
        out: list[JobReject] = []
        jobs = self.jobs
        for ident, pos in zip(chunk.ids, chunk.positions, strict=True):
            reason = ids.get(ident)
            if reason is not None:
                out.append(jobs.reject(pos, jobs.original(ident), reason, stage))
        return out

    def _submitted(self, chunk: Chunk, refused: dict[str, str]) -> dict[int, dict[str, int]]:
        """Rows of the chunk the service took, per job."""
        positions = chunk.positions
        if refused:
            positions = [p for i, p in zip(chunk.ids, positions, strict=True) if i not in refused]
        return {job: {"submitted": n} for job, n in self.jobs.count_by_job(positions).items()}

    def expiry_headroom(self) -> float | None:
        """Seconds until the first open task stops taking writes (None: no open task)."""
        now = self.clock()
        left = [
            self.policy.write_deadline(t) - now
            for t in self.tasks.values()
            if t.task_id is not None and not t.sealed
        ]
        return min(left) if left else None

    # ------------------------------------------------------------------ life and resume

    def attach(self, task_group: TaskGroup) -> None:
        """The run's task group, where sends run (they may outlive the intake: rows sent
        again after a task is lost come after the input ends)."""
        self._tg = task_group

    def resume_open(self, task_id: str, seq: int, token: str, remaining: float) -> None:
        """An open task of an interrupted run (``remaining`` seconds until its expiry): only
        the chunks of unknown fate that went to it are sent to it again, then it is sealed."""
        if task_id in self.tasks:
            return
        now = self.clock()
        task = OpenTask(seq=seq, token=token, opened=now, expires=now + remaining, task_id=task_id)
        task.closing = True
        task.created.set()
        self.tasks[task_id] = task

    async def adopt(self, token: str, found: Task) -> None:
        """A task created by an interrupted run's ambiguous create, found by its token: record
        it (closing, like every task of an interrupted run)."""
        seq = int(token.rsplit("-t", 1)[1])
        now = self.clock()
        task = OpenTask(seq=seq, token=token, opened=now, expires=now, closing=True)
        await self._opened(task, found.task_id, found.expires_at)

    async def seal_idle(self) -> None:
        """Seal every closing task with no write in flight (after a resume's re-sends)."""
        for task in list(self.tasks.values()):
            if task.closing and task.inflight == 0:
                await self._maybe_seal(task)

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
            idle = batch is not None and not batch
            if batch:
                if not buffer:
                    since = self.clock()
                buffer.extend(batch)
            while len(buffer) >= self.policy.chunk_size:
                head, buffer = buffer[: self.policy.chunk_size], buffer[self.policy.chunk_size :]
                await self.dispatch(head)
                since = self.clock()
            now = self.clock()
            due_now = now >= self.policy.flush_at(len(buffer), since, self.current)
            if buffer and (eof or idle or due_now):
                await self.dispatch(buffer)
                buffer = []
            cur = self.current
            if cur is not None and (idle or now >= self.policy.close_at(cur, len(buffer))):
                # Nothing more to read for now (idle): seal, so the rows sent get results.
                await self._close(cur)

    async def dispatch(
        self, items: list[Item], *, chunk_id: int | None = None, resent: bool = False
    ) -> None:
        """Write a chunk ahead (new rows move the chunked watermark) and start sending it.
        ``resent``: rows sent again (in place of chunk ``chunk_id`` when given)."""
        ids = [i for i, _, _ in items]
        positions = [p for _, p, _ in items]
        requests = [r for _, _, r in items]
        body, encoded = encode_body(positions, requests)
        last = max(positions)
        marks = [] if resent else self.jobs.marks(positions)
        cid = await self.journal.write_ahead(
            len(items), last, body, chunk_id, len(items) if resent else 0, marks
        )
        await self.start(Chunk(cid, ids, positions, encoded))

    async def resend(self, items: list[Item], chunk_id: int) -> None:
        """Send again rows without an outcome, in place of chunk ``chunk_id`` (a lost task,
        rows a task did not return, orphans)."""
        size = self.config.chunk_size
        for start in range(0, len(items), size):
            part = items[start : start + size]
            await self.dispatch(part, chunk_id=chunk_id if start == 0 else None, resent=True)

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
            self.tasks.pop(task.task_id, None)
            # Not committed: a resume treats an open task the same way (closed, then watched).
            self.book.watch(task.task_id, self.description(task.token))

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
        opened: list[changes.Change] | None = None,
    ) -> None:
        """Record an accepted write (and, with ``opened``, the task it created: one
        transaction)."""
        assert task.task_id is not None
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
        counters = {"submitted": accepted}
        if opened:
            counters["tasks"] = 1
        await self.journal.commit(
            rejects=rejects,
            settle=True,
            by_job=self._submitted(chunk, reasons),
            ops=[
                *(opened or ()),
                changes.chunk_accepted(chunk.chunk_id, task.task_id, accepted),
                changes.task_expiry(task.task_id, expiry.timestamp() if expiry else None),
            ],
            counters=counters,
        )

    async def _reject_chunk(self, chunk: Chunk, message: str) -> None:
        reasons = dict.fromkeys(chunk.ids, message)
        rejects = self._reject_rows(chunk, reasons, STAGE_SERVER)
        await self.journal.commit(
            rejects=rejects, settle=True, ops=[changes.chunk_state(chunk.chunk_id, "resolved")]
        )

    async def _orphan(self, chunk: Chunk) -> None:
        assert chunk.task_id is not None
        await self.journal.commit(ops=[changes.chunk_state(chunk.chunk_id, "orphan")])
        self.book.orphan(chunk.task_id, chunk.chunk_id)

    def _fatal(self, err: exc.FashiontagError) -> FatalRunError:
        return refused(err)

    async def _create(self, task: OpenTask, chunk: Chunk) -> bool:
        """POST the chunk as a new task. True when the chunk is settled."""
        await self.journal.commit(ops=[changes.chunk_token(chunk.chunk_id, task.token)])
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
    ) -> list[changes.Change]:
        """Attach a created task; the rows recording it (committed before any other write
        goes to the task: :attr:`OpenTask.created` is set after)."""
        task.task_id = task_id
        task.expires = self._expiry(expiry)
        self.tasks[task_id] = task
        stamp = expiry.timestamp() if expiry else None
        return changes.task_opened(task_id, task.seq, task.token, stamp, self._seq)

    async def _opened(self, task: OpenTask, task_id: str, expiry: datetime | None) -> None:
        await self.journal.commit(
            ops=self._opened_ops(task, task_id, expiry), counters={"tasks": 1}
        )
        task.created.set()

    async def find_task(self, token: str) -> Task | None:
        """The task whose description carries ``token`` (after an ambiguous create)."""
        wanted = self.description(token)
        tasks = await self.budget.call("list tasks", self.client.all_tasks)
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
                await self.journal.commit(ops=[changes.chunk_task(chunk.chunk_id, task.task_id)])
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
                # Refused, so not applied: the chunk belongs to no task until it is sent again
                # (were the task found lost meanwhile, its rows must not be re-sent twice).
                chunk.task_id = None
                await self.journal.commit(ops=[changes.chunk_detached(chunk.chunk_id)])
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
