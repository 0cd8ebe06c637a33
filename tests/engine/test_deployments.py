"""``fashiontag run`` / ``daemon`` pointed at a tagging service as deployments put it, not at the
embedded one on plain ``http://127.0.0.1:PORT`` (found by a hunt; each test failed before its
fix unless it says otherwise): a gateway that mounts the service under a path prefix, IPv6
loopback, TLS with a private CA, the machine's proxy variables, gateways that redirect, answer
HTML error pages or close idle connections, and base URLs as shell scripts and config files
hand them over (a line end, spaces, a password). Every server is real, on loopback.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from PIL import Image as PILImage

from fashiontag_pipeline import RetryPolicy, TaggerClient
from fashiontag_pipeline._connect import WRITE_IDLE_MAX
from fashiontag_pipeline._models import BulkContext, Image, ImageType, TaggingRequest
from fashiontag_pipeline._proxies import proxy_for
from fashiontag_pipeline.service import ServiceConfig, running_service

from .gateways import ForwardProxy, IdleClosingGateway, PrefixGateway, make_pki
from .helpers import ENV, assert_exactly_once, dead_port, short_deadline, write_csv

BULK = "/tagger/v2.12/bulk"
SINGLE = "/tagger/v2/tags"
#: Each row its own outcome; a run whose every task takes several chunks (PUTs) and pages.
ENGINE_FLAGS = ("--rotate-images", "3000", "--rotate-min-images", "3000", "--linger", "0.2")


def run_cmd(out: Path, *manifests: str, base_url: str | None = None, extra: tuple[str, ...] = ()):
    """``fashiontag run`` with results to ``out`` (rejects ``.rej``, summary ``.summary``)."""
    import sys

    args = [sys.executable, "-m", "fashiontag_pipeline", "run", *manifests, "--out", str(out)]
    args += ["--rejects", str(out.with_suffix(".rej")), "--summary", str(summary_of(out))]
    args += ["--no-progress", *extra]
    if base_url is not None:
        args += ["--base-url", base_url]
    return args


def summary_of(out: Path) -> Path:
    return out.with_suffix(".summary")


async def run(
    args: list[str], env: dict[str, str] | None = None, *, stdin: bytes | None = None
) -> tuple[int, str, float]:
    started = time.monotonic()
    result = await anyio.run_process(args, check=False, env=env or ENV, input=stdin)
    return result.returncode, result.stderr.decode(), time.monotonic() - started


def one_line(stderr: str) -> str:
    """The run's last stderr line (its one-line reason), checked to be a clean error."""
    assert "Traceback" not in stderr, stderr[-2000:]
    lines = [line for line in stderr.splitlines() if line.startswith("fashiontag: ")]
    assert lines, stderr[-1000:]
    return lines[-1]


def picture(path: Path) -> Path:
    canvas = PILImage.new("RGB", (240, 320), (250, 250, 250))
    canvas.paste((200, 20, 30), (60, 60, 180, 280))
    canvas.save(path)
    return path


def manifest_with_a_local_file(tmp_path: Path, n: int) -> tuple[Path, set[str]]:
    """``n`` URL rows (bulk) and one local picture (the single endpoint)."""
    path = write_csv(tmp_path / "m.csv", n, extra=[f"local,{picture(tmp_path / 'red.png')},,"])
    return path, {f"p{i}" for i in range(n)} | {"local"}


# --------------------------------------------------------------------------- path prefixes


