"""Promise 5 against what stands in front of a service: a gateway whose refusal echoes the key it
was sent (``{"error": "invalid api key sk-..."}``, as some do), and a base URL whose password
holds a character that ends a URL's authority early (``#``, ``?``)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from aiohttp import web

from .helpers import dead_port, write_csv

KEY = "sk-LEAK-123456789"
BULK_KEY = "sk-LEAK-BULK-987654321"
FRAGMENT = "LEAK"


@asynccontextmanager
async def echoing_gateway(status: int) -> AsyncIterator[str]:
    """A gateway on loopback that refuses every request with ``status``, its body naming the
    key the request carried (in the spec's error shape when ``status`` is 401, else as text)."""

    async def refuse(request: web.Request) -> web.Response:
        sent = request.headers.get("x-api-key", "")
        if status == 401:
            body = {"error": {"code": 609, "message": f"authentication failed for key {sent}"}}
            return web.json_response(body, status=status)
        return web.json_response({"error": f"key {sent} is over its quota"}, status=status)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("status", "pad"),
    [(401, ""), (403, ""), (400, ""), (401, " ")],
    ids=["401", "403", "400", "401-padded"],
)
async def test_a_key_a_gateway_echoes_in_its_refusal_is_shown_nowhere(
    tmp_path: Path, status: int, pad: str
) -> None:
    """A gateway answering ``{"error": "invalid key sk-..."}`` had its message put whole into
    the run's one-line reason: the key in clear on stderr (cron's mail, the journal) and in the
    ``--summary`` file a monitor reads. The key is masked in what the service says (a key
    given with a space after it, from an env file, as the service reads it: without)."""
    manifest = write_csv(tmp_path / "m.csv", 5)
    summary = tmp_path / "summary.json"
    env = {**os.environ, "FASHIONTAG_API_KEY": KEY + pad, "FASHIONTAG_BULK_API_KEY": BULK_KEY + pad}
    fashiontag = [sys.executable, "-m", "fashiontag_pipeline"]
    async with echoing_gateway(status) as url:
        runs = [
            ["run", str(manifest), "--summary", str(summary), "--out", str(tmp_path / "o")],
            ["tag", "https://img.example/1.jpg"],
            ["tasks", "list"],
        ]
        for args in runs:
            argv = [*fashiontag, *args, "--base-url", url, "--give-up-after", "3"]
            if args[0] != "run":
                argv = argv[:-2]
            with anyio.fail_after(60):
                result = await anyio.run_process(argv, check=False, env=env, cwd=tmp_path)
            err = result.stderr.decode()
            assert result.returncode not in (0, None), err
            assert str(status) in err, err  # (the refusal is named)
            assert FRAGMENT not in err + result.stdout.decode(), err
    assert json.loads(summary.read_text())  # (written)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert FRAGMENT.encode() not in path.read_bytes(), path.name


@pytest.mark.parametrize("password", ["pwLEAK#987", "pwLEAK?987"], ids=["hash", "question"])
async def test_a_base_url_password_holding_a_hash_or_question_mark_is_not_shown(
    tmp_path: Path, password: str
) -> None:
    """``--base-url https://tagger:pw#987@gw/`` (a generated password pasted unencoded) was
    refused for its "query or fragment" with the URL to give instead: the URL up to the ``#``,
    the password's start in clear on stderr. It is masked as any password is."""
    url = f"http://tagger:{password}@127.0.0.1:{dead_port()}/"
    manifest = write_csv(tmp_path / "m.csv", 5)
    argv = [sys.executable, "-m", "fashiontag_pipeline", "run", str(manifest), "--base-url", url]
    with anyio.fail_after(60):
        result = await anyio.run_process(argv, check=False, cwd=tmp_path)
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert "base_url" in err and "%23" in err, err
    assert FRAGMENT not in err, err


#: A key as many are issued: base64, with a ``/`` in it.
SLASHED_KEY = "LEAK+ab/Cd9/xyZ0=="


