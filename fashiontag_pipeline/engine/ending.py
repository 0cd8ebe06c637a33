"""How an :class:`~.engine.Engine` ends: the end-of-life reconciliation, and the waits that
end with the engine.

The stages run in a task group of their own inside the caller's ``async with`` block
(:meth:`Engine._life`): the normal end (closed, nothing in flight) cancels the stages and sets
:attr:`Engine.ended`, never the caller's block, whose code after :meth:`Engine.outcome` runs.
An end from outside (a drain or an abort of its :class:`~.flow.RunControl`) cancels the block
as well: a daemon's waits for its manifests end with it, and resume on the next start.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from .. import _exceptions as exc
from .._models import format_time

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["cancel_when", "conclude", "watch_control"]

logger = logging.getLogger("fashiontag_pipeline.engine")


async def cancel_when(event: anyio.Event, scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` once ``event`` is set (a wait that ends with the engine)."""
    await event.wait()
    scope.cancel()


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
