"""Load and hostile-client benchmark of the reference service (``fashiontag serve``).

One command::

    python -m benchmarks.hostile                       # the checkout's service, ~3 minutes
    python -m benchmarks.hostile --source /tmp/old     # a service from another tree (before/after)

It starts the service in its own process (``python -m fashiontag_pipeline serve --port 0``,
run from ``--source`` when given) and measures, over loopback:

* **load**: ops/s and p50/p99 latency of a normal mix (single-mode tag, task status, a
  10-result page) at 20 and 200 concurrent clients;
* **under attack**: the latency of a normal request (a single-mode tag; a fetched image for
  the fetch attack) sent every 50 ms while each attack of the hardening issue runs, with the
  service's peak RSS. Attacks: ``png-bomb`` (8 clients posting a 113 KB base64 PNG of
  6300x6300 pixels), ``task-list`` (300 concurrent lists of a key with 3,000 tasks),
  ``connections`` (2,000 idle + 2,000 header-drip sockets), ``bad-json`` (20 clients posting
  JSON nested 100k deep), ``slow-fetch`` (110 single-mode fetches from a 1 byte/s host;
  another key's 1-image task behind one key's 64 slow URLs).

Every attack is bounded in count and time (``--attack-seconds``); nothing leaves loopback. The
JSON report goes to stdout (``--out`` to save it).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from benchmarks.harness import proc_rss_mb

SINGLE = "/tagger/v2/tags"
BULK = "/tagger/v2.12/bulk"
KEY = "bench-single-key-0001"
BULK_KEY = "bench-bulk-key-0002"
OTHER_BULK_KEY = "bench-bulk-key-0003"
PROBE_INTERVAL = 0.05


# --------------------------------------------------------------------------- the service


class Service:
    def __init__(self, url: str, proc: subprocess.Popen[str], log: Path) -> None:
        self.url = url
        self.proc = proc
        self.log = log
        self.peak_rss = 0.0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            rss = proc_rss_mb(self.proc.pid)
            if rss is not None:
                self.peak_rss = max(self.peak_rss, rss)

    def rss(self) -> float:
        return proc_rss_mb(self.proc.pid) or 0.0

    def reset_peak(self) -> None:
        self.peak_rss = self.rss()

    def stop(self) -> None:
        self._stop.set()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _serve_flags(source: Path | None, work: Path) -> str:
    # cwd=work as for the service: ``-m`` would otherwise import the package from the cwd.
    work.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "fashiontag_pipeline", "serve", "--help"],
        capture_output=True,
        text=True,
        env=_env(source),
        cwd=work,
        check=True,
    ).stdout


def _env(source: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("FASHIONTAG_API_KEY", "FASHIONTAG_BULK_API_KEY", "FASHIONTAG_BASE_URL"):
        env.pop(var, None)
    env["PYTHONUNBUFFERED"] = "1"
    if source is not None:
        env["PYTHONPATH"] = str(source)
    return env


@contextlib.contextmanager
def service(source: Path | None, work: Path, extra: list[str]) -> Iterator[Service]:
    cmd = [sys.executable, "-m", "fashiontag_pipeline", "serve", "--port", "0"]
    cmd += ["--api-key", KEY, "--bulk-api-key", BULK_KEY, "--bulk-api-key", OTHER_BULK_KEY]
    cmd += extra
    work.mkdir(parents=True, exist_ok=True)
    log = work / f"hostile-service-{int(time.time() * 1000)}.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=_env(source), cwd=work
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"service did not start: {line!r} (log: {log})")
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    svc = Service(line.split()[-1], proc, log)
    try:
        yield svc
    finally:
        svc.stop()


# --------------------------------------------------------------------------- helpers


def percentiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {"n": 0}
    ordered = sorted(samples)
    q = statistics.quantiles(ordered, n=100, method="inclusive") if len(ordered) > 1 else []

    def ms(v: float) -> float:
        return round(v * 1000, 1)

    return {
        "n": len(ordered),
        "p50_ms": ms(statistics.median(ordered)),
        "p99_ms": ms(q[98] if q else ordered[0]),
        "max_ms": ms(ordered[-1]),
    }


def _element(url: str, ident: str) -> dict[str, Any]:
    return {"image": {"type": "url", "content": url}, "context": {"id": ident}}


async def _json(session: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> Any:
    async with session.request(method, url, **kw) as resp:
        return resp.status, await resp.json(content_type=None)


async def probe_while(
    base: str,
    flood: str,
    flood_args: dict[str, Any],
    *,
    seconds: float,
    probe: Callable[[aiohttp.ClientSession], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """Latency of normal requests, one every 50 ms (each on its own connection, like a new
    client), while the attack ``flood`` runs in a child process (its own CPU and event loop,
    so the probes measure the service, not this process); the child is stopped after
    ``seconds`` of probing."""
    samples: list[float] = []
    failures = 0
    body = json.dumps({"image": {"type": "url", "content": "https://cdn.example/p.jpg"}})

    async def default_probe(session: aiohttp.ClientSession) -> None:
        async with session.post(base + SINGLE, data=body, headers={"x-api-key": KEY}) as resp:
            await resp.read()
            if resp.status != 200:
                raise RuntimeError(resp.status)

    run_probe = probe or default_probe

    async def one() -> None:
        nonlocal failures
        started = time.perf_counter()
        try:
            connector = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=30)
            ) as session:
                await run_probe(session)
            samples.append(time.perf_counter() - started)
        except Exception:
            failures += 1

    child = multiprocessing.get_context("spawn").Process(
        target=_flood_main, args=(flood, flood_args), daemon=True
    )
    child.start()
    try:
        await asyncio.sleep(min(2.0, seconds / 4))  # let the attack build up
        probes: list[asyncio.Task[None]] = []
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            probes.append(asyncio.ensure_future(one()))
            await asyncio.sleep(PROBE_INTERVAL)
        await asyncio.gather(*probes)
    finally:
        child.terminate()
        child.join(10)
    return {**percentiles(samples), "probe_failures": failures}


def _flood_main(name: str, kwargs: dict[str, Any]) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(FLOODS[name](**kwargs))


async def repeat(clients: int, action: Callable[[], Awaitable[None]]) -> None:
    async def loop() -> None:
        while True:
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                await action()

    await asyncio.gather(*(loop() for _ in range(clients)))


# --------------------------------------------------------------------------- load


async def load(base: str, clients: int, seconds: float) -> dict[str, Any]:
    """A normal mix (single tag, status, a 10-result page) from ``clients`` at once."""
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        bulk = {"x-api-key": BULK_KEY}
        status, created = await _json(
            session,
            "POST",
            base + BULK,
            json={"taggingRequest": [_element(f"https://c/{i}.jpg", str(i)) for i in range(100)]},
            headers=bulk,
        )
        assert status == 202, created
        task = created["taskId"]
        single = json.dumps({"image": {"type": "url", "content": "https://cdn.example/p.jpg"}})
        ops: list[tuple[str, str, dict[str, Any]]] = [
            ("POST", base + SINGLE, {"data": single, "headers": {"x-api-key": KEY}}),
            ("GET", f"{base}{BULK}/{task}/status", {"headers": bulk}),
            ("GET", f"{base}{BULK}/{task}?offset=0&size=10", {"headers": bulk}),
        ]
        samples: list[float] = []
        errors = 0
        deadline = time.perf_counter() + seconds

        async def client(n: int) -> None:
            nonlocal errors
            i = n
            while time.perf_counter() < deadline:
                method, url, kw = ops[i % len(ops)]
                i += 1
                started = time.perf_counter()
                try:
                    async with session.request(method, url, **kw) as resp:
                        await resp.read()
                        ok = resp.status < 400
                except aiohttp.ClientError:
                    ok = False
                if ok:
                    samples.append(time.perf_counter() - started)
                else:
                    errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(client(n) for n in range(clients)))
        elapsed = time.perf_counter() - started
    return {
        "clients": clients,
        "ops_per_s": round(len(samples) / elapsed),
        "errors": errors,
        **percentiles(samples),
    }


# --------------------------------------------------------------------------- attacks


def bomb_png() -> str:
    from PIL import Image

    out = io.BytesIO()
    Image.new("L", (6300, 6300), 0).save(out, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


async def flood_posts(base: str, path: str, body: bytes, key: str, clients: int) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def post() -> None:
            async with session.post(base + path, data=body, headers={"x-api-key": key}) as r:
                await r.read()

        await repeat(clients, post)


async def flood_lists(base: str, clients: int) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def list_tasks() -> None:
            async with session.get(base + BULK, headers={"x-api-key": BULK_KEY}) as r:
                await r.read()

        await repeat(clients, list_tasks)


async def flood_connections(host: str, port: int, count: int) -> None:
    """``count`` sockets: half idle, half sending a request line then one header byte/s."""
    loop = asyncio.get_running_loop()
    sockets: list[socket.socket] = []
    for i in range(count):
        s = socket.socket()
        s.setblocking(False)
        try:
            await loop.sock_connect(s, (host, port))
        except OSError:
            s.close()
            continue
        sockets.append(s)
        if i % 2:
            with contextlib.suppress(OSError):
                s.send(b"GET /openapi.json HTTP/1.1\r\n")
    while True:
        await asyncio.sleep(1)
        for n, s in enumerate(sockets):
            if n % 2:
                with contextlib.suppress(OSError):
                    s.send(b"X")


async def flood_slow_fetch(base: str, slow: str, clients: int) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        counter = iter(range(10**9))

        async def post() -> None:
            body = json.dumps({"image": {"type": "url", "content": f"{slow}/{next(counter)}.png"}})
            async with session.post(base + SINGLE, data=body, headers={"x-api-key": KEY}) as r:
                await r.read()

        await repeat(clients, post)


FLOODS: dict[str, Callable[..., Awaitable[None]]] = {
    "posts": flood_posts,
    "lists": flood_lists,
    "connections": flood_connections,
    "slow-fetch": flood_slow_fetch,
    "idle": lambda: asyncio.sleep(3600),
}


async def attack_png_bomb(base: str, seconds: float) -> dict[str, Any]:
    body = json.dumps({"image": {"type": "base64", "content": bomb_png()}}).encode()
    flood = {"base": base, "path": SINGLE, "body": body, "key": KEY, "clients": 8}
    result = await probe_while(base, "posts", flood, seconds=seconds)
    return result | {"encoded_kb": round(len(body) / 1024)}


async def attack_task_list(base: str, seconds: float) -> dict[str, Any]:
    headers = {"x-api-key": BULK_KEY}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100)) as session:
        one = json.dumps({"taggingRequest": [_element("https://c/x.jpg", "x")]})

        async def create() -> None:
            async with session.post(base + BULK, data=one, headers=headers) as r:
                await r.read()

        for _ in range(30):
            await asyncio.gather(*(create() for _ in range(100)))
        async with session.get(base + BULK, headers=headers) as r:
            listed = len(await r.read())
    result = await probe_while(base, "lists", {"base": base, "clients": 300}, seconds=seconds)
    return result | {"list_kb": round(listed / 1024)}


async def attack_connections(base: str, host: str, port: int, seconds: float) -> dict[str, Any]:
    flood = {"host": host, "port": port, "count": 4000}
    return await probe_while(base, "connections", flood, seconds=seconds)


async def attack_bad_json(base: str, seconds: float) -> dict[str, Any]:
    body = b"[" * 100_000 + b"]" * 100_000
    async with (
        aiohttp.ClientSession() as session,
        session.post(base + BULK, data=body, headers={"x-api-key": BULK_KEY}) as r,
    ):
        status = r.status
    flood = {"base": base, "path": BULK, "body": body, "key": BULK_KEY, "clients": 20}
    result = await probe_while(base, "posts", flood, seconds=seconds)
    return result | {"status": status}


@contextlib.asynccontextmanager
async def image_hosts() -> AsyncIterator[tuple[str, str]]:
    """(slow, fast) loopback image hosts: slow sends one byte a second."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(out, format="PNG")
    png = out.getvalue()

    async def slow(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "image/png"})
        await resp.prepare(request)
        for byte in png:
            await resp.write(bytes([byte]))
            await asyncio.sleep(1)
        return resp

    async def fast(request: web.Request) -> web.Response:
        return web.Response(body=png, content_type="image/png")

    runners = []
    urls = []
    try:
        for handler in (slow, fast):
            app = web.Application()
            app.router.add_get("/{name}", handler)
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
            await runner.setup()
            runners.append(runner)
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
        yield urls[0], urls[1]
    finally:
        for runner in runners:
            await runner.cleanup()