@pytest.mark.parametrize(
    ("mounted", "given"),
    [
        ("/tagging/v1", "/tagging/v1"),
        ("/tagging/v1", "/tagging/v1/"),
        ("/tenant%20a", "/tenant a/"),
        ("/t%C3%A9nant", "/t%C3%A9nant"),
        ("/t%C3%A9nant", "/ténant/"),
    ],
)
async def test_every_request_goes_under_the_gateways_path_prefix(
    tmp_path: Path, mounted: str, given: str
) -> None:
    """Create, append, list, status, pages and the single endpoint all go under the prefix,
    with or without its trailing slash, typed percent-encoded or not (passed before: kept)."""
    manifest, ids = manifest_with_a_local_file(tmp_path, 2500)
    out = tmp_path / "out.jsonl"
    async with (
        running_service(ServiceConfig()) as svc,
        PrefixGateway(svc.url, mounted).running() as gw,
    ):
        code, err, _ = await run(
            run_cmd(out, str(manifest), base_url=gw.url + given, extra=ENGINE_FLAGS)
        )
    assert code == 0, err[-1500:]
    assert_exactly_once(out, out.with_suffix(".rej"), ids)
    assert gw.seen and all(s.split(" ", 1)[1].startswith(mounted + "/") for s in gw.seen)
    kinds = {(s.split(" ")[0], s.split(" ")[1][len(mounted) :].split("?")[0]) for s in gw.seen}
    assert {("POST", BULK), ("GET", BULK), ("POST", SINGLE)} <= kinds, kinds
    methods = {m for m, path in kinds if path.startswith(BULK + "/")}
    assert {"PUT", "GET"} <= methods, kinds


