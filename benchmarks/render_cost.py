"""The reference service's CPU per rendered result, fetch and no-fetch (results read path).

Starts the service in its own process (``serve --rate 0``, with ``--fetch`` or ``--no-fetch``)
and, in this process, a loopback image server holding ``--images`` generated product photos
(Pillow: a figure of coloured blocks on a plain background, seeded, so every run serves the
same bytes). Fills ``--tasks`` tasks with ``--rows`` image URLs pointing at it (every detection
type asked unless ``--detection`` says otherwise), waits until they are done, then reads every
100-result page ``--read-passes`` times, 16 at a time. The service's user+sys CPU
(``/proc/PID/stat``, 10 ms ticks: hence the passes) is reported per image for the ingest phase
(download and measurement in fetch mode) and per result for the read phase (rendering), the
median of ``--repeat`` runs.

    python -m benchmarks.render_cost --fetch --rows 5000 --repeat 3
    python -m benchmarks.render_cost --no-fetch --rows 20000 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from benchmarks.harness import proc_cpu_seconds, running_service
from fashiontag_pipeline._models import Detection

BULK = "/tagger/v2.12/bulk"


def product_photo(seed: int) -> bytes:
    """A deterministic 'model photo': blocks of colour (hat, top, bottom, shoes, bag) on a
    plain background, with a little noise so that colours are not perfectly flat."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    w, h = 240, 320

    def colour() -> tuple[int, int, int]:
        return (rng.randrange(256), rng.randrange(256), rng.randrange(256))

    background = rng.choice([(255, 255, 255), (240, 240, 236), (30, 30, 30)])
    img = Image.new("RGB", (w, h), background)
    draw = ImageDraw.Draw(img)
    draw.rectangle((90, 10, 150, 50), fill=colour())  # hat
    draw.rectangle((70, 55, 170, 160), fill=colour())  # top
    draw.rectangle((80, 160, 160, 270), fill=colour())  # bottom
    shoes = colour()
    draw.rectangle((75, 275, 115, 305), fill=shoes)
    draw.rectangle((125, 275, 165, 305), fill=shoes)
    draw.rectangle((175, 120, 215, 190), fill=colour())  # bag
    noise = Image.effect_noise((w, h), 12).convert("RGB")
    img = Image.blend(img, noise, 0.05)
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


async def _one_run(args: argparse.Namespace, images: str) -> dict[str, Any]:
    from fashiontag_pipeline._config import DEV_BULK_API_KEY

    extra = ["--fetch"] if args.fetch else []
    with tempfile.TemporaryDirectory() as work, running_service(Path(work), extra=extra) as svc:
        pid = svc.proc.pid
        headers = {"x-api-key": DEV_BULK_API_KEY}
        per_task = -(-args.rows // args.tasks)
        sem = asyncio.Semaphore(16)
        async with aiohttp.ClientSession(base_url=svc.url, headers=headers) as s:

            async def fill(lo: int, hi: int) -> str:
                task_id = ""
                for a in range(lo, hi, 1000):
                    body = {
                        "taggingRequest": [
                            {
                                "image": {
                                    "type": "url",
                                    "content": f"{images}/p/{i % args.images}.png?row={i}",
                                },
                                "context": {"id": f"row-{i}", "detection": args.detection},
                            }
                            for i in range(a, min(hi, a + 1000))
                        ]
                    }
                    if not task_id:
                        async with sem, s.post(BULK, json=body) as r:
                            assert r.status == 202, await r.text()
                            task_id = (await r.json())["taskId"]
                    else:
                        async with sem, s.put(f"{BULK}/{task_id}", json=body) as r:
                            assert r.status == 202, await r.text()
                return task_id

            cpu0 = proc_cpu_seconds(pid)
            bounds = [(t * per_task, min(args.rows, (t + 1) * per_task)) for t in range(args.tasks)]
            task_ids = await asyncio.gather(*(fill(lo, hi) for lo, hi in bounds if lo < hi))
            while True:
                async with s.get(BULK) as r:
                    tasks = (await r.json())["data"]["tasks"]
                if all(t["taskStatus"] == "TASK_DONE" for t in tasks):
                    break
                await asyncio.sleep(0.05)
            ingest_cpu = proc_cpu_seconds(pid) - cpu0
            results = 0
            failures = 0

            async def read(tid: str, off: int) -> None:
                nonlocal results, failures
                async with sem, s.get(f"{BULK}/{tid}", params={"offset": off, "size": 100}) as r:
                    body = await r.read()
                    assert r.status == 200, body[:200]
                results += body.count(b'"taggingResult"')
                failures += body.count(b'"status":"failure"')

            pages = [(tid, off) for tid in task_ids for off in range(0, per_task, 100)]
            pages *= args.read_passes
            cpu1, t1 = proc_cpu_seconds(pid), time.perf_counter()
            await asyncio.gather(*(read(tid, off) for tid, off in pages))
            read_s, read_cpu = time.perf_counter() - t1, proc_cpu_seconds(pid) - cpu1
    return {
        "ingest_cpu_us_per_image": ingest_cpu / args.rows * 1e6,
        "read_cpu_us_per_result": read_cpu / max(1, results) * 1e6,
        "results": results,
        "failed_results": failures,
        "read_s": read_s,
    }


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    photos = [product_photo(seed) for seed in range(args.images)]

    async def photo(request: web.Request) -> web.Response:
        return web.Response(body=photos[int(request.match_info["n"])], content_type="image/png")

    app = web.Application()
    app.router.add_get("/p/{n:\\d+}.png", photo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    images = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        runs = [await _one_run(args, images) for _ in range(args.repeat)]
    finally:
        await runner.cleanup()
    return {
        "mode": "fetch" if args.fetch else "no-fetch",
        "rows": args.rows,
        "detection": args.detection,
        "runs": runs,
        "median_ingest_cpu_us_per_image": statistics.median(
            r["ingest_cpu_us_per_image"] for r in runs
        ),
        "median_read_cpu_us_per_result": statistics.median(
            r["read_cpu_us_per_result"] for r in runs
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.render_cost")
    parser.add_argument("--fetch", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--read-passes", type=int, default=5, help="times every page is read")
    parser.add_argument(
        "--detection",
        nargs="*",
        default=[d.value for d in Detection],
    )
    args = parser.parse_args()
    print(json.dumps(asyncio.run(_run(args)), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
