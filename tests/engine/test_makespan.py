"""Makespan and time to first result: the tracker polls at the predicted completion (not after
a long backoff), tasks rotate so results flow while later tasks are tagged.

The forecast and the tracker are driven in virtual time (a fake clock and a fake service), so
the assertions are exact and do not depend on the machine's speed; the end-to-end test asserts
an ordering (results before the service has tagged everything), never a wall-clock ratio.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fashiontag_pipeline import TaggerClient
from fashiontag_pipeline._models import Task, TaskCount, TaskStatus
from fashiontag_pipeline.engine import EngineConfig, run_pipeline
from fashiontag_pipeline.engine.flow import RetryBudget
from fashiontag_pipeline.engine.forecast import CompletionForecast
from fashiontag_pipeline.engine.policy import OpenTask, WritePolicy
from fashiontag_pipeline.engine.tracker import TaskBook, TaskEntry, Tracker
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import assert_exactly_once, client_config, write_csv

POLL_MIN, POLL_MAX = 0.05, 5.0

# ---------------------------------------------------------------- the forecast, pure


def test_forecast_aims_at_the_earliest_completion() -> None:
    """A task moving at 2,000/s with 1,000 left: the next poll is ~0.5 s away, not a backoff."""
    f = CompletionForecast(POLL_MIN, POLL_MAX)
    f.observe(0.0, {"a": (0, 2000), "b": (0, 2000)})
    f.observe(0.1, {"a": (200, 2000), "b": (0, 2000)})  # first move: no rate yet
    assert f.next_interval(True) == pytest.approx(1800 / 2000, abs=0.02)  # by throughput
    f.observe(0.5, {"a": (1000, 2000), "b": (0, 2000)})
    assert f.next_interval(True) == pytest.approx(1000 / 2000, abs=0.02)


def test_forecast_waiting_task_queues_behind_earlier_ones() -> None:
    """A task that has not moved is expected after the tasks before it (acceptance order), so a
    small queued task does not cause early polls."""
    f = CompletionForecast(POLL_MIN, POLL_MAX)
    f.observe(0.0, {"big": (0, 4000), "small": (0, 100)})
    f.observe(0.5, {"big": (1000, 4000), "small": (0, 100)})
    f.observe(1.0, {"big": (2000, 4000), "small": (0, 100)})
    assert f.next_interval(True) == pytest.approx(1.0, abs=0.02)  # big: 2,000 left at 2,000/s


def test_forecast_polls_fast_near_done_and_within_bounds() -> None:
    f = CompletionForecast(POLL_MIN, POLL_MAX)
    f.observe(0.0, {"a": (0, 100_000)})
    f.observe(1.0, {"a": (1000, 100_000)})
    f.observe(2.0, {"a": (2000, 100_000)})
    assert f.next_interval(True) == POLL_MAX  # 98 s away: clamped
    f.observe(2.5, {"a": (99_990, 100_000)})
    assert f.next_interval(True) == POLL_MIN


def test_forecast_backs_off_only_while_nothing_progresses() -> None:
    f = CompletionForecast(POLL_MIN, POLL_MAX)
    now, intervals = 0.0, []
    for _ in range(12):
        progressed = f.observe(now, {"a": (10, 2000)})
        intervals.append(f.next_interval(progressed))
        now += intervals[-1]
    assert intervals == sorted(intervals) and intervals[-1] == POLL_MAX
    # Progress again: straight back to the forecast, no slow climb down.
    f.observe(now + 1.0, {"a": (1010, 2000)})
    f.observe(now + 1.5, {"a": (1510, 2000)})
    assert f.next_interval(True) == pytest.approx(0.5, abs=0.03)  # 490 left at 1,000/s


# ---------------------------------------------------------------- the tracker, virtual time


@dataclass
class FifoService:
    """Tags accepted images in acceptance order at ``rate`` per second of the fake clock."""

    rate: float
    sizes: dict[str, int]
    clock: list[float]
    lists: int = 0
    statuses: int = 0
    done_at: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        end = 0.0
        for task_id, n in self.sizes.items():
            end += n / self.rate
            self.done_at[task_id] = end

    async def list_tasks(self, **kwargs: object) -> list[Task]:
        self.lists += 1
        return self._view()

    async def task_status(self, task_id: str) -> Task:
        self.statuses += 1
        (task,) = [t for t in self._view() if t.task_id == task_id]
        return task

    def _view(self) -> list[Task]:
        tagged = self.clock[0] * self.rate
        tasks = []
        for task_id, n in self.sizes.items():
            processed = int(max(0.0, min(float(n), tagged)))
            tagged -= n
            done = self.clock[0] >= self.done_at[task_id]
            tasks.append(
                Task(
                    task_id=task_id,
                    count=TaskCount(total=n, done=n if done else processed),
                    task_status=TaskStatus.DONE if done else TaskStatus.PROCESSING,
                )
            )
        return tasks


class _NoJournal:
    async def commit(self, **kwargs: Any) -> None:
        return None


class VirtualTracker(Tracker):
    """Sleeps by moving the fake clock (the schedule is what is under test)."""

    def __init__(self, clock: list[float], **kwargs: Any) -> None:
        super().__init__(clock=lambda: clock[0], **kwargs)
        self.fake = clock
        self.sleeps: list[float] = []

    async def _sleep(self, started: float, interval: float, added: int) -> None:
        self.sleeps.append(interval)
        self.fake[0] += interval


async def run_virtual(
    sizes: dict[str, int], rate: float, service_type: type[FifoService] = FifoService
) -> tuple[FifoService, dict[str, float]]:
    clock = [0.0]
    service = service_type(rate, sizes, clock)
    book = TaskBook()
    for task_id in sizes:
        book.add(TaskEntry(task_id))
    noticed: dict[str, float] = {}

    async def on_done(entry: TaskEntry) -> None:
        noticed[entry.task_id] = clock[0]
        entry.state = "drained"

    tracker = VirtualTracker(
        clock,
        client=service,  # type: ignore[arg-type]
        journal=_NoJournal(),  # type: ignore[arg-type]
        book=book,
        config=EngineConfig(poll_min=POLL_MIN, poll_max=POLL_MAX),
        budget=RetryBudget(60),
        on_done=on_done,
        finished=lambda: len(noticed) == len(sizes),
    )
    with anyio.fail_after(10):
        await tracker.run()
    return service, noticed


async def test_tracker_notices_each_task_soon_after_it_is_done() -> None:
    """Ten 2,000-image tasks at 2,000/s (one done per second): each is noticed within a short
    poll of its completion, with a few polls per task; a tracker that backs off while tasks
    are processing (x1.6 up to 5 s) notices them seconds late."""
    sizes = {f"t{i}": 2000 for i in range(10)}
    service, noticed = await run_virtual(sizes, 2000.0)
    for task_id, done_at in service.done_at.items():
        late = noticed[task_id] - done_at
        assert 0 <= late <= POLL_MIN + 0.02, (task_id, late)
    assert service.lists <= 4 * len(sizes)


async def test_tracker_last_task_of_uneven_sizes() -> None:
    """Uneven tasks (a big one, then small ones, a tiny last one) are all noticed promptly."""
    sizes = {"a": 5000, "b": 300, "c": 2000, "d": 40}
    service, noticed = await run_virtual(sizes, 1000.0)
    for task_id, done_at in service.done_at.items():
        assert 0 <= noticed[task_id] - done_at <= POLL_MIN + 0.02, task_id


# ---------------------------------------------------------------- rotation sizes


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 1000),
    st.integers(1, 100_000),
    st.integers(1, 10_000),
    st.floats(0.0, 1.0),
    st.integers(0, 10_000_000),
)
def test_task_limit_bounds(chunk: int, cap: int, floor: int, fraction: float, before: int) -> None:
    config = EngineConfig(
        chunk_size=chunk, rotate_images=cap, rotate_min_images=floor, rotate_fraction=fraction
    )
    limit = WritePolicy(config).task_limit(before)
    assert min(floor, cap) <= limit <= cap
    assert limit <= max(min(floor, cap), int(before * fraction))


def test_default_rotation_is_small_first_and_grows_slowly() -> None:
    """Defaults: 1,000-image tasks at first (early first result, short tail), then 2% of what
    was sent, capped at 50,000; a 1M-image run needs a couple of hundred tasks."""
    policy = WritePolicy(EngineConfig())
    sent, sizes = 0, []
    while sent < 1_000_000:
        size = min(policy.task_limit(sent), 1_000_000 - sent)
        sizes.append(size)
        sent += size
    assert sizes[0] == 1000 and max(sizes) <= 50_000
    assert sizes[-1] <= 0.021 * 1_000_000
    assert len(sizes) < 250


def test_full_task_is_closed_for_further_chunks() -> None:
    policy = WritePolicy(EngineConfig(rotate_min_images=2000))
    task = OpenTask(seq=1, token="t", opened=0.0, expires=600.0, limit=policy.task_limit(0))
    task.images = 1000
    assert policy.usable(task, 1.0, 1000) and not policy.full(task)
    task.images = 2000
    assert policy.full(task) and not policy.usable(task, 1.0, 1)


# ---------------------------------------------------------------- end to end


async def test_results_flow_before_the_service_has_tagged_everything(tmp_path: Path) -> None:
    """Against a rate-limited reference service, the first result line is written while the
    service is still tagging the run's later tasks (rotation + prompt tracking)."""
    n, rate = 4000, 2000.0
    manifest = write_csv(tmp_path / "m.csv", n)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    engine = EngineConfig(chunk_size=250, rotate_min_images=500, fsync_seconds=0.0)
    seen: dict[str, int] = {}
    async with running_service(ServiceConfig(rate=rate)) as svc:
        watcher = TaggerClient(config=client_config(svc.url))

        async def watch() -> None:
            while not (out.exists() and out.stat().st_size > 0):
                await anyio.sleep(0.005)
            tasks = await watcher.list_tasks()
            seen["tagged"] = sum(t.count.done + t.count.failure for t in tasks)
            seen["tasks_done"] = sum(1 for t in tasks if t.done)
            seen["tasks"] = len(tasks)

        async with watcher, anyio.create_task_group() as tg:
            tg.start_soon(watch)
            summary = await run_pipeline(
                [manifest], client=client_config(svc.url), out=out, rejects=rej, engine=engine
            )
    assert summary.complete and summary.tasks == n // 500
    assert_exactly_once(out, rej, {f"p{i}" for i in range(n)})
    assert seen["tagged"] < n, seen
    assert seen["tasks_done"] < seen["tasks"], seen


@dataclass
class CrowdedAccount(FifoService):
    """An account that also holds 400 old tasks: its list is 400+ entries long."""

    async def list_tasks(self, **kwargs: object) -> list[Task]:
        old = [
            Task(
                task_id=f"old{i}",
                count=TaskCount(total=1000, done=1000),
                task_status=TaskStatus.DONE,
            )
            for i in range(400)
        ]
        return old + await super().list_tasks()


async def test_tracker_asks_statuses_when_the_list_is_mostly_other_tasks() -> None:
    """Three watched tasks among 400 old ones: after one list the tracker polls statuses (one
    small request per watched task), lists again only now and then, and still notices each
    task promptly."""
    sizes = {f"t{i}": 2000 for i in range(3)}
    service, noticed = await run_virtual(sizes, 2000.0, CrowdedAccount)
    assert service.statuses > 0
    assert service.lists <= 2
    for task_id, done_at in service.done_at.items():
        assert 0 <= noticed[task_id] - done_at <= POLL_MIN + 0.02, task_id
