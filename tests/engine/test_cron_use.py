"""How cron jobs and operators run ``fashiontag run`` (found by a hunt; each test failed before
its fix): ``--summary`` into a folder that does not exist yet, or after a run that failed (the
last night's report must not stay), a key with a line end kept from a file, a password in the
base URL, a misspelt config table, and the summary naming the state file as typed."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from pathlib import Path

import anyio

from fashiontag_pipeline.service import ServiceConfig, running_service
from fashiontag_pipeline.service.faults import FaultSpec

from .helpers import ENV, assert_exactly_once, dead_port, run_args, write_csv


async def test_summary_into_a_missing_folder_is_a_clear_error_not_a_traceback(
    tmp_path: Path,
) -> None:
    """`--out` into a missing folder is created; `--summary` into one crashes after the whole
    run with a traceback and exit 1 (the run itself is complete)."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    out = tmp_path / "results.jsonl"
    summary = tmp_path / "logs" / "2026-11-26" / "summary.json"
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            run_args(svc.url, out, str(manifest), "--summary", str(summary)),
            check=False,
            env=ENV,
        )
    err = result.stderr.decode()
    assert "Traceback" not in err, err[-400:]
    assert result.returncode == 0, err[-400:]
    assert json.loads(summary.read_text())["complete"] is True


async def test_summary_file_is_rewritten_when_the_run_fails(tmp_path: Path) -> None:
    """A cron job that reads --summary after each night: a fatal run (service unreachable,
    exit 1) leaves yesterday's summary saying complete: true."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    out = tmp_path / "results.jsonl"
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"complete": True, "tagged": 20, "error": None}))
    url = f"http://127.0.0.1:{dead_port()}"
    result = await anyio.run_process(
        run_args(url, out, str(manifest), "--summary", str(summary), "--give-up-after", "1"),
        check=False,
        env=ENV,
    )
    assert result.returncode == 1, result.stderr.decode()
    data = json.loads(summary.read_text())
    assert data["complete"] is False and data["error"], data


async def test_a_key_with_a_trailing_newline_is_a_clear_error(tmp_path: Path) -> None:
    """A key read from a file or a CRLF env file keeps its line end: the run dies with an
    aiohttp traceback ('Forbidden control character ... header injection') instead of one
    line naming the key's source."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    out = tmp_path / "results.jsonl"
    env = {**ENV, "FASHIONTAG_BULK_API_KEY": "dev-bulk-api-key\r\n"}
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            run_args(svc.url, out, str(manifest)), check=False, env=env
        )
    err = result.stderr.decode()
    assert result.returncode in (1, 2)
    assert "Traceback" not in err, err[-300:]
    assert "FASHIONTAG_BULK_API_KEY" in err


async def test_a_password_in_the_base_url_never_appears_in_messages(tmp_path: Path) -> None:
    """A service behind basic auth given as http://user:PASSWORD@host: the first-failure
    warning and the fatal error print the URL with its password (PostgreSQL URLs are
    redacted; this one is not)."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    out = tmp_path / "results.jsonl"
    env = {**ENV, "FASHIONTAG_BASE_URL": f"http://svc:hunter2secret@127.0.0.1:{dead_port()}"}
    args = list(run_args("x", out, str(manifest), "--give-up-after", "1"))
    i = args.index("--base-url")
    del args[i : i + 2]
    result = await anyio.run_process(args, check=False, env=env)
    assert result.returncode == 1
    assert b"hunter2secret" not in result.stderr, result.stderr.decode()[-300:]


async def test_a_misspelt_config_table_is_an_error(tmp_path: Path) -> None:
    """`[enigne]` or `[clinet]`: unknown keys inside a table are refused (exit 2), but an
    unknown table is ignored silently and the run goes on with defaults."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    out = tmp_path / "results.jsonl"
    config = tmp_path / "fashiontag.toml"
    config.write_text("[enigne]\nrotate_images = 2000\n")
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            run_args(svc.url, out, str(manifest), "--config", str(config)), check=False, env=ENV
        )
    assert result.returncode == 2, result.stderr.decode()[-300:]
    assert b"enigne" in result.stderr


