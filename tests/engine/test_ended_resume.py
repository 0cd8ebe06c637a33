"""A task the service ended without making it done (``TASK_FAILED``, ``CANCELLED``), the run
killed while it read that task's pages, then resumed: the rows the task never processed are
sent again at once, as the killed run would have, not after the read-again window (kept for a
results store that lags a task's "done", which an ended task is not)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiohttp import web

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, BilledProxy, assert_exactly_once, ids_of, kill_when, run_args, write_csv
from .proxy import Misbehaviour, request_kind

#: Tasks of 1,000 rows.
TASKS_OF_1000_FLAGS = ("--rotate-images", "1000", "--rotate-min-images", "1000")


#: Rows of the ended task its service processed (and gives on its pages); the rest of its
#: 1,000 are left off its pages, which come short (its count still says 1,000).
PROCESSED = 600


class EndedPartway(BilledProxy):
    """The billing proxy before a service that ends task 1 having processed its first
    :data:`PROCESSED` rows, and answers 503 to every results page past them while :attr:`busy`
    (the run is killed meanwhile)."""

    def __init__(self, word: str) -> None:
        super().__init__(Misbehaviour(status_when_done={1: word}))
        self.busy = True

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if (
            self.busy
            and request_kind(request.method, request.path) == "results"
            and int(request.query.get("offset", "0")) >= PROCESSED
        ):
            return web.json_response(
                {"status": "failure", "error": "busy"}, status=503, headers={"Retry-After": "0"}
            )
        return await super().handle(request)

    def _reshape_page(self, task_id: str, offset: int, data: dict[str, Any]) -> bool:
        changed = super()._reshape_page(task_id, offset, data)
        if self.ordinal(task_id) != 1:
            return changed
        results: list[Any] = data["data"]["results"]
        results[:] = results[: max(0, PROCESSED - offset)]
        return True


@pytest.mark.parametrize("word", ["TASK_FAILED", "CANCELLED"])
async def test_a_resumed_run_sends_an_ended_tasks_unprocessed_rows_again_at_once(
    tmp_path: Path, word: str
) -> None:
    """The service ends the task having processed 600 of its 1,000 rows (its pages from there
    on empty); the run is killed once it has read pages of them (the pages past them answered
    503 meanwhile: the pages read with them wait), and run again. Before, the resume took the
    task for done, its pages read before and those after for short, and waited the whole
    read-again window (20 s here, 30 by default) from the restart for the 400 rows the task
    never processed (the killed run would have sent them at once); now it reads the task's
    status, says ended, and sends them again at once. Either way each of those 400 is written
    (billed) twice, once to the ended task, and the other 600 once: the wait lost and billed
    nothing, it only took time."""
    manifest = write_csv(tmp_path / "m.csv", 1000)
    out, state = tmp_path / "out.jsonl", tmp_path / "state.sqlite"
    proxy = EndedPartway(word)
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            args = run_args(proxy.url, out, "--state", str(state), *TASKS_OF_1000_FLAGS)
            args += ["--read-again-window", "20", str(manifest)]

            def processed_rows_in() -> bool:
                return out.exists() and out.read_bytes().count(b"\n") >= 400

            proc = await anyio.open_process(args, env=ENV)
            await kill_when(proc, processed_rows_in)
            proxy.busy = False
            started = time.monotonic()
            with anyio.fail_after(60):
                done = await anyio.run_process(args, check=False, env=ENV)
            took = time.monotonic() - started
    err = done.stderr.decode()
    assert done.returncode == 0, err[-2000:]
    o = assert_exactly_once(out, out.with_suffix(".rej"), ids_of(1000))
    assert len(o.results) == 1000 and not o.rejects
    twice = [i for i, n in proxy.written.items() if n > 1]
    assert len(proxy.written) == 1000 and len(twice) == 400, err[-3000:]
    assert max(proxy.written.values()) == 2
    assert took < 12, f"the resume took {took:.1f} s (a read-again window of 20 s): {err[-1500:]}"
