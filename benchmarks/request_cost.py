"""What one HTTP exchange costs the client: the engine's, bare aiohttp's, and a lean one's.

    python -m benchmarks.request_cost [--images 1000] [--rounds 20] [--repeat 3]
    python -m benchmarks.request_cost --instructions      # valgrind: marginal instructions

The reference service runs in its own process (``serve --rate 0 --no-fetch``) with one done
task of ``--images`` images. Each client mode runs in a child process of its own, one request at
a time over one keep-alive connection, and a round is: every results page of the task (``GET
.../bulk/{task}?offset=&size=100``, the body read as bytes, never decoded), 10 status reads
(``GET .../status``, decoded with the engine's decoder in every mode) and one append of 1,000
images (``PUT .../bulk/{task}`` to a task of the child's own; the body built by the engine's
``bulk_body`` in every mode, its answer decoded with the engine's decoder). Modes:

* ``engine``: :class:`~fashiontag_pipeline.TaggerClient` (``task_results_raw``,
  ``task_status``, ``append_to_task``): aiohttp under the engine's retry, error and bound layer;
* ``aiohttp``: a bare ``aiohttp.ClientSession`` (the async script's calls: ``session.get(url)``
  then ``await resp.read()``);
* ``parser``: an ``asyncio.Protocol`` on one connection writing pre-built request bytes, the
  answers parsed by aiohttp's C parser (``aiohttp._http_parser.HttpResponseParser``), the body
  read from its ``StreamReader`` as aiohttp's ``resp.read()`` does (64 KiB buffer);
* ``lean``: an ``asyncio.BufferedProtocol`` reading into one reused buffer, with a hand-rolled
  reader (the head up to the blank line, then ``Content-Length`` bytes, copied out once);
  nothing else of HTTP is handled: a floor, not a client.

CPU: ``time.process_time()`` of the child around each kind of request after one warm-up round
(the child's CPU only; the service's is its own process's), the median of ``--repeat`` children
per mode, the modes interleaved. ``--instructions``: each mode's child runs under ``valgrind
--tool=callgrind`` (:func:`benchmarks.instructions.count`) four times (2 rounds of everything,
then 22 rounds of one kind of request), and the differences give the marginal instructions per
request, start-up and imports cancelled out. The child runs with the engine's collector
setting (``engine.gcpolicy.tune_gc``) in every mode. Copies count once per byte under valgrind
(``rep movsb``): a ~150 KB page copied once is ~150k "instructions" but ~10 us.
The per-image line is ``page / 100 + PUT / 1000 + status * --polls-per-image``.

Figures of 2026-11-27 (Python 3.11.7, aiohttp 3.14.5, uvloop 0.23, 1,000-image task, pages of
~152 KB; ``--rounds 20 --repeat 5 --polls-per-image 0.0004 --instructions``), marginal
instructions per request, page / status / PUT, and per image of a run:

* engine ``TaggerClient``: 678,712 / 383,677 / 709,932; 7,651 per image (CPU 2.80 us);
* bare aiohttp: 600,091 / 310,052 / 583,814; 6,709 per image (CPU 2.34 us);
* own protocol + aiohttp's C parser: 394,695 / 78,747 / 249,583; 4,228 per image (1.24 us);
* lean reader: 178,445 / 36,427 / 187,208; 1,986 per image (CPU 0.91 us).

The PUT column moves by +-20% between runs; the CPU figures (a loaded 2-core machine) by up
to 2x. Reading and discussion: benchmarks/README.md, "What one request costs".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

MODES = ("engine", "aiohttp", "parser", "lean")
KINDS = ("page", "status", "put")
PAGE = 100
STATUSES_PER_ROUND = 10
WRITE_IMAGES = 1000
#: Rounds of the larger instruction count (the smaller: 2).
LARGE = 22
BULK = "/tagger/v2.12/bulk"
ROOT = Path(__file__).resolve().parent.parent
_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)


def _requests(start: int, count: int) -> bytes:
    import msgspec

    return msgspec.json.encode(
        [
            {
                "image": {"type": "url", "content": f"https://img.example.com/c/{i % 997}/{i}.jpg"},
                "context": {"id": f"rc-{i:09d}"},
            }
            for i in range(start, start + count)
        ]
    )


# --------------------------------------------------------------------------- lean connections


class _Lean(asyncio.BufferedProtocol):
    """One keep-alive connection, one request at a time, read into one reused buffer (no
    bytes object per read, the body copied out once): the head up to its blank line, then
    ``Content-Length`` bytes of body. No chunked body, no encoding, no close: a floor."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray(1 << 20)
        self.view = memoryview(self.buf)
        self.filled = 0
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.status = 0
        self.start = 0
        self.end = -1

    def get_buffer(self, sizehint: int) -> memoryview:
        if len(self.buf) - self.filled < 1 << 16:  # (a body longer than the buffer: grown)
            self.view.release()
            self.buf = self.buf[: self.filled] + bytearray(len(self.buf))
            self.view = memoryview(self.buf)
        return self.view[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        buf = self.buf
        if self.end < 0:
            blank = buf.find(b"\r\n\r\n", 0, self.filled)
            if blank < 0:
                return
            head = bytes(buf[:blank])
            found = _LENGTH.search(head)
            if found is None:
                raise RuntimeError(f"no Content-Length: {head[:200]!r}")
            self.status = int(head[9:12])
            self.start = blank + 4
            self.end = self.start + int(found.group(1))
        if self.filled >= self.end:
            body = bytes(self.view[self.start : self.end])
            rest = self.filled - self.end
            if rest:  # (nothing follows an answer here: one request at a time)
                buf[:rest] = buf[self.end : self.filled]
            self.filled, self.end = rest, -1
            assert self.waiter is not None
            self.waiter.set_result((self.status, body))

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return await self.waiter


def _parsed_protocol(loop: asyncio.AbstractEventLoop) -> Any:
    """The lean connection with aiohttp's C response parser (chunked bodies, gzip/deflate/br
    decoding, header limits handled; no redirects, retries, proxies or timeouts)."""
    from aiohttp._http_parser import HttpResponseParser
    from aiohttp.base_protocol import BaseProtocol

    class Parsed(BaseProtocol):
        def __init__(self) -> None:
            super().__init__(loop)
            # (aiohttp's read buffer: 64 KiB, reading paused past twice that, as in its client)
            self.parser = HttpResponseParser(self, loop, 2**16, max_line_size=65536)
            self._parser = self.parser
            self.waiter: asyncio.Future[Any] | None = None

        def data_received(self, data: bytes) -> None:
            # (Called again with b"" from resume_reading when the parser paused mid-body.)
            messages, _, _ = self.parser.feed_data(data)
            if messages:
                assert self.waiter is not None
                self.waiter.set_result(messages[0])

        async def request(self, raw: bytes) -> tuple[int, bytes]:
            assert self.transport is not None
            self.waiter = loop.create_future()
            self.transport.write(raw)
            head, payload = await self.waiter
            return head.code, await payload.read()  # (as aiohttp's response.read() does)

    return Parsed()


# --------------------------------------------------------------------------- the child


async def _child(args: argparse.Namespace) -> dict[str, list[float]]:
    import aiohttp
    import msgspec
    from yarl import URL

    from fashiontag_pipeline import TaggerClient
    from fashiontag_pipeline._bodies import bulk_body
    from fashiontag_pipeline._client import _status_decoder
    from fashiontag_pipeline._config import DEV_BULK_API_KEY
    from fashiontag_pipeline._models import EncodedRequests
    from fashiontag_pipeline._write_answer import _bulk_response_decoder
    from fashiontag_pipeline.engine.gcpolicy import tune_gc

    base, task = args.base_url, args.task
    host = base.split("//", 1)[1]
    offsets = range(0, args.images, PAGE)
    # Every write's 1,000 images are new to the task (a duplicate is refused, and the answer
    # lists each refused request): as many bodies made before anything is counted whatever
    # the rounds (the instruction counts of 2 and LARGE rounds must differ by the PUTs alone).
    template = _requests(0, WRITE_IMAGES)
    bodies = [
        EncodedRequests(msgspec.Raw(template.replace(b'"rc-', b'"rc%03d-' % k)), WRITE_IMAGES)
        for k in range(max(args.put_rounds, LARGE) + 2)
    ]
    closing: list[Callable[[], Awaitable[Any]]] = []

    # The task the PUTs go to: the child's own (untimed).
    async with aiohttp.ClientSession(headers={"x-api-key": DEV_BULK_API_KEY}) as setup:
        first = bulk_body(bodies.pop(), None, None, None, False)
        async with setup.post(base + BULK, data=first) as r:
            assert r.status == 202, await r.text()
            target = json.loads(await r.read())["taskId"]

    page: Callable[[int], Awaitable[bytes]]
    status: Callable[[], Awaitable[object]]
    put: Callable[[], Awaitable[object]]
    if args.child == "engine":
        client = TaggerClient(base)
        await client.__aenter__()
        closing.append(client.aclose)

        async def page(offset: int) -> bytes:
            return await client.task_results_raw(task, offset=offset, size=PAGE)

        async def status() -> object:
            return await client.task_status(task)

        async def put() -> object:
            return await client.append_to_task(target, bodies.pop())

    elif args.child == "aiohttp":
        session = aiohttp.ClientSession(headers={"x-api-key": DEV_BULK_API_KEY})
        closing.append(session.close)
        json_type = {"Content-Type": "application/json"}

        async def page(offset: int) -> bytes:
            async with session.get(f"{base}{BULK}/{task}?offset={offset}&size={PAGE}") as r:
                body = await r.read()
                assert r.status == 200
                return body

        async def status() -> object:
            async with session.get(f"{base}{BULK}/{task}/status") as r:
                return _status_decoder.decode(await r.read())

        async def put() -> object:
            body = bulk_body(bodies.pop(), None, None, None, False)
            async with session.put(f"{base}{BULK}/{target}", data=body, headers=json_type) as r:
                return _bulk_response_decoder.decode(await r.read())

    else:
        loop = asyncio.get_running_loop()
        url = URL(base)
        factory = _Lean if args.child == "lean" else lambda: _parsed_protocol(loop)
        transport, conn = await loop.create_connection(factory, url.host, url.port)
        conn.transport = transport  # (uvloop calls connection_made after this returns)

        async def close() -> None:
            transport.close()

        closing.append(close)
        common = (
            f"Host: {host}\r\nx-api-key: {DEV_BULK_API_KEY}\r\naccept-language: en\r\n"
            "User-Agent: fashiontag_pipeline/0.1\r\nAccept: */*\r\n"
        )
        pages = {
            o: f"GET {BULK}/{task}?offset={o}&size={PAGE} HTTP/1.1\r\n{common}\r\n".encode()
            for o in offsets
        }
        status_raw = f"GET {BULK}/{task}/status HTTP/1.1\r\n{common}\r\n".encode()

        async def page(offset: int) -> bytes:
            code, body = await conn.request(pages[offset])
            assert code == 200
            return body

        async def status() -> object:
            return _status_decoder.decode((await conn.request(status_raw))[1])

        async def put() -> object:
            body = bulk_body(bodies.pop(), None, None, None, False)
            head = f"PUT {BULK}/{target} HTTP/1.1\r\n{common}Content-Type: application/json\r\n"
            raw = f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
            return _bulk_response_decoder.decode((await conn.request(raw))[1])

    async def pages_round() -> None:
        for offset in offsets:
            await page(offset)

    async def status_round() -> None:
        for _ in range(STATUSES_PER_ROUND):
            await status()

    async def put_accepted() -> None:
        answer: Any = await put()
        assert answer.validation.accept == WRITE_IMAGES, answer

    kinds = {"page": pages_round, "status": status_round, "put": put_accepted}
    rounds = {"page": args.page_rounds, "status": args.status_rounds, "put": args.put_rounds}
    # The collector as a run has it (everything made so far frozen, young collections rare),
    # in every mode: a full collection walking the imports must not land in one count only.
    tune_gc()
    for kind in KINDS:  # warm-up: connections made, caches filled, code paths taken once
        await kinds[kind]()
    cpu: dict[str, list[float]] = {}
    for kind in KINDS:
        spent = []
        for _ in range(rounds[kind]):
            t0 = time.process_time()
            await kinds[kind]()
            spent.append(time.process_time() - t0)
        cpu[kind] = spent
    for close in closing:
        await close()
    return cpu


def _run_child(args: argparse.Namespace) -> int:
    try:
        import uvloop

        run: Callable[[Any], Any] = uvloop.run
    except ImportError:
        run = asyncio.run
    print(json.dumps(run(_child(args))))
    return 0


# --------------------------------------------------------------------------- the parent


def _done_task(base: str, images: int) -> str:
    """A task of ``images`` images (POST then PUTs of 1,000), waited for until done."""
    import aiohttp

    from fashiontag_pipeline._config import DEV_BULK_API_KEY

    async def go() -> str:
        headers = {"x-api-key": DEV_BULK_API_KEY, "Content-Type": "application/json"}
        async with aiohttp.ClientSession(headers=headers) as s:
            task = ""
            for start in range(0, images, 1000):
                chunk = b'{"taggingRequest":' + _requests(start, min(1000, images - start)) + b"}"
                url = base + BULK + (f"/{task}" if task else "")
                async with s.request("PUT" if task else "POST", url, data=chunk) as r:
                    assert r.status == 202, await r.text()
                    task = task or json.loads(await r.read())["taskId"]
            while True:
                async with s.get(f"{base}{BULK}/{task}/status") as r:
                    if json.loads(await r.read())["data"]["taskStatus"] == "TASK_DONE":
                        return task
                await asyncio.sleep(0.05)

    return asyncio.run(go())


def _child_cmd(mode: str, base: str, task: str, images: int, rounds: dict[str, int]) -> list[str]:
    cmd = [sys.executable, "-m", "benchmarks.request_cost", "--child", mode, "--base-url", base]
    cmd += ["--task", task, "--images", str(images)]
    for kind in KINDS:
        cmd += [f"--{kind}-rounds", str(rounds[kind])]
    return cmd


def _per_request(kind: str, images: int) -> int:
    """Requests of ``kind`` in one round."""
    return {"page": -(-images // PAGE), "status": STATUSES_PER_ROUND, "put": 1}[kind]


def measure_cpu(base: str, task: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Median over ``--repeat`` children (modes interleaved) of the CPU us per request."""
    samples: dict[str, dict[str, list[float]]] = {m: {k: [] for k in KINDS} for m in args.modes}
    rounds = dict.fromkeys(KINDS, args.rounds)
    for _ in range(args.repeat):
        for mode in args.modes:
            out = subprocess.run(
                _child_cmd(mode, base, task, args.images, rounds),
                check=True,
                capture_output=True,
                text=True,
                cwd=ROOT,
            ).stdout
            for kind, spent in json.loads(out).items():
                n = _per_request(kind, args.images) * len(spent)
                samples[mode][kind].append(sum(spent) / n * 1e6)
    return {m: {k: statistics.median(v) for k, v in got.items()} for m, got in samples.items()}


def measure_instructions(
    base: str, task: str, args: argparse.Namespace
) -> dict[str, dict[str, float]]:
    """Marginal instructions per request: 22 rounds of one kind against 2, by callgrind."""
    import tempfile

    from .instructions import count

    small, large = 2, LARGE
    work = Path(tempfile.mkdtemp(prefix="fashiontag-reqcost-"))
    got: dict[str, dict[str, float]] = {}
    for mode in args.modes:
        base_rounds = dict.fromkeys(KINDS, small)
        floor = count(_child_cmd(mode, base, task, args.images, base_rounds), None, work)
        got[mode] = {}
        for kind in KINDS:
            more = count(
                _child_cmd(mode, base, task, args.images, {**base_rounds, kind: large}), None, work
            )
            got[mode][kind] = (more - floor) / ((large - small) * _per_request(kind, args.images))
        print(f"  {mode}: " + ", ".join(f"{k} {v:,.0f}" for k, v in got[mode].items()), flush=True)
    return got


def table(got: dict[str, dict[str, float]], unit: str, polls: float) -> list[str]:
    """Markdown: per request, per image of a run, and the differences between the modes."""

    def image(m: dict[str, float]) -> float:
        return m["page"] / PAGE + m["put"] / WRITE_IMAGES + m["status"] * polls

    lines = [
        f"| mode | page of 100 ({unit}) | status ({unit}) | PUT of 1,000 ({unit})"
        f" | per image ({unit}) |",
        "|---|---|---|---|---|",
    ]
    rows = dict(got)
    pairs = [("engine", "aiohttp"), ("aiohttp", "parser"), ("aiohttp", "lean"), ("parser", "lean")]
    for a, b in pairs:
        if a in got and b in got:
            rows[f"{a} - {b}"] = {k: got[a][k] - got[b][k] for k in KINDS}
    for name, m in rows.items():
        cells = " | ".join(f"{m[k]:,.1f}" for k in KINDS)
        lines.append(f"| {name} | {cells} | {image(m):,.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.request_cost", description=__doc__)
    p.add_argument("--images", type=int, default=1000, help="images in the task read")
    p.add_argument("--rounds", type=int, default=20, help="rounds per child (CPU)")
    p.add_argument("--repeat", type=int, default=3, help="children per mode (CPU: the median)")
    p.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    p.add_argument("--instructions", action="store_true", help="valgrind instruction counts")
    p.add_argument(
        "--polls-per-image", type=float, default=0.0005, help="status reads per image of a run"
    )
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--base-url", help=argparse.SUPPRESS)
    p.add_argument("--task", help=argparse.SUPPRESS)
    for kind in KINDS:
        p.add_argument(f"--{kind}-rounds", type=int, default=20, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return _run_child(args)
    from .harness import running_service

    with running_service(ROOT / "benchmarks" / "results" / "tmp") as svc:
        task = _done_task(svc.url, args.images)
        print(f"service {svc.url}, task {task} of {args.images:,} images", flush=True)
        cpu = measure_cpu(svc.url, task, args)
        print("\nCPU us per request (median of children):\n")
        print("\n".join(table(cpu, "us", args.polls_per_image)))
        if args.instructions:
            print("\ncounting instructions (valgrind) ...", flush=True)
            instr = measure_instructions(svc.url, task, args)
            print("\nInstructions per request (marginal):\n")
            print("\n".join(table(instr, "instr", args.polls_per_image)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
