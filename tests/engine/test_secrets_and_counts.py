"""Promises the first fixes for unstaged server answers left open (found by a review):
secrets in chained errors, the counts of a write answered 204."""

from __future__ import annotations

import base64
import contextlib
from pathlib import Path

import anyio
import anyio.abc
import msgspec
import pytest

from .helpers import dead_port
from .test_contracts_cli import _GONE, BULK_KEY, KEY, _chain

PASSWORD = "pw-REVIEW-CANARY"


@pytest.mark.parametrize("userinfo", [f"tagger:{PASSWORD}", PASSWORD], ids=["password", "token"])
async def test_a_base_url_password_is_in_no_exception_of_a_client_errors_chain(
    userinfo: str,
) -> None:
    """Promise 5, as 038847f reads it (a password in the base URL is a secret: ClientConfig's
    repr masks it). aiohttp moves ``user:password@`` of a URL into an ``Authorization: Basic``
    header and keeps the URL whole in ``RequestInfo.url``/``real_url``: the RequestInfo that
    f5310ae masks (``x-api-key`` only) still shows the password twice, in clear and base64.
    A token given alone (``https://TOKEN@gw``, a gateway that takes the key as the basic-auth
    user, as Stripe's does) is sent the same way, as ``TOKEN:``: it was shown in clear in
    every message, the config's repr and the chain."""

    async def garbage(reader: anyio.abc.ByteStream) -> None:
        # (The client's probe for TLS is refused at once: see test_contracts_cli's twin.)
        async with reader:
            with anyio.move_on_after(5), contextlib.suppress(*_GONE):
                data = await reader.receive()
                if data.startswith(b"\x16"):  # (the probe's ClientHello: no TLS here)
                    return
                while b"\r\n\r\n" not in data:
                    data += await reader.receive()
                await reader.send(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nBad\x01Header: x\r\n\r\n{}"
                )

    from fashiontag_pipeline import ClientConfig, RetryPolicy, TaggerClient

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    config = ClientConfig(
        base_url=f"http://{userinfo}@127.0.0.1:{port}",
        api_key=KEY,
        bulk_api_key=BULK_KEY,
        retry=RetryPolicy(max_attempts=1),
    )
    assert PASSWORD not in repr(config)
    basic = base64.b64encode(f"{userinfo}{'' if ':' in userinfo else ':'}".encode()).decode()
    errors: list[BaseException] = []
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, garbage)
        async with TaggerClient(config=config) as client:
            for call in (client.list_tasks, lambda: client.task_status("t1")):
                try:
                    await call()
                except Exception as err:  # each call fails: its chain is checked
                    errors.append(err)
        tg.cancel_scope.cancel()
    unreachable = msgspec.structs.replace(
        config, base_url=f"http://{userinfo}@127.0.0.1:{dead_port()}"
    )
    async with TaggerClient(config=unreachable) as client:
        try:
            await client.list_tasks()
        except Exception as err:  # a message that names the base URL
            errors.append(err)
    assert len(errors) == 3
    for err in errors:
        for item in _chain(err):
            text = f"{item!r} {item}"
            assert PASSWORD not in text and basic not in text, (
                f"{type(err).__name__} carries {type(item).__name__} showing the password: {text}"
            )


async def test_rows_of_a_write_answered_204_count_as_submitted(tmp_path: Path) -> None:
    """A write answered ``204 No Content`` is applied (04ab8b5): its rows are in the task as
    much as those of a 202. The summary's ``submitted`` (and a daemon's summary.json) must
    count them, or a run that tagged 3,000 rows says it submitted 1,000."""
    from .helpers import run_misbehaving
    from .proxy import Misbehaviour
    from .test_unstaged_servers import LONG_TASKS

    summary, _, o = await run_misbehaving(
        tmp_path, 3000, Misbehaviour(no_content_writes={"PUT"}), LONG_TASKS
    )
    assert summary.complete and len(o.results) == 3000
    assert summary.tagged + summary.failed == 3000
    assert summary.submitted == 3000, (summary.submitted, summary.tagged)


