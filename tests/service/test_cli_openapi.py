"""The ``serve`` command as a subprocess, and schemathesis against /openapi.json."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline import TaggerClient
from fashiontag_pipeline._config import DEV_BULK_API_KEY

from .conftest import StartService, requests

VENV_BIN = Path(sys.executable).parent


def serve_argv(*flags: str) -> list[str]:
    if importlib.util.find_spec("fashiontag_pipeline.cli.run") is not None:
        return [sys.executable, "-m", "fashiontag_pipeline", "serve", *flags]
    return [sys.executable, "-m", "fashiontag_pipeline.service", *flags]


def start_serve(
    *flags: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        serve_argv(*flags),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line.startswith("listening on http://127.0.0.1:"), line
    return proc, line.removeprefix("listening on ")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_serve_prints_listening_and_exits_on_signal(tmp_path: Path, sig: int) -> None:
    config = tmp_path / "svc.toml"
    config.write_text("[service]\nport = 0\ntask_ttl = 30\n")
    proc, url = start_serve(
        "--config",
        str(config),
        "--bulk-api-key",
        "cli-bulk",
        "--state",
        str(tmp_path / "s.db"),
        env={"FASHIONTAG_API_KEY": "env-single"},
    )
    try:
        async with TaggerClient(url, api_key="env-single", bulk_api_key="cli-bulk") as client:
            created = await client.create_task(requests(2))
            assert created.validation.accept == 2
            assert created.task_expired_at is not None
        proc.send_signal(sig)
        assert proc.wait(timeout=10) == 0
        assert proc.stderr is not None
        stderr = proc.stderr.read()
        assert "cli-bulk" not in stderr and "env-single" not in stderr
        assert "development keys" not in stderr
    finally:
        stop(proc)


async def test_serve_warns_on_dev_keys_and_rejects_bad_flags() -> None:
    proc, _url = start_serve("--port", "0", "--faults", "500=0.0")
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert proc.stderr is not None
        stderr = proc.stderr.read()
        assert "development keys" in stderr and DEV_BULK_API_KEY not in stderr
    finally:
        stop(proc)
    bad = subprocess.run(
        serve_argv("--port", "0", "--faults", "boom=1"), capture_output=True, text=True, timeout=30
    )
    assert bad.returncode == 2 and "faults" in bad.stderr


@pytest.mark.skipif(
    shutil.which("schemathesis", path=str(VENV_BIN)) is None, reason="schemathesis not installed"
)
async def test_schemathesis_against_openapi(start_service: StartService) -> None:
    service = await start_service(api_keys=(), bulk_api_keys=())
    result = await anyio.run_process(
        [
            str(VENV_BIN / "schemathesis"),
            "run",
            f"{service.url}/openapi.json",
            "-H",
            f"x-api-key: {DEV_BULK_API_KEY}",
            "--checks",
            "not_a_server_error,status_code_conformance,"
            "content_type_conformance,response_schema_conformance",
            "--max-examples",
            "15",
            "--seed",
            "1",
            "--workers",
            "1",
            "--generation-database",
            "none",
            "--request-timeout",
            "10",
            "--phases",
            "examples,fuzzing",
        ],
        check=False,
    )
    output = result.stdout.decode() + result.stderr.decode()
    assert result.returncode == 0, output[-4000:]


def test_service_config_file_repr_shows_no_key() -> None:
    from fashiontag_pipeline.service.cli import ServiceConfigFile

    config = ServiceConfigFile(api_keys=["sk-live-canary"], bulk_api_keys=["bk-canary", "x"])
    text = repr(config)
    assert "canary" not in text and "api_keys=['***']" in text


@pytest.mark.parametrize(
    ("flags", "toml"), [(("--port", "99999"), None), ((), "[service]\nport = 70000\n")]
)
def test_serve_refuses_a_port_out_of_range(
    tmp_path: Path, flags: tuple[str, ...], toml: str | None
) -> None:
    """A port past 65535 was taken modulo 65536 (99999 listened on 34463): a bad flag value
    is exit 2 naming it, as `serve --help` says, never a service on a port nobody asked for."""
    argv = list(flags)
    if toml is not None:
        (tmp_path / "svc.toml").write_text(toml)
        argv += ["--config", str(tmp_path / "svc.toml")]
    bad = subprocess.run(serve_argv(*argv), capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2, bad.stdout
    assert "port" in bad.stderr and "65535" in bad.stderr
    assert "listening" not in bad.stdout


@pytest.mark.parametrize(
    ("flags", "toml", "named"),
    [
        (("--task-ttl", "nan"), None, "task_ttl"),
        (("--task-ttl", "inf"), None, "task_ttl"),
        (("--task-ttl", "1e300"), None, "task_ttl"),
        (("--result-ttl", "nan"), None, "result_ttl"),
        (("--rate", "inf"), None, "rate"),
        (("--rate", "nan"), None, "rate"),
        ((), "[service]\ntask_ttl = nan\n", "task_ttl"),
        ((), "[service]\nheader_timeout = nan\n", "header_timeout"),
    ],
)
def test_serve_refuses_a_ttl_or_rate_it_cannot_keep(
    tmp_path: Path, flags: tuple[str, ...], toml: str | None, named: str
) -> None:
    """A TTL of nan, inf or 1e300 (a date past year 9999) was taken: the service listened, then
    answered every list or status HTTP 500; ``--rate inf`` stopped its tagging worker on an
    OverflowError (every status 503); a header_timeout of nan dropped every connection. Exit 2
    naming the flag, nothing listened on."""
    argv = list(flags)
    if toml is not None:
        (tmp_path / "svc.toml").write_text(toml)
        argv += ["--config", str(tmp_path / "svc.toml")]
    bad = subprocess.run(
        serve_argv("--port", "0", *argv), capture_output=True, text=True, timeout=5
    )
    assert bad.returncode == 2, bad.stdout
    assert named in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    assert "listening" not in bad.stdout


@pytest.mark.parametrize("kind", ["missing_dir", "directory", "not_sqlite", "run_state"])
def test_serve_refuses_a_state_file_it_cannot_use(tmp_path: Path, kind: str) -> None:
    """``serve --state FILE`` with FILE in a directory that does not exist, a directory, a file
    that is no SQLite database, or the state file of ``fashiontag run --state`` (also a
    ``tasks`` table): a traceback, exit 1, and the run's state file was given a column and a
    table of the service's. Exit 2 naming the file and why, nothing written to it."""
    import sqlite3

    from fashiontag_pipeline.engine.state.schema import SCHEMA

    state = {
        "missing_dir": tmp_path / "no" / "such" / "state.sqlite",
        "directory": tmp_path,
        "not_sqlite": tmp_path / "notes.txt",
        "run_state": tmp_path / "run-state.sqlite",
    }[kind]
    if kind == "not_sqlite":
        state.write_text("not a database, some notes\n" * 50)
    if kind == "run_state":
        with sqlite3.connect(state) as db:
            db.executescript(SCHEMA)
        db.close()
    before = state.read_bytes() if state.is_file() else None
    bad = subprocess.run(
        serve_argv("--port", "0", "--state", str(state)), capture_output=True, text=True, timeout=30
    )
    assert bad.returncode == 2, (bad.stdout, bad.stderr)
    assert "Traceback" not in bad.stderr, bad.stderr
    assert "--state" in bad.stderr and str(state) in bad.stderr, bad.stderr
    assert "listening" not in bad.stdout
    if before is not None:
        assert state.read_bytes() == before
