"""RetryBudget.call: the one rule every read loop of the engine follows; the tracker's stall
clock, which stops a run whose tasks the service holds for ever; and the AIMD limiter that
holds the engine's requests to its concurrency."""

from __future__ import annotations

import anyio
import pytest

from fashiontag_pipeline import (
    AmbiguousWriteError,
    AuthenticationError,
    DecodeError,
    RateLimitedError,
    ServerError,
    TransportError,
)
from fashiontag_pipeline.engine import EngineConfig
from fashiontag_pipeline.engine.flow import AIMDLimiter, FatalRunError, RetryBudget
from fashiontag_pipeline.engine.tracker import TaskBook, TaskEntry, Tracker


def failing(errors: list[Exception], result: str = "ok") -> tuple[list[int], object]:
    calls = [0]

    async def fn() -> str:
        calls[0] += 1
        if errors:
            raise errors.pop(0)
        return result

    return calls, fn


async def test_transient_failures_are_retried_until_success() -> None:
    budget = RetryBudget(60, base=0.001, cap=0.002)
    calls, fn = failing([TransportError("drop"), ServerError("boom", status=503)])
    assert await budget.call("list tasks", fn) == "ok"  # type: ignore[arg-type]
    assert calls == [3] and budget.retries == 2


async def test_a_refused_key_is_fatal_at_once() -> None:
    budget = RetryBudget(60, base=0.001, cap=0.002)
    calls, fn = failing([AuthenticationError("HTTP 401", status=401)])
    with pytest.raises(FatalRunError, match="refused the run: HTTP 401"):
        await budget.call("list tasks", fn)  # type: ignore[arg-type]
    assert calls == [1] and budget.retries == 0


async def test_a_spent_budget_is_fatal_and_names_the_operation() -> None:
    budget = RetryBudget(0.01, base=0.02, cap=0.02)
    _, fn = failing([TransportError("refused")] * 10)
    with pytest.raises(FatalRunError, match="status of task t1: service unreachable"):
        await budget.call("status of task t1", fn)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("error", "warned", "final"),
    [
        (
            RateLimitedError("HTTP 429: this key has 1000 live tasks", status=429),
            "the service is rate limiting this key (HTTP 429)",
            "service rate limiting this key",
        ),
        (
            ServerError("HTTP 503", status=503),
            "the service answers with an error",
            "service answering with errors",
        ),
        (
            AmbiguousWriteError("answered HTTP 503; the write may or may not ...", status=503),
            "the service answers HTTP 503",
            "service answering HTTP 503",
        ),
    ],
)
async def test_a_budget_spent_on_refusals_says_so_not_unreachable(
    caplog: pytest.LogCaptureFixture, error: Exception, warned: str, final: str
) -> None:
    """A service that answers 429 (a live-task limit, a quota) or 5xx is reachable: the
    warning and the final error say what it answers, never "cannot reach"."""
    budget = RetryBudget(0.01, base=0.02, cap=0.02)
    _, fn = failing([error] * 10)
    with pytest.raises(FatalRunError, match=f"create task: {final}"):
        await budget.call("create task", fn)  # type: ignore[arg-type]
    assert warned in caplog.text and "cannot reach" not in caplog.text


