"""What stands between the engine and the service, seen by a hunt (each test failed before its
fix): a forward proxy that answers for itself (an ``http://`` service through ``HTTP_PROXY``:
its 407, its credentials), proxy variables with a typo or a name that does not resolve, a
gateway's 404 that is no page (Envoy, Kong), and an ``SSL_CERT_FILE`` that holds no CA.
Every server is real, on loopback.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web

from fashiontag_pipeline.service import ServiceConfig, running_service

from .gateways import ForwardProxy, PrefixGateway
from .helpers import ENV, assert_exactly_once, run_through, write_csv
from .test_deployments import one_line, run, run_cmd
from .test_transport_faults import GATEWAY_404, LONG_TASKS, GatewayBlip


@pytest.mark.parametrize("given", ["", "team:wrong-s3cret@"], ids=["none", "wrong"])
async def test_a_plain_http_proxy_that_wants_credentials_is_named_not_the_service(
    tmp_path: Path, given: str
) -> None:
    """An ``http://`` service through HTTP_PROXY, whose proxy wants credentials: it answers
    the request itself, 407. The run stopped with "the service refused the run: POST
    /tagger/v2.12/bulk: HTTP 407", naming neither the proxy nor its variable (through
    HTTPS_PROXY, the CONNECT's 407 said both). Now the same one line: the proxy, the
    variable, and whether credentials were given (never the password)."""
    manifest = write_csv(tmp_path / "m.csv", 50)
    out = tmp_path / "out.jsonl"
    async with (
        running_service(ServiceConfig()) as svc,
        PrefixGateway(svc.url, "/v1").running() as gw,
    ):
        port = int(gw.url.rsplit(":", 1)[1])
        routes = {"tagger.test:80": ("127.0.0.1", port)}
        async with ForwardProxy(routes, require_auth="team:pw").running() as proxy:
            env = {**ENV, "http_proxy": f"http://{given}127.0.0.1:{proxy.port}"}
            code, err, took = await run(
                run_cmd(out, str(manifest), base_url="http://tagger.test/v1"), env
            )
    assert code == 1 and took < 20, err[-1500:]
    line = one_line(err)
    assert "407" in line and f"the proxy http://127.0.0.1:{proxy.port}" in line, line
    assert "http_proxy" in line and "wrong-s3cret" not in err, line
    assert ("refused the credentials" in line) == bool(given), line
    assert not gw.seen


class ShapelessGatewayBlip(GatewayBlip):
    """:class:`GatewayBlip` answering its 404s with ``body`` (``content_type``) in place of a
    text page."""

    def __init__(self, kind: str, body: bytes, content_type: str) -> None:
        super().__init__("", kind, 3)
        self.page = (body, content_type)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        answer = await super().handle(request)
        if answer.status == 404 and isinstance(answer, web.Response) and answer.body == GATEWAY_404:
            body, content_type = self.page
            return web.Response(status=404, body=body, headers={"Content-Type": content_type})
        return answer


@pytest.mark.parametrize("kind", ["page", "list", "PUT"])
@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"", "text/plain"),
        (b'{"message":"no Route matched with those values"}', "application/json"),
    ],
    ids=["envoy-empty", "kong-json"],
)
async def test_a_gateways_shapeless_404_while_the_service_is_redeployed(
    tmp_path: Path, kind: str, body: bytes, content_type: str
) -> None:
    """A gateway answers a few requests 404 while the service behind it is redeployed, not
    with a page but as Envoy (an Istio ingress with no route: an empty body) or Kong (``{"message":
    "no Route matched with those values"}``) do. Neither is the service's answer (its errors
    carry ``status`` and ``error``), and the service still holds every task; yet a results page
    so answered was taken for the task gone: its rows were sent (and billed) again. It is
    retried like the gateway's text page."""
    proxy = ShapelessGatewayBlip(kind, body, content_type)
    summary, o = await run_through(tmp_path, 3000, proxy, LONG_TASKS)
    assert proxy.blipped == 3 or (kind == "list" and proxy.blipped >= 1)
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 3000 and not o.rejects
    assert summary.resent == 0 and summary.lost_tasks == 0
    assert len(proxy.created) == 1, proxy.created


async def test_a_plain_http_service_through_a_proxy_that_wants_credentials(
    tmp_path: Path,
) -> None:
    """``HTTP_PROXY=http://user:password@proxy:3128`` for an ``http://`` service, as
    docs/configuration.md says to give a proxy's credentials: they went nowhere (aiohttp sends
    its ``proxy_headers`` only in an ``https://`` service's CONNECT), so every request was
    refused 407 and the run could not start. They go to the proxy with each request now (and
    never to the service)."""
    manifest = write_csv(tmp_path / "m.csv", 1200)
    out = tmp_path / "out.jsonl"
    async with (
        running_service(ServiceConfig()) as svc,
        PrefixGateway(svc.url, "/v1").running() as gw,
    ):
        port = int(gw.url.rsplit(":", 1)[1])
        routes = {"tagger.test:80": ("127.0.0.1", port)}
        async with ForwardProxy(routes, require_auth="team:s3cret-proxy").running() as proxy:
            env = {**ENV, "HTTP_PROXY": f"http://team:s3cret-proxy@127.0.0.1:{proxy.port}"}
            code, err, _ = await run(
                run_cmd(out, str(manifest), base_url="http://tagger.test/v1", extra=("-v",)), env
            )
    assert code == 0, err[-1500:]
    assert "s3cret-proxy" not in err
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(1200)})
    assert proxy.seen and all(" http://tagger.test/v1/" in line for line in proxy.seen)


