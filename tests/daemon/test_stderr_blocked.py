"""A daemon whose stderr nobody reads (a log shipper whose backend is down, ``daemon 2>&1 |
tool`` with the tool paused): its work and its endpoints never wait for the log reader, the
lines it could not keep are counted in one line once the reader is back, and at a normal exit
every queued line is written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import anyio

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import DaemonProcess, drop_atomic, metric_samples, write_manifest

MANIFESTS = 250


async def livez(daemon: DaemonProcess) -> int:
    """/livez's status, within 5 s (an event loop blocked on its stderr never answers)."""
    timeout = aiohttp.ClientTimeout(total=5)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(daemon.url + "/livez") as resp,
    ):
        return resp.status


@dataclass
class UnreadDaemon(DaemonProcess):
    """The daemon with its stderr on a pipe read only until it says where it listens."""

    def start(self) -> UnreadDaemon:
        self.inbox.mkdir(parents=True, exist_ok=True)
        self.stderr_path = self.root / "unused.err"
        self.stderr_path.write_text("")
        self.stdout_path = self.root / "daemon.out"
        args = [
            *(sys.executable, "-m", "fashiontag_pipeline", "daemon", "-vv"),
            *("--inbox", str(self.inbox), "--outbox", str(self.outbox)),
            *("--base-url", self.base_url, "--listen", "127.0.0.1:0"),
            *("--settle", "0.1", "--scan-interval", "0.05", "--log-format", "json"),
            *("--linger", "0.05", "--rotate-seconds", "2"),
        ]
        with self.stdout_path.open("wb") as out:
            self.proc = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.PIPE,
                # (a small queue: the daemon's lines for these manifests overflow it)
                env={**os.environ, "FASHIONTAG_LOG_QUEUE_LINES": "64"},
            )
        assert self.proc.stderr is not None
        self.head: list[bytes] = []
        deadline = time.monotonic() + 30
        while not self.port and time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            assert line, f"the daemon ended: {b''.join(self.head)!r}"
            self.head.append(line)
            if b'"daemon started"' in line:
                self.port = int(str(json.loads(line)["listen"]).rsplit(":", 1)[1])
        return self


async def test_a_stderr_nobody_reads_stops_neither_the_work_nor_the_endpoints(
    tmp_path: Path,
) -> None:
    """The hunt's reproduction: the daemon stopped tagging at manifest 151 of 400 once the
    64 KiB pipe was full, and /livez stopped answering."""
    async with running_service(ServiceConfig()) as svc:
        daemon = UnreadDaemon(tmp_path, svc.url).start()
        rest: list[bytes] = []
        try:
            for n in range(MANIFESTS):
                data = write_manifest(Path(), [f"p{i}" for i in range(3)], url_tag=f"{n}-")
                drop_atomic(daemon.inbox, f"m{n}.csv", data)
            with anyio.fail_after(60):
                while len(list(daemon.outbox.glob("*/summary.json"))) < MANIFESTS:
                    daemon.check_alive()
                    assert await livez(daemon) == 200
                    await anyio.sleep(0.2)
            status, metrics = await daemon.get("/metrics", timeout=5)
            assert status == 200
            dropped = metric_samples(metrics)[("fashiontag_log_lines_dropped_total", ())]
            assert dropped > 0  # (else the pipe never filled: the test proves nothing)
            # The reader is back: what was queued comes out, then the count of the rest.
            assert daemon.proc is not None and daemon.proc.stderr is not None
            reader = threading.Thread(target=lambda: rest.extend(daemon.proc.stderr))  # type: ignore[union-attr]
            reader.start()
            await anyio.sleep(1.0)
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait_exit() == 0
            reader.join(timeout=30)
        finally:
            daemon.ensure_dead()
            if daemon.proc is not None and daemon.proc.stderr is not None:
                daemon.proc.stderr.close()
    docs = [json.loads(line) for line in daemon.head + rest]  # every line whole
    said = [d for d in docs if "dropped" in str(d["event"])]
    # (at least the count read from /metrics: a line logged between that read and the
    # reader's start was dropped too, and is said with the others: 412 against 411 once)
    assert said and sum(int(d["lines"]) for d in said) >= dropped
    assert docs[-1]["event"] == "daemon stopped"


def test_every_line_is_written_at_a_normal_exit() -> None:
    """A burst of lines logged just before the process ends: each one is on stderr, whole and
    in order, after the process has gone."""
    script = (
        "import logging\n"
        "from fashiontag_pipeline.daemon.logs import configure_logging\n"
        "configure_logging(log_format='json', background=True)\n"
        "log = logging.getLogger('fashiontag_pipeline.daemon')\n"
        "for n in range(3000):\n"
        "    log.info('line', extra={'n': n, 'pad': 'x' * 200})\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, timeout=60, env=dict(os.environ)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [json.loads(line)["n"] for line in proc.stderr.splitlines()] == list(range(3000))


def test_a_stderr_still_blocked_at_exit_holds_the_process_only_briefly() -> None:
    """At exit the queued lines have a short deadline: a reader stalled for ever does not keep
    the process alive for ever."""
    script = (
        "import logging\n"
        "from fashiontag_pipeline.daemon.logs import configure_logging\n"
        "configure_logging(log_format='json', background=True)\n"
        "log = logging.getLogger('fashiontag_pipeline.daemon')\n"
        "for n in range(3000):\n"
        "    log.info('line', extra={'n': n, 'pad': 'x' * 200})\n"
    )
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    try:
        assert proc.wait(timeout=20) == 0
        assert time.monotonic() - started < 15
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()


def test_lines_dropped_just_before_exit_are_still_counted_in_the_log() -> None:
    """A reader stalled while a stopping daemon logged its last lines, back within the exit's
    2 s: the queued lines were written, but the lines dropped meanwhile were said nowhere
    (their warning waits for an idle writer, and the process ended first), so the log read
    as whole with lines missing. The exit says how many, after the queued lines."""
    script = (
        "import logging\n"
        "from fashiontag_pipeline.daemon.logs import configure_logging\n"
        "configure_logging(log_format='json', background=True, queue_lines=50)\n"
        "log = logging.getLogger('fashiontag_pipeline.daemon')\n"
        "for n in range(3000):\n"
        "    log.info('line', extra={'n': n, 'pad': 'x' * 200})\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    try:
        time.sleep(0.8)  # (the burst is logged and the pipe full; the exit's flush waits)
        assert proc.stderr is not None
        raw = proc.stderr.read()
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()
    docs = [json.loads(line) for line in raw.splitlines()]
    written = [d["n"] for d in docs if d["event"] == "line"]
    assert written == sorted(written) and len(written) < 3000
    said = [d for d in docs if "dropped" in str(d["event"])]
    assert said and sum(int(d["lines"]) for d in said) == 3000 - len(written), docs[-3:]
