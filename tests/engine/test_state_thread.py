"""The state thread: calls run one at a time in one thread, in order; errors reach the caller; a
cancelled caller still waits for its call; the loop keeps turning; stop ends the thread."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from fashiontag_pipeline import _exceptions as exc
from fashiontag_pipeline.engine.state.worker import StateThread


async def test_calls_run_in_order_in_one_thread_off_the_loop() -> None:
    worker = StateThread()
    seen: list[tuple[int, int]] = []

    def record(i: int) -> int:
        seen.append((i, threading.get_ident()))
        return i * 2

    try:
        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(worker.run, record, i)
        assert await worker.run(record, 20) == 40
    finally:
        worker.stop()
    threads = {ident for _, ident in seen}
    assert len(threads) == 1
    assert threading.get_ident() not in threads
    assert sorted(i for i, _ in seen) == list(range(21))


async def test_an_error_is_raised_in_the_caller_and_the_thread_goes_on() -> None:
    worker = StateThread()

    def fail() -> None:
        raise ValueError("disk said no")

    try:
        with pytest.raises(ValueError, match="disk said no"):
            await worker.run(fail)
        assert await worker.run(lambda: "still here") == "still here"
    finally:
        worker.stop()


async def test_a_cancelled_caller_waits_for_its_call_and_the_loop_keeps_turning() -> None:
    worker = StateThread()
    release = threading.Event()
    finished: list[str] = []
    ticks = 0

    def slow() -> None:
        release.wait(5)
        finished.append("committed")

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.sleep(0.01)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(tick)
            started = time.monotonic()
            threading.Timer(0.3, release.set).start()
            with anyio.move_on_after(0.1):
                await worker.run(slow)
            waited = time.monotonic() - started
            tg.cancel_scope.cancel()
        # The call was not abandoned: the caller waited for it, past its 0.1 s deadline.
        assert finished == ["committed"]
        assert waited >= 0.25
        assert ticks >= 5  # the loop turned while the call held its thread
    finally:
        worker.stop()


async def test_stop_ends_the_thread_after_queued_calls_and_refuses_new_ones() -> None:
    worker = StateThread(name="state-thread-under-test")
    done: list[int] = []
    await worker.run(done.append, 1)
    thread = next(t for t in threading.enumerate() if t.name == "state-thread-under-test")
    worker.stop()
    worker.stop()  # idempotent
    assert not thread.is_alive()
    assert done == [1]
    with pytest.raises(exc.StateError):
        await worker.run(done.append, 2)