@pytest.mark.parametrize(
    "value",
    [
        "http://proxy.corp:31a8",
        "http://team:pw-secret@proxy.corp:99999",
        "http://:3128",
        "http://[::1:3128",
        "http://team:pw-secret@10.0.0.300:3128",
        "http://127.1:3128",
        "http://10.0.0.010:3128",
        "http://team:pw-secret@proxy..corp:3128",
    ],
    ids=[
        *("port-typo", "port-range", "no-host", "bracket", "octet", "short-ip", "zero-padded"),
        "empty-label",
    ],
)
async def test_a_malformed_proxy_variable_is_exit_2_naming_it(tmp_path: Path, value: str) -> None:
    """A proxy variable with a typo in its address (a port with a letter or past 65535, no
    host, an unclosed IPv6 bracket; an IPv4 host as aiohttp connects to none, ``127.1``, an
    octet past 255 or zero-padded): every request failed "InvalidURL", each create taken for
    a write that "may or may not have been applied" (never sent), and the run kept trying for
    ``--give-up-after``, then stopped saying the service was unreachable, never naming the
    variable; a name with a double dot was a traceback (``UnicodeError``, from the IDNA
    codec). It is exit 2 at once, as for a proxy of another scheme (the password never
    shown)."""
    manifest = write_csv(tmp_path / "m.csv", 5)
    env = {**ENV, "HTTPS_PROXY": value}
    code, err, took = await run(
        run_cmd(
            tmp_path / "o.jsonl",
            str(manifest),
            base_url="https://tagger.test",
            extra=("--give-up-after", "3"),
        ),
        env,
    )
    assert code == 2 and took < 20, err[-1500:]
    line = one_line(err)
    assert "HTTPS_PROXY" in line and "pw-secret" not in err, line
    assert "may or may not" not in err, err[-1500:]


async def test_a_proxy_whose_name_does_not_resolve_is_named_not_the_service(
    tmp_path: Path,
) -> None:
    """HTTPS_PROXY names a proxy host that does not resolve (a typo, a VPN's resolver not
    up): the run stopped saying "cannot connect to https://tagger.test: Name or service not
    known", the service's name, so the service's address was the one looked at. The proxy
    and its variable are named, as for a proxy that refuses connections."""
    manifest = write_csv(tmp_path / "m.csv", 5)
    env = {**ENV, "HTTPS_PROXY": "http://proxy.invalid:3128"}
    code, err, _ = await run(
        run_cmd(
            tmp_path / "o.jsonl",
            str(manifest),
            base_url="https://tagger.test",
            extra=("--give-up-after", "2"),
        ),
        env,
    )
    assert code == 1, err[-1500:]
    line = one_line(err)
    assert "the proxy http://proxy.invalid:3128 (from HTTPS_PROXY)" in line, line


@pytest.mark.parametrize("given", ["missing", "der", "relative"])
async def test_an_ssl_cert_file_that_holds_no_ca_is_named_for_what_it_is(
    tmp_path: Path, given: str
) -> None:
    """SSL_CERT_FILE set to a file that is not there (a typo; a relative path, from a cron
    job whose working directory is another) or to the CA in DER form (``ca.crt`` as Windows
    exports it): OpenSSL loads nothing and says nothing, and the run stopped with "not
    trusted ...: if it comes from a private CA, give that CA's certificates in
    SSL_CERT_FILE", the variable the user had just set. The one line says what is wrong with
    the file."""
    import subprocess

    from .gateways import make_pki

    pki = make_pki(tmp_path / "pki")
    manifest = write_csv(tmp_path / "m.csv", 5)
    if given == "der":
        cert_file = str(tmp_path / "ca.crt")
        subprocess.run(
            ["openssl", "x509", "-in", str(pki.ca), "-outform", "der", "-out", cert_file],
            check=True,
            capture_output=True,
        )
        expected = "no PEM certificate"
    else:
        cert_file = "pki/ca.pem" if given == "relative" else str(tmp_path / "pki" / "ca.pm")
        expected = "names no file"
    async with (
        running_service(ServiceConfig()) as svc,
        PrefixGateway(svc.url, "/api", tls=pki).running() as gw,
    ):
        url = gw.url.replace("127.0.0.1", "localhost") + "/api"
        code, err, _ = await run(
            run_cmd(tmp_path / "o.jsonl", str(manifest), base_url=url),
            {**ENV, "SSL_CERT_FILE": cert_file},
        )
    assert code == 1, err[-1500:]
    line = one_line(err)
    assert "not trusted" in line and f"SSL_CERT_FILE={cert_file!r}" in line, line
    assert expected in line, line


@pytest.mark.parametrize("host", ["straße.test", "xn--strae-oqa.test"], ids=["idn", "punycode"])
async def test_a_service_whose_name_is_idna_2008_is_reached(tmp_path: Path, host: str) -> None:
    """A service (or proxy) on a host name valid under IDNA 2008 but not IDNA 2003 (``ß``,
    ``ς``, a joiner: ``straße.test`` is ``xn--strae-oqa.test``, not ``strasse.test``), as
    aiohttp and yarl reach it: the check for names no resolver takes refused it, exit 2 "no
    valid name", before any request. The run is made (here through an ``HTTP_PROXY``)."""
    manifest = write_csv(tmp_path / "m.csv", 50)
    out = tmp_path / "out.jsonl"
    async with (
        running_service(ServiceConfig()) as svc,
        PrefixGateway(svc.url, "/v1").running() as gw,
    ):
        port = int(gw.url.rsplit(":", 1)[1])
        routes = {"xn--strae-oqa.test:80": ("127.0.0.1", port)}
        async with ForwardProxy(routes).running() as proxy:
            env = {**ENV, "HTTP_PROXY": f"http://127.0.0.1:{proxy.port}"}
            code, err, _ = await run(run_cmd(out, str(manifest), base_url=f"http://{host}/v1"), env)
    assert code == 0, err[-1500:]
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(50)})