async def test_a_proxy_password_is_in_no_exception_of_a_407s_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An ``https://`` service behind a proxy that refuses the credentials of HTTPS_PROXY
    (407 to the CONNECT): aiohttp's ClientHttpProxyError, chained under the ConfigError, keeps
    the CONNECT's RequestInfo, whose repr showed ``Proxy-Authorization: Basic <user:password
    in base64>``: only errors of an exchange were scrubbed, not those of a connection."""
    from fashiontag_pipeline import ClientConfig, ConfigError, RetryPolicy, TaggerClient

    from .gateways import ForwardProxy

    basic = base64.b64encode(f"team:{PASSWORD}".encode()).decode()
    async with ForwardProxy({}, require_auth="team:another").running() as proxy:
        monkeypatch.setenv("HTTPS_PROXY", f"http://team:{PASSWORD}@127.0.0.1:{proxy.port}")
        config = ClientConfig(
            base_url="https://tagger.test/v1",
            api_key=KEY,
            bulk_api_key=BULK_KEY,
            retry=RetryPolicy(max_attempts=1),
        )
        async with TaggerClient(config=config) as client:
            with pytest.raises(ConfigError) as caught:
                await client.list_tasks()
    assert "407" in str(caught.value)
    for item in _chain(caught.value):
        text = f"{item!r} {item}"
        for secret in (PASSWORD, basic, KEY, BULK_KEY):
            assert secret not in text, f"{type(item).__name__} shows a secret: {text}"


async def test_a_service_that_quotes_the_key_in_its_refusals_leaks_it_nowhere(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A service (or a gateway) whose refusals quote the key they were sent with, as some
    do (``request refused for API key sk-...: ...``): the refusal of one row's write became its
    reject's reason, and a refused key the run's one-line error, key and all, in the rejects
    file, the logs and the summary. The keys sent are masked in every message of an answer."""
    import logging

    from aiohttp import web

    from fashiontag_pipeline._config import DEV_BULK_API_KEY
    from fashiontag_pipeline.engine import run_pipeline
    from fashiontag_pipeline.service import ServiceConfig, running_service

    from .helpers import client_config, run_through, write_csv
    from .proxy import MisbehavingProxy, Misbehaviour
    from .test_unstaged_servers import LONG_TASKS

    class Quoting(MisbehavingProxy):
        """Writes holding ``p1500`` refused 400, every request once ``refuse_all`` is set
        refused 401, each message quoting the key it came with."""

        refuse_all = False

        async def handle(self, request: web.Request) -> web.StreamResponse:
            key = request.headers.get("x-api-key", "")
            if self.refuse_all:
                error = {"code": 609, "message": f"authentication failed for API key {key}"}
                return web.json_response({"status": "failure", "error": error}, status=401)
            if request.method in ("POST", "PUT") and b'"p1500"' in await request.read():
                message = f"request refused for API key {key}: image p1500 is not allowed"
                return web.json_response({"status": "failure", "error": message}, status=400)
            return await super().handle(request)

    caplog.set_level(logging.DEBUG)
    (tmp_path / "a").mkdir()
    proxy = Quoting("", Misbehaviour())
    summary, o = await run_through(tmp_path / "a", 3000, proxy, LONG_TASKS)
    assert summary.complete and [r["id"] for r in o.rejects] == ["p1500"]
    assert "image p1500 is not allowed" in o.rejects[0]["reason"]
    manifest = write_csv(tmp_path / "m.csv", 50)
    proxy = Quoting("", Misbehaviour())
    proxy.refuse_all = True
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            with pytest.raises(Exception) as caught:
                await run_pipeline(
                    [manifest],
                    client=client_config(proxy.url),
                    out=tmp_path / "out.jsonl",
                    rejects=tmp_path / "rej.jsonl",
                )
    assert "authentication failed" in str(caught.value)
    texts = [caplog.text, *(f"{e!r} {e}" for e in _chain(caught.value))]
    texts += [p.read_bytes().decode("utf-8", "replace") for p in tmp_path.rglob("*") if p.is_file()]
    leaked = [t for t in texts if DEV_BULK_API_KEY in t]
    assert not leaked, leaked[0][:2000]


