"""The daemon's log lines leave the event loop through a bounded queue to a writer thread.

A write to stderr blocks while its reader does not read (a log shipper whose backend is down,
``daemon 2>&1 | tool`` with the tool paused: a full 64 KiB pipe). Written from the event loop,
that stopped the daemon's work and its ``/livez``, ``/readyz`` and ``/metrics`` with it: a
supervisor could not even tell why. :class:`LineWriter` formats each record where it is
logged (so redaction and the record's arguments are as they were then) and queues the line;
a thread of its own writes the lines, in order and whole. When the queue is full a line is
dropped and counted, never waited for (:data:`DROPPED_LINES`, the metric
``fashiontag_log_lines_dropped_total``), and once there is room again one line says how many
were dropped, where they were. At exit (:meth:`LineWriter.flush`, called by ``logging``'s
own shutdown) every queued line is written, for at most :data:`EXIT_DEADLINE` seconds when
the reader stays stalled: a stopping daemon is not kept alive by its log reader.

The thread writes to the stream's descriptor itself (``os.write``): a thread blocked inside
``sys.stderr``'s buffer would hold its lock, and the interpreter aborts ("could not acquire
lock for <stderr> at interpreter shutdown") when it flushes stderr at exit. A write that
fails for good (a broken pipe, a full disk) ends the writes, as :mod:`..cli.streams` does
for the rest of stderr.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import threading
import time
from collections.abc import Mapping
from typing import IO

__all__ = [
    "DROPPED_LINES",
    "EXIT_DEADLINE",
    "QUEUE_LINES",
    "QUEUE_LINES_VARIABLE",
    "DroppedLines",
    "LineWriter",
    "queue_lines",
]

#: Lines queued, at most, while the reader does not read (a few MiB of log lines).
QUEUE_LINES = 4096
#: The environment variable that sets another bound.
QUEUE_LINES_VARIABLE = "FASHIONTAG_LOG_QUEUE_LINES"
#: Seconds the queued lines have at exit, or at a flush, when the reader does not read.
EXIT_DEADLINE = 2.0
#: Seconds between two looks, while no line comes, for drops to report.
_IDLE = 0.25
#: Lines written with one system call, at most.
_BATCH = 256


def queue_lines(environ: Mapping[str, str] = os.environ) -> int:
    """The bound of the queue: :data:`QUEUE_LINES_VARIABLE` when set, else :data:`QUEUE_LINES`.
    Raises ValueError, saying so, for a value that is not a whole number of at least 1."""
    value = environ.get(QUEUE_LINES_VARIABLE, "").strip()
    if not value:
        return QUEUE_LINES
    try:
        lines = int(value)
    except ValueError:
        lines = 0
    if lines < 1:
        raise ValueError(f"{QUEUE_LINES_VARIABLE}={value!r}: give a whole number of at least 1")
    return lines


class DroppedLines:
    """Lines dropped by the process's writers since it started (the metric's value)."""

    def __init__(self) -> None:
        self.total = 0


#: The daemon's count (see :class:`LineWriter`).
DROPPED_LINES = DroppedLines()


class LineWriter(logging.Handler):
    """A handler queueing each formatted line for a thread that writes them to ``stream``
    (see the module docstring). ``capacity``: lines queued at most."""

    def __init__(
        self,
        stream: IO[str],
        *,
        capacity: int = QUEUE_LINES,
        deadline: float = EXIT_DEADLINE,
        dropped: DroppedLines = DROPPED_LINES,
    ) -> None:
        super().__init__()
        self._stream = stream
        self._fd: int | None = None
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()  # (what it holds goes first)
            self._fd = stream.fileno()
        self._deadline = deadline
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._capacity = capacity
        self._dropped = dropped
        #: Lines dropped since the last line saying so; lines queued; lines written.
        self._unsaid = 0
        self._queued = 0
        self._written = 0
        self._progress = threading.Condition()
        self._broken = False
        self._thread = threading.Thread(
            target=self._write_lines, name="fashiontag-log-writer", daemon=True
        )
        self._thread.start()

    # -- the logging side (any thread; emit runs under the handler's lock) ---------------

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:
            self.handleError(record)
            return
        if self._unsaid and self._room():
            self._put(self._said_dropped(self._unsaid))
            self._unsaid = 0
        if self._room():
            self._put(line)
        else:
            self._unsaid += 1
            self._dropped.total += 1

    def _room(self) -> bool:
        return self._queued - self._written < self._capacity

    def _put(self, line: str) -> None:
        with self._progress:
            self._queued += 1
        self._queue.put(line)

    def _said_dropped(self, lines: int) -> str:
        record = logging.LogRecord(
            "fashiontag_pipeline.daemon",
            logging.WARNING,
            __file__,
            0,
            "log lines dropped: stderr was not read",
            (),
            None,
        )
        record.lines = lines
        return self.format(record) + "\n"

    def flush(self, timeout: float | None = None) -> None:
        """Until every line queued so far is written, or ``timeout`` (default
        :data:`EXIT_DEADLINE`) seconds have passed; the lines dropped and not yet said are
        said last (the queue's bound aside: at exit no idle moment comes to say them)."""
        end = time.monotonic() + (self._deadline if timeout is None else timeout)
        self.acquire()  # (the lines dropped so far are said now: the process may end next)
        try:
            if self._unsaid:
                lines, self._unsaid = self._unsaid, 0
                self._put(self._said_dropped(lines))
        finally:
            self.release()
        with self._progress:
            target = self._queued
            while self._written < target and self._thread.is_alive():
                left = end - time.monotonic()
                if left <= 0:
                    return
                self._progress.wait(left)

    def close(self) -> None:
        # (No flush here: logging's shutdown flushes first, and a replaced handler's thread
        # writes what it holds before the end mark.)
        self._queue.put(None)
        super().close()

    # -- the writer thread ---------------------------------------------------------------

    def _write_lines(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=_IDLE)
            except queue.Empty:
                self._say_drops_when_idle()
                continue
            lines = [first]
            while first is not None and len(lines) < _BATCH:
                try:
                    lines.append(self._queue.get_nowait())
                except queue.Empty:
                    break
                if lines[-1] is None:
                    break
            text = "".join(line for line in lines if line is not None)
            self._write(text)
            with self._progress:
                self._written += sum(line is not None for line in lines)
                self._progress.notify_all()
            if lines[-1] is None:
                return

    def _say_drops_when_idle(self) -> None:
        """The lines dropped, said once nothing else is queued (else the next line logged
        says them, in their place). Not waited for: logging's shutdown holds the handler's
        lock while it flushes, and the lines it waits for are this thread's to write."""
        if not self._unsaid or self.lock is None or not self.lock.acquire(blocking=False):
            return
        try:
            if not self._unsaid or self._queued != self._written:
                return
            lines, self._unsaid = self._unsaid, 0
            self._put(self._said_dropped(lines))
        finally:
            self.release()

    def _write(self, text: str) -> None:
        if self._broken or not text:
            return
        try:
            if self._fd is None:
                self._stream.write(text)
                self._stream.flush()
                return
            data = memoryview(text.encode("utf-8", "backslashreplace"))
            while data:
                try:
                    data = data[os.write(self._fd, data) :]
                except BlockingIOError:  # (a non-blocking stderr: until it takes more)
                    select.select([], [self._fd], [], 1.0)
        except (OSError, ValueError):  # (a broken pipe, ENOSPC, EIO; closed)
            self._broken = True
