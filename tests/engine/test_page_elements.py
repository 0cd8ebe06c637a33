"""Results pages whose elements are not all results, from a server nobody staged.

Each test runs the reference service behind the misbehaving proxy, with one more rewrite of
the results pages, and checks every row ends once and none is billed again without need.
Found by a hunt, each failing before its fix:

* **An element of the results array that is no object** (``null`` in place of a result, as a
  server that serializes a list with a hole in it writes; a string, a number): the whole page
  was unreadable, asked for four times, then taken as empty: its other 99 rows were sent (and
  billed) again.
* **Done tasks whose every page holds no result** (results under another key, a service
  whose results API changed; a page of the spec's shape, empty, while the task is counted
  full): every row was sent (and billed) ``max_sends`` = 5 times, then written as an
  ``unreturned`` reject, and the run ended complete, exit 0, with no result at all.
* **A write the service applied twice** (ids and all: a service that does not keep ids unique
  within a task), its count past the rows written: the task was read only as far as those
  rows, and one page past them; the rows the doubled block pushed further were sent (and
  billed) again.
* **Results whose ``status`` is a number** (``"status": 1``, every one): each was left out
  as no result, task 1's rows were sent (and billed) again and the run stopped after two
  tasks, every night alike; each is written as it came and counted failed.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiohttp import web

from fashiontag_pipeline.engine import RunSummary, run_pipeline
from fashiontag_pipeline.engine.flow import FatalRunError
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import (
    ENV,
    TASKS_OF_1000,
    assert_exactly_once,
    client_config,
    ids_of,
    read_outcomes,
    run_args,
    run_through,
    write_csv,
)
from .proxy import BULK, MisbehavingProxy, Misbehaviour
from .test_kill_fuzz_cases import HOOK


class PageProxy(MisbehavingProxy):
    """The misbehaving proxy whose results pages of task 1 go through ``change`` (the page's
    ``data`` object and its offset) as well."""

    def __init__(self, change: Callable[[dict[str, Any], int], None]) -> None:
        super().__init__("", Misbehaviour())
        self.change = change

    def _rewrite(
        self, method: str, path: str, task_id: str | None, status: int, payload: bytes
    ) -> bytes:
        out = super()._rewrite(method, path, task_id, status, payload)
        is_page = (
            method == "GET"
            and task_id is not None
            and path.startswith(BULK + "/")
            and not path.endswith("/status")
        )
        if status != 200 or not is_page or self.ordinal(task_id or "") != 1:
            return out
        page = json.loads(out)
        data = page["data"]
        self.change(data, int(data["taskInfo"]["offset"]))
        return json.dumps(page).encode()


@pytest.mark.parametrize(
    "element", [None, "no result", 7, []], ids=["null", "text", "number", "list"]
)
async def test_an_element_of_the_results_that_is_no_object(tmp_path: Path, element: Any) -> None:
    """Task 1's first page gives ``element`` in place of its last result: that row is sent
    again, the page's other 99 rows are read (none sent again), and the run ends complete."""

    def hole(data: dict[str, Any], offset: int) -> None:
        if offset == 0 and data["results"]:
            data["results"][-1] = element

    with anyio.fail_after(60):
        summary, o = await run_through(tmp_path, 2000, PageProxy(hole), TASKS_OF_1000)
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 2000 and not o.rejects
    assert summary.resent == 1


class RenamedResults(MisbehavingProxy):
    """The misbehaving proxy whose results pages, every one of every task, give their results
    under ``data.items`` (a service whose results API changed): a page of the spec's shape
    with no result in it, while the task's count says it holds them."""

    def __init__(self) -> None:
        super().__init__("", Misbehaviour())
        self.written = 0
        #: The tasks whose pages are renamed (None: every task).
        self.broken: set[str] | None = None

    def _rewrite(
        self, method: str, path: str, task_id: str | None, status: int, payload: bytes
    ) -> bytes:
        out = super()._rewrite(method, path, task_id, status, payload)
        if method in ("POST", "PUT") and status < 300:
            self.written += json.loads(out).get("validation", {}).get("accept", 0)
        is_page = (
            method == "GET"
            and task_id is not None
            and path.startswith(BULK + "/")
            and not path.endswith("/status")
        )
        if status != 200 or not is_page or (self.broken is not None and task_id not in self.broken):
            return out
        page = json.loads(out)
        page["data"]["items"] = page["data"].pop("results")
        return json.dumps(page).encode()