async def test_a_results_page_refused_200_quoting_the_key_leaks_it_nowhere(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A gateway answering the results reads HTTP 200 with the spec's failure body quoting the
    key (``{"status": "failure", "error": "refused for API key sk-..."}``): the status and list
    reads mask it, but a results page so answered is read by the engine's own decoder, whose
    reason ("HTTP 200 with status 'failure': ...") went whole into the log lines and the run's
    final error, key and all. It is masked there too (a results page the service gives is not
    scanned: the hot path)."""
    import logging

    from aiohttp import web

    from fashiontag_pipeline._config import DEV_BULK_API_KEY
    from fashiontag_pipeline.engine import run_pipeline
    from fashiontag_pipeline.service import ServiceConfig, running_service

    from .helpers import client_config, write_csv
    from .proxy import MisbehavingProxy, Misbehaviour

    class Refusing(MisbehavingProxy):
        async def handle(self, request: web.Request) -> web.StreamResponse:
            page = request.path.startswith("/tagger/v2.12/bulk/") and "offset" in request.query
            if request.method == "GET" and page:
                key = request.headers.get("x-api-key", "")
                body = {"status": "failure", "error": f"refused for API key {key}"}
                return web.json_response(body, status=200)
            return await super().handle(request)

    caplog.set_level(logging.DEBUG)
    manifest = write_csv(tmp_path / "m.csv", 1000)
    proxy = Refusing("", Misbehaviour())
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            with anyio.fail_after(120), pytest.raises(Exception) as caught:
                await run_pipeline(
                    [manifest],
                    client=client_config(proxy.url),
                    out=tmp_path / "out.jsonl",
                    rejects=tmp_path / "rej.jsonl",
                )
    assert "refused for API key" in str(caught.value)
    texts = [caplog.text, *(f"{e!r} {e}" for e in _chain(caught.value))]
    texts += [p.read_bytes().decode("utf-8", "replace") for p in tmp_path.rglob("*") if p.is_file()]
    leaked = [t for t in texts if DEV_BULK_API_KEY in t]
    assert not leaked, leaked[0][:2000]


#: Answers whose HTTP head is none, each quoting the key it was sent where aiohttp's parser
#: stops (a broken gateway, a server of another protocol that echoes what it reads).
UNREADABLE_HEADS = {
    "status-code": b"HTTP/1.1 4O1 key %s\r\nContent-Length: 2\r\n\r\n{}",
    "version": b"HTTX/1.1 401 key %s\r\nContent-Length: 2\r\n\r\n{}",
    "header-line": b"HTTP/1.1 401 Unauthorized\r\nbad key %s\r\nContent-Length: 2\r\n\r\n{}",
    "chunk-size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%s\r\n{}\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("head", sorted(UNREADABLE_HEADS))
async def test_a_key_quoted_in_an_unreadable_http_head_is_masked(head: str) -> None:
    """An answer whose HTTP head aiohttp's parser cannot read, the key it was sent on the
    line where the parser stops: its message quotes that line (``Bad status line: b'HTTP/1.1
    4O1 key sk-...'``), and it went whole into the error (``answered an unreadable HTTP head
    (...)``: stderr, the logs, ``--summary``) and into the aiohttp errors it chains. The
    keys sent are masked there too."""
    import asyncio

    from fashiontag_pipeline import ClientConfig, RetryPolicy, Secret, TaggerClient

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if await reader.read(1) in (b"\x16", b""):  # (the client's probe for TLS, or none)
                writer.close()
                return
            request = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):  # (a client gone)
            writer.close()
            return
        sent = [
            line.partition(b":")[2].strip()
            for line in request.split(b"\r\n")
            if line.lower().startswith(b"x-api-key:")
        ]
        writer.write(UNREADABLE_HEADS[head] % (sent[0] if sent else b""))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    config = ClientConfig(
        base_url=f"http://127.0.0.1:{port}",
        api_key=Secret(KEY),
        bulk_api_key=Secret(BULK_KEY),
        retry=RetryPolicy(max_attempts=1),
    )
    try:
        async with TaggerClient(config=config) as client:
            with anyio.fail_after(30), pytest.raises(Exception) as caught:
                await client.list_tasks()
    finally:
        server.close()
    assert "unreadable HTTP head" in str(caught.value), caught.value
    for item in _chain(caught.value):
        text = f"{item!r} {item} {vars(item)}"
        assert BULK_KEY not in text, f"{type(item).__name__} shows the key: {text}"
