"""The three cost levers of round 12 against the code they replaced, on the inputs that decide
exactly-once: a run's positions (``idruns._packed``: ``struct.pack`` for ``array("q")``), a
chunk's stored body (``policy.encode_body``: one join for four concatenations), and a block's
(id, position) rows handed to the dedupe as its two columns (``state.KeyedColumns`` for a
list of pairs). The replaced code is inlined here, as it was, and both are run on the same
random inputs (fixed seeds): ids repeated inside a batch and across batches, runs, a shuffled
catalogue, positions past 2^31, 2^32 and a later manifest's, the empty and one-row cases, on
both state backends."""

from __future__ import annotations

import gc
import random
import signal
import struct
import subprocess
import sys
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from fashiontag_pipeline._models import BulkContext, Image, ImageType, TaggingRequest
from fashiontag_pipeline.engine.plainblock import context_block, plain_block
from fashiontag_pipeline.engine.policy import _body_encoder, encode_body
from fashiontag_pipeline.engine.rows import PlainRows
from fashiontag_pipeline.engine.state import POS_SHIFT, KeyedColumns, idruns, open_state
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, run_args

StateAt = Callable[[str], "Path | str"]

#: Positions around the bounds a packing could get wrong: 2^31, 2^32, a later manifest's
#: (``source << POS_SHIFT``), the largest int64.
EDGES = [
    0,
    1,
    (1 << 31) - 1,
    1 << 31,
    (1 << 32) - 1,
    1 << 32,
    (1 << 32) + 1,
    (1 << POS_SHIFT) | 1,
    (2 << POS_SHIFT) | ((1 << 32) + 5),
    (1 << 63) - 1,
]


def _old_packed(positions: Any) -> bytes:
    """``idruns._packed`` before round 12."""
    packed = array("q", positions)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def test_packed_positions_are_the_arrays_bytes_on_random_runs() -> None:
    rng = random.Random(1212)
    runs: list[list[int]] = [[], [0], [EDGES[-1]], EDGES, sorted(EDGES)]
    for _ in range(300):
        n = rng.choice([1, 2, 3, rng.randrange(1, 5000)])
        source = rng.randrange(0, 1 << 20)
        start = (source << POS_SHIFT) | rng.randrange(0, 1 << 40)
        runs.append([start + k * rng.randrange(1, 3) for k in range(n)])
        runs.append([rng.choice(EDGES) for _ in range(rng.randrange(1, 20))])
    for run in runs:
        by_id = {f"k{k:06d}": pos for k, pos in enumerate(run)}
        packed = idruns._packed(by_id.values())  # (as idset gives it: a dict's values)
        assert packed == _old_packed(by_id.values())
        assert list(idruns._unpacked(packed)) == run


def test_a_position_past_int64_is_refused_by_both_packings() -> None:
    """(Never a position: a source is far below 2^23. Both refuse it, neither wraps it.)"""
    for bad in (1 << 63, -(1 << 63) - 1):
        with pytest.raises(OverflowError):
            _old_packed([bad])
        with pytest.raises((OverflowError, struct.error)):
            idruns._packed([bad])


def _old_encode_body(
    positions: Sequence[int],
    requests: Sequence[Any],
    sends: int = 0,
    ids: Sequence[str] | None = None,
    ids_json: bytes | None = None,
) -> bytes:
    """``policy.encode_body``'s body before round 12 (its requests' encoding as now)."""
    encoded = bytes(encode_body([], requests, 0, ids, ids_json)[1].raw)
    tail = b',"g":%d}' % sends if sends else b"}"
    return b'{"p":' + _body_encoder.encode(positions) + b',"r":' + encoded + tail


_TEXT = ["", "a", "\u00e9t\u00e9", 'q"uo\\te', "x\u2028y", "\x00nul", "\U0001f600", "a,b"]


def _request(rng: random.Random, ident: str) -> TaggingRequest | str:
    url = f"https://img.example/{rng.randrange(10**9)}/{rng.choice(_TEXT)}.jpg"
    if rng.random() < 0.4:
        return url  # a plain row's request: its URL (plainbody)
    context = BulkContext(
        ident,
        brand=rng.choice([None, *_TEXT]),
        keywords=rng.choice([None, "k1|k2", *_TEXT]),
        season=rng.choice([None, "SS24"]),
    )
    return TaggingRequest(Image(ImageType.URL, url), context)