async def test_a_base_url_without_the_gateways_prefix_is_one_line_naming_the_url(
    tmp_path: Path,
) -> None:
    """The gateway answers 404 with an HTML page for a path it does not route: the run stops
    at the first create (exit 1), its line names the full URL asked, not only the path."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    out = tmp_path / "out.jsonl"
    async with (
        running_service(ServiceConfig()) as svc,
        PrefixGateway(svc.url, "/tagging/v1").running() as gw,
    ):
        code, err, took = await run(run_cmd(out, str(manifest), base_url=gw.url + "/tagging"))
    assert code == 1
    line = one_line(err)
    assert f"{gw.url}/tagging{BULK}" in line and "base URL" in line, line
    assert "<" not in line, line  # the page's title, not its markup
    assert took < 20


# --------------------------------------------------------------------------- IPv6


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback (::1) on this machine")
async def test_an_ipv6_loopback_service_behind_a_prefix(tmp_path: Path) -> None:
    manifest, ids = manifest_with_a_local_file(tmp_path, 1500)
    out = tmp_path / "out.jsonl"
    async with (
        running_service(ServiceConfig(), host="::1") as svc,
        PrefixGateway(svc.url, "/v1", host="::1").running() as gw,
    ):
        assert gw.url.startswith("http://[::1]:")
        code, err, _ = await run(run_cmd(out, str(manifest), base_url=gw.url + "/v1/"))
    assert code == 0, err[-1500:]
    assert_exactly_once(out, out.with_suffix(".rej"), ids)


# --------------------------------------------------------------------------- TLS


async def test_a_private_ca_is_given_with_ssl_cert_file(tmp_path: Path) -> None:
    """An https gateway whose certificate a private CA signed: without the CA the run stops at
    once (exit 1, one line naming SSL_CERT_FILE, nothing sent), not after retrying for the
    whole --give-up-after (120 s) on a fault no retry can fix; with SSL_CERT_FILE it runs."""
    pki = make_pki(tmp_path / "pki")
    manifest, ids = manifest_with_a_local_file(tmp_path, 1200)
    out = tmp_path / "out.jsonl"
    async with (
        running_service(ServiceConfig()) as svc,
        PrefixGateway(svc.url, "/api", tls=pki).running() as gw,
    ):
        url = gw.url.replace("127.0.0.1", "localhost") + "/api"
        code, err, took = await run(run_cmd(out, str(manifest), base_url=url))
        assert code == 1, err[-1500:]
        line = one_line(err)
        assert "not trusted" in line and "SSL_CERT_FILE" in line, line
        assert took < 20, f"{took:.0f} s: retried a certificate it cannot trust"
        assert not gw.seen and not svc.store.tasks
        summary = json.loads(summary_of(out).read_text())
        assert summary["complete"] is False and "SSL_CERT_FILE" in summary["error"]

        # (A create in flight when the first run stopped is looked for by the second for the
        # request deadline after it was sent: short here.)
        code, err, _ = await run(
            run_cmd(out, str(manifest), base_url=url, extra=short_deadline(tmp_path)),
            {**ENV, "SSL_CERT_FILE": str(pki.ca)},
        )
    assert code == 0, err[-1500:]
    assert_exactly_once(out, out.with_suffix(".rej"), ids)
    assert all(s.split(" ", 1)[1].startswith("/api/") for s in gw.seen)


async def test_a_certificate_for_another_name_and_https_to_a_plain_port_stop_at_once(
    tmp_path: Path,
) -> None:
    pki = make_pki(tmp_path / "pki", ("tagger.example",), addresses=False)
    manifest = write_csv(tmp_path / "m.csv", 20)
    env = {**ENV, "SSL_CERT_FILE": str(pki.ca)}
    async with (
        running_service(ServiceConfig()) as svc,
        PrefixGateway(svc.url, "/api", tls=pki).running() as gw,
    ):
        code, err, took = await run(
            run_cmd(tmp_path / "a.jsonl", str(manifest), base_url=gw.url + "/api"), env
        )
        assert code == 1 and took < 20
        assert "for another name" in one_line(err), err[-500:]
        plain = svc.url.replace("http://", "https://")
        code, err, took = await run(run_cmd(tmp_path / "b.jsonl", str(manifest), base_url=plain))
        assert code == 1 and took < 20
        assert "does not speak TLS" in one_line(err), err[-500:]
        assert not svc.store.tasks


async def test_the_daemon_stops_on_an_untrusted_certificate_with_one_log_line(
    tmp_path: Path,
) -> None:
    """Like a refused key: exit 1 and one JSON line saying why, not a daemon that retries a
    certificate it cannot trust for ever while its manifests wait."""
    import sys

    pki = make_pki(tmp_path / "pki")
    inbox, outbox = tmp_path / "in", tmp_path / "out"
    inbox.mkdir()
    write_csv(inbox / "a.csv", 20)
    (inbox / "a.csv.ready").touch()
    async with (
        running_service(ServiceConfig()) as svc,
        PrefixGateway(svc.url, "/api", tls=pki).running() as gw,
    ):
        args = [sys.executable, "-m", "fashiontag_pipeline", "daemon", "--inbox", str(inbox)]
        args += ["--outbox", str(outbox), "--listen", "", "--log-format", "json"]
        args += ["--scan-interval", "0.2", "--base-url", gw.url + "/api"]
        with anyio.fail_after(60):
            result = await anyio.run_process(args, check=False, env=ENV)
    assert result.returncode == 1, result.stderr.decode()[-1000:]
    lines = [json.loads(line) for line in result.stderr.decode().splitlines()]
    errors = [line for line in lines if line["level"] == "error"]
    assert len(errors) == 1 and "SSL_CERT_FILE" in errors[0]["error"], lines


# --------------------------------------------------------------------------- proxies


async def test_https_proxy_and_a_private_ca_reach_a_service_by_a_name_only_the_proxy_knows(
    tmp_path: Path,
) -> None:
    """The corporate set-up: the service's name resolves only at the proxy (HTTPS_PROXY,
    CONNECT), its certificate comes from a private CA (SSL_CERT_FILE). Before, the proxy
    variables were ignored: the run could not reach the service at all."""
    pki = make_pki(tmp_path / "pki", ("tagger.test",))
    manifest, ids = manifest_with_a_local_file(tmp_path, 1500)
    out = tmp_path / "out.jsonl"
    async with (
        running_service(ServiceConfig()) as svc,
        PrefixGateway(svc.url, "/v1", tls=pki).running() as gw,
    ):
        port = int(gw.url.rsplit(":", 1)[1])
        async with ForwardProxy(
            {"tagger.test:443": ("127.0.0.1", port)}, require_auth="team:s3cret-proxy"
        ).running() as proxy:
            env = {**ENV, "SSL_CERT_FILE": str(pki.ca)}
            env["HTTPS_PROXY"] = f"http://team:s3cret-proxy@127.0.0.1:{proxy.port}"
            code, err, _ = await run(
                run_cmd(out, str(manifest), base_url="https://tagger.test/v1", extra=("-v",)),
                env,
            )
            assert code == 0, err[-1500:]
            assert "s3cret-proxy" not in err
            assert proxy.seen and set(proxy.seen) == {"CONNECT tagger.test:443 HTTP/1.1"}

            # The same proxy without its credentials: 407, one line naming the variable.
            env["HTTPS_PROXY"] = f"http://127.0.0.1:{proxy.port}"
            code, err, took = await run(
                run_cmd(tmp_path / "b.jsonl", str(manifest), base_url="https://tagger.test/v1"),
                env,
            )
    assert_exactly_once(out, out.with_suffix(".rej"), ids)
    assert all(s.split(" ", 1)[1].startswith("/v1/") for s in gw.seen)
    assert code == 1 and took < 20
    line = one_line(err)
    assert "407" in line and "HTTPS_PROXY" in line, line


async def test_http_proxy_forwards_a_plain_http_service(tmp_path: Path) -> None:
    manifest = write_csv(tmp_path / "m.csv", 1200)
    out = tmp_path / "out.jsonl"
    async with (
        running_service(ServiceConfig()) as svc,
        PrefixGateway(svc.url, "/v1").running() as gw,
    ):
        port = int(gw.url.rsplit(":", 1)[1])
        async with ForwardProxy({"tagger.test:80": ("127.0.0.1", port)}).running() as proxy:
            env = {**ENV, "http_proxy": proxy.url}
            code, err, _ = await run(
                run_cmd(out, str(manifest), base_url="http://tagger.test/v1"), env
            )
    assert code == 0, err[-1500:]
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(1200)})
    assert proxy.seen and all(" http://tagger.test/v1/" in line for line in proxy.seen)


async def test_a_dead_proxy_is_named_and_bills_nothing(tmp_path: Path) -> None:
    """HTTPS_PROXY left pointing at a proxy that is gone: the run keeps trying for
    --give-up-after, then stops with one line naming the proxy and its variable (not 'cannot
    connect to the service'); no task was created. A loopback service is never proxied: the
    same variables set, a run against the embedded service works."""
    manifest = write_csv(tmp_path / "m.csv", 50)
    dead = f"http://127.0.0.1:{dead_port()}"
    env = {**ENV, "HTTPS_PROXY": dead, "HTTP_PROXY": dead, "ALL_PROXY": dead}
    code, err, took = await run(
        run_cmd(
            tmp_path / "a.jsonl",
            str(manifest),
            base_url="https://tagger.test/v1",
            extra=("--give-up-after", "2"),
        ),
        env,
    )
    assert code == 1 and took < 30, err[-1000:]
    line = one_line(err)
    assert f"the proxy {dead} (from HTTPS_PROXY)" in line, line
    async with running_service(ServiceConfig()) as svc:
        out = tmp_path / "b.jsonl"
        code, err, _ = await run(run_cmd(out, str(manifest), base_url=svc.url), env)
        localhost = svc.url.replace("127.0.0.1", "localhost")
        code2, err2, _ = await run(
            run_cmd(tmp_path / "c.jsonl", str(manifest)), env | {"FASHIONTAG_BASE_URL": localhost}
        )
    assert code == 0, err[-1000:]
    assert code2 == 0, err2[-1000:]
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(50)})


@pytest.mark.parametrize(
    ("host", "port", "no_proxy", "proxied"),
    [
        ("tagger.example", None, "", True),
        ("tagger.example", None, "tagger.example", False),
        ("api.tagger.example", None, ".tagger.example", False),
        ("api.tagger.example", None, "tagger.example", False),
        ("nottagger.example", None, "tagger.example", True),
        ("tagger.example", 8443, "tagger.example:8443", False),
        ("tagger.example", 9443, "tagger.example:8443", True),
        ("tagger.example", None, "tagger.example:443", False),
        ("tagger.example", None, "tagger.example:8443", True),
        ("api.corp.example", None, "*.corp.example", False),
        ("api.corp.example", None, "localhost, *.corp.example", False),
        ("10.1.2.3", None, "10.0.0.0/8", False),
        ("192.168.1.1", None, "10.0.0.0/8,  ", True),
        ("tagger.example", None, "*", False),
        ("localhost", None, "", False),
        ("127.0.0.2", None, "", False),
        ("::1", None, "", False),
    ],
)
def test_which_services_go_through_the_proxy(
    host: str, port: int | None, no_proxy: str, proxied: bool
) -> None:
    env = {"https_proxy": "http://proxy.corp:3128", "NO_PROXY": no_proxy}
    route = proxy_for("https", host, port, env)
    assert (route is not None) is proxied


async def test_a_proxy_variable_the_client_cannot_use_is_exit_2(tmp_path: Path) -> None:
    manifest = write_csv(tmp_path / "m.csv", 5)
    env = {**ENV, "HTTPS_PROXY": "socks5://u:pw-secret@127.0.0.1:1080"}
    code, err, _ = await run(
        run_cmd(tmp_path / "o.jsonl", str(manifest), base_url="https://tagger.test"), env
    )
    assert code == 2
    line = one_line(err)
    assert "HTTPS_PROXY" in line and "http://" in line and "pw-secret" not in line, line


# --------------------------------------------------------------------------- gateways


@pytest.mark.parametrize("status", [502, 503, 504])
async def test_a_gateway_answering_html_error_pages_then_recovering(
    tmp_path: Path, status: int
) -> None:
    """The service behind the gateway is down: the run keeps trying for --give-up-after, then
    stops (exit 1) with one line quoting the page's title, not its markup; nothing reached the
    service. Once the gateway recovers, the same command finishes: every row once."""
    manifest = write_csv(tmp_path / "m.csv", 1500)
    out = tmp_path / "out.jsonl"
    # (A create the gateway answered 502/504 may have been applied behind it: the resume
    # looks for it for the request deadline after it was sent, short here.)
    args = run_cmd(out, str(manifest), extra=("--give-up-after", "2", *short_deadline(tmp_path)))
    async with (
        running_service(ServiceConfig()) as svc,
        PrefixGateway(svc.url, "/v1", failing=status).running() as gw,
    ):
        env = {**ENV, "FASHIONTAG_BASE_URL": gw.url + "/v1"}
        code, err, took = await run(args, env)
        assert code == 1 and took < 30, err[-1000:]
        line = one_line(err)
        assert f"HTTP {status}" in line and "<" not in line, line
        assert not svc.store.tasks
        gw.failing = None
        code, err, _ = await run(args, env)
    assert code == 0, err[-1500:]
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(1500)})


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_a_redirect_is_not_followed_and_names_the_new_base_url(
    tmp_path: Path, status: int
) -> None:
    """http -> https or to a new path: never followed (the key would go to whatever the
    answer names), exit 1 at once, the line naming the base URL to give (passed before but
    for the base URL to give)."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    async with (
        running_service(ServiceConfig()) as svc,
        PrefixGateway(svc.url, "/v2").running() as target,
    ):
        moved = target.url + "/v2"
        async with PrefixGateway(
            svc.url, "/v1", redirect_to=moved, redirect_status=status
        ).running() as old:
            code, err, took = await run(
                run_cmd(tmp_path / "o.jsonl", str(manifest), base_url=old.url + "/v1")
            )
    assert code == 1 and took < 20
    line = one_line(err)
    assert f"give the base URL {moved}" in line, line
    assert not target.seen and not svc.store.tasks


