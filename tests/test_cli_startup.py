"""A stop asked for while ``fashiontag run`` or ``fashiontag daemon`` is still starting (its
imports, its configuration), as systemd, cron or a hand on Ctrl-C sends it: a clean exit with the
documented code, at most one line on stderr, no traceback, nothing claimed or sent.

The child sends the signal to itself the moment it has imported a given module, so that it
lands in the same stretch of the start-up every time, however loaded the machine (sent by the
test on reading the child's import times, it could land after the command's own handlers on a
loaded machine: a daemon drained, logging four lines, in one full-suite run beside other work).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.abc
import pytest

from fashiontag_pipeline import TaggerClient
from fashiontag_pipeline.service import ServiceConfig, running_service

from .daemon.helpers import drop_atomic, write_manifest
from .engine.helpers import ENV, client_config, dead_port, run_args, write_csv

#: Modules whose import a stop is sent after: deep in the imports (aiohttp) and half-way
#: through the engine's, both well before the command's own handlers (a stop that comes after
#: them is a drain, tested elsewhere).
MARKERS = {
    "run": ("aiohttp", "fashiontag_pipeline.engine.batcher"),
    "daemon": ("aiohttp", "fashiontag_pipeline.engine.batcher"),
}


#: Runs the Python command line after it with SIGINT, SIGTERM and SIGHUP at their defaults. A
#: signal ignored by the suite's own parent is inherited ignored (``nohup`` ignores SIGHUP, a
#: shell's background job SIGINT), and the command keeps such a signal ignored, by design; its
#: tests must not depend on how the suite was started (under ``nohup`` the SIGHUP test failed
#: every time, and the SIGINT ones hung).
_DEFAULT_SIGNALS = (
    "import os, signal, sys\n"
    "for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP): signal.signal(s, signal.SIG_DFL)\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


async def _signal_as(
    args: list[str], steps: list[tuple[Callable[[bytes], bool], int]], env: dict[str, str]
) -> tuple[int, bytes]:
    """Start ``args`` (a Python command line, signals at their defaults) and send each step's
    signal, in order, once its test holds of the stderr read so far (every step's signal is
    asserted sent); its exit code and its stderr."""
    assert args[0] == sys.executable
    err = b""
    done = 0
    launch = [sys.executable, "-c", _DEFAULT_SIGNALS, *args[1:]]
    async with await anyio.open_process(
        launch, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    ) as proc:
        assert proc.stderr is not None
        with anyio.fail_after(20):
            async for chunk in proc.stderr:
                err += chunk
                while done < len(steps) and steps[done][0](err):
                    proc.send_signal(steps[done][1])
                    done += 1
            code = await proc.wait()
    assert done == len(steps), err.decode(errors="replace")[-2000:]
    return code, err


def _imported(marker: str) -> Callable[[bytes], bool]:
    """Whether the child's stderr (``PYTHONPROFILEIMPORTTIME``) says it imported ``marker``."""
    name = marker.encode()
    return lambda err: any(line.rpartition(b"|")[2].strip() == name for line in err.splitlines())


def _not_import_times(err: bytes) -> list[str]:
    return [
        line
        for line in err.decode(errors="replace").splitlines()
        if not line.startswith("import time:")
    ]


#: Runs ``python -m MODULE ARGS...`` (after the marker and the signal's number), signals at
#: their defaults, and sends the signal to itself as soon as the marker module's import ends:
#: its handler (or the default action) runs at the next instruction of the start-up.
_SELF_SIGNALLED = (
    "import importlib.util, os, runpy, signal, sys\n"
    "for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP): signal.signal(s, signal.SIG_DFL)\n"
    "marker, signum = sys.argv[1], int(sys.argv[2])\n"
    "class Hook:\n"
    "    def find_spec(self, name, path, target=None):\n"
    "        if name != marker: return None\n"
    "        sys.meta_path.remove(self)\n"
    "        spec = importlib.util.find_spec(name)\n"
    "        run = spec.loader.exec_module\n"
    "        def exec_module(module):\n"
    "            run(module)\n"
    "            os.kill(os.getpid(), signum)\n"
    "        spec.loader.exec_module = exec_module\n"
    "        return spec\n"
    "sys.meta_path.insert(0, Hook())\n"
    "assert sys.argv[3] == '-m'\n"
    "sys.argv = [sys.argv[4], *sys.argv[5:]]\n"
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n"
)