def test_a_chunks_body_is_the_concatenations_bytes_on_random_chunks() -> None:
    rng = random.Random(2026)
    for _ in range(400):
        n = rng.choice([0, 1, 2, rng.randrange(1, 300)])
        ids = [f"{rng.choice(_TEXT)}id{rng.randrange(10**6)}" for _ in range(n)]
        requests = [_request(rng, ident) for ident in ids]
        positions = sorted(rng.choice([rng.choice(EDGES), rng.randrange(1 << 50)]) for _ in ids)
        sends = rng.choice([0, 0, 1, 7, 1 << 33])
        plain = any(isinstance(r, str) for r in requests)
        given_ids = ids if plain or rng.random() < 0.5 else None
        ids_json = (
            msgspec.json.encode(ids) if given_ids is not None and rng.random() < 0.5 else None
        )
        body, encoded = encode_body(positions, requests, sends, given_ids, ids_json)
        assert body == _old_encode_body(positions, requests, sends, given_ids, ids_json)
        decoded = msgspec.json.decode(body)
        assert decoded["p"] == positions and len(decoded["r"]) == n == encoded.size
        assert decoded.get("g", 0) == sends


def _batches(rng: random.Random) -> list[tuple[list[str], Sequence[int]]]:
    """Batches of one run's ids as the validator's blocks give them (ids, positions): a sorted
    catalogue (runs), ids repeated inside a batch and across batches, a shuffled catalogue
    (the tree), a later manifest's positions, an empty batch and batches of one row."""
    out: list[tuple[list[str], Sequence[int]]] = []
    pos = 1
    seen: list[str] = []
    for b in range(60):
        n = rng.choice([0, 1, 1, 2, rng.randrange(1, 400)])
        kind = b % 4
        if kind == 0:  # sorted, after every id held
            ids = [f"s{b:03d}-{k:05d}" for k in range(n)]
        elif kind == 1:  # repeats inside the batch and of earlier batches
            pool = seen[-500:] or ["x"]
            ids = [
                rng.choice(pool) if rng.random() < 0.5 else f"r{rng.randrange(300)}"
                for _ in range(n)
            ]
        elif kind == 2:  # shuffled
            ids = [f"h{rng.randrange(10**6):06d}" for _ in range(n)]
        else:  # equal but for what the id-key normalisation leaves (distinct keys here)
            base = f"n{rng.randrange(50)}"
            ids = [
                rng.choice([base, base.upper(), f" {base}", f"{base}.0", base]) for _ in range(n)
            ]
        if b == 30:
            pos = (1 << POS_SHIFT) | ((1 << 32) - 3)  # a later manifest, past 2^32
        positions: Sequence[int] = range(pos, pos + n) if b % 2 else list(range(pos, pos + n))
        pos += n + rng.randrange(0, 3)
        seen += ids
        out.append((ids, positions))
    return out


def _dedupes(state: Any, batches: Any, as_columns: bool) -> list[list[int] | None]:
    firsts = []
    for ids, positions in batches:
        keyed: Sequence[tuple[str, int]] = (
            KeyedColumns(ids, positions)
            if as_columns
            else [(ident, pos) for ident, pos in zip(ids, positions, strict=True)]
        )
        with state.transaction():
            firsts.append(state.dedupe(keyed))
    return firsts


@pytest.mark.parametrize("seed", [1, 2])
def test_batches_keyed_as_columns_dedupe_as_pairs_on_both_backends(
    state_location: StateAt, seed: int
) -> None:
    batches = _batches(random.Random(seed))
    results = []
    for name in ("pairs", "columns"):
        state = open_state(state_location(f"{name}_{seed}"))
        try:
            results.append((_dedupes(state, batches, name == "columns"), state.ids_taken()))
        finally:
            state.close()
    assert results[0] == results[1]
    assert any(firsts is not None for firsts in results[0][0])  # (repeats were met)


def test_a_keyed_columns_is_read_as_its_pairs_every_way() -> None:
    ids = ["a", "b", "a", "c"]
    for positions in (range(7, 11), [7, 8, 9, 10]):
        columns, pairs = KeyedColumns(ids, positions), list(zip(ids, positions, strict=True))
        assert list(columns) == pairs and list(reversed(columns)) == pairs[::-1]
        assert dict(columns) == dict(pairs) and len(columns) == len(pairs)
        assert [columns[i] for i in range(-4, 4)] == [pairs[i] for i in range(-4, 4)]
        assert columns[::2] == pairs[::2] and columns[5:] == [] == pairs[5:]
        assert sorted(columns, key=lambda p: p[1]) == pairs
        with pytest.raises(IndexError):
            columns[4]
    assert list(KeyedColumns([], range(0))) == [] and len(KeyedColumns([], [])) == 0


