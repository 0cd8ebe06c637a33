"""Measurement plumbing: the reference service as a subprocess, manifests, measured runs.

Everything here runs the thing being measured in its own process, so that its CPU time
(``os.wait4`` rusage of the child: user + sys) and its memory (``VmRSS`` sampled from ``/proc``,
peak from ``ru_maxrss``) are its own and nobody else's. The service always runs in a separate
process too; its CPU time is read from ``/proc/PID/stat``.
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

__all__ = [
    "MeasuredRun",
    "Service",
    "byte_compile_package",
    "count_lines",
    "manifest",
    "manifest_options",
    "run_measured",
    "running_foreign_proxy",
    "running_service",
]

PY = sys.executable
#: How the reference service is started (a list so tests can swap it).
SERVE_CMD = [PY, "-m", "fashiontag_pipeline", "serve"]
_LISTENING = re.compile(r"listening on (https?://\S+)")
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")

#: Manifest URLs: stable, many distinct hosts paths; the service tags them from the URL alone
#: (``--no-fetch``), so they never need to resolve.
_URL = "https://img.example.com/catalog/{b}/{i}.jpg"
#: Random-looking ids (:func:`manifest`): an odd multiplier is a bijection modulo 2**64.
_SPREAD = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
#: Values of the context columns of :func:`manifest` (``context=True``).
_BRANDS = ("acme", "northwind", "maison-lune", "fjord & co", "atelier 9", "kōbō")
_GENDERS = ("women", "men", "unisex")
_SEASONS = ("", "fw26")
#: The keys of a JSONL manifest's objects (without and with context fields).
_COLUMNS = {False: ("id", "url"), True: ("id", "url", "brand", "gender", "season")}


# --------------------------------------------------------------------------- package


def byte_compile_package() -> Path | None:
    """Byte-compile the package that the measured children import, as ``pip install`` does.

    A shell with ``PYTHONDONTWRITEBYTECODE=1`` (or a fresh ``git archive`` snapshot) has no
    ``__pycache__`` for the package, so every measured process would compile its ~60 modules
    from source first (~30 ms of CPU each time): a cost of the checkout, not of the product.
    Python reads existing byte code whatever that variable says. Returns the package folder.
    """
    spec = importlib.util.find_spec("fashiontag_pipeline")
    if spec is None or spec.origin is None:
        return None
    root = Path(spec.origin).parent
    compileall.compile_dir(root, quiet=1)
    return root


# --------------------------------------------------------------------------- service


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (from ``/proc/PID/stat``)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return float("nan")
    # The command name may hold spaces: fields start after the last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def proc_rss_mb(pid: int) -> float | None:
    """Resident set size of a live process in MiB (``/proc/PID/statm``), None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/statm").read_text()
    except OSError:
        return None
    return int(raw.split()[1]) * _PAGE / (1024 * 1024)


@dataclass
class Service:
    """A running reference service (``fashiontag serve``) in its own process."""

    url: str
    proc: subprocess.Popen[str]
    rate: float
    faults: str | None
    log: Path

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.proc.pid)

    def rss_mb(self) -> float | None:
        return proc_rss_mb(self.proc.pid)


@contextmanager
def running_service(
    work: Path,
    *,
    rate: float = 0,
    faults: str | None = None,
    task_ttl: float | None = None,
    extra: Sequence[str] = (),
    startup_timeout: float = 60.0,
) -> Iterator[Service]:
    """Start ``python -m fashiontag_pipeline serve --port 0 --no-fetch``; SIGTERM it on exit.

    Waits for the ``listening on URL`` line on stdout; stdout is drained in a thread
    afterwards so that a chatty service can never block on a full pipe.
    """
    cmd = [*SERVE_CMD, "--host", "127.0.0.1", "--port", "0"]
    cmd += ["--rate", _num(rate), "--no-fetch"]
    if faults:
        cmd += ["--faults", faults]
    if task_ttl is not None:
        cmd += ["--task-ttl", _num(task_ttl)]
    cmd += list(extra)
    work.mkdir(parents=True, exist_ok=True)
    log = work / f"service-{int(time.time() * 1000)}.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=_child_env(), bufsize=1
        )
    try:
        url = _await_listening(proc, startup_timeout, log)
        yield Service(url=url, proc=proc, rate=rate, faults=faults, log=log)
    finally:
        _terminate(proc)