async def test_writes_never_go_on_a_connection_the_gateway_may_have_closed(
    tmp_path: Path,
) -> None:
    """A gateway that closes connections idle for 1.3 s, just as the next request arrives
    (the race of every keep-alive timeout, made certain): before, each write sent after such
    a pause was lost on the old connection, of unknown fate to the client (an ambiguous write:
    a task-list look-up, a warning), and each read a retry and a warning. Now a write goes
    on a connection idle for at most WRITE_IDLE_MAX (a new one after a pause) and a read lost
    so is sent again at once."""
    assert WRITE_IDLE_MAX < 1.3
    async with running_service(ServiceConfig(fetch=False)) as svc:
        port = int(svc.url.rsplit(":", 1)[1])
        async with IdleClosingGateway(("127.0.0.1", port), idle=1.3).running() as gw:
            retry = RetryPolicy(max_attempts=2, backoff_base=0.01)
            async with TaggerClient(gw.url, bulk_api_key="dev-bulk-api-key", retry=retry) as c:

                def rows(start: int) -> list[TaggingRequest]:
                    return [
                        TaggingRequest(
                            image=Image(type=ImageType.URL, content=f"https://img.example/{i}.jpg"),
                            context=BulkContext(id=f"r{i}"),
                        )
                        for i in range(start, start + 10)
                    ]

                created = await c.create_task(rows(0), description="keep-alive")
                for n in range(1, 3):
                    await anyio.sleep(1.5)
                    await c.append_to_task(created.task_id, rows(n * 10))
                    await anyio.sleep(1.5)
                    await c.list_tasks()
                    await anyio.sleep(1.5)
                    status = await c.task_status(created.task_id)
            stats = c.stats
    assert gw.dropped >= 2, "the gateway closed no reused connection: the test tests nothing"
    assert stats.ambiguous_writes == 0 and stats.transport_errors == 0, stats
    assert stats.retries == 0, stats
    assert status.count.total == 30