@pytest.mark.parametrize("status", [401, 403, 429, 503])
async def test_a_key_echoed_with_its_slashes_escaped_is_masked(tmp_path: Path, status: int) -> None:
    """A gateway whose JSON encoder escapes ``/`` as ``\\/`` (PHP's ``json_encode`` does, by
    default) echoes a base64 key ``LEAK+ab/Cd9...`` as ``LEAK+ab\\/Cd9...``: neither of the
    forms masked (the key as sent, as a JSON string holds it) is in the answer, and its message,
    read, held the key in clear: in the error, the run's one-line reason and ``--summary``."""
    from fashiontag_pipeline import ClientConfig, RetryPolicy, Secret, TaggerClient

    async def refuse(request: web.Request) -> web.Response:
        sent = request.headers.get("x-api-key", "").replace("/", "\\/")
        body = '{"error": {"code": 609, "message": "invalid api key ' + sent + '"}}'
        return web.Response(status=status, body=body, content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    config = ClientConfig(
        base_url=f"http://127.0.0.1:{port}",
        api_key=Secret(SLASHED_KEY),
        bulk_api_key=Secret(SLASHED_KEY),
        retry=RetryPolicy(max_attempts=1),
    )
    try:
        async with TaggerClient(config=config) as client:
            with anyio.fail_after(30), pytest.raises(Exception) as caught:
                await client.task_status("t1")
    finally:
        await runner.cleanup()
    text = f"{caught.value!r} {caught.value} {vars(caught.value)}"
    assert "invalid api key" in text, text
    assert FRAGMENT not in text, text


async def test_a_key_quoted_in_a_written_rows_refusal_is_masked() -> None:
    """A service whose answer to a write (202) refuses a row quoting the key it came with
    (``failureList: [{"errorMessage": "refused for API key sk-...: ..."}]``): only answers of
    HTTP 300 and up were masked, so the row's reason, key and all, went into the rejects
    file. A write's refusals' words are masked whatever its status (one request per chunk of
    rows: no cost of note), as is a front end's page that is not JSON."""
    from fashiontag_pipeline import ClientConfig, RetryPolicy, Secret, TaggerClient

    async def accept(request: web.Request) -> web.Response:
        sent = request.headers.get("x-api-key", "")
        body = {
            "taskId": "t1",
            "taskExpiredAt": "2099-01-01T00:00:00Z",
            "validation": {"accept": 0, "failure": 1},
            "failureList": [
                {
                    "request": {"context": {"id": "p1"}},
                    "errorMessage": f"refused for API key {sent}: image p1 is not allowed",
                }
            ],
        }
        return web.json_response(body, status=202)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", accept)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    config = ClientConfig(
        base_url=f"http://127.0.0.1:{port}",
        api_key=Secret(KEY),
        bulk_api_key=Secret(BULK_KEY),
        retry=RetryPolicy(max_attempts=1),
    )
    from fashiontag_pipeline._models import BulkContext, Image, ImageType, TaggingRequest

    image = Image(type=ImageType("url"), content="https://img.example/1.jpg")
    try:
        async with TaggerClient(config=config) as client:
            with anyio.fail_after(30):
                answer = await client.create_task(
                    [TaggingRequest(image=image, context=BulkContext(id="p1"))]
                )
    finally:
        await runner.cleanup()
    reasons = [item.error_message for item in answer.failure_list]
    assert reasons and all("image p1 is not allowed" in r for r in reasons), reasons
    assert not any(FRAGMENT in r for r in reasons), reasons