async def _signalled_at(args: list[str], marker: str, signum: int) -> tuple[int, list[str]]:
    """Run ``args`` (``python -m ...``), which sends itself ``signum`` as soon as it has
    imported ``marker`` (asserted: a marker never imported fails the test); its exit code and
    the lines of its stderr."""
    assert args[0] == sys.executable and args[1] == "-m"
    launch = [sys.executable, "-c", _SELF_SIGNALLED, marker, str(int(signum)), *args[1:]]
    env = {**ENV, "PYTHONPROFILEIMPORTTIME": "1"}
    async with await anyio.open_process(
        launch, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    ) as proc:
        assert proc.stderr is not None
        err = b""
        with anyio.fail_after(20):
            async for chunk in proc.stderr:
                err += chunk
            code = await proc.wait()
    assert _imported(marker)(err), err.decode(errors="replace")[-2000:]
    return code, _not_import_times(err)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_run_stopped_while_starting_exits_130_with_one_line(
    tmp_path: Path, signum: int
) -> None:
    manifest = write_csv(tmp_path / "m.csv", 20)
    async with running_service(ServiceConfig()) as svc:
        for i, marker in enumerate(MARKERS["run"]):
            out = tmp_path / f"out{i}.jsonl"
            summary = tmp_path / f"summary{i}.json"
            args = run_args(svc.url, out, str(manifest), "--summary", str(summary))
            code, lines = await _signalled_at(args, marker, signum)
            shown = "\n".join(lines)
            assert code == 130, f"after {marker}: exit {code}\n{shown}"
            assert "Traceback" not in shown, f"after {marker}:\n{shown}"
            assert len(lines) == 1 and "interrupted" in lines[0], f"after {marker}:\n{shown}"
            assert not out.exists() or out.read_bytes() == b""
            # (Its ``interrupted`` said false: a loader that retries interrupted runs read a
            # run that stopped on its own.)
            data = json.loads(summary.read_text())
            assert data["interrupted"] is True and data["complete"] is False, data
            assert "interrupted while starting" in data["error"], data
        async with TaggerClient(config=client_config(svc.url)) as client:
            assert await client.all_tasks() == []


