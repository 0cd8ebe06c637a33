"""The narrow interface between the daemon and the long-lived engine it will drive.

The daemon owns files, folders, readiness, claims, metrics and health; the engine owns rows,
tasks and the state of what was sent. They meet here, in typed terms only:

* the daemon hands the engine a claimed manifest and its output folder:
  ``await engine.open_manifest(claim, outputs)`` returns a :class:`ManifestRun` at once (the
  engine resumes a claim whose ``resumed`` is true from its state store);
* the daemon reads ``run.progress()`` for ``/status`` and awaits ``run.outcome()``, which
  returns when every row of the manifest has its outcome in ``results.jsonl`` or
  ``rejects.jsonl`` (both fsync-ed) with the counts, or ``status="failed"`` and a reason when
  the manifest cannot be read at all;
* the daemon then writes ``summary.json`` (:meth:`ManifestOutcome.summary`), moves the
  manifest to ``done/`` or ``failed/``, and counts it in ``fashiontag_manifests_total``.

The engine reports what only it sees straight into the shared objects it is given at
construction: :class:`~fashiontag_pipeline.daemon.metrics.DaemonMetrics` (rows by outcome as
they are written, each request's op/code/duration, retries, its gauges on each tracker poll)
and :class:`~fashiontag_pipeline.daemon.http.Health` (service answered / unreachable, state
commit ok / failed).
"""

from __future__ import annotations

from typing import Literal, Protocol

from .http import ManifestProgress
from .inbox import Claim
from .outbox import ManifestCounts, ManifestOutputs, ManifestSummary, rfc3339

__all__ = ["IngestEngine", "ManifestOutcome", "ManifestRun"]


class ManifestOutcome(ManifestCounts, kw_only=True):
    """How one manifest ended, in the engine's words: ``run --summary``'s counts for its rows
    (``done``), or why it could not be read at all (``failed``: not CSV/JSONL, no id/url
    column, broken gzip; ``reason`` is said to the operator, never holds a key)."""

    status: Literal["done", "failed"]
    reason: str | None = None

    def summary(self, outputs: ManifestOutputs, *, finished_at: float) -> ManifestSummary:
        """The ``summary.json`` of this outcome for ``outputs``' claim."""
        claim = outputs.claim
        counts = {name: getattr(self, name) for name in ManifestCounts.__struct_fields__}
        return ManifestSummary(
            manifest=claim.name,
            sha256=claim.sha256,
            status=self.status,
            claimed_at=rfc3339(claim.claimed_at),
            finished_at=rfc3339(finished_at),
            reason=self.reason,
            **counts,
        )


class ManifestRun(Protocol):
    """One manifest inside the engine."""

    def progress(self) -> ManifestProgress:
        """Counts so far (cheap, no I/O: ``/status`` calls it on the event loop)."""
        ...

    async def outcome(self) -> ManifestOutcome:
        """Wait until every row has its outcome written (or the manifest failed). Cancelled
        on drain: the manifest stays in ``.work`` and resumes on the next start."""
        ...


class IngestEngine(Protocol):
    """The long-lived engine: one client session, one concurrency budget and one task
    rotation shared by every active manifest (rows of several manifests may share a task)."""

    async def open_manifest(self, claim: Claim, outputs: ManifestOutputs) -> ManifestRun:
        """Start (or resume) reading ``claim.path``, writing to ``outputs.results`` and
        ``outputs.rejects``."""
        ...
