"""Manifest edges a user of 10M-row dumps meets, scaled down to seconds.

Found by a hunt at scale: in a 1.5M-row CSV, one row whose URL field began with an unmatched
quote made the next 64 MiB of the manifest (1.3M rows) one record that the csv module then
refused: one reject line, the run "complete" with exit 0, 1.3M rows without an outcome, 843 MB
peak RSS and 33 s of re-parsing the open record with every chunk. (A smaller manifest ended
the record with the input: one reject for every row after the quote.) And a manifest line with
no newline was held whole and copied: 765 MB peak RSS for a 100 MB line.
"""

from __future__ import annotations

import csv
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fashiontag_pipeline import ManifestError
from fashiontag_pipeline.engine import csvchunk, manifest_bytes
from fashiontag_pipeline.engine.plainbody import request_of
from fashiontag_pipeline.engine.source import iter_rows_sync, open_manifest
from fashiontag_pipeline.engine.validate import Validator

#: The most lines one CSV record may span (read so that the tests run against code without it).
MAX_RECORD_LINES: int = getattr(csvchunk, "MAX_RECORD_LINES", 1000)


def _read(path: Path) -> list[tuple[int, object]]:
    reader = open_manifest(str(path), 0)
    try:
        return list(iter_rows_sync(reader))
    finally:
        reader.close()


def _quote_manifest(path: Path, after: int) -> None:
    lines = ["id,url"]
    lines += [f"a{i},https://x/a{i}.jpg" for i in range(5)]
    lines.append('bad,"https://x/bad.jpg')  # line 7: a quote opened and never closed
    lines += [f"b{i},https://x/b{i}.jpg" for i in range(after)]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("read_size", [1 << 20, 4096])
def test_an_unmatched_quote_costs_its_row_not_every_row_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_size: int
) -> None:
    monkeypatch.setattr(manifest_bytes, "READ_SIZE", read_size)
    after = 3 * MAX_RECORD_LINES
    p = tmp_path / "m.csv"
    _quote_manifest(p, after)
    rows = _read(p)
    assert len(rows) == 5 + 1 + after
    line, reason = rows[5]
    assert line == 7 and isinstance(reason, str) and "not closed" in reason
    assert rows[6] == (8, ["b0", "https://x/b0.jpg"])
    assert rows[-1] == (7 + after, [f"b{after - 1}", f"https://x/b{after - 1}.jpg"])
    assert [n for n, _ in rows] == [*range(2, 7), 7, *range(8, 8 + after)]


def test_a_record_the_field_limit_refuses_does_not_swallow_the_rows_it_spans(
    tmp_path: Path,
) -> None:
    """The csv module's refusal of an over-long quoted field consumed every line up to the
    limit: those rows were neither read nor rejected (the limit stands in for 64 MiB)."""
    p = tmp_path / "m.csv"
    _quote_manifest(p, 200)
    previous = csv.field_size_limit(1000)
    try:
        rows = _read(p)
    finally:
        csv.field_size_limit(previous)
    assert len(rows) == 5 + 1 + 200
    line, reason = rows[5]
    assert line == 7 and isinstance(reason, str) and "field larger than field limit" in reason
    batch_items = [r for r in rows if not isinstance(r[1], str)]
    assert [f[0] for _, f in batch_items[5:]] == [f"b{i}" for i in range(200)]  # type: ignore[index]


def test_a_multi_line_quoted_field_is_still_one_record(tmp_path: Path) -> None:
    p = tmp_path / "m.csv"
    desc = "\n".join(f"line {i}" for i in range(50))
    p.write_text(f'id,title,url\na,"{desc}",https://x/a.jpg\nb,t,https://x/b.jpg\n')
    assert _read(p) == [(2, ["a", desc, "https://x/a.jpg"]), (52, ["b", "t", "https://x/b.jpg"])]


def test_a_line_with_no_end_is_a_clear_error_in_bounded_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manifest_bytes, "MAX_LINE_BYTES", 1 << 20)  # stands in for 64 MiB
    p = tmp_path / "m.csv"
    with p.open("w") as fh:
        fh.write("id,url\n" + "".join(f"a{i},https://x/{i}.jpg\n" for i in range(10)))
        fh.write("big,https://x/" + "x" * (24 << 20))  # 24 MiB, no newline
    reader = open_manifest(str(p), 0)
    rows: list[tuple[int, object]] = []
    tracemalloc.start()
    try:
        with pytest.raises(ManifestError, match=r"line 12 is longer than 1 MiB"):
            while (batch := reader.read_batch()) is not None:
                rows.extend(batch.rows)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        reader.close()
    assert [n for n, _ in rows] == list(range(2, 12))  # the rows before it are read
    assert peak < 8 << 20, f"peak {peak:,} bytes for a 1 MiB line limit"


