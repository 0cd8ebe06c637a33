"""The task lifecycle against a service that behaves in ways nobody staged: a task its status
does not know for a moment after its create was answered, a create answered with an empty
task id."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import anyio
import msgspec
import pytest
from aiohttp import web

from fashiontag_pipeline.engine import run_pipeline
from fashiontag_pipeline.engine.flow import FatalRunError
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import (
    TASKS_OF_1000,
    assert_exactly_once,
    client_config,
    ids_of,
    run_misbehaving,
    run_through,
    write_csv,
)
from .proxy import BULK, MisbehavingProxy, Misbehaviour


async def test_a_task_unknown_to_its_status_for_a_moment_after_its_create_is_not_lost(
    tmp_path: Path,
) -> None:
    """An eventually consistent service: for 1.5 s after a create is answered, the task is
    neither in the list nor known to its status (404), then it is. The tracker took the first
    404 for a task forgotten and sent its 1,000 rows again to a new task: each billed twice,
    though the first task went on and was done."""
    rules = Misbehaviour(list_lag=1.5, status_lag=1.5)
    engine = msgspec.structs.replace(TASKS_OF_1000, list_lag=2.0)
    summary, proxy, _ = await run_misbehaving(tmp_path, 1000, rules, engine)
    assert proxy.status_lagged >= 1
    assert summary.complete and summary.lost_tasks == 0 and summary.resent == 0
    assert len(proxy.created) == 1


class BlankIds(MisbehavingProxy):
    """Creates answered with ``"taskId": ""`` (and, with ``in_list``, the task list showing
    every task so: a service that lost its ids)."""

    def __init__(self, upstream: str, *, in_list: bool) -> None:
        super().__init__(upstream, Misbehaviour())
        self.in_list = in_list

    def _rewrite(
        self, method: str, path: str, task_id: str | None, status: int, payload: bytes
    ) -> bytes:
        out = super()._rewrite(method, path, task_id, status, payload)
        if status >= 300 or method not in ("GET", "POST") or path != BULK:
            return out
        data = json.loads(out)
        if method == "POST":
            data["taskId"] = ""
        elif self.in_list:
            for task in data["data"]["tasks"]:
                task["taskId"] = ""
        return json.dumps(data).encode()


async def test_a_create_answered_with_an_empty_task_id_finds_its_task_by_token(
    tmp_path: Path,
) -> None:
    """Every create answered 202 with ``"taskId": ""``: the run took the empty string for the
    task's id and ended in a ValueError traceback from the client at the first status poll
    (its rows billed, none read). The answer names no task: the task is looked for in the
    list by its token (as for a 202 with no readable body), never created again."""
    proxy = BlankIds("", in_list=False)
    summary, o = await run_through(tmp_path, 3000, proxy, TASKS_OF_1000)
    assert summary.complete and summary.resent == 0
    assert len(proxy.created) == 3
    assert {r["taskId"] for r in o.results} == set(proxy.created)


async def test_a_service_that_shows_every_task_with_an_empty_id_stops_the_run(
    tmp_path: Path,
) -> None:
    """The list shows the task with an empty id too: its results cannot be read. The run
    stops, state saved, saying so (before: a ValueError traceback), and so does its resume;
    nothing is created again."""
    manifest = write_csv(tmp_path / "m.csv", 1000)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    proxy = BlankIds("", in_list=True)
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            for _ in range(2):  # the run, then its resume
                with anyio.fail_after(60), pytest.raises(FatalRunError, match="an empty task id"):
                    await run_pipeline(
                        [manifest],
                        client=client_config(proxy.url),
                        out=out,
                        rejects=rej,
                        engine=TASKS_OF_1000,
                    )
    assert len(proxy.created) == 1


class PutMakesATask(MisbehavingProxy):
    """The second PUT is applied as the create of a new task (a service that starts a new
    task for a write to one it no longer extends) and answered with that task's id."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream, Misbehaviour())
        self.put_count = 0
        self.made: list[str] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method != "PUT" or not request.path.startswith(BULK + "/"):
            return await super().handle(request)
        self.put_count += 1
        if self.put_count != 2:
            return await super().handle(request)
        assert self._session is not None
        async with self._session.post(
            f"{self.upstream}{BULK}",
            data=await request.read(),
            headers={"x-api-key": request.headers.get("x-api-key", "")},
        ) as up:
            status, payload = up.status, await up.read()
        self.made.append(json.loads(payload)["taskId"])
        return web.Response(status=status, body=payload, content_type="application/json")


