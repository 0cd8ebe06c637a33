"""Promise 4: bounded resources. Peak memory does not grow with the manifest.

No timing assertion: the CLI runs as a fresh subprocess (so its peak RSS is its own) on a small
and a 6x larger manifest, with small stage bounds (so the smaller run already fills them), and
the larger run's peak RSS must stay within 1.3x of the smaller one's. Holding the manifest, its
ids or its results anywhere in memory would break that. A structural check complements it:
every memory object stream of the run is created with a finite buffer.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import anyio

from fashiontag_pipeline.engine import engine as engine_module
from fashiontag_pipeline.engine import source
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import dead_port, run_args, run_piped, write_csv

SMALL, LARGE = 4_000, 24_000

CONFIG = """
[engine]
read_batch_rows = 250
queue_batches = 2
chunk_size = 500
rotate_images = 4000
max_write_concurrency = 2
max_page_concurrency = 4
poll_min = 0.02
poll_max = 0.2
linger_seconds = 0.2
"""

# Runs the CLI in a child and prints that child's peak RSS (KiB): RUSAGE_CHILDREN of a fresh
# wrapper process only ever sees the one engine process.
WRAPPER = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.run(sys.argv[1:]).returncode\n"
    "print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)


async def _peak_rss_kib(tmp: Path, url: str, rows: int) -> int:
    manifest = write_csv(tmp / f"m{rows}.csv", rows)
    config = tmp / "engine.toml"
    config.write_text(CONFIG)
    argv = [
        sys.executable,
        "-c",
        WRAPPER,
        sys.executable,
        "-m",
        "fashiontag_pipeline",
        "run",
        str(manifest),
        "--config",
        str(config),
        "--base-url",
        url,
        "--out",
        str(tmp / f"out{rows}.jsonl"),
        "--rejects",
        str(tmp / f"rej{rows}.jsonl"),
        "--no-progress",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASHIONTAG_")}
    result = await anyio.run_process(argv, env=env, check=False)
    code, peak = result.stdout.decode().split()[-2:]
    assert code == "0", result.stderr.decode(errors="replace")[-2000:]
    assert (tmp / f"out{rows}.jsonl").read_bytes().count(b"\n") == rows
    return int(peak)


async def test_peak_rss_does_not_grow_with_the_manifest(tmp_path: Path) -> None:
    async with running_service(ServiceConfig()) as svc:
        small = await _peak_rss_kib(tmp_path, svc.url, SMALL)
        large = await _peak_rss_kib(tmp_path, svc.url, LARGE)
    assert large <= 1.3 * small, f"peak RSS {large} KiB at {LARGE} rows vs {small} at {SMALL}"


def test_every_stage_stream_is_bounded() -> None:
    """Every memory object stream of the run has a finite, non-zero buffer."""
    tree = ast.parse(Path(engine_module.__file__).read_text())
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and "create_memory_object_stream" in ast.unparse(node.func)
    ]
    assert calls, "the engine wires its stages with memory object streams"
    for call in calls:
        args = [*call.args, *(k.value for k in call.keywords if k.arg == "max_buffer_size")]
        assert args, f"unbounded stream: {ast.unparse(call)}"
        size = ast.unparse(args[0])
        assert "inf" not in size and size not in ("0", "None"), size


def test_source_batches_are_capped_in_rows(tmp_path: Path) -> None:
    """A source batch never holds more than ``max_rows`` rows, whatever the chunk size."""
    manifest = write_csv(tmp_path / "m.csv", 5000)
    reader = source.open_manifest(str(manifest), 0, 300)
    sizes = []
    try:
        while (batch := reader.read_batch()) is not None:
            sizes.append(len(batch.rows))
    finally:
        reader.close()
    assert sum(sizes) == 5000 and max(sizes) <= 300


async def _resume_peak_rss_kib(tmp: Path, url: str, rows: int) -> int:
    """Peak RSS (KiB) of ``run - --resume`` of a stdin run of ``rows`` rows under one id (one
    taken in, every other a duplicate's reject) and one more, stopped unfinished at that last
    row (its service unreachable)."""
    dump = tmp / f"dump{rows}.csv"
    dump.write_bytes(
        b"id,url\n" + b"s0,https://img.example/0.jpg\n" * rows + b"last,https://img.example/l.jpg\n"
    )
    out = tmp / f"stdin{rows}.jsonl"
    dead = f"http://127.0.0.1:{dead_port()}"
    first = await run_piped([*run_args(dead, out, "-"), "--give-up-after", "1"], dump)
    assert first.returncode == 1, first.stderr.decode(errors="replace")[-2000:]
    resumed = await run_piped(
        [sys.executable, "-c", WRAPPER, *run_args(url, out, "-"), "--resume"], dump
    )
    code, peak = resumed.stdout.decode().split()[-2:]
    assert code == "0", resumed.stderr.decode(errors="replace")[-2000:]
    assert out.read_bytes().count(b"\n") == 2
    assert out.with_suffix(".rej").read_bytes().count(b"\n") == rows - 1
    return int(peak)


async def test_a_stdin_resume_does_not_hold_every_reject_line(tmp_path: Path) -> None:
    """``run - --resume`` checks each replayed row against the lines the run rejected: it read
    every such line of the rejects file into a set of ints first (~95 bytes each), so the
    resume of a night's dump with millions of duplicates or bad rows took hundreds of MB
    (300,000 rejects: ~22 MB more than 20,000). Compared with 50,000 rows, whose dump (1.6 MB)
    already fills the reader's 1 MiB chunk: a chunk's cells (a bounded cost, the same at any size
    past it) put 300,000 at 1.152x of 20,000 rows (0.6 MB), not 1.133x, with no reject held."""
    async with running_service(ServiceConfig()) as svc:
        small = await _resume_peak_rss_kib(tmp_path, svc.url, 50_000)
        large = await _resume_peak_rss_kib(tmp_path, svc.url, 300_000)
    assert large <= 1.15 * small, f"peak RSS {large} KiB at {300_000} rejects vs {small} at 50,000"
