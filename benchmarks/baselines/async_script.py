#!/usr/bin/env python3
"""The script a competent engineer writes in an afternoon: aiohttp + msgspec, no state.

Read the CSV manifest with ``csv.reader``; send it in requests of 1,000 rows (with the
context columns a catalogue may have, ``brand``, ``gender``, ..., in each request's context),
the first of a task by POST and the next ones by PUT until the task holds ``--task-size`` rows
(a new task when a PUT gets 410); each filled task is handed to a reader coroutine that
polls its status every ``--poll`` seconds and, once it is TASK_DONE, reads its 100-result
pages ``--pages`` at a time over one keep-alive connection pool, decoding each page once with
msgspec (the tagging result kept as raw bytes) and writing one JSONL line
``{"id","taskId","taggingResult"}`` per result. Reads are retried on 429/5xx/transport errors
a few times; writes are not (a write whose outcome is unknown would need the state this script
does not keep). No resume: a crash means starting over.

    python benchmarks/baselines/async_script.py MANIFEST.csv --base-url URL --out results.jsonl

Keys come from FASHIONTAG_BULK_API_KEY (or FASHIONTAG_API_KEY), else the development key the
reference service accepts out of the box. Uses uvloop when it is installed, as the engine does.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any, BinaryIO, TextIO

import aiohttp
import msgspec

BULK_PATH = "/tagger/v2.12/bulk"
CHUNK = 1000
PAGE = 100
DEV_BULK_API_KEY = "dev-bulk-api-key"  # fashiontag_pipeline._config.DEV_BULK_API_KEY


class Created(msgspec.Struct):
    taskId: str


class Count(msgspec.Struct):
    total: int = 0


class Task(msgspec.Struct):
    taskStatus: str
    count: Count = msgspec.field(default_factory=Count)


class StatusBody(msgspec.Struct):
    data: Task


class Result(msgspec.Struct, gc=False):
    id: str
    taggingResult: msgspec.Raw


class PageData(msgspec.Struct, gc=False):
    results: list[Result] = []


class PageBody(msgspec.Struct, gc=False):
    data: PageData


class Line(msgspec.Struct, gc=False):
    id: str
    taskId: str
    taggingResult: msgspec.Raw


class Script:
    def __init__(
        self, session: aiohttp.ClientSession, base: str, out: BinaryIO, args: argparse.Namespace
    ) -> None:
        self.session = session
        self.base = base
        self.out = out
        self.poll: float = args.poll
        self.pages = asyncio.Semaphore(args.pages)
        self.created = msgspec.json.Decoder(Created)
        self.status = msgspec.json.Decoder(StatusBody)
        self.page = msgspec.json.Decoder(PageBody)
        self.encoder = msgspec.json.Encoder()
        self.written = 0

    async def get(self, url: str) -> bytes:
        for attempt in range(5):
            try:
                async with self.session.get(url) as resp:
                    body = await resp.read()
                    if resp.status == 200:
                        return body
                    if resp.status != 429 and resp.status < 500:
                        raise RuntimeError(f"GET {url}: HTTP {resp.status}: {body[:200]!r}")
            except (TimeoutError, aiohttp.ClientError):
                if attempt == 4:
                    raise
            await asyncio.sleep(0.2 * 2**attempt)
        raise RuntimeError(f"GET {url}: still failing after 5 attempts")

    async def write(self, method: str, url: str, body: bytes) -> aiohttp.ClientResponse:
        async with self.session.request(
            method, url, data=body, headers={"Content-Type": "application/json"}
        ) as resp:
            await resp.read()
            return resp

    async def read_task(self, task_id: str) -> None:
        url = f"{self.base}{BULK_PATH}/{task_id}"
        while True:
            task = self.status.decode(await self.get(url + "/status")).data
            if task.taskStatus == "TASK_DONE":
                break
            await asyncio.sleep(self.poll)

        async def page(offset: int) -> None:
            async with self.pages:
                raw = await self.get(f"{url}?offset={offset}&size={PAGE}")
            results = self.page.decode(raw).data.results
            lines = [Line(r.id, task_id, r.taggingResult) for r in results]
            self.out.write(self.encoder.encode_lines(lines))
            self.written += len(lines)

        await asyncio.gather(*(page(o) for o in range(0, task.count.total, PAGE)))


#: Manifest columns sent as context fields (text; an empty cell is no value), by their name
#: in the request.
CONTEXT_COLUMNS = {
    "gender": "gender",
    "brand": "brand",
    "currency": "currency",
    "price": "price",
    "keywords": "keywords",
    "product_content_name": "productContentName",
    "season": "season",
}


def request_body(
    rows: list[list[str]], i_id: int, i_url: int, context: list[tuple[int, str]]
) -> dict[str, object]:
    if not context:
        return {
            "taggingRequest": [
                {"image": {"type": "url", "content": r[i_url]}, "context": {"id": r[i_id]}}
                for r in rows
            ]
        }
    return {
        "taggingRequest": [
            {
                "image": {"type": "url", "content": r[i_url]},
                "context": {"id": r[i_id], **{key: r[i] for i, key in context if r[i]}},
            }
            for r in rows
        ]
    }


async def main_async(args: argparse.Namespace, manifest: TextIO, out: BinaryIO) -> int:
    base = (args.base_url or "http://127.0.0.1:8080").rstrip("/")
    key = (
        os.environ.get("FASHIONTAG_BULK_API_KEY")
        or os.environ.get("FASHIONTAG_API_KEY")
        or DEV_BULK_API_KEY
    )
    connector = aiohttp.TCPConnector(limit=args.pages + 4)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers={"x-api-key": key}
    ) as session:
        s = Script(session, base, out, args)
        readers: list[asyncio.Task[None]] = []
        task_id: str | None = None
        in_task = 0

        async def send(rows: list[list[str]]) -> None:
            nonlocal task_id, in_task
            body = s.encoder.encode(request_body(rows, i_id, i_url, context))
            if task_id is not None:
                resp = await s.write("PUT", f"{base}{BULK_PATH}/{task_id}", body)
                if resp.status == 202:
                    in_task += len(rows)
                    if in_task >= args.task_size:
                        readers.append(asyncio.create_task(s.read_task(task_id)))
                        task_id = None
                    return
                if resp.status != 410:
                    raise RuntimeError(f"PUT: HTTP {resp.status}")
                readers.append(asyncio.create_task(s.read_task(task_id)))
            async with session.post(
                base + BULK_PATH, data=body, headers={"Content-Type": "application/json"}
            ) as resp:
                raw = await resp.read()
                if resp.status != 202:
                    raise RuntimeError(f"POST: HTTP {resp.status}: {raw[:200]!r}")
            task_id = s.created.decode(raw).taskId
            in_task = len(rows)

        reader = csv.reader(manifest)
        header = next(reader)
        i_id, i_url = header.index("id"), header.index("url")
        context = [(i, CONTEXT_COLUMNS[c]) for i, c in enumerate(header) if c in CONTEXT_COLUMNS]
        batch: list[list[str]] = []
        for row in reader:
            batch.append(row)
            if len(batch) == CHUNK:
                await send(batch)
                batch = []
        if batch:
            await send(batch)
        if task_id is not None:
            readers.append(asyncio.create_task(s.read_task(task_id)))
        await asyncio.gather(*readers)
    print(f"async script: {s.written} results from {len(readers)} task(s)", file=sys.stderr)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description="aiohttp + msgspec bulk tagging, no state")
    parser.add_argument("manifest")
    parser.add_argument("--base-url", default=os.environ.get("FASHIONTAG_BASE_URL"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--task-size", type=int, default=10_000, help="rows per task")
    parser.add_argument("--pages", type=int, default=16, help="result pages read at once")
    parser.add_argument("--poll", type=float, default=0.25, help="status poll interval (s)")
    args = parser.parse_args()
    run: Callable[[Coroutine[Any, Any, int]], int] = asyncio.run
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        pass
    with (
        open(args.manifest, newline="", encoding="utf-8") as manifest,
        open(args.out, "wb", buffering=1 << 20) as out,
    ):
        return run(main_async(args, manifest, out))


if __name__ == "__main__":
    sys.exit(main())
