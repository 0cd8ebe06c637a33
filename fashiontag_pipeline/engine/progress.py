"""Operator progress, on stderr, from the run's ``snapshot()`` counters.

* On a terminal: one live line that fits 80 columns (rich), with the percentage, the rows
  done out of the manifest's (estimated) size and an ETA when the size is known.
* Anywhere else (cron, a pipe, a log file): one plain line every ``interval`` seconds
  (``[engine] progress_seconds``, ``--progress-interval``), so a log shows the run moving.
* Both: a warning when retries or rate-limited answers pile up within one interval.

The size is known when every manifest is a regular file: rows are estimated from the share of
its bytes read so far (compressed bytes for a ``.gz``), exact once the input is read.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TextIO

import anyio

__all__ = ["PILE_UP", "ProgressLine", "show_progress"]

logger = logging.getLogger("fashiontag_pipeline.engine.progress")

#: Retries (or 429 answers) within one interval from which a warning is printed.
PILE_UP = 20
#: Refresh period of the terminal line.
TERMINAL_REFRESH = 0.5
LINE_WIDTH = 80

Snapshot = Mapping[str, int]


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


class ProgressLine:
    """Formats snapshots into progress text; keeps what it needs for rates and warnings."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._started = clock()
        self._done_at_start: int | None = None
        self._retries = 0
        self._rate_limited = 0

    @staticmethod
    def done(snap: Snapshot) -> int:
        """Rows with an outcome (a result, tagged or failed, or a reject)."""
        return snap.get("tagged", 0) + snap.get("rejected", 0)

    @staticmethod
    def total(snap: Snapshot) -> tuple[int, bool] | None:
        """(rows in the manifests, exact?) when their size is known, else None."""
        size, read, rows = snap.get("bytes_total", 0), snap.get("bytes_read", 0), snap["rows_read"]
        if size <= 0 or read <= 0 or rows <= 0:
            return None
        if read >= size:
            return rows, True
        return max(rows, round(rows * size / read)), False

    def estimate(self, snap: Snapshot) -> tuple[str, str, str] | None:
        """(percent, "done/total", ETA) when the size is known."""
        total = self.total(snap)
        if total is None:
            return None
        rows, exact = total
        done = self.done(snap)
        if self._done_at_start is None:
            self._done_at_start = done
        percent = min(100.0, 100.0 * done / rows) if rows else 100.0
        elapsed = self._clock() - self._started
        rate = (done - self._done_at_start) / elapsed if elapsed > 0 else 0.0
        eta = _duration((rows - done) / rate) if rate > 0 and rows > done else "?"
        return f"{percent:.1f}%", f"{done:,}/{'' if exact else '~'}{rows:,}", eta

    def terminal(self, snap: Snapshot, width: int = LINE_WIDTH) -> str:
        """The live line, at most ``width`` characters: the least useful parts go first."""
        elapsed = _duration(self._clock() - self._started)
        estimate = self.estimate(snap)
        parts: list[tuple[int, str]] = []  # (priority: lower is kept longer, text)
        if estimate is not None:
            percent, ratio, eta = estimate
            parts += [(0, percent), (1, ratio), (2, f"ETA {eta}")]
        else:
            parts.append((0, f"done {self.done(snap):,}"))
        parts += [
            (3, f"rej {snap.get('rejected', 0):,}"),
            (4, f"tasks {snap.get('tasks_live', 0)}"),
            (5, f"read {snap['rows_read']:,}"),
            (6, f"sent {snap.get('submitted', 0):,}"),
            (7, f"single {snap.get('single', 0):,}"),
            (8, f"pages {snap.get('pages', 0):,}"),
            (2, elapsed),
        ]
        while True:
            line = " ".join(text for _, text in parts)
            if len(line) <= width or len(parts) == 1:
                return line[:width]
            drop = max(range(len(parts)), key=lambda i: parts[i][0])
            parts.pop(drop)

    def plain(self, snap: Snapshot) -> str:
        """The periodic line for logs: every counter, then the estimate when known."""
        line = (
            f"progress {_duration(self._clock() - self._started)}: "
            f"read {snap['rows_read']:,}  submitted {snap.get('submitted', 0):,}  "
            f"tagged {snap.get('tagged', 0):,}  single {snap.get('single', 0):,}  "
            f"rejected {snap.get('rejected', 0):,}  pages {snap.get('pages', 0):,}  "
            f"tasks live {snap.get('tasks_live', 0)}  retries {snap.get('retries', 0):,}"
        )
        estimate = self.estimate(snap)
        if estimate is not None:
            percent, ratio, eta = estimate
            line += f"  ({percent}, {ratio} rows done, ETA {eta})"
        return line

    def pile_up(self, snap: Snapshot, interval: float) -> str | None:
        """A warning when retries or 429 answers grew by PILE_UP or more since the last call."""
        retries, limited = snap.get("retries", 0), snap.get("rate_limited", 0)
        new_retries, new_limited = retries - self._retries, limited - self._rate_limited
        self._retries, self._rate_limited = retries, limited
        if new_retries < PILE_UP and new_limited < PILE_UP:
            return None
        return (
            f"{new_retries:,} retries and {new_limited:,} rate-limited (429) answers in the "
            f"last {interval:.0f} s: the service is failing or pushing back; the run goes on "
            "(-v shows each retry)"
        )


