"""A second ``fashiontag daemon`` on one machine (another inbox) with the default ``--listen
127.0.0.1:9464`` that the first holds: found by a hunt; failed before its fix."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from .helpers import daemon_once


def test_a_listen_address_taken_is_one_line_naming_the_flag(tmp_path: Path) -> None:
    """It stopped (exit 1, as documented) logging ``OSError: [Errno 98] error while attempting
    to bind on address ('127.0.0.1', 9464): address already in use``: nothing named the
    monitoring endpoints nor ``--listen``. The line names both now, and what to give."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc, took = daemon_once(
            tmp_path,
            *("--listen", f"127.0.0.1:{port}", "--log-format", "json"),
            *("--base-url", "http://127.0.0.1:9"),
        )
    assert proc.returncode == 1, proc.stderr.decode()[-1000:]
    lines = [json.loads(line) for line in proc.stderr.decode().splitlines()]
    errors = [line for line in lines if line["level"] == "error"]
    assert len(errors) == 1, lines
    error = errors[0]["error"]
    assert f"127.0.0.1:{port}" in error and "--listen" in error, error
    assert "already in use" in error and "Errno" not in error, error
    assert took < 30


def test_a_listen_host_that_does_not_resolve_says_so(tmp_path: Path) -> None:
    """``--listen locahost:9464`` (a typo, or a pod's name its /etc/hosts lacks): found by a
    hunt. The line said ``unknown error -2`` (the resolver's EAI_NONAME read as an errno);
    it says the name does not resolve now."""
    proc, took = daemon_once(
        tmp_path,
        *("--listen", "nonexistent.invalid:9464", "--log-format", "json"),
        *("--base-url", "http://127.0.0.1:9"),
    )
    assert proc.returncode == 1, proc.stderr.decode()[-1000:]
    lines = [json.loads(line) for line in proc.stderr.decode().splitlines()]
    errors = [line for line in lines if line["level"] == "error"]
    assert len(errors) == 1, lines
    error = errors[0]["error"]
    assert "nonexistent.invalid:9464" in error and "--listen" in error, error
    assert "unknown error" not in error.lower(), error
    assert "does not resolve" in error, error
    assert took < 30
