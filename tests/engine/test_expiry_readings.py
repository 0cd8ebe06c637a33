"""Task and result expiry as a service that is not the reference one may have them.

The spec says a task expires 10 minutes after its creation, each PUT extending it, and that
results cannot be read after ``resultExpiredAt``; DESIGN.md fixes the rest for the reference
service (times in RFC 3339, a PUT after expiry 410). Each test stages a fair reading of the
spec that differs (times written as epoch numbers, a task's status answered 410 once it has
expired, a PUT after expiry answered 202 with every row refused, a clock minutes off, a TTL
shorter than ten minutes and not said, a PUT after expiry or a page read after the results'
expiry answered 403) in front of the reference service with a short TTL,
drives ``fashiontag run`` over HTTP, and checks the promises: every row once in the outputs,
none billed twice (the service's own count of images taken), exit code and summary right, no
hang.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiohttp import web

from fashiontag_pipeline._models import format_time, parse_time
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, Outcomes, assert_exactly_once, ids_of, read_outcomes, run_args, write_csv
from .proxy import MisbehavingProxy, Misbehaviour, request_kind
from .test_other_readings import Rewriting

#: The time fields of the spec's answers (create/append, task list, status).
TIME_FIELDS = ("taskExpiredAt", "taskExpireAt", "resultExpiredAt", "createDate")


@dataclass
class Run:
    code: int
    summary: dict[str, Any]
    outcomes: Outcomes
    #: Images the service took (billed), over the whole run.
    billed: int
    stderr: str


async def trickle(
    tmp_path: Path,
    proxy: MisbehavingProxy,
    config: ServiceConfig,
    rows: int,
    pause: float,
    *flags: str,
) -> Run:
    """``fashiontag run -`` through ``proxy`` in front of the reference service (``config``),
    fed ``rows`` rows on stdin, each ``pause`` seconds after the previous one was written (a
    producer slower than the task expiry)."""
    out, summary = tmp_path / "out.jsonl", tmp_path / "summary.json"
    async with running_service(config) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            args = [*run_args(proxy.url, out), "-", "--summary", str(summary)]
            args += ["--expiry-margin", "0.5", "--linger", "0.2", "--rotate-seconds", "60"]
            args += ["--give-up-after", "4", *flags]
            async with await anyio.open_process(
                [*args], stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV
            ) as proc:
                assert proc.stdin is not None and proc.stderr is not None
                await proc.stdin.send(b"id,url\n")
                for i in range(rows):
                    writes = proxy.writes
                    await proc.stdin.send(b"c%d,https://img.example/%d.jpg\n" % (i, i))
                    with anyio.fail_after(10):  # the row written (a slow start is no pause)
                        while proxy.writes == writes:
                            await anyio.sleep(0.02)
                    await anyio.sleep(pause)
                await proc.stdin.aclose()
                with anyio.fail_after(30):
                    err = b"".join([chunk async for chunk in proc.stderr])
                    code = await proc.wait()
        billed = svc.store.image_count
    written = json.loads(summary.read_text()) if summary.exists() else {}
    return Run(code, written, read_outcomes(out, out.with_suffix(".rej")), billed, err.decode())


async def run_file(
    tmp_path: Path, proxy: MisbehavingProxy, config: ServiceConfig, n: int, *flags: str
) -> Run:
    """``fashiontag run`` of a manifest of ``n`` rows (tasks of 1,000) through ``proxy`` in
    front of the reference service (``config``)."""
    manifest = write_csv(tmp_path / "m.csv", n)
    out, summary = tmp_path / "out.jsonl", tmp_path / "summary.json"
    async with running_service(config) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            args = [*run_args(proxy.url, out), str(manifest), "--summary", str(summary)]
            args += ["--rotate-images", "1000", "--rotate-min-images", "1000", "--linger", "0.2"]
            args += ["--give-up-after", "4", *flags]
            with anyio.fail_after(30):
                done = await anyio.run_process(args, check=False, env=ENV)
        billed = svc.store.image_count
    written = json.loads(summary.read_text()) if summary.exists() else {}
    outcomes = read_outcomes(out, out.with_suffix(".rej"))
    return Run(done.returncode, written, outcomes, billed, done.stderr.decode())


def _stamp(value: str) -> float:
    """Epoch seconds of a time the reference service wrote."""
    moment = parse_time(value)
    assert moment is not None
    return moment.timestamp()


def _times_in(data: Any, convert: Any) -> None:
    """Every time field of ``data`` (nested anywhere) passed through ``convert``."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key in TIME_FIELDS and isinstance(value, str):
                data[key] = convert(value)
            else:
                _times_in(value, convert)
    elif isinstance(data, list):
        for value in data:
            _times_in(value, convert)


