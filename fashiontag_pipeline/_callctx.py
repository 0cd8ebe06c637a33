"""What the caller of the client sets for the requests of its tasks (context variables, so
each engine, or each leased manifest of a daemon, has its own): a guard run before each write,
and the give-up rule that ends a request's retries. :class:`~._http.HttpExchange` reads them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import anyio

__all__ = ["GIVE_UP", "WRITES_STOPPED", "WRITE_AGAIN", "WRITE_GUARD"]

#: Called right before each write (a POST or PUT: the writes the service tags and bills) is
#: sent, by the task that sends it and the tasks it starts: it raises to keep the write from
#: going out. A daemon sets it for each leased manifest's engine: a daemon paused past its
#: lease (SIGSTOP, a stalled VM) and woken with a write on its way must not send rows that the
#: daemon which took the manifest over has sent already.
WRITE_GUARD: ContextVar[Callable[[], None] | None] = ContextVar(
    "fashiontag_write_guard", default=None
)

#: Seconds left before the caller gives up on a call that began at the given
#: ``time.monotonic()`` (below 0: given up; ``inf``: never): no retry of it starts once given
#: up (its last error is raised instead), and no wait for a retry (a Retry-After) runs past
#: that point. The engine sets it to its give-up budget, so that a service whose requests hang
#: is given up on about ``give_up_after`` seconds after it last answered, not after every
#: request's own ``max_attempts`` tries, each until its whole deadline (70 s x 6 at the
#: defaults).
GIVE_UP: ContextVar[Callable[[float], float] | None] = ContextVar(
    "fashiontag_give_up", default=None
)

#: Set once the caller starts no new write (a drain: Ctrl-C, SIGTERM, a daemon's shutdown): a
#: write refused (429, a connection that could not be made), so not applied, is not sent
#: again; its wait for a retry ends when this is set, and its last error is raised. The engine
#: sets it to its :class:`~.engine.flow.RunControl`'s ``stopping``.
WRITES_STOPPED: ContextVar[anyio.Event | None] = ContextVar(
    "fashiontag_writes_stopped", default=None
)

#: Awaited before the client sends a write again itself (its earlier try refused: a 429, a
#: connection that could not be made, so not applied), by the task that sends it. The engine
#: records there when a create goes out again: a resume looks for a create of unknown fate
#: until the request deadline has gone by since its last send, not its first.
WRITE_AGAIN: ContextVar[Callable[[], Awaitable[None]] | None] = ContextVar(
    "fashiontag_write_again", default=None
)
