"""Load generator for the reference service (scenario ``service``).

Measures what the service itself can do, with a client that does as little as possible
(pre-encoded bodies, responses counted, never decoded beyond what is needed):

1. ingest: create ``--tasks`` tasks and fill them with 1,000-image writes, ``--concurrency`` at
   a time -> accepted images/s;
2. read: every 100-result page of every task, ``--concurrency`` at a time -> results/s.

With ``--service-pid`` it also reports the service's CPU seconds per phase.

    python -m benchmarks.loadgen --base-url URL --rows 100000 [--service-pid PID]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import aiohttp

from benchmarks.harness import proc_cpu_seconds

BULK = "/tagger/v2.12/bulk"


def _body(start: int, stop: int, create: bool) -> bytes:
    requests = [
        {
            "image": {"type": "url", "content": f"https://img.example.com/load/{i % 997}/{i}.jpg"},
            "context": {"id": f"load-{i:09d}"},
        }
        for i in range(start, stop)
    ]
    body: dict[str, Any] = {"taggingRequest": requests}
    if create:
        body["description"] = "benchmarks.loadgen"
    return json.dumps(body).encode()


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from fashiontag_pipeline._config import DEV_BULK_API_KEY

    headers = {"x-api-key": DEV_BULK_API_KEY, "Content-Type": "application/json"}
    base = args.base_url.rstrip("/")
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    per_task = -(-args.rows // args.tasks)
    sem = asyncio.Semaphore(args.concurrency)
    pid = args.service_pid

    def svc_cpu() -> float:
        return proc_cpu_seconds(pid) if pid else float("nan")

    async with aiohttp.ClientSession(base_url=base, connector=connector, headers=headers) as s:
        # Phase 1: ingest. Bodies are encoded before the clock starts.
        plans: list[list[bytes]] = []
        for t in range(args.tasks):
            lo, hi = t * per_task, min(args.rows, (t + 1) * per_task)
            plans.append([_body(a, min(hi, a + 1000), a == lo) for a in range(lo, hi, 1000)])

        async def fill(chunks: list[bytes]) -> str:
            async with sem, s.post(BULK, data=chunks[0]) as r:
                assert r.status == 202, await r.text()
                task_id: str = (await r.json())["taskId"]
            for chunk in chunks[1:]:
                async with sem, s.put(f"{BULK}/{task_id}", data=chunk) as r:
                    assert r.status == 202, await r.text()
                    await r.read()
            return task_id

        cpu0, t0 = svc_cpu(), time.perf_counter()
        task_ids = await asyncio.gather(*(fill(p) for p in plans if p))
        ingest_s, ingest_cpu = time.perf_counter() - t0, svc_cpu() - cpu0

        # Wait until every task is done (instant with --rate 0).
        t_wait = time.perf_counter()
        while True:
            async with s.get(BULK) as r:
                tasks = (await r.json())["data"]["tasks"]
            mine = [t for t in tasks if t["taskId"] in set(task_ids)]
            if all(t["taskStatus"] == "TASK_DONE" for t in mine):
                break
            await asyncio.sleep(0.05)
        wait_s = time.perf_counter() - t_wait

        # Phase 2: read every page.
        pages = [
            (tid, off) for tid in task_ids for off in range(0, per_task, 100)
        ]  # offsets past the end give empty pages; harmless
        results = 0
        nbytes = 0

        async def read(tid: str, off: int) -> None:
            nonlocal results, nbytes
            async with sem, s.get(f"{BULK}/{tid}", params={"offset": off, "size": 100}) as r:
                body = await r.read()
                assert r.status == 200, body[:200]
            nbytes += len(body)
            results += body.count(b'"taggingResult"')

        cpu1, t1 = svc_cpu(), time.perf_counter()
        await asyncio.gather(*(read(tid, off) for tid, off in pages))
        read_s, read_cpu = time.perf_counter() - t1, svc_cpu() - cpu1

    return {
        "rows": args.rows,
        "tasks": args.tasks,
        "concurrency": args.concurrency,
        "ingest_s": ingest_s,
        "ingest_images_per_s": args.rows / ingest_s,
        "ingest_service_cpu_us_per_image": ingest_cpu / args.rows * 1e6,
        "done_wait_s": wait_s,
        "read_s": read_s,
        "results": results,
        "results_per_s": results / read_s,
        "read_mb_per_s": nbytes / read_s / 1e6,
        "bytes_per_result": nbytes / max(1, results),
        "read_service_cpu_us_per_result": read_cpu / max(1, results) * 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loadgen")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--service-pid", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(_run(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
