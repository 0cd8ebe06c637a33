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

import contextlib
import time
from collections.abc import Callable, Iterable

import anyio
from anyio.abc import TaskGroup

from .._client import TaggerClient
from .._models import Task
from .answers import last_and_one
from .config import EngineConfig
from .flow import AIMDLimiter, FatalRunError, RetryBudget
from .idkeys import keyed
from .jobs import Jobs
from .policy import (
    MAX_CHUNK_BYTES,
    Chunk,
    ChunkCutter,
    OpenTask,
    WritePolicy,
    encode_body,
    encode_ids,
)
from .state import Journal
from .targets import TaskTargets
from .tracker import TaskBook
from .validate import Item
from .writes import STAGE_SERVER, job_marks

__all__ = ["STAGE_SERVER", "TaskWriter"]


def _queued(items: anyio.abc.ObjectReceiveStream[list[Item]]) -> bool:
    """Whether batches wait in ``items`` (an IDLE before them is stale: read since)."""
    statistics = getattr(items, "statistics", None)
    return statistics is not None and statistics().current_buffer_used > 0


class TaskWriter(TaskTargets):
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
        #: New task ids being checked against the state (see ``_check_new_id``).
        self._checking: set[str] = set()
        self.current: OpenTask | None = None
        self.intake_done = False
        #: The intake's last message was IDLE (nothing to read for now, nothing buffered): a
        #: task a send opens now (a chunk refused whole and split, a write re-targeted) is
        #: sealed once its writes are answered, as at the end of the input, for no input will
        #: come to seal it.
        self.input_idle = False
        #: Whether more input is about to come when there is none (a daemon's next manifest;
        #: None: never held), the open task held for it on IDLE, and when rows last came.
        self.more_input: Callable[[], str | None] | None = None
        self._held: OpenTask | None = None
        self._held_bounded = True  # (held for "settling" files only: see held_until)
        self._rows_at = 0.0
        self.active = 0
        self._stop_scope = anyio.CancelScope()
        self.idle = anyio.Event()
        self._seq = task_seq
        self._tg: TaskGroup | None = None
        #: Images assigned to tasks by this writer (sizes the next task).
        self.assigned = 0
        self.sent_requests = 0
        #: PUTs the service refused as expired (410) or unknown (404): 0 in a healthy run.
        self.refused_writes = 0
        #: Writes the service took (a row refused alone is its reject only once one was).
        self.writes_taken = 0

    # ------------------------------------------------------------------ helpers

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

    def tokens_taken(self, tokens: Iterable[str]) -> None:
        """Tokens an interrupted run recorded for creates whose tasks it never learnt: the
        next tokens follow them (``task_seq`` is only committed with a task, so a run killed
        while its first create was unanswered would give the same token to a new create,
        and the task list would then show two tasks under it)."""
        for token in tokens:
            with contextlib.suppress(ValueError):
                self._seq = max(self._seq, self.token_seq(token))

    async def adopt(self, token: str, found: Task) -> None:
        """A task created by an interrupted run's ambiguous create, found by its token: record
        it (closing, like every task of an interrupted run)."""
        seq = self.token_seq(token)
        now = self.clock()
        task = OpenTask(seq=seq, token=token, opened=now, expires=now, closing=True)
        await self._opened(task, found.task_id, found.expires_at)

    async def seal_idle(self) -> None:
        """Seal every closing task with no write in flight (after a resume's re-sends)."""
        for task in list(self.tasks.values()):
            if task.closing and task.inflight == 0:
                await self._maybe_seal(task)

    def stop(self) -> None:
        """Start no new write of taken-in rows (a drain): the writes in flight finish."""
        self._stop_scope.cancel()

    # ------------------------------------------------------------------ intake loop

    async def run(self, items: anyio.abc.ObjectReceiveStream[list[Item]]) -> None:
        """Consume validated batches until the stream ends; then seal what is open."""
        # Sends run in the run's task group (``_tg``), not one of the intake's own: rows sent
        # again (a forgotten task, rows a task did not return) may come after the intake ends.
        assert self._tg is not None, "the run's task group is not attached"
        async with items:
            self.active += 1
            try:
                with self._stop_scope:
                    await self._intake(items)
                if self._stop_scope.cancel_called:
                    # Stopped (a drain, SIGTERM): what is still queued is not sent. Those rows
                    # are taken in and not written ahead, so a resume sends them (it replays
                    # the rows between the chunked and the validated watermarks).
                    async for _ in items:
                        pass
            finally:
                self.active -= 1
                self.intake_done = True
                if self.current is not None:
                    await self._close(self.current)
                self._check_idle()

    async def _intake(self, items: anyio.abc.ObjectReceiveStream[list[Item]]) -> None:
        buffer: list[Item] = []
        cutter = ChunkCutter(self.policy.chunk_size, MAX_CHUNK_BYTES)
        since = 0.0
        eof = False
        while not eof:
            now = self.clock()
            due = min(
                self.policy.flush_at(len(buffer), since, self.current),
                self.policy.close_at(self.current, len(buffer)),
                self._held_until(),
            )
            timeout = max(0.0, due - now) if due != float("inf") else None
            batch: list[Item] | None = None
            with anyio.move_on_after(timeout):
                try:
                    batch = await items.receive()
                except anyio.EndOfStream:
                    eof = True
            idle = batch is not None and not batch and not _queued(items)
            if batch:
                self.input_idle = False
                self._held = None  # rows keep coming: the task rotates as usual
                self._rows_at = self.clock()
                if not buffer:
                    since = self._rows_at
                buffer.extend(batch)
                cutter.added(batch)
            while cut := cutter.cut(buffer):
                head, buffer = buffer[:cut], buffer[cut:]
                await self.dispatch(head)
                since = self.clock()
            now = self.clock()
            due_now = now >= self.policy.flush_at(len(buffer), since, self.current)
            if buffer and (eof or idle or due_now):
                await self.dispatch(buffer)
                buffer = []
                cutter.emptied()
            if idle:  # (noted once they are sent, if no rows came meanwhile: else the create
                # they waited for took its task for quiet, and the rows after made another)
                idle = self.input_idle = not _queued(items)
            cur = self.current
            if cur is not None and now >= self.policy.close_at(cur, len(buffer)):
                await self._close(cur)
            elif cur is not None and (idle or cur is self._held):
                await self._seal_when_idle(cur, now)

    async def _seal_when_idle(self, task: OpenTask, now: float) -> None:
        """Nothing more to read for now (IDLE): seal the open task, so the rows sent get
        results; while more input is about to come (:attr:`more_input`: a daemon's burst of
        manifests), once no rows came for ``linger_seconds`` or, with no manifest's rows in
        hand (files only settling: a trickle), at most 3 of them past its first rows
        (:meth:`~.policy.WritePolicy.held_until`; or once full, rotated, near its expiry), so
        that a burst shares tasks (a service caps a key's live tasks)."""
        more = self.more_input() if self.more_input is not None else None
        self._held_bounded = more != "ready"  # (rows in hand: a burst, not a trickle)
        if not more or now >= self.policy.held_until(task, self._rows_at, self._held_bounded):
            self._held = None
            await self._close(task)
        else:
            self._held = task

    def _held_until(self) -> float:
        """When the task held open on IDLE is to be sealed (inf: none is held)."""
        held = self._held
        if held is None or held is not self.current or held.closing:
            return float("inf")
        return self.policy.held_until(held, self._rows_at, self._held_bounded)

    async def dispatch(
        self,
        items: list[Item],
        *,
        chunk_id: int | None = None,
        resent: bool = False,
        sends: int = 0,
    ) -> None:
        """Write a chunk ahead (new rows move the chunked watermark) and start sending it.
        ``resent``: rows sent again (in place of chunk ``chunk_id`` when given), ``sends``
        times before (kept in the chunk's body)."""
        ids, positions, requests = (list(column) for column in zip(*items, strict=True))
        keys = keyed(ids)  # (two ids of one key: written ahead whole, then split to send)
        ids_json = encode_ids(ids)  # (stored beside the body; its fast path reads it too)
        body, encoded = encode_body(positions, requests, sends, ids, ids_json)
        last, one = last_and_one(positions)
        marks = [] if resent else job_marks(self.jobs, positions, last, one)
        assert self._tg is not None, "TaskWriter.run is not running"
        # The task is chosen before the chunk is written ahead, so the write-ahead records it
        # too (the token of the task it creates, or the task it is appended to): one state
        # transaction. In dispatch order (watermarks only grow), committed before it is sent.
        await self.slots.acquire()
        self.active += 1
        task: OpenTask | None = None
        create = False
        try:
            if len(keys) == len(ids):
                task, create = await self._target(len(items), keys)
            chunk = Chunk(0, ids, positions, encoded, sends=sends, one_source=one)
            if task is not None and not create:
                chunk.task_id = task.task_id
            chunk.chunk_id = await self.journal.write_ahead(
                len(items),
                last,
                body,
                chunk_id,
                len(items) if resent else 0,
                marks,
                token=task.token if task is not None and create else None,
                task_id=chunk.task_id,
                ids=ids_json,
                sent=ids,
                service=self.client.server_clock.ahead_of_monotonic(),
            )
        except BaseException:
            if task is not None:
                self._unassign(task, create)
            self.active -= 1
            self.slots.release()
            self._check_idle()
            raise
        self._tg.start_soon(self._send, chunk, task, create, create)
        if resent and task is not None and self.current is task:
            # Rows sent again come from no input batch: the intake loop may be waiting for
            # input with no deadline (a daemon with nothing to read), and nothing else would
            # seal this task. Sealed now (once its create is answered), it gets results.
            await self._close(task)

    async def resend(self, items: list[Item], chunk_id: int, sends: int) -> None:
        """Send again rows without an outcome, in place of chunk ``chunk_id`` (a lost task,
        rows a task did not return, orphans); they were sent ``sends`` times already."""
        size = self.policy.chunk_size
        for start in range(0, len(items), size):
            part = items[start : start + size]
            replaces = chunk_id if start == 0 else None
            await self.dispatch(part, chunk_id=replaces, resent=True, sends=sends)

    async def start(self, chunk: Chunk) -> None:
        """Send a chunk in the background once a write slot is free."""
        assert self._tg is not None, "TaskWriter.run is not running"
        await self.slots.acquire()
        self.active += 1
        keys = keyed(chunk.ids)
        if (chunk.fate_unknown and chunk.task_id is not None) or len(keys) < len(chunk.ids):
            self._tg.start_soon(self._send, chunk, None, False)  # (ids of one key: split there)
            return
        try:
            task, create = await self._target(len(chunk.ids), keys)
        except BaseException:
            self.active -= 1
            self.slots.release()
            raise
        self._tg.start_soon(self._send, chunk, task, create)

    async def _send_one(
        self, chunk: Chunk, task: OpenTask | None, create: bool, token_written: bool = False
    ) -> list[Chunk]:
        """Send ``chunk`` until it is settled (returns []) or split (returns its parts)."""
        while True:
            if task is None:
                if chunk.fate_unknown and chunk.task_id is not None:
                    task = self.tasks.get(chunk.task_id)
                    if task is None:
                        await self._orphan(chunk)
                        return []
                    task.inflight += 1
                    create = False
                else:
                    target = await self._chunk_target(chunk)
                    if isinstance(target, list):
                        return target  # (split: ids of one key)
                    task, create = target
            try:
                if create:
                    done = await self._create(task, chunk, token_written)
                else:
                    done = await self._append(task, chunk)
            finally:
                task.inflight -= 1
                quiet = self.intake_done or (self.input_idle and task is not self._held)
                if quiet and self.current is task and task.inflight == 0:
                    task.closing = True
                    self.current = None
                await self._maybe_seal(task)
            if isinstance(done, list):
                if not chunk.fate_unknown:  # refused whole, not applied: not the task's keys
                    task.keys -= keyed(chunk.ids)
                return done
            if done:
                return []
            task = None
            token_written = False

    def _check_idle(self) -> None:
        if self.intake_done and self.active == 0:
            self.idle.set()

    # ------------------------------------------------------------------ sending

    async def _send(
        self, chunk: Chunk, task: OpenTask | None, create: bool, token_written: bool = False
    ) -> None:
        """Send ``chunk`` (to ``task``, which it creates when ``create``; None: choose one)
        until it is settled, and the parts it was split into when it was refused whole, one
        after the other (in this write slot). ``token_written``: the write-ahead recorded
        ``task``'s token."""
        try:
            parts = await self._send_one(chunk, task, create, token_written)
            waiting: list[Chunk] = []
            while True:
                while parts:
                    waiting += [part for part in parts if part.waiting]
                    parts = [part for part in parts if not part.waiting]
                    if parts:
                        head = parts.pop(0)
                        head.hold = bool(waiting) and not self.writes_taken
                        parts[:0] = await self._send_one(head, None, False)
                if not waiting:
                    break
                if not self.writes_taken:
                    # Every part refused whole, and no write of the run taken: about no row.
                    raise FatalRunError(
                        f"the service refuses every write whole, even of one row"
                        f" ({waiting[0].waiting}): not an answer about any row (a front"
                        " end's body limit, a firewall?); stopped with the state saved: the"
                        " same command resumes once writes are taken"
                    )
                for part in waiting:  # a write was taken since: refused again, they split
                    part.waiting, part.hold = None, False
                parts, waiting = waiting, []
        finally:
            self.active -= 1
            self.slots.release()
            self._check_idle()