@pytest.mark.parametrize(("status", "key"), [(302, KEY), (307, SLASHED_KEY)])
async def test_a_key_a_redirect_names_in_its_location_is_shown_nowhere(
    tmp_path: Path, status: int, key: str
) -> None:
    """A gateway that sends a request without its session to a login page with the key it
    came with in the query (``Location: https://sso.example/login?api_key=sk-...``): the
    answer's body is masked, but the refusal names where the service redirects to, Location
    whole, so the key was on stderr (and in ``--summary``) in clear. It is masked there too,
    percent-encoded as a query holds a base64 key's ``/``, ``+`` and ``=``."""
    from urllib.parse import quote

    async def redirect(request: web.Request) -> web.Response:
        sent = quote(request.headers.get("x-api-key", ""), safe="")
        where = f"https://sso.example/login?api_key={sent}&next={request.path}"
        return web.Response(status=status, headers={"Location": where}, text="Moved")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", redirect)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    manifest = write_csv(tmp_path / "m.csv", 5)
    summary = tmp_path / "summary.json"
    env = {**os.environ, "FASHIONTAG_API_KEY": key, "FASHIONTAG_BULK_API_KEY": key + "-BULK"}
    fashiontag = [sys.executable, "-m", "fashiontag_pipeline"]
    runs = [
        ["run", str(manifest), "--summary", str(summary), "--out", str(tmp_path / "o")],
        ["run", str(manifest), "--out", str(tmp_path / "o2"), "--resume"],
        ["tag", "https://img.example/1.jpg"],
        ["tasks", "list"],
    ]
    try:
        for args in runs:
            argv = [*fashiontag, *args, "--base-url", url]
            if args[0] == "run":
                argv += ["--give-up-after", "3"]
            with anyio.fail_after(60):
                result = await anyio.run_process(argv, check=False, env=env, cwd=tmp_path)
            err = result.stderr.decode()
            assert result.returncode not in (0, None), err
            assert "redirect" in err and "sso.example" in err, err  # (where it goes: named)
            assert FRAGMENT not in err + result.stdout.decode(), err
    finally:
        await runner.cleanup()
    assert json.loads(summary.read_text())  # (written)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert FRAGMENT.encode() not in path.read_bytes(), path.name


@pytest.mark.parametrize(
    ("status", "via"), [(401, "base_url"), (500, "base_url"), (502, "HTTP_PROXY")]
)
async def test_a_debug_page_quoting_the_request_headers_shows_no_credential(
    tmp_path: Path, status: int, via: str
) -> None:
    """A front end whose error page quotes the request it was sent, headers and all (a
    framework's debug page, left on; a proxy's): the keys are masked in it, but the
    ``Authorization`` of a base URL's ``user:password@`` (basic auth, as a gateway takes it)
    and the ``Proxy-Authorization`` of HTTP_PROXY's were not: the token, and the password it
    encodes, on stderr and in ``--summary``. Both are masked too."""
    import base64
    import html

    password = "pwLEAK-5f3a9c"
    token = base64.b64encode(f"tagger:{password}".encode()).decode()

    async def debug_page(request: web.Request) -> web.Response:
        lines = [f"<li>{html.escape(k)}: {html.escape(v)}</li>" for k, v in request.headers.items()]
        auth = request.headers.get("Authorization" if via == "base_url" else "Proxy-Authorization")
        auth = auth or ""
        said = base64.b64decode(auth.removeprefix("Basic ")).decode() if auth else ""
        body = f"<html><h1>Error</h1><p>user {said}</p><ul>{''.join(lines)}</ul></html>"
        return web.Response(status=status, text=body, content_type="text/html")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", debug_page)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    url = f"http://tagger:{password}@127.0.0.1:{port}"
    manifest = write_csv(tmp_path / "m.csv", 5)
    summary = tmp_path / "summary.json"
    env = {**os.environ, "FASHIONTAG_API_KEY": KEY, "FASHIONTAG_BULK_API_KEY": BULK_KEY}
    env["FASHIONTAG_BASE_URL"] = url
    if via == "HTTP_PROXY":  # (the page is the proxy's: a service on loopback is never proxied)
        env["FASHIONTAG_BASE_URL"] = "http://tagger.test"
        env["HTTP_PROXY"] = f"http://tagger:{password}@127.0.0.1:{port}"
    fashiontag = [sys.executable, "-m", "fashiontag_pipeline"]
    runs = [
        ["run", str(manifest), "--summary", str(summary), "--out", str(tmp_path / "o")],
        ["tag", "https://img.example/1.jpg", "--give-up-after", "3"],
        ["tasks", "list", "--give-up-after", "3"],
    ]
    try:
        for args in runs:
            argv = [*fashiontag, *args]
            if args[0] == "run":
                argv += ["--give-up-after", "3"]
            with anyio.fail_after(60):
                result = await anyio.run_process(argv, check=False, env=env, cwd=tmp_path)
            err = result.stderr.decode()
            assert result.returncode not in (0, None), err
            said = err + result.stdout.decode()
            assert str(status) in said, said
            assert FRAGMENT not in said and token[:12] not in said, said
    finally:
        await runner.cleanup()
    assert json.loads(summary.read_text())  # (written)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert FRAGMENT.encode() not in data and token[:12].encode() not in data, path.name


