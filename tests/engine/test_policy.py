"""Property tests of the writer's decisions (chunking, rotation, expiry) with a fake clock."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fashiontag_pipeline._models import BulkContext, Image, TaggingRequest
from fashiontag_pipeline.engine import EngineConfig, policy
from fashiontag_pipeline.engine.policy import (
    HOLD_LINGERS,
    ChunkCutter,
    OpenTask,
    WritePolicy,
    chunk_cut,
)

configs = st.builds(
    EngineConfig,
    chunk_size=st.integers(1, 1000),
    rotate_images=st.integers(1, 5000),
    rotate_min_images=st.integers(1, 3000),
    rotate_fraction=st.floats(0.0, 1.0),
    rotate_seconds=st.floats(1.0, 100.0),
    expiry_margin=st.floats(0.0, 5.0),
    linger_seconds=st.floats(0.05, 10.0),
)
arrivals = st.lists(st.tuples(st.floats(0.0, 3.0), st.integers(1, 2500)), max_size=60)


def simulate(config: EngineConfig, events: list[tuple[float, int]], ttl: float) -> dict[str, list]:
    """Drive the policy like TaskWriter does: rows arrive after gaps; due chunks are written
    to the open task (POST when none is usable); the fake clock only moves forward."""
    policy = WritePolicy(config)
    now = 0.0
    task: OpenTask | None = None
    buffered, since = 0, 0.0
    writes: list[tuple[float, int, int, float]] = []  # (time, task seq, rows, write deadline)
    tasks: list[OpenTask] = []
    order: list[int] = []
    next_row = 0
    sent = 0

    def write(n: int) -> None:
        nonlocal task, sent
        if task is None or not policy.usable(task, now, n):
            if task is not None:
                task.closing = True
            task = OpenTask(seq=len(tasks), token="t", opened=now, expires=now + ttl)
            task.task_id = f"task{len(tasks)}"
            task.limit = policy.task_limit(sent)
            tasks.append(task)
        writes.append((now, task.seq, n, policy.write_deadline(task)))
        task.images += n
        sent += n
        task.expires = now + ttl  # the service extends the expiry on every accepted write
        if policy.full(task):
            task.closing = True  # sealed at once, as TaskWriter does
            task = None

    def advance(to: float) -> None:
        nonlocal now, buffered, since, task
        while True:
            due = min(policy.flush_at(buffered, since, task), policy.close_at(task, buffered))
            if due > to:
                break
            now = max(now, due)
            if buffered and now >= policy.flush_at(buffered, since, task):
                write(buffered)
                buffered = 0
            if task is not None and now >= policy.close_at(task, buffered):
                task.closing = True
                task = None
        now = to

    for gap, n in events:
        advance(now + gap)
        if not buffered:
            since = now
        buffered += n
        order.extend(range(next_row, next_row + n))
        next_row += n
        for size in policy.split(buffered):
            write(size)
            buffered -= size
            since = now
    if buffered:
        write(buffered)
    return {"writes": writes, "tasks": tasks, "rows": [next_row]}


@settings(max_examples=300, deadline=None)
@given(configs, arrivals, st.floats(0.5, 600.0))
def test_chunks_are_bounded_and_lose_nothing(
    config: EngineConfig, events: list, ttl: float
) -> None:
    result = simulate(config, events, ttl)
    sizes = [n for _, _, n, _ in result["writes"]]
    assert all(1 <= n <= config.chunk_size for n in sizes)
    assert sum(sizes) == result["rows"][0]


@settings(max_examples=300, deadline=None)
@given(configs, arrivals, st.floats(0.5, 600.0))
def test_rotation_caps_task_size_and_age(config: EngineConfig, events: list, ttl: float) -> None:
    result = simulate(config, events, ttl)
    for task in result["tasks"]:
        assert task.images <= max(config.rotate_images, config.chunk_size)
        assert task.limit is not None and task.images <= max(task.limit, config.chunk_size)
        first = min(t for t, seq, _, _ in result["writes"] if seq == task.seq)
        last = max(t for t, seq, _, _ in result["writes"] if seq == task.seq)
        assert last - first < config.rotate_seconds or first == last


@settings(max_examples=300, deadline=None)
@given(configs, arrivals, st.floats(0.5, 600.0))
def test_no_write_to_a_task_after_expiry_minus_margin(
    config: EngineConfig, events: list, ttl: float
) -> None:
    result = simulate(config, events, ttl)
    previous_deadline: dict[int, float] = {}
    for when, seq, _, deadline in result["writes"]:
        if seq in previous_deadline:
            # A PUT: it must start before the deadline the previous write established.
            assert when < previous_deadline[seq]
        previous_deadline[seq] = when + ttl - config.expiry_margin
        del deadline


@given(configs, st.floats(0.0, 1000.0), st.integers(1, 999))
def test_partial_chunk_is_flushed_before_the_open_task_expires(
    config: EngineConfig, opened: float, buffered: int
) -> None:
    policy = WritePolicy(config)
    task = OpenTask(seq=0, token="t", opened=opened, expires=opened + 5.0, task_id="x")
    # A chunk is full at ``rotate_images`` when that is below ``chunk_size`` (it is sent at
    # once, which a margin of the whole TTL makes too late): partial is below the policy's.
    if buffered < policy.chunk_size:
        assert policy.flush_at(buffered, opened, task) < policy.write_deadline(task)


@given(
    configs,
    st.floats(0.0, 1000.0),
    st.floats(0.0, 60.0),
    st.lists(st.floats(0.0, 10.0), max_size=40),
)
def test_a_task_held_for_a_burst_is_sealed_within_a_few_lingers_of_its_first_rows(
    config: EngineConfig, opened: float, create_wait: float, gaps: list[float]
) -> None:
    """Held ``linger`` after its last rows while rows keep coming, but never past
    ``HOLD_LINGERS`` ``linger`` after its first (a trickle held it until rotated) or its
    create's answer (a create waiting out a 429 spent the bound: a second task for the
    burst); while the create is unanswered, only ``linger`` after its last rows."""
    policy = WritePolicy(config)
    task = OpenTask(seq=0, token="t", opened=opened, expires=opened + 600.0, task_id="x")
    linger, rows_at = config.linger_seconds, opened
    assert policy.held_until(task, opened + 100 * linger) == opened + 100 * linger + linger
    task.answered = opened + create_wait
    for gap in gaps:
        until = policy.held_until(task, rows_at)
        assert opened + linger <= until <= opened + create_wait + HOLD_LINGERS * linger
        if rows_at + gap >= until:
            break  # sealed before these rows came
        rows_at += gap
        assert policy.held_until(task, rows_at) >= until


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(min_value=1, max_value=400), max_size=30), max_size=12),
    st.integers(min_value=1, max_value=8),
)
def test_the_chunk_cutter_cuts_where_measuring_every_item_would(
    batches: list[list[int]], size: int
) -> None:
    """The writer's buffer, fed batches of URLs of these lengths, is cut where the item-by-item
    rule (``size`` requests, or fewer whose URLs stay within the bytes) cuts it, though the
    cutter measures each item once and cuts by count while its bound allows."""
    cutter = ChunkCutter(size, 1000)
    buffer: list[tuple[str, int, TaggingRequest]] = []
    n = 0
    for lengths in batches:
        batch = []
        for length in lengths:
            n += 1
            url = "h" * length
            batch.append((f"p{n}", n, TaggingRequest(Image("url", url), BulkContext(f"p{n}"))))
        buffer.extend(batch)
        cutter.added(batch)
        while True:
            expected = chunk_cut(buffer, size, 1000)
            assert cutter.cut(buffer) == expected
            if not expected:
                break
            buffer = buffer[expected:]


def test_a_buffer_of_several_chunks_is_cut_by_count_without_measuring_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A writer's buffer holding three chunks of 200-character URLs (each chunk ~210 KB, the
    buffer past the 512 KiB bound) was measured whole again at every cut (a JSON encoding of
    every request in it): three times the CPU of the cut by URLs alone. Each batch's size is
    known as it comes; a chunk is measured only when the batches it is in pass the bound."""
    measured: list[int] = []
    real = policy.batch_size

    def counting(items: Sequence[Any]) -> int:
        if not isinstance(items, policy.Measured):
            measured.append(len(items))
        return real(items)

    monkeypatch.setattr(policy, "batch_size", counting)
    cutter = ChunkCutter(1000, policy.MAX_CHUNK_BYTES)
    buffer: list[tuple[str, int, TaggingRequest]] = []
    for start in range(0, 6000, 500):
        batch = [
            (f"p{n}", n, TaggingRequest(Image("url", "h" * 200), BulkContext(f"p{n}")))
            for n in range(start, start + 500)
        ]
        buffer.extend(batch)
        cutter.added(policy.Measured(batch, 500 * 210))
        while len(buffer) > 3000 and (cut := cutter.cut(buffer)):
            assert cut == 1000
            buffer = buffer[cut:]
    assert measured == []
