"""An ``http://`` base URL for a service that speaks only TLS (the scheme mistyped or copied
from a test setup, the first hour of a data team's run against their real gateway): a TLS
server drops a plain HTTP request without an answer. Found by a hunt; failed before its fix."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fashiontag_pipeline.service import ServiceConfig, running_service

from .gateways import PrefixGateway, make_pki
from .helpers import ENV, write_csv
from .test_deployments import one_line, run, run_cmd, summary_of


async def test_an_http_url_for_a_tls_service_stops_at_once_saying_https(tmp_path: Path) -> None:
    """Every request was a dropped connection: the create of unknown fate, looked for in a
    list that dropped too, retried for the whole ``--give-up-after`` (120 s), then exit 1 with
    ``service unreachable for 120s: ... ServerDisconnectedError; the same command resumes once
    the service answers``: nothing said the address speaks TLS. ``tasks list`` likewise. Now
    a dropped connection to an ``http://`` address that answers a TLS handshake stops at once,
    exit 1, saying the service is at ``https://``; nothing reached the service."""
    pki = make_pki(tmp_path / "pki")
    manifest = write_csv(tmp_path / "m.csv", 20)
    env = {**ENV, "SSL_CERT_FILE": str(pki.ca)}
    async with (
        running_service(ServiceConfig()) as svc,
        PrefixGateway(svc.url, "/api", tls=pki).running() as gw,
    ):
        plain = gw.url.replace("https://", "http://") + "/api"
        out = tmp_path / "a.jsonl"
        give_up = ("--give-up-after", "25")  # (the default, 120 s, on failure)
        args = run_cmd(out, str(manifest), base_url=plain, extra=give_up)
        code, err, took = await run(args, env)
        assert code == 1 and took < 20, (took, err[-1500:])
        line = one_line(err)
        assert "speaks TLS" in line and "https://" in line, line
        assert "secret" not in line
        summary = json.loads(summary_of(out).read_text())
        assert summary["complete"] is False and "speaks TLS" in summary["error"]

        args = [sys.executable, "-m", "fashiontag_pipeline", "tasks", "list", "--base-url", plain]
        args += give_up
        code, err, took = await run(args, env)
        assert code == 1 and took < 20, (took, err[-1500:])
        assert "speaks TLS" in one_line(err), err[-800:]
        assert not gw.seen and not svc.store.tasks

        # The same address as https:// runs.
        https = gw.url + "/api"
        code, err, _ = await run(run_cmd(tmp_path / "b.jsonl", str(manifest), base_url=https), env)
        assert code == 0, err[-1500:]