@asynccontextmanager
async def show_progress(
    snapshot: Callable[[], Snapshot],
    *,
    interval: float = 30.0,
    file: TextIO | None = None,
    terminal: bool | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[None]:
    """Report progress from ``snapshot()`` while the body runs (see the module docstring).

    ``file`` defaults to stderr; ``terminal`` to whether ``file`` is one. Progress is for
    people: a host without stderr (``None``) shows none, and once a line cannot be written (a
    reader gone: a broken pipe; a full disk) no more are, and the run goes on."""
    out = file if file is not None else sys.stderr
    if out is None:
        yield
        return
    try:
        is_terminal = terminal if terminal is not None else out.isatty()
    except (OSError, ValueError, AttributeError):  # (closed; a host's stand-in, write only)
        is_terminal = False
    line = ProgressLine(clock=clock)
    if not is_terminal:
        async with anyio.create_task_group() as tg:

            async def report() -> None:
                read = True  # (someone reads the lines: none failed yet)
                while True:
                    await anyio.sleep(interval)
                    snap = snapshot()
                    if read:
                        read = _print(f"fashiontag: {line.plain(snap)}", out)
                    warning = line.pile_up(snap, interval)
                    if warning:
                        logger.warning("%s", warning)

            tg.start_soon(report)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
        return

    # rich (~50 ms of imports) only for the live line: a run in cron or a pipe never needs it.
    from rich.console import Console
    from rich.progress import Progress, TextColumn

    console = Console(file=out, force_terminal=True)
    width = min(console.width, LINE_WIDTH) - 1
    with Progress(TextColumn("{task.fields[line]}"), console=console, transient=False) as bar:
        task = bar.add_task("run", total=None, line=line.terminal(snapshot(), width))
        async with anyio.create_task_group() as tg:

            async def refresh() -> None:
                since_check = 0.0
                while True:
                    snap = snapshot()
                    bar.update(task, line=line.terminal(snap, width))
                    since_check += TERMINAL_REFRESH
                    if since_check >= interval:
                        since_check = 0.0
                        warning = line.pile_up(snap, interval)
                        if warning:
                            bar.console.print(f"warning: {warning}")
                    await anyio.sleep(TERMINAL_REFRESH)

            tg.start_soon(refresh)
            try:
                yield
            finally:
                bar.update(task, line=line.terminal(snapshot(), width))
                tg.cancel_scope.cancel()


def _print(text: str, out: TextIO) -> bool:
    """Write one progress line; False once nobody reads them (a broken pipe, a full disk, a
    closed file). A write that would block (a slow reader) drops that line only."""
    try:
        out.write(text + "\n")
        flush = getattr(out, "flush", None)  # (a host's stand-in may only write)
        if flush is not None:
            flush()
    except BlockingIOError:
        return True
    except (OSError, ValueError):
        return False
    return True
