"""How an :class:`~.engine.Engine` ends: the end-of-life reconciliation, and the waits that
end with the engine.

The stages run in a task group of their own inside the caller's ``async with`` block
(:meth:`Engine._life`): the normal end (closed, nothing in flight) cancels the stages and sets
:attr:`Engine.ended`, never the caller's block, whose code after :meth:`Engine.outcome` runs.
An end from outside (a drain or an abort of its :class:`~.flow.RunControl`) cancels the block
as well: a daemon's waits for its manifests end with it, and resume on the next start.

The end itself (reconciling, closing the outputs and the state) is :func:`finish`-ed: it runs
to its end whatever cancels the caller meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from .. import _exceptions as exc
from .._models import format_time

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["cancel_when", "conclude", "end", "finish", "watch_control"]

logger = logging.getLogger("fashiontag_pipeline.engine")


async def cancel_when(event: anyio.Event, scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` once ``event`` is set (a wait that ends with the engine)."""
    await event.wait()
    scope.cancel()


async def finish(fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
    """Run ``fn(*args)`` to its end whatever cancels the caller meanwhile, then let that
    cancel go on (an end that must not be cut short: the state, its lock, the outputs).

    anyio's shielded scopes hold off anyio's own cancellation only. asyncio's (a host's
    ``task.cancel()`` or ``asyncio.timeout``, a shutdown cancelling its tasks until they end)
    cut such an end short at its next await, or kept a thread's close from starting: the state
    file stayed locked for the process's life ("in use by another run" to the next run in it).
    ``fn`` runs in a task of its own, which the caller waits for through every cancel."""
    task = asyncio.ensure_future(fn(*args))
    cancelled: asyncio.CancelledError | None = None
    with anyio.CancelScope(shield=True):  # (no anyio cancel delivered meanwhile)
        while True:
            try:
                await asyncio.shield(task)
                break
            except asyncio.CancelledError as err:
                if task.done():
                    raise
                cancelled = err
    if cancelled is not None:
        raise cancelled


async def end(engine: Engine, failed: bool) -> None:
    """An engine's end (see :func:`conclude`), then its outputs and state closed."""
    try:
        await conclude(engine, failed=failed)
    finally:
        await anyio.to_thread.run_sync(engine.journal.close)


async def conclude(engine: Engine, *, failed: bool = False) -> None:
    """The end-of-life check (:meth:`StateDB.reconcile`): complete only when every row taken
    in has an outcome and nothing is in flight; then the state records it (the same manifests
    again: nothing to do)."""
    journal = engine.journal
    db = journal.db
    try:
        engine.reconciliation = reconciliation = await journal.run(db.reconcile)
    except exc.StateError as err:  # the store went away (a database restart): one line
        logger.error("the state store cannot be reconciled: %s", err)
        engine.complete = False
        return
    except Exception:
        logger.exception("the state store cannot be reconciled")
        engine.complete = False
        return
    if failed:
        # A stage died (a state write refused, a bug): rows it had not yet taken in are in no
        # count, so the counts may agree while the manifests are not done. Never recorded
        # complete: the same command resumes from the state.
        engine.complete = False
    ended = engine.complete and not engine.interrupted
    done = ended and reconciliation.complete
    if ended and not done:
        logger.error(
            "run incomplete: %d rows have no outcome (%s)",
            reconciliation.unsettled,
            "; ".join(reconciliation.in_flight) or "counts differ",
        )
    engine.complete = done
    if done:
        await journal.run(db.mark_complete, format_time(datetime.now(UTC)))


async def watch_control(engine: Engine, tg: anyio.abc.TaskGroup) -> None:
    """A stop from outside (:class:`~.flow.RunControl`): no more reads or sends; the stages
    end once the writes in flight are answered (a drain), or at once (an abort)."""
    await engine.control.stopping.wait()
    engine.interrupted = True
    engine.source.cancel()
    engine.writer.stop()
    engine.single.stop()
    async with anyio.create_task_group() as inner:

        async def until_idle() -> None:
            await engine.writer.idle.wait()
            await engine.single.idle.wait()
            inner.cancel_scope.cancel()

        inner.start_soon(until_idle)
        await engine.control.aborting.wait()
        inner.cancel_scope.cancel()
    tg.cancel_scope.cancel()
