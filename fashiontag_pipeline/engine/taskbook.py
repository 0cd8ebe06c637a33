"""The book of tasks past the writer: each sealed task's entry (its state, its read offset, the
ids it holds), from sealed to drained (or expired, lost). The writer hands tasks over with
:meth:`TaskBook.watch`; the :class:`~.tracker.Tracker` moves them to done, the pagers read them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime

import anyio

from .idmatch import IdMatcher

__all__ = ["TaskBook", "TaskEntry"]


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
    #: The ids written to the task (read when its draining starts; None: unknown, a chunk of
    #: it was resolved): a result under any other id is none of ours.
    sent: set[str] | None = None
    #: Ids the service refused at write time (each has its reject already; read with
    #: :attr:`sent`, None until then): a result under one is left out.
    refused: frozenset[str] | None = None
    #: :attr:`sent` by the keys of ids a service changes (built when a result comes under an
    #: id never sent to the task).
    matcher: IdMatcher | None = None
    #: Ids whose results came without a tagging result object (``null``, text, a list), each
    #: with the start of what came (None: none such): the reject of such a row, once sent
    #: ``max_sends`` times, says so rather than "never returned".
    no_result: dict[str, str] | None = None
    #: Offsets of the pages that came short of new rows (read again when rows are missing).
    deficient: set[int] = field(default_factory=set)
    #: The service's own count of the task's results when it is short of the rows written
    #: (:attr:`total` is raised to those rows): a page past it refused is a page past the end.
    counted: int | None = None
    #: The service's own count of the task's results when it is past the rows written
    #: (:attr:`total` is cut to those rows): pages past them holding rows of the task (a write
    #: applied twice) are read on as far as it.
    claimed: int | None = None
    #: When the tracker saw the task done (monotonic seconds; None: before this process).
    done_at: float | None = None
    #: The description the task was created with (it carries the run token): a task of that
    #: id that says otherwise is not ours (a service that restarted and reused the id).
    description: str | None = None
    advanced: anyio.Event = field(default_factory=anyio.Event)
    #: A results page of the task was read (by this process), and when one was first refused
    #: past its attempts (monotonic seconds): a service whose status says done a moment
    #: before its pages can be read refuses them meanwhile (see ``fetch.NOT_READY_GRACE``).
    readable: bool = False
    refused_at: float | None = None
    #: The state of a task the service ended without making it done (``TASK_FAILED``,
    #: ``CANCELLED``): its pages are read like a done task's, any refusal of one ends the
    #: reading, and the rows without a result are sent again.
    ended: str | None = None
    #: Seen done before this process (a resume): whether the service ended it is asked for
    #: only if its read-again window would be waited for (:meth:`PageRows._ask_ended`).
    ended_unknown: bool = False
    #: When this process sealed the task it created (monotonic seconds; None: a task of an
    #: interrupted run): a service may not know a task for a moment after its create was
    #: answered (an eventually consistent store), so a 404 within ``list_lag`` of it is no
    #: loss (see :meth:`young`).
    sealed_at: float | None = None

    def young(self, lag: float) -> bool:
        """Whether this process sealed the task less than ``lag`` seconds ago."""
        return self.sealed_at is not None and time.monotonic() - self.sealed_at < lag

    def advance(self, offset: int) -> None:
        """Record that pages up to ``offset`` are committed; wake the next page."""
        self.next_offset = offset
        event, self.advanced = self.advanced, anyio.Event()
        event.set()


class TaskBook:
    """Every task past the writer until it is drained: sealed -> done -> drained (or
    expired/lost). The writer hands tasks over with :meth:`watch` and chunks of unknown fate
    with :meth:`orphan`; the pagers :meth:`retire` drained tasks (a long-lived engine keeps
    only tasks in flight)."""

    def __init__(self) -> None:
        self.entries: dict[str, TaskEntry] = {}
        self.changed = anyio.Event()
        #: Tasks added so far (the tracker polls early for a new one).
        self.added = 0
        self.orphans_pending = 0
        #: Orphan chunks of tasks not handed over yet.
        self.orphans_by_task: dict[str, set[int]] = {}

    def watch(self, task_id: str, description: str, *, created: bool = False) -> None:
        """A sealed task: the tracker watches it from now on (``created``: by this process,
        just now). A task already watched keeps its entry (a new one would read its results
        again from the start, with no memory of the ids it wrote)."""
        orphans = self.orphans_by_task.pop(task_id, set())
        entry = self.entries.get(task_id)
        if entry is not None:
            entry.orphans |= orphans
            return
        sealed_at = time.monotonic() if created else None
        self.add(TaskEntry(task_id, orphans=orphans, description=description, sealed_at=sealed_at))

    def orphan(self, task_id: str, chunk_id: int) -> None:
        """A chunk of unknown fate whose task no longer takes writes: settled once the
        task's results are read."""
        self.orphans_pending += 1
        entry = self.entries.get(task_id)
        if entry is not None:
            entry.orphans.add(chunk_id)
        else:
            self.orphans_by_task.setdefault(task_id, set()).add(chunk_id)

    def take_orphans(self, task_id: str) -> set[int]:
        """The orphan chunks noted for a task before it is added (a resume)."""
        return self.orphans_by_task.pop(task_id, set())

    def retire(self, entry: TaskEntry) -> None:
        """A drained task leaves the book."""
        entry.state = "drained"
        self.entries.pop(entry.task_id, None)
        self.poke()

    def poke(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    def add(self, entry: TaskEntry) -> None:
        self.entries[entry.task_id] = entry
        self.added += 1
        self.poke()

    def sealed(self) -> list[TaskEntry]:
        return [e for e in self.entries.values() if e.state == "sealed"]

    def unfinished(self) -> int:
        """Tasks not yet drained (sealed, done, being settled after a loss or expiry)."""
        return sum(1 for e in self.entries.values() if e.state != "drained")
