"""The daemon's Prometheus metrics, in a registry of their own.

Names and labels are a contract (dashboards and alerts rely on them)::

    fashiontag_rows_total{outcome}                 tagged | failed | rejected | reused
    fashiontag_manifests_total{status}             done | failed | duplicate
    fashiontag_requests_total{op,code}             op: create append list status results single
    fashiontag_request_duration_seconds{op}        histogram
    fashiontag_retries_total
    fashiontag_rate_limited_total
    fashiontag_log_lines_dropped_total             stderr not read: see logwriter
    fashiontag_manifests_active                    gauges ...
    fashiontag_manifests_queued
    fashiontag_tasks_live
    fashiontag_rows_pending
    fashiontag_oldest_pending_seconds
    fashiontag_task_expiry_headroom_seconds        min over open tasks (+Inf: none)
    fashiontag_result_expiry_headroom_seconds      min over done, unread tasks (+Inf: none)

Every series exists from start-up: each listed label value at 0, ``requests_total`` with each
op's success code (202 for create/append, 200 for the others), headrooms at ``+Inf``.
Counters are per process. The engine reports in batches (a page of results, a chunk of
rejects), so the update methods take counts; label children are bound once, so an update is a
dict lookup and a locked add.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Final, Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from .logwriter import DROPPED_LINES

__all__ = [
    "CONTENT_TYPE",
    "OPS",
    "DaemonMetrics",
    "Op",
    "RowOutcome",
]

RowOutcome = Literal["tagged", "failed", "rejected", "reused"]
ManifestStatusLabel = Literal["done", "failed", "duplicate"]
Op = Literal["create", "append", "list", "status", "results", "single"]
ROW_OUTCOMES: Final = get_args(RowOutcome)
MANIFEST_STATUSES: Final = get_args(ManifestStatusLabel)
OPS: Final = get_args(Op)
#: The code each op answers when it succeeds (DESIGN section 3): the series shown at start-up.
SUCCESS_CODE: Final = {"create": 202, "append": 202}
#: Request latencies: loopback milliseconds up to a slow service's tens of seconds.
DURATION_BUCKETS: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
INF: Final = math.inf


class _DroppedLogLines(Collector):
    """``fashiontag_log_lines_dropped_total``: the writer's count, read at each scrape."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "fashiontag_log_lines_dropped",
            "Log lines dropped because stderr was not read (the log says how many, later).",
            value=DROPPED_LINES.total,
        )


