"""What a forward proxy answers in place of the service (found by a hunt; each test failed
before its fix): ``fashiontag run`` against an ``http://`` service reached through
``HTTP_PROXY``, whose proxy speaks for itself in the answers (absolute-form requests, no
CONNECT), on loopback.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .gateways import ForwardProxy, PrefixGateway
from .helpers import ENV, write_csv
from .test_deployments import one_line, run, run_cmd


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
