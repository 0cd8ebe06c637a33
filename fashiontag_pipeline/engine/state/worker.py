"""The state thread: one long-lived thread that runs every state and sink call in turn.

:meth:`StateThread.run` hands a call to the thread through a queue and awaits its result on
an event-loop future resolved with ``call_soon_threadsafe``; the loop never blocks on disk.
A thread of its own rather than ``anyio.to_thread.run_sync`` with a capacity limiter of one:
that costs a limiter acquire and release, a worker lookup and a task-level cancel scope per
call: 35-39 us of process CPU a hand-off against 21-22 here (5,000 no-op calls under
uvloop, both threads counted); a run of 200,000 rows makes ~870.

Like ``to_thread.run_sync`` it is not cancellable: a caller cancelled while its call runs
still waits for it (the call commits or not as a whole, and the caller learns which), then
the cancellation is delivered at its next checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, TypeVar

import anyio

from ... import _exceptions as exc

__all__ = ["StateThread"]

T = TypeVar("T")

_Call = tuple[Callable[..., Any], tuple[Any, ...], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


def _resolve(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class StateThread:
    """Runs calls one at a time in its own thread, started on the first call, stopped by
    :meth:`stop` (after the calls already handed to it)."""

    def __init__(self, name: str = "fashiontag-state") -> None:
        self._name = name
        self._queue: SimpleQueue[_Call | None] = SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._lock = threading.Lock()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the thread; its exception, if any, is raised here."""
        if self._stopped:
            raise exc.StateError("the state is closed")
        if self._thread is None:
            self._start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put((fn, args, loop, future))
        with anyio.CancelScope(shield=True):
            result = await future
        return result

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                thread = threading.Thread(target=self._work, name=self._name, daemon=True)
                thread.start()
                self._thread = thread

    def _work(self) -> None:
        queue = self._queue
        while True:
            call = queue.get()
            if call is None:
                return
            fn, args, loop, future = call
            result: Any = None
            error: BaseException | None = None
            try:
                result = fn(*args)
            except BaseException as err:  # handed to the caller, whatever it is
                error = err
            # A closed loop (RuntimeError): nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve, future, result, error)
            del call, fn, args, result, error

    def stop(self) -> None:
        """Let the calls already queued run, then end the thread and wait for it (from any
        thread but its own; idempotent)."""
        with self._lock:
            self._stopped = True
            thread, self._thread = self._thread, None
        if thread is None:
            return
        self._queue.put(None)
        if thread is not threading.current_thread():
            thread.join()
