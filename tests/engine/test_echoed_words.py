"""What a service writes, as ``tag`` and ``tasks`` print it for a person at a terminal: a
message or a task description holding line breaks (a Java stack trace) or terminal control
sequences (ESC ``[2J`` clears the screen) is shown on one line, its controls made visible."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
from aiohttp import web

#: A service's error message: a stack trace, then a sequence that clears the terminal.
MESSAGE = (
    "task lookup failed\n\tat com.shop.Tasks.get(Tasks.java:12)\r\n"
    "\tat com.shop.Api.handle(Api.java:80)\n\x1b[2J\x1b[31mred\x07"
)
ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("FASHIONTAG_")},
    "FASHIONTAG_API_KEY": "",
    "FASHIONTAG_BULK_API_KEY": "",
}


@asynccontextmanager
async def _service() -> AsyncIterator[str]:
    """A service that fails every call with :data:`MESSAGE` and lists one task described by
    it."""

    async def tag(request: web.Request) -> web.StreamResponse:
        return web.json_response({"status": "failure", "error": {"code": 805, "message": MESSAGE}})

    async def listing(request: web.Request) -> web.StreamResponse:
        task = {
            "taskId": "t-1",
            "taskStatus": "TASK_DONE",
            "description": MESSAGE,
            "count": {"total": 1, "done": 1, "failure": 0},
            "createDate": "2026-11-27T01:00:00.000Z",
        }
        return web.json_response({"status": "success", "data": {"tasks": [task]}})

    async def missing(request: web.Request) -> web.StreamResponse:
        body = {"status": "fail", "error": {"code": 404, "message": MESSAGE}}
        return web.json_response(body, status=404)

    app = web.Application()
    app.router.add_post("/tagger/v2/tags", tag)
    app.router.add_get("/tagger/v2.12/bulk", listing)
    app.router.add_route("*", "/{tail:.*}", missing)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_a_service_s_words_are_printed_on_one_line_without_terminal_controls() -> None:
    """``tasks status``'s one-line reason was the service's message as sent: four lines on
    stderr, and its ESC sequences reached the terminal (the screen cleared, the text turned
    red); ``tag``'s reason and ``tasks list``'s description column let them through too."""
    async with _service() as url:
        for command in (
            ["tasks", "status", "t-1"],
            ["tasks", "results", "t-1"],
            ["tag", "https://img.example/a.jpg"],
        ):
            result = await anyio.run_process(
                [sys.executable, "-m", "fashiontag_pipeline", *command, "--base-url", url],
                check=False,
                env=ENV,
            )
            err = result.stderr.decode()
            assert result.returncode == 1 and "Traceback" not in err, (command, err)
            assert len(err.splitlines()) == 1, (command, err)
            assert "\x1b" not in err and "\x07" not in err and "\r" not in err, (command, err)
            assert "Tasks.java:12" in err and "\\x1b[2J" in err, (command, err)
        result = await anyio.run_process(
            [sys.executable, "-m", "fashiontag_pipeline", "tasks", "list", "--base-url", url],
            check=False,
            env=ENV,
        )
        out = result.stdout.decode()
        assert result.returncode == 0, result.stderr.decode()
        assert len(out.splitlines()) == 2 and "\x1b" not in out and "\x07" not in out, out


async def test_tasks_results_reads_a_page_holding_half_a_surrogate_pair_as_run_does() -> None:
    """A Java or .NET service that cuts an id across an emoji writes its first half alone,
    ``"\\ud83d"``: ``run`` reads such a page (the half read as U+FFFD), but ``tasks results``
    refused the whole page, exit 1 (``JSON is malformed``), so none of its results could be
    recovered by hand. It prints the page, the half as ``\\ufffd``, as ``run`` writes it."""
    page = (
        b'{"status":"success","data":{"taskInfo":{"totalCount":2,"offset":0,"size":100},'
        b'"results":[{"id":"sku-1 \\ud83d","taggingResult":{"status":"success","data":'
        b'{"objects":[]}}},{"id":"sku-2","taggingResult":{"status":"success","data":'
        b'{"objects":[]}}}]}}'
    )

    async def results(request: web.Request) -> web.StreamResponse:
        return web.Response(body=page, content_type="application/json")

    app = web.Application()
    app.router.add_get("/tagger/v2.12/bulk/{task}", results)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    argv = ["tasks", "results", "t-1", "--base-url", url, "--give-up-after", "1"]
    try:
        result = await anyio.run_process(
            [sys.executable, "-m", "fashiontag_pipeline", *argv],
            check=False,
            env=ENV,
        )
    finally:
        await runner.cleanup()
    assert result.returncode == 0, result.stderr.decode()
    printed = json.loads(result.stdout)
    assert [r["id"] for r in printed["results"]] == ["sku-1 \ufffd", "sku-2"]


async def test_tasks_list_and_status_read_half_a_surrogate_pair_in_a_description() -> None:
    """A service that cuts a description (another client's, on the same bulk key) to its
    1,024 characters as UTF-16 code units keeps half an emoji, ``"\\ud83d"``: ``tasks list``
    and ``tasks status`` refused the whole answer, exit 1 (``HTTP 200 body is not the expected
    JSON``), so no task of the key could be listed while it lived. The half is read as
    U+FFFD, as results pages are."""
    task = (
        b'{"taskId":"t-1","description":"night \\ud83d","taskStatus":"TASK_DONE",'
        b'"count":{"total":1,"done":1,"failure":0},"createDate":"2026-11-27T01:00:00.000Z"}'
    )

    async def listing(request: web.Request) -> web.StreamResponse:
        body = b'{"status":"success","data":{"tasks":[' + task + b"]}}"
        return web.Response(body=body, content_type="application/json")

    async def status(request: web.Request) -> web.StreamResponse:
        body = b'{"status":"success","data":' + task + b"}"
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/tagger/v2.12/bulk", listing)
    app.router.add_get("/tagger/v2.12/bulk/{task}/status", status)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    printed = []
    try:
        for action in (["list"], ["list", "--json"], ["status", "t-1"]):
            argv = ["tasks", *action, "--base-url", url, "--give-up-after", "1"]
            result = await anyio.run_process(
                [sys.executable, "-m", "fashiontag_pipeline", *argv], check=False, env=ENV
            )
            assert result.returncode == 0, (action, result.stderr.decode())
            printed.append(result.stdout.decode())
    finally:
        await runner.cleanup()
    assert printed[0].splitlines()[1].endswith("night \ufffd"), printed[0]
    assert json.loads(printed[1])[0]["description"] == "night \ufffd"
    assert json.loads(printed[2])["description"] == "night \ufffd"


async def test_run_s_last_line_shows_a_service_s_controls_escaped(tmp_path: Path) -> None:
    """``run``'s one-line reason quotes the service's message: its line breaks were made
    spaces, but its ESC sequences reached the cron mail or the terminal as sent (the screen
    cleared, the text turned red). They are shown escaped, as ``tag`` and ``tasks`` show
    them."""
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,url\np1,https://img.example/a.jpg\n")
    async with _service() as url:
        argv = ["run", str(manifest), "--base-url", url, "--out", str(tmp_path / "o.jsonl")]
        result = await anyio.run_process(
            [sys.executable, "-m", "fashiontag_pipeline", *argv, "--no-progress"],
            check=False,
            env=ENV,
        )
    err = result.stderr.decode()
    assert result.returncode == 1 and "Traceback" not in err, err
    last = err.splitlines()[-1]
    assert last.startswith("fashiontag: ") and "Tasks.java:12" in last, err
    assert "\x1b" not in err and "\x07" not in err and "\r" not in err, err
    assert "\\x1b[2J" in last, last