async def attack_slow_fetch(base: str, seconds: float) -> dict[str, Any]:
    async with (
        image_hosts() as (slow, fast),
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
    ):
        single = {"x-api-key": KEY}

        async def fast_probe(probe_session: aiohttp.ClientSession) -> None:
            body = json.dumps({"image": {"type": "url", "content": f"{fast}/p.png"}})
            async with probe_session.post(base + SINGLE, data=body, headers=single) as r:
                await r.read()

        singles = await probe_while(
            base,
            "slow-fetch",
            {"base": base, "slow": slow, "clients": 110},
            seconds=seconds,
            probe=fast_probe,
        )

        # One key's task of 64 slow URLs, then another key's 1-image task: time to its DONE.
        slow_task = {"taggingRequest": [_element(f"{slow}/b{i}.png", str(i)) for i in range(64)]}
        status, _ = await _json(
            session, "POST", base + BULK, json=slow_task, headers={"x-api-key": BULK_KEY}
        )
        assert status == 202
        await asyncio.sleep(0.5)
        started = time.perf_counter()
        other = {"x-api-key": OTHER_BULK_KEY}
        status, created = await _json(
            session,
            "POST",
            base + BULK,
            json={"taggingRequest": [_element(f"{fast}/o.png", "o")]},
            headers=other,
        )
        assert status == 202
        waited = None
        while time.perf_counter() - started < 60:
            _, body = await _json(
                session, "GET", f"{base}{BULK}/{created['taskId']}/status", headers=other
            )
            if body["data"]["taskStatus"] == "TASK_DONE":
                waited = time.perf_counter() - started
                break
            await asyncio.sleep(0.05)
    return {
        "single_fetch_probe": singles,
        "other_key_task_done_s": None if waited is None else round(waited, 2),
    }