def test_a_blocks_columns_hold_only_what_its_items_hold() -> None:
    """Memory: a block's columns keep no chunk's cells alive: its ids column holds the items'
    own id strings (no copy of a cell), its positions the items' (a range, or their ints), and
    neither refers to the text the block was cut from."""
    lines = [f"id{k},https://img.example/{k}.jpg" for k in range(2000)]
    cells = ",".join(lines).replace("\n", ",").split(",")
    body = "".join(line + "\n" for line in lines)
    blocks = [
        plain_block(PlainRows(5, lines), 0, 3 << POS_SHIFT),
        plain_block(PlainRows(5, cells=cells, body=body), 0, 3 << POS_SHIFT),
        context_block(PlainRows(5, [f"{line},acme" for line in lines]), 3, 0, 1, [(2, "brand")], 0)[
            0
        ],
    ]
    for block in blocks:
        assert block is not None and block.columns is not None
        ids, positions = block.columns
        assert len(block) == 2000
        assert all(a is b for a, (b, _, _) in zip(ids, block, strict=True))
        assert list(positions) == [p for _, p, _ in block]
        # Nothing but the ids (no cells list, no block text) behind the columns:
        assert ids is not cells and all(
            type(r) is str and len(r) < 16 for r in gc.get_referents(ids)
        )
        assert sys.getsizeof(ids) <= 8 * len(ids) + 200  # a list of pointers, nothing more
        assert isinstance(positions, range) or all(
            a is b for a, (_, b, _) in zip(positions, block, strict=True)
        )


def _manifests(folder: Path) -> tuple[list[Path], set[str], dict[tuple[str, int], str]]:
    """Three manifests of one run whose blocks all take the columns: ``id,url`` lines (the
    plain block), quoted CSV with a context column (the csv module's rows: the parsed block)
    and JSONL with integer ids (the JSONL block); ids repeated inside blocks, across blocks
    and across manifests. Returns (the manifests, the ids, each later row's (manifest, line)
    -> the "first seen at" its duplicate reject names)."""
    first: dict[str, tuple[str, int]] = {}
    dups: dict[tuple[str, int], str] = {}
    paths = []

    def row(name: str, line: int, ident: str) -> None:
        if ident in first:
            seen, at = first[ident]
            dups[(name, line)] = f"first seen at {seen} line {at})"
        else:
            first[ident] = (name, line)

    plain = ["id,url"]
    for k in range(4000):
        ident = f"p{k - 37 if k % 53 == 52 else k}"  # (a repeat every 53 rows)
        plain.append(f"{ident},https://img.example/p/{k}.jpg")
        row("a.csv", len(plain), ident)
    quoted = ["id,url,brand"]
    for k in range(1500):
        ident = f"p{k * 2}" if k % 10 == 0 else f"q{k}"  # (a.csv's ids again)
        quoted.append(f'{ident},https://img.example/q/{k}.jpg,"acme, inc {k % 4}"')
        row("b.csv", len(quoted), ident)
    objects = []
    for k in range(1500):
        ident: Any = k if k % 3 else f"q{k}"  # (7 and "7": one id)
        objects.append(msgspec.json.encode({"id": ident, "url": f"https://i.example/{k}"}).decode())
        row("c.jsonl", len(objects), str(ident))
    objects += [
        msgspec.json.encode({"id": k, "url": "https://i.example/x"}).decode() for k in (1, 2)
    ]
    row("c.jsonl", len(objects) - 1, "1")
    row("c.jsonl", len(objects), "2")
    for name, lines in (("a.csv", plain), ("b.csv", quoted), ("c.jsonl", objects)):
        path = folder / name
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths, set(first), dups


async def test_a_run_of_blocks_killed_and_resumed_names_each_duplicates_first_row(
    tmp_path: Path, state_location: StateAt
) -> None:
    """End to end, a kill -9 mid-run then the same command: every id once, and each later row
    of an id (inside a block, across blocks and manifests) a duplicate naming the manifest and
    line of its first row, as the pairs built row by row named it."""
    manifests, ids, dups = _manifests(tmp_path)
    out = tmp_path / "out.jsonl"
    state = str(state_location("blocks"))
    async with running_service(ServiceConfig(rate=4000.0)) as svc:
        args = run_args(svc.url, out, "--state", state)
        args += [str(path) for path in manifests]
        args += ["--summary", str(tmp_path / "summary.json")]
        proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
        with anyio.fail_after(60):
            while not out.exists() or out.stat().st_size == 0:
                await anyio.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await proc.aclose()
        final = await anyio.run_process(args, check=False, env=ENV)
    assert final.returncode == 0, final.stderr.decode()[-3000:]
    assert msgspec.json.decode((tmp_path / "summary.json").read_bytes())["opened"] == "resumed"
    outcomes = assert_exactly_once(out, out.with_suffix(".rej"), ids, duplicates=len(dups))
    named = sorted(
        r["reason"].rsplit(" (", 1)[1].replace(str(tmp_path) + "/", "")
        for r in outcomes.rejects
        if r["reason"].startswith("duplicate id")
    )
    assert named == sorted(dups.values())