async def _run(manifest: Path, url: str, out: Path, rej: Path) -> RunSummary:
    """``manifest`` through the service at ``url`` in tasks of 1,000 rows (60 s at most)."""
    with anyio.fail_after(60):
        return await run_pipeline(
            [manifest], client=client_config(url), out=out, rejects=rej, engine=TASKS_OF_1000
        )


async def test_done_tasks_whose_every_page_holds_no_result_stop_the_run(tmp_path: Path) -> None:
    """Every page of every task comes back empty although the tasks are done and counted
    full (their results under another key): the run stops, state saved, once two tasks gave
    not one result (none having given one), rather than send (and bill) every row
    ``max_sends`` times and end complete with every row an ``unreturned`` reject; the same
    command against a service that answers reads those tasks' pages again and sends nothing
    again."""
    manifest = write_csv(tmp_path / "m.csv", 2000)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    proxy = RenamedResults()
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            with pytest.raises(FatalRunError, match="no result"):
                await _run(manifest, proxy.url, out, rej)
        # What the service took, a write cut short by the stop too (the proxy counts only
        # the answers it gave): each row sent twice at most, not max_sends times (on a loaded
        # machine the second task's rows may be on their way again when the stop comes).
        taken = svc.store.image_count
        assert proxy.written <= taken <= 4000
        summary = await _run(manifest, svc.url, out, rej)
        assert svc.store.image_count == taken  # none sent on resume
    assert summary.complete and summary.unsettled == 0
    o = assert_exactly_once(out, rej, ids_of(2000))
    assert len(o.results) == 2000 and not o.rejects
    assert summary.submitted == taken  # (the whole run's)


class NumberedStatuses(MisbehavingProxy):
    """The misbehaving proxy whose results, every one, say their ``status`` as a number
    (``success`` -> ``ok``, ``failure`` -> ``bad``): results under the spec's key, each a
    tagging result object whose status is no text."""

    def __init__(self, ok: int, bad: int) -> None:
        super().__init__("", Misbehaviour())
        self.ok, self.bad = ok, bad

    def _rewrite(
        self, method: str, path: str, task_id: str | None, status: int, payload: bytes
    ) -> bytes:
        out = super()._rewrite(method, path, task_id, status, payload)
        is_page = (
            method == "GET"
            and task_id is not None
            and path.startswith(BULK + "/")
            and not path.endswith("/status")
        )
        if status != 200 or not is_page:
            return out
        page = json.loads(out)
        for row in page["data"]["results"]:
            result = row["taggingResult"]
            result["status"] = self.ok if result["status"] == "success" else self.bad
        return json.dumps(page).encode()


@pytest.mark.parametrize(("ok", "bad"), [(1, 0), (200, 500)])
async def test_results_whose_status_is_a_number_are_written_as_failures_and_never_resent(
    tmp_path: Path, ok: int, bad: int
) -> None:
    """Every result comes under the spec's key, a tagging result object whose ``status`` is a
    number (``"status": 1``): each was left out as no result, so task 1's rows were sent (and
    billed) again, and the run stopped after two tasks, every night alike. Each is the
    service's answer for its image: written as it came, counted failed (DESIGN: any status
    but ``success`` is a failure), and no row is sent twice."""
    manifest = write_csv(tmp_path / "m.csv", 2000)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    proxy = NumberedStatuses(ok, bad)
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            summary = await _run(manifest, proxy.url, out, rej)
        assert svc.store.image_count == 2000  # none sent twice
    assert summary.complete and summary.unsettled == 0 and summary.resent == 0
    assert summary.failed == 2000 and summary.tagged == 0
    o = read_outcomes(out, rej)  # (assert_exactly_once takes the spec's statuses only)
    assert sorted(o.ids) == sorted(ids_of(2000)) and not o.rejects
    assert {r["taggingResult"]["status"] for r in o.results} <= {ok, bad}


