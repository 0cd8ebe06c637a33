"""A front end (an API gateway, a CDN) that answers a few reads ``410 Gone`` with a page of its
own while the service behind it still holds every task and its results: a route being
switched, an API version being retired, a cached answer of another request. The service's
410 (its JSON failure body) says a task's results have expired; a page that is not the
service's says nothing about the task, and ``fashiontag run`` must neither write its rows as
``expired`` rejects (rows tagged, billed, and their results never delivered) nor exit 0.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import anyio
import msgspec
import pytest
from aiohttp import web

from fashiontag_pipeline.engine import run_pipeline, status_reads
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import (
    ENV,
    TASKS_OF_1000,
    assert_exactly_once,
    client_config,
    ids_of,
    read_outcomes,
    run_args,
    write_csv,
)
from .proxy import BULK, MisbehavingProxy, Misbehaviour

#: A gateway's own page for a route it says is gone (HTML, as nginx's ``return 410`` writes).
GONE_PAGE = (
    b"<html>\r\n<head><title>410 Gone</title></head>\r\n<body>\r\n<center><h1>410 Gone</h1>"
    b"</center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)


class GoneBlip(MisbehavingProxy):
    """The proxy with a front end that answers the first ``times`` requests of one kind
    (``page``: a results read; ``status``: a status poll) ``410 Gone`` with its own page,
    not forwarded."""

    def __init__(self, kind: str, times: int, rules: Misbehaviour) -> None:
        super().__init__("", rules)
        self.kind = kind
        self.times = times
        self.gone = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        kind = (
            "status"
            if path.endswith("/status")
            else "page"
            if request.method == "GET" and path.startswith(BULK + "/")
            else None
        )
        if kind == self.kind and self.gone < self.times:
            self.gone += 1
            return web.Response(status=410, body=GONE_PAGE, content_type="text/html")
        return await super().handle(request)


@pytest.mark.parametrize("kind", ["page", "status"])
async def test_a_front_ends_410_page_is_no_expiry_of_the_results(tmp_path: Path, kind: str) -> None:
    """Three reads answered ``410 Gone`` by a front end's HTML page, the service never asked.
    A results page so answered was taken for the results' expiry (hours before the
    ``resultExpiredAt`` the service gave): the task's 1,000 unread rows were written as
    ``expired`` rejects, tagged and billed, their results never read, and the run said
    complete (exit 0); a status poll so answered (the task list not given) the same. A 410
    that is not the service's answer is retried like a 5xx, under ``--give-up-after``."""
    manifest = write_csv(tmp_path / "m.csv", 2500)
    out = tmp_path / "out.jsonl"
    # (status polls: the task list is not given, so each task's status is read)
    rules = Misbehaviour(unreadable_list=kind == "status", poll_answer=503)
    proxy = GoneBlip(kind, 3, rules)
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            with anyio.fail_after(60):
                done = await anyio.run_process(
                    run_args(proxy.url, out, "--give-up-after", "20", str(manifest)),
                    check=False,
                    env=ENV,
                )
        billed = sum(len(task.ids) for task in svc.store.tasks.values())
    assert proxy.gone == 3
    assert done.returncode == 0, done.stderr.decode()[-800:]
    outcomes = read_outcomes(out, out.with_suffix(".rej"))
    assert not outcomes.rejects, outcomes.rejects[:2]
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(2500))
    assert billed == 2500


class ExpiredBehindFrontEnd(MisbehavingProxy):
    """A service that has dropped the run's first task (expired before it was done: it is
    gone from the list, its status answered 410) behind a front end that answers every 410
    with its own page (nginx's ``proxy_intercept_errors`` with an ``error_page`` for 410): the
    service's own 410 never reaches the run, while every other request is answered."""

    def __init__(self, rules: Misbehaviour) -> None:
        super().__init__("", rules)
        self.expired: str | None = None
        self.gone = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if self.expired is not None and path.startswith(f"{BULK}/{self.expired}"):
            self.gone += 1
            return web.Response(status=410, body=GONE_PAGE, content_type="text/html")
        answer = await super().handle(request)
        if request.method not in ("GET", "POST") or path != BULK:
            return answer
        if not isinstance(answer, web.Response) or answer.status >= 300 or not answer.body:
            return answer
        body = json.loads(bytes(answer.body))  # type: ignore[arg-type]
        if request.method == "POST":
            self.expired = self.expired or body["taskId"]
            return answer
        tasks = body["data"]["tasks"]
        body["data"]["tasks"] = [task for task in tasks if task["taskId"] != self.expired]
        return web.json_response(body)


def assert_dropped_task_expired(
    proxy: ExpiredBehindFrontEnd, expired: set[str], out: Path, rejects: Path
) -> None:
    """The dropped task's status was asked for through its 410 pages, then the task taken as
    gone: its rows (``expired``, some but not all of the 2,500) are ``expired`` rejects, every
    other row read, each row once."""
    assert proxy.gone >= 2 and 0 < len(expired) < 2500, len(expired)
    outcomes = read_outcomes(out, rejects)
    assert {row["id"] for row in outcomes.rejects} == expired
    assert {row["stage"] for row in outcomes.rejects} == {"expired"}
    assert_exactly_once(out, rejects, ids_of(2500))


async def test_a_task_gone_behind_a_front_end_that_rewrites_its_410_is_given_up(
    tmp_path: Path,
) -> None:
    """A task the service has dropped (gone from its list, its status 410) behind a front end
    that rewrites every 410 into its own page, while the service answers every other request:
    its status, retried as a front end's fault, was not given for ``--give-up-after`` and the
    run stopped (exit 1), and so did every resume: the task's rows never had an outcome. Once
    its status has been such a page for ``--give-up-after`` while the service answered other
    requests, the task is taken as gone: its rows are ``expired`` rejects, the others read."""
    manifest = write_csv(tmp_path / "m.csv", 2500)
    out = tmp_path / "out.jsonl"
    proxy = ExpiredBehindFrontEnd(Misbehaviour())
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            with anyio.fail_after(60):
                done = await anyio.run_process(
                    run_args(proxy.url, out, "--give-up-after", "3", str(manifest)),
                    check=False,
                    env=ENV,
                )
        assert proxy.expired is not None
        expired = set(svc.store.tasks[proxy.expired].ids)
    assert done.returncode == 0, done.stderr.decode()[-800:]
    assert_dropped_task_expired(proxy, expired, out, out.with_suffix(".rej"))


async def test_the_daemons_task_gone_behind_a_front_end_is_given_up_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same dropped task under the daemon's engine, which never gives up
    (``give_up_after`` infinite): its status, such a page at every poll, was asked for
    forever, and the manifest never finished (its other rows read, its summary never
    written). With no ``give_up_after``, the task is taken as gone after
    ``FRONT_END_GONE_AFTER`` (120 s; 3 here) of such pages while the service answered the
    rest."""
    monkeypatch.setattr(status_reads, "FRONT_END_GONE_AFTER", 3.0)
    manifest = write_csv(tmp_path / "m.csv", 2500)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    engine = msgspec.structs.replace(TASKS_OF_1000, give_up_after=math.inf)
    proxy = ExpiredBehindFrontEnd(Misbehaviour())
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            with anyio.fail_after(60):
                summary = await run_pipeline(
                    [manifest],
                    client=client_config(proxy.url),
                    out=out,
                    rejects=rej,
                    state=tmp_path / "run.state",
                    engine=engine,
                )
        assert proxy.expired is not None
        expired = set(svc.store.tasks[proxy.expired].ids)
    assert summary.complete
    assert_dropped_task_expired(proxy, expired, out, rej)
