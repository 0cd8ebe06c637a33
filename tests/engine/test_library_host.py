"""The engine inside a host program (``run_pipeline`` called by an application): what a run
leaves of the process's own settings once it returns. Found by a hunt; each failed before its
fix.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.engine import EngineConfig, run_pipeline
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import assert_exactly_once, client_config, ids_of, write_csv

FAST = EngineConfig(poll_min=0.02, poll_max=0.2, linger_seconds=0.05, fsync_seconds=10.0)


async def test_a_run_keeps_the_objects_its_host_froze_out_of_the_collector(tmp_path: Path) -> None:
    """A pre-fork server (``gc.freeze()`` before it forks its workers, as Python's documentation
    advises, so that the workers share the parent's memory) whose worker ran a pipeline: the
    run's end unfroze every object, the host's included, and the next full collection wrote to
    each of them, copying every shared page into the worker. A run leaves a freeze it did not
    make alone, and the collector's thresholds as they were."""
    manifest = write_csv(tmp_path / "m.csv", 200)
    held = [[i] for i in range(20_000)]  # the host's objects, frozen before the run
    thresholds = gc.get_threshold()
    gc.freeze()
    try:
        async with running_service(ServiceConfig()) as svc:
            with anyio.fail_after(30):
                summary = await run_pipeline(
                    [manifest],
                    client=client_config(svc.url),
                    out=tmp_path / "out.jsonl",
                    rejects=tmp_path / "rej.jsonl",
                    engine=FAST,
                )
        assert summary.complete
        # (Frozen objects freed since leave the count: the host's are still there.)
        assert gc.get_freeze_count() > len(held), "the run unfroze the host's objects"
        assert gc.get_threshold() == thresholds
    finally:
        gc.unfreeze()
    assert len(held) == 20_000
    assert_exactly_once(tmp_path / "out.jsonl", tmp_path / "rej.jsonl", ids_of(200))


@pytest.mark.parametrize("stderr", ["none", "reader gone"])
async def test_a_run_with_progress_goes_on_when_nobody_reads_its_hosts_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stderr: str
) -> None:
    """``run_pipeline(..., progress=True)`` in a host whose stderr is gone: ``None`` (a process
    started with descriptor 2 closed, pythonw) or a pipe whose reader died (``nightly.py 2>&1 |
    head``, a log collector that stopped). The first progress line stopped the run with a bare
    ``AttributeError: 'NoneType' object has no attribute 'isatty'`` or ``BrokenPipeError``
    (as ``fashiontag run`` did before it guarded its streams). Progress is for people: once
    nobody reads it, the run goes on without it and ends as it would."""
    manifest = write_csv(tmp_path / "m.csv", 2000)
    if stderr == "none":
        monkeypatch.setattr(sys, "stderr", None)
    else:
        read, write = os.pipe()
        os.close(read)
        gone = open(write, "w")  # noqa: SIM115 - closed below
        monkeypatch.setattr(sys, "stderr", gone)
    engine = EngineConfig(poll_min=0.02, poll_max=0.2, linger_seconds=0.05, progress_seconds=0.01)
    try:
        async with running_service(ServiceConfig(rate=2000)) as svc:
            with anyio.fail_after(30):
                summary = await run_pipeline(
                    [manifest],
                    client=client_config(svc.url),
                    out=tmp_path / "out.jsonl",
                    rejects=tmp_path / "rej.jsonl",
                    engine=engine,
                    progress=True,
                )
    finally:
        monkeypatch.undo()
        if stderr != "none":
            with contextlib.suppress(OSError):
                gone.close()
    assert summary.complete
    assert_exactly_once(tmp_path / "out.jsonl", tmp_path / "rej.jsonl", ids_of(2000))


class _WriteOnly:
    """A host's stand-in for stderr that has ``write`` and nothing else (a tee to its logger,
    ``contextlib.redirect_stderr`` to an object of its own)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, text: str) -> int:
        self.lines.append(text)
        return len(text)


async def test_a_run_with_progress_writes_to_a_stderr_that_can_only_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_pipeline(..., progress=True)`` in a host whose ``sys.stderr`` is an object of its
    own with only ``write``: the run stopped as it began, on a bare
    ``AttributeError: '...' object has no attribute 'isatty'`` (and, past that, ``flush``).
    Such a stream is not a terminal: the run writes its progress lines to it and ends as it
    would."""
    manifest = write_csv(tmp_path / "m.csv", 2000)
    stream = _WriteOnly()
    monkeypatch.setattr(sys, "stderr", stream)
    engine = EngineConfig(poll_min=0.02, poll_max=0.2, linger_seconds=0.05, progress_seconds=0.01)
    try:
        async with running_service(ServiceConfig(rate=2000)) as svc:
            with anyio.fail_after(30):
                summary = await run_pipeline(
                    [manifest],
                    client=client_config(svc.url),
                    out=tmp_path / "out.jsonl",
                    rejects=tmp_path / "rej.jsonl",
                    engine=engine,
                    progress=True,
                )
    finally:
        monkeypatch.undo()
    assert summary.complete
    assert_exactly_once(tmp_path / "out.jsonl", tmp_path / "rej.jsonl", ids_of(2000))
    assert any(line.startswith("fashiontag: ") for line in stream.lines)
