"""A real ``fashiontag daemon`` process for the tests, and readers of what it writes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import anyio
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "BootedDaemon",
    "DaemonProcess",
    "drop_atomic",
    "metric_samples",
    "read_lines",
    "until_results",
    "write_manifest",
]


def daemon_once(root: Path, *args: str) -> tuple[subprocess.CompletedProcess[bytes], float]:
    """``fashiontag daemon`` on ``root/IN`` (made) and ``root/OUT``, no endpoints, with
    ``args``, run to its end (a daemon refused at start): its process and the seconds it took."""
    (root / "IN").mkdir(exist_ok=True)
    started = time.monotonic()
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "fashiontag_pipeline", "daemon"),
            *("--inbox", str(root / "IN"), "--outbox", str(root / "OUT"), "--listen", ""),
            *args,
        ],
        capture_output=True,
        timeout=60,
    )
    return proc, time.monotonic() - started


def write_manifest(path: Path, ids: Sequence[str], *, url_tag: str = "") -> bytes:
    lines = ["id,url,brand"] + [f"{i},https://img.example/{url_tag}{i}.jpg,acme" for i in ids]
    return ("\n".join(lines) + "\n").encode()


def drop_atomic(inbox: Path, name: str, data: bytes) -> None:
    """Drop a manifest the atomic way: written under a hidden name, then renamed in."""
    tmp = inbox / f".{name}.part"
    tmp.write_bytes(data)
    os.rename(tmp, inbox / name)


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The complete lines of an output (one being written may end in a partial line)."""
    if not path.exists():
        return []
    text = path.read_text()
    if not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in text.splitlines()]


def metric_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


async def until_results(
    daemon: DaemonProcess, stem: str, n: int = 1, timeout: float = 60.0
) -> None:
    """Until ``n`` results of the manifest ``stem`` are written (it is being read)."""
    with anyio.fail_after(timeout):
        while len(read_lines(daemon.outbox / stem / "results.jsonl")) < n:
            daemon.check_alive()
            await anyio.sleep(0.02)


@dataclass
class DaemonProcess:
    """``fashiontag daemon`` on ``inbox``/``outbox`` against ``base_url``, as a subprocess."""

    root: Path
    base_url: str
    extra: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)
    settle: float = 0.4
    #: The port asked for (0: one the system picks, read from the "daemon started" line:
    #: a port chosen here and bound later could be taken meanwhile by another test worker).
    port: int = 0
    #: The daemon's working directory (None: the test's), for a relative ``--outbox``.
    cwd: Path | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def inbox(self) -> Path:
        return self.root / "inbox"

    @property
    def outbox(self) -> Path:
        return self.root / "outbox"

    def _said_port(self) -> int | None:
        """The port in the "daemon started" line of the log so far (None: not logged yet)."""
        for text in self.stderr_path.read_text(errors="replace").splitlines():
            if '"daemon started"' in text:
                with contextlib.suppress(ValueError):
                    listen = json.loads(text).get("listen")
                    if listen:
                        return int(str(listen).rsplit(":", 1)[1])
        return None

    @property
    def listen_port(self) -> int:
        """The port the daemon's endpoints listen on (asked for, or as its log says)."""
        port = self.port or self._said_port()
        if port is None:
            raise AssertionError(f"the daemon has not said where it listens yet: {self.tail(5)}")
        return port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    def start(self) -> DaemonProcess:
        self.inbox.mkdir(parents=True, exist_ok=True)
        args = [
            sys.executable,
            "-m",
            "fashiontag_pipeline",
            "daemon",
            "--inbox",
            str(self.inbox),
            "--outbox",
            str(self.outbox),
            "--base-url",
            self.base_url,
            "--listen",
            f"127.0.0.1:{self.port}",
            "--settle",
            str(self.settle),
            "--scan-interval",
            "0.1",
            "--log-format",
            "json",
            "--linger",
            "0.05",
            "--rotate-seconds",
            "2",
            *self.extra,
        ]
        env = {**os.environ, **self.env}
        self.stderr_path = self.root / f"daemon-{time.monotonic_ns()}.err"
        self.stdout_path = self.stderr_path.with_suffix(".out")
        with self.stderr_path.open("wb") as err, self.stdout_path.open("wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=err, env=env, cwd=self.cwd)
        return self

    def tail(self, lines: int = 40) -> str:
        """The last lines of the daemon's log (an assertion's message: a CI log shows why)."""
        return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-lines:])

    def logs(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stderr_path.read_text().splitlines() if line]

    async def get(self, path: str, timeout: float = 20.0) -> tuple[int, str]:
        """GET one of the daemon's endpoints (once it has said where it listens)."""
        with anyio.fail_after(timeout):
            while not self.port and self._said_port() is None:
                self.check_alive()
                await anyio.sleep(0.05)
        async with aiohttp.ClientSession() as session, session.get(self.url + path) as resp:
            return resp.status, await resp.text()

    async def wait_ready_endpoint(self, timeout: float = 20.0) -> None:
        """Until the monitoring endpoints answer."""
        with anyio.fail_after(timeout):
            while True:
                self.check_alive()
                try:
                    status, _ = await self.get("/livez")
                    if status == 200:
                        return
                except aiohttp.ClientError:
                    pass
                await anyio.sleep(0.05)

    def check_alive(self) -> None:
        assert self.proc is not None
        code = self.proc.poll()
        if code is not None:
            raise AssertionError(
                f"daemon exited with {code}: {self.stderr_path.read_text()[-3000:]}"
            )

    async def wait_summary(self, stem: str, timeout: float = 60.0) -> dict[str, Any]:
        path = self.outbox / stem / "summary.json"
        with anyio.fail_after(timeout):
            while not path.exists():
                self.check_alive()
                await anyio.sleep(0.05)
        return dict(json.loads(path.read_text()))

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    async def wait_exit(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        with anyio.fail_after(timeout):
            while (code := self.proc.poll()) is None:
                await anyio.sleep(0.05)
        return code

    async def kill(self) -> None:
        self.signal(signal.SIGKILL)
        await self.wait_exit()

    def ensure_dead(self) -> None:
        """Kill the process if it still runs, and reap it (a test that failed midway)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    async def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.signal(signal.SIGTERM)
        return await self.wait_exit()


@dataclass
class BootedDaemon(DaemonProcess):
    """The daemon started through the Python script ``boot`` (same arguments): a fault or a
    slowness set in the real process before ``fashiontag_pipeline.cli.main`` runs. The script
    puts the working directory first on ``sys.path`` (as ``-m`` does: the checkout under
    test), then calls ``main(sys.argv[1:])``."""

    boot: str = ""

    def start(self) -> BootedDaemon:
        script = self.root / "boot.py"
        script.write_text(
            "import os, sys\nsys.path.insert(0, os.getcwd())\n"
            + self.boot
            + "\nfrom fashiontag_pipeline.cli import main\nraise SystemExit(main(sys.argv[1:]))\n"
        )
        real = subprocess.Popen

        def popen(args: list[str], *a: Any, **k: Any) -> subprocess.Popen[bytes]:
            at = args.index("-m")
            return real([*args[:at], str(script), *args[at + 2 :]], *a, **k)

        subprocess.Popen = popen  # type: ignore[assignment, misc]
        try:
            super().start()
        finally:
            subprocess.Popen = real  # type: ignore[misc]
        return self
