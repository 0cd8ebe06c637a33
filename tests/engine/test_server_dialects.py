"""A service that follows the spec to the letter with habits ours does not have (the dialect
front of :mod:`.dialects`: its own HTTP framing, compression, status codes and JSON writer),
and ``fashiontag run`` through it: every row once, none billed twice, an honest exit.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import anyio
import pytest

from fashiontag_pipeline.engine import run_pipeline
from fashiontag_pipeline.service import ServiceConfig, running_service

from .dialects import Dialect, DialectFront, dumps
from .helpers import (
    ENV,
    TASKS_OF_1000,
    assert_exactly_once,
    client_config,
    ids_of,
    run_args,
    write_csv,
)


async def _run(tmp_path: Path, n: int, dialect: Dialect) -> tuple[DialectFront, int]:
    """``n`` rows run in-process through the front; (the front, images billed)."""
    manifest = write_csv(tmp_path / "m.csv", n)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with running_service(ServiceConfig()) as svc:
        front = DialectFront(svc.url, dialect)
        async with front.running():
            with anyio.fail_after(60):
                summary = await run_pipeline(
                    [manifest],
                    client=client_config(front.url),
                    out=out,
                    rejects=rej,
                    engine=TASKS_OF_1000,
                )
        billed = sum(len(task.ids) for task in svc.store.tasks.values())
    assert summary.complete and summary.unsettled == 0 and summary.resent == 0
    assert_exactly_once(out, rej, ids_of(n))
    return front, billed


DIALECTS = {
    "chunked-at-odd-bytes-gzip": Dialect(framing="chunked", encoding="gzip"),
    "raw-deflate-http-1.0-close-delimited": Dialect(
        version="1.0", framing="close", encoding="raw-deflate"
    ),
    "connection-close-interim-100-103": Dialect(
        close=True, interim=((100, "Continue"), (103, "Early Hints"))
    ),
    "idle-connections-closed-after-0.3s": Dialect(idle=0.3),
    "asctime-dates-writes-201": Dialect(date="asctime", statuses={202: 201}),
    "closed-unannounced-after-2-answers-no-content-type": Dialect(
        silent_close_every=2, content_type=""
    ),
    "writes-over-64KiB-refused-413-unread": Dialect(early_413_over=64 << 10),
    "json-of-another-writer": Dialect(
        writer=lambda data: (
            b"\xef\xbb\xbf"
            + dumps(
                data,
                reverse=True,
                extra=True,
                ints="exp",
                indent=2,
                twice=True,
                ascii_only=True,
            )
            + b"\r\n\n"
        ),
        framing="chunked",
        chunk_sizes=(5, 1, 17, 3, 2039),
    ),
}


@pytest.mark.parametrize("dialect", list(DIALECTS.values()), ids=list(DIALECTS))
async def test_habits_of_http_and_json_that_held(tmp_path: Path, dialect: Dialect) -> None:
    """HTTP and JSON as the spec and their RFCs allow, written another way: each held (every
    row once, none sent twice, exit complete). Kept so that it goes on holding."""
    front, billed = await _run(tmp_path, 1500, dialect)
    assert billed == 1500 and front.answers >= 10


@pytest.mark.parametrize("status", [203, 202])
async def test_results_pages_answered_in_another_success_status(
    tmp_path: Path, status: int
) -> None:
    """Every read answered with a success status other than 200, its body the spec's: 203
    (RFC 9110: content a transforming proxy in the way changed, a CDN's or a corporate
    proxy's) or 202 (a service that answers its whole bulk family so). Polls so answered were
    read, the pages were not: each was refused 14 times, every row billed, none written, and
    the run stopped with exit 1 saying "results under another key, a results API that
    changed?". A page is a page under any 2xx."""
    manifest = write_csv(tmp_path / "m.csv", 300)
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        front = DialectFront(svc.url, Dialect(statuses={200: status}))
        async with front.running():
            with anyio.fail_after(60):
                done = await anyio.run_process(
                    run_args(front.url, out, str(manifest)), check=False, env=ENV
                )
        billed = sum(len(task.ids) for task in svc.store.tasks.values())
    assert done.returncode == 0, done.stderr.decode()[-600:]
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(300))
    assert billed == 300


def _listed_twice(method: str, path: str, status: int, data: Any) -> Any:
    """Every task of the task list listed twice: as it is, then as it was when it was new
    (processing, nothing done): a list merged from replicas or shards, one of them behind."""
    if method == "GET" and path == "/tagger/v2.12/bulk" and status == 200:
        tasks = []
        for task in data["data"]["tasks"]:
            stale = copy.deepcopy(task)
            stale["count"].update(done=0, failure=0, processing=task["count"]["total"])
            stale.update(taskStatus="TASK_PROCESSING", resultExpiredAt=None)
            tasks += [task, stale]
        data["data"]["tasks"] = tasks
    return data


async def test_a_task_list_that_lists_each_task_twice_one_copy_behind(tmp_path: Path) -> None:
    """The task list gives every task twice, the second copy as it was when new (the spec's
    list has no rule against it; a list merged from replicas, one behind). The later copy was
    taken and every task read as processing, at every poll for ever: the run never ended (the
    status of each task, which says done, was never asked). A task listed twice, its copies
    saying different things, is read by its own status."""
    _, billed = await _run(tmp_path, 2500, Dialect(rewrite=_listed_twice))
    assert billed == 2500
