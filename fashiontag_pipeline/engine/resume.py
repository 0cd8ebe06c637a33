"""Resume: what an interrupted run left in flight, loaded back into the stages.

Tasks still open are closed (only the chunks of unknown fate that went to them are sent to them
again), done tasks go to the pagers, lost tasks whose rows were not all sent again are settled,
and chunks written ahead but never answered are sent again (to their task when it still takes
writes, else as orphans settled from their task's results).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from .._config import Timeout
from .._connect import deadline
from .._models import MAX_PAGE_SIZE
from .policy import Chunk, chunk_of, decode_chunk
from .state import changes
from .tracker import TaskEntry

if TYPE_CHECKING:
    from .._models import Task
    from .engine import Engine
    from .rules import Item

__all__ = ["late_look", "reattach", "reattach_unless_stopped"]

logger = logging.getLogger("fashiontag_pipeline.engine")

#: At most this long (seconds) besides ``list_lag`` for a long-lived engine's look (the SQLite
#: daemon's, whose claims wait for it; it sent systemd's READY=1 only after it too, and past
#: ``TimeoutStartSec`` (60 s in the unit we ship, 90 s by default) systemd killed the daemon
#: and started it again, over and over, each start waiting as long).
START_LOOK_CAP = 30.0


async def reattach_unless_stopped(
    run: Engine, stopping: anyio.Event, tg: anyio.abc.TaskGroup
) -> list[Chunk] | None:
    """:func:`reattach`, or None when ``stopping`` is set first (SIGTERM, Ctrl-C).

    Reattaching may wait on the service (an outage, under the give-up budget), so a stop must
    end it as it ends any other wait. The watcher runs in ``tg`` (the engine's task group) and
    ends with the reattach."""
    found: list[Chunk] | None = None
    watching = anyio.CancelScope()
    with anyio.CancelScope() as reattaching:

        async def cancel_on_stop() -> None:
            with watching:
                await stopping.wait()
                reattaching.cancel()

        tg.start_soon(cancel_on_stop)
        try:
            found = await reattach(run)
        finally:
            watching.cancel()
    return found


async def reattach(run: Engine) -> list[Chunk]:
    """Load an interrupted run: tasks to track or drain, chunks of unknown fate."""

    db = run.journal.db
    tasks = await run.journal.run(db.resume_tasks)
    chunks = await run.journal.run(db.resume_chunks)
    tokens = {c[3] for c in chunks if c[2] is None and c[3] is not None}
    if not run.client.server_clock.known and (tokens or any(t[3] == "open" for t in tasks)):
        # Open tasks' expiry times are in the service's clock, and so is the age of a create
        # of unknown fate once our clock was stepped (:func:`late_look`): learn its offset.
        await run.budget.call("list tasks", run.client.list_tasks)
    now_wall = time.time() + run.client.server_clock.correction
    pending: list[Chunk] = []
    lost = {t[0] for t in tasks if t[3] == "lost"}
    writable = {t[0] for t in tasks if t[3] == "open"}
    resumed = {t[0] for t in tasks}
    #: Tasks finished with (drained, expired) that still have a chunk of unknown fate.
    settle_only: set[str] = set()
    # Creates of unknown fate (recorded by their token only): one look for all of them, so
    # the task list's lag is waited for once, not once per chunk. A pending one may have been
    # on its way when the run died, and a service may apply it as late as a request may go
    # unanswered: looked for until then besides (:func:`late_look`; a stop ends it).
    run.writer.tokens_taken(c[3] for c in chunks if c[3] is not None)
    found_by_token: dict[str, Task] = {}
    if tokens:
        late = late_look(run, chunks, db.wall(), shared=db.shared_clock)
        if late > 0:
            # A wait a user would take for a hang is said at warning level (the default).
            (logger.warning if run.config.list_lag + late >= 10 else logger.info)(
                "a create may have been on its way when the run stopped: its task is looked"
                " for in the task list for up to %.0f s (list_lag, and the client's request"
                " deadline from when it was sent) before its rows are created again",
                run.config.list_lag + late,
            )
        found_by_token = await run.writer.find_tasks(tokens, late)
    # A listed task the state holds under another create already (a service that merged two
    # creates into one task, the run stopped at it): not adopted twice, whose results could
    # not be read exactly once; the create's rows are sent again. Every task the state knows
    # counts, a lost one settled too (not among ``resumed``): adopted, its pages were read as
    # the create's and gave the other create's rows a second line.
    # A task the state holds under the chunk's own token is that create's task, recorded
    # (adopted after a lost answer) before the kill caught the chunk's own commit: the chunk
    # goes to it as before, and is not sent again (its rows are in it: billed twice).

    def held_tokens() -> dict[str, str | None]:
        held: dict[str, str | None] = {}
        for t in found_by_token.values():
            row = db.task_row(t.task_id)
            if row is not None:
                held[t.task_id] = row[2]
        return held

    held = await run.journal.run(held_tokens)
    found_by_token = {
        k: t for k, t in found_by_token.items() if t.task_id not in held or held[t.task_id] == k
    }
    adopted: set[str] = set()
    for chunk_id, state, task_id, token, body, _, _ in chunks:
        if state == "pending" and task_id in lost:
            continue  # settled with its lost task (re-sent once, by the pagers)
        if task_id is None and token is not None:
            found = found_by_token.get(token)
            if found is not None and found.task_id in held:
                task_id = found.task_id  # recorded already, as open or not (see held)
            elif found is not None:
                if token not in adopted:
                    adopted.add(token)
                    await run.writer.adopt(token, found)
                task_id = found.task_id
                writable.add(task_id)
                resumed.add(task_id)
            if found is not None and state == "pending":
                # Its create was applied (the task is listed under its token): its rows are
                # in the task and count as submitted; settled from the task's results.
                chunk = chunk_of(chunk_id, body)
                chunk.task_id = task_id
                await run.writer.record_applied_create(chunk)
                state = "orphan"
        if state == "pending" and task_id is not None and task_id not in writable:
            # Its write was in flight to a task that takes no more writes: an orphan, settled
            # from that task's results. Decided here, before any task is read, so the chunk
            # is attached to its task before the pagers could finish with it.
            await run.journal.commit(ops=[changes.chunk_orphan(chunk_id, task_id)])
            state = "orphan"
        if state == "orphan" and task_id is None:
            # An orphan of a create whose task cannot be found (recorded by token only, by a
            # version that did not record its task): settled against the outputs themselves.
            await _settle_taskless(run, chunk_id, body)
            continue
        if state == "orphan":
            run.book.orphan(task_id, chunk_id)
            if task_id not in resumed:
                settle_only.add(task_id)
            continue
        chunk = chunk_of(chunk_id, body)
        if task_id is not None:
            chunk.fate_unknown = True
            chunk.task_id = task_id
        pending.append(chunk)
    for task_id in sorted(settle_only):
        # A task finished with: its results are all written (or expired), so an entry read to
        # its end settles the chunk against them (ids without a line are sent again).
        row = await run.journal.run(db.task_row, task_id)
        if row is None:
            continue
        tasks.append((*row[:3], "done", *row[4:6], row[6], row[6]))
    for task_id, seq, token, state, expires_at, results_at, total, offset in tasks:
        if state == "open":
            remaining = (expires_at or now_wall) - now_wall
            run.writer.resume_open(task_id, seq, token, remaining)
        elif state == "sealed":
            run.book.watch(task_id, run.writer.description(token))
        elif state in ("done", "lost"):
            # The pages an earlier process read may have come short of rows (a results store
            # that lags the status, the process killed while it waited for them): they are
            # read again if rows are missing once the rest is in, for ``read_again_window``
            # from now (this process sees the task done now), unless its status says the
            # service ended it (failed, cancelled: not stored, asked for then).
            entry = TaskEntry(
                task_id,
                state=state,
                total=total,
                next_offset=offset,
                results_expire_at=datetime.fromtimestamp(results_at, UTC) if results_at else None,
                orphans=run.book.take_orphans(task_id),
                description=run.writer.description(token),
                deficient=set(range(0, min(offset, total), MAX_PAGE_SIZE)),
                done_at=time.monotonic() if state == "done" else None,
                ended_unknown=state == "done",
            )
            run.book.add(entry)
            await run.pagers.add(entry)
    return pending


def late_look(
    run: Engine, chunks: Sequence[tuple[Any, ...]], now: float, *, shared: bool = False
) -> float:
    """Seconds the resume's look for creates of unknown fate (``chunks`` as
    :meth:`~.state.StateStore.resume_chunks` gives them) lasts besides ``list_lag``: at most
    the client's request deadline (``total``, else ``connect + read``; 30 s at most in a
    daemon, :data:`START_LOOK_CAP`), until that long after the latest create written ahead (or
    sent again) and never answered: a create sent then may be applied until then, and listed
    ``list_lag`` later. Negative (down to ``-list_lag``) when every such create was sent long
    enough ago (one look at the list). A chunk's time unknown (a state of an earlier version):
    the whole deadline. 0 for a token of an applied create (``list_lag``, as before).

    A create's age is the lesser of our clock's and the service's (``now`` corrected by the
    offset its ``Date`` shows): our clock stepped forward between the kill and the resume (an
    NTP step, a VM resumed) made a create sent a second before look an hour old, and a lagging
    list given one look missed it (its rows created again, billed twice). The offset's lower
    bound, not the write deadlines' upper one (``Date`` has whole seconds: up to 1 s older).
    ``shared``: ``now`` and the chunks' times are a clock every machine of the state reads
    alike (the database's: :meth:`~.state.StateStore.wall`), which no step of ours moves (our
    clock and another host's may differ by hours). The age is still the lesser of that and
    the service's: an older build wrote its host's clock there, which a database's clock an
    hour ahead would have taken for an hour old (its rows created again, billed twice).

    Those rules are for a chunk of an older build. This one's ``service_at`` is its time in
    the service's clock, judged by the service's clock now (its lower bound, carried by our
    monotonic clock: :meth:`~.._clock.ServerClock.ahead_of_monotonic`): our clock behind the
    service's when the create was written ahead, then corrected before the resume (an NTP
    step at boot after a crash), made it look as old as the step by our clock and the
    service's alike (they agreed by then): one look, its rows created again, billed twice.
    ``service_at`` -1 (no ``Date`` seen before it was written): the whole deadline, but for
    a ``shared`` clock (the database's, which no step of a host moves: its ``written_at``
    judged as above); either clock unknown now (a service with no ``Date``): the rules above.
    The look is the longer of the service's clock's and the rules above: an older build that
    sent the create again (mixed builds on a state: a rollback, a rolling upgrade) moved
    ``written_at`` and left ``service_at`` an hour old, judged by which alone the create was
    one look old (its rows created again, billed twice); a step of either clock only
    lengthens it."""
    window = deadline(run.client.timeout) or deadline(Timeout()) or 0.0  # (none: default)
    clock = run.client.server_clock
    low = clock.low  # (the service's clock less ours, its lower bound)
    if not shared:
        aged = now + min(0.0, low or 0.0)
    else:  # (the service's clock itself: ours behind it would make every look the longest)
        aged = now if low is None else min(now, time.time() + low)
    ahead = clock.ahead_of_monotonic(latest=False)
    service_now = None if ahead is None else time.monotonic() + ahead
    late: float | None = None
    for _, state, task_id, token, _, written_at, service_at in chunks:
        if task_id is not None or token is None:
            continue
        if state != "pending":
            need = 0.0
        elif written_at is None or written_at > now:  # (unknown, or the clock set back)
            need = window
        else:
            need = max(-run.config.list_lag, min(window, written_at + window - aged))
        if state == "pending" and service_at is not None and service_now is not None:
            if service_at >= 0:
                # The longer of the two clocks' looks: a time an older build left stale (its
                # create sent again, written_at moved and not service_at) or a step of either
                # clock can only lengthen it.
                age = service_at + window - service_now
                need = max(need, -run.config.list_lag, min(window, age))
            elif not shared:  # (no Date before it; a shared clock's written_at no host moves)
                need = window
        late = need if late is None else max(late, need)
    if late is not None and run.jobs.ids.namespaced:  # (a daemon: its start waits for it)
        late = min(late, START_LOOK_CAP)
    return late or 0.0


async def _settle_taskless(run: Engine, chunk_id: int, body: bytes) -> None:
    """Rows of a chunk whose task is unknown: those without a line in their job's outputs are
    sent again (in place of the chunk); the chunk is resolved."""
    jobs = run.jobs
    sends, chunk_rows = decode_chunk(body)
    rows = [(pos, r) for pos, r in chunk_rows if jobs.is_open(pos)]
    written = await run.journal.run(
        run.journal.written_among, {jobs.original(r.context.id) for _, r in rows}
    )
    missing: list[Item] = [
        (r.context.id, pos, r) for pos, r in rows if jobs.original(r.context.id) not in written
    ]
    if missing:
        # Sent or not (its task is unknown), these rows keep the send count they had.
        await run.writer.resend(missing, chunk_id, sends)
    else:
        await run.journal.commit(ops=changes.chunk_resolved(chunk_id))