async def test_a_trickling_stdin_through_an_idle_closing_gateway(tmp_path: Path) -> None:
    """Rows arrive in bursts 1.6 s apart through a gateway that closes connections idle for
    1.3 s: no ambiguous write, no retry, no warning, every row once."""
    out = tmp_path / "out.jsonl"
    bursts = [
        "id,url\n" + "".join(f"p{i},https://img.example/{i}.jpg\n" for i in range(0, 300)),
        "".join(f"p{i},https://img.example/{i}.jpg\n" for i in range(300, 600)),
        "".join(f"p{i},https://img.example/{i}.jpg\n" for i in range(600, 900)),
    ]
    async with running_service(ServiceConfig(fetch=False)) as svc:
        port = int(svc.url.rsplit(":", 1)[1])
        async with IdleClosingGateway(("127.0.0.1", port), idle=1.3).running() as gw:
            args = run_cmd(out, "-", base_url=gw.url, extra=ENGINE_FLAGS)
            proc = await anyio.open_process(args, env=ENV)
            assert proc.stdin is not None and proc.stderr is not None
            for burst in bursts:
                await proc.stdin.send(burst.encode())
                await anyio.sleep(1.6)
            await proc.stdin.aclose()
            with anyio.fail_after(60):
                err = b"".join([chunk async for chunk in proc.stderr]).decode()
                code = await proc.wait()
    assert code == 0, err[-1500:]
    assert "WARNING" not in err, err[-1500:]
    summary: dict[str, Any] = json.loads(summary_of(out).read_text())
    assert summary["ambiguous_writes"] == 0 and summary["retries"] == 0, summary
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(900)})