@pytest.mark.parametrize("unit", [1, 1000], ids=["seconds", "milliseconds"])
async def test_times_written_as_epoch_numbers(tmp_path: Path, unit: int) -> None:
    """Every time of the answers is a JSON number of epoch seconds or milliseconds (what a
    Java service writes by default), tasks live 1 s, and the producer pauses longer: the
    expiry is read from the numbers (no write meets an expired task), each row once, none
    billed twice. Before, the first task list was unreadable: exit 1, nothing sent, every
    night the same."""

    def numbers(kind: str, data: Any) -> Any:
        _times_in(data, lambda value: round(_stamp(value) * unit))
        return data

    run = await trickle(tmp_path, Rewriting(numbers), ServiceConfig(task_ttl=1.0), 3, 1.6)
    assert run.code == 0, run.stderr
    assert set(run.outcomes.ids) == ids_of(3, "c") and len(run.outcomes.ids) == 3
    assert not run.outcomes.rejects
    assert run.billed == 3
    assert run.summary["expired_writes"] == 0
    assert run.summary["tasks"] == 3 and run.summary["complete"]


class ExpiredTaskGone(MisbehavingProxy):
    """A service that shows only live tasks: its first task, once created, is left out of the
    task list and its status is answered 410 (``task expired``), as a service whose tasks
    expire (results with them) sooner than it says would."""

    def __init__(self) -> None:
        super().__init__("", Misbehaviour())
        self.gone_answers = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        kind = request_kind(request.method, request.path)
        first = self.created[0] if self.created else None
        if first is not None and kind == "status" and first in request.path:
            self.gone_answers += 1
            return web.json_response({"status": "failure", "error": "task expired"}, status=410)
        answer = await super().handle(request)
        if first is None or kind != "list" or not isinstance(answer, web.Response):
            return answer
        data = json.loads(answer.body) if isinstance(answer.body, bytes) else None
        if answer.status != 200 or data is None:
            return answer
        data["data"]["tasks"] = [t for t in data["data"]["tasks"] if t["taskId"] != first]
        return web.json_response(data)


async def test_a_task_whose_status_is_answered_410_gone(tmp_path: Path) -> None:
    """Task 1 leaves the list and its status is answered 410 (expired) before the run sees it
    done: its results can no longer be read, so its rows are ``expired`` rejects, as rows
    whose result pages are answered 410 are; the other tasks are read; nothing is sent twice,
    exit 0. Before, the 410 stopped the run (exit 1), and every resume the same."""
    proxy = ExpiredTaskGone()
    run = await run_file(tmp_path, proxy, ServiceConfig(), 2500)
    assert run.code == 0, run.stderr
    assert proxy.gone_answers >= 1
    o = assert_exactly_once(tmp_path / "out.jsonl", tmp_path / "out.rej", ids_of(2500))
    expired = [r for r in o.rejects if r["stage"] == "expired"]
    assert len(expired) == len(o.rejects) == 1000
    assert {r["taskId"] for r in o.results} == set(proxy.created[1:])
    assert run.billed == 2500
    assert run.summary["rejected"] == 1000 and run.summary["resent"] == 0
    assert run.summary["complete"] and run.summary["tagged"] == 1500
    assert "task expired" in run.stderr


