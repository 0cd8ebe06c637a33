"""Secrets a user gives in less common places: never shown in what a run writes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import msgspec
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, write_csv
from .test_deployments import one_line, run, run_cmd

SSL_PASSWORD = "sslLEAKpass-7731"


async def _fashiontag(*args: str) -> tuple[int, str]:
    argv = [sys.executable, "-m", "fashiontag_pipeline", *args]
    result = await anyio.run_process(argv, check=False, env={**os.environ})
    return result.returncode, (result.stdout + result.stderr).decode()


async def test_a_client_key_passphrase_in_a_postgresql_url_is_shown_nowhere(
    tmp_path: Path, postgres_url: str
) -> None:
    """libpq's ``sslpassword=`` (the passphrase of an encrypted client key, as a team with
    certificate auth writes it in the URL) was shown as written: in the result store's line
    at start, the run's last line, its ``--summary`` (``state``) and ``reuse stats``, where
    ``password=`` is masked; and the URL flag holding it was not warned of. It is masked as
    a password is, and warned of."""
    url = f"{postgres_url}{'&' if '?' in postgres_url else '?'}sslpassword={SSL_PASSWORD}"
    summary = tmp_path / "summary.json"
    async with running_service(ServiceConfig()) as svc:
        code, out = await _fashiontag(
            *("-vv", "run", str(write_csv(tmp_path / "m.csv", 5))),
            *("--out", str(tmp_path / "o.jsonl"), "--summary", str(summary)),
            *("--state", url, "--reuse", url, "--base-url", svc.url, "--no-progress"),
        )
    assert code == 0, out
    stats_code, stats = await _fashiontag("reuse", "stats", url)
    assert stats_code == 0, stats
    for text in (out, summary.read_text(), stats):
        assert SSL_PASSWORD not in text and "LEAKpass" not in text, text
    assert "sslpassword=%2A%2A%2A" in summary.read_text()  # (as password= is shown)
    assert "--state is visible to other users" in out, out


@pytest.mark.parametrize(
    "value",
    ["http://Hunter2pw/x9@proxy.corp:3128", "http://tagger:31337/Hunter2pw@proxy.corp:3128"],
    ids=["token", "password"],
)
async def test_a_proxy_credential_holding_an_unencoded_slash_is_refused_unshown(
    tmp_path: Path, value: str
) -> None:
    """``HTTPS_PROXY`` whose token or password holds an unencoded ``/`` (pasted as
    generated): the variable's authority was read up to the ``/``, so the credential's head
    was taken for the proxy's host (and port): the run looked it up in DNS, tried it until
    ``--give-up-after`` and named it in every line, its summary and its last error ("cannot
    connect to the proxy http://Hunter2pw"). It is exit 2 at once, naming the variable and
    saying to write ``/`` as ``%2F``, no piece of the credential shown."""
    summary = tmp_path / "summary.json"
    code, err, took = await run(
        run_cmd(
            tmp_path / "o.jsonl",
            str(write_csv(tmp_path / "m.csv", 5)),
            base_url="https://tagger.test",
            extra=("--give-up-after", "3", "--summary", str(summary)),
        ),
        {**ENV, "HTTPS_PROXY": value},
    )
    assert code == 2 and took < 20, err[-1500:]
    line = one_line(err)
    assert "HTTPS_PROXY" in line and "%2F" in line, line
    for text in (err, summary.read_text() if summary.exists() else ""):
        assert "Hunter2pw" not in text and "31337" not in text, text


@pytest.mark.parametrize(
    "url",
    ["https://Hunter2pw/x9@tagger.test", "https://tagger:31337/Hunter2pw@tagger.test/v1"],
    ids=["token", "password"],
)
async def test_a_base_url_credential_holding_an_unencoded_slash_is_refused(
    tmp_path: Path, url: str
) -> None:
    """``FASHIONTAG_BASE_URL=https://TOKEN@gw`` whose token (or password) holds an unencoded
    ``/``: messages masked it (all up to the last ``@`` is the user's part), but requests
    went to its head taken for the host (``Hunter2pw``, ``tagger:31337``): looked up in
    DNS, the secret sent in clear to the resolver, and the run said for ``--give-up-after``
    "cannot connect to https://***@tagger.test", a host that answers. It is exit 2 at once,
    saying to write ``/`` as ``%2F``, as for an unencoded ``#`` or ``?``."""
    code, err, took = await run(
        run_cmd(
            tmp_path / "o.jsonl",
            str(write_csv(tmp_path / "m.csv", 5)),
            base_url=url,
            extra=("--give-up-after", "30"),
        ),
        ENV,
    )
    assert code == 2 and took < 20, err[-1500:]
    line = one_line(err)
    assert "base_url" in line and "%2F" in line, line
    assert "Hunter2pw" not in err and "31337" not in err, err


async def test_a_key_quoted_where_a_tagging_result_should_be_is_masked(tmp_path: Path) -> None:
    """A results page whose row came with a string where its tagging result object should be
    (a gateway's words: ``"taggingResult": "bulk key sk-... not entitled to this model"``):
    the reject's reason (and the warning) quote the start of what came, and quoted the key
    sent in clear into the rejects file. Those words are the service's: the keys are masked,
    before the quote is cut (a key cut short is not shown either)."""
    from fashiontag_pipeline import Secret
    from fashiontag_pipeline.engine import EngineConfig, run_pipeline

    from .helpers import client_config, read_outcomes
    from .proxy import Misbehaviour, misbehaving

    key, bulk = "sk-LEAK-single-5521", "sk-LEAK-bulk-key-77310"
    manifest = write_csv(tmp_path / "m.csv", 10)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    given = {
        "p3": f"bulk key {bulk} is not entitled to this model",
        "p4": f"{'x' * 45} bulk key {bulk}",  # (cut at 60 characters: in the key)
        "p5": f"single key {key} expired",
    }
    service = ServiceConfig(api_keys=(key,), bulk_api_keys=(bulk,))
    async with (
        running_service(service) as svc,
        misbehaving(svc.url, Misbehaviour(results_given=given)) as proxy,
    ):
        client = msgspec.structs.replace(
            client_config(proxy.url), api_key=Secret(key), bulk_api_key=Secret(bulk)
        )
        engine = EngineConfig(poll_min=0.02, poll_max=0.2, linger_seconds=0.2)
        with anyio.fail_after(120):
            summary = await run_pipeline(
                [manifest], client=client, out=out, rejects=rej, engine=engine
            )
    assert summary.complete and summary.rejected == 3, summary
    reasons = {r["id"]: r["reason"] for r in read_outcomes(out, rej).rejects}
    assert "not entitled" in reasons["p3"] and "expired" in reasons["p5"], reasons
    text = rej.read_text()
    for secret in (key, bulk, "sk-LEAK", "LEAK-bulk", "LEAK-single"):
        assert secret not in text, text


async def test_a_key_quoted_in_a_tasks_status_word_is_masked(tmp_path: Path) -> None:
    """A task list or status answer whose ``taskStatus`` is none the spec names and quotes
    the key (a gateway's ``"taskStatus": "HELD_FOR_KEY sk-..."``): the run's warning ("the
    service says it is ...") and ``tasks list`` / ``tasks status`` printed it as it came, key
    and all. The words of a task's status are the service's: the keys sent are masked."""
    import re

    import aiohttp
    from aiohttp import web

    key = "sk-LEAK-status-key-8842"
    odd = f"HELD_FOR_KEY {key}".encode()
    rewrites = [3]  # (the first answers holding a task's status)

    async with running_service(ServiceConfig(api_keys=(key,), bulk_api_keys=(key,))) as svc:
        session = aiohttp.ClientSession()

        async def forward(request: web.Request) -> web.Response:
            headers = {k: v for k, v in request.headers.items() if k.lower() == "x-api-key"}
            headers["Content-Type"] = "application/json"
            async with session.request(
                request.method,
                svc.url + request.path_qs,
                data=await request.read(),
                headers=headers,
            ) as answer:
                body, status = await answer.read(), answer.status
            if request.method == "GET" and b'"taskStatus"' in body and rewrites[0] > 0:
                rewrites[0] -= 1
                body = re.sub(rb'"taskStatus":\s*"[^"]*"', b'"taskStatus":"' + odd + b'"', body)
            return web.Response(body=body, status=status, content_type="application/json")

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        url = f"http://127.0.0.1:{port}"
        env = {**ENV, "FASHIONTAG_API_KEY": key, "FASHIONTAG_BULK_API_KEY": key}
        try:
            code, err, _ = await run(
                run_cmd(tmp_path / "o.jsonl", str(write_csv(tmp_path / "m.csv", 5)), base_url=url),
                env,
            )
            assert code == 0, err[-1500:]
            assert "HELD_FOR_KEY" in err and key not in err, err[-1500:]
            task_id = json.loads((tmp_path / "o.jsonl").read_text().splitlines()[0])["taskId"]
            for command in (["list"], ["status", task_id]):
                rewrites[0] = 1
                argv = [sys.executable, "-m", "fashiontag_pipeline", "tasks", *command]
                shown = await anyio.run_process([*argv, "--base-url", url], env=env, check=False)
                out = (shown.stdout + shown.stderr).decode()
                assert shown.returncode == 0 and "HELD_FOR_KEY" in out, out
                assert key not in out and "LEAK-status" not in out, out
        finally:
            await runner.cleanup()
            await session.close()


#: A key as many are issued: base64, with a ``+`` and a ``/`` in it.
PLUS_KEY = "LEAKpl+ab/Cd9+xyZ0=="


@pytest.mark.parametrize("status", [401, 403])
async def test_a_key_echoed_as_dotnet_json_escapes_it_is_masked(
    tmp_path: Path, status: int
) -> None:
    """A gateway of ASP.NET Core echoes the key in its refusal: its JSON encoder (the default
    of System.Text.Json) writes ``+`` as ``\\u002B`` (and ``<``, ``>``, ``&``, ``'``, a
    backquote so too), so a base64 key ``LEAKpl+ab/...`` came as ``LEAKpl\\u002Bab/...``: none
    of the forms masked, its message held the key's pieces in clear: on stderr and in
    ``--summary``. That form is masked too (and the lower-case ``\\u002b`` others write)."""
    from aiohttp import web

    async def refuse(request: web.Request) -> web.Response:
        sent = request.headers.get("x-api-key", "").replace("+", "\\u002B")
        body = '{"error":{"code":609,"message":"invalid api key ' + sent + '"}}'
        return web.Response(status=status, body=body, content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    env = {**ENV, "FASHIONTAG_API_KEY": PLUS_KEY, "FASHIONTAG_BULK_API_KEY": PLUS_KEY}
    out = tmp_path / "o.jsonl"
    try:
        code, err, _ = await run(
            run_cmd(
                out,
                str(write_csv(tmp_path / "m.csv", 5)),
                base_url=f"http://127.0.0.1:{port}",
                extra=("--give-up-after", "2"),
            ),
            env,
        )
    finally:
        await runner.cleanup()
    summary = out.with_suffix(".summary").read_text()
    assert code != 0 and "invalid api key" in err, err[-1500:]
    for text in (err, summary):
        assert "LEAKpl" not in text and "ab/Cd9" not in text and "xyZ0" not in text, text


async def test_a_key_json_escaped_where_a_tagging_result_should_be_is_masked(
    tmp_path: Path,
) -> None:
    """As above, the words where a row's tagging result object should be written by a JSON
    encoder that escapes ``+`` (System.Text.Json: ``\\u002B``): the reject quotes them as
    they came (JSON), and that form of the key was not masked: both its halves in clear in
    the rejects file. Every ``\\u`` form such encoders write of a key is masked."""
    import aiohttp
    from aiohttp import web

    from .helpers import read_outcomes

    odd = PLUS_KEY.replace("+", "\\u002B").encode()
    async with running_service(
        ServiceConfig(api_keys=(PLUS_KEY,), bulk_api_keys=(PLUS_KEY,))
    ) as svc:
        session = aiohttp.ClientSession()

        async def forward(request: web.Request) -> web.Response:
            headers = {k: v for k, v in request.headers.items() if k.lower() == "x-api-key"}
            headers["Content-Type"] = "application/json"
            async with session.request(
                request.method,
                svc.url + request.path_qs,
                data=await request.read(),
                headers=headers,
            ) as answer:
                body, status = await answer.read(), answer.status
            if request.method == "GET" and b'"taggingResult"' in body:
                page = json.loads(body)
                for row in page["data"]["results"]:
                    if row["id"] == "p3":
                        row["taggingResult"] = "__ODD__"
                body = (
                    json.dumps(page).encode().replace(b'"__ODD__"', b'"key ' + odd + b' refused"')
                )
            return web.Response(body=body, status=status, content_type="application/json")

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        env = {**ENV, "FASHIONTAG_API_KEY": PLUS_KEY, "FASHIONTAG_BULK_API_KEY": PLUS_KEY}
        out = tmp_path / "o.jsonl"
        try:
            code, err, _ = await run(
                run_cmd(
                    out, str(write_csv(tmp_path / "m.csv", 6)), base_url=f"http://127.0.0.1:{port}"
                ),
                env,
            )
        finally:
            await runner.cleanup()
            await session.close()
    assert code == 0, err[-1500:]
    (reject,) = read_outcomes(out, out.with_suffix(".rej")).rejects
    assert reject["id"] == "p3" and "refused" in reject["reason"], reject
    for text in (err, out.with_suffix(".rej").read_text()):
        assert "LEAKpl" not in text and "ab/Cd9" not in text and "xyZ0" not in text, text
