"""A task the service holds processing for ever behind a status route a front end broke for
good (its status the front end's own ``410 Gone`` page at every poll, the task list showing
it processing): ``run`` must still end. The whole task list, read before such a task is taken
as gone, shows it, so it is not gone; its status unread at every other poll counted as an
unknown status (no stall), so the stall clock started again at each poll and neither
``--give-up-after`` nor ``--stall-timeout`` ever stopped the run. A task whose status the list
gave is no unknown status: it is held processing like any other, under ``--stall-timeout``."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from aiohttp import web

from fashiontag_pipeline.engine import status_reads
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import (
    ENV,
    TASKS_OF_1000,
    assert_exactly_once,
    ids_of,
    run_args,
    write_csv,
)
from .proxy import BULK, Misbehaviour
from .test_gateway_route_switch import RouteSwitch, run_behind

#: Newer tasks of the key (another team's): the list's whole first page (1,000 tasks).
_NEWER = [
    {
        "taskId": f"newer-{n}",
        "count": {"total": 5, "done": 5, "processing": 0, "failure": 0},
        "taskStatus": "DONE",
        "createDate": "2026-01-01T00:00:00.000Z",
    }
    for n in range(1000)
]


class HeldBehindBrokenRoute(RouteSwitch):
    """The run's two tasks held processing by the service (nothing processed) for ``held``
    seconds from the first task's first page, listed past the list's first page; the first
    task's status the front end's 410 page for ever (the route broken for good), the
    second's answered (the service answering the rest)."""

    def __init__(self, held: float = math.inf) -> None:
        super().__init__(math.inf)
        self.rules = Misbehaviour(hold_processing={1, 2})
        self.held = held
        self.lists = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.since is not None and time.monotonic() - self.since >= self.held:
            self.rules.hold_processing = set()
        return await super().handle(request)

    async def _listed(self, request: web.Request) -> web.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host",)}
        assert self._session is not None
        async with self._session.get(self.upstream + BULK, headers=headers) as upstream:
            body = await upstream.json()
        tasks: list[dict[str, Any]] = _NEWER + [self._held(t) for t in body["data"]["tasks"]]
        offset = int(request.query.get("offset", "0"))
        size = int(request.query.get("size", str(len(tasks))))
        self.lists += 1
        info = {"totalCount": len(tasks), "offset": offset, "size": size}
        page = tasks[offset : offset + size]
        return web.json_response({"status": "success", "data": {"taskInfo": info, "tasks": page}})

    def _held(self, task: dict[str, Any]) -> dict[str, Any]:
        if self.ordinal(task["taskId"]) not in self.rules.hold_processing:
            return task
        count = task["count"]
        held = {**count, "done": 0, "failure": 0, "processing": count["total"]}
        return {**task, "taskStatus": "TASK_PROCESSING", "count": held}


def _settings(folder: Path) -> tuple[str, str]:
    """``--config FILE``: tasks of 300 rows, polls at most 0.1 s apart."""
    path = folder / "engine.toml"
    path.write_text("[engine]\nrotate_images = 300\nrotate_min_images = 300\npoll_max = 0.1\n")
    return "--config", str(path)


