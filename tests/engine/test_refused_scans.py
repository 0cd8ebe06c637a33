"""Rows the service refuses at write time, in every task of a run: the cost stays linear.

Found by a hunt at scale: a catalogue whose ids are 1-2 KB long (the engine takes ids up to
2,048 bytes, the reference service refuses those past 1,024 characters row by row). Each
task with a refused row scanned the whole rejects file when its results were read (the
refused ids must not be written as results too), so the run cost tasks x rejects: 20,000 rows
took 7.8 s, 171,000 rows more than 298 s (576 rows/s, killed).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fashiontag_pipeline.engine import EngineConfig, batcher, run_pipeline, sinks
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import assert_exactly_once, client_config


async def test_refused_rows_in_every_task_do_not_rescan_the_rejects_per_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 3_000
    ids = [f"p{i:05d}-" + "x" * 1100 if i % 2 else f"p{i:05d}" for i in range(n)]
    manifest = tmp_path / "m.csv"
    rows = (f"{ident},https://img.example/{i}.jpg\n" for i, ident in enumerate(ids))
    manifest.write_text("id,url\n" + "".join(rows))
    scanned = [0]
    scan = sinks.RejectSink.scan

    def counting(self: sinks.RejectSink, *args: object, **kwargs: object) -> Iterator[bytes]:
        for line in scan(self, *args, **kwargs):  # type: ignore[arg-type]
            scanned[0] += 1
            yield line

    monkeypatch.setattr(sinks.RejectSink, "scan", counting)
    # Chunks of ~40 rows, one write at a time: a run much longer than its window of rows in
    # flight, as a catalogue of millions is.
    monkeypatch.setattr(batcher, "MAX_CHUNK_BYTES", 50_000)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with running_service(ServiceConfig(rate=0, fetch=False)) as svc:
        summary = await run_pipeline(
            [manifest],
            client=client_config(svc.url),
            out=out,
            rejects=rej,
            engine=EngineConfig(
                poll_min=0.02,
                poll_max=0.2,
                rotate_images=100,
                rotate_min_images=100,
                linger_seconds=0.05,
                max_write_concurrency=1,
            ),
        )
    assert summary.complete
    assert_exactly_once(out, rej, set(ids))
    assert summary.tasks >= 10, summary
    # Each reject line read a few times at most (not once per task: ~35 tasks x 1,500).
    assert scanned[0] <= 3 * n, (scanned[0], summary.tasks)