class DaemonMetrics:
    """Every metric of the daemon, registered in :attr:`registry` (never the global one, so
    several daemons in one process, as in tests, do not collide)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        rows = Counter(
            "fashiontag_rows_total",
            "Rows with an outcome, by outcome (counted once, when written to the outputs).",
            ["outcome"],
            registry=r,
        )
        manifests = Counter(
            "fashiontag_manifests_total",
            "Manifests finished, by status.",
            ["status"],
            registry=r,
        )
        requests = Counter(
            "fashiontag_requests_total",
            "Requests answered by the tagging service, by operation and HTTP status code.",
            ["op", "code"],
            registry=r,
        )
        durations = Histogram(
            "fashiontag_request_duration_seconds",
            "Time from sending a request to its whole answer, by operation.",
            ["op"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self._retries = Counter(
            "fashiontag_retries_total", "Requests sent again after a failure.", registry=r
        )
        self._rate_limited = Counter(
            "fashiontag_rate_limited_total", "Answers 429 (rate limited).", registry=r
        )
        self._manifests_active = Gauge(
            "fashiontag_manifests_active", "Manifests being read and tagged.", registry=r
        )
        self._manifests_queued = Gauge(
            "fashiontag_manifests_queued",
            "Manifests claimed or ready, waiting for an active slot.",
            registry=r,
        )
        self._tasks_live = Gauge(
            "fashiontag_tasks_live", "Tasks created and not yet fully read.", registry=r
        )
        self._rows_pending = Gauge(
            "fashiontag_rows_pending",
            "Rows submitted to the service without an outcome yet.",
            registry=r,
        )
        self._oldest_pending = Gauge(
            "fashiontag_oldest_pending_seconds",
            "Age of the oldest row taken in without an outcome (0 when none).",
            registry=r,
        )
        self._task_headroom = Gauge(
            "fashiontag_task_expiry_headroom_seconds",
            "Seconds until the earliest taskExpireAt among open tasks (+Inf when none).",
            registry=r,
        )
        self._result_headroom = Gauge(
            "fashiontag_result_expiry_headroom_seconds",
            "Seconds until the earliest resultExpiredAt among done, unread tasks (+Inf when none).",
            registry=r,
        )
        r.register(_DroppedLogLines())
        self._task_headroom.set(INF)
        self._result_headroom.set(INF)
        # Bound children: exported at 0 from start-up, and cheap to update.
        self._rows = {outcome: rows.labels(outcome=outcome) for outcome in ROW_OUTCOMES}
        self._manifests = {status: manifests.labels(status=status) for status in MANIFEST_STATUSES}
        self._requests_family = requests
        self._requests: dict[tuple[str, int], Counter] = {}
        self._durations = {op: durations.labels(op=op) for op in OPS}
        for op in OPS:
            self._request_counter(op, SUCCESS_CODE.get(op, 200))

    def _request_counter(self, op: str, code: int) -> Counter:
        key = (op, code)
        counter = self._requests.get(key)
        if counter is None:
            counter = self._requests_family.labels(op=op, code=str(code))
            self._requests[key] = counter
        return counter

    # -- counters ------------------------------------------------------------------------

    def count_rows(self, outcome: RowOutcome, rows: int = 1) -> None:
        """``rows`` more rows with this outcome (call when they are written to the outputs)."""
        if rows:
            try:
                child = self._rows[outcome]
            except KeyError:
                raise ValueError(f"unknown row outcome {outcome!r}") from None
            child.inc(rows)

    def count_manifest(self, status: ManifestStatusLabel) -> None:
        """One more manifest finished with this status (call when its summary is written)."""
        try:
            child = self._manifests[status]
        except KeyError:
            raise ValueError(f"unknown manifest status {status!r}") from None
        child.inc()

    def observe_request(self, op: Op, code: int, seconds: float) -> None:
        """One answered request: its HTTP status code and how long it took."""
        try:
            duration = self._durations[op]
        except KeyError:
            raise ValueError(f"unknown request op {op!r}") from None
        self._request_counter(op, code).inc()
        duration.observe(seconds)
        if code == 429:
            self._rate_limited.inc()

    def count_retries(self, retries: int = 1) -> None:
        """``retries`` more requests sent again."""
        if retries:
            self._retries.inc(retries)

    # -- gauges --------------------------------------------------------------------------

    def set_manifests(self, *, active: int, queued: int) -> None:
        """How many manifests are active and how many wait for a slot."""
        self._manifests_active.set(active)
        self._manifests_queued.set(queued)

    def set_engine(
        self,
        *,
        tasks_live: int,
        rows_pending: int,
        oldest_pending_seconds: float | None,
        task_expiry_headroom_seconds: float | None,
        result_expiry_headroom_seconds: float | None,
    ) -> None:
        """The engine's gauges in one call (a tracker poll). A None headroom is a min over no
        task: ``+Inf``; a None age is no pending row: 0."""
        self._tasks_live.set(tasks_live)
        self._rows_pending.set(rows_pending)
        self._oldest_pending.set(0.0 if oldest_pending_seconds is None else oldest_pending_seconds)
        self._task_headroom.set(
            INF if task_expiry_headroom_seconds is None else task_expiry_headroom_seconds
        )
        self._result_headroom.set(
            INF if result_expiry_headroom_seconds is None else result_expiry_headroom_seconds
        )

    # -- exposition ----------------------------------------------------------------------

    def render(self) -> bytes:
        """The registry in Prometheus text format (what ``GET /metrics`` returns)."""
        return generate_latest(self.registry)