async def test_a_resume_goes_on_when_the_tasks_that_stopped_the_run_still_give_nothing(
    tmp_path: Path,
) -> None:
    """The two tasks that stopped the run (done, not one result) give nothing on the resume
    either (a service that lost them), while its new tasks answer: the resume, asked for by
    the user who read why the run stopped, sends their rows again and completes; it does not
    stop again on the same two tasks, every resume alike (a run no command could finish)."""
    manifest = write_csv(tmp_path / "m.csv", 2000)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    proxy = RenamedResults()
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            with pytest.raises(FatalRunError, match="no result"):
                await _run(manifest, proxy.url, out, rej)
            # The two tasks of the rows read (on a loaded machine a task of rows sent again
            # may be made before the stop: it is not one of those that stopped the run).
            proxy.broken = set(proxy.created[:2])
            summary = await _run(manifest, proxy.url, out, rej)
    assert summary.complete and summary.unsettled == 0
    o = assert_exactly_once(out, rej, ids_of(2000))
    assert len(o.results) == 2000 and not o.rejects


class TwiceApplied(MisbehavingProxy):
    """The misbehaving proxy whose task 1 holds ``block`` of its rows twice, from its row
    ``at`` on (a write the service applied twice, ids and all: a service that does not hold
    ids unique within a task), its count that much higher too."""

    def __init__(self, at: int, block: int) -> None:
        super().__init__("", Misbehaviour(inflate_total={1: block}))
        self.at, self.block = at, block

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        task_id = path[len(BULK) + 1 :]
        is_page = (
            request.method == "GET" and path.startswith(BULK + "/") and not path.endswith("/status")
        )
        if not is_page or self.ordinal(task_id) != 1:
            return await super().handle(request)
        rows = await self.upstream_rows(task_id, request.headers.get("x-api-key", ""))
        at = self.at
        rows = rows[:at] + rows[at - self.block : at] + rows[at:]
        offset, size = int(request.query["offset"]), int(request.query["size"])
        info = {"totalCount": len(rows), "offset": offset, "size": size}
        body = {
            "status": "success",
            "data": {"taskInfo": info, "results": rows[offset : offset + size]},
        }
        return web.json_response(body)


async def test_a_write_the_service_applied_twice(tmp_path: Path) -> None:
    """Task 1 holds 300 of its rows twice (a write applied twice by a service that does not
    keep ids unique within a task), its count 1,300 for the 1,000 rows written: the pages are
    read to the count's end as far as they give rows written to the task, so its last rows,
    past the first 1,000 results, are read, not sent (and billed) again."""
    with anyio.fail_after(60):
        summary, o = await run_through(tmp_path, 2000, TwiceApplied(500, 300), TASKS_OF_1000)
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 2000 and not o.rejects
    assert summary.resent == 0


async def test_a_write_applied_twice_whose_copy_is_longer_than_a_page_past_the_rows(
    tmp_path: Path,
) -> None:
    """Task 1 holds rows 600-899 twice, the copy from its row 900 on (kill -9 fuzz, seed 17):
    its last 100 rows are at 1,200-1,299 of its 1,300 results. The page past the 1,000 rows
    written held copies only (rows with a line already), and the reading stopped there: those
    100 rows were sent (and billed) again. Pages are read on, up to the count the service
    claims, while they hold rows written to the task, copies or not."""
    with anyio.fail_after(60):
        summary, o = await run_through(tmp_path, 2000, TwiceApplied(900, 300), TASKS_OF_1000)
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 2000 and not o.rejects
    assert summary.resent == 0, f"{summary.resent} rows sent (and billed) again"


async def test_a_kill_before_the_pages_past_the_rows_of_a_write_applied_twice(
    tmp_path: Path,
) -> None:
    """The run of the test above killed (SIGKILL) once the task's pages up to the rows written
    are committed, before the pages past them are asked for: the resume read the task to the
    rows written and no further (the count the service claims was not kept), and sent its last
    100 rows again (billed twice). It reads on past them as the run would have."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    manifest = write_csv(tmp_path / "m.csv", 1000)
    out = tmp_path / "out.jsonl"
    summary = tmp_path / "summary.json"
    pythonpath = os.pathsep.join([str(hook), ENV.get("PYTHONPATH", "")])
    proxy = TwiceApplied(900, 300)
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            args = run_args(proxy.url, out, str(manifest), "--summary", str(summary))
            with anyio.fail_after(60):
                killed = await anyio.run_process(
                    args,
                    check=False,
                    env={**ENV, "PYTHONPATH": pythonpath, "HOOK_KILL_AT_PAST_END": "1"},
                )
            assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-400:]
            with anyio.fail_after(60):
                resumed = await anyio.run_process(args, check=False, env=ENV)
            assert resumed.returncode == 0, resumed.stderr.decode()[-400:]
        billed = svc.store.image_count
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(1000))
    assert billed == 1000, f"{billed - 1000} images billed twice"