class ExpiredPutRefusedRowByRow(Rewriting):
    """A service whose tasks live a second though its answers say ten minutes (its TTL is not
    the one it states), and whose PUT after expiry is answered 202 with every row in the
    ``failureList`` as ``task has expired`` (the spec does not show how a PUT after expiry is
    answered; this is its per-row validation's way)."""

    def __init__(self) -> None:
        super().__init__(self.ten_minutes)
        self.refused_row_by_row = 0

    @staticmethod
    def ten_minutes(kind: str, data: Any) -> Any:
        if kind in ("create", "append"):
            data["taskExpiredAt"] = format_time(datetime.now(UTC) + timedelta(minutes=10))
        return data

    async def handle(self, request: web.Request) -> web.StreamResponse:
        answer = await super().handle(request)
        if request_kind(request.method, request.path) != "append" or answer.status != 410:
            return answer
        self.refused_row_by_row += 1
        sent = json.loads(await request.read())["taggingRequest"]
        failures = [{"request": r, "errorMessage": "task has expired"} for r in sent]
        return web.json_response(
            {
                "taskId": request.path.rsplit("/", 1)[-1],
                "taskExpiredAt": format_time(datetime.now(UTC) - timedelta(seconds=1)),
                "validation": {"accept": 0, "failure": len(sent)},
                "failureList": failures,
            },
            status=202,
        )


async def test_a_put_after_expiry_answered_202_with_every_row_refused(tmp_path: Path) -> None:
    """Rows written to a task that expired sooner than its answers said, the PUT answered 202
    with each row refused (``task has expired``): they are no rejects (nothing is wrong with
    them) but go to a new task, whose answer is their verdict; each row tagged once, none
    billed twice, exit 0. Before, 2 of 3 rows were ``server-validation`` rejects."""
    proxy = ExpiredPutRefusedRowByRow()
    run = await trickle(tmp_path, proxy, ServiceConfig(task_ttl=1.0), 3, 1.6)
    assert run.code == 0, run.stderr
    assert proxy.refused_row_by_row >= 1
    assert not run.outcomes.rejects
    assert set(run.outcomes.ids) == ids_of(3, "c") and len(run.outcomes.ids) == 3
    assert run.billed == 3
    assert run.summary["expired_writes"] == proxy.refused_row_by_row
    assert run.summary["tasks"] == 3 and run.summary["complete"]
    assert run.summary["submitted"] == 3 and run.summary["rejected"] == 0


# ------------------------------------------------------------------ readings that held


@pytest.mark.parametrize("offset", [300.0, -300.0], ids=["ahead", "behind"])
async def test_a_service_clock_minutes_off(tmp_path: Path, offset: float) -> None:
    """The service's clock (its expiry times and its ``Date``) runs five minutes ahead of or
    behind ours, tasks live 4 s: the rows, a second apart, all go to one task (its expiry read
    in the service's clock), none meets an expired task. (It held.)"""
    proxy = MisbehavingProxy("", Misbehaviour(clock_ahead=offset))
    config = ServiceConfig(task_ttl=4.0, clock=lambda: time.time() + offset)
    run = await trickle(tmp_path, proxy, config, 4, 1.0)
    assert run.code == 0, run.stderr
    assert set(run.outcomes.ids) == ids_of(4, "c") and len(run.outcomes.ids) == 4
    assert run.billed == 4 and not run.outcomes.rejects
    assert run.summary["tasks"] == 1 and run.summary["expired_writes"] == 0
    assert abs(run.summary["server_clock_offset_s"] - offset) <= 1.5


class SilentShortTtl(Rewriting):
    """Tasks live a second and no answer says when they expire; a PUT after expiry is
    answered ``status`` (410, 404 as a service that no longer finds the open task, or 403 as
    one that forbids writes to a closed task: the spec shows none of them)."""

    def __init__(self, status: int) -> None:
        super().__init__(self.no_expiry)
        self.status = status

    @staticmethod
    def no_expiry(kind: str, data: Any) -> Any:
        if kind in ("create", "append"):
            data.pop("taskExpiredAt", None)
            data.pop("taskExpireAt", None)
        return data

    async def handle(self, request: web.Request) -> web.StreamResponse:
        answer = await super().handle(request)
        if request_kind(request.method, request.path) == "append" and answer.status == 410:
            return web.json_response(
                {"status": "failure", "error": "task expired"}, status=self.status
            )
        return answer