# --------------------------------------------------------------------------- main


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work)
    new = "--max-live-tasks" in _serve_flags(args.source, work)
    report: dict[str, Any] = {"source": str(args.source or "checkout"), "load": [], "attacks": {}}
    base_flags = ["--no-fetch", "--rate", "0"] + (["--max-live-tasks", "5000"] if new else [])
    seconds = args.attack_seconds

    with service(args.source, work, base_flags) as svc:
        for clients in (20, 200):
            report["load"].append(await load(svc.url, clients, args.load_seconds))
        host, port = svc.url.rsplit("//", 1)[1].rsplit(":", 1)
        attacks: list[tuple[str, Callable[[], Awaitable[dict[str, Any]]]]] = [
            ("none", lambda: probe_while(svc.url, "idle", {}, seconds=seconds)),
            ("png-bomb", lambda: attack_png_bomb(svc.url, seconds)),
            ("task-list", lambda: attack_task_list(svc.url, seconds)),
            ("bad-json", lambda: attack_bad_json(svc.url, seconds)),
            ("connections", lambda: attack_connections(svc.url, host, int(port), seconds)),
        ]
        for name, run in attacks:
            if args.only and name not in args.only:
                continue
            svc.reset_peak()
            rss0 = svc.rss()
            result = await run()
            report["attacks"][name] = result | {
                "rss_before_mb": round(rss0),
                "rss_peak_mb": round(svc.peak_rss),
            }
            print(name, json.dumps(report["attacks"][name]), file=sys.stderr, flush=True)
        report["service_log_bytes"] = svc.log.stat().st_size
        report["key_in_log"] = any(
            k in svc.log.read_text(errors="replace") for k in (KEY, BULK_KEY, OTHER_BULK_KEY)
        )

    if not args.only or "slow-fetch" in args.only:
        fetch_flags = ["--fetch", "--rate", "0"] + (["--fetch-allow-private"] if new else [])
        with service(args.source, work, fetch_flags) as svc:
            svc.reset_peak()
            result = await attack_slow_fetch(svc.url, seconds)
            report["attacks"]["slow-fetch"] = result | {"rss_peak_mb": round(svc.peak_rss)}
            print("slow-fetch", json.dumps(result), file=sys.stderr, flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hostile", description=__doc__)
    parser.add_argument("--source", type=Path, help="run the service from this tree")
    parser.add_argument("--load-seconds", type=float, default=8.0)
    parser.add_argument("--attack-seconds", type=float, default=8.0)
    parser.add_argument("--only", nargs="*", help="attacks to run (default: all)")
    parser.add_argument("--work", default="benchmarks/results/tmp")
    parser.add_argument("--out", type=Path, help="also write the JSON report here")
    args = parser.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    report = asyncio.run(_main(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
