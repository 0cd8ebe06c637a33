"""Where the engine's CPU goes: the parts a stateless script does not have, per image.

One ``run_pipeline`` in this process against a reference service in its own process
(``serve --rate 0 --no-fetch``). Each part is timed with the CPU clock of the thread that runs
it (``time.thread_time``, so waits and the other threads are left out) by wrapping the function
that does it, and every SQL statement of the state thread is timed the same way:

* exactly-once parts, which the async script has no counterpart of: checking rows before they
  cost a request (``Validator.route``, building the requests included), the run-wide dedupe
  of ids and the write-ahead of each chunk (each with its SQL), the outcome count of each
  page, and the state's other SQL and COMMITs;
* parts both clients have: decoding result pages and writing the results file.

The process's own CPU (user + sys, start-up excluded: the service and the manifest are ready
first) is printed too, and split by thread: the event loop's (HTTP, decoding, validation and
every stage's coroutines), the state thread's (SQL, commits and the output files), and the
others' (the manifest reader's worker thread). Wrapping adds a little CPU of its own, so
compare the parts with each other and across builds, not with the ``compare`` scenario's
totals.

    python -m benchmarks.breakdown [--rows 200000] [--sql 12] [--foreign]

``--foreign`` reads through the foreign-format proxy (:mod:`benchmarks.foreign`: other spacing,
keys in reverse order, unknown fields), to see what a server's formatting costs and where.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import resource
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .harness import manifest, manifest_options, running_foreign_proxy, running_service

#: (owner module or class path, attribute, label, exactly-once part?)
_PARTS = (
    ("fashiontag_pipeline.engine.validate:Validator", "route", "validate rows", True),
    ("fashiontag_pipeline.engine.state.store:StateStore", "dedupe", "dedupe ids", True),
    ("fashiontag_pipeline.engine.state.store:StateStore", "insert_chunk", "write-ahead", True),
    ("fashiontag_pipeline.engine.state.journal", "count_outcomes", "count outcomes", True),
    ("fashiontag_pipeline.engine.fetch", "decode_page", "decode pages", False),
    ("fashiontag_pipeline.engine.sinks:JsonlResultSink", "write_page", "write results", False),
)


class _Timed:
    """Thread CPU per label. ``inside``: per thread, whether a wrapped part is running (its
    SQL is then counted in that part, and apart in :attr:`within`)."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.seconds: collections.Counter[str] = collections.Counter()
        self.within: collections.Counter[str] = collections.Counter()
        self.within_calls: collections.Counter[str] = collections.Counter()
        self.inside = threading.local()

    def wrap(self, fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        clock = time.thread_time
        inside = self.inside

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = clock()
            depth = getattr(inside, "depth", 0)
            inside.depth = depth + 1
            try:
                return fn(*args, **kwargs)
            finally:
                inside.depth = depth
                self.calls[label] += 1
                self.seconds[label] += clock() - started

        return timed


class _TimedConnection:
    """A sqlite3 connection whose statements are timed by their text."""

    def __init__(self, db: sqlite3.Connection, timed: _Timed, parts: _Timed) -> None:
        self._db = db
        self._timed = timed
        self._parts = parts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def _run(self, fn: Callable[..., Any], sql: str, *args: Any) -> Any:
        started = time.thread_time()
        try:
            return fn(sql, *args)
        finally:
            label = " ".join(sql.split())[:72]
            seconds = time.thread_time() - started
            self._timed.calls[label] += 1
            self._timed.seconds[label] += seconds
            if getattr(self._parts.inside, "depth", 0):
                self._timed.within[label] += seconds
                self._timed.within_calls[label] += 1

    def execute(self, sql: str, *args: Any) -> Any:
        return self._run(self._db.execute, sql, *args)

    def executemany(self, sql: str, *args: Any) -> Any:
        return self._run(self._db.executemany, sql, *args)


def _resolve(spec: str) -> Any:
    module, _, attr = spec.partition(":")
    __import__(module)
    owner = sys.modules[module]
    return getattr(owner, attr) if attr else owner


def _instrument_state_thread(seconds: list[float]) -> None:
    """Record the state thread's CPU when it ends (appended to ``seconds``)."""
    from fashiontag_pipeline.engine.state import worker

    work = worker.StateThread._work

    def timed_work(self: Any) -> None:
        try:
            work(self)
        finally:
            seconds.append(time.thread_time())

    worker.StateThread._work = timed_work  # type: ignore[method-assign]


def _instrument(parts: _Timed, sql: _Timed) -> None:
    for spec, name, label, _ in _PARTS:
        owner = _resolve(spec)
        setattr(owner, name, parts.wrap(getattr(owner, name), label))
    from fashiontag_pipeline.engine.state import sqlite as state_sqlite

    connect = state_sqlite.StateDB._connect

    def timed_connect(path: Path, cache_kib: int) -> Any:
        return _TimedConnection(connect(path, cache_kib), sql, parts)

    state_sqlite.StateDB._connect = staticmethod(timed_connect)  # type: ignore[method-assign]


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.breakdown")
    p.add_argument("--rows", type=int, default=200_000)
    manifest_options(p)
    p.add_argument("--sql", type=int, default=12, help="SQL statements to list (most CPU first)")
    p.add_argument("--work", type=Path, default=Path(__file__).parent / "results" / "tmp")
    p.add_argument(
        "--foreign",
        action="store_true",
        help="read through the foreign-format proxy (benchmarks.foreign), as compare does",
    )
    args = p.parse_args()
    rows: int = args.rows
    parts, sql = _Timed(), _Timed()
    _instrument(parts, sql)
    state_cpu: list[float] = []
    _instrument_state_thread(state_cpu)

    from fashiontag_pipeline import ClientConfig
    from fashiontag_pipeline.engine.run import run_pipeline

    source = manifest(args.work, rows, args.ids, args.context, args.jsonl)
    with contextlib.ExitStack() as stack:
        service = stack.enter_context(running_service(args.work))
        url = service.url
        if args.foreign:
            url = stack.enter_context(running_foreign_proxy(args.work, url))
        out = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        client = ClientConfig(base_url=url)

        async def run() -> Any:
            return await run_pipeline(
                [source],
                client=client,
                out=out / "results.jsonl",
                rejects=out / "rejects.jsonl",
                state=out / "state.db",
            )

        before = resource.getrusage(resource.RUSAGE_SELF)
        loop_before = time.thread_time()
        try:
            import uvloop

            summary = uvloop.run(run())
        except ImportError:
            summary = asyncio.run(run())
        after = resource.getrusage(resource.RUSAGE_SELF)
        loop_cpu = time.thread_time() - loop_before
    if summary.tagged + summary.failed != rows:
        print(f"the run did not tag every row: {summary}", file=sys.stderr)
        return 1

    def us(seconds: float) -> float:
        return seconds * 1e6 / rows

    user = us(after.ru_utime - before.ru_utime)
    system = us(after.ru_stime - before.ru_stime)
    print(f"engine, {rows:,} rows: process CPU {user + system:.2f} us/image")
    print(f"  (user {user:.2f}, sys {system:.2f}; start-up excluded)")
    state = sum(state_cpu)
    others = (
        (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) - loop_cpu - state
    )
    print(
        f"  by thread: event loop {us(loop_cpu):.2f}, state thread {us(state):.2f},"
        f" others (manifest reader) {us(others):.2f}\n"
    )
    commit = "COMMIT"
    # SQL run by a timed part (dedupe, write-ahead) is counted in that part only.
    statements = sum(s - sql.within[label] for label, s in sql.seconds.items() if label != commit)
    commits = sql.seconds[commit] - sql.within[commit]
    exactly_once = [
        (label, parts.seconds[label], parts.calls[label]) for _, _, label, own in _PARTS if own
    ]
    others = sum(n - sql.within_calls[label] for label, n in sql.calls.items() if label != commit)
    exactly_once.append(("other state SQL", statements, others))
    exactly_once.append(("other COMMITs", commits, sql.calls[commit] - sql.within_calls[commit]))
    shared = [(label, parts.seconds[label], parts.calls[label]) for _, _, label, own in _PARTS]
    shared = [row for row, (_, _, _, own) in zip(shared, _PARTS, strict=True) if not own]
    print("| part | us/image | calls |")
    print("|---|---|---|")
    for label, seconds, calls in exactly_once:
        print(f"| {label} | {us(seconds):.2f} | {calls:,} |")
    total = sum(seconds for _, seconds, _ in exactly_once)
    print(f"| **exactly-once parts** | **{us(total):.2f}** | |")
    for label, seconds, calls in shared:
        print(f"| {label} (the script has it too) | {us(seconds):.2f} | {calls:,} |")
    print("\nstate SQL by statement (thread CPU):")
    for label, seconds in sql.seconds.most_common(args.sql):
        calls = sql.calls[label]
        print(
            f"  {us(seconds):6.3f} us/image  {calls:6,} x {seconds / calls * 1e6:7.1f} us  {label}"
        )
    print("\n(the statements of dedupe and write-ahead, their COMMITs included, are listed above")
    print(" and counted in those two parts, not in the other SQL and COMMITs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
