"""What the daemon shows of itself: ``/status``, the Prometheus metrics, and health.

:class:`DaemonMonitor` is the part of :class:`~.runner.Daemon` that watches: the manifests being
tagged and queued, the ones completed lately, request timings from the client's observer, and
a once-a-second report of row counts and engine gauges. Rows are counted as they are written;
when a manifest completes its counts are topped up to exactly its rows with an outcome (a
manifest resumed after a restart counts all of its rows in the new process).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from .._urls import shown_url
from ..engine.manifests import ManifestPrint
from .http import DaemonStatus, Health, ManifestProgress
from .inbox import Claim
from .logs import RETRY_LINES
from .metrics import DaemonMetrics, Op
from .outbox import ManifestSummary, rfc3339

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._client import TaggerClient
    from ..engine.engine import Engine
    from ..engine.jobs import Job
    from ..engine.manifest_bytes import ReadEnd
    from .config import DaemonConfig
    from .inbox import Inbox
    from .ledger import ClaimRecord

__all__ = ["ActiveManifest", "DaemonMonitor", "op_of"]

#: Completed manifests kept for ``/status``.
RECENT = 20
_OUTCOMES = ("tagged", "failed", "rejected", "reused")
#: Most seconds without a word from the service before the daemon asks it (see ``probe``).
PROBE_INTERVAL = 5.0
#: Seconds a probe may take before it counts as unanswered.
PROBE_TIMEOUT = 10.0
#: While the service rate limits the daemon, and while retry lines are left out of the log,
#: a line says so this often.
SUMMARY_EVERY = 60.0

logger = logging.getLogger("fashiontag_pipeline.daemon")


def op_of(method: str, path: str) -> Op | None:
    """The metrics ``op`` of a request (paths as the client sends them, query apart)."""
    if path.endswith("/tags"):
        return "single"
    if method == "POST":
        return "create"
    if method == "PUT":
        return "append"
    if method == "GET":
        if path.endswith("/status"):
            return "status"
        if path.rstrip("/").endswith("/bulk"):
            return "list"
        if "/bulk/" in path:
            return "results"
    return None


@dataclass(eq=False)
class ActiveManifest:
    claim: Claim
    job: Job | None = None
    #: Rows already counted in the metrics, by outcome.
    counted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_OUTCOMES, 0))
    baseline: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_OUTCOMES, 0))
    started: float = field(default_factory=time.monotonic)
    #: (when, rows taken in by then) each time more were taken in, while rows taken in by
    #: then have no outcome: :meth:`oldest_pending`.
    intake: deque[tuple[float, int]] = field(default_factory=deque)
    #: Its file as the engine opened it, looked at again once its rows have their outcome
    #: (:func:`~.claims.changed_since_read`: one that grew after it was read is not done).
    ends: list[ReadEnd] = field(default_factory=list)

    def watch(self, job: Job) -> None:
        """The manifest's job, once the engine has it: its counters from now on."""
        self.job = job
        self.baseline = {k: job.counters.get(k, 0) for k in _OUTCOMES}
        self.ends = [reader.read_end for reader in job.readers]  # (none once read: taken now)
        for end in self.ends:  # the bytes read are the ones hashed when it was claimed
            if end.read_print is None:
                end.read_print = ManifestPrint(
                    name=end.name, size=self.claim.size, sha256=self.claim.sha256
                )

    def oldest_pending(self, now: float) -> float | None:
        """Seconds since the oldest row without an outcome was taken in (None: none is), as
        ``report`` saw the counts each second: at the first moment whose rows taken in
        outnumber the rows with an outcome now, one of them had been taken in. (Not the
        manifest's age: the rows of a long manifest flow.)"""
        job = self.job
        if job is None:
            return None
        c = job.row.counters
        accepted, settled = c.get("accepted", 0), c.get("settled", 0)
        intake = self.intake
        if not intake or intake[-1][1] < accepted:
            intake.append((now, accepted))
        while intake and intake[0][1] <= settled:
            intake.popleft()
        return now - intake[0][0] if intake else None