async def test_a_task_held_behind_a_status_route_broken_for_good_stops_the_run(
    tmp_path: Path,
) -> None:
    """``--give-up-after 1``, ``--stall-timeout 3``: the run stops (exit 1) saying the service
    processed nothing, its state saved, and the same command against the service (the route
    mended, the tasks done) reads the tasks' rows, each once, billed once. Before: still
    running after 40 s (for ever)."""
    manifest = write_csv(tmp_path / "m.csv", 600)
    out = tmp_path / "out.jsonl"
    limits = ("--give-up-after", "1", "--stall-timeout", "3", *_settings(tmp_path))
    proxy = HeldBehindBrokenRoute()
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            try:
                with anyio.fail_after(40):
                    stopped = await anyio.run_process(
                        run_args(proxy.url, out, *limits, str(manifest)), check=False, env=ENV
                    )
            except TimeoutError:
                pytest.fail(f"still running after 40 s: {proxy.pages} pages, {proxy.lists} lists")
        stderr = stopped.stderr.decode()
        assert proxy.pages >= 2 and proxy.lists >= 2, (proxy.pages, proxy.lists, stderr)
        assert stopped.returncode == 1, stderr[-800:]
        assert "processed nothing" in stderr and "--stall-timeout" in stderr, stderr[-800:]
        resumed = await anyio.run_process(
            run_args(svc.url, out, *limits, str(manifest)), check=False, env=ENV
        )
        billed = sum(len(task.ids) for task in svc.store.tasks.values())
    assert resumed.returncode == 0, resumed.stderr.decode()[-800:]
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(600))
    assert billed == 600


async def test_the_daemons_task_held_behind_a_broken_route_is_read_once_the_service_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's engine (no ``give_up_after``, no ``stall_timeout``: it waits for a held
    task as for any) waits for the tasks while the service holds them (3 s here) and reads
    the first once the whole task list, read every ``FRONT_END_GONE_AFTER`` (1 s here) while
    its status stays the front end's page, shows it done: the manifest ends, every row read
    once, none ``expired``."""
    monkeypatch.setattr(status_reads, "FRONT_END_GONE_AFTER", 1.0)
    engine = msgspec.structs.replace(
        TASKS_OF_1000,
        rotate_images=300,
        rotate_min_images=300,
        give_up_after=math.inf,
        stall_timeout=math.inf,
    )
    proxy = HeldBehindBrokenRoute(held=3.0)
    summary, out, rej, tasks = await run_behind(
        proxy, tmp_path, engine, rows=600, service=ServiceConfig(), limit=30
    )
    billed = sum(len(ids) for ids in tasks.values())
    assert summary.complete and proxy.lists >= 3, proxy.lists
    assert not (rej.read_text().splitlines() if rej.exists() else [])
    assert_exactly_once(out, rej, ids_of(600))
    assert billed == 600


class ProgressingBehindBrokenRoute(HeldBehindBrokenRoute):
    """As :class:`HeldBehindBrokenRoute`, but the list shows the first task progressing (its
    done count moving every moment) while the service holds it."""

    def _held(self, task: dict[str, Any]) -> dict[str, Any]:
        held = super()._held(task)
        if held is task or self.ordinal(task["taskId"]) != 1 or self.since is None:
            return held
        count = held["count"]
        done = min(count["total"] - 1, int((time.monotonic() - self.since) * 30))
        return {**held, "count": {**count, "done": done, "processing": count["total"] - done}}


async def test_a_task_progressing_behind_a_broken_route_is_no_stall(tmp_path: Path) -> None:
    """``--give-up-after 3``, ``--stall-timeout 2``: the whole task list shows the first task
    progressing all along (held 8 s); the run is not stopped as a stall and ends once the
    service is done, every row read once. Before: its list word was read again only once its
    status had been the front end's page for ``--give-up-after``, so for 3 s at a time it
    seemed still and the run stopped (exit 1, "processed nothing") as the task progressed."""
    manifest = write_csv(tmp_path / "m.csv", 600)
    out = tmp_path / "out.jsonl"
    limits = ("--give-up-after", "3", "--stall-timeout", "2", *_settings(tmp_path))
    proxy = ProgressingBehindBrokenRoute(held=8.0)
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            with anyio.fail_after(40):
                done = await anyio.run_process(
                    run_args(proxy.url, out, *limits, str(manifest)), check=False, env=ENV
                )
        billed = sum(len(task.ids) for task in svc.store.tasks.values())
    stderr = done.stderr.decode()
    assert proxy.pages >= 2 and proxy.lists >= 2, (proxy.pages, proxy.lists, stderr)
    assert done.returncode == 0, stderr[-800:]
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(600))
    assert billed == 600
