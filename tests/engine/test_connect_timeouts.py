"""A connection to the service that is never made within ``timeout.connect``: a firewall that
drops the packets of a host's address, a server whose accept queue is full, an ``https://``
address that takes the TCP connection and never answers the TLS handshake. Nothing was sent.
Found by a hunt; failed before its fix."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import anyio.abc
import msgspec
import pytest

from fashiontag_pipeline import ConnectError, RetryPolicy, TaggerClient, Timeout
from fashiontag_pipeline._models import BulkContext, Image, ImageType, TaggingRequest
from fashiontag_pipeline.engine import run_pipeline

from .gateways import _tcp_serving
from .helpers import ENV, TASKS_OF_1000, client_config, short_deadline, write_csv
from .test_deployments import one_line, run, run_cmd, summary_of


def rows_of(n: int) -> list[TaggingRequest]:
    return [
        TaggingRequest(
            image=Image(type=ImageType.URL, content=f"https://img.example/{i}.jpg"),
            context=BulkContext(id=f"r{i}"),
        )
        for i in range(n)
    ]


async def _hold(stream: anyio.abc.SocketStream) -> None:
    """A server that takes the connection and never sends a byte (no TLS handshake)."""
    async with stream:
        await anyio.sleep_forever()


async def test_a_write_whose_connection_was_never_made_is_not_of_unknown_fate() -> None:
    """The create was "timed out; the write may or may not have been applied": an ambiguous
    write, counted so, its task looked for in a task list that cannot be reached either,
    though not a byte of it left the machine. It is a connection not made, named so (and,
    as any, retried: nothing reached the service)."""
    async with _tcp_serving(_hold) as port:
        retry = RetryPolicy(max_attempts=2, backoff_base=0.01, backoff_max=0.01)
        timeout = Timeout(connect=0.5, total=20.0)
        url = f"https://127.0.0.1:{port}"
        key = "a-bulk-key"
        async with TaggerClient(url, bulk_api_key=key, retry=retry, timeout=timeout) as c:
            with anyio.fail_after(15), pytest.raises(ConnectError) as caught:
                await c.create_task(rows_of(3), description="x")
            stats = c.stats
    message = str(caught.value)
    assert f"cannot connect to {url}" in message, message
    assert "may or may not" not in message and "timeout.connect" in message, message
    assert stats.ambiguous_writes == 0 and stats.retries == 1, stats


async def test_a_run_whose_connections_are_never_made_says_so(tmp_path: Path) -> None:
    """The run stopped with "service unreachable: POST ... timed out; the write may or may
    not have been applied". It says it cannot connect, and what bounds the wait."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    async with _tcp_serving(_hold) as port:
        with anyio.fail_after(30), pytest.raises(Exception) as caught:
            await run_pipeline(
                [manifest],
                client=client_config(
                    f"https://127.0.0.1:{port}", timeout=Timeout(connect=0.5, total=20.0)
                ),
                out=tmp_path / "out.jsonl",
                rejects=tmp_path / "rej.jsonl",
                engine=msgspec.structs.replace(TASKS_OF_1000, give_up_after=2.0),
            )
    message = str(caught.value)
    assert "cannot connect" in message and "may or may not" not in message, message


async def test_a_proxy_that_never_answers_the_connect_is_named_and_bills_nothing(
    tmp_path: Path,
) -> None:
    """``HTTPS_PROXY`` names a proxy that takes the connection and never answers its
    ``CONNECT`` (hung, or a firewall's black hole behind a port forward): each request ran to
    its deadline and the run stopped with "service not answering within the request
    deadline", the proxy never named, each create "may or may not have been applied" (an
    ambiguous write, looked for), though no byte reached the service. The proxy is named, and
    the create is a connection not made."""
    manifest = write_csv(tmp_path / "m.csv", 50)
    async with _tcp_serving(_hold) as port:
        proxy = f"http://127.0.0.1:{port}"
        env = {**ENV, "HTTPS_PROXY": proxy}
        out = tmp_path / "a.jsonl"
        extra = ("--give-up-after", "3", *short_deadline(tmp_path, 2.0))
        args = run_cmd(out, str(manifest), base_url="https://tagger.test/v1", extra=extra)
        code, err, took = await run(args, env)
    assert code == 1 and took < 20, (took, err[-1500:])
    line = one_line(err)
    assert f"the proxy {proxy} (from HTTPS_PROXY)" in line, line
    assert "may or may not" not in err and "not answering" not in line, err[-1500:]
    assert json.loads(summary_of(out).read_text())["ambiguous_writes"] == 0


async def test_a_proxy_of_a_plain_http_service_that_never_answers_is_named(
    tmp_path: Path,
) -> None:
    """``HTTP_PROXY`` names a proxy that takes each request and never answers (hung, its
    upstream black-holed) for an ``http://`` service: the run stopped after
    ``--give-up-after`` with "service not answering within the request deadline", the proxy
    the user's environment sent every request through never named. It is named (the writes
    stay of unknown fate: the proxy had them whole and may have passed them on)."""
    manifest = write_csv(tmp_path / "m.csv", 50)
    async with _tcp_serving(_hold) as port:
        proxy = f"http://127.0.0.1:{port}"
        env = {**ENV, "HTTP_PROXY": proxy}
        out = tmp_path / "a.jsonl"
        extra = ("--give-up-after", "3", *short_deadline(tmp_path, 2.0))
        args = run_cmd(out, str(manifest), base_url="http://tagger.test/v1", extra=extra)
        code, err, took = await run(args, env)
    assert code == 1 and took < 20, (took, err[-1500:])
    line = one_line(err)
    assert f"the proxy {proxy} (from HTTP_PROXY)" in line, line