def test_the_unmatched_quote_reject_is_a_client_reject(tmp_path: Path) -> None:
    p = tmp_path / "m.csv"
    _quote_manifest(p, MAX_RECORD_LINES + 5)
    reader = open_manifest(str(p), 0)
    items, rejects = [], []
    try:
        while (batch := reader.read_batch()) is not None:
            i, r = Validator().validate(batch)
            items += i
            rejects += r
    finally:
        reader.close()
    assert len(items) == 5 + MAX_RECORD_LINES + 5
    ((_, reject),) = rejects
    assert reject.line == 7 and reject.stage == "client"


async def _chunk_sizes(
    monkeypatch: pytest.MonkeyPatch,
    manifest: Path,
    ids: set[str],
    budget: int,
    measure: Callable[[list[Any]], int],
) -> list[int]:
    """Run ``manifest`` with chunks cut at ``budget`` bytes (standing in for 512 KiB) against
    the reference service; every id once; the ``measure`` of each chunk the writer sent."""
    from fashiontag_pipeline.engine import EngineConfig, batcher, run_pipeline
    from fashiontag_pipeline.service import ServiceConfig, running_service

    from .helpers import assert_exactly_once, client_config

    monkeypatch.setattr(batcher, "MAX_CHUNK_BYTES", budget)
    sizes: list[int] = []
    dispatch = batcher.TaskWriter.dispatch

    async def recording(self: batcher.TaskWriter, items: list, **kw: object) -> None:  # type: ignore[type-arg]
        sizes.append(measure(items))
        await dispatch(self, items, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(batcher.TaskWriter, "dispatch", recording)
    out, rej = manifest.with_suffix(".out"), manifest.with_suffix(".rej")
    async with running_service(ServiceConfig()) as svc:
        summary = await run_pipeline(
            [manifest],
            client=client_config(svc.url),
            out=out,
            rejects=rej,
            engine=EngineConfig(poll_min=0.02, poll_max=0.2),
        )
    assert summary.complete
    assert_exactly_once(out, rej, ids)
    return sizes


async def test_a_chunk_of_long_urls_is_cut_by_bytes_not_only_by_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks were cut at 1,000 rows whatever their size: 1,000 rows of 250 KB URLs made a
    250 MB chunk, several in flight at once (2.2 GB peak RSS for a 500 MB manifest)."""
    budget = 100_000
    n = 100
    pad = "x" * 8000  # each URL under the reference service's 8,192 characters
    p = tmp_path / "m.csv"
    p.write_text(
        "id,url\n" + "".join(f"p{i},https://img.example/{i}/{pad}.jpg\n" for i in range(n))
    )
    sizes = await _chunk_sizes(
        monkeypatch,
        p,
        {f"p{i}" for i in range(n)},
        budget,
        lambda items: sum(len(request_of(i, r).image.content) for i, _, r in items),
    )
    assert sum(sizes) >= n * 8000 and max(sizes) <= budget, sizes


def _rich_manifest(path: Path, kind: str, n: int) -> set[str]:
    """``n`` rows whose bytes are not in their URLs: long keywords (CSV), long ids in plain
    ``id,url`` lines (each under the reference service's 1,024 characters), long brands
    (JSONL)."""
    ids = [f"p{i}" + ("i" * 1000 if kind == "ids" else "") for i in range(n)]
    if kind == "keywords":
        pad = "k" * 5000
        path.write_text(
            "id,url,keywords\n" + "".join(f"{i},https://x/{i}.jpg,{pad}\n" for i in ids)
        )
    elif kind == "ids":
        path.write_text("id,url\n" + "".join(f"{i},https://x/{k}.jpg\n" for k, i in enumerate(ids)))
    else:
        pad = "b" * 5000
        path.write_text(
            "".join(f'{{"id":"{i}","url":"https://x/{i}.jpg","brand":"{pad}"}}\n' for i in ids)
        )
    return set(ids)


@pytest.mark.parametrize("kind", ["keywords", "ids", "jsonl"])
async def test_a_chunk_of_long_ids_or_context_fields_is_cut_by_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Chunks were cut by the bytes of their URLs alone: 1,000 rows of 50 KB keywords (or
    ids) made a 50 MB chunk, encoded, written ahead and sent by each write slot (407 MB peak
    RSS for a 50 MB manifest, 626 MB for 2,000 rows of 50 KB ids)."""
    import msgspec

    budget = 50_000
    p = tmp_path / "m.manifest"
    n = 300 if kind == "ids" else 150  # (chunks under 1 MB, aiohttp's large-body warning)
    ids = _rich_manifest(p, kind, n)
    sizes = await _chunk_sizes(
        monkeypatch,
        p,
        ids,
        budget,
        lambda items: len(msgspec.json.encode([request_of(i, r) for i, _, r in items])),
    )
    # (The budget counts the requests' strings; their JSON adds ~60 bytes a request.)
    assert sum(sizes) >= n * 1000 and max(sizes) <= 1.1 * budget, sizes