async def test_a_budget_spent_on_malformed_answers_says_so_not_unreachable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A body that is not the spec's JSON is no outage: the warning and the final error say
    the service answers malformed JSON, not that it cannot be reached."""
    budget = RetryBudget(0.01, base=0.02, cap=0.02)
    _, fn = failing([DecodeError("Expected `str`, got `int`")] * 10)
    with pytest.raises(FatalRunError, match="list tasks: service answering malformed JSON"):
        await budget.call("list tasks", fn)  # type: ignore[arg-type]
    assert "answers JSON that is not the spec's shape" in caplog.text
    assert "cannot reach" not in caplog.text


def _stall_tracker(clock: list[float]) -> Tracker:
    async def on_done(entry: TaskEntry) -> None:
        return None

    return Tracker(
        client=None,  # type: ignore[arg-type]
        journal=None,  # type: ignore[arg-type]
        book=TaskBook(),
        config=EngineConfig(stall_timeout=100.0),
        budget=RetryBudget(60),
        on_done=on_done,
        finished=lambda: False,
        clock=lambda: clock[0],
    )


def test_the_stall_clock_counts_only_answered_polls_of_the_same_tasks() -> None:
    """No watched task progresses: the run stops after ``stall_timeout`` of polls the service
    answered. A poll that needed retries (an outage: give_up_after rules it) or a task new to
    the watch (rows of a lost task sent again) starts the clock again; progress does too."""
    clock = [0.0]
    tracker = _stall_tracker(clock)
    a, b = [TaskEntry("a")], [TaskEntry("a"), TaskEntry("b")]

    def poll(
        at: float, sealed: list[TaskEntry], *, progressed: bool = False, retried: int = 0
    ) -> None:
        clock[0] = at
        before = tracker.retried
        tracker.retried += retried
        tracker.budget.retries += 5  # other stages' retries: no outage of the polls
        tracker._check_stall(progressed, sealed, before)

    poll(0, a)
    poll(60, a)
    poll(90, a, retried=1)  # a poll that needed retries (an outage): again at 90
    poll(150, a)
    poll(180, b)  # b is new: again at 180
    poll(250, b, progressed=True)  # at 250
    poll(349, b)
    with pytest.raises(FatalRunError, match="processed nothing of the 2 task"):
        poll(350, b)


async def test_the_limiter_holds_acquirers_at_its_limit_and_wakes_them_in_turn() -> None:
    """Slots past the limit wait; each release lets one more in; a success that grows the
    window lets one in without a release; a waiter cancelled while it waits leaves the count
    as it was (the next waiter is still woken)."""
    slots = AIMDLimiter(4, start=2)
    await slots.acquire()
    await slots.acquire()
    got: list[int] = []

    async def take(n: int) -> None:
        await slots.acquire()
        got.append(n)

    async with anyio.create_task_group() as tg:
        for n in range(3):
            tg.start_soon(take, n)
        await anyio.wait_all_tasks_blocked()
        assert got == [] and slots.inflight == 2
        slots.release()
        await anyio.wait_all_tasks_blocked()
        assert len(got) == 1 and slots.inflight == 2
        slots.success()  # window 2 -> 2.5: still 2 slots
        await anyio.wait_all_tasks_blocked()
        assert len(got) == 1
        slots.success()  # 2.5 -> 2.9
        slots.success()  # 2.9 -> 3.24: a third slot
        await anyio.wait_all_tasks_blocked()
        assert len(got) == 2 and slots.inflight == 3
        tg.cancel_scope.cancel()  # the last waiter goes
    assert slots._waiting == 0
    slots.release()
    slots.release()
    await slots.acquire()  # nobody waits: a release woke nothing, the slot is free
    assert slots.inflight == 2 and slots.peak == 3


async def test_a_task_watched_again_keeps_its_entry() -> None:
    """A task sealed twice (adopted twice after a create of unknown fate) is one entry: a new
    one would read its results again from the start with no memory of the ids written."""
    book = TaskBook()
    book.watch("t1", "fashiontag run R-t1")
    entry = book.entries["t1"]
    entry.next_offset = 300
    book.orphan("t1", 7)
    book.orphan("t2", 8)
    book.watch("t1", "fashiontag run R-t1")
    assert book.entries["t1"] is entry and entry.next_offset == 300 and entry.orphans == {7}
    book.watch("t2", "fashiontag run R-t2")
    assert book.entries["t2"].orphans == {8}


async def test_the_services_retry_after_is_capped_by_the_clients_max_retry_after() -> None:
    """A Retry-After the client handed on (a write answered 503, a single-mode 429) is waited
    at most the client's ``retry.max_retry_after``, as docs/configuration.md says: the run's
    own wait used the default (120 s) whatever the setting, so ``max_retry_after = 0.2`` still
    waited the service's 30 s."""
    budget = RetryBudget(60, base=0.001, cap=0.002, max_retry_after=0.2)
    calls, fn = failing([RateLimitedError("HTTP 429", status=429, retry_after=30.0)])
    with anyio.fail_after(5):
        assert await budget.call("single-mode tag", fn) == "ok"  # type: ignore[arg-type]
    assert calls == [2]


async def test_a_retry_after_past_the_give_up_point_counts_no_retry() -> None:
    """A 429 asking to wait past the give-up point is waited to it, then the run stops: no
    retry is made, yet the summary and the progress line counted one ("retries 1" for a run
    that sent its request once)."""
    budget = RetryBudget(0.05, base=0.001, cap=0.002)
    calls, fn = failing([RateLimitedError("HTTP 429", status=429, retry_after=30.0)])
    with anyio.fail_after(5), pytest.raises(FatalRunError, match="rate limiting"):
        await budget.call("create task", fn)  # type: ignore[arg-type]
    assert calls == [1]
    assert budget.retries == 0


async def test_a_writes_retry_called_off_by_a_stop_counts_no_retry() -> None:
    """A write failed (a create answered 503, its fate unknown) while the run drains: the
    wait before its retry ends at the stop and the writer sends nothing more, yet the budget
    counted a retry ("retries 1" in an interrupted run's summary for a create sent once). The
    client counts none in that case; the engine neither."""
    budget = RetryBudget(60.0, base=0.5, cap=1.0)
    until = anyio.Event()

    async def stop_soon() -> None:
        await anyio.sleep(0.05)
        until.set()

    err = AmbiguousWriteError("HTTP 503", method="POST", path="/bulk", status=503)
    async with anyio.create_task_group() as tg:
        tg.start_soon(stop_soon)
        with anyio.fail_after(5):
            await budget.failed(err, "create task", until=until)
    await budget.failed(err, "create task", until=until)  # (stopped already)
    assert budget.retries == 0
