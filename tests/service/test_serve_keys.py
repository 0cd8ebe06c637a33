"""``fashiontag serve`` given a single-mode key and no bulk key (``FASHIONTAG_API_KEY`` set in
the shell, the variable the README's table names first): found by a hunt; failed before its
fix."""

from __future__ import annotations

import os
import signal

import pytest

from fashiontag_pipeline import TaggerClient
from fashiontag_pipeline._exceptions import AuthenticationError

from .test_cli_openapi import start_serve, stop


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