# --------------------------------------------------------------------------- base URLs as given


@pytest.mark.parametrize(
    ("how", "value"),
    [
        ("env", "{url}\n"),  # FASHIONTAG_BASE_URL="$(cat url.txt)" keeps no \n, but read does
        ("env", "{url}\r\n"),  # a CRLF file
        ("env", "  {url}  "),
        ("flag", "{url} "),
        ("config", "{url}\n"),
        ("env", "HTTP://{hostport}/v1/"),
    ],
)
async def test_white_space_around_a_base_url_is_not_part_of_it(
    tmp_path: Path, how: str, value: str
) -> None:
    """A space after the URL was sent as %20 in every path (404 at the gateway, 'the service
    refused the run'); one before it, or an upper-case scheme, was refused."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    out = tmp_path / "out.jsonl"
    async with (
        running_service(ServiceConfig()) as svc,
        PrefixGateway(svc.url, "/v1").running() as gw,
    ):
        given = value.format(url=gw.url + "/v1", hostport=gw.url.split("://")[1])
        env, extra, base = dict(ENV), (), None
        if how == "env":
            env["FASHIONTAG_BASE_URL"] = given
        elif how == "flag":
            base = given
        else:
            config = tmp_path / "c.toml"
            config.write_text(f"[client]\nbase_url = {json.dumps(given)}\n")
            extra = ("--config", str(config))
        code, err, _ = await run(run_cmd(out, str(manifest), base_url=base, extra=extra), env)
    assert code == 0, err[-1000:]
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(20)})
    assert all(s.split(" ", 1)[1].startswith("/v1/tagger/") for s in gw.seen)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://127.0.0.1:99999", "Port out of range"),
        ("http://[::1", "Invalid IPv6"),
        ("http://host:abc/", "port"),
        ("http://", "no host"),
        ("http:///v1", "no host"),
        ("http://:8080", "host"),
        ("https://tagger example/", "host"),
        ("http://u:pw-hunter2@127.0.0.1:99999/v1", "Port out of range"),
        ("http://u:pw-hunter2@[::1/v1", "Invalid IPv6"),
    ],
)
@pytest.mark.parametrize("how", ["env", "flag"])
async def test_a_malformed_base_url_is_exit_2_in_one_line(
    tmp_path: Path, url: str, said: str, how: str
) -> None:
    """Before: a traceback from deep in the first request (ValueError: Port out of range),
    exit 1; or, for http://, 'base_url must start with http://' about 'http:'."""
    manifest = write_csv(tmp_path / "m.csv", 5)
    env = dict(ENV)
    if how == "env":
        env["FASHIONTAG_BASE_URL"] = url
    code, err, _ = await run(
        run_cmd(tmp_path / "o.jsonl", str(manifest), base_url=url if how == "flag" else None),
        env,
    )
    assert code == 2, err[-1000:]
    line = one_line(err)
    assert said in line and "hunter2" not in line, line
    assert ("FASHIONTAG_BASE_URL" if how == "env" else "--base-url") in line, line