async def test_a_key_in_the_status_of_a_200_failure_body_is_masked() -> None:
    """A gateway answering HTTP 200 with the spec's failure body, the key it came with in
    ``status`` as well as in ``error`` (``{"status": "denied for sk-...", "error": "..."}``):
    ``error`` was masked, but the message quotes ``status`` too (``service answered HTTP 200
    with status='denied for sk-...'``), so ``tasks list``, ``tasks status`` and ``tag`` put
    the key on stderr. Both are masked."""
    from fashiontag_pipeline import ClientConfig, RetryPolicy, Secret, TaggerClient
    from fashiontag_pipeline._models import Image, ImageType

    from .test_contracts_cli import _chain

    async def deny(request: web.Request) -> web.Response:
        sent = request.headers.get("x-api-key", "")
        body = {"status": f"denied for {sent}", "error": f"key {sent} is not allowed"}
        return web.json_response(body, status=200)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", deny)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    config = ClientConfig(
        base_url=f"http://127.0.0.1:{runner.addresses[0][1]}",
        api_key=Secret(KEY),
        bulk_api_key=Secret(BULK_KEY),
        retry=RetryPolicy(max_attempts=1),
    )
    image = Image(type=ImageType("url"), content="https://img.example/1.jpg")
    caught = []
    try:
        async with TaggerClient(config=config) as client:
            for call in (client.list_tasks(), client.task_status("t1"), client.tag_raw(image)):
                with anyio.fail_after(30), pytest.raises(Exception) as raised:
                    await call
                caught.append(raised.value)
    finally:
        await runner.cleanup()
    for err in caught:
        assert "denied for" in str(err), err
        for item in _chain(err):
            text = f"{item!r} {item} {vars(item)}"
            assert FRAGMENT not in text, f"{type(item).__name__} shows the key: {text}"


async def test_tag_and_tasks_results_mask_a_key_their_answer_quotes(tmp_path: Path) -> None:
    """``tag`` prints the service's answer and says why it failed; ``tasks results`` says why
    a page is none: both in the words of an answer taken as the service's data, never
    masked, so a gateway's 200 that quoted the key (``{"message": "key sk-... is unknown"}``,
    a failure whose error names it) put it on stdout and stderr, in clear. Masked there."""

    async def deny(request: web.Request) -> web.Response:
        sent = request.headers.get("x-api-key", "")
        if request.path.endswith("/tags"):
            error = {"code": 805, "message": f"image refused for key {sent}"}
            return web.json_response({"status": "failure", "error": error}, status=200)
        return web.json_response({"status": "failure", "error": f"key {sent} is unknown"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", deny)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    env = {**os.environ, "FASHIONTAG_API_KEY": KEY, "FASHIONTAG_BULK_API_KEY": BULK_KEY}
    try:
        for args in (["tag", "https://img.example/1.jpg"], ["tasks", "results", "t1"]):
            argv = [sys.executable, "-m", "fashiontag_pipeline", *args, "--base-url", url]
            with anyio.fail_after(60):
                result = await anyio.run_process(argv, check=False, env=env, cwd=tmp_path)
            said = result.stdout.decode() + result.stderr.decode()
            assert result.returncode == 1, said
            assert "refused for key" in said or "is unknown" in said, said
            assert FRAGMENT not in said, said
    finally:
        await runner.cleanup()