@contextmanager
def running_foreign_proxy(
    work: Path, upstream: str, *, startup_timeout: float = 60.0
) -> Iterator[str]:
    """Start ``python -m benchmarks.foreign`` in front of ``upstream``; yield its URL.

    Its own process: re-encoding every body costs the proxy, never the measured client."""
    cmd = [PY, "-m", "benchmarks.foreign", "--upstream", upstream, "--port", "0"]
    work.mkdir(parents=True, exist_ok=True)
    log = work / f"foreign-{int(time.time() * 1000)}.log"
    root = str(Path(__file__).resolve().parent.parent)
    env = _child_env(
        {"PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    )
    with log.open("w") as err:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env, bufsize=1
        )
    try:
        yield _await_listening(proc, startup_timeout, log)
    finally:
        _terminate(proc)


def _await_listening(proc: subprocess.Popen[str], timeout: float, log: Path) -> str:
    assert proc.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def pump(stream: IO[str]) -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, args=(proc.stdout,), daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RuntimeError(f"service did not report listening in {timeout:.0f}s (log: {log})")
        try:
            line = lines.get(timeout=remaining)
        except queue.Empty:
            continue
        if line is None:
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"service exited before listening (rc={proc.wait()}):\n{tail}")
        match = _LISTENING.search(line)
        if match:
            # The pump thread keeps draining stdout into the (unread) queue.
            return match.group(1).rstrip("/")