async def test_a_write_answered_with_another_tasks_id_is_read_from_that_task(
    tmp_path: Path,
) -> None:
    """A PUT answered 202 with the id of a new task the service made for it: its 1,000 rows
    were taken as added to the task written to, missing from its results, and sent again to
    another task (billed twice, the new task never read; exit 0). They are read from the
    task the answer names now."""
    engine = msgspec.structs.replace(TASKS_OF_1000, rotate_images=3000, rotate_min_images=3000)
    proxy = PutMakesATask("")
    summary, o = await run_through(tmp_path, 3000, proxy, engine)
    assert len(proxy.made) == 1
    assert summary.complete and summary.resent == 0
    assert len(proxy.created) == 1  # no create of the run's own after the first
    by_task = Counter(r["taskId"] for r in o.results)
    assert by_task == {proxy.created[0]: 2000, proxy.made[0]: 1000}


class PutMakesATaskLikeIt(PutMakesATask):
    """:class:`PutMakesATask` whose made task carries the description of the task written to
    (a service that goes on with the task under a new id), held processing while ``hold``."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.hold = True

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "PUT" and request.path.startswith(BULK + "/") and self.put_count == 1:
            assert self._session is not None
            task_id = request.path[len(BULK) + 1 :]
            headers = {"x-api-key": request.headers.get("x-api-key", "")}
            status_url = f"{self.upstream}{BULK}/{task_id}/status"
            async with self._session.get(status_url, headers=headers) as up:
                description = (await up.json())["data"]["description"]
            body = json.loads(await request.read())
            body["description"] = description
            self.put_count += 1
            create = self._session.post(f"{self.upstream}{BULK}", json=body, headers=headers)
            async with create as up:
                status, payload = up.status, await up.read()
            self.made.append(json.loads(payload)["taskId"])
            return web.Response(status=status, body=payload, content_type="application/json")
        return await super().handle(request)

    def _rewrite(
        self, method: str, path: str, task_id: str | None, status: int, payload: bytes
    ) -> bytes:
        out = super()._rewrite(method, path, task_id, status, payload)
        if not self.hold or not self.made or status >= 300 or method != "GET":
            return out
        data = json.loads(out)
        tasks = data["data"].get("tasks") if path == BULK else [data["data"]]
        for task in tasks or ():
            if isinstance(task, dict) and task.get("taskId") == self.made[0]:
                task["count"].update(done=0, failure=0, processing=task["count"]["total"])
                task["taskStatus"] = "TASK_PROCESSING"
        return json.dumps(data).encode()


async def test_a_task_a_write_moved_to_is_read_by_the_resume(tmp_path: Path) -> None:
    """The run that read a write's rows from the task its answer named is stopped before that
    task is done; the resume took the task, which the service shows with the description of
    the task written to, for another's (its own token's description expected) and sent its
    1,000 rows again: billed twice. The resume reads them from that task."""
    engine = msgspec.structs.replace(TASKS_OF_1000, rotate_images=3000, rotate_min_images=3000)
    manifest = write_csv(tmp_path / "m.csv", 3000)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    proxy = PutMakesATaskLikeIt("")
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():

            async def run() -> object:
                return await run_pipeline(
                    [manifest],
                    client=client_config(proxy.url),
                    out=out,
                    rejects=rej,
                    engine=engine,
                )

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(run)
                    while not (out.exists() and len(out.read_bytes().splitlines()) >= 2000):
                        await anyio.sleep(0.05)
                    await anyio.sleep(0.5)
                    tg.cancel_scope.cancel()
            assert len(proxy.made) == 1 and len(proxy.created) == 1
            proxy.hold = False
            with anyio.fail_after(60):
                summary = await run()
    assert summary.complete and summary.resent == 0  # type: ignore[attr-defined]
    assert len(proxy.created) == 1  # nothing created again
    o = assert_exactly_once(out, rej, ids_of(3000))
    by_task = Counter(r["taskId"] for r in o.results)
    assert by_task == {proxy.created[0]: 2000, proxy.made[0]: 1000}


class PutAnsweredWithABatchId(MisbehavingProxy):
    """Every PUT applied to the task written to, as the spec says, but answered with an id of
    the append's own (a batch id a service hands out per write) in ``taskId``: no task."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream, Misbehaviour())
        self.batches = 0

    def _rewrite(
        self, method: str, path: str, task_id: str | None, status: int, payload: bytes
    ) -> bytes:
        out = super()._rewrite(method, path, task_id, status, payload)
        if method != "PUT" or status >= 300:
            return out
        data = json.loads(out)
        self.batches += 1
        data["taskId"] = f"batch-{self.batches}"
        return json.dumps(data).encode()