def _daemon_args(inbox: Path, outbox: Path, base_url: str) -> list[str]:
    """``fashiontag daemon`` on ``inbox``, JSON logs, no HTTP endpoints."""
    return [
        *(sys.executable, "-m", "fashiontag_pipeline", "daemon"),
        *("--inbox", str(inbox), "--outbox", str(outbox), "--listen", ""),
        *("--base-url", base_url, "--log-format", "json"),
    ]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_daemon_stopped_while_starting_exits_0_and_claims_nothing(
    tmp_path: Path, signum: int
) -> None:
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    inbox.mkdir()
    drop_atomic(inbox, "m.csv", write_manifest(inbox / "m.csv", ["a", "b"]))
    (inbox / "m.csv.ready").touch()
    for marker in MARKERS["daemon"]:
        args = _daemon_args(inbox, outbox, "http://127.0.0.1:9")
        code, lines = await _signalled_at(args, marker, signum)
        shown = "\n".join(lines)
        assert code == 0, f"after {marker}: exit {code}\n{shown}"
        assert "Traceback" not in shown, f"after {marker}:\n{shown}"
        assert len(lines) <= 1, f"after {marker}:\n{shown}"
        assert (inbox / "m.csv").exists() and (inbox / "m.csv.ready").exists()
        assert not (inbox / ".work").exists() or not any((inbox / ".work").iterdir())
        assert not outbox.exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_a_stop_once_the_run_has_ended_leaves_its_exit_code(
    tmp_path: Path, signum: int
) -> None:
    """A stop sent as the run prints its summary (its work done, its own handlers gone with
    its event loop): the exit stays 0 and ``--summary`` is written, not -15 (or 130 and a
    summary file of the night before)."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    async with running_service(ServiceConfig()) as svc:
        for i in range(3):
            summary = tmp_path / f"summary{i}.json"
            args = run_args(
                svc.url, tmp_path / f"out{i}.jsonl", str(manifest), "--summary", str(summary)
            )
            code, err = await _signal_as(args, [(lambda err: b"run complete" in err, signum)], ENV)
            shown = err.decode(errors="replace")
            assert code == 0, f"exit {code}\n{shown}"
            assert "Traceback" not in shown
            assert '"complete": true' in summary.read_text().replace('":true', '": true')


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_serve_stopped_while_starting_exits_0(signum: int) -> None:
    """``serve`` exits 0 on SIGTERM or SIGINT (its documented stop), while it starts too."""
    args = [sys.executable, "-m", "fashiontag_pipeline", "serve", "--port", "0"]
    for marker in ("aiohttp", "fashiontag_pipeline.service.store"):
        code, lines = await _signalled_at(args, marker, signum)
        shown = "\n".join(lines)
        assert code == 0, f"after {marker}: exit {code}\n{shown}"
        assert "Traceback" not in shown and "listening" not in shown, shown


async def test_daemon_sighup_while_starting_is_logged_and_ignored_as_once_running(
    tmp_path: Path,
) -> None:
    """SIGHUP once running is logged and ignored (docs/daemon.md); one that came while the
    daemon started was dropped without a word. It is logged the same way, the daemon starts,
    and a SIGTERM then drains it (exit 0)."""
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    inbox.mkdir()
    args = _daemon_args(inbox, outbox, f"http://127.0.0.1:{dead_port()}")
    env = {**ENV, "PYTHONPROFILEIMPORTTIME": "1"}
    steps = [
        (_imported(MARKERS["daemon"][1]), signal.SIGHUP),
        (lambda err: b"daemon started" in err, signal.SIGTERM),
    ]
    code, err = await _signal_as(args, steps, env)
    logs = [json.loads(line) for line in _not_import_times(err)]
    shown = "\n".join(map(str, logs))
    assert code == 0, f"exit {code}\n{shown}"
    (hup_line,) = [e for e in logs if "SIGHUP" in e["event"]]
    assert "ignored" in hup_line["event"], shown
    assert any(e["event"] == "daemon stopped" for e in logs), shown


def test_stderr_that_cannot_take_a_line_right_now_takes_the_next() -> None:
    """Stderr inherited non-blocking (``O_NONBLOCK`` set by the parent on a pipe it shares: a
    CI runner's, a Node.js supervisor's) and read slowly: a line met a full pipe, EAGAIN
    (``BlockingIOError``), and stderr was taken as gone, as after a broken pipe or ENOSPC:
    every later line dropped, the run's final error among them (exit 1 with no word why).
    That line is dropped; the next ones are written once the reader has caught up."""
    import io

    from fashiontag_pipeline.cli.streams import _ForgivingStream

    class SlowReader(io.StringIO):
        full = True

        def write(self, text: str) -> int:
            if self.full:
                self.full = False
                raise BlockingIOError(11, "write could not complete without blocking", 0)
            return super().write(text)

    target = SlowReader()
    stream = _ForgivingStream(target)
    stream.write("progress 10%\n")
    stream.write("fashiontag: the service is unreachable\n")
    stream.flush()
    assert target.getvalue() == "fashiontag: the service is unreachable\n"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize(
    "command", [["tag", "https://img.example/1.jpg"], ["tasks", "list"]], ids=["tag", "tasks"]
)
async def test_tag_and_tasks_stopped_at_work_exit_130_with_one_line(
    command: list[str], signum: int
) -> None:
    """``tag --help`` and ``tasks --help``: "130 interrupted (Ctrl-C, SIGTERM)". Ctrl-C was,
    but SIGTERM (a supervisor's stop, ``timeout``) killed them where they stood: exit -15, no
    word on stderr."""
    asked = anyio.Event()

    async def hang(stream: anyio.abc.SocketStream) -> None:  # a service that never answers
        asked.set()
        async with stream:
            await anyio.sleep_forever()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    args = [sys.executable, "-m", "fashiontag_pipeline", *command]
    args += ["--base-url", f"http://127.0.0.1:{port}"]
    launch = [sys.executable, "-c", _DEFAULT_SIGNALS, *args[1:]]
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, hang)
        async with await anyio.open_process(
            launch, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
        ) as proc:
            with anyio.fail_after(20):
                await asked.wait()  # at work: its request sent
                proc.send_signal(signum)
                code = await proc.wait()
            assert proc.stderr is not None
            err = b"".join([chunk async for chunk in proc.stderr]).decode(errors="replace")
        tg.cancel_scope.cancel()
    assert code == 130, f"exit {code}\n{err}"
    assert "interrupted" in err and "Traceback" not in err, err


def test_the_collector_waits_while_the_command_starts_and_is_back_for_the_command() -> None:
    import gc

    from fashiontag_pipeline.cli import startup

    frozen = gc.get_freeze_count()
    try:
        startup.defer_collections()
        assert not gc.isenabled()
        startup.resume_collections()  # what the start made is frozen, the collector back on
        assert gc.isenabled() and gc.get_freeze_count() > frozen
        startup.resume_collections()  # (once only)
        assert gc.isenabled()
        # A collector its host turned off stays off.
        gc.disable()
        startup.defer_collections()
        startup.resume_collections()
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()