@pytest.mark.parametrize("status", [410, 404, 403])
async def test_a_ttl_shorter_than_ten_minutes_and_not_said(tmp_path: Path, status: int) -> None:
    """The engine assumes the spec's 10 minutes; each PUT after the real expiry is refused
    (410, 404 or 403) and its row goes to a new task: each row once, none billed twice. (It
    held for 410 and 404. A 403 stopped the run, exit 1, saying the bulk key was refused and
    to set another, though that key had just created the task: a 403 to a write to one task
    is about that task; the key is judged by the create the rows go to next.)"""
    run = await trickle(tmp_path, SilentShortTtl(status), ServiceConfig(task_ttl=1.0), 3, 1.6)
    assert run.code == 0, run.stderr
    assert set(run.outcomes.ids) == ids_of(3, "c") and len(run.outcomes.ids) == 3
    assert run.billed == 3 and not run.outcomes.rejects
    assert run.summary["tasks"] == 3 and run.summary["expired_writes"] == 2
    assert run.summary["resent"] == 0 and run.summary["lost_tasks"] == 0


class _Clock:
    """The service's clock (and its ``Date``, through the proxy): real time plus ``offset``."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


class ForbiddenOnceExpired(MisbehavingProxy):
    """Results read after ``resultExpiredAt`` answered 403 (as a store that forbids reads of
    what it deleted: the spec shows no status for them), not the reference service's 410. The
    service's clock (and ``Date``) moves past the results' TTL when a page past the first is
    asked for: the results expire partway through the reading."""

    def __init__(self, clock: _Clock, ttl: float) -> None:
        super().__init__("", Misbehaviour())
        self.clock, self.ttl = clock, ttl
        #: Images sent in creates and appends (billed): the service's own count drops when it
        #: forgets a task, one result TTL past its results' expiry, which the clock passes.
        self.images = 0

    async def _counted(self, request: web.Request) -> str:
        kind = request_kind(request.method, request.path)
        if kind in ("create", "append"):
            self.images += len(json.loads(await request.read()).get("taggingRequest") or [])
        if kind == "results" and request.query.get("offset", "0") != "0":
            self.clock.offset = self.rules.clock_ahead = self.ttl * 10
        return kind

    async def handle(self, request: web.Request) -> web.StreamResponse:
        kind = await self._counted(request)
        answer = await super().handle(request)
        if kind == "results" and answer.status == 410:
            body = {"status": "failure", "error": "forbidden"}
            return web.json_response(body, status=403, headers=self._headers())
        return answer


async def test_results_read_after_their_expiry_answered_403(tmp_path: Path) -> None:
    """Results that expire partway through the reading, each later page answered 403: the rows
    without a line are ``expired`` rejects, as after a 410 (the service's clock says the results
    expired), exit 0, each row once and billed once. Before, the 403 stopped the run, exit 1,
    saying the bulk key was refused and to set another (the key that had just read the first
    page), and the same command met the same 403 at every resume: the run never completed."""
    clock = _Clock()
    proxy = ForbiddenOnceExpired(clock, 60.0)
    config = ServiceConfig(result_ttl=60.0, clock=clock)
    run = await run_file(tmp_path, proxy, config, 300, "--page-concurrency", "1")
    assert run.code == 0, run.stderr
    lines = [r["id"] for r in run.outcomes.results + run.outcomes.rejects]
    assert set(lines) == ids_of(300) and len(lines) == 300
    expired = [r for r in run.outcomes.rejects if r["stage"] == "expired"]
    assert len(run.outcomes.results) == 100 and len(expired) == 200
    assert proxy.images == 300 and run.summary["complete"]


class ForgottenOnceExpired(ForbiddenOnceExpired):
    """The reference service as it is since it forgets a task one result TTL after its
    results expired: once the clock has moved past that (a resume days later, or a reading
    that long), the task's status and pages are answered 404, not 410."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        kind = await self._counted(request)
        answer = await MisbehavingProxy.handle(self, request)
        if kind in ("results", "status") and answer.status == 410:
            body = {"status": "failure", "error": "task not found"}
            return web.json_response(body, status=404, headers=self._headers())
        return answer