async def test_a_password_in_the_base_url_stays_out_of_everything_written(
    tmp_path: Path,
) -> None:
    """``https://user:PASSWORD@gateway/prefix`` (a gateway behind basic auth): sent as the
    Authorization header, never in stderr (-vv), the summary, the state or the outputs; nor
    when the run fails (a 503 page, a certificate, a dead port). Passed before the fixes."""
    pki = make_pki(tmp_path / "pki")
    manifest = write_csv(tmp_path / "m.csv", 1200)
    out = tmp_path / "out.jsonl"
    secret = "pw-hunter2-basic"
    async with (
        running_service(ServiceConfig()) as svc,
        PrefixGateway(svc.url, "/v1", tls=pki).running() as gw,
    ):
        url = gw.url.replace("://", f"://team:{secret}@") + "/v1"
        env = {**ENV, "SSL_CERT_FILE": str(pki.ca)}
        code, err, _ = await run(run_cmd(out, str(manifest), base_url=url, extra=("-vv",)), env)
        assert code == 0, err[-1000:]
        assert gw.authorizations and all(a.startswith("Basic ") for a in gw.authorizations)
        written = [err, summary_of(out).read_text(), out.read_text()]
        state = out.with_name(out.name + ".state")
        written.append(state.read_bytes().decode("latin-1"))
        assert all(secret not in text for text in written)
        # A 503 page, an untrusted certificate, a dead port: the failing lines mask it too.
        gw.failing = 503
        failures = [
            (url, env),
            (url, dict(ENV)),
            (f"http://team:{secret}@127.0.0.1:{dead_port()}/v1", env),
        ]
        for i, (base, environ) in enumerate(failures):
            o = tmp_path / f"f{i}.jsonl"
            code, err, _ = await run(
                run_cmd(o, str(manifest), base_url=base, extra=("-vv", "--give-up-after", "1")),
                environ,
            )
            assert code == 1, err[-1000:]
            assert secret not in err and secret not in summary_of(o).read_text()
            assert "team:***@" in one_line(err) or "HTTP 503" in one_line(err), err[-500:]


def test_a_handshake_error_nobody_waits_for_prints_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A refused certificate ends the run while another request's handshake is under way:
    that handshake's error, which nobody waits for, printed a traceback under the run's
    one-line reason (seen now and then). Only those are dropped."""
    import asyncio
    import gc
    import ssl

    from fashiontag_pipeline.cli.common import run_async

    async def body() -> None:
        loop = asyncio.get_running_loop()
        lost = loop.create_future()
        lost.set_exception(ssl.SSLCertVerificationError(1, "certificate verify failed"))
        del lost
        other = loop.create_future()
        other.set_exception(ValueError("a lost error that is not a handshake's"))
        del other
        gc.collect()

    run_async(body)
    assert "certificate verify failed" not in caplog.text
    assert "not a handshake's" in caplog.text
