"""Soak: ``fashiontag daemon`` for a long time with manifests arriving continually.

Starts the reference service (``fashiontag serve``, optionally rate-limited) and the daemon as
processes of their own, drops a manifest of random size every ``--interval`` seconds for
``--minutes``, samples the daemon's RSS and ``/metrics`` every ``--sample`` seconds, then waits
for every summary and drains the daemon with SIGTERM. Reports rows/s sustained (rows with an
outcome / time from the first drop to the last summary), peak RSS, and whether RSS stayed flat
(the slope of RSS over the second half of the run, in MiB per hour), and checks that every
manifest's outputs hold each of its ids exactly once.

    python -m benchmarks.soak --minutes 30            # the issue's soak
    python -m benchmarks.soak --minutes 2 --interval 1   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def _rows_total(url: str) -> float:
    try:
        text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    except OSError:
        return float("nan")
    total = 0.0
    for line in text.splitlines():
        if line.startswith("fashiontag_rows_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"process exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"nothing listens on {port}")


def _slope_mib_per_hour(samples: list[tuple[float, float]]) -> float:
    if len(samples) < 3:
        return 0.0
    n = len(samples)
    mx = sum(t for t, _ in samples) / n
    my = sum(r for _, r in samples) / n
    var = sum((t - mx) ** 2 for t, _ in samples)
    if var == 0:
        return 0.0
    cov = sum((t - mx) * (r - my) for t, r in samples)
    return cov / var * 3600


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between drops")
    parser.add_argument("--min-rows", type=int, default=1_000)
    parser.add_argument("--max-rows", type=int, default=40_000)
    parser.add_argument("--rate", type=float, default=0.0, help="service images/s (0: no limit)")
    parser.add_argument("--sample", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="fashiontag-soak-"))
    inbox, outbox = work / "inbox", work / "outbox"
    inbox.mkdir()
    svc_port, mon_port = _free_port(), _free_port()
    python = sys.executable
    serve_args = [python, "-m", "fashiontag_pipeline", "serve", "--port", str(svc_port)]
    if args.rate:
        serve_args += ["--rate", str(args.rate)]
    service = subprocess.Popen(serve_args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    daemon_log = (work / "daemon.log").open("wb")
    daemon = subprocess.Popen(
        [
            python,
            "-m",
            "fashiontag_pipeline",
            "daemon",
            "--inbox",
            str(inbox),
            "--outbox",
            str(outbox),
            "--base-url",
            f"http://127.0.0.1:{svc_port}",
            "--listen",
            f"127.0.0.1:{mon_port}",
            "--settle",
            "1",
            "--scan-interval",
            "0.5",
            "--log-format",
            "json",
        ],
        stdout=subprocess.DEVNULL,
        stderr=daemon_log,
    )
    mon = f"http://127.0.0.1:{mon_port}"
    expected: dict[str, int] = {}
    samples: list[dict[str, float]] = []
    try:
        _wait_port(svc_port, service)
        _wait_port(mon_port, daemon)
        started = time.monotonic()
        end = started + args.minutes * 60
        next_drop = next_sample = started
        n = 0
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_drop:
                rows = rng.randint(args.min_rows, args.max_rows)
                name = f"m{n:05d}.csv"
                lines = ["id,url,brand"] + [
                    f"{name}-{i},https://img.example/{n}/{i}.jpg,acme" for i in range(rows)
                ]
                tmp = inbox / f".{name}.part"
                tmp.write_text("\n".join(lines) + "\n")
                os.rename(tmp, inbox / name)
                expected[name] = rows
                n += 1
                next_drop += args.interval
            if now >= next_sample:
                samples.append(
                    {
                        "t": round(now - started, 1),
                        "rss_mib": round(_rss_mib(daemon.pid), 1),
                        "cpu_s": round(_cpu_s(daemon.pid), 2),
                        "rows": _rows_total(mon),
                    }
                )
                print(json.dumps(samples[-1]), flush=True)
                next_sample += args.sample
            if daemon.poll() is not None:
                raise SystemExit(f"daemon exited with {daemon.returncode}")
            time.sleep(0.05)
        dropped_until = time.monotonic()
        # Every manifest dropped must complete.
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            done = list(outbox.glob("*/summary.json"))
            if len(done) >= len(expected):
                break
            time.sleep(0.5)
        finished = time.monotonic()
        samples.append(
            {
                "t": round(finished - started, 1),
                "rss_mib": round(_rss_mib(daemon.pid), 1),
                "cpu_s": round(_cpu_s(daemon.pid), 2),
                "rows": _rows_total(mon),
            }
        )
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(timeout=60)
    finally:
        for proc in (daemon, service):
            if proc.poll() is None:
                proc.kill()
        daemon_log.close()
    # Exactly once, per manifest.
    bad: list[str] = []
    total = 0
    for name, rows in expected.items():
        folder = outbox / name[: -len(".csv")]
        summary_path = folder / "summary.json"
        if not summary_path.exists():
            bad.append(f"{name}: no summary")
            continue
        ids: set[str] = set()
        count = 0
        for file in ("results.jsonl", "rejects.jsonl"):
            with (folder / file).open("rb") as fh:
                for line in fh:
                    count += 1
                    ids.add(json.loads(line)["id"])
        if count != rows or len(ids) != rows:
            bad.append(f"{name}: {count} lines, {len(ids)} ids, {rows} rows")
        total += rows
    elapsed = finished - started
    second_half = [
        (s["t"], s["rss_mib"]) for s in samples if s["t"] >= (dropped_until - started) / 2
    ]
    report: dict[str, Any] = {
        "minutes": args.minutes,
        "manifests": len(expected),
        "rows": total,
        "elapsed_s": round(elapsed, 1),
        "rows_per_s": round(total / elapsed, 1),
        "daemon_cpu_s": samples[-1]["cpu_s"],
        "cpu_us_per_row": round(samples[-1]["cpu_s"] / max(total, 1) * 1e6, 2),
        "peak_rss_mib": max(s["rss_mib"] for s in samples),
        "rss_first_sample_mib": samples[0]["rss_mib"],
        "rss_last_sample_mib": samples[-1]["rss_mib"],
        "rss_slope_second_half_mib_per_h": round(_slope_mib_per_hour(second_half), 2),
        "exit_code": code,
        "exactly_once": not bad,
        "problems": bad[:20],
        "metrics_rows_total": samples[-1]["rows"],
        "samples": samples,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"soak-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    summary = {k: v for k, v in report.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    print(f"written {path}")
    return 0 if not bad and code == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
