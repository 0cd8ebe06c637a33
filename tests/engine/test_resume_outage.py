"""Resuming while the service is down: the run gives up after ``--give-up-after`` or stops on
SIGTERM, as any run does, with the state kept for the next try.

A state with a task still open sends the resume to the service before anything else (to learn
its clock); that call used to run before the engine watched for signals, and a failure of it
left the engine waiting for ever on its own stages: a nightly job that only ``kill -9`` ended.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import anyio

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, dead_port, run_args, write_csv
from .proxy import MisbehavingProxy, Misbehaviour


def open_tasks(state: Path) -> int:
    if not state.exists():
        return 0
    try:
        with sqlite3.connect(state) as db:
            (n,) = db.execute("SELECT count(*) FROM tasks WHERE state='open'").fetchone()
    except sqlite3.Error:
        return 0
    return int(n)


async def interrupted_with_an_open_task(
    tmp_path: Path, n: int, proxy: MisbehavingProxy | None = None
) -> tuple[list[str], Path]:
    """A run killed (SIGKILL) while a task of it is open, its service then gone: the args of
    the same command against that dead address (or ``proxy``, in front of it), and the
    results path."""
    manifest = write_csv(tmp_path / "m.csv", n)
    out, state = tmp_path / "out.jsonl", tmp_path / "s.state"
    async with running_service(ServiceConfig(rate=500.0)) as svc:
        url = svc.url
        if proxy is not None:
            proxy.upstream, url = svc.url, proxy.url
        args = run_args(url, out, str(manifest), "--state", str(state))
        args += ["--rotate-images", "5000", "--rotate-min-images", "5000"]
        proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
        with anyio.fail_after(60):
            while open_tasks(state) == 0 and proc.returncode is None:
                await anyio.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await proc.aclose()
    return args, out


async def test_a_resume_against_a_service_that_is_down_gives_up(tmp_path: Path) -> None:
    args, out = await interrupted_with_an_open_task(tmp_path, 3000)
    started = time.monotonic()
    with anyio.fail_after(60):
        done = await anyio.run_process([*args, "--give-up-after", "2"], check=False, env=ENV)
    assert done.returncode == 1, done.stderr.decode()
    assert time.monotonic() - started < 30
    assert b"Traceback" not in done.stderr
    assert open_tasks(out.with_name("s.state")) >= 1  # kept for the next try


async def test_sigterm_while_a_resume_waits_for_the_service_stops_it(tmp_path: Path) -> None:
    args, _ = await interrupted_with_an_open_task(tmp_path, 3000)
    proc = await anyio.open_process(
        [*args, "--give-up-after", "600"], stderr=subprocess.PIPE, env=ENV
    )
    try:
        # Stopped once it says it keeps trying (not a fixed 2 s, which on a loaded machine may
        # come while it starts: a stop then ends it with 130 too, and tests nothing here).
        assert proc.stderr is not None
        said = b""
        with anyio.fail_after(60):
            while b"will keep trying" not in said:
                said += await proc.stderr.receive()
        assert proc.returncode is None
        proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(20):
            await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.aclose()
    assert proc.returncode == 130


async def test_the_same_command_finishes_once_the_service_is_back(tmp_path: Path) -> None:
    """After a resume gave up, the same command against a service that is up again ends
    with every id once (the task the dead service held is lost with it: its rows are sent
    again). The service is reached through a proxy, so that it comes back at the address
    the run was begun with (another address is another service: refused)."""
    async with MisbehavingProxy("", Misbehaviour()).running() as proxy:
        args, out = await interrupted_with_an_open_task(tmp_path, 3000, proxy)
        proxy.upstream = f"http://127.0.0.1:{dead_port()}"
        with anyio.fail_after(60):
            gave_up = await anyio.run_process([*args, "--give-up-after", "1"], check=False, env=ENV)
        assert gave_up.returncode == 1
        async with running_service(ServiceConfig()) as svc:
            proxy.upstream = svc.url
            with anyio.fail_after(120):
                done = await anyio.run_process(args, check=False, env=ENV)
    assert done.returncode == 0, done.stderr.decode()
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(3000)})