async def test_results_whose_task_was_forgotten_after_they_expired(tmp_path: Path) -> None:
    """Results whose task the service forgot after they expired (404 for its pages, as the
    reference service now answers one result TTL past their expiry): the rows without a line
    are ``expired`` rejects, as after a 410 or a 403 past ``resultExpiredAt``, each row billed
    once. Before, the 404 was taken as a task forgotten before its rows were tagged, and every
    row whose result had expired was sent (and billed) again in a new task."""
    clock = _Clock()
    proxy = ForgottenOnceExpired(clock, 60.0)
    config = ServiceConfig(result_ttl=60.0, clock=clock)
    run = await run_file(tmp_path, proxy, config, 300, "--page-concurrency", "1")
    assert run.code == 0, run.stderr
    lines = [r["id"] for r in run.outcomes.results + run.outcomes.rejects]
    assert set(lines) == ids_of(300) and len(lines) == 300
    expired = [r for r in run.outcomes.rejects if r["stage"] == "expired"]
    assert len(run.outcomes.results) == 100 and len(expired) == 200, run.stderr[-2000:]
    assert proxy.images == 300 and run.summary["complete"]


class ZeroExpiryForbidden(MisbehavingProxy):
    """A service that writes a time it has not set as Go's zero time (``resultExpiredAt``
    ``0001-01-01T00:00:00Z``, as ``time.Time{}`` marshals), and whose every results page is
    answered 403: the bulk key refused for reads (revoked in the night). ``zero``: how the
    zero time is written (its text, or the epoch seconds ``time.Time{}.Unix()`` gives)."""

    def __init__(self, zero: str | int = "0001-01-01T00:00:00Z") -> None:
        super().__init__("", Misbehaviour())
        self.zero = zero

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request_kind(request.method, request.path) == "results":
            body = {"status": "failure", "error": "forbidden"}
            return web.json_response(body, status=403, headers=self._headers())
        answer = await super().handle(request)
        if not isinstance(answer, web.Response) or not isinstance(answer.body, bytes):
            return answer
        if answer.status >= 300 or not answer.body:
            return answer
        data = json.loads(answer.body)
        _times_in(data, lambda value: self.zero)
        return web.json_response(data, status=answer.status)


@pytest.mark.parametrize("zero", ["0001-01-01T00:00:00Z", -62135596800, "-62135596800"])
async def test_a_go_zero_time_is_no_expiry_of_the_results(tmp_path: Path, zero: str | int) -> None:
    """``resultExpiredAt`` written as Go's zero time (a field the service leaves unset) was
    read as results that expired in year 1: a 403 to every page (the key refused) was taken
    as their expiry, every row an ``expired`` reject, exit 0, the rows billed and their
    results never read. The zero time is no time, as an empty one: the 403 stops the run
    saying the key was refused, exit 1, no row rejected, and the same command resumes. So
    is its epoch seconds as a JSON number (``time.Time{}.Unix()``), which was still year 1."""
    run = await run_file(tmp_path, ZeroExpiryForbidden(zero), ServiceConfig(), 300)
    assert run.code == 1, run.stderr
    assert "refused" in run.stderr
    assert not run.outcomes.rejects and not run.outcomes.results
    assert run.billed == 300


@pytest.mark.parametrize("written", ["9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+01:00"])
async def test_a_time_past_the_ends_of_the_calendar_in_utc(tmp_path: Path, written: str) -> None:
    """Every time of the answers written at an end of the calendar in a zone that puts it
    past that end in UTC (``9999-12-31T23:59:59-05:00``: "never expires" in a service's local
    zone): the task list, status and writes ended on a traceback (OverflowError), exit 1,
    nothing tagged, every night the same. Such a time is one the client cannot read: an
    unknown expiry, as any other (the spec's is assumed)."""

    def far(kind: str, data: Any) -> Any:
        _times_in(data, lambda value: written)
        return data

    run = await run_file(tmp_path, Rewriting(far), ServiceConfig(), 300)
    assert run.code == 0, run.stderr
    assert "Traceback" not in run.stderr
    assert len(run.outcomes.results) == 300 and not run.outcomes.rejects
    assert run.billed == 300