def _terminate(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # Children use the development keys unless the caller configured others.
    for var in ("FASHIONTAG_API_KEY", "FASHIONTAG_BULK_API_KEY", "FASHIONTAG_BASE_URL"):
        env.pop(var, None)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


# --------------------------------------------------------------------------- manifests


def manifest(
    work: Path, rows: int, ids: str = "sequential", context: bool = False, jsonl: bool = False
) -> Path:
    """A CSV manifest of ``rows`` valid rows (``id,url``), cached in ``work`` by size.

    ``ids``: ``sequential`` (``sku-000000000``, ``sku-000000001``, ...: a dump sorted by id)
    or ``random`` (16 hex digits that look random and never repeat: row ``i``'s is ``i``
    times an odd 64-bit constant, modulo 2**64; a dump sorted by anything but its ids, or
    ids that are hashes or UUIDs). The engine's run-wide dedupe keeps the ids in a B-tree
    that sequential ids fill at its right edge only and random ids everywhere.

    ``context``: three context columns after the URL, ``brand,gender,season`` (a fashion
    catalogue's usual shape; the engine sends each non-empty one in the request's context,
    and so does the async script). Every seventh row's ``season`` is empty (no value).

    ``jsonl``: the same rows as JSON Lines (``{"id": ..., "url": ..., "brand": ...}``, a
    catalogue exported from a database or a product API; an empty ``season`` written as
    ``""``). The async script reads CSV only.

    Written in 10k-row blocks with one ``join`` each (about 1 s per million rows): a larger
    block left this process (and so the peak RSS of every client it starts, which counts the
    memory of the process it was forked from) tens of MiB larger.
    """
    if ids not in ("sequential", "random"):
        raise ValueError(f"ids must be sequential or random, not {ids!r}")
    work.mkdir(parents=True, exist_ok=True)
    name = f"manifest-{rows}" + ("" if ids == "sequential" else f"-{ids}")
    suffix = ".jsonl" if jsonl else ".csv"
    path = work / (name + ("-context" if context else "") + suffix)
    if path.exists():
        return path
    tmp = path.with_suffix(suffix + ".part")
    block = 10_000  # (small: a measuring process forks its clients, which count its memory)
    with tmp.open("w", encoding="utf-8", newline="") as fh:
        if not jsonl:
            fh.write("id,url,brand,gender,season\n" if context else "id,url\n")
        for start in range(0, rows, block):
            stop = min(rows, start + block)
            if ids == "random":
                lines = [
                    f"{i * _SPREAD & _MASK:016x},{_URL.format(b=i % 997, i=i)}"
                    for i in range(start, stop)
                ]
            else:
                lines = [f"sku-{i:09d},{_URL.format(b=i % 997, i=i)}" for i in range(start, stop)]
            if context:
                lines = [
                    f"{line},{_BRANDS[i % len(_BRANDS)]},{_GENDERS[i % 3]},{_SEASONS[i % 7 != 0]}"
                    for i, line in enumerate(lines, start)
                ]
            if jsonl:
                columns = _COLUMNS[context]
                lines = [
                    json.dumps(dict(zip(columns, line.split(","), strict=True))) for line in lines
                ]
            fh.write("\n".join(lines) + "\n")
    tmp.replace(path)
    return path


def manifest_options(p: argparse.ArgumentParser) -> None:
    """The options of a measuring tool that choose its manifest (``args.ids``,
    ``args.context``, ``args.jsonl``: the arguments of :func:`manifest`)."""
    p.add_argument(
        "--ids",
        choices=("sequential", "random"),
        default="sequential",
        help="the manifest's ids: sequential (sorted) or random (hash-like)",
    )
    p.add_argument(
        "--context",
        action="store_true",
        help="three context columns after the URL (brand,gender,season), as a catalogue has",
    )
    p.add_argument(
        "--jsonl",
        action="store_true",
        help="the manifest as JSON Lines (one object a row), as a database or API export is",
    )


def count_lines(path: Path) -> int:
    """Number of lines of a file, read in 8 MiB blocks (0 when it does not exist)."""
    if not path.exists():
        return 0
    n = 0
    with path.open("rb") as fh:
        while block := fh.read(8 << 20):
            n += block.count(b"\n")
    return n


# --------------------------------------------------------------------------- measured runs


@dataclass
class MeasuredRun:
    """One measured child process: wall, CPU, memory, and output growth over time."""

    label: str
    cmd: list[str]
    rows: int
    returncode: int = 0
    wall_s: float = 0.0
    user_s: float = 0.0
    sys_s: float = 0.0
    peak_rss_mb: float = 0.0
    #: seconds from start to the first byte in the output file (None: never)
    first_result_s: float | None = None
    #: (t seconds, rss MiB, output bytes)
    samples: list[tuple[float, float, int]] = field(default_factory=list)
    out_lines: int = 0
    reject_lines: int = 0
    service_cpu_s: float | None = None
    summary: dict[str, Any] | None = None
    stderr_tail: str = ""
    timed_out: bool = False

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.sys_s

    @property
    def cpu_us_per_row(self) -> float:
        return self.cpu_s / self.rows * 1e6 if self.rows else float("nan")

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def results_curve(self) -> list[tuple[float, float]]:
        """(t, results written) over time, scaling output bytes by the final bytes per line."""
        if not self.samples:
            return []
        final_bytes = self.samples[-1][2]
        if final_bytes <= 0 or self.out_lines <= 0:
            return [(t, 0.0) for t, _, _ in self.samples]
        per_line = final_bytes / self.out_lines
        return [(t, b / per_line) for t, _, b in self.samples]

    def to_json(self, max_samples: int = 400) -> dict[str, Any]:
        step = max(1, len(self.samples) // max_samples)
        samples = self.samples[::step]
        if self.samples and samples[-1] != self.samples[-1]:
            samples.append(self.samples[-1])
        return {
            "label": self.label,
            "cmd": [_short(c) for c in self.cmd],
            "rows": self.rows,
            "ok": self.ok,
            "returncode": self.returncode,
            "timed_out": self.timed_out,
            "wall_s": round(self.wall_s, 3),
            "user_s": round(self.user_s, 3),
            "sys_s": round(self.sys_s, 3),
            "cpu_s": round(self.cpu_s, 3),
            "cpu_us_per_row": round(self.cpu_us_per_row, 3),
            "peak_rss_mb": round(self.peak_rss_mb, 1),
            "first_result_s": None
            if self.first_result_s is None
            else round(self.first_result_s, 3),
            "out_lines": self.out_lines,
            "reject_lines": self.reject_lines,
            "service_cpu_s": None if self.service_cpu_s is None else round(self.service_cpu_s, 3),
            "summary": self.summary,
            "stderr_tail": self.stderr_tail,
            "samples": [[round(t, 3), round(r, 1), b] for t, r, b in samples],
        }


def _short(arg: str) -> str:
    """Paths in reported commands relative to the repository, so reports do not leak /tmp."""
    try:
        return str(Path(arg).relative_to(Path.cwd()))
    except ValueError:
        return arg


def run_measured(
    label: str,
    cmd: Sequence[str],
    *,
    rows: int,
    out: Path,
    rejects: Path | None = None,
    service: Service | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 3600.0,
    interval: float = 0.05,
    count_output: bool = True,
    log_dir: Path | None = None,
) -> MeasuredRun:
    """Run ``cmd`` to completion, measuring it alone.

    * CPU: ``ru_utime + ru_stime`` of the child from ``os.wait4`` (includes interpreter start).
    * Peak RSS: ``ru_maxrss``; RSS over time: ``/proc/PID/statm`` every ``interval`` seconds.
    * Results over time: the size of ``out`` at each sample (bytes; scaled to lines later).
    * Service CPU over the run, when a service is given.
    """
    run = MeasuredRun(label=label, cmd=list(cmd), rows=rows)
    for p in (out, rejects):
        if p is not None and p.exists():
            p.unlink()
    err_path = (log_dir or out.parent) / f"{out.stem}.stderr"
    svc_cpu0 = service.cpu_seconds() if service else None
    with err_path.open("w") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            list(cmd), stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=_child_env(env)
        )
        status, rusage = _sample_until_exit(proc, run, out, t0, timeout, interval)
        run.wall_s = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    run.returncode = proc.returncode
    run.user_s = rusage.ru_utime
    run.sys_s = rusage.ru_stime
    run.peak_rss_mb = rusage.ru_maxrss / 1024  # KiB on Linux
    if service is not None and svc_cpu0 is not None:
        run.service_cpu_s = service.cpu_seconds() - svc_cpu0
    run.stderr_tail = err_path.read_text(errors="replace")[-1500:]
    if count_output:
        run.out_lines = count_lines(out)
        run.reject_lines = count_lines(rejects) if rejects is not None else 0
    return run


def _sample_until_exit(
    proc: subprocess.Popen[bytes],
    run: MeasuredRun,
    out: Path,
    t0: float,
    timeout: float,
    interval: float,
) -> tuple[int, Any]:
    pid = proc.pid
    while True:
        got, status, rusage = os.wait4(pid, os.WNOHANG)
        if got == pid:
            # One last point at exit so the curve ends where the run ended.
            now = time.monotonic() - t0
            size = _size(out)
            last_rss = run.samples[-1][1] if run.samples else 0.0
            run.samples.append((now, last_rss, size))
            if run.first_result_s is None and size > 0:
                run.first_result_s = now
            return status, rusage
        now = time.monotonic() - t0
        if now > timeout:
            run.timed_out = True
            os.kill(pid, signal.SIGKILL)
            _, status, rusage = os.wait4(pid, 0)
            return status, rusage
        rss = proc_rss_mb(pid)
        size = _size(out)
        if rss is not None:
            run.samples.append((now, rss, size))
        if run.first_result_s is None and size > 0:
            run.first_result_s = now
        time.sleep(interval)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
