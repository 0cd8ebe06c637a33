"""The CPU floor of moving results with aiohttp: what no client built on it can go under.

Against a running service (``serve --rate 0 --no-fetch``), in one process:

1. start-up: interpreter start and the imports (aiohttp, msgspec, uvloop), from ``/proc``;
2. submit: ``rows`` images as pre-encoded 1,000-row bodies, POST then PUTs (10,000 per task);
3. read: every 100-result page, 16 at a time over one keep-alive pool, bytes read and dropped;
4. decode: each page decoded once with msgspec into (id, raw taggingResult);
5. write: one JSONL line per result with ``encode_lines`` to a file.

Each phase's CPU (user + sys of the process, ``time.process_time``) is printed per image. The
sum of 1 + 3 is the floor of any aiohttp client that reads the results; 1 + 2 + 3 + 4 + 5 is
about what the async baseline spends.

    python -m benchmarks.floor --base-url http://127.0.0.1:8080 --rows 200000 --out /tmp/x.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import aiohttp
import msgspec
import uvloop

BULK = "/tagger/v2.12/bulk"
KEY = "dev-bulk-api-key"


class _Row(msgspec.Struct, gc=False):
    id: str
    taggingResult: msgspec.Raw


class _Data(msgspec.Struct, gc=False):
    results: list[_Row] = []


class _Page(msgspec.Struct, gc=False):
    data: _Data


class _Line(msgspec.Struct, gc=False):
    id: str
    taskId: str
    taggingResult: msgspec.Raw


def _startup_cpu() -> float:
    """CPU of this process before ``main`` ran: from /proc (includes the interpreter start)."""
    with open(f"/proc/{os.getpid()}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tck


async def _transfer(args: argparse.Namespace, phases: dict[str, float]) -> list[tuple[str, bytes]]:
    base = args.base_url.rstrip("/")
    enc = msgspec.json.Encoder()
    bodies = [
        enc.encode(
            {
                "taggingRequest": [
                    {
                        "image": {"type": "url", "content": f"https://f.example/{i}.jpg"},
                        "context": {"id": f"f{i}"},
                    }
                    for i in range(start, min(args.rows, start + 1000))
                ]
            }
        )
        for start in range(0, args.rows, 1000)
    ]
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=20),
        timeout=aiohttp.ClientTimeout(total=120),
        headers={"x-api-key": KEY},
    ) as s:
        t = time.process_time()
        tasks: list[str] = []
        for i, body in enumerate(bodies):
            if i % 10 == 0:
                async with s.post(base + BULK, data=body, headers=headers) as r:
                    tasks.append((await r.json())["taskId"])
            else:
                async with s.put(f"{base}{BULK}/{tasks[-1]}", data=body, headers=headers) as r:
                    await r.read()
        phases["submit"] = time.process_time() - t
        for task in tasks:
            while True:
                async with s.get(f"{base}{BULK}/{task}/status") as r:
                    if (await r.json())["data"]["taskStatus"] == "TASK_DONE":
                        break
                await asyncio.sleep(0.1)
        sem = asyncio.Semaphore(16)
        pages: list[tuple[str, bytes]] = []

        async def get(task: str, offset: int) -> None:
            async with sem, s.get(f"{base}{BULK}/{task}?offset={offset}&size=100") as r:
                body = await r.read()
                if r.status != 200:
                    raise SystemExit(f"GET page: HTTP {r.status}: {body[:200]!r}")
                pages.append((task, body))

        per_task = [min(10_000, args.rows - 10_000 * k) for k in range(len(tasks))]
        t = time.process_time()
        await asyncio.gather(
            *(
                get(task, o)
                for task, n in zip(tasks, per_task, strict=True)
                for o in range(0, n, 100)
            )
        )
        phases["read"] = time.process_time() - t
    return pages


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.floor", description=__doc__)
    p.add_argument("--base-url", required=True)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--out", default=os.devnull)
    args = p.parse_args()
    phases = {"start-up": _startup_cpu()}
    pages = uvloop.run(_transfer(args, phases))
    dec = msgspec.json.Decoder(_Page)
    enc = msgspec.json.Encoder()
    t = time.process_time()
    decoded = [(task, dec.decode(raw).data.results) for task, raw in pages]
    phases["decode"] = time.process_time() - t
    t = time.process_time()
    with open(args.out, "wb", buffering=1 << 20) as out:
        for task, rows in decoded:
            out.write(enc.encode_lines([_Line(r.id, task, r.taggingResult) for r in rows]))
    phases["write"] = time.process_time() - t
    got = sum(len(rows) for _, rows in decoded)
    if got != args.rows:
        raise SystemExit(f"read {got} results, expected {args.rows}")
    total = 0.0
    for name, seconds in phases.items():
        total += seconds
        print(f"{name:>9}: {seconds / args.rows * 1e6:6.2f} us/image ({seconds:.3f} s)")
    print(f"{'total':>9}: {total / args.rows * 1e6:6.2f} us/image")
    return 0


if __name__ == "__main__":
    sys.exit(main())