class DaemonMonitor:
    """The watching half of the daemon (see the module docstring)."""

    def __init__(self, config: DaemonConfig) -> None:
        self.metrics = DaemonMetrics()
        self.health = Health(unreachable_after=config.unreachable_after)
        self.active: dict[str, ActiveManifest] = {}
        #: Claims that wait for equal content in flight to end.
        self.queued: deque[Claim] = deque()
        #: The inbox (its claims resumed at start-up and not started yet are queued), and the
        #: names of the files ready in it while every ``max_active`` slot is taken.
        self._inbox: Inbox | None = None
        self._waiting: list[str] = []
        #: The claim loop waits for a slot (no manifest is read until one ends).
        self._slot_wait = False
        #: Shared mode: claims in flight no daemon leases yet (the cluster's queue).
        self.unleased: Sequence[ClaimRecord] = ()
        self.recent: deque[ManifestSummary] = deque(maxlen=RECENT)
        self._engine: Engine | None = None
        #: When a rate limit or the retry lines left out were last said.
        self._limit_said = time.monotonic()

    # -------------------------------------------------------------- /status

    def status(self) -> DaemonStatus:
        return DaemonStatus(
            active=[self._progress(a) for a in self.active.values()],
            queued=self._queued(),
            recent=list(self.recent),
            draining=self.health.draining,
        )

    def _queued(self) -> list[ManifestProgress]:
        """Manifests that wait: for equal content in flight, then for a slot (claims resumed
        at start-up, then files ready in the inbox, not claimed yet: no sha256 nor claim)."""
        resumed = self._inbox.resumed if self._inbox is not None else ()
        # (Shared mode: the cluster's queue as last looked at, less any leased here since.)
        unleased = [c for c in self.unleased if c.name not in self.active]
        return [
            ManifestProgress(manifest=c.name, sha256=c.sha256, claimed_at=rfc3339(c.claimed_at))
            for c in (*self.queued, *resumed, *unleased)
        ] + [ManifestProgress(manifest=name) for name in self._waiting]

    async def take_slot(self, slots: anyio.Semaphore, inbox: Inbox, interval: float) -> None:
        """``slots.acquire()``; while every slot is taken, the files ready in the inbox are
        looked for every ``interval`` seconds and shown as queued (``/status``, the gauge)."""
        self._inbox = inbox
        if slots.value > 0:
            await slots.acquire()
            return
        self._slot_wait = True
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch_ready, inbox, interval)
                await slots.acquire()
                tg.cancel_scope.cancel()
        finally:
            self._waiting, self._slot_wait = [], False

    def more_claims(self) -> str | None:
        """Whether another manifest's rows are about to come (the engine then holds its open
        task for them, until ``linger_seconds`` after its last rows): "ready" when a manifest
        claimed is not read to the end yet (claimed, its rows come a moment later) or more
        files are ready in the inbox (the rest of a burst), "settling" when files are only
        still settling (a burst's next wave, or a trickle: the hold is then bounded, see
        :meth:`~..engine.policy.WritePolicy.held_until`), and a slot is free or about to be (a
        manifest whose rows all have their outcome is being finished). None: no more; not a
        manifest that waits for equal content in flight (it waits for its outcome), nor while
        reading waits for the rows in flight (``--max-pending-rows``): none comes before the
        open task's results."""
        inbox, engine = self._inbox, self._engine
        if inbox is None or (engine is not None and engine.source.gated):
            return None
        waiting = {c.name for c in (*self.queued, *inbox.resumed)}
        for name in inbox.claimed_names() - waiting:
            active = self.active.get(name)
            if active is None or active.job is None or not active.job.read_all:
                return "ready"
        if inbox.ready_left == 0 and inbox.settling == 0:
            return None
        if self._slot_wait and not any(
            a.job is not None and a.job.read_all and a.job.pending() <= 0
            for a in self.active.values()
        ):
            return None
        return "ready" if inbox.ready_left else "settling"

    async def _watch_ready(self, inbox: Inbox, interval: float) -> None:
        while True:
            self._waiting = [path.name for path in await inbox.ascan()]
            await anyio.sleep(interval)

    @staticmethod
    def _progress(active: ActiveManifest) -> ManifestProgress:
        claim, job = active.claim, active.job
        c = job.counters if job is not None else {}
        return ManifestProgress(
            manifest=claim.name,
            sha256=claim.sha256,
            claimed_at=rfc3339(claim.claimed_at),
            rows_read=job.rows_read if job is not None else 0,
            submitted=c.get("submitted", 0),
            tagged=c.get("tagged", 0),
            failed=c.get("failed", 0),
            rejected=c.get("rejected", 0),
            reused=c.get("reused", 0),
            pending=job.pending() if job is not None else 0,
        )

    # -------------------------------------------------------------- observation

    def observe(self, method: str, path: str, status: int, seconds: float) -> None:
        health = self.health
        if status == 0:
            health.mark_service_unreachable()
            return
        op = op_of(method, path)
        was = health.limited_since
        health.mark_service_answered(status, api=op is not None)
        if op is not None:
            self.metrics.observe_request(op, status, seconds)
        if (health.limited_since is None) != (was is None):
            self._limit_changed(was)

    def _limit_changed(self, was: float | None) -> None:
        """One line when a rate limit starts, one when it ends (the client's line per refused
        request is left out of the log, see :data:`~.logs.RETRY_LINES`)."""
        health = self.health
        if was is None:
            self._limit_said = time.monotonic()
            logger.warning(
                "the service is rate limiting this key (HTTP 429): requests wait and go on",
                extra={"since": rfc3339(health.limited_since_wall)},
            )
        else:
            logger.info(
                "the service no longer rate limits this key, after %.0f s and %d answers 429",
                time.monotonic() - was,
                health.limited_answers,
            )

    def _summaries(self) -> None:
        """While a rate limit lasts, and while retry lines are left out of the log, a line
        every :data:`SUMMARY_EVERY` seconds."""
        was = self.health.limited_since
        self.health.settle_limit()
        if was is not None and self.health.limited_since is None:
            self._limit_changed(was)
        now = time.monotonic()
        if now - self._limit_said < SUMMARY_EVERY:
            return
        self._limit_said = now
        health = self.health
        if health.limited_since is not None:
            logger.warning(
                "still rate limited (HTTP 429) after %.0f s: %d answers 429",
                now - health.limited_since,
                health.limited_answers,
                extra={"since": rfc3339(health.limited_since_wall)},
            )
        left_out = RETRY_LINES.take_left_out()
        if left_out:
            logger.info(
                "%d lines of requests retried left out of the log in the last %.0f s"
                " (-v logs each)",
                left_out,
                SUMMARY_EVERY,
            )

    def count_rows(self, active: ActiveManifest, *, final: bool) -> None:
        """Rows written since the last count; ``final``: up to every row of the manifest."""
        job = active.job
        if job is None:
            return
        for outcome in _OUTCOMES:
            now = job.counters.get(outcome, 0)
            target = now if final else now - active.baseline[outcome]
            delta = target - active.counted[outcome]
            if delta > 0:
                self.metrics.count_rows(outcome, delta)  # type: ignore[arg-type]
                active.counted[outcome] += delta

    async def report(self, client: TaggerClient) -> None:
        """Gauges and row counters, once a second."""
        retries = 0
        while True:
            for active in list(self.active.values()):
                self.count_rows(active, final=False)
            self._summaries()
            self.metrics.set_manifests(active=len(self.active), queued=len(self._queued()))
            engine = self._engine
            # (A shared daemon has an engine per leased manifest, none here: its client's.)
            total = client.stats.retries + (engine.budget.retries if engine is not None else 0)
            self.metrics.count_retries(max(0, total - retries))
            retries = max(retries, total)
            if engine is not None:
                self.metrics.set_engine(
                    tasks_live=engine.tasks_live(),
                    rows_pending=max(0, engine.rows_pending()),
                    oldest_pending_seconds=self._oldest_pending(),
                    task_expiry_headroom_seconds=engine.writer.expiry_headroom(),
                    result_expiry_headroom_seconds=engine.pagers.result_headroom(),
                )
            await anyio.sleep(1.0)

    async def probe(self, client: TaggerClient) -> None:
        """Keeps ``/readyz`` true while the daemon has nothing to send: when no request has
        ended for a third of ``unreachable_after`` (at most :data:`PROBE_INTERVAL`), one
        ``GET`` of the base URL (:meth:`TaggerClient.probe`), bounded in time. Before, an
        idle daemon said "service has not answered yet" (503) for as long as no manifest came,
        and 200 for ever after its service went away."""
        health = self.health
        interval = max(0.1, min(PROBE_INTERVAL, health.unreachable_after / 3))
        said: float | None = None
        while True:
            if health.quiet_for() >= interval and not health.draining:
                # A probe cut short ends as "no answer" (the observer sees status 0).
                with anyio.move_on_after(max(interval, PROBE_TIMEOUT)):
                    await client.probe()
                said = self._say_unreachable(shown_url(client.base_url), said)
            await anyio.sleep(interval)

    def _say_unreachable(self, where: str, said: float | None) -> float | None:
        """While only the probe asks the service (nothing to send), a warning once it has not
        answered for ``unreachable_after``, again every :data:`SUMMARY_EVERY` seconds (at most
        ten times ``unreachable_after``) while that lasts, and a line when it answers. Before,
        a daemon started with a wrong ``--base-url`` logged "daemon started" and nothing more
        until a manifest came (``/readyz`` alone said so). Returns when it last said so."""
        health = self.health
        down = health.unreachable_for()
        if down is None:
            if said is not None:
                logger.info("the service at %s answers now", where)
            return None
        now = time.monotonic()
        every = min(SUMMARY_EVERY, 10 * health.unreachable_after)
        if down < health.unreachable_after or (said is not None and now - said < every):
            return said
        logger.warning(
            "the service at %s has not answered for %.0f s (nothing listens there, or it is"
            " down: is --base-url right?); /readyz says 503, and the daemon keeps asking",
            where,
            down,
        )
        return now

    def _oldest_pending(self) -> float | None:
        now = time.monotonic()
        ages = [age for a in self.active.values() if (age := a.oldest_pending(now)) is not None]
        return max(ages) if ages else None

    def begin_manifest(self, claim: Claim) -> ActiveManifest:
        """A manifest is being tagged: shown by /status, counted by the metrics."""
        active = self.active[claim.name] = ActiveManifest(claim)
        return active

    def end_manifest(self, active: ActiveManifest) -> None:
        if self.active.get(active.claim.name) is active:
            del self.active[active.claim.name]