async def test_summary_names_the_state_file_absolute_like_the_outputs(
    tmp_path: Path,
) -> None:
    """Paths are recorded absolute (docs), and the summary's out and rejects are; its state
    is the relative path as typed, which a cron job reading the summary from elsewhere
    cannot find."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    (tmp_path / "o").mkdir()
    async with running_service(ServiceConfig()) as svc:
        args = run_args(svc.url, Path("o/results.jsonl"), str(manifest), "--summary", "s.json")
        result = await anyio.run_process(args, check=False, env=ENV, cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    data = json.loads((tmp_path / "s.json").read_text())
    assert Path(data["out"]).is_absolute()
    assert Path(data["state"]).is_absolute(), data["state"]


async def test_sigterm_sends_no_new_writes_and_stops_promptly(tmp_path: Path) -> None:
    """Every request takes 1 s at the service. SIGTERM once the first tasks exist: the
    writes in flight (at most --write-concurrency 2) may finish, but no new task is created
    after the signal, and the process exits within a few request times, not after sending
    every row it had queued."""
    manifest = write_csv(tmp_path / "m.csv", 30_000)
    out = tmp_path / "out.jsonl"
    spec = FaultSpec(latency=1.0, latency_seconds=1.0)
    async with running_service(ServiceConfig(faults=spec)) as svc:
        args = run_args(svc.url, out, str(manifest))
        args += ["--rotate-images", "1000", "--write-concurrency", "2"]
        proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
        with anyio.fail_after(30):
            while len(svc.store.tasks) < 2:
                await anyio.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        at_signal = len(svc.store.tasks)
        t0 = time.monotonic()
        with anyio.fail_after(120):
            code = await proc.wait()
        stopped_after = time.monotonic() - t0
        await proc.aclose()
        created_after = len(svc.store.tasks) - at_signal
        assert code == 130
        assert created_after <= 2, f"{created_after} tasks created after SIGTERM"
        assert stopped_after < 6, f"exited {stopped_after:.1f} s after SIGTERM"
        # The rows it did not send are sent by the same command: every id once.
        dice = svc.state.dice
        assert dice is not None
        dice.spec = FaultSpec()  # requests answered at once again
        again = await anyio.run_process(args, check=False, env=ENV)
    assert again.returncode == 0, again.stderr.decode()[-400:]
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(30_000)})


async def test_a_second_run_refused_for_a_locked_output_leaves_no_state(tmp_path: Path) -> None:
    """Two cron entries given the same --out, each its own --state: the second is refused
    (exit 2), and touches nothing. It left its state file behind, recording an open job on the
    first run's outputs, which a later run with that state re-tagged and rewrote."""
    manifest = write_csv(tmp_path / "m.csv", 5000)
    out = tmp_path / "out.jsonl"
    other = tmp_path / "other.state"
    # (20 s of tagging, killed once the second ends: at 5 s, a loaded CI machine ended the
    # first run before the second had started, and kill() met a process gone.)
    async with running_service(ServiceConfig(rate=250.0)) as svc:
        first = await anyio.open_process(run_args(svc.url, out, str(manifest)), env=ENV)
        try:
            with anyio.fail_after(30):
                while not out.exists() or out.stat().st_size == 0:
                    await anyio.sleep(0.05)
            second = await anyio.run_process(
                run_args(svc.url, out, str(manifest), "--state", str(other)),
                check=False,
                env=ENV,
            )
        finally:
            with contextlib.suppress(ProcessLookupError):
                first.kill()
            await first.wait()
            await first.aclose()
    assert second.returncode == 2, second.stderr.decode()
    assert b"is being written by another run" in second.stderr
    assert not other.exists() and not other.with_name("other.state.lock").exists()


_EMPTY_FLAGS = [("run", flag) for flag in ("--out", "--rejects", "--state", "--reuse", "--summary")]


async def test_an_empty_path_from_an_unset_variable_is_refused_naming_the_flag(
    tmp_path: Path,
) -> None:
    """A cron line ``--state "$STATE"`` with the variable unset gives an empty value. It was
    taken as the current folder: a traceback for ``--state``, "result store . cannot be used
    ... move it away" (exit 1) for ``--reuse``, and the daemon's ``--reuse ""`` turned reuse off
    without a word (every row billed again). Each is now exit 2 naming the flag, nothing made,
    nothing sent."""
    manifest = write_csv(tmp_path / "m.csv", 5)
    url = f"http://127.0.0.1:{dead_port()}"
    out = tmp_path / "results.jsonl"
    for command, flag in [*_EMPTY_FLAGS, ("run", "MANIFEST"), ("daemon", "--reuse")]:
        if command == "run":
            args = run_args(
                url, out, *([flag, ""] if flag != "MANIFEST" else []), "--give-up-after", "1"
            )
            args.append(str(manifest) if flag != "MANIFEST" else "")
        else:
            inbox = tmp_path / "inbox"
            inbox.mkdir(exist_ok=True)
            args = [
                *run_args(url, out)[:3],
                "daemon",
                "--inbox",
                str(inbox),
                "--outbox",
                str(tmp_path / "outbox"),
                "--base-url",
                url,
                "--listen",
                "127.0.0.1:0",
                "--reuse",
                "",
            ]
        with anyio.fail_after(20):
            result = await anyio.run_process(args, check=False, env=ENV)
        err = result.stderr.decode()
        assert result.returncode == 2, (command, flag, result.returncode, err[-300:])
        assert "Traceback" not in err and f"argument {flag}" in err and "empty" in err, err
        assert not out.exists() and not (tmp_path / "outbox").exists(), (command, flag)
        assert not list(tmp_path.glob("*.state")) and not (tmp_path / "results.state").exists()