async def test_a_write_answered_with_an_id_that_names_no_task_is_read_from_its_task(
    tmp_path: Path,
) -> None:
    """A PUT answered 202 with an id the service gives no task (a batch id of its own in
    ``taskId``) had its rows looked for under that id: unknown to the status (404), taken for
    forgotten once ``list_lag`` was past and sent again (billed twice), while the task
    written to returned them. They are read from the task written to."""
    engine = msgspec.structs.replace(
        TASKS_OF_1000, rotate_images=3000, rotate_min_images=3000, list_lag=0.5
    )
    proxy = PutAnsweredWithABatchId("")
    summary, o = await run_through(tmp_path, 3000, proxy, engine)
    assert summary.complete and summary.resent == 0
    assert len(proxy.created) == 1
    assert Counter(r["taskId"] for r in o.results) == {proxy.created[0]: 3000}


class PutsGoOnInANewTask(PutMakesATask):
    """:class:`PutMakesATask` whose made task goes on for the task written to: every later
    PUT to that task is applied to the made one and answered with its id (a service that
    continues a task under a new id, writes already on their way included)."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method != "PUT" or not request.path.startswith(BULK + "/"):
            return await super().handle(request)
        if self.put_count < 2:  # (the first PUT, then the one that makes the task)
            return await super().handle(request)
        while not self.made:  # a write on its way meanwhile is applied once it is made
            await anyio.sleep(0.01)
        if request.path[len(BULK) + 1 :] != self.created[0]:
            return await super().handle(request)
        assert self._session is not None
        async with self._session.put(
            f"{self.upstream}{BULK}/{self.made[0]}",
            data=await request.read(),
            headers={"x-api-key": request.headers.get("x-api-key", "")},
        ) as up:
            status, payload = up.status, await up.read()
        return web.Response(status=status, body=payload, content_type="application/json")


async def test_writes_moved_to_one_task_are_all_read_from_it(tmp_path: Path) -> None:
    """Two writes to a task, both on their way, answered with the id of the one new task the
    service went on with: the second was taken for a create answered with an id the run held
    already, and the run stopped (FatalRunError naming "a create") with every row in a task.
    Both are read from that task."""
    engine = msgspec.structs.replace(TASKS_OF_1000, rotate_images=4000, rotate_min_images=4000)
    proxy = PutsGoOnInANewTask("")
    summary, o = await run_through(tmp_path, 4000, proxy, engine)
    assert len(proxy.made) == 1 and len(proxy.created) == 1
    assert summary.complete and summary.resent == 0
    by_task = Counter(r["taskId"] for r in o.results)
    assert by_task[proxy.created[0]] + by_task[proxy.made[0]] == 4000
    assert by_task[proxy.made[0]] >= 2000


class IntegerIds(MisbehavingProxy):
    """A service whose task ids are JSON integers (``"taskId": 1``, the spec says a string;
    many APIs number their resources): its answers carry each task's number, and it takes the
    number in its paths (``/bulk/1/status``)."""

    _TASK_ID = re.compile(rb'"taskId"(\s*):(\s*)"([^"]*)"')

    async def handle(self, request: web.Request) -> web.StreamResponse:
        number, slash, tail = request.path.removeprefix(BULK + "/").partition("/")
        if request.path.startswith(BULK + "/") and number.isdigit():
            path = f"{BULK}/{self.created[int(number) - 1]}{slash}{tail}"
            url = request.rel_url.with_path(path).with_query(request.rel_url.query)
            request = request.clone(rel_url=url)
        return await super().handle(request)

    def _rewrite(
        self, method: str, path: str, task_id: str | None, status: int, payload: bytes
    ) -> bytes:
        out = super()._rewrite(method, path, task_id, status, payload)

        def number(m: re.Match[bytes]) -> bytes:
            ordinal = self.ordinal(m[3].decode())
            return m[0] if ordinal is None else b'"taskId"%s:%s%d' % (m[1], m[2], ordinal)

        return self._TASK_ID.sub(number, out)


async def test_a_service_whose_task_ids_are_integers_is_read_as_any_other(
    tmp_path: Path,
) -> None:
    """Every create answered ``"taskId": 1`` (a number): the answer failed to decode, so the
    first chunk's 1,000 rows were billed with its task unknown, sent again until the run gave
    up, exit 1, nothing read. A numeric task id is its decimal text: the run completes, each
    row billed once, and the results name the task as the service numbers it."""
    proxy = IntegerIds("", Misbehaviour())
    summary, _ = await run_through(tmp_path, 3000, proxy, TASKS_OF_1000)
    assert summary.complete and summary.resent == 0
    assert len(proxy.created) == 3 and proxy.writes == 3
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert {json.loads(line)["taskId"] for line in lines} == {"1", "2", "3"}
