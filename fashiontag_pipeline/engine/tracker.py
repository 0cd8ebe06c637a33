"""Tracker: watches sealed tasks until they are done, with as few requests as possible.

One ``GET /bulk`` (list) covers every live task; a task missing from the list is asked for by
its status (fallback). The poll interval adapts: back to ``poll_min`` whenever a poll found a
task done, growing by 1.6x (up to ``poll_max``) while nothing changes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

import anyio

from .. import _exceptions as exc
from .._client import TaggerClient
from .._models import Task
from .config import EngineConfig
from .flow import FatalRunError, RetryBudget
from .state import Journal

__all__ = ["TaskBook", "TaskEntry", "Tracker"]


@dataclass(eq=False)
class TaskEntry:
    """A sealed task on its way to drained."""

    task_id: str
    state: str = "sealed"
    total: int = 0
    next_offset: int = 0
    results_expire_at: datetime | None = None
    orphans: set[int] = field(default_factory=set)
    seen: set[str] | None = None
    advanced: anyio.Event = field(default_factory=anyio.Event)

    def advance(self, offset: int) -> None:
        """Record that pages up to ``offset`` are committed; wake the next page."""
        self.next_offset = offset
        event, self.advanced = self.advanced, anyio.Event()
        event.set()


class TaskBook:
    """Every task of the run past the writer: sealed -> done -> drained (or expired/lost)."""

    def __init__(self) -> None:
        self.entries: dict[str, TaskEntry] = {}
        self.changed = anyio.Event()
        self.orphans_pending = 0

    def poke(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    def add(self, entry: TaskEntry) -> None:
        self.entries[entry.task_id] = entry
        self.poke()

    def sealed(self) -> list[TaskEntry]:
        return [e for e in self.entries.values() if e.state == "sealed"]

    def unfinished(self) -> int:
        return sum(1 for e in self.entries.values() if e.state in ("sealed", "done"))


class Tracker:
    """Moves sealed tasks to done and hands them to the pagers."""

    def __init__(
        self,
        *,
        client: TaggerClient,
        journal: Journal,
        book: TaskBook,
        config: EngineConfig,
        budget: RetryBudget,
        on_done: Callable[[TaskEntry], Awaitable[None]],
        finished: Callable[[], bool],
    ) -> None:
        self.client = client
        self.journal = journal
        self.book = book
        self.config = config
        self.budget = budget
        self.on_done = on_done
        self.finished = finished
        self.polls = 0

    async def run(self) -> None:
        interval = self.config.poll_min
        while True:
            sealed = self.book.sealed()
            if not sealed:
                if self.finished():
                    return
                changed = self.book.changed
                with anyio.move_on_after(self.config.poll_max):
                    await changed.wait()
                continue
            progressed = await self.poll(sealed)
            interval = (
                self.config.poll_min if progressed else min(interval * 1.6, self.config.poll_max)
            )
            await anyio.sleep(interval)

    async def _list(self) -> dict[str, Task]:
        while True:
            try:
                tasks = await self.client.list_tasks()
            except (exc.TransportError, exc.RateLimitedError, exc.ServerError) as err:
                await self.budget.failed(err, "list tasks")
                continue
            except (exc.AuthenticationError, exc.PermissionDeniedError) as err:
                raise FatalRunError(f"the service refused the run: {err}") from err
            self.budget.ok()
            self.polls += 1
            return {t.task_id: t for t in tasks}

    async def _status(self, task_id: str) -> Task | None:
        while True:
            try:
                return await self.client.task_status(task_id)
            except exc.TaskNotFoundError:
                return None
            except (exc.TransportError, exc.RateLimitedError, exc.ServerError) as err:
                await self.budget.failed(err, f"status of task {task_id}")

    async def poll(self, sealed: list[TaskEntry]) -> bool:
        """One round: True when some task became done."""
        listed = await self._list()
        progressed = False
        for entry in sealed:
            task = listed.get(entry.task_id)
            if task is None:
                task = await self._status(entry.task_id)
            if task is None:
                entry.state = "lost"
                await self.journal.commit(
                    ops=[("UPDATE tasks SET state='lost' WHERE task_id=?", (entry.task_id,))]
                )
                continue
            if not task.done:
                continue
            entry.state = "done"
            entry.total = task.count.total
            entry.results_expire_at = task.results_expire_at
            stamp = entry.results_expire_at.timestamp() if entry.results_expire_at else None
            await self.journal.commit(
                ops=[
                    (
                        "UPDATE tasks SET state='done', total=?, results_expire_at=?"
                        " WHERE task_id=?",
                        (entry.total, stamp, entry.task_id),
                    )
                ]
            )
            progressed = True
            await self.on_done(entry)
        return progressed
