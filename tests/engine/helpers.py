"""Helpers of the engine tests: manifests, clients that record what they send, outcome checks,
and a run behind the misbehaving proxy."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from aiohttp import web

from fashiontag_pipeline import ClientConfig, RetryPolicy, Secret, TaggerClient
from fashiontag_pipeline._config import DEV_API_KEY, DEV_BULK_API_KEY
from fashiontag_pipeline._models import MAX_PAGE_SIZE, MAX_REQUESTS_PER_WRITE
from fashiontag_pipeline.engine import EngineConfig, RunSummary, run_pipeline
from fashiontag_pipeline.engine.jobs import JobSpec
from fashiontag_pipeline.service import ServiceConfig, running_service

from .proxy import MisbehavingProxy, Misbehaviour

#: The environment of an engine subprocess: no key variables (the development keys are sent).
ENV = {**os.environ, "FASHIONTAG_API_KEY": "", "FASHIONTAG_BULK_API_KEY": ""}


def run_args(url: str, out: Path, *extra: str) -> list[str]:
    """``fashiontag run`` as a subprocess: results to ``out``, rejects beside it (``.rej``)."""
    return [
        sys.executable,
        "-m",
        "fashiontag_pipeline",
        "run",
        "--base-url",
        url,
        "--out",
        str(out),
        "--rejects",
        str(out.with_suffix(".rej")),
        "--no-progress",
        *extra,
    ]


async def run_piped(args: Sequence[str], stdin: Path) -> subprocess.CompletedProcess[bytes]:
    """``args`` (a ``fashiontag`` command) run with the file ``stdin`` on its standard input
    (a dump piped again), whatever its exit code."""
    with stdin.open("rb") as piped:
        return await anyio.run_process(list(args), stdin=piped, check=False, env=ENV)


def short_deadline(folder: Path, total: float = 3.0) -> tuple[str, str]:
    """``--config FILE`` giving the client a request deadline of ``total`` seconds and
    ``list_lag`` 0.5 s: a resume over a create whose fate is unknown (killed or stopped with
    it on its way, or answered by a gateway that gave up) looks for it that long after it was
    sent, not the default 75 s."""
    path = folder / "short-deadline.toml"
    path.write_text(f"[client.timeout]\ntotal = {total}\n\n[engine]\nlist_lag = 0.5\n")
    return "--config", str(path)


def client_config(url: str, **kwargs: Any) -> ClientConfig:
    return ClientConfig(
        base_url=url,
        api_key=Secret(DEV_API_KEY),
        bulk_api_key=Secret(DEV_BULK_API_KEY),
        **{"retry": RetryPolicy(max_attempts=4, backoff_base=0.01, backoff_max=0.1), **kwargs},
    )


def write_csv(path: Path, n: int, *, start: int = 0, extra: Sequence[str] = ()) -> Path:
    lines = ["id,url,brand,detection"]
    lines += [f"p{i},https://img.example/{i}.jpg,acme,TOP|SHOES" for i in range(start, start + n)]
    lines += list(extra)
    data = ("\n".join(lines) + "\n").encode()
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def free_port() -> int:
    """A loopback port free now, for a server the test starts on it later (another process may
    take it meanwhile: a URL that must refuse connections takes :func:`dead_port`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: The sockets behind :func:`dead_port`, held open until the test process ends.
_DEAD_PORTS: list[socket.socket] = []


def dead_port() -> int:
    """A loopback port that refuses every connection for the rest of the test process: bound,
    never listening. A port merely closed again (``free_port``) can be taken by a server of a
    test running beside this one (``make test`` runs them in parallel), and a run meant to
    meet a dead service would then talk to that test's service."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _DEAD_PORTS.append(s)
    return int(s.getsockname()[1])


@dataclass
class Outcomes:
    results: list[dict[str, Any]]
    rejects: list[dict[str, Any]]
    ids: list[str | None] = field(default_factory=list)


def taken_in(state: Path) -> tuple[int, int, int]:
    """What the SQLite state at ``state`` holds: rows taken in (``accepted``, its jobs
    together), chunks written ahead, and creates of unknown fate (chunks with no task whose
    ``written_at`` is not 0: their create may be on its way, and a stop then has the resume
    look for its task for a request deadline). All 0 while it cannot be read.

    For tests that stop a run once it got somewhere, not a fixed time after its start (which on
    a loaded machine may come before it read a row)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{state}?mode=ro", uri=True)) as db:
            (accepted,) = db.execute("SELECT coalesce(sum(accepted), 0) FROM jobs").fetchone()
            ahead, unknown = db.execute(
                "SELECT count(*), count(*) FILTER (WHERE task_id IS NULL AND written_at IS NOT 0)"
                " FROM chunks"
            ).fetchone()
    except sqlite3.Error:
        return 0, 0, 0
    return int(accepted), int(ahead), int(unknown)


def job_marks(state: Path) -> tuple[int, int, int]:
    """(validated, results_ckpt, rejects_ckpt) of the job in the SQLite state at ``state``
    (read-only: a state not made yet is not made by looking); validated is -1 until the job
    takes a row in, and while the state cannot be read."""
    try:
        uri = state.absolute().as_uri() + "?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
            found = db.execute("SELECT validated, results_ckpt, rejects_ckpt FROM jobs").fetchone()
    except sqlite3.Error:
        return -1, 0, 0
    return (int(found[0]), int(found[1]), int(found[2])) if found else (-1, 0, 0)


async def kill_when(proc: anyio.abc.Process, ready: Callable[[], bool]) -> None:
    """SIGKILL ``proc`` once ``ready()`` holds (polled, at most 60 s); a run that ended first
    fails the test (its kill point was never reached)."""
    with anyio.fail_after(60):
        while not ready() and proc.returncode is None:
            await anyio.sleep(0.005)
    assert proc.returncode is None, "the run ended before it was killed"
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    await proc.aclose()


def read_outcomes(out: Path, rejects: Path) -> Outcomes:
    results = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    rej = (
        [json.loads(line) for line in rejects.read_text().splitlines()] if rejects.exists() else []
    )
    return Outcomes(results, rej, [r["id"] for r in results])


def assert_exactly_once(
    out: Path, rejects: Path, expected_ids: set[str], *, duplicates: int = 0
) -> Outcomes:
    """Every expected id in exactly one line of results or rejects; nothing else (besides
    ``duplicates`` rejects for duplicate rows)."""
    o = read_outcomes(out, rejects)
    result_ids = [r["id"] for r in o.results]
    assert len(result_ids) == len(set(result_ids)), "an id has two results lines"
    dup_rejects = [r for r in o.rejects if r["reason"].startswith("duplicate id")]
    other_rejects = [r["id"] for r in o.rejects if not r["reason"].startswith("duplicate id")]
    assert len(dup_rejects) == duplicates
    everything = result_ids + other_rejects
    assert len(everything) == len(set(everything)), "an id has two outcomes"
    assert set(everything) == expected_ids
    for r in o.results:
        # A row answered from the result store (--reuse) says so: "reused": true.
        assert set(r) - {"reused"} == {"id", "taskId", "taggingResult"}
        assert r.get("reused", True) is True
        assert r["taggingResult"]["status"] in ("success", "failure")
    return o


class RecordingClient(TaggerClient):
    """A client that records the size of every write and page it is asked for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.write_sizes: list[int] = []
        self.page_sizes: list[int] = []
        self.creates = 0

    async def create_task(self, requests: Any, **kwargs: Any) -> Any:
        self.write_sizes.append(len(requests))
        self.creates += 1
        return await super().create_task(requests, **kwargs)

    async def append_to_task(self, task_id: str, requests: Any, **kwargs: Any) -> Any:
        self.write_sizes.append(len(requests))
        return await super().append_to_task(task_id, requests, **kwargs)

    async def task_results_raw(self, task_id: str, **kwargs: Any) -> bytes:
        self.page_sizes.append(kwargs.get("size", MAX_PAGE_SIZE))
        return await super().task_results_raw(task_id, **kwargs)

    def assert_limits(self) -> None:
        assert self.write_sizes and max(self.write_sizes) <= MAX_REQUESTS_PER_WRITE
        assert not self.page_sizes or max(self.page_sizes) <= MAX_PAGE_SIZE


#: Tasks of 1,000 rows (one create each), polled fast: the engine of the nothing-lost tests.
#: Pages short of rows are read again for 3 s after their task is done (30 s by default): a row
#: the service never returns is sent again 3 s later, and so ends ``unreturned`` in seconds.
TASKS_OF_1000 = EngineConfig(
    poll_min=0.02,
    poll_max=0.2,
    linger_seconds=0.2,
    fsync_seconds=10.0,
    rotate_images=1000,
    rotate_min_images=1000,
    read_again_window=3.0,
)


def job_spec(key: str, manifest: Path, outdir: Path) -> JobSpec:
    """A job of one manifest whose outputs are ``outdir``'s ``results.jsonl`` and
    ``rejects.jsonl``."""
    return JobSpec(
        key=key,
        manifests=[str(manifest)],
        results=outdir / "results.jsonl",
        rejects=outdir / "rejects.jsonl",
    )


def ids_of(n: int, prefix: str = "p") -> set[str]:
    return {f"{prefix}{i}" for i in range(n)}


async def run_through(
    tmp_path: Path,
    n: int,
    proxy: MisbehavingProxy,
    engine: EngineConfig = TASKS_OF_1000,
    *,
    fail_after: float | None = 60.0,
    service: ServiceConfig | None = None,
    **client: Any,
) -> tuple[RunSummary, Outcomes]:
    """A run of ``n`` rows against the reference service (``service``, instant by default)
    behind ``proxy`` (a misbehaving proxy of any kind, its upstream set here; ``client``: more
    ClientConfig fields; the run fails after ``fail_after`` seconds); every id exactly once in
    the outputs is asserted."""
    manifest = write_csv(tmp_path / "m.csv", n)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with running_service(service or ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            with anyio.fail_after(fail_after):
                summary = await run_pipeline(
                    [manifest],
                    client=client_config(proxy.url, **client),
                    out=out,
                    rejects=rej,
                    engine=engine,
                )
    return summary, assert_exactly_once(out, rej, ids_of(n))


class BilledProxy(MisbehavingProxy):
    """The misbehaving proxy that counts the rows written to the service (each one billed)."""

    def __init__(self, rules: Misbehaviour) -> None:
        super().__init__("", rules)
        self.written: Counter[str] = Counter()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method in ("POST", "PUT"):
            body = json.loads(await request.read() or b"{}")
            self.written.update(r["context"]["id"] for r in body.get("taggingRequest", []))
        return await super().handle(request)


async def run_misbehaving(
    tmp_path: Path, n: int, rules: Misbehaviour, engine: EngineConfig = TASKS_OF_1000
) -> tuple[RunSummary, MisbehavingProxy, Outcomes]:
    """A run of ``n`` rows against the reference service behind the misbehaving proxy; every
    id exactly once in the outputs is asserted."""
    proxy = MisbehavingProxy("", rules)
    summary, outcomes = await run_through(tmp_path, n, proxy, engine, fail_after=None)
    return summary, proxy, outcomes
