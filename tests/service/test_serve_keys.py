"""``fashiontag serve`` given a single-mode key and no bulk key (``FASHIONTAG_API_KEY`` set in
the shell, the variable the README's table names first): found by a hunt; failed before its
fix."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from fashiontag_pipeline import TaggerClient
from fashiontag_pipeline._exceptions import AuthenticationError

from .test_cli_openapi import serve_argv, start_serve, stop


async def test_serve_with_no_bulk_key_says_bulk_paths_refuse_every_key() -> None:
    """The service started in silence with no bulk key at all: every create, list and page
    was refused for every key (the development bulk key too), and a user who then set
    ``FASHIONTAG_BULK_API_KEY`` on the client side, as the client's 403 advises, met 401
    with nothing saying the service has none. ``serve`` warns at its start now, naming the
    flag and variable to set, never the key."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASHIONTAG_")}
    env["FASHIONTAG_API_KEY"] = "single-only-key"
    proc, url = start_serve("--port", "0", env=env)
    try:
        async with TaggerClient(url, api_key="single-only-key", bulk_api_key="x") as client:
            with pytest.raises(AuthenticationError):
                await client.list_tasks()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert proc.stderr is not None
        stderr = proc.stderr.read()
    finally:
        stop(proc)
    assert "no bulk key" in stderr and "FASHIONTAG_BULK_API_KEY" in stderr, stderr
    assert "single-only-key" not in stderr


_CANARY = "svc-KEY-CANARY"


@pytest.mark.parametrize(
    ("how", "named"),
    [
        ("env_crlf", "FASHIONTAG_BULK_API_KEY"),
        ("file_newline", "bulk_api_keys in [service] of"),
        ("file_empty", "api_keys in [service] of"),
        ("flag_tab", "--api-key"),
        ("env_blank", "FASHIONTAG_API_KEY"),
    ],
)
def test_serve_refuses_a_key_no_request_can_carry(tmp_path: Path, how: str, named: str) -> None:
    """A key of the service's own that no ``x-api-key`` header can match (the ``\\r`` a CRLF
    env file or ``EnvironmentFile`` keeps, a line end, a tab, an empty or blank key): ``serve``
    listened in silence, the development keys no longer accepted, and every client met
    ``401 authentication failed`` for ever, the client's key blamed. Exit 2 naming where the
    key came from, never the key."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASHIONTAG_")}
    argv = ["--port", "0"]
    config = tmp_path / "svc.toml"
    if how == "env_crlf":
        env["FASHIONTAG_BULK_API_KEY"] = _CANARY + "\r"
    elif how == "env_blank":
        env["FASHIONTAG_API_KEY"] = "   "
    elif how == "flag_tab":
        argv += ["--api-key", _CANARY + "\t"]
    else:
        value = '""' if how == "file_empty" else f'"{_CANARY}\\n"'
        field = "api_keys" if how == "file_empty" else "bulk_api_keys"
        config.write_text(f"[service]\n{field} = [{value}]\n")
        argv += ["--config", str(config)]
    bad = subprocess.run(serve_argv(*argv), capture_output=True, text=True, timeout=30, env=env)
    assert bad.returncode == 2, (bad.stdout, bad.stderr)
    assert "listening" not in bad.stdout
    assert named in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    assert _CANARY not in bad.stderr, bad.stderr


async def test_serve_takes_a_key_without_the_spaces_at_its_ends() -> None:
    """``FASHIONTAG_BULK_API_KEY=key `` (a space left at the end of an env file's line): a
    header's value is read without the spaces at its ends, so no request matched the key and
    every client met 401. The service's keys are taken without them, as the client's are."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASHIONTAG_")}
    env["FASHIONTAG_API_KEY"] = " single-key "
    env["FASHIONTAG_BULK_API_KEY"] = "bulk-key  "
    proc, url = start_serve("--port", "0", env=env)
    try:
        async with TaggerClient(url, api_key="single-key", bulk_api_key="bulk-key") as client:
            await client.list_tasks()
        async with TaggerClient(url, api_key=" single-key", bulk_api_key="bulk-key ") as client:
            await client.list_tasks()
    finally:
        stop(proc)
