"""Subprocess tests: stdin trickle slower than the task TTL, kill -9 and resume."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import anyio
import msgspec

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, run_args, short_deadline, write_csv


async def test_stdin_trickle_slower_than_task_ttl(tmp_path: Path) -> None:
    """Rows arrive on stdin over ~3x the task TTL: no PUT ever meets an expired task."""
    out = tmp_path / "out.jsonl"
    summary = tmp_path / "summary.json"
    ids = [f"t{i}" for i in range(14)]
    async with running_service(ServiceConfig(task_ttl=1.5)) as svc:
        args = run_args(svc.url, out, "-", "--summary", str(summary))
        args += ["--expiry-margin", "0.6", "--linger", "30", "--rotate-seconds", "60"]
        async with await anyio.open_process(
            args, stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV
        ) as proc:
            assert proc.stdin is not None
            await proc.stdin.send(b"id,url\n")
            for ident in ids:
                await proc.stdin.send(f"{ident},https://img.example/{ident}.jpg\n".encode())
                await anyio.sleep(0.3)
            await proc.stdin.aclose()
            with anyio.fail_after(30):
                code = await proc.wait()
    assert code == 0
    data = msgspec.json.decode(summary.read_bytes())
    assert data["expired_writes"] == 0 and data["tasks"] == 1
    assert_exactly_once(out, out.with_suffix(".rej"), set(ids))


async def test_kill_9_at_several_points_then_resume_exactly_once(tmp_path: Path) -> None:
    n = 12000
    manifest = write_csv(tmp_path / "m.csv", n, extra=["p5,https://img.example/d.jpg,,"])
    out = tmp_path / "out.jsonl"
    state = tmp_path / "run.state"
    async with running_service(ServiceConfig(rate=4000.0)) as svc:
        args = run_args(svc.url, out, str(manifest), "--state", str(state))
        args += ["--rotate-images", "1500", "--write-concurrency", "2"]
        # A kill that catches a create written ahead and not yet applied has the resume look
        # for its task until the request deadline and list_lag have gone by since it was
        # written (75 s by default: past the 60 s below, which a loaded machine met): 10.5 s.
        args += short_deadline(tmp_path, 10.0)
        killed = []
        seen = 0
        for attempt in range(3):
            # Its stderr to a file, not a pipe never read (a run that wrote 64 KB would block).
            err = tmp_path / f"attempt-{attempt}.err"
            with err.open("wb") as stderr:
                proc = await anyio.open_process(args, stderr=stderr, env=ENV)
            # Killed once it wrote results past the last kill (kills 0.8-1.3 s after the start
            # came before any on a loaded machine: three kills of a run that did nothing).
            with anyio.move_on_after(60) as waited:
                while proc.returncode is None and (not out.exists() or out.stat().st_size <= seen):
                    await anyio.sleep(0.02)
            if waited.cancelled_caught:
                proc.kill()
                await proc.aclose()
                raise AssertionError(f"attempt {attempt}: no new result in 60 s\n{err.read_text()}")
            seen = out.stat().st_size
            if proc.returncode is None:
                proc.send_signal(signal.SIGKILL)
            killed.append(await proc.wait())
            await proc.aclose()
        assert killed.count(-signal.SIGKILL) >= 2, killed
        result = await anyio.run_process(args, check=False, env=ENV)
    assert result.returncode == 0, result.stderr.decode()
    assert b"complete" in result.stderr
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(n)}, duplicates=1)


async def test_sigterm_stops_intake_saves_state_and_resume_completes(tmp_path: Path) -> None:
    n = 8000
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig(rate=8000.0)) as svc:
        args = run_args(svc.url, out, str(manifest), "--rotate-images", "1000")
        proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
        # Stopped once its first results are written (not a fixed 1 s, which on a loaded
        # machine may come while it starts: a stop then ends it with 130 too, nothing begun).
        with anyio.fail_after(60):
            while (not out.exists() or out.stat().st_size == 0) and proc.returncode is None:
                await anyio.sleep(0.02)
        assert proc.returncode is None, "the run ended before it was stopped"
        proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            code = await proc.wait()
        await proc.aclose()
        result = await anyio.run_process(args, check=False, env=ENV)
    assert code == 130
    assert result.returncode == 0, result.stderr.decode()
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(n)})
